"""plotly figures in one style, and a renderer that draws them in JupyterLab, Colab and the static book.

In a plain Jupyter kernel plotly emits only ``application/vnd.plotly.v1+json``. JupyterLab draws
that, but MyST-NB (the book's notebook renderer) drops it, so the book would show nothing. Importing
this module registers a renderer, ``gpulab``, that emits that mime type *and* a ``text/html`` div
which calls the page's global ``Plotly``; the book loads plotly.js once per page from its own
``_static/`` (see ``book/_ext/page_scripts.py``). On Colab, VS Code and other hosts that plotly
recognises, plotly's own renderer is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import PlotlyRenderer
from plotly.subplots import make_subplots

from gpulab.roofline import Roofline
from gpulab.sweep import OUT_OF_MEMORY, ok_rows

PALETTE = ["#1f6fb4", "#e4572e", "#29a35a", "#8e44ad", "#f0a202", "#17becf", "#7f7f7f"]
# Marker symbols and bar fill patterns, in the palette's order: series stay apart in grayscale too.
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star", "cross"]
PATTERNS = ["", "/", ".", "x", "\\", "+", "-"]
TEMPLATE = "gpulab"


class BookRenderer(PlotlyRenderer):
    """plotly's JupyterLab mime bundle plus an HTML fallback that uses the page's global Plotly."""

    def to_mimebundle(self, fig_dict):
        bundle = super().to_mimebundle(fig_dict)
        bundle["text/html"] = pio.to_html(
            fig_dict, include_plotlyjs=False, full_html=False, config=self.config, validate=False,
        )
        return bundle


def _register() -> None:
    pio.templates[TEMPLATE] = go.layout.Template(
        layout=go.Layout(
            template=pio.templates["simple_white"],
            colorway=PALETTE,
            font=dict(family="Inter, Helvetica, Arial, sans-serif", size=13),
            margin=dict(l=70, r=30, t=60, b=60),
            height=440,
            hovermode="closest",
            xaxis=dict(showgrid=True, gridcolor="#eeeeee", automargin=True),  # room for long or slanted labels
            yaxis=dict(showgrid=True, gridcolor="#eeeeee"),
            legend=dict(bgcolor="rgba(255,255,255,0.7)"),
        )
    )
    pio.templates.default = TEMPLATE
    pio.renderers[TEMPLATE] = BookRenderer(config={"responsive": True, "displaylogo": False})
    if pio.renderers.default in ("", "plotly_mimetype", "plotly_mimetype+notebook", "notebook"):
        pio.renderers.default = TEMPLATE


_register()


def hover_text(row: dict, keys: Sequence[str]) -> str:
    return "<br>".join(f"{k} = {row[k]:.4g}" if isinstance(row[k], float) else f"{k} = {row[k]}"
                       for k in keys if k in row)


def sweep_figure(
    rows: Iterable[dict], x: str, y: str, *, color: str | None = None, title: str,
    x_title: str, y_title: str, log_x: bool = False, log_y: bool = False, name: str = "",
    hover: Sequence[str] = (), colors: Mapping[str, str] | None = None,
) -> go.Figure:
    """One line per value of ``color`` (or one line), y against x; out-of-memory rows are marked on the x axis.

    ``colors`` can fix a line's colour by its ``color`` value, e.g. to draw a prediction in its measurement's colour.
    """
    rows = list(rows)
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title)
    fig.update_xaxes(type="log" if log_x else "linear")  # before the lines: their out-of-memory marks need it
    fig.update_yaxes(type="log" if log_y else "linear")
    return add_sweep(fig, rows, x, y, color=color, name=name, hover=hover, colors=colors)


def add_sweep(fig: go.Figure, rows: list[dict], x: str, y: str, *, color: str | None = None,
              name: str = "", hover: Sequence[str] = (), dash: str | None = None,
              colors: Mapping[str, str] | None = None) -> go.Figure:
    """Add the lines of a sweep to ``fig`` (see :func:`sweep_figure`)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(str(row[color]) if color else name, []).append(row)
    for label, group in groups.items():
        good = ok_rows(group)
        trace_name = f"{name} {label}".strip() if color else name
        fig.add_trace(go.Scatter(
            x=[r[x] for r in good], y=[r[y] for r in good], mode="lines+markers", name=trace_name,
            line=dict(dash=dash, color=(colors or {}).get(label)), hovertext=[hover_text(r, hover) for r in good],
            hoverinfo="text+name",
        ))
        for r in group:
            if r.get("status") == OUT_OF_MEMORY:  # annotations take log10 of x on a log axis
                position = math.log10(r[x]) if fig.layout.xaxis.type == "log" else r[x]
                fig.add_annotation(x=position, y=0, yref="paper", text=f"out of memory at {r[x]:,}",
                                   showarrow=True, arrowhead=2, ay=-40)
    return fig


