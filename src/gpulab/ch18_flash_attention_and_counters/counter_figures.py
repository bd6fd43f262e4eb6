"""Chapter 18's figures and tables of the hardware counters (:func:`.profiled.profile_kernels`): the book's kernels as
points under each recorded GPU's roofline, the counters' counts against the book's, and what the counters measured.

Each function takes the runs of ``kernel_counters`` (:func:`gpulab.core.recordings.runs`) and, optionally, a chapter
("09"), so that the chapter that teaches a kernel can show its own points. A GPU's roof comes from its own measured
ceilings (the ``blas_ceilings`` recording of the same GPU, :func:`gpulab.core.claims.same_gpu`), else from its
datasheet row (:mod:`gpulab.core.specs`); the figure's title says which.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.core import claims, counters, plots, specs
from gpulab.core.recordings import Recording
from gpulab.core.roofline import Roofline
from gpulab.core.tables import MISSING, Column, Table, table

CEILINGS = "blas_ceilings"
ROOF_DTYPES = ("float32", "tf32", "float16", "bfloat16")  # the number formats the profiled kernels compute in
CHAPTERS = {"08": "ch. 08, memory hierarchy", "09": "ch. 09, GEMM", "10": "ch. 10, tensor cores",
            "17": "ch. 17, Hopper GEMM", "13": "ch. 13, fusion", "18": "ch. 18, FlashAttention"}


def _rows(run: Recording, chapter: str | None) -> list[dict]:
    return [r for r in run.rows if chapter is None or r.get("chapter") == chapter]


def _ok(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok"]


def roofline_of(run: Recording) -> tuple[Roofline | None, str]:
    """The roofline of ``run``'s GPU and where it comes from: its measured ceilings, else its datasheet, else None."""
    try:
        ceilings = claims.same_gpu(run, CEILINGS)
        return Roofline.from_rows(ceilings.rows, ceilings.device_name), "measured ceilings"
    except (KeyError, ValueError):
        pass
    row = specs.find(run.device_name)
    if row is None:
        return None, "none (no measured ceilings, no datasheet)"
    peaks = {d: specs.peak(row, d).ops_per_s for d in ROOF_DTYPES if specs.peak_tflops(row, d)}
    return Roofline(run.device_name, row.bandwidth_gb_s * 1e9, peaks), "datasheet peaks"


def share_of_roof(row: dict, roof: Roofline | None) -> float | None:
    """What a kernel reached as a share of what the roof allows at its intensity; for a kernel with no FLOPs, its
    DRAM bandwidth as a share of the roof's. None without a roof (or a peak for the kernel's number format)."""
    if roof is None or row.get("status") != "ok":
        return None
    if not row["flops"] or not row["dram_bytes"]:
        return row["dram_bytes"] / row["seconds"] / roof.bandwidth
    point = counters.counter_point(row)
    if row["dtype"] not in roof.peaks:
        return None
    return point["flops_per_s"] / roof.attainable(point["intensity"], row["dtype"])


def stalls_text(row: dict) -> str:
    """'mio_throttle 4.0, long_scoreboard 2.5': the top stall reasons, in warp cycles per issued instruction."""
    return ", ".join(f"{reason} {value:.1f}" for reason, value in row.get("top_stalls") or []) or MISSING


def _hover(row: dict, point: dict, roof: Roofline | None) -> str:
    share = share_of_roof(row, roof)
    lines = [f"<b>{row['label']}</b> ({CHAPTERS.get(row['chapter'], row['chapter'])})",
             f"{row['dtype']}, {row['size_means'].split(':')[0]} = {row['size']:,}",
             plots.field_text("seconds", row["seconds"]),
             f"rate = {point['flops_per_s'] / 1e12:,.2f} TFLOP/s" + (f" ({share:.0%} of the roof)" if share else ""),
             f"intensity = {point['intensity']:,.1f} FLOP/DRAM byte"
             + (f", {point['intensity_l2']:,.1f} per L2 byte" if point["intensity_l2"] else ""),
             f"SM busy {row['sm_throughput_pct'] or 0:.0f}%, memory busy {row['memory_throughput_pct'] or 0:.0f}%",
             f"top stalls (cycles per instruction): {stalls_text(row)}"]
    return "<br>".join(lines)


