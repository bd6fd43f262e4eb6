"""FlashAttention's backward pass in Triton (FlashAttention-2's order), and the autograd function built on both passes.

With ``S = scale Q K^T``, ``P = softmax(S)`` row by row and ``O = P V``, the chain rule gives, for an incoming
gradient ``dO``::

    dV = P^T dO            dP = dO V^T            dS = P * (dP - D)     (elementwise; D broadcast along rows)
    dQ = scale dS K        dK = scale dS^T Q      where D[r] = sum_j P[r, j] dP[r, j] = sum_c dO[r, c] O[r, c]

The middle line is the softmax's backward: row ``r`` of ``P`` depends on the whole row of ``S``, and the sum
over the row that this brings in is the single number ``D[r]``. Its second form, ``rowsum(dO * O)``, needs no
``P`` at all -- that is what makes a blocked backward possible.

Like the forward pass, the backward never stores ``P`` or ``dS``. It *recomputes* each tile of ``P`` from ``Q``,
``K`` and the log-sum-exp ``L`` the forward saved: ``P = exp(S - L)`` needs no running maximum, because ``L``
is already the final one. Recomputing a tile costs one ``tl.dot``; storing ``seq x seq`` numbers would cost far
more memory traffic. Three launches:

1. :func:`row_dot_kernel` -- ``D = rowsum(dO * O)``, one float per row (the preprocessing step).
2. :func:`key_value_grads_kernel` -- one program per block of *keys*: it holds ``K_j``, ``V_j`` and their
   gradients on chip and walks over the blocks of queries, adding ``P_ij^T dO_i`` to ``dV_j`` and
   ``dS_ij^T Q_i`` to ``dK_j``. It computes the tiles transposed (keys along rows), which is what both sums need.
3. :func:`query_grads_kernel` -- one program per block of *queries*: it holds ``Q_i``, ``dO_i`` and ``dQ_i`` and
   walks over the blocks of keys, adding ``dS_ij K_j``; the same loop shape as the forward pass.

Each program owns the rows it writes, so no two programs add into the same memory: no atomics, and the result
does not depend on the order in which programs run (the original FlashAttention-2 adds ``dQ`` with atomics
from the key-block programs instead, saving step 3's recomputation at the price of run-to-run differences).
The causal split is the forward's: whole tiles without a mask, the diagonal and the last partial tile with one.

:func:`attention` ties the two passes into one differentiable function (:class:`FlashAttention`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpulab.kernels.triton_attention.forward import (
    check_causal,
    check_inputs,
    check_scale,
    forward,
    forward_settings,
)
from gpulab.kernels.triton_gemm.common import settings

LOG2E = tl.constexpr(math.log2(math.e))
ROW_BLOCK = 64  # rows per program of the preprocessing step

# BLOCK_N1 keys held per dK/dV program, BLOCK_M1 queries per step; BLOCK_M2 queries held per dQ program, BLOCK_N2
# keys per step. The held block is the larger: it is loaded once, the stepped one every step. For an H100 or
# H200; a later session tunes them (see measure.py).
CONFIGS = {
    16: {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, "num_warps": 4, "num_stages": 3},
    32: {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, "num_warps": 4, "num_stages": 3},
    64: {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, "num_warps": 4, "num_stages": 3},
    128: {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "num_warps": 4, "num_stages": 3},
}


@triton.jit
def row_dot_kernel(Out, DO, Delta, seq_len, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """``Delta[r] = sum_c dO[r, c] O[r, c]`` in float32 for ``BLOCK_M`` rows of one head."""
    start_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    rows = head * seq_len * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    o = tl.load(Out + rows, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + rows, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(Delta + head * seq_len + offs_m, tl.sum(o * do, 1), mask=row_ok)


@triton.jit
def key_block_step(dk, dv, k, v, Q, DO, LSE, Delta, offs_n, lo, hi, seq_len, qk_scale,
                   BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Add the contributions of the query tiles starting in ``[lo, hi)`` to one key block's ``dk`` and ``dv``.

    Tiles are transposed (BLOCK_N keys x BLOCK_M queries): ``p_t`` is ``P^T``, so ``dV += P^T dO`` and
    ``dK += dS^T Q`` are plain tile products. ``dk`` is still missing its factor ``scale``.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < seq_len
        rows = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            q = tl.load(Q + rows, mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + rows, mask=row_ok[:, None], other=0.0)
            lse = tl.load(LSE + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(Delta + offs_m, mask=row_ok, other=0.0)
        else:
            q = tl.load(Q + rows)
            do = tl.load(DO + rows)
            lse = tl.load(LSE + offs_m)
            delta = tl.load(Delta + offs_m)
        s_t = tl.dot(k, tl.trans(q)) * qk_scale  # S^T in base-2 units
        p_t = tl.exp2(s_t - lse[None, :] * LOG2E)  # P^T = exp(S - L): the final softmax, no running maximum
        if MASKED:
            keep = row_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))  # (dO V^T)^T
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def key_value_grads_kernel(Q, K, V, DO, LSE, Delta, DK, DV, seq_len, qk_scale, scale, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: ``dK`` and ``dV`` of ``BLOCK_N`` keys of one head, from every query that sees them."""
    start_n = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    Q += base
    K += base
    V += base
    DO += base
    DK += base
    DV += base
    LSE += head * seq_len
    Delta += head * seq_len
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n < seq_len
    keys = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(K + keys, mask=key_ok[:, None], other=0.0)
    v = tl.load(V + keys, mask=key_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    whole = seq_len // BLOCK_M * BLOCK_M  # query tiles wholly inside the sequence end here
    if CAUSAL:  # queries above the diagonal block see none of these keys: they are skipped
        diagonal = start_n * BLOCK_N
        below = diagonal + BLOCK_N  # queries from here on see every key of the block
        dk, dv = key_block_step(dk, dv, k, v, Q, DO, LSE, Delta, offs_n, diagonal, tl.minimum(below, seq_len),
                                seq_len, qk_scale, BLOCK_M, HEAD_DIM, True, True)
        dk, dv = key_block_step(dk, dv, k, v, Q, DO, LSE, Delta, offs_n, below, whole, seq_len, qk_scale,
                                BLOCK_M, HEAD_DIM, False, True)
        dk, dv = key_block_step(dk, dv, k, v, Q, DO, LSE, Delta, offs_n, tl.maximum(below, whole), seq_len,
                                seq_len, qk_scale, BLOCK_M, HEAD_DIM, True, True)
    else:
        dk, dv = key_block_step(dk, dv, k, v, Q, DO, LSE, Delta, offs_n, 0, whole, seq_len, qk_scale,
                                BLOCK_M, HEAD_DIM, False, False)
        dk, dv = key_block_step(dk, dv, k, v, Q, DO, LSE, Delta, offs_n, whole, seq_len, seq_len, qk_scale,
                                BLOCK_M, HEAD_DIM, True, False)
    tl.store(DK + keys, (dk * scale).to(DK.dtype.element_ty), mask=key_ok[:, None])
    tl.store(DV + keys, dv.to(DV.dtype.element_ty), mask=key_ok[:, None])


@triton.jit
def query_block_step(dq, q, do, lse, delta, K, V, offs_m, lo, hi, seq_len, qk_scale,
                     BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Add ``dS_ij K_j`` of the key tiles starting in ``[lo, hi)`` to one query block's ``dq`` (without ``scale``)."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < seq_len
        keys = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            k = tl.load(K + keys, mask=key_ok[:, None], other=0.0)
            v = tl.load(V + keys, mask=key_ok[:, None], other=0.0)
        else:
            k = tl.load(K + keys)
            v = tl.load(V + keys)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None] * LOG2E)
        if MASKED:
            keep = key_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def query_grads_kernel(Q, K, V, DO, LSE, Delta, DQ, seq_len, qk_scale, scale, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: ``dQ`` of ``BLOCK_M`` queries of one head, from every key they see."""
    start_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    Q += base
    K += base
    V += base
    DO += base
    DQ += base
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    rows = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + rows, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + rows, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + head * seq_len + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(Delta + head * seq_len + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        diagonal = start_m * BLOCK_M
        dq = query_block_step(dq, q, do, lse, delta, K, V, offs_m, 0, diagonal, seq_len, qk_scale,
                              BLOCK_N, HEAD_DIM, False, True)
        dq = query_block_step(dq, q, do, lse, delta, K, V, offs_m, diagonal, tl.minimum(diagonal + BLOCK_M, seq_len),
                              seq_len, qk_scale, BLOCK_N, HEAD_DIM, True, True)
    else:
        whole = seq_len // BLOCK_N * BLOCK_N
        dq = query_block_step(dq, q, do, lse, delta, K, V, offs_m, 0, whole, seq_len, qk_scale,
                              BLOCK_N, HEAD_DIM, False, False)
        dq = query_block_step(dq, q, do, lse, delta, K, V, offs_m, whole, seq_len, seq_len, qk_scale,
                              BLOCK_N, HEAD_DIM, True, False)
    tl.store(DQ + rows, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


def backward_settings(head_dim: int, config: dict) -> dict:
    """:data:`CONFIGS` for ``head_dim`` updated with ``config``. The held block must be a multiple of the stepped
    one (BLOCK_N1 of BLOCK_M1, BLOCK_M2 of BLOCK_N2), so that the diagonal block starts on a tile boundary."""
    merged = settings(CONFIGS[head_dim], config, "attention_backward")
    for held, step in (("BLOCK_N1", "BLOCK_M1"), ("BLOCK_M2", "BLOCK_N2")):
        if merged[held] % merged[step]:
            raise ValueError(f"attention_backward: {held} must be a multiple of {step}, got {merged[held]} and "
                             f"{merged[step]}")
    return merged


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
             do: torch.Tensor, causal: bool, scale: float, config: dict) -> tuple[torch.Tensor, ...]:
    """Launch the three kernels on contiguous checked tensors; returns ``(dq, dk, dv)``."""
    batch, heads, seq_len, head_dim = q.shape
    do = do.contiguous()
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    row_dot_kernel[(triton.cdiv(seq_len, ROW_BLOCK), batch * heads)](o, do, delta, seq_len, BLOCK_M=ROW_BLOCK,
                                                                     HEAD_DIM=head_dim)
    launch = {"num_warps": config["num_warps"], "num_stages": config["num_stages"], "HEAD_DIM": head_dim,
              "CAUSAL": bool(causal)}
    key_value_grads_kernel[(triton.cdiv(seq_len, config["BLOCK_N1"]), batch * heads)](
        q, k, v, do, lse, delta, dk, dv, seq_len, scale * math.log2(math.e), scale,
        BLOCK_M=config["BLOCK_M1"], BLOCK_N=config["BLOCK_N1"], **launch)
    query_grads_kernel[(triton.cdiv(seq_len, config["BLOCK_M2"]), batch * heads)](
        q, k, v, do, lse, delta, dq, seq_len, scale * math.log2(math.e), scale,
        BLOCK_M=config["BLOCK_M2"], BLOCK_N=config["BLOCK_N2"], **launch)
    return dq, dk, dv


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                       do: torch.Tensor, causal: bool = False, scale: float | None = None,
                       **config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of attention for the gradient ``do`` of its output ``o``, from the forward's ``lse``.

    ``o`` and ``lse`` are what :func:`gpulab.kernels.triton_attention.forward.attention_forward` returned for the
    same q, k, v, causal and scale; ``config`` overrides :data:`CONFIGS`.
    """
    batch, heads, seq_len, head_dim = check_inputs(q, k, v)
    check_inputs(q, o, do)  # the output and its gradient: q's shape, dtype and device
    if not isinstance(lse, torch.Tensor) or lse.shape != (batch, heads, seq_len) or lse.dtype != torch.float32:
        raise ValueError(f"lse: the forward's float32 log-sum-exp of shape {(batch, heads, seq_len)}, got "
                         f"{getattr(lse, 'dtype', type(lse).__name__)} {tuple(getattr(lse, 'shape', ()))}")
    q, k, v, o, lse = (t.contiguous() for t in (q, k, v, o, lse))
    return backward(q, k, v, o, lse, do, check_causal(causal), check_scale(scale, head_dim),
                    backward_settings(head_dim, config))


class FlashAttention(torch.autograd.Function):
    """Attention whose forward and backward are the Triton kernels: autograd calls :func:`backward` with the
    tensors the forward saved (q, k, v, the output and the log-sum-exp; never the ``seq x seq`` probabilities)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, forward_config, backward_config):
        q, k, v = (t.contiguous() for t in (q, k, v))
        o, lse = forward(q, k, v, causal, scale, forward_config)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.backward_config = causal, scale, backward_config
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.backward_config)
        return dq, dk, dv, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None,
              forward_config: dict | None = None, backward_config: dict | None = None) -> torch.Tensor:
    """Differentiable ``softmax(q k^T * scale [+ causal mask]) v`` by the Triton kernels, like
    ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``.

    q, k, v: ``(batch, heads, seq_len, head_dim)`` (:func:`.forward.check_inputs`). The configs override the
    tile sizes of :data:`.forward.CONFIGS` and :data:`CONFIGS`; both are checked here, before anything runs.
    """
    _, _, _, head_dim = check_inputs(q, k, v)
    causal, scale = check_causal(causal), check_scale(scale, head_dim)
    forward_config = forward_settings(head_dim, forward_config or {})
    backward_config = backward_settings(head_dim, backward_config or {})
    return FlashAttention.apply(q, k, v, causal, scale, forward_config, backward_config)
