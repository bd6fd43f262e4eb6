"""Graders and the experiment of the lab "Fuse it": one kernel for y = relu(x + bias) + residual.

Eager PyTorch runs ``torch.relu(x + bias) + residual`` as three kernels, each of which reads its inputs
from memory and writes its result back: ``t = x + bias``, ``u = relu(t)``, ``y = u + residual``. Every
one of them does almost no arithmetic per byte, so each runs at the speed of memory, and the chain
moves 28 bytes per element where one fused kernel, which keeps ``t`` and ``u`` in registers, moves 12
(read x and residual, write y; the bias's ``cols`` floats are read once). The lab counts those bytes
(:func:`eager_bytes`, :func:`fused_bytes`), writes the fused kernel in numba-cuda twice (one element
per thread on a 2D grid, then a grid-stride loop over the rows with a grid sized to fill the GPU
once), and measures it against a device copy, the fastest way to move bytes
(:func:`compare_with_copy`; the recorded experiment ``lab_fuse_it`` is :func:`measure_fusion`).

The graders work as :mod:`gpulab.kernel_checks`' do: fresh random inputs (never zeros), the output
poisoned with NaN, guard zones after every array (on a GPU; the simulator checks bounds itself),
and, when values are wrong, a comparison with what each usual mistake computes (the bias added along
the wrong axis, the ReLU applied after the residual, a term left out), so that a hint can name it.
Nothing here raises on a student's mistake: it becomes a :class:`Diagnosis`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpulab import blas, env, kernel_checks, kernels, plots, timing
from gpulab.correctness import poisoned
from gpulab.provenance import experiment
from gpulab.threads import blocks_for
from gpulab.validation import fits_in_memory, positive_int

cuda = kernels.numba_cuda()

FLOAT_BYTES = 4  # float32
KERNELS = ("x + bias", "relu", "+ residual")  # eager PyTorch's three kernels, in the order they run
TARGET_FRACTION = 0.8  # the lab's target: the fused kernel at 80% or more of a copy's bandwidth
THREADS_PER_SM = 2048  # resident threads per SM on Ampere and Hopper (A100, H100, H200); 1024 on Turing
GUARD = (16, 64)  # rows and columns of guard zone after a matrix (on a GPU), elements after the bias
TOLERANCE = 1e-5  # relative, as in kernel_checks: float32 rounding of two additions is far below it
DTYPE = np.float32

PROBLEMS = ("ok", "error", "not a number", "not a dict", "elements, not bytes", "bias not counted",
            "bias counted as a matrix", "read and written swapped", "wrong count", "inverted", "eager bytes",
            "gigabytes", "out of bounds", "unwritten", "unwritten tail", "wrong values", "input written",
            "bias along rows", "relu after residual", "no relu", "no bias", "no residual", "bad grid",
            "columns not covered", "idle blocks", "too few blocks", "too many blocks")


@dataclass(frozen=True)
class Diagnosis(kernel_checks.Diagnosis):
    """What a student's answer or kernel showed: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says what.

    It is a :class:`gpulab.kernel_checks.Diagnosis` with this module's problems, so
    :func:`gpulab.kernel_checks.grade` records it as a lab check.
    """

    problems: ClassVar[tuple[str, ...]] = PROBLEMS


def _as_ours(diagnosis: kernel_checks.Diagnosis) -> Diagnosis:
    return Diagnosis(diagnosis.problem, diagnosis.detail)


# ---------------------------------------------------------------------------------------------
# Exercise 1: the bytes each version moves


def eager_bytes(rows: int, cols: int) -> dict[str, tuple[int, int]]:
    """Bytes (read, written) of each of eager PyTorch's kernels for ``relu(x + bias) + residual``.

    Each tensor a kernel touches counts once: ``x + bias`` reads x (rows x cols floats) and the bias
    (cols floats) and writes t; ``relu`` reads t and writes u; ``+ residual`` reads u and residual and
    writes y.
    """
    n = positive_int("rows", rows) * positive_int("cols", cols)
    return {"x + bias": (FLOAT_BYTES * (n + cols), FLOAT_BYTES * n),
            "relu": (FLOAT_BYTES * n, FLOAT_BYTES * n),
            "+ residual": (FLOAT_BYTES * 2 * n, FLOAT_BYTES * n)}


def fused_bytes(rows: int, cols: int) -> tuple[int, int]:
    """Bytes (read, written) of one fused kernel: read x, residual and the bias once, write y once."""
    n = positive_int("rows", rows) * positive_int("cols", cols)
    return FLOAT_BYTES * (2 * n + cols), FLOAT_BYTES * n


def ideal_speedup(rows: int, cols: int) -> float:
    """How many times faster fusion makes the chain if every kernel runs at the same bandwidth: bytes over bytes."""
    return sum(sum(pair) for pair in eager_bytes(rows, cols).values()) / sum(fused_bytes(rows, cols))


COUNT_SHAPES = ((37, 50), (1000, 768), (2**14, 2**12))  # (rows, cols) of the counting checks


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


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


# ---------------------------------------------------------------------------------------------
# The kernels: the reference, and what the usual mistakes compute


def reference(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """relu(x + bias) + residual in float64, the bias added to every row."""
    return torch.relu(x.double() + bias.double()) + residual.double()


def mistakes(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> dict[str, tuple[torch.Tensor, str]]:
    """What a fused kernel computes under each usual mistake (float64): {problem: (result, what it did)}."""
    x, bias, residual = x.double(), bias.double(), residual.double()
    rows = x.shape[0]
    found = {
        "relu after residual": (torch.relu(x + bias + residual), "they are relu(x + bias + residual): the ReLU "
                                                                  "came after adding the residual"),
        "no relu": (x + bias + residual, "they are x + bias + residual: the ReLU is missing"),
        "no bias": (torch.relu(x) + residual, "they are relu(x) + residual: the bias is missing"),
        "no residual": (torch.relu(x + bias), "they are relu(x + bias): the residual is missing"),
    }
    if rows <= bias.shape[0]:  # bias[row]: in bounds only while rows <= cols
        found["bias along rows"] = (torch.relu(x + bias[:rows, None]) + residual,
                                    "they are relu(x[row, col] + bias[row]) + residual[row, col]: the bias was "
                                    "indexed by the row")
    return found


@cuda.jit
def fused_per_element(x, bias, residual, out):
    """out[row, col] = relu(x[row, col] + bias[col]) + residual[row, col]: one element per thread, 2D grid."""
    col, row = cuda.grid(2)  # x runs along a row: consecutive threads of a warp read consecutive columns
    if row < out.shape[0] and col < out.shape[1]:
        value = x[row, col] + bias[col]
        out[row, col] = (value if value > DTYPE(0) else DTYPE(0)) + residual[row, col]


@cuda.jit
def fused_rows(x, bias, residual, out):
    """The same, with the grid covering the columns once and each thread stepping down the rows by the grid's
    height, four rows at a time: all eight loads of a step are issued before the first store, so that each
    thread keeps 32 bytes in flight instead of 8 (chapter 8, "bytes in flight")."""
    col, row = cuda.grid(2)
    if col < out.shape[1]:
        b = bias[col]  # loaded once, used for every row this thread visits
        _, step = cuda.gridsize(2)
        rows, zero = out.shape[0], DTYPE(0)
        while row + 3 * step < rows:  # four whole rows left for this thread
            x0, x1, x2, x3 = x[row, col], x[row + step, col], x[row + 2 * step, col], x[row + 3 * step, col]
            r0, r1 = residual[row, col], residual[row + step, col]
            r2, r3 = residual[row + 2 * step, col], residual[row + 3 * step, col]
            out[row, col] = max(x0 + b, zero) + r0
            out[row + step, col] = max(x1 + b, zero) + r1
            out[row + 2 * step, col] = max(x2 + b, zero) + r2
            out[row + 3 * step, col] = max(x3 + b, zero) + r3
            row += 4 * step
        while row < rows:  # the last few rows, one at a time
            out[row, col] = max(x[row, col] + b, zero) + residual[row, col]
            row += step


def covering_grid(rows: int, cols: int, threads: tuple[int, int]) -> tuple[int, int]:
    """Blocks (along x, along y) of ``threads = (tx, ty)`` that give every element of a rows x cols matrix a thread."""
    tx, ty = threads
    return blocks_for(cols, tx), blocks_for(rows, ty)


def rows_grid(rows: int, cols: int, threads: tuple[int, int], sm_count: int,
              threads_per_sm: int = THREADS_PER_SM) -> tuple[int, int]:
    """The grid of :func:`fused_rows`: every column covered once, and as many rows of blocks as fill the GPU once.

    ``threads_per_sm // (tx ty)`` blocks fit on an SM at a time (if nothing else limits them), so
    ``sm_count`` times that fill the GPU; more rows of blocks than the matrix has rows of threads would idle.
    """
    tx, ty = threads
    across = blocks_for(cols, tx)
    resident = sm_count * max(1, threads_per_sm // (tx * ty))
    return across, max(1, min(blocks_for(rows, ty), blocks_for(resident, across)))


def grid_bounds(rows: int, cols: int, threads: tuple[int, int], sm_count: int,
                threads_per_sm: int = THREADS_PER_SM) -> tuple[int, int, int]:
    """(blocks along x, fewest and most blocks along y) that :func:`diagnose_rows_grid` accepts.

    Along x the grid covers the columns exactly. Along y: at least enough rows of blocks for one block
    per SM, at most as many as fit on the GPU at once, and never more than the matrix has rows of
    threads (where it has fewer, exactly that many).
    """
    tx, ty = threads
    across = blocks_for(cols, tx)
    full = blocks_for(rows, ty)
    low = min(full, blocks_for(sm_count, across))
    high = min(full, max(low, blocks_for(sm_count * max(1, threads_per_sm // (tx * ty)), across)))
    return across, low, high


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


def grid_reach(grid: Sequence[int], threads: Sequence[int]) -> int:
    """The most threads a launch of ``grid`` blocks of ``threads`` has along x or along y."""
    return max(grid[0] * threads[0], grid[1] * threads[1])


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

    ``call`` gets kernel arguments (:func:`gpulab.kernels.device_array`) and launches a kernel. Every
    array is followed by a guard zone (on a GPU; the simulator checks bounds itself) and ``out`` is
    poisoned. The guard zones reach ``reach`` rows and columns at least (:func:`grid_reach` of the
    launch), so that a kernel with its rows and columns swapped, or without a bounds check, writes into
    them rather than into other memory. Wrong values are compared with :func:`mistakes`; with
    ``rows <= cols``, a bias indexed by the row is caught too. An input changed by the kernel is a
    mistake of its own.
    """
    rows, cols = positive_int("rows", rows), positive_int("cols", cols)
    guard = (max(GUARD[0], reach - rows), max(GUARD[1], reach - cols))
    device = kernels.device()
    fits_in_memory("rows and cols", 10 * 8 * (rows + guard[0]) * (cols + guard[1]), device)
    generator = torch.Generator().manual_seed(seed)
    x = kernel_checks.guarded(kernel_checks.fresh((rows, cols), generator), guard, generator)
    bias = kernel_checks.guarded(kernel_checks.fresh((cols,), generator), guard[1], generator)
    residual = kernel_checks.guarded(kernel_checks.fresh((rows, cols), generator), guard, generator)
    out = kernel_checks.guarded(poisoned((rows, cols), torch.float32, device), guard, generator)
    inputs = {"x": x, "bias": bias, "residual": residual}
    before = {name: t.buffer.clone() for name, t in inputs.items()}
    failure = kernel_checks.launch(lambda: call(*(kernels.device_array(t.view) for t in (x, bias, residual, out))))
    if failure:
        return _as_ours(failure)
    for name, tensor in inputs.items():
        if not torch.equal(tensor.buffer, before[name]):
            return Diagnosis("input written", f"the kernel changed {name} (or the memory after it): it may only "
                                              "write out")
    if not out.guard_intact():
        return Diagnosis("out of bounds", "the kernel wrote past the end of out's rows or columns (into the guard "
                                          "zone that follows them in memory)")
    diagnosis = kernel_checks.compare(out.view, reference(x.view, bias.view, residual.view))
    if diagnosis.problem == "wrong values":
        for problem, (result, what) in mistakes(x.view, bias.view, residual.view).items():
            if kernel_checks.compare(out.view, result).ok:
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


