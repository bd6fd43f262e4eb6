"""Argument checks shared by every public function of gpulab.

Each check raises a ``ValueError`` whose message names the argument, so a notebook reader who
types a bad size or dtype sees what was wrong instead of a stack trace from deep inside torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from gpulab.core import env

# The dtypes the book measures, by the names a reader types in a widget or a parameters cell.
DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "tf32": torch.float32,  # stored as float32; tensor cores round the inputs to 10 mantissa bits
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
# The 8-bit formats of Hopper and Ada tensor cores, where this torch has them. torch stores and converts
# them, but multiplies them only through scaled kernels (torch._scaled_mm), so they are storage formats here.
FP8_DTYPES = tuple(name for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))
DTYPES.update({name: getattr(torch, name) for name in FP8_DTYPES})


def dtype_name(dtype: str | torch.dtype, argument: str = "dtype") -> str:
    """The book's name for ``dtype`` ('float32', 'tf32', ...); raises ValueError naming ``argument`` if unknown."""
    if isinstance(dtype, torch.dtype):
        for name, value in DTYPES.items():
            if value == dtype and name != "tf32":
                return name
    elif dtype in DTYPES:
        return dtype
    raise ValueError(f"{argument}: unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a book dtype name (or a torch dtype, checked)."""
    return DTYPES[dtype_name(dtype)]


def unsupported_reason(dtype: str | torch.dtype, device: torch.device) -> str | None:
    """None if ``device`` computes in ``dtype`` natively; otherwise why not, in a sentence.

    TF32 and bfloat16 arithmetic arrived with Ampere (compute capability 8.0). On older GPUs and on
    CPUs, torch would silently run tf32 as plain float32, and bfloat16 through slow emulation, so a
    measurement would carry the wrong label. A single measurement raises it (:func:`supported_dtype`); a notebook
    leaves such formats out of its sweeps beforehand (:func:`supported_dtypes`).
    """
    label = dtype_name(dtype)
    if label in FP8_DTYPES:
        return (f"{label} is a storage format in this book; torch multiplies it only through scaled kernels "
                "(torch._scaled_mm), not in ordinary arithmetic")
    if label in ("tf32", "bfloat16") and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 0):
            return (f"{label} needs an NVIDIA GPU of compute capability 8.0 or later (Ampere); "
                    f"{torch.cuda.get_device_name(device)} is {major}.{minor}")
    if label == "tf32" and device.type != "cuda":
        return f"tf32 is a tensor-core mode of NVIDIA GPUs (Ampere and later); this device is a {device.type.upper()}"
    return None


def supported_dtypes(dtypes: Sequence[str], device: torch.device | None = None) -> list[str]:
    """The number formats of ``dtypes`` that ``device`` (by default the notebook's) computes in natively: a T4 has
    no tf32 or bfloat16, a CPU no tf32 (:func:`unsupported_reason`)."""
    device = device or env.device()
    return [d for d in dtypes if unsupported_reason(d, device) is None]


def supported_dtype(name: str, dtype: str | torch.dtype, device: torch.device) -> str:
    """The book's name for ``dtype`` if ``device`` computes in it natively; otherwise ValueError naming ``name``
    and saying why (:func:`unsupported_reason`)."""
    label = dtype_name(dtype, name)
    reason = unsupported_reason(label, device)
    if reason is not None:
        raise ValueError(f"{name}: {reason}")
    return label


def positive_int(name: str, value: object) -> int:
    """``value`` as an int if it is a whole number > 0; otherwise ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ValueError(f"{name}: expected a positive whole number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name}: must be > 0, got {value!r}")
    return int(value)


def positive_ints(name: str, values: object) -> list[int]:
    """A non-empty list of positive ints, each checked as ``name``."""
    if isinstance(values, int | float):
        values = [values]
    values = list(values)  # type: ignore[call-overload]
    if not values:
        raise ValueError(f"{name}: expected at least one size, got an empty list")
    return [positive_int(name, v) for v in values]


def available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on ``device``, or None where that cannot be known."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: no cheap way to ask
        return None


class DoesNotFit(ValueError):
    """A size too big for the device's free memory (a sweep draws it as 'out of memory at N')."""


def fits_in_memory(name: str, nbytes: int, device: torch.device, headroom: float = 0.9) -> None:
    """Raise DoesNotFit (a ValueError) naming ``name`` if ``nbytes`` cannot fit in ``device``'s free memory."""
    free = available_memory(device)
    if free is not None and nbytes > headroom * free:
        raise DoesNotFit(
            f"{name}: needs {nbytes / 2**30:.2f} GiB but only {free / 2**30:.2f} GiB is free on "
            f"{device.type}; choose a smaller size"
        )


INT32_MAX = 2**31 - 1  # the book's CUDA C kernels index with C ints


def matmul_operands(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, dtype: torch.dtype) -> tuple[int, int, int]:
    """(m, n, k) of ``C = A @ B`` for a hand-written CUDA C kernel; ValueError naming the operand otherwise.

    A and B must be contiguous 2D ``dtype`` CUDA tensors whose inner sizes agree, C a contiguous float32
    m x n tensor, and every matrix small enough for the kernels' 32-bit int indices.
    """
    for name, t in (("A", A), ("B", B)):
        if t.dtype != dtype or t.dim() != 2 or not t.is_contiguous() or t.device.type != "cuda":
            raise ValueError(f"{name}: a contiguous 2D {dtype_name(dtype)} CUDA tensor, got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")
    (m, k), (k2, n) = A.shape, B.shape
    if k != k2:
        raise ValueError(f"B: A is {m} x {k}, so B needs {k} rows; it has {k2}")
    if max(m * k, k * n, m * n) > INT32_MAX:
        raise ValueError(f"A, B: the kernels index with 32-bit ints; {m} x {k} @ {k} x {n} has too many elements")
    if C.shape != (m, n) or C.dtype != torch.float32 or not C.is_contiguous() or C.device != A.device:
        raise ValueError(f"C: a contiguous float32 tensor of {m} x {n} on {A.device}, got {C.dtype} "
                         f"{tuple(C.shape)} on {C.device}")
    return m, n, k
