"""Chapter 13's figures and tables for attention: the online softmax, the blocked attention against the naive one
in NumPy, and the attention methods timed on a device (:func:`.blocked_attention.attention_sweep`, each recorded GPU
behind a menu)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from gpulab.ch13_memory_bound_layers_and_fusion import blocked_attention
from gpulab.ch13_memory_bound_layers_and_fusion.sweeps import roofline_of
from gpulab.core import plots
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.sweep import OUT_OF_MEMORY
from gpulab.core.tables import Column, Table, table

LARGE_ROW = (1000.0, 999.0, 3.0, -1000.0, 998.5, 1001.0)  # a row whose exponentials overflow without the maximum


def online_softmax_table(row: Sequence[float] = LARGE_ROW, block: int = 2) -> Table:
    """The softmax of ``row`` three ways: without subtracting the maximum (NaN where exp overflows), in three passes,
    and online in blocks of ``block``."""
    x = np.array([row], dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        unsafe = np.exp(x) / np.exp(x).sum()
    online, counts = blocked_attention.online_softmax(x, block=block)
    ways = {"without the maximum": unsafe[0], "three passes": blocked_attention.softmax(x)[0],
            f"online, blocks of {block}: {counts['passes']} passes, {counts['blocks']} blocks, "
            f"{counts['rescalings']} rescalings of the running sum": online[0]}
    rows = [{"way": way, **{f"x{j}": "NaN" if np.isnan(v) else f"{v:.4f}" for j, v in enumerate(values)}}
            for way, values in ways.items()]
    return table(rows, [Column("way", "softmax"), *(Column(f"x{j}", f"x = {v:g}") for j, v in enumerate(row))],
                 caption="one row with large values: exp(1000) overflows float64")


def online_softmax_error(rows: int = 64, length: int = 1000, blocks: Sequence[int] = (1, 7, 64, 1000),
                         seed: int = 0) -> str:
    """The largest relative difference between the online and the three-pass softmax of random rows, in a sentence."""
    x = np.random.default_rng(seed).normal(scale=30, size=(rows, length))
    error = max(np.max(np.abs(blocked_attention.online_softmax(x, b)[0] / blocked_attention.softmax(x) - 1))
                for b in blocks)
    return (f"On {rows} random rows of {length:,}, the online softmax differs from the three-pass one by at most "
            f"{error:.1e} (relative), over blocks of {', '.join(f'{b:,}' for b in blocks)}.")


def blocked_table(rows: Sequence[dict]) -> Table:
    """The rows of :func:`.blocked_attention.blocked_vs_naive`: per block size, the errors, rescalings and elements
    held."""
    first = rows[0]
    return table(rows, [Column("block", "block"), Column("relative_error", "relative error", format=".1e"),
                        Column("max_elementwise_error", "largest elementwise error", format=".1e"),
                        Column("rescalings", "rescalings of O"), Column("scores_held", "scores held"),
                        Column("working_elements", "working set", "elements")],
                 caption=f"N = {first['n']:,}, d = {first['d']}, float64; the naive attention holds "
                         f"{first['naive_scores_held']:,} scores")


def blocked_target(rows: Sequence[dict]) -> str:
    """The verdict on :data:`.blocked_attention.TARGET_ERROR`, in a sentence; raises if a block size misses it or a
    counted working set differs from :func:`.blocked_attention.attention_memory`'s formula."""
    worst = max(r["relative_error"] for r in rows)
    if worst > blocked_attention.TARGET_ERROR:
        raise AssertionError(f"blocked attention: relative error {worst:.1e}")
    if any(r["working_elements"] != r["formula_blocked"] for r in rows):
        raise AssertionError("blocked attention: a counted working set differs from attention_memory's formula")
    return (f"Target (relative error at most {blocked_attention.TARGET_ERROR:.0e}) met for every block size: the "
            f"largest is {worst:.1e}, the size of float64 rounding, "
            f"{np.log10(blocked_attention.TARGET_ERROR / worst):.0f} orders of magnitude under the target. The "
            "working sets the function counted equal the formula of `blocked_attention.attention_memory`.")


