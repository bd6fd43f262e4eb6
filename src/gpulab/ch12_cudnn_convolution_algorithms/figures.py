"""Chapter 12's figures: multiplications per method, benchmark mode, workspace, settings, channels, filter
sizes, determinism; each GPU's runs behind a menu (:mod:`.tables` and :mod:`.measured` have the tables)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.ch12_cudnn_convolution_algorithms.algorithms import COUNTED, talk_rates
from gpulab.ch12_cudnn_convolution_algorithms.backend import setting_label
from gpulab.core import plots
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows


def _bars_with_menu(rows: Sequence[dict], *, x: str, series: str, menu: str, value: str, scale: float = 1.0,
                    title: str, y_title: str, log_y: bool = False, hover: Sequence[str] = ()) -> go.Figure:
    """Grouped bars: x = ``row[x]``, one bar per ``row[series]``; a menu picks ``row[menu]`` (static in the book)."""
    rows = ok_rows(rows)
    options = list(dict.fromkeys(r[menu] for r in rows))
    names = list(dict.fromkeys(r[series] for r in rows))
    fig, owners = go.Figure(), []
    for option in options:
        for i, name in enumerate(names):
            chosen = [r for r in rows if r[menu] == option and r[series] == name]
            if not chosen:
                continue
            fig.add_trace(go.Bar(
                x=[r[x] for r in chosen], y=[r[value] * scale for r in chosen], name=str(name),
                visible=option == options[0], marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                marker_pattern_shape=plots.PATTERNS[i % len(plots.PATTERNS)],
                hovertext=[plots.hover_text(r, hover) for r in chosen], hoverinfo="text+name",
            ))
            owners.append(option)
    buttons = [dict(label=str(o), method="update", args=[{"visible": [w == o for w in owners]}]) for o in options]
    fig.update_layout(title=title, yaxis_title=y_title, barmode="group", legend=dict(orientation="h", y=-0.25),
                      updatemenus=[dict(buttons=buttons, x=0.0, y=1.14, xanchor="left", direction="down")]
                      if len(options) > 1 else [], margin=dict(t=100))
    fig.update_yaxes(type="log" if log_y else "linear")
    return fig


def multiplies_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Multiplies per output element against the filter size, a line per method (and batch where it matters)."""
    fig = go.Figure()
    batches = sorted({r["batch"] for r in rows})
    for i, method in enumerate(COUNTED):
        for j, n in enumerate(batches):
            chosen = sorted((r for r in rows if r["method"] == method and r["batch"] == n), key=lambda r: r["filter"])
            if not chosen or (j > 0 and method in ("direct or GEMM", "Winograd F(2x2)")):
                continue  # per output, direct and Winograd do not depend on the batch
            label = method if method in ("direct or GEMM", "Winograd F(2x2)") else f"{method}, N={n}"
            fig.add_trace(go.Scatter(
                x=[r["filter"] for r in chosen], y=[r["per_output"] for r in chosen], name=label,
                mode="lines+markers", line=dict(color=plots.PALETTE[i], dash="solid" if j == 0 else "dash"),
                marker=dict(symbol=plots.SYMBOLS[i]),
                hovertemplate=f"{label}<br>%{{x}} x %{{x}} filter: %{{y:,.0f}} multiplies per output<extra></extra>",
            ))
    fig.update_layout(title=title, xaxis_title="filter size R = S", yaxis_title="real multiplies per output element",
                      legend=dict(orientation="h", y=-0.25))
    fig.update_yaxes(type="log")
    fig.update_xaxes(dtick=2)
    return fig


