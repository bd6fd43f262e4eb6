"""The graders of the lab "Fuse it" name the usual mistakes: each count and each kernel below makes one of them.

The kernels run under numba's CUDA simulator here (and on the GPU on a GPU machine), on a few small
blocks, so the whole file takes seconds. The timing experiment needs a GPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import needs_gpu
from gpulab.core import kernel_mode
from gpulab.labs.lab10_fuse_it import diagnose, measure, reference

cuda = kernel_mode.numba_cuda()
DTYPE = np.float32
ROWS, COLS, THREADS = 21, 40, (16, 8)  # rows < cols, so that a bias indexed by the row stays in bounds
GRID = reference.covering_grid(ROWS, COLS, THREADS)


# --- exercise 1: counting bytes ---------------------------------------------------------------------

def test_the_counts():
    rows, cols = 1000, 768
    n = rows * cols
    assert reference.eager_bytes(rows, cols) == {"x + bias": (4 * n + 4 * cols, 4 * n), "relu": (4 * n, 4 * n),
                                          "+ residual": (8 * n, 4 * n)}
    assert reference.fused_bytes(rows, cols) == (8 * n + 4 * cols, 4 * n)
    assert reference.ideal_speedup(rows, cols) == pytest.approx((28 * n + 4 * cols) / (12 * n + 4 * cols))
    assert reference.ideal_speedup(2**14, 2**12) == pytest.approx(28 / 12, rel=1e-3)
    with pytest.raises(ValueError, match="rows"):
        reference.fused_bytes(0, 5)


def in_elements(rows, cols):
    return {kernel: (read // 4, written // 4) for kernel, (read, written) in reference.eager_bytes(rows, cols).items()}


def relu_counted_once(rows, cols):
    return {**reference.eager_bytes(rows, cols), "relu": (4 * rows * cols, 0)}


@pytest.mark.parametrize(("counts", "problem"), [
    (reference.eager_bytes, "ok"), (in_elements, "elements, not bytes"), (relu_counted_once, "wrong count"),
    (lambda rows, cols: {"x + bias": (0, 0)}, "not a dict"), (lambda rows, cols: None, "not a dict"),
    (lambda rows, cols: {**reference.eager_bytes(rows, cols), "relu": None}, "not a number"),
])
def test_eager_count_mistakes_are_named(counts, problem):
    assert diagnose.diagnose_eager_bytes(counts).problem == problem


@pytest.mark.parametrize(("counts", "problem"), [
    (reference.fused_bytes, "ok"), (lambda rows, cols: (8 * rows * cols, 4 * rows * cols), "bias not counted"),
    (lambda rows, cols: (12 * rows * cols, 4 * rows * cols), "bias counted as a matrix"),
    (lambda rows, cols: (4 * rows * cols, 8 * rows * cols + 4 * cols), "read and written swapped"),
    (lambda rows, cols: (16 * rows * cols + 4 * cols, 4 * rows * cols), "wrong count"),
    (lambda rows, cols: 12 * rows * cols, "not a number"), (lambda rows, cols: 1 / 0, "error"),
])
def test_fused_count_mistakes_are_named(counts, problem):
    diagnosis = diagnose.diagnose_fused_bytes(counts)
    assert diagnosis.problem == problem, diagnosis
    if problem == "wrong count":
        assert "2 tensors of rows x cols floats too many" in diagnosis.detail


def test_speedup_mistakes_are_named():
    assert diagnose.diagnose_speedup(reference.ideal_speedup).ok
    assert diagnose.diagnose_speedup(lambda rows, cols: 1 / reference.ideal_speedup(rows, cols)).problem == "inverted"
    # the bias matters at small sizes
    assert diagnose.diagnose_speedup(lambda rows, cols: 28 / 12).problem == "wrong count"
    assert diagnose.diagnose_speedup(lambda rows, cols: None).problem == "not a number"


# --- exercise 2: the fused kernel, one element per thread --------------------------------------------

@cuda.jit
def right(x, bias, residual, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        value = x[row, col] + bias[col]
        out[row, col] = (value if value > DTYPE(0) else DTYPE(0)) + residual[row, col]


@cuda.jit
def bias_by_row(x, bias, residual, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        value = x[row, col] + bias[row]
        out[row, col] = (value if value > DTYPE(0) else DTYPE(0)) + residual[row, col]


@cuda.jit
def relu_last(x, bias, residual, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        value = x[row, col] + bias[col] + residual[row, col]
        out[row, col] = value if value > DTYPE(0) else DTYPE(0)


@cuda.jit
def no_relu(x, bias, residual, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = x[row, col] + bias[col] + residual[row, col]


@cuda.jit
def unbounded(x, bias, residual, out):
    col, row = cuda.grid(2)
    value = x[row, col] + bias[col]
    out[row, col] = (value if value > DTYPE(0) else DTYPE(0)) + residual[row, col]


@cuda.jit
def in_place(x, bias, residual, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        value = x[row, col] + bias[col]
        x[row, col] = value
        out[row, col] = (value if value > DTYPE(0) else DTYPE(0)) + residual[row, col]


@cuda.jit
def swapped(x, bias, residual, out):  # takes x of cuda.grid(2) as the row
    row, col = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        value = x[row, col] + bias[col]
        out[row, col] = (value if value > DTYPE(0) else DTYPE(0)) + residual[row, col]


def launched(kernel, grid=GRID):
    return lambda *arguments: kernel[grid, THREADS](*arguments)


def test_fused_right_kernels_pass():
    assert diagnose.diagnose_fused(launched(right), ROWS, COLS).ok
    assert diagnose.diagnose_fused(launched(reference.fused_per_element), ROWS, COLS).ok
    # each thread loops down the rows
    assert diagnose.diagnose_fused(launched(reference.fused_rows, (GRID[0], 1)), ROWS, COLS).ok


@pytest.mark.parametrize(("kernel", "problem"), [
    (bias_by_row, "bias along rows"), (relu_last, "relu after residual"), (no_relu, "no relu"),
    (unbounded, "out of bounds"), (in_place, "input written"),
])
def test_fused_mistakes_are_named(kernel, problem):
    diagnosis = diagnose.diagnose_fused(launched(kernel), ROWS, COLS)
    assert diagnosis.problem == problem, diagnosis


def test_launches_check_the_grid_first():
    assert diagnose.diagnose_launch(right, GRID, THREADS, ROWS, COLS).ok
    assert diagnose.diagnose_grid((3, 2)).ok and reference.grid_reach((3, 2), THREADS) == 48
    for grid in (None, (3,), (3, 0), (2.0, 3), (True, 3)):
        assert diagnose.diagnose_launch(right, grid, THREADS, ROWS, COLS).problem == "bad grid", grid
    far = diagnose.diagnose_launch(right, (COLS, ROWS), THREADS, ROWS, COLS)
    assert far.problem == "bad grid" and "reaches far past" in far.detail
    # x taken as the row: its threads reach 48 "rows" but only 24 columns of the 21 x 40 matrix
    assert diagnose.diagnose_launch(swapped, GRID, THREADS, ROWS, COLS).problem in ("out of bounds", "unwritten")


def test_too_few_blocks_leave_elements_unwritten():
    diagnosis = diagnose.diagnose_fused(launched(right, (GRID[0], GRID[1] - 1)), ROWS, COLS)
    assert diagnosis.problem == "unwritten" and "rows 16 to 20" in diagnosis.detail
    assert diagnose.diagnose_fused(lambda *a: 1 / 0, ROWS, COLS).problem == "error"


def test_the_mistakes_differ_from_the_reference():
    generator = torch.Generator().manual_seed(0)
    x, residual = torch.randn(5, 7, generator=generator), torch.randn(5, 7, generator=generator)
    bias = torch.randn(7, generator=generator)
    expected = reference.reference(x, bias, residual)
    assert expected.dtype == torch.float64
    assert torch.allclose(expected, torch.relu(x + bias).double() + residual.double(), rtol=0, atol=1e-6)
    found = reference.mistakes(x, bias, residual)
    assert set(found) == {"relu after residual", "no relu", "no bias", "no residual", "bias along rows"}
    assert all(not torch.allclose(result, expected) for result, _ in found.values())
    assert "bias along rows" not in reference.mistakes(x.T, bias[:5], residual.T)  # more rows than columns


# --- exercise 3: the launch configuration of the grid-stride kernel -----------------------------------

def test_rows_grid_fills_the_gpu_once():
    assert reference.rows_grid(2**14, 2**12, (32, 8), 132) == (128, 9)  # 128 x 9 blocks >= 132 SMs x 8 blocks of 256
    assert reference.rows_grid(5, 7, (32, 4), 2) == (1, 2)  # only 2 rows of blocks have rows to work on
    assert diagnose.diagnose_rows_grid(reference.rows_grid).ok


@pytest.mark.parametrize(("grid", "problem"), [
    (lambda rows, cols, threads, sms: reference.covering_grid(rows, cols, threads), "too many blocks"),
    (lambda rows, cols, threads, sms: (math.ceil(cols / threads[0]), 1), "too few blocks"),
    (lambda rows, cols, threads, sms: (sms, 1), "columns not covered"),
    (lambda rows, cols, threads, sms: (math.ceil(cols / threads[0]), rows), "idle blocks"),
    (lambda rows, cols, threads, sms: (1.5, 2), "bad grid"), (lambda rows, cols, threads, sms: None, "bad grid"),
])
def test_rows_grid_mistakes_are_named(grid, problem):
    assert diagnose.diagnose_rows_grid(grid).problem == problem


# --- exercise 4: the prediction, and the measurement (GPU) --------------------------------------------

def test_predicted_seconds_and_its_mistakes():
    assert reference.predicted_seconds(2**14, 2**12, 4000) == pytest.approx((12 * 2**26 + 4 * 2**12) / 4e12)
    assert diagnose.diagnose_predicted_seconds(reference.predicted_seconds).ok
    eager = lambda rows, cols, gbs: 28 * rows * cols / (gbs * 1e9)  # noqa: E731
    assert diagnose.diagnose_predicted_seconds(eager).problem == "wrong count"
    exact_eager = lambda rows, cols, gbs: sum(map(sum, reference.eager_bytes(rows, cols).values())) / (gbs * 1e9)  # noqa: E731
    assert diagnose.diagnose_predicted_seconds(exact_eager).problem == "eager bytes"
    in_gb = lambda rows, cols, gbs: sum(reference.fused_bytes(rows, cols)) / gbs  # noqa: E731
    assert diagnose.diagnose_predicted_seconds(in_gb).problem == "gigabytes"
    with pytest.raises(ValueError, match="copy_gbytes_per_s"):
        reference.predicted_seconds(4, 4, 0)


def test_measure_fusion_needs_a_gpu():
    if kernel_mode.on_gpu():
        pytest.skip("there is a GPU here")
    with pytest.raises(ValueError, match="GPU"):
        measure.measure_fusion(64, 64)


@needs_gpu
def test_measure_fusion_on_a_gpu():
    rows = measure.measure_fusion(2**10, 2**10)
    by_name = {r["kernel"]: r for r in rows}
    assert all(r["status"] == "ok" for r in rows)
    assert by_name["copy of the same bytes"]["fraction_of_copy"] == pytest.approx(1.0)
    assert by_name["eager PyTorch (3 kernels)"]["bytes"] > by_name["fused, grid-stride over rows"]["bytes"]


def test_fusion_figure_draws_time_and_bandwidth():
    table = [{"kernel": name, "bytes": 12e6, "seconds": s, "gbytes_per_s": 12e6 / s / 1e9, "fraction_of_copy": f,
              "status": "ok"} for name, s, f in (("eager", 3e-3, 0.9), ("fused", 1e-3, 0.95), ("copy", 9e-4, 1.0))]
    table.append({"kernel": "broken", "bytes": 1, "status": "wrong result"})
    fig = measure.fusion_figure(table, title="t")
    assert len(fig.data) == 2 and list(fig.data[0].x) == ["eager", "fused", "copy"]
    with pytest.raises(ValueError, match="rows"):
        measure.fusion_figure(table[-1:], title="t")
