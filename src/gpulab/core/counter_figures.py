"""Figures and tables of the hardware counters: the book's kernels as points under each recorded GPU's roofline, the
counters' counts against the book's, and what the counters measured.

The counters are collected in chapter 18 (``notebooks/18_flash_attention_and_counters.ipynb``): its experiment
``kernel_counters`` (:func:`gpulab.ch18_flash_attention_and_counters.profiled.profile_kernels`) runs each kernel under
Nsight Compute. Each function here takes the runs of that experiment (:func:`gpulab.core.recordings.recorded`) and,
optionally, a chapter ("09"), so that the chapter that teaches a kernel shows its own points. A GPU's roof comes from
its own measured ceilings (the ``blas_ceilings`` recording of the same GPU, :func:`gpulab.core.claims.same_gpu`),
else from its datasheet row (:mod:`gpulab.core.specs`); the figure says which.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go

from gpulab.core import claims, counters, plots, recordings, specs
from gpulab.core.recordings import Recording
from gpulab.core.roofline import Roofline
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import MISSING, Column, Table, table

EXPERIMENT = "kernel_counters"
CEILINGS = "blas_ceilings"
ROOF_DTYPES = ("float32", "tf32", "float16", "bfloat16")  # the number formats the profiled kernels compute in
CHAPTERS = {"08": "ch. 08, memory hierarchy", "09": "ch. 09, GEMM", "10": "ch. 10, tensor cores",
            "17": "ch. 17, Hopper GEMM", "13": "ch. 13, fusion", "18": "ch. 18, FlashAttention"}


def _check_chapter(chapter: str | None) -> None:
    if chapter is not None and chapter not in CHAPTERS:
        raise ValueError(f"chapter: one of {', '.join(CHAPTERS)} (the chapters with profiled kernels), or None for "
                         f"all; got {chapter!r}")


def _rows(run: Recording, chapter: str | None) -> list[dict]:
    return [r for r in run.rows if chapter is None or r.get("chapter") == chapter]


def kernels(run: Recording, chapter: str | None = None) -> dict[str, dict]:
    """The kernels that ``run`` profiled (of ``chapter``, or all), by name ('sgemm_naive'): a failed one is left out."""
    _check_chapter(chapter)
    return {r["kernel"]: r for r in ok_rows(_rows(run, chapter))}


def required(run: Recording, chapter: str | None, names: Sequence[str]) -> dict[str, dict]:
    """The rows of the kernels ``names`` in ``run`` (of ``chapter``), by name; KeyError naming those that failed or
    are missing, for a page to print as one sentence."""
    found = kernels(run, chapter)
    missing = [name for name in names if name not in found]
    if missing:
        raise KeyError(f"no counters for {', '.join(missing)} on {run.device_name}")
    return {name: found[name] for name in names}


def roof_with_peaks(run: Recording, dtypes: Sequence[str]) -> Roofline:
    """``run``'s GPU's roofline (:func:`roofline_of`), with a peak for each of ``dtypes`` (KeyError without one)."""
    roof, _ = roofline_of(run)
    lacking = [d for d in dtypes if roof is None or d not in roof.peaks]
    if lacking:
        raise KeyError(f"no {', '.join(lacking)} roof for {run.device_name}")
    return roof


def dram_share(row: dict, roof: Roofline) -> float:
    """The kernel's DRAM bytes per second as a share of the roof's bandwidth."""
    return row["dram_gbytes_per_s"] * 1e9 / roof.bandwidth


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


# What a warp waits for under each stall reason of Nsight Compute's (its kernel profiling guide's descriptions)
STALL_MEANINGS = {
    "barrier": "waiting at a barrier for the other warps of its block",
    "branch_resolving": "waiting for a branch's target",
    "dispatch_stall": "picked, but held back by the dispatcher",
    "drain": "waiting, after its last instruction, for its stores to drain to memory",
    "gmma": "waiting for the warpgroup matrix instructions",
    "imc_miss": "waiting for a miss in the constant cache",
    "lg_throttle": "waiting for room in the queue of global-memory instructions",
    "long_scoreboard": "waiting for the data of a global-memory load",
    "math_pipe_throttle": "waiting for a busy arithmetic pipe",
    "membar": "waiting at a memory fence",
    "mio_throttle": "waiting for room in the queue of shared-memory and special-function instructions",
    "misc": "waiting for a reason of no other kind",
    "no_instruction": "waiting for its instructions to be fetched",
    "not_selected": "ready, but another warp was issued: the scheduler had work",
    "short_scoreboard": "waiting for the data of a shared-memory load or a special function",
    "sleeping": "asleep",
    "tex_throttle": "waiting for room in the texture unit's queue",
    "wait": "waiting out a fixed-latency dependency between instructions",
}


def top_stall(row: dict, rank: int = 0) -> tuple[str, float]:
    """The ``rank``-th largest stall reason of a profiled kernel and its warp cycles per issued instruction."""
    stalls = row.get("top_stalls") or []
    if not 0 <= rank < len(stalls):
        raise KeyError(f"{row.get('label', row.get('kernel'))}: no stall reason of rank {rank}")
    reason, value = stalls[rank]
    return reason, value


def describe_stall(row: dict, rank: int = 0) -> str:
    """'`mio_throttle`, 86.6 cycles per instruction (waiting for room in ...)': a stall reason, its cost and what it
    means, for a sentence."""
    reason, value = top_stall(row, rank)
    meaning = STALL_MEANINGS.get(reason)
    return f"`{reason}`, {value:,.1f} cycles per instruction" + (f" ({meaning})" if meaning else "")


def stalls_text(row: dict) -> str:
    """'mio_throttle 4.0, long_scoreboard 2.5': the top stall reasons, in warp cycles per issued instruction."""
    return ", ".join(f"{reason} {value:.1f}" for reason, value in row.get("top_stalls") or []) or MISSING


def _recorded_gpus(root: Path | None = None) -> list[str]:
    """The GPUs with any recording in the results folder, by name (each folder holds one GPU's recordings)."""
    root = root or recordings.results_dir()
    names = set()
    for folder in sorted(Path(root).iterdir()) if root is not None and Path(root).is_dir() else []:
        for path in sorted(folder.glob("*.json"))[:1]:
            device = json.loads(path.read_text()).get("provenance", {}).get("device", {})
            if device.get("kind") == "cuda" and device.get("name"):
                names.add(device["name"])
    return sorted(names)


def missing_note(runs: Sequence[Recording], root: Path | None = None) -> str:
    """One line naming each recorded GPU that has no recording of the counters ('' when every one has); what the
    figures and tables then show is the other GPUs' alone."""
    profiled = {run.device_name for run in runs}
    missing = [name.removeprefix("NVIDIA ") for name in _recorded_gpus(root) if name not in profiled]
    if not missing:
        return ""
    drawn = ", ".join(run.short_label for run in runs if run.on_gpu) or "no GPU"
    return (f"Not profiled yet: the {' and the '.join(missing)} {'has' if len(missing) == 1 else 'have'} no "
            f"recording of the hardware counters ({EXPERIMENT}); the counters below are the {drawn}'s.")


def _hover(row: dict, point: dict, roof: Roofline | None) -> str:
    share = share_of_roof(row, roof)
    lines = [f"<b>{row['label']}</b> ({CHAPTERS.get(row['chapter'], row['chapter'])})",
             f"{row['dtype']}, {row['size_means'].split(':')[0].replace('_', ' ')} = {row['size']:,}",
             plots.field_text("seconds", row["seconds"]),
             f"rate = {point['flops_per_s'] / 1e12:,.2f} TFLOP/s" + (f" ({share:.0%} of the roof)" if share else ""),
             f"intensity = {point['intensity']:,.1f} FLOP/DRAM byte"
             + (f", {point['intensity_l2']:,.1f} per L2 byte" if point["intensity_l2"] else ""),
             f"SM busy {row['sm_throughput_pct'] or 0:.0f}%, memory busy {row['memory_throughput_pct'] or 0:.0f}%",
             f"top stalls (cycles per instruction): {stalls_text(row)}"]
    return "<br>".join(lines)


def _title(what: str, run: Recording, chapter: str | None) -> str:
    return f"{what}, {CHAPTERS[chapter]}: {run.label}" if chapter else f"{what}: {run.label}"


def _note(fig: go.Figure, text: str) -> None:
    fig.add_annotation(text=text, x=0.99, xref="paper", xanchor="right", y=0.01, yref="paper", yanchor="bottom",
                       align="left", showarrow=False, font=dict(size=11), bgcolor="rgba(255,255,255,0.8)")


def _figure(run: Recording, chapter: str | None, tags: Mapping[str, str]) -> go.Figure:
    roof, source = roofline_of(run)
    rows = ok_rows(_rows(run, chapter))
    drawn = [r for r in rows if r["flops"] > 0 and r["dram_bytes"] > 0]
    dtypes = [d for d in ROOF_DTYPES if roof and d in roof.peaks and any(r["dtype"] == d for r in drawn)]
    title = _title("The book's kernels under the roofline", run, chapter)
    fig = plots.roofline_figure(roof, dtypes=dtypes, title=title) if roof and dtypes else go.Figure(
        layout=dict(title=title, xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
                    yaxis=dict(type="log", title="rate (GFLOP/s)")))
    colour = {d: plots.PALETTE[i % len(plots.PALETTE)] for i, d in enumerate(dtypes)}
    for i, (number, name) in enumerate((n, c) for n, c in CHAPTERS.items() if any(r["chapter"] == n for r in drawn)):
        group = [r for r in drawn if r["chapter"] == number]
        points = [counters.counter_point(r) for r in group]
        labelled = any(r["kernel"] in tags for r in group)
        fig.add_trace(go.Scatter(
            x=[p["intensity"] for p in points], y=[p["gflops"] for p in points], name=name,
            mode="markers+text" if labelled else "markers", text=[tags.get(r["kernel"], "") for r in group],
            textposition=[("middle right", "middle left")[j % 2] for j in range(len(group))],  # neighbours apart
            textfont=dict(size=11),
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
    _note(fig, f"roofs: {source}<br>points: under ncu, clocks at base" + (
        f"<br>not drawn: {', '.join(notes)}" if notes else ""))
    fig.update_layout(height=560, legend=dict(orientation="h", y=-0.3, x=0, yanchor="top"),
                      xaxis_title="arithmetic intensity (FLOP per DRAM byte)")
    return fig


def counter_roofline(runs: Sequence[Recording], chapter: str | None = None,
                     tags: Mapping[str, str] | None = None) -> go.Figure:
    """Per recorded GPU (a menu picks it): the profiled kernels (of ``chapter``, or all) as points at their achieved
    FLOP/s and FLOP per DRAM byte, under that GPU's roofline; a point's colour is the roof of its number format, its
    symbol its chapter, and ``tags`` ({kernel: text}) writes a short text beside a point; the hover gives the time,
    the share of the roof, the SM and memory load and the top stalls. Kernels without FLOPs (the transposes) are left
    out: :func:`counter_bandwidth` and :func:`counter_table` have them."""
    _check_chapter(chapter)
    return plots.by_gpu(runs, lambda run: _figure(run, chapter, tags or {}))


def _bandwidth_figure(run: Recording, chapter: str | None) -> go.Figure:
    roof, source = roofline_of(run)
    rows = [{"label": r["label"], "dram": r["dram_gbytes_per_s"], "l2": (r.get("l2_bytes") or 0) / r["seconds"] / 1e9
             or None, "share": share_of_roof(r, roof), "stalls": stalls_text(r)} for r in ok_rows(_rows(run, chapter))]
    fig = plots.bars_figure(rows, "label", {"DRAM": "dram", "L2 (to and from the SMs)": "l2"},
                            title=_title("Bytes per second, counted by the hardware", run, chapter),
                            y_title="bandwidth (GB/s)", x_title="kernel")
    for trace, key in zip(fig.data, ("dram", "l2"), strict=True):
        present = [r for r in rows if r[key] is not None]
        trace.hovertext = [f"<b>{r['label']}</b><br>{trace.name}: {r[key]:,.0f} GB/s"
                           + (f" ({r['share']:.0%} of the roof's DRAM bandwidth)" if key == "dram" and r["share"]
                              else "") + f"<br>top stalls (cycles per instruction): {r['stalls']}" for r in present]
        trace.hoverinfo = "text"
    if roof is not None:
        fig.add_hline(y=roof.bandwidth / 1e9, line_dash="dash", line_color="#444444")
    _note(fig, f"dashed: the DRAM roof, {roof.bandwidth / 1e9:,.0f} GB/s ({source})<br>bars: under ncu, clocks at base"
          if roof else f"roof: {source}<br>bars: under ncu, clocks at base")
    fig.update_layout(height=480, legend=dict(orientation="h", y=-0.3, x=0, yanchor="top"))
    return fig


def counter_bandwidth(runs: Sequence[Recording], chapter: str | None = None) -> go.Figure:
    """Per recorded GPU (a menu picks it): the bytes per second each profiled kernel (of ``chapter``, or all) moved
    between DRAM and L2 and between L2 and the SMs, against the DRAM roof: the roofline of kernels without FLOPs."""
    _check_chapter(chapter)
    return plots.by_gpu(runs, lambda run: _bandwidth_figure(run, chapter))


def _ratio(value: float | None, within: bool | None) -> str:
    return MISSING if value is None else f"{value:.3f}" + (" ✓" if within else "")


def counts_table(runs: Sequence[Recording], chapter: str | None = None) -> Table:
    """Per kernel (of ``chapter``, or all): the book's count of its FLOPs and DRAM bytes, and for each recorded GPU
    what the counters counted over it (✓ within :data:`gpulab.core.counters.TOLERANCE`); a failed kernel says so."""
    _check_chapter(chapter)
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
    _check_chapter(chapter)
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
