"""Chapter 04's figures and tables: a layer's GEMMs and a training step, counted; quantization steps, alignment and
a training run's loss; the recorded sweeps of :mod:`.sweeps` (each recorded GPU behind a menu, or in the rows of a
table)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.ch04_mlp_gemms import waves
from gpulab.ch04_mlp_gemms.waves import TILE_MODELS, predicted_rows, tile_label, wave_steps
from gpulab.core import env, flops, plots
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, table


def quantization_figure(rows: Sequence[dict], x: str, *, sms: int, vary: str, title: str, x_title: str,
                        tiles: Sequence[Sequence[int]] = TILE_MODELS, max_markers: int = 12) -> go.Figure:
    """Measured TFLOP/s against ``x`` per dtype, with the tile/wave prediction (dashed) and its wave steps (dotted).

    A menu picks the tile shape of the prediction; every variant is in the figure, so it works in the
    static book. ``vary`` says which GEMM dimension ``x`` is: 'm' (outputs) or 'n' (batch).
    """
    rows = ok_rows(rows)
    fig = go.Figure()
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    colors = {d: plots.PALETTE[i % len(plots.PALETTE)] for i, d in enumerate(dtypes)}
    plots.add_sweep(fig, rows, x, "tflops", color="dtype", name="measured", colors=colors,
                    hover=("batch", "inputs", "outputs", "seconds", "tflops"))
    measured_traces = len(fig.data)
    owners: list[int | None] = [None] * measured_traces  # None: always shown
    menus_layout = []
    lo, hi = min(r[x] for r in rows), max(r[x] for r in rows)
    fixed = rows[0]["N"] if vary == "m" else rows[0]["M"]
    for i, tile in enumerate(tiles):
        predicted = predicted_rows(rows, x, tile=tile, sms=sms)
        before = len(fig.data)
        plots.add_sweep(fig, predicted, x, "tflops", color="dtype", name=f"model, {tile_label(tile)}:", dash="dash",
                        colors=colors, hover=("tiles", "waves", "efficiency"))
        for trace in fig.data[before:]:
            trace.visible = i == 0
            trace.mode = "lines"
        owners += [i] * (len(fig.data) - before)
        steps = wave_steps(lo, hi, fixed, vary=vary, tile=tile, sms=sms)[:max_markers]
        shapes = [dict(type="line", x0=s, x1=s, y0=0, y1=1, yref="paper", line=dict(dash="dot", color="#444444"))
                  for s in steps]
        notes = [dict(x=s, y=1.0, yref="paper", text=f"wave {k + 2}", showarrow=False, xanchor="left",
                      yanchor="top", xshift=2, font=dict(size=10), bgcolor="rgba(255,255,255,0.8)")
                 for k, s in enumerate(steps)]
        menus_layout.append((f"model: {tile_label(tile)}", shapes, notes))
    buttons = [dict(label=label, method="update",
                    args=[{"visible": [o is None or o == i for o in owners]}, {"shapes": shapes, "annotations": notes}])
               for i, (label, shapes, notes) in enumerate(menus_layout)]
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title="TFLOP/s", shapes=menus_layout[0][1],
                      annotations=menus_layout[0][2],
                      updatemenus=[dict(buttons=buttons, x=0.0, y=1.14, xanchor="left", direction="down")],
                      margin=dict(t=100))
    return fig


def alignment_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Rate relative to the base size, per varied dimension and size, one bar per dtype."""
    good = [r for r in ok_rows(rows) if "relative" in r]
    categories: dict[str, dict] = {}
    for r in good:
        key = f"{r['vary']} = {r['size']}" + ("" if r["multiple_of_8"] else " (not x8)")
        categories.setdefault(key, {"shape": key})[r["dtype"]] = r["relative"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in good))
    fig = plots.bars_figure(list(categories.values()), "shape", {d: d for d in dtypes}, title=title,
                            y_title="rate relative to the base size")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#444444")
    return fig


