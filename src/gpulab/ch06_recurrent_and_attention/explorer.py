"""Chapter 06's explorer: a transformer block's GEMMs and where their FLOPs go, and the LSTM layer of the same width."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch06_recurrent_and_attention import attention, recurrent
from gpulab.core import plots
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, render

LENGTHS = [2**k for k in range(4, 18)]
WIDTHS = [128, 256, 512, 768, 1024, 2048, 4096, 8192, 12288]
HEADS = [1, 2, 4, 8, 12, 16, 32, 64, 96]


def block_rows(batch: int, seq_len: int, d_model: int, heads: int, d_ff: int) -> list[dict]:
    """The GEMMs of one transformer block's forward pass: shape, how many, FLOPs and share
    (:func:`gpulab.ch06_recurrent_and_attention.attention.block_flops`)."""
    flops = attention.block_flops(batch, seq_len, d_model, d_ff)
    total = sum(flops.values())
    tokens, head = batch * seq_len, d_model // heads
    shapes = {"QKV projections": (f"{tokens:,} x {d_model:,} by {d_model:,} x {3 * d_model:,}", 1),
              "scores QK^T": (f"{seq_len:,} x {head:,} by {head:,} x {seq_len:,}", batch * heads),
              "AV": (f"{seq_len:,} x {seq_len:,} by {seq_len:,} x {head:,}", batch * heads),
              "output projection": (f"{tokens:,} x {d_model:,} by {d_model:,} x {d_model:,}", 1),
              "MLP": (f"{tokens:,} x {d_model:,} by {d_model:,} x {d_ff:,}, and back", 2)}
    return [{"part": part, "gemm": shapes[part][0], "count": shapes[part][1], "gflop": value / 1e9,
             "share": value / total} for part, value in flops.items()]


def attention_explorer(seq_len: int = 512, d_model: int = 1024, heads: int = 16, batch: int = 16,
                       ff_multiple: int = 4) -> w.Widget:
    """Pick a sequence length, a model width, heads, a batch and the MLP's width: the GEMMs of a transformer block and
    their FLOPs, the share of the two quadratic products, the length where they take over, and the GEMMs of an LSTM
    layer of the same width over the same sequence. Pure arithmetic: it answers without a GPU."""
    length = w.SelectionSlider(options=LENGTHS, value=seq_len, description="sequence length L", style=WIDE)
    width = w.Dropdown(options=WIDTHS, value=d_model, description="model width d", style=WIDE)
    head_count = w.Dropdown(options=HEADS, value=heads, description="heads h", style=WIDE)
    sequences = w.BoundedIntText(value=batch, min=1, max=4096, description="batch B", style=WIDE,
                                 layout=w.Layout(width="12em"))
    multiple = w.Dropdown(options=[(f"{m} d", m) for m in (1, 2, 4, 8)], value=ff_multiple,
                          description="MLP width d_ff", style=WIDE)
    output = w.Output()

    def update(_change=None) -> None:
        n, d, h, b = length.value, width.value, head_count.value, sequences.value
        d_ff = multiple.value * d
        if d % h:
            render(output, f"{h} heads do not divide the width d = {d:,}: pick another number of heads.")
            return
        rows = block_rows(b, n, d, h, d_ff)
        quadratic = sum(r["share"] for r in rows if r["part"] in attention.QUADRATIC_PARTS)
        crossover = attention.quadratic_crossover(d, d_ff)
        side = "below" if crossover > n else "at or above"
        lstm = recurrent.layer_flops(d, n, b, d)
        text = [
            f"A block's GEMMs do {sum(r['gflop'] for r in rows):,.1f} GFLOP forward for {b:,} x {n:,} tokens; "
            f"QK^T and AV, the two products that grow with L^2, take {quadratic:.1%} of them.",
            f"They take over at L* = 2d + d_ff = {crossover:,} tokens; L = {n:,} is {side} it. The heads split "
            f"each product into {b * h:,} small GEMMs with d/h = {d // h:,} but do not change the FLOPs.",
            f"An LSTM layer of the same width (H = D = {d:,}) over T = {n:,} steps of the same batch does "
            f"{lstm / 1e9:,.1f} GFLOP: per step one GEMM of {b:,} x {2 * d:,} by {2 * d:,} x {4 * d:,}, {n:,} of "
            f"them one after another; hoisting the input half makes that one GEMM of {n * b:,} x {d:,} by {d:,} x "
            f"{4 * d:,} before the loop and {n:,} of {b:,} x {d:,} by {d:,} x {4 * d:,} inside it.",
        ]
        shares = [r for r in attention.flop_share_rows(sorted({*LENGTHS, n}), d, d_ff)
                  if r["part"].startswith("QK^T + AV")]
        figure = plots.sweep_figure(shares, "seq_len", "share", name="QK^T + AV", log_x=True,
                                    hover=("seq_len", "flops", "share"),
                                    title=f"Share of the block's FLOPs in QK^T and AV, d = {d:,}, d_ff = {d_ff:,}",
                                    x_title="sequence length L (log scale)",
                                    y_title="share of the block's GEMM FLOPs")
        plots.vertical_marker(figure, crossover, f"L* = {crossover:,}")
        plots.vertical_marker(figure, n, f"L = {n:,}")
        render(output, "\n".join(text), figure, table(rows, [
            Column("part"), Column("gemm", "GEMM (M x K by K x N)"), Column("count", "how many"),
            Column("gflop", "work", "GFLOP", ",.2f"), Column("share", format=".1%")]))

    return assemble([[length, width, head_count], [sequences, multiple]], output, update)
