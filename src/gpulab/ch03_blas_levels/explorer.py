"""Chapter 03's explorer: measure a BLAS call and place it on this device's roofline."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w
import torch

from gpulab.core import plots, rates
from gpulab.core.roofline import Roofline
from gpulab.core.widgets import render, show


def roofline_explorer(roofline: Roofline, *, sizes: Sequence[int], dtypes: Sequence[str],
                      ops: Sequence[str] = rates.OPS) -> w.Widget:
    """Pick an operation, a size and a dtype, press Measure: the measurement lands on this device's roofline.

    Each measurement stays on the plot, so a reader can build up the picture point by point.
    """
    op = w.Dropdown(options=list(ops), value="gemm" if "gemm" in ops else ops[0], description="operation")
    size = w.SelectionSlider(options=list(sizes), value=sizes[len(sizes) // 2], description="n")
    dtype = w.Dropdown(options=[d for d in dtypes if d in roofline.peaks], description="dtype")
    button = w.Button(description="Measure", button_style="primary", icon="play")
    output = w.Output()
    points: list[dict] = []

    def measure(_button=None) -> None:
        problem = ""
        try:
            points.append(rates.measure_blas(op.value, size.value, dtype.value))
        except (ValueError, AssertionError) as error:  # too big, a dtype the device lacks, a failed check
            problem = f"Not measured: {error}\n"
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            problem = f"Not measured: {op.value} at n = {size.value} in {dtype.value} ran out of GPU memory\n"
        render(output, problem,
               plots.roofline_figure(roofline, points, dtypes=sorted({p["dtype"] for p in points}) or None))

    button.on_click(measure)
    explorer = w.VBox([w.HBox([op, size, dtype, button]), output])
    show(explorer)
    return explorer
