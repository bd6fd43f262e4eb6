"""What chapter 09 states about the SGEMM worklog, its tuning and tile and wave quantization, as claims checked on
every recorded GPU (:mod:`gpulab.core.claims`)."""

from __future__ import annotations

import statistics

from gpulab.ch09_gemm_on_the_gpu import counters
from gpulab.ch09_gemm_on_the_gpu.figures import variant_name
from gpulab.ch09_gemm_on_the_gpu.gemm import blocks_per_busiest_sm, fit_partial, sm_efficiency
from gpulab.core import counter_figures, specs
from gpulab.core.claims import Claim, Verdict, same_gpu, verdict
from gpulab.core.counter_figures import top_stall
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

WORKLOG, TUNING = "gemm_worklog", "gemm_tuning"
WAVES, TILES = "gemm_wave_quantization", "gemm_tile_quantization"


# --- the worklog -------------------------------------------------------------------------------------------------

def _steps(run: Recording) -> dict[int, dict]:
    """The worklog's rows by step number (0: cuBLAS)."""
    rows = {r["step"]: r for r in ok_rows(run.rows)}
    if 0 not in rows or len(rows) < 3:
        raise KeyError("the worklog needs cuBLAS (step 0) and at least two steps")
    return rows


def _gains(run: Recording) -> dict[int, float]:
    """Each step's rate over the step before it."""
    rows = _steps(run)
    numbers = sorted(n for n in rows if n > 0)
    return {n: rows[n]["tflops"] / rows[p]["tflops"] for p, n in zip(numbers, numbers[1:], strict=False)}


def _coalescing_gains_most(run: Recording) -> Verdict:
    gains = _gains(run)
    runner_up = max((n for n in gains if n != 2), key=gains.get)
    return verdict(gains[2] > max(g for n, g in gains.items() if n != 2),
                   f"step 2 {gains[2]:.1f}x over step 1; the next largest gain, step {runner_up}, "
                   f"{gains[runner_up]:.2f}x")


COALESCING_GAINS_MOST = Claim(
    "coalescing_gains_most", "Coalescing (step 2) is the largest single gain of the worklog, larger than any later "
    "step's.", WORKLOG, _coalescing_gains_most)


def _registers_beat_shared_tiles(run: Recording) -> Verdict:
    gains = _gains(run)
    return verdict(gains[3] < min(gains[4], gains[5]),
                   f"step 3 {gains[3]:.2f}x, step 4 {gains[4]:.2f}x, step 5 {gains[5]:.2f}x")


REGISTERS_BEAT_SHARED_TILES = Claim(
    "registers_beat_shared_tiles", "Shared-memory tiling (step 3), which cuts the loads from global memory 32-fold, "
    "gains less than either step of register blocking (steps 4 and 5), which cut the loads from shared memory per "
    "FMA.", WORKLOG, _registers_beat_shared_tiles)


def _every_step_gains(run: Recording) -> Verdict:
    gains = _gains(run)
    smallest = min(gains, key=gains.get)
    return verdict(all(g > 1 for g in gains.values()),
                   f"the smallest gain, step {smallest}, {gains[smallest]:.2f}x")


EVERY_STEP_GAINS = Claim("every_step_gains", "Every step is faster than the one before it.", WORKLOG,
                         _every_step_gains)


def _best_near_cublas(run: Recording) -> Verdict:
    rows = _steps(run)
    best = max((n for n in rows if n > 0), key=lambda n: rows[n]["tflops"])
    share = rows[best]["fraction_of_cublas"]
    return verdict(best == max(rows) and 0.85 <= share <= 0.95,
                   f"step {best} at {share:.1%} of cuBLAS ({rows[best]['tflops']:.1f} against "
                   f"{rows[0]['tflops']:.1f} TFLOP/s)")


BEST_NEAR_CUBLAS = Claim(
    "best_near_cublas", "The last step is the fastest, at about nine tenths of cuBLAS (between 85% and 95%), past "
    "the chapter's target of 80%.", WORKLOG, _best_near_cublas)


