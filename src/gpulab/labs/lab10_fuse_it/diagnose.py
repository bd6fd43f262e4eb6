"""Graders and the experiment of the lab "Fuse it": one kernel for y = relu(x + bias) + residual.

Eager PyTorch runs ``torch.relu(x + bias) + residual`` as three kernels, each of which reads its inputs
from memory and writes its result back: ``t = x + bias``, ``u = relu(t)``, ``y = u + residual``. Every
one of them does almost no arithmetic per byte, so each runs at the speed of memory, and the chain
moves 28 bytes per element where one fused kernel, which keeps ``t`` and ``u`` in registers, moves 12
(read x and residual, write y; the bias's ``cols`` floats are read once). The lab counts those bytes
(:func:`eager_bytes`, :func:`fused_bytes`), writes the fused kernel in numba-cuda twice (one element
per thread on a 2D grid, then a grid-stride loop over the rows with a grid sized to fill the GPU
once), and measures it against a device copy, the fastest way to move bytes
(:func:`.measure.compare_with_copy`; the recorded experiment ``lab_fuse_it`` is :func:`.measure.measure_fusion`).

The graders work as :mod:`gpulab.labs.grading`' do: fresh random inputs (never zeros), the output
poisoned with NaN, guard zones after every array (on a GPU; the simulator checks bounds itself),
and, when values are wrong, a comparison with what each usual mistake computes (the bias added along
the wrong axis, the ReLU applied after the residual, a term left out), so that a hint can name it.
Nothing here raises on a student's mistake: it becomes a :class:`Diagnosis`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from gpulab.ch07_cuda_threads_blocks.threads import blocks_for
from gpulab.core import kernel_mode
from gpulab.core.correctness import poisoned
from gpulab.core.validation import fits_in_memory, positive_int
from gpulab.labs import grading, kernel_grading
from gpulab.labs.lab10_fuse_it.reference import (
    FLOAT_BYTES,
    KERNELS,
    THREADS_PER_SM,
    _is_number,
    eager_bytes,
    fused_bytes,
    grid_bounds,
    grid_reach,
    ideal_speedup,
    mistakes,
    predicted_seconds,
    reference,
)

GUARD = (16, 64)  # rows and columns of guard zone after a matrix (on a GPU), elements after the bias
TOLERANCE = 1e-5  # relative, as in kernel_checks: float32 rounding of two additions is far below it


PROBLEMS = ("ok", "error", "not a number", "not a dict", "elements, not bytes", "bias not counted",
            "bias counted as a matrix", "read and written swapped", "wrong count", "inverted", "eager bytes",
            "gigabytes", "out of bounds", "unwritten", "unwritten tail", "wrong values", "input written",
            "bias along rows", "relu after residual", "no relu", "no bias", "no residual", "bad grid",
            "columns not covered", "idle blocks", "too few blocks", "too many blocks")


@dataclass(frozen=True)
class Diagnosis(grading.Diagnosis):
    """What a student's answer or kernel showed: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says what.

    It is a :class:`gpulab.labs.grading.Diagnosis` with this module's problems, so
    :func:`gpulab.labs.grading.grade` records it as a lab check.
    """

    problems: ClassVar[tuple[str, ...]] = PROBLEMS


def _as_ours(diagnosis: grading.Diagnosis) -> Diagnosis:
    return Diagnosis(diagnosis.problem, diagnosis.detail)


COUNT_SHAPES = ((37, 50), (1000, 768), (2**14, 2**12))  # (rows, cols) of the counting checks


def _same(value: float, expected: float) -> bool:
    return abs(value - expected) <= 1e-9 * max(1.0, abs(expected))


def _count_problem(what: str, got: object, expected: int, rows: int, cols: int) -> Diagnosis | None:
    """None if ``got`` is the count ``expected`` of bytes; else the mistake that explains it, if one does."""
    if not _is_number(got):
        return Diagnosis("not a number", f"{what} is {got!r}, not a number of bytes")
    if _same(got, expected):
        return None
    n = rows * cols
    said = f"{what} at rows = {rows}, cols = {cols}: {got:,}, not {expected:,}"
    if _same(got * FLOAT_BYTES, expected):
        return Diagnosis("elements, not bytes", said + ": that is the count of elements")
    if cols and _same(got, expected - FLOAT_BYTES * cols):
        return Diagnosis("bias not counted", said + f": {FLOAT_BYTES * cols:,} bytes short, the bias's")
    if cols and _same(got, expected + FLOAT_BYTES * (n - cols)):
        return Diagnosis("bias counted as a matrix", said + ": the bias was counted as rows x cols floats")
    tensors = (got - expected) / (FLOAT_BYTES * n)
    if abs(tensors - round(tensors)) < 1e-9 and round(tensors):
        k = round(tensors)
        return Diagnosis("wrong count", said + f": {abs(k)} tensor{'s' * (abs(k) != 1)} of rows x cols floats too "
                                               f"{'many' if k > 0 else 'few'}")
    return Diagnosis("wrong count", said)


def _pair_problem(what: str, got: object, expected: tuple[int, int], rows: int, cols: int) -> Diagnosis | None:
    if not isinstance(got, tuple | list) or len(got) != 2:
        return Diagnosis("not a number", f"for {what} the answer was {got!r}, not a pair (bytes read, bytes written)")
    if all(_is_number(v) for v in got) and _same(got[0], expected[1]) and _same(got[1], expected[0]) \
            and expected[0] != expected[1]:
        return Diagnosis("read and written swapped", f"{what} at rows = {rows}, cols = {cols}: {tuple(got)}, with "
                                                     "read and written the other way round")
    return (_count_problem(f"bytes read by {what}", got[0], expected[0], rows, cols)
            or _count_problem(f"bytes written by {what}", got[1], expected[1], rows, cols))


def _call(fn: Callable, *arguments: object) -> tuple[object, Diagnosis | None]:
    try:
        return fn(*arguments), None
    except Exception as error:  # a grader reports, never raises
        call = f"{getattr(fn, '__name__', 'the function')}({', '.join(map(repr, arguments))})"
        return None, Diagnosis("error", f"{call} raised {type(error).__name__}: {error}")


def diagnose_eager_bytes(fn: Callable[[int, int], Mapping], shapes: Sequence[tuple[int, int]] = COUNT_SHAPES
                         ) -> Diagnosis:
    """``fn(rows, cols)`` must return :func:`eager_bytes`: {kernel: (bytes read, bytes written)} for :data:`KERNELS`."""
    for rows, cols in shapes:
        got, failure = _call(fn, rows, cols)
        if failure:
            return failure
        if not isinstance(got, Mapping) or set(got) != set(KERNELS):
            return Diagnosis("not a dict", f"eager_bytes({rows}, {cols}) returned {got!r}, not a dict with the keys "
                                           f"{', '.join(map(repr, KERNELS))}")
        for kernel, expected in eager_bytes(rows, cols).items():
            problem = _pair_problem(f"the kernel {kernel!r}", got[kernel], expected, rows, cols)
            if problem:
                return problem
    return Diagnosis("ok", "every kernel's bytes read and written, for every shape")


def diagnose_fused_bytes(fn: Callable[[int, int], tuple], shapes: Sequence[tuple[int, int]] = COUNT_SHAPES
                         ) -> Diagnosis:
    """``fn(rows, cols)`` must return :func:`fused_bytes`: (bytes read, bytes written) of the fused kernel."""
    for rows, cols in shapes:
        got, failure = _call(fn, rows, cols)
        if failure:
            return failure
        problem = _pair_problem("the fused kernel", got, fused_bytes(rows, cols), rows, cols)
        if problem:
            return problem
    return Diagnosis("ok", "the fused kernel's bytes read and written, for every shape")


def diagnose_speedup(fn: Callable[[int, int], float], shapes: Sequence[tuple[int, int]] = COUNT_SHAPES) -> Diagnosis:
    """``fn(rows, cols)`` must return :func:`ideal_speedup`, the eager chain's bytes over the fused kernel's."""
    for rows, cols in shapes:
        got, failure = _call(fn, rows, cols)
        if failure:
            return failure
        expected = ideal_speedup(rows, cols)
        if not _is_number(got):
            return Diagnosis("not a number", f"ideal_speedup({rows}, {cols}) returned {got!r}, not a number")
        said = f"ideal_speedup({rows}, {cols}) is {got:.6g}, not {expected:.6g}"
        if _same(got * expected, 1.0):
            return Diagnosis("inverted", said + ": that is the fused kernel's bytes over the eager chain's")
        if not _same(got, expected):
            return Diagnosis("wrong count", said)
    return Diagnosis("ok", "the eager chain's bytes over the fused kernel's, for every shape")


GRID_CASES = ((2**14, 2**12, (32, 8), 132), (2**14, 2**12, (16, 16), 108), (100, 50, (16, 8), 132),
              (2**20, 64, (32, 8), 40), (5, 7, (32, 4), 2))  # (rows, cols, threads, sm_count)


def diagnose_rows_grid(fn: Callable, cases: Sequence[tuple] = GRID_CASES,
                       threads_per_sm: int = THREADS_PER_SM) -> Diagnosis:
    """``fn(rows, cols, threads, sm_count)`` must return a grid that :func:`grid_bounds` accepts, for every case."""
    for rows, cols, threads, sms in cases:
        got, failure = _call(fn, rows, cols, threads, sms)
        if failure:
            return failure
        said = f"rows_grid({rows}, {cols}, {threads}, {sms}) = {got!r}"
        if not diagnose_grid(got).ok:
            return Diagnosis("bad grid", f"{said}: not two whole numbers of blocks (along x, along y)")
        across, low, high = grid_bounds(rows, cols, threads, sms, threads_per_sm)
        if got[0] != across:
            return Diagnosis("columns not covered", f"{said}: along x it needs ceil({cols} / {threads[0]}) = {across} "
                                                    "blocks, one thread per column")
        down = got[1]
        if down > blocks_for(rows, threads[1]):
            return Diagnosis("idle blocks", f"{said}: {down} rows of blocks of {threads[1]} threads, for {rows} rows")
        if down < low:
            return Diagnosis("too few blocks", f"{said}: {across * down} blocks for {sms} SMs")
        if down > high:
            per_sm = max(1, threads_per_sm // (threads[0] * threads[1]))
            return Diagnosis("too many blocks", f"{said}: {across * down} blocks, where {sms} SMs hold "
                                                f"{sms * per_sm} blocks of {threads[0] * threads[1]} threads at once")
    return Diagnosis("ok", "every column covered once, and enough blocks to fill every SM, no more than fit at once")


def diagnose_grid(grid: object, threads: Sequence[int] | None = None, rows: int | None = None,
                  cols: int | None = None) -> Diagnosis:
    """"ok" if ``grid`` is two whole numbers of blocks (>= 1), else "bad grid"; given ``threads``, ``rows`` and
    ``cols``, also "bad grid" for a grid that reaches more than twice past the matrix."""
    if not (isinstance(grid, tuple | list) and len(grid) == 2
            and all(isinstance(b, numbers.Integral) and not isinstance(b, bool) and b >= 1 for b in grid)):
        return Diagnosis("bad grid", f"the grid is {grid!r}, not two whole numbers of blocks (along x, along y)")
    if threads is not None and rows is not None and cols is not None \
            and grid_reach(grid, threads) > 2 * max(rows, cols, *threads):
        return Diagnosis("bad grid", f"a grid of {tuple(grid)} blocks of {tuple(threads)} threads reaches far past a "
                                     f"{rows} x {cols} matrix")
    return Diagnosis("ok", f"a grid of {grid[0]} x {grid[1]} blocks")


def diagnose_fused(call: Callable, rows: int, cols: int, reach: int = 0, seed: int = 0) -> Diagnosis:
    """Run ``call(x, bias, residual, out)`` on fresh data; ``out`` must become relu(x + bias) + residual.

    ``call`` gets kernel arguments (:func:`gpulab.core.kernel_mode.device_array`) and launches a kernel. Every
    array is followed by a guard zone (on a GPU; the simulator checks bounds itself) and ``out`` is
    poisoned. The guard zones reach ``reach`` rows and columns at least (:func:`grid_reach` of the
    launch), so that a kernel with its rows and columns swapped, or without a bounds check, writes into
    them rather than into other memory. Wrong values are compared with :func:`mistakes`; with
    ``rows <= cols``, a bias indexed by the row is caught too. An input changed by the kernel is a
    mistake of its own.
    """
    rows, cols = positive_int("rows", rows), positive_int("cols", cols)
    guard = (max(GUARD[0], reach - rows), max(GUARD[1], reach - cols))
    device = kernel_mode.device()
    fits_in_memory("rows and cols", 10 * 8 * (rows + guard[0]) * (cols + guard[1]), device)
    generator = torch.Generator().manual_seed(seed)
    x = kernel_grading.guarded(kernel_grading.fresh((rows, cols), generator), guard, generator)
    bias = kernel_grading.guarded(kernel_grading.fresh((cols,), generator), guard[1], generator)
    residual = kernel_grading.guarded(kernel_grading.fresh((rows, cols), generator), guard, generator)
    out = kernel_grading.guarded(poisoned((rows, cols), torch.float32, device), guard, generator)
    inputs = {"x": x, "bias": bias, "residual": residual}
    before = {name: t.buffer.clone() for name, t in inputs.items()}
    failure = kernel_grading.launch(lambda: call(*(kernel_mode.device_array(t.view) for t in (x, bias, residual, out))))
    if failure:
        return _as_ours(failure)
    for name, tensor in inputs.items():
        if not torch.equal(tensor.buffer, before[name]):
            return Diagnosis("input written", f"the kernel changed {name} (or the memory after it): it may only "
                                              "write out")
    if not out.guard_intact():
        return Diagnosis("out of bounds", "the kernel wrote past the end of out's rows or columns (into the guard "
                                          "zone that follows them in memory)")
    diagnosis = kernel_grading.compare(out.view, reference(x.view, bias.view, residual.view))
    if diagnosis.problem == "wrong values":
        for problem, (result, what) in mistakes(x.view, bias.view, residual.view).items():
            if kernel_grading.compare(out.view, result).ok:
                return Diagnosis(problem, f"{diagnosis.detail}; {what}")
    return _as_ours(diagnosis)


def diagnose_launch(kernel, grid: object, threads: tuple[int, int], rows: int, cols: int, seed: int = 0) -> Diagnosis:
    """:func:`diagnose_fused` of ``kernel[grid, threads](x, bias, residual, out)``, once :func:`diagnose_grid`
    has found ``grid`` sound; the guard zones reach as far as the grid does."""
    problem = diagnose_grid(grid, threads, rows, cols)
    if not problem.ok:
        return problem
    grid = (int(grid[0]), int(grid[1]))
    return diagnose_fused(lambda *arrays: kernel[grid, threads](*arrays), rows, cols, grid_reach(grid, threads), seed)


PREDICTION_CASES = ((2**14, 2**12, 4000.0), (1000, 768, 900.0), (37, 50, 3.5))  # (rows, cols, copy GB/s)


def diagnose_predicted_seconds(fn: Callable[[int, int, float], float],
                               cases: Sequence[tuple[int, int, float]] = PREDICTION_CASES) -> Diagnosis:
    """``fn(rows, cols, copy_gbytes_per_s)`` must return :func:`predicted_seconds`."""
    for rows, cols, gbs in cases:
        got, failure = _call(fn, rows, cols, gbs)
        if failure:
            return failure
        if not _is_number(got):
            return Diagnosis("not a number", f"predicted_seconds({rows}, {cols}, {gbs}) returned {got!r}")
        expected = predicted_seconds(rows, cols, gbs)
        said = f"predicted_seconds({rows}, {cols}, {gbs}) is {got:.6g}, not {expected:.6g}"
        if _same(got, expected):
            continue
        eager = sum(sum(pair) for pair in eager_bytes(rows, cols).values()) / (gbs * 1e9)
        if _same(got, eager):
            return Diagnosis("eager bytes", said + ": that is the time of the eager chain's bytes")
        for factor in (1e9, 1e-9, 1e6, 1e3):
            if _same(got, expected * factor):
                return Diagnosis("gigabytes", said + f": {factor:g} times too {'large' if factor > 1 else 'small'}")
        if _same(got * FLOAT_BYTES, expected):
            return Diagnosis("elements, not bytes", said + ": that is the elements' count over the bandwidth")
        return Diagnosis("wrong count", said)
    return Diagnosis("ok", "the fused kernel's bytes over the copy's bandwidth, for every case")
