"""Number formats: their bit layouts, the numbers those layouts imply, rounding to them, and matmul modes.

A binary floating-point number is ``(-1)^s * 1.f * 2^(E - bias)``: one sign bit ``s``, an exponent
field ``E`` of ``exponent_bits`` and a fraction ``f`` of ``mantissa_bits`` stored bits (the leading 1
is implicit for normal numbers). Everything else in the book's table of formats -- epsilon, the
smallest and largest numbers, the decimal digits -- follows from those two counts and is computed
here from them, never typed in; the unit tests check the results against ``torch.finfo``.

TF32 is not a storage type: it is the arithmetic of NVIDIA tensor cores (Ampere and later) on
float32 data, which round the inputs of a matmul or convolution to 10 fraction bits and accumulate
in float32. :func:`matmul_mode` switches it on for a block; :func:`round_to` emulates its rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from gpulab.core.validation import DTYPES, dtype_name


@contextmanager
def matmul_mode(dtype: str | torch.dtype) -> Iterator[torch.dtype]:
    """Within the block, float32 GEMMs use TF32 if and only if ``dtype == 'tf32'``; yields the torch dtype.

    That holds for cuBLAS matmuls and for cuDNN's convolutions and RNNs alike. The two have separate
    switches with different defaults: torch lets cuDNN use TF32 unless told not to, so without this a
    float32 convolution or ``nn.LSTM`` would silently run on the tensor cores.
    """
    name = dtype_name(dtype)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = name == "tf32"
    try:
        yield torch.float32 if name == "tf32" else getattr(torch, name)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextmanager
def float32_accumulation() -> Iterator[None]:
    """Within the block, cuBLAS sums float16 and bfloat16 matmuls in float32 all the way.

    By default torch lets cuBLAS add partial sums of a split reduction in the inputs' own 16-bit
    format when that is faster; an experiment that claims float32 accumulation must forbid it.
    """
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_fp16_reduced_precision_reduction = matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction = saved


# Relative error a correct matmul of random normal data stays under, per arithmetic (against float64).
MATMUL_TOLERANCE = {"float64": 1e-12, "float32": 1e-4, "tf32": 5e-3, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass(frozen=True)
class Format:
    """A binary floating-point format, given by its bit counts; every number below is derived from them."""

    name: str
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits: the leading 1 of a normal number is implicit
    dtype: torch.dtype | None  # the torch storage dtype; None for tf32, a tensor-core mode on float32 data
    infinities: bool = True
    """True for IEEE 754 layouts, where the all-ones exponent field is kept for infinity and NaN. False
    for float8_e4m3fn (the "fn" is for *finite, NaN*): it has no infinities, so the all-ones exponent
    holds ordinary numbers, and only its all-ones fraction (S.1111.111) is NaN. That buys one binade
    more range: the largest number is 1.110b * 2^8 = 448 instead of 1.111b * 2^7 = 240."""

    @property
    def bits(self) -> int:
        """Sign, exponent and fraction bits: 19 for tf32, although it is stored in 32."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def storage_bits(self) -> int:
        """Bits one number occupies in memory: tf32 lives in a float32 word whose lowest 13 bits it ignores."""
        return torch.finfo(self.dtype).bits if self.dtype is not None else 32

    @property
    def precision_bits(self) -> int:
        """Significant bits of a normal number, the implicit leading 1 included (the course's 'precision')."""
        return self.mantissa_bits + 1

    @property
    def bias(self) -> int:
        """The stored exponent field minus the bias is the power of two."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def epsilon(self) -> float:
        """The gap between 1 and the next number: 2^-mantissa_bits (torch.finfo's ``eps``)."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def unit_roundoff(self) -> float:
        """The largest relative error of rounding to nearest, epsilon / 2 (for results in the normal range)."""
        return self.epsilon / 2

    @property
    def smallest_normal(self) -> float:
        """1.0 * 2^(1 - bias): the smallest number with full precision (torch.finfo's ``tiny``)."""
        return math.ldexp(1.0, 1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        """0.00...1 * 2^(1 - bias): below it, and above half of it, everything rounds to zero or to it."""
        return math.ldexp(1.0, 1 - self.bias - self.mantissa_bits)

    @property
    def max_exponent(self) -> int:
        """The power of two of the largest binade: the all-ones exponent field counts only without infinities."""
        top_field = 2**self.exponent_bits - (2 if self.infinities else 1)
        return top_field - self.bias

    @property
    def largest(self) -> float:
        """The largest finite number: the largest fraction in the top binade (torch.finfo's ``max``).

        With infinities that fraction is all ones, 1.11...1b = 2 - epsilon. Without (float8_e4m3fn)
        the all-ones fraction of the top binade is NaN, so the largest is one step below, 2 - 2 epsilon.
        """
        ones = 2**self.precision_bits - (1 if self.infinities else 2)  # the significand as an integer
        return math.ldexp(float(ones), self.max_exponent - self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """-log10(epsilon): how many decimal digits the format resolves (the course rounds it: bf16 ~2, fp16 ~3)."""
        return -math.log10(self.epsilon)

    def spacing(self, x: float) -> float:
        """The gap between adjacent numbers of the format around ``|x|`` (the 'ulp'); constant below the normals."""
        x = abs(float(x))
        if x < self.smallest_normal:
            return self.smallest_subnormal
        return math.ldexp(self.epsilon, math.frexp(x)[1] - 1)  # frexp: x = m * 2^e with m in [0.5, 1)


def _formats() -> dict[str, Format]:
    layouts = {  # name: (exponent bits, fraction bits, IEEE-style infinities)
        "float64": (11, 52, True),
        "float32": (8, 23, True),
        "tf32": (8, 10, True),
        "float16": (5, 10, True),
        "bfloat16": (8, 7, True),
        "float8_e4m3fn": (4, 3, False),
        "float8_e5m2": (5, 2, True),
    }
    return {name: Format(name, e, m, None if name == "tf32" else DTYPES[name], inf)
            for name, (e, m, inf) in layouts.items() if name in DTYPES}  # fp8 only where torch has it


FORMATS: dict[str, Format] = _formats()
"""The book's number formats by dtype name, widest first: float64, float32, tf32, float16, bfloat16, fp8."""


def format_of(dtype: str | torch.dtype, argument: str = "dtype") -> Format:
    """The :class:`Format` of a book dtype name (or torch dtype); ValueError naming ``argument`` if unknown."""
    return FORMATS[dtype_name(dtype, argument)]


def round_to(x: torch.Tensor, dtype: str | torch.dtype, *, truncate: bool = False) -> torch.Tensor:
    """The float32 values of ``x`` rounded to the precision and range of ``dtype``, returned as float32.

    Rounding is to nearest, ties to even, as in IEEE 754. Formats that share float32's 8-bit exponent
    (tf32, bfloat16) are rounded on the bits: of the 23 stored fraction bits, the lowest
    ``23 - mantissa_bits`` are rounded away in the int32 view. This is how TF32 is emulated without a
    tensor core. ``truncate=True`` drops those bits instead (round toward zero), which is what a
    tensor core does if it simply ignores them. Other formats are converted to their torch dtype and
    back (torch's conversions round to nearest even; note that its float8_e4m3fn conversion saturates
    at 448 instead of giving NaN). NaN and infinities pass through unchanged.
    """
    fmt = format_of(dtype)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise ValueError(f"x: expected a float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if fmt.exponent_bits == 8 and fmt.mantissa_bits < 23:
        return _round_fraction_bits(x, 23 - fmt.mantissa_bits, truncate)
    if truncate:
        raise ValueError(f"truncate: only formats with float32's exponent (tf32, bfloat16) can truncate, "
                         f"not {fmt.name}")
    if fmt.mantissa_bits >= 23:  # float32 and float64 hold every float32 exactly
        return x.clone()
    return x.to(fmt.dtype).to(torch.float32)


def _round_fraction_bits(x: torch.Tensor, dropped: int, truncate: bool) -> torch.Tensor:
    """Round away the lowest ``dropped`` fraction bits of float32 ``x``, to nearest even (or toward zero)."""
    bits = x.view(torch.int32)
    sign = bits & torch.iinfo(torch.int32).min  # 0x80000000
    magnitude = bits & 0x7FFFFFFF  # finite values stay below 0x7F800000, so adding below cannot overflow
    if not truncate:
        # Add half a unit of the kept last place, less one unless that kept bit is 1 (odd): a tie then
        # carries into it only when it would otherwise stay odd -- ties to even. A carry out of the
        # fraction raises the exponent, exactly as rounding up 1.11..1 * 2^e to 1.0 * 2^(e+1) should.
        kept_last_bit = (magnitude >> dropped) & 1
        magnitude = magnitude + (1 << (dropped - 1)) - 1 + kept_last_bit
    magnitude = magnitude & ~((1 << dropped) - 1)
    rounded = (sign | magnitude).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)
