"""Chapter 12's explorer: a convolution's multiplications by algorithm, for any layer."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch12_cudnn_convolution_algorithms import algorithms
from gpulab.core import plots
from gpulab.core.printing import format_bytes
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, render


def convolution_algorithms_explorer(batch: int = 1, channels: int = 128, size: int = 128,
                                    filter_size: int = 3) -> w.Widget:
    """Pick a filter size, a batch, C = K and an image size ("same" padding, stride 1): each algorithm family's
    multiplies per output element (:func:`gpulab.ch12_cudnn_convolution_algorithms.algorithms.multiplies`) as bars,
    the family with the fewest, and the float32 workspace each needs
    (:func:`gpulab.ch12_cudnn_convolution_algorithms.algorithms.workspace_bytes`). Pure arithmetic: it answers without
    a GPU.
    """

    # each counted family: its implementation's name (for cudnn.applies) and its workspace models
    families = {"direct or GEMM": ("im2col + GEMM", ("GEMM", "implicit GEMM")),
                "Winograd F(2x2)": ("Winograd F(2x2, 3x3)", ("Winograd nonfused", "Winograd fused")),
                "FFT": ("FFT", ("FFT",)), "FFT tiled": ("FFT tiled", ("FFT tiled",))}
    r = w.IntSlider(value=filter_size, min=1, max=15, step=2, description="filter R = S", style=WIDE)
    n = w.BoundedIntText(value=batch, min=1, max=4096, description="batch N", style=WIDE)
    c = w.BoundedIntText(value=channels, min=1, max=4096, description="channels C = K", style=WIDE)
    hw = w.BoundedIntText(value=size, min=1, max=2048, description="image H = W", style=WIDE)
    output = w.Output()

    def update(_change=None) -> None:
        layer = algorithms.same_padding_layer(n.value, c.value, hw.value, c.value, r.value)
        outputs = layer.n * layer.k * layer.p * layer.q
        rows = [{"family": family, "multiplies": (count := algorithms.multiplies(layer, family)),
                 "per_output": count / outputs,
                 "workspace": ", ".join(f"{m} {format_bytes(algorithms.workspace_bytes(layer, m))}" for m in models)}
                for family, (implementation, models) in families.items() if algorithms.applies(implementation, layer)]
        lines = [f"N = {n.value}, C = K = {c.value}, {hw.value} x {hw.value} images, {r.value} x {r.value} filters: "
                 f"{outputs:,} outputs."]
        best = min(rows, key=lambda row: row["multiplies"])  # rows[0] is the direct method, which always applies
        fewer = "" if best is rows[0] else f", {rows[0]['multiplies'] / best['multiplies']:.2f}x fewer than direct"
        lines.append(f"Fewest multiplies: {best['family']}{fewer}; its workspace: {best['workspace']}. "
                     "Multiplies are not time.")
        if r.value != 3:
            lines.append("Winograd F(2x2, 3x3) is drawn for 3 x 3 filters only, as cuDNN uses it.")
        figure = plots.bars_figure(rows, "family", {"multiplies per output": "per_output"}, log_y=True,
                                   title=f"Multiplies per output element, {r.value} x {r.value} filters",
                                   y_title="real multiplies per output element (log)", x_title="algorithm family",
                                   hover=("multiplies", "per_output"))
        render(output, "\n".join(lines), figure, table(rows, [
            Column("family"), Column("multiplies", format=".3g"), Column("per_output", "per output", format=",.0f"),
            Column("workspace", "workspace (float32)")]))

    return assemble([[r, n], [c, hw]], output, update)
