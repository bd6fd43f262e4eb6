"""Chapter 08's transposes as the hardware counted them: their DRAM and L2 traffic, how busy the memory was and what
their warps waited for, printed as sentences from each GPU's recording of ``kernel_counters`` (profiled in chapter
18, :func:`gpulab.ch18_flash_attention_and_counters.profiled.profile_kernels`; drawn by
:mod:`gpulab.core.counter_figures`)."""

from __future__ import annotations

from collections.abc import Sequence

from gpulab.core import counter_figures
from gpulab.core.counter_figures import describe_stall
from gpulab.core.recordings import Recording

CHAPTER = "08"
EXPERIMENT = counter_figures.EXPERIMENT
NAIVE, TILED, PADDED = "transpose_naive", "transpose_tiled", "transpose_padded"


def transposes(run: Recording) -> tuple[dict, dict, dict]:
    """The naive, tiled and padded transposes' rows of ``run`` (KeyError naming those that failed or are missing)."""
    found = counter_figures.required(run, CHAPTER, (NAIVE, TILED, PADDED))
    return found[NAIVE], found[TILED], found[PADDED]


def l2_over_book(row: dict) -> float:
    """Bytes between L2 and the SMs, as a multiple of the book's count of the bytes the kernel must move."""
    return (row.get("l2_bytes") or 0) / row["book_bytes"]


def _rate(row: dict, roof) -> str:
    share = counter_figures.share_of_roof(row, roof)
    return f"{row['dram_gbytes_per_s']:,.0f} GB/s" + (f" ({share:.0%})" if share is not None else "")


def counter_statements(runs: Sequence[Recording]) -> list[str]:
    """Per GPU: how far each transpose's DRAM bandwidth stayed from the roof, the naive one's extra bytes, and the
    stalls that set the tiled and the padded ones apart."""
    said = []
    for run in runs:
        try:
            naive, tiled, padded = transposes(run)
        except KeyError as error:
            said.append(f"{run.label}: {error.args[0]}.")
            continue
        roof, source = counter_figures.roofline_of(run)
        share = counter_figures.share_of_roof(padded, roof)
        ceiling = f", {share:.0%} of the DRAM roof ({roof.bandwidth / 1e9:,.0f} GB/s, {source})" if roof else ""
        said.append(
            f"{run.label}: under ncu the padded transpose moved {padded['dram_gbytes_per_s']:,.0f} GB/s between DRAM "
            f"and L2{ceiling}; the tiled one {_rate(tiled, roof)}, the naive one {_rate(naive, roof)}. "
            f"The naive transpose moved {naive['bytes_ratio']:.2f}x the book's DRAM bytes but "
            f"{l2_over_book(naive):.1f}x them between L2 and the SMs (the tiled ones {l2_over_book(tiled):.1f}x and "
            f"{l2_over_book(padded):.1f}x); its memory units were {naive['memory_throughput_pct']:.0f}% busy, its "
            f"SMs {naive['sm_throughput_pct']:.0f}%, and its top stall was {describe_stall(naive)}. "
            f"The tiled transpose's top stall was {describe_stall(tiled)}; with the padded tile it was "
            f"{describe_stall(padded)}.")
    return said
