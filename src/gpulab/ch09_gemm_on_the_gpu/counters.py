"""Chapter 09's SGEMM worklog as the hardware counted it: where each step sits against the float32 ridge, the DRAM
bytes it moved, how busy its SMs and memory were and what its warps waited for, printed as sentences from each GPU's
recording of ``kernel_counters`` (profiled in chapter 18,
:func:`gpulab.ch18_flash_attention_and_counters.profiled.profile_kernels`; drawn by
:mod:`gpulab.core.counter_figures`)."""

from __future__ import annotations

from collections.abc import Sequence

from gpulab.ch09_gemm_on_the_gpu import gemm
from gpulab.core import counter_figures
from gpulab.core.counter_figures import describe_stall
from gpulab.core.recordings import Recording

CHAPTER = "09"
EXPERIMENT = counter_figures.EXPERIMENT
CUBLAS = "cublas_float32"
STEPS = tuple(s.kernel for s in gemm.STEPS)  # the worklog's kernels, step 1 first
TAGS = {**{s.kernel: str(s.number) for s in gemm.STEPS}, CUBLAS: "cuBLAS"}  # the text beside each point
FIRST = 3  # steps 1 to 3 load their operands for every FMA; register blocking starts at step 4


def worklog_rows(run: Recording) -> tuple[list[dict], dict]:
    """The worklog's rows of ``run``, step 1 first, and cuBLAS's (KeyError naming what failed or is missing)."""
    found = counter_figures.required(run, CHAPTER, (*STEPS, CUBLAS))
    return [found[k] for k in STEPS], found[CUBLAS]


def _span(values: Sequence[float], form: str, unit: str = "") -> str:
    low, high = min(values), max(values)
    return f"{low:{form}}{unit} to {high:{form}}{unit}"


def counter_statements(runs: Sequence[Recording]) -> list[str]:
    """Per GPU: the first three steps against the ridge and their on-chip waits, the DRAM bytes register blocking
    saved, and how close the later steps and cuBLAS came to the FP32 peak."""
    said = []
    for run in runs:
        try:
            steps, cublas = worklog_rows(run)
            roof = counter_figures.roof_with_peaks(run, ["float32"])
        except KeyError as error:
            said.append(f"{run.label}: {error.args[0]}.")
            continue
        ridge = roof.ridge("float32")
        first, later = steps[:FIRST], steps[FIRST:]
        share = [counter_figures.share_of_roof(r, roof) for r in steps + [cublas]]
        dram = [counter_figures.dram_share(r, roof) for r in first]
        right = [r["intensity"] / ridge for r in [*later, cublas]]
        stalls = "; ".join(f"step {i} {describe_stall(r)}" for i, r in enumerate(first, 1))
        said.append(
            f"{run.label}: steps 1 to {FIRST} sit at {_span([r['intensity'] for r in first], '.0f')} FLOP per DRAM "
            f"byte, with the float32 ridge at {ridge:.0f}, and reach {_span(share[:FIRST], '.0%')} of the roof there; "
            f"their DRAM moved {_span(dram, '.0%')} of its bandwidth while their memory units were "
            f"{_span([r['memory_throughput_pct'] for r in first], '.0f', '%')} busy. Their top stalls: {stalls}. "
            f"They moved {_span([r['bytes_ratio'] for r in first], '.0f')} times the book's DRAM bytes; register "
            f"blocking cut that to {steps[3]['bytes_ratio']:.1f} times at step 4 and {steps[4]['bytes_ratio']:.1f} at "
            f"step 5 (cuBLAS: {cublas['bytes_ratio']:.1f}). From step 4 on the points sit "
            f"{_span(right, '.1f')} times right of the ridge, under the flat FP32 roof: step {len(steps)} reached "
            f"{share[len(steps) - 1]:.0%} of it with its SMs {steps[-1]['sm_throughput_pct']:.0f}% busy and top stall "
            f"{describe_stall(steps[-1])}; cuBLAS {share[-1]:.0%}, with its SMs {cublas['sm_throughput_pct']:.0f}% "
            f"busy and top stall {describe_stall(cublas)}.")
    return said
