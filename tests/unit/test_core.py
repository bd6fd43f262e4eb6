"""Unit tests of gpulab's core: argument checks, counts, timing, roofline, sweeps and lab graders."""

from __future__ import annotations

import time

import pytest
import torch

from gpulab.core import banner, env, flops, plots, rates, timing, validation
from gpulab.core.correctness import check_close, relative_error
from gpulab.core.roofline import Roofline
from gpulab.core.sweep import OUT_OF_MEMORY, run_sweep
from gpulab.core.validation import (
    dtype_name,
    fits_in_memory,
    matmul_operands,
    positive_int,
    supported_dtype,
    unsupported_reason,
)
from gpulab.labs import grading


@pytest.mark.parametrize("value", [0, -3, 2.5, "8", True, None])
def test_positive_int_rejects_bad_sizes_naming_the_argument(value):
    with pytest.raises(ValueError, match="^n:"):
        positive_int("n", value)


def test_unknown_dtype_is_named():
    with pytest.raises(ValueError, match="dtype: unknown dtype 'float8'"):
        dtype_name("float8")
    assert dtype_name(torch.float16) == "float16"


def test_dtype_the_device_lacks_is_rejected(monkeypatch):
    with pytest.raises(ValueError, match="^dtype: tf32 is a tensor-core mode .* this device is a CPU"):
        supported_dtype("dtype", "tf32", torch.device("cpu"))
    assert supported_dtype("dtype", "bfloat16", torch.device("cpu")) == "bfloat16"
    # a Turing GPU (T4, compute capability 7.5) has neither TF32 nor native bfloat16
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    for dtype in ("tf32", "bfloat16"):
        with pytest.raises(ValueError, match=f"^dtype: {dtype} needs .* Tesla T4 is 7.5"):
            supported_dtype("dtype", dtype, torch.device("cuda", 0))
    assert supported_dtype("dtype", "float16", torch.device("cuda", 0)) == "float16"


def test_the_reason_a_dtype_cannot_run_is_a_sentence_without_the_argument_name():
    cpu = torch.device("cpu")
    assert unsupported_reason("float32", cpu) is None and unsupported_reason(torch.bfloat16, cpu) is None
    assert unsupported_reason("tf32", cpu).startswith("tf32 is a tensor-core mode")
    with pytest.raises(ValueError, match="^precisions: tf32 is a tensor-core mode"):
        supported_dtype("precisions", "tf32", cpu)  # the same sentence, after the argument's name
    with pytest.raises(ValueError, match="^dtype: unknown dtype"):
        unsupported_reason("float12", cpu)  # a typo is an error, not a row that says 'not run'


def test_matmul_operands_name_the_operand_that_is_wrong():
    A = torch.zeros(32, 16)
    with pytest.raises(ValueError, match="^A: a contiguous 2D float16 CUDA tensor, got torch.float32"):
        matmul_operands(A, A, A, torch.float16)
    with pytest.raises(ValueError, match="^A: a contiguous 2D float32 CUDA tensor, .* on cpu"):
        matmul_operands(A, A, A, torch.float32)
    if torch.cuda.is_available():
        A, B = torch.zeros(32, 16, device="cuda"), torch.zeros(16, 8, device="cuda")
        assert matmul_operands(A, B, torch.zeros(32, 8, device="cuda"), torch.float32) == (32, 8, 16)
        with pytest.raises(ValueError, match="^B: A is 32 x 16, so B needs 16 rows; it has 32"):
            matmul_operands(A, torch.zeros(32, 8, device="cuda"), torch.zeros(32, 8, device="cuda"), torch.float32)
        with pytest.raises(ValueError, match="^C: a contiguous float32 tensor of 32 x 8"):
            matmul_operands(A, B, torch.zeros(8, 32, device="cuda"), torch.float32)


def test_size_that_cannot_fit_is_rejected():
    with pytest.raises(ValueError, match="^n: needs .* GiB"):
        fits_in_memory("n", 2**60, torch.device("cpu"))


def test_the_timer_comparison_takes_turns_and_needs_a_gpu(monkeypatch):
    with pytest.raises(ValueError, match="^rounds: an even number"):
        timing.compare_with_do_bench(rounds=3)
    monkeypatch.setattr(timing.env, "device", lambda: torch.device("cpu"))
    with pytest.raises(ValueError, match="^device: .* needs a CUDA GPU"):
        timing.compare_with_do_bench()


def test_blas_counts():
    assert flops.axpy(1000).flops == 2000 and flops.axpy(1000).bytes == 12000
    assert flops.dot(10, "float64").bytes == 160
    assert flops.gemv(3, 4).flops == 24 and flops.gemv(3, 4).bytes == (12 + 4 + 6) * 4
    gemm = flops.gemm(100, 200, 300, "float16")
    assert gemm.flops == 2 * 100 * 200 * 300 and gemm.bytes == (100 * 300 + 300 * 200 + 100 * 200) * 2
    # float32 gemm intensity grows like n/6
    assert flops.gemm(6000, 6000, 6000).intensity == pytest.approx(1000)


