"""Measurement rows as tables: HTML on the page, aligned text in a terminal, numbers formatted once.

A chapter describes its columns once (:class:`Column`: the row's key, a header, the unit, a format) and hands
rows to :func:`table`; the result displays as an HTML table that fits the text column or scrolls inside it, with
the units in the headers. For recordings of several GPUs, :func:`by_gpu` sets them side by side, a column per GPU,
and :func:`stacked` puts their rows one under another with the GPU first.

The same object has a text form, so a script or a log still reads it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from IPython.display import display

Format = str | Callable[[object], str]
MISSING = "–"  # an en dash: a value that does not exist (not measured, not applicable)
CELL = "padding:0.25em 0.7em;vertical-align:top"  # inline, so that the table reads the same in Jupyter and Colab


@dataclass(frozen=True)
class Column:
    """One column: ``key`` of the rows, its ``header`` (with ``unit`` appended in parentheses), and how to format
    a value: a format spec for numbers (``",.0f"``, ``".1%"``, ``".3g"``) or a function. A missing value (None) is a
    dash; a NaN is 'NaN'."""

    key: str
    header: str = ""
    unit: str = ""
    format: Format = ""
    align: str = ""  # "right" or "left"; by default numbers go right, anything else left

    @property
    def title(self) -> str:
        header = self.header or self.key.replace("_", " ")
        return f"{header} ({self.unit})" if self.unit else header

    def text(self, value: object) -> str:
        if value is None:
            return MISSING
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        if callable(self.format):
            return self.format(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return str(value)
        if self.format:
            return format(value, self.format)
        return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


def _columns(columns: Sequence[Column | str]) -> list[Column]:
    return [c if isinstance(c, Column) else Column(c) for c in columns]


class Table:
    """A table of formatted cells; displays as HTML (``_repr_html_``) or as text (``str``)."""

    def __init__(self, headers: Sequence[str], cells: Sequence[Sequence[str]], *, numeric: Sequence[bool],
                 caption: str = ""):
        self.headers, self.cells, self.numeric, self.caption = list(headers), [list(c) for c in cells], list(
            numeric), caption

    def _repr_html_(self) -> str:
        align = [f'style="text-align:{"right" if n else "left"};{CELL}"' for n in self.numeric]
        head = "".join(f"<th {a}>{html.escape(h)}</th>" for h, a in zip(self.headers, align, strict=True))
        body = "".join("<tr>" + "".join(f"<td {a}>{html.escape(c)}</td>" for c, a in zip(row, align, strict=True))
                       + "</tr>" for row in self.cells)
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return ('<div class="gpulab-table" style="overflow-x:auto;max-width:100%">'
                f'<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')

    def __str__(self) -> str:
        widths = [max([len(h), *(len(row[i]) for row in self.cells)]) for i, h in enumerate(self.headers)]

        def line(values: Sequence[str]) -> str:
            return "  ".join(v.rjust(w) if n else v.ljust(w)
                             for v, w, n in zip(values, widths, self.numeric, strict=True)).rstrip()

        lines = [self.caption] if self.caption else []
        lines += [line(self.headers), line(["-" * w for w in widths]), *(line(row) for row in self.cells)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def show(self) -> None:
        display(self)


def table(rows: Iterable[dict], columns: Sequence[Column | str], *, caption: str = "") -> Table:
    """``rows`` as a table of ``columns``; a column is numeric (right-aligned) when its values are numbers."""
    rows, columns = list(rows), _columns(columns)
    numeric = [c.align == "right" or (c.align != "left" and all(
        isinstance(r.get(c.key), int | float) and not isinstance(r.get(c.key), bool)
        for r in rows if r.get(c.key) is not None)) for c in columns]
    return Table([c.title for c in columns], [[c.text(r.get(c.key)) for c in columns] for r in rows],
                 numeric=numeric, caption=caption)


def stacked(runs: Sequence, columns: Sequence[Column | str], *, where: Callable[[dict], bool] | None = None,
            caption: str = "") -> Table:
    """The rows of every run (a :class:`gpulab.core.recordings.Recording`) one under another, each led by its GPU."""
    rows = [{"gpu": run.short_label, **row} for run in runs for row in run.rows if where is None or where(row)]
    return table(rows, [Column("gpu", "GPU"), *_columns(columns)], caption=caption)


def by_gpu(runs: Sequence, index: Column | str, value: Column, *, where: Callable[[dict], bool] | None = None,
           caption: str = "") -> Table:
    """One row per value of ``index`` and one column per run (GPU) holding ``value``: the GPUs side by side. The
    index values keep the order in which the runs list them."""
    index = _columns([index])[0]
    keys: list[object] = []
    cells: dict[tuple[object, int], object] = {}
    for i, run in enumerate(runs):
        for row in run.rows:
            if where is not None and not where(row):
                continue
            key = row.get(index.key)
            if key not in keys:
                keys.append(key)
            cells[key, i] = row.get(value.key)
    rows = [{"index": key, **{f"run{i}": cells.get((key, i)) for i in range(len(runs))}} for key in keys]
    columns = [Column("index", index.title), *(Column(f"run{i}", f"{run.short_label}: {value.title}",
                                                      format=value.format) for i, run in enumerate(runs))]
    return table(rows, columns, caption=caption)
