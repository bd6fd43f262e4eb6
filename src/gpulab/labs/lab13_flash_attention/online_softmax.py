"""Lab "Flash attention", exercises 1 and 2: the online-softmax update and the tile loop in NumPy, and their graders.

The forward kernel of :mod:`gpulab.kernels.triton_attention.forward` is two ideas wrapped in Triton: the
*online-softmax update* (fold one tile of scores into a running maximum, a running sum and an unnormalised output)
and the *tile loop* (start from an empty state, update with every tile of keys, divide at the end). The lab has the
student write both as plain NumPy functions first, because every mistake worth making is already possible there:

- :func:`online_update` -- given the running max ``m``, the running sum ``l``, the accumulator ``acc`` of a block of
  query rows, a new tile of scores ``s`` (rows x tile) and the tile's values ``v`` (tile x d), return the new
  ``(m, l, acc)``. :func:`diagnose_online_update` grades a student's version.
- :func:`tile_loop` -- attention for one block of queries by that update over tiles of ``block_n`` keys (the last
  tile may be short). :func:`diagnose_tile_loop` grades it against attention with every score stored
  (:func:`gpulab.kernels.triton_attention.reference.reference_attention`, chapter 13's ``naive_attention``).

A grader never just says "wrong". It runs the student's function on fresh random tiles, each case built so that
one kind of mistake shows (a first tile, where ``m = -inf`` and nothing needs rescaling; a tile that raises every
row's maximum, where everything must be rescaled; a tile that raises some rows only; scores of about 100), and when
the answer is wrong it runs the typical wrong answers (:data:`MISTAKES`) on the same inputs: if one of them gives
what the student's gave, the diagnosis names that mistake, and :data:`HINTS` says how to fix it. A diagnosis is a
:class:`gpulab.labs.grading.Diagnosis`, recorded with :func:`gpulab.labs.grading.grade`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from gpulab.kernels.triton_attention.reference import reference_attention
from gpulab.labs import grading


def online_update(m: np.ndarray, l: np.ndarray, acc: np.ndarray, s: np.ndarray,  # noqa: E741  (the paper's l)
                  v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of the online softmax: the state of ``rows`` query rows after one more tile of keys.

    ``m``, ``l``: (rows,) running max and running sum of ``exp(score - m)``; ``acc``: (rows, d), the sum of
    ``exp(score - m) * value`` so far; ``s``: (rows, tile) new scores; ``v``: (tile, d) their values::

        m_new = max(m, rowmax(s));  alpha = exp(m - m_new)       (how much the old max overstated the new one)
        p = exp(s - m_new);  l_new = alpha l + rowsum(p);  acc_new = alpha acc + p v

    Start from ``m = -inf``, ``l = 0``, ``acc = 0``; ``alpha`` is then ``exp(-inf) = 0``, as it should be.
    """
    m_new = np.maximum(m, s.max(axis=1))
    alpha = np.exp(m - m_new)
    p = np.exp(s - m_new[:, None])
    return m_new, alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v


def forgot_rescale(m, l, acc, s, v):  # noqa: E741
    """Wrong: adds the new tile without rescaling what was summed under the old maximum."""
    m_new = np.maximum(m, s.max(axis=1))
    p = np.exp(s - m_new[:, None])
    return m_new, l + p.sum(axis=1), acc + p @ v


def rescaled_l_only(m, l, acc, s, v):  # noqa: E741
    """Wrong: rescales the running sum but not the accumulator."""
    m_new = np.maximum(m, s.max(axis=1))
    p = np.exp(s - m_new[:, None])
    return m_new, np.exp(m - m_new) * l + p.sum(axis=1), acc + p @ v


def no_max_subtracted(m, l, acc, s, v):  # noqa: E741
    """Wrong: ``exp(s)`` instead of ``exp(s - m_new)`` (the unsafe softmax: it overflows for large scores)."""
    m_new = np.maximum(m, s.max(axis=1))
    p = np.exp(s)
    return m_new, l + p.sum(axis=1), acc + p @ v


def max_updated_after_use(m, l, acc, s, v):  # noqa: E741
    """Wrong: exponentiates the tile with the *old* maximum, then updates the maximum and rescales."""
    p = np.exp(s - m[:, None])
    m_new = np.maximum(m, s.max(axis=1))
    alpha = np.exp(m - m_new)
    return m_new, alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v