def attention_memory_figure(block: int = 128, d: int = 64, sizes: Sequence[int] = tuple(2**k for k in range(9, 18))
                            ) -> go.Figure:
    """Elements each attention holds beyond its inputs, naive and blocked, against N, with the inputs' own size."""
    memory = [blocked_attention.attention_memory(n, d, block, block) for n in sizes]
    series = {"naive: scores and probabilities, 2 N^2": "naive", "blocked: one block of scores, O, m and l": "blocked",
              "Q, K, V and O themselves, 4 N d": "inputs_outputs"}
    fig = plots.sweep_figure([], "n", "elements",
                             title=f"Elements attention holds beyond its inputs (blocks of {block}, d = {d})",
                             x_title="sequence length N (tokens)", y_title="elements (log scale)", log_x=True,
                             log_y=True)
    for i, (name, key) in enumerate(series.items()):
        fig.add_scatter(x=list(sizes), y=[m[key] for m in memory], name=name, mode="lines+markers",
                        marker_symbol=plots.SYMBOLS[i], line_color=plots.PALETTE[i],
                        hovertext=[f"N = {n:,}: {m[key]:,} elements" for n, m in zip(sizes, memory, strict=True)],
                        hoverinfo="text+name")
    return fig


def _measured(run: Recording) -> list[dict]:
    return [r for r in run.rows if r["status"] == "ok" and r["seq_len"] is not None]


def attention_methods_table(runs: Sequence[Recording]) -> Table:
    """Per run and method: the backend that ran, the longest sequence it ran, and the lengths out of memory."""
    rows = []
    for run in runs:
        p = run.params
        for method, label in blocked_attention.METHODS.items():
            mine = [r for r in run.rows if r["method"] == method]
            if not mine:
                continue
            ran = [r for r in mine if r["status"] == "ok" and r["seq_len"] is not None]
            failed = [r["seq_len"] for r in mine if r["status"] == OUT_OF_MEMORY]
            rows.append({"gpu": run.short_label, "shape": f"{p['batch']} x {p['heads']} heads, d = {p['head_dim']}, "
                         f"{p['dtype']}", "method": label,
                         "backend": ", ".join(dict.fromkeys(r["backend"].removeprefix("none: ") for r in ran))
                         or mine[0]["status"],
                         "longest": max((r["seq_len"] for r in ran), default=None),
                         "failed": ", ".join(f"{n:,}" for n in failed) or None})
    return table(rows, [Column("gpu", "GPU"), Column("shape", "inputs"), Column("method"),
                        Column("backend", "backend that ran"), Column("longest", "longest N run", format=","),
                        Column("failed", "out of memory at N")])


def _names(rows: Sequence[dict]) -> dict[str, str]:
    """Legend names: SDPA's own choice names the backend it picked."""
    picked = ", ".join(dict.fromkeys(r["backend"] for r in rows if r["method"] == "sdpa" and r["status"] == "ok"))
    return {"naive": "naive (matmul, softmax, matmul)", "sdpa": f"SDPA, its own choice ({picked})",
            "sdpa-math": "SDPA, math", "sdpa-flash": "SDPA, flash", "sdpa-efficient": "SDPA, memory-efficient",
            "sdpa-cudnn": "SDPA, cuDNN"}


def _drawn(run: Recording) -> list[dict]:
    names = _names(run.rows)
    return [{**r, "name": names[r["method"]], "ms": r.get("seconds", 0) * 1e3,
             "gib": (r.get("peak_extra_bytes") or 0) / 2**30} for r in run.rows if r["seq_len"] is not None]


def _out_of_memory_arrows(fig: go.Figure, rows: Sequence[dict]) -> go.Figure:
    """One arrow per size that did not fit, naming the methods (on a log axis an annotation's x is log10)."""
    fig.layout.annotations = ()
    sizes = sorted({r["seq_len"] for r in rows if r["status"] == OUT_OF_MEMORY})
    for i, n in enumerate(sizes):
        which = ", ".join(r["name"].split(" (")[0] for r in rows if r["seq_len"] == n and r["status"] == OUT_OF_MEMORY)
        fig.add_annotation(x=np.log10(n), y=0, yref="paper", text=f"N = {n:,}: out of memory for {which}",
                           showarrow=True, arrowhead=2, ay=-30 - 28 * (len(sizes) - 1 - i), xanchor="right",
                           bgcolor="rgba(255,255,255,0.8)")
    return fig


def attention_time_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        shown = _drawn(run)
        fig = plots.sweep_figure(shown, "seq_len", "ms", color="name", title=f"Attention time: {run.label}",
                                 x_title="sequence length N (tokens)", y_title="milliseconds per call (log scale)",
                                 log_x=True, log_y=True, hover=("seq_len", "backend", "seconds", "tflops",
                                                                "peak_extra_bytes"))
        return _out_of_memory_arrows(fig, shown)
    return plots.by_gpu(runs, figure)


