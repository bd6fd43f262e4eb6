"""Worked answers to chapter 06's exercises, every number computed when the answer is shown: from the worked
example, the chapter's FLOP counts and time model (:mod:`.plan`), the GPU table and each recorded GPU's runs."""

from __future__ import annotations

import dataclasses

from gpulab.ch05_convolutions_as_gemms.answers import per_gpu
from gpulab.ch06_recurrent_and_attention import attention, plan, recurrent
from gpulab.core import budget, flops, recordings, specs
from gpulab.core.printing import Answer
from gpulab.core.recordings import Recording

T4 = specs.gpu("T4")
GPT3_WIDTH, GPT3_CONTEXT = 12288, 2048  # GPT-3's model width d and its context length, in tokens


def _indices(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every index of a tensor of ``shape`` (of at most two dimensions), in storage order."""
    return [(i,) for i in range(shape[0])] if len(shape) == 1 else [(i, j) for i in range(shape[0])
                                                                    for j in range(shape[1])]


def exercise_1() -> Answer:
    wrong = dataclasses.replace(recurrent.COURSE_EXAMPLE, labels=recurrent.SLIDE_LABELS)
    right_grads, wrong_grads = recurrent.autograd_gradients(), recurrent.autograd_gradients(wrong)
    deltas = [recurrent.forward_trace(example)[-1] for example in (recurrent.COURSE_EXAMPLE, wrong)]
    signals = [float(step["out"] - step["y"]) for step in deltas]
    flipped, kept = [], []
    for name in ("dW", "dU", "db"):
        right, wrong_values = right_grads[name], wrong_grads[name]
        for (gate, *column), a in zip(_indices(right.shape), right.flatten().tolist(), strict=True):
            label = f"{name}[{', '.join([recurrent.GATES[gate], *map(str, column)])}]"
            (flipped if a * wrong_values[(gate, *column)].item() < 0 else kept).append(label)
    which = (f"all {len(flipped)} of them, every entry of dW, dU and db" if not kept else
             f"{len(flipped)} of {len(flipped) + len(kept)}: {', '.join(flipped)}")
    return Answer("Answer to exercise 1", (
        "Build the example with the slide's printed labels, `dataclasses.replace(recurrent.COURSE_EXAMPLE, "
        "labels=recurrent.SLIDE_LABELS)`, and call `recurrent.autograd_gradients` on it.",
        f"The error signal at the last step, Delta_1 = out_1 - y_1, goes from {signals[0]:.5f} to {signals[1]:.5f}: "
        f"it changes sign and grows {abs(signals[1] / signals[0]):.1f} times, while Delta_0 stays as it was.",
        f"Every gradient is a sum over the steps of terms proportional to the error signals, and the last step's now "
        f"dominates. The gradient entries that change sign: {which}.",
        f"The loss itself grows from {float(right_grads['loss']):.4f} to {float(wrong_grads['loss']):.4f}: with "
        f"{recurrent.SLIDE_LABELS[-1]} the network is asked for an output of the other sign.",
    ))


def exercise_2() -> Answer:
    hidden, steps, batch = max(plan.FULL["hidden_sizes"]), max(plan.FULL["seq_lens"]), plan.FULL["lstm_batch"]
    inputs = hidden
    forward = recurrent.layer_flops(hidden, steps, batch, inputs)
    in_loop = steps * flops.gemm(batch, hidden, 4 * hidden).flops  # delta h_{t-1} = delta z_t U
    weights = flops.gemm(4 * hidden, hidden + inputs, steps * batch).flops  # delta [U W] in one GEMM
    input_grads = flops.gemm(steps * batch, inputs, 4 * hidden).flops  # delta x_t = delta z_t W for all t
    return Answer("Answer to exercise 2", (
        "With z_t = [h_{t-1} x_t] [U W]^T + b (B x 4H), the backward pass of one step, given the gates' gradient "
        "delta z_t (B x 4H, from the pointwise part), is two GEMMs:",
        "- delta [h_{t-1} x_t] = delta z_t [U W]: (B x 4H) by (4H x (H + D)), the gradient sent back;",
        "- delta [U W] += delta z_t^T [h_{t-1} x_t]: (4H x B) by (B x (H + D)), one GEMM per step, summed.",
        "So BPTT over T steps takes 2T GEMMs besides the forward pass's T. Only delta h_{t-1} = delta z_t U must stay "
        "in the loop, since step t - 1 needs it. Once every delta z_t is known, the rest is two large GEMMs over all "
        "T B rows: the weight gradient, and the inputs' gradient delta x_t = delta z_t W.",
        f"For the chapter's largest layer (H = D = {hidden:,}, T = {steps}, B = {batch}): the forward pass does "
        f"{forward / 1e12:.2f} TFLOP; backward, the loop keeps {steps} GEMMs of {in_loop / steps / 1e9:.1f} GFLOP "
        f"({in_loop / 1e12:.2f} TFLOP in all), and the two hoisted GEMMs do {weights / 1e12:.2f} and "
        f"{input_grads / 1e12:.2f} TFLOP, {(weights + input_grads) / (in_loop + weights + input_grads):.0%} of the "
        "backward work in two calls.",
    ))


def _per_step(run: Recording, hidden: int, dtype: str) -> dict[str, float]:
    """ms per step of each implementation at the longest recorded sequence, for ``hidden`` and ``dtype``."""
    rows = [r for r in run.rows if r.get("status") == "ok" and r["hidden"] == hidden and r["dtype"] == dtype]
    longest = max((r["seq_len"] for r in rows), default=None)
    return {r["implementation"]: r["ms_per_step"] for r in rows if r["seq_len"] == longest}


def exercise_3() -> Answer:
    hidden, batch, dtype = 1024, plan.FULL["lstm_batch"], "float16"
    gemm = flops.gemm(batch, 4 * hidden, 2 * hidden, dtype)  # one step: [h x] (B x 2H) by (2H x 4H)
    step = budget.Work("one step's GEMM", flops=gemm.flops, bytes=gemm.bytes, precision=dtype)
    python = plan.LSTM_STEP_OPS * budget.HOST_CALL_SECONDS  # a step's operations issued from Python

    def measured(run: Recording) -> str | None:
        times, row = _per_step(run, hidden, dtype), specs.find(run.device_name)
        if len(times) < 3:
            return None
        model = f"; the step's GEMM alone, at the model's rate: {step.gpu_seconds(row) * 1e3:.3f} ms" if row else ""
        return f"the loop took {times['per-step GEMM']:.3f} ms a step, `nn.LSTM` {times['torch.nn.LSTM']:.3f} ms{model}"

    return Answer("Answer to exercise 3", (
        "Method: make static input, state and output tensors, warm `lstm_cell` up on a side stream, capture one step "
        "with `g = torch.cuda.CUDAGraph()` and `with torch.cuda.graph(g): ...`, then for each t copy x_t into the "
        "static input, `g.replay()`, and copy the new h and c back. Time it with `timing.measure` against "
        "`nn.LSTM` on the same weights, after checking its output.",
        f"What to look for: a replay launches the step's kernels with one call, so the Python and launch cost of its "
        f"{plan.LSTM_STEP_OPS} operations (about {python * 1e3:.2f} ms a step on a fast host) goes away; what is "
        "left is the GPU's own time, the GEMM and the pointwise kernels.",
        f"The recordings, at H = {hidden:,}, B = {batch}, {dtype}, the longest sequence:",
        *per_gpu(recordings.recorded("rnn_lstm_layer"), measured, "- No GPU has recorded the LSTM layer yet."),
        f"On a T4 the step's GEMM takes {step.gpu_seconds(T4) * 1e3:.3f} ms at the model's rate: the graph brings "
        "the loop down to about that plus its pointwise kernels. `nn.LSTM` stays ahead, as cuDNN fuses the "
        "pointwise work and hoists the input GEMM.",
    ))


def exercise_4() -> Answer:
    d = GPT3_WIDTH
    d_ff = 4 * d
    crossover = attention.quadratic_crossover(d, d_ff)
    parts = attention.block_flops(1, crossover, d, d_ff)
    quadratic = sum(parts[p] for p in attention.QUADRATIC_PARTS)
    causal = 2 * crossover
    causal_parts = attention.block_flops(1, causal, d, d_ff)
    causal_quadratic = sum(causal_parts[p] for p in attention.QUADRATIC_PARTS) / 2
    return Answer("Answer to exercise 4", (
        f"Per token the linear layers do 8d^2 + 4d d_ff and the two attention products 4Ld, so they are equal at "
        f"L* = 2d + d_ff. For d = {d:,} and d_ff = 4d = {d_ff:,}: `attention.quadratic_crossover({d}, {d_ff})` = "
        f"{crossover:,} tokens.",
        f"Check: at that length `attention.block_flops` gives QK^T and AV {quadratic / 1e12:,.0f} TFLOP per sequence "
        f"and the rest {(sum(parts.values()) - quadratic) / 1e12:,.0f} TFLOP.",
        f"With a causal mask a kernel that skips the masked half of the scores (as FlashAttention does) does half "
        f"of QK^T and AV, 2Ld per token: the crossover doubles to L* = 2 (2d + d_ff) = {causal:,} tokens, where "
        f"the halved products make {causal_quadratic / 1e12:,.0f} TFLOP against the rest's "
        f"{(sum(causal_parts.values()) - 2 * causal_quadratic) / 1e12:,.0f}.",
        f"GPT-3's context was {GPT3_CONTEXT:,} tokens, {crossover // GPT3_CONTEXT} times shorter than L*: for it, "
        "attention's quadratic part is a small share of the FLOPs.",
    ))


def exercise_5() -> Answer:
    gemms, rest = plan.training_step(plan.FULL, "float32")
    gemm_only = gemms.gpu_seconds(T4)
    t4_step = gemm_only + rest.gpu_seconds(T4)  # the GPU's time: the GEMMs, then the memory-bound kernels

    def dropout(run: Recording) -> str | None:
        rows = {r["precision"]: r for r in run.rows if r.get("category") == "dropout"}
        if not rows:
            return None
        return "; ".join(f"{p}: dropout {r['seconds'] * 1e3:.2f} ms a step, {r['share']:.1%} of the kernels' time, "
                         f"{r['count']:.0f} kernels" for p, r in rows.items())

    return Answer("Answer to exercise 5", (
        "Method: change `attention.transformer` (its `norm_first=True` and `dropout=0.1`) in a copy, run "
        "`attention.training_step_profile` with the chapter's sizes, and compare its table with the recorded one, "
        "category by category, in each precision.",
        "Dropout 0: torch skips dropout when p = 0, so the dropout row should vanish, and with it the masks' "
        "multiplications in the backward pass (part of the elementwise row); the fused attention runs without its "
        "dropout too. The recordings give what there is to lose:",
        *per_gpu(recordings.recorded("attention_training_step"), dropout,
                 "- No GPU has recorded the training step yet."),
        "`norm_first=False` (post-norm) runs the same two layer norms per block, after each residual addition "
        "instead of before each part: the same kernels in another order, so every category should stay within the "
        "run-to-run noise. The difference is in training stability, not in time.",
        f"On a T4 the chapter's model puts a float32 step of the recorded transformer at {t4_step:.2f} s, "
        f"{gemm_only / t4_step:.0%} of it in GEMMs: dropout is a small share there as well.",
    ))