def loss_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Training loss and accuracies against epoch."""
    fig = plots.sweep_figure(rows, "epoch", "loss", name="training loss", title=title, x_title="epoch",
                             y_title="mean cross-entropy", hover=("epoch", "loss", "train_accuracy", "test_accuracy"))
    for key, name in (("train_accuracy", "training accuracy"), ("test_accuracy", "test accuracy")):
        fig.add_trace(go.Scatter(x=[r["epoch"] for r in rows], y=[r[key] for r in rows], name=name, yaxis="y2",
                                 mode="lines", line=dict(dash="dash")))
    fig.update_layout(yaxis2=dict(title="accuracy", overlaying="y", side="right", range=[0, 1.02], showgrid=False),
                      legend=dict(x=0.55, y=0.5))
    return fig


# ---- a layer's three GEMMs, and a training step ------------------------------------------------------------------

def gemms_table(gemms: Sequence[dict]) -> Table:
    """The three GEMMs of :func:`gpulab.ch04_mlp_gemms.mlp.layer_gemms`: what each multiplies and what it gives."""
    return table(gemms, [Column("phase", "GEMM"), Column("formula"), Column("A"), Column("B", "times B"),
                         Column("C", "gives C")])


def mnk_table(gemms: Sequence[dict]) -> Table:
    """The three GEMMs in NVIDIA's M x N x K, and which of the layer's dimensions each of M, N and K is."""
    return table(gemms, [Column("phase", "GEMM"), Column("M"), Column("N"), Column("K"), Column("M is", "M is the"),
                         Column("N is", "N is the"), Column("K is", "K (summed) is the")])


def autograd_table(checks: Sequence[dict]) -> Table:
    """Rows of 'tensor', 'shape' and 'error': each hand-computed tensor against autograd's."""
    return table(checks, [Column("tensor"), Column("shape", format=lambda s: " x ".join(map(str, s))),
                          Column("error", "relative error against autograd", format=".1e")])


def operations_table(operations: Sequence[dict]) -> Table:
    """Every operation of a training step (:func:`gpulab.ch04_mlp_gemms.mlp.training_step_operations`)."""
    return table(operations, [Column("layer"), Column("kind"), Column("operation"), Column("shape"),
                              Column("flops", "work", "FLOP", ",d")])


def step_totals_said(totals: dict) -> list[str]:
    """What :func:`gpulab.ch04_mlp_gemms.mlp.step_totals` says, in two sentences."""
    return [f"GEMMs: {totals['gemm']:,.0f} FLOP ({totals['gemm_share']:.1%} of the step); elementwise and "
            f"reductions: {totals['elementwise']:,.0f} FLOP.",
            f"The step's GEMMs are {totals['step_over_forward']:.2f} x the forward GEMMs (3 x, less the first "
            "layer's activation gradient)."]


def flop_counts_table(counts: Sequence[dict]) -> Table:
    """Rows of 'sizes', 'batch', FlopCounterMode's 'forward', 'backward' and 'total', and 'ours' (the GEMMs)."""
    rows = [{**c, "ratio": c["backward"] / c["forward"]} for c in counts]
    flop = {"unit": "FLOP", "format": ",d"}
    return table(rows, [Column("sizes", "MLP", format=lambda s: " -> ".join(map(str, s))), Column("batch"),
                        Column("forward", "FlopCounterMode: forward", **flop), Column("backward", "backward", **flop),
                        Column("total", "total", **flop), Column("ours", "our GEMM count", "FLOP", ",.0f"),
                        Column("ratio", "backward / forward", format=".2f")])


def training_said(training, epochs: int) -> str:
    """A sentence on a :class:`gpulab.ch04_mlp_gemms.mlp.Training`: its steps, final loss and accuracies."""
    last = training.rows[-1]
    return (f"{training.steps} SGD steps over {epochs} epochs: final mean loss {last['loss']:.3f}, accuracy "
            f"{last['train_accuracy']:.1%} on the training images and {last['test_accuracy']:.1%} on the held-out "
            "test images.")


def gradient_check_table(checks: Sequence[dict]) -> Table:
    """Rows of 'layer', 'shape' (of dW), 'dW' and 'db' (relative errors against autograd)."""
    return table(checks, [Column("layer"), Column("shape", "dW", format=lambda s: " x ".join(map(str, s))),
                          Column("dW", "dW: relative error", format=".1e"),
                          Column("db", "db: relative error", format=".1e")])


# ---- tiles and waves ---------------------------------------------------------------------------------------------

def example_gpu(runs: Sequence[Recording]) -> tuple[str, int]:
    """The GPU whose SMs the chapter's example counts: the one running the notebook, else the first recorded."""
    info = env.describe()
    if info.kind == "cuda":
        return info.name, info.multiprocessors
    for run in runs:
        return run.device_name, run.provenance["device"]["multiprocessors"]
    return "an H100 or H200", 132


def wave_example(m: int, n: int, gpu: str, sms: int, tile: Sequence[int] = (128, 128)) -> list[str]:
    """The tile/wave model of an M x N output on ``sms`` SMs, in sentences."""
    example = waves.tile_waves(m, n, tile, sms)
    return [f"{gpu}: {sms} SMs. Outputs M = {m:,} and batch N = {n:,} in {tile[0]} x {tile[1]} tiles make "
            f"{-(-m // tile[0])} x {-(-n // tile[1])} = {example.tiles} tiles, {example.waves} waves; the last wave "
            f"keeps {example.tiles - (example.waves - 1) * example.slots} of {example.slots} SMs busy.",
            f"Tile efficiency {example.tile_efficiency:.0%} x wave efficiency {example.wave_efficiency:.0%} = "
            f"{example.efficiency:.0%} of the peak at best."]


