"""Chapter 18's figures, tables and sentences.

- The kernels: their checks against float64, run live (:func:`kernel_checks`: Triton's interpreter without a GPU,
  the compiled kernels on one); the tiles a causal program computes (:func:`tile_states`); what the compiler made
  of them for a Hopper GPU (:func:`compiled_evidence`, on any machine).
- The race, FlashAttention in Triton against every SDPA backend
  (:func:`gpulab.kernels.triton_attention.measure.attention_race`): each recorded GPU behind a menu, or in a GPU
  column of a table; the target's verdict printed from the numbers.
- The hardware counters' metrics, as the page explains them (:mod:`gpulab.core.counters`).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go
import torch

import gpulab
from gpulab.core import counters, plots, specs
from gpulab.core.precision import MATMUL_TOLERANCE
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, table
from gpulab.core.validation import dtype_name, positive_int, torch_dtype
from gpulab.kernels.triton_attention import attention, attention_forward, backward, forward, measure, reference
from gpulab.kernels.triton_gemm.interpreter import interpreting

PASSES = {"forward_tflops": "forward", "forward_backward_tflops": "forward + backward"}
SECONDS = {"forward_tflops": "forward_seconds", "forward_backward_tflops": "forward_backward_seconds"}
# The tile products the backward computes: those its two kernels' loops contain (S and dP are recomputed by both),
# against the five of the count (BACKWARD_FACTOR = 2.5 forwards of two products each)
TRITON_BACKWARD_PRODUCTS = sum(inspect.getsource(step.fn).count("tl.dot(")
                               for step in (backward.key_block_step, backward.query_block_step))
COUNTED_BACKWARD_PRODUCTS = round(2 * measure.BACKWARD_FACTOR)


def mask_name(causal: bool) -> str:
    return "causal" if causal else "full"


def _points(run: Recording) -> list[tuple[int, bool]]:
    """The (head size, mask) pairs the run measured, in its order."""
    return list(dict.fromkeys((r["head_dim"], r["causal"]) for r in run.rows if r.get("seq_len") is not None))


def _rows(run: Recording, name: str, head_dim: int, causal: bool) -> list[dict]:
    return [r for r in run.rows if r["implementation"] == name and r["head_dim"] == head_dim
            and r["causal"] == causal and r.get("seq_len") is not None]


def _measured(row: dict, key: str) -> bool:
    return row.get("status") == "ok" and row.get(key) is not None


def _why_not(row: dict, key: str) -> str:
    """Why a row has no ``key``: its status, or for forward + backward the backward's."""
    if row.get("status") != "ok":
        return row.get("status", "no measurement")
    return row.get("backward_status") or "no measurement"


def _log_axis(fig: go.Figure, lengths: Sequence[int], title: str) -> None:
    fig.update_xaxes(type="log", title=title, tickvals=list(lengths), ticktext=[f"{n:,}" for n in lengths])


def _gaps(rows: Sequence[dict], key: str, label: str, ordinal: int) -> list[dict]:
    """Annotations on the x axis (log10 positions) for the lengths an implementation did not measure."""
    return [dict(x=math.log10(r["seq_len"]), y=0, yref="paper", text=f"{label}: {_why_not(r, key)[:40]}",
                 showarrow=True, arrowhead=2, ay=-30 - 26 * ordinal, bgcolor="rgba(255,255,255,0.8)")
            for r in rows if not _measured(r, key)]


