"""FP8 matrix multiplication: scales, casts, PyTorch's scaled matrix multiply, its error and its speed.

Hopper's (and Ada's) tensor cores multiply 8-bit floats: e4m3 (3 mantissa bits, largest 448, unit roundoff
2^-4) and e5m2 (2 mantissa bits, largest 57344, unit roundoff 2^-3). So few bits cover little range, so each
operand is *scaled* before the cast: ``scale = fp8 max / amax`` maps the largest magnitude onto the format's
largest value, and the product is multiplied back by the inverse scales. The scale is one number for the
whole tensor (``granularity="tensor"``) or one per row of A and one per column of B (``"row"``, which keeps
rows of very different sizes accurate).

:func:`quantize` gives an operand in FP8 and its inverse scale in the shape ``torch._scaled_mm`` wants (a
singleton for tensor-wise; ``(M, 1)`` for A, ``(1, N)`` for B row-wise); :func:`scaled_matmul` quantizes both
operands and calls ``torch._scaled_mm``, which on a GPU needs A row-major, B column-major, every size a
multiple of 16, a GPU of compute capability 8.9 or later, and not both operands in e5m2 (cuBLAS has no
e5m2 x e5m2 kernel: FP8 training multiplies e5m2 gradients by e4m3 weights, the pair ``("e5m2", "e4m3")``).
In torch 2.13 ``torch._scaled_mm`` also runs on the CPU (a reference implementation, no speed to read).
:func:`emulated_matmul` is the same product computed exactly from the dequantized operands (float64), so
:func:`fp8_error` isolates the error of the format and the scales, beside bfloat16's on the same data.

:func:`fp8_sweep` (GPU only) times, per shape and configuration, bfloat16's ``torch.mm``, the FP8 matmul
alone (operands already quantized) and the whole path (amax, scale, casts and matmul), each checked against
float64 first: the shape at which FP8 starts to pay is where the whole path's speed-up passes 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpulab.core import env, flops, kernel_mode, timing
from gpulab.core.correctness import check_close, relative_error
from gpulab.core.provenance import experiment
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints

FORMATS: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
UNIT_ROUNDOFF = {"e4m3": 2.0**-4, "e5m2": 2.0**-3}  # half the spacing of the numbers in [1, 2)
GRANULARITIES = ("tensor", "row")
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MIN_CAPABILITY = (8, 9)  # Ada (8.9) and Hopper (9.0): the first tensor cores with FP8
MULTIPLE = 16  # torch._scaled_mm on a GPU wants every size a multiple of 16
AMAX_FLOOR = 1e-30  # a smaller (nonzero) amax is taken as this, so the scale stays finite in float32
SWEEP_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
SWEEP_FORMATS = ("e4m3", ("e5m2", "e4m3"))


def fp8_format(fmt: str | torch.dtype, name: str = "fp8_dtype") -> str:
    """The short name ('e4m3' or 'e5m2') of an FP8 format given as a short name, a torch name or a dtype."""
    if isinstance(fmt, torch.dtype):
        for short, dtype in FORMATS.items():
            if dtype == fmt:
                return short
        raise ValueError(f"{name}: {fmt} is no FP8 format of this book; choose one of {', '.join(FORMATS)}")
    if not isinstance(fmt, str):
        raise TypeError(f"{name}: an FP8 format's name ({', '.join(FORMATS)}), got {type(fmt).__name__}")
    short = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}.get(fmt, fmt)
    if short not in FORMATS:
        raise ValueError(f"{name}: unknown FP8 format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return short


def format_pair(fp8_dtype, name: str = "fp8_dtype") -> tuple[str, str]:
    """(format of A, format of B): one format for both, or a pair such as ``("e5m2", "e4m3")``."""
    if isinstance(fp8_dtype, tuple | list):
        if len(fp8_dtype) != 2:
            raise ValueError(f"{name}: one FP8 format, or a pair (format of A, format of B), got {fp8_dtype!r}")
        return fp8_format(fp8_dtype[0], name), fp8_format(fp8_dtype[1], name)
    short = fp8_format(fp8_dtype, name)
    return short, short


def format_label(fp8_dtype) -> str:
    """'e4m3', or 'e5m2 x e4m3' for operands in different formats."""
    fa, fb = format_pair(fp8_dtype)
    return fa if fa == fb else f"{fa} x {fb}"


def _granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    return granularity


def _operand(operand: str) -> str:
    if operand not in ("a", "b"):
        raise ValueError(f"operand: 'a' (row-wise scales per row) or 'b' (per column), got {operand!r}")
    return operand


def _matrix(name: str, tensor: object) -> torch.Tensor:
    """``tensor`` if it is a 2-D tensor of a high-precision floating dtype; TypeError or ValueError otherwise."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name}: a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype in FORMATS.values():
        raise TypeError(f"{name}: already FP8 ({tensor.dtype}); pass the high-precision tensor, which is scaled first")
    if not tensor.is_floating_point():
        raise TypeError(f"{name}: a floating-point tensor, got {tensor.dtype}")
    if tensor.dim() != 2:
        raise ValueError(f"{name}: a 2-D matrix, got {tensor.dim()} dimensions {tuple(tensor.shape)}")
    return tensor


