"""Chapter 10's explorer: a matrix multiply in each format, its rate and its error, beside the recorded GPUs'."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w

from gpulab.ch10_tensor_cores import tensor_cores
from gpulab.core import recordings
from gpulab.core.tables import Column, table
from gpulab.core.widgets import assemble, render

COLUMNS = [Column("where"), Column("format"), Column("n", "n"), Column("tflops", "rate", "TFLOP/s", ",.3g"),
           Column("relative_error", "relative error", format=".2e")]


def matmul_format_explorer(sizes: Sequence[int], formats: Sequence[str]) -> w.Widget:
    """Pick a format: the recorded GPUs' rate and error in it (the experiment ``tensor_formats``). Pick a size and
    press Measure: the rate and the error against float64 of an n^3 matmul in that format on this device
    (:func:`gpulab.ch10_tensor_cores.tensor_cores.measure_format`), added below to compare side by side. The
    recordings answer without a GPU; a measurement runs on whatever device there is."""
    fmt = w.Dropdown(options=list(formats), description="format")
    size = w.SelectionSlider(options=list(sizes), value=sizes[0], description="n")
    button = w.Button(description="Measure", button_style="primary", icon="play")
    output = w.Output()
    recorded = recordings.newest_per_gpu("tensor_formats")
    measured: list[dict] = []
    note = {"text": ""}

    def update(change=None) -> None:
        if change is not None:  # a control moved: the last refusal no longer applies
            note["text"] = ""
        rows = [{"where": f"{run.short_label}, recorded", "n": run.params["n"], **r}
                for run in recorded for r in run.rows if r["format"] == fmt.value and r.get("status") == "ok"]
        lines = [f"{fmt.value}: the recorded GPUs' rate and error, then your measurements on this device "
                 "(press Measure)." if rows else
                 f"No GPU recording of {fmt.value} yet; press Measure to measure it on this device."]
        render(output, "\n".join([*lines, note["text"]]), table=table(rows + measured, COLUMNS))

    def measure(_button=None) -> None:
        try:
            row = tensor_cores.measure_format(size.value, fmt.value)
            measured.append({"where": "this device", "format": fmt.value, "n": size.value, **row})
            note["text"] = ""
        except (ValueError, AssertionError, RuntimeError) as error:  # a format this device lacks, too big, a check
            note["text"] = f"Not measured: {error}"
        update()

    button.on_click(measure)
    return assemble([[fmt, size, button]], output, update)
