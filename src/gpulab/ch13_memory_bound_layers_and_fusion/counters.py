"""Chapter 13's hand-fused bias + GELU + dropout kernel as the hardware counted it: the bytes and FLOPs it moved and
did against the book's counts, its distance to the bandwidth roof and what its warps waited for, printed as
sentences from each GPU's recording of ``kernel_counters`` (profiled in chapter 18,
:func:`gpulab.ch18_flash_attention_and_counters.profiled.profile_kernels`; drawn by
:mod:`gpulab.core.counter_figures`)."""

from __future__ import annotations

from collections.abc import Sequence

from gpulab.ch13_memory_bound_layers_and_fusion import fusion
from gpulab.core import counter_figures
from gpulab.core.counter_figures import describe_stall
from gpulab.core.recordings import Recording
from gpulab.core.roofline import Roofline

CHAPTER = "13"
EXPERIMENT = counter_figures.EXPERIMENT
FUSED = fusion.KERNEL_FUNCTION  # the profiled kernel's name: "fused_bias_gelu_dropout"
TAGS = {FUSED: "fused"}  # the text beside its point


def fused(run: Recording) -> tuple[dict, Roofline]:
    """The fused kernel's row of ``run`` and its GPU's roofline, with a float32 peak (KeyError where either is
    missing)."""
    row = counter_figures.required(run, CHAPTER, (FUSED,))[FUSED]
    return row, counter_figures.roof_with_peaks(run, [row["dtype"]])


def counter_statements(runs: Sequence[Recording]) -> list[str]:
    """Per GPU: the fused kernel's DRAM bandwidth against the roof, its bytes and FLOPs against the book's counts and
    the ridge, and how busy its SMs and memory were and what its warps waited for."""
    said = []
    for run in runs:
        try:
            row, roof = fused(run)
        except KeyError as error:
            said.append(f"{run.label}: {error.args[0]}.")
            continue
        ridge = roof.ridge(row["dtype"])
        side = (f"still {ridge / row['intensity']:.1f} times left of" if row["intensity"] < ridge else "right of")
        said.append(
            f"{run.label}: under ncu the fused kernel moved {row['dram_gbytes_per_s']:,.0f} GB/s between DRAM and L2, "
            f"{counter_figures.share_of_roof(row, roof):.0%} of the DRAM roof ({roof.bandwidth / 1e9:,.0f} GB/s), and "
            f"{row['bytes_ratio']:.2f}x the book's count of its bytes; between L2 and the SMs it moved "
            f"{row['l2_bytes'] / row['dram_bytes']:.2f}x its DRAM bytes. The counters found "
            f"{row['flops_ratio']:.1f}x the FLOPs the book counts, which puts the point at "
            f"{row['intensity']:.1f} FLOP per DRAM byte, {side} the {row['dtype']} ridge ({ridge:.0f}). Its memory "
            f"units were {row['memory_throughput_pct']:.0f}% busy and its SMs {row['sm_throughput_pct']:.0f}%, and "
            f"its top stall was {describe_stall(row)}.")
    return said
