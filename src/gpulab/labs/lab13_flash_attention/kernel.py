"""Lab "Flash attention", exercise 3: the online-softmax update inside a Triton kernel, and the launcher.

:func:`flash_forward` is the lab's answer: FlashAttention's forward pass in its smallest form, one program per block
of ``BLOCK_M`` queries of one (batch, head), looping over tiles of ``BLOCK_N`` keys and values. It is
:mod:`gpulab.kernels.triton_attention.forward` without what makes that one complete (no causal mask, no log-sum-exp
saved for a backward pass), so that the loop of exercise 2 is all there is to read. The notebook gives the student
this kernel with :func:`tile_update` (the update it calls for every tile) and its final division blanked.

Two things differ from the NumPy update of exercise 1, and both are where the typical Triton mistakes are:

- **base 2.** The launcher passes ``qk_scale = log2(e) / sqrt(d)``, so ``s = q k^T * qk_scale`` is the score in
  base-2 units and ``exp(score) = 2^s``: the kernel calls ``tl.exp2``, which the GPU's special-function unit
  computes in one instruction (``tl.exp`` of the same ``s`` would compute ``e^(s)``, the wrong softmax);
- **16-bit inputs to the tensor cores.** ``p`` is float32; ``tl.dot`` takes both operands in one type, so
  ``p.to(v.dtype)`` before ``p @ v`` (under the interpreter in float32 the cast does nothing; on the GPU, in
  bfloat16, it is needed to compile).

``EVEN_N`` (a ``tl.constexpr``: the compiler builds one kernel for each value) is True when the keys fill whole
tiles, and then no load and no score is masked; otherwise every tile masks the keys past the end (their scores
become ``-inf``, so ``exp2`` gives them no weight).

:func:`attend` launches a kernel of this signature -- the student's or :func:`flash_forward` -- on ``(batch,
heads, seq_len, head_dim)`` tensors, into an output poisoned with NaN.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpulab.core.correctness import poisoned
from gpulab.kernels.triton_attention.forward import CONFIGS, check_inputs
from gpulab.kernels.triton_gemm.common import settings

LOG2E = math.log2(math.e)  # e^x = 2^(x * LOG2E)
# Before Hopper (a T4 has 64 KiB of shared memory per block, an L4 99 KiB): tiles whose two stages of K and V fit
SMALL_GPU_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}


@triton.jit
def tile_update(m_i, l_i, acc, s, v):
    """Exercise 1's ``online_update`` in base 2, on tiles: the state ``(m_i, l_i, acc)`` of ``BLOCK_M`` rows after
    the scores ``s`` (BLOCK_M x BLOCK_N, base-2 units) and values ``v`` (BLOCK_N x HEAD_DIM) of one more tile."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def flash_forward(Q, K, V, Out, seq_len, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_DIM: tl.constexpr, EVEN_N: tl.constexpr):
    """One program: ``BLOCK_M`` query rows of one (batch, head), all of its keys, the rows' output.

    Q, K, V, Out: contiguous ``(batch, heads, seq_len, HEAD_DIM)``; grid ``(ceil(seq_len / BLOCK_M), batch * heads)``.
    """
    head = tl.program_id(1)
    base = head.to(tl.int64) * seq_len * HEAD_DIM  # this head's (seq_len x HEAD_DIM) matrices
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    row_ok = offs_m < seq_len
    q = tl.load(Q + rows, mask=row_ok[:, None], other=0.0)  # kept on chip for the whole loop
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        tile = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        if EVEN_N:
            k = tl.load(K + tile)
            v = tl.load(V + tile)
            s = tl.dot(q, tl.trans(k)) * qk_scale  # scores in base-2 units
        else:
            key_ok = offs_n < seq_len
            k = tl.load(K + tile, mask=key_ok[:, None], other=0.0)
            v = tl.load(V + tile, mask=key_ok[:, None], other=0.0)
            s = tl.where(key_ok[None, :], tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_i, l_i, acc = tile_update(m_i, l_i, acc, s, v)
    out = acc / l_i[:, None]
    tl.store(Out + rows, out.to(Out.dtype.element_ty), mask=row_ok[:, None])


def launch_settings(head_dim: int, config: dict, device: torch.device) -> dict:
    """BLOCK_M, BLOCK_N, num_warps and num_stages, updated with ``config`` and checked: on a Hopper GPU (and under
    the interpreter) the book's tuned forward's for ``head_dim`` (:data:`gpulab.kernels.triton_attention.forward.
    CONFIGS`, chosen for an H100), on an earlier GPU :data:`SMALL_GPU_CONFIG`."""
    hopper = device.type != "cuda" or torch.cuda.get_device_capability(device) >= (9, 0)
    return settings(CONFIGS[head_dim] if hopper else SMALL_GPU_CONFIG, config, "attend")


def attend(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **config) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` computed by ``kernel`` (a ``@triton.jit`` function with the signature of
    :func:`flash_forward`), launched on a grid of ``(ceil(seq_len / BLOCK_M), batch * heads)`` programs.

    q, k, v: ``(batch, heads, seq_len, head_dim)`` of one dtype (float16 or bfloat16 on a GPU, float16 or float32
    under the interpreter; :func:`gpulab.kernels.triton_attention.forward.check_inputs`); ``config`` overrides the
    tile sizes and launch settings (:func:`launch_settings`). The output, in q's dtype, starts as NaN, so a row the
    kernel never writes is NaN.
    """
    if not hasattr(kernel, "__getitem__") or not hasattr(kernel, "fn"):
        raise TypeError(f"kernel: a @triton.jit function, got {type(kernel).__name__}")
    batch, heads, seq_len, head_dim = check_inputs(q, k, v)
    chosen = launch_settings(head_dim, config, q.device)
    q, k, v = (t.contiguous() for t in (q, k, v))  # the kernel's offsets assume (b, h, s, d) row-major storage
    out = poisoned(tuple(q.shape), q.dtype, q.device)
    grid = (triton.cdiv(seq_len, chosen["BLOCK_M"]), batch * heads)
    kernel[grid](q, k, v, out, seq_len, LOG2E / math.sqrt(head_dim), HEAD_DIM=head_dim,
                 EVEN_N=seq_len % chosen["BLOCK_N"] == 0, **chosen)
    return out
