"""Chapter 15's figures: a 2:4 pattern, accuracy after pruning, and the sparse products' speed-ups and rates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpulab.ch15_structured_sparsity.patterns import GROUP, KEPT, compress
from gpulab.ch15_structured_sparsity.pruning import DENSE
from gpulab.ch15_structured_sparsity.speedup import BACKENDS, DENSE_BACKEND, SPARSE_MATH_FACTOR
from gpulab.core import plots


def pattern_figure(dense: torch.Tensor, pruned: torch.Tensor, *, title: str) -> go.Figure:
    """Three heatmaps side by side: a small matrix, the same matrix pruned to 2:4 (pruned weights blank), and its
    compressed values, each labelled with its position in its group; dotted lines part the groups of 4."""
    packed = compress(pruned)
    rows, columns = dense.shape
    limit = dense.abs().max().item()
    panels = [("dense", dense, [[f"{v:.1f}" for v in row] for row in dense.tolist()]),
              ("pruned to 2:4", torch.where(pruned != 0, pruned, torch.nan),
               [[f"{v:.1f}" if v else "" for v in row] for row in pruned.tolist()]),
              ("compressed: values (index in group)", packed.values,
               [[f"{v:.1f} ({i})" for v, i in zip(vr, ir, strict=True)]
                for vr, ir in zip(packed.values.tolist(), packed.indices.tolist(), strict=True)])]
    fig = make_subplots(rows=1, cols=3, column_widths=[columns, columns, columns / 2],
                        subplot_titles=[name for name, _, _ in panels], horizontal_spacing=0.04)
    for col, (_, matrix, text) in enumerate(panels, start=1):
        fig.add_trace(go.Heatmap(z=matrix.tolist(), text=text, texttemplate="%{text}", textfont=dict(size=9),
                                 colorscale="RdBu", zmid=0, zmin=-limit, zmax=limit, showscale=col == 1,
                                 colorbar=dict(title=dict(text="value")), xgap=1, ygap=1, hoverinfo="text"),
                      row=1, col=col)
        width = matrix.shape[1]
        step = GROUP if col < 3 else KEPT  # a group is 4 columns dense, 2 compressed
        for x in range(step, width, step):
            fig.add_vline(x=x - 0.5, line_dash="dot", line_color="#444444", row=1, col=col)
        fig.update_xaxes(title_text="column (reduction dimension)" if col < 3 else "compressed column", row=1, col=col,
                         showgrid=False)
        fig.update_yaxes(autorange="reversed", showticklabels=col == 1, showgrid=False, row=1, col=col)
    fig.update_yaxes(title_text="row", row=1, col=1)
    fig.update_layout(title=title, height=140 + 32 * rows, plot_bgcolor="#f4f4f4")
    return fig


def accuracy_figure(summary: Sequence[dict], *, title: str) -> go.Figure:
    """Test accuracy (mean over seeds, a bar of one standard deviation) of each method after pruning and after
    fine-tuning with the mask fixed, as grouped bars; a dotted line at the dense network's accuracy."""
    stages = {"pruned": "after pruning", "fine-tuned": "after fine-tuning (mask fixed)"}
    methods = list(dict.fromkeys(s["method"] for s in summary))
    fig = go.Figure()
    for i, (stage, label) in enumerate(stages.items()):
        chosen = {s["method"]: s for s in summary if s["stage"] == stage}
        shown = [m for m in methods if m in chosen]
        fig.add_trace(go.Bar(
            x=shown, y=[100 * chosen[m]["accuracy_mean"] for m in shown], name=label,
            error_y=dict(type="data", array=[100 * chosen[m]["accuracy_sd"] for m in shown]),
            marker_color=plots.PALETTE[i], marker_pattern_shape=plots.PATTERNS[i],
            text=[f"{100 * chosen[m]['accuracy_mean']:.1f}" for m in shown], textposition="outside",
            hovertext=[plots.hover_text(chosen[m], ("runs", "accuracy_min", "accuracy_max", "zeros", "kept_norm"))
                       for m in shown], hoverinfo="text"))
    dense = next((s for s in summary if s["method"] == DENSE and s["stage"] == "trained"), None)
    if dense:
        fig.add_hline(y=100 * dense["accuracy_mean"], line_dash="dot", line_color="#444444",
                      annotation_text="dense, trained", annotation_position="bottom left")
    fig.update_layout(title=title, barmode="group", yaxis_title="test accuracy (%), mean and sd over seeds",
                      xaxis_title="how the network was pruned", legend=dict(orientation="h", y=-0.2))
    return fig


