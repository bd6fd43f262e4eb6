"""Chapter 09's figures and tables: the worklog against cuBLAS, the tiling hierarchy, a block schedule, tuning, waves
and quantization, drawn from runs of :mod:`.gemm` (each recorded GPU behind a menu, a column per GPU in the tables)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.ch04_mlp_gemms.waves import tile_waves
from gpulab.ch09_gemm_on_the_gpu import gemm
from gpulab.ch09_gemm_on_the_gpu.gemm import BEST, LANES, TUNABLE, Step, blocks_per_busiest_sm, sm_efficiency
from gpulab.core import kernel_mode, plots, specs
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, table
from gpulab.kernels import cuda_c

TARGET = 0.8  # the best hand-written kernel should reach at least 80% of cuBLAS


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
                      xaxis_title="kernel step", xaxis_tickangle=-30, showlegend=False)
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
    for col, (down, across) in enumerate([("M", "K"), ("K", "N"), ("M", "N")], start=1):  # the panels A, B and C
        fig.update_xaxes(title_text=f"tiles along {across}", row=1, col=col)
        fig.update_yaxes(title_text=f"tiles along {down}", row=1, col=col)
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


def ridge_table(names: Sequence[str] = ("H100 SXM5 80GB", "H200 SXM 141GB")) -> Table:
    """Per GPU of :mod:`gpulab.core.specs`: the FP32 peak of the CUDA cores, the memory's bandwidth, the ridge point,
    and the most floats a GEMM may load from memory per FMA and still reach the peak."""
    rows = []
    for name in names:
        row = specs.gpu(name)
        peak = specs.peak(row, "float32", "CUDA cores")
        ridge = peak.ops_per_s / (row.bandwidth_gb_s * 1e9)
        rows.append({"gpu": row.name, "peak": peak.tflops, "bandwidth": row.bandwidth_gb_s, "ridge": ridge,
                     "floats": 2 / ridge / 4})
    return table(rows, [Column("gpu", "GPU"), Column("peak", "FP32 peak", "TFLOP/s", ",.1f"),
                        Column("bandwidth", "memory", "GB/s", ","), Column("ridge", "ridge point", "FLOP/byte", ".1f"),
                        Column("floats", "at most, floats from memory per FMA", format=".3f")],
                 caption="datasheet rates at the boost clock")


def blocking_table(n: int, sizes: Sequence[int] = (1, 8, 16, 32, 64, 128, 256)) -> Table:
    """Floats loaded per FMA and FLOP per byte loaded for a block of b x b outputs of C, with the whole n^3 GEMM's
    intensity (each matrix moved once) in the caption."""
    rows = []
    for b in sizes:
        per_fma = 2.0 if b == 1 else 2 / b
        rows.append({"block": f"{b} x {b}", "per_fma": per_fma, "intensity": 2 / (4 * per_fma)})
    whole = 2 * n**3 / (3 * 4 * n**2)
    return table(rows, [Column("block", "block of C"), Column("per_fma", "floats loaded per FMA", format=".4f"),
                        Column("intensity", "FLOP per byte loaded", format=",.1f")],
                 caption=f"the whole {n:,}^3 GEMM, each matrix moved once: {whole:,.0f} FLOP per byte")


def steps_table(steps: Sequence[Step] = gemm.STEPS) -> Table:
    """Each step's tiling and what the compiler reports (:func:`gpulab.ch09_gemm_on_the_gpu.gemm.resources`), with the
    traffic its tiling implies (:func:`gpulab.ch09_gemm_on_the_gpu.gemm.traffic`)."""
    rows = [{"step": f"{s.number}. {s.label}", "tile": f"{s.tile[0]}x{s.tile[1]}",
             "thread_tile": f"{s.thread_tile[0]}x{s.thread_tile[1]}", **gemm.resources(s), **gemm.traffic(s)}
            for s in steps]
    capability = "this GPU" if kernel_mode.on_gpu() else "9.0"
    return table(rows, [Column("step"), Column("tile", "block tile"), Column("thread_tile", "per thread"),
                        Column("threads"), Column("registers"), Column("shared_bytes", "shared memory", "B"),
                        Column("spill_bytes", "spills", "B"), Column("blocks_per_sm", "blocks per SM"),
                        Column("global_floats_per_fma", "floats per FMA", format=".4f"),
                        Column("shared_loads_per_fma", "LDS per FMA", format=".3f")],
                 caption=f"compiled for {cuda_c.device_arch()}; blocks per SM from the register and shared-memory "
                 f"limits of compute capability {capability}; floats per FMA: values a block loads from global "
                 "memory per FMA; LDS per FMA: shared-memory load instructions per FMA of a thread")


def worklog_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    """:func:`worklog_figure` for each GPU's run, with that GPU's FP32 peak (a menu picks the GPU)."""
    def figure(run: Recording) -> go.Figure:
        row = specs.find(run.device_name)
        peak = specs.peak(row, "float32", "CUDA cores").tflops if row else None
        return worklog_figure(run.rows, peak_tflops=peak, title=f"SGEMM, {run.params['n']}^3, step by step: "
                              f"{run.label}")
    return plots.by_gpu(runs, figure)


def _times(value: float) -> str:
    return f"{value:.2f}x"


def worklog_table(runs: Sequence[Recording]) -> Table:
    """A row per step and cuBLAS; per GPU its TFLOP/s, the gain over the step before, and its share of cuBLAS and
    of the FP32 peak."""
    rows: dict[int, dict] = {}
    for i, run in enumerate(runs):
        previous = None
        for r in run.rows:
            row = rows.setdefault(r["step"], {"step": f"{r['step']}. {r['label']}" if r["step"] else "cuBLAS"})
            row |= {f"tflops{i}": r["tflops"], f"cublas{i}": r["fraction_of_cublas"],
                    f"peak{i}": r["fraction_of_peak"],
                    f"gain{i}": r["tflops"] / previous if previous and r["step"] > 0 else None}
            previous = r["tflops"]
    columns = [Column("step")]
    for i, run in enumerate(runs):
        gpu = run.short_label
        columns += [Column(f"tflops{i}", f"{gpu}: rate", "TFLOP/s", ",.2f"),
                    Column(f"gain{i}", "over the step before", format=_times),
                    Column(f"cublas{i}", "of cuBLAS", format=".1%"), Column(f"peak{i}", "of the peak", format=".0%")]
    sizes = sorted({run.params["n"] for run in runs})
    caption = f"float32, {' and '.join(f'{n:,}^3' for n in sizes)}, cuBLAS with TF32 off" if runs else ""
    return table(rows.values(), columns, caption=caption)


def worklog_target(runs: Sequence[Recording], target: float = TARGET) -> list[str]:
    """A sentence per run: the best step against the target share of cuBLAS, and the largest error of any step."""
    said = []
    for run in runs:
        best = max((r for r in run.rows if r["step"] > 0), key=lambda r: r["tflops"])
        verdict = "meets" if best["fraction_of_cublas"] >= target else "misses"
        error = max(r["relative_error"] for r in run.rows)
        said.append(f"{run.label}: the best kernel, step {best['step']} ({best['label']}), reaches "
                    f"{best['fraction_of_cublas']:.1%} of cuBLAS and {verdict} the {target:.0%} target; every kernel, "
                    f"cuBLAS too, matched float64 to a relative error of {error:.1e} or less.")
    return said


def variant_name(label: str) -> str:
    """'prefetched fragments (BK=16)' -> 'BK=16'; the file as it stands is 'defaults'."""
    return label.removeprefix("prefetched fragments").strip(" ()") or "defaults"


def tuning_table(runs: Sequence[Recording]) -> Table:
    """A row per variant of step 9, fastest first on the first GPU: its threads, thread tile and what the compiler
    made of it (registers, spills, resident blocks and warps per SM), and each GPU's TFLOP/s."""
    rows: dict[str, dict] = {}
    for i, run in enumerate(runs):
        for r in sorted(run.rows, key=lambda r: -r["tflops"]):
            row = rows.setdefault(r["label"], {
                "variant": variant_name(r["label"]), "threads": r["threads"], "thread_tile": r["thread_tile"],
                "registers": r["registers"], "spill_bytes": r["spill_bytes"], "blocks_per_sm": r["blocks_per_sm"],
                "warps": r["blocks_per_sm"] * r["threads"] // 32})
            row[f"tflops{i}"] = r["tflops"]
    columns = [Column("variant", "settings that differ from step 9"), Column("threads"),
               Column("thread_tile", "per thread"), Column("registers"), Column("spill_bytes", "spills", "B"),
               Column("blocks_per_sm", "blocks per SM"), Column("warps", "warps per SM")]
    columns += [Column(f"tflops{i}", f"{run.short_label}: rate", "TFLOP/s", ",.2f") for i, run in enumerate(runs)]
    caption = f"registers, spills and resident blocks as compiled for {runs[0].short_label}" if len(runs) > 1 else ""
    return table(rows.values(), columns, caption=caption)


def tuning_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        rows = [{**r, "variant": variant_name(r["label"])} for r in sorted(run.rows, key=lambda r: -r["tflops"])]
        return plots.bars_figure(rows, "variant", {"TFLOP/s": "tflops"}, x_title="settings that differ from step 9",
                                 title=f"Step 9 with other tile sizes, {run.params['n']}^3: {run.label}",
                                 y_title="TFLOP/s", hover=("registers", "spill_bytes", "blocks_per_sm", "thread_tile"))
    return plots.by_gpu(runs, figure)


def tuning_sentences(runs: Sequence[Recording]) -> list[str]:
    """A sentence per run: its fastest variant, and the variants that spill registers."""
    said = []
    for run in runs:
        fastest = max(run.rows, key=lambda r: r["tflops"])
        spilled = [variant_name(r["label"]) for r in run.rows if r["spill_bytes"]]
        said.append(f"{run.label}: the fastest variant is {variant_name(fastest['label'])} at "
                    f"{fastest['tflops']:,.2f} TFLOP/s; variants that spill registers: {', '.join(spilled) or 'none'}.")
    return said


def model_figure(m: int, ns: Sequence[int], tile: Sequence[int], sms: int) -> go.Figure:
    """The slot model (:func:`gpulab.ch04_mlp_gemms.waves.tile_waves`) of an m x n output against n: tile x wave
    efficiency and the wave efficiency alone."""
    rows = []
    for n in ns:
        model = tile_waves(m, n, tile, sms)
        rows.append({"N": n, "efficiency": model.efficiency, "wave_efficiency": model.wave_efficiency,
                     "tiles": model.tiles, "waves": model.waves})
    fig = plots.sweep_figure(rows, "N", "efficiency", name="tile x wave efficiency",
                             title=f"{m} x N in {tile[0]} x {tile[1]} tiles on {sms} SMs: the model",
                             x_title="N (columns of C)", y_title="share of the full-tile rate",
                             hover=("tiles", "waves"))
    return plots.add_sweep(fig, rows, "N", "wave_efficiency", name="wave efficiency", dash="dot")


def model_table(m: int, ns: Sequence[int], tile: Sequence[int], sms: int) -> Table:
    rows = []
    for n in ns:
        model = tile_waves(m, n, tile, sms)
        rows.append({"n": n, "tiles": model.tiles, "waves": model.waves, "efficiency": model.efficiency})
    return table(rows, [Column("n", "N"), Column("tiles"), Column("waves"),
                        Column("efficiency", "at best", format=".1%")],
                 caption=f"{m} x N in {tile[0]} x {tile[1]} tiles on {sms} SMs")


def fitted_partials(runs: Sequence[Recording]) -> dict[str, float]:
    """Per GPU (its device name): the time of a lone block that fits its sweep best
    (:func:`gpulab.ch09_gemm_on_the_gpu.gemm.fit_partial`)."""
    return {run.device_name: gemm.fit_partial(run.rows) for run in runs}


def quantization_by_gpu(runs: Sequence[Recording], x: str, partials: Mapping[str, float], *, title: str,
                        x_title: str) -> go.Figure:
    """:func:`quantization_figure` for each GPU's sweep, with the ``partials`` fitted for that GPU (else its own)."""
    def figure(run: Recording) -> go.Figure:
        partial = partials.get(run.device_name) or gemm.fit_partial(run.rows)
        return quantization_figure(run.rows, x, partial=partial, title=f"{title}: {run.label}", x_title=x_title)
    return plots.by_gpu(runs, figure)


def _correlation(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson's correlation, or None where it is undefined (fewer than two points, a constant series)."""
    try:
        return statistics.correlation(x, y)
    except statistics.StatisticsError:
        return None


def model_fit_table(sweeps: Mapping[str, Sequence[Recording]], partials: Mapping[str, float]) -> Table:
    """Per sweep and GPU: the fitted time of a lone block, and how well each model follows the measured rates
    (correlation): the slot model and the per-SM model with the kernel, the per-SM model with cuBLAS."""
    rows = []
    for sweep, runs in sweeps.items():
        for run in runs:
            p = partials.get(run.device_name) or gemm.fit_partial(run.rows)
            ok = sorted(ok_rows(run.rows), key=lambda r: r["n"])
            kernel, per_sm = [r["kernel_tflops"] for r in ok], [sm_efficiency(r, p) for r in ok]
            rows.append({"sweep": sweep, "gpu": run.short_label, "p": p,
                         "slot": _correlation([r["efficiency"] for r in ok], kernel),
                         "per_sm": _correlation(per_sm, kernel),
                         "cublas": _correlation(per_sm, [r["cublas_tflops"] for r in ok])})
    correlation = {"format": ".3f"}
    return table(rows, [Column("sweep"), Column("gpu", "GPU"), Column("p", "partial group p", format=".3f"),
                        Column("slot", "slot model with the kernel", **correlation),
                        Column("per_sm", "per-SM model with the kernel", **correlation),
                        Column("cublas", "per-SM model with cuBLAS", **correlation)],
                 caption="correlation of each model with the measured rates")


def model_steps_table(sweeps: Mapping[str, Sequence[Recording]], partials: Mapping[str, float]) -> Table:
    """Per sweep and GPU, each point where the busiest SM gets another block: the per-SM model's step against the
    kernel's and cuBLAS's measured ones (ratios of the rates after and before)."""
    rows = []
    for sweep, runs in sweeps.items():
        for run in runs:
            p = partials.get(run.device_name) or gemm.fit_partial(run.rows)
            ok = sorted(ok_rows(run.rows), key=lambda r: r["n"])
            for before, after in zip(ok, ok[1:], strict=False):
                if blocks_per_busiest_sm(after) > blocks_per_busiest_sm(before):
                    rows.append({"sweep": sweep, "gpu": run.short_label, "n": f"{before['n']:,} -> {after['n']:,}",
                                 "blocks": f"{blocks_per_busiest_sm(before)} -> {blocks_per_busiest_sm(after)}",
                                 "model": sm_efficiency(after, p) / sm_efficiency(before, p),
                                 "kernel": after["kernel_tflops"] / before["kernel_tflops"],
                                 "cublas": after["cublas_tflops"] / before["cublas_tflops"]})
    return table(rows, [Column("sweep"), Column("gpu", "GPU"), Column("n", "N"),
                        Column("blocks", "blocks on the busiest SM"), Column("model", "per-SM model", format=_times),
                        Column("kernel", "step 9, measured", format=_times),
                        Column("cublas", "cuBLAS, measured", format=_times)])


def divisibility_table(runs: Sequence[Recording]) -> Table:
    """The sizes of each GPU's tile sweep grouped by the largest power of two that divides N
    (:func:`gpulab.ch09_gemm_on_the_gpu.gemm.divisibility`): each group's mean rate over the sweep's best, per GPU."""
    rows: dict[str, dict] = {}
    for i, run in enumerate(runs):
        for r in gemm.divisibility(run.rows):
            row = rows.setdefault(r["sizes"], {"sizes": r["sizes"], "count": r["count"]})
            row |= {f"kernel{i}": r["kernel_relative"], f"cublas{i}": r["cublas_relative"]}
    columns = [Column("sizes", "N is a"), Column("count", "sizes")]
    for i, run in enumerate(runs):
        columns += [Column(f"kernel{i}", f"{run.short_label}: step 9", format=".1%"),
                    Column(f"cublas{i}", "cuBLAS", format=".1%")]
    shapes = ", ".join(dict.fromkeys(f"{run.rows[0]['m']} x N x {run.rows[0]['k']}" for run in runs if run.rows))
    return table(rows.values(), columns, caption=f"mean rate of the group over the sweep's best ({shapes})")


def simulation_table(rows: Sequence[dict], grid: Sequence[int], tile: int) -> Table:
    """The numba kernels run on one shape: each one's error against float64 and the values it loads from global
    memory."""
    return table(rows, [Column("kernel"), Column("relative_error", "relative error", format=".1e"),
                        Column("loads", "loads from global memory", format=",.0f")],
                 caption=f"{grid[0]} x {grid[1]} blocks of {tile} x {tile} threads")
