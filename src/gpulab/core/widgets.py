"""ipywidgets explorers that measure live or explore a model, built on the same functions the chapters call.

A live control needs a running kernel. JupyterLab and Colab show the widget itself. The static book
has no kernel: it draws each explorer's saved view (the state the build left, with the book's own copy
of the Jupyter widgets HTML manager) with its controls switched off and a note beside them that they need
a running kernel (book/_ext/widget_views.py); a viewer that draws no widgets shows :func:`show`'s ``text/html``
line instead. The static page explores the recordings with plotly's own menus (see
:func:`gpulab.core.plots.by_gpu`).

Explorers write their results into an ``Output`` widget by setting its state (:func:`render`), never
with ``with output:``. The notebook executor behind papermill and the book build (nbclient) imitates a
capturing ``Output`` by writing to the kernel's shell socket while it waits on that socket for the
cell's reply; now and then it misses the reply and waits forever (jupyter/nbclient#312).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import display

from gpulab.core.tables import Table

NEEDS_KERNEL = (
    "This explorer needs a running kernel to answer its controls: launch this notebook (the Colab button at "
    "the top of the page, or Jupyter on your own machine) to use it."
)


def show(widget: w.Widget) -> None:
    """Display ``widget``; where no kernel can answer it (the static book) show how to launch it instead."""
    display({
        "application/vnd.jupyter.widget-view+json": {
            "version_major": 2, "version_minor": 0, "model_id": widget.model_id,
        },
        "text/plain": NEEDS_KERNEL,
        "text/html": f'<p class="gpulab-needs-kernel"><em>{NEEDS_KERNEL}</em></p>',
    }, raw=True)


def assemble(rows: Sequence[Sequence[w.Widget]], output: w.Output, update: Callable[..., None]) -> w.Widget:
    """An explorer: ``rows`` of controls above ``output``; any control's change calls ``update``, which runs once
    now to fill ``output``. The explorer is displayed (:func:`show`) and returned."""
    for row in rows:
        for control in row:
            control.observe(update, names="value")
    update()
    explorer = w.VBox([w.HBox(list(row)) for row in rows] + [output])
    show(explorer)
    return explorer


def render(output: w.Output, text: str = "", figure: go.Figure | None = None, table: Table | None = None) -> None:
    """Make ``output`` show ``text`` (as paragraphs, one per line, which wrap to the page), then ``table``, then
    ``figure``, replacing what it showed.

    The figure goes in as the mime bundle of plotly's current renderer (``display(figure)`` would
    not do: a plotly figure displays itself, into whichever cell is running, not into ``output``).
    """
    paragraphs = "".join(f"<p>{html.escape(line)}</p>" for line in text.splitlines() if line.strip())
    outputs = [{"output_type": "display_data", "metadata": {},
                "data": {"text/html": paragraphs, "text/plain": text}}] if text.strip() else []
    if table is not None:
        outputs.append({"output_type": "display_data", "metadata": {},
                        "data": {"text/html": table._repr_html_(), "text/plain": str(table)}})
    if figure is not None:
        outputs.append({"output_type": "display_data", "data": figure._repr_mimebundle_(), "metadata": {}})
    output.outputs = tuple(outputs)


WIDE = {"description_width": "initial"}  # a control's whole description, not the first dozen letters


def nearest(values: Sequence[float], target: float) -> float:
    """The one of ``values`` (all > 0) nearest to ``target`` on a logarithmic scale."""
    return min(values, key=lambda v: abs(math.log(v / target)))
