"""Worked answers to the exercises of chapter 02, every number computed from the formats' bit counts
(:data:`gpulab.core.precision.FORMATS`), the chapter's functions and the recordings when the answer is shown
(:func:`gpulab.core.printing.show_answers`)."""

from __future__ import annotations

import math

import numpy as np
import torch

from gpulab.ch02_number_formats import figures
from gpulab.ch02_number_formats.formats import stagnation_sum
from gpulab.core import recordings
from gpulab.core.precision import FORMATS, round_to
from gpulab.core.printing import Answer

KAHAN_TERMS, KAHAN_ADDEND = 10_000, 1e-4


def _no_recording(experiment: str) -> str:
    return f"No GPU has recorded `{experiment}` yet."


def _stored(value: float, name: str) -> float:
    return round_to(torch.tensor([value], dtype=torch.float32), name).item()


def exercise_1() -> Answer:
    n, addend, u = 100_000, _stored(1e-3, "float16"), FORMATS["float16"].unit_roundoff
    stall = stagnation_sum(addend, "float16")
    lines = [
        f"float16 stores 1e-3 as {addend:.7g}. A running sum s stops growing once the term is at most half the "
        f"spacing around s, s u with u = {u:.3g} at a power of two: the smallest power of two P with P u >= "
        f"{addend:.7g} is **P = {stall:g}** (`formats.stagnation_sum({addend:.7g}, \"float16\")`).",
        f"The sum reaches P after about P / a = {stall / addend:,.0f} terms (a little sooner: each term is rounded "
        f"up to a whole spacing near the top). Of {n:,} terms, whose exact sum is {n * addend:.4g}, the rest are "
        f"lost: `rounding.measure_sum({n:_}, \"float16 running sum\", addend=1e-3)` should return {stall:g}, a "
        f"relative error of {1 - stall / (n * addend):.1%}.",
    ]
    runs = recordings.recorded("formats_summation")
    for run in runs:
        last = max((r for r in run.rows if r["method"] == "float16 running sum"), key=lambda r: r["n"])
        lines.append(f"The same rule at the chapter's addend, {run.short_label}: the prediction is "
                     f"{stagnation_sum(last['addend'], 'float16'):g}, and the recorded sum of {last['n']:,} terms "
                     f"is {last['sum']:g}.")
    if not runs:
        lines.append(_no_recording("formats_summation"))
    return Answer("Answer to exercise 1", tuple(lines))


def _kahan_and_running(terms: int, addend: float) -> tuple[float, float, float]:
    """float16 Kahan and running sums of ``terms`` copies of ``addend`` (numpy's float16 rounds every operation),
    and the exact sum of the stored terms."""
    a, total, carry, running = np.float16(addend), np.float16(0), np.float16(0), np.float16(0)
    for _ in range(terms):
        y = a - carry
        t = total + y
        carry = (t - total) - y
        total, running = t, running + a
    return float(total), float(running), terms * float(a)


def exercise_2() -> Answer:
    kahan, running, exact = _kahan_and_running(KAHAN_TERMS, KAHAN_ADDEND)
    u = FORMATS["float16"].unit_roundoff
    return Answer("Answer to exercise 2", (
        "Kahan keeps a second float16 number c, the part of the last term the addition rounded away, and "
        "subtracts it from the next term: `for x in terms: y = x - c; t = s + y; c = (t - s) - y; s = t`. "
        "(t - s) is what the addition really added, so (t - s) - y is its rounding error, exactly.",
        f"With {KAHAN_TERMS:,} terms of {KAHAN_ADDEND:g} in float16 (numpy's float16 rounds every operation, as "
        f"a float16 tensor does), the exact sum of the stored terms is {exact:.6g}:",
        f"- running sum: {running:g}, a relative error of {abs(running - exact) / exact:.1%} (it stalls at "
        f"{stagnation_sum(float(np.float16(KAHAN_ADDEND)), 'float16'):g}, as exercise 1 predicts);",
        f"- Kahan: {kahan:g}, a relative error of {abs(kahan - exact) / exact:.2g}, below float16's own "
        f"u = {u:.2g}: the nearest float16 to the exact sum.",
        "The error no longer grows with n. The price: four operations per term instead of one, in sequence, "
        "which is why libraries prefer float32 accumulators and pairwise order on a GPU.",
    ))


