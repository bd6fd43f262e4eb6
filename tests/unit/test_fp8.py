"""FP8 scales, casts and scaled matmuls (gpulab.kernels.fp8): numerics on the CPU, the real thing on Hopper."""

from __future__ import annotations

import pytest
import torch

from conftest import needs_gpu
from gpulab.core.correctness import relative_error
from gpulab.kernels import fp8

LARGEST = {"e4m3": 448.0, "e5m2": 57344.0}


def test_formats_largest_values_and_unit_roundoffs():
    for name, largest in LARGEST.items():
        assert torch.finfo(fp8.FORMATS[name]).max == largest
        assert fp8.UNIT_ROUNDOFF[name] == torch.finfo(fp8.FORMATS[name]).eps / 2
    assert fp8.fp8_format(torch.float8_e4m3fn) == fp8.fp8_format("float8_e4m3fn") == "e4m3"
    assert fp8.format_pair(("e5m2", "e4m3")) == ("e5m2", "e4m3") and fp8.format_label(("e5m2", "e4m3")) == "e5m2 x e4m3"


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_scales_map_amax_to_the_largest_value(fmt, granularity):
    a, b = fp8.spread_operands(32, 48, 64, seed=1, spread=2)
    for operand, x, dim in (("a", a, 1), ("b", b, 0)):
        scale = fp8.scale_for(x, fmt, granularity, operand)
        q, inverse = fp8.quantize(x, fmt, granularity, operand)
        assert scale.dtype == inverse.dtype == torch.float32
        if granularity == "tensor":
            assert scale.shape == inverse.shape == ()
            assert (x.abs().max() * scale).item() == pytest.approx(LARGEST[fmt], rel=1e-6)
            assert q.float().abs().max().item() == LARGEST[fmt]
        else:
            shape = (32, 1) if operand == "a" else (1, 48)
            assert scale.shape == inverse.shape == shape
            assert torch.allclose(x.abs().amax(dim=dim, keepdim=True) * scale, torch.full(shape, LARGEST[fmt]))
            assert (q.float().abs().amax(dim=dim) == LARGEST[fmt]).all()
        assert q.dtype == fp8.FORMATS[fmt]
        assert torch.allclose(scale * inverse, torch.ones_like(scale))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_round_trip_error_is_within_the_unit_roundoff(fmt, granularity):
    x = fp8.spread_operands(64, 16, 256, seed=2, spread=1)[0]
    q, inverse = fp8.quantize(x, fmt, granularity)
    back = fp8.dequantize(q, inverse, torch.float64)
    info = torch.finfo(fp8.FORMATS[fmt])
    # Relative to the value where it is normal in FP8; below, half the spacing of FP8's subnormals (scaled back).
    half_subnormal_step = info.smallest_normal * info.eps / 2 * inverse.double()
    bound = fp8.UNIT_ROUNDOFF[fmt] * x.double().abs() + half_subnormal_step
    assert ((back - x.double()).abs() <= bound * (1 + 1e-6)).all()
    assert not torch.equal(back, x.double())  # it does round
    assert fp8.dequantize(q, inverse, torch.bfloat16).dtype == torch.bfloat16


def test_zero_tensors_and_rows_get_a_finite_scale_and_stay_zero():
    zeros = torch.zeros(16, 32)
    for granularity in fp8.GRANULARITIES:
        for operand in ("a", "b"):
            scale = fp8.scale_for(zeros, "e4m3", granularity, operand)
            assert torch.isfinite(scale).all() and (scale == 1).all()
            q, inverse = fp8.quantize(zeros, "e5m2", granularity, operand)
            assert (fp8.dequantize(q, inverse) == 0).all()
    x = torch.randn(16, 32)
    x[3] = 0
    x[5] = 1e-38  # tinier than the amax floor: the scale stays finite
    q, inverse = fp8.quantize(x, "e4m3", "row")
    back = fp8.dequantize(q, inverse)
    assert torch.isfinite(back).all() and (back[3] == 0).all()
    assert relative_error(back, x) < 2 * fp8.UNIT_ROUNDOFF["e4m3"]
    a = torch.zeros(16, 32)
    assert (fp8.emulated_matmul(a, torch.randn(32, 16)) == 0).all()


