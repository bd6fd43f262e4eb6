"""Worked answers to the exercises of chapter 04, every number computed from the chapter's models
(:mod:`gpulab.ch04_mlp_gemms.mlp`, :mod:`gpulab.ch04_mlp_gemms.waves`) and the recordings when the answer is shown
(:func:`gpulab.core.printing.show_answers`)."""

from __future__ import annotations

import torch

from gpulab.ch04_mlp_gemms import mlp, waves
from gpulab.core import recordings
from gpulab.core.printing import Answer
from gpulab.core.sweep import ok_rows

TILE, OUTPUTS = (128, 128), 4096  # exercises 3 and 4: 128 x 128 tiles, a layer of 4096 outputs (NVIDIA's M)


def exercise_1() -> Answer:
    gemms = mlp.layer_gemms(mlp.MNIST_BATCH, mlp.MNIST_HIDDEN, mlp.MNIST_CLASSES)
    return Answer("Answer to exercise 1", (
        f"The layer has batch = {mlp.MNIST_BATCH}, inputs = {mlp.MNIST_HIDDEN} (the hidden neurons) and outputs = "
        f"{mlp.MNIST_CLASSES} (the digits). Each GEMM takes its shapes from the formula:",
        *(f"- {g['phase']}, `{g['formula']}`: {g['A']} times {g['B']} gives {g['C']}; in NVIDIA's terms "
          f"M x N x K = {g['M']} x {g['N']} x {g['K']} ({g['M is']} x {g['N is']} x {g['K is']})" for g in gemms),
        f"All three do the same {gemms[0]['flops']:,} FLOP (2 x batch x inputs x outputs), and each sums over a "
        "different dimension: the inputs, the outputs, the batch. `mlp.layer_gemms(10, 16, 10)` lists exactly these.",
    ))


def _gemm_share(inputs: int, hidden: int, batch: int) -> float:
    return mlp.step_totals(mlp.training_step_operations([inputs, hidden, 10], batch))["gemm_share"]


def exercise_2() -> Answer:
    shares = {h: _gemm_share(64, h, 64) for h in (8, 32, 128, 1024)}
    limit = _gemm_share(64, 10**6, 64)
    mnist = next((h for h in range(1, 4097) if _gemm_share(mlp.MNIST_PIXELS, h, 64) >= 0.99), None)
    return Answer("Answer to exercise 2", (
        "Loop over the width and read `mlp.step_totals(mlp.training_step_operations([64, h, 10], 64))`'s "
        "`gemm_share`: " + ", ".join(f"h = {h:,}: {s:.2%}" for h, s in shares.items()) + ".",
        f"**No width reaches 99%**: the share levels off at {limit:.2%} (a width of a million). Both kinds of work "
        "grow in proportion to h when the inputs and the batch are fixed: the GEMMs as batch x h x (inputs + 10) "
        "per pass, the elementwise work as batch x h (bias, ReLU and its gradient, the bias gradient) plus the "
        "SGD update of the inputs x h weights. Their ratio tends to a constant set by the 64 inputs.",
        f"What does get past 99% is more inputs per hidden neuron: with MNIST's {mlp.MNIST_PIXELS} pixels at batch "
        f"64, the smallest width is h = {mnist}.",
    ))


