"""The chapter "Memory-bound layers and kernel fusion": layers that move bytes, and kernels that move fewer.

Activations, normalisations, softmax and dropout do a handful of operations per element they read,
far too few to keep a GPU's arithmetic busy: on the roofline they sit far left, under the bandwidth
slope, and their time is the bytes they move divided by the memory's bandwidth. Run one after
another, each layer reads its input from memory and writes its output back; *fusing* them into one
kernel reads the inputs once and writes the output once. This module measures that:

- :func:`.sweeps.pointwise_roofline`: FLOPs, bytes, time and bandwidth of ReLU, GELU, LayerNorm, softmax and
  a bias + GELU + dropout chain, beside the device's measured ceilings (:func:`gpulab.core.rates.ceilings`);
- :func:`.sweeps.compile_comparison`: two chains run eagerly (one PyTorch kernel per operation) and through
  ``torch.compile`` (which fuses them), with the kernels the profiler saw, the bytes each moves
  (:func:`chain_cost`), the time, and the compile time;
- :func:`fused_bias_gelu_dropout`: the chain fused by hand in CUDA C (``27_fused_bias_gelu_dropout.cu``),
  its dropout mask a hash of (seed, element index) that :func:`keep_mask` recomputes exactly, and
  :func:`.sweeps.hand_kernel`, which races it against a device copy of the same bytes, eager PyTorch and
  ``torch.compile``;
- :func:`.sweeps.horizontal_fusion`: one update per parameter tensor against ``torch._foreach_add_``
  (multi-tensor apply) and one flat buffer: fusing *side by side* instead of one after another.

The blocked softmax and FlashAttention, the same idea applied to attention, are in
:mod:`gpulab.ch13_memory_bound_layers_and_fusion.blocked_attention`.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from gpulab.core import env, flops, kernel_mode, profiling, timing
from gpulab.core.correctness import check_close, poisoned
from gpulab.core.validation import positive_int
from gpulab.kernels import cuda_c

KERNEL = "27_fused_bias_gelu_dropout"
KERNEL_FUNCTION = "fused_bias_gelu_dropout"
THREADS_PER_BLOCK = 256  # the kernel's __launch_bounds__
TARGET_FRACTION = 0.85  # of the device copy's bandwidth, for the hand-fused kernel on a large input
APPROXIMATIONS = ("none", "tanh")  # of GELU, as F.gelu's ``approximate``
# Relative error of each GELU form in float32 against float64: erff is accurate to 2 ulp; the
# tanh form uses the one-instruction tanh.approx.f32, whose relative error is about 2^-11.
TOLERANCE = {"none": 1e-6, "tanh": 1e-3}
MAX_ELEMENTS = 2**31 - 1  # the kernel indexes elements with 32-bit integers






@dataclass(frozen=True)
class Op:
    """One elementwise or row-wise layer, as one kernel: its arithmetic and its memory traffic per element.

    FLOPs count every add, multiply, compare and special function (exp, erf, tanh) as one. ``reads``
    and ``writes`` count tensors of the full size; ``extra_bytes`` is per element beyond those
    (dropout's one-byte mask). Small per-column or per-row vectors (a bias, LayerNorm's weights,
    a row's mean) are left out: they are read from cache.
    """

    name: str
    label: str
    flops_per_element: int
    reads: int
    writes: int
    extra_bytes: int = 0
    formula: str = ""


OPS: dict[str, Op] = {op.name: op for op in (
    Op("relu", "ReLU", 1, 1, 1, formula="max(x, 0)"),
    Op("gelu", "GELU", 5, 1, 1, formula="0.5 x (1 + erf(x / sqrt 2)): a multiply, erf, an add, two multiplies"),
    Op("layer_norm", "LayerNorm", 7, 1, 1,
       formula="mean (add), x - mean, square, sum, times 1/std, times weight, plus bias"),
    Op("softmax", "softmax", 5, 1, 1, formula="row max (compare), x - max, exp, row sum, times 1/sum"),
    Op("bias_add", "x + bias", 1, 1, 1, formula="x + b"),
    Op("add", "x + residual", 1, 2, 1, formula="x + r"),
    Op("dropout", "dropout", 2, 1, 1, extra_bytes=1,
       formula="keep test (compare) and scale by 1/(1-p); PyTorch's CUDA kernel also writes a one-byte mask"),
)}


@dataclass(frozen=True)
class Chain:
    """A sequence of layers: run eagerly as ``kernels``, or fused into one kernel that reads ``reads``
    full-size tensors once and writes ``writes`` once."""

    name: str
    label: str
    kernels: tuple[str, ...]
    reads: int
    writes: int


CHAINS: dict[str, Chain] = {c.name: c for c in (
    Chain("bias_gelu_dropout", "bias + GELU + dropout", ("bias_add", "gelu", "dropout"), 1, 1),
    Chain("add_layer_norm", "residual add + LayerNorm", ("add", "layer_norm"), 2, 1),
)}


def _known(name: str, table: dict, argument: str):
    if name not in table:
        raise ValueError(f"{argument}: unknown {name!r}; choose one of {', '.join(table)}")
    return table[name]


def op_cost(op: str, n: int, dtype: str = "float32") -> flops.Cost:
    """FLOPs and bytes of layer ``op`` (a key of :data:`OPS`) on ``n`` elements of ``dtype``."""
    spec, n = _known(op, OPS, "op"), positive_int("n", n)
    size = flops.bytes_per_element(dtype)
    return flops.Cost(flops=spec.flops_per_element * n,
                      bytes=((spec.reads + spec.writes) * size + spec.extra_bytes) * n)


def chain_cost(chain: str, n: int, dtype: str = "float32", fused: bool = False) -> flops.Cost:
    """FLOPs and bytes of ``chain`` on ``n`` elements: one kernel per layer (each reads its input and
    writes its output), or ``fused``: the chain's inputs read once and its output written once."""
    spec, n = _known(chain, CHAINS, "chain"), positive_int("n", n)
    work = sum(OPS[k].flops_per_element for k in spec.kernels) * n
    if fused:
        return flops.Cost(flops=work, bytes=(spec.reads + spec.writes) * flops.bytes_per_element(dtype) * n)
    return flops.Cost(flops=work, bytes=sum(op_cost(k, n, dtype).bytes for k in spec.kernels))






def bias_gelu_dropout(x: torch.Tensor, bias: torch.Tensor, p: float, approximate: str = "none") -> torch.Tensor:
    """``dropout(gelu(x + bias), p)`` in training mode: three PyTorch operations, three kernels on a GPU."""
    return F.dropout(F.gelu(x + bias, approximate=approximate), p, training=True)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``layer_norm(x + residual)`` over the last dimension: a transformer's "add & norm", two kernels."""
    return F.layer_norm(x + residual, (x.shape[-1],), weight, bias)


def check_dropout(output: torch.Tensor, expected: torch.Tensor, p: float, what: str) -> float:
    """Check an output of dropout whose mask is not known (PyTorch's own random numbers).

    The kept elements must equal ``expected / (1 - p)``; the share dropped must be ``p`` within six
    standard deviations of a binomial count. Returns the relative error of the kept elements.
    """
    if not torch.isfinite(output).all():
        raise AssertionError(f"{what}: the output holds NaN or inf")
    kept = output != 0
    error = check_close(output[kept], expected[kept] / (1 - p), TOLERANCE["none"], what)
    n = expected.numel()
    dropped = ((~kept) & (expected != 0)).sum().item() / n
    allowed = 6 * math.sqrt(p * (1 - p) / n) + float((expected == 0).sum().item()) / n
    if abs(dropped - p) > allowed:
        raise AssertionError(f"{what}: dropped {dropped:.4f} of the elements, expected {p} +- {allowed:.4f}")
    return error






MASK32 = 0xFFFFFFFF
HASH_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)  # lowbias32's, as in 27_fused_bias_gelu_dropout.cu


