"""Worked answers to chapter 08's exercises, every number computed when the answer is shown: from the sector and
bank models of :mod:`.memory`, the GPU table, NVRTC's compile reports (no GPU needed) and each recorded GPU's runs."""

from __future__ import annotations

from gpulab.ch05_convolutions_as_gemms.answers import per_gpu
from gpulab.ch08_memory_hierarchy import figures, memory
from gpulab.core import budget, occupancy, recordings, specs
from gpulab.core.printing import Answer, format_bytes
from gpulab.core.recordings import Recording
from gpulab.kernels import cuda_c

T4 = specs.gpu("T4")
SHARE = 0.1  # exercise 5: the copy's share of the total time


def exercise_1() -> Answer:
    strides = [2**k for k in range(8)]
    first = {size: next(s for s in strides if memory.sectors_per_warp(s, size) == occupancy.WARP) for size in (4, 8)}
    return Answer("Answer to exercise 1", (
        "`memory.sectors_per_warp(stride, 8)` for float64, against `memory.sectors_per_warp(stride)` for float32:",
        *(f"- stride {s}: float64 {memory.sectors_per_warp(s, 8)} sectors, float32 {memory.sectors_per_warp(s)}"
          for s in strides if s <= first[4]),
        f"A warp of float64 loads first fetches {occupancy.WARP} sectors at stride {first[8]}, float32 at stride "
        f"{first[4]}. What counts is the distance in bytes between neighbouring threads: once it reaches a sector "
        f"({memory.SECTOR_BYTES} bytes), every thread has a sector of its own. A float64 is {8 // 4} times wider, so "
        f"it gets there at a stride {first[4] // first[8]} times smaller: {first[8]} x 8 = {first[4]} x 4 = "
        f"{memory.SECTOR_BYTES} bytes.",
    ))


def _fractions(run: Recording) -> dict[str, float]:
    return {r["kernel"]: r["fraction_of_copy"] for r in run.rows if "fraction_of_copy" in r}


def exercise_2() -> Answer:
    widths = (memory.TILE, memory.TILE + 1, memory.TILE + 2)
    degrees = {w: memory.bank_conflict_degree(w) for w in widths}
    registers = next(iter(cuda_c.compile_report("14_transpose_padded").resources.values())).registers
    hopper = occupancy.limits("9.0")
    fits = {w: occupancy.theoretical(memory.TILE * memory.BLOCK_ROWS, registers, memory.TILE * w * 4, hopper)
            for w in widths[1:]}

    def recorded(run: Recording) -> str | None:
        share = _fractions(run)
        if "13_transpose_tiled" not in share or "14_transpose_padded" not in share:
            return None
        return (f"the tiled transpose ({degrees[widths[0]]}-way) reached {share['13_transpose_tiled']:.0%} of the "
                f"copy, the padded one {share['14_transpose_padded']:.0%}")

    return Answer("Answer to exercise 2", (
        "`memory.bank_conflict_degree` for rows of " + ", ".join(f"{w} floats: {d}" for w, d in degrees.items())
        + f". With {widths[2]} floats, element [r][c] is in bank ({widths[2]} r + c) mod {memory.BANKS} = "
        f"(2 r + c) mod {memory.BANKS}: a column covers only the even (or odd) banks, two threads per bank, a "
        f"{degrees[widths[2]]}-way conflict.",
        f"The tile grows to {format_bytes(memory.TILE * widths[2] * 4)} a block, still {fits[widths[2]].blocks_per_sm} "
        f"blocks an SM on Hopper (as with {widths[1]} floats: {fits[widths[1]].blocks_per_sm}), so occupancy does "
        "not change.",
        "Expect a bandwidth close to the padded transpose's, far above the tiled one's: each column read takes two "
        "shared-memory steps instead of one, while the kernel's time is set by device memory. The recordings:",
        *per_gpu(recordings.recorded("memory_transpose"), recorded, "- No GPU has recorded the transposes yet."),
        "Try it by copying `14_transpose_padded.cu` with the row width changed, and time it with "
        "`cuda_c.time_launch` beside the two.",
    ))


def exercise_3() -> Answer:
    block, radius = 128, 5
    at_risk = figures.outputs_at_risk(block=block, radius=radius)
    warps = block // occupancy.WARP
    return Answer("Answer to exercise 3", (
        f"Thread t reads the {2 * radius + 1} slots t to t + {2 * radius} of the block's window; slot j is written by "
        f"thread j mod {block}, in the loading loop's first round (the {block} inputs) or its second (the halo).",
        f"Within a warp the last {2 * radius} threads read slots of the next warp; in the block's last warp they read "
        f"the right halo, written by the first warp in its second round. With {warps} warps of {occupancy.WARP}, "
        f"that is {2 * radius} threads a warp.",
        f"`outputs_at_risk(block={block}, radius={radius})` = {at_risk} of the {block} outputs, "
        f"{at_risk / block:.0%} of the block, against {figures.outputs_at_risk()} of {memory.STENCIL_BLOCK} "
        f"({figures.outputs_at_risk() / memory.STENCIL_BLOCK:.0%}) for the chapter's radius "
        f"{memory.STENCIL_RADIUS} and blocks of {memory.STENCIL_BLOCK}: a wider stencil and smaller blocks put more "
        "of every block at the mercy of the scheduler without `__syncthreads()`.",
    ))