# The typical wrong updates, and the hint for each (the name is the diagnosis's problem).
MISTAKES: dict[str, tuple[Callable, str]] = {
    "forgot to rescale": (forgot_rescale, "l and acc were summed under the old maximum: multiply both by "
                                          "alpha = exp(m - m_new) before adding the new tile"),
    "rescaled l but not acc": (rescaled_l_only, "l is rescaled but acc is not: acc holds exp(s - m) * v summed "
                                                "under the old maximum too, so it needs the same alpha[:, None]"),
    "exp(s) without subtracting the max": (no_max_subtracted, "p must be exp(s - m_new[:, None]), not exp(s): "
                                                              "scores of 100 would overflow float32, and l and acc "
                                                              "must be relative to the same maximum m_new"),
    "used m before updating it": (max_updated_after_use, "p was computed with the old m (which is -inf for the "
                                                         "first tile): compute m_new first, then "
                                                         "p = exp(s - m_new[:, None])"),
}
TILE_LOOP_HINTS = {
    "not divided by l": "the loop ends with acc; the output is acc / l[:, None]",
    "dropped the last tile": "loop with range(0, n, block_n) and slice k[start:start + block_n] (the last slice "
                             "is shorter)",
    "wrong values": "the output differs from attention with every score stored: print m and l after each tile",
}
HINTS = {
    "not answered": "replace the placeholder with your code: the formulas are in the text above the cell",
    **{name: hint for name, (_, hint) in MISTAKES.items()},
    "not three arrays": "return three arrays: (m_new, l_new, acc_new)",
    "wrong values": "compare each line with online_update's formulas: m_new, alpha, p, then l and acc",
    "error": "the function takes numpy arrays (m, l, acc, s, v) and returns numpy arrays",
    **TILE_LOOP_HINTS,
}
PROBLEMS = ("ok", "error", "not answered", "not three arrays", "wrong values", *MISTAKES, "not divided by l",
            "dropped the last tile")


@dataclass(frozen=True)
class Diagnosis(grading.Diagnosis):
    """What a student's function did (``problem``: one of :data:`PROBLEMS`), and for a failure the ``case`` it
    failed on, what it ``returned`` and what was ``expected``."""

    case: str = ""
    returned: object = None
    expected: object = None
    problems: ClassVar[tuple[str, ...]] = PROBLEMS


def _close(got: object, want: np.ndarray, rtol: float) -> bool:
    """``got`` equals ``want`` norm-wise within ``rtol``, with the same infinities and NaNs in the same places (a
    typical wrong answer may overflow exactly as the student's does)."""
    try:
        got = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if got.shape != want.shape:
        return False
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite) or not np.array_equal(got[~finite], want[~finite], equal_nan=True):
        return False
    return bool(np.linalg.norm(got[finite] - want[finite]) <= rtol * np.linalg.norm(want[finite]))


def _same(got, want, rtol: float = 1e-6) -> bool:
    """Each of ``got`` close to the matching one of ``want`` (:func:`_close`)."""
    return len(got) == len(want) and all(_close(g, w, rtol) for g, w in zip(got, want, strict=True))


def update_cases(rng: np.random.Generator, rows: int = 8, tile: int = 16, d: int = 4) -> dict[str, tuple]:
    """Inputs ``(m, l, acc, s, v)`` for each case of :func:`diagnose_online_update`, drawn from ``rng``.

    The state after a first tile is made by :func:`online_update` itself, so it is a state a correct loop reaches.
    """
    def tile_of(row_max: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # scores whose row maxima are given
        s = 3 * rng.standard_normal((rows, tile))
        return s - s.max(axis=1, keepdims=True) + np.reshape(row_max, (-1, 1)), rng.standard_normal((tile, d))

    start = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, d)))
    state = online_update(*start, *tile_of(rng.uniform(-2, 2, rows)))
    m = state[0]
    some = np.where(np.arange(rows) % 2 == 0, m + 5, m - 5)  # even rows' maximum rises, odd rows' does not
    return {
        "the first tile (m = -inf, l = 0, acc = 0)": (*start, *tile_of(rng.uniform(-2, 2, rows))),
        "a tile that raises every row's maximum": (*state, *tile_of(m + 5)),
        "a tile that raises the maximum of some rows only": (*state, *tile_of(some)),
        "large scores (about 100)": (*online_update(*start, *tile_of(100.0)), *tile_of(104.0)),
    }


def _call(student_fn: Callable, args: tuple):
    """The student's answer on copies of ``args`` (an in-place update must not change what the grader compares)."""
    with np.errstate(all="ignore"):  # an overflow is part of the answer; the hint explains it
        return student_fn(*(np.array(a, copy=True) for a in args))


def _error(case: str, error: Exception) -> Diagnosis:
    said = grading.raised(error)
    if said == grading.NOT_ANSWERED:
        return Diagnosis("not answered", said, case)
    return Diagnosis("error", f"on {case}: {said}", case, repr(error))


