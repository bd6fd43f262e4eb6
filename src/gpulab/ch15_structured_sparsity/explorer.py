"""Chapter 15's explorer: the storage of N:M compressed matrices per format."""

from __future__ import annotations

import math

import ipywidgets as w
import plotly.graph_objects as go

from gpulab.ch15_structured_sparsity import patterns
from gpulab.core import recordings
from gpulab.core.printing import format_bytes
from gpulab.core.widgets import WIDE, assemble, nearest, render


def sparsity_explorer(n: int = 4096, value_bits: int = 16) -> w.Widget:
    """Pick the bits per value, an N:M pattern and an n x n matrix: its dense and compressed bytes, values and
    metadata (:func:`gpulab.ch15_structured_sparsity.patterns.compressed_size`), and for 16-bit 2:4 the best and worst
    speed-up of the H200's recording ``sparsity_linear_speedup`` at the nearest recorded weight size. Pure arithmetic
    on a recording: it answers without a GPU."""

    hardware = {8: "2:4", 16: "2:4", 32: "1:2"}  # the pattern the sparse tensor cores take for each width
    recording = recordings.load("sparsity_linear_speedup")
    speedups = [r for r in (recording.rows if recording else []) if r["status"] == "ok" and "speedup" in r]
    bits = w.Dropdown(options=[("8 (int8, float8)", 8), ("16 (float16, bfloat16)", 16), ("32 (float32, tf32)", 32)],
                      value=value_bits, description="bits per value", style=WIDE)
    pattern = w.Dropdown(options=["2:4", "1:2", "4:8", "2:8", "1:4"], description="N:M", style=WIDE)
    order = w.BoundedIntText(value=n, min=8, max=65536, step=64, description="matrix n x n, n =", style=WIDE)
    output = w.Output()

    def update(_change=None) -> None:
        kept, group = map(int, pattern.value.split(":"))
        if order.value % group:
            render(output, f"n = {order.value}: the columns (the reduction dimension) split into groups of {group}: "
                   f"pick a multiple of {group}.\n")
            return
        size = patterns.compressed_size(bits.value, kept, group)
        groups = order.value**2 // group
        dense, values, metadata = (math.ceil(groups * b / 8) for b in
                                   (size.dense_bits, size.value_bits_per_group, size.metadata_bits))
        lines = [f"{order.value:,} x {order.value:,}, {bits.value}-bit values, {pattern.value}: dense "
                 f"{format_bytes(dense)}; compressed {format_bytes(values)} of values + {format_bytes(metadata)} of "
                 f"metadata ({size.index_bits} bits per kept value) = {size.fraction_of_dense:.2%} of dense",
                 f"the metadata: {size.metadata_overhead:.1%} on top of the values, "
                 f"{metadata / (values + metadata):.1%} of the compressed bytes",
                 f"the sparse tensor cores take {bits.value}-bit data as {hardware[bits.value]}"
                 + ("" if pattern.value == hardware[bits.value] else f": {pattern.value} is storage arithmetic only")]
        if bits.value == 16 and pattern.value == "2:4" and speedups:
            near = nearest(sorted({r["n"] for r in speedups}), order.value)
            at = [r for r in speedups if r["n"] == near]
            best, worst = max(at, key=lambda r: r["speedup"]), min(at, key=lambda r: r["speedup"])
            lines.append(f"recorded ({recording.label}), F.linear with a {near:,} x {near:,} weight: best speed-up "
                         f"{best['speedup']:.2f}x ({best['dtype']}, {best['tokens']:,} tokens, {best['backend']}), "
                         f"worst {worst['speedup']:.2f}x ({worst['dtype']}, {worst['tokens']:,} tokens)")
        else:
            lines.append("recorded speed-ups: only 16-bit 2:4 products were recorded" if recording
                         else "recorded speed-ups: no recording of sparsity_linear_speedup here")
        figure = go.Figure([go.Bar(x=["dense", pattern.value], y=[dense / 2**20, values / 2**20], name="values"),
                            go.Bar(x=["dense", pattern.value], y=[0, metadata / 2**20], name="metadata")])
        figure.update_layout(barmode="stack", title=f"Bytes of a {order.value:,} x {order.value:,} matrix, "
                             f"{bits.value}-bit values", xaxis_title="storage", yaxis_title="MiB")
        render(output, "\n".join(lines) + "\n", figure)

    return assemble([[bits, pattern, order]], output, update)
