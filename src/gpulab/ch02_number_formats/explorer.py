"""Chapter 02's explorer: type a number, see how each format stores it."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch02_number_formats import formats
from gpulab.core.widgets import render, show


def rounding_explorer(value: str = "0.1") -> w.Widget:
    """Type a number: how each format of :mod:`gpulab.core.precision` stores it, with its relative error and spacing."""

    number = w.Text(value=value, description="number", continuous_update=False)
    output = w.Output()

    def refresh(_change=None) -> None:
        try:
            rows = formats.rounding_table(number.value)
        except ValueError as error:
            render(output, f"Not a number: {error}\n")
            return
        lines = [f"{'format':>14} {'stored as':>24} {'relative error':>15} {'spacing there':>14}"]
        for r in rows:
            lines.append(f"{r['format']:>14} {r['stored']:>24.17g} {r['relative_error']:>15.3g} "
                         f"{r['spacing']:>14.3g}  {r['note']}")
        render(output, "\n".join(lines) + "\n")

    number.observe(refresh, names="value")
    refresh()
    explorer = w.VBox([number, output])
    show(explorer)
    return explorer
