"""The measurement of the lab "Flash attention" (GPU only): a forward kernel's time against every SDPA backend.

:func:`compare_with_sdpa` checks, then times, forward launches -- the student's kernel, or the lab's and the book's
(:func:`lab_kernel_against_sdpa`, the recorded experiment ``lab_flash_attention``) -- and
``F.scaled_dot_product_attention`` forced to each of its backends (math, memory-efficient, flash, cuDNN, through the
switch of :mod:`gpulab.kernels.triton_attention.measure`), all on the same non-causal inputs. Each is checked first at
a small length against float64 attention; a wrong one is a row that says so and is not timed, a backend that refuses
the inputs is a row "not available". The implementations take turns over a few rounds, each starting a round in
turn, and a row's time is the median of its rounds' medians: a GPU's clock moves from one second to the next, and a
ratio taken within one run, turn by turn, is the one that means something.

**Size.** As the book's FlashAttention experiment (``triton_attention``): ``tokens = batch x seq_len`` (16k) and a
model width of 2048 (``heads = 2048 / head_dim``); the lab's point is 4096 tokens with head size 128, batch 4 and 16
heads, about 137 GFLOP per forward pass (``4 b h s^2 d``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from gpulab.core import env, kernel_mode, timing
from gpulab.core.correctness import random_tensor
from gpulab.core.provenance import experiment
from gpulab.core.tables import Column, Table, table
from gpulab.core.validation import fits_in_memory, positive_int, supported_dtype, torch_dtype
from gpulab.kernels.triton_attention.forward import HEAD_DIMS, attention_forward
from gpulab.kernels.triton_attention.measure import SDPA_BACKENDS, _context, forward_flops
from gpulab.kernels.triton_attention.reference import check_attention
from gpulab.labs.lab13_flash_attention.kernel import attend, flash_forward

LABELS = {"yours": "your kernel", "lab": "the lab's kernel", "book": "the book's kernel",
          **{name: label for name, (label, _) in SDPA_BACKENDS.items()}}


def attention_shape(seq_len: int, head_dim: int, tokens: int = 16384, model_dim: int = 2048) -> tuple[int, ...]:
    """``(batch, heads, seq_len, head_dim)`` with ``batch = tokens / seq_len`` (at least 1), ``heads = model_dim /
    head_dim``; a ValueError for a head size the kernels do not take or one that does not divide the width."""
    seq_len, tokens, model_dim = (positive_int(n, v) for n, v in (("seq_len", seq_len), ("tokens", tokens),
                                                                  ("model_dim", model_dim)))
    if head_dim not in HEAD_DIMS or model_dim % head_dim:
        raise ValueError(f"head_dim: one of {HEAD_DIMS} dividing model_dim {model_dim}, got {head_dim!r}")
    return max(1, tokens // seq_len), model_dim // head_dim, seq_len, head_dim


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return (lines[-1] if lines and lines[0].startswith("at ") else lines[0] if lines else type(error).__name__)[:160]


def _checked(name: str, fn: Callable, head_dim: int, dtype: torch.dtype, check_len: int, device) -> str:
    """"ok" if ``fn(q, k, v)`` agrees with float64 attention at ``check_len`` tokens; else why not, in words."""
    try:
        with _context("triton" if name not in SDPA_BACKENDS else name):
            check_attention(lambda q, k, v, causal: fn(q, k, v), 1, 2, check_len, head_dim, dtype, False, device,
                            gradients=False, what=LABELS.get(name, name))
    except AssertionError as error:
        return f"wrong result: {_first_line(error)}"
    except Exception as error:  # SDPA's "No available kernel", a student's kernel that does not compile, ...
        prefix = "not available" if name in SDPA_BACKENDS else "failed"
        return f"{prefix}: {type(error).__name__}: {_first_line(error)}"
    return "ok"


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def compare_with_sdpa(launches: Mapping[str, Callable], seq_len: int = 4096, head_dim: int = 128,
                      dtype: str = "bfloat16", rounds: int = 3, check_len: int = 256, tokens: int = 16384,
                      model_dim: int = 2048) -> list[dict]:
    """Check, then time, each of ``launches`` (name -> ``fn(q, k, v)`` returning the attention output) and SDPA with
    each backend, on the same ``(batch, heads, seq_len, head_dim)`` inputs (:func:`attention_shape`); GPU only.

    A row per implementation: ``implementation`` and ``label``, ``status`` ("ok", "wrong result: ...", "not
    available: ...", "failed: ...", "out of memory"), and for the timed ones ``seconds`` (the median over
    ``rounds`` of each round's median), ``round_seconds``, ``tflops`` (:func:`gpulab.kernels.triton_attention.
    measure.forward_flops` over ``seconds``) and ``vs_best_sdpa`` (the fastest SDPA backend's time over this
    one's, its share of that speed), with ``best_sdpa`` naming that backend.
    """
    kernel_mode.require_gpu("compare_with_sdpa")
    device = env.device()
    label = supported_dtype("dtype", dtype, device)
    shape = attention_shape(seq_len, head_dim, tokens, model_dim)
    rounds, check_len = positive_int("rounds", rounds), positive_int("check_len", check_len)
    size = torch.empty((), dtype=torch_dtype(label)).element_size()
    fits_in_memory("seq_len", 4 * size * shape[0] * shape[1] * seq_len * head_dim, device)
    fns = {**launches, **dict.fromkeys(SDPA_BACKENDS, _sdpa)}
    rows = {name: {"implementation": name, "label": LABELS.get(name, name), "batch": shape[0], "heads": shape[1],
                   "seq_len": seq_len, "head_dim": head_dim, "dtype": label,
                   "status": _checked(name, fn, head_dim, torch_dtype(label), check_len, device)}
            for name, fn in fns.items()}
    q, k, v = (random_tensor(shape, torch_dtype(label), device) for _ in range(3))
    timed = {name: [] for name, row in rows.items() if row["status"] == "ok"}
    names = list(timed)
    for round_number in range(rounds if names else 0):
        first = round_number % len(names)  # each implementation starts a round in turn
        for name in names[first:] + names[:first]:
            if rows[name]["status"] != "ok":
                continue
            try:
                with _context("triton" if name not in SDPA_BACKENDS else name):
                    measured = timing.measure(lambda fn=fns[name]: fn(q, k, v), device=device, target_s=0.1)
            except torch.cuda.OutOfMemoryError:  # SDPA's math backend stores the scores
                rows[name]["status"] = "out of memory"
                torch.cuda.empty_cache()
                continue
            timed[name].append(measured.median_s)
    work = forward_flops(*shape, causal=False)
    for name, seconds in timed.items():
        if rows[name]["status"] == "ok":
            median = statistics.median(seconds)
            rows[name].update(seconds=median, round_seconds=seconds, tflops=work / median / 1e12)
    sdpa = {name: rows[name]["seconds"] for name in SDPA_BACKENDS if "seconds" in rows[name]}
    if sdpa:
        best = min(sdpa, key=sdpa.get)
        for row in rows.values():
            if "seconds" in row:
                row.update(best_sdpa=best, vs_best_sdpa=sdpa[best] / row["seconds"])
    return list(rows.values())


@experiment("lab_flash_attention")
def lab_kernel_against_sdpa(seq_len: int = 4096, head_dim: int = 128, dtype: str = "bfloat16",
                            rounds: int = 3) -> list[dict]:
    """The lab's answer (:func:`.kernel.flash_forward`) and the book's tuned forward kernel
    (:func:`gpulab.kernels.triton_attention.forward.attention_forward`) against every SDPA backend
    (:func:`compare_with_sdpa`); GPU only."""
    return compare_with_sdpa({"lab": lambda q, k, v: attend(flash_forward, q, k, v),
                              "book": lambda q, k, v: attention_forward(q, k, v)[0]},
                             seq_len, head_dim, dtype, rounds)


def _status(row: dict) -> str:
    return row["status"].split(":")[0]


COLUMNS = (Column("label", "implementation"), Column("seconds", "time", "ms", lambda s: f"{s * 1e3:,.3f}"),
           Column("tflops", "forward", "TFLOP/s", ",.0f"),
           Column("vs_best_sdpa", "speed vs the fastest SDPA", "", ".0%"), Column("status", format=str))


def _fastest_first(rows: Sequence[dict]) -> list[dict]:
    """``rows`` ordered by time (those not timed last), each status cut to its first words."""
    return sorted(({**r, "status": _status(r)} for r in rows), key=lambda r: r.get("seconds", float("inf")))


def comparison_table(rows: Sequence[dict], caption: str = "") -> Table:
    """The rows of :func:`compare_with_sdpa` as a table, the fastest first (a row not timed says why, briefly)."""
    return table(_fastest_first(rows), COLUMNS, caption=caption)


def gpu_table(runs: Sequence[tuple[str, Sequence[dict]]], caption: str = "") -> Table:
    """:func:`comparison_table` for several GPUs, one under the other: ``runs`` is ``(GPU, rows)`` pairs."""
    return table([{"gpu": gpu, **row} for gpu, rows in runs for row in _fastest_first(rows)],
                 (Column("gpu", "GPU"), *COLUMNS), caption=caption)


def book_kernel_rows(rows: Sequence[dict], seq_len: int = 4096, head_dim: int = 128) -> list[dict]:
    """From a recording of the book's FlashAttention experiment (``triton_attention``): its non-causal forward
    rows at ``seq_len`` and ``head_dim``, in the form of :func:`compare_with_sdpa`'s (``vs_best_sdpa`` included)."""
    point = [r for r in rows if r.get("seq_len") == seq_len and r.get("head_dim") == head_dim
             and r.get("causal") is False]
    out = [{"implementation": "book" if r["implementation"] == "triton" else r["implementation"],
            "status": r.get("status", "ok"), "dtype": r.get("dtype"),
            **({"seconds": r["forward_seconds"], "tflops": r["forward_tflops"]} if r.get("forward_tflops") else {})}
           for r in point]
    sdpa = [r["seconds"] for r in out if r["implementation"] in SDPA_BACKENDS and "seconds" in r]
    for row in out:
        row["label"] = LABELS.get(row["implementation"], row["implementation"])
        if sdpa and "seconds" in row:
            row["vs_best_sdpa"] = min(sdpa) / row["seconds"]
    return out
