"""Memory-bound layers and fusion: costs, the dropout hash, the hand-fused kernel, eager against compiled."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import needs_gpu
from gpulab.ch13_memory_bound_layers_and_fusion import figures, fusion, sweeps
from gpulab.core import kernel_mode
from gpulab.kernels import cuda_c


def test_layer_and_chain_costs():
    relu = fusion.op_cost("relu", 1000)
    assert (relu.flops, relu.bytes) == (1000, 8000) and relu.intensity == 1 / 8
    assert fusion.op_cost("dropout", 10).bytes == 10 * (4 + 4 + 1)  # output and a one-byte mask
    assert fusion.op_cost("gelu", 10, "bfloat16").bytes == 40
    eager, fused = fusion.chain_cost("bias_gelu_dropout", 100), fusion.chain_cost("bias_gelu_dropout", 100, fused=True)
    assert eager.flops == fused.flops == 100 * (1 + 5 + 2)
    assert (eager.bytes, fused.bytes) == (100 * 25, 100 * 8)
    norm_eager = fusion.chain_cost("add_layer_norm", 100)
    assert (norm_eager.bytes, fusion.chain_cost("add_layer_norm", 100, fused=True).bytes) == (100 * 20, 100 * 12)
    with pytest.raises(ValueError, match="^op: unknown 'swish'"):
        fusion.op_cost("swish", 10)
    with pytest.raises(ValueError, match="^chain:"):
        fusion.chain_cost("conv_relu", 10)
    with pytest.raises(ValueError, match="^n:"):
        fusion.op_cost("relu", 0)


def _numpy_hash(values: np.ndarray) -> np.ndarray:
    """lowbias32 in NumPy's uint32, whose multiplication wraps modulo 2^32 by definition."""
    h = values.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x7FEB352D)
    h ^= h >> np.uint32(15)
    h *= np.uint32(0x846CA68B)
    return h ^ (h >> np.uint32(16))


def test_the_three_hashes_agree():
    values = np.concatenate([[0, 1, 2, 2**31, 2**32 - 1], np.random.default_rng(0).integers(0, 2**32, 10_000)])
    expected = _numpy_hash(values)
    assert [fusion.hash32(int(v)) for v in values[:50]] == expected[:50].tolist()
    assert torch.equal(fusion.hash32_tensor(torch.tensor(values, dtype=torch.int64)),
                       torch.tensor(expected.astype(np.int64)))
    assert fusion.hash32(0) == 0 and len(set(expected.tolist())) == len(set(values.tolist()))  # a bijection


def test_the_kernel_uses_the_same_hash_constants():
    text = cuda_c.source(fusion.KERNEL)
    found = [int(c, 16) for c in re.findall(r"h \*= (0x[0-9a-fA-F]+)U", text)]
    assert found == list(fusion.HASH_MULTIPLIERS)


def test_keep_mask_is_reproducible_and_keeps_the_right_share():
    n, p = 200_000, 0.1
    mask = fusion.keep_mask(n, p, seed=7)
    assert mask.dtype == torch.bool and mask.shape == (n,)
    assert abs(1 - mask.double().mean().item() - p) < 6 * math.sqrt(p * (1 - p) / n)
    assert torch.equal(mask, fusion.keep_mask(n, p, seed=7))
    assert not torch.equal(mask, fusion.keep_mask(n, p, seed=8))
    assert fusion.keep_mask(1000, 0.0, seed=1).all()
    assert fusion.dropout_threshold(0.5) == 2**31
    for bad in (-0.1, 1.0, float("nan"), True):
        with pytest.raises(ValueError, match="^p:"):
            fusion.keep_mask(10, bad, 0)
    for bad in (-1, 2**32, 1.5):
        with pytest.raises(ValueError, match="^seed:"):
            fusion.keep_mask(10, 0.1, bad)


