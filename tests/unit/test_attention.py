"""Attention as batched GEMMs, a transformer block's FLOPs, and the profiled training step, small on the CPU."""

from __future__ import annotations

import pytest
import torch

from gpulab.ch06_recurrent_and_attention import attention
from gpulab.core import env


def test_attention_functions_match_pytorch():
    rows = attention.check_attention(batch=2, seq_len=16, embed=32, heads=4)
    assert len(rows) == 2 and all(r["relative_error"] < 1e-5 for r in rows)


def test_multi_head_rejects_bad_arguments():
    x = torch.randn(1, 4, 6)
    with pytest.raises(ValueError, match="^heads:"):
        attention.multi_head_self_attention(x, torch.zeros(18, 6), torch.zeros(18), torch.zeros(6, 6),
                                            torch.zeros(6), heads=4)
    with pytest.raises(ValueError, match="^in_proj_weight, out_proj_weight:"):
        attention.multi_head_self_attention(x, torch.zeros(12, 6), torch.zeros(12), torch.zeros(6, 6),
                                            torch.zeros(6), heads=2)
    with pytest.raises(ValueError, match="^w_q, w_k, w_v:"):
        attention.self_attention(x, torch.zeros(6, 3), torch.zeros(6, 4), torch.zeros(6, 3))


def test_block_flops_and_flop_counter_agree():
    parts = attention.block_flops(2, 8, 16, 64)
    assert parts["scores QK^T"] == parts["AV"] == 2 * 2 * 8 * 8 * 16
    assert parts["MLP"] == 4 * 2 * 8 * 16 * 64
    for row in attention.counted_flops(batch=2, seq_len=8, d_model=16, heads=2, d_ff=64):
        assert row["formula"] == row["flop_counter"], row["counted"]
    with pytest.raises(ValueError, match="^seq_len:"):
        attention.block_flops(1, 0, 16, 64)


def test_quadratic_terms_overtake_at_the_crossover():
    d, d_ff = 64, 256
    crossover = attention.quadratic_crossover(d, d_ff)
    assert crossover == 6 * d
    rows = attention.flop_share_rows([crossover // 2, crossover, crossover * 2], d, d_ff)
    share = {r["seq_len"]: r["share"] for r in rows if r["part"].startswith("QK^T + AV")}
    assert share[crossover // 2] < 0.5 and share[crossover] == pytest.approx(0.5) and share[crossover * 2] > 0.5
    for n in (crossover, crossover * 2):
        assert sum(r["share"] for r in rows if r["seq_len"] == n and r["part"] in attention.BLOCK_PARTS) \
            == pytest.approx(1)


@pytest.mark.parametrize(("name", "category"), [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "GEMM"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(Params)", "GEMM"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "GEMM"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>)", "attention (fused)"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "attention (fused)"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>", "layer norm"),
    ("void (anonymous namespace)::cunn_SoftMaxForward<4, float>", "softmax"),
    ("void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float>", "dropout"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<4>>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "copy and cast"),
    ("something_new", "other"),
])
def test_kernel_names_are_classified(name, category):
    assert attention.classify(name) == category


def test_operator_names_are_classified():
    patterns = attention.OPERATOR_PATTERNS
    assert attention.classify("aten::addmm", patterns) == "GEMM"
    assert attention.classify("aten::bmm", patterns) == "GEMM"
    assert attention.classify("aten::matmul", patterns) == "other"  # it calls mm; its own time is bookkeeping
    assert attention.classify("aten::native_layer_norm_backward", patterns) == "layer norm"


def test_profile_training_step_sorts_the_time_of_every_kernel_or_operator_into_categories():
    rows = attention.training_step_profile(layers=1, d_model=16, heads=2, d_ff=32, batch=2, seq_len=8,
                                           precisions=["float32"], steps=2)
    assert [r["category"] for r in rows] == list(attention.CATEGORIES)
    assert sum(r["share"] for r in rows) == pytest.approx(1)
    gemm = next(r for r in rows if r["category"] == "GEMM")
    expected_source = "GPU kernels" if env.device().type == "cuda" else "CPU operators"
    assert gemm["source"] == expected_source and gemm["seconds"] > 0 and gemm["count"] > 0
    with pytest.raises(ValueError, match="^precision:"):
        attention.profile_training_step(1, 16, 2, 32, 2, 8, precision="bfloat16", device=torch.device("cpu"))
