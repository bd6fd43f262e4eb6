"""Worked answers to the exercises of chapter 03, every number computed from :mod:`gpulab.core.flops`, the
roofline of the recorded ceilings (:class:`gpulab.core.roofline.Roofline`) and the recorded sweeps when the answer is
shown (:func:`gpulab.core.printing.show_answers`)."""

from __future__ import annotations

from gpulab.ch03_blas_levels import plan
from gpulab.core import flops, recordings, specs
from gpulab.core.printing import Answer
from gpulab.core.roofline import Roofline
from gpulab.core.sweep import ok_rows

NEAR_PEAK = 0.8  # exercise 4: the share of the measured peak that counts as having reached the compute roof


def _roofs() -> list[tuple[recordings.Recording, Roofline]]:
    return [(run, Roofline.from_rows(run.rows, run.device_name)) for run in recordings.recorded("blas_ceilings")]


def _no_recording() -> str:
    return "No GPU has recorded `blas_ceilings` yet: with its copy bandwidth B and gemm rate P, the same steps apply."


def exercise_1() -> Answer:
    n, cost = 1000, flops.gemv(1000, 1000, "float64")
    lines = [
        f"By hand: gemv does one multiply-add per matrix element, 2 n^2 = {cost.flops:,.0f} FLOP, and must read A "
        f"(n^2 numbers), x (n) and y (n) and write y (n): (n^2 + 3n) x 8 bytes = {cost.bytes:,.0f} bytes. The "
        f"intensity is {cost.flops:,.0f} / {cost.bytes:,.0f} = **{cost.intensity:.3f} FLOP/byte**; "
        f"`flops.gemv({n}, {n}, \"float64\")` gives the same.",
    ]
    for run, roof in _roofs():
        ridge, rate = roof.ridge("float64"), roof.attainable(cost.intensity, "float64")
        lines.append(f"- {run.short_label}: the float64 ridge is {ridge:.1f} FLOP/byte, far above, so the "
                     f"bandwidth roof limits it: B x I = {roof.bandwidth / 1e9:,.0f} GB/s x {cost.intensity:.3f} = "
                     f"**{rate / 1e9:,.0f} GFLOP/s**, {rate / roof.peak('float64'):.1%} of its float64 gemm rate.")
    if len(lines) == 1:
        lines.append(_no_recording())
    lines.append(f"The matrix is {8 * n * n / 1e6:.0f} MB, small enough for a large L2, but the timer flushes the "
                 "L2 before each repeat, so it comes from device memory; and a call this short also pays its launch.")
    levels = {run.device_name: run for run in recordings.recorded("blas_levels")}
    for run, roof in _roofs():
        near = min((r for r in ok_rows(levels[run.device_name].rows) if r["op"] == "gemv" and r["dtype"] == "float64"),
                   key=lambda r: abs(r["n"] - n), default=None) if run.device_name in levels else None
        if near:
            bound = roof.attainable(near["intensity"], "float64")
            lines.append(f"- {run.short_label}, recorded: the float64 gemv of order {near['n']:,} ran at "
                         f"{near['gflops']:,.0f} GFLOP/s, {near['gflops'] * 1e9 / bound:.0%} of its bound.")
    return Answer("Answer to exercise 1", tuple(lines))


def exercise_2() -> Answer:
    small = {d: flops.gemm(32, 32, 32, d).intensity for d in ("float32", "float16")}
    lines = [f"Each 32 x 32 product does 2 x 32^3 FLOP on 3 x 32^2 numbers: {small['float32']:.2f} FLOP/byte in "
             f"float32, {small['float16']:.2f} in float16. A batch of them moves every matrix once too, so the "
             "batch has the same intensity, however many products it holds."]
    for run, roof in _roofs():
        parts = [f"{d}: ridge {roof.ridge(d):.0f}, bound {roof.attainable(i, d) / 1e12:.1f} TFLOP/s "
                 f"({roof.attainable(i, d) / roof.peak(d):.0%} of the gemm rate)"
                 for d, i in small.items() if d in roof.peaks]
        lines.append(f"- {run.short_label}: {'; '.join(parts)}.")
    if len(lines) == 1:
        lines.append(_no_recording())
    lines.append("Far left of the ridge: a batched small GEMM is **memory-bound** like a level-2 operation, and a "
                 "good batched kernel is judged against the bandwidth roof, not the compute roof.")
    return Answer("Answer to exercise 2", tuple(lines))


