"""Chapter 14's figures: batched GEMM methods against a loop, and LU on the device and the host."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.ch14_batched_linear_algebra.batched import METHOD_LABELS
from gpulab.core import plots
from gpulab.core.sweep import ok_rows


def methods_figure(rows: Iterable[dict], *, title: str, labels: Mapping[str, str] | None = None) -> go.Figure:
    """GFLOP/s (top) and time per call (bottom) against n, one line per method, one column per batch count; a menu
    picks the dtype when there are several. For the rows of :func:`.batched.gemm_sweep` and
    :func:`.batched.small_lu_sweep`; ``labels`` names the methods in the legend (default :data:`METHOD_LABELS`;
    :data:`.batched.LU_METHOD_LABELS` for LU).

    Every dtype's lines are in the figure already, so the menu works in the static book with no kernel.
    """
    rows = ok_rows(rows)
    if not rows:
        raise ValueError("rows: no measured rows to draw")
    batches = sorted({r["batch"] for r in rows})
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig = make_subplots(rows=2, cols=len(batches), shared_xaxes=True, vertical_spacing=0.08,
                        horizontal_spacing=0.05, subplot_titles=[f"batch of {b:,}" for b in batches])
    owners = []
    for dtype in dtypes:
        for col, batch in enumerate(batches, start=1):
            for i, method in enumerate(methods):
                series = sorted((r for r in rows if (r["dtype"], r["batch"], r["method"]) == (dtype, batch, method)),
                                key=lambda r: r["n"])
                if not series:
                    continue
                for row, key, scale in ((1, "gflops", 1.0), (2, "seconds", 1e3)):
                    fig.add_trace(go.Scatter(
                        x=[r["n"] for r in series], y=[r[key] * scale for r in series], mode="lines+markers",
                        name=(labels or METHOD_LABELS).get(method, method), legendgroup=method,
                        showlegend=(col == 1 and row == 1), visible=dtype == dtypes[0],
                        line=dict(color=plots.PALETTE[i % len(plots.PALETTE)]),
                        marker=dict(symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)], size=8),
                        hovertext=[plots.hover_text(r, ("method", "n", "batch", "dtype", "gflops", "seconds",
                                                        "us_per_problem")) for r in series],
                        hoverinfo="text"), row=row, col=col)
                    owners.append(dtype)
    fig.update_xaxes(type="log", dtick=0.30103)  # a tick at every power of two (log10 2)
    fig.update_yaxes(type="log")
    for col in range(1, len(batches) + 1):
        fig.update_xaxes(title_text="matrix order n", row=2, col=col)
    fig.update_yaxes(title_text="GFLOP/s", row=1, col=1)
    fig.update_yaxes(title_text="time per call (ms)", row=2, col=1)
    menus = []
    if len(dtypes) > 1:
        buttons = [dict(label=d, method="update", args=[{"visible": [o == d for o in owners]}]) for d in dtypes]
        menus = [dict(buttons=buttons, x=0.0, y=1.16, xanchor="left", direction="down")]
    fig.update_layout(title=title if len(dtypes) > 1 else f"{title}, {dtypes[0]}", updatemenus=menus, height=640,
                      legend=dict(orientation="h", y=-0.14), margin=dict(t=110))
    return fig


def lu_figure(rows: Iterable[dict], *, title: str) -> go.Figure:
    """getrf GFLOP/s against n: one line per processor (colour) and dtype (dash), from :func:`.batched.lu_sweep`'s
    rows."""
    rows = ok_rows(rows)
    if not rows:
        raise ValueError("rows: no measured rows to draw")
    fig = go.Figure()
    for i, device in enumerate(d for d in ("cpu", "cuda") if any(r["device"] == d for r in rows)):
        for j, dtype in enumerate(dict.fromkeys(r["dtype"] for r in rows)):
            series = sorted((r for r in rows if r["device"] == device and r["dtype"] == dtype), key=lambda r: r["n"])
            if not series:
                continue
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in series], y=[r["gflops"] for r in series], mode="lines+markers",
                name=f"{'GPU' if device == 'cuda' else 'CPU'} {dtype}",
                line=dict(color=plots.PALETTE[i], dash="solid" if j == 0 else "dash"),
                marker=dict(symbol=plots.SYMBOLS[j % len(plots.SYMBOLS)], size=8),
                hovertext=[plots.hover_text(r, ("processor", "n", "dtype", "gflops", "seconds", "backward_error"))
                           for r in series], hoverinfo="text"))
    fig.update_layout(title=title, xaxis_title="matrix order n", yaxis_title="GFLOP/s")
    fig.update_xaxes(type="log", tickvals=sorted({r["n"] for r in rows}))
    fig.update_yaxes(type="log")
    return fig
