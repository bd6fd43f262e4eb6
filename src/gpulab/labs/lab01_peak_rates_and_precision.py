"""Graders of the lab "Peak rates and precision" (``labs/01_peak_rates_and_precision.ipynb``): a peak rate from
the hardware, the tensor-core peaks of the table's GPUs, the minimum time of a matrix multiply, the unit roundoff
and the typical error of a long sum. Each check quotes a wrong answer beside the expected one and names the usual
mistake: the 2 FLOP of an FMA, GFLOP/s or FLOP/s for TFLOP/s, a clock in GHz left unconverted, a missing factor,
Hopper's tensor clock, milliseconds, epsilon for the unit roundoff, n u for sqrt(n) u.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

from gpulab.core import specs
from gpulab.core.tables import Column, Table, table
from gpulab.labs.grading import NOT_ANSWERED, SECONDS, Grader, Mistake, attempt, number_problem

# --- exercise 1: a peak rate from the hardware --------------------------------------------------------------

PEAK_HINT = "multiply SMs x FMA per clock per SM x 2 FLOP per FMA x clock in Hz, then divide by 1e12"


def peak_mistakes(sms: int, clock_ghz: float) -> tuple[Mistake, ...]:
    """The usual wrong peaks, as factors of the right one (a GPU of ``sms`` SMs at ``clock_ghz``)."""
    return (
        Mistake("an FMA is two operations, a multiplication and an addition: multiply by 2", factor=0.5),
        Mistake("the factor 2 is counted twice: an FMA is 2 FLOP, once", factor=2),
        Mistake("that is GFLOP/s (SMs x FMA x 2 x GHz): divide by 1,000 for TFLOP/s", factor=1e3),
        Mistake("that is FLOP/s: divide by 1e12 for TFLOP/s", factor=1e12),
        Mistake("the clock is in GHz: multiply it by 1e9 for cycles per second before dividing by 1e12",
                factor=1e-9),
        Mistake("1 GHz is 1e9 cycles per second and 1 TFLOP/s is 1e12 FLOP/s: the powers of ten are off",
                factor=1e-3),
        Mistake("the clock is missing: FMA per clock needs clocks per second to become a rate",
                factor=1 / clock_ghz),
        Mistake("the clock is missing, and that is GFLOP/s: multiply by the clock, then divide by 1,000",
                factor=1e3 / clock_ghz),
        Mistake("fma_per_clock_per_sm is per SM: multiply by the number of SMs", factor=1 / sms),
    )


def peak_problem(peak_tflops: Callable, sms: int, fma_per_clock_per_sm: int, clock_ghz: float) -> str:
    """'' if ``peak_tflops`` gives the peak of this GPU; otherwise what is wrong, with its mistake named."""
    expected = sms * fma_per_clock_per_sm * 2 * clock_ghz * 1e9 / 1e12
    got, problem = attempt(lambda: peak_tflops(sms, fma_per_clock_per_sm, clock_ghz))
    if problem:
        return problem
    return number_problem(got, expected, 1e-3, peak_mistakes(sms, clock_ghz))


def check_peak_tflops(grader: Grader, peak_tflops: Callable) -> None:
    """Exercise 1: the course's V100 (80 SMs, 512 FP16 FMA per clock per SM, 1.53 GHz) and the A100's FP32 units."""
    grader.record("V100 float16 tensor cores", peak_problem(peak_tflops, 80, 512, 1.53), PEAK_HINT)
    grader.record("A100 float32 units", peak_problem(peak_tflops, 108, 64, 1.41), PEAK_HINT)


# --- exercise 2: every GPU of the table ------------------------------------------------------------------------

PUBLISHED = {("T4", "float16"): 65, ("A100 SXM4 40GB", "tf32"): 156, ("L4", "float8"): 242.5,
             ("H100 SXM5 80GB", "bfloat16"): 989.4}  # the vendors' datasheets, dense, in TFLOP/s
TENSOR_HINT = ("FMA per clock per SM = gpu.tensor_cores_per_sm x gpu.tensor_fma_per_clock[precision]: pass it to "
               "your peak_tflops with gpu.sms and the clock; specs.describe(gpu) prints a row's fields")
HOPPER_HINT = ("Hopper's datasheet quotes tf32, 16-bit and 8-bit tensor-core peaks at a lower clock than "
               "everything else, because the chip cannot hold its top clock under that load: "
               "use gpu.tensor_clock_ghz when the row has one")


def tensor_mistakes(gpu: specs.GPU, precision: str) -> list[Mistake]:
    """The usual wrong tensor-core peaks of ``gpu``: what each mistake computes, in TFLOP/s."""
    clock = gpu.tensor_clock_ghz or gpu.boost_clock_ghz
    per_core = gpu.sms * gpu.tensor_fma_per_clock[precision] * 2 * clock / 1e3
    mistakes = [Mistake("tensor_fma_per_clock is per tensor core: multiply by gpu.tensor_cores_per_sm",
                        value=per_core, rel=0.015)]
    if gpu.tensor_clock_ghz:
        at_boost = per_core * gpu.tensor_cores_per_sm * gpu.boost_clock_ghz / gpu.tensor_clock_ghz
        mistakes.append(Mistake("that is the peak at the boost clock, but this row has a tensor_clock_ghz",
                                value=at_boost, rel=0.005))
    cuda = gpu.sms * gpu.cuda_cores_per_sm["float32"] * 2 * gpu.boost_clock_ghz / 1e3
    mistakes.append(Mistake("that is the CUDA cores' float32 peak: use the tensor-core fields of the row",
                            value=cuda, rel=0.005))
    return mistakes + list(peak_mistakes(gpu.sms, clock)[:6])


def _mentions(fn: Callable, name: str) -> bool:
    """Whether the code of ``fn`` uses the attribute or variable ``name``."""
    code = getattr(fn, "__code__", None)
    if code is not None and name in code.co_names:
        return True
    try:
        return name in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


def tensor_peak_problem(tensor_peak: Callable, name: str, precision: str, figure: float) -> str:
    """'' if ``tensor_peak(gpu, precision)`` is within 1.5% of the vendor's ``figure``; otherwise what is wrong."""
    gpu = specs.gpu(name)

    def no_tensor_clock(error: Exception) -> str:  # arithmetic on a row's None, not on a stub's
        if (isinstance(error, TypeError) and "NoneType" in str(error) and gpu.tensor_clock_ghz is None
                and _mentions(tensor_peak, "tensor_clock_ghz")):
            return ("the code computed with None: this row's tensor_clock_ghz is None (only Hopper rows have "
                    "one); fall back to gpu.boost_clock_ghz where it is None")
        return ""

    got, problem = attempt(lambda: tensor_peak(gpu, precision), no_tensor_clock)
    return problem or number_problem(got, figure, 0.015, tensor_mistakes(gpu, precision))


