"""FlashAttention's forward pass in Triton: chapter 13's blocked attention, one program per block of queries.

Chapter 13 wrote attention in blocks in NumPy (:func:`gpulab.ch13_memory_bound_layers_and_fusion.blocked_attention.
blocked_attention`): for each block of queries ``Q_i``, walk over the blocks of keys and values, keep a running row
maximum ``m``, a running sum ``l`` and an unnormalised output ``acc``, and divide once at the end::

    S = Q_i K_j^T * scale                        (BLOCK_M x BLOCK_N scores: the only scores that exist)
    m_new = max(m, rowmax(S));  alpha = exp(m - m_new);  P = exp(S - m_new)
    l = alpha l + rowsum(P);    acc = alpha acc + P V_j;  m = m_new
    O_i = acc / l

This module is that loop as a GPU kernel. What changes is *where* it runs, not *what* it computes:

- **One program per (block of queries, head).** The grid is ``(ceil(seq / BLOCK_M), batch * heads)``; the
  NumPy loop ``for i in range(0, n, block_q)`` becomes ``tl.program_id(0)``: thousands of programs, as many at a
  time as the SMs hold. Inside a program, every line above is a whole-tile operation: ``tl.dot`` multiplies tiles on the
  tensor cores, ``tl.max(s, 1)`` and ``tl.sum(p, 1)`` reduce rows, ``tl.where`` masks.
- **Tiles stay on chip.** ``acc``, ``m`` and ``l`` live in registers, and ``q`` on chip (compiled for
  Hopper, in shared memory, where wgmma reads it), for the whole program; a ``K_j`` and
  ``V_j`` tile is loaded from global memory (HBM) once per step and the score tile never leaves the chip. The
  only writes to HBM are the output and one number per row (below). That is why it is fast: the ``seq x seq``
  score matrix, which the naive attention writes and reads six times, is never stored.
- **exp2 instead of exp.** The GPU's special-function unit computes ``2^x``; ``e^x = 2^(x log2(e))``. So the
  kernel folds ``log2(e)`` into the scale once (``qk_scale = scale * log2(e)``), keeps ``m`` in base-2 units and
  calls ``tl.exp2``: the same numbers with one multiply fewer per score.
- **The log-sum-exp is saved for the backward pass.** Row ``r``'s softmax is ``P[r] = exp(S[r] - L[r])`` with
  ``L[r] = log(sum_j exp(S[r, j]))``, which is ``m + log(l)`` at the end of the loop. Storing ``L`` (``seq``
  floats per head, nothing next to the ``seq x seq`` scores) lets the backward recompute any tile of ``P`` from
  ``Q`` and ``K`` without a second pass over the row (:mod:`.backward`).
- **Causal attention skips work, and masks only where it must.** With ``causal=True`` query ``r`` sees keys
  ``0..r``. The block of queries ``[m0, m0 + BLOCK_M)`` sees every key left of ``m0`` completely (no mask), the
  keys of its own diagonal block partly (mask ``key <= query``), and nothing to the right: those tiles are never
  loaded, so causal attention does about half the work (a share ``(1 + BLOCK_M / seq_len) / 2`` of the
  tiles). Non-causal attention masks only the last, partial block of keys when the sequence is not a multiple
  of ``BLOCK_N``. ``MASKED`` is a ``tl.constexpr``: the compiler
  builds the masked and the unmasked loop as two separate loops, and the common one carries no mask at all.

No row is ever fully masked in the first tile it sees (key 0 is visible to every query, and it is in the first
tile), so ``m`` becomes finite at once and ``exp2(m - m_new)`` never computes ``-inf - (-inf)``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpulab.kernels.triton_gemm.common import DTYPES, INTERPRETER_DTYPES, settings
from gpulab.kernels.triton_gemm.interpreter import interpreting

LOG2E = math.log2(math.e)  # e^x = 2^(x * LOG2E)
LN2 = tl.constexpr(math.log(2.0))  # a log2 back to a natural log (a global a kernel reads must be a constexpr)
HEAD_DIMS = (16, 32, 64, 128)  # tl.arange needs a power of two, tl.dot at least 16

# Tile sizes and launch settings per head size, for an H100 or H200; a later session tunes them (see measure.py).
CONFIGS = {
    16: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    32: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    64: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    128: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
}


@triton.jit
def attend_to_tiles(acc, l_i, m_i, q, K, V, offs_m, lo, hi, seq_len, qk_scale,
                    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """The online-softmax loop over the key/value tiles that start in ``[lo, hi)``: chapter 13's inner loop.

    ``acc`` (BLOCK_M x HEAD_DIM), ``l_i`` and ``m_i`` (BLOCK_M) are the running state, returned updated. ``MASKED``
    adds the masks: keys past ``seq_len`` (a partial last tile), and with ``CAUSAL`` keys right of the query.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):  # a run-time bound (the interpreter needs the repair of triton_gemm)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < seq_len
        tile = offs_n[:, None] * HEAD_DIM + offs_d[None, :]  # BLOCK_N x HEAD_DIM offsets of K_j and V_j
        if MASKED:
            k = tl.load(K + tile, mask=key_ok[:, None], other=0.0)
            v = tl.load(V + tile, mask=key_ok[:, None], other=0.0)
        else:
            k = tl.load(K + tile)
            v = tl.load(V + tile)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # the score tile, in base-2 units
        if MASKED:
            keep = key_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))  # exp2(-inf) = 0: a masked key gets no weight
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)  # how much the old maximum overstated the new one
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]  # rescale what was summed under the old maximum ...
        acc = tl.dot(p.to(v.dtype), v, acc)  # ... then add P V_j (16-bit inputs, float32 sums)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def forward_kernel(Q, K, V, Out, LSE, seq_len, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: ``BLOCK_M`` queries of one (batch, head), all their keys, their output and log-sum-exp rows.

    Q, K, V and Out are contiguous ``(batch, heads, seq_len, HEAD_DIM)``; LSE is float32 ``(batch, heads, seq_len)``.
    """
    start_m = tl.program_id(0)
    head = tl.program_id(1)  # batch index * heads + head index: one (seq_len x HEAD_DIM) matrix per head
    base = head.to(tl.int64) * seq_len * HEAD_DIM  # 64-bit: batch * heads * seq * dim can pass 2^31
    Q += base
    K += base
    V += base
    Out += base
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    rows = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + rows, mask=row_ok[:, None], other=0.0)  # loaded once, kept on chip
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        diagonal = start_m * BLOCK_M  # keys left of it: seen by every row of the block, no mask needed
        acc, l_i, m_i = attend_to_tiles(acc, l_i, m_i, q, K, V, offs_m, 0, diagonal, seq_len, qk_scale,
                                        BLOCK_N, HEAD_DIM, False, True)
        acc, l_i, m_i = attend_to_tiles(acc, l_i, m_i, q, K, V, offs_m, diagonal,
                                        tl.minimum(diagonal + BLOCK_M, seq_len), seq_len, qk_scale,
                                        BLOCK_N, HEAD_DIM, True, True)
    else:
        whole = seq_len // BLOCK_N * BLOCK_N  # the tiles that lie wholly inside the sequence
        acc, l_i, m_i = attend_to_tiles(acc, l_i, m_i, q, K, V, offs_m, 0, whole, seq_len, qk_scale,
                                        BLOCK_N, HEAD_DIM, False, False)
        acc, l_i, m_i = attend_to_tiles(acc, l_i, m_i, q, K, V, offs_m, whole, seq_len, seq_len, qk_scale,
                                        BLOCK_N, HEAD_DIM, True, False)
    out = acc / l_i[:, None]
    tl.store(Out + rows, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_i + tl.log2(l_i)) * LN2  # log(sum exp(S)) in natural units: 2^m l = e^(ln2 (m + log2 l))
    tl.store(LSE + head.to(tl.int64) * seq_len + offs_m, lse, mask=row_ok)


def check_inputs(q: object, k: object, v: object) -> tuple[int, int, int, int]:
    """``(batch, heads, seq_len, head_dim)`` of attention's inputs, or a TypeError / ValueError naming what is wrong.

    q, k and v must be torch tensors of one shape ``(batch, heads, seq_len, head_dim)``, one dtype and one device;
    ``head_dim`` one of :data:`HEAD_DIMS`; the dtype float16 or bfloat16 on the GPU, float16 or float32 under the
    interpreter (which has no bfloat16 arithmetic).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q: 4-D (batch, heads, seq_len, head_dim), got {q.dim()}-D shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.shape != q.shape:
            raise ValueError(f"{name}: the same shape as q {tuple(q.shape)}, got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: the same dtype as q ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on the same device as q ({q.device}), got {t.device}")
    interpreted = interpreting()
    if interpreted and q.dtype == torch.bfloat16:
        raise TypeError("q: bfloat16 runs on the GPU only: Triton 3.6's interpreter keeps bfloat16 as raw 16-bit "
                        "patterns and tl.dot multiplies those; use float16 or float32 under the interpreter")
    allowed = INTERPRETER_DTYPES if interpreted else DTYPES
    if q.dtype not in allowed:
        raise TypeError(f"q: dtype {' or '.join(map(str, allowed))}, got {q.dtype}")
    if not interpreted and q.device.type != "cuda":
        raise ValueError(f"q: compiled Triton kernels run on a CUDA GPU, got tensors on {q.device}; move them to the "
                         "GPU, or run without a GPU (Triton's interpreter, see gpulab.kernels.triton_gemm.interpreter)")
    batch, heads, seq_len, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"q: head_dim (the last size) must be one of {HEAD_DIMS}, got {head_dim}")
    if min(batch, heads, seq_len) < 1:
        raise ValueError(f"q: every size at least 1, got shape {tuple(q.shape)}")
    return batch, heads, seq_len, head_dim


