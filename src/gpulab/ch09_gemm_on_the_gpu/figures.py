"""Chapter 09's figures: the worklog against cuBLAS, the tiling hierarchy, a block schedule, waves and quantization."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.ch04_mlp_gemms.waves import tile_waves
from gpulab.ch09_gemm_on_the_gpu.gemm import BEST, LANES, TUNABLE, Step, blocks_per_busiest_sm, sm_efficiency
from gpulab.core import plots
from gpulab.core.sweep import ok_rows


def worklog_figure(rows: Sequence[dict], *, peak_tflops: float | None, title: str) -> go.Figure:
    """TFLOP/s of each step as bars labelled with their share of cuBLAS; cuBLAS and the FP32 peak as lines."""
    steps = [r for r in rows if r["step"] > 0]
    cublas = next(r for r in rows if r["step"] == 0)
    fig = go.Figure(go.Bar(
        x=[f"{r['step']}. {r['label']}" for r in steps], y=[r["tflops"] for r in steps],
        text=[f"{r['fraction_of_cublas']:.0%}" for r in steps], textposition="outside",
        marker_color=plots.PALETTE[0], name="hand-written SGEMM",
        hovertext=[plots.hover_text(r, ("file", "tflops", "registers", "shared_bytes", "blocks_per_sm",
                                        "global_floats_per_fma", "shared_loads_per_fma")) for r in steps],
        hoverinfo="text",
    ))
    fig.add_hline(y=cublas["tflops"], line_dash="dash", line_color=plots.PALETTE[1],
                  annotation_text=f"cuBLAS {cublas['tflops']:.1f}", annotation_position="top left")
    if peak_tflops:
        fig.add_hline(y=peak_tflops, line_dash="dot", line_color="#444444",
                      annotation_text=f"FP32 peak {peak_tflops:.1f}", annotation_position="top left")
    fig.update_layout(title=title, yaxis_title="TFLOP/s (bars labelled with the share of cuBLAS)",
                      xaxis_tickangle=-30, showlegend=False)
    return fig


def hierarchy_figure(s: Step = BEST) -> go.Figure:
    """The tiling of step ``s`` as CUTLASS draws it: the block's tile of C, its warp tiles, and the elements of
    C that warp 0's lane 0 computes (its 4 x 4 pieces, one per pass of the warp over its tile)."""
    bm, bn = s.tile
    wm, wn = dict(s.defines).get("WM", TUNABLE["WM"]), dict(s.defines).get("WN", TUNABLE["WN"])
    lanes_m, lanes_n = LANES
    fig = go.Figure()

    def rect(x0, y0, x1, y1, **style):
        fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, **style)

    rect(0, 0, bn, bm, line=dict(width=3, color="#222222"))
    for wr in range(0, bm, wm):
        for wc in range(0, bn, wn):
            warp = wr // wm * (bn // wn) + wc // wn
            rect(wc, wr, wc + wn, wr + wm, line=dict(width=1.5, color=plots.PALETTE[1]),
                 fillcolor="rgba(221,132,82,0.18)" if warp == 0 else None)
            fig.add_annotation(x=wc + wn / 2, y=wr + wm / 2, text=f"warp {warp}", showarrow=False)
    for im in range(wm // (4 * lanes_m)):
        for jn in range(wn // (4 * lanes_n)):
            r0, c0 = im * 4 * lanes_m, jn * 4 * lanes_n
            rect(c0, r0, c0 + 4 * lanes_n, r0 + 4 * lanes_m, line=dict(width=1, dash="dot", color="#444444"))
            rect(c0, r0, c0 + 4, r0 + 4, line=dict(width=0), fillcolor=plots.PALETTE[0])
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker=dict(color=plots.PALETTE[0], symbol="square"),
                             name="the outputs of warp 0, lane 0"))
    fig.update_xaxes(range=[-2, bn + 2], title="column of the block's tile of C", constrain="domain")
    fig.update_yaxes(range=[bm + 2, -2], title="row", scaleanchor="x")
    fig.update_layout(title=f"Step {s.number}: a {bm} x {bn} block tile, {wm} x {wn} warp tiles, "
                            f"{s.thread_tile[0]} x {s.thread_tile[1]} outputs per thread",
                      height=560, legend=dict(orientation="h", y=-0.12))
    return fig


