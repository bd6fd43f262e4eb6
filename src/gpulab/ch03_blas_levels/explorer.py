"""Chapter 03's explorer: a BLAS call's work and bytes, placed on the roofline of each recorded GPU, with the rate
the recording measured; and, on request, measured on the machine that runs the notebook."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w
import plotly.graph_objects as go
import torch

from gpulab.core import flops, plots, rates
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.roofline import Roofline
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, render


def roofline_explorer(ceilings: Sequence[Recording], levels: Sequence[Recording], *, here: Recording | None = None,
                      sizes: Sequence[int] = (64, 256, 1024)) -> w.Widget:
    """Pick an operation, a size and a number format: its FLOP, bytes and intensity, and, on each GPU of
    ``ceilings`` (the runs of ``blas_ceilings``), the roofline's bound and the rate ``levels`` (the runs of
    ``blas_levels``) measured at that size. Arithmetic and recordings: it answers without a GPU.

    *Measure here* checks and times the call on this machine and adds it to the table, held against ``here``'s
    ceilings (this machine's run of ``blas_ceilings``; by default the live run of ``ceilings``); on a GPU whose
    ceilings are drawn, it also lands on that GPU's roofline. ``sizes`` are offered when no run has any.
    """
    here = here if here is not None else getattr(ceilings, "live", None)
    with_here = [*ceilings, *([here] if here is not None else [])]
    roofs = {run.device_name: Roofline.from_rows(run.rows, run.device_name) for run in with_here}
    measured = {run.device_name: run for run in levels}
    every_size: dict[str, set[int]] = {}
    for run in [*levels, *([levels.live] if getattr(levels, "live", None) else [])]:
        for r in ok_rows(run.rows):
            every_size.setdefault(r["op"], set()).add(r["n"])
    dtypes = list(dict.fromkeys(d for roof in roofs.values() for d in roof.peaks)) or ["float32"]

    def options(op: str) -> list[int]:
        return sorted(every_size.get(op) or sizes)

    op = w.Dropdown(options=list(rates.OPS), value="gemm", description="operation")
    size = w.Dropdown(options=options("gemm"), description="n", style=WIDE)
    size.value = min(size.options, key=lambda n: abs(n - 4096))
    dtype = w.Dropdown(options=dtypes, value="float32" if "float32" in dtypes else dtypes[0],
                       description="number format", style=WIDE)
    button = w.Button(description="Measure here", icon="play", tooltip="time this call on this machine")
    output = w.Output()
    points: list[dict] = []  # measured here
    problems: list[str] = []

    def change_op(_change=None) -> None:
        keep = size.value
        size.options = options(op.value)
        size.value = min(size.options, key=lambda n: abs(n - keep))

    def row(machine: str, roof: Roofline | None, point: dict, rate: float | None) -> dict:
        bound = roof.attainable(point["intensity"], point["dtype"]) / 1e9 if roof and point["dtype"] in roof.peaks \
            else None
        return {"gpu": machine, "call": f"{point['op']} n = {point['n']:,} {point['dtype']}",
                "intensity": point["intensity"], "ridge": roof.ridge(point["dtype"]) if bound else None,
                "bound": bound, "rate": rate, "share": rate / bound if rate and bound else None,
                "limit": roof.bound(point["intensity"], point["dtype"]) if bound else None}

    def update(_change=None) -> None:
        cost = flops.blas(op.value, size.value, dtype.value)
        chosen = {"op": op.value, "n": size.value, "dtype": dtype.value, "intensity": cost.intensity}
        drawn = [run for run in ceilings if run.device_name in roofs]
        if here is not None and here not in drawn and points:
            drawn.append(here)
        def recorded(run: Recording) -> list[dict]:
            """The row of ``levels`` that measured the chosen call on ``run``'s GPU (none or one)."""
            rows = ok_rows(measured[run.device_name].rows) if run.device_name in measured else []
            return [r for r in rows if (r["op"], r["n"], r["dtype"]) == (op.value, size.value, dtype.value)]

        rows = []
        for run in ceilings:
            found = recorded(run)
            rows.append(row(run.short_label, roofs[run.device_name], chosen, found[0]["gflops"] if found else None))
        for point in points:
            rows.append(row(f"{here.short_label}, measured" if here else "measured here",
                            roofs.get(here.device_name) if here else None, point, point["gflops"]))

        def figure(run: Recording) -> go.Figure:
            roof = roofs[run.device_name]
            on_run = points if run is here else recorded(run)
            shown = sorted(({p["dtype"] for p in on_run} | {dtype.value}) & set(roof.peaks)) or None
            fig = plots.roofline_figure(roof, on_run, dtypes=shown, title=f"Roofline of {run.label}")
            return plots.vertical_marker(fig, cost.intensity, f"{op.value}, n = {size.value:,}")

        render(output, "\n".join([
            f"{op.value} (level {rates.LEVEL[op.value]}) at n = {size.value:,} in {dtype.value}: "
            f"{cost.flops:,.0f} FLOP on {format_bytes(int(cost.bytes))} moved, {cost.intensity:,.3g} FLOP per byte.",
            *problems]),
            figure=plots.by_gpu(drawn, figure) if drawn else None,
            table=table(rows, [Column("gpu", "GPU"), Column("call"),
                               Column("intensity", "intensity", "FLOP/byte", ",.3g"),
                               Column("ridge", "ridge point", "FLOP/byte", ",.1f"),
                               Column("bound", "roofline bound", "GFLOP/s", ",.1f"),
                               Column("limit", "the bound is"), Column("rate", "measured", "GFLOP/s", ",.1f"),
                               Column("share", "of the bound", format=".0%")]))

    def measure(_button=None) -> None:
        problems.clear()
        try:
            points.append(rates.measure_blas(op.value, size.value, dtype.value))
        except (ValueError, AssertionError) as error:  # too big, a dtype the device lacks, a failed check
            problems.append(f"Not measured: {error}")
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            problems.append(f"Not measured: {op.value} at n = {size.value} in {dtype.value} ran out of GPU memory")
        update()

    op.observe(change_op, names="value")
    button.on_click(measure)
    return assemble([[op, size, dtype], [button]], output, update)
