"""Chapter 10's explorer: a matrix multiply in each format, its rate and its error."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w

from gpulab.ch10_tensor_cores import tensor_cores
from gpulab.core.widgets import render, show


def matmul_format_explorer(sizes: Sequence[int], formats: Sequence[str]) -> w.Widget:
    """Pick a format and a size, press Measure: the rate and the error against float64 of an n^3 matmul in that format
    on this device (:func:`gpulab.ch10_tensor_cores.tensor_cores.measure_format`), added to a table to compare side by
    side."""

    fmt = w.Dropdown(options=list(formats), description="format")
    size = w.SelectionSlider(options=list(sizes), value=sizes[0], description="n")
    button = w.Button(description="Measure", button_style="primary", icon="play")
    output = w.Output()
    lines = [f"{'format':>14} {'n':>6} {'TFLOP/s':>9} {'relative error':>15}"]

    def measure(_button=None) -> None:
        try:
            row = tensor_cores.measure_format(size.value, fmt.value)
            lines.append(f"{fmt.value:>14} {size.value:>6} {row['tflops']:>9.3g} {row['relative_error']:>15.2e}")
            render(output, "\n".join(lines) + "\n")
        except (ValueError, AssertionError, RuntimeError) as error:  # a format this device lacks, too big, a check
            render(output, "\n".join(lines) + f"\nNot measured: {error}\n")

    button.on_click(measure)
    explorer = w.VBox([w.HBox([fmt, size, button]), output])
    show(explorer)
    return explorer