# ---------------------------------------------------------------------------------------------
# Exercise 4: the fused kernel against a copy, and against eager PyTorch


def predicted_seconds(rows: int, cols: int, copy_gbytes_per_s: float) -> float:
    """The fused kernel's time if it moved its bytes (:func:`fused_bytes`) as fast as a copy moves bytes."""
    if not _is_number(copy_gbytes_per_s) or copy_gbytes_per_s <= 0:
        raise ValueError(f"copy_gbytes_per_s: a positive bandwidth in GB/s, got {copy_gbytes_per_s!r}")
    return sum(fused_bytes(rows, cols)) / (copy_gbytes_per_s * 1e9)


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


def _written_right(out: torch.Tensor, expected: torch.Tensor) -> bool:
    """Every element of ``out`` within :data:`TOLERANCE` of ``expected`` (relative to its largest value); on device."""
    difference = (out.double() - expected).abs().max()
    return bool(difference <= TOLERANCE * max(1.0, float(expected.abs().max())))  # NaN compares False


def _time_versions(launches: Mapping[str, Callable], rows: int, cols: int, device: torch.device) -> list[dict]:
    """Eager PyTorch and each launch at rows x cols: checked against float64, then timed (seconds, spread)."""
    generator = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(rows, cols, generator=generator).to(device) for _ in range(2))
    bias = torch.randn(cols, generator=generator).to(device)
    expected = reference(x, bias, residual)

    def eager() -> torch.Tensor:
        return torch.relu(x + bias) + residual  # three kernels: add (broadcast), relu, add

    table = [{"kernel": "eager PyTorch (3 kernels)", "bytes": sum(sum(p) for p in eager_bytes(rows, cols).values()),
              "status": "ok" if _written_right(eager(), expected) else "wrong result"}]
    if table[0]["status"] == "ok":
        measured = timing.measure(eager, device=device)
        table[0].update(seconds=measured.median_s, spread=measured.spread)
    out = poisoned((rows, cols), torch.float32, device)
    arguments = [kernels.device_array(t) for t in (x, bias, residual, out)]  # once, outside the timed calls
    for name, launch in launches.items():
        row = {"kernel": name, "bytes": sum(fused_bytes(rows, cols))}
        out.fill_(math.nan)
        try:
            launch(*arguments)
            kernels.synchronize()
            row["status"] = "ok" if _written_right(out, expected) else "wrong result"
        except Exception as error:  # a student's launch: report it in the row
            row["status"] = f"failed: {type(error).__name__}: {error}"
        if row["status"] == "ok":
            measured = timing.measure(lambda launch=launch: launch(*arguments), device=device)
            row.update(seconds=measured.median_s, spread=measured.spread)
        table.append(row)
    return table