@pytest.mark.parametrize("fp8_dtype", ["e4m3", "e5m2", ("e5m2", "e4m3")])
@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_scaled_matmul_on_the_cpu_matches_the_emulation(fp8_dtype, granularity):
    a, b = fp8.spread_operands(48, 32, 64, seed=3, spread=1)
    emulated = fp8.emulated_matmul(a, b, fp8_dtype, granularity)
    assert relative_error(fp8.scaled_matmul(a, b, fp8_dtype, granularity, torch.float32), emulated) < 1e-5
    result = fp8.scaled_matmul(a, b, fp8_dtype, granularity)
    assert result.dtype == torch.bfloat16 and result.shape == (48, 32)
    assert relative_error(result, emulated) < 2**-8
    column_major_b = b.t().contiguous().t()  # a Linear layer's weight, transposed: used as it is
    assert relative_error(fp8.scaled_matmul(a, column_major_b, fp8_dtype, granularity, torch.float32), emulated) < 1e-5


def test_e4m3_is_more_accurate_than_e5m2_and_bfloat16_than_both():
    for granularity in fp8.GRANULARITIES:
        e4m3 = fp8.fp8_error(128, 128, 256, "e4m3", granularity, seed=4)
        e5m2 = fp8.fp8_error(128, 128, 256, "e5m2", granularity, seed=4)
        mixed = fp8.fp8_error(128, 128, 256, ("e5m2", "e4m3"), granularity, seed=4)
        assert e4m3["bfloat16_error"] == e5m2["bfloat16_error"]  # the same data
        assert e4m3["bfloat16_error"] < e4m3["fp8_error"] < mixed["fp8_error"] < e5m2["fp8_error"]
        # Each within its unit roundoff (rounding both operands, errors averaging over the dot products).
        assert e4m3["fp8_error"] < fp8.UNIT_ROUNDOFF["e4m3"] and e5m2["fp8_error"] < fp8.UNIT_ROUNDOFF["e5m2"]
        assert e4m3["bfloat16_error"] < 2**-8


def test_row_wise_scales_keep_rows_of_very_different_sizes_accurate():
    # Rows of A and columns of B spread over 10^-3..10^3. The overall (Frobenius) error is the large rows',
    # which any scale keeps in FP8's normal range: there the two granularities differ only by where the values
    # fall between FP8 numbers (about +-15% from seed to seed). Per row, every row counted alike, they part.
    for seed in (5, 6):
        tensor = fp8.fp8_error(128, 128, 256, "e4m3", "tensor", seed=seed, spread=3)
        row = fp8.fp8_error(128, 128, 256, "e4m3", "row", seed=seed, spread=3)
        # e4m3's narrow range: one scale for the tensor sends the small rows into subnormals and zero.
        assert tensor["fp8_mean_row_error"] > 3 * row["fp8_mean_row_error"]
        assert tensor["fp8_max_row_error"] > 4 * row["fp8_max_row_error"]
        assert tensor["fp8_max_row_error"] > 0.5  # some row mostly lost
        assert row["fp8_max_row_error"] < 2 * fp8.UNIT_ROUNDOFF["e4m3"]
        assert row["fp8_error"] <= 1.2 * tensor["fp8_error"]
        # e5m2's range (2^-16 .. 57344) covers 10^6 under one scale: row-wise is as accurate, not more.
        tensor = fp8.fp8_error(128, 128, 256, "e5m2", "tensor", seed=seed, spread=3)
        row = fp8.fp8_error(128, 128, 256, "e5m2", "row", seed=seed, spread=3)
        assert row["fp8_mean_row_error"] <= 1.1 * tensor["fp8_mean_row_error"]
        assert row["fp8_max_row_error"] <= 1.3 * tensor["fp8_max_row_error"]
        assert row["fp8_error"] <= 1.2 * tensor["fp8_error"]
        assert row["bfloat16_max_row_error"] < row["fp8_max_row_error"]
    # On data of one scale, row-wise is at least as accurate overall.
    for fmt in ("e4m3", "e5m2"):
        for seed in range(3):
            row = fp8.fp8_error(128, 128, 256, fmt, "row", seed=seed)
            tensor = fp8.fp8_error(128, 128, 256, fmt, "tensor", seed=seed)
            assert row["fp8_error"] <= 1.01 * tensor["fp8_error"]


