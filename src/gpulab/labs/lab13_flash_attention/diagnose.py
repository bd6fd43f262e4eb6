"""The grader of exercise 3 of the lab "Flash attention": a student's Triton forward kernel, run at small shapes.

Without a GPU the kernel runs in Triton's interpreter on the CPU (:mod:`gpulab.kernels.triton_gemm.interpreter`), on
a GPU it is compiled; either way :func:`diagnose_kernel` launches it (:func:`.kernel.attend`) on random inputs
(fresh ones for each check :func:`grade_kernel` records), into an output poisoned with NaN, for each of :data:`CASES`
in turn, and compares the output with attention in float64 with every score stored
(:func:`gpulab.kernels.triton_attention.reference.reference_attention`).

When the output is wrong, the grader computes in float64 what each typical mistake would have produced on the same
inputs and the same tiles (:func:`simulate` with the variants of :data:`MISTAKES`): ``tl.exp`` where the scores are
in base-2 units, ``acc`` or ``l`` not rescaled, the running maximum never carried, ``acc`` divided by ``l`` inside
the loop, or never. An output that matches one names the mistake; NaN or infinity names the two ways to get one
(``-inf`` in the first tile, or ``2^s`` overflowing where the maximum was not subtracted); a compile error that says
the operands of ``tl.dot`` differ in type is the missing cast of ``p``. An output of zeros everywhere is the stub's:
"not answered yet".
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from gpulab.core import kernel_mode
from gpulab.core.correctness import relative_error
from gpulab.kernels.triton_attention.reference import random_inputs, reference_attention
from gpulab.labs import grading, kernel_grading
from gpulab.labs.lab13_flash_attention.kernel import LOG2E, attend

PROBLEMS = ("ok", "error", "not answered", "p not cast", "exp instead of exp2", "max not subtracted",
            "acc not rescaled", "l not rescaled",
            "neither rescaled", "m not carried", "divided by l in the loop", "not divided by l", "not finite",
            "overflow", "wrong values")


@dataclass(frozen=True)
class Diagnosis(grading.Diagnosis):
    """What a student's kernel did: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says on which case and how."""

    problems: ClassVar[tuple[str, ...]] = PROBLEMS


@dataclass(frozen=True)
class Case:
    """One launch of the graded kernel: ``seq_len`` keys and queries (batch 1, 2 heads, head size 16) in tiles of
    ``block_m`` x ``block_n``, queries scaled by ``spread`` (large: scores of hundreds in base-2 units)."""

    name: str
    seq_len: int
    block_m: int = 16
    block_n: int = 16
    float16: bool = False  # float16 inputs even under the interpreter (on a GPU every case is float16)
    spread: float = 2.0
    large: bool = False  # the case that overflows 2^s when the maximum is not subtracted


HEAD_DIM = 16  # the smallest that tl.dot takes
CASES = (
    Case("one tile of 16 keys", 16),
    Case("4 tiles of 16 keys, across which the row maxima move", 64),
    Case("40 keys: 2 tiles of 16 and a short one of 8", 40, block_m=32),
    Case("float16 inputs, as the tensor cores take them", 64, float16=True),
    Case("scores of several hundred (in base-2 units)", 64, spread=60.0, large=True),
)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3}  # relative, against float64: the rounding of the inputs' type


def _update(p_factor: float = 1.0, alpha_factor: float = 1.0, subtract: bool = True, rescale_l: bool = True,
            rescale_acc: bool = True, carry_m: bool = True, divide: bool = False):
    """The online-softmax update (natural units) with one of the typical mistakes switched on: ``p_factor`` and
    ``alpha_factor`` scale the exponents of ``p`` and ``alpha`` (log2(e): ``tl.exp`` of base-2 numbers),
    ``subtract=False`` exponentiates the scores without subtracting the running maximum."""
    def update(m, l, acc, s, v):  # noqa: E741  (the paper's l)
        m_new = np.maximum(m, s.max(axis=1))
        alpha = np.exp(alpha_factor * (m - m_new))
        p = np.exp(p_factor * (s - m_new[:, None] if subtract else s))
        l_new = (alpha * l if rescale_l else l) + p.sum(axis=1)
        acc_new = (alpha[:, None] * acc if rescale_acc else acc) + p @ v
        if divide:
            acc_new = acc_new / l_new[:, None]
        return (m_new if carry_m else m), l_new, acc_new
    return update