def exercise_4() -> Answer:
    a100 = specs.gpu("A100 SXM4 40GB")
    loads = 2

    def a100_needs(run: Recording) -> str | None:
        rows = [r for r in run.rows if r.get("gbytes_per_s")]
        row = specs.find(run.device_name)
        try:
            latency = memory.unloaded_latency(rows)
        except ValueError:
            return None
        best = max(r["gbytes_per_s"] for r in rows) * 1e9  # read + written
        share = best / (row.bandwidth_gb_s * 1e9) if row else budget.MEMORY_EFFICIENCY
        read = share * a100.bandwidth_gb_s * 1e9 / 2  # the copy reads half its bytes
        in_flight = read * latency
        threads = in_flight / (loads * 16) / a100.sms
        return (f"L = {latency * 1e9:,.0f} ns, best copy {best / 1e9:,.0f} GB/s ({share:.0%} of its datasheet). "
                f"An A100 at the same share reads {read / 1e9:,.0f} GB/s, so it needs {format_bytes(in_flight)} in "
                f"flight: {threads:,.0f} threads an SM with {loads} loads of 16 B each, of the "
                f"{a100.max_threads_per_sm:,} an SM holds")

    return Answer("Answer to exercise 4", (
        "Little's law: bytes in flight = read bandwidth x latency. Take the latency L that the last experiment read "
        "from its slow grids (`memory.unloaded_latency`), and the best rate it reached as a share of its GPU's "
        f"datasheet bandwidth; the A100 40GB's datasheet gives {a100.bandwidth_gb_s:,} GB/s over {a100.sms} SMs.",
        *per_gpu(recordings.recorded("memory_bytes_in_flight"), a100_needs,
                 "- No GPU has recorded the in-flight copy yet."),
        "Spread over the SMs, that is well within what an A100 keeps resident: a copy with two independent loads a "
        "thread reaches its peak at partial occupancy. But an A100's latency need not be the recorded GPUs': "
        "measure it.",
    ))


def exercise_5() -> Answer:
    copies = {run.device_name: run for run in recordings.recorded("hardware_peaks")}
    t4_device = T4.bandwidth_gb_s * budget.MEMORY_EFFICIENCY
    t4_link = T4.pcie_gb_s * budget.MEMORY_EFFICIENCY
    t4_ratio = t4_device / t4_link  # the same 12 bytes an element cross PCIe and device memory

    def amortised(run: Recording) -> str | None:
        peak = copies.get(run.device_name)
        rates = {d: max((r["gbytes_per_s"] for r in run.rows if r.get("status") == "ok" and r["direction"] == d
                         and r["memory"] == "pinned"), default=None) for d in ("h2d", "d2h")}
        device = next((r["measured"] for r in peak.rows if r.get("work") == "copy"), None) if peak else None
        if device is None or None in rates.values():
            return None
        ratio = (8 / rates["h2d"] + 4 / rates["d2h"]) / (12 / device)
        return (f"pinned copies at {rates['h2d']:,.1f} GB/s in and {rates['d2h']:,.1f} out, device memory "
                f"{device:,.0f} GB/s: the copies take {ratio:,.0f} times one SAXPY, so at least "
                f"{(1 - SHARE) / SHARE * ratio:,.0f} SAXPYs")

    return Answer("Answer to exercise 5", (
        "SAXPY on N floats moves 12N bytes of device memory; bringing x and y in and y back moves 8N bytes to the "
        "GPU and 4N back over PCIe. With k SAXPYs on the same data the copies' share is t_copy / (t_copy + k "
        f"t_saxpy); for it to be at most {SHARE:.0%}, k >= {(1 - SHARE) / SHARE:g} t_copy / t_saxpy, whatever N "
        "(above the copies' fixed cost of microseconds).",
        *per_gpu(recordings.recorded("hardware_host_transfers"), amortised,
                 "- No GPU has recorded its host copies yet."),
        f"A T4 on PCIe {T4.pcie_generation} ({T4.pcie_gb_s:,.1f} GB/s a direction) with {T4.bandwidth_gb_s:,} GB/s "
        f"of device memory, both at {budget.MEMORY_EFFICIENCY:.0%}: the copies take {t4_ratio:,.0f} times a SAXPY, "
        f"so at least {(1 - SHARE) / SHARE * t4_ratio:,.0f} SAXPYs. A real network reuses its weights far more "
        "often than that, which is why they stay on the GPU.",
    ))
