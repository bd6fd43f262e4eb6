"""The online softmax, blocked attention against naive attention, and the attention sweep, small on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpulab.ch13_memory_bound_layers_and_fusion import blocked_attention
from gpulab.core.sweep import OUT_OF_MEMORY
from gpulab.core.validation import DoesNotFit


@pytest.mark.parametrize("block", [1, 3, 16, 100, 1000])
def test_online_softmax_equals_the_three_pass_softmax(block):
    x = np.random.default_rng(1).normal(scale=20, size=(7, 100))
    out, counts = blocked_attention.online_softmax(x, block)
    np.testing.assert_allclose(out, blocked_attention.softmax(x), rtol=1e-13, atol=0)
    assert counts["passes"] == 2 and counts["blocks"] == -(-100 // block)
    assert np.allclose(out.sum(axis=1), 1)


def test_online_softmax_rescales_when_the_maximum_grows_and_never_overflows():
    rising = np.arange(10.0)[None, :] * 100  # every block raises the maximum; exp(900) would overflow float64
    _, counts = blocked_attention.online_softmax(rising, 1)
    assert counts["rescalings"] == 9
    huge = np.array([[1000.0, 999.0, -1000.0]])
    with np.errstate(over="ignore", invalid="ignore"):
        unsafe = np.exp(huge) / np.exp(huge).sum()
    assert np.isnan(unsafe).any()  # the softmax without the maximum breaks...
    out, _ = blocked_attention.online_softmax(huge, 2)
    np.testing.assert_allclose(out, blocked_attention.softmax(huge), rtol=1e-15)  # ...the running maximum does not
    with pytest.raises(ValueError, match="^block:"):
        blocked_attention.online_softmax(rising, 0)


@pytest.mark.parametrize(("n", "m", "block_q", "block_k"), [(64, 64, 16, 16), (100, 70, 7, 32), (33, 200, 64, 1)])
def test_blocked_attention_matches_naive_and_holds_one_block(n, m, block_q, block_k):
    rng = np.random.default_rng(n + m)
    q, k, v = 4 * rng.standard_normal((n, 8)), rng.standard_normal((m, 8)), rng.standard_normal((m, 5))
    expected, naive = blocked_attention.naive_attention(q, k, v)
    out, counts = blocked_attention.blocked_attention(q, k, v, block_q, block_k)
    assert np.linalg.norm(out - expected) / np.linalg.norm(expected) < blocked_attention.TARGET_ERROR
    assert naive["score_elements"] == n * m
    assert counts["score_elements"] == min(block_q, n) * min(block_k, m) and counts["rescalings"] > 0
    reference = torch.softmax(torch.tensor(q) @ torch.tensor(k).T / np.sqrt(8), dim=-1) @ torch.tensor(v)
    np.testing.assert_allclose(expected, reference.numpy(), rtol=1e-10, atol=1e-12)


def test_blocked_attention_rejects_bad_shapes():
    with pytest.raises(ValueError, match="^q, k, v:"):
        blocked_attention.blocked_attention(np.zeros((4, 3)), np.zeros((4, 2)), np.zeros((4, 2)), 2, 2)
    with pytest.raises(ValueError, match="^block_k:"):
        blocked_attention.blocked_attention(np.zeros((4, 2)), np.zeros((4, 2)), np.zeros((4, 2)), 2, 0)


def test_memory_counts_and_the_comparison_rows():
    memory = blocked_attention.attention_memory(1024, 64, 128, 128)
    assert memory == {"inputs_outputs": 4 * 1024 * 64, "naive": 2 * 1024**2, "blocked": 128 * 128 + 128 * 64 + 256}
    rows = blocked_attention.blocked_vs_naive(96, 16, [8, 32, 96])
    assert [r["block"] for r in rows] == [8, 32, 96]
    for row in rows:
        assert row["relative_error"] < blocked_attention.TARGET_ERROR
        assert row["working_elements"] == row["formula_blocked"] and row["scores_held"] == row["block"] ** 2
        assert row["naive_scores_held"] == 96 * 96


def test_attention_sweep_on_this_device():
    rows = blocked_attention.attention_sweep([32, 64], batch=1, heads=2, head_dim=16, dtype="float32", check_len=32)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["method"] for r in ok} >= {"naive", "sdpa", "sdpa-math"}
    assert all(r["status"] == "ok" or r["status"].startswith("not available") for r in rows)
    by = {(r["method"], r["seq_len"]): r for r in ok}
    assert by["naive", 64]["backend"].startswith("none") and by["sdpa-math", 64]["backend"] == "math"
    assert by["naive", 64]["score_bytes"] == 2 * 64 * 64 * 4 and by["naive", 32]["tflops"] > 0
    with pytest.raises(ValueError, match="^methods:"):
        blocked_attention.attention_sweep([32], 1, 1, 8, "float32", methods=["cudnn"])


def test_a_size_that_does_not_fit_becomes_an_out_of_memory_row(monkeypatch):
    real = blocked_attention.fits_in_memory

    def small_device(name, nbytes, device, headroom=0.9):
        if nbytes > 2**20:
            raise DoesNotFit(f"{name}: needs {nbytes} bytes")
        return real(name, nbytes, device, headroom)

    monkeypatch.setattr(blocked_attention, "fits_in_memory", small_device)
    rows = blocked_attention.attention_sweep([64, 512], batch=1, heads=1, head_dim=8, dtype="float32",
                                             methods=["naive", "sdpa"], check_len=16)
    status = {(r["method"], r["seq_len"]): r["status"] for r in rows}
    assert status["naive", 512] == OUT_OF_MEMORY and status["naive", 64] == "ok"
    assert status["sdpa", 512] == "ok"  # the fused attention stores no scores
