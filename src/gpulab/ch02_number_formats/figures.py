"""Chapter 02's figures and tables: how a format lays out its bits and what it stores, and the recorded runs of
:mod:`.rounding` (each recorded GPU behind a menu, or in the rows of a table)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import plotly.graph_objects as go
import torch

from gpulab.ch02_number_formats import formats, rounding
from gpulab.core import plots, precision
from gpulab.core.precision import FORMATS
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, stacked, table

FIELD_COLOURS = {"sign": "#e4572e", "exponent": "#1f6fb4", "fraction": "#29a35a", "unused by tf32": "#d9d9d9"}


def bit_layout_figure(formats: Iterable, *, title: str = "Bit layouts of the number formats") -> go.Figure:
    """One row of boxes per :class:`gpulab.core.precision.Format`: sign, exponent and fraction bits, drawn to scale.

    tf32 is drawn in the float32 word it lives in, its 13 lowest bits greyed: TF32 arithmetic drops them.
    """
    formats = list(formats)
    names = [f.name for f in formats]
    fields: dict[str, list[tuple[str, int, int]]] = {field: [] for field in FIELD_COLOURS}  # (format, start, bits)
    for f in formats:
        fraction_end = 1 + f.exponent_bits + f.mantissa_bits
        fields["sign"].append((f.name, 0, 1))
        fields["exponent"].append((f.name, 1, f.exponent_bits))
        fields["fraction"].append((f.name, 1 + f.exponent_bits, f.mantissa_bits))
        if f.storage_bits > fraction_end:
            fields["unused by tf32"].append((f.name, fraction_end, f.storage_bits - fraction_end))
    fig = go.Figure()
    for field, parts in fields.items():
        if parts:
            fig.add_trace(go.Bar(
                y=[p[0] for p in parts], x=[p[2] for p in parts], base=[p[1] for p in parts], orientation="h",
                name=field, marker=dict(color=FIELD_COLOURS[field], line=dict(color="white", width=1)),
                text=[str(p[2]) if p[2] > 1 else "" for p in parts], textposition="inside", insidetextanchor="middle",
                hovertemplate=f"%{{y}}: %{{x}} {field} bit(s)<extra></extra>",
            ))
    for row, f in enumerate(formats):  # a thin white line between neighbouring bits
        for bit in range(1, f.storage_bits):
            fig.add_shape(type="line", x0=bit, x1=bit, y0=row - 0.4, y1=row + 0.4,
                          line=dict(color="white", width=0.6), layer="above")
        fig.add_annotation(x=f.storage_bits, y=f.name, xanchor="left", showarrow=False, font=dict(size=11),
                           text=f"  eps {f.epsilon:.3g}, max {f.largest:.3g}")
    fig.update_layout(title=title, barmode="overlay", bargap=0.25, height=120 + 45 * len(formats),
                      xaxis=dict(title="bits, most significant first", range=[0, 84], dtick=8, showgrid=False),
                      yaxis=dict(title="format", automargin=True, categoryorder="array", categoryarray=names,
                                 autorange="reversed", showgrid=False),
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=110))
    return fig


# ---- the formats ----------------------------------------------------------------------------------------------

def formats_table(formats: Iterable) -> Table:
    """Each :class:`gpulab.core.precision.Format` by its two counts, and the limits that follow from them."""
    rows = [{"format": f.name, "bits": f.bits, "exponent": f.exponent_bits, "fraction": f.mantissa_bits,
             "digits": f.decimal_digits, "epsilon": f.epsilon, "normal": f.smallest_normal,
             "subnormal": f.smallest_subnormal, "largest": f.largest} for f in formats]
    small = ".3g"
    return table(rows, [Column("format"), Column("bits"), Column("exponent", "exponent bits"),
                        Column("fraction", "fraction bits"), Column("digits", "decimal digits", format=".1f"),
                        Column("epsilon", format=small), Column("normal", "smallest normal", format=small),
                        Column("subnormal", "smallest subnormal", format=small),
                        Column("largest", format=small)])


def course_table() -> Table:
    """The course's table of formats, value by value, against the value derived from the bits."""
    rows = []
    for name, row in formats.COURSE_TABLE.items():
        for key, printed in row.items():
            derived = getattr(FORMATS[name], key)
            rows.append({"format": name, "quantity": key.replace("_", " "), "course": printed, "derived": derived,
                         "verdict": "agrees" if formats.matches_printed(printed, derived) else "differs"})
    return table(rows, [Column("format"), Column("quantity"), Column("course", "the course's slide", format=".5g"),
                        Column("derived", "derived from the bits", format=".5g"), Column("verdict", "")])