def schedule_figure(m: int, n: int, k: int, tile: int, block: tuple[int, int] = (1, 1)) -> go.Figure:
    """Which tiles of A and B block ``block`` = (row, column) of a tiled GEMM stages at each step along K:
    a slider walks the steps; C's tile is the one the block computes."""
    rows, cols, depth = (math.ceil(x / tile) for x in (m, n, k))
    by, bx = block
    if not (0 <= by < rows and 0 <= bx < cols):
        raise ValueError(f"block: (row, column) within the {rows} x {cols} grid of tiles, got {block}")
    fig = make_subplots(rows=1, cols=3, subplot_titles=("A (M x K)", "B (K x N)", "C (M x N)"),
                        horizontal_spacing=0.08)

    def grid(r, c, lit):
        return [[1.0 if (i, j) in lit else 0.15 for j in range(c)] for i in range(r)]

    def panels(step):
        return (grid(rows, depth, {(by, step)}), grid(depth, cols, {(step, bx)}), grid(rows, cols, {(by, bx)}))

    for col, z in enumerate(panels(0), start=1):
        fig.add_trace(go.Heatmap(z=z, zmin=0, zmax=1, colorscale="Blues", showscale=False, xgap=2, ygap=2,
                                 hoverinfo="skip"), row=1, col=col)
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    steps = [dict(method="restyle", label=str(t), args=[{"z": list(panels(t))}, [0, 1, 2]]) for t in range(depth)]
    fig.update_layout(title=f"Block ({by}, {bx}) of a {m} x {n} x {k} GEMM in {tile} x {tile} tiles: "
                            "the tiles it stages at each step",
                      sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix="step along K: "), pad=dict(t=30))],
                      height=420)
    return fig


def waves_figure(m: int, n: int, tile: Sequence[int], sms: int, *, title: str | None = None) -> go.Figure:
    """The tiles of an M x N output, each coloured by the wave it runs in (tiles are handed out row by row)."""
    model = tile_waves(m, n, tile, sms)
    rows, cols = math.ceil(m / model.tile_m), math.ceil(n / model.tile_n)
    wave = [[(i * cols + j) // model.slots + 1 for j in range(cols)] for i in range(rows)]
    fig = go.Figure(go.Heatmap(z=wave, text=wave, texttemplate="%{text}" if rows * cols <= 400 else None,
                               colorscale="Viridis", xgap=1, ygap=1, colorbar=dict(title=dict(text="wave")),
                               hovertemplate="tile row %{y}, column %{x}: wave %{z}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="tile row")
    fig.update_xaxes(title="tile column")
    fig.update_layout(title=title or (
        f"{m} x {n} in {model.tile_m} x {model.tile_n} tiles on {sms} SMs: {model.tiles} tiles, {model.waves} waves, "
        f"{model.efficiency:.0%} of the peak at best"))
    return fig


def quantization_figure(rows: Sequence[dict], x: str, *, partial: float, title: str, x_title: str) -> go.Figure:
    """The kernel's and cuBLAS's TFLOP/s against ``x``, with two models of the kernel scaled to its best point:
    the slot model (dotted: every block a slot, :func:`gpulab.ch04_mlp_gemms.waves.tile_waves`) and the per-SM model of
    :func:`sm_efficiency` with ``partial`` (dashed); a dotted line where the busiest SM gets another block."""
    rows = sorted(ok_rows(rows), key=lambda r: r[x])
    best = max(rows, key=lambda r: r["kernel_tflops"])
    models = []
    for r in rows:
        models.append({**r, "slot_model": r["efficiency"], "sm_model": sm_efficiency(r, partial),
                       "blocks_per_sm": blocks_per_busiest_sm(r)})
    for key in ("slot_model", "sm_model"):
        scale = best["kernel_tflops"] / next(m[key] for m in models if m[x] == best[x])
        for m in models:
            m[f"{key}_tflops"] = scale * m[key]
    fig = plots.sweep_figure(rows, x, "kernel_tflops", name=f"{rows[0]['kernel']} ({rows[0]['tile']} tiles)",
                             title=title, x_title=x_title, y_title="TFLOP/s",
                             hover=("m", "n", "k", "tiles", "waves", "efficiency"))
    plots.add_sweep(fig, rows, x, "cublas_tflops", name="cuBLAS", hover=("m", "n", "k"))
    plots.add_sweep(fig, models, x, "sm_model_tflops", name=f"model per SM (partial group {partial:.2f})",
                    dash="dash", hover=("tiles", "blocks_per_sm", "sm_model"))
    plots.add_sweep(fig, models, x, "slot_model_tflops", name="model per slot (waves of SMs x blocks)",
                    dash="dot", hover=("tiles", "waves", "slot_model"))
    for trace in fig.data[-2:]:
        trace.mode = "lines"
    for before, after in zip(models, models[1:], strict=False):
        if after["blocks_per_sm"] > before["blocks_per_sm"]:
            plots.vertical_marker(fig, after[x], str(after["blocks_per_sm"]))
    fig.update_layout(legend=dict(orientation="h", y=-0.2))
    return fig
