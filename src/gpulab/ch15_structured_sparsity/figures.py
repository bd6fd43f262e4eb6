"""Chapter 15's figures and tables: a 2:4 pattern and its storage, accuracy after pruning, and the sparse products'
orientations, speed-ups and rates, drawn from runs of :mod:`.speedup` (each recorded GPU behind a menu, a GPU column
in the tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpulab.ch15_structured_sparsity.patterns import (
    GROUP,
    KEPT,
    Compressed,
    compress,
    is_2_4,
    nonzeros_per_group,
    prune_2_4,
    storage_rows,
)
from gpulab.ch15_structured_sparsity.pruning import DENSE, PRUNING_METHODS
from gpulab.ch15_structured_sparsity.speedup import (
    BACKENDS,
    DENSE_BACKEND,
    SPARSE_MATH_FACTOR,
    peak_rows,
    semi_structured_constraints,
    sparse_peak,
    speedup_statements,
)
from gpulab.core import plots, specs
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, table


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


def pattern_summary(dense: torch.Tensor, pruned: torch.Tensor, packed: Compressed) -> str:
    """Whether ``dense`` and ``pruned`` are 2:4, the nonzeros per group after pruning, and the compressed shapes."""
    counts = sorted(set(nonzeros_per_group(pruned).flatten().tolist()))
    return (f"W is {tuple(dense.shape)}: 2:4 before pruning {is_2_4(dense)}, after {is_2_4(pruned)} (nonzeros per "
            f"group after: {counts}). Compressed, its values are {tuple(packed.values.shape)} and its indices "
            f"{tuple(packed.indices.shape)}; decompress(compress(W)) equals the pruned W exactly.")


def compressed_row_table(pruned: torch.Tensor, packed: Compressed, row: int = 0) -> Table:
    """Row ``row`` of ``pruned``, group by group: its four weights, the two values kept and their indices."""
    values, indices = packed.values[row].tolist(), packed.indices[row].tolist()
    weights = pruned[row].tolist()
    rows = [{"group": g, "weights": "  ".join(f"{v:5.2f}" for v in weights[GROUP * g:GROUP * (g + 1)]),
             "values": "  ".join(f"{v:5.2f}" for v in values[KEPT * g:KEPT * (g + 1)]),
             "indices": " ".join(str(i) for i in indices[KEPT * g:KEPT * (g + 1)])}
            for g in range(len(weights) // GROUP)]
    return table(rows, [Column("group"), Column("weights", "pruned row: the group's 4 weights"),
                        Column("values", "compressed: values kept"), Column("indices", "their positions 0-3")],
                 caption=f"row {row} of the pruned matrix, and its compressed form")


def storage_table(seed: int = 0) -> Table:
    """:func:`.patterns.storage_rows` per format, with the share counted on a real 64 x 256 matrix compressed in that
    format where torch has the dtype; raises if a count differs from the formula."""
    generator = torch.Generator().manual_seed(seed)
    counted_dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8}
    rows = []
    for r in storage_rows():
        counted = None
        if r["format"] in counted_dtypes:  # values plus packed metadata
            matrix = prune_2_4(8 * torch.randn(64, 256, generator=generator)).to(counted_dtypes[r["format"]])
            c = compress(matrix)
            counted = c.nbytes / c.dense_nbytes
            if counted != r["fraction_of_dense"]:
                raise AssertionError(f"{r['format']}: {c.nbytes} bytes counted, the formula says "
                                     f"{r['fraction_of_dense']}")
        rows.append({**r, "counted": counted})
    bits = {"unit": "bits", "format": "d"}
    return table(rows, [Column("format"), Column("value_bits", "a value", **bits),
                        Column("dense_bits", "a dense group", **bits), Column("value_bits_kept", "kept values", **bits),
                        Column("metadata_bits", "metadata", **bits),
                        Column("metadata_overhead", "metadata overhead", format=".1%"),
                        Column("fraction_of_dense", "compressed / dense", format=".4f"),
                        Column("counted", "counted on a 64 x 256 matrix", format=".4f")])


def peaks_table(names: Sequence[str], precision: str = "float16") -> Table:
    """:func:`.speedup.peak_rows` of ``names``: dense and 2:4 sparse tensor-core peaks, and where they come from."""
    rows = [{**r, "from": r["formula"] or r["reason"]} for r in peak_rows(names, precision)]
    return table(rows, [Column("gpu", "GPU"), Column("dense_tflops", f"dense {precision}", "TFLOP/s", ",.0f"),
                        Column("sparse_tflops", "2:4 sparse", "TFLOP/s", ",.0f"), Column("from", "from")],
                 caption="the tensor cores' peaks, from gpulab.core.specs; sparse rates counted in the dense "
                         "product's FLOP")


def pruning_table(summary: Sequence[dict]) -> Table:
    """:func:`.pruning.summarize_pruning`'s rows: test accuracy over the seeds, zeros, squared norm kept, and the gap
    to the dense network (marked where it stands out from the noise)."""
    rows = [{**s, "gap": None if s["method"] == DENSE or "gap_to_dense" not in s else
             f"{100 * s['gap_to_dense']:+.2f}" + (" *" if s["within_noise"] is False else "")} for s in summary]
    points = {"unit": "%", "format": lambda a: f"{100 * a:.2f}"}
    return table(rows, [Column("method"), Column("stage"), Column("accuracy_mean", "accuracy, mean", **points),
                        Column("accuracy_sd", "sd", **points), Column("accuracy_min", "lowest", **points),
                        Column("accuracy_max", "highest", **points), Column("zeros", "zero weights", format=".0%"),
                        Column("kept_norm", "squared norm kept", format=".1%"),
                        Column("gap", "against dense", "points")],
                 caption="test accuracy over the seeds. Against dense: the mean difference from the dense network of "
                         "the same seed (after pruning: as trained; after fine-tuning: trained as many epochs more); "
                         "* marks a gap beyond twice its standard error")


def pruning_statements(summary: Sequence[dict]) -> list[str]:
    """Per pruning method: the norm it keeps and its gap to the dense network after pruning and after fine-tuning,
    judged against the noise; then whether the fall follows the norm kept, and which methods come back."""
    judge = {True: "within the noise", False: "beyond the noise", None: "one seed: no estimate of the noise"}
    by_stage = {(s["method"], s["stage"]): s for s in summary}
    said = []
    for method in PRUNING_METHODS:
        pruned, tuned = by_stage[method, "pruned"], by_stage[method, "fine-tuned"]
        said.append(f"{method}: keeps {pruned['kept_norm']:.0%} of the weights' squared norm; pruning moves the "
                    f"accuracy {100 * pruned['gap_to_dense']:+.1f} points ({judge[pruned['within_noise']]}); after "
                    f"fine-tuning it is {100 * tuned['gap_to_dense']:+.1f} points from the dense network "
                    f"({judge[tuned['within_noise']]}).")
    by_norm = sorted(PRUNING_METHODS, key=lambda m: by_stage[m, "pruned"]["kept_norm"])
    falls = [by_stage[m, "pruned"]["gap_to_dense"] for m in by_norm]
    back = {w: [m for m in PRUNING_METHODS if by_stage[m, "fine-tuned"]["within_noise"] is w] for w in (True, False)}
    said.append(f"From the least norm kept to the most ({', '.join(by_norm)}), the fall right after pruning "
                f"{'shrinks' if falls == sorted(falls) else 'does not shrink'} in step. After fine-tuning, within the "
                f"noise of the dense network: {', '.join(back[True]) or 'none'}; still below it: "
                f"{', '.join(back[False]) or 'none'}.")
    return said


def constraints_table() -> Table:
    """:func:`.speedup.semi_structured_constraints` of the installed PyTorch."""
    return table(semi_structured_constraints(),
                 [Column("backend"), Column("dtype"), Column("sparse_rows", "sparse matrix: rows, a multiple of"),
                  Column("sparse_columns", "columns"), Column("dense_rows", "dense operand: rows"),
                  Column("dense_columns", "columns")],
                 caption=f"PyTorch {torch.__version__}: the multiples each 2:4 backend requires")


def orientations_table(runs: Sequence[Recording]) -> Table:
    """Per run, backend and expression of :func:`.speedup.orientations`: whether it ran correctly, its error and the
    layout of its output, or torch's reason for refusing it."""
    rows = []
    for run in runs:
        for r in run.rows:
            ok = r["status"] == "ok"
            layout = None if not ok else "contiguous" if r["output_contiguous"] else "a transposed view"
            rows.append({"gpu": run.short_label, "backend": r["backend"], "expression": r.get("expression"),
                         "status": r["status"], "relative_error": r.get("relative_error") if ok else None,
                         "output": f"{' x '.join(map(str, r['output_shape']))}, {layout}" if ok else None})
    return table(rows, [Column("gpu", "GPU"), Column("backend"), Column("expression"), Column("status", "result"),
                        Column("relative_error", "relative error", format=".1e"), Column("output")],
                 caption="Ws: a compressed n x n weight; X: tokens x n inputs" + "".join(
                     f"; {run.short_label}: n = {run.params['n']:,}, {run.params['tokens']:,} tokens" for run in runs))