def race_figure(runs: Sequence[Recording], key: str = "forward_tflops") -> go.Figure:
    """TFLOP/s against the sequence length, a line per implementation; a menu picks the head size and mask (and,
    with several runs, the GPU)."""
    if key not in PASSES:
        raise ValueError(f"key: one of {', '.join(PASSES)}, got {key!r}")

    def figure(run: Recording) -> go.Figure:
        fig = go.Figure()
        choices = []
        for head_dim, causal in _points(run):
            first, notes = len(fig.data), []
            for i, (name, label) in enumerate(measure.IMPLEMENTATIONS.items()):
                rows = _rows(run, name, head_dim, causal)
                if not rows:
                    continue
                good = [r for r in rows if _measured(r, key)]
                fig.add_trace(go.Scatter(
                    x=[r["seq_len"] for r in good], y=[r[key] for r in good], name=label, mode="lines+markers",
                    line_color=plots.PALETTE[i], marker_symbol=plots.SYMBOLS[i], visible=not choices,
                    hovertext=[plots.hover_text(r, ("seq_len", "batch", "heads", SECONDS[key], key)) for r in good],
                    hoverinfo="text+name"))
                notes += _gaps(rows, key, label, len(notes))
            choices.append((f"head size {head_dim}, {mask_name(causal)}", first, len(fig.data), notes))
        lengths = sorted({r["seq_len"] for r in run.rows if r.get("seq_len") is not None})
        _log_axis(fig, lengths, "sequence length (tokens)")
        fig.update_layout(title=f"Attention {PASSES[key]}, {run.params.get('dtype', 'bfloat16')}: {run.label}",
                          yaxis_title="rate (TFLOP/s)", annotations=choices[0][3] if choices else [])
        _menu(fig, choices)
        return fig

    return plots.by_gpu(runs, figure)


def _menu(fig: go.Figure, choices: Sequence[tuple[str, int, int, list]]) -> None:
    """A menu whose entries show the traces ``[first, end)`` of a choice, with its annotations."""
    if len(choices) < 2:
        return
    buttons = [dict(label=label, method="update",
                    args=[{"visible": [first <= t < end for t in range(len(fig.data))]}, {"annotations": notes}])
               for label, first, end, notes in choices]
    fig.update_layout(updatemenus=[dict(buttons=buttons, active=0, x=0.0, y=1.0, xanchor="left", yanchor="bottom",
                                        direction="down")])


def ratio_figure(runs: Sequence[Recording]) -> go.Figure:
    """Triton's rate as a share of the fastest SDPA backend's at each point, a line per head size and mask, the
    target drawn at its share; a menu picks forward or forward + backward."""
    def figure(run: Recording) -> go.Figure:
        fig = go.Figure()
        choices = []
        for key, what in PASSES.items():
            first = len(fig.data)
            points = measure.versus_best_sdpa(run.rows, key)
            for i, (head_dim, causal) in enumerate(_points(run)):
                mine = [p for p in points if p["head_dim"] == head_dim and p["causal"] == causal]
                fig.add_trace(go.Scatter(
                    x=[p["seq_len"] for p in mine], y=[p["ratio"] for p in mine], mode="lines+markers",
                    name=f"head size {head_dim}, {mask_name(causal)}", visible=not choices,
                    line=dict(color=plots.PALETTE[i], dash="solid" if causal else "dash"),
                    marker_symbol=plots.SYMBOLS[i],
                    hovertext=[f"{p['seq_len']:,} tokens: Triton {p['triton']:,.0f} TFLOP/s, "
                               f"{measure.IMPLEMENTATIONS[p['best_sdpa']]} {p['best_sdpa_rate']:,.0f} TFLOP/s: "
                               f"{p['ratio']:.1%}" for p in mine], hoverinfo="text"))
            choices.append((what, first, len(fig.data), []))
        lengths = sorted({r["seq_len"] for r in run.rows if r.get("seq_len") is not None})
        _log_axis(fig, lengths, "sequence length (tokens)")
        fig.update_layout(title=f"Triton's share of the fastest SDPA backend: {run.label}",
                          yaxis=dict(title="Triton / fastest SDPA backend", tickformat=".0%"))
        fig.add_hline(y=measure.TARGET, line_dash="dot", line_color="#444444")
        fig.add_annotation(x=1.0, xref="paper", y=measure.TARGET, yanchor="bottom", xanchor="right",
                           showarrow=False, text=f"target {measure.TARGET:.0%} (forward, head size "
                           f"{measure.TARGET_FROM['head_dim']}, from {measure.TARGET_FROM['seq_len']:,} tokens)")
        if len(choices) > 1:
            buttons = [dict(label=label, method="update",
                            args=[{"visible": [first <= t < end for t in range(len(fig.data))]}])
                       for label, first, end, _ in choices]
            fig.update_layout(updatemenus=[dict(buttons=buttons, active=0, x=0.0, y=1.0, xanchor="left",
                                                yanchor="bottom", direction="down")])
        return fig

    return plots.by_gpu(runs, figure)