# problem -> the variants of the kernel that make it: arguments of _update, and finish=False for no final division
MISTAKES: dict[str, tuple[dict, ...]] = {
    "exp instead of exp2": ({"p_factor": LOG2E, "alpha_factor": LOG2E}, {"p_factor": LOG2E},
                            {"alpha_factor": LOG2E}),
    "max not subtracted": ({"subtract": False},),
    "acc not rescaled": ({"rescale_acc": False},),
    "l not rescaled": ({"rescale_l": False},),
    "neither rescaled": ({"rescale_l": False, "rescale_acc": False},),
    "m not carried": ({"carry_m": False},),
    "divided by l in the loop": ({"divide": True}, {"divide": True, "finish": False}),
    "not divided by l": ({"finish": False},),
}
HINTS = {
    "not answered": "complete tile_update (m_new, alpha and p, then the new l_i and acc) and the output after the loop",
    "p not cast": "tl.dot takes both operands in one type: p is float32 and v is 16-bit, so multiply p.to(v.dtype) "
                  "by v",
    "exp instead of exp2": "s is in base-2 units (qk_scale includes log2(e)), so e^score is tl.exp2(s): use tl.exp2 "
                           "for both alpha and p",
    "max not subtracted": "l_i and acc hold sums relative to the running maximum, so p = tl.exp2(s - m_new[:, None]), "
                          "not tl.exp2(s) (which also overflows float32 for s above 128)",
    "acc not rescaled": "acc was summed under the old maximum: multiply it by alpha[:, None] before adding p v",
    "l not rescaled": "l_i was summed under the old maximum: l_i = l_i * alpha + tl.sum(p, 1)",
    "neither rescaled": "l_i and acc were summed under the old maximum: multiply both by alpha = tl.exp2(m_i - m_new) "
                        "before adding the new tile",
    "m not carried": "the running maximum carries over to the next tile: tile_update returns m_new, not m_i",
    "divided by l in the loop": "tile_update returns acc unnormalised (each later tile rescales it by alpha); divide "
                                "once, after the loop: out = acc / l_i[:, None]",
    "not divided by l": "after the loop, out = acc / l_i[:, None]",
    "not finite": "NaN or inf comes from 0/0 or inf - inf. In the first tile m_i is -inf: compute m_new = "
                  "tl.maximum(m_i, tl.max(s, 1)) first, then alpha = tl.exp2(m_i - m_new) and p = tl.exp2(s - "
                  "m_new[:, None]); and l_i must grow with every tile, or acc / l_i is 0 / 0",
    "overflow": "2^s overflows float32 for s above 128: subtract the running maximum before exponentiating, "
                "p = tl.exp2(s - m_new[:, None])",
    "wrong values": "compare each line with exercise 1's online_update, in base 2: alpha = tl.exp2(m_i - m_new), "
                    "p = tl.exp2(s - m_new[:, None])",
    "error": "the kernel must run: read the error's last line, which names the line or the operation",
}


def simulate(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_n: int, finish: bool = True,
             **mistake) -> np.ndarray:
    """What the kernel computes on ``(batch, heads, seq_len, d)`` float64 arrays with tiles of ``block_n`` keys,
    the update changed by ``mistake`` (arguments of :func:`_update`; none: the right answer), and ``finish=False``
    leaving out the final ``acc / l``. A short last tile is a short slice, as masked keys add nothing."""
    update = _update(**mistake)
    out = np.empty_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for index in np.ndindex(q.shape[:2]):
        rows, n = q[index].shape[0], k[index].shape[0]
        m, l, acc = np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, v.shape[-1]))  # noqa: E741
        with np.errstate(all="ignore"):
            for start in range(0, n, block_n):
                s = q[index] @ k[index][start:start + block_n].T * scale
                m, l, acc = update(m, l, acc, s, v[index][start:start + block_n])  # noqa: E741
            out[index] = acc / l[:, None] if finish else acc
    return out


