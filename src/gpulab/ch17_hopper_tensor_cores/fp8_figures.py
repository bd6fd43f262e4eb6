"""Chapter 17's tables, figures and sentences for FP8: the formats, the errors emulated live, the quantization's
operations, and the ``fp8_matmul`` recordings (every recorded GPU behind a menu, a GPU column in the tables)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.ch17_hopper_tensor_cores import quantization
from gpulab.ch17_hopper_tensor_cores.quantization import config_label, measured_rows
from gpulab.core import plots
from gpulab.core.printing import say
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, table

SPEEDUP = {"format": lambda x: f"{x:.2f}x"}
MS = {"format": lambda s: f"{1e3 * s:,.3f}"}
RATE = {"format": plots.short_number}  # three significant digits: small products run at a fraction of a TFLOP/s
SERIES = (("bfloat16 (cuBLAS)", "bfloat16_tflops", "solid"), ("FP8 matmul alone", "fp8_tflops", "solid"),
          ("FP8, quantization included", "path_tflops", "dash"))


def formats_table(rows: Sequence[dict]) -> Table:
    """:func:`.quantization.format_rows` as a table."""
    return table(rows, [Column("format"), Column("bits"), Column("exponent_bits", "exponent bits"),
                        Column("fraction_bits", "fraction bits"), Column("max", "largest", format=",.6g"),
                        Column("smallest_normal", "smallest normal", format=".3g"),
                        Column("smallest_subnormal", "smallest subnormal", format=".3g"),
                        Column("unit_roundoff", "unit roundoff", format=".3g"),
                        Column("binades", "range", "powers of two", ".1f")],
                 caption="every number from torch.finfo; range: log2(largest / smallest subnormal)")


def errors_table(rows: Sequence[dict]) -> Table:
    """:func:`.quantization.error_rows`: the relative error against float64, overall and per row, FP8 beside
    bfloat16."""
    shown = [{**r, "spread_text": "one scale" if not r["spread"] else f"rows over 10^±{r['spread']:g}"} for r in rows]
    return table(shown, [Column("spread_text", "operands"), Column("format"), Column("granularity", "scales"),
                         Column("fp8_error", "FP8 error", format=".3f"),
                         Column("fp8_mean_row_error", "mean row", format=".3f"),
                         Column("fp8_max_row_error", "worst row", format=".3f"),
                         Column("bfloat16_error", "bfloat16 error", format=".4f"),
                         Column("bfloat16_max_row_error", "bfloat16 worst row", format=".4f")],
                 caption=f"relative errors against float64 (Frobenius norm; per row of C), "
                         f"{rows[0]['m']} x {rows[0]['k']} by {rows[0]['k']} x {rows[0]['n']}, emulated exactly on "
                         "the host" if rows else "")


def error_statements(rows: Sequence[dict]) -> list[str]:
    """What the emulated errors show, computed from ``rows``."""
    one = {(r["format"], r["granularity"]): r for r in rows if not r["spread"]}
    spread = {(r["format"], r["granularity"]): r for r in rows if r["spread"]}
    said = []
    e4m3, pair = one.get(("e4m3", "tensor")), one.get(("e5m2 x e4m3", "tensor"))
    if e4m3 and pair:
        said.append(f"On operands of one scale, e4m3's error is {e4m3['fp8_error'] / e4m3['bfloat16_error']:.0f} times "
                    f"bfloat16's, and e5m2 x e4m3's is {pair['fp8_error'] / e4m3['fp8_error']:.2f} times e4m3's "
                    f"(independent roundings of each operand predict {quantization.error_ratio_model():.2f}).")
    tensor, row = spread.get(("e4m3", "tensor")), spread.get(("e4m3", "row"))
    if tensor and row:
        said.append(f"With rows spread over 10^±{tensor['spread']:g}, one scale for the whole tensor leaves e4m3's "
                    f"worst row of C with an error of {tensor['fp8_max_row_error']:.0%} (its small rows sink into the "
                    f"subnormals and zero), against {row['fp8_max_row_error']:.0%} with a scale per row; the overall "
                    f"errors, made by the large rows, hardly differ ({tensor['fp8_error']:.3f} and "
                    f"{row['fp8_error']:.3f}).")
    return said


def operations_table(operations: Sequence[dict]) -> Table:
    """:func:`.quantization.quantize_operations`, with a total row."""
    total = {"operation": "total", "read_bytes": sum(o["read_bytes"] for o in operations),
             "written_bytes": sum(o["written_bytes"] for o in operations),
             "bytes": sum(o["bytes"] for o in operations)}
    shown = [{**o, "pass": "whole tensor" if o["whole_tensor"] else "scale only"} for o in operations]
    per = {"format": ".2f"}
    return table([*shown, total], [Column("operation", "ATen operation (one GPU kernel)"), Column("pass", "on"),
                                   Column("read_bytes", "read", "bytes per element", **per),
                                   Column("written_bytes", "written", "bytes per element", **per),
                                   Column("bytes", "moved", "bytes per element", **per)],
                 caption="quantizing one bfloat16 operand to e4m3 with one scale, as gpulab.kernels.fp8 does it; "
                         "counted on this machine's CPU")


def _fp8_one(run: Recording) -> go.Figure:
    """One GPU: TFLOP/s against n of bfloat16, the FP8 matmul alone and the whole path, a menu entry per format and
    granularity."""
    rows = measured_rows(run.rows)
    configs = list(dict.fromkeys(config_label(r) for r in rows))
    fig = go.Figure()
    for i, config in enumerate(configs):
        mine = sorted((r for r in rows if config_label(r) == config), key=lambda r: r["n"])
        for j, (name, key, dash) in enumerate(SERIES):
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in mine], y=[r[key] for r in mine], mode="lines+markers", name=name,
                visible=i == 0, line=dict(color=plots.PALETTE[j], dash=dash), marker_symbol=plots.SYMBOLS[j],
                hovertext=[plots.hover_text(r, ("n", key, "speedup_matmul", "speedup_path", "quantize_share",
                                                "relative_error")) for r in mine], hoverinfo="text+name"))
    buttons = [dict(label=config, method="update",
                    args=[{"visible": [k // len(SERIES) == i for k in range(len(fig.data))]},
                          {"title.text": f"FP8 against bfloat16, {config}: {run.label}"}])
               for i, config in enumerate(configs)]
    title = buttons[0]["args"][1]["title.text"] if buttons else f"FP8 against bfloat16: {run.label}"
    fig.update_layout(title=title, xaxis=dict(type="log", title="n (n x n x n matmul)"),
                      yaxis=dict(type="log", title="rate (TFLOP/s, 2n^3 per time)"),
                      legend=dict(orientation="h", y=-0.25),
                      updatemenus=[dict(buttons=buttons, active=0, x=0.0, y=1.0, xanchor="left", yanchor="bottom",
                                        direction="down")] if len(buttons) > 1 else [])
    return fig


def fp8_figure(runs: Sequence[Recording]) -> go.Figure | None:
    return plots.by_gpu(runs, _fp8_one) if runs else None


def fp8_table(runs: Sequence[Recording]) -> Table:
    rows = [{"gpu": run.short_label, **r, "config": config_label(r)} for run in runs for r in measured_rows(run.rows)]
    return table(rows, [Column("gpu", "GPU"), Column("n", "n"), Column("config", "FP8 format, scales"),
                        Column("bfloat16_tflops", "bfloat16", "TFLOP/s", **RATE),
                        Column("fp8_tflops", "FP8 matmul", "TFLOP/s", **RATE),
                        Column("path_tflops", "FP8 path", "TFLOP/s", **RATE),
                        Column("speedup_matmul", "matmul speed-up", **SPEEDUP),
                        Column("speedup_path", "path speed-up", **SPEEDUP),
                        Column("quantize_share", "quantizing", format=".0%"),
                        Column("relative_error", "FP8 error", format=".3f"),
                        Column("error_vs_bfloat16", "error / bfloat16's", format=".0f")])


def unsupported_statements(runs: Sequence[Recording]) -> list[str]:
    """A sentence per GPU that refused a configuration (the row says why)."""
    said = []
    for run in runs:
        refused = {config_label(r): r["unsupported"] for r in run.rows if "unsupported" in r}
        said += [f"{run.label}: {config} did not run ({why})." for config, why in refused.items()]
    return said


def pays_statements(runs: Sequence[Recording]) -> list[str]:
    """Per GPU: from which n on FP8 pays, the matmul alone and the whole path, in every configuration."""
    said = []
    for run in runs:
        rows = measured_rows(run.rows)
        if not rows:
            continue
        largest = max(r["n"] for r in rows)
        top = [r for r in rows if r["n"] == largest]
        alone, path = quantization.pays_from(rows, "speedup_matmul"), quantization.pays_from(rows, "speedup_path")
        best_path = max(rows, key=lambda r: r["speedup_path"])
        text = (f"{run.label}: the FP8 matmul alone beats bfloat16 in every configuration "
                + (f"from n = {alone:,} on" if alone else "at no size of the sweep")
                + f" ({min(r['speedup_matmul'] for r in top):.2f}x to {max(r['speedup_matmul'] for r in top):.2f}x "
                f"at n = {largest:,}). With both operands quantized in the call, the whole path ")
        text += (f"beats it from n = {path:,} on." if path else
                 f"never does: at best {best_path['speedup_path']:.2f}x, at n = {best_path['n']:,} "
                 f"({config_label(best_path)}), where quantizing took {best_path['quantize_share']:.0%} of the path's "
                 "time.")
        said.append(text)
    return said


def quantization_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and size, for e4m3 with either scale: the quantization's time, the bytes it moved (counted by
    :func:`.quantization.quantize_operations`), its rate and its share of the device copy's rate measured on the same
    GPU (chapter 03's ceilings; a dash where that GPU has none)."""
    rows = []
    for run in runs:
        try:
            copy = quantization.copy_gbytes_per_s(run)
        except KeyError:
            copy = None
        for r in measured_rows(run.rows):
            if r["format"] != "e4m3":
                continue
            rate = quantization.quantize_gbytes_per_s(r)
            rows.append({"gpu": run.short_label, "n": r["n"], "scales": f"{r['granularity']}-wise",
                         "seconds": r["quantize_seconds"], "gib": quantization.quantized_bytes(r) / 2**30,
                         "rate": rate, "of_copy": rate / copy if copy else None, "share": r["quantize_share"]})
    return table(rows, [Column("gpu", "GPU"), Column("n", "n"), Column("scales"),
                        Column("seconds", "quantizing A and B", "ms", **MS), Column("gib", "moved", "GiB", ",.2f"),
                        Column("rate", "rate", "GB/s", ",.0f"), Column("of_copy", "of the copy", format=".0%"),
                        Column("share", "of the path's time", format=".0%")],
                 caption="e4m3; bytes as counted per operation on the CPU, the copy from the same GPU's blas_ceilings")


def show_fp8(runs: Sequence[Recording]) -> None:
    """Display the FP8 figure and sentences (where FP8 pays, what a GPU refused), where a GPU recorded or ran the
    sweep; the table of every point is :func:`fp8_table`, which the page shows folded."""
    if runs:
        fp8_figure(runs).show()
        say(*pays_statements(runs), *unsupported_statements(runs))
