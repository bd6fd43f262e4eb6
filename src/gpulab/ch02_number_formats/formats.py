"""Chapter 02's tables of formats: the course's table checked against the formats' own limits, rounding a
number into every format, and the sum that stops growing when its increments fall below half a spacing.
"""

from __future__ import annotations

import math

import torch

from gpulab.core.precision import FORMATS, format_of, round_to

# The table of the course's slides {lapenna2022unit11}, as printed (three significant digits), to check
# the derived values against: precision in bits, epsilon, smallest normal number, largest number.
COURSE_TABLE = {
    "bfloat16": {"precision_bits": 8, "epsilon": 7.81e-3, "smallest_normal": 1.18e-38, "largest": 3.40e38},
    "float16": {"precision_bits": 11, "epsilon": 9.77e-4, "smallest_normal": 6.10e-5, "largest": 65504},
    "float32": {"precision_bits": 24, "epsilon": 1.19e-7, "smallest_normal": 1.18e-38, "largest": 3.40e38},
    "float64": {"precision_bits": 53, "epsilon": 2.22e-16, "smallest_normal": 2.23e-308, "largest": 1.79e308},
}


def matches_printed(printed: float, value: float, digits: int = 3) -> bool:
    """Whether ``printed``, a number shown to ``digits`` significant digits, is within one unit of its last digit
    of ``value``: true of a correctly rounded or a truncated print (1.79e308 for 1.797...e308), false of a wrong one.
    """
    if printed == value:
        return True
    unit = 10.0 ** (math.floor(math.log10(abs(printed))) - digits + 1)
    return abs(printed - value) <= unit * (1 + 1e-9)


def stagnation_sum(addend: float, dtype: str | torch.dtype) -> float:
    """The running sum at which adding ``addend`` (> 0, already in the format) stops changing it.

    Round to nearest loses an addition ``s + a`` entirely once ``a`` is at most half the spacing of
    the numbers around ``s``: ``a <= spacing(s) / 2 = s * epsilon / 2`` for ``s`` a power of two.
    So a sum of equal positive terms climbs to the smallest power of two ``P`` with
    ``P * epsilon / 2 >= a`` and stays there (at a tie, ties-to-even keeps the even ``P``).
    """
    fmt = format_of(dtype)
    if not addend > 0:
        raise ValueError(f"addend: must be > 0, got {addend!r}")
    fraction, exponent = math.frexp(addend / fmt.unit_roundoff)  # = fraction * 2^exponent, fraction in [0.5, 1)
    return math.ldexp(1.0, exponent - 1 if fraction == 0.5 else exponent)  # the power of two at or above it


def rounding_table(value: float) -> list[dict]:
    """``value`` as every format stores it: the stored number, its relative error and the spacing there.

    float64 keeps the value as Python holds it; every other format rounds its float32 value (so a
    number that float32 itself rounds at a tie could, rarely, round differently straight from float64).
    """
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"value: expected a number, got {value!r}") from None
    as_float32 = torch.tensor([value], dtype=torch.float64).float()
    rows = []
    for name, fmt in FORMATS.items():
        stored = value if name == "float64" else round_to(as_float32, name).item()
        if math.isnan(value) or math.isinf(value):
            note = ""
        elif math.isinf(stored) or math.isnan(stored):
            note = "overflow"
        elif stored == 0 and value != 0:
            note = "underflow to 0"
        elif 0 < abs(stored) < fmt.smallest_normal:
            note = "subnormal: fewer significant bits"
        elif abs(value) > fmt.largest and math.isfinite(stored):
            note = f"saturated at {fmt.largest:g}"
        else:
            note = ""
        error = abs(stored - value) / abs(value) if value != 0 and math.isfinite(value) else float("nan")
        spacing = fmt.spacing(value) if abs(value) <= fmt.largest else float("nan")  # none beyond the range
        rows.append({"format": name, "stored": stored, "relative_error": error, "spacing": spacing, "note": note})
    return rows


def check_against_finfo() -> list[str]:
    """Hold each storage format's derived epsilon, smallest normal and largest number to ``torch.finfo``'s, exactly;
    AssertionError naming the first that differs. Returns the formats checked (tf32 has no storage type)."""
    checked = []
    for fmt in FORMATS.values():
        if fmt.dtype is None:
            continue
        info = torch.finfo(fmt.dtype)
        if (fmt.epsilon, fmt.smallest_normal, fmt.largest) != (info.eps, info.tiny, info.max):
            raise AssertionError(f"{fmt.name}: derived values differ from torch.finfo")
        checked.append(fmt.name)
    return checked
