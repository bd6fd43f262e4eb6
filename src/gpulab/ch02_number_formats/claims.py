"""What chapter 02 states about sums, the softmax and the error of a matrix multiply in each number format, as
claims checked on every recorded GPU (:mod:`gpulab.core.claims`)."""

from __future__ import annotations

import math

from gpulab.ch02_number_formats import figures, formats, rounding
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.precision import FORMATS
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

SUMS, SOFTMAX, MATMUL = "formats_summation", "formats_softmax", "formats_matmul_error"
STALLING = {"float16 running sum": "float16", "bfloat16 running sum": "bfloat16"}
ROUNDED = {"tf32 tensor cores": ("tf32", 2), "float16": ("float16", 3), "bfloat16": ("bfloat16", 3)}


def _at_largest(run: Recording, method: str) -> dict:
    rows = [r for r in ok_rows(run.rows) if r["method"] == method]
    if not rows:
        raise KeyError(f"no {method}")
    return max(rows, key=lambda r: r["n"])


def _stalls(run: Recording) -> Verdict:
    found = {m: (_at_largest(run, m)["sum"], formats.stagnation_sum(_at_largest(run, m)["addend"], f))
             for m, f in STALLING.items()}
    return verdict(all(s == p for s, p in found.values()),
                   ", ".join(f"{m} ends at {s:g}, predicted {p:g}" for m, (s, p) in found.items()))


STALLS = Claim(
    "stalls", "The float16 and bfloat16 running sums stop at exactly the powers of two predicted from $\\varepsilon$.",
    SUMS, _stalls)


def _float32_grows(run: Recording) -> Verdict:
    row = _at_largest(run, "float32 running sum of float16 data")
    random = math.sqrt(row["n"]) * FORMATS["float32"].epsilon / 2
    return verdict(row["relative_error"] > 100 * random,
                   f"{row['n']:,} terms: error {row['relative_error']:.2e}, sqrt(n) u {random:.2e} "
                   f"({row['relative_error'] / random:,.0f}x)")


FLOAT32_GROWS = Claim(
    "float32_grows", "With $10^7$ equal terms, the float32 running sum's error is more than a hundred times the "
    "$\\sqrt{n}\\,u$ that random rounding errors would give.", SUMS, _float32_grows)


def _pairwise(run: Recording) -> Verdict:
    u = FORMATS["float16"].epsilon / 2
    worst = {m: max(r["relative_error"] for r in ok_rows(run.rows) if r["method"] == m)
             for m in ("float16 pairwise", "torch.sum of float16 data")}
    return verdict(all(e <= u for e in worst.values()),
                   ", ".join(f"{m} at most {e:.2e}" for m, e in worst.items()) + f"; float16's u {u:.2e}")


PAIRWISE = Claim(
    "pairwise", "At every number of terms, float16 pairwise summation and `torch.sum` stay within one unit roundoff "
    "of float16.", SUMS, _pairwise)


def _softmax(run: Recording) -> Verdict:
    thresholds, wrong = figures.softmax_thresholds(run), []
    for r in ok_rows(run.rows):
        if r["how"] == "naive":
            zeros, nan = thresholds[r["format"]]
            expected = rounding.OK if r["largest_logit"] < zeros else (
                rounding.ZEROS if r["largest_logit"] <= nan else rounding.NOT_FINITE)
        else:
            expected = rounding.OK
        if r["outcome"] != expected:
            wrong.append(f"{r['method']} at L = {r['largest_logit']:g}: {r['outcome']}")
    return verdict(not wrong, "; ".join(wrong) or ", ".join(
        f"{f}: zeros from L > {z:.2f}, NaN from L > {n:.2f}" for f, (z, n) in thresholds.items()))


SOFTMAX_OUTCOMES = Claim(
    "softmax_outcomes", "Every naive softmax returns rows of zeros exactly between its two predicted thresholds and "
    "NaN past the second, while the max-subtracted float16 softmax and `torch.softmax` never fail.", SOFTMAX,
    _softmax)


def _errors(run: Recording, arithmetic: str) -> list[dict]:
    rows = [r for r in ok_rows(run.rows) if r["arithmetic"] == arithmetic]
    if not rows:
        raise KeyError(f"no {arithmetic}")
    return rows


def _flat(run: Recording) -> Verdict:
    spread, off = {}, {}
    for arithmetic in ROUNDED:
        errors = [r["relative_error"] for r in _errors(run, arithmetic)]
        spread[arithmetic] = max(errors) / min(errors) - 1
        off[arithmetic] = max(abs(r["relative_error"] / r["predicted"] - 1) for r in _errors(run, arithmetic))
    return verdict(all(s < 0.05 for s in spread.values()) and all(o < 0.1 for o in off.values()), ", ".join(
        f"{a}: varies by {spread[a]:.1%} over n, within {off[a]:.1%} of the prediction" for a in ROUNDED))


FLAT = Claim(
    "flat", "The errors of TF32, float16 and bfloat16 matrix multiplies vary by less than 5% from the smallest order "
    "to the largest, and lie within 10% of the prediction $\\sqrt{k}\\,\\rho$.", MATMUL, _flat)


def _bfloat16_eight(run: Recording) -> Verdict:
    n = max(r["n"] for r in ok_rows(run.rows))
    error = {a: next(r["relative_error"] for r in _errors(run, a) if r["n"] == n) for a in ("float16", "bfloat16")}
    ratio = error["bfloat16"] / error["float16"]
    return verdict(6 <= ratio <= 10, f"n = {n:,}: bfloat16 {error['bfloat16']:.2e}, float16 {error['float16']:.2e}, "
                                     f"{ratio:.1f}x")


BFLOAT16_EIGHT = Claim(
    "bfloat16_eight", "A bfloat16 matrix multiply's error is 6 to 10 times that of float16, close to the $2^3 = 8$ "
    "of its three fraction bits fewer.", MATMUL, _bfloat16_eight)


def _tensor_cores_round(run: Recording) -> Verdict:
    real = figures.mean_error(run, "tf32 tensor cores")
    rounded, truncated = (figures.mean_error(run, a) for a in figures.EMULATIONS)
    if not (real and rounded and truncated):
        raise KeyError("no TF32 tensor-core run beside both emulations")
    return verdict(abs(real / rounded - 1) < 0.05 and real < truncated / 2,
                   f"tensor cores {real:.3e}, rounded inputs {rounded:.3e}, truncated inputs {truncated:.3e}")


TENSOR_CORES_ROUND = Claim(
    "tensor_cores_round", "The error of TF32 on the tensor cores matches, within 5%, that of inputs rounded to 10 "
    "fraction bits, and is less than half that of truncated inputs: cuBLAS's TF32 multiply rounds its inputs.",
    MATMUL, _tensor_cores_round)
