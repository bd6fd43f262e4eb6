"""Chapter 11's figures and tables: autocast's decisions per device, master weights, the gradient histogram against a
format's range, underflow per loss scale, the scale's trace, and the precisions compared; one function per thing
the page shows, drawn from runs (each recorded GPU behind a menu, the GPUs one under another in the tables)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch11_mixed_precision import amp, autocast
from gpulab.core import plots, specs
from gpulab.core.precision import FORMATS, MATMUL_TOLERANCE, Format
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, table

FALLBACK_GPU = "H200 SXM 141GB"  # whose peaks the page quotes before any GPU has recorded the wide MLP


def _power(x: float) -> str:
    return f"2^{x:g}"


# --- autocast and master weights ---------------------------------------------------------------------------------

def autocast_table(runs: Sequence[Recording]) -> Table:
    """One row per operation of :data:`.autocast.AUTOCAST_OPS`: the course's class and advice, then what each run's
    autocast did with it in each 16-bit type (a column per device and type)."""
    columns, treatments = [], {}
    for i, run in enumerate(runs):
        for r in run.rows:
            if r["status"] != "ok":
                continue
            key = f"run{i} {r['autocast_dtype']}"
            if key not in treatments:
                treatments[key] = {}
                columns.append(Column(key, f"{run.short_label}: autocast {r['autocast_dtype']}"))
            treatments[key][r["op"]] = r["treatment"]
    rows = [{"op": op, "kind": kind, "advice": advice, **{key: done.get(op) for key, done in treatments.items()}}
            for op, kind, advice in autocast.AUTOCAST_OPS]
    return table(rows, [Column("op", "operation"), Column("kind", "class"), Column("advice", "course advice"),
                        *columns])


def autocast_notes(runs: Sequence[Recording]) -> list[str]:
    """A sentence per 16-bit type a run could not try, and one that names the operations that a CUDA run's and a
    CPU run's autocast treat differently (or which device's lists are shown, when only one kind of device is)."""
    said = [f"{run.label}: autocast {r['autocast_dtype']} not run: {r['reason']}." for run in runs for r in run.rows
            if r["status"] != "ok"]
    by_device = {}
    for run in runs:
        by_device.setdefault(run.rows[0]["device"], {(r["autocast_dtype"], r["op"]): r["treatment"]
                                                    for r in run.rows if r["status"] == "ok"})
    if "cuda" in by_device and "cpu" in by_device:
        cuda, cpu = by_device["cuda"], by_device["cpu"]
        differ = sorted({op for (dtype, op) in cuda if (dtype, op) in cpu and cuda[dtype, op] != cpu[dtype, op]})
        said.append("Operations that CUDA's and the CPU's autocast treat differently: "
                    f"{', '.join(f'`{op}`' for op in differ) or 'none'}.")
    elif by_device:
        said.append(f"Only {next(iter(by_device)).upper()} autocast is shown here; its lists are that device's.")
    return said


def master_weights_table(rows: Sequence[dict]) -> Table:
    """The rows of :func:`.autocast.master_weight_updates`, with the exact result in the caption."""
    first = rows[0]
    return table(rows, [Column("weights"), Column("spacing", "spacing at w", format=".3g"),
                        Column("after_one", "after 1 update", format=".8f"),
                        Column("after_all", "after all", format=".6f"),
                        Column("copy_after_all", "16-bit copy", format=".6f")],
                 caption=f"w = {first['weight']:g}, {first['steps']:,} updates of {first['update']:g}: the exact "
                         f"result is {first['exact']:g}")


# --- the gradient histogram against a format's range ------------------------------------------------------------

def edges(fmt: Format) -> dict[str, float]:
    """log2 of where ``fmt`` stops representing a magnitude: below 'zero' it rounds to 0 (half the smallest
    subnormal), below 'normal' it is subnormal, from 'overflow' on it overflows (the power of two above the largest
    finite number; the bin below it holds the largest and counts as fitting)."""
    return {"zero": math.log2(fmt.smallest_subnormal) - 1, "normal": math.log2(fmt.smallest_normal),
            "overflow": math.floor(math.log2(fmt.largest)) + 1}


def range_sentence(name: str = "float16") -> str:
    fmt = FORMATS[name]
    return (f"{name}: smallest subnormal {fmt.smallest_subnormal:.3g} = "
            f"{_power(math.log2(fmt.smallest_subnormal))}, smallest normal {fmt.smallest_normal:.3g} = "
            f"{_power(math.log2(fmt.smallest_normal))}, largest {fmt.largest:g}.")


def regions(fmt: Format, log2_scale: float, low: float, high: float) -> tuple[list[dict], list[dict]]:
    """Shapes and labels that shade where ``fmt`` rounds to 0, is subnormal and overflows, on an axis of log2 of the
    unscaled gradient from ``low`` to ``high``: a loss scale 2^s moves the format's bounds down by s."""
    zero, normal, overflow = (edges(fmt)[k] - log2_scale for k in ("zero", "normal", "overflow"))
    boxes = [("rounds to 0", min(low, zero) - 1, zero, "rgba(0,0,0,0.22)", 0.98),
             ("subnormal", zero, normal, "rgba(0,0,0,0.08)", 0.90),
             ("overflows", overflow, max(high, overflow) + 1, "rgba(0,0,0,0.22)", 0.98)]
    shapes = [dict(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, fillcolor=colour, line_width=0,
                   layer="below") for _, x0, x1, colour, _ in boxes]
    notes = [dict(x=(max(x0, low - 1) + min(x1, high + 1)) / 2, y=y, yref="paper", yanchor="top", text=name,
                  showarrow=False, font=dict(size=11), bgcolor="rgba(255,255,255,0.7)")
             for name, x0, x1, _, y in boxes if x1 > low - 1 and x0 < high + 1]
    return shapes, notes


