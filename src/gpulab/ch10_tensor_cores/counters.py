"""Chapter 10's WMMA kernels and cuBLAS's tensor-core GEMMs as the hardware counted them: where each sits against
its format's ridge, the DRAM and L2 bytes it moved, how busy its SMs and memory were and what its warps waited for,
printed as sentences from each GPU's recording of ``kernel_counters`` (profiled in chapter 18,
:func:`gpulab.ch18_flash_attention_and_counters.profiled.profile_kernels`; drawn by
:mod:`gpulab.core.counter_figures`)."""

from __future__ import annotations

from collections.abc import Sequence

from gpulab.ch10_tensor_cores import wmma
from gpulab.core import counter_figures
from gpulab.core.counter_figures import describe_stall
from gpulab.core.recordings import Recording
from gpulab.core.roofline import Roofline

CHAPTER = "10"
EXPERIMENT = counter_figures.EXPERIMENT
NAIVE, PIPELINED = wmma.NAIVE.kernel, wmma.PIPELINED.kernel
CUBLAS = ("cublas_tf32", "cublas_bfloat16")
TAGS = {NAIVE: "WMMA naive", PIPELINED: "WMMA pipelined", "cublas_tf32": "cuBLAS TF32",
        "cublas_bfloat16": "cuBLAS bf16"}  # the text beside each point


def tensor_kernels(run: Recording) -> dict[str, dict]:
    """The rows of the two WMMA kernels and cuBLAS's TF32 and bfloat16 GEMMs in ``run``, by kernel (KeyError naming
    what failed or is missing)."""
    return counter_figures.required(run, CHAPTER, (NAIVE, PIPELINED, *CUBLAS))


def _side(row: dict, roof: Roofline) -> str:
    """'left of the float16 ridge (221), under the DRAM roof': where the kernel's point sits and which roof is above."""
    ridge = roof.ridge(row["dtype"])
    left = row["intensity"] < ridge
    return (f"{'left' if left else 'right'} of the {row['dtype']} ridge ({ridge:.0f}), under the "
            + ("DRAM roof" if left else f"flat {row['dtype']} roof"))


def counter_statements(runs: Sequence[Recording]) -> list[str]:
    """Per GPU: the naive WMMA kernel's distance to its roof and what it waited for, the pipelined kernel's, and how
    close cuBLAS came to its roofs."""
    said = []
    for run in runs:
        try:
            found = tensor_kernels(run)
            roof = counter_figures.roof_with_peaks(run, sorted({row["dtype"] for row in found.values()}))
        except KeyError as error:
            said.append(f"{run.label}: {error.args[0]}.")
            continue
        naive, pipelined, tf32, bf16 = (found[k] for k in (NAIVE, PIPELINED, *CUBLAS))
        share = {k: counter_figures.share_of_roof(found[k], roof) for k in (NAIVE, PIPELINED, *CUBLAS)}
        memory, sm = (f"its memory units {r['memory_throughput_pct']:.0f}% busy and its SMs "
                      f"{r['sm_throughput_pct']:.0f}%" for r in (naive, pipelined))
        said.append(
            f"{run.label}: the naive WMMA kernel sits at {naive['intensity']:.0f} FLOP per DRAM byte, "
            f"{_side(naive, roof)}, and reached {share[NAIVE]:.0%} of that roof. Its DRAM bytes were "
            f"{naive['bytes_ratio']:.1f}x the book's count, and {naive['l2_bytes'] / naive['dram_bytes']:.1f} times "
            f"its DRAM bytes went between L2 and the SMs, which kept {memory}; its top stall was "
            f"{describe_stall(naive)}. "
            f"The pipelined kernel moved {pipelined['bytes_ratio']:.2f}x the book's DRAM bytes and sits at "
            f"{pipelined['intensity']:.0f}, {_side(pipelined, roof)}; it reached {share[PIPELINED]:.0%} of that roof "
            f"with {sm}, while DRAM moved {counter_figures.dram_share(pipelined, roof):.0%} of its bandwidth, and its "
            f"top stall "
            f"was {describe_stall(pipelined)}. cuBLAS reached {share[CUBLAS[0]]:.0%} of the TF32 roof and "
            f"{share[CUBLAS[1]]:.0%} of the bfloat16 one, with its SMs {tf32['sm_throughput_pct']:.0f}% and "
            f"{bf16['sm_throughput_pct']:.0f}% busy.")
    return said
