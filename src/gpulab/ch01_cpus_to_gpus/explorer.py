"""Chapter 01's explorer: pick any two GPUs of :mod:`gpulab.core.specs` and compare them."""

from __future__ import annotations

import ipywidgets as w

from gpulab.core import specs
from gpulab.core.widgets import render, show


def gpu_comparison(a: str, b: str) -> w.Widget:
    """Pick any two GPUs of :mod:`gpulab.core.specs`: their figures side by side, and the ratio of B to A."""
    first = w.Dropdown(options=list(specs.GPUS), value=a, description="GPU A")
    second = w.Dropdown(options=list(specs.GPUS), value=b, description="GPU B")
    output = w.Output()

    def refresh(_change=None) -> None:
        lines = [f"{'':26} {first.value:>16} {second.value:>16} {'B / A':>8}"]
        for r in specs.comparison(specs.gpu(first.value), specs.gpu(second.value)):
            values = ["n/a" if v is None else f"{v:,.4g}" for v in (r["a"], r["b"])]
            ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
            lines.append(f"{r['metric']:26} {values[0]:>16} {values[1]:>16} {ratio:>8}")
        render(output, "\n".join(lines) + "\n")

    first.observe(refresh, names="value")
    second.observe(refresh, names="value")
    refresh()
    explorer = w.VBox([w.HBox([first, second]), output])
    show(explorer)
    return explorer