# ---- rounding one number, and many -------------------------------------------------------------------------------

def _stored(row: dict) -> str:
    """A cell of :func:`rounding_numbers_table`: the relative error, or what went wrong."""
    if row["note"] == "overflow":
        return "overflow: inf"
    if row["note"] == "underflow to 0":
        return "flushed to 0"
    if row["note"].startswith("saturated"):
        return f"saturated at {row['stored']:g}"
    return f"{row['relative_error']:.2e}"


def rounding_numbers_table(numbers: Sequence[float]) -> Table:
    """A row per number, a column per format: the relative error of storing it there, or what went wrong."""
    rows = [{"number": number, **{r["format"]: r for r in formats.rounding_table(number)}} for number in numbers]
    return table(rows, [Column("number", format=",.6g"), *(Column(name, name, format=_stored) for name in FORMATS)],
                 caption="relative error of the stored number")


def float8_conversion() -> str:
    """What this torch does with numbers beyond float8_e4m3fn's range: a sentence, or '' without the format."""
    if "float8_e4m3fn" not in FORMATS:
        return ""
    stored = torch.tensor([1000.0, math.inf]).to(torch.float8_e4m3fn).float().tolist()
    return f"torch {torch.__version__} converts 1000 and inf to float8_e4m3fn as {stored[0]:g} and {stored[1]:g}."


def stagnation_table(addend: float, cases: Sequence[tuple[str, str]] = (
        ("float16", "float16"), ("bfloat16", "bfloat16"), ("float16", "float32"))) -> Table:
    """For each (data, accumulator) format: ``addend`` as stored, and where a running sum of it stalls."""
    rows = []
    for data, accumulator in cases:
        stored = precision.round_to(torch.tensor([addend]), data).item()
        stall = formats.stagnation_sum(stored, accumulator)
        terms = stall / stored
        rows.append({"accumulator": accumulator, "data": data, "stored": stored, "stall": stall,
                     "terms": round(terms, 2 - math.floor(math.log10(terms)))})
    return table(rows, [Column("accumulator", "running sum in"), Column("data", "terms in"),
                        Column("stored", f"{addend:g} as stored", format=".6g"),
                        Column("stall", "stalls at", format="g"), Column("terms", "after about", "terms", ",.0f")])


def _largest(run: Recording, key: str = "n") -> int:
    return max(r[key] for r in run.rows if r["status"] == "ok")


def summation_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, at its largest number of terms: each method's sum against the exact one."""
    rows = [{"gpu": run.short_label, **r} for run in runs for r in run.rows
            if r["status"] == "ok" and r["n"] == _largest(run)]
    return table(rows, [Column("gpu", "GPU"), Column("n", "terms"), Column("method"), Column("sum", format=".6g"),
                        Column("exact", format=".6g"), Column("relative_error", "relative error", format=".2e")])


def summation_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: each method's relative error against n, with the predictions of rounding (dotted)."""
    colours = {method: plots.PALETTE[i] for i, method in enumerate(rounding.SUM_METHODS)}

    def figure(run: Recording) -> go.Figure:
        addend = run.params["addend"]
        theory = rounding.summation_theory(run.params["sizes"], addend)
        rows = [{**r, "relative_error": r.get("relative_error") or None} for r in run.rows]  # 0 has no logarithm
        fig = plots.sweep_figure(rows, "n", "relative_error", color="method", log_x=True, log_y=True, colors=colours,
                                 hover=("method", "n", "sum", "exact", "relative_error"),
                                 title=f"Adding n copies of {addend:g}: {run.label}", x_title="number of terms n",
                                 y_title="relative error of the sum")
        return plots.add_sweep(fig, theory, "n", "relative_error", color="line", dash="dot",
                               colors={r["line"]: colours[r["method"]] for r in theory})
    return plots.by_gpu(runs, figure)