def _span(rows: Sequence[dict]) -> tuple[int, int]:
    return min(r["log2_magnitude"] for r in rows), max(r["log2_magnitude"] for r in rows) + 1


def histogram_figure(rows: Sequence[dict], scales: Sequence[float], *, title: str, fmt: str = "float16",
                     span: tuple[int, int] | None = None) -> go.Figure:
    """The gradient histogram, with ``fmt``'s ranges shaded for a loss scale that a menu picks (no menu for one
    scale).

    Multiplying by a scale S moves every gradient up by log2 S; the figure moves the format's bounds
    down instead, so that the histogram stays put: below 2^-25 / S a float16 gradient rounds to zero, up to
    2^-14 / S it is subnormal, beyond 65504 / S it overflows.
    """
    fig = go.Figure()
    for i, kind in enumerate(dict.fromkeys(r["gradients"] for r in rows)):
        series = [r for r in rows if r["gradients"] == kind]
        fig.add_trace(go.Bar(x=[r["log2_magnitude"] + 0.5 for r in series], y=[100 * r["share"] for r in series],
                             name=f"{kind} gradients", marker_color=plots.PALETTE[i],
                             marker_pattern_shape="" if i == 0 else "/", opacity=0.75,
                             hovertext=[plots.hover_text(r, ("gradients", "log2_magnitude", "count")) for r in series],
                             hoverinfo="text"))
    low, high = span or _span(rows)
    buttons = []
    for scale in scales:
        shapes, notes = regions(FORMATS[fmt], math.log2(scale), low, high)
        buttons.append(dict(label=f"{fmt} ranges at loss scale {_power(math.log2(scale))}", method="update",
                            args=[{"visible": [True] * len(fig.data)}, {"shapes": shapes, "annotations": notes}]))
    shapes, notes = regions(FORMATS[fmt], math.log2(scales[0]), low, high)
    fig.update_layout(title=title, barmode="overlay", bargap=0.05, shapes=shapes, annotations=notes,
                      xaxis=dict(title="log2 |gradient| (bins of one power of two)", range=[low - 1, high + 1]),
                      yaxis_title="share of the nonzero gradients (%)", margin=dict(t=100),
                      updatemenus=[dict(buttons=buttons, active=0, x=0.0, y=1.14, xanchor="left", direction="down")]
                      if len(scales) > 1 else [], legend=dict(x=0.01, y=0.8))
    return fig


def histogram_by_gpu(runs: Sequence[Recording], scales: Sequence[float]) -> go.Figure:
    """:func:`histogram_figure` of each run on one axis, one menu for the GPU and the loss scale."""
    spans = [_span(run.rows) for run in runs]
    span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
    return plots.by_gpu(runs, lambda run: histogram_figure(
        run.rows, scales, span=span, title=f"Gradients of the trained digits MLP, one batch: {run.label}"))


def shares(rows: Sequence[dict], fmt: Format, log2_scale: float = 0) -> dict:
    """Of one kind's histogram rows (bins [2^k, 2^(k+1)) of the nonzero gradients), the shares that round to 0, are
    subnormal, are normal and overflow once multiplied by 2^log2_scale and stored in ``fmt`` (whole bins: a bin that
    straddles a bound counts on the side of its lower end, so the shares are close, not exact)."""
    e = edges(fmt)
    found = {"zero": 0.0, "subnormal": 0.0, "normal": 0.0, "overflow": 0.0}
    for r in rows:
        k = r["log2_magnitude"] + log2_scale
        where = "zero" if k < e["zero"] else "subnormal" if k < e["normal"] else "normal" if k < e["overflow"] \
            else "overflow"
        found[where] += r["share"]
    return found