def orientation_statements(runs: Sequence[Recording]) -> list[str]:
    """Per run: which backends run the layer's own product, F.linear(X, Ws), and which refuse it."""
    said = []
    for run in runs:
        layer = {r["backend"]: r["status"] for r in run.rows if r.get("expression") == "F.linear(X, Ws)"}
        if layer:
            ran = [b for b, status in layer.items() if status == "ok"]
            refused = [f"{b} refuses it" for b, status in layer.items() if status != "ok"]
            said.append(f"{run.label}: the layer's product, F.linear(X, Ws), runs correctly through "
                        f"{' and '.join(ran) or 'no backend'}" + "".join(f"; {text}" for text in refused) + ".")
    return said


def speedup_table(runs: Sequence[Recording]) -> Table:
    """Per run, dtype, weight size and tokens: the dense product's time and rate, then each sparse backend's time,
    rate and speed-up (or why it did not run)."""
    rows, backends = [], []
    for run in runs:
        cell = {(r["dtype"], r["n"], r["tokens"], r["backend"]): r for r in run.rows if "n" in r}
        backends += [b for b in BACKENDS if b not in backends and any(k[3] == b for k in cell)]
        for dtype, n, tokens in dict.fromkeys(k[:3] for k in cell):
            row = {"gpu": run.short_label, "dtype": dtype, "n": n, "tokens": tokens}
            for backend in (DENSE_BACKEND, *BACKENDS):
                r = cell.get((dtype, n, tokens, backend))
                if r is not None and r["status"] == "ok":
                    row |= {f"{backend} s": r["seconds"], f"{backend} tflops": r["tflops"],
                            f"{backend} speedup": r.get("speedup")}
                elif r is not None:
                    row[f"{backend} s"] = r["status"].split(":")[0]
            rows.append(row)
    ms = {"unit": "ms", "format": lambda s: s if isinstance(s, str) else f"{1e3 * s:,.3f}"}
    columns = [Column("gpu", "GPU"), Column("dtype"), Column("n", "weight order n"), Column("tokens")]
    for backend in (DENSE_BACKEND, *backends):
        columns += [Column(f"{backend} s", backend, **ms), Column(f"{backend} tflops", backend, "TFLOP/s", ",.1f")]
        if backend != DENSE_BACKEND:
            columns.append(Column(f"{backend} speedup", f"{backend} over dense", format=".2f"))
    return table(rows, columns, caption="rates count the dense product's FLOP, 2 x tokens x n^2")


