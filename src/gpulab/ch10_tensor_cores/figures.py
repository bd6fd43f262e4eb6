"""Chapter 10's figures and tables: one function per thing the page shows, the measurements drawn from runs of
:mod:`.tensor_cores` and :mod:`.wmma` (each recorded GPU behind a menu, the GPUs one under another in the tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch

from gpulab.ch04_mlp_gemms.figures import alignment_figure as _alignment_bars
from gpulab.ch10_tensor_cores import tensor_cores, wmma
from gpulab.core import kernel_mode, plots, specs
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, table
from gpulab.kernels import cuda_c

SIXTEEN_BYTE_ELEMENTS = {"float16": 2, "bfloat16": 2}  # elements of other dtypes take 4 bytes (float32, tf32)


def _ok(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r.get("status", "ok") == "ok"]


def instructions_table() -> Table:
    """The PTX matrix instructions of each generation (:data:`.tensor_cores.MATRIX_INSTRUCTIONS`)."""
    rows = [{**r, "tile": f"{r['m']} x {r['n']} x {r['k']}", "fma": r["m"] * r["n"] * r["k"]}
            for r in tensor_cores.MATRIX_INSTRUCTIONS]
    return table(rows, [Column("architecture"), Column("instruction"), Column("issued by"),
                        Column("tile", "tile m x n x k"), Column("fma", "FMA per instruction")])


def accumulation_rows(seed: int = 0, terms: int = 4096) -> list[dict]:
    """One tensor-core operation (:func:`.tensor_cores.tile_mma`) with float32 and float16 sums: a 4 x 4 x 4 tile
    of random numbers against float64 on the same float16 inputs, and ``terms`` products of 1 x (1 + 2^-10) added
    to 0."""
    generator = torch.Generator().manual_seed(seed)
    A, B, C = (torch.randn(4, 4, generator=generator) for _ in range(3))
    exact = A.half().double() @ B.half().double() + C.double()
    a, b = torch.ones(1, terms), torch.full((terms, 1), 1.0 + 2**-10)
    total = terms * (1 + 2**-10)
    rows = []
    for accumulator in ("float32", "float16"):
        D = tensor_cores.tile_mma(A, B, C, accumulator)
        rows.append({"sum": "one 4 x 4 x 4 tile (64 FMA)", "accumulator": accumulator, "result": None,
                     "exact": None, "error": ((D.double() - exact).norm() / exact.norm()).item()})
    for accumulator in ("float32", "float16"):
        found = tensor_cores.tile_mma(a, b, torch.zeros(1, 1), accumulator).item()
        rows.append({"sum": f"{terms:,} products of 1 x (1 + 2^-10)", "accumulator": accumulator, "result": found,
                     "exact": total, "error": abs(found - total) / total})
    return rows


def accumulation_table(rows: Sequence[dict]) -> Table:
    return table(rows, [Column("sum", "D = A B + C"), Column("accumulator", "sums in"),
                        Column("result", format=",.1f"), Column("exact", format=",.1f"),
                        Column("error", "relative error", format=".1e")])


def peaks_table(rows: Sequence[dict]) -> Table:
    """The rows of :func:`.tensor_cores.peak_rows`: each GPU's tensor-core peak, worked out, beside its CUDA cores'."""
    return table(rows, [Column("gpu", "GPU"), Column("sms", "SMs"),
                        Column("tensor_cores_per_sm", "tensor cores per SM"),
                        Column("fma_per_clock_per_tensor_core", "FMA per clock per tensor core"),
                        Column("tile_per_clock", "tile per clock"), Column("clock_ghz", "clock", "GHz", ".2f"),
                        Column("tensor_tflops", "float16, tensor cores", "TFLOP/s", ",.1f"),
                        Column("fp32_cuda_core_tflops", "float32, CUDA cores", "TFLOP/s", ",.1f"),
                        Column("ratio", "ratio", format=lambda v: f"{v:.1f}x")],
                 caption="dense rates: float16 inputs on the tensor cores, float32 on the CUDA cores")


def peaks_figure(rows: Sequence[dict]) -> go.Figure:
    return plots.bars_figure(rows, "gpu", {"float16 on the tensor cores": "tensor_tflops",
                                           "float32 on the CUDA cores": "fp32_cuda_core_tflops"},
                             title="Peak rates worked out from the hardware (gpulab.core.specs)", x_title="GPU",
                             y_title="TFLOP/s (dense, log scale)", log_y=True,
                             hover=("sms", "tensor_cores_per_sm", "clock_ghz", "ratio"))


def formats_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Each format as a point: its error against float64 (x, log) and its rate (y, log)."""
    fig = go.Figure()
    for i, r in enumerate(_ok(rows)):
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