def check_causal(causal: object) -> bool:
    """``causal`` itself if it is a bool (a 0 or 1 would pass silently as the wrong thing otherwise)."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal: True or False, got {causal!r}")
    return causal


def check_scale(scale: object, head_dim: int) -> float:
    """The softmax scale: ``1 / sqrt(head_dim)`` when None (as SDPA), else a positive finite float."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale: a positive finite number (or None for 1/sqrt(head_dim)), got {scale!r}")
    return float(scale)


def forward_settings(head_dim: int, config: dict) -> dict:
    """:data:`CONFIGS` for ``head_dim`` updated with ``config``; BLOCK_M must be a multiple of BLOCK_N (the causal
    split: the diagonal block of keys starts at a multiple of BLOCK_M, so it must start on a tile of keys)."""
    merged = settings(CONFIGS[head_dim], config, "attention_forward")
    if merged["BLOCK_M"] % merged["BLOCK_N"]:
        raise ValueError(f"attention_forward: BLOCK_M must be a multiple of BLOCK_N, got {merged['BLOCK_M']} and "
                         f"{merged['BLOCK_N']}")
    return merged


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch :func:`forward_kernel` on checked inputs; returns the output and the float32 log-sum-exp rows."""
    batch, heads, seq_len, head_dim = q.shape
    q, k, v = (t.contiguous() for t in (q, k, v))  # the kernel's offsets assume (b, h, s, d) row-major storage
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, seq_len), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(seq_len, config["BLOCK_M"]), batch * heads)
    forward_kernel[grid](q, k, v, o, lse, seq_len, scale * LOG2E, HEAD_DIM=head_dim, CAUSAL=bool(causal), **config)
    return o, lse


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      scale: float | None = None, **config) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q k^T * scale [+ causal mask]) v`` by the Triton kernel, and the log-sum-exp of every row.

    q, k, v: ``(batch, heads, seq_len, head_dim)`` (:func:`check_inputs`); ``scale`` defaults to
    ``1 / sqrt(head_dim)``; ``config`` overrides :data:`CONFIGS` (BLOCK_M, BLOCK_N, num_warps, num_stages).
    Returns the output (q's shape and dtype) and the float32 ``(batch, heads, seq_len)`` log-sum-exp ``L``, with
    which ``softmax(S)[r] = exp(S[r] - L[r])``. Not differentiable: :func:`gpulab.kernels.triton_attention.attention`
    is.
    """
    _, _, _, head_dim = check_inputs(q, k, v)
    return forward(q, k, v, check_causal(causal), check_scale(scale, head_dim), forward_settings(head_dim, config))
