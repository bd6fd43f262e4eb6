"""Chapter 14's figures and tables: batched GEMM methods against a loop, and LU on the device and the host, one
function per thing the page shows, drawn from runs of :mod:`.batched` (each recorded GPU behind a menu, a GPU column
in the tables)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpulab.ch09_gemm_on_the_gpu import gemm
from gpulab.ch14_batched_linear_algebra import batched
from gpulab.ch14_batched_linear_algebra.batched import METHOD_LABELS
from gpulab.core import flops, plots, roofline, specs
from gpulab.core.precision import FORMATS
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, table

DATASHEET_GPU = "H200 SXM 141GB"  # the datasheet the page reads when no recorded GPU is in the table of specs


def _gpus(runs: Sequence[Recording]) -> list[specs.GPU]:
    """The datasheet row of each GPU of ``runs`` (the H200's when none is known)."""
    found = {g.name: g for g in (specs.find(run.device_name) for run in runs) if g}
    return list(found.values()) or [specs.gpu(DATASHEET_GPU)]


def _ratio(value: float) -> str:
    return f"{value:,.{0 if value >= 10 else 1}f}x"


def small_problem_table(runs: Sequence[Recording], sizes: Sequence[int] = (8, 64, 256, 1024)) -> Table:
    """For each GPU of ``runs`` (its datasheet) and order n: the FLOP of one n x n product, its time at the float32
    peak, and the thread blocks it makes with the tiles of chapter 9's best kernel, per SM."""
    tile_m, tile_n = gemm.TUNABLE["BM"], gemm.TUNABLE["BN"]
    rows = []
    for gpu in _gpus(runs):
        peak = specs.peak_tflops(gpu, "float32") * 1e12
        for n in sizes:
            blocks = math.ceil(n / tile_m) * math.ceil(n / tile_n)
            rows.append({"gpu": f"{gpu.name} ({gpu.sms} SMs, {peak / 1e12:.1f} TFLOP/s)", "n": n, "flop": 2 * n**3,
                         "ns": 2 * n**3 / peak * 1e9, "blocks": blocks, "per_sm": blocks / gpu.sms})
    return table(rows, [Column("gpu", "GPU (float32 peak)"), Column("n", "order n"), Column("flop", "work", "FLOP"),
                        Column("ns", "at peak", "ns", ",.2f"), Column("blocks", "thread blocks"),
                        Column("per_sm", "blocks per SM", format=".2f")],
                 caption=f"one product of two n x n float32 matrices, in tiles of {tile_m} x {tile_n}")


def speedup_table(runs: Sequence[Recording], *, dtype: str | None = None, baseline: str = "loop") -> Table:
    """Per run, dtype (``dtype`` only, if given) and n, at the run's largest batch: each method's time per call, the
    baseline's time per problem, and how many times faster than the baseline each other method is. For the runs of
    :func:`.batched.gemm_sweep` and :func:`.batched.small_lu_sweep`."""
    rows, methods = [], []
    for run in runs:
        good = [r for r in ok_rows(run.rows) if dtype is None or r["dtype"] == dtype]
        if not good:
            continue
        batch = max(r["batch"] for r in good)
        methods += [m for m in dict.fromkeys(r["method"] for r in good) if m not in methods]
        cell = {(r["dtype"], r["n"], r["method"]): r for r in good if r["batch"] == batch}
        for d, n in dict.fromkeys((d, n) for d, n, _ in cell):
            base = cell.get((d, n, baseline))
            row = {"gpu": run.short_label, "case": f"{d}, batch of {batch:,}", "n": n,
                   "per_problem": base["us_per_problem"] if base else None}
            for m in methods:
                if (d, n, m) in cell:
                    row[m] = cell[d, n, m]["seconds"]
                    if base and m != baseline:
                        row[f"{m} speed-up"] = base["seconds"] / cell[d, n, m]["seconds"]
            rows.append(row)
    ms = {"unit": "ms", "format": lambda s: f"{1e3 * s:,.4f}"}
    labels = batched.LU_METHOD_LABELS if set(methods) <= set(batched.LU_METHODS) else METHOD_LABELS
    return table(rows, [Column("gpu", "GPU"), Column("case", "format, batch"), Column("n", "order n"),
                        *(Column(m, labels.get(m, m), **ms) for m in methods),
                        Column("per_problem", f"{baseline}, per problem", "µs", ",.2f"),
                        *(Column(f"{m} speed-up", f"{m} over the {baseline}", format=_ratio)
                          for m in methods if m != baseline)])


def gemm_target(runs: Sequence[Recording], n: int, batch: int, factor: float) -> list[str]:
    """Per run: the formats it could not run, and whether torch.bmm beats the loop by ``factor`` at (n, batch) in
    float32; on a GPU, the ratio in every format at (n, batch) and the smallest at n over every batch."""
    said = []
    for run in runs:
        lines = [f"{row['dtype']} was not run: {row['status'].removeprefix('not run: ')}." for row in run.rows
                 if row["status"] != "ok" and "method" not in row]
        verdict = batched.gemm_target(run.rows, n, batch, "float32", factor)
        if verdict["ratio"] is None:
            said.append(f"{run.label}: the target cannot be judged from this run: {verdict['reason']}.")
            continue
        outcome = "met" if verdict["met"] else "not met"
        lines.append(f"torch.bmm of {batch} products of order {n} in float32 is {verdict['ratio']:.1f} times "
                     f"faster than the loop. The book's target (at least {factor}x on a GPU) is {outcome}.")
        at_target = {(r["dtype"], r["batch"]): r["speedup"] for r in batched.speedups(run.rows)
                     if r["method"] == "bmm" and r["n"] == n}
        if run.on_gpu and len(at_target) > 1:
            low = min(at_target, key=at_target.get)
            lines.append(f"bmm over the loop at n = {n}, batch of {batch}: "
                         + ", ".join(f"{d} {s:.0f}x" for (d, b), s in at_target.items() if b == batch)
                         + f"; the smallest ratio at n = {n} over every format and batch count: {at_target[low]:.0f}x "
                         f"({low[0]}, batch of {low[1]}).")
        said.append(f"{run.label}: " + " ".join(lines))
    return said


def gemm_statements(runs: Sequence[Recording], n: int) -> list[str]:
    """Per run, in float32 at its largest batch: the loop's time per product at the smallest and largest order,
    bmm's speed-up at both, bmm's rate at order ``n`` per batch, the fastest rate against the datasheet peak, and the
    one tall GEMM against bmm (the range over n per format and batch)."""
    said = []
    for run in runs:
        ok = ok_rows(run.rows)
        pick = {(r["dtype"], r["method"], r["batch"], r["n"]): r for r in ok}
        batches = sorted({r["batch"] for r in ok})
        largest = batches[-1]
        sizes = sorted(m for d, meth, b, m in pick if (d, meth, b) == ("float32", "loop", largest)
                       and all(("float32", other, b, m) in pick for other in ("bmm", "one_gemm")))
        if not sizes:
            continue
        small, big = sizes[0], sizes[-1]
        loop = {m: pick["float32", "loop", largest, m] for m in sizes}
        gain = {m: loop[m]["seconds"] / pick["float32", "bmm", largest, m]["seconds"] for m in sizes}
        lines = [f"{run.label}, float32, batch of {largest:,}: the loop takes {loop[small]['us_per_problem']:.1f} µs "
                 f"per product at n = {small} and {loop[big]['us_per_problem']:.1f} µs at n = {big}, whose arithmetic "
                 f"is {(big / small) ** 3:,.0f} times more; bmm's speed-up over the loop goes from "
                 f"{_ratio(gain[small])} at n = {small} to {_ratio(gain[big])} at n = {big}."]
        if all(("float32", "bmm", b, n) in pick for b in batches):
            lines.append(f"bmm at n = {n}: " + ", ".join(
                f"{pick['float32', 'bmm', b, n]['gflops']:,.0f} GFLOP/s with a batch of {b:,}" for b in batches) + ".")
        gpu = specs.find(run.device_name) if run.on_gpu else None
        if gpu is not None:
            best = max((r for r in ok if r["dtype"] == "float32" and r["method"] != "loop"), key=lambda r: r["gflops"])
            lines.append(f"The fastest float32 rate, {best['method']} at n = {best['n']} with a batch of "
                         f"{best['batch']:,}: {best['gflops']:,.0f} GFLOP/s = "
                         f"{best['gflops'] / 1e3 / specs.peak_tflops(gpu, 'float32'):.0%} of the {gpu.name}'s float32 "
                         "peak.")
        over = {m: pick["float32", "bmm", largest, m]["seconds"] / pick["float32", "one_gemm", largest, m]["seconds"]
                for m in sizes}
        lines.append(f"One tall GEMM over bmm (bmm's time / the tall GEMM's), batch of {largest:,}: "
                     + ", ".join(f"n = {m}: {ratio:.2f}" for m, ratio in over.items()) + ".")
        for dtype in dict.fromkeys(d for d, *_ in pick):
            ranges = []
            for b in batches:
                ratio = [r["seconds"] / pick[dtype, "one_gemm", b, m]["seconds"] for (d, meth, bb, m), r in pick.items()
                         if (d, meth, bb) == (dtype, "bmm", b) and (dtype, "one_gemm", b, m) in pick]
                ranges += [f"batch of {b:,}: {min(ratio):.2f} to {max(ratio):.2f}"] if ratio else []
            lines.append(f"The same ratio in {dtype}, over n: " + "; ".join(ranges) + ".")
        said.append(" ".join(lines))
    return said


def methods_figure(rows: Iterable[dict], *, title: str, labels: Mapping[str, str] | None = None) -> go.Figure:
    """GFLOP/s (top) and time per call (bottom) against n, one line per method, one column per batch count; a menu
    picks the dtype when there are several. For the rows of :func:`.batched.gemm_sweep` and
    :func:`.batched.small_lu_sweep`; ``labels`` names the methods in the legend (default :data:`METHOD_LABELS`;
    :data:`.batched.LU_METHOD_LABELS` for LU).

    Every dtype's lines are in the figure already, so the menu works in the static book with no kernel.
    """
    rows = ok_rows(rows)
    if not rows:
        raise ValueError("rows: no measured rows to draw")
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    return _methods([("", title, rows)], labels, title if len(dtypes) > 1 else f"{title}, {dtypes[0]}")


def methods_by_gpu(runs: Sequence[Recording], subject: str, labels: Mapping[str, str] | None = None) -> go.Figure:
    """:func:`methods_figure` of each run in one figure: the menu picks the GPU and the dtype."""
    groups = [(run.short_label, f"{subject}: {run.label}", ok_rows(run.rows)) for run in runs]
    groups = [g for g in groups if g[2]]
    if not groups:
        return go.Figure(layout=dict(title="No recording yet"))
    return _methods(groups, labels)


def _methods(groups: Sequence[tuple[str, str, list[dict]]], labels: Mapping[str, str] | None,
             title: str | None = None) -> go.Figure:
    """The figure of :func:`methods_figure` for ``groups`` of (menu label, title, rows): one menu entry per group and
    dtype (no menu when there is one entry), each showing its own lines and title."""
    batches = sorted({r["batch"] for _, _, rows in groups for r in rows})
    fig = make_subplots(rows=2, cols=len(batches), shared_xaxes=True, vertical_spacing=0.08,
                        horizontal_spacing=0.05, subplot_titles=[f"batch of {b:,}" for b in batches])
    entries, owners = [], []
    for name, heading, rows in groups:
        methods = list(dict.fromkeys(r["method"] for r in rows))
        for dtype in dict.fromkeys(r["dtype"] for r in rows):
            entries.append((", ".join(filter(None, (name, dtype))), f"{heading}, {dtype}"))
            for col, batch in enumerate(batches, start=1):
                for i, method in enumerate(methods):
                    wanted = (dtype, batch, method)
                    series = sorted((r for r in rows if (r["dtype"], r["batch"], r["method"]) == wanted),
                                    key=lambda r: r["n"])
                    for row, key, scale in ((1, "gflops", 1.0), (2, "seconds", 1e3)) if series else ():
                        fig.add_trace(go.Scatter(
                            x=[r["n"] for r in series], y=[r[key] * scale for r in series], mode="lines+markers",
                            name=(labels or METHOD_LABELS).get(method, method), legendgroup=method,
                            showlegend=(col == 1 and row == 1), visible=len(entries) == 1,
                            line=dict(color=plots.PALETTE[i % len(plots.PALETTE)]),
                            marker=dict(symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)], size=8),
                            hovertext=[plots.hover_text(r, ("method", "n", "batch", "dtype", "gflops", "seconds",
                                                            "us_per_problem")) for r in series],
                            hoverinfo="text"), row=row, col=col)
                        owners.append(len(entries) - 1)
    fig.update_xaxes(type="log", dtick=0.30103)  # a tick at every power of two (log10 2)
    fig.update_yaxes(type="log")
    for col in range(1, len(batches) + 1):
        fig.update_xaxes(title_text="matrix order n", row=2, col=col)
    fig.update_yaxes(title_text="GFLOP/s", row=1, col=1)
    fig.update_yaxes(title_text="time per call (ms)", row=2, col=1)
    menus = []
    if len(entries) > 1:
        buttons = [dict(label=label, method="update", args=[{"visible": [o == i for o in owners]},
                                                            {"title.text": plots.wrapped_title(heading)}])
                   for i, (label, heading) in enumerate(entries)]
        menus = [dict(buttons=buttons, x=0.0, y=1.16, xanchor="left", direction="down")]
    fig.update_layout(title=title or entries[0][1], updatemenus=menus, height=640,
                      legend=dict(orientation="h", y=-0.14), margin=dict(t=110))
    return fig


