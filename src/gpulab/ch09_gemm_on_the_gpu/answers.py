"""Worked answers to the exercises of chapter 09, "GEMM on the GPU": every number computed when it is shown, from
the chapter's own models (:mod:`.gemm`), the tile and wave model of chapter 04, the compiler's report and the
recordings. No experiment runs here, and no GPU is needed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from gpulab.ch04_mlp_gemms import waves
from gpulab.ch08_memory_hierarchy import memory
from gpulab.ch09_gemm_on_the_gpu import gemm
from gpulab.ch09_gemm_on_the_gpu.figures import variant_name
from gpulab.core import occupancy, recordings, specs
from gpulab.core.printing import Answer

FEED_FORWARD = 16384  # the weights' columns in exercise 5
H100 = "H100 SXM5 80GB"
MAX_THREADS_PER_BLOCK = 1024  # CUDA's limit, the same on every GPU of the book


def _fraction(x: float) -> str:
    return f"1/{1 / x:g}" if x and (1 / x).is_integer() else f"{x:.4g}"


def exercise_1() -> Answer:
    step3, step4, step5 = (gemm.step(number) for number in (3, 4, 5))
    t3, t4, t5 = (gemm.traffic(s) for s in (step3, step4, step5))
    wide = gemm.traffic(dataclasses.replace(step3, tile=(64, 64)))
    threads = 64 * 64
    outputs4, outputs5 = math.prod(step4.thread_tile), math.prod(step5.thread_tile)
    return Answer("Answer to exercise 1", (
        f"Step 3 stages {step3.tile[0]} x {step3.tile[1]} tiles in shared memory: `gemm.traffic` gives "
        f"{_fraction(t3['global_floats_per_fma'])} float from global memory per FMA. With 64 x 64 tiles it falls to "
        f"{_fraction(wide['global_floats_per_fma'])}: each loaded value serves twice as many FMAs.",
        f"One thread per output would take {threads:,} threads, more than the {MAX_THREADS_PER_BLOCK:,} a block may "
        f"have. So each thread computes several outputs: {step4.threads[0]} threads with {outputs4} outputs each "
        f"(step 4), or {step5.threads[0]} with {outputs5} each (step 5). That is register blocking.",
        f"`gemm.traffic`: step 4 ({step4.tile[0]} x {step4.tile[1]} block tile) loads "
        f"{_fraction(t4['global_floats_per_fma'])} float per FMA, step 5 ({step5.tile[0]} x {step5.tile[1]}) "
        f"{_fraction(t5['global_floats_per_fma'])}: exactly a shared tile of the same size.",
        "The reason: traffic to global memory depends only on the block's tile of C. Each value of A the block "
        "loads serves its BN columns, each value of B its BM rows, however the threads split the work.",
        f"What register blocking changes is the next level down, the shared-memory loads per FMA: "
        f"{t3['shared_loads_per_fma']:g} for step 3, {t4['shared_loads_per_fma']:g} for step 4, "
        f"{t5['shared_loads_per_fma']:g} for step 5.",
    ))


def exercise_2() -> Answer:
    k = 4096
    sectors_a1 = memory.sectors_per_warp(k)  # lane t reads A[i + t][kk]: K floats apart
    sectors_b2 = memory.sectors_per_warp(1)  # lane t reads B[kk][j + t]: neighbours
    lines = [
        f"Step 1 maps `threadIdx.x` to rows: a warp's 32 lanes hold 32 rows i of C and one column j. At each k, lane "
        f"t reads A[i + t][k], {k:,} floats from its neighbour when K = {k:,}: `memory.sectors_per_warp({k})` = "
        f"{sectors_a1} sectors. All lanes read the same B[k][j]: one sector, broadcast.",
        f"Step 2 maps `threadIdx.x` to columns: the lanes share row i and hold 32 neighbouring columns. A[i][k] is "
        f"one address, one sector; B[k][j + t] are neighbours: `memory.sectors_per_warp(1)` = {sectors_b2} sectors.",
        f"So per k a warp touches {sectors_a1 + 1} sectors in step 1 against {1 + sectors_b2} in step 2, for the "
        f"same 32 FMAs: {(sectors_a1 + 1) / (1 + sectors_b2):.1f} times fewer bytes requested.",
    ]
    for run in recordings.recorded("gemm_worklog"):
        rate = {row["step"]: row["tflops"] for row in run.rows}
        lines.append(f"On the {run.short_label} (recorded) step 2 ran {rate[2] / rate[1]:.1f} times faster than step "
                     f"1: less than the sector count says, because L1 and L2 serve many of step 1's repeated sectors.")
    return Answer("Answer to exercise 2", tuple(lines))


def exercise_3() -> Answer:
    default, capped = gemm.BEST, gemm.prefetched(MIN_BLOCKS=3)
    before, after = gemm.resources(default), gemm.resources(capped)
    cap = 65536 // (after["threads"] * 3)
    lines = [
        f"`__launch_bounds__` with 3 blocks of {after['threads']} threads caps a thread at 65,536 / "
        f"{3 * after['threads']} = {cap} registers. The compiler's report (for an H100 where there is no GPU): "
        f"{after['registers']} registers and {after['spill_bytes']:,} bytes of spills per thread, against "
        f"{before['registers']} registers and {before['spill_bytes']} bytes for the defaults.",
        f"It buys {after['blocks_per_sm']} resident blocks per SM instead of {before['blocks_per_sm']}, but the 64 "
        "accumulators and the two sets of fragments no longer fit: the spilled values go to local memory and come "
        "back on every slice. Predict a slower kernel, like the variants that spilled in the tuning table.",
    ]
    for run in recordings.recorded("gemm_tuning"):
        base = next(row for row in run.rows if row["label"] == default.label)
        spilled = [row for row in run.rows if row["spill_bytes"]]
        if spilled:
            worst = min(spilled, key=lambda row: row["tflops"])
            lines.append(f"On the {run.short_label} (recorded), {len(spilled)} variants spilled; the slowest of them, "
                         f"{variant_name(worst['label'])}, ran at "
                         f"{worst['tflops'] / base['tflops']:.0%} of the defaults.")
    t4 = occupancy.limits(specs.gpu("T4").compute_capability)
    on_t4 = [occupancy.theoretical(r["threads"], r["registers"], r["shared_bytes"], t4).blocks_per_sm
             for r in (before, after)]
    lines.append(f"On a T4 (compute capability {t4.compute_capability}) the same registers allow {on_t4[1]} blocks "
                 f"per SM against {on_t4[0]}: the same trade, spills included. To measure it on a GPU: "
                 "`gemm.tuning(4096, variants=[{}, {\"MIN_BLOCKS\": 3}])`, and compare the two rows' TFLOP/s.")
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4() -> Answer:
    gpu = specs.gpu(H100)
    slots = gpu.sms * gemm.resources(gemm.BEST)["blocks_per_sm"]
    tile = gemm.BEST.tile[0]
    sizes = range(2048, 8192 + 1, tile)
    models = {n: waves.tile_waves(n, n, gemm.BEST.tile, slots) for n in sizes}
    full = [n for n, model in models.items() if model.wave_efficiency == 1]
    side = next(t for t in itertools.count(1) if t * t % slots == 0)
    best = sorted(models, key=lambda n: -models[n].wave_efficiency)[:3]
    return Answer("Answer to exercise 4", (
        f"An n x n output has (n/{tile})^2 tiles of {tile} x {tile}, and an H100 runs {gpu.sms} SMs x 2 = {slots} "
        "of them at once. The last wave is full when the tile count is a multiple of the slots.",
        f"Between 2048 and 8192, in steps of {tile}: "
        + (", ".join(f"{n:,}" for n in full) if full else "no size")
        + f" fills its last wave. The smallest side that does is {tile * side:,}: (n/{tile})^2 must be a multiple of "
        f"{slots}, so n/{tile} must be a multiple of {side}.",
        "The fullest last waves in the range: "
        + "; ".join(f"n = {n:,}, {models[n].tiles:,} tiles in {models[n].waves} waves, "
                    f"{models[n].wave_efficiency:.1%} of the slots busy" for n in best) + ".",
        "For square sizes, then, pick a large n: the waves are many and the last one costs little, whatever it holds.",
    ))


def _slots_per_gpu() -> list[tuple[str, int]]:
    """(name, slots) of each GPU that recorded the wave sweep, and of a T4 by the occupancy model."""
    found = [(f"{run.short_label} (recorded)", run.rows[0]["slots"])
             for run in recordings.recorded("gemm_wave_quantization") if run.rows]
    t4 = specs.gpu("T4")
    step9 = gemm.resources(gemm.BEST)
    resident = occupancy.theoretical(step9["threads"], step9["registers"], step9["shared_bytes"],
                                     occupancy.limits(t4.compute_capability)).blocks_per_sm
    return [*found, (f"T4 (model, {resident} blocks per SM)", t4.sms * resident)]


def exercise_5() -> Answer:
    batches = range(256, 4096 + 1)
    lines = [f"The output is b x {FEED_FORWARD:,}: {FEED_FORWARD // 128} tiles of 128 x 128 per 128 rows, so "
             "ceil(b/128) x 128 tiles. The last wave is partial unless that count is a multiple of the GPU's slots "
             "(SMs x blocks per SM). `waves.tile_waves(b, 16384, (128, 128), slots)` counts it for every b:"]
    for name, slots in _slots_per_gpu():
        models = {b: waves.tile_waves(b, FEED_FORWARD, (128, 128), slots) for b in batches}
        partial = sum(1 for m in models.values() if m.wave_efficiency < 1)
        worst = min(models, key=lambda b: (models[b].wave_efficiency, b))
        model = models[worst]
        lines.append(f"- {name}, {slots} slots: {partial:,} of the {len(models):,} batch sizes end on a partial wave. "
                     f"The worst is b = {worst:,}: {model.tiles:,} tiles in {model.waves} waves, the last holding "
                     f"{model.tiles - (model.waves - 1) * slots:,}: at best {model.wave_efficiency:.0%} of the "
                     f"full-wave rate ({model.efficiency:.0%} counting partial tiles too).")
    lines.append("The cost shrinks as b grows: more waves, and one partial wave is a smaller share of them. The "
                 "chapter's per-SM model refines it: a half-full SM is not half as fast.")
    return Answer("Answer to exercise 5", tuple(lines))
