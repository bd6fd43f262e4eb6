"""Worked answers to the exercises of chapter 11, "Automatic mixed precision": every number computed when it is
shown, from :mod:`gpulab.core.precision`, the chapter's own functions and models, and the recordings. No experiment
runs here (the layer-norm answer runs one small operation under autocast on the CPU), and no GPU is needed.
"""

from __future__ import annotations

import inspect
import math
import statistics

import torch
import torch.nn.functional as F

from gpulab.ch04_mlp_gemms.mlp import training_step_operations
from gpulab.ch11_mixed_precision import amp, autocast, figures
from gpulab.ch11_mixed_precision.plan import FULL
from gpulab.core import budget, recordings, specs
from gpulab.core.precision import FORMATS
from gpulab.core.printing import Answer

START, GROWTH = 2**4, 10  # exercise 2's GradScaler


def _smallest_taken(weight: float) -> float:
    """The smallest update (to 3 significant digits) that a float16 weight of ``weight`` still takes, by bisection
    with :func:`autocast.master_weight_updates` (one update)."""
    low, high = 0.0, FORMATS["float16"].spacing(weight)  # an update of a whole spacing is always taken
    for _ in range(40):
        middle = (low + high) / 2
        row = next(r for r in autocast.master_weight_updates(weight, middle, 1) if r["weights"] == "float16 weights")
        low, high = (low, middle) if row["after_one"] != row["weight"] else (middle, high)
    return high


def exercise_1() -> Answer:
    eps = FORMATS["float16"].epsilon
    lines = ["Bisect the update u with `autocast.master_weight_updates(w, u, 1)` until the float16 row's weight moves:"]
    ratios = []
    for weight in (1.0, 1000.0):
        u = _smallest_taken(weight)
        below = FORMATS["float16"].spacing(weight * (1 - eps))  # the spacing just below the weight
        ratios.append(math.log2(u / weight))
        lines.append(f"- w = {weight:g}: the smallest update taken is just over {u:.4g}, {u / eps:.3g} epsilon. The "
                     f"float16 numbers just below {weight:g} are {below:g} apart, and an update rounds away unless it "
                     "passes half of that.")
    lines.append(f"float16's epsilon, {eps:g} = 2^{math.log2(eps):.0f}, is the spacing just above 1; below a power of "
                 "two the spacing halves, so a weight of 1 still takes updates down to a quarter of epsilon. The "
                 "threshold grows with the weight: about 2^" + f"{statistics.fmean(ratios):.0f} of it for both, near "
                 "the ratio of Micikevicius et al. that section 2 quotes (where the weight sits between two powers "
                 "of two moves it by a factor of up to 2).")
    return Answer("Answer to exercise 1", tuple(lines))