def roofline_figure(roofline: Roofline, points: Iterable[dict] = (), *, dtypes: Sequence[str] | None = None,
                    title: str | None = None) -> go.Figure:
    """The roofline of ``roofline`` for ``dtypes`` (default: all measured), with measured ``points`` on it.

    Each point row needs 'intensity' (FLOP/byte) and 'gflops'; 'op', 'n' and 'dtype' label it.
    """
    fig = go.Figure()
    for i, dtype in enumerate(dtypes or list(roofline.peaks)):
        _add_roofs(fig, roofline, dtype, PALETTE[i % len(PALETTE)])
    for row in points:
        _add_point(fig, row)
    fig.update_layout(
        title=title or f"Roofline of {roofline.device_name}",
        xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
        yaxis=dict(type="log", title="rate (GFLOP/s)"),
    )
    return fig


def _add_roofs(fig: go.Figure, roofline: Roofline, dtype: str, colour: str, visible: bool = True) -> None:
    ridge, peak = roofline.ridge(dtype), roofline.peak(dtype) / 1e9
    xs = [min(0.01, ridge / 100), ridge, max(1e4, ridge * 100)]
    fig.add_trace(go.Scatter(
        x=xs, y=[roofline.bandwidth * xs[0] / 1e9, peak, peak], mode="lines", name=f"roof {dtype}",
        line=dict(color=colour, width=2), visible=visible,
        hovertemplate=(f"{dtype}: peak {peak:,.0f} GFLOP/s, bandwidth {roofline.bandwidth / 1e9:,.0f} GB/s, "
                       f"ridge at {ridge:.1f} FLOP/byte<extra></extra>"),
    ))


def _add_point(fig: go.Figure, row: dict, visible: bool = True) -> None:
    fig.add_trace(go.Scatter(
        x=[row["intensity"]], y=[row["gflops"]], mode="markers+text", visible=visible,
        name=f"{row.get('op', '')} n={row.get('n', '')} {row.get('dtype', '')}".strip(),
        text=[row.get("op", "")], textposition="top center", marker=dict(size=11, line=dict(width=1)),
        hovertext=hover_text(row, ("op", "n", "dtype", "intensity", "gflops", "seconds")), hoverinfo="text",
    ))


def blocking_figure(rows: Iterable[dict], roofline: Roofline, *, title: str) -> go.Figure:
    """Measured rate of the blocked GEMM against block size, with the roofline's bound min(P, B q) drawn over it."""
    rows = list(rows)
    fig = sweep_figure(rows, "block", "gflops", name="measured", log_x=True, log_y=True,
                       hover=("block", "intensity", "gflops", "seconds"), title=title,
                       x_title="block size b", y_title="GFLOP/s")
    bound = [{"block": r["block"], "gflops": roofline.attainable(r["intensity"], r["dtype"]) / 1e9}
             for r in ok_rows(rows)]
    return add_sweep(fig, bound, "block", "gflops", name="roofline bound", dash="dash")