def _longest_common(run: Recording, head_dim: int, causal: bool) -> int | None:
    """The longest length at which every implementation the run measured at (head_dim, causal) ran its forward."""
    names = [n for n in measure.IMPLEMENTATIONS if _rows(run, n, head_dim, causal)]
    lengths = [{r["seq_len"] for r in _rows(run, n, head_dim, causal) if _measured(r, "forward_tflops")}
               for n in names]
    common = set.intersection(*lengths) if lengths else set()
    return max(common) if common else None


def race_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, head size and mask, at the longest length every implementation ran: each implementation's forward
    and forward + backward TFLOP/s (the backends a GPU refused are named, without numbers)."""
    rows = []
    for run in runs:
        for head_dim, causal in _points(run):
            n = _longest_common(run, head_dim, causal)
            for name, label in measure.IMPLEMENTATIONS.items():
                found = [r for r in _rows(run, name, head_dim, causal) if r["seq_len"] == n]
                refused = [r for r in run.rows if r["implementation"] == name and r.get("seq_len") is None
                           and r["head_dim"] == head_dim and r["causal"] == causal]
                if not found and not refused:
                    continue
                row = found[0] if found else {"status": refused[0]["status"]}
                rows.append({"gpu": run.short_label, "point": f"d = {head_dim}, {mask_name(causal)}",
                             "tokens": n, "implementation": label if found else f"{label} ({row['status'][:60]})",
                             "forward": row.get("forward_tflops"),
                             "forward_backward": row.get("forward_backward_tflops")})
    return table(rows, [Column("gpu", "GPU"), Column("point", "head size, mask"), Column("tokens", format=","),
                        Column("implementation"), Column("forward", "forward", "TFLOP/s", ",.0f"),
                        Column("forward_backward", "forward + backward", "TFLOP/s", ",.0f")],
                 caption="at the longest sequence every implementation ran; a forward counted as 4 b h s^2 d FLOP "
                         "(half of it when causal), forward + backward as 3.5 forwards")


def target_points(run: Recording) -> list[dict]:
    """The points the target covers (head size 128, 4,096 tokens and more), forward and forward + backward."""
    forward = [p for p in measure.versus_best_sdpa(run.rows) if p["target_applies"]]
    both = {(p["seq_len"], p["causal"]): p for p in measure.versus_best_sdpa(run.rows, "forward_backward_tflops")}
    return [{**p, "forward_backward_ratio": both.get((p["seq_len"], p["causal"]), {}).get("ratio")} for p in forward]


def target_table(runs: Sequence[Recording]) -> Table:
    rows = [{"gpu": run.short_label, "mask": mask_name(p["causal"]), "tokens": p["seq_len"],
             "best": measure.IMPLEMENTATIONS[p["best_sdpa"]].removeprefix("SDPA, "), "triton": p["triton"],
             "ratio": p["ratio"], "forward_backward_ratio": p["forward_backward_ratio"],
             "met": "yes" if p["meets_target"] else "no"} for run in runs for p in target_points(run)]
    return table(rows, [Column("gpu", "GPU"), Column("mask"), Column("tokens", format=","),
                        Column("best", "fastest SDPA backend"), Column("triton", "Triton forward", "TFLOP/s", ",.0f"),
                        Column("ratio", "forward share", format=".0%"),
                        Column("forward_backward_ratio", "forward + backward share", format=".0%"),
                        Column("met", f"forward at {measure.TARGET:.0%} or more")],
                 caption=f"head size {measure.TARGET_FROM['head_dim']}, from {measure.TARGET_FROM['seq_len']:,} "
                         "tokens: Triton's rate as a share of the fastest SDPA backend's at the same point")


def _span(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.0%}" if round(low, 2) == round(high, 2) else f"{low:.0%} to {high:.0%}"


def target_statements(runs: Sequence[Recording]) -> list[str]:
    """Per run: the target's verdict from the numbers (met at how many of its points, the shares measured)."""
    said = []
    target = (f"the forward at {measure.TARGET:.0%} or more of the fastest SDPA backend at head size "
              f"{measure.TARGET_FROM['head_dim']} from {measure.TARGET_FROM['seq_len']:,} tokens")
    for run in runs:
        points = target_points(run)
        if not points:
            said.append(f"{run.label}: no point at head size {measure.TARGET_FROM['head_dim']} from "
                        f"{measure.TARGET_FROM['seq_len']:,} tokens, so the target ({target}) was not measured.")
            continue
        met = sum(bool(p["meets_target"]) for p in points)
        verdict = ("met at every one of its" if met == len(points) else
                   "not met at any of its" if met == 0 else f"met at {met} of its")
        best = ", ".join(sorted({measure.IMPLEMENTATIONS[p["best_sdpa"]].removeprefix("SDPA, ") for p in points}))
        said.append(f"{run.label}: the target ({target}) is **{verdict} {len(points)} points**: the Triton "
                    f"forward reached {_span([p['ratio'] for p in points])} of the fastest backend ({best}).")
    return said