@pytest.mark.parametrize("approximate", fusion.APPROXIMATIONS)
def test_the_reference_is_gelu_of_x_plus_bias_masked_and_scaled(approximate):
    x, bias, p, seed = torch.randn(5, 8), torch.randn(8), 0.3, 11
    out = fusion.reference_bias_gelu_dropout(x, bias, p, seed, approximate)
    mask = fusion.keep_mask(40, p, seed).reshape(5, 8)
    for i in range(5):
        for j in range(8):
            v = float(x[i, j]) + float(bias[j])
            if approximate == "none":
                g = 0.5 * v * (1 + math.erf(v / math.sqrt(2)))
            else:
                g = 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
            assert out[i, j].item() == pytest.approx(g / (1 - p) if mask[i, j] else 0.0, rel=1e-12, abs=1e-15)
    with pytest.raises(ValueError, match="^bias:"):
        fusion.reference_bias_gelu_dropout(x, torch.randn(5), p, seed)
    with pytest.raises(ValueError, match="^approximate:"):
        fusion.reference_bias_gelu_dropout(x, bias, p, seed, "sigmoid")


@pytest.mark.parametrize(("rows", "cols4", "blocks_per_sm"), [(65536, 1024, 4), (37, 257, 8), (3, 1, 4),
                                                              (1000, 16, 2), (10**6, 3, 16)])
def test_launch_shape_covers_every_column_and_fits_the_limits(rows, cols4, blocks_per_sm):
    (gx, gy), (tx, ty) = fusion.launch_shape(rows, cols4, 132, blocks_per_sm)
    assert tx * ty <= fusion.THREADS_PER_BLOCK and tx % 32 == 0
    assert gx * tx >= cols4 > (gx - 1) * tx  # every float4 column has a thread, and no block is wholly idle
    assert 1 <= gy <= min(65535, math.ceil(rows / ty))
    if cols4 < 128:
        assert ty > 1  # narrow rows: a block takes several rows at once


def test_the_kernel_compiles_in_both_forms_without_spilling():
    for defines in ({"GELU_TANH": 0}, {"GELU_TANH": 1}, {"UNROLL": 8}):
        report = cuda_c.compile_report(fusion.KERNEL, arch="sm_90", defines=defines)
        resources = report.resources[fusion.KERNEL_FUNCTION]
        assert resources.registers <= 64 or defines.get("UNROLL") == 8
        assert resources.spill_stores_bytes == resources.stack_bytes == 0


@pytest.mark.skipif(kernel_mode.on_gpu(), reason="checks the message shown without a GPU")
def test_the_hand_kernel_says_it_needs_a_gpu():
    with pytest.raises(ValueError, match="runs only on a GPU.*recorded run"):
        fusion.fused_bias_gelu_dropout(torch.randn(4, 8), torch.randn(8), 0.1, 0)


def test_check_dropout_accepts_dropout_and_catches_mistakes():
    torch.manual_seed(0)
    x = torch.randn(200, 256)
    expected = F.gelu(x.double())
    assert fusion.check_dropout(F.dropout(F.gelu(x), 0.2, training=True), expected, 0.2, "dropout") < 1e-6
    with pytest.raises(AssertionError, match="relative error"):  # kept elements not scaled by 1 / (1 - p)
        fusion.check_dropout(F.gelu(x) * (torch.rand_like(x) > 0.2), expected, 0.2, "unscaled")
    with pytest.raises(AssertionError, match="dropped"):  # the wrong probability
        fusion.check_dropout(F.dropout(F.gelu(x), 0.5, training=True) * 0.5 / 0.8, expected, 0.2, "p = 0.5")