def speedup_refusals(runs: Sequence[Recording]) -> list[str]:
    """Per run: a sentence for each dtype or backend that ran nothing, with torch's reasons."""
    said = []
    for run in runs:
        for r in run.rows:
            if r["status"] != "ok" and "n" not in r:
                said.append(f"{run.label}, {r['dtype']}, {r['backend']}: {r['status']}.")
        for backend in BACKENDS:
            tried = [r for r in run.rows if r["backend"] == backend and "n" in r]
            if tried and not any(r["status"] == "ok" for r in tried):
                reasons = "; ".join(dict.fromkeys(r["status"] for r in tried))
                said.append(f"{run.label}, {backend}: none of its {len(tried)} products ran ({reasons}).")
    return said


def speedup_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    drawn = [run for run in runs if any(r["status"] == "ok" and "speedup" in r for r in run.rows)]
    return plots.by_gpu(drawn, lambda run: speedup_figure(run.rows, title=f"2:4 sparse F.linear against dense: "
                                                                           f"{run.label}"))


def speedup_summary(runs: Sequence[Recording]) -> list[str]:
    """Per run, its label and then a Markdown list: :func:`.speedup.speedup_statements`, the floor of a sparse call
    against the quickest dense product, where sparse won and by how much, and how many of its wins beat the GPU's
    dense peak."""
    said = []
    for run in runs:
        gpu = specs.find(run.device_name) if run.on_gpu else None
        lines = speedup_statements(run.rows, gpu)
        if not lines:
            said.append(f"{run.label}: no sparse product ran, so there is nothing to compare.")
            continue
        ok = [r for r in run.rows if r["status"] == "ok"]
        sparse = [r for r in ok if "speedup" in r]
        dense = {(r["dtype"], r["n"], r["tokens"]): r for r in ok if r["backend"] == DENSE_BACKEND}
        dense_ms = {id(r): 1e3 * dense[r["dtype"], r["n"], r["tokens"]]["seconds"] for r in sparse}
        fastest, worst = min(sparse, key=lambda r: r["seconds"]), min(sparse, key=lambda r: r["speedup"])
        lines.append(f"no sparse product took less than {1e3 * fastest['seconds']:.2f} ms ({fastest['backend']}, "
                     f"n = {fastest['n']:,}, {fastest['tokens']:,} tokens), while the quickest dense one took "
                     f"{1e6 * min(r['seconds'] for r in dense.values()):.1f} µs; at worst the sparse layer was "
                     f"{1 / worst['speedup']:.0f}x slower ({worst['dtype']}, n = {worst['n']:,}, "
                     f"{worst['tokens']:,} tokens)")
        won = [r for r in sparse if r["speedup"] > 1]
        if won:
            wins = sorted(r["speedup"] for r in won)
            low = min(dense_ms[id(r)] for r in won)  # the quickest dense product that sparse beat
            high = max([dense_ms[id(r)] for r in sparse if r["speedup"] <= 1], default=0)  # the slowest it lost to
            largest = max(r["n"] * r["n"] * r["tokens"] for r in sparse)
            big = [r for r in sparse if r["n"] * r["n"] * r["tokens"] == largest]
            lines.append(f"sparse won {len(won)} of {len(sparse)} products: every one whose dense product took more "
                         f"than {max(low, high):.2f} ms, none under {low:.2f} ms; where it won, {wins[0]:.2f}x to "
                         f"{wins[-1]:.2f}x (median {wins[len(wins) // 2]:.2f}x)"
                         f"{', never 2x' if wins[-1] < 2 else ''}; the largest product (n = {big[0]['n']:,}, "
                         f"{big[0]['tokens']:,} tokens): "
                         + ", ".join(f"{r['speedup']:.2f}x in {r['dtype']} ({r['backend']})" for r in big))
            if gpu:
                above = [r for r in won if r["tflops"] > specs.peak(gpu, r["dtype"], specs.TENSOR_CORES).tflops]
                lines.append(f"{len(above)} of the {len(won)} products sparse won ran faster than the {gpu.name}'s "
                             f"dense peak ({specs.peak(gpu, 'float16', specs.TENSOR_CORES).tflops:,.0f} TFLOP/s in "
                             "float16), a rate no dense product can reach")
        said += [f"{run.label}:", *(f"- {line}" for line in lines)]
    return said


def rate_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    """:func:`rate_figure` of each run's largest weight, with its GPU's dense and 2:4 sparse peaks (labelled with
    every dtype drawn that shares float16's)."""
    def figure(run: Recording) -> go.Figure:
        ok = [r for r in run.rows if r["status"] == "ok"]
        largest = max(r["n"] for r in ok)
        gpu = specs.find(run.device_name) if run.on_gpu else None
        peaks = {}
        if gpu is not None:
            dense_peak = specs.peak(gpu, "float16", specs.TENSOR_CORES).tflops
            shared = " and ".join(d for d in dict.fromkeys(r["dtype"] for r in ok)
                                  if specs.peak(gpu, d, specs.TENSOR_CORES).tflops == dense_peak)
            peaks = {f"{gpu.name} dense peak ({shared})": dense_peak,
                     f"{gpu.name} 2:4 sparse peak ({shared})": sparse_peak(gpu, "float16").tflops}
        return rate_figure(run.rows, largest, peaks=peaks,
                           title=f"F.linear with a {largest:,} x {largest:,} weight: {run.label}")
    return plots.by_gpu([run for run in runs if any(r["status"] == "ok" for r in run.rows)], figure)
