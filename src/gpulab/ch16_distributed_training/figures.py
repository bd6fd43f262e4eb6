"""Chapter 16's figures: parallelism's traffic, the all-reduce's schedules and model, bandwidth, large batches."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.ch16_distributed_training.distributed import (
    ALGORITHMS,
    Message,
    describe_result,
    model_seconds,
    ring_rounds,
    simulate,
)
from gpulab.core import plots
from gpulab.core.validation import positive_int


def parallelism_figure(workers: int = 4, layers: int = 4, *, title: str = "Who computes what") -> go.Figure:
    """Three panels, one per strategy: which worker computes each piece of one training step.

    A piece is (a ``1/workers`` share of the batch) x (a ``1/workers`` slice of a layer's output neurons),
    so each panel has ``workers`` rows and ``layers x workers`` columns, coloured by the worker that owns it.
    """
    p, layers = positive_int("workers", workers), positive_int("layers", layers)
    if layers % p and layers >= p:
        raise ValueError(f"layers: a multiple of workers ({p}) so that pipeline stages are equal, got {layers}")
    owners = {
        "data parallelism: split the batch": lambda row, layer, part: row,
        "tensor parallelism: split each layer": lambda row, layer, part: part,
        "pipeline parallelism: split the layers": lambda row, layer, part: layer * p // layers,
    }
    colours = [plots.PALETTE[i % len(plots.PALETTE)] for i in range(p)]
    scale = [[k / p if j % 2 == 0 else (k + 1) / p, c] for k, c in enumerate(colours) for j in range(2)]
    fig = make_subplots(rows=1, cols=3, subplot_titles=list(owners), horizontal_spacing=0.06)
    for col, owner in enumerate(owners.values(), start=1):
        z = [[owner(row, column // p, column % p) for column in range(layers * p)] for row in range(p)]
        fig.add_trace(go.Heatmap(z=z, zmin=-0.5, zmax=p - 0.5, colorscale=scale, showscale=False, xgap=1, ygap=1,
                                 hovertemplate="batch share %{y}, layer piece %{x}: worker %{z}<extra></extra>"),
                      row=1, col=col)
        for layer in range(1, layers):
            fig.add_vline(x=layer * p - 0.5, line_width=3, line_color="white", row=1, col=col)
        fig.update_xaxes(tickvals=[layer * p + (p - 1) / 2 for layer in range(layers)],
                         ticktext=[f"layer {layer + 1}" for layer in range(layers)], showgrid=False,
                         title_text=f"layers, each in {p} slices of neurons", row=1, col=col)
        fig.update_yaxes(tickvals=list(range(p)), ticktext=[f"samples {row + 1}/{p}" for row in range(p)],
                         autorange="reversed", showgrid=False, visible=col == 1, title_text="share of the batch",
                         row=1, col=col)
    for worker, colour in enumerate(colours):  # the legend: one square per worker
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"worker W{worker}",
                                 marker=dict(symbol="square", size=14, color=colour)), row=1, col=1)
    fig.update_layout(title=title, height=420, margin=dict(l=110, r=20, t=90, b=90),
                      legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="center", x=0.5))
    return fig


def traffic_figure(rows_by_batch: Sequence[dict], *, title: str) -> go.Figure:
    """Bytes sent per worker per step against the global batch, one line per strategy (log-log)."""
    fig = plots.sweep_figure([{**r, "MB": r["sent_bytes"] / 1e6} for r in rows_by_batch], "batch", "MB",
                             color="strategy", title=title, x_title="global batch (samples)",
                             y_title="sent per worker per step (MB)", log_x=True, log_y=True,
                             hover=("strategy", "batch", "MB", "communicates"))
    for i, trace in enumerate(fig.data):
        trace.marker.symbol = plots.SYMBOLS[i % len(plots.SYMBOLS)]
    return fig


def traffic_vs_workers_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """The busiest worker's bytes sent, over the vector's size, against the number of workers; ring's limit, 2."""
    fig = plots.sweep_figure(rows, "workers", "sent_over_size", color="algorithm", title=title,
                             x_title="workers p", y_title="bytes sent by the busiest worker / vector size",
                             hover=("algorithm", "workers", "rounds", "sent_over_size"))
    for i, trace in enumerate(fig.data):
        trace.marker.symbol = plots.SYMBOLS[i % len(plots.SYMBOLS)]
    fig.add_hline(y=2, line_dash="dot", line_color="#444444", annotation_text="2: the ring's limit as p grows",
                  annotation_position="top left")
    return fig


def model_time_figure(workers: int, sizes: Sequence[float], latency_s: float, bandwidth: float, *,
                      title: str) -> go.Figure:
    """The model's time of each algorithm against the message size, for ``workers`` workers (log-log)."""
    rows = [{"algorithm": name, "bytes": s, "microseconds": 1e6 * model_seconds(name, workers, s, latency_s, bandwidth)}
            for name in ALGORITHMS for s in sizes]
    fig = plots.sweep_figure(rows, "bytes", "microseconds", color="algorithm", title=title,
                             x_title="message size (bytes)", y_title="modelled time (µs)", log_x=True, log_y=True,
                             hover=("algorithm", "bytes", "microseconds"))
    for i, trace in enumerate(fig.data):
        trace.marker.symbol = plots.SYMBOLS[i % len(plots.SYMBOLS)]
    return fig


def ring_steps_figure(workers: int = 4, *, title: str = "Ring all-reduce, step by step") -> go.Figure:
    """A slider over the steps of a ring all-reduce: which workers' values each chunk of each worker holds.

    Worker w starts with the value 2^w in every element, so a sum tells which workers it holds (bit w).
    A cell reads "A+C" when a chunk holds workers A's and C's values; its colour counts them. Cells
    that a message has just written are framed.
    """
    p = positive_int("workers", workers)
    if not 2 <= p <= 8:
        raise ValueError(f"workers: between 2 and 8 (a picture, not a benchmark), got {p}")
    rounds = ring_rounds(p, p)  # one element per chunk
    run = simulate([np.full(p, 2.0**w) for w in range(p)], rounds, keep_history=True)
    letters = "ABCDEFGH"

    def cells(vectors: list[np.ndarray]) -> tuple[list[list[int]], list[list[str]]]:
        bits = [[int(value) for value in vector] for vector in vectors]
        counts = [[bin(b).count("1") for b in row] for row in bits]
        text = [["+".join(letters[w] for w in range(p) if b >> w & 1) for b in row] for row in bits]
        return counts, text

    def caption(index: int) -> str:
        if index == 0:
            return "start: each worker holds its own vector, cut into p chunks"
        if index <= p - 1:
            return (f"reduce-scatter step {index} of {p - 1}: each worker sends one chunk to its right "
                    "neighbour, which adds it")
        return (f"all-gather step {index - p + 1} of {p - 1}: each worker passes a summed chunk to its right "
                "neighbour, which overwrites its own")

    def boxes(messages: Sequence[Message]) -> list[dict]:  # a frame round each cell that a message just wrote
        return [dict(type="rect", x0=m.start - 0.46, x1=m.start + 0.46, y0=m.target - 0.44, y1=m.target + 0.44,
                     line=dict(color="#e4572e", width=4)) for m in messages]

    frames = []
    for index, vectors in enumerate(run.history):
        counts, text = cells(vectors)
        frames.append(go.Frame(name=str(index), data=[go.Heatmap(z=counts, text=text)],
                               layout=dict(title_text=f"{title}<br><sub>{caption(index)}</sub>",
                                           shapes=boxes(rounds[index - 1] if index else []))))
    # Light to mid blue, so that the dark cell text stays readable on every count.
    colours = [[0.0, "#f3f8fd"], [1.0, "#6fa8dc"]]
    fig = go.Figure(frames=frames)
    fig.add_trace(go.Heatmap(z=frames[0].data[0].z, text=frames[0].data[0].text, texttemplate="%{text}",
                             textfont=dict(size=14), zmin=0.5, zmax=p + 0.5, colorscale=colours, xgap=2, ygap=2,
                             colorbar=dict(title="workers<br>summed", dtick=1),
                             hovertemplate="worker %{y}, chunk %{x}: %{text}<extra></extra>"))
    steps = [dict(method="animate", label=str(index), args=[[str(index)], dict(mode="immediate", frame=dict(
        duration=0, redraw=True), transition=dict(duration=0))]) for index in range(len(frames))]
    fig.update_layout(
        title=dict(text=f"{title}<br><sub>{caption(0)}</sub>", y=0.97, yanchor="top"), height=280 + 60 * p,
        margin=dict(t=150, b=40),
        xaxis=dict(title="chunk", side="top", tickvals=list(range(p)), showgrid=False),
        yaxis=dict(title="worker", tickvals=list(range(p)), ticktext=[f"{w} ({letters[w]})" for w in range(p)],
                   autorange="reversed", showgrid=False),
        sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix="step "), pad=dict(t=20))],
    )
    return fig


