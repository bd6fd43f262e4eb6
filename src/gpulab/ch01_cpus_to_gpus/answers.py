"""Worked answers to the exercises of chapter 01, every number computed from :mod:`gpulab.core.specs`, the
chapter's models and the recordings when the answer is shown (:func:`gpulab.core.printing.show_answers`)."""

from __future__ import annotations

from gpulab.ch01_cpus_to_gpus import hardware, plan
from gpulab.core import budget, recordings, specs
from gpulab.core.printing import Answer


def _no_recording(experiment: str) -> str:
    return f"No GPU has recorded `{experiment}` yet: the method above applies to the first recording."


def exercise_1() -> Answer:
    a100 = specs.gpu("A100 SXM4 40GB")
    cuda = specs.peak(a100, "float64", specs.CUDA_CORES)
    tensor = specs.peak(a100, "float64", specs.TENSOR_CORES)
    return Answer("Answer to exercise 1", (
        "A peak is SMs x FMA per clock per SM x 2 FLOP per FMA x clock, with the figures of the A100's row.",
        f"- CUDA cores: {a100.cuda_cores_per_sm['float64']} FP64 units per SM, each one FMA per clock: "
        f"{cuda.formula()}.",
        f"- Tensor cores: {a100.tensor_cores_per_sm} per SM, each {a100.tensor_fma_per_clock['float64']} FP64 FMA "
        f"per clock, so {tensor.fma_per_clock_per_sm} per SM: {tensor.formula()}.",
        f"The tensor cores give {tensor.ops_per_s / cuda.ops_per_s:.0f}x the CUDA cores' rate, and their "
        f"**{tensor.tflops:.1f} TFLOP/s** is the course's \"FP64 TC\". Only matrix multiplies (cuBLAS's DGEMM) run "
        f"there: every other float64 operation is held to the CUDA cores' {cuda.tflops:.1f} TFLOP/s.",
    ))


def exercise_2() -> Answer:
    t4, l4 = specs.gpu("T4"), specs.gpu("L4")
    rows = {r["metric"]: r for r in specs.comparison(t4, l4)}
    wider = l4.tensor_fma_per_clock["float16"] / t4.tensor_fma_per_clock["float16"]
    peaks = [r for r in rows.values() if r["metric"].startswith("peak ") and r["ratio"]]
    only_l4 = [r["metric"].removeprefix("peak ") for r in rows.values()
               if r["metric"].startswith("peak ") and r["b"] and not r["a"]]
    bandwidth = rows["bandwidth (GB/s)"]
    best = max(peaks, key=lambda r: r["ratio"])["metric"].removeprefix("peak ")
    return Answer("Answer to exercise 2", (
        "Set GPU A to the T4 and GPU B to the L4; the ratio column is B over A. Each peak grows with the SM count "
        f"({rows['SMs']['ratio']:.2f}x) times the clock ({rows['boost clock (GHz)']['ratio']:.2f}x) times the "
        "units per SM:",
        *(f"- {r['metric']}: {r['a']:,.2f} to {r['b']:,.2f} {'TOPS' if 'int' in r['metric'] else 'TFLOP/s'}, "
          f"{r['ratio']:.2f}x" for r in peaks),
        f"{best} gains most: an Ada SM has {rows['FP32 units per SM']['ratio']:.0f}x a Turing SM's FP32 units, while "
        f"it has {rows['tensor cores per SM']['ratio']:.1f}x the tensor cores, each {wider:.0f}x as wide. The L4 also "
        f"computes in {', '.join(only_l4)}, which the T4 lacks.",
        f"The bandwidth goes the other way: {bandwidth['a']:,.0f} to {bandwidth['b']:,.0f} GB/s, "
        f"{bandwidth['ratio']:.2f}x. Memory-bound work (levels 1 and 2 of the BLAS, elementwise layers, small "
        "batches) gains nothing, or loses a little, unless its data fits the L2, "
        f"{rows['L2 (MB)']['ratio']:.0f}x larger on the L4.",
    ))


def exercise_3() -> Answer:
    lines = ["A copy or an axpy that moves m bytes takes t0 + m / B, so it reaches m / (m + B t0) of the bandwidth "
             "B: 90% needs m = 9 B t0. An axpy moves 12 bytes per float32 element (x and y read, y written), so "
             "n = 9 B t0 / 12 elements. With the fit to each recorded GPU's cold copies:"]
    runs = recordings.recorded("hardware_copy_hierarchy")
    for run in runs:
        try:
            fit = hardware.latency_fit(run.rows)
        except ValueError:
            continue
        moved = 9 * fit["bytes_in_flight"]
        lines.append(f"- {run.short_label}: t0 = {fit['t0_s'] * 1e6:.2f} µs and B = {fit['bandwidth'] / 1e9:,.0f} "
                     f"GB/s, so B t0 = {fit['bytes_in_flight'] / 1e6:.1f} MB and m = {moved / 1e6:.0f} MB: "
                     f"**n = {moved / 12 / 1e6:.1f} million elements**.")
    if not runs:
        lines.append(_no_recording("hardware_copy_hierarchy"))
    lines.append("An axpy kernel's fixed cost need not be a copy's, so this is an estimate: the BLAS chapter's "
                 "recorded axpy sweep shows where axpy really meets the bandwidth roof.")
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4() -> Answer:
    t4 = specs.gpu(budget.CLASS_GPU)
    sizes = plan.CHAPTER.plan("class", t4).sizes
    peaks = ", ".join(f"{p.precision} {p.tflops:,.2f}" for p in (specs.peak(t4, d) for d in sizes["dtypes"]
                                                                  if specs.peak_tflops(t4, d)))
    lines = [
        "Open the notebook on Colab with a T4 or an L4 runtime, set `PROFILE = \"class\"` and run every cell; the "
        "table under the peaks figure gives, per format, the measured rate against the datasheet peak and "
        "against the peak at the clock the GPU ran at.",
        f"What to expect on a T4: the class profile times matmuls of {sizes['matmul_n']:,} against the peaks of "
        f"its row ({peaks} TFLOP/s); it has no tf32 or bfloat16, so those rows are left out.",
        "The recordings, as a fraction of the datasheet peak (and of the peak at the measured clock):",
    ]
    runs = recordings.recorded("hardware_peaks")
    for run in runs:
        parts = [f"{r['work']} {r['fraction']:.0%}" + (f" ({r['fraction_at_clock']:.0%})"
                                                      if r.get("fraction_at_clock") else "")
                 for r in run.rows if r.get("fraction")]
        lines.append(f"- {run.short_label}: {', '.join(parts)}.")
    if not runs:
        lines.append(_no_recording("hardware_peaks"))
    lines.append("The tensor-core ratios against the datasheet should change most: a T4 is a low-power card, "
                 "and under a float16 matmul its clock falls further below its boost clock than a data-centre "
                 "GPU's, while the ratio at the measured clock should stay close to the recorded ones. The copy's "
                 "share of GDDR6's pin bandwidth may be lower than of HBM's.")
    return Answer("Answer to exercise 4", tuple(lines))
