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
from collections.abc import Callable, Iterable, Mapping, Sequence

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import PlotlyRenderer

from gpulab.core.printing import format_bytes
from gpulab.core.roofline import Roofline
from gpulab.core.sweep import OUT_OF_MEMORY, ok_rows

PALETTE = ["#1f6fb4", "#e4572e", "#29a35a", "#8e44ad", "#f0a202", "#17becf", "#7f7f7f"]
# Marker symbols and bar fill patterns, in the palette's order: series stay apart in grayscale too.
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star", "cross"]
PATTERNS = ["", "/", ".", "x", "\\", "+", "-"]
TEMPLATE = "gpulab"


TITLE_WIDTH = 60  # characters of a title's line: longer titles break after their last colon (a phone is narrow)
TITLE_TOP, TITLE_LINE, MENU_ROW = 16, 23, 36  # px: above a title, per line of a title (17 px font), a menu's row
TEMPLATE_TITLE_LINES = 2  # the lines of title the template's top margin holds


def wrapped_title(text: str | None) -> str | None:
    """'Transposes and copies: NVIDIA H200, recorded 2026-11-24' on two lines when it is long: the figure's subject,
    then the run it draws."""
    if not text or len(text) <= TITLE_WIDTH or "<br>" in text or ": " not in text:
        return text
    head, _, tail = text.rpartition(": ")
    return f"{head}:<br>{tail}"


def make_room_for_title(layout: dict) -> None:
    """Lay out (in place) a figure whose title does not fit the template's top margin (two lines), or whose menus
    sit over the plot, so that nothing covers the title: the title hangs from the figure's top (plotly draws a
    title's further lines below its first), any menus stand in a row on the plot's top edge under it, and the top
    margin holds both, for the longest title a menu entry sets."""
    menus = [m for m in layout.get("updatemenus") or [] if m.get("y", 1.0) >= 1]  # plotly's default y is 1
    titles = [layout.get("title", {}).get("text") or ""] + [
        str(arg.get("title.text") or "") for menu in menus for button in menu.get("buttons") or []
        for arg in (button.get("args") or [])[1:2] if isinstance(arg, dict)]
    lines = max(title.count("<br>") + 1 for title in titles)
    if not menus and lines <= TEMPLATE_TITLE_LINES:
        return
    for menu in menus:
        menu.update(y=1, yanchor="bottom", yref="paper", pad={**menu.get("pad", {}), "b": 6})
    layout["title"] = {**layout.get("title", {}), "yref": "container", "y": 1, "yanchor": "top",
                       "pad": {"t": TITLE_TOP}}
    layout["margin"] = {**layout.get("margin", {}),
                        "t": TITLE_TOP + round(lines * TITLE_LINE) + 8 + (MENU_ROW if menus else 0)}


class BookRenderer(PlotlyRenderer):
    """plotly's JupyterLab mime bundle plus an HTML fallback that uses the page's global Plotly; long titles broken
    after their last colon, and menus kept clear of the title."""

    def to_mimebundle(self, fig_dict):
        layout = fig_dict.setdefault("layout", {})
        title = layout.get("title")
        if isinstance(title, str):
            title = layout["title"] = {"text": title}
        if isinstance(title, dict) and title.get("text"):
            title["text"] = wrapped_title(title["text"])
        make_room_for_title(layout)
        bundle = super().to_mimebundle(fig_dict)
        bundle["text/html"] = pio.to_html(
            fig_dict, include_plotlyjs=False, full_html=False, config=self.config, validate=False,
            auto_play=False,  # a figure with frames (a slider over steps) opens at its first step, as drawn
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
            modebar=dict(orientation="v"),  # down the right edge, clear of the title
        )
    )
    pio.templates.default = TEMPLATE
    # No buttons a reader of a static page cannot use: sending the chart to a plotly server, selecting points.
    pio.renderers[TEMPLATE] = BookRenderer(config={
        "responsive": True, "displaylogo": False,
        "modeBarButtonsToRemove": ["sendChartToCloud", "sendDataToCloud", "select2d", "lasso2d"]})
    if pio.renderers.default in ("", "plotly_mimetype", "plotly_mimetype+notebook", "notebook"):
        pio.renderers.default = TEMPLATE


_register()