def speedup_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Speed-up of each 2:4 backend over the dense product against tokens (log), a panel per dtype, one line per
    weight size and backend; dotted lines at 1 (no gain) and at 2 (the sparse tensor cores' peak ratio)."""
    ok = [r for r in rows if r.get("status") == "ok" and "speedup" in r]
    dtypes = list(dict.fromkeys(r["dtype"] for r in ok)) or ["(none)"]
    fig = make_subplots(rows=1, cols=len(dtypes), subplot_titles=dtypes, shared_yaxes=True)
    sizes = sorted({r["n"] for r in ok})
    dashes = {b: d for b, d in zip(BACKENDS, ("solid", "dash"), strict=True)}
    for col, dtype in enumerate(dtypes, start=1):
        for i, n in enumerate(sizes):
            for backend in BACKENDS:
                line = sorted((r for r in ok if r["dtype"] == dtype and r["n"] == n and r["backend"] == backend),
                              key=lambda r: r["tokens"])
                if not line:
                    continue
                fig.add_trace(go.Scatter(
                    x=[r["tokens"] for r in line], y=[r["speedup"] for r in line], mode="lines+markers",
                    name=f"{n:,} x {n:,}, {backend}", legendgroup=f"{n}{backend}", showlegend=col == 1,
                    line=dict(color=plots.PALETTE[i % len(plots.PALETTE)], dash=dashes[backend]),
                    marker=dict(symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)]),
                    hovertext=[plots.hover_text(r, ("n", "tokens", "backend", "seconds", "tflops", "speedup"))
                               for r in line], hoverinfo="text"), row=1, col=col)
        for level, text in ((1, "dense"), (SPARSE_MATH_FACTOR, "2x: the sparse peak ratio")):
            fig.add_hline(y=level, line_dash="dot", line_color="#444444", annotation_text=text,
                          annotation_position="top left", row=1, col=col)
        fig.update_xaxes(type="log", title_text="tokens (rows of X)", row=1, col=col)
    fig.update_yaxes(title_text="speed-up over dense (dense time / sparse time)", row=1, col=1)
    fig.update_layout(title=title, legend=dict(title=dict(text="weight, backend")))
    return fig


def rate_figure(rows: Sequence[dict], n: int, *, title: str, peaks: Mapping[str, float] | None = None) -> go.Figure:
    """TFLOP/s (dense FLOP count) of the dense product and of each backend against tokens, for the n x n weight,
    a line per dtype and backend; ``peaks`` ({label: TFLOP/s}) are drawn as dotted lines."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("n") == n]
    fig = go.Figure()
    combos = list(dict.fromkeys((r["dtype"], r["backend"]) for r in ok))
    for i, (dtype, backend) in enumerate(combos):
        line = sorted((r for r in ok if r["dtype"] == dtype and r["backend"] == backend), key=lambda r: r["tokens"])
        fig.add_trace(go.Scatter(
            x=[r["tokens"] for r in line], y=[r["tflops"] for r in line], mode="lines+markers",
            name=f"{dtype}, {backend}", line=dict(color=plots.PALETTE[i % len(plots.PALETTE)],
                                                  dash="solid" if backend == DENSE_BACKEND else "dash"),
            marker=dict(symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)]),
            hovertext=[plots.hover_text(r, ("tokens", "seconds", "tflops", "relative_error")) for r in line],
            hoverinfo="text"))
    for label, value in (peaks or {}).items():
        fig.add_hline(y=value, line_dash="dot", line_color="#444444", annotation_text=label,
                      annotation_position="top left")
    fig.update_layout(title=title, xaxis_title="tokens (rows of X)",
                      yaxis_title="TFLOP/s (dense FLOP: 2 x tokens x n^2)")
    fig.update_xaxes(type="log")
    return fig