def formats_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    return plots.by_gpu(runs, lambda run: formats_figure(
        run.rows, title=f"Rate against error, {run.params['n']:,}^3 matmul: {run.label}"))


def _note(row: dict) -> str | None:
    return None if row.get("status", "ok") == "ok" else row["status"]


def formats_table(runs: Sequence[Recording]) -> Table:
    rows = [{"gpu": run.short_label, **r, "note": _note(r)} for run in runs for r in run.rows]
    columns = [Column("gpu", "GPU"), Column("format"), Column("unit"), Column("n", "n"),
               Column("tflops", "rate", "TFLOP/s", ",.3g"), Column("fraction_of_peak", "of peak", format=".0%"),
               Column("relative_error", "relative error", format=".2e")]
    return table(rows, columns + ([Column("note")] if any(r["note"] for r in rows) else []))


def wmma_resources_table(variants: Sequence[Mapping[str, int]]) -> Table:
    """What NVRTC reports for the naive WMMA kernel and each variant of the pipelined one, and the blocks and warps
    those resources let an SM hold (of this GPU, or of compute capability 9.0 without one)."""
    rows = []
    for kernel in (wmma.NAIVE, *(wmma.pipelined(**v) for v in variants)):
        reason = wmma.unavailable(kernel)
        rows.append({"kernel": kernel.label, "tile": f"{kernel.tile[0]} x {kernel.tile[1]}", "note": reason,
                     **({} if reason else wmma.resources(kernel))})
    columns = [Column("kernel"), Column("tile", "block tile"), Column("threads"), Column("registers"),
               Column("shared_bytes", "shared memory", "B", ","), Column("spill_bytes", "spills", "B"),
               Column("blocks_per_sm", "blocks per SM"), Column("warps_per_sm", "warps per SM")]
    if any(r["note"] for r in rows):
        columns.append(Column("note", "not run here"))
    where = "this GPU" if kernel_mode.on_gpu() else "compute capability 9.0"
    return table(rows, columns, caption=f"compiled for {cuda_c.device_arch()}; blocks per SM from the registers "
                                        f"and shared memory of {where}")


def wmma_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """TFLOP/s of every kernel of :func:`.wmma.wmma_comparison` as horizontal bars in the table's order, tensor cores
    and CUDA cores in two colours and fills, each bar labelled with its share of cuBLAS float16; a dotted line
    at half of cuBLAS float16."""
    ok = _ok(rows)
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
    fig.update_yaxes(autorange="reversed", automargin=True, title_text="kernel")  # the table's first row on top
    fig.update_layout(title=title, xaxis_title="TFLOP/s (labels: TFLOP/s and the share of cuBLAS float16)",
                      height=160 + 30 * len(ok), legend=dict(orientation="h", y=-0.15), margin=dict(r=90))
    return fig


def wmma_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    return plots.by_gpu(runs, lambda run: wmma_figure(
        run.rows, title=f"GEMM {run.params['n']:,}^3 on tensor cores and CUDA cores: {run.label}"))


