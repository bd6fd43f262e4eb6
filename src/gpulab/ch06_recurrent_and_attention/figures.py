"""Chapter 06's figures and tables: the LSTM cell's checks, the course's worked example against the slides, the
timed LSTM layer, attention's FLOPs and a profiled training step (each recorded GPU behind a menu)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import torch

from gpulab.ch06_recurrent_and_attention import attention, recurrent
from gpulab.core import plots
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, table

FIVE = {"format": ".5f"}


def cell_forms_table(rows: Sequence[dict]) -> Table:
    """:func:`gpulab.ch06_recurrent_and_attention.recurrent.compare_cell_forms`: each form against nn.LSTMCell."""
    return table(rows, [Column("form", "one step computed"), Column("weight", "stacked weight, 4H x (H + D)"),
                        Column("difference", "largest difference from torch.nn.LSTMCell", format=".1e")],
                 caption="float64, fresh random data")


def example_table(example: recurrent.WorkedExample = recurrent.COURSE_EXAMPLE) -> Table:
    """The worked example's weights, a row per gate, with its inputs and labels in the caption."""
    rows = [{"gate": g, "W": str(list(example.W[k])), "U": example.U[k], "b": example.b[k]}
            for k, g in enumerate(recurrent.GATES)]
    x, y = example.inputs, example.labels
    return table(rows, [Column("gate"), Column("W", "W_g (2 inputs)"), Column("U", "U_g"), Column("b", "b_g")],
                 caption=f"inputs x_0 = {list(x[0])}, x_1 = {list(x[1])}; labels y_0 = {y[0]}, y_1 = {y[1]}")


def forward_table(steps: Sequence[dict], slide: dict[str, str] | None = None) -> Table:
    """The forward pass of :func:`gpulab.ch06_recurrent_and_attention.recurrent.forward_trace`, each step's values
    (five decimals) above what the slide prints."""
    slide = slide if slide is not None else dict(recurrent.SLIDE_VALUES)
    names = ("a", "i", "f", "o", "state", "out")
    rows = []
    for s in steps:
        rows.append({"t": s["t"], "source": "ours", **{n: f"{float(s[n]):.5f}" for n in names}})
        rows.append({"t": s["t"], "source": "slide", **{n: slide[f"{n}_{s['t']}"] for n in names}})
    return table(rows, [Column("t", "step t"), Column("source", "from"),
                        *(Column(n, f"{n}_t") for n in names)])


def labels_table(example: recurrent.WorkedExample = recurrent.COURSE_EXAMPLE) -> Table:
    """The first backward numbers with the slide's printed second label and with the one its arithmetic used."""
    slide = dict(recurrent.SLIDE_VALUES)
    keys = ("Delta_1", "delta_state_1", "dW[a,1]")
    rows = []
    for y1 in (recurrent.SLIDE_LABELS[1], example.labels[1]):
        v = recurrent.worked_example_values(example, labels=(example.labels[0], y1))
        rows.append({"label": f"{y1:+.2f}", **{k: f"{v[k]:+.5f}" for k in keys}})
    rows.append({"label": "the slide prints", **{k: slide[k] for k in keys}})
    return table(rows, [Column("label", "y_1"), Column("Delta_1", "Delta_1"),
                        Column("delta_state_1", "delta state_1"), Column("dW[a,1]")])


def slides_table(exact: Sequence[dict], rounded: Sequence[dict]) -> Table:
    """Every number the slides print (:func:`gpulab.ch06_recurrent_and_attention.recurrent.compare_with_slides`):
    the slide, ours in float64 and with the slides' rounding, each difference in units of the last printed digit."""
    rows = [{"quantity": e["quantity"], "slide": e["slide"], "exact": e["computed"], "exact_units": e["units"],
             "rounded": r["computed"], "rounded_units": r["units"],
             "note": "" if e["within_one_unit"] else "rounding on the slide"}
            for e, r in zip(exact, rounded, strict=True)]
    units = {"format": "+.2f"}
    return table(rows, [Column("quantity"), Column("slide"), Column("exact", "float64", format=".6f"),
                        Column("exact_units", "units", **units), Column("note", "more than one unit off"),
                        Column("rounded", "rounded as the slides", **FIVE), Column("rounded_units", "units", **units)])


def slides_summary(exact: Sequence[dict], rounded: Sequence[dict]) -> list[str]:
    """Two sentences: how many numbers float64 gets within one printed unit, and that the slides' rounding gets them
    all (AssertionError otherwise: the slides' arithmetic, rounded as they did, must match)."""
    outside = [e["quantity"] for e in exact if not e["within_one_unit"]]
    if not all(r["within_one_unit"] for r in rounded):
        raise AssertionError("the slides' arithmetic, rounded as they did, must match every printed number")
    return [f"In float64, {len(exact) - len(outside)} of {len(exact)} numbers are within one printed unit; outside: "
            f"{', '.join(outside) or 'none'}.",
            f"With the slides' rounding, all {len(rounded)} are within one printed unit."]


