"""What every step of the ladder shares: checking a launcher's inputs and settings, and the check before timing.

Each step's ``matmul(a, b, **config)`` computes ``a @ b`` for a row-major (contiguous) ``M x K`` matrix ``a`` and
``K x N`` matrix ``b`` of one 16-bit float type, summing in float32 and returning ``M x N`` in the inputs'
type -- what ``torch.mm`` (cuBLAS) returns for the same inputs, so the two can be compared and timed alike.

:func:`check` is what runs before anything is timed: fresh random operands from a seeded generator, the product
in float64 on the host, and a tolerance that follows from the arithmetic (:func:`tolerance`): the kernel's output
is rounded once to its 16-bit type, and its float32 sums of K products add rounding that grows like sqrt(K).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from gpulab.core import kernel_mode
from gpulab.core.correctness import check_close, poisoned
from gpulab.kernels.triton_gemm import interpreter

DTYPES = (torch.float16, torch.bfloat16)  # what tl.dot feeds to the tensor cores in these kernels
INTERPRETER_DTYPES = (torch.float16, torch.float32)  # no bfloat16 arithmetic in Triton 3.6's interpreter
INT32_MAX = 2**31 - 1


def operands(a: object, b: object) -> tuple[int, int, int]:
    """``(M, N, K)`` of ``a @ b``, or a TypeError / ValueError that names the operand and what is wrong."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: a torch.Tensor, got {type(t).__name__}")
    interpreted = interpreter.interpreting()
    allowed = INTERPRETER_DTYPES if interpreted else DTYPES
    if interpreted and torch.bfloat16 in (a.dtype, b.dtype):
        raise TypeError("a, b: bfloat16 runs on the GPU only: Triton 3.6's interpreter keeps bfloat16 as its raw "
                        "16-bit patterns and tl.dot multiplies those (it does not support bfloat16 arithmetic); "
                        "use float16 or float32 under the interpreter")
    if not interpreted and (a.device.type != "cuda" or b.device.type != "cuda"):
        raise ValueError(f"a, b: compiled Triton kernels run on a CUDA GPU; got tensors on {a.device} and {b.device}")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in allowed:
            raise TypeError(f"{name}: dtype {', '.join(map(str, allowed))}; got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name}: a 2-D matrix, got {t.dim()} dimension(s), shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: contiguous (row-major) storage, got strides {t.stride()} for shape "
                             f"{tuple(t.shape)}; pass {name}.contiguous()")
        if t.numel() == 0:
            raise ValueError(f"{name}: a non-empty matrix, got shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"b: the same dtype as a ({a.dtype}), got {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"b: on the same device as a ({a.device}), got {b.device}")
    (m, k), (k_b, n) = a.shape, b.shape
    if k != k_b:
        raise ValueError(f"b: a is {m} x {k}, so b needs {k} rows (the inner dimension); it has {k_b}")
    if max(m * k, k * n, m * n) > INT32_MAX:
        raise ValueError(f"a, b: the kernels index with 32-bit ints; {m} x {k} @ {k} x {n} has too many elements")
    return m, n, k


def output(a: torch.Tensor, m: int, n: int, out: torch.Tensor | None) -> torch.Tensor:
    """The ``M x N`` result buffer: ``out`` if given (checked), else a fresh one (not cleared: the kernel writes
    every element)."""
    if out is None:
        return torch.empty((m, n), dtype=a.dtype, device=a.device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: a torch.Tensor, got {type(out).__name__}")
    if out.shape != (m, n) or out.dtype != a.dtype or out.device != a.device or not out.is_contiguous():
        raise ValueError(f"out: a contiguous {a.dtype} tensor of {m} x {n} on {a.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    return out


def settings(defaults: Mapping[str, int], given: Mapping[str, object], step: str) -> dict[str, int]:
    """``defaults`` updated with ``given``; a ValueError for an unknown name or a block size tl.dot cannot take.

    Block sizes (names starting ``BLOCK_``) must be powers of two of at least 16: ``tl.arange`` needs a power of
    two, and ``tl.dot`` works on tiles of at least 16 along each side.
    """
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"{step}: settings are {', '.join(defaults)}; got unknown {unknown}")
    merged = {**defaults, **given}
    for name, value in merged.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{step}: {name} must be a positive int, got {value!r}")
        if name.startswith("BLOCK_") and (value < 16 or value & (value - 1)):
            raise ValueError(f"{step}: {name} must be a power of two >= 16, got {value}")
    return merged


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the distance from 1 to the next number: the largest relative error of rounding to ``dtype``."""
    return torch.finfo(dtype).eps / 2


def tolerance(dtype: torch.dtype, k: int) -> float:
    """The relative error (Frobenius norm, against float64) a correct ``M x K @ K x N`` product in ``dtype`` with
    float32 sums stays under, on standard-normal data.

    Two roundings add up: the result rounded once to ``dtype`` (at most its unit roundoff per element) and the
    K-term float32 sum, whose rounding errors add like a random walk, about sqrt(K) float32 unit roundoffs. A
    factor 2 is the margin; a kernel that keeps its running sum in 16 bits fails it only once K is long (about
    2,000 for 16-wide K steps); a short-K check does not catch it.
    """
    return 2 * (unit_roundoff(dtype) + math.sqrt(k) * unit_roundoff(torch.float32))


def random_operands(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device,
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh standard-normal ``M x K`` and ``K x N`` matrices in ``dtype``, the same for the same ``seed``.

    Drawn in float32 on the host from a seeded generator (so a GPU and the CPU draw the same numbers), then
    rounded to ``dtype`` and moved to ``device``.
    """
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn((m, k), generator=generator).to(dtype)
    b = torch.randn((k, n), generator=generator).to(dtype)
    return a.to(device), b.to(device)


def check(matmul: Callable[..., torch.Tensor], m: int, n: int, k: int, dtype: torch.dtype,
          device: torch.device | None = None, seed: int = 0, what: str | None = None) -> float:
    """Run ``matmul(a, b, out=...)`` on fresh random operands and return its relative error against float64.

    The output buffer is filled with NaN first, so an element the kernel never writes fails. Raises an
    AssertionError (naming ``what``) when the error is NaN or above :func:`tolerance`.
    """
    device = device or kernel_mode.device()
    a, b = random_operands(m, n, k, dtype, device, seed)
    out = poisoned((m, n), dtype, device)
    result = matmul(a, b, out=out)
    reference = a.double() @ b.double()  # on the GPU: its float64 units take milliseconds where a CPU takes seconds
    name = what or getattr(matmul, "__module__", "matmul")
    return check_close(result, reference, tolerance(dtype, k), f"{name} at {m} x {n} x {k} {dtype}")