def backward_alone(row: dict) -> float | None:
    """TFLOP/s of the backward alone, counted as :data:`measure.BACKWARD_FACTOR` forwards: its work over the time
    forward + backward took beyond the forward; None without both measurements."""
    if not (_measured(row, "forward_tflops") and _measured(row, "forward_backward_tflops")):
        return None
    work = measure.forward_flops(row["batch"], row["heads"], row["seq_len"], row["head_dim"], row["causal"])
    extra = row["forward_backward_seconds"] - row["forward_seconds"]
    return measure.BACKWARD_FACTOR * work / extra / 1e12 if extra > 0 else None


def race_statements(runs: Sequence[Recording]) -> list[str]:
    """Per run: which SDPA backend was the fastest, Triton's forward share of it per head size, and the backward
    alone at the longest length of the last head size, Triton's against the fastest backend's."""
    said = []
    for run in runs:
        points = measure.versus_best_sdpa(run.rows)
        if not points:
            continue
        fastest = Counter(measure.IMPLEMENTATIONS[p["best_sdpa"]].removeprefix("SDPA, ") for p in points)
        lines = [f"{run.label}: the fastest SDPA backend was " + ", ".join(
            f"the {name} at {count} of {len(points)} points" for name, count in fastest.most_common()) + "."]
        shares = [f"at head size {d}, {_span([p['ratio'] for p in points if p['head_dim'] == d])}"
                  for d in dict.fromkeys(p["head_dim"] for p in points)]
        lines.append("The Triton forward reached, of the fastest backend's rate, " + "; ".join(shares) + ".")
        head_dim = max(p["head_dim"] for p in points)
        full = [p for p in points if p["head_dim"] == head_dim and not p["causal"]]
        n, best = max((p["seq_len"], p["best_sdpa"]) for p in full) if full else (None, None)
        rates = {name: backward_alone(next(r for r in _rows(run, name, head_dim, False) if r["seq_len"] == n))
                 for name in ("triton", best)} if full else {}
        if rates and all(rates.values()):
            executed = rates["triton"] * TRITON_BACKWARD_PRODUCTS / COUNTED_BACKWARD_PRODUCTS
            lines.append(f"The backward alone at head size {head_dim}, {n:,} tokens, full mask: Triton "
                         f"{rates['triton']:,.0f} TFLOP/s counted ({executed:,.0f} for the "
                         f"{TRITON_BACKWARD_PRODUCTS} tile products it computes where the count has "
                         f"{COUNTED_BACKWARD_PRODUCTS}), {measure.IMPLEMENTATIONS[best]} {rates[best]:,.0f}.")
        said.append(" ".join(lines))
    return said


