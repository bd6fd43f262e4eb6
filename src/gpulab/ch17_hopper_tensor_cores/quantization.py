"""What chapter 17 computes about FP8 on any machine: the two formats (from ``torch.finfo``), the error of the
scaled product against float64 beside bfloat16's (emulated on the host, :func:`gpulab.kernels.fp8.fp8_error`), and
what one call of :func:`gpulab.kernels.fp8.scaled_matmul` does to memory before the matmul starts
(:func:`quantize_operations`: every PyTorch operation of the quantization, with the bytes it reads and writes).

The operations are counted by running the quantization once on small CPU tensors under a dispatch mode that sees
every ATen operation, the same operations that eager PyTorch launches as one GPU kernel each. So the count follows
the code of :mod:`gpulab.kernels.fp8`, not a model of it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpulab.core.validation import positive_int
from gpulab.kernels import fp8

COMPARED = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")  # the formats the table sets side by side
COUNT_SIZE = 64  # the operands' side when the operations are counted (a larger matrix gives the same per element)
BF16_BYTES, FP8_BYTES = 2, 1
# The fewest bytes per element a current-scaling quantization can move: read the bfloat16 operand once for its amax
# and once more to cast it, write one byte; a delayed scale (known before the pass) saves the first read.
LEAST_BYTES = {"current scaling": 2 * BF16_BYTES + FP8_BYTES, "delayed scaling": BF16_BYTES + FP8_BYTES}


def format_rows(names: Sequence[str] = COMPARED) -> list[dict]:
    """Bits, range and precision of each floating-point format of ``names`` (torch dtype names), all read from
    ``torch.finfo``: the fraction bits from epsilon, the exponent bits from the rest."""
    rows = []
    for name in names:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"names: torch floating-point dtype names, got {name!r}")
        info = torch.finfo(dtype)
        fraction = round(-math.log2(info.eps))
        smallest = info.smallest_normal * info.eps  # the smallest subnormal: one unit in the last place below 1
        rows.append({"format": name.replace("float8_", "").replace("fn", ""), "dtype": name, "bits": info.bits,
                     "exponent_bits": info.bits - 1 - fraction, "fraction_bits": fraction, "max": info.max,
                     "smallest_normal": info.smallest_normal, "smallest_subnormal": smallest,
                     "unit_roundoff": info.eps / 2, "binades": math.log2(info.max / smallest)})
    return rows


class _Operations(TorchDispatchMode):
    """Every ATen operation run inside the mode, with the bytes of its tensor arguments and results."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        self.seen.append((str(func.overloadpacket.__name__), sum(t.numel() * t.element_size() for t in inputs),
                          sum(t.numel() * t.element_size() for t in outputs)))
        return result