def test_pointwise_layers_are_measured_with_their_ceilings():
    rows = sweeps.pointwise_roofline(32, 64, 2**20, 64)
    roofline, layers = sweeps.roofline_of(rows, "cpu")
    assert roofline.bandwidth > 0 and roofline.peak("float32") > 0
    assert {r["op"] for r in layers} >= {"ReLU", "GELU", "LayerNorm", "softmax", "bias + GELU + dropout (eager)"}
    for row in layers:
        assert row["seconds"] > 0 and row["relative_error"] < 1e-5 and row["fraction_of_copy"] > 0
        assert row["intensity"] <= 1  # at most one FLOP per byte: far left of any GPU's ridge
        assert row["gbytes_per_s"] == pytest.approx(row["bytes"] / row["seconds"] / 1e9)
    fig = figures.roofline_figure(rows, "cpu", title="test")
    assert len(fig.data) == 1 + len(layers) and fig.layout.xaxis.type == "log"


def test_compile_comparison_rows_and_a_compile_that_fails(monkeypatch):
    rows = sweeps.compile_comparison(16, 64, use_compile=False)
    assert [(r["chain"], r["mode"]) for r in rows] == [
        ("bias_gelu_dropout", "eager"), ("bias_gelu_dropout", "torch.compile"), ("add_layer_norm", "eager"),
        ("add_layer_norm", "torch.compile"), ("copy", "copy")]
    eager = rows[0]
    assert eager["status"] == "ok" and eager["bytes"] == 25 * 16 * 64 and eager["min_bytes"] == 8 * 16 * 64
    assert eager["kernels"] is None or eager["kernels"] >= 3
    assert rows[1]["status"] == "skipped: turned off (use_compile=False)" and "seconds" not in rows[1]

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler\nmore detail")

    monkeypatch.setattr(sweeps, "compile_unavailable", lambda device: None)
    monkeypatch.setattr(sweeps, "compiled", broken)
    rows = sweeps.compile_comparison(8, 32, chains=["add_layer_norm"])
    assert rows[1]["status"] == "compile failed: RuntimeError: no C++ compiler"
    with pytest.raises(ValueError, match="^chains:"):
        sweeps.compile_comparison(8, 32, chains=["nope"])


def test_parameter_sizes_are_a_transformers():
    sizes = sweeps.parameter_sizes(2, 64)
    assert len(sizes) == 2 * 12 and sum(sizes) == 2 * (12 * 64 * 64 + 13 * 64)


def test_horizontal_fusion_gives_one_answer_three_ways():
    rows = sweeps.horizontal_fusion([32], layers=2)
    assert [r["method"] for r in rows] == list(sweeps.HORIZONTAL_METHODS)
    assert all(r["relative_error"] < 1e-6 and r["tensors"] == 24 for r in rows)
    assert rows[0]["speedup"] == 1.0
    with pytest.raises(ValueError, match="^d_models:"):
        sweeps.horizontal_fusion([0], layers=1)


@needs_gpu
def test_the_hand_kernel_matches_the_reference_on_the_gpu():
    for shape in ((37, 1028), (2, 4), (129, 64)):
        for approximate in fusion.APPROXIMATIONS:
            x, bias = torch.randn(shape, device="cuda"), torch.randn(shape[1], device="cuda")
            assert fusion.check_fused(x, bias, 0.25, 99, approximate) <= fusion.TOLERANCE[approximate]
    with pytest.raises(ValueError, match="multiple of 4"):
        fusion.fused_bias_gelu_dropout(torch.randn(4, 6, device="cuda"), torch.randn(6, device="cuda"), 0.1, 0)
    with pytest.raises(ValueError, match="16-byte aligned"):
        x = torch.randn(4 * 8 + 1, device="cuda")[1:].reshape(4, 8)
        fusion.fused_bias_gelu_dropout(x, torch.randn(8, device="cuda"), 0.1, 0)


@needs_gpu
def test_hand_kernel_experiment_small_on_the_gpu():
    rows = sweeps.hand_kernel(256, 1024, use_compile=False)
    kinds = [r["kind"] for r in rows]
    assert kinds.count("CUDA C") == len(sweeps.DEFAULT_VARIANTS) and kinds[-1] == "copy"
    assert all(r["fraction_of_copy"] > 0 for r in rows if r["status"] == "ok")