def _innermost(error: BaseException) -> BaseException:
    """The error that started it: the interpreter wraps an error in the kernel in one InterpreterError per call."""
    seen = {id(error)}
    while (inner := error.__cause__ or error.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        error = inner
    return error


def _said(error: BaseException) -> str:
    """An error in a few words, with the kernel's line where the interpreter shows it: the innermost error's
    message (Triton's compile errors start with the position and the source and end with the message, so their
    last line is kept)."""
    inner = _innermost(error)
    lines = [line.strip() for line in str(inner).strip().splitlines() if line.strip()]
    message = (lines[-1] if lines[0].startswith("at ") else lines[0])[:200] if lines else ""
    return f"{type(inner).__name__}: {message}{kernel_grading._kernel_line(inner)}"


def _mistake(output: torch.Tensor, inputs: tuple[torch.Tensor, ...], case: Case, tolerance: float) -> str | None:
    """The name of the first of :data:`MISTAKES` whose simulation gives ``output``, or None."""
    arrays = [t.detach().to("cpu", torch.float64).numpy() for t in inputs]
    for problem, variants in MISTAKES.items():
        for variant in variants:
            wrong = torch.from_numpy(simulate(*arrays, case.block_n, **variant))
            if torch.isfinite(wrong).all() and relative_error(output, wrong) <= tolerance:
                return problem
    return None


def diagnose_case(kernel, case: Case, seed: int = 0) -> Diagnosis:
    """Launch ``kernel`` on ``case``'s fresh inputs and say what its output is: "ok", or what went wrong."""
    dtype = torch.float16 if case.float16 or kernel_mode.on_gpu() else torch.float32
    inputs = random_inputs((1, 2, case.seq_len, HEAD_DIM), dtype, kernel_mode.device(), seed, case.spread)[:3]
    where = f"on {case.name}"
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):  # the interpreter's overflow in a wrong kernel
            warnings.simplefilter("ignore", RuntimeWarning)
            output = attend(kernel, *inputs, BLOCK_M=case.block_m, BLOCK_N=case.block_n, num_warps=4, num_stages=2)
            kernel_mode.synchronize()
    except Exception as error:  # a student's kernel may fail in any way; the grader reports, never raises
        said = _said(error)
        if "same dtype" in said:
            return Diagnosis("p not cast", f"{where}, the kernel did not compile: {said}")
        return Diagnosis("error", f"{where}, the kernel failed: {said}")
    output = output.detach().to("cpu", torch.float64)
    if bool((output == 0).all()):
        return Diagnosis("not answered", grading.NOT_ANSWERED)
    expected, _ = reference_attention(*inputs)
    tolerance = TOLERANCE[dtype]
    if not torch.isfinite(output).all():
        bad = int((~torch.isfinite(output)).sum())
        said = f"{where}: {bad} of {output.numel()} elements are NaN or infinite"
        return Diagnosis("overflow" if case.large else "not finite", said)
    error = relative_error(output, expected)
    if error <= tolerance:
        return Diagnosis("ok", f"{where}: a relative error of {error:.2g} against float64")
    said = f"{where}: a relative error of {error:.3g} against float64 attention (at most {tolerance:g})"
    problem = _mistake(output, inputs, case, tolerance)
    return Diagnosis(problem or "wrong values", f"{said}; it is what a kernel with the mistake '{problem}' computes"
                     if problem else said)


def diagnose_kernel(kernel, cases: tuple[Case, ...] = CASES, seed: int = 0) -> Diagnosis:
    """:func:`diagnose_case` for each of ``cases`` in turn: the first that is not "ok", else "ok"."""
    for case in cases:
        found = diagnose_case(kernel, case, seed)
        if not found.ok:
            return found
    return Diagnosis("ok", f"right on all {len(cases)} cases: " + "; ".join(case.name for case in cases))


def grade_kernel(grader: grading.Grader, name: str, kernel, hints: Mapping[str, str] = HINTS,
                 seed: int | None = None) -> bool:
    """Record :func:`diagnose_kernel` of ``kernel`` as the check ``name`` (never raises for the student's code), on
    fresh random inputs: ``seed`` is drawn when None, so that every run of the check sees new numbers."""
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    return grading.grade(grader, name, grading.safely(lambda: diagnose_kernel(kernel, seed=seed)), hints,
                         HINTS["wrong values"])