def peak_statements(runs: Sequence[Recording]) -> list[str]:
    """Per run: each implementation's forward at the longest length, largest head size, full mask, as a share of
    the GPU's datasheet 16-bit tensor-core peak (:mod:`gpulab.core.specs`); nothing for a GPU the table lacks."""
    said = []
    for run in runs:
        gpu = specs.find(run.device_name)
        rows = [r for r in run.rows if _measured(r, "forward_tflops") and not r["causal"]]
        if gpu is None or not rows:
            continue
        head_dim = max(r["head_dim"] for r in rows)
        n = max(r["seq_len"] for r in rows if r["head_dim"] == head_dim)
        peak = specs.peak_tflops(gpu, run.params.get("dtype", "bfloat16"))
        shares = sorted(((r["forward_tflops"] / peak, r["label"]) for r in rows
                         if (r["head_dim"], r["seq_len"]) == (head_dim, n)), reverse=True)
        said.append(f"{run.short_label}, forward at {n:,} tokens, head size {head_dim}, full mask, as a share of the "
                    f"{gpu.name}'s datasheet peak ({peak:,.0f} TFLOP/s): " +
                    ", ".join(f"{label.removeprefix('SDPA, ')} {share:.0%}" for share, label in shares) + ".")
    return said


# What each counter measures, for the page: (metric or family, what it counts, what the chapter makes of it)
METRIC_MEANINGS = [
    (counters.TIME, "the launch's duration, at the clocks ncu locks", "the time of the point's rate"),
    (f"{counters.DRAM_READ}, {counters.DRAM_WRITE}", "bytes read from and written to the GPU's memory (HBM)",
     "the x of the roofline point: FLOPs per DRAM byte"),
    (counters.L2, "bytes through the L2 cache, all requests", "intensity against L2, and the reuse the L2 gives"),
    (counters.SM_THROUGHPUT, "the busiest SM unit's share of its peak", "how close the kernel is to a compute roof"),
    (counters.MEMORY_THROUGHPUT, "the busiest memory unit's share of its peak (DRAM, L2, L1, shared memory)",
     "how close it is to a memory roof"),
    ("sm__sass_thread_inst_executed_op_{ffma,fadd,fmul}_pred_on.sum (and dfma... for float64, hfma... for "
     "float16)", "instructions executed by active threads", "CUDA-core FLOPs: an FMA counts 2"),
    ("sm__ops_path_tensor_src_{fp16,bf16_dst_fp32,tf32_dst_fp32,fp8,fp64}.sum", "tensor-core operations",
     "tensor-core FLOPs, one per operation"),
    (f"{counters.HMMA_INST}, {counters.GMMA_INST}", "warp-level (mma.sync) and warpgroup (wgmma) tensor-core "
     "instructions", "which tensor-core instructions the kernel uses"),
    ("smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio", "cycles a warp waits, per instruction "
     "issued, for each reason (a load, a barrier, a busy pipe)", "the top stall reasons: why the point sits "
     "below its roof"),
]


def metrics_table() -> Table:
    rows = [{"metric": m, "counts": c, "use": u} for m, c, u in METRIC_MEANINGS]
    return table(rows, [Column("metric", "ncu metric"), Column("counts", "what it counts"),
                        Column("use", "what the chapter makes of it")],
                 caption=f"the {len(counters.METRICS)} metrics of gpulab.core.counters.METRICS, by family")


# The kernels: checked live, the tiles a program computes, and the compiled code.

def kernel_checks(batch: int, heads: int, seq_len: int, head_dims: Sequence[int], dtype: str,
                  seed: int | None = None) -> list[dict]:
    """Per head size and mask, on fresh random inputs (``seed``, drawn when None): the forward checked against
    float64 (output and log-sum-exp), then forward and backward (output, dQ, dK, dV); a row of errors each.
    Raises AssertionError where an error is NaN or above its tolerance: nothing wrong is shown as a result."""
    batch, heads, seq_len = (positive_int(n, v) for n, v in (("batch", batch), ("heads", heads),
                                                              ("seq_len", seq_len)))
    label = dtype_name(dtype)
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    where = "Triton's interpreter on the CPU" if interpreting() else f"compiled, on the {torch.cuda.get_device_name()}"
    rows = []
    for head_dim in head_dims:
        for causal in (False, True):
            shape = (batch, heads, seq_len, head_dim, torch_dtype(label), causal)
            lse = reference.check_forward(attention_forward, *shape, seed=seed)["lse"]
            errors = reference.check_attention(attention, *shape, seed=seed)
            rows.append({"head_dim": head_dim, "mask": mask_name(causal), **errors, "lse": lse,
                         "tolerance": MATMUL_TOLERANCE[label], "where": where, "seed": seed,
                         "shape": f"{batch} x {heads} heads x {seq_len:,} tokens, {label}"})
    return rows