def check_tensor_peak(grader: Grader, tensor_peak: Callable) -> None:
    """Exercise 2: ``tensor_peak(gpu, precision)`` against the vendors' figures of four GPUs, Hopper's included."""
    for (name, precision), figure in PUBLISHED.items():
        hint = HOPPER_HINT if specs.gpu(name).tensor_clock_ghz else TENSOR_HINT
        grader.record(f"{name} {precision}", tensor_peak_problem(tensor_peak, name, precision, figure), hint)


# --- exercise 3: the minimum time of a matrix multiply ------------------------------------------------------------

MINIMUM_HINT = ("the minimum time is work / rate: 2 n^3 FLOP divided by the peak in FLOP/s (TFLOP/s x 1e12); "
                "no measurement can beat it")


def minimum_mistakes(n: int, peak: float) -> list[Mistake]:
    return [
        Mistake("that is rate / work, how many multiplies fit in a second: time = work / rate",
                value=peak * 1e12 / (2 * n**3)),
        Mistake("the peak is in TFLOP/s: multiply it by 1e12 for FLOP/s", factor=1e12, rel=0.05),
        Mistake("a matrix multiply of order n is 2 n^3 FLOP (n^3 multiply-adds of 2 FLOP each), not n^3",
                factor=0.5),
        Mistake("2 n^2 is the work of a matrix-vector product; a matrix multiply is 2 n^3", factor=1 / n),
        Mistake("that is milliseconds, or the peak taken as GFLOP/s: return seconds, with the peak in FLOP/s "
                "(TFLOP/s x 1e12)", factor=1e3, rel=0.05),
        *SECONDS[1:],
    ]


def check_minimum_seconds(grader: Grader, minimum_seconds: Callable, n: int = 4096, peak: float = 125.0) -> None:
    """Exercise 3: ``minimum_seconds(n, peak)`` of the course's V100 example, 2 x 4096^3 FLOP at 125 TFLOP/s."""
    expected = 2 * n**3 / (peak * 1e12)
    got, problem = attempt(lambda: minimum_seconds(n, peak))
    grader.record(f"minimum_seconds({n}, {peak:g})",
           problem or number_problem(got, expected, 1e-3, minimum_mistakes(n, peak)), MINIMUM_HINT)


# --- exercise 4: the unit roundoff and the error of a long sum ----------------------------------------------------

MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23}
ROUNDOFF_HINT = "u is half of epsilon = 2^-mantissa_bits, so 2^-(mantissa_bits + 1)"


def roundoff_mistakes(bits: int) -> list[Mistake]:
    return [
        Mistake("that is machine epsilon, the gap from 1 to the next number: u is half of it", factor=2, rel=1e-6),
        Mistake("the exponent is -(mantissa_bits + 1): the implicit leading bit adds one bit", factor=4,
                rel=1e-6),
        Mistake("one halving too many: u = 2^-(mantissa_bits + 1)", factor=0.5, rel=1e-6),
        Mistake("Python reads 2 ** -m + 1 as (2 ** -m) + 1: put the exponent in parentheses, 2.0 ** -(m + 1)",
                value=1 + 2.0**-bits, rel=1e-9),
        Mistake("the exponent must be negative: u is a small fraction", test=lambda got: got >= 2**bits / 2),
    ]


