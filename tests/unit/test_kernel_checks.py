"""The kernel graders name the usual mistakes: each test kernel below makes one of them.

The kernels run under numba's CUDA simulator here (and on the GPU on a GPU machine), on a few small
blocks so that the whole file takes seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpulab.ch07_cuda_threads_blocks.threads import blocks_for
from gpulab.ch08_memory_hierarchy.memory import stencil_reference
from gpulab.core import kernel_mode
from gpulab.kernels import numba_kernels
from gpulab.labs import grading, kernel_grading, lab06_first_kernels, lab07_tiled_matmul
from gpulab.labs.kernel_grading import KernelDiagnosis as Diagnosis

cuda = kernel_mode.numba_cuda()
M = 32  # threads per block of the 1D tests
N = 2 * M + 5  # not a multiple of M: the last block has idle threads


# --- SAXPY -----------------------------------------------------------------------------------------

@cuda.jit
def saxpy(n, a, x, y):
    i = cuda.grid(1)
    if i < n:
        y[i] = a * x[i] + y[i]


@cuda.jit
def saxpy_unbounded(n, a, x, y):
    i = cuda.grid(1)
    y[i] = a * x[i] + y[i]


@cuda.jit
def saxpy_forgets_y(n, a, x, y):
    i = cuda.grid(1)
    if i < n:
        y[i] = a * x[i]


@cuda.jit
def does_nothing(n, a, x, y):
    pass


def launched(kernel, blocks):
    return lambda a, x, y: kernel[blocks(x.shape[0]), M](x.shape[0], a, x, y)


def test_saxpy_right_kernel_passes():
    diagnosis = lab06_first_kernels.diagnose_saxpy(launched(saxpy, lambda n: blocks_for(n, M)), N)
    assert diagnosis.ok and diagnosis == Diagnosis("ok", "every element is right")


def test_saxpy_mistakes_are_named():
    ceil_blocks = lambda n: blocks_for(n, M)  # noqa: E731
    assert lab06_first_kernels.diagnose_saxpy(launched(saxpy_unbounded, ceil_blocks), N).problem == "out of bounds"
    too_few = lab06_first_kernels.diagnose_saxpy(launched(saxpy, lambda n: n // M), N)
    assert too_few.problem == "unwritten tail" and f"indices {2 * M} to {N - 1}" in too_few.detail
    nothing = lab06_first_kernels.diagnose_saxpy(launched(does_nothing, ceil_blocks), N)
    assert nothing == Diagnosis("unwritten", f"none of the {N} elements was written")
    wrong = lab06_first_kernels.diagnose_saxpy(launched(saxpy_forgets_y, ceil_blocks), N)
    assert wrong.problem == "wrong values" and f"{N} of {N} elements are wrong" in wrong.detail


def test_saxpy_errors_become_diagnoses():
    def broken(a, x, y):
        raise TypeError("unsupported operand")

    diagnosis = lab06_first_kernels.diagnose_saxpy(broken, N)
    assert diagnosis.problem == "error" and "TypeError: unsupported operand" in diagnosis.detail
    assert lab06_first_kernels.diagnose_saxpy(lambda a, x, y: None, N).problem == "unwritten"
    with pytest.raises(ValueError, match="^n:"):
        lab06_first_kernels.diagnose_saxpy(broken, 0)


# --- a 2D kernel: out[row, col] = scale * inp[row, col] + row ----------------------------------------

THREADS = (8, 4)  # x along a row
ROWS, COLS = 13, 21  # neither a multiple of its block side, and not square


@cuda.jit
def scale_add_row(inp, out, scale):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = scale * inp[row, col] + row


@cuda.jit
def scale_add_row_names_swapped(inp, out, scale):
    row, col = cuda.grid(2)  # the mistake: x is the column
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = scale * inp[row, col] + row


@cuda.jit
def scale_add_row_indices_swapped(inp, out, scale):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        out[col, row] = scale * inp[col, row] + row  # the mistake: out[col, row]


@cuda.jit
def scale_add_row_unbounded(inp, out, scale):
    col, row = cuda.grid(2)
    out[row, col] = scale * inp[row, col] + row


def test_matrix_right_kernel_passes():
    assert lab06_first_kernels.diagnose_scale_add_row(scale_add_row, ROWS, COLS, THREADS).ok


def test_matrix_mistakes_are_named():
    names = lab06_first_kernels.diagnose_scale_add_row(scale_add_row_names_swapped, ROWS, COLS, THREADS)
    assert names.problem == "index order" and "takes x" in names.detail
    indices = lab06_first_kernels.diagnose_scale_add_row(scale_add_row_indices_swapped, ROWS, COLS, THREADS)
    assert indices.problem == "index order" and "16 x 16" in indices.detail
    unbounded = lab06_first_kernels.diagnose_scale_add_row(scale_add_row_unbounded, ROWS, COLS, THREADS)
    assert unbounded.problem == "out of bounds"
    too_small = lab06_first_kernels.diagnose_scale_add_row(scale_add_row, ROWS, COLS, THREADS, blocks=(2, 3))
    assert too_small.problem == "unwritten" and "reaches 12 rows and 16 columns" in too_small.detail


def test_matrix_bad_grids_are_named_without_a_launch():
    for blocks in (None, (3,), (3.0, 4), (0, 4)):
        diagnosis = lab06_first_kernels.diagnose_scale_add_row(scale_add_row, ROWS, COLS, THREADS, blocks=blocks)
        assert diagnosis.problem == "error" and "two whole numbers" in diagnosis.detail
    assert "far past" in lab06_first_kernels.diagnose_scale_add_row(scale_add_row, ROWS, COLS, THREADS, (99, 99)).detail
    assert lab06_first_kernels.diagnose_scale_add_row(scale_add_row, ROWS, COLS, THREADS, (np.int64(3), 4)).ok


# --- the 1D stencil of radius 3 in shared memory ---------------------------------------------------

RADIUS = 3
BLOCK = 32
WINDOW = BLOCK + 2 * RADIUS  # a shared array's size must be a constant: numba on a GPU takes no expression


def make_stencil(barrier: bool, halo: bool, shift: int):
    @cuda.jit
    def stencil(inp, out, n):
        window = cuda.shared.array(WINDOW, np.float32)
        first = cuda.blockIdx.x * BLOCK
        j = cuda.threadIdx.x
        last = WINDOW if halo else BLOCK
        while j < last:
            if first + j < n + 2 * RADIUS:
                window[j] = inp[first + j]
            j += BLOCK
        if barrier:
            cuda.syncthreads()
        i = first + cuda.threadIdx.x
        if i < n:
            total = 0.0
            for k in range(2 * RADIUS + 1):
                total += window[cuda.threadIdx.x + k + shift]
            out[i] = total

    return stencil


def test_stencil_right_kernel_passes():
    assert lab06_first_kernels.diagnose_stencil(make_stencil(True, True, 0), N, BLOCK).ok


def test_stencil_mistakes_are_named():
    race = lab06_first_kernels.diagnose_stencil(make_stencil(False, True, 0), 2 * BLOCK, BLOCK)
    halo = lab06_first_kernels.diagnose_stencil(make_stencil(True, False, 0), 2 * BLOCK, BLOCK)
    # On a GPU neither mistake shows reliably: a block of 32 threads is one warp, which runs in step
    # (no race), and shared memory that a kernel forgot to fill may still hold a previous launch's halo.
    if not kernel_mode.on_gpu():
        assert race.problem == "race" and "match no window" in race.detail
        assert halo.problem == "race" and "halo" in halo.detail
    shifted = lab06_first_kernels.diagnose_stencil(make_stencil(True, True, -RADIUS), 2 * BLOCK, BLOCK)
    assert shifted.problem == "shifted window" and "i -3" in shifted.detail


def test_stencil_reference_and_blocks():
    x = torch.arange(10.0)
    assert stencil_reference(x, 3).tolist() == [21.0, 28.0, 35.0, 42.0]
    assert [blocks_for(n, 32) for n in (1, 32, 33, 64)] == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="^n and threads_per_block"):
        blocks_for(0, 32)


# --- C = A @ B in shared-memory tiles ---------------------------------------------------------------

TILE = 4  # 16 threads per block: the simulator runs these in a fraction of a second
SHAPE = (7, 10, 6)  # M, K, N: 2 x 2 blocks; K is two whole tiles and a partial one


def make_matmul(early_return=False, zero_fill=True, guard_loads=True, guard_store=True, ceil=True,
                transpose_a=False, transpose_b=False, first_barrier=True, second_barrier=True):
    """A tiled matmul kernel for any shapes, or one with the named mistake."""
    tile = TILE

    @cuda.jit
    def matmul(A, B, C):
        a_tile = cuda.shared.array((tile, tile), np.float32)
        b_tile = cuda.shared.array((tile, tile), np.float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        row = cuda.blockIdx.y * tile + ty
        col = cuda.blockIdx.x * tile + tx
        m, k = A.shape
        n = B.shape[1]
        if early_return and (row >= m or col >= n):
            return
        total = np.float32(0)
        for step in range((k + tile - 1) // tile if ceil else k // tile):
            a_col, b_row = step * tile + tx, step * tile + ty
            if not guard_loads:
                a_tile[ty, tx] = A[row, a_col]
                b_tile[ty, tx] = B[b_row, col]
            elif not zero_fill:
                if row < m and a_col < k:
                    a_tile[ty, tx] = A[row, a_col]
                if b_row < k and col < n:
                    b_tile[ty, tx] = B[b_row, col]
            else:
                a_tile[ty, tx] = A[row, a_col] if row < m and a_col < k else np.float32(0)
                b_value = B[b_row, col] if b_row < k and col < n else np.float32(0)
                if transpose_b:
                    b_tile[tx, ty] = b_value
                else:
                    b_tile[ty, tx] = b_value
            if first_barrier:
                cuda.syncthreads()
            for i in range(tile):
                total += (a_tile[i, ty] if transpose_a else a_tile[ty, i]) * b_tile[i, tx]
            if second_barrier:
                cuda.syncthreads()
        if not guard_store or (row < m and col < n):
            C[row, col] = total

    return matmul


def test_matmul_right_kernels_pass():
    right = make_matmul()
    assert lab07_tiled_matmul.diagnose_matmul(right, *SHAPE, TILE) == Diagnosis("ok", "every element is right")
    assert lab07_tiled_matmul.diagnose_matmul(right, 3, 2, 5, TILE).ok  # less than one tile
    assert lab07_tiled_matmul.diagnose_matmul(numba_kernels.matmul_naive, *SHAPE, TILE).ok


@pytest.mark.parametrize(("mistake", "problem", "detail"), [
    ({"ceil": False}, "short k loop", "the sum of the first 8 of the K = 10 products"),
    ({"zero_fill": False}, "partial k tile", "2 products too many"),
    ({"transpose_a": True}, "transposed tile", "the tiles of A"),
    ({"transpose_b": True}, "transposed tile", "the tiles of B"),
    ({"guard_store": False}, "out of bounds", ""),
    ({"guard_loads": False}, "out of bounds", ""),
], ids=["floor loop", "no zero fill", "tile of A read transposed", "tile of B stored transposed", "store unguarded",
        "loads unguarded"])
def test_matmul_mistakes_are_named(mistake, problem, detail):
    diagnosis = lab07_tiled_matmul.diagnose_matmul(make_matmul(**mistake), *SHAPE, TILE)
    assert diagnosis.problem == problem and detail in diagnosis.detail


def test_matmul_timing_dependent_mistakes_are_named():
    early = lab07_tiled_matmul.diagnose_matmul(make_matmul(early_return=True), *SHAPE, TILE)
    no_barriers = [lab07_tiled_matmul.diagnose_matmul(make_matmul(**{barrier: False}), *SHAPE, TILE)
                   for barrier in ("first_barrier", "second_barrier")]
    # On a GPU these show only by chance: the skipped loads leave whatever the slots held (zeros, perhaps),
    # and a block's warps may well run in step.
    if not kernel_mode.on_gpu():
        assert early.problem == "edge tiles" and "rows 4 to 6 and columns 4 to 5" in early.detail
        assert [d.problem for d in no_barriers] == ["race", "race"]
        store = lab07_tiled_matmul.diagnose_matmul(make_matmul(guard_store=False), *SHAPE, TILE)
        assert "in the line `C[row, col] = total`" in store.detail  # the simulator names the kernel's line


def test_matmul_grids_are_examined():
    right, (m, k, n) = make_matmul(), (9, 3, 6)  # 3 blocks down, 2 across
    too_few = lab07_tiled_matmul.diagnose_matmul(right, m, k, n, TILE, blocks=(1, 2))
    assert too_few.problem == "unwritten" and "reaches 8 rows and 4 columns" in too_few.detail
    one_block = lab07_tiled_matmul.diagnose_matmul(right, m, k, n, TILE, blocks=(1, 1))
    assert one_block.problem == "unwritten" and "reaches 4 rows and 4 columns" in one_block.detail
    swapped = lab07_tiled_matmul.diagnose_matmul(right, m, k, n, TILE, blocks=(3, 2))
    assert swapped.problem == "unwritten" and "C's transpose" in swapped.detail
    assert "two whole numbers" in lab07_tiled_matmul.diagnose_matmul(right, m, k, n, TILE, blocks=None).detail
    assert "far past" in lab07_tiled_matmul.diagnose_matmul(right, m, k, n, TILE, blocks=(9, 9)).detail
    for bad in ({"m": 0}, {"tile": 33}, {"k": 2.5}):
        arguments = {"m": m, "k": k, "n": n, "tile": TILE, **bad}
        with pytest.raises(ValueError, match=f"^{next(iter(bad))}:"):
            lab07_tiled_matmul.diagnose_matmul(right, **arguments)


# --- the building blocks ---------------------------------------------------------------------------

def test_compare_names_nan_tail_and_wrong_values():
    reference = torch.arange(1.0, 9.0)
    assert kernel_grading.compare(reference.clone(), reference).ok
    tail = reference.clone()
    tail[5:] = math.nan
    assert kernel_grading.compare(tail, reference).problem == "unwritten tail"
    holes = reference.clone()
    holes[2] = math.nan
    assert kernel_grading.compare(holes, reference).detail.endswith("the first at index 2")
    wrong = reference.clone()
    wrong[4] += 1
    assert "the first at index 4: 6 instead of 5" in kernel_grading.compare(wrong, reference).detail
    matrix = torch.ones(3, 4)
    matrix[1, 2] = 7
    assert "row 1, column 2" in kernel_grading.compare(matrix, torch.ones(3, 4)).detail
    with pytest.raises(ValueError, match="^actual: shape"):
        kernel_grading.compare(torch.ones(3), torch.ones(4))


def test_guard_zone_sees_a_write_past_the_end():
    generator = torch.Generator().manual_seed(1)
    vector = kernel_grading.guarded(torch.zeros(5), 3, generator)
    assert vector.buffer.shape == (8,) and vector.guard_intact()
    vector.buffer[6] = 0
    assert not vector.guard_intact()
    with pytest.raises(ValueError, match="^guard:"):
        kernel_grading.guarded(torch.zeros(5), (1, 2), generator)


def test_diagnosis_hint_and_validation():
    diagnosis = Diagnosis("out of bounds", "a thread wrote past the end")
    assert diagnosis.hint({"out of bounds": "check i < n"}) == "a thread wrote past the end. check i < n"
    assert diagnosis.hint({}) == "a thread wrote past the end" and not diagnosis.ok
    with pytest.raises(ValueError, match="^problem:"):
        Diagnosis("strange", "")


def test_safely_first_failure_and_grade(capsys):
    def boom():
        raise KeyError("x")

    assert grading.safely(boom) == grading.Diagnosis("error", "KeyError: 'x'")
    good, bad = Diagnosis("ok", "fine"), Diagnosis("unwritten", "none of the 3 elements was written")
    assert grading.first_failure([lambda: good, lambda: bad, boom]) == bad
    assert grading.first_failure([lambda: good]) == good
    assert grading.first_failure([]).problem == "error"
    only = kernel_grading.compare(torch.tensor([math.nan]), torch.ones(1))
    assert only == Diagnosis("unwritten", "the only element was never written")
    grader = grading.Grader(strict=False)
    assert not grading.grade(grader, "demo", bad, {"unwritten": "launch it"})
    assert grading.grade(grader, "demo ok", good, {})
    text = capsys.readouterr().out
    assert "NOT YET  demo: none of the 3 elements was written\n   hint: launch it" in text and "PASS  demo ok" in text
    with pytest.raises(grading.CheckFailed):
        grading.grade(grading.Grader(strict=True), "strict", bad, {})