def checks_table(rows: Sequence[dict]) -> Table:
    errors = [Column(k, h, format=".1e") for k, h in (("out", "output"), ("lse", "log-sum-exp (absolute)"),
                                                      ("dq", "dQ"), ("dk", "dK"), ("dv", "dV"))]
    first = rows[0]
    return table(rows, [Column("head_dim", "head size"), Column("mask"), *errors,
                        Column("tolerance", "tolerance", format=".0e")],
                 caption=f"{first['where']}: {first['shape']}, seed {first['seed']}; relative errors against "
                         "float64 attention on the host")


def checks_sentence(rows: Sequence[dict]) -> str:
    worst = max(max(r[k] for k in ("out", "dq", "dk", "dv")) for r in rows)
    return (f"The largest relative error of an output or a gradient is {worst:.1e}, "
            f"{rows[0]['tolerance'] / worst:,.0f} times under the tolerance of {rows[0]['shape'].split(', ')[-1]}.")


def tile_states(seq_len: int, block_m: int, block_n: int, causal: bool = True) -> list[list[str]]:
    """What :func:`gpulab.kernels.triton_attention.forward.forward_kernel` does with each (block of queries, tile
    of keys), following its loops: 'unmasked', 'masked' or 'skipped' (never loaded)."""
    seq_len, block_m, block_n = (positive_int(n, v) for n, v in (("seq_len", seq_len), ("block_m", block_m),
                                                                  ("block_n", block_n)))
    if block_m % block_n:
        raise ValueError(f"block_m: a multiple of block_n, as the kernel requires; got {block_m} and {block_n}")
    states = []
    for start_m in range(0, seq_len, block_m):
        plain, masked = (start_m, min(start_m + block_m, seq_len)) if causal else (seq_len // block_n * block_n,
                                                                                    seq_len)
        states.append(["unmasked" if n < plain else "masked" if n < masked else "skipped"
                       for n in range(0, seq_len, block_n)])
    return states


STATE_COLOURS = {"skipped": "#eeeeee", "masked": plots.PALETTE[1], "unmasked": plots.PALETTE[0]}


def causal_tiles_figure(seq_len: int = 1024, head_dim: int = 128) -> go.Figure:
    """The tiles a causal forward computes, with the tile sizes of ``head_dim`` (:data:`forward.CONFIGS`)."""
    config = forward.CONFIGS[head_dim]
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    states = tile_states(seq_len, bm, bn)
    level = {s: i for i, s in enumerate(STATE_COLOURS)}
    steps = len(STATE_COLOURS)
    scale = [[edge / steps, colour] for i, colour in enumerate(STATE_COLOURS.values()) for edge in (i, i + 1)]
    text = [[f"queries {i * bm:,}-{min((i + 1) * bm, seq_len) - 1:,}, keys {j * bn:,}-"
             f"{min((j + 1) * bn, seq_len) - 1:,}: {s}" for j, s in enumerate(row)] for i, row in enumerate(states)]
    fig = go.Figure(go.Heatmap(
        z=[[level[s] for s in row] for row in states], zmin=-0.5, zmax=steps - 0.5, colorscale=scale, xgap=1, ygap=1,
        text=text, hoverinfo="text",
        colorbar=dict(tickvals=list(range(steps)), ticktext=list(STATE_COLOURS), title="tile")))
    fig.update_layout(title=f"Tiles of a causal forward: {seq_len:,} tokens, {bm} x {bn} tiles (head size {head_dim})",
                      xaxis_title=f"tile of {bn} keys", yaxis=dict(title=f"program: block of {bm} queries",
                                                                    autorange="reversed"))
    return fig