def _operands(a: object, b: object) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M x K) and B (K x N) checked for a scaled matmul: 2-D, inner sizes equal, sizes multiples of 16."""
    a, b = _matrix("a", a), _matrix("b", b)
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"b: a is {m} x {k}, so b needs {k} rows; it has {k2}")
    if a.device != b.device:
        raise ValueError(f"b: on {b.device}, but a is on {a.device}")
    if any(size % MULTIPLE for size in (m, n, k)):
        raise ValueError(f"a, b: torch._scaled_mm wants M, N and K multiples of {MULTIPLE}; got M={m}, N={n}, K={k}")
    return a, b


def fp8_unavailable(device: torch.device) -> str | None:
    """None if ``device`` runs FP8 matmuls; otherwise why not, in a sentence (CPUs run torch's reference)."""
    if device.type != "cuda":
        return None
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"FP8 matmuls need an NVIDIA GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or "
                f"later (Ada, Hopper); {torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}")
    return None


def _amax(tensor: torch.Tensor, granularity: str, operand: str) -> torch.Tensor:
    magnitude = tensor.abs().float()
    if granularity == "tensor":
        return magnitude.amax()
    return magnitude.amax(dim=1, keepdim=True) if operand == "a" else magnitude.amax(dim=0, keepdim=True)