def _low_occupancy_fastest(run: Recording) -> Verdict:
    rows = [r for n, r in _steps(run).items() if n > 0]
    quarter = [r for r in rows if r["occupancy"] <= 0.25]
    full = [r for r in rows if r["occupancy"] >= 1.0]
    if not quarter or not full:
        raise KeyError("no step at 25% occupancy or none at 100%")
    slowest_quarter, fastest_full = min(r["tflops"] for r in quarter), max(r["tflops"] for r in full)
    return verdict(slowest_quarter > fastest_full and max(rows, key=lambda r: r["tflops"]) in quarter,
                   f"slowest step at 25% occupancy {slowest_quarter:.1f} TFLOP/s, fastest at 100% "
                   f"{fastest_full:.1f} TFLOP/s")


LOW_OCCUPANCY_FASTEST = Claim(
    "low_occupancy_fastest", "Every step that runs a quarter of the threads an SM can hold is faster than every step "
    "that fills the SM: occupancy is a means, not a goal.", WORKLOG, _low_occupancy_fastest)


def _caches_serve_step_2(run: Recording) -> Verdict:
    spec = specs.find(run.device_name)
    if spec is None:
        raise KeyError(f"no datasheet for {run.device_name}")
    bound = spec.bandwidth_gb_s * 1e9 * 2 / 8 / 1e12  # TFLOP/s: 2 flops per FMA, 8 bytes per FMA from memory
    rate = _steps(run)[2]["tflops"]
    return verdict(rate > 2 * bound, f"step 2 {rate:.2f} TFLOP/s; with every load from memory at "
                   f"{spec.bandwidth_gb_s:,} GB/s at most {bound:.2f} ({rate / bound:.1f}x)")


CACHES_SERVE_STEP_2 = Claim(
    "caches_serve_step_2", "Step 2 runs more than twice as fast as it could if its two loads per FMA all came from "
    "device memory: the L1 and L2 caches serve most of them.", WORKLOG, _caches_serve_step_2)


# --- tuning ------------------------------------------------------------------------------------------------------

def _defaults_fastest(run: Recording) -> Verdict:
    rows = ok_rows(run.rows)
    defaults = next(r for r in rows if r["label"] == "prefetched fragments")
    fastest = max(rows, key=lambda r: r["tflops"])
    spilling = [r for r in rows if r["spill_bytes"]]
    runner_up = max((r for r in rows if r is not defaults), key=lambda r: r["tflops"])
    return verdict(fastest is defaults and spilling and all(r["tflops"] < defaults["tflops"] for r in spilling),
                   f"defaults {defaults['tflops']:.2f} TFLOP/s, next {variant_name(runner_up['label'])} "
                   f"{runner_up['tflops']:.2f}; spilling variants at most "
                   f"{max(r['tflops'] for r in spilling):.2f}")


DEFAULTS_FASTEST = Claim(
    "defaults_fastest", "The file's defaults are the fastest variant of the sweep, and every variant that spills "
    "registers is slower than they are.", TUNING, _defaults_fastest)


# --- wave and tile quantization ----------------------------------------------------------------------------------

def _sweep(run: Recording) -> list[dict]:
    rows = sorted(ok_rows(run.rows), key=lambda r: r["n"])
    if len(rows) < 3:
        raise ValueError(f"{len(rows)} measurements: too few for a sweep")
    return rows