def roofline_explorer_figure(roofline: Roofline, rows: Iterable[dict], *, title: str) -> go.Figure:
    """A static explorer: a dropdown picks the dtype; each op's recorded sizes sit on that dtype's roofline.

    It works in the static book with no kernel, since every variant is in the figure already.
    """
    rows = ok_rows(rows)
    dtypes = [d for d in roofline.peaks if any(r["dtype"] == d for r in rows)]
    fig = go.Figure()
    owners: list[str] = []
    for dtype in dtypes:
        visible = dtype == dtypes[0]
        _add_roofs(fig, roofline, dtype, "#444444", visible)
        owners.append(dtype)
        for i, op in enumerate(dict.fromkeys(r["op"] for r in rows)):
            series = sorted((r for r in rows if r["dtype"] == dtype and r["op"] == op), key=lambda r: r["n"])
            fig.add_trace(go.Scatter(
                x=[r["intensity"] for r in series], y=[r["gflops"] for r in series], visible=visible,
                mode="lines+markers", name=op, marker=dict(size=9, color=PALETTE[i % len(PALETTE)]),
                hovertext=[hover_text(r, ("op", "n", "dtype", "intensity", "gflops", "gbytes_per_s")) for r in series],
                hoverinfo="text",
            ))
            owners.append(dtype)
    buttons = [dict(label=d, method="update", args=[{"visible": [o == d for o in owners]}]) for d in dtypes]
    fig.update_layout(
        title=title, updatemenus=[dict(buttons=buttons, x=0.0, y=1.13, xanchor="left", direction="down")],
        xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
        yaxis=dict(type="log", title="rate (GFLOP/s)"),
    )
    return fig


def short_number(value: float) -> str:
    """A bar's label: three significant digits, without an exponent up to the millions ('1,060', '3.14')."""
    return f"{value:,.0f}" if 1000 <= abs(value) < 1e7 else f"{value:,.3g}"


def bars_figure(rows: Sequence[dict], category: str, series: dict[str, str], *, title: str, y_title: str,
                x_title: str | None = None, log_y: bool = False, hover: Sequence[str] = ()) -> go.Figure:
    """Grouped bars: one group per row (labelled by ``row[category]``), one bar per ``series`` {legend: key}.

    The x axis is titled ``x_title``, by default ``category``: what the groups are. A row without a
    value for a key gets no bar in that series.
    """
    fig = go.Figure()
    for i, (label, key) in enumerate(series.items()):
        present = [r for r in rows if r.get(key) is not None]
        fig.add_trace(go.Bar(
            x=[r[category] for r in present], y=[r[key] for r in present], name=label,
            marker_color=PALETTE[i % len(PALETTE)], hovertext=[hover_text(r, hover) for r in present],
            text=[short_number(r[key]) for r in present], textposition="outside",
        ))
    fig.update_layout(title=title, xaxis_title=category if x_title is None else x_title, yaxis_title=y_title,
                      barmode="group")
    fig.update_yaxes(type="log" if log_y else "linear")
    return fig


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


FIELD_COLOURS = {"sign": "#e4572e", "exponent": "#1f6fb4", "fraction": "#29a35a", "unused by tf32": "#d9d9d9"}


def bit_layout_figure(formats: Iterable, *, title: str = "Bit layouts of the number formats") -> go.Figure:
    """One row of boxes per :class:`gpulab.precision.Format`: sign, exponent and fraction bits, drawn to scale.

    tf32 is drawn in the float32 word it lives in, its 13 lowest bits greyed: TF32 arithmetic drops them.
    """
    formats = list(formats)
    names = [f.name for f in formats]
    fields: dict[str, list[tuple[str, int, int]]] = {field: [] for field in FIELD_COLOURS}  # (format, start, bits)
    for f in formats:
        fraction_end = 1 + f.exponent_bits + f.mantissa_bits
        fields["sign"].append((f.name, 0, 1))
        fields["exponent"].append((f.name, 1, f.exponent_bits))
        fields["fraction"].append((f.name, 1 + f.exponent_bits, f.mantissa_bits))
        if f.storage_bits > fraction_end:
            fields["unused by tf32"].append((f.name, fraction_end, f.storage_bits - fraction_end))
    fig = go.Figure()
    for field, parts in fields.items():
        if parts:
            fig.add_trace(go.Bar(
                y=[p[0] for p in parts], x=[p[2] for p in parts], base=[p[1] for p in parts], orientation="h",
                name=field, marker=dict(color=FIELD_COLOURS[field], line=dict(color="white", width=1)),
                text=[str(p[2]) if p[2] > 1 else "" for p in parts], textposition="inside", insidetextanchor="middle",
                hovertemplate=f"%{{y}}: %{{x}} {field} bit(s)<extra></extra>",
            ))
    for row, f in enumerate(formats):  # a thin white line between neighbouring bits
        for bit in range(1, f.storage_bits):
            fig.add_shape(type="line", x0=bit, x1=bit, y0=row - 0.4, y1=row + 0.4,
                          line=dict(color="white", width=0.6), layer="above")
        fig.add_annotation(x=f.storage_bits, y=f.name, xanchor="left", showarrow=False, font=dict(size=11),
                           text=f"  eps {f.epsilon:.3g}, max {f.largest:.3g}")
    fig.update_layout(title=title, barmode="overlay", bargap=0.25, height=120 + 45 * len(formats),
                      xaxis=dict(title="bits, most significant first", range=[0, 84], dtick=8, showgrid=False),
                      yaxis=dict(title="format", automargin=True, categoryorder="array", categoryarray=names,
                                 autorange="reversed", showgrid=False),
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=110))
    return fig


