"""Softmax in blocks with a running maximum, and the FlashAttention idea built on it.

A safe softmax of a row needs its maximum before it can exponentiate anything, and its sum before
it can divide: three passes over the row. The *online* softmax of Milakov and Gimelshein
{milakov2018online} keeps a running maximum ``m`` and a running sum ``l`` of ``exp(x - m)``: when a
new block raises the maximum, the sum so far is rescaled by ``exp(m_old - m_new)``, so one pass
gives both. FlashAttention {dao2022flashattention} applies the same rescaling to the *output* of
attention: for each block of queries it walks over blocks of keys and values, keeps ``m``, ``l`` and
a partial output ``O``, and never holds more than one block of the ``N x N`` score matrix.

- :func:`softmax`, :func:`online_softmax`: the three-pass and the blocked one-pass softmax, in NumPy;
- :func:`naive_attention`, :func:`blocked_attention`: attention that stores all the scores, and
  attention in blocks; both return what they held, so the memory claim is counted, not asserted;
- :func:`blocked_vs_naive`: the two compared for error and memory (NumPy, float64, any machine);
- :func:`attention_sweep`: on the device, the naive attention of
  :func:`gpulab.ch06_recurrent_and_attention.attention.scaled_dot_product` (three operations, the scores in memory)
  against ``F.scaled_dot_product_attention`` and its backends, for time and peak memory as the sequence grows, until
  the naive one runs out of memory.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gpulab.ch06_recurrent_and_attention import attention
from gpulab.core import env, timing
from gpulab.core.correctness import check_close, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE
from gpulab.core.provenance import experiment
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, supported_dtype, torch_dtype

TARGET_ERROR = 1e-6  # blocked against naive attention, relative, in float64






def softmax(x: np.ndarray) -> np.ndarray:
    """The safe softmax along the last axis: find the maximum, sum ``exp(x - max)``, divide (three passes)."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def _block(name: str, block: int, length: int) -> int:
    block = positive_int(name, block)
    return min(block, length)


