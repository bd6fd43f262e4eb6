"""Chapter 01's explorer: pick any two GPUs of :mod:`gpulab.core.specs` and compare them."""

from __future__ import annotations

import ipywidgets as w

from gpulab.core import specs
from gpulab.core.tables import Column, table
from gpulab.core.widgets import assemble, render


def _ratio(value: float) -> str:
    return f"{value:.2f}x"


def gpu_comparison(a: str, b: str) -> w.Widget:
    """Pick any two GPUs of :mod:`gpulab.core.specs`: their figures side by side, and the ratio of B to A. Pure
    arithmetic on the hardware table: it answers without a GPU."""
    first = w.Dropdown(options=list(specs.GPUS), value=a, description="GPU A")
    second = w.Dropdown(options=list(specs.GPUS), value=b, description="GPU B")
    output = w.Output()

    def update(_change=None) -> None:
        rows = specs.comparison(specs.gpu(first.value), specs.gpu(second.value))
        render(output, f"GPU B, the {second.value}, against GPU A, the {first.value} (peaks are dense; TOPS for int8):",
               table=table(rows, [Column("metric", "figure"), Column("a", f"A: {first.value}", format=",.4g"),
                                  Column("b", f"B: {second.value}", format=",.4g"),
                                  Column("ratio", "B / A", format=_ratio)]))

    return assemble([[first, second]], output, update)
