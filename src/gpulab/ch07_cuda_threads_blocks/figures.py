"""Chapter 07's figures: heatmaps of a launch, and which thread owns which element of a grid."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.core.plots import hover_text
from gpulab.core.sweep import ok_rows


def heatmap_figure(rows: Sequence[dict], x: str, y: str, z: str, *, title: str, x_title: str, y_title: str,
                   z_title: str, hover: Sequence[str] = (), text_format: str = "{:,.0f}") -> go.Figure:
    """A heatmap of ``row[z]`` over the distinct ``row[x]`` (columns) and ``row[y]`` (rows), each cell labelled.

    x and y are treated as categories, in sorted order, so that sizes such as 32, 64, ... 1024 sit evenly.
    """
    rows = ok_rows(rows)
    xs, ys = sorted({r[x] for r in rows}), sorted({r[y] for r in rows})
    cell = {(r[x], r[y]): r for r in rows}
    values = [[cell[(a, b)][z] if (a, b) in cell else None for a in xs] for b in ys]
    fig = go.Figure(go.Heatmap(
        x=[str(a) for a in xs], y=[str(b) for b in ys], z=values, colorscale="Viridis",
        colorbar=dict(title=dict(text=z_title)),
        text=[[text_format.format(v) if v is not None else "" for v in line] for line in values],
        texttemplate="%{text}",
        hovertext=[[hover_text(cell[(a, b)], hover) if (a, b) in cell else "" for a in xs] for b in ys],
        hoverinfo="text",
    ))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def grid_owner_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """The matrix of :func:`gpulab.ch07_cuda_threads_blocks.threads.grid_2d`: each element coloured by the block that
    wrote it and labelled with the writing thread's (threadIdx.x, threadIdx.y)."""
    rows = list(rows)
    n_rows, n_cols = max(r["row"] for r in rows) + 1, max(r["col"] for r in rows) + 1
    blocks_x = max(r["block_x"] for r in rows) + 1
    cell = {(r["row"], r["col"]): r for r in rows}
    block = [[cell[(i, j)]["block_y"] * blocks_x + cell[(i, j)]["block_x"] for j in range(n_cols)]
             for i in range(n_rows)]
    text = [[f"({cell[(i, j)]['thread_x']},{cell[(i, j)]['thread_y']})" for j in range(n_cols)] for i in range(n_rows)]
    hover = [[f"element [{i}][{j}]<br>blockIdx = ({cell[(i, j)]['block_x']}, {cell[(i, j)]['block_y']})<br>"
              f"threadIdx = ({cell[(i, j)]['thread_x']}, {cell[(i, j)]['thread_y']})" for j in range(n_cols)]
             for i in range(n_rows)]
    fig = go.Figure(go.Heatmap(
        z=block, text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text", colorscale="Cividis",
        colorbar=dict(title=dict(text="block<br>y * gridDim.x + x")), xgap=1, ygap=1,
    ))
    fig.update_layout(title=title, xaxis_title="column (x = blockIdx.x * blockDim.x + threadIdx.x)",
                      yaxis_title="row (y = blockIdx.y * blockDim.y + threadIdx.y)")
    fig.update_yaxes(autorange="reversed")
    return fig
