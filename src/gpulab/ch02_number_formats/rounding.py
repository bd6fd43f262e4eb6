"""The number-formats chapter's experiments: what rounding to 16 bits does to sums, softmax and matmuls.

Each experiment returns rows (one dict per measurement) so that a GPU run can be recorded, and
compares every result with float64 arithmetic on the same inputs:

- :func:`summation_error`: n equal small terms added up in different formats and orders;
- :func:`softmax_overflow`: softmax of logits of growing size, computed naively and safely;
- :func:`matmul_error`: the relative error of C = A B in float32, TF32 (real and emulated), float16
  and bfloat16;
- :func:`sixteen_bit_evidence`: which operations keep their accuracy in 16 bits and which need
  float32 accumulation, float32 range or float32 storage.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

from gpulab.ch02_number_formats.formats import stagnation_sum
from gpulab.core import env
from gpulab.core.correctness import check_close, random_tensor, relative_error
from gpulab.core.precision import FORMATS, MATMUL_TOLERANCE, float32_accumulation, format_of, matmul_mode, round_to
from gpulab.core.provenance import experiment
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, supported_dtype

SUM_METHODS = {  # label: (format of the data, format of the running sum, order)
    "float16 running sum": ("float16", "float16", "sequential"),
    "bfloat16 running sum": ("bfloat16", "bfloat16", "sequential"),
    "float32 running sum of float16 data": ("float16", "float32", "sequential"),
    "float16 pairwise": ("float16", "float16", "pairwise"),
    "torch.sum of float16 data": ("float16", "float16", "library"),
}


def running_sum(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x[0] + x[1] + ... one term at a time into one accumulator of ``dtype``, rounded after every addition.

    ``index_add_`` with every index 0 does exactly ``out[0] += x[i]`` for each i (on a GPU with atomic
    adds, in no fixed order). ``torch.cumsum`` would not do: it carries its running sum in a wider type.
    """
    out = torch.zeros(1, dtype=dtype, device=x.device)
    return out.index_add_(0, torch.zeros(x.numel(), dtype=torch.long, device=x.device), x.to(dtype))[0]


def pairwise_sum(x: torch.Tensor) -> torch.Tensor:
    """Add neighbours in pairs, then the pair sums in pairs, ...: log2(n) rounds, all in x's own dtype."""
    while x.numel() > 1:
        if x.numel() % 2:
            x = torch.cat([x, x.new_zeros(1)])
        x = x[0::2] + x[1::2]
    return x[0]


def measure_sum(n: int, method: str, addend: float = 1e-4, device: torch.device | None = None) -> dict:
    """Add ``n`` copies of ``addend`` by ``method`` (a key of SUM_METHODS); the relative error of the total.

    The exact total is n times the addend as the data format stores it, so the error is the
    summation's alone, not that of storing the addend.
    """
    if method not in SUM_METHODS:
        raise ValueError(f"method: unknown summation {method!r}; choose one of {', '.join(SUM_METHODS)}")
    n = positive_int("n", n)
    if not 0 < addend < 1:
        raise ValueError(f"addend: expected a small positive number below 1, got {addend!r}")
    device = device or env.device()
    data_format, sum_format, order = SUM_METHODS[method]
    fits_in_memory("n", n * (2 + 4 + 8), device)  # the data, a float32 copy, the int64 indices
    x = torch.full((n,), addend, dtype=FORMATS[data_format].dtype, device=device)
    stored = x[0].item()
    if order == "sequential":
        total = running_sum(x, FORMATS[sum_format].dtype)
    elif order == "pairwise":
        total = pairwise_sum(x)
    else:
        total = torch.sum(x)  # float16 in and out; torch adds in float32 inside, in blocks
    exact = n * stored  # a product of integers and a 11-bit significand: exact in float64
    value = total.item()
    return {"sum": value, "exact": exact, "relative_error": abs(value - exact) / exact,
            "data_format": data_format, "sum_format": sum_format, "order": order, "addend": stored}


