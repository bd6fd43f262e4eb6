"""The tensor-core chapter: peaks from the hardware, one tensor-core operation in plain arithmetic, the formats
side by side, the WMMA kernels (compiled everywhere, run against float64 on a GPU), TF32 switches, a layer's GEMMs."""

from __future__ import annotations

import pytest
import torch

from conftest import needs_gpu
from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch10_tensor_cores import tensor_cores, wmma
from gpulab.core import kernel_mode
from gpulab.core.correctness import check_close, random_tensor
from gpulab.kernels import cuda_c


def test_peaks_follow_from_the_hardware_as_the_course_works_them_out():
    rows = {r["architecture"]: r for r in tensor_cores.peak_rows()}
    # The course: V100 80 SMs x 8 tensor cores x 64 FMA x 2 x 1.53 GHz = 125 TFLOP/s;
    # A100 108 x 4 x 256 x 2 x 1.41 GHz = 312 TFLOP/s
    assert rows["Volta"]["tensor_tflops"] == pytest.approx(125.3, rel=1e-3)
    assert rows["Ampere"]["tensor_tflops"] == pytest.approx(311.9, rel=1e-3)
    assert rows["Hopper"]["tensor_tflops"] == pytest.approx(989.4, rel=1e-3)
    assert rows["Volta"]["tile_per_clock"] == "4x4x4" and rows["Ampere"]["tile_per_clock"] == "8x4x8"
    assert rows["Volta"]["fma_per_clock_per_tensor_core"] == 4 * 4 * 4
    assert rows["Ampere"]["fma_per_clock_per_tensor_core"] == 8 * 4 * 8
    assert rows["Ampere"]["ratio"] == pytest.approx(16.0)


def test_one_tensor_core_operation_in_plain_arithmetic():
    generator = torch.Generator().manual_seed(3)
    A, B, C = (torch.randn(4, 4, generator=generator) for _ in range(3))
    exact = A.half().double() @ B.half().double() + C.double()  # float16 inputs, exact products and sums
    assert check_close(tensor_cores.tile_mma(A, B, C), exact, 1e-6, "float32 sums") < 1e-6
    assert tensor_cores.tile_mma(A, B, C, "float16").dtype == torch.float16
    # A float16 accumulator stops growing where a float32 one does not: 2048 + 1 is 2048 in float16.
    ones = torch.ones(1, 8)
    start = torch.full((1, 1), 2048.0)
    assert tensor_cores.tile_mma(ones, ones.T, start, "float16").item() == 2048.0
    assert tensor_cores.tile_mma(ones, ones.T, start, "float32").item() == 2056.0
    with pytest.raises(ValueError, match="^accumulator:"):
        tensor_cores.tile_mma(A, B, C, "bfloat16")
    with pytest.raises(ValueError, match="^A, B, C:"):
        tensor_cores.tile_mma(A, B[:3], C)


def test_formats_side_by_side_on_this_device():
    rows = {r["format"]: r for r in tensor_cores.matmul_formats(64)}
    assert list(rows) == list(tensor_cores.FORMATS_COMPARED)
    measured = {name: r for name, r in rows.items() if r.get("status") == "ok"}
    assert {"float32", "float16", "bfloat16"} <= set(measured)
    assert measured["float32"]["relative_error"] < 1e-5
    assert measured["float32"]["relative_error"] < measured["float16"]["relative_error"] < \
        measured["bfloat16"]["relative_error"] < 0.05  # 10 fraction bits, then 7
    assert all(r["tflops"] > 0 for r in measured.values())
    if not kernel_mode.on_gpu():
        assert rows["tf32"]["status"].startswith("not available: tf32 is a tensor-core mode")
    if "float8_e4m3fn" in measured:  # 3 fraction bits: an error of a few percent
        assert measured["bfloat16"]["relative_error"] < measured["float8_e4m3fn"]["relative_error"] < 0.15


def test_a_format_is_named_when_it_is_unknown_or_missing():
    with pytest.raises(ValueError, match="^fmt: one of"):
        tensor_cores.measure_format(64, "float64")
    with pytest.raises(ValueError, match="^n:"):
        tensor_cores.measure_format(0, "float32")
    if not kernel_mode.on_gpu():
        with pytest.raises(ValueError, match="^fmt: tf32 is a tensor-core mode"):
            tensor_cores.measure_format(64, "tf32", torch.device("cpu"))


