"""What chapter 06 states about an LSTM layer's time and a transformer's training step, as claims checked on every
recorded GPU (:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch06_recurrent_and_attention.recurrent import IMPLEMENTATIONS
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

LSTM = "rnn_lstm_layer"
STEP = "attention_training_step"
LOOP, HOISTED, FUSED = IMPLEMENTATIONS


def _per_step(run: Recording) -> dict[tuple[str, int, int, str], float]:
    """Seconds per time step by (dtype, sequence length, hidden size, implementation)."""
    found = {(r["dtype"], r["seq_len"], r["hidden"], r["implementation"]): r["ms_per_step"] / 1e3
             for r in ok_rows(run.rows)}
    if not found:
        raise KeyError("no LSTM layer measured")
    return found


def _points(times: dict) -> list[tuple[str, int, int]]:
    return list(dict.fromkeys(key[:3] for key in times))


def _loop_launch_bound(run: Recording) -> Verdict:
    times = _per_step(run)
    hidden = sorted({h for _, _, h in _points(times)})
    small, large = hidden[0], hidden[-1]
    growth = {(d, t): times[d, t, large, LOOP] / times[d, t, small, LOOP]
              for d, t in dict.fromkeys((d, t) for d, t, _ in _points(times))}
    return verdict(large >= 8 * small and all(g < 2 for g in growth.values()),
                   f"H {small:,} to {large:,}: the loop's time per step x " +
                   ", ".join(f"{g:.2f} ({d}, T = {t})" for (d, t), g in growth.items()))


LOOP_LAUNCH_BOUND = Claim(
    "loop_launch_bound", "From the smallest hidden size to the largest, eight times larger, the GEMM work per step "
    "grows 64-fold, but the per-step loop's time per step grows by less than a factor of two: launching its small "
    "kernels, not its arithmetic, sets its pace.", LSTM, _loop_launch_bound)


def _hoisting(run: Recording, dtype: str) -> dict[int, float]:
    times = _per_step(run)
    large = max(h for _, _, h in _points(times))
    saved = {t: 1 - times[dtype, t, large, HOISTED] / times[dtype, t, large, LOOP]
             for d, t, h in _points(times) if d == dtype and h == large}
    if not saved:
        raise KeyError(f"no {dtype} point at H = {large}")
    return saved


def _hoisting_helps_float32(run: Recording) -> Verdict:
    saved = _hoisting(run, "float32")
    return verdict(min(saved.values()) >= 0.1, ", ".join(f"T = {t}: {s:.0%} saved" for t, s in saved.items()))


HOISTING_HELPS_FLOAT32 = Claim(
    "hoisting_helps_float32", "In float32 at the largest hidden size, where the loop's time grows with $H$, hoisting "
    "the input GEMM saves at least a tenth of the time per step.", LSTM, _hoisting_helps_float32)


def _hoisting_unreliable_float16(run: Recording) -> Verdict:
    times = _per_step(run)
    slower = [(t, h) for d, t, h in _points(times) if d == "float16" and times[d, t, h, HOISTED] > times[d, t, h, LOOP]]
    return verdict(bool(slower), "hoisted slower at " + (", ".join(f"T = {t}, H = {h:,}" for t, h in slower)
                                                        or "no size"))


HOISTING_UNRELIABLE_FLOAT16 = Claim(
    "hoisting_unreliable_float16", "In float16, where each step's GEMMs take little time on the tensor cores, "
    "hoisting is not reliably faster: at one size or more the hoisted loop is slower than the plain one.", LSTM,
    _hoisting_unreliable_float16)


def _cudnn_fastest(run: Recording) -> Verdict:
    times = _per_step(run)
    points = _points(times)
    speedup = {p: times[(*p, LOOP)] / times[(*p, FUSED)] for p in points}
    fastest = all(times[(*p, FUSED)] < min(times[(*p, LOOP)], times[(*p, HOISTED)]) for p in points)
    best, worst = max(speedup, key=speedup.get), min(speedup, key=speedup.get)
    small, large = min(h for _, _, h in points), max(h for _, _, h in points)
    holds = fastest and best[0] == "float16" and best[2] == small and worst[0] == "float32" and worst[2] == large
    return verdict(holds, f"speed-up over the loop from {speedup[worst]:.1f} x ({worst[0]}, T = {worst[1]}, "
                          f"H = {worst[2]:,}) to {speedup[best]:.0f} x ({best[0]}, T = {best[1]}, H = {best[2]:,})")


CUDNN_FASTEST = Claim(
    "cudnn_fastest", "`nn.LSTM` is faster than both loops at every size and in both formats. Its speed-up over the "
    "loop is largest in float16 at the smallest hidden size, where the loop's launches are almost all of its time, "
    "and smallest in float32 at the largest, where the arithmetic on the CUDA cores is most of both.", LSTM,
    _cudnn_fastest)


def _shares(run: Recording) -> dict[str, dict[str, dict]]:
    by = {}
    for r in run.rows:
        by.setdefault(r["precision"], {})[r["category"]] = r
    if not {"float32", "bfloat16"} <= set(by):
        raise KeyError(f"float32 and bfloat16 profiles needed, got {sorted(by)}")
    return by


def _gemm_most_float32(run: Recording) -> Verdict:
    share = _shares(run)["float32"]["GEMM"]["share"]
    return verdict(share > 0.5, f"GEMM {share:.0%} of the kernels' time in float32")


GEMM_MOST_FLOAT32 = Claim(
    "gemm_most_float32", "In float32 the GEMMs take more than half of the GPU kernels' time of a training step.", STEP,
    _gemm_most_float32)


def _rest(categories: dict[str, dict]) -> float:
    return sum(r["seconds"] for c, r in categories.items() if c not in ("GEMM", "attention (fused)"))


def _bfloat16_moves_the_balance(run: Recording) -> Verdict:
    by = _shares(run)
    gemm = by["float32"]["GEMM"]["seconds"] / by["bfloat16"]["GEMM"]["seconds"]
    rest = _rest(by["float32"]) / _rest(by["bfloat16"])
    shares = [by[p]["GEMM"]["share"] for p in ("float32", "bfloat16")]
    return verdict(gemm >= 5 and rest < 2 and shares[1] < shares[0],
                   f"GEMM {gemm:.1f} x faster, the rest {rest:.2f} x; GEMM's share {shares[0]:.0%} -> {shares[1]:.0%}")


BFLOAT16_MOVES_THE_BALANCE = Claim(
    "bfloat16_moves_the_balance", "With bfloat16 autocast the GEMM kernels run at least five times faster, while "
    "the work other than GEMM and fused attention gets less than twice faster, so the GEMMs' share of the time "
    "falls.", STEP, _bfloat16_moves_the_balance)