def _figure(run: Recording, chapter: str | None) -> go.Figure:
    roof, source = roofline_of(run)
    rows = _ok(_rows(run, chapter))
    drawn = [r for r in rows if r["flops"] > 0 and r["dram_bytes"] > 0]
    dtypes = [d for d in ROOF_DTYPES if roof and d in roof.peaks and any(r["dtype"] == d for r in drawn)]
    title = f"The book's kernels under the roofline: {run.label}"
    fig = plots.roofline_figure(roof, dtypes=dtypes, title=title) if roof and dtypes else go.Figure(
        layout=dict(title=title, xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
                    yaxis=dict(type="log", title="rate (GFLOP/s)")))
    colour = {d: plots.PALETTE[i % len(plots.PALETTE)] for i, d in enumerate(dtypes)}
    for i, (number, name) in enumerate((n, c) for n, c in CHAPTERS.items() if any(r["chapter"] == n for r in drawn)):
        group = [r for r in drawn if r["chapter"] == number]
        points = [counters.counter_point(r) for r in group]
        fig.add_trace(go.Scatter(
            x=[p["intensity"] for p in points], y=[p["gflops"] for p in points], mode="markers", name=name,
            marker=dict(size=11, symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)], line=dict(width=1, color="#333333"),
                        color=[colour.get(r["dtype"], "#7f7f7f") for r in group]),
            hovertext=[_hover(r, p, roof) for r, p in zip(group, points, strict=True)], hoverinfo="text"))
    against_l2 = [(r, counters.counter_point(r)) for r in drawn if r.get("l2_bytes")]
    if against_l2:
        fig.add_trace(go.Scatter(
            x=[p["intensity_l2"] for _, p in against_l2], y=[p["gflops"] for _, p in against_l2], mode="markers",
            name="the same, per L2 byte", visible="legendonly",
            marker=dict(size=9, symbol="circle-open", color="#444444"),
            hovertext=[f"{r['label']}: {p['intensity_l2']:,.1f} FLOP per L2 byte" for r, p in against_l2],
            hoverinfo="text"))
    left_out = [r for r in rows if r not in drawn]
    failed = len(_rows(run, chapter)) - len(rows)
    notes = ([f"{len(left_out)} without FLOPs"] if left_out else []) + ([f"{failed} failed"] if failed else [])
    note = f"roofs: {source}<br>points: under ncu, clocks at base" + (
        f"<br>not drawn: {', '.join(notes)}" if notes else "")
    fig.add_annotation(text=note, x=0.99, xref="paper", xanchor="right", y=0.01, yref="paper", yanchor="bottom",
                       align="left", showarrow=False, font=dict(size=11), bgcolor="rgba(255,255,255,0.8)")
    fig.update_layout(height=560, legend=dict(orientation="h", y=-0.3, x=0, yanchor="top"),
                      xaxis_title="arithmetic intensity (FLOP per DRAM byte)")
    return fig


def counter_roofline(runs: Sequence[Recording], chapter: str | None = None) -> go.Figure:
    """Per recorded GPU (a menu picks it): the profiled kernels (of ``chapter``, or all) as points at their achieved
    FLOP/s and FLOP per DRAM byte, under that GPU's roofline; a point's colour is the roof of its number format, its
    symbol its chapter; the hover gives the time, the share of the roof, the SM and memory load and the top stalls.
    Kernels without FLOPs (the transposes) are left out: :func:`counter_table` has them."""
    return plots.by_gpu(runs, lambda run: _figure(run, chapter))


def _ratio(value: float | None, within: bool | None) -> str:
    return MISSING if value is None else f"{value:.3f}" + (" ✓" if within else "")


def counts_table(runs: Sequence[Recording], chapter: str | None = None) -> Table:
    """Per kernel (of ``chapter``, or all): the book's count of its FLOPs and DRAM bytes, and for each recorded GPU
    what the counters counted over it (✓ within :data:`gpulab.core.counters.TOLERANCE`); a failed kernel says so."""
    keys: list[tuple[str, int]] = []
    found: dict[tuple[str, int], dict] = {}
    for i, run in enumerate(runs):
        for row in _rows(run, chapter):
            key = (row["kernel"], row["size"])
            if key not in found:
                keys.append(key)
                found[key] = {"label": row["label"], "size": row["size"]}
            entry = found[key]
            if row.get("status") == "ok":
                entry.update(book_gflop=row["book_flops"] / 1e9 or None, book_mb=row["book_bytes"] / 1e6)
                entry[f"flops{i}"] = _ratio(row["flops_ratio"], row["flops_within"])
                entry[f"bytes{i}"] = _ratio(row["bytes_ratio"], row["bytes_within"])
            else:
                entry[f"flops{i}"] = entry[f"bytes{i}"] = "failed"
    columns = [Column("label", "kernel"), Column("size", format=",d"),
               Column("book_gflop", "book's count", "GFLOP", ",.1f"), Column("book_mb", "book's count", "MB", ",.0f")]
    for i, run in enumerate(runs):
        columns += [Column(f"flops{i}", f"{run.short_label}: FLOP counted / book", align="right"),
                    Column(f"bytes{i}", f"{run.short_label}: DRAM bytes counted / book", align="right")]
    return table([found[k] for k in keys], columns,
                 caption=f"✓: within {counters.TOLERANCE:.0%} of the book's count, which has the fewest bytes (inputs "
                         "read once, the output written once).")


def counter_table(runs: Sequence[Recording], chapter: str | None = None) -> Table:
    """What the counters measured, per recorded GPU and kernel (of ``chapter``, or all): time, FLOP/s, DRAM
    bandwidth and L2 traffic, the share of the roof, how busy the SMs and the memory were, the top stall reasons (or
    why the kernel failed)."""
    rows = []
    for run in runs:
        roof, _ = roofline_of(run)
        for row in _rows(run, chapter):
            ok = row.get("status") == "ok"
            rows.append({"gpu": run.short_label, "label": row["label"], **({
                "us": row["seconds"] * 1e6, "tflops": row["flops"] / row["seconds"] / 1e12,
                "dram": row["dram_gbytes_per_s"], "l2": (row.get("l2_bytes") or 0) / 1e6 or None,
                "roof": share_of_roof(row, roof), "sm": row["sm_throughput_pct"],
                "memory": row["memory_throughput_pct"], "stalls": stalls_text(row)} if ok else {
                "stalls": row.get("status", "failed")})})
    return table(rows, [Column("gpu", "GPU"), Column("label", "kernel"), Column("us", "time", "µs", ",.1f"),
                        Column("tflops", "rate", "TFLOP/s", ",.2f"), Column("dram", "DRAM", "GB/s", ",.0f"),
                        Column("l2", "L2 traffic", "MB", ",.0f"), Column("roof", "of the roof", format=".0%"),
                        Column("sm", "SM busy", "%", ".0f"), Column("memory", "memory busy", "%", ".0f"),
                        Column("stalls", "top stalls (cycles per instruction)", align="left")],
                 caption="Measured under ncu: clocks locked to base, caches emptied before each pass.")