def attention_memory_peak_figure(runs: Sequence[Recording]) -> go.Figure:
    """The peak memory beyond Q, K and V against N, for the runs that measured it (on a GPU)."""
    def measured(run: Recording) -> list[dict]:
        return [r for r in _drawn(run) if r["status"] != "ok" or r.get("peak_extra_bytes") is not None]

    def figure(run: Recording) -> go.Figure:
        fig = plots.sweep_figure(measured(run), "seq_len", "gib", color="name", log_x=True, log_y=True,
                                 title=f"Attention peak memory: {run.label}", x_title="sequence length N (tokens)",
                                 y_title="GiB beyond the inputs (log scale)",
                                 hover=("seq_len", "backend", "peak_extra_bytes", "score_bytes"))
        return _out_of_memory_arrows(fig, measured(run))
    return plots.by_gpu([run for run in runs if any(r["status"] == "ok" for r in measured(run))], figure)


def attention_statements(runs: Sequence[Recording], rooflines: Sequence[Recording]) -> list[str]:
    """Per run: SDPA against the naive attention at the longest sequence both ran (time, rate, peak memory), where
    the naive attention ran out of memory, the math backend against the naive attention, and each SDPA backend's
    rate at the longest sequence against the bfloat16 matmul of ``rooflines``' run on the same device."""
    matmul = {(r.device_name, bool(r.provenance.get("recorded"))):
              roofline_of(r.rows, r.device_name)[0].peaks.get("bfloat16") for r in rooflines}
    said = []
    for run in runs:
        ok = _measured(run)
        by = {(r["method"], r["seq_len"]): r for r in ok}
        naive = {r["seq_len"]: r for r in ok if r["method"] == "naive"}
        fused = {r["seq_len"]: r for r in ok if r["method"] == "sdpa"}
        common = sorted(set(naive) & set(fused))
        if not common:
            continue
        n = common[-1]
        line = (f"{run.label}: at N = {n:,}, the largest both ran, SDPA ({fused[n]['backend']}) took "
                f"{fused[n]['seconds'] * 1e3:.2f} ms against the naive {naive[n]['seconds'] * 1e3:.2f} ms "
                f"({naive[n]['seconds'] / fused[n]['seconds']:.1f}x), at {fused[n]['tflops']:.3g} against "
                f"{naive[n]['tflops']:.3g} TFLOP/s")
        if naive[n].get("peak_extra_bytes") is not None:
            line += (f"; peak memory {format_bytes(fused[n]['peak_extra_bytes'])} against "
                     f"{format_bytes(naive[n]['peak_extra_bytes'])}, "
                     f"{naive[n]['peak_extra_bytes'] / naive[n]['score_bytes']:.1f}x one score matrix "
                     f"({format_bytes(naive[n]['score_bytes'])})")
        lines = [line + "."]
        beyond = sorted(r["seq_len"] for r in run.rows if r["method"] == "naive" and r["status"] == OUT_OF_MEMORY)
        if beyond:
            longest = max(r["seq_len"] for r in ok if r["method"] == "sdpa")
            lines.append(f"The naive attention ran out of memory from N = {beyond[0]:,}; SDPA ran up to "
                         f"N = {longest:,}.")
        math_common = [m for m in common if ("sdpa-math", m) in by]
        if math_common and naive[math_common[-1]].get("peak_extra_bytes") is not None:
            m = math_common[-1]
            lines.append(f"The math backend at N = {m:,}: {by['sdpa-math', m]['seconds'] / naive[m]['seconds']:.1f}x "
                         f"the naive attention's time and "
                         f"{by['sdpa-math', m]['peak_extra_bytes'] / naive[m]['peak_extra_bytes']:.1f}x its peak "
                         "memory.")
        top = max(r["seq_len"] for r in ok)
        rates = {r["backend"]: r["tflops"] for r in ok if r["seq_len"] == top and r["method"].startswith("sdpa")}
        if rates:
            peak = (matmul.get((run.device_name, bool(run.provenance.get("recorded"))))
                    if run.params["dtype"] == "bfloat16" else None)
            fastest = "" if not peak else (f"; the bfloat16 matmul of the roofline run: {peak / 1e12:.0f}, of which "
                                           f"the fastest attention reaches {max(rates.values()) * 1e12 / peak:.0%}")
            lines.append(f"At N = {top:,}, each SDPA backend in TFLOP/s: " + ", ".join(
                f"{b} {t:.3g}" for b, t in sorted(rates.items(), key=lambda kv: -kv[1])) + fastest + ".")
        said.append(" ".join(lines))
    return said
