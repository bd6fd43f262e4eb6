"""What chapter 04 states about a linear layer's rate against its shape, as claims checked on every recorded GPU
(:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch04_mlp_gemms import waves
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

BATCH = "mlp_fc_batch_sweep"
FEATURES = "mlp_fc_feature_sweep"
ALIGNMENT = "mlp_alignment"
TENSOR_CORE_FORMATS = ("float16", "tf32")
MODEL_TILE = (128, 128)


def _series(rows: list[dict], dtype: str, x: str) -> list[dict]:
    series = sorted((r for r in ok_rows(rows) if r["dtype"] == dtype), key=lambda r: r[x])
    if not series:
        raise KeyError(f"no {dtype} row against {x}")
    return series


def _sms(run: Recording) -> int:
    return run.provenance["device"]["multiprocessors"]


def _small_batch_slow(run: Recording) -> Verdict:
    shares = {}
    for dtype in TENSOR_CORE_FORMATS:
        series = _series(run.rows, dtype, "batch")
        shares[dtype] = (series[0]["batch"], series[0]["tflops"] / max(r["tflops"] for r in series))
    return verdict(all(share < 0.1 for _, share in shares.values()),
                   ", ".join(f"{d} at batch {b} {s:.1%} of its best" for d, (b, s) in shares.items()))


SMALL_BATCH_SLOW = Claim(
    "small_batch_slow", "At a batch of 32 the tensor-core formats, float16 and TF32, reach less than a tenth of "
    "their best rate in the sweep.", BATCH, _small_batch_slow)


def _agreement(run: Recording) -> dict[str, list[dict]]:
    return {waves.tile_label(tile): waves.step_agreement(run.rows, "batch", vary="n", tile=tile, sms=_sms(run))
            for tile in waves.TILE_MODELS}


def _steps_seen(run: Recording) -> Verdict:
    found = {a["dtype"]: a for a in waves.step_agreement(run.rows, "batch", vary="n", tile=MODEL_TILE,
                                                         sms=_sms(run))}
    seen = {d: (found[d]["seen"], found[d]["predicted"]) for d in TENSOR_CORE_FORMATS}
    return verdict(all(p > 0 and 2 * s > p for s, p in seen.values()),
                   ", ".join(f"{d} {s} of {p}" for d, (s, p) in seen.items()))


STEPS_SEEN = Claim(
    "steps_seen", "Against the batch, more than half of the new waves that the $128 \\times 128$ tile model predicts "
    "show as a measured drop, in float16 and in TF32.", BATCH, _steps_seen)


def _most_drops_unexplained(run: Recording) -> Verdict:
    best = max((a for found in _agreement(run).values() for a in found), key=lambda a: a["explained"])
    return verdict(best["explained"] < 0.5, f"at best {best['explained']:.0%} ({best['dtype']}, {best['tile']}, "
                                            f"{best['seen']} of {best['drops']} drops)")


MOST_DROPS_UNEXPLAINED = Claim(
    "most_drops_unexplained", "No single tile model explains even half of the drops measured against the batch, in "
    "any format.", BATCH, _most_drops_unexplained)


def _inputs_smooth(run: Recording) -> Verdict:
    counts = {}
    for vary in ("inputs", "outputs"):
        rows = [r for r in run.rows if r.get("vary") == vary]
        for dtype in dict.fromkeys(r["dtype"] for r in ok_rows(rows)):
            counts[vary, dtype] = len(waves.measured_drops(_series(rows, dtype, vary), vary))
    if not counts:
        raise KeyError("no rows against inputs or outputs")
    holds = all(n <= 1 for (v, _), n in counts.items() if v == "inputs") and all(
        n >= 10 for (v, _), n in counts.items() if v == "outputs")
    return verdict(holds, ", ".join(f"{d} {n} against the {v}" for (v, d), n in counts.items()))


INPUTS_SMOOTH = Claim(
    "inputs_smooth", "Against the inputs each format shows at most one drop of more than 4%; against the outputs, "
    "ten or more.", FEATURES, _inputs_smooth)


def _relative(run: Recording) -> dict[tuple[str, str, int], float]:
    found = {(r["dtype"], r["vary"], r["size"]): r["relative"] for r in ok_rows(run.rows) if "relative" in r}
    if not found:
        raise KeyError("no relative rate")
    return found


def _odd_widths(run: Recording) -> Verdict:
    relative, base = _relative(run), run.params["base"]
    worst = {d: max(relative[d, v, s] for v in ("inputs", "outputs") for s in (base - 1, base + 1))
             for d in TENSOR_CORE_FORMATS}
    return verdict(worst["float16"] < 0.2 and worst["tf32"] < 0.4,
                   ", ".join(f"{d} at most {w:.0%} of its rate at {base:,}" for d, w in worst.items()))


ODD_WIDTHS = Claim(
    "odd_widths", "A layer of 4,095 or 4,097 inputs or outputs, one element from 4,096, runs float16 at less than a "
    "fifth of its rate at 4,096 and TF32 at less than two fifths.", ALIGNMENT, _odd_widths)


def _four_is_enough_for_tf32(run: Recording) -> Verdict:
    relative, size = _relative(run), run.params["base"] + 4
    got = {d: [relative[d, v, size] for v in ("inputs", "outputs")] for d in TENSOR_CORE_FORMATS}
    return verdict(min(got["tf32"]) >= 0.85 and max(got["float16"]) < 0.4,
                   f"at {size:,}: " + ", ".join(f"{d} {min(v):.0%} to {max(v):.0%}" for d, v in got.items()))


FOUR_IS_ENOUGH_FOR_TF32 = Claim(
    "four_is_enough_for_tf32", "At 4,100 inputs or outputs, a multiple of 4 but not of 8, rows of TF32's 4-byte "
    "numbers still fill whole 16-byte pieces and TF32 keeps at least 85% of its rate; float16's 2-byte rows do not, "
    "and it falls below 40%.", ALIGNMENT, _four_is_enough_for_tf32)


def _float32_indifferent(run: Recording) -> Verdict:
    values = [v for (d, _, _), v in _relative(run).items() if d == "float32"]
    if not values:
        raise KeyError("no float32 row")
    return verdict(all(abs(v - 1) <= 0.05 for v in values), f"float32 from {min(values):.1%} to {max(values):.1%}")


FLOAT32_INDIFFERENT = Claim(
    "float32_indifferent", "Plain float32 on the CUDA cores stays within 5% of its rate at 4,096 at every size, "
    "aligned or not.", ALIGNMENT, _float32_indifferent)


def _batch_is_not_alignment(run: Recording) -> Verdict:
    values = {d: min(v for (e, vary, _), v in _relative(run).items() if e == d and vary == "batch")
              for d in dict.fromkeys(d for d, _, _ in _relative(run))}
    return verdict(min(values.values()) >= 0.9, ", ".join(f"{d} at least {v:.0%}" for d, v in values.items()))


BATCH_IS_NOT_ALIGNMENT = Claim(
    "batch_is_not_alignment", "Moving the batch up to 8 samples either way, to a multiple of 8 or not, costs no "
    "format more than 10% of its rate.", ALIGNMENT, _batch_is_not_alignment)