def check_unit_roundoff(grader: Grader, unit_roundoff: Callable) -> None:
    """Exercise 4a: ``unit_roundoff(bits)`` of float16, bfloat16 and float32 (the first that is wrong is quoted)."""
    problem = ""
    for name, bits in MANTISSA_BITS.items():
        got, problem = attempt(lambda bits=bits: unit_roundoff(bits))
        problem = problem or number_problem(got, 2.0 ** -(bits + 1), 1e-9, roundoff_mistakes(bits))
        if problem:
            problem = problem if problem == NOT_ANSWERED else f"{name}, unit_roundoff({bits}) {problem}"
            break
    grader.record("unit_roundoff of float16, bfloat16 and float32", problem, ROUNDOFF_HINT)


SUM_HINT = ("n roundings of relative size up to u that go up or down at random add up like a random walk: "
            "about sqrt(n) times u")


def sum_error_mistakes(n: int, u: float) -> list[Mistake]:
    root = math.sqrt(n)
    return [
        Mistake("n u is the worst case, every rounding in the same direction; random roundings partly cancel: "
                "sqrt(n) u", factor=root, rel=0.01),
        Mistake("u is the error of one rounding; a sum of n numbers rounds n - 1 times", factor=1 / root),
        Mistake("the error grows with n: multiply u by sqrt(n), do not divide", factor=1 / n),
        Mistake("log2(n) u is pairwise summation's bound; a running sum's typical error is sqrt(n) u",
                value=math.log2(n) * u),
        Mistake("take the square root of n alone: sqrt(n) * u, not sqrt(n * u)", value=math.sqrt(n * u)),
    ]


def check_typical_sum_error(grader: Grader, typical_sum_error: Callable, n: int = 10**6, u: float = 2.0**-24
                            ) -> None:
    """Exercise 4b: ``typical_sum_error(n, u)`` is sqrt(n) u (a million float32 numbers)."""
    got, problem = attempt(lambda: typical_sum_error(n, u))
    grader.record(f"typical_sum_error({n:,}, 2^-24)",
           problem or number_problem(got, math.sqrt(n) * u, 1e-6, sum_error_mistakes(n, u)), SUM_HINT)


def sum_errors_problem(rows: Sequence[dict]) -> str:
    """'' if each growing sum's measured error lies between a hundredth of and twice its ``predicted`` error.

    A sum's error is a random variable: a median of five can land far below sqrt(n) u (one row on an H200: 1/30
    of it), but not above 2 sqrt(n) u. The bounds still fail u alone (too small for large n) and n u (too large).
    Sums that stagnated (the running sum so large that each addition loses most of its term) are left out.
    """
    growing = [r for r in rows if not r["stagnated"]]
    if any(r.get("predicted") is None for r in growing):
        return NOT_ANSWERED
    for r in growing:
        measured, predicted = r["relative_error"], r["predicted"]
        if not isinstance(predicted, int | float) or not predicted > 0:
            return f"{r['dtype']}, n = {r['n']:,}: the estimate is {predicted!r}, not an error above zero"
        said = f"{r['dtype']}, n = {r['n']:,}: measured {measured:.2e}, your estimate {predicted:.2e}"
        if measured > 2 * predicted:
            return f"{said}: the sum is {measured / predicted:.3g} times less accurate than you predict"
        if measured < predicted / 100:
            return f"{said}: your estimate is {predicted / measured:.3g} times too pessimistic"
    return ""


def check_sum_errors(grader: Grader, rows: Sequence[dict]) -> None:
    """Exercise 4c: the student's estimates (``row['predicted']``) against the measured errors of the sums."""
    grader.record("typical_sum_error matches the measured errors while the sum grows", sum_errors_problem(rows),
           SUM_HINT)


def prediction_table(minimum_seconds: Callable, gpu: specs.GPU | None, n: int, measured: dict[str, dict],
                     caption: str) -> Table:
    """Exercise 3's comparison: per format, the student's minimum time for ``gpu`` beside the ``measured`` time
    (rows with ``seconds``) and their ratio; a prediction that is not yet a positive number shows as a dash."""
    rows = []
    for dtype in ("float32", "bfloat16"):
        if dtype not in measured or gpu is None:
            continue
        predicted, _ = attempt(lambda dtype=dtype: minimum_seconds(n, specs.peak(gpu, dtype).tflops))
        usable = isinstance(predicted, int | float) and not isinstance(predicted, bool) and predicted > 0
        seconds = measured[dtype]["seconds"]
        rows.append({"dtype": dtype, "n": n, "predicted": predicted * 1e3 if usable else None,
                     "measured": seconds * 1e3, "ratio": seconds / predicted if usable else None})
    return table(rows, [Column("dtype", "format"), Column("n", "n"), Column("predicted", "at least", "ms", ".3f"),
                        Column("measured", "measured", "ms", ".3f"), Column("ratio", "measured / minimum", "",
                                                                            ".2f")], caption=caption)