def tiles_sentence(seq_len: int = 1024, head_dim: int = 128) -> str:
    config = forward.CONFIGS[head_dim]
    full = tile_states(seq_len, config["BLOCK_M"], config["BLOCK_N"], causal=False)
    causal = Counter(s for row in tile_states(seq_len, config["BLOCK_M"], config["BLOCK_N"]) for s in row)
    total, computed = sum(len(row) for row in full), causal["unmasked"] + causal["masked"]
    return (f"At {seq_len:,} tokens a causal forward computes {computed:,} of the {total:,} tiles a full one computes "
            f"({computed / total:.1%}), {causal['masked']} of them masked, on the diagonal; the FLOP count takes "
            "half, so the causal rates count the masked half of each diagonal tile as no work.")


_EVIDENCE = """
import json, sys
from gpulab.kernels.triton_attention import measure
from gpulab.kernels.triton_gemm.ladder import evidence
kernels, head_dim, causal, capability = json.loads(sys.argv[1])
print(json.dumps([{"kernel": k, **evidence(measure.cross_compile(k, head_dim, causal, capability=capability))}
                  for k in kernels]))
"""


def compiled_evidence(kernels: Sequence[str] = tuple(measure.KERNELS), head_dim: int = 128, causal: bool = False,
                      capability: int = 90) -> list[dict]:
    """What Triton compiles each of ``kernels`` (:data:`measure.KERNELS`) to for a GPU of compute ``capability``,
    on any machine: :func:`gpulab.kernels.triton_gemm.ladder.evidence` per kernel, bfloat16, with its own tiles.
    The kernels must be defined for compiling, so a separate Python process does it (``TRITON_INTERPRET=0``)."""
    unknown = [k for k in kernels if k not in measure.KERNELS]
    if unknown or not kernels:
        raise ValueError(f"kernels: some of {', '.join(measure.KERNELS)}, got {list(kernels)!r}")
    if head_dim not in forward.CONFIGS:
        raise ValueError(f"head_dim: one of {', '.join(map(str, forward.CONFIGS))}, got {head_dim!r}")
    source = str(Path(gpulab.__file__).resolve().parents[1])  # gpulab's folder, also where a notebook put it
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, (source, os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", _EVIDENCE, json.dumps([list(kernels), head_dim, causal, capability])],
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"compiled_evidence: compiling for sm_{capability} failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def evidence_sentence(rows: Sequence[dict]) -> str:
    """What the compiled code shows, counted from ``rows`` of :func:`compiled_evidence`."""
    def count(test) -> str:
        return f"{sum(bool(test(r)) for r in rows)} of {len(rows)}"
    return (f"Of the {len(rows)} kernels, {count(lambda r: r['sass_HGMMA'])} use Hopper's warpgroup instructions "
            f"(HGMMA), {count(lambda r: r['sass_LDGSTS'])} copy their tiles to shared memory with cp.async (LDGSTS), "
            f"{count(lambda r: r['sass_UTMALDG'])} load with the Tensor Memory Accelerator (UTMALDG), and "
            f"{count(lambda r: r['warp_specialized'])} are warp-specialized.")


def evidence_table(rows: Sequence[dict], head_dim: int = 128, capability: int = 90) -> Table:
    shown = [{**r, "tensor_cores": f"{r['tensor_core']}: {r['sass_HGMMA'] or r['sass_HMMA']}",
              "ws": "yes" if r["warp_specialized"] else "no", "kib": r["shared_bytes"] / 1024} for r in rows]
    return table(shown, [Column("kernel"), Column("tensor_cores", "tensor-core instructions"),
                         Column("sass_LDG", "LDG (loads to registers)"), Column("sass_LDGSTS", "LDGSTS (cp.async)"),
                         Column("sass_UTMALDG", "UTMALDG (TMA)"), Column("ws", "warp-specialized"),
                         Column("kib", "shared memory", "KiB", ",.1f"), Column("num_warps", "warps"),
                         Column("num_stages", "stages")],
                 caption=f"SASS of each kernel compiled by Triton for sm_{capability}, bfloat16, head size {head_dim}, "
                         "its own tiles: instructions counted in the code, not executed")
