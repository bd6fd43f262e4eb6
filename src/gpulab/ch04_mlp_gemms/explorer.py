"""Chapter 04's explorer: a linear layer's three GEMMs, their shapes and FLOP, the tiles and waves each makes on a
GPU, and the rates the recordings measured for GEMMs of those shapes."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w
import plotly.graph_objects as go

from gpulab.ch04_mlp_gemms import mlp, waves
from gpulab.core import plots, recordings, specs
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, render

EXPERIMENTS = ("mlp_fc_batch_sweep", "mlp_fc_feature_sweep", "mlp_alignment")  # forward GEMMs of measure_linear
SHORT = {"forward propagation": "forward", "activation gradient": "activation gradient",
         "weight gradient": "weight gradient"}


def _recorded_range(run: Recording) -> str:
    """What shapes a run of one of :data:`EXPERIMENTS` measured, in words."""
    p = run.params
    if run.experiment == "mlp_fc_batch_sweep":
        return f"batches {min(p['batches']):,} to {max(p['batches']):,} of a {p['inputs']:,} -> {p['outputs']:,} layer"
    if run.experiment == "mlp_fc_feature_sweep":
        return (f"{min(p['features']):,} to {max(p['features']):,} inputs or outputs, the other {p['fixed']:,}, "
                f"at batch {p['batch']:,}")
    return f"batch, inputs or outputs of {', '.join(f'{s:,}' for s in p['sizes'])}, the others {p['base']:,}"


def layer_explorer(batch: int = 2048, inputs: int = 4096, outputs: int = 4096,
                   runs: Sequence[Recording] | None = None) -> w.Widget:
    """Pick a linear layer's batch, inputs and outputs, a GPU and a tile: its three GEMMs (forward, activation
    gradient, weight gradient) with their M x N x K, FLOP, tiles, waves and the share of the peak the tile/wave
    model allows (:func:`gpulab.ch04_mlp_gemms.waves.tile_waves`); and, per recorded GPU, the rate measured for a
    layer's forward GEMM of the same M x N x K, where one was (``runs``: the runs of :data:`EXPERIMENTS`, by
    default every GPU's recordings of them). Arithmetic and recordings: it answers without a GPU."""
    if runs is None:
        runs = [run for name in EXPERIMENTS for run in recordings.newest_per_gpu(name)]
    measured: dict[str, dict[tuple, float]] = {}
    labels: dict[str, str] = {}
    gpus: dict[str, tuple[str, int]] = {}  # a menu label: (GPU name, SMs)
    for run in runs:
        labels[run.device_name] = run.short_label
        measured.setdefault(run.device_name, {}).update(
            {(r["M"], r["N"], r["K"], r["dtype"]): r["tflops"] for r in ok_rows(run.rows)})
        sms = run.provenance.get("device", {}).get("multiprocessors")
        if run.on_gpu and sms:
            gpus.setdefault(f"{run.short_label}: {sms} SMs (recorded)", (run.device_name, sms))
    gpus.update({f"{row.name}: {row.sms} SMs": (row.name, row.sms) for row in specs.GPUS.values()})
    dtypes = sorted({key[3] for rates in measured.values() for key in rates}) or ["float16", "tf32", "float32"]

    def size(value: int, description: str) -> w.BoundedIntText:
        return w.BoundedIntText(value=value, min=1, max=2**17, description=description, style=WIDE,
                                layout=w.Layout(width="14em"))

    sizes = [size(batch, "batch"), size(inputs, "inputs"), size(outputs, "outputs")]
    gpu = w.Dropdown(options=list(gpus), description="GPU", style=WIDE)
    tile = w.Dropdown(options=[(waves.tile_label(t), t) for t in waves.TILE_MODELS], description="tile", style=WIDE)
    dtype = w.Dropdown(options=dtypes, value="float16" if "float16" in dtypes else dtypes[0],
                       description="recorded rates in", style=WIDE)
    output = w.Output()

    def update(_change=None) -> None:
        b, n_in, n_out = (s.value for s in sizes)
        name, sms = gpus[gpu.value]
        rows = []
        for g in mlp.layer_gemms(b, n_in, n_out):
            model = waves.tile_waves(g["M"], g["N"], tile.value, sms)
            rows.append({**g, "phase": SHORT[g["phase"]], "gflop": g["flops"] / 1e9, "tiles": model.tiles,
                         "waves": model.waves, "tile_eff": model.tile_efficiency, "wave_eff": model.wave_efficiency,
                         "efficiency": model.efficiency,
                         **{device: rates.get((g["M"], g["N"], g["K"], dtype.value))
                            for device, rates in measured.items()}})
        columns = [Column("phase", "GEMM"), Column("formula"), Column("M"), Column("N"), Column("K"),
                   Column("gflop", "work", "GFLOP", ",.4g"), Column("tiles"), Column("waves"),
                   Column("tile_eff", "tile efficiency", format=".0%"),
                   Column("wave_eff", "wave efficiency", format=".0%"),
                   Column("efficiency", "of the peak, at best", format=".0%"),
                   *(Column(device, f"{labels[device]}: recorded", "TFLOP/s", ",.1f") for device in measured)]
        said = [f"A layer of {n_in:,} inputs and {n_out:,} outputs on a batch of {b:,}: three GEMMs of "
                f"{2 * b * n_in * n_out:,} FLOP each. On the {name} ({sms} SMs), in tiles of "
                f"{waves.tile_label(tile.value)}:"]
        if measured:
            said.append(f"The recorded rates, in {dtype.value}, are those of a layer's forward GEMM (X W^T, as "
                        "nn.Linear runs it) of the same M x N x K; a dash: no recording of that shape. The recordings "
                        "hold " + "; ".join(_recorded_range(run) for run in runs) + ".")
        render(output, "\n".join(said), figure=_efficiency_figure(b, n_in, n_out, tile.value, name, sms),
               table=table(rows, columns))

    return assemble([sizes, [gpu, tile, dtype]], output, update)


def _efficiency_figure(batch: int, inputs: int, outputs: int, tile: Sequence[int], name: str, sms: int,
                       points: int = 240) -> go.Figure:
    """The share of the peak each of the three GEMMs can reach, against the batch, up to twice ``batch``."""
    step = max(1, 2 * batch // points)
    batches = list(range(step, 2 * batch + 1, step))
    fig = go.Figure()
    for phase, shape in (("forward", lambda b: (outputs, b)), ("activation gradient", lambda b: (inputs, b)),
                         ("weight gradient", lambda b: (outputs, inputs))):
        models = [waves.tile_waves(*shape(b), tile, sms) for b in batches]
        fig.add_trace(go.Scatter(x=batches, y=[m.efficiency for m in models], mode="lines", name=phase,
                                 hovertext=[f"batch = {b:,}<br>tiles = {m.tiles:,}<br>waves = {m.waves}<br>"
                                            f"efficiency = {m.efficiency:.1%}" for b, m in zip(batches, models,
                                                                                                  strict=True)],
                                 hoverinfo="text+name"))
    fig.update_layout(title=f"Tile and wave efficiency against the batch: {name}, {waves.tile_label(tile)}",
                      xaxis_title="batch size", yaxis_title="share of the peak the model allows",
                      yaxis=dict(range=[0, 1.05], tickformat=".0%"))
    return plots.vertical_marker(fig, batch, f"batch {batch:,}")