def exercise_2() -> Answer:
    lines = [f"Starting at 2^{int(math.log2(START))}, no gradient overflows, so the scaler only grows: it doubles "
             f"after every {GROWTH} clean steps. Reaching 2^s takes (s - {int(math.log2(START))}) x {GROWTH} steps."]
    for run in recordings.recorded("amp_loss_scale_trace"):
        later = [r["log2_scale"] for r in run.rows[len(run.rows) // 4:] if not r["skipped"]]
        level = statistics.median(later)
        steps = (level - math.log2(START)) * GROWTH
        lines.append(f"On the {run.short_label} (recorded) the sawtooth sat at 2^{level:.0f} (the median scale of "
                     f"the updates after the first quarter of the trace): about {steps:.0f} steps from 2^4.")
    for run in recordings.recorded("amp_gradient_histogram"):
        kinds = dict.fromkeys(r["gradients"] for r in run.rows)
        lost = {kind: figures.shares([r for r in run.rows if r["gradients"] == kind], FORMATS["float16"],
                                     math.log2(START))["zero"] for kind in kinds}
        lines.append(f"Meanwhile, at 2^{int(math.log2(START))}, float16 rounds to zero "
                     + " and ".join(f"{share:.0%} of the nonzero {kind} gradients" for kind, share in lost.items())
                     + f" (the {run.short_label}'s recorded histogram, through `figures.shares`): their updates are "
                     "lost, and the network learns from its larger gradients only.")
    default = inspect.signature(amp.new_training).parameters["init_scale"].default
    lines.append(f"A start too low costs many steps of lost gradients; a start too high, a few skipped steps. That is "
                 f"why the default starts high, at 2^{math.log2(default):.0f}.")
    return Answer("Answer to exercise 2", tuple(lines))


def exercise_3() -> Answer:
    lines = ["Run `gradients.loss_scale_underflow(scales=[1.0], epochs=e)` for e = 1, 10 and 30 (any device: float16 "
             "rounds the same everywhere, so a CPU, a T4 and the recordings agree up to the training's noise), and "
             "read `backward_lost` at scale 1."]
    for run in recordings.recorded("amp_loss_scale_underflow"):
        at_one = {r["gradients"]: r["backward_lost"] for r in run.rows if r["loss_scale"] == 1}
        lines.append(f"The {run.short_label} recorded it after {run.params['epochs']} epochs: "
                     + " and ".join(f"{share:.0%} of the {kind} gradients" for kind, share in at_one.items())
                     + " lost without scaling.")
    lines.append("Expect fewer losses after 1 epoch and more as training goes on. The gradient of the loss with "
                 "respect to the logits is softmax(z) - y; as the network learns, its predictions approach the labels, "
                 "that difference shrinks, and every gradient backpropagated from it shrinks too. The histogram moves "
                 "left, past float16's smallest subnormal, which is why the scale must grow as training goes on.")
    return Answer("Answer to exercise 3", tuple(lines))


def _layer_norm_on_cpu() -> str:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.layer_norm(x, (16,), torch.ones(16))
    return str(out.dtype).removeprefix("torch.")


def exercise_4() -> Answer:
    lines = ["Add `nn.LayerNorm(width)` after each hidden `nn.Linear` of the model, and train it with "
             "`amp.Training.step` in bfloat16 (a CPU runs bfloat16 autocast too)."]
    for run in recordings.recorded("amp_autocast_dtypes"):
        row = next((r for r in run.rows if r.get("op") == "layer_norm" and r.get("autocast_dtype") == "bfloat16"),
                   None)
        if row:
            lines.append(f"On the {run.short_label} (recorded, CUDA's lists), layer_norm {row['treatment']}: from "
                         f"bfloat16 input it returns {row['from_low']}.")
    lines.append(f"On this CPU, `F.layer_norm` of bfloat16 data under `torch.autocast(\"cpu\", dtype=torch.bfloat16)` "
                 f"returns {_layer_norm_on_cpu()}: on the CPU it follows its input, as the table's live column says.")
    lines.append("So the same model normalises in float32 on a GPU and in bfloat16 on a CPU. bfloat16's 8 bits of "
                 "precision in the mean and variance of a wide layer can cost accuracy there; compare the two runs' "
                 "test accuracy.")
    return Answer("Answer to exercise 4", tuple(lines))


def exercise_5() -> Answer:
    sizes = [FULL["wide_inputs"], *[FULL["wide_width"]] * FULL["wide_depth"], 10]
    batch = FULL["wide_batch"]
    weights = sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    step_flops = sum(op["flops"] for op in training_step_operations(sizes, batch))
    cast_bytes = 6 * weights  # each float32 weight read (4 bytes) and written as a 16-bit copy (2) every step
    lines = ["Profile one step after a few warm-up steps: `torch.profiler.profile(activities=[CPU, CUDA])` around "
             "`training.step(X, y)`, once with `precision=\"float32\"` and once `\"bfloat16\"`, then "
             "`prof.key_averages().table(sort_by=\"cuda_time_total\")`.",
             "What AMP adds: the casts of every weight to bfloat16 (`aten::_to_copy`, elementwise copy kernels) in "
             "the forward pass, and casts of activations where autocast changes type; float16 adds the scaler's "
             "`_amp_foreach_non_finite_check_and_unscale_` and its update. The GEMMs themselves change kernels "
             "(`bf16` in their names)."]
    for name in ("T4", "H200 SXM 141GB"):
        gpu = specs.gpu(name)
        precision = "bfloat16" if specs.peak_tflops(gpu, "bfloat16") else "float16"
        gemm = budget.Work("step", flops=step_flops, precision=precision).call_seconds(gpu)
        cast = budget.Work("casts", bytes=cast_bytes).call_seconds(gpu)
        lines.append(f"- {name}, by the model: {weights / 1e6:.1f} M weights cast ({cast_bytes / 1e6:.0f} MB moved) "
                     f"take {cast * 1e3:.2f} ms against {gemm * 1e3:.2f} ms of {precision} GEMMs, "
                     f"{cast / (cast + gemm):.0%} of the step" + ("" if precision == "bfloat16" else
                                                                    " (a T4 has no bfloat16: profile float16 AMP)")
                     + ".")
    for run in recordings.recorded("amp_wide_mlp"):
        steps = {p: statistics.fmean(r["step_seconds"] for r in run.rows if r.get("precision") == p
                                     and r.get("status") == "ok") for p in ("bfloat16",)}
        lines.append(f"The {run.short_label} (recorded) took {steps['bfloat16'] * 1e3:.2f} ms per bfloat16 step: "
                     "compare it with the model's sum to see how much is Python's time between kernels.")
    return Answer("Answer to exercise 5", tuple(lines))