def test_bad_inputs_are_named():
    a, b = torch.randn(32, 48), torch.randn(48, 16)
    with pytest.raises(ValueError, match="fp8_dtype: unknown FP8 format 'e3m4'"):
        fp8.scaled_matmul(a, b, "e3m4")
    with pytest.raises(ValueError, match="fp8_dtype"):
        fp8.quantize(a, torch.float16)
    with pytest.raises(TypeError, match="fp8_dtype"):
        fp8.scale_for(a, 8)
    with pytest.raises(ValueError, match="fp8_dtype"):
        fp8.scaled_matmul(a, b, ("e4m3",))
    with pytest.raises(ValueError, match="granularity"):
        fp8.scaled_matmul(a, b, "e4m3", "block")
    with pytest.raises(ValueError, match="granularity"):
        fp8.quantize(a, "e4m3", "column")
    with pytest.raises(ValueError, match="operand"):
        fp8.scale_for(a, "e4m3", "row", "c")
    with pytest.raises(ValueError, match="a: a 2-D matrix"):
        fp8.scaled_matmul(torch.randn(2, 32, 48), b)
    with pytest.raises(ValueError, match="tensor: a 2-D matrix"):
        fp8.quantize(torch.randn(32))
    with pytest.raises(ValueError, match="b needs 48 rows; it has 32"):
        fp8.scaled_matmul(a, torch.randn(32, 16))
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8.scaled_matmul(torch.randn(30, 48), b)
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8.emulated_matmul(a, torch.randn(48, 20))
    with pytest.raises(TypeError, match="a: a torch.Tensor"):
        fp8.scaled_matmul(a.tolist(), b)
    with pytest.raises(TypeError, match="already FP8"):
        fp8.scaled_matmul(a.to(torch.float8_e4m3fn), b)
    with pytest.raises(TypeError, match="floating-point"):
        fp8.quantize(torch.ones(16, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="inf or NaN"):
        fp8.quantize(torch.full((16, 16), float("inf")))
    with pytest.raises(ValueError, match="out_dtype"):
        fp8.scaled_matmul(a, b, out_dtype=torch.int8)
    with pytest.raises(TypeError, match="quantized: an FP8 tensor"):
        fp8.dequantize(a, torch.tensor(1.0))
    with pytest.raises(ValueError, match="spread"):
        fp8.fp8_error(16, 16, 16, spread=-1)


def test_sweep_checks_its_arguments_and_needs_an_fp8_gpu():
    from gpulab.core import kernel_mode
    from gpulab.core.provenance import declaration

    assert declaration(fp8.fp8_sweep).names == ("fp8_matmul",)
    with pytest.raises(ValueError, match="sizes: torch._scaled_mm wants multiples of 16"):
        fp8.fp8_sweep(sizes=(1000,))
    with pytest.raises(ValueError, match="sizes"):
        fp8.fp8_sweep(sizes=())
    with pytest.raises(ValueError, match="formats: unknown FP8 format"):
        fp8.fp8_sweep(sizes=(256,), formats=("e4m3", "int8"))
    with pytest.raises(ValueError, match="formats: at least one"):
        fp8.fp8_sweep(sizes=(256,), formats=())
    with pytest.raises(ValueError, match="granularities"):
        fp8.fp8_sweep(sizes=(256,), granularities=("tensor", "block"))
    if not kernel_mode.on_gpu():
        with pytest.raises(ValueError, match="fp8_sweep: times kernels, which needs a CUDA GPU"):
            fp8.fp8_sweep(sizes=(256,))


@needs_gpu(capability=(8, 9))
@pytest.mark.parametrize("fp8_dtype", ["e4m3", ("e5m2", "e4m3")])
@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_scaled_matmul_on_the_gpu_matches_the_emulation(fp8_dtype, granularity):
    a, b = fp8.spread_operands(256, 384, 512, seed=6, spread=1)
    a, b = a.to(torch.bfloat16).cuda(), b.to(torch.bfloat16).cuda()
    emulated = fp8.emulated_matmul(a.cpu(), b.cpu(), fp8_dtype, granularity)
    result = fp8.scaled_matmul(a, b, fp8_dtype, granularity)
    assert result.dtype == torch.bfloat16 and result.is_cuda
    assert relative_error(result, emulated) < 2**-7  # float32 accumulation, bfloat16 output
    reference = a.double() @ b.double()
    fa, fb = fp8.format_pair(fp8_dtype)
    assert relative_error(result, reference) < fp8.UNIT_ROUNDOFF[fa] + fp8.UNIT_ROUNDOFF[fb]
    with pytest.raises(ValueError, match="no e5m2 x e5m2"):
        fp8.scaled_matmul(a, b, "e5m2", granularity)
