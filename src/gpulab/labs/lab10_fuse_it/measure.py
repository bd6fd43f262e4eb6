"""The lab's experiment ``lab_fuse_it``: eager PyTorch, the fused kernels and a device copy, each checked
against float64 on fresh data, then timed (:func:`measure_fusion`), and drawn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpulab.core import env, kernel_mode, plots, rates, timing
from gpulab.core.correctness import poisoned
from gpulab.core.provenance import experiment
from gpulab.core.validation import fits_in_memory, positive_int
from gpulab.labs.lab10_fuse_it.diagnose import TOLERANCE
from gpulab.labs.lab10_fuse_it.reference import (
    FLOAT_BYTES,
    covering_grid,
    eager_bytes,
    fused_bytes,
    fused_per_element,
    fused_rows,
    reference,
    rows_grid,
)

TARGET_FRACTION = 0.8  # the lab's target: the fused kernel at 80% or more of a copy's bandwidth


def _written_right(out: torch.Tensor, expected: torch.Tensor) -> bool:
    """Every element of ``out`` within :data:`TOLERANCE` of ``expected`` (relative to its largest value); on device."""
    difference = (out.double() - expected).abs().max()
    return bool(difference <= TOLERANCE * max(1.0, float(expected.abs().max())))  # NaN compares False


def _time_versions(launches: Mapping[str, Callable], rows: int, cols: int, device: torch.device) -> list[dict]:
    """Eager PyTorch and each launch at rows x cols: checked against float64, then timed (seconds, spread)."""
    generator = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(rows, cols, generator=generator).to(device) for _ in range(2))
    bias = torch.randn(cols, generator=generator).to(device)
    expected = reference(x, bias, residual)

    def eager() -> torch.Tensor:
        return torch.relu(x + bias) + residual  # three kernels: add (broadcast), relu, add

    table = [{"kernel": "eager PyTorch (3 kernels)", "bytes": sum(sum(p) for p in eager_bytes(rows, cols).values()),
              "status": "ok" if _written_right(eager(), expected) else "wrong result"}]
    if table[0]["status"] == "ok":
        measured = timing.measure(eager, device=device)
        table[0].update(seconds=measured.median_s, spread=measured.spread)
    out = poisoned((rows, cols), torch.float32, device)
    arguments = [kernel_mode.device_array(t) for t in (x, bias, residual, out)]  # once, outside the timed calls
    for name, launch in launches.items():
        row = {"kernel": name, "bytes": sum(fused_bytes(rows, cols))}
        out.fill_(math.nan)
        try:
            launch(*arguments)
            kernel_mode.synchronize()
            row["status"] = "ok" if _written_right(out, expected) else "wrong result"
        except Exception as error:  # a student's launch: report it in the row
            row["status"] = f"failed: {type(error).__name__}: {error}"
        if row["status"] == "ok":
            measured = timing.measure(lambda launch=launch: launch(*arguments), device=device)
            row.update(seconds=measured.median_s, spread=measured.spread)
        table.append(row)
    return table


def compare_with_copy(launches: Mapping[str, Callable], rows: int, cols: int,
                      device: torch.device | None = None) -> list[dict]:
    """Check, then time, each fused kernel's launch at rows x cols, eager PyTorch, and a copy of the same bytes.

    ``launches`` maps a name to ``launch(x, bias, residual, out)``, which takes kernel arguments
    (:func:`gpulab.core.kernel_mode.device_array`, converted once, outside the timed calls). Each result is
    compared with float64 before timing; a wrong one is a row with ``status`` saying so, and is not
    timed. Every row has ``bytes`` (what that version must move: :func:`fused_bytes` for a fused kernel,
    :func:`eager_bytes` for eager PyTorch), ``seconds`` (median, L2 flushed between runs),
    ``gbytes_per_s`` (bytes over seconds), ``fraction_of_copy`` and ``speedup_vs_eager``. The copy moves
    the fused kernel's bytes: it reads half of them and writes the other half (:func:`gpulab.core.rates.measure_copy`).
    """
    rows, cols = positive_int("rows", rows), positive_int("cols", cols)
    device = device or kernel_mode.device()
    # x, residual, out and the eager chain's two temporaries and result, a float64 reference and one float64 copy
    fits_in_memory("rows and cols", FLOAT_BYTES * 6 * rows * cols + 8 * 2 * rows * cols, device)
    table = _time_versions(launches, rows, cols, device)  # its tensors are freed on return: the copy needs the memory
    copy = rates.measure_copy(sum(fused_bytes(rows, cols)) // 2, device)
    table.append({"kernel": "copy of the same bytes", "bytes": 2 * copy["nbytes"], "seconds": copy["seconds"],
                  "spread": copy["spread"], "status": "ok"})
    copy_gbs = table[-1]["bytes"] / copy["seconds"] / 1e9
    eager_s = table[0].get("seconds")
    for row in table:
        if row["status"] == "ok":
            row["gbytes_per_s"] = row["bytes"] / row["seconds"] / 1e9
            row["fraction_of_copy"] = row["gbytes_per_s"] / copy_gbs
            row["speedup_vs_eager"] = eager_s / row["seconds"] if eager_s else None
        row.update(rows=rows, cols=cols)
    return table


@experiment("lab_fuse_it")
def measure_fusion(rows: int = 2**14, cols: int = 2**12, threads: Sequence[int] = (32, 8)) -> list[dict]:
    """The lab's experiment on a GPU: eager PyTorch, the two reference fused kernels and a copy (see
    :func:`compare_with_copy`), at rows x cols float32 with blocks of ``threads = (tx, ty)``."""
    kernel_mode.require_gpu("measure_fusion")
    tx, ty = (positive_int("threads", t) for t in threads)
    sms = env.describe().multiprocessors
    per_element = covering_grid(rows, cols, (tx, ty))
    stepping = rows_grid(rows, cols, (tx, ty), sms)
    return compare_with_copy({
        "fused, one element per thread": lambda *a: fused_per_element[per_element, (tx, ty)](*a),
        "fused, grid-stride over rows": lambda *a: fused_rows[stepping, (tx, ty)](*a),
    }, rows, cols)


def fusion_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Two panels: each version's median time, and the bandwidth it reaches (its own bytes over its time)."""
    measured = [r for r in rows if r.get("status") == "ok"]
    if not measured:
        raise ValueError("rows: no measured row to draw")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time", "bandwidth (bytes each version moves / time)"))
    names = [r["kernel"] for r in measured]
    hover = [f"{r['kernel']}<br>{r['bytes'] / 1e6:,.0f} MB in {r['seconds'] * 1e6:,.1f} us<br>"
             f"{r['gbytes_per_s']:,.0f} GB/s, {r['fraction_of_copy']:.0%} of the copy's" for r in measured]
    colours = [plots.PALETTE[i % len(plots.PALETTE)] for i in range(len(measured))]
    fig.add_trace(go.Bar(x=names, y=[r["seconds"] * 1e6 for r in measured], marker_color=colours,
                         hovertext=hover, hoverinfo="text", showlegend=False,
                         text=[f"{r['seconds'] * 1e6:,.0f}" for r in measured], textposition="outside"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[r["gbytes_per_s"] for r in measured], marker_color=colours,
                         hovertext=hover, hoverinfo="text", showlegend=False,
                         text=[f"{r['gbytes_per_s']:,.0f}" for r in measured], textposition="outside"), row=1, col=2)
    fig.update_yaxes(title_text="time (us)", row=1, col=1)
    fig.update_yaxes(title_text="GB/s", row=1, col=2)
    fig.update_layout(title=title, height=480)
    return fig