def exercise_3() -> Answer:
    n = plan.FULL["blocked_n"]
    block = 3 * n // 8
    try:
        flops.blocked_gemm(n, block)
        message = "no error"
    except ValueError as error:
        message = str(error)
    divisors = [b for b in plan.FULL["blocks"] if n % b == 0]
    return Answer("Answer to exercise 3", (
        f"With a block of {block:,} in `BLOCKS`, `blas.measure_blocked_gemm` first asks `flops.blocked_gemm` for "
        f"the cost, which raises `ValueError: {message}`. The sweep turns only out-of-memory errors into a row, so "
        "this one stops the cell.",
        f"Why it insists: the count assumes N = n / b whole updates, each streaming all of C, so that "
        f"m = (2N + 2) n^2 numbers and q = f / m is about b. With {n:,} / {block:,} = {n / block:.2f} the last "
        "update would be a thinner panel with a lower intensity: the bytes, the intensity and the roofline bound "
        "drawn beside the measurement would all be wrong, while the measurement itself would not say so.",
        f"Choose blocks that divide n: for n = {n:,} those are the powers of two, as in the recorded sweep "
        f"({', '.join(f'{b:,}' for b in divisors)}).",
    ))


def _compute_bound_n(ridge: float, dtype: str) -> int:
    """The smallest power of two n whose square gemm's intensity 2n / (3 x bytes per number) reaches ``ridge``."""
    n = 2
    while flops.gemm(n, n, n, dtype).intensity < ridge:
        n *= 2
    return n


def exercise_4() -> Answer:
    lines = ["The full profile already times float16 (`DTYPES` lists it). A square gemm of order n has intensity "
             "2n^3 / (3n^2 x bytes per number) = 2n / (3 x bytes), so it is compute-bound from n = 3 x bytes x "
             "ridge / 2: the 16-bit formats gain a factor two from their smaller numbers, and lose more to their "
             "higher ridge."]
    levels = {run.device_name: run for run in recordings.recorded("blas_levels")}
    for run, roof in _roofs():
        parts = []
        for dtype in ("float32", "float16"):
            if dtype not in roof.peaks:
                continue
            size = flops.bytes_per_element(dtype)
            text = (f"{dtype}: ridge {roof.ridge(dtype):.0f} FLOP/byte, n >= {3 * size * roof.ridge(dtype) / 2:,.0f} "
                    f"(power of two: {_compute_bound_n(roof.ridge(dtype), dtype):,})")
            gemms = sorted((r for r in ok_rows(levels[run.device_name].rows) if r["op"] == "gemm"
                            and r["dtype"] == dtype), key=lambda r: r["n"]) if run.device_name in levels else []
            near = next((r["n"] for r in gemms if r["gflops"] * 1e9 >= NEAR_PEAK * roof.peak(dtype)), None)
            if near:
                text += f"; the recorded gemm first reaches {NEAR_PEAK:.0%} of its rate at n = {near:,}"
            parts.append(text)
        lines.append(f"- {run.short_label}: {'; '.join(parts)}.")
    if len(lines) == 1:
        lines.append(_no_recording())
    lines.append("The ridge only says where the bandwidth stops limiting a gemm: a real gemm needs larger n than "
                 "that before it runs near its rate, as the recordings show, because small products fill few tiles "
                 "and pay their launch.")
    t4 = specs.gpu("T4")
    ridge16 = specs.peak(t4, "float16").ops_per_s / (t4.bandwidth_gb_s * 1e9)
    lines.append(f"On a T4 the datasheet ridge of float16 is {ridge16:.0f} FLOP/byte: compute-bound from "
                 f"n = {3 * 2 * ridge16 / 2:,.0f} on, by the same formula.")
    return Answer("Answer to exercise 4", tuple(lines))