def wmma_table(runs: Sequence[Recording]) -> Table:
    rows = [{"gpu": run.short_label, **r, "note": _note(r)} for run in runs for r in run.rows]
    columns = [Column("gpu", "GPU"), Column("name", "kernel"), Column("unit"),
               Column("tflops", "rate", "TFLOP/s", ",.1f"),
               Column("fraction_of_cublas_fp16", "of cuBLAS float16", format=".1%"),
               Column("fraction_of_peak", "of peak", format=".0%"), Column("relative_error", "error", format=".1e")]
    return table(rows, columns + ([Column("note")] if any(r["note"] for r in rows) else []))


def wmma_verdict(runs: Sequence[Recording], target: float) -> list[str]:
    """Per run: the kernel cuBLAS float16 ran, and whether the best WMMA kernel meets ``target`` (a share of cuBLAS
    float16) and beats the best SIMT SGEMM."""
    said = []
    for run in runs:
        ok = _ok(run.rows)
        wmma_rows = [r for r in ok if "wmma" in r["file"]]
        if not wmma_rows:
            continue
        best = max(wmma_rows, key=lambda r: r["tflops"])
        sgemm = max((r for r in ok if r["file"].startswith("24_")), key=lambda r: r["tflops"])
        cublas = next(r for r in ok if r["name"] == "cuBLAS float16")
        ran = ", ".join(f"`{k}`" for k in cublas["kernels"].split(", ")) if cublas.get("kernels") else "(not recorded)"
        share = best["fraction_of_cublas_fp16"]
        said.append(f"{run.label}: cuBLAS float16 ran {ran}. The best WMMA kernel, {best['name']}, runs at "
                    f"{best['tflops']:.1f} TFLOP/s, {share:.1%} of cuBLAS float16: it "
                    f"{'meets' if share >= target else 'misses'} the {target:.0%} target. It is "
                    f"{best['tflops'] / sgemm['tflops']:.1f}x the best SGEMM, which it "
                    f"{'beats' if best['tflops'] > sgemm['tflops'] else 'does not beat'}.")
    return said


def tf32_table(runs: Sequence[Recording]) -> Table:
    rows = [{"gpu": run.short_label, **r, "ran": ", ".join(r["kernels"])} for run in runs for r in run.rows]
    return table(rows, [Column("gpu", "GPU"), Column("setting"), Column("allow_tf32", "allow_tf32"),
                        Column("matmul_precision", "precision"), Column("tflops", "rate", "TFLOP/s", ",.1f"),
                        Column("relative_error", "error", format=".1e"), Column("ran", "kernels that ran")])


def _element_bytes(dtype: str) -> int:
    return SIXTEEN_BYTE_ELEMENTS.get(dtype, 4)


def _aligned(row: dict) -> bool:
    """Whether the row length ``row['size']`` of the varied dimension is a multiple of 16 bytes."""
    return row["size"] * _element_bytes(row["dtype"]) % 16 == 0


def alignment_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        fig = _alignment_bars(run.rows, title=f"Rate relative to {run.params['base']:,} when one dimension "
                                              f"changes: {run.label}")
        return fig.update_xaxes(title_text="the dimension changed, and its new size")
    return plots.by_gpu(runs, figure)