def _sms(run: Recording) -> int:
    return run.provenance["device"]["multiprocessors"]


def batch_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU and tile model (one menu): the forward GEMM's rate against the batch, with the model over it."""
    return plots.by_gpu(runs, lambda run: quantization_figure(
        run.rows, "batch", sms=_sms(run), vary="n", x_title="batch size (N)",
        title=f"Linear layer forward GEMM, {run.params['inputs']} inputs and {run.params['outputs']} outputs, "
              f"against batch: {run.label}"))


def outputs_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU and tile model (one menu): the forward GEMM's rate against the outputs, with the model over it."""
    return plots.by_gpu(runs, lambda run: quantization_figure(
        [r for r in run.rows if r["vary"] == "outputs"], "outputs", sms=_sms(run), vary="m", x_title="outputs (M)",
        title=f"Linear layer forward GEMM, batch {run.params['batch']}, {run.params['fixed']} inputs, against "
              f"outputs: {run.label}"))


def step_agreement_table(runs: Sequence[Recording], x: str, *, vary: str) -> Table:
    """Per GPU, format and tile model: how many of the model's wave steps against ``x`` show as a measured drop of
    more than 4%, and how many of the measured drops the model explains."""
    rows = [{"gpu": run.short_label, **row} for run in runs for tile in TILE_MODELS
            for row in waves.step_agreement([r for r in run.rows if r.get("vary", x) == x], x, vary=vary, tile=tile,
                                      sms=_sms(run))]
    return table(rows, [Column("gpu", "GPU"), Column("dtype", "format"), Column("tile", "tile model"),
                        Column("predicted", "steps predicted"), Column("seen", "seen as a drop"),
                        Column("drops", "drops measured"), Column("explained", "drops explained", format=".0%")],
                 caption=f"against {x}: a drop is a fall of more than 4% from one size to the next")


def inputs_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: the forward GEMM's rate against the inputs (K), which the model predicts no steps for."""
    return plots.by_gpu(runs, lambda run: plots.sweep_figure(
        [r for r in run.rows if r["vary"] == "inputs"], "inputs", "tflops", color="dtype", x_title="inputs (K)",
        y_title="TFLOP/s", hover=("batch", "inputs", "outputs", "seconds"),
        title=f"Linear layer forward GEMM, batch {run.params['batch']}, {run.params['fixed']} outputs, against "
              f"inputs: {run.label}"))


def inputs_drops_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and format: the measured drops of more than 4% against the inputs."""
    rows = []
    for run in runs:
        inputs = [r for r in run.rows if r["vary"] == "inputs"]
        for dtype in dict.fromkeys(r["dtype"] for r in inputs):
            drops = waves.measured_drops([r for r in inputs if r["dtype"] == dtype], "inputs")
            rows.append({"gpu": run.short_label, "dtype": dtype, "drops": len(drops),
                         "at": ", ".join(f"{d['inputs']:,}" for d in drops)})
    return table(rows, [Column("gpu", "GPU"), Column("dtype", "format"),
                        Column("drops", "drops of more than 4% against inputs (K)"), Column("at", "at inputs")])


# ---- alignment ---------------------------------------------------------------------------------------------------

def alignment_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: :func:`alignment_figure` of its run."""
    def figure(run: Recording) -> go.Figure:
        fig = alignment_figure(run.rows, title=f"Rate relative to {run.params['base']:,} when one dimension "
                                                f"changes: {run.label}")
        return fig.update_xaxes(title_text="the dimension changed, and its new size")
    return plots.by_gpu(runs, figure)


def _relative(value: tuple[float, bool]) -> str:
    relative, misaligned = value
    return f"{relative:.2f}" + (" *" if misaligned else "")


def alignment_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, format and dimension: the rate at each size relative to the base, a star where a row of X, W or Y
    is not a whole number of 16-byte pieces (inputs and outputs are row lengths; the batch is only a row count)."""
    rows, sizes = [], []
    for run in runs:
        good = [r for r in ok_rows(run.rows) if "relative" in r]
        sizes += sorted({r["size"] for r in good} - set(sizes))
        for dtype in dict.fromkeys(r["dtype"] for r in good):
            size = flops.bytes_per_element(dtype)  # tf32 data are float32: 4 bytes
            for vary in ("batch", "inputs", "outputs"):
                rows.append({"gpu": run.short_label, "dtype": dtype, "vary": vary, **{
                    r["size"]: (r["relative"], vary != "batch" and r["size"] * size % 16 != 0)
                    for r in good if r["dtype"] == dtype and r["vary"] == vary}})
    return table(rows, [Column("gpu", "GPU"), Column("dtype", "format"), Column("vary", "dimension changed"),
                        *(Column(s, f"{s:,}", format=_relative) for s in sorted(sizes))],
                 caption="rate relative to the base size; * a row length that is not a multiple of 16 bytes")