def _steps_up(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(before, after) where the busiest SM gets another block."""
    return [(b, a) for b, a in zip(rows, rows[1:], strict=False) if blocks_per_busiest_sm(a) > blocks_per_busiest_sm(b)]


def _drops_at_every_block(run: Recording) -> Verdict:
    steps = _steps_up(_sweep(run))
    odd = [(b, a) for b, a in steps if blocks_per_busiest_sm(b) % b["resident"]]  # tiles pass an odd multiple of SMs
    drops = [a["kernel_tflops"] / b["kernel_tflops"] for b, a in steps]
    slot_silent = all(a["efficiency"] >= b["efficiency"] for b, a in odd)
    return verdict(steps and odd and all(d < 0.95 for d in drops) and slot_silent,
                   f"{len(steps)} points, {len(odd)} of them where the slot model rises; the rate falls at each, by "
                   f"{1 - max(drops):.0%} to {1 - min(drops):.0%}")


DROPS_AT_EVERY_BLOCK = Claim(
    "drops_at_every_block", "The kernel's rate falls by more than 5% at every point where the busiest SM gets "
    "another block, including those where the tiles pass an odd multiple of the SMs and the slot model predicts no "
    "drop at all.", WAVES, _drops_at_every_block)


def _lone_block_fast(run: Recording) -> Verdict:
    rows = _sweep(run)
    lone = max((r for r in rows if r["tiles"] <= r["sms"]), key=lambda r: r["tiles"])
    pair = max((r for r in rows if r["sms"] < r["tiles"] <= r["slots"]), key=lambda r: r["tiles"])
    share = lone["kernel_tflops"] / pair["kernel_tflops"]
    slot_share = lone["efficiency"] / pair["efficiency"]
    return verdict(share > 0.8 and slot_share < 0.55,
                   f"{lone['tiles']} tiles at {share:.0%} of the rate at {pair['tiles']} tiles; the slot model "
                   f"{slot_share:.0%}")


LONE_BLOCK_FAST = Claim(
    "lone_block_fast", "With fewer tiles than SMs, one block on each, the kernel reaches more than 80% of its rate "
    "at two blocks per SM, where the slot model allows about half.", WAVES, _lone_block_fast)


def _partial_near_half(run: Recording) -> Verdict:
    p = fit_partial(run.rows)
    return verdict(0.5 <= p <= 0.6, f"p = {p:.3f}: one block does {1 / (2 * p):.0%} of the work per second of two")


PARTIAL_NEAR_HALF = Claim(
    "partial_near_half", "A block alone on its SM takes between 0.5 and 0.6 of the time of a pair (the fitted $p$): "
    "an SM that runs one block still does more than four fifths of the work per second of one that runs two.",
    WAVES, _partial_near_half)


def _correlation(x: list[float], y: list[float]) -> float:
    return statistics.correlation(x, y)


def _per_sm_model_fits(run: Recording) -> Verdict:
    wave = same_gpu(run, WAVES)
    p = fit_partial(wave.rows)
    said, holds = [], True
    for name, rows in (("wave", _sweep(wave)), ("tile", _sweep(run))):
        measured = [r["kernel_tflops"] for r in rows]
        per_sm = [sm_efficiency(r, p) for r in rows]
        model, slot = _correlation(per_sm, measured), _correlation([r["efficiency"] for r in rows], measured)
        cublas = _correlation(per_sm, [r["cublas_tflops"] for r in rows])
        holds &= model > 0.95 and model > slot and cublas < 0.8
        said.append(f"{name} sweep: per SM {model:.3f}, slots {slot:.3f}, per SM with cuBLAS {cublas:.3f}")
    return verdict(holds, "; ".join(said))


PER_SM_MODEL_FITS = Claim(
    "per_sm_model_fits", "In both sweeps the per-SM model, with the $p$ fitted on the wave sweep, follows the kernel "
    "closely (a correlation above 0.95) and better than the slot model; it does not follow cuBLAS (below 0.8).",
    TILES, _per_sm_model_fits)


def _falls_only_at_blocks(run: Recording) -> Verdict:
    rows = _sweep(run)
    steps = {id(a) for _, a in _steps_up(rows)}
    elsewhere = [a["kernel_tflops"] / b["kernel_tflops"] for b, a in zip(rows, rows[1:], strict=False)
                 if id(a) not in steps]
    at_blocks = [a["kernel_tflops"] / b["kernel_tflops"] for b, a in _steps_up(rows)]
    return verdict(at_blocks and min(elsewhere) > 0.99 and max(at_blocks) < 0.95,
                   f"largest fall between those points {max(0.0, 1 - min(elsewhere)):.1%}; falls where the busiest "
                   f"SM gets another block {', '.join(f'{1 - r:.0%}' for r in at_blocks)}")


FALLS_ONLY_AT_BLOCKS = Claim(
    "falls_only_at_blocks", "Across the tile sweep the rate falls by more than 5% where the busiest SM gets another "
    "block and nowhere else by more than 1%: a partial column of tiles costs a whole one, but that shows only where "
    "it adds a block to the busiest SM.", TILES, _falls_only_at_blocks)


def _cublas_faster_and_smoother(run: Recording) -> Verdict:
    rows = _sweep(run)
    slowest = min(r["cublas_tflops"] / r["kernel_tflops"] for r in rows)
    spread = {key: min(r[key] for r in rows) / max(r[key] for r in rows) for key in ("kernel_tflops", "cublas_tflops")}
    return verdict(slowest > 1 and spread["cublas_tflops"] > spread["kernel_tflops"],
                   f"cuBLAS at least {slowest:.2f}x step 9; slowest size over fastest: cuBLAS "
                   f"{spread['cublas_tflops']:.0%}, step 9 {spread['kernel_tflops']:.0%}")


CUBLAS_FASTER_AND_SMOOTHER = Claim(
    "cublas_faster_and_smoother", "cuBLAS is faster than step 9 at every size of the wave sweep, and its rate varies "
    "less from size to size: it picks its tile per shape.", WAVES, _cublas_faster_and_smoother)


def _alignment_worth_little(run: Recording) -> Verdict:
    rows = _sweep(run)
    said, holds = [], True
    for key, name in (("kernel_tflops", "step 9"), ("cublas_tflops", "cuBLAS")):
        aligned = statistics.mean(r[key] for r in rows if r["n"] % 128 == 0)
        other = statistics.mean(r[key] for r in rows if r["n"] % 128)
        holds &= 1 < aligned / other < 1.05
        said.append(f"{name} {aligned / other - 1:+.1%}")
    return verdict(holds, "multiples of 128 over the rest: " + ", ".join(said))


ALIGNMENT_WORTH_LITTLE = Claim(
    "alignment_worth_little", "In the tile sweep, sizes that are multiples of 128 run faster on average than those "
    "that are not, for step 9 and for cuBLAS, but by less than 5%.", TILES, _alignment_worth_little)


# --- the worklog's hardware counters (profiled in chapter 18) ----------------------------------------------------

def _counters_find_2n3(run: Recording) -> Verdict:
    steps, cublas = counters.worklog_rows(run)
    ratios = [r["flops_ratio"] for r in [*steps, cublas]]
    return verdict(all(r["flops_within"] for r in [*steps, cublas]),
                   f"counted FLOPs / 2n³ from {min(ratios):.3f} to {max(ratios):.3f}")


COUNTERS_FIND_2N3 = Claim(
    "counters_find_2n3", "The counters find the book's $2n^3$ FLOPs in every step and in cuBLAS, within 10%: what the "
    "worklog changes is how the operands reach the FMAs, not how many FMAs there are.", counters.EXPERIMENT,
    _counters_find_2n3)

MEMORY_WAITS = ("lg_throttle", "long_scoreboard", "mio_throttle", "short_scoreboard")


def _first_steps_wait_on_chip(run: Recording) -> Verdict:
    steps, _ = counters.worklog_rows(run)
    roof = counter_figures.roof_with_peaks(run, ["float32"])
    first = steps[:counters.FIRST]
    dram = [r["dram_gbytes_per_s"] * 1e9 / roof.bandwidth for r in first]
    busy = [r["memory_throughput_pct"] for r in first]
    waits = [top_stall(r)[0] for r in first]
    return verdict(min(busy) >= 70 and max(dram) < 0.2 and all(w in MEMORY_WAITS for w in waits),
                   f"memory units {min(busy):.0f}% to {max(busy):.0f}% busy, DRAM at {max(dram):.0%} of its bandwidth "
                   f"at most; top stalls {', '.join(waits)}")


FIRST_STEPS_WAIT_ON_CHIP = Claim(
    "first_steps_wait_on_chip", "Steps 1 to 3 keep their memory units at least 70% busy while DRAM moves less than a "
    "fifth of its bandwidth, and their warps wait most on loads and stores (a full queue or a load's data): what "
    "holds them back is the traffic between the SMs and their caches and shared memory, not DRAM.",
    counters.EXPERIMENT, _first_steps_wait_on_chip)


def _blocked_right_of_ridge(run: Recording) -> Verdict:
    steps, cublas = counters.worklog_rows(run)
    ridge = counter_figures.roof_with_peaks(run, ["float32"]).ridge("float32")
    later = [*steps[counters.FIRST:], cublas]
    low = min(later, key=lambda r: r["intensity"])
    return verdict(low["intensity"] >= 5 * ridge, f"lowest: {low['label']} at {low['intensity']:.0f} FLOP per DRAM "
                   f"byte, {low['intensity'] / ridge:.1f}x the float32 ridge ({ridge:.1f})")


BLOCKED_RIGHT_OF_RIDGE = Claim(
    "blocked_right_of_ridge", "From step 4 on, every step and cuBLAS lies at least five times right of the float32 "
    "ridge: the roof above it is the FP32 peak, and DRAM, however many bytes above the book's count it moves, is not "
    "what holds it back.", counters.EXPERIMENT, _blocked_right_of_ridge)