def histogram_rows(run: Recording, fmt: Format, log2_scale: float = 0) -> list[dict]:
    """Per kind of gradient of one run: its count, the share of exact zeros, and :func:`shares` of the others."""
    found = []
    for kind in dict.fromkeys(r["gradients"] for r in run.rows):
        rows = [r for r in run.rows if r["gradients"] == kind]
        found.append({"gpu": run.short_label, "gradients": kind, "values": rows[0]["values"],
                      "zeros": rows[0]["zeros"] / rows[0]["values"], **shares(rows, fmt, log2_scale),
                      "largest": max(r["log2_magnitude"] for r in rows) + 1})
    return found


SHARE_COLUMNS = [Column("zero", "round to 0", format=".1%"), Column("subnormal", format=".1%"),
                 Column("normal", format=".1%"), Column("overflow", "overflow", format=".1%")]


def histogram_table(runs: Sequence[Recording], fmt: str = "float16") -> Table:
    """Per GPU and kind of gradient: how many, the exact zeros, and where the others fall in ``fmt``'s range."""
    rows = [row for run in runs for row in histogram_rows(run, FORMATS[fmt])]
    return table(rows, [Column("gpu", "GPU"), Column("gradients"), Column("values", "values"),
                        Column("zeros", "exactly zero", format=".0%"), *SHARE_COLUMNS,
                        Column("largest", "largest below", format=lambda k: _power(k))],
                 caption=f"of the nonzero gradients, stored in {fmt} without a loss scale")


# --- underflow per loss scale, and the scaler's trace -----------------------------------------------------------