def alignment_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, dtype and size: the rate relative to the base when the batch, the inputs or the outputs take that
    size, and whether a row of that many elements is a multiple of 16 bytes long."""
    rows: dict[tuple, dict] = {}
    for run in runs:
        for r in run.rows:
            if r.get("status") != "ok" or "relative" not in r:
                continue
            row = rows.setdefault((run.short_label, r["dtype"], r["size"]), {
                "gpu": run.short_label, "dtype": r["dtype"], "size": r["size"],
                "aligned": "yes" if _aligned(r) else "no"})
            row[r["vary"]] = r["relative"]
    relative = {"format": ".2f"}
    return table(rows.values(), [Column("gpu", "GPU"), Column("dtype"), Column("size", "new size"),
                                 Column("aligned", "rows of this length are a multiple of 16 B"),
                                 Column("batch", "batch changed", **relative),
                                 Column("inputs", "inputs changed", **relative),
                                 Column("outputs", "outputs changed", **relative)],
                 caption="rate relative to the layer with every dimension at the base size")


def alignment_summary(runs: Sequence[Recording]) -> Table:
    """Per GPU, dtype and row-length dimension (inputs, outputs): the mean relative rate of the sizes whose rows are
    a multiple of 16 bytes long and of the others."""
    rows = []
    for run in runs:
        ok = [r for r in run.rows if r.get("status") == "ok" and "relative" in r]
        for dtype in dict.fromkeys(r["dtype"] for r in ok):
            for vary in ("inputs", "outputs"):
                chosen = [r for r in ok if r["dtype"] == dtype and r["vary"] == vary]
                groups = {aligned: [r["relative"] for r in chosen if _aligned(r) == aligned]
                          for aligned in (True, False)}
                mean = {k: sum(v) / len(v) if v else None for k, v in groups.items()}
                rows.append({"gpu": run.short_label, "dtype": dtype, "vary": vary, "aligned": mean[True],
                             "misaligned": mean[False], "worst": min(groups[False], default=None)})
    return table(rows, [Column("gpu", "GPU"), Column("dtype"), Column("vary", "dimension changed"),
                        Column("aligned", "rows a multiple of 16 B: mean", format=".2f"),
                        Column("misaligned", "the other sizes: mean", format=".2f"),
                        Column("worst", "the other sizes: lowest", format=".2f")],
                 caption="rate relative to the base size")


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


def _layer_title(run: Recording, x: str) -> str:
    first = run.rows[0]
    if x == "outputs":
        return f"Output layer, {first['batch']:,} tokens x {first['inputs']:,} -> vocabulary: {run.label}"
    return f"A {first['inputs']:,} -> {first['outputs']:,} layer against the batch: {run.label}"


def layer_by_gpu(runs: Sequence[Recording], x: str) -> go.Figure:
    """:func:`layer_gemms_figure` of each run, against ``x``: 'outputs' (the vocabulary) or 'batch'."""
    x_title = "vocabulary size (outputs)" if x == "outputs" else "batch size"
    return plots.by_gpu(runs, lambda run: layer_gemms_figure(run.rows, x, title=_layer_title(run, x), x_title=x_title))


def layer_reference(run: Recording, x: str) -> int:
    """The size the step's rate is compared with: the padded vocabulary (the largest), or a batch equal to the
    layer's inputs."""
    return max(r["outputs"] for r in run.rows) if x == "outputs" else run.rows[0]["inputs"]


def layer_table(runs: Sequence[Recording], x: str) -> Table:
    """Per GPU and size of ``x``: the rate of each GEMM of the layer's step, the step's time, and its rate relative
    to that at :func:`layer_reference`."""
    rows, phases = [], []
    for run in runs:
        ok = [r for r in run.rows if r.get("status") == "ok"]
        reference = layer_reference(run, x)
        steps = {r[x]: r for r in ok if r["gemm"] == "step"}
        for size in sorted(steps):
            row = {"gpu": run.short_label, "dtype": steps[size]["dtype"], "size": size,
                   "step_ms": 1e3 * steps[size]["seconds"],
                   "relative": steps[size]["tflops"] / steps[reference]["tflops"] if reference in steps else None}
            for r in ok:
                if r[x] == size and r["gemm"] != "step":
                    row[r["gemm"]] = r["tflops"]
                    if r["gemm"] not in phases:
                        phases.append(r["gemm"])
            rows.append(row)
    reference = f"that at {layer_reference(runs[0], x):,}" if runs else "the reference"
    return table(rows, [Column("gpu", "GPU"), Column("dtype"), Column("size", x),
                        *(Column(p, p, "TFLOP/s", ",.0f") for p in phases),
                        Column("step_ms", "step", "ms", ",.3f"),
                        Column("relative", f"step rate / {reference}", format=".2f")])
