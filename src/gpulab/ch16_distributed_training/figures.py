"""Chapter 16's figures and tables of models and simulations: parallelism's traffic, the all-reduce's schedules and
model, large batches. The measured all-reduces and DDP steps are drawn by :mod:`.measured`."""

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
    parallelism_traffic,
    parameter_count,
    ring_rounds,
    simulate,
)
from gpulab.core import plots
from gpulab.core.printing import format_bytes
from gpulab.core.tables import Column, Table, table
from gpulab.core.validation import positive_int

SIZE = {"format": lambda b: format_bytes(int(b))}


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
    # Light to mid blue, so that the dark cell text stays readable on every count; the text's size is plotly's
    # "auto": as large as fits a cell (up to the figure's font), so "A+B+C+D" fits a phone's narrow cells too.
    colours = [[0.0, "#f3f8fd"], [1.0, "#6fa8dc"]]
    fig = go.Figure(frames=frames)
    fig.add_trace(go.Heatmap(z=frames[0].data[0].z, text=frames[0].data[0].text, texttemplate="%{text}",
                             zmin=0.5, zmax=p + 0.5, colorscale=colours, xgap=2, ygap=2,
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


def traffic_table(width: int, depth: int, batch: int, workers: int) -> Table:
    """:func:`.distributed.parallelism_traffic` of the worked example: per strategy, the weights a worker holds, the
    bytes it sends per step and in how many messages, what they are, and whether they overlap the computation."""
    parameters = parameter_count([width] * (depth + 1))
    return table(parallelism_traffic(width, depth, batch, workers),
                 [Column("strategy"), Column("weight_bytes", "weights held", **SIZE),
                  Column("sent_bytes", "sent per step", **SIZE), Column("messages"),
                  Column("communicates", "what is sent"), Column("overlaps", "overlaps the computation")],
                 caption=f"MLP of {depth} layers of {width:,} x {width:,}: {parameters / 1e6:,.1f} M parameters, "
                         f"{format_bytes(4 * parameters)} of float32 gradients; global batch {batch:,}, "
                         f"{workers} workers")


def traffic_statement(width: int, depth: int, batch: int, workers: int) -> str:
    sent = {r["strategy"]: r["sent_bytes"] for r in parallelism_traffic(width, depth, batch, workers)}
    even = depth * width / (2 * math.ceil(depth / 2))  # depth x width^2 gradients = 2 ceil(depth/2) x batch x width
    where = f"equal to the width, {width:,}" if depth % 2 == 0 else f"of depth x width / (depth + 1) = {even:,.0f}"
    return (f"Data parallelism sends {sent['data'] / sent['tensor']:.2g} times what tensor parallelism sends at this "
            f"batch: the gradients grow with the width squared and not with the batch; the activations grow with "
            f"batch x width. They send the same at a global batch {where}.")


def traffic_by_batch_figure(width: int, depth: int, batches: Sequence[int], workers: int) -> go.Figure:
    """:func:`traffic_figure` of the worked example over ``batches``, with the batch equal to the width marked."""
    rows = [{"batch": batch, **r} for batch in batches for r in parallelism_traffic(width, depth, batch, workers)]
    fig = traffic_figure(rows, title=f"Bytes each worker sends per step: MLP {depth} x {width}^2, {workers} workers, "
                                     "float32")
    return plots.vertical_marker(fig, width, f"batch = width = {width}")


def simulated_traffic_table(rows: Sequence[dict]) -> Table:
    """The rows of :func:`.distributed.allreduce_traffic` for its largest number of workers: rounds, the busiest
    worker's bytes and the bytes its links carry one after the other, as multiples of the vector's size S."""
    largest = max(r["workers"] for r in rows)
    shown = [{**r, "critical_over_size": r["critical_bytes"] / r["bytes"]} for r in rows if r["workers"] == largest]
    return table(shown, [Column("algorithm"), Column("rounds"),
                         Column("sent_over_size", "the busiest worker sends", "x S", ".3g"),
                         Column("critical_over_size", "its links carry, one after the other", "x S", ".3g")],
                 caption=f"p = {largest} workers, a vector of S = {format_bytes(shown[0]['bytes'])}")


def simulated_check(rows: Sequence[dict]) -> str:
    workers = sorted({r["workers"] for r in rows})
    return (f"Every algorithm left every worker with the exact sum, for p = {workers[0]} to {workers[-1]}, on a "
            f"vector of {format_bytes(rows[0]['bytes'])}.")


def model_time_table(workers: int, sizes: Sequence[int], latency_s: float, bandwidth: float) -> Table:
    """The model's time of each algorithm for each message size, and the fastest."""
    rows = []
    for nbytes in sizes:
        times = {name: model_seconds(name, workers, nbytes, latency_s, bandwidth) for name in ALGORITHMS}
        rows.append({"bytes": nbytes, **times, "fastest": min(times, key=times.get)})
    us = {"unit": "µs", "format": lambda s: f"{1e6 * s:,.1f}"}
    return table(rows, [Column("bytes", "message", **SIZE), *(Column(name, name, **us) for name in ALGORITHMS),
                        Column("fastest")],
                 caption=f"{workers} workers, alpha = {latency_s * 1e6:g} µs per message, {bandwidth / 1e9:g} GB/s "
                         "per link direction (illustrative, not measured)")


def crossover(workers: int, sizes: Sequence[int], latency_s: float, bandwidth: float) -> str:
    """Where the model's ring overtakes its tree, in a sentence."""
    ring_wins = next((n for n in sizes if model_seconds("ring", workers, n, latency_s, bandwidth)
                      < model_seconds("tree", workers, n, latency_s, bandwidth)), None)
    if ring_wins is None:
        return "In this model the tree is faster at every size drawn."
    return (f"In this model the tree is faster below {format_bytes(ring_wins)} and the ring from there on (of the "
            "sizes drawn, powers of two).")


def large_batch_table(rows: Sequence[dict]) -> Table:
    """:func:`.distributed.large_batch_rows`: who trained ResNet-50 on ImageNet, with what batch, machine and time,
    to what accuracy, and the learning rate of the linear scaling rule."""
    shown = [{**r, "batches": f"{r['batch']:,}" + (f" to {r['batch_end']:,}" if r["batch_end"] != r["batch"] else ""),
              "machine": f"{r['processors']:,} x {r['processor']}" if r["processors"] else r["processor"]}
             for r in rows]
    return table(shown, [Column("year", format="d"), Column("who"), Column("batches", "global batch"),
                         Column("machine", "processors"), Column("library"),
                         Column("minutes", "time", "min", ",.1f"), Column("accuracy", "top-1", format=".2%"),
                         Column("speedup", "speed-up", format=lambda x: f"{x:,.0f}x"),
                         Column("processor_hours", "processor-hours", format=",.0f"),
                         Column("linear_rule_lr", "0.1 x B / 256", format=".1f")])


def large_batch_statements(rows: Sequence[dict]) -> list[str]:
    first, fastest = rows[0], min(rows, key=lambda r: r["seconds"])
    hours = [r["processor_hours"] for r in rows if r["processor_hours"]]
    goyal = next(r for r in rows if r["who"] == "Goyal et al.")
    worst = min(rows, key=lambda r: r["accuracy"])
    return [f"{fastest['who']} trained {fastest['speedup']:,.0f} times faster than {first['who']}, on "
            f"{fastest['processors'] / first['processors']:,.0f} times as many GPUs, with a global batch "
            f"{fastest['batch_end'] / first['batch']:,.0f} times larger; top-1 "
            f"{(fastest['accuracy'] - first['accuracy']) * 100:+.2f} points.",
            f"Processor-hours (of different GPUs) range from {min(hours):,.0f} to {max(hours):,.0f}, a factor of "
            f"{max(hours) / min(hours):.1f}. The largest loss of top-1 accuracy against {goyal['who']}'s "
            f"{goyal['accuracy']:.1%}: {worst['who']}, {(goyal['accuracy'] - worst['accuracy']) * 100:.2f} points."]