def random_sum_errors(sizes: Sequence[int], formats: Sequence[str] = ("float32", "bfloat16", "float16"),
                      repeats: int = 5, seed: int = 0) -> list[dict]:
    """Running sums of n random numbers from [0, 1), kept in each format: the median relative error of ``repeats``.

    The data is stored in the format first and the exact total is its float64 sum, so the error is
    the summation's alone. ``stagnated`` marks sums that grew so large (u times the total at least
    1/2) that each addition loses much of its term: past that point no sqrt(n) law holds.
    """
    sizes, repeats = positive_ints("sizes", sizes), positive_int("repeats", repeats)
    device = env.device()
    generator = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for name in formats:
        fmt = format_of(name, argument="formats")
        for n in sizes:
            fits_in_memory("sizes", n * (4 + 8 + 8), device)  # the data, a float64 copy, the int64 indices
            errors, totals = [], []
            for _ in range(repeats):
                x = torch.rand(n, generator=generator, device=device).to(fmt.dtype)
                exact = x.double().sum().item()
                errors.append(abs(running_sum(x, fmt.dtype).item() - exact) / exact)
                totals.append(exact)
            total = statistics.median(totals)
            rows.append({"dtype": name, "n": n, "relative_error": statistics.median(errors), "exact": total,
                         "stagnated": fmt.unit_roundoff * total >= 0.5})
    return rows


def summation_theory(sizes: Sequence[int], addend: float = 1e-4) -> list[dict]:
    """What rounding predicts for :func:`summation_error`, as rows to draw beside it.

    - a running sum in a 16-bit format stalls at :func:`gpulab.ch02_number_formats.formats.stagnation_sum` ``P``, so
      past ``n = P / addend`` its relative error is ``1 - P / (n * addend)``;
    - a running sum of n terms can be off by up to (n - 1) u (Higham's bound; u = epsilon / 2), drawn
      for float32, which is still far from stalling; errors that were random, half up and half down,
      would instead grow like sqrt(n) u;
    - pairwise summation by at most ceil(log2 n) u, drawn for float16.

    Each row names the summation ``method`` it describes, so that a figure can draw it in that colour.
    """
    sizes = positive_ints("sizes", sizes)
    rows = []
    for name in ("float16", "bfloat16"):
        stored = round_to(torch.tensor([addend]), name).item()
        stall = stagnation_sum(stored, name)
        rows += [{"n": n, "line": f"{name} stalls at {stall:g}", "method": f"{name} running sum",
                  "relative_error": 1 - stall / (n * stored)} for n in sizes if n * stored > stall]
    u32, u16 = FORMATS["float32"].unit_roundoff, FORMATS["float16"].unit_roundoff
    float32_sum = "float32 running sum of float16 data"
    rows += [{"n": n, "line": "bound (n-1) u, float32 running sum", "method": float32_sum,
              "relative_error": (n - 1) * u32} for n in sizes]
    rows += [{"n": n, "line": "random errors sqrt(n) u, float32", "method": float32_sum,
              "relative_error": math.sqrt(n) * u32} for n in sizes]
    rows += [{"n": n, "line": "bound log2(n) u, float16 pairwise", "method": "float16 pairwise",
              "relative_error": math.ceil(math.log2(n)) * u16} for n in sizes if n > 1]
    return rows


@experiment("formats_summation")
def summation_error(sizes: Sequence[int], addend: float = 1e-4,
                    methods: Sequence[str] = tuple(SUM_METHODS)) -> list[dict]:
    """Every summation method at every n: the sum of n copies of ``addend`` against the exact total."""
    sizes = positive_ints("sizes", sizes)
    for method in methods:
        if method not in SUM_METHODS:
            raise ValueError(f"methods: unknown summation {method!r}; choose from {', '.join(SUM_METHODS)}")
    return run_sweep(measure_sum, [{"n": n, "method": m, "addend": addend} for m in methods for n in sizes])





SOFTMAX_METHODS = {  # label: (format, how)
    "naive float16": ("float16", "naive"),
    "naive bfloat16": ("bfloat16", "naive"),
    "naive float32": ("float32", "naive"),
    "max-subtracted float16": ("float16", "max-subtracted"),
    "torch.softmax float16": ("float16", "library"),
}
OK, ZEROS, NOT_FINITE = "ok", "rows of zeros", "NaN or inf"


def _softmax(x: torch.Tensor, how: str) -> torch.Tensor:
    """Softmax along the last dimension, in x's own dtype."""
    if how == "naive":  # the formula as written: exp, then divide by the sum
        e = torch.exp(x)
        return e / e.sum(dim=-1, keepdim=True)
    if how == "max-subtracted":  # softmax(x) = softmax(x - c) for any c; c = max makes every exponent <= 0
        e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
        return e / e.sum(dim=-1, keepdim=True)
    return torch.softmax(x, dim=-1)


