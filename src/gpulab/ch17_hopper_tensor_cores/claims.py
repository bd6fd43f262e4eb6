"""What chapter 17 states about the Triton ladder and about FP8 matrix multiplication, as claims checked on every
recorded GPU (:mod:`gpulab.core.claims`). The ladder's tests read the rows of one GPU's ``triton_gemm_ladder``
recording (:func:`gpulab.kernels.triton_gemm.ladder.ladder_sweep`: every step and cuBLAS, timed in the same run,
with the evidence of each compiled kernel); the FP8 tests read its ``fp8_matmul`` recording
(:func:`gpulab.kernels.fp8.fp8_sweep`). The numbers of one case per GPU are printed by
:func:`.figures.ladder_statements`.
"""

from __future__ import annotations

from gpulab.ch17_hopper_tensor_cores import quantization
from gpulab.ch17_hopper_tensor_cores.figures import TARGET, TARGET_DTYPE, TARGET_N, step_label
from gpulab.ch17_hopper_tensor_cores.quantization import config_label, measured_rows
from gpulab.core import counter_figures
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

LADDER = "triton_gemm_ladder"
STEPS = ("step1_blocked", "step2_pipelined", "step3_grouped", "step4_tma", "step5_persistent",
         "step6_warp_specialized")
STEP_PAIR_GAIN = 2.0  # step 2 over step 1, at least, at every size and dtype
TILE_GAIN, STAGES_GAIN = 1.25, 1.8  # step 2's tile at one stage over step 1 (below); three stages over one (at least)
FOURTH_STAGE = 0.05  # a fourth stage over three adds at most this
STEP_CHANGE = 0.05  # after step 2, each step's rate within this of the step before's
SAME_CODE_MARGIN = 0.05  # step 6 within this of step 5
FP8 = "fp8_matmul"
LARGE_SPEEDUP = 1.3  # the FP8 matmul alone over bfloat16 at the two largest sizes, at least
SMALL_N, SMALL_SPEEDUP = 1024, 1.25  # up to this n the FP8 matmul alone gains at most this much
COPY_SHARE = 0.6  # the quantization's share of the copy's rate at the two largest sizes, at least
RATIO_MARGIN = 0.1  # the e5m2 x e4m3 over e4m3 error ratio within 10% of the model
FLAT_MARGIN = 0.05  # errors at the largest and the smallest n within 5%, and tensor-wise against row-wise


# ---- the Triton ladder ---------------------------------------------------------------------------------------------

def _ladder_cases(run: Recording) -> dict[tuple[str, int], dict[str, dict]]:
    """{(dtype, n): {kernel: row}} of a ladder recording, every case with cuBLAS and all six steps."""
    cases: dict[tuple[str, int], dict[str, dict]] = {}
    for row in ok_rows(run.rows):
        cases.setdefault((row["dtype"], row["n"]), {})[row["kernel"]] = row
    if not cases:
        raise ValueError("no row of the ladder ran")
    for (dtype, n), kernels in cases.items():
        missing = [k for k in ("cuBLAS", *STEPS) if k not in kernels]
        if missing:
            raise KeyError(f"{dtype} at {n}: no row for {', '.join(missing)}")
    return cases


def _case(dtype: str, n: int) -> str:
    return f"{dtype} at {n:,}^3"


def _depth(kernels: dict[str, dict], stages: int) -> dict:
    """Step 2 at ``stages`` pipeline stages: its own row at its own depth, else its row at that depth."""
    own = kernels["step2_pipelined"]
    return own if own["num_stages"] == stages else kernels[f"step2_pipelined (num_stages={stages})"]


def _span(values: list[float], form: str = ".2f", unit: str = "x") -> str:
    low, high = (f"{v:{form}}{unit}" for v in (min(values), max(values)))
    return low if low == high else f"{low} to {high}"


def _target(run: Recording) -> Verdict:
    cases = _ladder_cases(run)
    if (TARGET_DTYPE, TARGET_N) not in cases:
        raise KeyError(f"no {_case(TARGET_DTYPE, TARGET_N)} in the recording")
    kernels = cases[TARGET_DTYPE, TARGET_N]
    best = max((kernels[k] for k in STEPS), key=lambda r: r["tflops"])
    return verdict(best["share_of_cublas"] >= TARGET,
                   f"{step_label(best['kernel'])} at {best['share_of_cublas']:.0%} of cuBLAS ({best['tflops']:,.0f} "
                   f"against {kernels['cuBLAS']['tflops']:,.0f} TFLOP/s)")


LADDER_TARGET = Claim(
    "ladder_target", f"The ladder reaches its target: its best kernel runs at {TARGET:.0%} of cuBLAS or more in "
    f"{TARGET_DTYPE} at {TARGET_N:,}^3, timed in the same run as cuBLAS.", LADDER, _target)