# ---- the softmax ----------------------------------------------------------------------------------------------

SOFTMAX_OUTCOMES = {rounding.OK: "ok", rounding.ZEROS: "zeros", rounding.NOT_FINITE: "NaN"}


def softmax_thresholds(run: Recording, names: Sequence[str] = ("float16", "bfloat16", "float32")) -> dict:
    """Per format: the largest logit L past which the naive softmax's sum overflows (rows of zeros), and past which
    e^L itself does (NaN), from the run's largest log-sum excess (the row that overflows first)."""
    excess = max(r["log_sum_excess"] for r in run.rows if r["status"] == "ok")
    return {name: (math.log(FORMATS[name].largest) - excess, math.log(FORMATS[name].largest)) for name in names}


def softmax_thresholds_table(runs: Sequence[Recording]) -> Table:
    rows = [{"gpu": run.short_label, "format": name, "zeros": zeros, "nan": nan, "largest": FORMATS[name].largest}
            for run in runs for name, (zeros, nan) in softmax_thresholds(run).items()]
    return table(rows, [Column("gpu", "GPU"), Column("format", "naive softmax in"),
                        Column("zeros", "rows of zeros expected from L >", format=".2f"),
                        Column("nan", "NaN from L > ln(largest)", format=".2f"),
                        Column("largest", "largest number", format=".4g")])


def softmax_outcomes_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and largest logit L: what each softmax returned (ok, rows of zeros, NaN)."""
    rows = []
    for run in runs:
        outcome = {(r["largest_logit"], r["method"]): SOFTMAX_OUTCOMES.get(r["outcome"], r["status"])
                   for r in run.rows}
        rows += [{"gpu": run.short_label, "L": L, **{m: outcome.get((L, m)) for m in rounding.SOFTMAX_METHODS}}
                 for L in sorted({r["largest_logit"] for r in run.rows})]
    return table(rows, [Column("gpu", "GPU"), Column("L", "largest logit L", format="g"),
                        *(Column(m) for m in rounding.SOFTMAX_METHODS)])


def softmax_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: each softmax's relative error against the largest logit, with the predicted thresholds (dotted)."""
    colours = {method: plots.PALETTE[i] for i, method in enumerate(rounding.SOFTMAX_METHODS)}

    def figure(run: Recording) -> go.Figure:
        thresholds = softmax_thresholds(run)
        fig = plots.sweep_figure(run.rows, "largest_logit", "relative_error", color="method", log_x=True, log_y=True,
                                 colors=colours, hover=("method", "largest_logit", "outcome", "relative_error"),
                                 title=f"Softmax of {run.params['classes']} classes: {run.label}",
                                 x_title="largest logit L", y_title="relative error (missing: NaN)")
        # the predicted thresholds as vertical lines (bfloat16's are float32's, to within a hundredth)
        lines = [{"L": L, "error": error, "line": f"naive {name}: {what}"}
                 for name in ("float16", "float32")
                 for L, what in zip(thresholds[name], ("sum overflows", "e^L overflows"), strict=True)
                 for error in (1e-8, 10)]
        return plots.add_sweep(fig, lines, "L", "error", color="line", dash="dot",
                               colors={r["line"]: colours[r["line"].split(":")[0]] for r in lines})
    return plots.by_gpu(runs, figure)


# ---- the matrix multiply ---------------------------------------------------------------------------------------

def matmul_error_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, at its largest order n: each arithmetic's relative error, and the prediction from input rounding."""
    rows = [{"gpu": run.short_label, **r} for run in runs for r in run.rows
            if r["n"] == _largest(run) or r["status"] != "ok"]
    return table(rows, [Column("gpu", "GPU"), Column("n", "order n"), Column("arithmetic"),
                        Column("relative_error", "relative error", format=".2e"),
                        Column("predicted", "predicted", format=".2e"), Column("status")])


