"""Chapter 07's explorer: a launch configuration's blocks, warps and occupancy."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w

from gpulab.ch07_cuda_threads_blocks import threads
from gpulab.core.widgets import render, show


def launch_configuration_explorer(n: int, threads_per_block: Sequence[int],
                                  elements_per_thread: Sequence[int]) -> w.Widget:
    """Pick threads per block and elements per thread, press Measure: SAXPY's bandwidth and occupancy on this GPU.

    Each measurement is added to a table, so a reader can compare configurations side by side.
    """

    size = w.SelectionSlider(options=list(threads_per_block), value=256, description="threads/block")
    per = w.SelectionSlider(options=list(elements_per_thread), value=1, description="elements/thread")
    button = w.Button(description="Measure", button_style="primary", icon="play")
    output = w.Output()
    lines = [f"{'threads/block':>13} {'elements/thread':>15} {'blocks':>10} {'GB/s':>8} {'occupancy':>9} limited by"]

    def measure(_button=None) -> None:
        try:
            (row,) = threads.launch_configuration(n, [size.value], [per.value])
            lines.append(f"{row['threads_per_block']:>13} {row['elements_per_thread']:>15} {row['blocks']:>10,} "
                         f"{row['gbytes_per_s']:>8,.0f} {row['occupancy']:>9.0%} {row['limited_by']}")
            render(output, "\n".join(lines) + "\n")
        except (ValueError, AssertionError) as error:  # no GPU, too big, a failed check
            render(output, "\n".join(lines) + f"\nNot measured: {error}\n")

    button.on_click(measure)
    explorer = w.VBox([w.HBox([size, per, button]), output])
    show(explorer)
    return explorer
