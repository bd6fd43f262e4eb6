"""Chapter 04's figures: quantization steps, alignment, and a training run's loss."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.ch04_mlp_gemms.waves import TILE_MODELS, predicted_rows, tile_label, wave_steps
from gpulab.core import plots
from gpulab.core.sweep import ok_rows


def quantization_figure(rows: Sequence[dict], x: str, *, sms: int, vary: str, title: str, x_title: str,
                        tiles: Sequence[Sequence[int]] = TILE_MODELS, max_markers: int = 12) -> go.Figure:
    """Measured TFLOP/s against ``x`` per dtype, with the tile/wave prediction (dashed) and its wave steps (dotted).

    A menu picks the tile shape of the prediction; every variant is in the figure, so it works in the
    static book. ``vary`` says which GEMM dimension ``x`` is: 'm' (outputs) or 'n' (batch).
    """
    rows = ok_rows(rows)
    fig = go.Figure()
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    colors = {d: plots.PALETTE[i % len(plots.PALETTE)] for i, d in enumerate(dtypes)}
    plots.add_sweep(fig, rows, x, "tflops", color="dtype", name="measured", colors=colors,
                    hover=("batch", "inputs", "outputs", "seconds", "tflops"))
    measured_traces = len(fig.data)
    owners: list[int | None] = [None] * measured_traces  # None: always shown
    menus_layout = []
    lo, hi = min(r[x] for r in rows), max(r[x] for r in rows)
    fixed = rows[0]["N"] if vary == "m" else rows[0]["M"]
    for i, tile in enumerate(tiles):
        predicted = predicted_rows(rows, x, tile=tile, sms=sms)
        before = len(fig.data)
        plots.add_sweep(fig, predicted, x, "tflops", color="dtype", name=f"model, {tile_label(tile)}:", dash="dash",
                        colors=colors, hover=("tiles", "waves", "efficiency"))
        for trace in fig.data[before:]:
            trace.visible = i == 0
            trace.mode = "lines"
        owners += [i] * (len(fig.data) - before)
        steps = wave_steps(lo, hi, fixed, vary=vary, tile=tile, sms=sms)[:max_markers]
        shapes = [dict(type="line", x0=s, x1=s, y0=0, y1=1, yref="paper", line=dict(dash="dot", color="#444444"))
                  for s in steps]
        notes = [dict(x=s, y=1.0, yref="paper", text=f"wave {k + 2}", showarrow=False, xanchor="left",
                      yanchor="top", xshift=2, font=dict(size=10), bgcolor="rgba(255,255,255,0.8)")
                 for k, s in enumerate(steps)]
        menus_layout.append((f"model: {tile_label(tile)}", shapes, notes))
    buttons = [dict(label=label, method="update",
                    args=[{"visible": [o is None or o == i for o in owners]}, {"shapes": shapes, "annotations": notes}])
               for i, (label, shapes, notes) in enumerate(menus_layout)]
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title="TFLOP/s", shapes=menus_layout[0][1],
                      annotations=menus_layout[0][2],
                      updatemenus=[dict(buttons=buttons, x=0.0, y=1.14, xanchor="left", direction="down")],
                      margin=dict(t=100))
    return fig


def alignment_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Rate relative to the base size, per varied dimension and size, one bar per dtype."""
    good = [r for r in ok_rows(rows) if "relative" in r]
    categories: dict[str, dict] = {}
    for r in good:
        key = f"{r['vary']} = {r['size']}" + ("" if r["multiple_of_8"] else " (not x8)")
        categories.setdefault(key, {"shape": key})[r["dtype"]] = r["relative"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in good))
    fig = plots.bars_figure(list(categories.values()), "shape", {d: d for d in dtypes}, title=title,
                            y_title="rate relative to the base size")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#444444")
    return fig


def loss_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Training loss and accuracies against epoch."""
    fig = plots.sweep_figure(rows, "epoch", "loss", name="training loss", title=title, x_title="epoch",
                             y_title="mean cross-entropy", hover=("epoch", "loss", "train_accuracy", "test_accuracy"))
    for key, name in (("train_accuracy", "training accuracy"), ("test_accuracy", "test accuracy")):
        fig.add_trace(go.Scatter(x=[r["epoch"] for r in rows], y=[r[key] for r in rows], name=name, yaxis="y2",
                                 mode="lines", line=dict(dash="dash")))
    fig.update_layout(yaxis2=dict(title="accuracy", overlaying="y", side="right", range=[0, 1.02], showgrid=False),
                      legend=dict(x=0.55, y=0.5))
    return fig
