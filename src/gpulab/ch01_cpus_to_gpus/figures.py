"""Chapter 01's figures: two GPUs of :mod:`gpulab.core.specs` compared, figure by figure."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.core.plots import PALETTE


def gpu_comparison_figure(table: dict[str, list[dict]], a: str, b: str, *, title: str) -> go.Figure:
    """Two GPUs side by side, each picked from its own menu: peak rates as bars, and a table of their figures.

    ``table`` maps a GPU's name to its rows of {'metric', 'value', 'peak'}; rows with ``peak`` True
    are also drawn as bars (log scale). Every GPU's figures are in the figure already, so the menus
    work in the static book with no kernel. Each menu restyles two traces: its GPU's bars and its
    GPU's column of the table (a table trace of its own), and leaves the other GPU's alone.
    """
    metrics = [r["metric"] for r in next(iter(table.values()))]
    fig = make_subplots(rows=1, cols=3, column_widths=[0.52, 0.3, 0.18], horizontal_spacing=0.0,
                        specs=[[{"type": "bar"}, {"type": "table"}, {"type": "table"}]])

    def bars(name: str) -> tuple[list[str], list[float]]:
        shown = [r for r in table[name] if r["peak"] and r["value"] is not None]
        return [r["metric"].removeprefix("peak ") for r in shown], [r["value"] for r in shown]

    def column(name: str) -> list[str]:
        return ["n/a" if r["value"] is None else f"{r['value']:,.4g}" for r in table[name]]

    for i, name in enumerate((a, b)):
        x, y = bars(name)
        fig.add_trace(go.Bar(x=x, y=y, name=name, marker_color=PALETTE[i]), row=1, col=1)
    style = dict(align="left", height=24)
    # Fixed one-line headers: the two tables must keep their rows level whatever the menus pick.
    fig.add_trace(go.Table(header=dict(values=["", "GPU A"], fill_color="#eeeeee", **style),
                           cells=dict(values=[metrics, column(a)], **style), columnwidth=[1.7, 1]), row=1, col=2)
    fig.add_trace(go.Table(header=dict(values=["GPU B"], fill_color="#eeeeee", **style),
                           cells=dict(values=[column(b)], **style)), row=1, col=3)

    def menu(bar_trace: int, table_trace: int, chosen: str, x: float) -> dict:
        buttons = []
        for name in table:
            xs, ys = bars(name)
            values = [metrics, column(name)] if table_trace == 2 else [column(name)]
            # restyle applies each attribute to both traces; a bar ignores cells, a table ignores x and y
            buttons.append(dict(label=name, method="restyle", args=[
                {"x": [xs], "y": [ys], "name": [name], "cells.values": [values]},
                [bar_trace, table_trace],
            ]))
        return dict(buttons=buttons, active=list(table).index(chosen), x=x, y=1.16, xanchor="left", direction="down")

    fig.add_annotation(text="GPU A", x=0.0, y=1.23, xref="paper", yref="paper", showarrow=False, xanchor="left")
    fig.add_annotation(text="GPU B", x=0.22, y=1.23, xref="paper", yref="paper", showarrow=False, xanchor="left")
    fig.update_layout(title=title, updatemenus=[menu(0, 2, a, 0.0), menu(1, 3, b, 0.22)], height=640,
                      barmode="group", legend=dict(orientation="h", y=-0.3), margin=dict(t=110))
    fig.update_xaxes(title="number format", row=1, col=1)
    fig.update_yaxes(type="log", title="dense peak (TFLOP/s; TOPS for int8)", row=1, col=1)
    return fig
