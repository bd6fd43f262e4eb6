"""Chapter 02's explorer: type a number, see how each format stores it."""

from __future__ import annotations

import math

import ipywidgets as w

from gpulab.ch02_number_formats import formats
from gpulab.core.tables import Column, table
from gpulab.core.widgets import assemble, render


def rounding_explorer(value: str = "0.1") -> w.Widget:
    """Type a number: how each format of :mod:`gpulab.core.precision` stores it, with its relative error and the
    spacing of the format around it. Pure arithmetic: it answers without a GPU."""
    number = w.Text(value=value, description="number", continuous_update=False)
    output = w.Output()

    def update(_change=None) -> None:
        try:
            rows = formats.rounding_table(number.value)
        except ValueError as error:
            render(output, f"Not a number: {error}")
            return
        said = f"{number.value} as each format stores it:"
        if math.isnan(float(number.value)):
            said += " NaN stays NaN in every format, with no error or spacing to give (the dashes)."
        render(output, said, table=table(rows, [
            Column("format"), Column("stored", "stored as", format=".17g"),
            Column("relative_error", "relative error", format=".3g"),
            Column("spacing", "spacing there", format=".3g"), Column("note", "")]))

    return assemble([[number]], output, update)