def permutation_table(A: torch.Tensor, LU: torch.Tensor, pivots: torch.Tensor) -> Table:
    """The Frobenius norms that tell the two directions of the permutation apart, for torch's P, L, U of ``A``."""
    P, L, U = torch.lu_unpack(LU, pivots)
    rows = [{"what": f"||{name}||_F", "value": torch.linalg.matrix_norm(value).item()}
            for name, value in (("A - P L U", A - P @ L @ U), ("P^T A - L U", P.mT @ A - L @ U),
                                ("P A - L U", P @ A - L @ U))]
    rows.append({"what": "batched.lu_backward_error", "value": batched.lu_backward_error(A, LU, pivots).item()})
    order = " ".join(str(k) for k in P.argmax(dim=-2).tolist())
    return table(rows, [Column("what", "quantity"), Column("value", format=".3g")],
                 caption=f"LAPACK's pivots (1-based): {pivots.tolist()}; torch's P takes row i of L U from row "
                         f"[{order}][i] of A")


def lu_table(runs: Sequence[Recording]) -> Table:
    """The rows of :func:`.batched.lu_sweep` as MAGMA's tester prints them: per run, dtype and n, GFLOP/s and time on
    the CPU and on the GPU, the backward error of each and whether every one passed."""
    rows = []
    for run in runs:
        for dtype in dict.fromkeys(r["dtype"] for r in run.rows):
            cell = {(r["n"], r["device"]): r for r in run.rows if r["dtype"] == dtype}
            for n in sorted({n for n, _ in cell}):
                row, verdicts = {"gpu": run.short_label, "dtype": dtype, "n": n}, []
                for device in ("cpu", "cuda"):
                    r = cell.get((n, device))
                    if r is not None and r["status"] == "ok":
                        row |= {f"{device} rate": r["gflops"], f"{device} time": r["seconds"],
                                f"{device} error": r["backward_error"]}
                        verdicts.append(r["backward_error"] <= r["tolerance"])
                    elif r is not None:
                        row[f"{device} rate"] = r["status"].split(":")[0]
                row["check"] = ("ok" if all(verdicts) else "failed") if verdicts else None
                rows.append(row)
    processors = "; ".join(dict.fromkeys(f"{run.short_label}'s host: {r['processor'].removeprefix('CPU, ')}"
                                         for run in runs for r in ok_rows(run.rows) if r["device"] == "cpu"))
    ms = {"unit": "ms", "format": lambda s: f"{1e3 * s:,.2f}"}
    rate = {"unit": "GFLOP/s", "format": lambda v: v if isinstance(v, str) else f"{v:,.1f}"}
    return table(rows, [Column("gpu", "GPU"), Column("dtype"), Column("n", "order n"),
                        Column("cpu rate", "CPU", **rate), Column("cpu time", "CPU", **ms),
                        Column("cuda rate", "GPU", **rate), Column("cuda time", "GPU", **ms),
                        Column("cpu error", "|PA-LU|/(n|A|), CPU", format=".2e"),
                        Column("cuda error", "|PA-LU|/(n|A|), GPU", format=".2e"), Column("check")],
                 caption=f"getrf (torch.linalg.lu_factor_ex); {processors}")