def hash32(value: int) -> int:
    """The kernel's integer hash ("lowbias32") of a 32-bit unsigned ``value``, in Python integers."""
    h = value & MASK32
    h ^= h >> 16
    h = (h * HASH_MULTIPLIERS[0]) & MASK32
    h ^= h >> 15
    h = (h * HASH_MULTIPLIERS[1]) & MASK32
    return h ^ (h >> 16)


def _multiply32(h: torch.Tensor, constant: int) -> torch.Tensor:
    """``h * constant mod 2^32`` for int64 tensors of values below 2^32, without overflowing 64 bits:
    the constant is split into 16-bit halves, so that no product exceeds 2^48."""
    low, high = constant & 0xFFFF, constant >> 16
    return (h * low + (((h * high) & 0xFFFF) << 16)) & MASK32


def hash32_tensor(h: torch.Tensor) -> torch.Tensor:
    """:func:`hash32` of every element of an int64 tensor of values in [0, 2^32), exactly, with torch's
    integer operations (on whichever device the tensor is)."""
    h = h ^ (h >> 16)
    h = _multiply32(h, HASH_MULTIPLIERS[0])
    h = h ^ (h >> 15)
    h = _multiply32(h, HASH_MULTIPLIERS[1])
    return h ^ (h >> 16)