def measure_softmax(largest_logit: float, method: str, classes: int = 1000, batch: int = 64,
                    device: torch.device | None = None, seed: int = 0) -> dict:
    """Softmax of ``batch`` rows of ``classes`` logits whose largest is ``largest_logit``, by ``method``.

    The logits are standard normal, shifted so that each row's largest is exactly ``largest_logit``:
    softmax ignores such a shift, so only the size of the numbers changes, not the answer. The
    reference is float64 softmax of the same logits after rounding them to the method's format.
    """
    if method not in SOFTMAX_METHODS:
        raise ValueError(f"method: unknown softmax {method!r}; choose one of {', '.join(SOFTMAX_METHODS)}")
    classes, batch = positive_int("classes", classes), positive_int("batch", batch)
    if not math.isfinite(largest_logit):
        raise ValueError(f"largest_logit: expected a finite number, got {largest_logit!r}")
    device = device or env.device()
    name, how = SOFTMAX_METHODS[method]
    generator = torch.Generator(device=device).manual_seed(seed)
    z = random_tensor((batch, classes), torch.float32, device, generator)
    x = (z - z.max(dim=-1, keepdim=True).values + largest_logit).to(FORMATS[name].dtype)
    reference = torch.softmax(x.double(), dim=-1)
    p = _softmax(x, how)
    finite = torch.isfinite(p)
    if not finite.all():
        outcome = NOT_FINITE
    elif (p.double().sum(dim=-1) < 0.5).any():  # the denominator overflowed to inf: x / inf = 0
        outcome = ZEROS
    else:
        outcome = OK
    # ln of the denominator over e^largest, for the row where it is largest: that row's sum overflows first,
    # once largest_logit + log_sum_excess exceeds ln(the format's largest number)
    log_excess = torch.logsumexp(x.double() - x.double().max(dim=-1, keepdim=True).values, dim=-1).max().item()
    return {"format": name, "how": how, "outcome": outcome, "relative_error": relative_error(p, reference),
            "not_finite_fraction": 1 - finite.double().mean().item(), "log_sum_excess": log_excess}


@experiment("formats_softmax")
def softmax_overflow(largest_logits: Sequence[float], classes: int = 1000, batch: int = 64,
                     methods: Sequence[str] = tuple(SOFTMAX_METHODS)) -> list[dict]:
    """Every softmax method at every size of logit: outcome and relative error against float64."""
    if not list(largest_logits):
        raise ValueError("largest_logits: expected at least one value, got an empty list")
    for method in methods:
        if method not in SOFTMAX_METHODS:
            raise ValueError(f"methods: unknown softmax {method!r}; choose from {', '.join(SOFTMAX_METHODS)}")
    points = [{"largest_logit": float(v), "method": m, "classes": classes, "batch": batch}
              for m in methods for v in largest_logits]
    return run_sweep(measure_softmax, points)





MATMUL_ARITHMETIC = {  # label: (format whose rounding applies, roundings per product: inputs + output, runs as)
    "float32": ("float32", 0, "float32"),
    "tf32 tensor cores": ("tf32", 2, "tf32"),
    "tf32 emulated": ("tf32", 2, "float32"),
    "tf32 emulated, truncated": ("tf32", 2, "float32"),
    "float16": ("float16", 3, "float16"),
    "bfloat16": ("bfloat16", 3, "bfloat16"),
}
CHECK_ROWS = 256  # rows of C compared with the float64 reference


def _matmul(A: torch.Tensor, B: torch.Tensor, arithmetic: str) -> torch.Tensor:
    """C = A B of float32 A and B in ``arithmetic``, returned in the format the arithmetic produces."""
    if arithmetic == "tf32 tensor cores":
        with matmul_mode("tf32"):
            return A @ B
    with matmul_mode("float32"), float32_accumulation():
        if arithmetic.startswith("tf32 emulated"):  # inputs rounded to TF32, products and sums in float32
            truncate = arithmetic.endswith("truncated")
            return round_to(A, "tf32", truncate=truncate) @ round_to(B, "tf32", truncate=truncate)
        dtype = FORMATS[arithmetic].dtype
        return A.to(dtype) @ B.to(dtype)


def available(arithmetic: str, device: torch.device) -> str | None:
    """None if ``device`` can run ``arithmetic``; otherwise why not."""
    if arithmetic not in MATMUL_ARITHMETIC:
        raise ValueError(f"arithmetic: unknown {arithmetic!r}; choose one of {', '.join(MATMUL_ARITHMETIC)}")
    try:
        supported_dtype("arithmetic", MATMUL_ARITHMETIC[arithmetic][2], device)
    except ValueError as error:
        return str(error).split(": ", 1)[1]
    return None


