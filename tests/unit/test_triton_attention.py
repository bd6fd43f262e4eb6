"""FlashAttention in Triton (gpulab.kernels.triton_attention): the forward and backward kernels against float64
attention under Triton's interpreter on the CPU (compiled on a GPU), the launchers' errors, and the GPU
experiment's pure parts (the lab's graders are tested in test_lab13_flash_attention.py).

As for gpulab.kernels.triton_gemm, the package switches the interpreter on (TRITON_INTERPRET=1) when there is no
GPU, before its kernels are defined, so nothing needs setting here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from conftest import needs_gpu
from gpulab.ch06_recurrent_and_attention.attention import scaled_dot_product
from gpulab.core import kernel_mode
from gpulab.core.correctness import check_close
from gpulab.core.provenance import fingerprint_of
from gpulab.kernels.triton_attention import attention, attention_backward, attention_forward, measure
from gpulab.kernels.triton_attention.reference import (
    check_attention,
    check_forward,
    random_inputs,
    reference_attention,
)

DEVICE = kernel_mode.device()
# Several tiles at small shapes. 64 tokens: whole tiles, BLOCK_M != BLOCK_N. 96 tokens: a partial last tile.
SMALL = {
    64: ({"BLOCK_M": 32, "BLOCK_N": 16}, {"BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16}),
    96: ({"BLOCK_M": 64, "BLOCK_N": 32}, {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32}),
}
DTYPE = torch.float16 if kernel_mode.on_gpu() else torch.float32
CLOSE = 1e-5 if torch.float32 == DTYPE else 1e-2  # float32 under the interpreter: only the sums' rounding


def small_attention(seq_len: int):
    forward_config, backward_config = SMALL[seq_len]
    return lambda q, k, v, causal: attention(q, k, v, causal, forward_config=forward_config,
                                             backward_config=backward_config)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len, head_dim", [(64, 16), (96, 32)])
def test_forward_matches_float64(seq_len, head_dim, causal):
    errors = check_forward(attention_forward, 1, 2, seq_len, head_dim, DTYPE, causal, DEVICE, **SMALL[seq_len][0])
    assert errors["out"] < CLOSE and errors["lse"] < 10 * CLOSE


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len, head_dim", [(64, 16), (96, 32)])
def test_backward_matches_float64(seq_len, head_dim, causal):
    errors = check_attention(small_attention(seq_len), 1, 2, seq_len, head_dim, DTYPE, causal, DEVICE, seed=1)
    assert set(errors) == {"out", "dq", "dk", "dv"} and max(errors.values()) < CLOSE


def test_float16_and_the_default_tiles_on_a_sequence_shorter_than_one_tile():
    """float16 as on the GPU (P rounded to 16 bits before P V), with the real 128 x 64 tiles on 40 tokens."""
    errors = check_attention(attention, 2, 1, 40, 32, torch.float16, True, DEVICE, seed=2)
    assert 1e-5 < max(errors.values()) < 1e-2


def test_attention_backward_is_the_autograd_backward():
    q, k, v, do = random_inputs((1, 2, 48, 16), DTYPE, DEVICE, seed=3)
    forward_config, backward_config = SMALL[64]
    out, lse = attention_forward(q, k, v, True, **forward_config)
    grads = attention_backward(q, k, v, out, lse, do, True, **backward_config)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(attention(*inputs, True, forward_config=forward_config,
                                             backward_config=backward_config), inputs, do)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same kernels: no atomics, no run-to-run noise


def test_scale_and_the_reference():
    q, k, v, _ = random_inputs((1, 2, 32, 16), DTYPE, DEVICE)
    q64, k64, v64 = (t.cpu().double() for t in (q, k, v))
    expected, lse = reference_attention(q, k, v)
    torch.testing.assert_close(expected, scaled_dot_product(q64, k64, v64))  # chapter 06's attention
    torch.testing.assert_close(lse, torch.logsumexp(q64 @ k64.mT / 4, dim=-1))
    out, _ = attention_forward(q, k, v, scale=0.5, BLOCK_M=16, BLOCK_N=16)
    assert check_close(out, reference_attention(q, k, v, scale=0.5)[0], CLOSE, "scale 0.5") < CLOSE


def test_a_wrong_kernel_fails_the_check():
    def off(q, k, v, causal, **config):
        out, lse = attention_forward(q, k, v, causal, **config)
        return out * 1.01, lse

    with pytest.raises(AssertionError, match="forward at .* output: relative error"):
        check_forward(off, 1, 1, 32, 16, DTYPE, False, DEVICE, BLOCK_M=16, BLOCK_N=16)


def _qkv(shape=(1, 2, 32, 16), dtype=torch.float32):
    return [torch.randn(shape).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("make, error, match", [
    (lambda: (_qkv()[0][0], *_qkv()[1:]), ValueError, r"^q: 4-D"),
    (lambda: (*_qkv()[:2], torch.randn(1, 2, 16, 16)), ValueError, r"^v: the same shape as q"),
    (lambda: (*_qkv()[:2], torch.randn(1, 2, 32, 16, dtype=torch.float64)), TypeError, r"^v: the same dtype as q"),
    (lambda: _qkv(dtype=torch.float64), TypeError, r"^q: dtype"),
    (lambda: _qkv(dtype=torch.bfloat16), TypeError, r"^q: bfloat16 runs on the GPU only"),
    (lambda: _qkv((1, 2, 32, 48)), ValueError, r"^q: head_dim .* one of \(16, 32, 64, 128\), got 48"),
    (lambda: (np.zeros((1, 2, 32, 16)), *_qkv()[1:]), TypeError, r"^q: a torch.Tensor, got ndarray"),
])
def test_bad_inputs_raise_clear_errors(make, error, match):
    if kernel_mode.on_gpu():
        pytest.skip("the interpreter's rules (CPU tensors, no bfloat16)")
    with pytest.raises(error, match=match):
        attention_forward(*make())
    with pytest.raises(error, match=match):
        attention(*make())


def test_bad_settings_raise_clear_errors():
    q, k, v = (t.to(DEVICE) for t in _qkv(dtype=DTYPE))
    with pytest.raises(TypeError, match=r"^causal: True or False, got 1"):
        attention(q, k, v, 1)
    with pytest.raises(ValueError, match=r"^scale: a positive finite number"):
        attention_forward(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match=r"BLOCK_M must be a multiple of BLOCK_N, got 16 and 32"):
        attention_forward(q, k, v, BLOCK_M=16, BLOCK_N=32)
    with pytest.raises(ValueError, match=r"settings are .*; got unknown \['BLOCK_K'\]"):
        attention_forward(q, k, v, BLOCK_K=16)
    with pytest.raises(ValueError, match=r"BLOCK_N must be a power of two >= 16, got 24"):
        attention_forward(q, k, v, BLOCK_N=24)
    with pytest.raises(ValueError, match=r"BLOCK_N1 must be a multiple of BLOCK_M1, got 16 and 32"):
        attention(q, k, v, backward_config={"BLOCK_M1": 32, "BLOCK_N1": 16})
    out, lse = attention_forward(q, k, v, BLOCK_M=16, BLOCK_N=16)
    with pytest.raises(ValueError, match=r"^lse: the forward's float32 log-sum-exp of shape \(1, 2, 32\)"):
        attention_backward(q, k, v, out, lse[0], out)


# The GPU experiment: what can run without a GPU.

def test_flops_and_the_comparison_with_the_best_backend():
    assert measure.forward_flops(2, 4, 1024, 64, False) == 4 * 2 * 4 * 1024**2 * 64
    assert measure.forward_flops(2, 4, 1024, 64, True) == measure.forward_flops(2, 4, 1024, 64, False) / 2
    rows = [{"implementation": name, "seq_len": 4096, "head_dim": 128, "causal": False, "status": "ok",
             "forward_tflops": rate} for name, rate in (("triton", 450), ("sdpa-flash", 400), ("sdpa-cudnn", 500))]
    rows += [{"implementation": "sdpa-math", "seq_len": 4096, "head_dim": 128, "causal": False,
              "status": "out of memory"}, {"implementation": "sdpa-cudnn", "seq_len": None, "status": "not available"}]
    [point] = measure.versus_best_sdpa(rows)
    assert point["best_sdpa"] == "sdpa-cudnn" and point["ratio"] == pytest.approx(0.9) and point["meets_target"]


def test_the_experiment_needs_a_gpu_and_fingerprints_the_kernels():
    if not kernel_mode.on_gpu():
        with pytest.raises(ValueError, match="^attention_race: times kernels"):
            measure.attention_race()
    with pytest.raises(ValueError, match="^implementation: one of triton, sdpa-math"):
        measure.implementation("naive")
    parts = fingerprint_of(measure.attention_race).parts
    assert {"gpulab.kernels.triton_attention.forward.forward_kernel",
            "gpulab.kernels.triton_attention.backward.key_value_grads_kernel"} <= set(parts)


def test_the_kernels_compile_for_hopper_with_wgmma():
    """Compiled for sm_90 without a GPU (Triton's own ptxas), in a process whose kernels are defined for compiling:
    each kernel multiplies with HGMMA (warpgroup MMA) and fits in the H100's 227 KiB of shared memory per block."""
    script = textwrap.dedent("""
        from gpulab.kernels.triton_attention import measure
        from gpulab.kernels.triton_gemm.ladder import evidence
        for kernel, head_dim, causal in (("forward", 128, True), ("key_value_grads", 64, True)):
            e = evidence(measure.cross_compile(kernel, head_dim, causal))
            print(kernel, e["sass_HGMMA"], e["shared_bytes"])
    """)
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TRITON_INTERPRET": "0"},
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    for line in done.stdout.splitlines():
        kernel, hgmma, shared = line.split()
        assert int(hgmma) > 0 and 0 < int(shared) <= 227 * 1024, line


def test_the_race_checks_then_times_small_on_the_cpu():
    if kernel_mode.on_gpu():
        pytest.skip("float32 is the interpreter's")
    passed, refused = measure.checked_implementations(["triton", "sdpa-math", "sdpa-cudnn"], 16, True, "float32", 64)
    assert passed == ["triton", "sdpa-math"]  # on a CPU, SDPA has no cuDNN backend
    [row] = refused
    assert row["implementation"] == "sdpa-cudnn" and row["status"].startswith("not available: ")
    row = measure.measure_point("sdpa-math", 64, 1, 2, 16, True, "float32")
    assert row["backward_status"] == "ok"
    work = measure.forward_flops(1, 2, 64, 16, True)
    assert row["forward_tflops"] == pytest.approx(work / row["forward_seconds"] / 1e12)
    assert row["forward_backward_tflops"] == pytest.approx(3.5 * work / row["forward_backward_seconds"] / 1e12)


@needs_gpu(capability=(8, 0))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bfloat16_with_the_real_tiles_on_the_gpu(head_dim, causal):
    """The compiled kernels with their own tile sizes, on a length no tile divides, and each SDPA backend checked."""
    check_attention(attention, 2, 3, 1000, head_dim, torch.bfloat16, causal, DEVICE)
    passed, refused = measure.checked_implementations(measure.IMPLEMENTATIONS, head_dim, causal, "bfloat16", 256)
    assert "triton" in passed and len(passed) + len(refused) == len(measure.IMPLEMENTATIONS)


def test_kernels_run_when_triton_was_imported_before_the_mode_was_chosen():
    """torch.utils.flop_counter imports triton; the package must still interpret Triton's own library."""
    if kernel_mode.on_gpu():
        pytest.skip("the interpreter's problem")
    script = textwrap.dedent("""
        import os, sys
        os.environ.pop("TRITON_INTERPRET", None)
        import torch.utils.flop_counter
        assert "triton" in sys.modules
        from gpulab.kernels.triton_attention import attention_forward
        from gpulab.kernels.triton_attention.reference import check_forward
        import torch
        print(check_forward(attention_forward, 1, 1, 32, 16, torch.float32, True, BLOCK_M=16, BLOCK_N=16)["out"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout) < 1e-5