def benchmark_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Per layer, with cudnn.benchmark off and on: the first call (left) and a steady-state call (right), ms."""
    rows = ok_rows(rows)
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("first call (wall time)", "steady state (median)"),
                        horizontal_spacing=0.1)
    for i, flag in enumerate((False, True)):
        chosen = {r["layer"]: r for r in rows if r["benchmark"] == flag}
        name = "benchmark on (autotuned)" if flag else "benchmark off (heuristics)"
        for col, key in ((1, "first_call_seconds"), (2, "seconds")):
            fig.add_trace(go.Bar(
                x=[layer for layer in layers if layer in chosen], y=[1e3 * chosen[layer][key] for layer in layers
                                                                     if layer in chosen],
                name=name, legendgroup=name, showlegend=col == 1, marker_color=plots.PALETTE[i],
                marker_pattern_shape=plots.PATTERNS[i],
                hovertext=[f"{layer}, {name}<br>{1e3 * chosen[layer][key]:.3g} ms<br>algorithm: "
                           f"{chosen[layer].get('algorithm')}" for layer in layers if layer in chosen],
                hoverinfo="text",
            ), row=1, col=col)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=1)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=2)
    fig.update_xaxes(title_text="layer")
    fig.update_layout(title=title, barmode="group", legend=dict(orientation="h", y=-0.3), margin=dict(t=100))
    return fig


def workspace_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Per layer (rows of :func:`.cudnn.benchmark_sweep` on a GPU): the im2col matrix, and the memory cuDNN used beyond
    the output, with benchmark off and on in steady state, and during the autotuner's first call (MiB)."""
    rows = ok_rows(rows)
    table: dict[str, dict] = {}
    for r in rows:
        entry = table.setdefault(r["layer"], {"layer": r["layer"], "im2col": r["im2col_bytes"] / 2**20})
        if r.get("peak_extra_bytes") is None:
            continue
        setting = "on" if r["benchmark"] else "off"
        entry[f"steady_{setting}"] = r["peak_extra_bytes"] / 2**20
        entry[f"first_{setting}"] = r["first_call_extra_bytes"] / 2**20
    series = {"im2col matrix (the GEMM algorithm's workspace)": "im2col", "steady state, benchmark off": "steady_off",
              "steady state, benchmark on": "steady_on", "first call, benchmark on (autotuner)": "first_on"}
    fig = plots.bars_figure(list(table.values()), "layer", series, title=title,
                            y_title="MiB beyond the output (log; 0 has no bar)", log_y=True)
    fig.update_traces(texttemplate="%{y:,.3g}")
    fig.update_layout(legend=dict(orientation="h", y=-0.25), xaxis_title="layer")
    return fig


def settings_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """TFLOP/s per layer, one bar per method and layout; a menu picks the precision."""
    shown = [{**r, "setting": r["method"] if r["method"] != "conv2d" else f"conv2d {r['layout']}"}
             for r in ok_rows(rows) if "method" in r]
    fig = _bars_with_menu(shown, x="layer", series="setting", menu="dtype", value="tflops", title=title,
                          y_title="TFLOP/s (2 N K P Q C R S / time)",
                          hover=("layer", "dtype", "layout", "seconds", "tflops", "algorithm"))
    fig.update_xaxes(title_text="layer")
    return fig


def settings_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    """:func:`settings_figure` of each run, one menu for the GPU and the precision."""
    return plots.by_gpu(runs, lambda run: settings_figure(
        run.rows, title=f"Convolution rate by format and layout: {run.label}"))


def channels_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """TFLOP/s against C = K, a line per layout, with the multiples of 8 marked."""
    fig = plots.sweep_figure(ok_rows(rows), "c", "tflops", color="layout", title=title,
                             x_title="channels C = K", y_title="TFLOP/s (2 N K P Q C R S / time)",
                             hover=("c", "layout", "seconds", "tflops", "algorithm"))
    for i, trace in enumerate(fig.data):
        trace.marker.symbol = plots.SYMBOLS[i % len(plots.SYMBOLS)]
    channels = sorted({r["c"] for r in ok_rows(rows)})
    for c in channels:
        if c % 8 == 0:
            fig.add_vline(x=c, line_dash="dot", line_color="#999999")
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return fig