def underflow_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Per loss scale, the share of the nonzero gradients that float16 loses: predicted by storing float32's
    gradients (dotted) and measured in a float16 backward pass (solid); and the share that overflowed (dash-dot)."""
    series = []
    for r in rows:
        kind = r["gradients"]
        series += [{"log2_scale": r["log2_scale"], "series": f"{kind}: rounded to 0, predicted",
                    "percent": 100 * r["cast_flushed"]},
                   {"log2_scale": r["log2_scale"], "series": f"{kind}: lost in the float16 backward",
                    "percent": 100 * r["backward_lost"]},
                   {"log2_scale": r["log2_scale"], "series": f"{kind}: inf or NaN in the float16 backward",
                    "percent": 100 * r["backward_not_finite"]}]
    kinds = list(dict.fromkeys(r["gradients"] for r in rows))
    colors = {s["series"]: plots.PALETTE[kinds.index(s["series"].split(":")[0]) % len(plots.PALETTE)] for s in series}
    fig = plots.sweep_figure(series, "log2_scale", "percent", color="series", colors=colors, title=title,
                             x_title="log2 of the loss scale", y_title="share of the nonzero gradients (%)",
                             hover=("series", "log2_scale", "percent"))
    for trace in fig.data:
        trace.line.dash = "dot" if "predicted" in trace.name else "dashdot" if "inf" in trace.name else "solid"
        trace.marker.symbol = "circle" if trace.name.startswith(kinds[0]) else "square"
    fig.update_xaxes(dtick=8)
    return fig


def underflow_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    return plots.by_gpu(runs, lambda run: underflow_figure(
        run.rows, title=f"Gradients float16 loses, against the loss scale: {run.label}"))


def underflow_table(runs: Sequence[Recording]) -> Table:
    rows = [{"gpu": run.short_label, **r, "error": "none: not finite" if r["relative_error"] is None
             else r["relative_error"]} for run in runs for r in run.rows]
    share = {"format": ".2%"}
    return table(rows, [Column("gpu", "GPU"), Column("gradients"),
                        Column("log2_scale", "loss scale", format=_power),
                        Column("cast_flushed", "predicted 0", **share),
                        Column("backward_lost", "lost in backward", **share),
                        Column("cast_subnormal", "subnormal", **share),
                        Column("backward_not_finite", "inf or NaN", **share),
                        Column("error", "error of the unscaled gradients",
                               format=lambda v: v if isinstance(v, str) else f"{v:.2e}")],
                 caption="shares of the nonzero float32 gradients")


def trace_summary(runs: Sequence[Recording]) -> list[str]:
    """A sentence per run of :func:`.gradients.loss_scale_trace`: where the scaler started, its first update, the
    steps it skipped, the scales of the updates and the loss. Raises if the scaler never found a scale."""
    said = []
    for run in runs:
        rows = run.rows
        good = [r for r in rows if not r["skipped"]]
        if not good:
            raise AssertionError(f"{run.label}: the scaler skipped every step; it never found a scale that fits")
        said.append(
            f"{run.label}: started at {_power(rows[0]['log2_scale'])}; the first update at step {good[0]['step']}, "
            f"with a scale of {_power(good[0]['log2_scale'])}; {len(rows) - len(good)} of {len(rows)} steps "
            f"skipped; the scales of the updates from {_power(min(r['log2_scale'] for r in good))} to "
            f"{_power(max(r['log2_scale'] for r in good))}, the last {_power(rows[-1]['log2_scale'])}; loss "
            f"{rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}.")
    return said


def loss_scale_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """The loss scale at every step (a line, log2), the skipped steps marked with crosses."""
    fig = plots.sweep_figure(rows, "step", "log2_scale", name="loss scale", title=title, x_title="training step",
                             y_title="log2 of the loss scale", hover=("step", "loss_scale", "skipped", "loss"))
    fig.data[0].mode = "lines"
    skipped = [r for r in rows if r["skipped"]]
    fig.add_trace(go.Scatter(x=[r["step"] for r in skipped], y=[r["log2_scale"] for r in skipped], mode="markers",
                             name="skipped step (inf or NaN found)", marker=dict(symbol="x", size=9, color="#e4572e"),
                             hovertext=[plots.hover_text(r, ("step", "loss_scale", "loss")) for r in skipped],
                             hoverinfo="text+name"))
    return fig


def trace_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    return plots.by_gpu(runs, lambda run: loss_scale_figure(run.rows, title=(
        f"GradScaler from {_power(run.rows[0]['log2_scale'])}, growth interval {run.params['growth_interval']}: "
        f"{run.label}")))


# --- the precisions compared -------------------------------------------------------------------------------------

def tolerance_sentence(precisions: Sequence[str]) -> str:
    return "Tolerance of the first losses against float32's: " + ", ".join(
        f"{p} {MATMUL_TOLERANCE[p]:g}" for p in precisions if p != "float32") + "."


def precision_figure(summary: Sequence[dict], *, title: str) -> go.Figure:
    """Side by side, per precision: the time per training step, and the test accuracy (mean, with a bar of
    one standard deviation over the seeds)."""
    ran = [s for s in summary if s["runs"]]
    labels = [s["label"] for s in ran]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per training step", "test accuracy"),
                        horizontal_spacing=0.12)
    fig.add_trace(go.Bar(x=labels, y=[1e3 * s["step_seconds"] for s in ran], marker_color=plots.PALETTE[0],
                         text=[f"{1e3 * s['step_seconds']:.3g}" for s in ran], textposition="outside",
                         hovertext=[f"{s['label']}<br>time per step = {1e3 * s['step_seconds']:.3g} ms"
                                    for s in ran], hoverinfo="text",
                         name="ms per step", showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[100 * s["accuracy_mean"] for s in ran], marker_color="#7f7f7f",
                         error_y=dict(type="data", array=[100 * s["accuracy_sd"] for s in ran]),
                         text=[f"{100 * s['accuracy_mean']:.1f}" for s in ran], textposition="inside",
                         hovertext=[f"{s['label']}<br>test accuracy = {s['accuracy_mean']:.2%} "
                                    f"(sd {s['accuracy_sd']:.2%}, {s['runs']} runs)" for s in ran], hoverinfo="text",
                         name="accuracy", showlegend=False), row=1, col=2)
    low = min(100 * (s["accuracy_mean"] - s["accuracy_sd"]) for s in ran)
    fig.update_xaxes(title_text="precision")
    fig.update_yaxes(title_text="milliseconds per step", row=1, col=1)
    fig.update_yaxes(title_text="test accuracy (%, mean over seeds)", range=[max(0, low - 10), 100], row=1, col=2)
    fig.update_layout(title=title, margin=dict(t=100))
    return fig


def _shape(run: Recording) -> str:
    p = run.params
    if "width" in p:
        return f"Wide MLP {p['inputs']} -> {p['width']} x {p['depth']} -> 10, batch {p['batch']}"
    return f"Digits MLP {[64, *p['hidden'], 10]}"


def precisions_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    return plots.by_gpu(runs, lambda run: precision_figure(amp.summarize(run.rows),
                                                           title=f"{_shape(run)}: {run.label}"))


def precisions_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and precision (:func:`.amp.summarize`): time per step, speed-up, memory, accuracy against float32's,
    skipped steps and the first losses' difference from float32's."""
    rows = []
    for run in runs:
        trained = next(r for r in run.rows if r.get("status", "ok") == "ok")
        for s in amp.summarize(run.rows):
            rows.append({"gpu": run.short_label, "steps": f"{trained['steps']:,} x {trained['batch']:,}", **s,
                         "ms": 1e3 * s["step_seconds"] if s["runs"] else None,
                         "noise": None if "within_noise" not in s else "same" if s["within_noise"] else "different",
                         "gap": 100 * s["accuracy_gap"] if "accuracy_gap" in s else None,
                         "note": None if s["runs"] else f"not run: {s['reason']}"})
    percent = {"format": lambda v: f"{100 * v:.2f}"}
    columns = [Column("gpu", "GPU"), Column("label", "precision"), Column("steps", "steps x batch"),
               Column("runs"), Column("ms", "time per step", "ms", ",.3f"),
               Column("speedup", "speed-up", format=".2f"),
               Column("peak_memory_bytes", "peak memory", format=lambda b: format_bytes(int(b))),
               Column("accuracy_mean", "accuracy", "%", **percent), Column("accuracy_sd", "sd", "%", **percent),
               Column("gap", "vs float32", "points", "+.2f"), Column("noise", "within the noise"),
               Column("skipped_steps", "skipped"), Column("first_loss_error", "1st losses", format=".1e")]
    return table(rows, columns + ([Column("note")] if any(r["note"] for r in rows) else []))