def dropout_threshold(p: float) -> int:
    """The 32-bit threshold below which a hash drops its element: ``round(p 2^32)``; checks ``p`` in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
        raise ValueError(f"p: the dropout probability, a number in [0, 1), got {p!r}")
    return min(round(p * 2**32), MASK32)


def _seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MASK32:
        raise ValueError(f"seed: an integer in [0, 2^32), got {seed!r}")
    return seed


def keep_mask(n: int, p: float, seed: int, device: torch.device | None = None) -> torch.Tensor:
    """Which of ``n`` elements the kernel keeps: element i is kept when ``hash32(i ^ hash32(seed)) >=
    dropout_threshold(p)``. A bool tensor of ``n``, computed with integer operations on ``device``."""
    n, threshold, key = positive_int("n", n), dropout_threshold(p), hash32(_seed(seed))
    if n > MAX_ELEMENTS:
        raise ValueError(f"n: the kernel indexes at most 2^31 - 1 elements, got {n}")
    index = torch.arange(n, dtype=torch.int64, device=device or torch.device("cpu"))
    return hash32_tensor(index ^ key) >= threshold


def _gelu_approximation(approximate: str) -> str:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate: 'none' (erf) or 'tanh', as F.gelu takes, got {approximate!r}")
    return approximate


def reference_bias_gelu_dropout(x: torch.Tensor, bias: torch.Tensor, p: float, seed: int,
                                approximate: str = "none") -> torch.Tensor:
    """What the hand-fused kernel computes, in float64, with the same dropout mask (:func:`keep_mask`)."""
    approximate = _gelu_approximation(approximate)
    if bias.shape != x.shape[-1:]:
        raise ValueError(f"bias: one value per column, shape ({x.shape[-1]},), got {tuple(bias.shape)}")
    g = F.gelu(x.double() + bias.double(), approximate=approximate)
    mask = keep_mask(x.numel(), p, seed, x.device).reshape(x.shape)
    return torch.where(mask, g / (1 - p), torch.zeros((), dtype=torch.float64, device=x.device))






def launch_shape(rows: int, cols4: int, sms: int, blocks_per_sm: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(grid, block)`` for the kernel: threads along x cover the ``cols4`` float4s of a row (a multiple
    of 32 threads, at most 256); a narrow row leaves room for several rows per block along y; the grid
    has about ``blocks_per_sm`` blocks per SM, and its blocks loop down the rows."""
    rows, cols4 = positive_int("rows", rows), positive_int("cols4", cols4)
    sms, blocks_per_sm = positive_int("sms", sms), positive_int("blocks_per_sm", blocks_per_sm)
    threads_x = min(THREADS_PER_BLOCK, 32 * math.ceil(cols4 / 32))
    threads_y = THREADS_PER_BLOCK // threads_x
    grid_x = math.ceil(cols4 / threads_x)
    grid_y = max(1, min(math.ceil(rows / threads_y), math.ceil(blocks_per_sm * sms / grid_x), 65535))
    return (grid_x, grid_y), (threads_x, threads_y)


def _check_operands(x: torch.Tensor, bias: torch.Tensor, out: torch.Tensor | None) -> None:
    if x.dtype != torch.float32 or x.device.type != "cuda" or not x.is_contiguous() or x.dim() < 1:
        raise ValueError(f"x: a contiguous float32 CUDA tensor, got {x.dtype} on {x.device}")
    if x.shape[-1] % 4:
        raise ValueError(f"x: its last dimension must be a multiple of 4 (the kernel loads float4s), got {x.shape[-1]}")
    if x.numel() > MAX_ELEMENTS:
        raise ValueError(f"x: at most 2^31 - 1 elements (32-bit indices), got {x.numel()}")
    if bias.shape != x.shape[-1:] or bias.dtype != torch.float32 or bias.device != x.device:
        raise ValueError(f"bias: float32, shape ({x.shape[-1]},), on {x.device}; got {bias.dtype} "
                         f"{tuple(bias.shape)} on {bias.device}")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device
                            or not out.is_contiguous()):
        raise ValueError("out: a contiguous tensor of x's shape, dtype and device")
    for name, t in (("x", x), ("bias", bias), ("out", out)):
        if t is not None and (not t.is_contiguous() or t.data_ptr() % 16):
            raise ValueError(f"{name}: must be contiguous and 16-byte aligned for float4 loads (a slice may not be)")