def vertical_marker(fig: go.Figure, x: float, text: str) -> go.Figure:
    """A dotted vertical line at ``x`` with ``text`` beside its top.

    (plotly's own ``add_vline(annotation_text=...)`` misplaces the text on a logarithmic x axis,
    where annotations take log10 of the position.)
    """
    fig.add_vline(x=x, line_dash="dot", line_color="#444444")
    position = math.log10(x) if fig.layout.xaxis.type == "log" else x
    fig.add_annotation(x=position, y=1.0, yref="paper", text=text, showarrow=False, xanchor="left",
                       yanchor="top", xshift=4, bgcolor="rgba(255,255,255,0.8)")
    return fig


def heatmap_figure(rows: Sequence[dict], x: str, y: str, z: str, *, title: str, x_title: str, y_title: str,
                   z_title: str, hover: Sequence[str] = (), text_format: str = "{:,.0f}") -> go.Figure:
    """A heatmap of ``row[z]`` over the distinct ``row[x]`` (columns) and ``row[y]`` (rows), each cell labelled.

    x and y are treated as categories, in sorted order, so that sizes such as 32, 64, ... 1024 sit evenly.
    """
    rows = ok_rows(rows)
    xs, ys = sorted({r[x] for r in rows}), sorted({r[y] for r in rows})
    cell = {(r[x], r[y]): r for r in rows}
    values = [[cell[(a, b)][z] if (a, b) in cell else None for a in xs] for b in ys]
    fig = go.Figure(go.Heatmap(
        x=[str(a) for a in xs], y=[str(b) for b in ys], z=values, colorscale="Viridis",
        colorbar=dict(title=dict(text=z_title)),
        text=[[text_format.format(v) if v is not None else "" for v in line] for line in values],
        texttemplate="%{text}",
        hovertext=[[hover_text(cell[(a, b)], hover) if (a, b) in cell else "" for a in xs] for b in ys],
        hoverinfo="text",
    ))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def grid_owner_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """The matrix of :func:`gpulab.threads.grid_2d`: each element coloured by the block that wrote it and
    labelled with the writing thread's (threadIdx.x, threadIdx.y)."""
    rows = list(rows)
    n_rows, n_cols = max(r["row"] for r in rows) + 1, max(r["col"] for r in rows) + 1
    blocks_x = max(r["block_x"] for r in rows) + 1
    cell = {(r["row"], r["col"]): r for r in rows}
    block = [[cell[(i, j)]["block_y"] * blocks_x + cell[(i, j)]["block_x"] for j in range(n_cols)]
             for i in range(n_rows)]
    text = [[f"({cell[(i, j)]['thread_x']},{cell[(i, j)]['thread_y']})" for j in range(n_cols)] for i in range(n_rows)]
    hover = [[f"element [{i}][{j}]<br>blockIdx = ({cell[(i, j)]['block_x']}, {cell[(i, j)]['block_y']})<br>"
              f"threadIdx = ({cell[(i, j)]['thread_x']}, {cell[(i, j)]['thread_y']})" for j in range(n_cols)]
             for i in range(n_rows)]
    fig = go.Figure(go.Heatmap(
        z=block, text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text", colorscale="Cividis",
        colorbar=dict(title=dict(text="block<br>y * gridDim.x + x")), xgap=1, ygap=1,
    ))
    fig.update_layout(title=title, xaxis_title="column (x = blockIdx.x * blockDim.x + threadIdx.x)",
                      yaxis_title="row (y = blockIdx.y * blockDim.y + threadIdx.y)")
    fig.update_yaxes(autorange="reversed")
    return fig