def filter_sizes_figure(talk_rows: Sequence[dict], measured: Sequence[dict], *, title: str,
                        measured_label: str) -> go.Figure:
    """Side by side, milliseconds per filter size: the talk's GV100 table (left) and a measurement (right)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("Quadro GV100 (the talk), cuDNN algorithms", measured_label))
    talk = [r for r in talk_rows if r["milliseconds"] is not None]
    algorithms = list(dict.fromkeys(r["algorithm"] for r in talk))
    for i, algorithm in enumerate(algorithms):
        chosen = [r for r in talk if r["algorithm"] == algorithm]
        fig.add_trace(go.Bar(x=[f"{r['filter']}x{r['filter']}" for r in chosen], y=[r["milliseconds"] for r in chosen],
                             name=algorithm, legendgroup="talk", legendgrouptitle_text="the talk",
                             marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                             marker_pattern_shape=plots.PATTERNS[i % len(plots.PATTERNS)],
                             hovertemplate=f"{algorithm}<br>%{{x}}: %{{y}} ms<extra></extra>"), row=1, col=1)
    ran = ok_rows(measured)
    settings = list(dict.fromkeys(_filter_setting(r) for r in ran))
    for i, setting in enumerate(settings):
        chosen = [r for r in ran if _filter_setting(r) == setting]
        fig.add_trace(go.Bar(x=[f"{r['r']}x{r['s']}" for r in chosen], y=[1e3 * r["seconds"] for r in chosen],
                             name=setting, legendgroup="measured", legendgrouptitle_text="measured",
                             marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                             marker_pattern_shape=plots.PATTERNS[(i + 3) % len(plots.PATTERNS)],
                             hovertext=[f"{setting}, {r['r']}x{r['s']}<br>{1e3 * r['seconds']:.3g} ms<br>"
                                        f"algorithm: {r.get('algorithm') or r['method']}" for r in chosen],
                             hoverinfo="text"), row=1, col=2)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=1)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=2)
    fig.update_xaxes(title_text="filter")
    fig.update_layout(title=title, barmode="group", height=560, margin=dict(t=100))
    return fig


def _filter_setting(row: dict) -> str:
    if row["method"] != "conv2d":
        return setting_label(row)
    return "torch conv2d, benchmark " + ("on" if row["benchmark"] else "off")


def deterministic_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Milliseconds per layer with cudnn.deterministic off and on; a menu picks the pass."""
    shown = [{**r, "setting": "deterministic on" if r["deterministic"] else "deterministic off"}
             for r in ok_rows(rows) if "pass" in r]
    fig = _bars_with_menu(shown, x="layer", series="setting", menu="pass", value="seconds", scale=1e3, title=title,
                          y_title="milliseconds", hover=("layer", "pass", "seconds", "identical", "algorithm"))
    fig.update_xaxes(title_text="layer")
    return fig


def deterministic_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    """:func:`deterministic_figure` of each run, one menu for the GPU and the pass."""
    return plots.by_gpu(runs, lambda run: deterministic_figure(
        run.rows, title=f"cudnn.deterministic off and on: {run.label}"))


def benchmark_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    return plots.by_gpu(runs, lambda run: benchmark_figure(
        run.rows, title=f"cudnn.benchmark off and on, float32: {run.label}"))


def workspace_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    """:func:`workspace_figure` of each run that measured memory (a GPU's)."""
    measured = [run for run in runs if any(r.get("peak_extra_bytes") is not None for r in ok_rows(run.rows))]
    return plots.by_gpu(measured, lambda run: workspace_figure(
        run.rows, title=f"Memory beyond the output, float32: {run.label}"))


def channels_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    return plots.by_gpu(runs, lambda run: channels_figure(
        run.rows, title=f"Rate against the channel count (dotted: multiples of 8): {run.label}"))


def filter_sizes_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    talk = talk_rates([1])
    return plots.by_gpu(runs, lambda run: filter_sizes_figure(
        talk, run.rows, title="The talk's convolution: 3x3 and 11x11 filters, float32", measured_label=run.label))