def prepared_bias_gelu_dropout(x: torch.Tensor, bias: torch.Tensor, p: float, seed: int, out: torch.Tensor,
                               approximate: str = "none", blocks_per_sm: int = 4) -> Callable[[], None]:
    """A function that launches the hand-fused kernel on these operands, writing ``out`` (for timing)."""
    if not kernel_mode.on_gpu():
        raise ValueError("fused_bias_gelu_dropout: the CUDA C kernel runs only on a GPU; without one, this page "
                         "shows the kernel's recorded run")
    approximate = _gelu_approximation(approximate)
    _check_operands(x, bias, out)
    threshold, key = dropout_threshold(p), hash32(_seed(seed))
    cols4 = x.shape[-1] // 4
    grid, block = launch_shape(x.numel() // x.shape[-1], cols4, env.describe().multiprocessors, blocks_per_sm)
    return cuda_c.prepared(KERNEL, KERNEL_FUNCTION, grid, block, x, bias, out, x.numel() // x.shape[-1], cols4,
                           np.uint32(key), np.uint32(threshold), np.float32(1 / (1 - p)),
                           defines={"GELU_TANH": int(approximate == "tanh")})


def fused_bias_gelu_dropout(x: torch.Tensor, bias: torch.Tensor, p: float, seed: int, approximate: str = "none",
                            out: torch.Tensor | None = None, blocks_per_sm: int = 4) -> torch.Tensor:
    """``dropout(gelu(x + bias), p)`` in one pass over memory, with the hand-written CUDA C kernel.

    ``x`` is float32 on a GPU with its last dimension (the columns; ``bias`` has one value per column)
    a multiple of 4. Dropout keeps element i when a hash of (``seed``, i) clears a threshold, so the
    same seed gives the same mask, which :func:`keep_mask` recomputes. Returns ``out`` (a new tensor
    if None). Without a GPU this raises ValueError: the kernel needs one.
    """
    out = torch.empty_like(x) if out is None and x.device.type == "cuda" else out
    prepared_bias_gelu_dropout(x, bias, p, seed, out, approximate, blocks_per_sm)()
    return out


def check_fused(x: torch.Tensor, bias: torch.Tensor, p: float, seed: int, approximate: str = "none",
                blocks_per_sm: int = 4) -> float:
    """Run the kernel on ``x`` into a NaN-poisoned output and check it against the float64 reference.

    Raises AssertionError if the relative error exceeds the form's :data:`TOLERANCE`, if any dropped
    element is not exactly 0, or if a second launch with the same seed differs. Returns the error.
    """
    out = poisoned(tuple(x.shape), torch.float32, x.device)
    fused_bias_gelu_dropout(x, bias, p, seed, approximate, out, blocks_per_sm)
    expected = reference_bias_gelu_dropout(x, bias, p, seed, approximate)
    what = f"fused bias + GELU ({approximate}) + dropout on {tuple(x.shape)}"
    error = check_close(out, expected, TOLERANCE[approximate], what)
    dropped = expected == 0
    if (out[dropped] != 0).any():
        raise AssertionError(f"{what}: an element the mask drops is not 0")
    again = fused_bias_gelu_dropout(x, bias, p, seed, approximate, blocks_per_sm=blocks_per_sm)
    if not torch.equal(again, out):
        raise AssertionError(f"{what}: two launches with the same seed differ")
    return error






def kernels_per_call(fn: Callable[[], object], device: torch.device, calls: int = 3) -> tuple[float, list[str]] | None:
    """How many GPU kernels (memsets and copies included) one call of ``fn`` runs, and their distinct
    names, from ``torch.profiler`` over ``calls`` calls; None on a CPU, which has no kernels to count."""
    if device.type != "cuda":
        return None
    fn()
    timing.synchronize(device)
    profile = profiling.profile_calls(fn, device, calls)
    names = [profiling.short_name(name) for name, _seconds in profiling.device_kernels(profile)]
    return len(names) / calls, list(dict.fromkeys(names))


def compile_unavailable(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run here, or None if it can."""
    import torch._dynamo

    supported = getattr(torch._dynamo, "is_dynamo_supported", lambda: True)
    if not supported():
        return "TorchDynamo does not support this Python version"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "torch.compile generates Triton kernels on a GPU, and Triton is not installed"
        return None
    if not any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if c):
        return "torch.compile generates C++ on a CPU, and no C++ compiler was found"
    return None


@contextlib.contextmanager
def _cold_compile() -> Iterator[None]:
    """Compile from scratch: without inductor's caches on disk, the compile time is not a cache hit."""
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    patch = (torch._inductor.config.patch(force_disable_caches=True)
             if hasattr(torch._inductor.config, "force_disable_caches") else contextlib.nullcontext())
    with warnings.catch_warnings(), patch:
        warnings.simplefilter("ignore")  # e.g. "dynamo_pgo force disabled by ... force_disable_caches"
        yield


def compiled(fn: Callable, *args, device: torch.device) -> tuple[Callable, float]:
    """``torch.compile(fn)`` and the seconds of its first call on ``args`` (tracing, code generation,
    compilation and one run), compiled from scratch."""
    with _cold_compile():
        fast = torch.compile(fn, dynamic=False)
        timing.synchronize(device)
        start = time.perf_counter()
        fast(*args)
        timing.synchronize(device)
        return fast, time.perf_counter() - start


def _failure(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first[:200]}"