def gradients_table(by_hand: dict, by_autograd: dict) -> Table:
    """The gradients from autograd, a row per gate, with the largest difference from the hand-written backward pass
    in the caption."""
    differences = {name: (by_hand[name] - by_autograd[name]).abs().max().item() for name in ("dW", "dU", "db")}
    rows = [{"gate": g, "dW0": float(by_autograd["dW"][k, 0]), "dW1": float(by_autograd["dW"][k, 1]),
             "dU": float(by_autograd["dU"][k, 0]), "db": float(by_autograd["db"][k])}
            for k, g in enumerate(recurrent.GATES)]
    return table(rows, [Column("gate"), Column("dW0", "dW[g, 0]", **FIVE), Column("dW1", "dW[g, 1]", **FIVE),
                        Column("dU", "dU[g]", **FIVE), Column("db", "db[g]", **FIVE)],
                 caption="autograd's gradients; largest difference from the hand-written backward pass: "
                 + ", ".join(f"{name} {value:.1e}" for name, value in differences.items()))


def lstm_table(runs: Sequence[Recording]) -> Table:
    """Per run, number format, sequence length and hidden size: each implementation's time per step, and how many
    times faster nn.LSTM is than the per-step loop."""
    loop, hoisted, fused = recurrent.IMPLEMENTATIONS
    rows = []
    for run in runs:
        ok = ok_rows(run.rows)
        for point in dict.fromkeys((r["dtype"], r["seq_len"], r["hidden"]) for r in ok):
            by = {r["implementation"]: r for r in ok if (r["dtype"], r["seq_len"], r["hidden"]) == point}
            if len(by) < len(recurrent.IMPLEMENTATIONS):
                continue
            rows.append({"gpu": run.short_label, "dtype": point[0], "seq_len": point[1], "hidden": point[2],
                         **{name: by[name]["ms_per_step"] * 1e3 for name in recurrent.IMPLEMENTATIONS},
                         "speedup": by[loop]["seconds"] / by[fused]["seconds"], "gflops": by[fused]["gflops"]})
    us = {"unit": "µs/step", "format": ",.1f"}
    return table(rows, [Column("gpu", "run"), Column("dtype"), Column("seq_len", "T"), Column("hidden", "H"),
                        Column(loop, loop, **us), Column(hoisted, "hoisted", **us), Column(fused, fused, **us),
                        Column("speedup", "speed-up of nn.LSTM over the loop", format=",.1f"),
                        Column("gflops", "nn.LSTM", "GFLOP/s", ",.0f")])


def lstm_dtypes(runs: Sequence[Recording]) -> list[str]:
    """The number formats the runs measured, in the order they first appear."""
    return list(dict.fromkeys(r["dtype"] for run in runs for r in ok_rows(run.rows)))


def lstm_figure(runs: Sequence[Recording], dtype: str) -> go.Figure:
    """Time per step of each implementation against the hidden size, in ``dtype``, a run at a time (a menu)."""
    having = [run for run in runs if any(r["dtype"] == dtype for r in ok_rows(run.rows))]

    def figure(run: Recording) -> go.Figure:
        rows = [{**r, "series": f"{r['implementation']}, T = {r['seq_len']}", "us_per_step": r["ms_per_step"] * 1e3}
                for r in ok_rows(run.rows) if r["dtype"] == dtype]
        fig = plots.sweep_figure(
            rows, "hidden", "us_per_step", color="series", log_x=True, log_y=True,
            hover=("implementation", "hidden", "seq_len", "batch", "gflops", "relative_error"),
            title=f"One LSTM layer, {dtype}, batch {run.params['batch']}: {run.label}",
            x_title="hidden size H (= input size D)", y_title="time per time step (µs, log scale)")
        return fig.update_xaxes(tickvals=sorted({r["hidden"] for r in rows}))
    return plots.by_gpu(having, figure)


def attention_checks_table(rows: Sequence[dict], device: torch.device) -> Table:
    return table(rows, [Column("check"), Column("relative_error", "relative error", format=".1e")],
                 caption=f"float32 on {'a GPU' if device.type == 'cuda' else 'a CPU'}, fresh random data")


def counted_table(rows: Sequence[dict]) -> Table:
    """:func:`gpulab.ch06_recurrent_and_attention.attention.counted_flops`: the formula against FlopCounterMode."""
    return table(rows, [Column("counted"), Column("formula", "formula", "FLOP"),
                        Column("flop_counter", "FlopCounterMode", "FLOP")])


