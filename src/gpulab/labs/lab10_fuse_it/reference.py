"""The answers of the lab "Fuse it": the bytes eager PyTorch and one fused kernel move for
relu(x + bias) + residual, the two reference kernels (one element per thread, and a grid-stride loop over the
rows), their grids, and what each usual mistake computes instead.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch

from gpulab.ch07_cuda_threads_blocks.threads import blocks_for
from gpulab.core import kernel_mode
from gpulab.core.validation import positive_int

cuda = kernel_mode.numba_cuda()

FLOAT_BYTES = 4  # float32
KERNELS = ("x + bias", "relu", "+ residual")  # eager PyTorch's three kernels, in the order they run


THREADS_PER_SM = 2048  # resident threads per SM on Ampere and Hopper (A100, H100, H200); 1024 on Turing


DTYPE = np.float32


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


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
    """(blocks along x, fewest and most blocks along y) that :func:`.diagnose.diagnose_rows_grid` accepts.

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


def grid_reach(grid: Sequence[int], threads: Sequence[int]) -> int:
    """The most threads a launch of ``grid`` blocks of ``threads`` has along x or along y."""
    return max(grid[0] * threads[0], grid[1] * threads[1])


def predicted_seconds(rows: int, cols: int, copy_gbytes_per_s: float) -> float:
    """The fused kernel's time if it moved its bytes (:func:`fused_bytes`) as fast as a copy moves bytes."""
    if not _is_number(copy_gbytes_per_s) or copy_gbytes_per_s <= 0:
        raise ValueError(f"copy_gbytes_per_s: a positive bandwidth in GB/s, got {copy_gbytes_per_s!r}")
    return sum(fused_bytes(rows, cols)) / (copy_gbytes_per_s * 1e9)
