"""What chapter 17 states about FP8 matrix multiplication, as claims checked on every recorded GPU
(:mod:`gpulab.core.claims`). Each test reads the rows of one GPU's ``fp8_matmul`` recording
(:func:`gpulab.kernels.fp8.fp8_sweep`).

The Triton ladder has no claims yet: its page prints what each recorded GPU measured
(:func:`.figures.ladder_statements`), and its general statements become claims once the ladder is recorded.
"""

from __future__ import annotations

from gpulab.ch17_hopper_tensor_cores import quantization
from gpulab.ch17_hopper_tensor_cores.quantization import config_label, measured_rows
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording

FP8 = "fp8_matmul"
LARGE_SPEEDUP = 1.3  # the FP8 matmul alone over bfloat16 at the two largest sizes, at least
SMALL_N, SMALL_SPEEDUP = 1024, 1.25  # up to this n the FP8 matmul alone gains at most this much
COPY_SHARE = 0.6  # the quantization's share of the copy's rate at the two largest sizes, at least
RATIO_MARGIN = 0.1  # the e5m2 x e4m3 over e4m3 error ratio within 10% of the model
FLAT_MARGIN = 0.05  # errors at the largest and the smallest n within 5%, and tensor-wise against row-wise


def _rows(run: Recording) -> list[dict]:
    rows = measured_rows(run.rows)
    if not rows:
        raise ValueError("no configuration of the sweep ran")
    return rows


def _largest(rows: list[dict], count: int = 2) -> list[dict]:
    sizes = sorted({r["n"] for r in rows})[-count:]
    return [r for r in rows if r["n"] in sizes]


def _matmul_pays(run: Recording) -> Verdict:
    rows = _largest(_rows(run))
    low = min(rows, key=lambda r: r["speedup_matmul"])
    return verdict(low["speedup_matmul"] >= LARGE_SPEEDUP,
                   f"at n = {', '.join(f'{n:,}' for n in sorted({r['n'] for r in rows}))}: at least "
                   f"{low['speedup_matmul']:.2f}x ({config_label(low)} at n = {low['n']:,}), at most "
                   f"{max(r['speedup_matmul'] for r in rows):.2f}x")


MATMUL_PAYS_WHEN_LARGE = Claim(
    "matmul_pays_when_large", f"Fed operands already in FP8, the scaled matmul is at least {LARGE_SPEEDUP} times as "
    "fast as bfloat16 at the two largest sizes of the sweep, in every format and scale granularity.", FP8,
    _matmul_pays)


def _small_gains_little(run: Recording) -> Verdict:
    rows = [r for r in _rows(run) if r["n"] <= SMALL_N]
    if not rows:
        raise ValueError(f"no size up to {SMALL_N}")
    high = max(rows, key=lambda r: r["speedup_matmul"])
    return verdict(high["speedup_matmul"] <= SMALL_SPEEDUP,
                   f"at most {high['speedup_matmul']:.2f}x ({config_label(high)} at n = {high['n']:,}), at least "
                   f"{min(r['speedup_matmul'] for r in rows):.2f}x")


SMALL_GAINS_LITTLE = Claim(
    "small_gains_little", f"Up to n = {SMALL_N:,} the FP8 matmul alone gains little or nothing over bfloat16 (at most "
    f"{SMALL_SPEEDUP} times as fast, and sometimes slower), in every format and scale granularity.", FP8,
    _small_gains_little)


def _path_slower(run: Recording) -> Verdict:
    rows = _rows(run)
    best = max(rows, key=lambda r: r["speedup_path"])
    return verdict(best["speedup_path"] < 1, f"at best {best['speedup_path']:.2f}x ({config_label(best)} at n = "
                   f"{best['n']:,}); {len(rows)} configurations and sizes")


PATH_SLOWER = Claim(
    "path_slower", "With both operands quantized in the call (their amax, their scale and their cast timed with the "
    "matmul), the FP8 path is slower than bfloat16 at every size of the sweep, in every configuration.", FP8,
    _path_slower)


def _quantization_memory_bound(run: Recording) -> Verdict:
    copy = quantization.copy_gbytes_per_s(run)
    rows = _largest(_rows(run))
    low = min(rows, key=quantization.quantize_gbytes_per_s)
    rate = quantization.quantize_gbytes_per_s(low)
    return verdict(rate >= COPY_SHARE * copy,
                   f"at least {rate:,.0f} GB/s ({config_label(low)} at n = {low['n']:,}), {rate / copy:.0%} of the "
                   f"copy's {copy:,.0f} GB/s")


QUANTIZATION_MEMORY_BOUND = Claim(
    "quantization_memory_bound", f"At the two largest sizes, quantizing both operands moves the bytes its "
    f"operations read and write at {COPY_SHARE:.0%} or more of the device copy's rate on the same GPU: it is "
    "memory-bound, and its time is those bytes over the bandwidth.", FP8, _quantization_memory_bound)


def _format_ratio(run: Recording) -> Verdict:
    rows = _rows(run)
    model = quantization.error_ratio_model()
    ratios = []
    for n in sorted({r["n"] for r in rows}):
        for granularity in sorted({r["granularity"] for r in rows}):
            found = {r["format"]: r for r in rows if (r["n"], r["granularity"]) == (n, granularity)}
            if {"e4m3", "e5m2 x e4m3"} <= set(found):
                ratios.append(found["e5m2 x e4m3"]["relative_error"] / found["e4m3"]["relative_error"])
    if not ratios:
        raise ValueError("no size with both e4m3 and e5m2 x e4m3")
    return verdict(all(abs(r / model - 1) <= RATIO_MARGIN for r in ratios),
                   f"ratios {min(ratios):.2f} to {max(ratios):.2f} against the model's {model:.2f}")


FORMAT_ERROR_RATIO = Claim(
    "format_error_ratio", "Taking A in e5m2 instead of e4m3 multiplies the error by the ratio that independent "
    "roundings of the two operands predict, sqrt(u(e5m2)^2 + u(e4m3)^2) / sqrt(2 u(e4m3)^2), within "
    f"{RATIO_MARGIN:.0%}, at every size and with either scale.", FP8, _format_ratio)


def _errors_flat(run: Recording) -> Verdict:
    rows = _rows(run)
    spans, granular = [], []
    for fmt in sorted({r["format"] for r in rows}):
        for granularity in sorted({r["granularity"] for r in rows}):
            mine = sorted((r for r in rows if (r["format"], r["granularity"]) == (fmt, granularity)),
                          key=lambda r: r["n"])
            if mine:
                spans.append(mine[-1]["relative_error"] / mine[0]["relative_error"] - 1)
        for n in sorted({r["n"] for r in rows}):
            pair = {r["granularity"]: r["relative_error"] for r in rows if (r["format"], r["n"]) == (fmt, n)}
            if {"tensor", "row"} <= set(pair):
                granular.append(pair["row"] / pair["tensor"] - 1)
    worst_n, worst_g = max(map(abs, spans)), max(map(abs, granular), default=0.0)
    return verdict(worst_n <= FLAT_MARGIN and worst_g <= FLAT_MARGIN,
                   f"largest against smallest n within {worst_n:.1%}; row-wise against tensor-wise within "
                   f"{worst_g:.1%}")


ERRORS_FLAT = Claim(
    "errors_flat", "On these operands (standard normal, one scale) FP8's error does not grow with the size, and a "
    f"scale per row gives the error of one scale per tensor, within {FLAT_MARGIN:.0%}: the rounding of the operands "
    "sets it, not the float32 sums or the scales.", FP8, _errors_flat)