def test_blocked_gemm_intensity_is_the_block_size_in_words():
    n, block = 4096, 256
    cost = flops.blocked_gemm(n, block, "float32")
    blocks = n // block
    assert cost.bytes == 4 * (2 * blocks + 2) * n * n  # the course's m = (2N + 2) n^2 words
    assert cost.intensity * 4 == pytest.approx(block, rel=0.07)  # q = f/m ~ n/N = block
    with pytest.raises(ValueError, match="^block: must divide"):
        flops.blocked_gemm(100, 7)


def test_timer_measures_a_known_duration():
    measured = timing.measure(lambda: time.sleep(0.004), device=torch.device("cpu"), warmup=1, repeats=5)
    assert len(measured.samples_s) == 5
    assert 0.004 <= measured.median_s < 0.05
    assert measured.rate(8.0) == pytest.approx(8.0 / measured.median_s)
    with pytest.raises(ValueError, match="^repeats"):
        timing.measure(lambda: None, device=torch.device("cpu"), repeats=0)


def test_relative_error_and_nan():
    reference = torch.randn(50, 50)
    assert relative_error(reference.clone(), reference) == 0
    noisy = reference + 1e-3 * torch.randn(50, 50)
    assert 1e-4 < relative_error(noisy, reference) < 1e-2
    poisoned = reference.clone()
    poisoned[3, 4] = float("nan")
    with pytest.raises(AssertionError, match="relative error nan"):
        check_close(poisoned, reference, 1.0, "poisoned")


def test_roofline_model():
    rows = [{"ceiling": "bandwidth", "gbytes_per_s": 1000.0, "status": "ok"},
            {"ceiling": "compute", "dtype": "float32", "gflops": 50_000.0, "status": "ok"},
            {"ceiling": "compute", "dtype": "float16", "status": OUT_OF_MEMORY}]
    roof = Roofline.from_rows(rows, "test GPU")
    assert roof.ridge("float32") == pytest.approx(50)
    assert roof.attainable(10, "float32") == pytest.approx(1e13)
    assert roof.attainable(100, "float32") == pytest.approx(5e13)
    assert roof.bound(10, "float32") == "memory-bound"
    with pytest.raises(ValueError, match="^dtype: no measured peak for 'float16'"):
        roof.peak("float16")
    with pytest.raises(ValueError, match="^intensity"):
        roof.attainable(0, "float32")


def test_sweep_turns_out_of_memory_into_a_row_and_goes_on():
    def measure(n):
        if n > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")
        return {"value": n * 10}

    rows = run_sweep(measure, [{"n": 1}, {"n": 3}, {"n": 2}])
    assert [r["status"] for r in rows] == ["ok", OUT_OF_MEMORY, "ok"]
    assert rows[2]["value"] == 20


def test_sweep_records_a_size_refused_before_allocation():

    rows = run_sweep(rates.measure_blas, [{"op": "gemm", "n": 10**7, "dtype": "float32"},
                                         {"op": "gemm", "n": 32, "dtype": "float32"}])
    assert [r["status"] for r in rows] == [OUT_OF_MEMORY, "ok"]


def test_sweep_does_not_hide_other_errors():
    def measure(n):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_sweep(measure, [{"n": 1}])


def test_banner_without_gpu(monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    assert env.device().type == "cpu"
    assert str(banner.banner()).startswith("The GPU figures on this page are drawn from recordings")
    assert env.slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_strict_grader_raises_and_lenient_grader_hints(capsys):
    strict = grading.Grader(strict=True)
    strict.close("two", lambda: 2.0, 2.0, 1e-9, "hint")
    with pytest.raises(grading.CheckFailed, match="hint: add more"):
        strict.close("three", lambda: None, 3.0, 1e-9, "add more")
    lenient = grading.Grader(strict=False)
    lenient.check("broken", lambda: 1 / 0, "divide by something else")
    lenient.close("nan", lambda: float("nan"), 1.0, 0.5, "not a number")
    out = capsys.readouterr().out
    assert "ZeroDivisionError" in out and "hint: divide by something else" in out and "hint: not a number" in out
    assert lenient.failed == ["broken", "nan"]


def test_vertical_marker_places_its_text_on_a_log_axis():

    fig = plots.sweep_figure([{"x": 1e3, "y": 1}, {"x": 1e9, "y": 2}], "x", "y", title="t", x_title="x", y_title="y",
                             log_x=True)
    plots.vertical_marker(fig, 1e6, "here")
    assert fig.layout.shapes[0].x0 == 1e6
    assert fig.layout.annotations[-1].x == pytest.approx(6.0) and fig.layout.annotations[-1].text == "here"


def test_agrees_with_never_raises():
    reference = torch.randn(3, 2, dtype=torch.float64)
    assert grading.agrees_with(reference.clone(), reference)
    assert not grading.agrees_with(None, reference)
    assert not grading.agrees_with(reference.T, reference)
    assert not grading.agrees_with(torch.full_like(reference, float("nan")), reference)


def test_a_sweep_leaves_out_the_formats_its_device_lacks():
    cpu = torch.device("cpu")
    assert validation.supported_dtypes(["float64", "tf32", "bfloat16"], cpu) == ["float64", "bfloat16"]