def bandwidth_figure(runs: Sequence[tuple[str, Sequence[dict]]], *, title: str, y: str = "busbw_gbs") -> go.Figure:
    """All-reduce bandwidth (``y``: 'busbw_gbs' or 'algbw_gbs') against message size, one line per labelled run."""
    fig = go.Figure()
    for i, (label, rows) in enumerate(runs):
        good = [r for r in rows if r.get("status", "ok") == "ok"]
        fig.add_trace(go.Scatter(x=[r["bytes"] for r in good], y=[r[y] for r in good], mode="lines+markers", name=label,
                                 marker=dict(symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)]),
                                 line=dict(color=plots.PALETTE[i % len(plots.PALETTE)]),
                                 hovertext=[plots.hover_text(r, ("bytes", "seconds", "algbw_gbs", "busbw_gbs"))
                                            for r in good], hoverinfo="text+name"))
    fig.update_layout(title=title, xaxis_title="message size (bytes)",
                      yaxis_title=("bus" if y == "busbw_gbs" else "algorithm") + " bandwidth (GB/s)")
    fig.update_xaxes(type="log", exponentformat="power")
    fig.update_yaxes(type="log")
    return fig


def large_batch_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Training time against the (final) global batch, one marker per result, labelled (log-log)."""
    fig = go.Figure()
    processors = list(dict.fromkeys(r["processor"] for r in rows))
    for i, name in enumerate(processors):
        group = [r for r in rows if r["processor"] == name]
        fig.add_trace(go.Scatter(
            x=[r["batch_end"] for r in group], y=[r["minutes"] for r in group], mode="markers+text", name=name,
            text=[f"{r['who']} {r['year']}" for r in group], textposition="top center",
            marker=dict(size=12, symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)],
                        color=plots.PALETTE[i % len(plots.PALETTE)]),
            hovertext=[describe_result(r) for r in group], hoverinfo="text"))
    fig.update_layout(title=title, xaxis_title="global batch (images; the final one where it grew)",
                      yaxis_title="training time (minutes)")
    batches = [r["batch_end"] for r in rows]
    fig.update_xaxes(type="log", range=[math.log10(min(batches)) - 0.3, math.log10(max(batches)) + 0.4])
    fig.update_yaxes(type="log")
    return fig
