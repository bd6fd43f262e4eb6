"""Chapter 11's figures: the gradient histogram against float16's range, underflow per loss scale, the
scale's trace, and the precisions compared."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.core import plots
from gpulab.core.precision import FORMATS


def histogram_figure(rows: Sequence[dict], scales: Sequence[float], *, title: str) -> go.Figure:
    """The gradient histogram, with float16's ranges shaded for a loss scale that a menu picks.

    Multiplying by a scale S moves every gradient up by log2 S; the figure moves float16's bounds
    down instead, so that the histogram stays put: below 2^-25 / S a gradient rounds to zero, up to
    2^-14 / S it is subnormal, beyond 65504 / S it overflows.
    """
    fmt = FORMATS["float16"]
    fig = go.Figure()
    for i, kind in enumerate(dict.fromkeys(r["gradients"] for r in rows)):
        series = [r for r in rows if r["gradients"] == kind]
        fig.add_trace(go.Bar(x=[r["log2_magnitude"] + 0.5 for r in series], y=[100 * r["share"] for r in series],
                             name=f"{kind} gradients", marker_color=plots.PALETTE[i],
                             marker_pattern_shape="" if i == 0 else "/", opacity=0.75,
                             hovertext=[plots.hover_text(r, ("gradients", "log2_magnitude", "count")) for r in series],
                             hoverinfo="text"))
    low, high = min(r["log2_magnitude"] for r in rows), max(r["log2_magnitude"] for r in rows) + 1
    edges = {"zero": math.log2(fmt.smallest_subnormal) - 1, "normal": math.log2(fmt.smallest_normal),
             "overflow": math.log2(fmt.largest)}

    def regions(scale: float) -> tuple[list[dict], list[dict]]:
        shift = math.log2(scale)
        zero, normal, overflow = (edges[k] - shift for k in ("zero", "normal", "overflow"))
        boxes = [("rounds to 0", min(low, zero) - 1, zero, "rgba(0,0,0,0.22)", 0.98),
                 ("subnormal", zero, normal, "rgba(0,0,0,0.08)", 0.90),
                 ("overflows", overflow, max(high, overflow) + 1, "rgba(0,0,0,0.22)", 0.98)]
        shapes = [dict(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, fillcolor=colour, line_width=0,
                       layer="below") for _, x0, x1, colour, _ in boxes]
        notes = [dict(x=(max(x0, low - 1) + min(x1, high + 1)) / 2, y=y, yref="paper", yanchor="top", text=name,
                      showarrow=False, font=dict(size=11), bgcolor="rgba(255,255,255,0.7)")
                 for name, x0, x1, _, y in boxes if x1 > low - 1 and x0 < high + 1]
        return shapes, notes

    buttons = []
    for scale in scales:
        shapes, notes = regions(scale)
        buttons.append(dict(label=f"float16 ranges at loss scale 2^{math.log2(scale):g}", method="relayout",
                            args=[{"shapes": shapes, "annotations": notes}]))
    shapes, notes = regions(scales[0])
    fig.update_layout(title=title, barmode="overlay", bargap=0.05, shapes=shapes, annotations=notes,
                      xaxis=dict(title="log2 |gradient| (bins of one power of two)", range=[low - 1, high + 1]),
                      yaxis_title="share of the nonzero gradients (%)", margin=dict(t=100),
                      updatemenus=[dict(buttons=buttons, active=0, x=0.0, y=1.14, xanchor="left", direction="down")],
                      legend=dict(x=0.01, y=0.8))
    return fig


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


def loss_scale_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """The loss scale at every step (a line, log2), the skipped steps marked with crosses."""
    fig = plots.sweep_figure(rows, "step", "log2_scale", name="loss scale", title=title, x_title="training step",
                             y_title="log2 of the loss scale", hover=("step", "loss_scale", "skipped", "loss"))
    fig.data[0].mode = "lines"
    skipped = [r for r in rows if r["skipped"]]
    fig.add_trace(go.Scatter(x=[r["step"] for r in skipped], y=[r["log2_scale"] for r in skipped], mode="markers",
                             name="skipped step (inf or NaN found)", marker=dict(symbol="x", size=9, color="#e4572e")))
    return fig


def precision_figure(summary: Sequence[dict], *, title: str) -> go.Figure:
    """Side by side, per precision: the time per training step, and the test accuracy (mean, with a bar of
    one standard deviation over the seeds)."""
    ran = [s for s in summary if s["runs"]]
    labels = [s["label"] for s in ran]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per training step", "test accuracy"),
                        horizontal_spacing=0.12)
    fig.add_trace(go.Bar(x=labels, y=[1e3 * s["step_seconds"] for s in ran], marker_color=plots.PALETTE[0],
                         text=[f"{1e3 * s['step_seconds']:.3g}" for s in ran], textposition="outside",
                         name="ms per step", showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[100 * s["accuracy_mean"] for s in ran], marker_color="#7f7f7f",
                         error_y=dict(type="data", array=[100 * s["accuracy_sd"] for s in ran]),
                         text=[f"{100 * s['accuracy_mean']:.1f}" for s in ran], textposition="inside",
                         name="accuracy", showlegend=False), row=1, col=2)
    low = min(100 * (s["accuracy_mean"] - s["accuracy_sd"]) for s in ran)
    fig.update_xaxes(title_text="precision")
    fig.update_yaxes(title_text="milliseconds per step", row=1, col=1)
    fig.update_yaxes(title_text="test accuracy (%, mean over seeds)", range=[max(0, low - 10), 100], row=1, col=2)
    fig.update_layout(title=title, margin=dict(t=100))
    return fig
