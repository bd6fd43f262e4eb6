"""Chapter 05's figures: layouts in memory, im2col's matrix, and the methods' time and memory."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpulab.ch05_convolutions_as_gemms.conv import LAYOUTS, im2col, layout_offsets, output_size
from gpulab.ch05_convolutions_as_gemms.sweeps import METHODS
from gpulab.core import plots
from gpulab.core.sweep import ok_rows
from gpulab.core.validation import positive_int


def layout_figure(c: int = 64, h: int = 5, w: int = 4, *, title: str | None = None) -> go.Figure:
    """Memory offset of every (c, h, w) element of a 1 x C x H x W tensor, in NCHW (left) and NHWC (right).

    Rows are channels, columns the H x W pixels in row-major order; colour and hover give the offset.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("NCHW: w, then h, then c", "NHWC: c, then w, then h"),
                        horizontal_spacing=0.12)
    pixels = [f"h{i} w{j}" for i in range(h) for j in range(w)]
    for col, name in enumerate(LAYOUTS, start=1):
        offsets = layout_offsets((1, c, h, w), name)[0].reshape(c, h * w)
        hover = [[f"c = {ci}, h = {p // w}, w = {p % w}<br>{name} offset {offsets[ci, p].item()}"
                  for p in range(h * w)] for ci in range(c)]
        fig.add_trace(go.Heatmap(
            z=offsets.tolist(), x=pixels, y=list(range(c)), colorscale="Viridis", showscale=col == 2,
            text=offsets.tolist(), texttemplate="%{text}", textfont=dict(size=8), hovertext=hover,
            hoverinfo="text", colorbar=dict(title="offset"), zmin=0, zmax=c * h * w - 1,
        ), row=1, col=col)
        fig.update_xaxes(title_text="pixel (h, w)", tickangle=-60, row=1, col=col)
        fig.update_yaxes(title_text="channel c", autorange="reversed", row=1, col=col)
    fig.update_layout(title=title or f"Where each element of a 1 x {c} x {h} x {w} tensor lives in memory",
                      height=max(440, 16 * c + 160))
    return fig


def memory_order_figure(c: int = 64, h: int = 5, w: int = 4, count: int = 24, *, title: str | None = None) -> go.Figure:
    """The first ``count`` elements of memory, in order, for each layout: which (c, h, w) sits at each offset.

    One heatmap with a row per layout (two one-row heatmaps on a category axis break plotly.js's calc).
    """
    count = positive_int("count", count)
    channels, labels = [], []
    for name in LAYOUTS:
        flat = layout_offsets((1, c, h, w), name)[0].flatten()
        order = torch.argsort(flat)[:count].tolist()  # element index (c, h, w) row-major, sorted by its offset
        channels.append([i // (h * w) for i in order])
        labels.append([f"c{i // (h * w)}<br>h{i // w % h}<br>w{i % w}" for i in order])
    fig = go.Figure(go.Heatmap(
        z=channels, x=list(range(len(labels[0]))), y=list(LAYOUTS), text=labels, texttemplate="%{text}",
        textfont=dict(size=9), colorscale="Viridis", zmin=0, zmax=c - 1, showscale=False,
        hovertemplate="%{y} offset %{x}: %{text}<extra></extra>", xgap=2, ygap=6,
    ))
    fig.update_layout(title=title or f"The first {count} elements in memory (colour: channel)", height=330,
                      xaxis=dict(title="memory offset", dtick=1, showgrid=False),
                      yaxis=dict(autorange="reversed", showgrid=False))
    return fig






def methods_figure(rows: Sequence[dict], *, value: str = "tflops", title: str, y_title: str,
                   log_y: bool = True) -> go.Figure:
    """Grouped bars, one group per layer and one bar per method; a menu picks the dtype (static in the book)."""
    rows = ok_rows(rows)
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    fig, owners = go.Figure(), []
    for dtype in dtypes:
        for i, method in enumerate(methods):
            series = [r for r in rows if r["dtype"] == dtype and r["method"] == method]
            fig.add_trace(go.Bar(
                x=[r["layer"] for r in series], y=[r[value] for r in series], name=method,
                visible=dtype == dtypes[0], marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                hovertext=[f"{r['layer']}, {method}, {dtype}<br>{r['seconds'] * 1e3:.3g} ms, "
                           f"{r['tflops']:.3g} TFLOP/s<br>GEMM M={r['gemm_m']:,} N={r['gemm_n']:,} K={r['gemm_k']:,}"
                           for r in series], hoverinfo="text",
            ))
            owners.append(dtype)
    buttons = [dict(label=d, method="update", args=[{"visible": [o == d for o in owners]}]) for d in dtypes]
    fig.update_layout(title=title, yaxis_title=y_title, barmode="group", legend=dict(orientation="h", y=-0.25),
                      updatemenus=[dict(buttons=buttons, x=0.0, y=1.14, xanchor="left", direction="down")]
                      if len(dtypes) > 1 else [])
    fig.update_yaxes(type="log" if log_y else "linear")
    return fig


def im2col_figure(h: int = 4, w: int = 4, r: int = 3, s: int = 3, stride: int = 1, padding: int = 1, *,
                  title: str | None = None) -> go.Figure:
    """The im2col matrix of a one-channel h x w image whose pixels are numbered: each pixel is copied up to R S times.

    Each column is one output position's window; a cell shows which input pixel was copied there
    (blank: a tap in the zero padding).
    """
    image = torch.arange(1, h * w + 1, dtype=torch.float64).reshape(1, 1, h, w)  # 1-based: padding reads 0
    columns = (im2col(image, r, s, stride, padding) - 1).long()  # pixel number, -1 in the padding
    cells = [[None if v < 0 else v for v in row] for row in columns.tolist()]
    fig = go.Figure(go.Heatmap(
        z=cells, text=[["" if v is None else str(v) for v in row] for row in cells], texttemplate="%{text}",
        colorscale="Viridis", showscale=False, xgap=1, ygap=1,
        x=[f"p{j // output_size(w, s, stride, padding)} q{j % output_size(w, s, stride, padding)}"
           for j in range(columns.shape[1])],
        y=[f"r{i // s} s{i % s}" for i in range(r * s)],
        hovertemplate="output position %{x}, filter tap %{y}: input pixel %{text}<extra></extra>",
    ))
    copies = torch.bincount(columns[columns >= 0].flatten(), minlength=h * w)
    fig.update_layout(
        title=title or (f"im2col of a {h} x {w} image, {r} x {s} filter, stride {stride}, padding {padding}: "
                        f"{columns.numel()} cells for {h * w} pixels (each copied up to {int(copies.max())} times)"),
        xaxis=dict(title="column: output position (p, q)", tickangle=-60, showgrid=False),
        yaxis=dict(title="row: filter tap (r, s)", autorange="reversed", showgrid=False), height=420,
    )
    return fig