def online_softmax(x: np.ndarray, block: int) -> tuple[np.ndarray, dict]:
    """Softmax along the last axis with the maximum and the sum found in one pass over blocks of ``block``.

    For each block: ``m_new = max(m, max(block))`` and ``l = l exp(m - m_new) + sum(exp(block - m_new))``.
    A second pass writes ``exp(x - m) / l``. Returns the softmax and counts: the passes over the
    input, the blocks, and how often a row's sum had to be rescaled because its maximum grew.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"x: an array with a non-empty last axis, got shape {x.shape}")
    length = x.shape[-1]
    block = _block("block", block, length)
    m = np.full(x.shape[:-1], -np.inf)
    total = np.zeros(x.shape[:-1])  # the running sum l
    rescalings = 0
    for start in range(0, length, block):
        part = x[..., start:start + block]
        m_new = np.maximum(m, part.max(axis=-1))
        rescalings += int(np.count_nonzero((m_new > m) & (total > 0)))
        total = total * np.exp(m - m_new) + np.exp(part - m_new[..., None]).sum(axis=-1)
        m = m_new
    return np.exp(x - m[..., None]) / total[..., None], {
        "passes": 2, "blocks": math.ceil(length / block), "rescalings": rescalings}






def _check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        raise ValueError(f"q, k, v: N x d, M x d and M x d_v matrices, got {q.shape}, {k.shape}, {v.shape}")
    return q, k, v


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, dict]:
    """``softmax(q k^T / sqrt(d)) v`` with the whole ``N x M`` score matrix in memory.

    Returns the output and the largest number of scores held at once (``N M``).
    """
    q, k, v = _check_qkv(q, k, v)
    scores = q @ k.T / math.sqrt(q.shape[1])
    return softmax(scores) @ v, {"score_elements": scores.size}


def blocked_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_q: int, block_k: int) -> tuple[np.ndarray,
                                                                                                       dict]:
    """Attention computed block by block, as FlashAttention's forward pass does, in NumPy.

    For each block of ``block_q`` queries, walk over blocks of ``block_k`` keys and values with a
    running row maximum ``m``, a running sum ``l`` and a partial output ``O``::

        S = Q_i K_j^T / sqrt(d)               (block_q x block_k scores: the only scores held)
        m_new = max(m, rowmax(S));  alpha = exp(m - m_new);  P = exp(S - m_new)
        l = alpha l + rowsum(P);    O = alpha O + P V_j;     m = m_new

    and finish with ``O / l``. Returns the output and counts: the most scores held at once, the
    elements of the working set (scores, ``O``, ``m`` and ``l``), and the rescalings of ``O``.
    """
    q, k, v = _check_qkv(q, k, v)
    n, m_keys = q.shape[0], k.shape[0]
    block_q, block_k = _block("block_q", block_q, n), _block("block_k", block_k, m_keys)
    scale = 1 / math.sqrt(q.shape[1])
    out = np.empty((n, v.shape[1]))
    held, working, rescalings = 0, 0, 0
    for i in range(0, n, block_q):
        q_i = q[i:i + block_q]
        m = np.full(q_i.shape[0], -np.inf)
        total = np.zeros(q_i.shape[0])  # the running sum l
        o = np.zeros((q_i.shape[0], v.shape[1]))
        for j in range(0, m_keys, block_k):
            s = q_i @ k[j:j + block_k].T * scale
            m_new = np.maximum(m, s.max(axis=1))
            alpha = np.exp(m - m_new)
            rescalings += int(np.count_nonzero((m_new > m) & (total > 0)))
            p = np.exp(s - m_new[:, None])
            total = alpha * total + p.sum(axis=1)
            o = alpha[:, None] * o + p @ v[j:j + block_k]
            m = m_new
            held = max(held, s.size)
            working = max(working, s.size + o.size + m.size + total.size)
        out[i:i + block_q] = o / total[:, None]
    return out, {"score_elements": held, "working_elements": working, "rescalings": rescalings}


def attention_memory(n: int, d: int, block_q: int, block_k: int) -> dict:
    """Elements each attention holds beyond its inputs and output (``4 N d``): naive, the ``N^2`` scores
    and as many probabilities; blocked, one ``block_q x block_k`` block of scores, ``O`` (``block_q x d``),
    ``m`` and ``l``."""
    n, d = positive_int("n", n), positive_int("d", d)
    block_q, block_k = _block("block_q", block_q, n), _block("block_k", block_k, n)
    return {"inputs_outputs": 4 * n * d, "naive": 2 * n * n, "blocked": block_q * block_k + block_q * d + 2 * block_q}


def blocked_vs_naive(n: int, d: int, blocks: Sequence[int], seed: int = 0, spread: float = 3.0) -> list[dict]:
    """Blocked against naive attention on random ``n x d`` float64 queries, keys and values, per block size.

    The queries are scaled by ``spread`` so that the scores range widely and the running maximum
    changes often (a gentle softmax would hide a wrong rescaling). A row per block size (square
    blocks): the norm-wise and the largest elementwise relative error, the rescalings, and the
    elements each held (counted by the functions themselves, and by formula).
    """
    n, d, blocks = positive_int("n", n), positive_int("d", d), positive_ints("blocks", blocks)
    rng = np.random.default_rng(seed)
    q = spread * rng.standard_normal((n, d))
    k, v = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    expected, naive_counts = naive_attention(q, k, v)
    rows = []
    for block in blocks:
        out, counts = blocked_attention(q, k, v, block, block)
        memory = attention_memory(n, d, block, block)
        rows.append({
            "n": n, "d": d, "block": block,
            "relative_error": float(np.linalg.norm(out - expected) / np.linalg.norm(expected)),
            "max_elementwise_error": float(np.max(np.abs(out - expected) / np.abs(expected).clip(1e-300))),
            "rescalings": counts["rescalings"], "scores_held": counts["score_elements"],
            "working_elements": counts["working_elements"], "naive_scores_held": naive_counts["score_elements"],
            "formula_blocked": memory["blocked"], "formula_naive": memory["naive"],
        })
    return rows






METHODS = {
    "naive": "naive: QK^T, softmax, PV as separate operations",
    "sdpa": "F.scaled_dot_product_attention (PyTorch picks the backend)",
    "sdpa-math": "SDPA, math backend",
    "sdpa-flash": "SDPA, flash backend",
    "sdpa-efficient": "SDPA, memory-efficient backend",
    "sdpa-cudnn": "SDPA, cuDNN backend",
}
DEFAULT_METHODS = ("naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient")
# ATen operators that reveal which backend ran (matched in this order in the profiler's CPU events).
BACKEND_OPERATORS = (
    ("flash", "_scaled_dot_product_flash_attention"),
    ("memory-efficient", "_scaled_dot_product_efficient_attention"),
    ("cuDNN", "_scaled_dot_product_cudnn_attention"),
    ("math", "_scaled_dot_product_attention_math"),
    ("fused (other)", "_scaled_dot_product_fused_attention"),
)


def _backend_context(method: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    forced = {"sdpa-math": SDPBackend.MATH, "sdpa-flash": SDPBackend.FLASH_ATTENTION,
              "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}
    return sdpa_kernel(forced[method]) if method in forced else contextlib.nullcontext()


def _attention_call(method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    if method not in METHODS:
        raise ValueError(f"method: one of {', '.join(METHODS)}, got {method!r}")
    if method == "naive":
        return lambda: attention.scaled_dot_product(q, k, v)
    return lambda: F.scaled_dot_product_attention(q, k, v)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():  # SDPA warns why each backend it skips was not usable
        warnings.simplefilter("ignore")
        yield


def backend_used(method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """Which attention implementation ``method`` ran, read from the ATen operators the profiler saw."""
    if method == "naive":
        return "none: matmul, softmax, matmul"
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "99")
    with _quiet(), _backend_context(method), profile(activities=[ProfilerActivity.CPU]) as prof:
        _attention_call(method, q, k, v)()
    names = [e.name for e in prof.events()]
    for backend, operator in BACKEND_OPERATORS:
        if any(operator in name for name in names):
            return backend
    return "unknown"


def _needed_bytes(method: str, batch: int, heads: int, seq_len: int, head_dim: int, size: int) -> int:
    inputs = 4 * batch * heads * seq_len * head_dim * size
    scores = batch * heads * seq_len * seq_len * size
    return inputs + (2 * scores if method in ("naive", "sdpa-math") else 0)


def measure_attention(method: str, seq_len: int, batch: int, heads: int, head_dim: int, dtype: str) -> dict:
    """Time one attention ``method`` on random ``batch x heads x seq_len x head_dim`` inputs.

    Returns seconds, TFLOP/s (``4 B H N^2 d``), the scores' size if stored, the peak memory beyond the
    inputs (GPU only: ``torch.cuda.max_memory_allocated``) and the backend that ran. Raises
    :class:`gpulab.core.validation.DoesNotFit` when the scores cannot fit (a sweep's "out of memory").
    """
    device = env.device()
    label = supported_dtype("dtype", dtype, device)
    seq_len, batch, heads, head_dim = (positive_int(n, v) for n, v in (("seq_len", seq_len), ("batch", batch),
                                                                       ("heads", heads), ("head_dim", head_dim)))
    size = torch.empty((), dtype=torch_dtype(label)).element_size()
    if device.type == "cuda":  # hand the previous point's cached blocks back, so that the check sees them as free
        torch.cuda.empty_cache()
    fits_in_memory("seq_len", _needed_bytes(method, batch, heads, seq_len, head_dim, size), device)
    q, k, v = (random_tensor((batch, heads, seq_len, head_dim), torch_dtype(label), device) for _ in range(3))
    call = _attention_call(method, q, k, v)
    with _quiet(), _backend_context(method):
        call()
        timing.synchronize(device)
        peak = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            call()
            timing.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) - base
        t = timing.measure(call, device=device, flush_l2=False)
    work = 4 * batch * heads * seq_len * seq_len * head_dim
    return {"seconds": t.median_s, "spread": t.spread, "tflops": work / t.median_s / 1e12,
            "score_bytes": batch * heads * seq_len * seq_len * size, "peak_extra_bytes": peak,
            "backend": backend_used(method, q, k, v)}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


@experiment("fusion_attention")
def attention_sweep(seq_lens: Sequence[int], batch: int, heads: int, head_dim: int, dtype: str,
                    methods: Sequence[str] = DEFAULT_METHODS, check_len: int = 256) -> list[dict]:
    """Each attention method at each sequence length: a row per (method, seq_len) from :func:`measure_attention`.

    A backend this device or dtype lacks gets one row with status 'not available: ...'; a size that
    does not fit gets status 'out of memory' (:func:`gpulab.core.sweep.run_sweep`). Before anything is
    timed, every method is checked against float64 attention at ``check_len`` tokens.
    """
    seq_lens = positive_ints("seq_lens", seq_lens)
    device = env.device()
    label = supported_dtype("dtype", dtype, device)
    for method in methods:
        if method not in METHODS:
            raise ValueError(f"methods: each one of {', '.join(METHODS)}, got {method!r}")
    check_len = positive_int("check_len", check_len)
    q, k, v = (random_tensor((1, 2, check_len, head_dim), torch_dtype(label), device) for _ in range(3))
    expected = attention.scaled_dot_product(q.double(), k.double(), v.double())
    rows, available = [], []
    for method in methods:
        try:
            with _quiet(), _backend_context(method):
                out = _attention_call(method, q, k, v)()
        except RuntimeError as error:  # "No available kernel": this backend cannot take these inputs here
            rows.append({"method": method, "label": METHODS[method], "dtype": label, "seq_len": None,
                         "status": f"not available: {_first_line(error)}"})
            continue
        check_close(out, expected, MATMUL_TOLERANCE[label], f"{METHODS[method]} ({label})")
        available.append(method)
    points = [{"method": m, "seq_len": n, "batch": batch, "heads": heads, "head_dim": head_dim, "dtype": label}
              for m in available for n in seq_lens]
    swept = run_sweep(measure_attention, points)
    return [{**row, "label": METHODS[row["method"]]} for row in swept] + rows