def exercise_3() -> Answer:
    runs = recordings.recorded("formats_softmax")
    largest = {name: FORMATS[name].largest for name in ("float32", "bfloat16")}
    lines = [f"The naive softmax returns zeros once its denominator, the sum of e^x over a row, overflows: once "
             f"L + ln(sum of e^(x - L)) > ln(largest). ln(largest) is {math.log(largest['float32']):.4f} for "
             f"float32 and {math.log(largest['bfloat16']):.4f} for bfloat16."]
    for run in runs:
        zeros = figures.softmax_thresholds(run)
        first = {name: min((r["largest_logit"] for r in run.rows if r["method"] == f"naive {name}"
                            and r["outcome"] == "rows of zeros"), default=None) for name in largest}
        said = ", ".join(f"{name} from L = {first[name]:g}" for name in largest if first[name] is not None)
        lines.append(f"- {run.short_label}: the largest row's excess gives thresholds of {zeros['float32'][0]:.2f} "
                     f"(float32) and {zeros['bfloat16'][0]:.2f} (bfloat16); the first recorded logit with rows of "
                     f"zeros: {said or 'none in the sweep'}.")
    if not runs:
        lines.append(_no_recording("formats_softmax"))
    lines.append(f"bfloat16 fails at almost the same logit because it has float32's 8-bit exponent: its largest "
                 f"number is float32's with 7 fraction bits instead of 23, {largest['bfloat16']:.4g} against "
                 f"{largest['float32']:.4g}, and the logarithms differ by "
                 f"{math.log(largest['float32'] / largest['bfloat16']):.4f}.")
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4() -> Answer:
    fmt, smallest = FORMATS["float16"], 1e-10
    # x rounds to zero when it is at most half the smallest subnormal (a tie rounds to the even 0)
    exponent = math.floor(math.log2(fmt.smallest_subnormal / 2 / smallest)) + 1
    scale = 2.0**exponent
    kept = (torch.tensor([smallest]) * scale).half().item()
    lost = (torch.tensor([smallest]) * scale / 2).half().item()
    normal = 2.0 ** math.ceil(math.log2(fmt.smallest_normal / smallest))
    return Answer("Answer to exercise 4", (
        f"float16's smallest subnormal is {fmt.smallest_subnormal:.4g}; anything at most half of it rounds to 0. "
        f"So S must make {smallest:g} S larger than {fmt.smallest_subnormal / 2:.4g}: S > "
        f"{fmt.smallest_subnormal / 2 / smallest:.1f}, and the smallest power of two is **S = 2^{exponent} = "
        f"{scale:g}**.",
        f"Check: {smallest:g} x 2^{exponent} in float16 is {kept:.4g}, not 0; with 2^{exponent - 1} it is {lost:g}.",
        f"The largest gradient that then survives is float16's largest over S: {fmt.largest:g} / {scale:g} = "
        f"**{fmt.largest / scale:.4g}**.",
        f"A subnormal keeps few significant bits: to store {smallest:g} with float16's full precision, S must reach "
        f"the smallest normal, S = {normal:,.0f} = 2^{math.log2(normal):.0f}, and the largest gradient falls to "
        f"{fmt.largest / normal:.3g}. Dynamic loss scaling searches for that balance during training.",
    ))


def _evidence(run: recordings.Recording, operation: str) -> float | None:
    return next((r["value"] for r in run.rows if r["operation"].startswith("matmul") and operation in
                 r["operation"]), None)


def exercise_5() -> Answer:
    lines = [
        "On a GPU: `A, B = torch.randn(64, 2**16, device=\"cuda\").half(), torch.randn(2**16, 64, "
        "device=\"cuda\").half()`, then for each setting of "
        "`torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction` compute "
        "`relative_error(A @ B, A.double() @ B.double())`; the same for two 4096 x 4096 matrices.",
        "What to look for: with float32 accumulation throughout, the error is that of float16 inputs and output. "
        "If cuBLAS adds partial sums in float16 when allowed, the switched-on error is larger, most likely for "
        f"the thin product (K of {2**16:,} cut among thread blocks, each partial sum rounded to float16). Equal "
        "errors, to the last digits, mean cuBLAS did not use the freedom for that shape.",
        "The recordings bracket the answer:",
    ]
    errors = recordings.recorded("formats_matmul_error")
    evidence = recordings.recorded("formats_sixteen_bits")
    for run in errors:
        row = max((r for r in run.rows if r.get("arithmetic") == "float16" and r.get("status") == "ok"),
                  key=lambda r: r["n"], default=None)
        if row:
            lines.append(f"- {run.short_label}: a float16 product of order {row['n']:,} with float32 accumulation "
                         f"has a relative error of {row['relative_error']:.2g} (predicted from the roundings: "
                         f"{row['predicted']:.2g}).")
    for run in evidence:
        wide, narrow = _evidence(run, "float32 accumulation"), _evidence(run, "float16 accumulation")
        if wide and narrow:
            lines.append(f"- {run.short_label}: a float16 accumulator rounded at every step (the worst case) "
                         f"gives {narrow:.2g} against {wide:.2g} at order {run.params['matmul_n']:,}.")
    if not errors and not evidence:
        lines.append(_no_recording("formats_matmul_error"))
    return Answer("Answer to exercise 5", tuple(lines))