def _hgmma_everywhere(run: Recording) -> Verdict:
    rows = [r for r in ok_rows(run.rows) if r["kernel"] != "cuBLAS"]
    if not rows:
        raise ValueError("no step of the ladder ran")
    bad = sorted({step_label(r["kernel"]) for r in rows
                  if not str(r["tensor_core"]).startswith("HGMMA") or r["sass_HMMA"]})
    hgmma = sorted({r["sass_HGMMA"] for r in rows})
    timed = f"{len({r['kernel'] for r in rows})} kernels at {len({(r['dtype'], r['n']) for r in rows})} sizes and types"
    return verdict(not bad, f"{timed}, " + (f"not HGMMA: {', '.join(bad)}" if bad else
                   f"each with {' or '.join(map(str, hgmma))} HGMMA and no HMMA in its code"))


HGMMA_EVERYWHERE = Claim(
    "hgmma_everywhere", "Every kernel of the ladder, from step 1 on and at every pipeline depth, multiplies with "
    "Hopper's warpgroup instruction (HGMMA) and never with Ampere's HMMA: the slowest kernel and the fastest use the "
    "same tensor-core instruction, so what separates them is how fast the tiles reach it.", LADDER, _hgmma_everywhere)


def _pipeline_is_the_jump(run: Recording) -> Verdict:
    step, tile, stages = [], [], []
    for kernels in _ladder_cases(run).values():
        one, three = _depth(kernels, 1), _depth(kernels, 3)
        step.append(kernels["step2_pipelined"]["tflops"] / kernels["step1_blocked"]["tflops"])
        tile.append(one["tflops"] / kernels["step1_blocked"]["tflops"])
        stages.append(three["tflops"] / one["tflops"])
    holds = min(step) >= STEP_PAIR_GAIN and max(tile) < TILE_GAIN and min(stages) >= STAGES_GAIN
    return verdict(holds, f"step 2 over step 1 {_span(step)}; its tile at one stage over step 1 {_span(tile)}; three "
                   f"stages over one on that tile {_span(stages)}")


PIPELINE_IS_THE_JUMP = Claim(
    "pipeline_is_the_jump", f"Step 2 runs at least {STEP_PAIR_GAIN:g} times as fast as step 1 at every size and type, "
    f"and the pipeline does most of it: step 2's larger tile with one stage gains less than {TILE_GAIN:g} times over "
    f"step 1, and three stages on that same tile gain at least {STAGES_GAIN:g} times more.", LADDER,
    _pipeline_is_the_jump)


def _stages_climb(run: Recording) -> Verdict:
    climbs, fourth, failed = {1: [], 2: []}, [], []
    for (dtype, n), kernels in _ladder_cases(run).items():
        rates = {s: _depth(kernels, s)["tflops"] for s in (1, 2, 3, 4)}
        if not rates[1] < rates[2] < rates[3]:
            failed.append(_case(dtype, n))
        climbs[1].append(rates[2] / rates[1])
        climbs[2].append(rates[3] / rates[2])
        fourth.append(rates[4] / rates[3] - 1)
    holds = not failed and max(fourth) <= FOURTH_STAGE
    return verdict(holds, f"two stages over one {_span(climbs[1])}, three over two {_span(climbs[2])}, four over "
                   f"three {min(fourth):+.1%} to {max(fourth):+.1%}"
                   + (f"; no climb at {', '.join(failed)}" if failed else ""))


STAGES_CLIMB = Claim(
    "stages_climb", "Step 2's rate climbs with the depth of its pipeline, from one stage to two to three, at every "
    f"size and type, and a fourth stage adds at most {FOURTH_STAGE:.0%}: at these sizes three stages are enough to "
    "keep the tensor cores fed.", LADDER, _stages_climb)


def _later_steps_small(run: Recording) -> Verdict:
    cases = _ladder_cases(run)
    shares = [kernels["step2_pipelined"]["share_of_cublas"] for kernels in cases.values()]
    changes = [(kernels[later]["tflops"] / kernels[before]["tflops"] - 1, before, later, dtype, n)
               for (dtype, n), kernels in cases.items() for before, later in zip(STEPS[1:], STEPS[2:], strict=False)]
    change, before, later, dtype, n = max(changes, key=lambda c: abs(c[0]))
    holds = min(shares) >= TARGET and abs(change) < STEP_CHANGE
    return verdict(holds, f"step 2 at {_span(shares, '.0%', '')} of cuBLAS; the largest change from a step to the "
                   f"next: {step_label(later)} against {step_label(before)}, {change:+.1%} ({_case(dtype, n)})")