def test_the_pipelined_variants_are_validated_and_every_variant_compiles():
    default = wmma.PIPELINED
    assert (default.tile, default.threads, default.defines) == ((128, 128), 128, ())
    assert default.shared_bytes == 3 * (128 * 40 + 32 * 136) * 2  # rows padded by 8 halves
    assert default.grid(1000, 4097) == (33, 8)
    wide = wmma.pipelined(BN=256, STAGES=4)
    assert (wide.tile, wide.threads, wide.label) == ((128, 256), 256, "WMMA, pipelined (BN=256, STAGES=4)")
    for kernel in (*wmma.KERNELS, wide):
        found = wmma.resources(kernel)
        assert 0 < found["registers"] <= 255 and found["spill_bytes"] == 0 and found["blocks_per_sm"] >= 1
    too_big = {"BM": 256, "BN": 256, "WM": 128, "WN": 128, "BK": 128, "STAGES": 4}
    for bad, message in (({"BX": 8}, "has BM, BN"), ({"WM": 48}, "warp tiles"), ({"BK": 8}, "warp tiles"),
                         ({"STAGES": 1}, "STAGES >= 2"), (too_big, "shared memory")):
        with pytest.raises(ValueError, match=message):
            wmma.pipelined(**bad)


def test_every_wmma_file_is_a_kernel_of_the_chapter():
    wmma_files = [p.stem for p in cuda_c.files() if "wmma" in p.stem]
    assert wmma_files == [k.file for k in wmma.KERNELS]


def test_the_kernels_need_a_gpu_and_bad_operands_are_named():
    A = random_tensor((32, 32), torch.float16, torch.device("cpu"))
    if not kernel_mode.on_gpu():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            wmma.wmma_gemm(wmma.NAIVE, A, A)
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            wmma.wmma_comparison(64)
    with pytest.raises(ValueError, match="^A: a contiguous 2D float16 CUDA tensor"):
        wmma.prepared(wmma.NAIVE, A, A, torch.empty(32, 32))
    with pytest.raises(ValueError, match="^n, check_size: multiples of 16"):
        wmma.wmma_comparison(100)


@needs_gpu
@pytest.mark.parametrize("kernel", [*wmma.KERNELS, wmma.pipelined(BN=256, STAGES=4)],
                         ids=lambda k: k.label)
def test_every_wmma_kernel_matches_float64_on_ragged_sizes(kernel):
    device = kernel_mode.device()
    for m, n, k in ((16, 16, 16), (144, 400, 48), (1008, 1200, 784)):
        assert wmma.check(kernel, m, n, k, device) < 1e-4


@needs_gpu
def test_operands_that_are_not_whole_fragments_are_refused():
    A = random_tensor((40, 32), torch.float16, kernel_mode.device())
    with pytest.raises(ValueError, match="multiples of 16"):
        wmma.wmma_gemm(wmma.PIPELINED, A, A[:32])


def test_the_tf32_switches_are_reported_and_restored():
    before = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    rows = {r["setting"]: r for r in tensor_cores.tf32_switch(64)}
    assert (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()) == before
    assert list(rows) == list(tensor_cores.TF32_SETTINGS)
    assert rows["allow_tf32 = True"]["allow_tf32"] and not rows["allow_tf32 = False"]["allow_tf32"]
    assert rows['set_float32_matmul_precision("high")']["allow_tf32"]  # "high" is the same switch
    assert all(r["kernels"] and r["relative_error"] < 5e-3 for r in rows.values())
    if kernel_mode.on_gpu():  # TF32 rounds the inputs to 10 fraction bits: its error is far above float32's
        assert rows["allow_tf32 = True"]["relative_error"] > 10 * rows["allow_tf32 = False"]["relative_error"]


def test_a_layers_three_gemms_are_checked_and_timed():
    rows = tensor_cores.layer_gemms_timed(24, 40, 56, "float32")
    shapes = mlp.layer_gemms(24, 40, 56)
    assert [r["gemm"] for r in rows] == [s["phase"] for s in shapes]
    assert [(r["M"], r["N"], r["K"]) for r in rows] == [(s["M"], s["N"], s["K"]) for s in shapes]
    assert all(r["relative_error"] < 1e-5 and r["seconds"] > 0 for r in rows)
    sweep = tensor_cores.layer_gemms_sweep([{"batch": 24, "inputs": 40, "outputs": o} for o in (56, 60)], "float32")
    steps = [r for r in sweep if r["gemm"] == "step"]
    assert [r["outputs"] for r in steps] == [56, 60]
    for step in steps:
        parts = [r["seconds"] for r in sweep if r["outputs"] == step["outputs"] and r["gemm"] != "step"]
        assert step["seconds"] == pytest.approx(sum(parts))
    with pytest.raises(ValueError, match="^outputs:"):
        tensor_cores.layer_gemms_timed(24, 40, 0)