def measure_matmul_error(n: int, arithmetic: str, device: torch.device | None = None) -> dict:
    """Relative error of the n x n product C = A B in ``arithmetic`` against float64, on random normal data.

    A and B are float32, the same for every arithmetic at a given n (seeded by n). Also reported:
    how much rounding A to the arithmetic's format changes it (``input_rounding``), and the error
    that the roundings alone predict, sqrt(roundings) * input_rounding, assuming they are independent
    and the float32 sums add nothing.
    """
    device = device or env.device()
    n = positive_int("n", n)
    reason = available(arithmetic, device)
    if reason is not None:
        raise ValueError(f"arithmetic: {reason}")
    fits_in_memory("n", n * n * (4 * 4 + 8), device)  # A, B, C, a rounded copy; B in float64
    generator = torch.Generator(device=device).manual_seed(n)
    A = random_tensor((n, n), torch.float32, device, generator)
    B = random_tensor((n, n), torch.float32, device, generator)
    C = _matmul(A, B, arithmetic)
    rows = torch.randperm(n, device=device, generator=generator)[:CHECK_ROWS]
    name, roundings, _ = MATMUL_ARITHMETIC[arithmetic]
    error = check_close(C[rows], A[rows].double() @ B.double(), MATMUL_TOLERANCE[name], f"matmul {arithmetic}")
    input_rounding = relative_error(round_to(A, name, truncate=arithmetic.endswith("truncated")), A)
    return {"format": name, "relative_error": error, "input_rounding": input_rounding,
            "predicted": math.sqrt(roundings) * input_rounding if roundings else None}


@experiment("formats_matmul_error")
def matmul_error(sizes: Sequence[int], arithmetics: Sequence[str] = tuple(MATMUL_ARITHMETIC)) -> list[dict]:
    """Every arithmetic at every size; one row saying why for an arithmetic this device lacks."""
    device = env.device()
    sizes = positive_ints("sizes", sizes)
    rows, points = [], []
    for arithmetic in arithmetics:
        reason = available(arithmetic, device)
        if reason is None:
            points += [{"n": n, "arithmetic": arithmetic} for n in sizes]
        else:
            rows.append({"n": None, "arithmetic": arithmetic, "status": f"not available: {reason}"})
    return run_sweep(measure_matmul_error, points) + rows






def _row(operation: str, name: str, quantity: str, value: float, limit: float) -> dict:
    return {"operation": operation, "format": name, "quantity": quantity, "value": value, "limit": limit,
            "passes": bool(value <= limit)}  # NaN fails


def _elementwise(n: int, name: str, device: torch.device, generator: torch.Generator) -> list[dict]:
    """One operation, one rounding: the largest relative error is at most the unit roundoff u."""
    fmt = FORMATS[name]
    x = random_tensor((n,), fmt.dtype, device, generator)
    y = random_tensor((n,), fmt.dtype, device, generator)
    rows = []
    for operation, result, exact in (("multiply x * y", x * y, x.double() * y.double()),
                                     ("exp(x)", torch.exp(x), torch.exp(x.double()))):
        normal = exact.abs() >= fmt.smallest_normal  # below it, precision is lost by design (subnormals)
        errors = ((result.double() - exact).abs() / exact.abs())[normal]
        # exp: float32 exp is itself off by up to about one float32 unit before the final rounding
        limit = fmt.unit_roundoff + (2 * FORMATS["float32"].epsilon if operation.startswith("exp") else 0)
        rows.append(_row(operation, name, "largest relative error", errors.max().item(), limit))
    return rows


def _sums(n: int, name: str, device: torch.device, generator: torch.Generator) -> list[dict]:
    """n small positive terms: one running sum in 16 bits stalls; float32 accumulation does not."""
    fmt = FORMATS[name]
    x = (torch.rand(n, device=device, generator=generator) * 1e-3).to(fmt.dtype)
    exact = x.double().sum()
    limit = 2 * fmt.unit_roundoff  # the rounding of the terms' sum to the format, and a little more
    return [
        _row(f"sum of {n:,} terms, one {name} running sum", name, "relative error",
             relative_error(running_sum(x, fmt.dtype), exact), limit),
        _row(f"sum of {n:,} terms, float32 accumulation (torch.sum)", name, "relative error",
             relative_error(torch.sum(x), exact), limit),
    ]


