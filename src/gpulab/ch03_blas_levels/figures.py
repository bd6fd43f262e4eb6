"""Chapter 03's figures and tables: the BLAS's costs, and the recorded runs of the roofline's ceilings, of the three
levels and of blocking (each recorded GPU behind a menu, or in the rows of a table)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import plotly.graph_objects as go

from gpulab.core import flops, plots, rates
from gpulab.core.plots import PALETTE, _add_roofs, add_sweep, hover_text, sweep_figure
from gpulab.core.recordings import Recording
from gpulab.core.roofline import Roofline
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, table


def _pair(runs: Sequence[Recording], ceilings: Sequence[Recording]) -> list[tuple[Recording, Roofline]]:
    """Each run with the roofline of its GPU's ceilings (runs whose GPU has none are left out)."""
    roofs = {c.device_name: Roofline.from_rows(c.rows, c.device_name) for c in ceilings}
    return [(run, roofs[run.device_name]) for run in runs if run.device_name in roofs]


def costs_table(n: int, dtype: str = "float32") -> Table:
    """The FLOP, the fewest bytes and the arithmetic intensity of each BLAS operation at size ``n``."""
    rows = [{"op": op, "level": rates.LEVEL[op], "gflop": flops.blas(op, n, dtype).flops / 1e9,
             "mb": flops.blas(op, n, dtype).bytes / 1e6, "intensity": flops.blas(op, n, dtype).intensity}
            for op in rates.OPS]
    return table(rows, [Column("op", "operation"), Column("level"), Column("gflop", "work", "GFLOP", ",.4g"),
                        Column("mb", "moved", "MB", ",.4g"), Column("intensity", "intensity", "FLOP/byte", ",.2f")],
                 caption=f"n = {n:,}, {dtype}")


# ---- the ceilings ------------------------------------------------------------------------------------------------

def ceilings_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and number format: the measured gemm rate, the copy bandwidth and the ridge point between them."""
    rows = []
    for run in runs:
        roof = Roofline.from_rows(run.rows, run.device_name)
        rows += [{"gpu": run.short_label, "dtype": dtype, "peak": peak / 1e12, "bandwidth": roof.bandwidth / 1e9,
                  "ridge": roof.ridge(dtype)} for dtype, peak in roof.peaks.items()]
    return table(rows, [Column("gpu", "GPU"), Column("dtype", "number format"),
                        Column("peak", "gemm", "TFLOP/s", ",.2f"), Column("bandwidth", "copy", "GB/s", ",.0f"),
                        Column("ridge", "ridge point", "FLOP/byte", ",.1f")])


def roofline_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: the roofline of its measured ceilings, one roof per number format."""
    return plots.by_gpu(runs, lambda run: plots.roofline_figure(Roofline.from_rows(run.rows, run.device_name),
                                                                  title=f"Roofline of {run.label}"))


# ---- the three levels ------------------------------------------------------------------------------------------

def _levels(roofline: Roofline, rows: Iterable[dict], *, title: str) -> go.Figure:
    """A menu picks the number format; each operation's recorded sizes sit on that format's roofline."""
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


def levels_figure(ceilings: Sequence[Recording], levels: Sequence[Recording]) -> go.Figure:
    """Per GPU and number format (one menu): every operation's sizes on that GPU's roofline. Every variant is in
    the figure, so the menu works on the static page."""
    roofs = {run.device_name: roof for run, roof in _pair(ceilings, ceilings)}
    runs = [run for run in levels if run.device_name in roofs]
    return plots.by_gpu(runs, lambda run: _levels(roofs[run.device_name], run.rows,
                                                       title=f"BLAS levels on {run.label}"))


def float32_figure(levels: Sequence[Recording]) -> go.Figure:
    """Per GPU: the float32 rate of each operation against its size."""
    def figure(run: Recording) -> go.Figure:
        rows = [r for r in run.rows if r.get("dtype") == "float32"]
        return sweep_figure(rows, "n", "gflops", color="op", log_x=True, log_y=True,
                            hover=("op", "n", "seconds", "gbytes_per_s"),
                            title=f"float32 rate against size: {run.label}",
                            x_title="n (elements or matrix order)", y_title="GFLOP/s")
    return plots.by_gpu(levels, figure)


def best_float32_table(levels: Sequence[Recording]) -> Table:
    """Per GPU and operation: the best float32 rate of the sweep, the size that reached it and its bandwidth."""
    rows = []
    for run in levels:
        for op in rates.OPS:
            good = [r for r in ok_rows(run.rows) if r["op"] == op and r["dtype"] == "float32"]
            if good:
                rows.append({"gpu": run.short_label, **max(good, key=lambda r: r["gflops"])})
    return table(rows, [Column("gpu", "GPU"), Column("op", "operation"),
                        Column("gflops", "best float32 rate", "GFLOP/s", ",.1f"), Column("n", "at n", format=",d"),
                        Column("gbytes_per_s", "bandwidth", "GB/s", ",.0f")])


# ---- blocking ----------------------------------------------------------------------------------------------------

def _blocking(rows: Iterable[dict], roofline: Roofline, *, title: str) -> go.Figure:
    """Measured rate of the blocked GEMM against block size, with the roofline's bound min(P, B q) drawn over it."""
    rows = list(rows)
    fig = sweep_figure(rows, "block", "gflops", name="measured", log_x=True, log_y=True,
                       hover=("block", "intensity", "gflops", "seconds"), title=title,
                       x_title="block size b", y_title="GFLOP/s")
    bound = [{"block": r["block"], "gflops": roofline.attainable(r["intensity"], r["dtype"]) / 1e9}
             for r in ok_rows(rows)]
    return add_sweep(fig, bound, "block", "gflops", name="roofline bound", dash="dash")


def blocking_figure(runs: Sequence[Recording], ceilings: Sequence[Recording]) -> go.Figure:
    """Per GPU: the blocked GEMM's rate against the block size, under the bound of that GPU's roofline."""
    pairs = _pair(runs, ceilings)
    roofs = {run.device_name: roof for run, roof in pairs}
    return plots.by_gpu([run for run, _ in pairs], lambda run: _blocking(
        run.rows, roofs[run.device_name],
        title=f"Blocked GEMM, n = {run.params['n']:,}, {run.params['dtype']}: {run.label}"))


def blocking_table(runs: Sequence[Recording], ceilings: Sequence[Recording]) -> Table:
    """Per GPU and block size: the intensity q, the measured rate, and its share of the roofline's bound."""
    rows = []
    for run, roof in _pair(runs, ceilings):
        for r in ok_rows(run.rows):
            bound = roof.attainable(r["intensity"], r["dtype"]) / 1e9
            rows.append({"gpu": run.short_label, **r, "share": r["gflops"] / bound, "bound": bound,
                         "limit": roof.bound(r["intensity"], r["dtype"])})
    return table(rows, [Column("gpu", "GPU"), Column("block", "block b"),
                        Column("intensity", "q", "FLOP/byte", ",.1f"), Column("gflops", "rate", "GFLOP/s", ",.0f"),
                        Column("bound", "roofline bound", "GFLOP/s", ",.0f"),
                        Column("share", "of the bound", format=".0%"), Column("limit", "the bound is")])
