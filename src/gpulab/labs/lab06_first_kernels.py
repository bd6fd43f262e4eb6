"""Graders of the lab "First kernels" (``labs/06_first_kernels.ipynb``): SAXPY, a 2D grid over a matrix,
and the shared-memory stencil, each run on fresh data with a poisoned output and a guard zone
(:mod:`gpulab.labs.grading`), and the mistake named: a grid too small, rows and columns swapped, a missing
barrier.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from gpulab.ch07_cuda_threads_blocks.threads import blocks_for
from gpulab.ch08_memory_hierarchy.memory import stencil_reference
from gpulab.core import kernel_mode
from gpulab.core.correctness import poisoned
from gpulab.labs.kernel_grading import (
    COVERING,
    GUARD,
    checked,
    close_to,
    fresh,
    grid_problem,
    guarded,
    launch,
    seeded,
)
from gpulab.labs.kernel_grading import (
    KernelDiagnosis as Diagnosis,
)


def diagnose_saxpy(call: Callable[[float, object, object], object], n: int, seed: int = 0) -> Diagnosis:
    """Run ``call(a, x, y)`` on fresh x and y of ``n`` float32 elements; it must leave a * x + y in y.

    ``call`` gets kernel arguments (:func:`gpulab.core.kernel_mode.device_array`): either it launches the
    student's kernel with a block count the grader chose, or it is the student's own launcher.
    Both x and y are followed by a guard zone. An element of y that kept its value was never written.
    """
    if n < 1:
        raise ValueError(f"n: at least 1, got {n}")
    generator = seeded(seed)
    a = 0.5 + float(torch.rand((), generator=generator))  # never 0 or 1: both would hide a missing term
    # |a x| >= 1/8, so that a * x + y always differs from y in float32: an element that kept its value
    # was not written (with x near 0, a written y could round back to its old value)
    x_values = fresh((n,), generator)
    x_values = x_values.sign() * (x_values.abs() + 0.25)
    x, y = guarded(x_values, GUARD, generator), guarded(fresh((n,), generator), GUARD, generator)
    y_before = y.view.clone()
    reference = a * x.view.double() + y_before.double()
    failure = launch(lambda: call(a, kernel_mode.device_array(x.view), kernel_mode.device_array(y.view)))
    return failure or checked(y, reference, unchanged=y_before)


def scale_add_row_reference(inp: torch.Tensor, scale: float, *, swapped: bool = False) -> torch.Tensor:
    """``out[row, col] = scale * inp[row, col] + row`` (with ``swapped``: ``+ col``), in float64."""
    rows, cols = inp.shape
    index = (torch.arange(cols, device=inp.device).expand(rows, cols) if swapped
             else torch.arange(rows, device=inp.device)[:, None].expand(rows, cols))
    return scale * inp.double() + index.double()


def _run_matrix(kernel, rows: int, cols: int, threads: tuple[int, int], blocks: tuple[int, int],
                seed: int) -> tuple[Diagnosis, torch.Tensor | None, torch.Tensor]:
    extent = max(blocks[0] * threads[0], blocks[1] * threads[1])
    generator = seeded(seed)
    scale = 0.5 + float(torch.rand((), generator=generator))
    # The guard leaves room for any (row, col) the grid reaches, in either order: on a GPU a kernel that
    # swaps them, or checks no bounds, writes into the guard instead of into someone else's memory.
    inp = guarded(fresh((rows, cols), generator), (extent, extent), generator).view
    out = guarded(poisoned((rows, cols), torch.float32, inp.device), (extent, extent), generator)
    failure = launch(lambda: kernel[blocks, threads](kernel_mode.device_array(inp), kernel_mode.device_array(out.view),
                                                     scale))
    if failure:
        return failure, None, inp
    diagnosis = checked(out, scale_add_row_reference(inp, scale))
    if diagnosis.problem == "wrong values":
        written = out.view.detach().cpu().double()
        for alternative in (scale_add_row_reference(inp, scale, swapped=True),
                            scale_add_row_reference(inp.T, scale), scale_add_row_reference(inp.T, scale, swapped=True)):
            if alternative.shape == written.shape and bool(close_to(written, alternative.cpu()).all()):
                return Diagnosis("index order", "each element got the value meant for its mirror image: rows and "
                                                "columns are swapped somewhere"), out.view, inp
    return diagnosis, out.view, inp


def diagnose_scale_add_row(kernel, rows: int, cols: int, threads: tuple[int, int],
                           blocks: tuple[int, int] | str = COVERING, seed: int = 0) -> Diagnosis:
    """Launch ``kernel[blocks, threads](inp, out, scale)``, which must write ``out[r, c] = scale * inp[r, c] + r``.

    ``threads`` is (x, y), x along a row; ``blocks`` (a student's grid, say) defaults to the grid that
    covers the matrix, (ceil(cols / x), ceil(rows / y)); anything but a pair of whole numbers is diagnosed
    as an error, None included. A failure is examined further: a square matrix that the grid
    covers exactly (so no bounds check can matter) tells a swap of rows and columns from a missing bounds
    check, and unwritten elements exactly where a swapped kernel would leave them point at the swap.
    """
    if min(rows, cols) < 1 or len(threads) != 2 or min(threads) < 1:
        raise ValueError(f"rows, cols and threads: positive, got {rows}, {cols}, {threads}")
    grid = (blocks_for(cols, threads[0]), blocks_for(rows, threads[1])) if blocks is COVERING else blocks
    bad_grid = grid_problem(grid, threads, rows, cols)
    if bad_grid:
        return bad_grid
    grid = (int(grid[0]), int(grid[1]))
    diagnosis, written, _ = _run_matrix(kernel, rows, cols, threads, grid, seed)
    if diagnosis.ok or diagnosis.problem == "index order":
        return diagnosis
    if diagnosis.problem == "unwritten" and written is not None:
        extent_x, extent_y = grid[0] * threads[0], grid[1] * threads[1]
        swapped_cover = torch.zeros(rows, cols, dtype=torch.bool)
        swapped_cover[:min(rows, extent_x), :min(cols, extent_y)] = True
        correct_cover = torch.zeros(rows, cols, dtype=torch.bool)
        correct_cover[:min(rows, extent_y), :min(cols, extent_x)] = True
        unwritten = torch.isnan(written.detach().cpu())
        if torch.equal(~unwritten, swapped_cover) and not torch.equal(swapped_cover, correct_cover):
            return Diagnosis("index order", diagnosis.detail + f": exactly the elements a kernel misses that takes "
                                                              f"x (which reaches {extent_x}) as the row and y "
                                                              f"(which reaches {extent_y}) as the column")
        if torch.equal(~unwritten, correct_cover):
            return Diagnosis("unwritten", diagnosis.detail + f": the grid reaches {extent_y} rows and {extent_x} "
                                                             "columns, too few")
        return diagnosis
    if diagnosis.problem in ("out of bounds", "error", "wrong values"):
        side = math.lcm(*threads) * 2
        probe_grid = (side // threads[0], side // threads[1])
        probe, _, _ = _run_matrix(kernel, side, side, threads, probe_grid, seed + 1)
        if probe.problem == "index order":
            return Diagnosis("index order", f"{diagnosis.detail}; and on a {side} x {side} matrix that the grid "
                                            f"covers exactly, {probe.detail}")
    return diagnosis


def diagnose_stencil(kernel, n: int, block_size: int, radius: int = 3, seed: int = 0) -> Diagnosis:
    """Launch ``kernel[ceil(n / block_size), block_size](inp, out, n)`` with ``inp`` of n + 2 radius elements.

    ``out[i]`` must be the sum of ``inp[i .. i + 2 radius]``. Wrong values are examined: if they equal
    a window shifted by a few elements, the offsets are off; if they match no window, threads read
    shared memory before it was written (or read slots nobody writes: the halo).
    """
    if n < 1 or block_size < 1 or radius < 0:
        raise ValueError(f"n, block_size, radius: n, block_size >= 1 and radius >= 0, got {n}, {block_size}, {radius}")
    generator = seeded(seed)
    inp = guarded(fresh((n + 2 * radius,), generator), GUARD, generator)
    out = guarded(poisoned((n,), torch.float32, inp.view.device), GUARD, generator)
    failure = launch(lambda: kernel[blocks_for(n, block_size), block_size](
        kernel_mode.device_array(inp.view), kernel_mode.device_array(out.view), n))
    if failure:
        return failure
    reference = stencil_reference(inp.view, radius)
    diagnosis = checked(out, reference)
    if diagnosis.problem != "wrong values":
        return diagnosis
    actual = out.view.detach().cpu().double()
    wrong = ~close_to(actual, reference.cpu())
    padded = torch.cat([torch.full((3 * radius,), math.nan, dtype=torch.float64), inp.view.detach().cpu().double(),
                        torch.full((3 * radius,), math.nan, dtype=torch.float64)])
    for shift in range(-2 * radius, 2 * radius + 1):  # a window starting `shift` elements off
        if shift == 0:
            continue
        shifted = stencil_reference(padded[3 * radius + shift:3 * radius + shift + n + 2 * radius], radius)
        if bool(close_to(actual, shifted).double().mean() > 0.9):
            return Diagnosis("shifted window", diagnosis.detail + f": they are sums of the 7 inputs starting at "
                                                                  f"i {shift:+d} instead of at i")
    positions = wrong.nonzero().flatten()
    in_block = positions % block_size
    if bool((in_block >= block_size - 2 * radius).all()):
        return Diagnosis("race", diagnosis.detail + f", all among the last {2 * radius} outputs of a block: "
                                                    "those read the halo, the slots past the block's own elements")
    return Diagnosis("race", diagnosis.detail + ", and they match no window of the input")
