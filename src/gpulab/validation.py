"""Argument checks shared by every public function of gpulab.

Each check raises a ``ValueError`` whose message names the argument, so a notebook reader who
types a bad size or dtype sees what was wrong instead of a stack trace from deep inside torch.
"""

from __future__ import annotations

import os

import torch

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


def supported_dtype(name: str, dtype: str | torch.dtype, device: torch.device) -> str:
    """The book's name for ``dtype`` if ``device`` computes in it natively; otherwise ValueError naming ``name``.

    TF32 and bfloat16 arithmetic arrived with Ampere (compute capability 8.0). On older GPUs and on
    CPUs, torch would silently run tf32 as plain float32, and bfloat16 through slow emulation, so a
    measurement would carry the wrong label.
    """
    label = dtype_name(dtype, name)
    if label in FP8_DTYPES:
        raise ValueError(f"{name}: {label} is a storage format in this book; torch multiplies it only through "
                         "scaled kernels (torch._scaled_mm), not in ordinary arithmetic")
    if label in ("tf32", "bfloat16") and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 0):
            raise ValueError(f"{name}: {label} needs an NVIDIA GPU of compute capability 8.0 or later (Ampere); "
                             f"{torch.cuda.get_device_name(device)} is {major}.{minor}")
    if label == "tf32" and device.type != "cuda":
        raise ValueError(f"{name}: tf32 is a tensor-core mode of NVIDIA GPUs (Ampere and later); "
                         f"this device is a {device.type.upper()}")
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