def quantize_operations(fp8_dtype="e4m3", granularity: str = "tensor", n: int = COUNT_SIZE) -> list[dict]:
    """The operations of quantizing one bfloat16 ``n x n`` operand (A, scaled per row when row-wise) as
    :func:`gpulab.kernels.fp8.scaled_matmul` does it, in order: each with the bytes it reads and writes per element
    of the operand. Each is one GPU kernel in eager PyTorch."""
    n = positive_int("n", n)
    fmt = fp8.fp8_format(fp8_dtype)
    if granularity not in fp8.GRANULARITIES:
        raise ValueError(f"granularity: one of {', '.join(fp8.GRANULARITIES)}, got {granularity!r}")
    operand = torch.randn((n, n), generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with _Operations() as seen:
        fp8._quantize(operand, fmt, granularity, "a")
    return [{"operation": name, "read_bytes": read / n**2, "written_bytes": written / n**2,
             "bytes": (read + written) / n**2, "whole_tensor": max(read, written) >= n * n}
            for name, read, written in seen.seen]


@functools.cache
def quantize_traffic(fp8_dtype="e4m3", granularity: str = "tensor") -> dict:
    """How much one quantized operand costs: the operations (GPU kernels) and the bytes per element they move,
    against the fewest a fused cast needs (:data:`LEAST_BYTES`). Counted once per process (the plan asks often)."""
    operations = quantize_operations(fp8_dtype, granularity)
    moved = sum(op["bytes"] for op in operations)
    return {"operations": len(operations), "whole_tensor_passes": sum(op["whole_tensor"] for op in operations),
            "bytes_per_element": moved, **{f"least_{k.split()[0]}": v for k, v in LEAST_BYTES.items()}}


def error_rows(m: int, n: int, k: int, spreads: Sequence[float] = (0.0, 3.0), seed: int = 0) -> list[dict]:
    """The error of each FP8 format (and pair) with each scale granularity against float64, beside bfloat16's, on
    ``m x k`` by ``k x n`` operands whose rows and columns are spread over 10^±spread
    (:func:`gpulab.kernels.fp8.fp8_error`, emulated exactly on the host, so any machine runs it)."""
    rows = []
    for spread in spreads:
        for fmt in ("e4m3", ("e5m2", "e4m3"), "e5m2"):
            for granularity in fp8.GRANULARITIES:
                rows.append(fp8.fp8_error(m, n, k, fmt, granularity, seed=seed, spread=spread))
    return rows


def error_ratio_model(fmt_a: str = "e5m2", fmt_b: str = "e4m3", base: str = "e4m3") -> float:
    """The error of an ``fmt_a`` x ``fmt_b`` product over a ``base`` x ``base`` one, if each operand's rounding
    errors are independent and scale with its unit roundoff: sqrt(u_a^2 + u_b^2) / sqrt(2 u_base^2)."""
    u = {name: fp8.UNIT_ROUNDOFF[fp8.fp8_format(name)] for name in (fmt_a, fmt_b, base)}
    return math.sqrt(u[fmt_a] ** 2 + u[fmt_b] ** 2) / math.sqrt(2 * u[base] ** 2)


# ---- reading the fp8_matmul recordings -----------------------------------------------------------------------------

COPY_EXPERIMENT = "blas_ceilings"  # where each GPU's copy rate was measured (chapter 03's ceilings)


def config_label(row: dict) -> str:
    """'e4m3, tensor-wise' for a row of :func:`gpulab.kernels.fp8.fp8_sweep`."""
    return f"{row['format']}, {row['granularity']}-wise"


def measured_rows(rows: Sequence[dict]) -> list[dict]:
    """The rows of a configuration that ran (a refused one carries 'unsupported' instead of times)."""
    return [r for r in rows if "unsupported" not in r and "speedup_path" in r]


def quantized_bytes(row: dict) -> float:
    """The bytes that quantizing both operands of ``row`` moved: the operations :func:`quantize_operations` counts,
    per element of an operand, times the two n x n operands."""
    fmt_a, fmt_b = fp8.format_pair(tuple(row["format"].split(" x ")) if " x " in row["format"] else row["format"])
    per_element = (quantize_traffic(fmt_a, row["granularity"])["bytes_per_element"]
                   + quantize_traffic(fmt_b, row["granularity"])["bytes_per_element"])
    return per_element * row["n"] ** 2


def quantize_gbytes_per_s(row: dict) -> float:
    """The rate at which the quantization of ``row`` moved its counted bytes, in GB/s."""
    return quantized_bytes(row) / row["quantize_seconds"] / 1e9


def copy_gbytes_per_s(run) -> float:
    """The device copy's rate (reads and writes, GB/s) that the GPU of ``run`` reached in its
    :data:`COPY_EXPERIMENT` recording; KeyError where there is none."""
    from gpulab.core.claims import same_gpu

    ceilings = same_gpu(run, COPY_EXPERIMENT)
    return next(r["gbytes_per_s"] for r in ceilings.rows if r.get("ceiling") == "bandwidth")


def pays_from(rows: Sequence[dict], key: str, at_least: float = 1.0) -> int | None:
    """The smallest n of ``rows`` from which on, at every larger n too, every configuration's ``key`` (a speed-up
    over bfloat16) is at least ``at_least``; None where the largest n does not get there."""
    sizes = sorted({r["n"] for r in rows})
    found = None
    for n in reversed(sizes):
        if all(r[key] >= at_least for r in rows if r["n"] == n):
            found = n
        else:
            break
    return found