def exercise_3() -> Answer:
    sms = 108
    steps = waves.wave_steps(1, OUTPUTS, OUTPUTS, vary="n", tile=TILE, sms=sms)[:3]
    lines = [f"A 4096 -> 4096 layer's forward GEMM has M = {OUTPUTS:,} (outputs), so {OUTPUTS // TILE[0]} tiles "
             f"along M; each {TILE[1]} samples of the batch (N) add one more column of tiles, and {sms} SMs take one "
             f"tile each per wave. `waves.wave_steps(1, 4096, 4096, vary=\"n\", sms={sms})` gives the batches where "
             f"a new wave starts: **{', '.join(f'{s:,}' for s in steps)}**."]
    for step in steps:
        before, after = waves.tile_waves(OUTPUTS, step - 1, TILE, sms), waves.tile_waves(OUTPUTS, step, TILE, sms)
        lines.append(f"- batch {step - 1:,}: {before.tiles} tiles in {before.waves} wave(s), efficiency "
                     f"{before.efficiency:.0%}; batch {step:,}: {after.tiles} tiles in {after.waves}, "
                     f"{after.efficiency:.0%}.")
    lines.append("Avoid batches just past a step, whose last wave is nearly empty; choose the largest batch before "
                 f"it ({', '.join(f'{s - 1:,}' for s in steps)}), or a multiple of {TILE[1]} that fills its waves.")
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4() -> Answer:
    sms, batches = 132, range(1024, 2049)
    efficiency = {b: waves.tile_waves(OUTPUTS, b, TILE, sms).efficiency for b in batches}
    best = max(efficiency.values())
    chosen = [b for b, e in efficiency.items() if e >= best - 1e-12]
    lines = [f"With {OUTPUTS // TILE[0]} tiles along M, a batch of b makes {OUTPUTS // TILE[0]} x ceil(b / "
             f"{TILE[1]}) tiles, run {sms} at a time. Over every batch from {batches[0]:,} to {batches[-1]:,}, "
             f"`waves.tile_waves` gives the best efficiency, {best:.1%}, at **{', '.join(f'{b:,}' for b in chosen)}**: "
             "whole tiles, and waves as full as this tile count allows."]
    runs = recordings.recorded("mlp_fc_batch_sweep")
    for run in runs:
        rows = {r["batch"]: r["tflops"] for r in ok_rows(run.rows) if r["dtype"] == "float16"
                and batches[0] <= r["batch"] <= batches[-1]}
        if not rows:
            continue
        ranked = sorted(rows, key=rows.get, reverse=True)
        said = "; ".join(f"{b:,}: {rows[b]:.0f} TFLOP/s (rank {ranked.index(b) + 1} of {len(rows)})"
                         for b in chosen if b in rows)
        lines.append(f"- {run.short_label} ({run.provenance['device'].get('multiprocessors')} SMs), float16, "
                     f"recorded: {said}; its fastest batch in the range is {ranked[0]:,}.")
    if not runs:
        lines.append("No GPU has recorded `mlp_fc_batch_sweep` yet.")
    lines.append("cuBLAS picks its own tile, and on Hopper clusters of two SMs, so the model's best batches "
                 "are good bets rather than a guarantee: the recorded rates show how far they hold.")
    return Answer("Answer to exercise 4", tuple(lines))


def exercise_5() -> Answer:
    sizes, batch = [mlp.MNIST_PIXELS, mlp.MNIST_HIDDEN, mlp.MNIST_CLASSES], mlp.MNIST_BATCH
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(batch, sizes[0], generator=generator)
    labels = torch.randint(0, sizes[-1], (batch,), generator=generator)
    plain = mlp.flop_counter_totals(mlp.torch_mlp(sizes), X, labels)
    with_input = mlp.flop_counter_totals(mlp.torch_mlp(sizes), X.clone().requires_grad_(), labels)
    first = 2 * batch * sizes[0] * sizes[1]
    return Answer("Answer to exercise 5", (
        f"For the course's MLP ({' -> '.join(map(str, sizes))}, batch {batch}) the counter gives a forward pass of "
        f"{plain['forward']:,} FLOP and a backward pass of {plain['backward']:,} "
        f"({plain['backward'] / plain['forward']:.3f}x).",
        f"With `requires_grad=True` on the input, the backward pass counts {with_input['backward']:,} FLOP, "
        f"{with_input['backward'] - plain['backward']:,} more: the first layer's activation gradient "
        f"dX = dY W^T, a GEMM of 2 x {batch} x {sizes[0]} x {sizes[1]} = {first:,} FLOP, which autograd skipped "
        "while nothing needed the gradient of the data.",
        f"The ratio is now **exactly {with_input['backward'] / with_input['forward']:g}**: every layer computes dW "
        "and dX, two GEMMs of the same M N K as its forward GEMM, and the counter sees only matrix products, so "
        "the elementwise work (bias, ReLU, softmax) never enters the count.",
    ))
