"""The answer the kernels are checked against: attention in float64 on the host, its gradients, and the check.

:func:`reference_attention` is the textbook formula, every score stored (chapter 06's
:func:`gpulab.ch06_recurrent_and_attention.attention.scaled_dot_product`, plus the causal mask, the scale and the
log-sum-exp the kernels save); autograd differentiates it in float64 for the gradients. :func:`check_attention`
is what runs before anything is timed: fresh seeded inputs, the kernels, and
:func:`gpulab.core.correctness.check_close` on the output, the log-sum-exp and the three gradients, with the
tolerance of the inputs' dtype (:data:`gpulab.core.precision.MATMUL_TOLERANCE`: attention is two matmuls and a
softmax, and the kernels round to 16 bits where a matmul does: the output, and ``P`` before ``P V``).

The queries are multiplied by ``spread`` (2 by default) so that the scores range widely and the running maximum
changes often from one tile to the next: a softmax of nearly equal scores would hide a forgotten rescaling.
"""

from __future__ import annotations

import math

import torch

from gpulab.core import kernel_mode
from gpulab.core.correctness import check_close
from gpulab.core.precision import MATMUL_TOLERANCE
from gpulab.core.validation import dtype_name

LSE_TOLERANCE = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}  # the log-sum-exp: a float32 sum of exps


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q k^T * scale [+ causal mask]) v`` and the log-sum-exp of every row of scores, in float64 on the host.

    Differentiable (autograd) when the inputs require gradients. ``scale`` defaults to ``1 / sqrt(head_dim)``.
    """
    q, k, v = (t.to("cpu", torch.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if causal:
        n = q.shape[-2]
        above = torch.ones(n, n, dtype=torch.bool).triu(1)  # key j > query i: not seen
        scores = scores.masked_fill(above, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def reference_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool = False,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of :func:`reference_attention` for the output gradient ``do``, by autograd in float64."""
    q64, k64, v64 = (t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v))
    out, _ = reference_attention(q64, k64, v64, causal, scale)
    return torch.autograd.grad(out, (q64, k64, v64), do.detach().to("cpu", torch.float64))


def random_inputs(shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device, seed: int = 0,
                  spread: float = 2.0) -> tuple[torch.Tensor, ...]:
    """Fresh standard-normal ``q, k, v`` and an output gradient ``do`` (q times ``spread``), the same for a seed.

    Drawn in float32 on the host from a seeded generator (a GPU and the CPU draw the same numbers), rounded to
    ``dtype``, moved to ``device``.
    """
    generator = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(shape, generator=generator) for _ in range(4))
    return tuple(t.to(dtype).to(device) for t in (q * spread, k, v, do))


def check_attention(attention_fn, batch: int, heads: int, seq_len: int, head_dim: int, dtype: torch.dtype,
                    causal: bool = False, device: torch.device | None = None, seed: int = 0,
                    gradients: bool = True, what: str = "attention") -> dict:
    """Check ``attention_fn(q, k, v, causal)`` (differentiable, e.g. :func:`.backward.attention` or SDPA) on fresh
    random inputs against float64; returns the relative errors by name (``out``, and ``dq``, ``dk``, ``dv`` when
    ``gradients``). Raises AssertionError naming ``what`` when an error is NaN or above the dtype's tolerance.
    """
    device = device or kernel_mode.device()
    label = dtype_name(dtype)
    tolerance = MATMUL_TOLERANCE[label]
    q, k, v, do = random_inputs((batch, heads, seq_len, head_dim), dtype, device, seed)
    where = f"{what} at {(batch, heads, seq_len, head_dim)} {label}{' causal' if causal else ''}"
    inputs = [t.detach().requires_grad_(gradients) for t in (q, k, v)]
    out = attention_fn(*inputs, causal)
    expected, _ = reference_attention(q, k, v, causal)
    errors = {"out": check_close(out, expected, tolerance, f"{where}: output")}
    if gradients:
        grads = torch.autograd.grad(out, inputs, do)
        for name, got, want in zip(("dq", "dk", "dv"), grads, reference_gradients(q, k, v, do, causal), strict=True):
            errors[name] = check_close(got, want, tolerance, f"{where}: {name}")
    return errors


def check_forward(attention_forward_fn, batch: int, heads: int, seq_len: int, head_dim: int, dtype: torch.dtype,
                  causal: bool = False, device: torch.device | None = None, seed: int = 0, **config) -> dict:
    """Check a forward launcher returning ``(out, lse)`` (:func:`.forward.attention_forward`): both against float64.

    Every element counts (a NaN, or garbage where a row was never written, fails); the log-sum-exp is checked
    elementwise against its own tolerance (:data:`LSE_TOLERANCE`, relative to its largest value).
    """
    device = device or kernel_mode.device()
    label = dtype_name(dtype)
    q, k, v, _ = random_inputs((batch, heads, seq_len, head_dim), dtype, device, seed)
    out, lse = attention_forward_fn(q, k, v, causal, **config)
    expected, expected_lse = reference_attention(q, k, v, causal)
    where = f"forward at {(batch, heads, seq_len, head_dim)} {label}{' causal' if causal else ''}"
    errors = {"out": check_close(out, expected, MATMUL_TOLERANCE[label], f"{where}: output")}
    lse_error = (lse.detach().cpu().double() - expected_lse).abs().max().item()
    if not lse_error <= LSE_TOLERANCE[label] * expected_lse.abs().max().item():
        raise AssertionError(f"{where}: log-sum-exp off by {lse_error:.3g}")
    errors["lse"] = lse_error
    return errors

