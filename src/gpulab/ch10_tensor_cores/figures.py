"""Chapter 10's figures: formats by error and rate, the WMMA kernels against cuBLAS, layer shapes."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.core import plots, specs


def formats_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Each format as a point: its error against float64 (x, log) and its rate (y, log)."""
    fig = go.Figure()
    for i, r in enumerate(r for r in rows if r.get("status") == "ok"):
        fig.add_trace(go.Scatter(
            x=[r["relative_error"]], y=[r["tflops"]], mode="markers+text", name=r["format"], text=[r["format"]],
            textposition="top center", marker=dict(size=14, color=plots.PALETTE[i % len(plots.PALETTE)],
                                                   symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)]),
            hovertext=plots.hover_text(r, ("unit", "tflops", "relative_error", "fraction_of_peak")), hoverinfo="text",
        ))
    fig.update_layout(title=title, showlegend=False)
    fig.update_xaxes(type="log", title="relative error against float64 (lower is better)")
    fig.update_yaxes(type="log", title="TFLOP/s (higher is better)")
    return fig


def wmma_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """TFLOP/s of every kernel of :func:`.wmma.wmma_comparison` as horizontal bars in the table's order, tensor cores
    and CUDA cores in two colours and fills, each bar labelled with its share of cuBLAS float16; a dotted line
    at half of cuBLAS float16."""
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    fig = go.Figure()
    for i, unit in enumerate((specs.TENSOR_CORES, specs.CUDA_CORES)):
        chosen = [r for r in ok if r["unit"] == unit]
        fig.add_trace(go.Bar(
            orientation="h", y=[r["name"] for r in chosen], x=[r["tflops"] for r in chosen], name=f"on the {unit}",
            marker_color=plots.PALETTE[i], marker_pattern_shape=plots.PATTERNS[i], textposition="outside",
            text=[f"{r['tflops']:.0f} ({r['fraction_of_cublas_fp16']:.0%})" for r in chosen], cliponaxis=False,
            hovertext=[plots.hover_text(r, ("tflops", "relative_error", "registers", "shared_bytes", "blocks_per_sm"))
                       for r in chosen], hoverinfo="text",
        ))
    cublas = next((r["tflops"] for r in ok if r["name"] == "cuBLAS float16"), None)
    if cublas:
        fig.add_vline(x=cublas / 2, line_dash="dot", line_color="#444444", annotation_text="half of cuBLAS float16",
                      annotation_position="bottom right")
    fig.update_yaxes(autorange="reversed", automargin=True)  # the first row of the table at the top
    fig.update_layout(title=title, xaxis_title="TFLOP/s (labels: TFLOP/s and the share of cuBLAS float16)",
                      height=160 + 30 * len(ok), legend=dict(orientation="h", y=-0.15), margin=dict(r=90))
    return fig


def layer_gemms_figure(rows: Sequence[dict], x: str, *, title: str, x_title: str) -> go.Figure:
    """TFLOP/s of each GEMM of the layer (and the step) against ``x`` ('batch' or 'outputs'), as grouped bars;
    sizes that are multiples of 8 are marked in the axis labels."""
    ok = [r for r in rows if r.get("status") == "ok"]
    sizes = sorted({r[x] for r in ok})
    labels = {s: f"{s:,}" + (" (x8)" if s % 8 == 0 else "") for s in sizes}
    fig = go.Figure()
    for i, phase in enumerate(dict.fromkeys(r["gemm"] for r in ok)):
        chosen = sorted((r for r in ok if r["gemm"] == phase), key=lambda r: r[x])
        fig.add_trace(go.Bar(x=[labels[r[x]] for r in chosen], y=[r["tflops"] for r in chosen], name=phase,
                             marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                             marker_pattern_shape=plots.PATTERNS[i % len(plots.PATTERNS)],
                             hovertext=[plots.hover_text(r, ("M", "N", "K", "seconds", "tflops")) for r in chosen],
                             hoverinfo="text"))
    fig.update_layout(title=title, barmode="group", yaxis_title="TFLOP/s", xaxis_title=x_title,
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(type="category")
    return fig