def matmul_error_ratios(runs: Sequence[Recording]) -> list[str]:
    """A sentence per GPU: TF32's error over float32's, and bfloat16's over float16's, at the largest n."""
    said = []
    for run in runs:
        largest = _largest(run)
        errors = {r["arithmetic"]: r["relative_error"] for r in run.rows if r["n"] == largest and r["status"] == "ok"}
        tf32 = "tf32 tensor cores" if "tf32 tensor cores" in errors else "tf32 emulated"
        said.append(f"{run.label}, n = {largest:,}: {tf32} has {errors[tf32] / errors['float32']:,.0f} times the "
                    f"error of float32; bfloat16 {errors['bfloat16'] / errors['float16']:.1f} times that of float16.")
    return said


def matmul_error_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: each arithmetic's relative error against n, with the prediction sqrt(k) rho (dotted)."""
    colours = {arithmetic: plots.PALETTE[i] for i, arithmetic in enumerate(rounding.MATMUL_ARITHMETIC)}

    def figure(run: Recording) -> go.Figure:
        fig = plots.sweep_figure(run.rows, "n", "relative_error", color="arithmetic", log_x=True, log_y=True,
                                 colors=colours,
                                 hover=("arithmetic", "n", "relative_error", "input_rounding", "predicted"),
                                 title=f"Relative error of C = A B against float64: {run.label}",
                                 x_title="matrix order n", y_title="relative error (Frobenius norm)")
        predicted = [r for r in run.rows
                     if r.get("predicted") is not None and not r["arithmetic"].endswith("truncated")]
        return plots.add_sweep(fig, predicted, "n", "predicted", color="arithmetic", name="predicted", dash="dot",
                               colors=colours)
    return plots.by_gpu(runs, figure)


EMULATIONS = ("tf32 emulated", "tf32 emulated, truncated")


def mean_error(run: Recording, arithmetic: str) -> float | None:
    """The mean relative error of ``arithmetic`` over every size of ``run``, or None where it did not run."""
    errors = [r["relative_error"] for r in run.rows if r["arithmetic"] == arithmetic and r["status"] == "ok"]
    return sum(errors) / len(errors) if errors else None


def emulation_table(runs: Sequence[Recording]) -> Table:
    """Per GPU that ran TF32 on its tensor cores: their mean error against each emulation's."""
    rows = []
    for run in runs:
        real = mean_error(run, "tf32 tensor cores")
        if not real:
            continue
        rows += [{"gpu": run.short_label, "arithmetic": a, "error": mean_error(run, a),
                  "ratio": real / mean_error(run, a) if mean_error(run, a) else None}
                 for a in ("tf32 tensor cores", *EMULATIONS)]
    return table(rows, [Column("gpu", "GPU"), Column("arithmetic"),
                        Column("error", "mean relative error", format=".3e"),
                        Column("ratio", "tensor cores / this", format=".2f")])


def emulation_verdict(runs: Sequence[Recording]) -> list[str]:
    """A sentence per GPU that ran TF32 on its tensor cores: which emulation its error is closer to."""
    said = []
    for run in runs:
        real = mean_error(run, "tf32 tensor cores")
        if real and all(mean_error(run, a) for a in EMULATIONS):
            closer = min(EMULATIONS, key=lambda a: abs(math.log(real / mean_error(run, a))))
            said.append(f"{run.label}: the tensor cores' error is closer to '{closer}'.")
    return said or ["No GPU run with TF32 tensor cores yet, so the emulation cannot be compared with the hardware."]


# ---- what can live in 16 bits ----------------------------------------------------------------------------------

def evidence_table(runs: Sequence[Recording]) -> Table:
    """Per GPU: each operation of a training step in 16 bits, its measurement and the limit it must meet."""
    return stacked(runs, [Column("operation"), Column("format"), Column("quantity", "measured"),
                          Column("value", "", format=".2e"), Column("limit", format=".2e"),
                          Column("passes", "", format=lambda passes: "passes" if passes else "FAILS")])
