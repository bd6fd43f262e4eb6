"""Chapter 03's figures: blocking on the roofline, and recorded BLAS calls explored on it."""

from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go

from gpulab.core.plots import PALETTE, _add_roofs, add_sweep, hover_text, sweep_figure
from gpulab.core.roofline import Roofline
from gpulab.core.sweep import ok_rows


def blocking_figure(rows: Iterable[dict], roofline: Roofline, *, title: str) -> go.Figure:
    """Measured rate of the blocked GEMM against block size, with the roofline's bound min(P, B q) drawn over it."""
    rows = list(rows)
    fig = sweep_figure(rows, "block", "gflops", name="measured", log_x=True, log_y=True,
                       hover=("block", "intensity", "gflops", "seconds"), title=title,
                       x_title="block size b", y_title="GFLOP/s")
    bound = [{"block": r["block"], "gflops": roofline.attainable(r["intensity"], r["dtype"]) / 1e9}
             for r in ok_rows(rows)]
    return add_sweep(fig, bound, "block", "gflops", name="roofline bound", dash="dash")


def roofline_explorer_figure(roofline: Roofline, rows: Iterable[dict], *, title: str) -> go.Figure:
    """A static explorer: a dropdown picks the dtype; each op's recorded sizes sit on that dtype's roofline.

    It works in the static book with no kernel, since every variant is in the figure already.
    """
    rows = ok_rows(rows)
    dtypes = [d for d in roofline.peaks if any(r["dtype"] == d for r in rows)]
    fig = go.Figure()
    owners: list[str] = []
    for dtype in dtypes:
        visible = dtype == dtypes[0]
        _add_roofs(fig, roofline, dtype, "#444444", visible)
        owners.append(dtype)
        for i, op in enumerate(dict.fromkeys(r["op"] for r in rows)):
            series = sorted((r for r in rows if r["dtype"] == dtype and r["op"] == op), key=lambda r: r["n"])
            fig.add_trace(go.Scatter(
                x=[r["intensity"] for r in series], y=[r["gflops"] for r in series], visible=visible,
                mode="lines+markers", name=op, marker=dict(size=9, color=PALETTE[i % len(PALETTE)]),
                hovertext=[hover_text(r, ("op", "n", "dtype", "intensity", "gflops", "gbytes_per_s")) for r in series],
                hoverinfo="text",
            ))
            owners.append(dtype)
    buttons = [dict(label=d, method="update", args=[{"visible": [o == d for o in owners]}]) for d in dtypes]
    fig.update_layout(
        title=title, updatemenus=[dict(buttons=buttons, x=0.0, y=1.13, xanchor="left", direction="down")],
        xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
        yaxis=dict(type="log", title="rate (GFLOP/s)"),
    )
    return fig
