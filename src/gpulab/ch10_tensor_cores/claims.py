"""What chapter 10 states about tensor cores, number formats, WMMA, TF32 and alignment, as claims checked on every
recorded GPU (:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch10_tensor_cores import counters
from gpulab.core import counter_figures
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.counter_figures import top_stall
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

FORMATS = "tensor_formats"
WMMA = "tensor_wmma"
TF32 = "tensor_tf32_switch"
ALIGNMENT = "tensor_alignment"
VOCABULARY = "tensor_vocabulary"
BATCHES = "tensor_batch_sizes"


def _by(run: Recording, key: str) -> dict[str, dict]:
    return {r[key]: r for r in ok_rows(run.rows)}


def _formats(run: Recording) -> dict[str, dict]:
    rows = _by(run, "format")
    for name in ("float32", "tf32", "float16", "bfloat16", "float8_e4m3fn"):
        if name not in rows:
            raise KeyError(f"no row for {name}")
    return rows


def _halving_doubles(run: Recording) -> Verdict:
    f = _formats(run)
    sixteen = min(f["float16"]["tflops"], f["bfloat16"]["tflops"])
    steps = {"tf32 -> float16/bfloat16": sixteen / f["tf32"]["tflops"],
             "float16 -> float8": f["float8_e4m3fn"]["tflops"] / f["float16"]["tflops"]}
    return verdict(all(1.6 <= x <= 2.2 for x in steps.values()),
                   ", ".join(f"{k} {x:.2f}x" for k, x in steps.items()))


HALVING_DOUBLES = Claim(
    "halving_doubles", "On the tensor cores each halving of the bits an input occupies multiplies the rate by 1.6 "
    "to 2.2: TF32 (read from 32-bit words) to float16 and bfloat16, and float16 to float8, as the datasheet's "
    "factors of 2 predict.", FORMATS, _halving_doubles)


def _sixteen_bit_alike(run: Recording) -> Verdict:
    f = _formats(run)
    rates = f["bfloat16"]["tflops"] / f["float16"]["tflops"]
    errors = f["bfloat16"]["relative_error"] / f["float16"]["relative_error"]
    return verdict(abs(rates - 1) <= 0.1 and 5 <= errors <= 12,
                   f"rate bfloat16/float16 {rates:.2f}, error bfloat16/float16 {errors:.1f}")


SIXTEEN_BIT_ALIKE = Claim(
    "sixteen_bit_alike", "float16 and bfloat16 run within 10% of each other's rate, and bfloat16's error is about "
    "$2^3$ times float16's (between 5 and 12 times): it keeps 3 fraction bits fewer.", FORMATS, _sixteen_bit_alike)


def _below_peak(run: Recording) -> Verdict:
    f = _formats(run)
    best = max(f.values(), key=lambda r: r["fraction_of_peak"])
    return verdict(best["fraction_of_peak"] < 0.85, f"closest to its peak: {best['format']} at "
                                                     f"{best['fraction_of_peak']:.0%}")


BELOW_PEAK = Claim(
    "below_peak", "None of the formats reaches 85% of its peak at this size.", FORMATS, _below_peak)


def _wmma(run: Recording) -> tuple[dict, list[dict], dict, dict]:
    rows = ok_rows(run.rows)
    naive = next(r for r in rows if r["file"] == "25_wmma_naive")
    pipelined = [r for r in rows if r["file"] == "26_wmma_pipelined"]
    sgemm = max((r for r in rows if r["file"].startswith("24_")), key=lambda r: r["tflops"])
    cublas = next(r for r in rows if r["name"] == "cuBLAS float16")
    if not pipelined:
        raise KeyError("no pipelined WMMA row")
    return naive, pipelined, sgemm, cublas


def _naive_beats_half_sgemm(run: Recording) -> Verdict:
    naive, pipelined, sgemm, _ = _wmma(run)
    best = max(pipelined, key=lambda r: r["tflops"])
    share, gain = naive["tflops"] / sgemm["tflops"], best["tflops"] / naive["tflops"]
    return verdict(share > 0.5 and gain >= 8, f"naive WMMA {naive['tflops']:.1f} TFLOP/s, {share:.0%} of the best "
                                              f"SGEMM; the best pipelined {best['tflops']:.0f}, {gain:.1f}x the naive")


NAIVE_AND_PIPELINED = Claim(
    "naive_and_pipelined", "The naive WMMA kernel runs at more than half the rate of the best SGEMM, and blocking, "
    "staging and the pipeline multiply its rate by eight or more.", WMMA, _naive_beats_half_sgemm)


def _best_misses_half(run: Recording) -> Verdict:
    _, pipelined, sgemm, cublas = _wmma(run)
    best = max(pipelined, key=lambda r: r["tflops"])
    share = best["tflops"] / cublas["tflops"]
    return verdict(share < 0.5 and best["tflops"] > sgemm["tflops"],
                   f"best WMMA {best['tflops']:.0f} TFLOP/s, {share:.1%} of cuBLAS float16 "
                   f"({cublas['tflops']:.0f}); best SGEMM {sgemm['tflops']:.0f}")


BEST_MISSES_HALF = Claim(
    "best_misses_half", "The best WMMA kernel beats the best SIMT SGEMM many times over, but stays under half of "
    "cuBLAS float16: the chapter's first target is missed.", WMMA, _best_misses_half)


def _narrow_tiles_slower(run: Recording) -> Verdict:
    _, pipelined, _, _ = _wmma(run)
    default = next(r for r in pipelined if r["name"] == "WMMA, pipelined")
    narrow = [r for r in pipelined if r.get("WM") == 32 or r.get("WN") == 32]
    if not narrow:
        raise KeyError("no variant with 32-wide warp tiles")
    return verdict(all(r["tflops"] < default["tflops"] and r["warps_per_sm"] > default["warps_per_sm"]
                       for r in narrow),
                   f"64 x 64 warp tiles {default['tflops']:.0f} TFLOP/s at {default['warps_per_sm']} warps per SM; "
                   + ", ".join(f"{r['name'].split('(')[-1].rstrip(')')} {r['tflops']:.0f} at {r['warps_per_sm']}"
                               for r in narrow))


NARROW_TILES_SLOWER = Claim(
    "narrow_tiles_slower", "Warp tiles of 32 x 64 or 64 x 32 fit twice the warps per SM and are slower all the same.",
    WMMA, _narrow_tiles_slower)


def _tf32_switch(run: Recording) -> Verdict:
    rows = _by(run, "setting")
    off, on = rows["allow_tf32 = False"], rows["allow_tf32 = True"]
    medium = rows['set_float32_matmul_precision("medium")']
    speedup = on["tflops"] / off["tflops"]
    holds = (speedup >= 3 and 1e-4 <= on["relative_error"] < 1e-3 and off["relative_error"] < 1e-5
             and medium["kernels"] == on["kernels"])
    same = "the same kernel as" if medium["kernels"] == on["kernels"] else "another kernel than"
    return verdict(holds, f"TF32 {speedup:.1f}x faster than float32, error {on['relative_error']:.1e} against "
                          f"{off['relative_error']:.1e}; \"medium\" ran {same} \"high\"")


TF32_SWITCH = Claim(
    "tf32_switch", "Allowing TF32 makes cuBLAS's float32 matmul at least three times faster, with an error between "
    "$10^{-4}$ and $10^{-3}$ where float32's is below $10^{-5}$; `\"medium\"` ran the same TF32 kernel as "
    "`\"high\"`.", TF32, _tf32_switch)


def _aligned(dtype: str, size: int) -> bool:
    return size * (2 if dtype in ("float16", "bfloat16") else 4) % 16 == 0


def _misaligned_rows_collapse(run: Recording) -> Verdict:
    rows = [r for r in ok_rows(run.rows) if "relative" in r and r["vary"] in ("inputs", "outputs")]
    bad = [r for r in rows if not _aligned(r["dtype"], r["size"])]
    good = [r for r in rows if _aligned(r["dtype"], r["size"])]
    if not bad or not good:
        raise KeyError("no aligned or no misaligned size")
    worst_bad, least_good = max(r["relative"] for r in bad), min(r["relative"] for r in good)
    return verdict(worst_bad < 0.4 and least_good > 0.85,
                   f"misaligned row lengths at most {worst_bad:.2f} of the base rate, aligned ones at least "
                   f"{least_good:.2f}")


MISALIGNED_ROWS_COLLAPSE = Claim(
    "misaligned_rows_collapse", "A row length (the inputs or the outputs) that is not a multiple of 16 bytes cuts "
    "the GEMM to less than 40% of the base rate, in float16 and in TF32 alike, while the aligned sizes around it "
    "keep more than 85%: today's cuBLAS still makes the guides' advice a rule.", ALIGNMENT, _misaligned_rows_collapse)


def _odd_slower_than_even(run: Recording) -> Verdict:
    rows = [r for r in ok_rows(run.rows) if "relative" in r and r["dtype"] == "float16"
            and r["vary"] in ("inputs", "outputs") and not _aligned("float16", r["size"])]
    odd = [r["relative"] for r in rows if r["size"] % 2]
    even = [r["relative"] for r in rows if not r["size"] % 2]
    if not odd or not even:
        raise KeyError("no odd or no even misaligned float16 size")
    return verdict(max(odd) < min(even), f"odd sizes {min(odd):.2f} to {max(odd):.2f}, even ones "
                                         f"{min(even):.2f} to {max(even):.2f} of the base rate")


ODD_SLOWER_THAN_EVEN = Claim(
    "odd_slower_than_even", "In float16, every odd row length (2-byte aligned) is slower than every even one "
    "(4-byte aligned) among the misaligned sizes.", ALIGNMENT, _odd_slower_than_even)


def _steps(run: Recording, key: str) -> dict[int, dict]:
    return {r[key]: r for r in ok_rows(run.rows) if r["gemm"] == "step"}


def _padding_pays(run: Recording) -> Verdict:
    rows = ok_rows(run.rows)
    sizes = sorted({r["outputs"] for r in rows})
    if len(sizes) != 2:
        raise KeyError(f"expected two vocabularies, got {sizes}")
    rate = {(r["outputs"], r["gemm"]): r["tflops"] for r in rows}
    gains = {g: rate[sizes[1], g] / rate[sizes[0], g] for (v, g) in rate if v == sizes[0]}
    return verdict(min(gains.values()) >= 2, ", ".join(f"{g} {x:.2f}x" for g, x in gains.items()))


PADDING_PAYS = Claim(
    "padding_pays", "Padding the vocabulary to a multiple of 8 makes each of the three GEMMs, and so the step, at "
    "least twice as fast.", VOCABULARY, _padding_pays)


def _batch_barely_moves(run: Recording) -> Verdict:
    steps = _steps(run, "batch")
    rates = [r["tflops"] for r in steps.values()]
    spread = 1 - min(rates) / max(rates)
    return verdict(spread < 0.06, f"step rates {min(rates):.0f} to {max(rates):.0f} TFLOP/s, {spread:.1%} apart")


BATCH_BARELY_MOVES = Claim(
    "batch_barely_moves", "Around a batch of 4096, the step's rate moves by less than 6% whatever the batch, "
    "multiple of 8 or not.", BATCHES, _batch_barely_moves)


# --- the hardware counters of the WMMA kernels and cuBLAS (profiled in chapter 18) -------------------------------

def _naive_wmma_waits_for_loads(run: Recording) -> Verdict:
    naive = counters.tensor_kernels(run)[counters.NAIVE]
    reason, cycles = top_stall(naive)
    memory, sm = naive["memory_throughput_pct"], naive["sm_throughput_pct"]
    return verdict(reason == "long_scoreboard" and cycles >= 10 and memory >= 80 and sm <= 30,
                   f"top stall {reason} at {cycles:.1f} cycles per instruction; memory units {memory:.0f}% busy, "
                   f"SMs {sm:.0f}%")


NAIVE_WMMA_WAITS_FOR_LOADS = Claim(
    "naive_wmma_waits_for_loads", "The naive WMMA kernel's warps wait most for the data of global loads "
    "(`long_scoreboard`, 10 or more cycles per instruction), with its memory units at least 80% busy and its SMs at "
    "most 30%: its loads, not its tensor cores, set its time.", counters.EXPERIMENT, _naive_wmma_waits_for_loads)


def _pipelined_limit_on_chip(run: Recording) -> Verdict:
    found = counters.tensor_kernels(run)
    pipelined = found[counters.PIPELINED]
    roof = counter_figures.roof_with_peaks(run, [pipelined["dtype"]])
    dram = counter_figures.dram_share(pipelined, roof)
    cublas = [found[k] for k in counters.CUBLAS]
    holds = (pipelined["memory_throughput_pct"] > pipelined["sm_throughput_pct"] and dram < 0.25
             and all(r["sm_throughput_pct"] > r["memory_throughput_pct"] for r in cublas))
    return verdict(holds, f"pipelined WMMA: memory units {pipelined['memory_throughput_pct']:.0f}% busy, SMs "
                   f"{pipelined['sm_throughput_pct']:.0f}%, DRAM at {dram:.0%} of its bandwidth; "
                   + "; ".join(f"{r['label']}: SMs {r['sm_throughput_pct']:.0f}%, memory units "
                               f"{r['memory_throughput_pct']:.0f}%" for r in cublas))


PIPELINED_LIMIT_ON_CHIP = Claim(
    "pipelined_limit_on_chip", "The pipelined WMMA kernel keeps its memory units busier than its SMs while DRAM moves "
    "less than a quarter of its bandwidth: its limit is on chip, in the traffic between L2, shared memory and the "
    "registers (`cp.async` in, `ldmatrix` out). cuBLAS's TF32 and bfloat16 kernels keep their SMs the busier.",
    counters.EXPERIMENT, _pipelined_limit_on_chip)