def lu_figure(rows: Iterable[dict], *, title: str) -> go.Figure:
    """getrf GFLOP/s against n: one line per processor (colour) and dtype (dash), from :func:`.batched.lu_sweep`'s
    rows."""
    rows = ok_rows(rows)
    if not rows:
        raise ValueError("rows: no measured rows to draw")
    fig = go.Figure()
    for i, device in enumerate(d for d in ("cpu", "cuda") if any(r["device"] == d for r in rows)):
        for j, dtype in enumerate(dict.fromkeys(r["dtype"] for r in rows)):
            series = sorted((r for r in rows if r["device"] == device and r["dtype"] == dtype), key=lambda r: r["n"])
            if not series:
                continue
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in series], y=[r["gflops"] for r in series], mode="lines+markers",
                name=f"{'GPU' if device == 'cuda' else 'CPU'} {dtype}",
                line=dict(color=plots.PALETTE[i], dash="solid" if j == 0 else "dash"),
                marker=dict(symbol=plots.SYMBOLS[j % len(plots.SYMBOLS)], size=8),
                hovertext=[plots.hover_text(r, ("processor", "n", "dtype", "gflops", "seconds", "backward_error"))
                           for r in series], hoverinfo="text"))
    fig.update_layout(title=title, xaxis_title="matrix order n", yaxis_title="GFLOP/s")
    fig.update_xaxes(type="log", tickvals=sorted({r["n"] for r in rows}), tickformat=",")
    fig.update_yaxes(type="log")
    return fig