def _step_flops(run: Recording) -> float:
    p = run.params
    return mlp.step_totals(mlp.training_step_operations([p["inputs"], *[p["width"]] * p["depth"], 10],
                                                        p["batch"]))["gemm"]


def wide_rates_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and precision: the GPU's peak (:mod:`gpulab.core.specs`), its ratio to float32's, and the rate of the
    GEMMs of a measured training step of the wide MLP with its share of that peak. With no run yet, the peaks of
    the book's other GPU."""
    rows, flops = [], set()
    for run in runs:
        chip = specs.find(run.device_name)
        work = _step_flops(run)
        flops.add(work)
        for s in amp.summarize(run.rows):
            peak = specs.peak_tflops(chip, s["precision"]) if chip else None
            base = specs.peak_tflops(chip, "float32") if chip else None
            rate = work / s["step_seconds"] / 1e12 if s["runs"] else None
            rows.append({"gpu": run.short_label, "precision": s["label"], "peak": peak,
                         "ratio": peak / base if peak and base else None, "rate": rate,
                         "share": rate / peak if rate and peak else None})
    if not runs:
        chip = specs.gpu(FALLBACK_GPU)
        for precision in amp.PRECISIONS:
            peak = specs.peak_tflops(chip, precision)
            rows.append({"gpu": chip.name, "precision": precision, "peak": peak,
                         "ratio": peak / specs.peak_tflops(chip, "float32") if peak else None})
    caption = ("GEMMs of one training step: " + ", ".join(f"{f / 1e9:,.3g} GFLOP" for f in sorted(flops))) \
        if flops else f"the peaks of the {FALLBACK_GPU}: no GPU has recorded the wide MLP yet"
    return table(rows, [Column("gpu", "GPU"), Column("precision"), Column("peak", "peak", "TFLOP/s", ",.0f"),
                        Column("ratio", "peak / float32's", format=lambda v: f"{v:.1f}x"),
                        Column("rate", "GEMM rate of the step", "TFLOP/s", ",.3g"),
                        Column("share", "of peak", format=".0%")], caption=caption)


def wide_verdicts(runs: Sequence[Recording], factor: float = 2.0) -> list[str]:
    """Per run: whether the book's target (AMP at least ``factor`` times faster per step than float32 with TF32 off,
    same accuracy) was met, and the accuracy of always guessing the most common class."""
    said = []
    for run in runs:
        verdict = amp.target_met(amp.summarize(run.rows), factor=factor)
        how = verdict.get("reason") or (f"{verdict['precision']} is {verdict['speedup']:.1f}x faster, with its "
                                        f"accuracy {'within' if verdict['within_noise'] else 'outside'} the noise")
        target = (f"The book's target (AMP at least {factor:g}x faster than float32 with TF32 off, same accuracy) "
                  f"is {'met' if verdict['met'] else 'not met'}: {how}." if run.on_gpu else
                  "The book's target is for GPUs: a run on a CPU only exercises the code.")
        said.append(f"{run.label}: {target} Always guessing the most common class would score "
                    f"{next(r['majority_share'] for r in run.rows if 'majority_share' in r):.1%}.")
    return said
