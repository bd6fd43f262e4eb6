"""Chapter 15's explorer: the storage of N:M compressed matrices per format, and each GPU's recorded speed-ups."""

from __future__ import annotations

import math

import ipywidgets as w
import plotly.graph_objects as go

from gpulab.ch15_structured_sparsity import patterns
from gpulab.core import recordings
from gpulab.core.printing import format_bytes
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, nearest, render

HARDWARE = {8: "2:4", 16: "2:4", 32: "1:2"}  # the pattern the sparse tensor cores take for each width


def sparsity_explorer(n: int = 4096, value_bits: int = 16, gpu: str | None = None) -> w.Widget:
    """Pick the bits per value, an N:M pattern, an n x n matrix and a recorded GPU: the matrix's dense and compressed
    bytes, values and metadata (:func:`gpulab.ch15_structured_sparsity.patterns.compressed_size`), and for 16-bit
    2:4 the best and worst speed-up that the GPU's recording ``sparsity_linear_speedup`` measured at the nearest
    recorded weight size. Pure arithmetic on recordings: it answers without a GPU."""

    runs = {run.device_name: run for run in recordings.newest_per_gpu("sparsity_linear_speedup")}
    gpus = [(run.short_label, name) for name, run in runs.items()] or [("no recording", "")]
    bits = w.Dropdown(options=[("8 (int8, float8)", 8), ("16 (float16, bfloat16)", 16), ("32 (float32, tf32)", 32)],
                      value=value_bits, description="bits per value", style=WIDE)
    pattern = w.Dropdown(options=["2:4", "1:2", "4:8", "2:8", "1:4"], description="N:M", style=WIDE)
    order = w.BoundedIntText(value=n, min=8, max=65536, step=64, description="matrix n x n, n =", style=WIDE)
    device = w.Dropdown(options=gpus, value=next((v for _, v in gpus if gpu and gpu.lower() in v.lower()), gpus[0][1]),
                        description="GPU")
    output = w.Output()

    def update(_change=None) -> None:
        kept, group = map(int, pattern.value.split(":"))
        if order.value % group:
            render(output, f"n = {order.value}: the columns (the reduction dimension) split into groups of {group}: "
                           f"pick a multiple of {group} for {pattern.value}.")
            return
        size = patterns.compressed_size(bits.value, kept, group)
        groups = order.value**2 // group
        dense, values, metadata = (math.ceil(groups * b / 8) for b in
                                   (size.dense_bits, size.value_bits_per_group, size.metadata_bits))
        text = [f"{order.value:,} x {order.value:,}, {bits.value}-bit values, {pattern.value}: compressed, "
                f"{size.fraction_of_dense:.2%} of dense, with {size.index_bits} bits of metadata per kept value: "
                f"{size.metadata_overhead:.1%} on top of the values.",
                f"The sparse tensor cores take {bits.value}-bit data as {HARDWARE[bits.value]}"
                + ("." if pattern.value == HARDWARE[bits.value] else f": {pattern.value} is storage arithmetic only.")]
        run = runs.get(device.value)
        speedups = [r for r in (run.rows if run else []) if r["status"] == "ok" and "speedup" in r]
        if bits.value == 16 and pattern.value == "2:4" and speedups:
            near = nearest(sorted({r["n"] for r in speedups}), order.value)
            at = [r for r in speedups if r["n"] == near]
            best, worst = max(at, key=lambda r: r["speedup"]), min(at, key=lambda r: r["speedup"])
            text.append(f"Recorded ({run.label}), F.linear with a {near:,} x {near:,} weight: best speed-up "
                        f"{best['speedup']:.2f}x ({best['dtype']}, {best['tokens']:,} tokens, {best['backend']}), "
                        f"worst {worst['speedup']:.2f}x ({worst['dtype']}, {worst['tokens']:,} tokens).")
        else:
            text.append("Recorded speed-ups: only 16-bit 2:4 products were recorded." if run
                        else "Recorded speed-ups: no recording of sparsity_linear_speedup here.")
        rows = [{"storage": "dense", "bytes": dense, "share": 1.0},
                {"storage": f"{pattern.value}: values kept", "bytes": values, "share": values / dense},
                {"storage": f"{pattern.value}: metadata", "bytes": metadata, "share": metadata / dense},
                {"storage": f"{pattern.value}: compressed", "bytes": values + metadata,
                 "share": (values + metadata) / dense}]
        shown = table(rows, [Column("storage"), Column("bytes", format=lambda b: format_bytes(int(b))),
                             Column("share", "of dense", format=".2%")])
        figure = go.Figure([go.Bar(x=["dense", pattern.value], y=[dense / 2**20, values / 2**20], name="values"),
                            go.Bar(x=["dense", pattern.value], y=[0, metadata / 2**20], name="metadata")])
        figure.update_layout(barmode="stack", title=f"Bytes of a {order.value:,} x {order.value:,} matrix, "
                             f"{bits.value}-bit values", xaxis_title="storage", yaxis_title="MiB")
        render(output, "\n".join(text), figure, shown)

    return assemble([[bits, pattern], [order, device]], output, update)