def lu_by_gpu(runs: Sequence[Recording]) -> go.Figure:
    return plots.by_gpu(runs, lambda run: lu_figure(run.rows, title=f"LU factorisation (getrf): {run.label}"))


def lu_statements(runs: Sequence[Recording]) -> list[str]:
    """Per run and dtype: the best rate on each processor (against the GPU's datasheet peak), where the GPU wins,
    the backward errors in units of u; and float32 over float64 on each processor."""
    said = []
    for run in runs:
        gpu = specs.find(run.device_name) if run.on_gpu else None
        ok = ok_rows(run.rows)
        cpu_name = next((r["processor"] for r in ok if r["device"] == "cpu"), None)
        lines = [f"{run.label}" + (f"; CPU = {cpu_name}" if cpu_name else "") + "."]
        for c in batched.lu_comparison(ok):
            dtype, u = c["dtype"], FORMATS[c["dtype"]].unit_roundoff
            rate = {(r["device"], r["n"]): r["gflops"] for r in ok if r["dtype"] == dtype}
            line = f"{dtype}: CPU best {c['cpu_best']['gflops']:,.0f} GFLOP/s at n = {c['cpu_best']['n']:,}"
            if c["gpu_best"] is not None:
                best = c["gpu_best"]
                line += f"; GPU best {best['gflops']:,.0f} GFLOP/s at n = {best['n']:,}"
                if gpu is not None:
                    peak = specs.peak(gpu, dtype)
                    line += (f" = {best['gflops'] / 1e3 / peak.tflops:.0%} of its {peak.tflops:.1f} TFLOP/s peak "
                             f"({peak.unit})")
                below = [n for d, n in rate if d == "cuda" and n < best["n"]]
                if below:
                    line += f", {best['gflops'] / rate['cuda', max(below)] - 1:+.0%} over n = {max(below):,}"
            common = sorted(n for d, n in rate if d == "cuda" and ("cpu", n) in rate)
            if common:
                wins = [n for n in common if rate["cuda", n] > rate["cpu", n]]
                ratio = {n: rate["cuda", n] / rate["cpu", n] for n in common}
                if wins == common:
                    line += (f"; the GPU was faster at every order measured: {ratio[common[0]]:.2f}x the CPU at the "
                             f"smallest, n = {common[0]:,}, {ratio[common[-1]]:.1f}x at n = {common[-1]:,}")
                elif wins:
                    line += (f"; the GPU first wins at n = {wins[0]:,}, {ratio[common[-1]]:.1f}x the CPU at "
                             f"n = {common[-1]:,}")
                else:
                    line += "; the GPU is never faster than the CPU here"
            for device in ("cpu", "cuda"):
                errors = [r["backward_error"] / u for r in ok if r["dtype"] == dtype and r["device"] == device]
                if errors:
                    line += (f"; backward errors on the {'GPU' if device == 'cuda' else 'CPU'}: {min(errors):.3f} u to "
                             f"{max(errors):.3f} u")
            lines.append(line + f" (u = {u:.2g}; MAGMA's test: below {batched.TOLERANCE_FACTOR} u).")
        gflops = {(r["device"], r["n"], r["dtype"]): r["gflops"] for r in ok}
        for device in ("cpu", "cuda"):
            both = [n for d, n, t in gflops if (d, t) == (device, "float32") and (device, n, "float64") in gflops]
            if both:
                n = max(both)
                lines.append(f"float32 over float64 on the {'GPU' if device == 'cuda' else 'CPU'} at n = {n:,}: "
                             f"{gflops[device, n, 'float32'] / gflops[device, n, 'float64']:.2f}x.")
        said.append(" ".join(lines))
    return said