def _small_gradients(n: int, device: torch.device, generator: torch.Generator) -> list[dict]:
    """Magnitudes spread over 1e-10 .. 1e-6: float16 flushes the small ones to zero, bfloat16 keeps them."""
    g = 10 ** (-10 + 4 * torch.rand(n, device=device, generator=generator, dtype=torch.float64))
    g = g.float()
    rows = []
    for label, name, scale in (("store gradients of 1e-10 .. 1e-6", "float16", 1.0),
                               ("store gradients of 1e-10 .. 1e-6", "bfloat16", 1.0),
                               ("store gradients of 1e-10 .. 1e-6, scaled by 2^16", "float16", 2.0**16)):
        lost = ((g * scale).to(FORMATS[name].dtype) == 0).double().mean().item()
        rows.append(_row(label, name, "fraction flushed to 0", lost, 0.0))
    return rows


def _sum_of_squares(n: int, device: torch.device, generator: torch.Generator) -> list[dict]:
    """||x||^2 of activations of size ~10: the result outgrows float16's 65504 once n passes a few hundred."""
    x32 = 10 * random_tensor((n,), torch.float32, device, generator)
    rows = []
    for name, result in (("float16", "float16"), ("bfloat16", "bfloat16"), ("float16", "float32")):
        x = x32.to(FORMATS[name].dtype)
        squares = x * x  # each rounded to the 16-bit format; their sum is what overflows
        total = squares.sum() if result == name else squares.sum(dtype=FORMATS[result].dtype)
        error = relative_error(total, (x.double() ** 2).sum()) if torch.isfinite(total) else math.inf  # overflow
        rows.append(_row(f"sum of squares of {n:,} values of size ~10, result in {result}", name, "relative error",
                         error, 2 * FORMATS[name].unit_roundoff))
    return rows


def _matmuls(n: int, device: torch.device, generator: torch.Generator) -> list[dict]:
    """float16 products summed in float32 (tensor cores, cuBLAS) against sums rounded to float16 at every step."""
    A = random_tensor((n, n), torch.float32, device, generator)
    B = random_tensor((n, n), torch.float32, device, generator)
    exact = A.double() @ B.double()
    A16, B16 = A.half(), B.half()
    with float32_accumulation():
        fp32_sums = A16 @ B16
    fp16_sums = torch.zeros(n, n, dtype=torch.float16, device=device)
    for k in range(n):  # n rank-1 updates, each result rounded to float16: a float16 accumulator
        fp16_sums.addr_(A16[:, k], B16[k])
    limit = 2 * FORMATS["float16"].unit_roundoff  # inputs and output rounded: about 0.7 u for random data
    return [_row(f"matmul {n}x{n}, float32 accumulation", "float16", "relative error",
                 relative_error(fp32_sums, exact), limit),
            _row(f"matmul {n}x{n}, float16 accumulation", "float16", "relative error",
                 relative_error(fp16_sums, exact), limit)]


def _weight_updates(n: int, steps: int, device: torch.device, generator: torch.Generator) -> list[dict]:
    """``steps`` updates w <- w - 1e-4 on weights in [1, 2): below half a float16 spacing, each is lost."""
    w0 = 1 + torch.rand(n, device=device, generator=generator)
    change = steps * 1e-4
    rows = []
    for name in ("float16", "bfloat16", "float32"):
        w = w0.to(FORMATS[name].dtype)
        start = w.double()
        for _ in range(steps):
            w -= 1e-4
        applied = (start - w.double()).mean().item()
        rows.append(_row(f"{steps} weight updates of 1e-4 on weights in [1, 2)", name,
                         "error of the total change", abs(applied - change) / change, 0.01))
    return rows


@experiment("formats_sixteen_bits")
def sixteen_bit_evidence(n: int = 2**20, matmul_n: int = 256, steps: int = 1000) -> list[dict]:
    """Rows of evidence: operation, format, what was measured, its value, the limit it must meet, passes.

    ``n`` elements for the elementwise operations, sums and gradients; ``matmul_n`` for the matmuls;
    ``steps`` weight updates (on 4096 weights).
    """
    n, matmul_n, steps = positive_int("n", n), positive_int("matmul_n", matmul_n), positive_int("steps", steps)
    device = env.device()
    fits_in_memory("n", n * 64, device)
    fits_in_memory("matmul_n", matmul_n * matmul_n * 32, device)
    generator = torch.Generator(device=device).manual_seed(0)
    rows = []
    for name in ("float16", "bfloat16"):
        rows += _elementwise(n, name, device, generator)
    for name in ("float16", "bfloat16"):
        rows += _sums(n, name, device, generator)
    rows += _small_gradients(n, device, generator)
    rows += _sum_of_squares(n, device, generator)
    rows += _matmuls(matmul_n, device, generator)
    rows += _weight_updates(4096, steps, device, generator)
    return rows