def diagnose_online_update(student_fn: Callable, seed: int | None = None) -> Diagnosis:
    """Grade ``student_fn(m, l, acc, s, v) -> (m_new, l_new, acc_new)`` against :func:`online_update`.

    Fresh random tiles on every call (``seed`` to repeat one). The first failing case is reported with what came
    back and what was expected; the problem names the mistake when one of :data:`MISTAKES` reproduces it.
    A stub's ``None`` is "not answered".
    """
    cases = update_cases(np.random.default_rng(seed))
    for case, args in cases.items():
        expected = online_update(*args)
        try:
            returned = _call(student_fn, args)
        except Exception as error:  # a student's exception is a grade, not a crash
            return _error(case, error)
        if returned is None:
            return Diagnosis("not answered", grading.NOT_ANSWERED, case)
        if not isinstance(returned, tuple | list) or len(returned) != 3:
            return Diagnosis("not three arrays", f"on {case}: returned {grading.shown(returned)}, not three arrays",
                             case, returned, expected)
        if _same(returned, expected):
            continue
        for mistake, (wrong, _) in MISTAKES.items():
            with np.errstate(all="ignore"):
                if _same(returned, wrong(*args)):
                    return Diagnosis(mistake, f"on {case}: {mistake}", case, returned, expected)
        parts = [name for name, g, w in zip(("m", "l", "acc"), returned, expected, strict=True)
                 if not _close(g, w, 1e-6)]
        return Diagnosis("wrong values", f"on {case}: {', '.join(parts)} differ from the expected values", case,
                         returned, expected)
    return Diagnosis("ok", f"passed: {', '.join(cases)}")


def tile_loop(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_n: int,
              update: Callable = online_update) -> np.ndarray:
    """Attention of one block of queries ``q`` (rows x d) over all keys ``k`` and values ``v`` (n x d), tile by tile.

    Start from ``m = -inf``, ``l = 0``, ``acc = 0``; for each tile of ``block_n`` keys (the last may be shorter)
    compute the scores ``q k_tile^T / sqrt(d)`` and call ``update``; finish with ``acc / l``.
    """
    rows, n = q.shape[0], k.shape[0]
    m, l, acc = np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, v.shape[1]))  # noqa: E741
    for start in range(0, n, block_n):
        s = q @ k[start:start + block_n].T / math.sqrt(q.shape[1])
        m, l, acc = update(m, l, acc, s, v[start:start + block_n])  # noqa: E741
    return acc / l[:, None]


def all_scores_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``softmax(q k^T / sqrt(d)) v`` with every score stored, in float64 (the kernels' float64 reference)."""
    return reference_attention(*(torch.from_numpy(np.asarray(t, dtype=np.float64)) for t in (q, k, v)))[0].numpy()


TILE_CASES = {"8 tiles of 16 keys": (12, 128, 16), "a short last tile (100 keys, tiles of 32)": (12, 100, 32),
              "one tile larger than all 20 keys": (12, 20, 64)}  # (query rows, keys, block_n)


def diagnose_tile_loop(student_fn: Callable, seed: int | None = None) -> Diagnosis:
    """Grade ``student_fn(q, k, v, block_n) -> output`` against :func:`all_scores_attention` (all scores stored).

    Cases (:data:`TILE_CASES`): tiles that divide the keys, a short last tile, one tile larger than all the keys.
    Named slips: the output not divided by ``l``, the last partial tile dropped.
    """
    rng = np.random.default_rng(seed)
    for case, (rows, n, block_n) in TILE_CASES.items():
        q, k, v = 2 * rng.standard_normal((rows, 8)), rng.standard_normal((n, 8)), rng.standard_normal((n, 8))
        expected = all_scores_attention(q, k, v)
        try:
            answer = _call(lambda *a, n=block_n: student_fn(*a, n), (q, k, v))  # block_n: an int, not copied
        except Exception as error:  # a student's exception is a grade, not a crash
            return _error(case, error)
        if answer is None:
            return Diagnosis("not answered", grading.NOT_ANSWERED, case)
        if _same((answer,), (expected,), rtol=1e-8):
            continue
        returned = np.asarray(answer, dtype=np.float64) if np.ndim(answer) else answer
        scores = q @ k.T / math.sqrt(q.shape[1])
        undivided = np.exp(scores - scores.max(axis=1, keepdims=True)) @ v
        whole = n // block_n * block_n
        if _same((returned,), (undivided,), rtol=1e-8):
            problem = "not divided by l"
        elif 0 < whole < n and _same((returned,), (all_scores_attention(q, k[:whole], v[:whole]),), rtol=1e-8):
            problem = "dropped the last tile"
        else:
            return Diagnosis("wrong values", f"on {case}: the output differs from attention with every score stored",
                             case, returned, expected)
        detail = {"not divided by l": "the output is acc, not acc / l",
                  "dropped the last tile": f"the keys {whole} to {n - 1} (the last, short tile) were never seen"}
        return Diagnosis(problem, f"on {case}: {detail[problem]}", case, returned, expected)
    return Diagnosis("ok", f"passed: {', '.join(TILE_CASES)}")