def lu_intensity_table(runs: Sequence[Recording], sizes: Sequence[int] = (8, 16, 32, 64, 128, 256)) -> Table:
    """Per GPU of ``runs`` (its datasheet): the float64 ridge point, and for each order n the intensity of one small
    factorisation (the matrix read once, its factors written once) against it."""
    rows = []
    for gpu in _gpus(runs):
        ridge = specs.peak_tflops(gpu, "float64") * 1e12 / (gpu.bandwidth_gb_s * 1e9)
        for n in sizes:
            intensity = batched.lu_flops(n) / (2 * n * n * 8)
            rows.append({"gpu": f"{gpu.name} (ridge {ridge:.1f} FLOP/byte)", "n": n, "flop": batched.lu_flops(n),
                         "bytes": 2 * n * n * 8, "intensity": intensity,
                         "side": "below" if intensity < ridge else "above"})
    return table(rows, [Column("gpu", "GPU (float64 ridge point)"), Column("n", "order n"),
                        Column("flop", "work", "FLOP", ",.0f"), Column("bytes", "traffic", "bytes", ","),
                        Column("intensity", "intensity", "FLOP/byte", ".2f"), Column("side", "the ridge")],
                 caption="one float64 LU factorisation: the matrix read once, its factors written once")


def small_lu_statements(runs: Sequence[Recording], large: Sequence[Recording]) -> list[str]:
    """Per run and dtype, at its largest batch: the loop's time per matrix, the batched call's speed-up at the
    smallest and largest order, its rate at the largest order per batch, any order where that rate did not grow, and
    on a GPU the rate against the roofline bound and the large getrf's best (``large``, the same machine's run)."""
    best_large = {(r.device_name, bool(r.provenance.get("recorded")), row["dtype"]): row["gflops"]
                  for r in large for row in sorted(ok_rows(r.rows), key=lambda row: row["gflops"])
                  if row["device"] == "cuda"}
    said = []
    for run in runs:
        gpu = specs.find(run.device_name) if run.on_gpu else None
        ok = ok_rows(run.rows)
        lines = [f"{run.label}:"]
        for dtype in dict.fromkeys(r["dtype"] for r in ok):
            pick = {(r["method"], r["batch"], r["n"]): r for r in ok if r["dtype"] == dtype}
            batches = sorted({b for _, b, _ in pick})
            batch = batches[-1]
            sizes = sorted(n for m, b, n in pick if (m, b) == ("batched", batch) and ("loop", b, n) in pick)
            small, big = sizes[0], sizes[-1]
            gain = {n: pick["loop", batch, n]["seconds"] / pick["batched", batch, n]["seconds"] for n in sizes}
            lines.append(f"{dtype}, batch of {batch:,}: the loop takes "
                         f"{pick['loop', batch, small]['us_per_problem']:.0f} µs per matrix at n = {small} and "
                         f"{pick['loop', batch, big]['us_per_problem']:.0f} µs at n = {big}; the batched call is "
                         f"{_ratio(gain[small])} faster at n = {small} and {_ratio(gain[big])} at n = {big}. Its rate "
                         f"at n = {big}: " + ", ".join(
                             f"{pick['batched', b, big]['gflops']:,.0f} GFLOP/s with a batch of {b:,}"
                             for b in batches if ("batched", b, big) in pick) + ".")
            rates = {n: pick["batched", batch, n]["gflops"] for n in sizes}
            for before, n in zip(sizes, sizes[1:], strict=False):
                if rates[n] <= rates[before]:
                    lines.append(f"The batched rate did not grow from n = {before} ({rates[before]:,.0f} GFLOP/s) "
                                 f"to n = {n} ({rates[n]:,.0f} GFLOP/s).")
            if gpu is not None:
                ceilings = roofline.Roofline(gpu.name, gpu.bandwidth_gb_s * 1e9,
                                             {dtype: specs.peak_tflops(gpu, dtype) * 1e12})
                intensity = batched.lu_flops(big) / (2 * big * big * flops.bytes_per_element(dtype))
                bound = ceilings.attainable(intensity, dtype) / 1e9
                line = f"At n = {big}: {rates[big] / bound:.1%} of the roofline bound, {bound:,.0f} GFLOP/s"
                top = best_large.get((run.device_name, bool(run.provenance.get("recorded")), dtype))
                if top:
                    line += f"; {rates[big] / top:.0%} of the large getrf's best rate ({top:,.0f} GFLOP/s)"
                lines.append(line + ".")
        said.append(" ".join(lines))
    return said
