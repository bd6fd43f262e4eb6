"""Tensor, pipeline and sharded parallelism as measured on machines of several GPUs: the speed-up of each method
over one GPU, the memory each GPU used, the measured pipeline bubble against (p - 1) / (m + p - 1), and the
all-reduce's bus bandwidth on every machine size, from the recordings of ``tools/record_parallelism.py``
(``distributed_parallel_scaling``, ``distributed_pipeline_bubble``, ``distributed_allreduce_gpus``)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.ch16_distributed_training import figures, pipeline
from gpulab.ch16_distributed_training.parallel_figures import bubble_figure as formula_figure
from gpulab.ch16_distributed_training.parallel_figures import timeline_figure
from gpulab.core import plots, recordings
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, table

SCALING = "distributed_parallel_scaling"
BUBBLE = "distributed_pipeline_bubble"
ALLREDUCE = "distributed_allreduce_gpus"
LABELS = {"ddp": "DDP", "fsdp": "FSDP", "tensor": "tensor parallel", "pipeline": "pipeline (1F1B)"}
DATA_PARALLEL = ("ddp", "fsdp")  # weak scaling: the batch is per GPU


def configurations(run: Recording) -> list[tuple[str, int]]:
    """The (precision, batch) pairs ``run`` measured, in the order it ran them."""
    return list(dict.fromkeys((r["precision"], r["batch_per_device"]) for r in ok_rows(run.rows)))


def speedup(row: dict) -> float:
    """How many times one GPU's throughput the method reached: p x efficiency, for weak and strong scaling alike
    (weak: p times the samples in t_p against t_1; strong: the same samples in t_p against t_1)."""
    return row["devices"] * row["efficiency"]


def _batch_text(strategy: str, batch: int) -> str:
    return f"{batch:,} per GPU" if strategy in DATA_PARALLEL else f"{batch:,} in all"


def speedup_figure(runs: Sequence[Recording]) -> go.Figure:
    """Speed-up over one GPU against the number of GPUs, a line per method and the ideal dotted; a menu picks the
    precision and batch (and the machine, where several recorded)."""
    def figure(run: Recording) -> go.Figure:
        fig, buttons, visible = go.Figure(), [], []
        configs = configurations(run)
        shown = configs.index(max(configs, key=lambda c: (c[0] == "float32", c[1])))  # as the sentences below
        for k, (precision, batch) in enumerate(configs):
            rows = [r for r in ok_rows(run.rows) if (r["precision"], r["batch_per_device"]) == (precision, batch)]
            counts = sorted({r["devices"] for r in rows})
            for i, strategy in enumerate(LABELS):
                mine = sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["devices"])
                fig.add_trace(go.Scatter(
                    x=[1, *[r["devices"] for r in mine]], y=[1.0, *[speedup(r) for r in mine]], mode="lines+markers",
                    name=LABELS[strategy], visible=k == shown, line=dict(color=plots.PALETTE[i % len(plots.PALETTE)]),
                    marker=dict(symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)]),
                    hovertext=["one GPU alone"] + [f"{r['devices']} GPUs: {r['seconds'] * 1e3:.2f} ms a step "
                                                   f"({_batch_text(strategy, batch)}), efficiency "
                                                   f"{r['efficiency']:.0%}" for r in mine], hoverinfo="text+name"))
                visible.append(k)
            fig.add_trace(go.Scatter(x=[1, *counts], y=[1, *counts], mode="lines", name="ideal (p times)",
                                     visible=k == shown, line=dict(color="grey", dash="dot")))
            visible.append(k)
        for k, (precision, batch) in enumerate(configs):
            buttons.append(dict(label=f"{precision}, batch {batch:,}", method="update",
                                args=[{"visible": [owner == k for owner in visible]}]))
        fig.update_layout(title=plots.wrapped_title(f"Speed-up over one GPU: {run.label}"),
                          xaxis_title="GPUs", yaxis_title="throughput / one GPU's",
                          updatemenus=[dict(type="dropdown", buttons=buttons, direction="down", showactive=True,
                                            active=shown, x=0, xanchor="left", y=1.0, yanchor="bottom")])
        return fig.update_xaxes(tickvals=[1, 2, 4, 8])
    return plots.by_gpu(runs, figure)


def scaling_table(runs: Sequence[Recording]) -> Table:
    """Every row of the scaling runs: the step's time together and alone, efficiency, speed-up, peak memory of the
    busiest GPU, the parameters and gradients it stores and the bytes it sends per step (the model's count)."""
    rows = [{"gpu": run.short_label, **r, "speedup": speedup(r)} for run in runs for r in ok_rows(run.rows)]
    return table(rows, [
        Column("gpu", "GPU"), Column("precision"), Column("batch_per_device", "batch", format=","),
        Column("strategy", format=LABELS.get),
        Column("devices", "GPUs"), Column("seconds", "step", "ms", format=lambda s: f"{s * 1e3:.2f}"),
        Column("single_seconds", "one GPU", "ms", format=lambda s: f"{s * 1e3:.2f}"),
        Column("spread", format=".0%"), Column("efficiency", format=".0%"),
        Column("speedup", "speed-up", format=".2f"),
        Column("peak_memory_bytes", "peak memory", format=lambda b: format_bytes(int(b))),
        Column("state_bytes", "weights + gradients", format=lambda b: format_bytes(int(b))),
        Column("predicted_sent_bytes", "sent per step", format=lambda b: format_bytes(int(b)))],
        caption="batch: per GPU for DDP and FSDP, in all for tensor and pipeline parallelism; step: the median of 10 "
                "steps, spread its interquartile range over the median; sent per step: the busiest GPU's bytes as "
                "the model counts them (in bfloat16 tensor parallelism sends more: adding the float32 bias makes "
                "its backward all-reduce float32)")


def rows_where(run: Recording, **match) -> list[dict]:
    """``run``'s good rows whose fields equal ``match`` (strategy="fsdp", devices=4, ...)."""
    return [r for r in ok_rows(run.rows) if all(r.get(key) == value for key, value in match.items())]


def _row(run: Recording, strategy: str, precision: str, batch: int, devices: int) -> dict | None:
    found = rows_where(run, strategy=strategy, precision=precision, batch_per_device=batch, devices=devices)
    return found[0] if found else None


def scaling_statements(runs: Sequence[Recording]) -> list[str]:
    """Per machine: the best weak scaling of DDP and FSDP, the fastest split of one batch, and FSDP's fixed cost."""
    said = []
    for run in runs:
        rows = ok_rows(run.rows)
        most = max(r["devices"] for r in rows)
        precision, batch = max(configurations(run), key=lambda c: (c[0] == "float32", c[1]))
        ddp, fsdp = (_row(run, s, precision, batch, most) for s in ("ddp", "fsdp"))
        tensor, piped = (_row(run, s, precision, batch, most) for s in ("tensor", "pipeline"))
        fsdp_rows = [r for r in rows if r["strategy"] == "fsdp"]
        floor = min(r["seconds"] for r in fsdp_rows)
        sent = max(r["predicted_sent_bytes"] for r in fsdp_rows)
        ddp_added = max(r["seconds"] - r["single_seconds"] for r in rows if r["strategy"] == "ddp")
        same = _row(run, "ddp", precision, batch // most, most)
        text = (f"{run.label}, {most} GPUs, {precision}, {batch:,} samples per GPU: DDP kept "
                f"{ddp['efficiency']:.0%} of one GPU's throughput per GPU and FSDP {fsdp['efficiency']:.0%}. "
                f"Splitting one batch of {batch:,} instead, tensor parallelism ran the step "
                f"{speedup(tensor):.2f} times as fast as one GPU ({tensor['seconds'] * 1e3:.1f} against "
                f"{tensor['single_seconds'] * 1e3:.1f} ms) and the pipeline {speedup(piped):.2f} times.")
        if same:
            text += (f" DDP with {batch // most:,} samples per GPU, the same {batch:,} samples a step, took "
                     f"{same['seconds'] * 1e3:.1f} ms.")
        text += (f" FSDP's step never took less than {floor * 1e3:.1f} ms, whatever the batch, precision or number "
                 f"of GPUs.")
        rate = _bus_rate(run)
        if rate:
            text += (f" The most it sends per step, {format_bytes(int(sent))}, would take about "
                     f"{sent / rate * 1e3:.1f} ms at the best bus bandwidth this machine's all-reduce reached "
                     f"(below), and DDP, sending two thirds as much, added at most {ddp_added * 1e3:.1f} ms to its "
                     "step: the links do not set the floor.")
        said.append(text)
    return said


def _bus_rate(run: Recording) -> float | None:
    """The largest all-reduce bus bandwidth (bytes/s) recorded on ``run``'s machine; None where none was recorded."""
    allreduce = next((r for r in recordings.newest_per_gpu(ALLREDUCE) if r.device_name == run.device_name), None)
    return max(r["busbw_gbs"] for r in ok_rows(allreduce.rows)) * 1e9 if allreduce else None


def memory_rows(run: Recording) -> list[dict]:
    """Per precision, batch and number of GPUs: the peak memory of the busiest GPU under DDP and FSDP, the weights
    and gradients each keeps, and FSDP's share of DDP's."""
    rows = []
    for precision, batch in configurations(run):
        for devices in sorted({r["devices"] for r in ok_rows(run.rows)}):
            ddp, fsdp = (_row(run, s, precision, batch, devices) for s in ("ddp", "fsdp"))
            if ddp and fsdp:
                rows.append({"precision": precision, "batch": batch, "devices": devices,
                             "ddp_peak": ddp["peak_memory_bytes"], "fsdp_peak": fsdp["peak_memory_bytes"],
                             "ddp_state": ddp["state_bytes"], "fsdp_state": fsdp["state_bytes"],
                             "state_share": fsdp["state_bytes"] / ddp["state_bytes"],
                             "peak_share": fsdp["peak_memory_bytes"] / ddp["peak_memory_bytes"]})
    return rows


def memory_table(runs: Sequence[Recording]) -> Table:
    """:func:`memory_rows` of each machine as a table."""
    size = lambda b: format_bytes(int(b))  # noqa: E731
    rows = [{"gpu": run.short_label, **r} for run in runs for r in memory_rows(run)]
    return table(rows, [Column("gpu", "GPU"), Column("precision"), Column("batch", "batch per GPU", format=","),
                        Column("devices", "GPUs"),
                          Column("ddp_state", "DDP: weights + gradients", format=size),
                          Column("fsdp_state", "FSDP: weights + gradients", format=size),
                          Column("ddp_peak", "DDP: peak", format=size), Column("fsdp_peak", "FSDP: peak", format=size),
                          Column("peak_share", "FSDP's peak / DDP's", format=".0%")],
                 caption="per GPU, the busiest; plain SGD, so no optimizer state")


def memory_statements(runs: Sequence[Recording]) -> list[str]:
    """Per machine: how FSDP's state and peak shrank against DDP's on the most GPUs, at the largest float32 batch."""
    said = []
    for run in runs:
        rows = [r for r in memory_rows(run) if r["precision"] == "float32"] or memory_rows(run)
        row = max(rows, key=lambda r: (r["devices"], r["batch"]))
        said.append(f"{run.label}, {row['devices']} GPUs, {row['batch']:,} samples per GPU in {row['precision']}: "
                    f"FSDP kept {format_bytes(int(row['fsdp_state']))} of weights and gradients per GPU against "
                    f"DDP's {format_bytes(int(row['ddp_state']))} ({row['state_share']:.0%}), but its peak was "
                    f"{format_bytes(int(row['fsdp_peak']))} against {format_bytes(int(row['ddp_peak']))} "
                    f"({row['peak_share']:.0%}).")
    return said


def _smallest(rows: Sequence[dict]) -> str:
    """'34 µs on 2 GPUs and 52 µs on 4': the time of the smallest message on each number of GPUs."""
    parts = []
    for p in sorted({r["processes"] for r in rows}):
        first = min((r for r in rows if r["processes"] == p), key=lambda r: r["bytes"])
        parts.append(f"{first['seconds'] * 1e6:.0f} µs on {p} GPUs")
    return " and ".join(parts)


def bubble_table(runs: Sequence[Recording]) -> Table:
    """Every pipelined step of the bubble runs: its time, one GPU's, the bubble measured and by the formula, and
    the peak memory of the busiest GPU."""
    rows = [{"gpu": run.short_label, **r} for run in runs for r in ok_rows(run.rows)]
    return table(rows, [
        Column("gpu", "GPU"), Column("devices", "stages"), Column("schedule"), Column("micro_batches", "m"),
        Column("seconds", "step", "ms", format=lambda s: f"{s * 1e3:.1f}"),
        Column("single_seconds", "one GPU", "ms", format=lambda s: f"{s * 1e3:.1f}"),
        Column("bubble", "bubble", format=".1%"), Column("bubble_formula", "(p - 1)/(m + p - 1)", format=".1%"),
        Column("peak_memory_bytes", "peak memory", format=lambda b: format_bytes(int(b)))],
        caption="float32; the bubble from the stages' compute intervals of one step")


def bubble_figure(runs: Sequence[Recording]) -> go.Figure:
    """The measured bubbles of each machine's pipelines (markers) on the formula's lines, for the GPU counts run."""
    def figure(run: Recording) -> go.Figure:
        rows = ok_rows(run.rows)
        stages = sorted({r["devices"] for r in rows})
        fig = pipeline_bubble_lines(stages, sorted({r["micro_batches"] for r in rows}), rows)
        return fig.update_layout(title=plots.wrapped_title(f"Measured bubble against the formula: {run.label}"))
    return plots.by_gpu(runs, figure)


def pipeline_bubble_lines(stages: Sequence[int], micro_batches: Sequence[int], rows: Sequence[dict]) -> go.Figure:
    """:func:`.parallel_figures.bubble_figure` with a marker colour per number of stages."""
    fig = formula_figure(stages, micro_batches, title="").update_xaxes(tickvals=list(micro_batches))
    for i, p in enumerate(stages):
        for j, schedule in enumerate(sorted({r["schedule"] for r in rows})):
            mine = sorted((r for r in rows if (r["devices"], r["schedule"]) == (p, schedule)),
                          key=lambda r: r["micro_batches"])
            fig.add_trace(go.Scatter(
                x=[r["micro_batches"] for r in mine], y=[r["bubble"] for r in mine], mode="markers",
                name=f"measured, p = {p}, {schedule}",
                marker=dict(symbol=plots.SYMBOLS[j % len(plots.SYMBOLS)], size=10,
                            color=plots.PALETTE[i % len(plots.PALETTE)]),
                hovertext=[f"p = {p}, m = {r['micro_batches']}, {schedule}: {r['bubble']:.1%} measured, "
                           f"{r['bubble_formula']:.1%} by the formula" for r in mine], hoverinfo="text"))
    return fig


def measured_timeline(run: Recording, devices: int, micro_batches: int, schedule: str = "1f1b") -> go.Figure:
    """The compute intervals of one recorded pipelined step (milliseconds), as the simulated timelines draw them."""
    row = next((r for r in ok_rows(run.rows) if (r["devices"], r["micro_batches"], r["schedule"]) ==
                (devices, micro_batches, schedule)), None)
    if row is None:
        raise KeyError(f"no pipelined step on {devices} GPUs with {micro_batches} micro-batches ({schedule}) in "
                       f"{run.label}")
    origin = min(i["start"] for i in row["intervals"])
    intervals = [{**i, "start": (i["start"] - origin) * 1e3, "end": (i["end"] - origin) * 1e3}
                 for i in row["intervals"]]
    return timeline_figure(intervals, title=f"One measured step, {devices} stages, {micro_batches} micro-batches "
                                            f"({schedule}): {run.label}", time_unit="ms")


def bubble_statements(runs: Sequence[Recording]) -> list[str]:
    """Per machine: the measured bubble against the formula at the fewest and the most micro-batches, and the gaps
    between passes that make the difference."""
    said = []
    for run in runs:
        rows = ok_rows(run.rows)
        for p in sorted({r["devices"] for r in rows}):
            mine = [r for r in rows if r["devices"] == p and r["schedule"] == "1f1b"] or [
                r for r in rows if r["devices"] == p]
            low, high = (min(mine, key=lambda r: r["micro_batches"]), max(mine, key=lambda r: r["micro_batches"]))
            gaps, count = _gaps(high)
            share = _gap_share(high["intervals"])
            ideal = _gap_share(_ideal_timeline(high))
            fastest = min(mine, key=lambda r: r["seconds"])
            extra, excess = (share - ideal) * 100, (high["bubble"] - high["bubble_formula"]) * 100
            match = "is within a point of" if abs(extra - excess) <= 1 else "compares with"
            said.append(
                f"{run.label}, {p} stages ({high['schedule']}): with {low['micro_batches']} micro-batch"
                f"{'' if low['micro_batches'] == 1 else 'es'} the "
                f"bubble was {low['bubble']:.1%} against the formula's {low['bubble_formula']:.1%}; with "
                f"{high['micro_batches']}, {high['bubble']:.1%} against {high['bubble_formula']:.1%}. In that step, "
                f"once its first backward pass had begun, a stage waited {gaps * 1e3:.2f} ms on average between "
                f"two passes, {share:.1%} of the step over its {count} such gaps; the same schedule at the step's "
                f"own mean pass times, with instant messages and no pauses, waits {ideal:.1%} there. The "
                f"difference, {extra:.1f} points, {match} the measured bubble's excess over the formula, "
                f"{excess:.1f} points. The step was shortest with "
                f"{fastest['micro_batches']} micro-batches ({fastest['seconds'] * 1e3:.1f} ms); with "
                f"{high['micro_batches']} it took {high['seconds'] * 1e3:.1f} ms.")
    return said


def _gap_share(intervals: Sequence[dict]) -> float:
    """The share of the span that a stage spends, on average, waiting between passes once its first backward pass
    began (:func:`_gaps`)."""
    gaps, count = _gaps({"intervals": intervals})
    span = max(i["end"] for i in intervals) - min(i["start"] for i in intervals)
    return gaps * count / span


def _ideal_timeline(row: dict) -> list[dict]:
    """The formula's world for a recorded step: its schedule on its stages, every forward pass taking the step's
    mean forward time and every backward pass its mean backward time, messages taking none."""
    times = {phase: [i["end"] - i["start"] for i in row["intervals"] if i["phase"] == phase]
             for phase in ("forward", "backward")}
    return pipeline.timeline(row["devices"], row["micro_batches"], row["schedule"],
                             forward_time=sum(times["forward"]) / len(times["forward"]),
                             backward_time=sum(times["backward"]) / len(times["backward"]))


def _gaps(row: dict) -> tuple[float, int]:
    """The mean idle time between a stage's consecutive passes once its first backward pass began (seconds), and
    how many such gaps one stage has."""
    waits = []
    for stage in {i["stage"] for i in row["intervals"]}:
        mine = sorted((i for i in row["intervals"] if i["stage"] == stage), key=lambda i: i["start"])
        first_backward = next(k for k, i in enumerate(mine) if i["phase"] == "backward")
        waits += [b["start"] - a["end"] for a, b in zip(mine[first_backward:], mine[first_backward + 1:],
                                                         strict=False)]
    stages = len({i["stage"] for i in row["intervals"]})
    return (sum(waits) / len(waits) if waits else 0.0), len(waits) // stages


def allreduce_figure(runs: Sequence[Recording]) -> go.Figure:
    """The all-reduce's bus bandwidth against the message size, a line per number of GPUs; a menu per machine."""
    def figure(run: Recording) -> go.Figure:
        counts = sorted({r["processes"] for r in ok_rows(run.rows)})
        return figures.bandwidth_figure([(f"{p} GPUs", [r for r in ok_rows(run.rows) if r["processes"] == p])
                                         for p in counts], title=f"NCCL all-reduce on 2 and more GPUs: {run.label}")
    return plots.by_gpu(runs, figure)


def allreduce_statements(runs: Sequence[Recording]) -> list[str]:
    """Per machine: the bus bandwidth of the largest message on each number of GPUs."""
    said = []
    for run in runs:
        rows = ok_rows(run.rows)
        parts = []
        for p in sorted({r["processes"] for r in rows}):
            last = max((r for r in rows if r["processes"] == p), key=lambda r: r["bytes"])
            parts.append(f"{last['busbw_gbs']:,.0f} GB/s on {p} GPUs")
        largest = format_bytes(max(r["bytes"] for r in rows))
        said.append(f"{run.label}: an all-reduce of {largest} reached a bus bandwidth of {' and '.join(parts)}. The "
                    "bus bandwidth counts what each GPU sends, 2 (p - 1)/p times the message, so a ring that kept "
                    "every link equally busy would show the same bus bandwidth on any number of GPUs. The smallest "
                    f"message took {_smallest(rows)}.")
    return said