# What a row's common fields mean, for hover text: (label, unit). Times, byte counts and shares are formatted by
# their kind (see :func:`field_text`); a field not listed here is shown by its name, underscores as spaces.
FIELDS = {
    "gflops": ("rate", "GFLOP/s"), "tflops": ("rate", "TFLOP/s"), "gbytes_per_s": ("bandwidth", "GB/s"),
    "useful_gbytes_per_s": ("useful bandwidth", "GB/s"), "busbw_gbs": ("bus bandwidth", "GB/s"),
    "algbw_gbs": ("algorithm bandwidth", "GB/s"), "intensity": ("arithmetic intensity", "FLOP/byte"),
    "flops": ("work", "FLOP"), "n": ("n", ""), "dtype": ("dtype", ""), "op": ("operation", ""),
}


def _number(value: float) -> str:
    """A number for a reader: thousands separated, no exponent between 0.001 and ten million."""
    magnitude = abs(value)
    if magnitude == 0 or math.isnan(value) or math.isinf(value):
        return str(value)
    if 1 <= magnitude < 1e7:
        return f"{value:,.{max(0, 3 - int(math.log10(magnitude)))}f}"
    return f"{value:.3g}"  # below 1 (0.00123), or an exponent for the very small and very large


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale or unit == "ns":
            return f"{_number(seconds / scale)} {unit}"
    return str(seconds)


def field_text(key: str, value: object) -> str:
    """'time = 1.23 ms', 'bandwidth = 3,012 GB/s', 'fraction of copy = 93.4%': one field of a row, for a reader."""
    label, unit = FIELDS.get(key, (key.replace("_", " "), ""))
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{label} = {value}"
    if key == "seconds" or key.endswith(("_seconds", "_s")):
        what = label.removesuffix("seconds").removesuffix(" s").strip()
        return f"{' '.join([what, 'time']).strip()} = {_time(value)}"
    if key in ("bytes", "nbytes") or key.endswith("_bytes"):
        what = "" if key in ("bytes", "nbytes") else label.removesuffix("bytes").strip()
        return f"{' '.join([what, 'size']).strip()} = {format_bytes(int(value))}"
    if key == "spread" or key.startswith(("fraction", "share")) or key.endswith(("_fraction", "_share", "efficiency")):
        return f"{label} = {value:.1%}"
    number = f"{value:,}" if isinstance(value, int) else _number(value)
    return f"{label} = {number}" + (f" {unit}" if unit else "")


def hover_text(row: dict, keys: Sequence[str]) -> str:
    return "<br>".join(field_text(k, row[k]) for k in keys if k in row and row[k] is not None)


def by_gpu(runs: Sequence, figure: Callable[[object], go.Figure]) -> go.Figure:
    """One figure for several GPUs' runs of an experiment: ``figure(run)`` for each, and one menu that picks the GPU
    (the first one shown). A figure with a menu of its own (a format, a tile) keeps its choices: the menu then lists
    each GPU's ('H200: float16'). With one run it is that run's figure, its own menu as it was. Each entry brings
    its run's title, annotations and shapes with its traces."""
    figures = [figure(run) for run in runs]
    if len(figures) <= 1:
        return figures[0] if figures else go.Figure(layout=dict(title="No recording yet"))
    combined = go.Figure(layout=figures[0].layout)
    owner = []
    for i, part in enumerate(figures):
        for trace in part.data:
            combined.add_trace(trace)
            owner.append(i)
    buttons = []
    for i, (run, part) in enumerate(zip(runs, figures, strict=True)):
        choices = part.layout.updatemenus[0].buttons if part.layout.updatemenus else [None]
        for choice in choices:
            # an "update" entry sets (traces, layout); a "relayout" entry only the layout, its traces all shown
            traces, changes = ((choice.args[0], choice.args[1] if len(choice.args) > 1 else {})
                               if choice is not None and choice.method == "update"
                               else ({}, choice.args[0] if choice is not None else {}))
            own = iter(traces.get("visible") or [t.visible is not False for t in part.data])
            layout = {"title.text": wrapped_title(part.layout.title.text), "annotations": part.layout.annotations or [],
                      "shapes": part.layout.shapes or [], **changes}
            buttons.append(dict(label=run.short_label + (f": {choice.label}" if choice else ""), method="update",
                                args=[{"visible": [next(own) if o == i else False for o in owner]}, layout]))
    for trace, visible in zip(combined.data, buttons[0]["args"][0]["visible"], strict=True):
        trace.visible = visible
    combined.update_layout(**{k: v for k, v in buttons[0]["args"][1].items() if k != "title.text"})
    combined.layout.updatemenus = [dict(type="dropdown", buttons=buttons, direction="down", showactive=True, active=0,
                                        x=0, xanchor="left", y=1.0, yanchor="bottom", pad=dict(b=6))]
    return combined  # the renderer puts the menu under the title (see make_room_for_title)


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