def compare_with_copy(launches: Mapping[str, Callable], rows: int, cols: int,
                      device: torch.device | None = None) -> list[dict]:
    """Check, then time, each fused kernel's launch at rows x cols, eager PyTorch, and a copy of the same bytes.

    ``launches`` maps a name to ``launch(x, bias, residual, out)``, which takes kernel arguments
    (:func:`gpulab.kernels.device_array`, converted once, outside the timed calls). Each result is
    compared with float64 before timing; a wrong one is a row with ``status`` saying so, and is not
    timed. Every row has ``bytes`` (what that version must move: :func:`fused_bytes` for a fused kernel,
    :func:`eager_bytes` for eager PyTorch), ``seconds`` (median, L2 flushed between runs),
    ``gbytes_per_s`` (bytes over seconds), ``fraction_of_copy`` and ``speedup_vs_eager``. The copy moves
    the fused kernel's bytes: it reads half of them and writes the other half (:func:`gpulab.blas.measure_copy`).
    """
    rows, cols = positive_int("rows", rows), positive_int("cols", cols)
    device = device or kernels.device()
    # x, residual, out and the eager chain's two temporaries and result, a float64 reference and one float64 copy
    fits_in_memory("rows and cols", FLOAT_BYTES * 6 * rows * cols + 8 * 2 * rows * cols, device)
    table = _time_versions(launches, rows, cols, device)  # its tensors are freed on return: the copy needs the memory
    copy = blas.measure_copy(sum(fused_bytes(rows, cols)) // 2, device)
    table.append({"kernel": "copy of the same bytes", "bytes": 2 * copy["nbytes"], "seconds": copy["seconds"],
                  "spread": copy["spread"], "status": "ok"})
    copy_gbs = table[-1]["bytes"] / copy["seconds"] / 1e9
    eager_s = table[0].get("seconds")
    for row in table:
        if row["status"] == "ok":
            row["gbytes_per_s"] = row["bytes"] / row["seconds"] / 1e9
            row["fraction_of_copy"] = row["gbytes_per_s"] / copy_gbs
            row["speedup_vs_eager"] = eager_s / row["seconds"] if eager_s else None
        row.update(rows=rows, cols=cols)
    return table


@experiment("lab_fuse_it")
def measure_fusion(rows: int = 2**14, cols: int = 2**12, threads: Sequence[int] = (32, 8)) -> list[dict]:
    """The lab's experiment on a GPU: eager PyTorch, the two reference fused kernels and a copy (see
    :func:`compare_with_copy`), at rows x cols float32 with blocks of ``threads = (tx, ty)``."""
    kernels.require_gpu("measure_fusion")
    tx, ty = (positive_int("threads", t) for t in threads)
    sms = env.describe().multiprocessors
    per_element = covering_grid(rows, cols, (tx, ty))
    stepping = rows_grid(rows, cols, (tx, ty), sms)
    return compare_with_copy({
        "fused, one element per thread": lambda *a: fused_per_element[per_element, (tx, ty)](*a),
        "fused, grid-stride over rows": lambda *a: fused_rows[stepping, (tx, ty)](*a),
    }, rows, cols)


def fusion_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Two panels: each version's median time, and the bandwidth it reaches (its own bytes over its time)."""
    measured = [r for r in rows if r.get("status") == "ok"]
    if not measured:
        raise ValueError("rows: no measured row to draw")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time", "bandwidth (bytes each version moves / time)"))
    names = [r["kernel"] for r in measured]
    hover = [f"{r['kernel']}<br>{r['bytes'] / 1e6:,.0f} MB in {r['seconds'] * 1e6:,.1f} us<br>"
             f"{r['gbytes_per_s']:,.0f} GB/s, {r['fraction_of_copy']:.0%} of the copy's" for r in measured]
    colours = [plots.PALETTE[i % len(plots.PALETTE)] for i in range(len(measured))]
    fig.add_trace(go.Bar(x=names, y=[r["seconds"] * 1e6 for r in measured], marker_color=colours,
                         hovertext=hover, hoverinfo="text", showlegend=False,
                         text=[f"{r['seconds'] * 1e6:,.0f}" for r in measured], textposition="outside"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[r["gbytes_per_s"] for r in measured], marker_color=colours,
                         hovertext=hover, hoverinfo="text", showlegend=False,
                         text=[f"{r['gbytes_per_s']:,.0f}" for r in measured], textposition="outside"), row=1, col=2)
    fig.update_yaxes(title_text="time (us)", row=1, col=1)
    fig.update_yaxes(title_text="GB/s", row=1, col=2)
    fig.update_layout(title=title, height=480)
    return fig