LATER_STEPS_SMALL = Claim(
    "later_steps_small", f"Pipelined, the pointer kernel is already near cuBLAS: step 2 reaches {TARGET:.0%} of it at "
    f"every size and type, and each later step (3 to 6) moves the rate by less than {STEP_CHANGE:.0%} from the step "
    "before it, either way.", LADDER, _later_steps_small)


def _step6_is_step5(run: Recording) -> Verdict:
    deviations, differ = [], []
    for (dtype, n), kernels in _ladder_cases(run).items():
        five, six = kernels["step5_persistent"], kernels["step6_warp_specialized"]
        deviations.append(six["tflops"] / five["tflops"] - 1)
        if six["warp_specialized"] or six["sass_USETMAXREG"] or any(
                six[key] != five[key] for key in ("sass_instructions", "registers", "shared_bytes")):
            differ.append(_case(dtype, n))
    worst = max(deviations, key=abs)
    return verdict(not differ and abs(worst) <= SAME_CODE_MARGIN,
                   f"step 6 at {min(deviations):+.1%} to {max(deviations):+.1%} of step 5's rate; "
                   + (f"different code at {', '.join(differ)}" if differ else
                      "no USETMAXREG, the same instructions, registers and shared memory"))


STEP6_IS_STEP5 = Claim(
    "step6_is_step5", "Asked for warp specialization, step 6 compiled to none (no USETMAXREG, and the instruction "
    f"count, registers and shared memory of step 5) and runs within {SAME_CODE_MARGIN:.0%} of step 5 at every size and "
    "type: the same machine code, timed twice.", LADDER, _step6_is_step5)


# ---- FP8 -----------------------------------------------------------------------------------------------------------

def _rows(run: Recording) -> list[dict]:
    rows = measured_rows(run.rows)
    if not rows:
        raise ValueError("no configuration of the sweep ran")
    return rows


def _largest(rows: list[dict], count: int = 2) -> list[dict]:
    sizes = sorted({r["n"] for r in rows})[-count:]
    return [r for r in rows if r["n"] in sizes]


def _matmul_pays(run: Recording) -> Verdict:
    rows = _largest(_rows(run))
    low = min(rows, key=lambda r: r["speedup_matmul"])
    return verdict(low["speedup_matmul"] >= LARGE_SPEEDUP,
                   f"at n = {', '.join(f'{n:,}' for n in sorted({r['n'] for r in rows}))}: at least "
                   f"{low['speedup_matmul']:.2f}x ({config_label(low)} at n = {low['n']:,}), at most "
                   f"{max(r['speedup_matmul'] for r in rows):.2f}x")


MATMUL_PAYS_WHEN_LARGE = Claim(
    "matmul_pays_when_large", f"Fed operands already in FP8, the scaled matmul is at least {LARGE_SPEEDUP} times as "
    "fast as bfloat16 at the two largest sizes of the sweep, in every format and scale granularity.", FP8,
    _matmul_pays)


def _small_gains_little(run: Recording) -> Verdict:
    rows = [r for r in _rows(run) if r["n"] <= SMALL_N]
    if not rows:
        raise ValueError(f"no size up to {SMALL_N}")
    high = max(rows, key=lambda r: r["speedup_matmul"])
    return verdict(high["speedup_matmul"] <= SMALL_SPEEDUP,
                   f"at most {high['speedup_matmul']:.2f}x ({config_label(high)} at n = {high['n']:,}), at least "
                   f"{min(r['speedup_matmul'] for r in rows):.2f}x")


SMALL_GAINS_LITTLE = Claim(
    "small_gains_little", f"Up to n = {SMALL_N:,} the FP8 matmul alone gains little or nothing over bfloat16 (at most "
    f"{SMALL_SPEEDUP} times as fast, and sometimes slower), in every format and scale granularity.", FP8,
    _small_gains_little)


def _path_slower(run: Recording) -> Verdict:
    rows = _rows(run)
    best = max(rows, key=lambda r: r["speedup_path"])
    return verdict(best["speedup_path"] < 1, f"at best {best['speedup_path']:.2f}x ({config_label(best)} at n = "
                   f"{best['n']:,}); {len(rows)} configurations and sizes")


PATH_SLOWER = Claim(
    "path_slower", "With both operands quantized in the call (their amax, their scale and their cast timed with the "
    "matmul), the FP8 path is slower than bfloat16 at every size of the sweep, in every configuration.", FP8,
    _path_slower)


