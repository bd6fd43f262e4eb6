"""What chapter 11 states about autocast, loss scaling and what AMP buys, as claims checked on every recorded GPU
(:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch11_mixed_precision import amp
from gpulab.core.claims import Claim, Verdict, same_gpu, verdict
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

AUTOCAST = "amp_autocast_dtypes"
HISTOGRAM = "amp_gradient_histogram"
UNDERFLOW = "amp_loss_scale_underflow"
TRACE = "amp_loss_scale_trace"
DIGITS = "amp_digits_precisions"
WIDE = "amp_wide_mlp"
FLOAT32_ON_CUDA = ("softmax", "log_softmax", "layer_norm", "sum", "exp", "log", "pow")
FOLLOW_EVERYWHERE = ("relu", "sigmoid", "tanh", "add", "batch_norm")


def _treatments(run: Recording) -> dict[tuple[str, str], str]:
    rows = [r for r in ok_rows(run.rows) if r.get("device", "cuda") == "cuda"]
    if not rows:
        raise KeyError("no CUDA row")
    return {(r["autocast_dtype"], r["op"]): r["treatment"] for r in rows}


def _cuda_lists(run: Recording) -> Verdict:
    t = _treatments(run)
    wrong = [f"{op} ({dtype}): {how}" for (dtype, op), how in t.items() if
             (op in FLOAT32_ON_CUDA and how != "runs in float32")
             or (op in FOLLOW_EVERYWHERE and how != "follows its input")
             or (op in ("linear", "matmul", "bmm", "conv2d") and how != f"casts to {dtype}")
             or (op in ("cross_entropy", "mse_loss") and how != "runs in float32")]
    return verdict(not wrong, "; ".join(wrong) or f"all {len(t)} operations as stated, in float16 and bfloat16")


CUDA_LISTS = Claim(
    "cuda_lists", "Under CUDA autocast, in float16 and in bfloat16, the matrix products cast to the 16-bit type, the "
    "losses and softmax, log_softmax, layer_norm, sum, exp, log and pow run in float32, and relu, sigmoid, tanh, add "
    "and batch_norm follow their input.", AUTOCAST, _cuda_lists)


def _underflow(run: Recording) -> dict[tuple[str, float], dict]:
    return {(r["gradients"], r["log2_scale"]): r for r in ok_rows(run.rows)}


def _unscaled_losses(run: Recording) -> Verdict:
    rows = _underflow(run)
    act, weight = rows["activation", 0.0], rows["weight", 0.0]
    return verdict(act["cast_flushed"] > 0.3 and act["cast_flushed"] + act["cast_subnormal"] > 0.9
                   and 0.02 < weight["cast_flushed"] < act["cast_flushed"],
                   f"activation gradients {act['cast_flushed']:.0%} to zero, {act['cast_subnormal']:.0%} subnormal; "
                   f"weight gradients {weight['cast_flushed']:.0%} to zero")


UNSCALED_LOSSES = Claim(
    "unscaled_losses", "Stored in float16 without a loss scale, more than 30% of the nonzero activation gradients "
    "round to zero and nearly all the others are subnormal; a smaller share of the weight gradients, but more than "
    "2%, round to zero too.", UNDERFLOW, _unscaled_losses)


def _top_unused(run: Recording) -> Verdict:
    top = max(r["log2_magnitude"] for r in ok_rows(run.rows)) + 1
    return verdict(top <= -8, f"the largest gradient is below 2^{top}, {16 - top} powers of two below 65504's 2^16")


TOP_UNUSED = Claim(
    "top_unused", "The largest gradient stays more than 20 powers of two below float16's largest number.",
    HISTOGRAM, _top_unused)


def _finite_scales(run: Recording) -> list[float]:
    rows = _underflow(run)
    scales = sorted({s for _, s in rows})
    return [s for s in scales if all(rows[k, s]["backward_not_finite"] == 0 for k in ("activation", "weight"))]


def _prediction_matches(run: Recording) -> Verdict:
    rows = _underflow(run)
    gaps = [abs(rows[k, s]["cast_flushed"] - rows[k, s]["backward_lost"]) for s in _finite_scales(run)
            for k in ("activation", "weight")]
    if not gaps:
        raise ValueError("no scale without overflow")
    return verdict(max(gaps) < 0.01, f"largest gap {100 * max(gaps):.2f} percentage points over "
                                     f"{len(gaps) // 2} scales without overflow")


PREDICTION_MATCHES = Claim(
    "prediction_matches", "At every scale that overflows nothing, the share that a real float16 backward pass returns "
    "as zero is within one percentage point of the share that storing float32's gradients in float16 predicts.",
    UNDERFLOW, _prediction_matches)


def _each_step_rescues(run: Recording) -> Verdict:
    rows, scales = _underflow(run), _finite_scales(run)
    shrink = {(k, b): rows[k, b]["backward_lost"] / rows[k, a]["backward_lost"]
              for a, b in zip(scales, scales[1:], strict=False) for k in ("activation", "weight")
              if rows[k, a]["backward_lost"] > 0}
    if not shrink:
        raise ValueError("fewer than two scales without overflow")
    return verdict(max(shrink.values()) < 0.5, ", ".join(f"{k} at 2^{s:g}: {x:.0%} of the loss left"
                                                        for (k, s), x in shrink.items()))


EACH_STEP_RESCUES = Claim(
    "each_step_rescues", "Below the overflow, each factor of $2^8$ in the loss scale rescues more than half of the "
    "gradients that were still lost.", UNDERFLOW, _each_step_rescues)


def _overflow_earlier(run: Recording) -> Verdict:
    rows = _underflow(run)
    scales = sorted({s for _, s in rows})
    real = min((s for s in scales if any(rows[k, s]["backward_not_finite"] > 0 for k in ("activation", "weight"))),
               default=None)
    predicted = min((s for s in scales if any(rows[k, s]["cast_overflowed"] > 0 for k in ("activation", "weight"))),
                    default=None)
    if real is None:
        return verdict(False, "no scale overflowed in the backward pass")
    return verdict(predicted is None or real < predicted,
                   f"first inf or NaN in the backward pass at 2^{real:g}; first predicted overflow at "
                   + (f"2^{predicted:g}" if predicted is not None else "none of the scales"))


OVERFLOW_EARLIER = Claim(
    "overflow_earlier", "The real float16 backward pass overflows at a smaller scale than the stored gradients "
    "predict: at the first scale that returns inf or NaN, every gradient times the scale would still fit below "
    "65504.", UNDERFLOW, _overflow_earlier)


def _error_flat(run: Recording) -> Verdict:
    rows = _underflow(run)
    band = [s for s in _finite_scales(run) if s > 0]
    errors = {k: [rows[k, s]["relative_error"] for s in band] for k in ("activation", "weight")}
    if len(band) < 2:
        raise ValueError("fewer than two scales in the band")
    spread = max(max(v) / min(v) - 1 for v in errors.values())
    return verdict(spread < 0.05, f"relative error at 2^{band[0]:g} to 2^{band[-1]:g}: "
                   + ", ".join(f"{k} {min(v):.2e} to {max(v):.2e}" for k, v in errors.items()))


ERROR_FLAT = Claim(
    "error_flat", "Within the band of good scales the gradients' relative error changes by less than 5% from one "
    "scale to the next.", UNDERFLOW, _error_flat)


def _trace_start(run: Recording) -> Verdict:
    rows = sorted(run.rows, key=lambda r: r["step"])
    first = next(i for i, r in enumerate(rows) if not r["skipped"])
    halving = all(rows[i + 1]["log2_scale"] == rows[i]["log2_scale"] - 1 for i in range(first))
    later = rows[first:]
    share = sum(r["skipped"] for r in later) / len(later)
    return verdict(0 < first <= 8 and halving and share < 0.1,
                   f"{first} steps skipped in a row, each halving the scale, before the first update; then "
                   f"{share:.0%} of the steps skipped")


TRACE_START = Claim(
    "trace_start", "Started far too high, the scaler skips its first steps one after another, halving the scale each "
    "time, and takes its first update within eight steps; after that it skips fewer than one step in ten.",
    TRACE, _trace_start)


def _summary(run: Recording) -> dict[str, dict]:
    found = {s["precision"]: s for s in amp.summarize(run.rows) if s["runs"]}
    for precision in ("float32", "tf32", "float16", "bfloat16"):
        if precision not in found:
            raise KeyError(f"no run in {precision}")
    return found


def _digits_amp_slower(run: Recording) -> Verdict:
    s = _summary(run)
    holds = all(s[p]["speedup"] < 1 and s[p]["within_noise"] for p in ("float16", "bfloat16"))
    return verdict(holds and s["float16"]["skipped_steps"] == 0,
                   ", ".join(f"{p} AMP {s[p]['speedup']:.2f}x float32's speed" for p in ("float16", "bfloat16"))
                   + f"; float16 skipped {s['float16']['skipped_steps']} steps")


DIGITS_AMP_SLOWER = Claim(
    "digits_amp_slower", "On the digits MLP both AMP formats train to float32's accuracy within the noise, float16's "
    "scaler skips no step, and both are slower per step than float32.", DIGITS, _digits_amp_slower)


def _wide_target(run: Recording) -> Verdict:
    s = _summary(run)
    return verdict(all(s[p]["speedup"] >= 2 and s[p]["within_noise"] for p in ("float16", "bfloat16")),
                   ", ".join(f"{p} AMP {s[p]['speedup']:.1f}x float32's speed" for p in ("float16", "bfloat16")))


WIDE_TARGET = Claim(
    "wide_target", "On the wide MLP both float16 and bfloat16 AMP train at least twice as fast per step as float32 "
    "with TF32 off, with the same accuracy within the noise: the book's target is met.", WIDE, _wide_target)


def _wide_not_beyond_tf32(run: Recording) -> Verdict:
    s = _summary(run)
    gains = {p: s["tf32"]["step_seconds"] / s[p]["step_seconds"] for p in ("float16", "bfloat16")}
    return verdict(max(gains.values()) < 1.2, ", ".join(f"{p} AMP {x:.2f}x TF32's speed" for p, x in gains.items()))


WIDE_NOT_BEYOND_TF32 = Claim(
    "wide_not_beyond_tf32", "On the wide MLP neither 16-bit format's step is even 1.2 times as fast as TF32's, though "
    "their tensor-core peak is twice TF32's.", WIDE, _wide_not_beyond_tf32)


def _near_launch_floor(run: Recording) -> Verdict:
    digits = same_gpu(run, DIGITS)
    wide, small = _summary(run), _summary(digits)
    ratios = {p: wide[p]["step_seconds"] / small[p]["step_seconds"] for p in ("float16", "bfloat16")}
    return verdict(max(ratios.values()) < 1.6, ", ".join(
        f"{p} AMP: wide {1e3 * wide[p]['step_seconds']:.2f} ms, digits {1e3 * small[p]['step_seconds']:.2f} ms "
        f"({x:.2f}x)" for p, x in ratios.items()))


NEAR_LAUNCH_FLOOR = Claim(
    "near_launch_floor", "A 16-bit AMP step of the wide MLP, hundreds of GFLOP of GEMMs, takes less than 1.6 times "
    "as long as a step of the digits MLP in the same format, which does almost no arithmetic.", WIDE,
    _near_launch_floor)


def _float16_pays_scaler(run: Recording) -> Verdict:
    s = _summary(run)
    ratio = s["float16"]["step_seconds"] / s["bfloat16"]["step_seconds"]
    return verdict(ratio > 1, f"float16 AMP step {ratio:.2f}x bfloat16's time")


FLOAT16_PAYS_SCALER = Claim(
    "float16_pays_scaler", "float16's AMP step, with its scaler, takes longer than bfloat16's.", WIDE,
    _float16_pays_scaler)
