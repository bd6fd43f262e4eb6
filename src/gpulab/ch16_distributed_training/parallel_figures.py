"""The page's view of model, pipeline and sharded parallelism: each method's step checked against one process's
(a table), who computes when in a pipeline (a timeline) and how the bubble shrinks with micro-batches, and what
each GPU stores under DDP and FSDP (a table)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from gpulab.ch16_distributed_training import pipeline, sharded
from gpulab.ch16_distributed_training.measured import whole_batch_step
from gpulab.core import plots, recordings
from gpulab.core.correctness import check_close
from gpulab.core.printing import format_bytes
from gpulab.core.tables import Column, Table, table

METHODS = {"tensor": "tensor parallel (column, then row)", "pipeline": "pipeline (GPipe's schedule)",
           "fsdp": "fully sharded data parallel (FSDP2)"}

PHASE_COLOURS = {"forward": "#6fa8dc", "backward": "#e69138"}


def timeline_figure(rows: Sequence[dict], *, title: str, time_unit: str = "forward passes") -> go.Figure:
    """One bar per pass of a pipelined step: stages down, time across, forward passes blue and backward orange,
    each labelled with its micro-batch. The white gaps are the bubble.

    ``rows`` as :func:`.pipeline.timeline` gives them (``time_unit`` 'forward passes') or a run recorded them
    (``time_unit`` 's'; the times are shifted to start at 0).
    """
    if not rows:
        raise ValueError("rows: an empty timeline")
    origin = min(r["start"] for r in rows)
    stages = sorted({r["stage"] for r in rows})
    fig = go.Figure()
    for phase, colour in PHASE_COLOURS.items():
        mine = [r for r in rows if r["phase"] == phase]
        fig.add_trace(go.Bar(
            base=[r["start"] - origin for r in mine], x=[r["end"] - r["start"] for r in mine],
            y=[f"stage {r['stage']}" for r in mine], orientation="h", name=phase, marker=dict(color=colour),
            text=[str(r["micro_batch"]) for r in mine], textposition="inside", insidetextanchor="middle",
            hovertemplate=f"{phase} of micro-batch %{{text}}<br>%{{base:.3g}} to %{{x:.3g}} later<extra></extra>"))
    bubble = pipeline.bubble_fraction(rows)
    fig.update_layout(title=f"{plots.wrapped_title(title)}<br><sub>idle share (bubble): {bubble:.1%}</sub>",
                      barmode="overlay", height=160 + 50 * len(stages), xaxis_title=f"time ({time_unit})",
                      yaxis_title="pipeline stage (one GPU each)",
                      yaxis=dict(autorange="reversed", categoryorder="array",
                                 categoryarray=[f"stage {s}" for s in stages]))
    return fig


def bubble_figure(stages: Sequence[int], micro_batches: Sequence[int], measured: Sequence[dict] = (), *,
                  title: str) -> go.Figure:
    """(p - 1) / (m + p - 1) against the number of micro-batches m, one line per number of stages p, and the
    bubbles of recorded runs as markers (rows with ``devices``, ``micro_batches``, ``bubble``, ``schedule``)."""
    fig = go.Figure()
    for i, p in enumerate(stages):
        fig.add_trace(go.Scatter(x=list(micro_batches), y=[pipeline.bubble_formula(p, m) for m in micro_batches],
                                 mode="lines", name=f"(p - 1) / (m + p - 1), p = {p}",
                                 line=dict(color=plots.PALETTE[i % len(plots.PALETTE)])))
    for j, schedule in enumerate(sorted({r["schedule"] for r in measured})):
        mine = [r for r in measured if r["schedule"] == schedule]
        fig.add_trace(go.Scatter(x=[r["micro_batches"] for r in mine], y=[r["bubble"] for r in mine], mode="markers",
                                 name=f"measured, {schedule}", marker=dict(symbol=plots.SYMBOLS[j % len(plots.SYMBOLS)],
                                                                           size=10, color="black"),
                                 hovertext=[f"p = {r['devices']}, m = {r['micro_batches']}: {r['bubble']:.1%}"
                                            for r in mine], hoverinfo="text"))
    fig.update_layout(title=title, xaxis_title="micro-batches m", yaxis_title="idle share of the step (bubble)")
    fig.update_xaxes(type="log")
    return fig


def check_rows(results: Mapping[str, Mapping], sizes: Sequence[int], batch: int) -> list[dict]:
    """Each method's step (:func:`.parallel.parallel_gradients`, by strategy) against one process's step on the whole
    batch: the loss, and the largest relative error over the parameters' gradients. Raises if any differs by more
    than float32 rounding allows."""
    loss, gradients = whole_batch_step(sizes, batch)
    rows = []
    for strategy, result in results.items():
        errors = [check_close(result["gradients"][name], gradient, 1e-5, f"{strategy}: the gradient of {name}")
                  for name, gradient in gradients.items()]
        if abs(result["loss"] - loss) > 1e-5 * abs(loss):
            raise AssertionError(f"{strategy}: loss {result['loss']:.7g}, one process {loss:.7g}")
        rows.append({"method": METHODS.get(strategy, strategy), "loss": result["loss"], "reference": loss,
                     "parameters": len(errors), "error": max(errors)})
    return rows


def check_table(results: Mapping[str, Mapping], sizes: Sequence[int], batch: int, processes: int) -> Table:
    """:func:`check_rows` as a table."""
    return table(check_rows(results, sizes, batch),
                 [Column("method"), Column("loss", "loss", format=".6f"),
                  Column("reference", "one process's loss", format=".6f"), Column("parameters", "gradients compared"),
                  Column("error", "largest gradient error, relative", format=".1e")],
                 caption=f"one training step of the MLP {' x '.join(map(str, sizes))} on {batch} samples, "
                         f"{processes} gloo processes, against one process")


def memory_rows(sizes: Sequence[int], worlds: Sequence[int], batch_per_gpu: int, optimizer: str = "adam") -> list[dict]:
    """What the most loaded GPU stores under DDP and under FSDP (bytes), for each number of GPUs: the parameters,
    their gradients and the optimizer's state (float32), and the activations of its share of the batch (the same
    in both)."""
    activations = sharded.activation_bytes(sizes, batch_per_gpu)
    return [{"gpus": world, "activations": activations,
             **{strategy: sum(sharded.predicted_state_bytes(sizes, world, strategy, optimizer).values()) + activations
                for strategy in ("ddp", "fsdp")}} for world in worlds]


def _bytes(nbytes: float) -> str:
    return format_bytes(int(nbytes))


def memory_table(sizes: Sequence[int], worlds: Sequence[int], batch_per_gpu: int, optimizer: str = "adam") -> Table:
    """:func:`memory_rows` as a table."""
    rows = memory_rows(sizes, worlds, batch_per_gpu, optimizer)
    return table(rows, [Column("gpus", "GPUs"), Column("ddp", "DDP, per GPU", format=_bytes),
                        Column("fsdp", "FSDP, per GPU", format=_bytes)],
                 caption=f"the MLP {' x '.join(map(str, sizes))}, {optimizer} in float32, {batch_per_gpu} samples "
                         f"per GPU (activations {format_bytes(rows[0]['activations'])}, the same under both)")


GPU_EXPERIMENTS = ("distributed_parallel_scaling", "distributed_pipeline_bubble")  # see .parallel


def recorded_statement(experiments: Sequence[str] = GPU_EXPERIMENTS, wanted: Sequence[int] = (2, 4, 8)) -> str:
    """Which machine sizes the three methods have been measured on (a sentence from the recordings), and which wait."""
    done: dict[int, set[str]] = {}
    machines: dict[str, int] = {}  # each machine (its GPU's label) and the most GPUs a run used on it
    for experiment in experiments:
        for run in recordings.newest_per_gpu(experiment):
            counts = {row["devices"] for row in run.rows if "devices" in row}
            for count in counts:
                done.setdefault(count, set()).add(run.label)
            if counts:
                machines[run.label] = max(machines.get(run.label, 0), *counts)
    waiting = [count for count in wanted if count not in done]
    said = [f"Measured on one machine of {most} GPUs ({label}), using "
            f"{' and '.join(str(c) for c in sorted(done) if label in done[c])} of them: "
            f"{', '.join(f'`{e}`' for e in experiments)}." for label, most in machines.items()]
    if waiting:
        counts = ", ".join(map(str, waiting[:-1])) + (" and " if len(waiting) > 1 else "") + str(waiting[-1])
        said.append(f"Not yet measured on {counts} GPUs: the step time, scaling efficiency, memory per GPU and bytes "
                    f"sent per step of the three methods ({', '.join(f'`{e}`' for e in experiments)}) wait for a "
                    "machine of that size; `gpulab.ch16_distributed_training.parallel` has the experiments.")
    return " ".join(said)