def _quantization_memory_bound(run: Recording) -> Verdict:
    copy = quantization.copy_gbytes_per_s(run)
    rows = _largest(_rows(run))
    low = min(rows, key=quantization.quantize_gbytes_per_s)
    rate = quantization.quantize_gbytes_per_s(low)
    return verdict(rate >= COPY_SHARE * copy,
                   f"at least {rate:,.0f} GB/s ({config_label(low)} at n = {low['n']:,}), {rate / copy:.0%} of the "
                   f"copy's {copy:,.0f} GB/s")


QUANTIZATION_MEMORY_BOUND = Claim(
    "quantization_memory_bound", f"At the two largest sizes, quantizing both operands moves the bytes its "
    f"operations read and write at {COPY_SHARE:.0%} or more of the device copy's rate on the same GPU: it is "
    "memory-bound, and its time is those bytes over the bandwidth.", FP8, _quantization_memory_bound)


def _format_ratio(run: Recording) -> Verdict:
    rows = _rows(run)
    model = quantization.error_ratio_model()
    ratios = []
    for n in sorted({r["n"] for r in rows}):
        for granularity in sorted({r["granularity"] for r in rows}):
            found = {r["format"]: r for r in rows if (r["n"], r["granularity"]) == (n, granularity)}
            if {"e4m3", "e5m2 x e4m3"} <= set(found):
                ratios.append(found["e5m2 x e4m3"]["relative_error"] / found["e4m3"]["relative_error"])
    if not ratios:
        raise ValueError("no size with both e4m3 and e5m2 x e4m3")
    return verdict(all(abs(r / model - 1) <= RATIO_MARGIN for r in ratios),
                   f"ratios {min(ratios):.2f} to {max(ratios):.2f} against the model's {model:.2f}")


FORMAT_ERROR_RATIO = Claim(
    "format_error_ratio", "Taking A in e5m2 instead of e4m3 multiplies the error by the ratio that independent "
    "roundings of the two operands predict, sqrt(u(e5m2)^2 + u(e4m3)^2) / sqrt(2 u(e4m3)^2), within "
    f"{RATIO_MARGIN:.0%}, at every size and with either scale.", FP8, _format_ratio)


def _errors_flat(run: Recording) -> Verdict:
    rows = _rows(run)
    spans, granular = [], []
    for fmt in sorted({r["format"] for r in rows}):
        for granularity in sorted({r["granularity"] for r in rows}):
            mine = sorted((r for r in rows if (r["format"], r["granularity"]) == (fmt, granularity)),
                          key=lambda r: r["n"])
            if mine:
                spans.append(mine[-1]["relative_error"] / mine[0]["relative_error"] - 1)
        for n in sorted({r["n"] for r in rows}):
            pair = {r["granularity"]: r["relative_error"] for r in rows if (r["format"], r["n"]) == (fmt, n)}
            if {"tensor", "row"} <= set(pair):
                granular.append(pair["row"] / pair["tensor"] - 1)
    worst_n, worst_g = max(map(abs, spans)), max(map(abs, granular), default=0.0)
    return verdict(worst_n <= FLAT_MARGIN and worst_g <= FLAT_MARGIN,
                   f"largest against smallest n within {worst_n:.1%}; row-wise against tensor-wise within "
                   f"{worst_g:.1%}")


ERRORS_FLAT = Claim(
    "errors_flat", "On these operands (standard normal, one scale) FP8's error does not grow with the size, and a "
    f"scale per row gives the error of one scale per tensor, within {FLAT_MARGIN:.0%}: the rounding of the operands "
    "sets it, not the float32 sums or the scales.", FP8, _errors_flat)


def _executed_gmma(run: Recording) -> Verdict:
    rows = counter_figures.required(run, None, ("wmma_gemm_pipelined", "cublas_bfloat16"))
    wmma, cublas = rows["wmma_gemm_pipelined"], rows["cublas_bfloat16"]
    w, c = wmma["tensor_instructions"], cublas["tensor_instructions"]
    per_w, per_c = wmma["flops"] / w["hmma"], cublas["flops"] / c["hmma"]
    return verdict(not w["gmma"] and c["gmma"] == c["hmma"] > 0 and per_c >= 8 * per_w,
                   f"WMMA {w['hmma']:,.0f} tensor-core instructions, {w['gmma'] or 0:,.0f} GMMA, {per_w:,.0f} FLOP "
                   f"each; cuBLAS bf16 {c['hmma']:,.0f}, {c['gmma']:,.0f} GMMA, {per_c:,.0f} FLOP each")


EXECUTED_GMMA = Claim(
    "executed_gmma", "Every tensor-core instruction cuBLAS's bfloat16 kernel executed was a warpgroup instruction "
    "(GMMA), and each did at least eight times the arithmetic of one of the WMMA kernel's, none of which was GMMA.",
    "kernel_counters", _executed_gmma)