def _scale(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    largest = torch.finfo(FORMATS[fmt]).max
    return torch.where(amax > 0, largest / amax.clamp(min=AMAX_FLOOR), torch.ones_like(amax))


def scale_for(tensor: torch.Tensor, fp8_dtype: str | torch.dtype = "e4m3", granularity: str = "tensor",
              operand: str = "a") -> torch.Tensor:
    """The float32 factor that maps ``tensor``'s largest magnitude onto the FP8 format's largest value.

    Tensor-wise: one number (shape ``()``). Row-wise: one per row of A (``operand="a"``, shape ``(M, 1)``) or
    one per column of B (``operand="b"``, shape ``(1, N)``). An all-zero tensor (or row) gets the scale 1; a
    smaller nonzero amax than 1e-30 is taken as 1e-30, so that the scale stays finite.
    """
    fmt, granularity, operand = fp8_format(fp8_dtype), _granularity(granularity), _operand(operand)
    tensor = _matrix("tensor", tensor)
    if not torch.isfinite(tensor).all():
        raise ValueError("tensor: holds inf or NaN, which no scale maps into an FP8 format")
    return _scale(_amax(tensor, granularity, operand), fmt)


def _quantize(tensor: torch.Tensor, fmt: str, granularity: str, operand: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize` without the argument checks (what the timed path runs: no host synchronization)."""
    scale = _scale(_amax(tensor, granularity, operand), fmt)
    largest = torch.finfo(FORMATS[fmt]).max
    # The clamp makes an overflow saturate in every format and PyTorch version (e5m2 casts it to inf; e4m3fn, which
    # has no inf, to NaN in some versions). .to keeps B's column-major layout (preserve_format).
    quantized = (tensor.float() * scale).clamp(-largest, largest).to(FORMATS[fmt])
    return quantized, scale.reciprocal()


def quantize(tensor: torch.Tensor, fp8_dtype: str | torch.dtype = "e4m3", granularity: str = "tensor",
             operand: str = "a") -> tuple[torch.Tensor, torch.Tensor]:
    """(``tensor`` scaled and cast to FP8, the inverse scale): ``dequantize`` of the pair approximates ``tensor``.

    The inverse scale is float32 in the shape ``torch._scaled_mm`` takes for ``operand``: ``()`` tensor-wise,
    ``(M, 1)`` row-wise for A, ``(1, N)`` row-wise for B (per column). See :func:`scale_for`.
    """
    fmt, granularity, operand = fp8_format(fp8_dtype), _granularity(granularity), _operand(operand)
    scale_for(tensor, fmt, granularity, operand)  # the checks
    return _quantize(tensor, fmt, granularity, operand)


def dequantize(quantized: torch.Tensor, inverse_scale: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The FP8 tensor times its inverse scale, in ``dtype``: what the scaled matmul multiplies."""
    if not isinstance(quantized, torch.Tensor) or quantized.dtype not in FORMATS.values():
        raise TypeError(f"quantized: an FP8 tensor ({', '.join(map(str, FORMATS.values()))}), got "
                        f"{getattr(quantized, 'dtype', type(quantized).__name__)}")
    if not isinstance(inverse_scale, torch.Tensor):
        raise TypeError(f"inverse_scale: a torch.Tensor, got {type(inverse_scale).__name__}")
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    return (quantized.to(compute) * inverse_scale.to(compute)).to(dtype)


def _out_dtype(out_dtype: torch.dtype) -> torch.dtype:
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: one of {', '.join(map(str, OUT_DTYPES))}, got {out_dtype!r}")
    return out_dtype


def column_major(matrix: torch.Tensor) -> torch.Tensor:
    """``matrix`` laid out column by column (a copy unless it already is), as torch._scaled_mm wants B."""
    return matrix if matrix.stride() == (1, matrix.shape[0]) else matrix.t().contiguous().t()


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, fp8_dtype="e4m3", granularity: str = "tensor",
                  out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A @ B through FP8: both operands scaled (:func:`quantize`) and multiplied by ``torch._scaled_mm``.

    ``fp8_dtype``: 'e4m3', 'e5m2', or a pair (format of A, format of B). ``granularity``: 'tensor' or 'row'.
    A stays row-major; B is made column-major unless it already is (a Linear layer's weight, transposed, is).
    On a GPU: compute capability 8.9 or later, and not both operands in e5m2.
    """
    a, b = _operands(a, b)
    fa, fb = format_pair(fp8_dtype)
    granularity, out_dtype = _granularity(granularity), _out_dtype(out_dtype)
    reason = fp8_unavailable(a.device)
    if reason is not None:
        raise ValueError(f"a: {reason}")
    if a.device.type == "cuda" and fa == fb == "e5m2":
        raise ValueError("fp8_dtype: cuBLAS has no e5m2 x e5m2 FP8 matmul; use ('e5m2', 'e4m3') (gradients in e5m2 "
                         "times weights in e4m3, as FP8 training does)")
    qa, inverse_a = _quantize(a, fa, granularity, "a")
    qb, inverse_b = _quantize(b, fb, granularity, "b")
    return torch._scaled_mm(qa, column_major(qb), scale_a=inverse_a, scale_b=inverse_b, out_dtype=out_dtype)


def emulated_matmul(a: torch.Tensor, b: torch.Tensor, fp8_dtype="e4m3", granularity: str = "tensor") -> torch.Tensor:
    """The FP8 product computed exactly (float64) from the dequantized operands: the error of the formats and the
    scales alone, without the tensor cores' accumulation and output rounding. Any device, same checks."""
    a, b = _operands(a, b)
    fa, fb = format_pair(fp8_dtype)
    granularity = _granularity(granularity)
    qa, inverse_a = _quantize(a, fa, granularity, "a")
    qb, inverse_b = _quantize(b, fb, granularity, "b")
    return dequantize(qa, inverse_a, torch.float64) @ dequantize(qb, inverse_b, torch.float64)


def spread_operands(m: int, n: int, k: int, seed: int = 0, spread: float = 0.0,
                    dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard-normal A (M x K) and B (K x N) from a seeded generator, each row of A and each column of B
    multiplied by 10^u with u uniform in [-spread, spread] (rows of very different sizes when spread > 0)."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn((m, k), generator=generator, dtype=torch.float64)
    b = torch.randn((k, n), generator=generator, dtype=torch.float64)
    if spread:
        a = a * 10.0 ** ((2 * torch.rand((m, 1), generator=generator, dtype=torch.float64) - 1) * spread)
        b = b * 10.0 ** ((2 * torch.rand((1, n), generator=generator, dtype=torch.float64) - 1) * spread)
    return a.to(dtype), b.to(dtype)


def _row_errors(actual: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """The relative error of each row: what a tensor-wise scale does to the small rows, which the overall
    (Frobenius) error, made of the large rows, hardly shows."""
    reference = reference.double()
    norms = torch.linalg.vector_norm(reference, dim=1).clamp(min=torch.finfo(torch.float64).tiny)
    return torch.linalg.vector_norm(actual.double() - reference, dim=1) / norms


def fp8_error(m: int, n: int, k: int, fp8_dtype="e4m3", granularity: str = "tensor", seed: int = 0,
              spread: float = 0.0) -> dict:
    """Relative error (Frobenius; per row, mean and worst) of the FP8 product against float64, beside bfloat16's.

    Both products are emulated on the host in float64 from the rounded operands (:func:`emulated_matmul`; for
    bfloat16, the operands rounded to bfloat16), so the numbers compare the formats and the scales only.
    ``spread``: rows of A and columns of B scaled by up to 10^±spread (:func:`spread_operands`).
    """
    m, n, k = positive_int("m", m), positive_int("n", n), positive_int("k", k)
    if not isinstance(spread, int | float) or spread < 0:
        raise ValueError(f"spread: a number >= 0 (powers of ten), got {spread!r}")
    a, b = spread_operands(m, n, k, seed, spread)
    reference = a.double() @ b.double()
    fp8 = emulated_matmul(a, b, fp8_dtype, granularity)
    bf16 = a.to(torch.bfloat16).double() @ b.to(torch.bfloat16).double()
    return {"m": m, "n": n, "k": k, "format": format_label(fp8_dtype), "granularity": granularity,
            "spread": spread, "fp8_error": relative_error(fp8, reference),
            "bfloat16_error": relative_error(bf16, reference),
            **{f"{name}_{kind}_row_error": getattr(_row_errors(product, reference), kind)().item()
               for name, product in (("fp8", fp8), ("bfloat16", bf16)) for kind in ("mean", "max")}}


def _sweep_arguments(sizes, formats, granularities) -> tuple[list[int], list, list[str]]:
    sizes = positive_ints("sizes", sizes)
    odd = [s for s in sizes if s % MULTIPLE]
    if odd:
        raise ValueError(f"sizes: torch._scaled_mm wants multiples of {MULTIPLE}, got {odd}")
    formats = [formats] if isinstance(formats, str | torch.dtype) else list(formats)
    if not formats:
        raise ValueError("formats: at least one FP8 format (or pair of formats)")
    for fmt in formats:
        format_pair(fmt, "formats")
    if isinstance(granularities, str):
        granularities = [granularities]
    granularities = list(granularities)
    if not granularities or any(g not in GRANULARITIES for g in granularities):
        raise ValueError(f"granularities: some of {', '.join(GRANULARITIES)}, got {granularities!r}")
    return sizes, formats, granularities


def _time(run, n: int, device: torch.device) -> dict:
    t = timing.measure(run, device=device, warmup=10, target_s=0.5)
    return {"seconds": t.median_s, "spread": t.spread, "tflops": flops.gemm(n, n, n).flops / t.median_s / 1e12}


@experiment("fp8_matmul")
def fp8_sweep(sizes: Sequence[int] = SWEEP_SIZES, formats: Sequence = SWEEP_FORMATS,
              granularities: Sequence[str] = GRANULARITIES) -> list[dict]:
    """bfloat16 against FP8 at n x n x n for each of ``sizes``, FP8 format (or pair) and scale granularity.

    Per size, bfloat16's ``torch.mm`` and then each FP8 configuration are checked against the float64 product
    of the same bfloat16 operands (a failed check raises), then timed: the FP8 matmul alone (operands already
    quantized), the quantization alone (amax, scale and cast of both operands) and the whole path. A row gives
    their TFLOP/s (2 n^3 over each time), the speed-ups over bfloat16 and the share of the path spent
    quantizing. A configuration that torch refuses on this GPU gives a row with its ``unsupported`` message.
    GPU only (compute capability 8.9 or later).
    """
    sizes, formats, granularities = _sweep_arguments(sizes, formats, granularities)
    kernel_mode.require_gpu("fp8_sweep")
    device = env.device()
    reason = fp8_unavailable(device)
    if reason is not None:
        raise ValueError(f"fp8_sweep: {reason}")
    rows = []
    for n in sizes:
        fits_in_memory("sizes", n * n * (3 * 2 + 2 + 3 * 8), device)  # A, B, C; the FP8 copies; float64 check
        generator = torch.Generator().manual_seed(n)
        a = torch.randn((n, n), generator=generator).to(torch.bfloat16).to(device)
        b = torch.randn((n, n), generator=generator).to(torch.bfloat16).to(device).t()  # column-major, as W.t()
        reference = a.double() @ b.double()
        c = torch.empty((n, n), dtype=torch.bfloat16, device=device)
        bf16_error = check_close(torch.mm(a, b, out=c), reference, 1e-2, f"bfloat16 torch.mm at {n}^3")
        base = _time(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), n, device)
        common = {"n": n, "device": torch.cuda.get_device_name(device), "bfloat16_tflops": base["tflops"],
                  "bfloat16_seconds": base["seconds"], "bfloat16_error": bf16_error}
        for fmt in formats:
            fa, fb = format_pair(fmt)
            for granularity in granularities:
                label = {**common, "format": format_label(fmt), "granularity": granularity}
                try:
                    result = scaled_matmul(a, b, fmt, granularity)
                except (RuntimeError, ValueError) as refused:
                    rows.append({**label, "unsupported": str(refused).splitlines()[0]})
                    continue
                error = check_close(result, reference, UNIT_ROUNDOFF[fa] + UNIT_ROUNDOFF[fb],
                                    f"FP8 {label['format']} {granularity}-wise at {n}^3")
                qa, inverse_a = _quantize(a, fa, granularity, "a")
                qb, inverse_b = _quantize(b, fb, granularity, "b")
                qb = column_major(qb)

                def matmul(qa=qa, qb=qb, inverse_a=inverse_a, inverse_b=inverse_b):
                    return torch._scaled_mm(qa, qb, scale_a=inverse_a, scale_b=inverse_b, out_dtype=torch.bfloat16)

                def casts(a=a, b=b, fa=fa, fb=fb, granularity=granularity):
                    return _quantize(a, fa, granularity, "a"), _quantize(b, fb, granularity, "b")

                def path(a=a, b=b, fmt=fmt, granularity=granularity):
                    return scaled_matmul(a, b, fmt, granularity)

                alone, quantizing, whole = _time(matmul, n, device), _time(casts, n, device), _time(path, n, device)
                rows.append({**label, "relative_error": error, "error_vs_bfloat16": error / bf16_error,
                             "fp8_tflops": alone["tflops"], "fp8_seconds": alone["seconds"],
                             "fp8_spread": alone["spread"], "path_tflops": whole["tflops"],
                             "path_seconds": whole["seconds"], "path_spread": whole["spread"],
                             "quantize_seconds": quantizing["seconds"],
                             "quantize_share": quantizing["seconds"] / whole["seconds"],
                             "speedup_matmul": base["seconds"] / alone["seconds"],
                             "speedup_path": base["seconds"] / whole["seconds"]})
        del a, b, c, reference
    return rows