def share_figure(lengths: Sequence[int], widths: Sequence[int]) -> go.Figure:
    """The share of a block's GEMM FLOPs in QK^T and AV against the sequence length, one line per width d (with
    d_ff = 4d), each crossover L* marked."""
    rows = [{**r, "width": f"d = {r['d_model']}, d_ff = {r['d_ff']}"} for d in widths
            for r in attention.flop_share_rows(lengths, d, 4 * d) if r["part"].startswith("QK^T + AV")]
    fig = plots.sweep_figure(rows, "seq_len", "share", color="width", log_x=True, hover=("seq_len", "flops", "share"),
                             title="Share of a transformer block's FLOPs in QK^T and AV",
                             x_title="sequence length L (log scale)", y_title="share of the block's GEMM FLOPs")
    for d in widths:
        crossover = attention.quadratic_crossover(d, 4 * d)
        plots.vertical_marker(fig, crossover, f"L* = {crossover:,}")
    return fig


def parts_figure(lengths: Sequence[int], d_model: int, d_ff: int) -> go.Figure:
    """Each part's share of a block's GEMM FLOPs against the sequence length."""
    rows = [r for r in attention.flop_share_rows(lengths, d_model, d_ff) if not r["part"].startswith("QK^T + AV")]
    return plots.sweep_figure(rows, "seq_len", "share", color="part", log_x=True, hover=("seq_len", "flops", "share"),
                              title=f"Where the FLOPs go, d = {d_model}, d_ff = {d_ff}",
                              x_title="sequence length L (log scale)", y_title="share of the block's GEMM FLOPs")


def _profiles(runs: Sequence[Recording]) -> list[tuple[Recording, str, list[dict]]]:
    return [(run, precision, [r for r in run.rows if r["precision"] == precision])
            for run in runs for precision in dict.fromkeys(r["precision"] for r in run.rows)]


def _profile_name(run: Recording, precision: str) -> str:
    return f"{run.short_label}, {precision}"


def profile_table(runs: Sequence[Recording]) -> Table:
    """A row per kind of work, and per run and precision its time per step and its share of the profiled time."""
    profiles = _profiles(runs)
    rows = []
    for category in attention.CATEGORIES:
        row = {"category": category}
        for i, (_, _, measured) in enumerate(profiles):
            found = next((r for r in measured if r["category"] == category), None)
            row[f"ms{i}"] = found["seconds"] * 1e3 if found else None
            row[f"share{i}"] = found["share"] if found else None
        if any(row[f"ms{i}"] for i in range(len(profiles))):
            rows.append(row)
    columns = [Column("category", "kind of work")]
    for i, (run, precision, _) in enumerate(profiles):
        name = _profile_name(run, precision)
        columns += [Column(f"ms{i}", f"{name}: per step", "ms", ",.2f"), Column(f"share{i}", "share", format=".1%")]
    return table(rows, columns, caption="GPU kernels on a GPU, CPU operators on a CPU")


def profile_sentences(runs: Sequence[Recording]) -> list[str]:
    """A sentence per run and precision: the GEMMs' share, with fused attention, the step's time, and on a GPU how
    much of the step's wall time its kernels ran."""
    said = []
    for run, precision, rows in _profiles(runs):
        share = {r["category"]: r["share"] for r in rows}
        shape = run.params
        sentence = (f"{run.label}, {precision} ({shape['layers']} layers, d = {shape['d_model']}, {shape['batch']} x "
                    f"{shape['seq_len']} tokens): GEMM takes {share['GEMM']:.0%} of the {rows[0]['source']}' time, "
                    f"GEMM and fused attention together {share['GEMM'] + share['attention (fused)']:.0%}; a step "
                    f"took {rows[0]['step_seconds'] * 1e3:,.2f} ms")
        if rows[0]["source"] == "GPU kernels":
            busy = rows[0]["profiled_seconds"] / rows[0]["step_seconds"]
            sentence += f", and the GPU's kernels ran for {busy:.0%} of it"
        said.append(sentence + ".")
    return said


def profile_figure(runs: Sequence[Recording]) -> go.Figure:
    """Bars of each kind of work's share of the profiled time, a bar per run and precision (all runs together: the
    comparison is the point)."""
    profiles = _profiles(runs)
    series, merged = {}, {c: {"category": c} for c in attention.CATEGORIES}
    for run, precision, rows in profiles:
        name = f"{run.label}, {precision}"
        series[name] = name
        for r in rows:
            merged[r["category"]][name] = 100 * r["share"]
    fig = plots.bars_figure([m for m in merged.values() if any(v for k, v in m.items() if k != "category")],
                            "category", series, title="A transformer's training step: share of time by kind of work",
                            x_title="kind of work", y_title="share of the profiled time (%)")
    return fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.3, x=0), height=560)
