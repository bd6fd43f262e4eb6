"""What chapter 08 states about memory sizes, host copies, coalescing, the stencil's barrier, the transposes and
bytes in flight, as claims checked on every recorded GPU (:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch08_memory_hierarchy import counters, memory
from gpulab.ch08_memory_hierarchy.figures import outputs_at_risk
from gpulab.core import specs
from gpulab.core.claims import Claim, Verdict, same_gpu, verdict
from gpulab.core.counter_figures import top_stall
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

SIZES, TRANSFERS, PEAKS = "memory_sizes", "hardware_host_transfers", "hardware_peaks"
COALESCING, STENCIL, TRANSPOSE, IN_FLIGHT = ("memory_coalescing", "memory_stencil", "memory_transpose",
                                             "memory_bytes_in_flight")
COURSE_LATENCY_CYCLES = 400  # the course's rule of thumb for a load from global memory


def _spec(run: Recording) -> specs.GPU:
    spec = specs.find(run.device_name)
    if spec is None:
        raise KeyError(f"no datasheet for {run.device_name}")
    return spec


def _copy_rate(run: Recording) -> float:
    """The device copy's bandwidth (GB/s, read + written) that chapter 1 recorded on ``run``'s GPU."""
    return next(r["measured"] for r in ok_rows(same_gpu(run, PEAKS).rows) if r["work"] == "copy")


# --- sizes -------------------------------------------------------------------------------------------------------

def _spaces(run: Recording) -> dict[str, int]:
    return {r["space"]: r["total_bytes"] for r in run.rows}


def _sizes_grow_outward(run: Recording) -> Verdict:
    s = _spaces(run)
    order = [s["registers"], s["L1 cache + shared memory"], s["L2 cache"], s["global memory"]]
    ratio = s["global memory"] / s["L2 cache"]
    return verdict(order == sorted(order) and ratio > 1000,
                   f"registers {format_bytes(s['registers'])}, L1 and shared "
                   f"{format_bytes(s['L1 cache + shared memory'])}, L2 {format_bytes(s['L2 cache'])}, "
                   f"global {format_bytes(s['global memory'])} "
                   f"({ratio:,.0f} L2s)")


SIZES_GROW_OUTWARD = Claim(
    "sizes_grow_outward", "From the registers out to device memory, each level is at least as large as the one "
    "before it (registers, the L1 and shared-memory SRAM, the L2, global memory), and global memory holds more than "
    "a thousand L2s.", SIZES, _sizes_grow_outward)


def _registers_near_l2(run: Recording) -> Verdict:
    s = _spaces(run)
    ratio = s["registers"] / s["L2 cache"]
    return verdict(0.5 <= ratio <= 1, f"all register files {ratio:.2f} of the L2")


REGISTERS_NEAR_L2 = Claim(
    "registers_near_l2", "The register files of all SMs together hold between half and all of the L2 cache's "
    "capacity.", SIZES, _registers_near_l2)


# --- host copies -------------------------------------------------------------------------------------------------

def _best_h2d(run: Recording, kind: str) -> float:
    return max(r["gbytes_per_s"] for r in ok_rows(run.rows) if r["direction"] == "h2d" and r["memory"] == kind)


def _pcie_costs(run: Recording) -> Verdict:
    copy = _copy_rate(run)
    pinned, pageable = copy / _best_h2d(run, "pinned"), copy / _best_h2d(run, "pageable")
    return verdict(10 <= pinned < 100 <= pageable,
                   f"device copy over the best copy to the GPU: pinned {pinned:.0f}x, pageable {pageable:.0f}x")


PCIE_COSTS = Claim(
    "pcie_costs", "A byte brought to the GPU across PCIe from pinned memory takes tens of times longer than a byte "
    "moved by a copy within device memory, and from pageable memory more than a hundred times longer.", TRANSFERS,
    _pcie_costs)


def _small_copies(run: Recording) -> Verdict:
    pinned = {r["nbytes"]: r["seconds"] for r in ok_rows(run.rows)
              if r["direction"] == "h2d" and r["memory"] == "pinned"}
    small, larger = pinned[4096], pinned[262144]
    fastest = min(r["seconds"] for r in ok_rows(run.rows))
    return verdict(small >= larger / 2 and fastest > 10e-6,
                   f"pinned, to the GPU: 4 KiB {small * 1e6:.1f} µs, 256 KiB {larger * 1e6:.1f} µs; the quickest copy "
                   f"of any size {fastest * 1e6:.1f} µs")


SMALL_COPIES = Claim(
    "small_copies", "A pinned copy of 4 KiB takes at least half as long as one of 256 KiB, 64 times larger, and no "
    "copy takes less than ten microseconds: every copy pays a fixed cost first.", TRANSFERS, _small_copies)


# --- coalescing --------------------------------------------------------------------------------------------------

def _strides(run: Recording) -> dict[int, dict]:
    return {r["stride"]: r for r in ok_rows(run.rows)}


def _stride_falls(run: Recording) -> Verdict:
    rows = _strides(run)
    strides = sorted(rows)
    rates = [rows[s]["useful_gbytes_per_s"] for s in strides]
    return verdict(all(a > b for a, b in zip(rates, rates[1:], strict=False)),
                   f"stride {strides[0]} {rates[0]:,.0f} GB/s down to stride {strides[-1]} {rates[-1]:,.0f} GB/s")


STRIDE_FALLS = Claim("stride_falls", "The useful bandwidth falls at every step of the stride.", COALESCING,
                     _stride_falls)


def _share_of_sectors(run: Recording) -> dict[int, float]:
    """Per stride: the useful bandwidth over what the sectors allow at the device copy's rate."""
    copy = _copy_rate(run)
    return {s: r["useful_gbytes_per_s"] / (copy * 8 / r["bytes_moved_per_element"]) for s, r in _strides(run).items()}


def _sectors_explain_small_strides(run: Recording) -> Verdict:
    share = _share_of_sectors(run)
    return verdict(share[1] < 0.9 <= min(share[4], share[8]),
                   f"stride 1 {share[1]:.0%}, stride 4 {share[4]:.0%}, stride 8 {share[8]:.0%} of the sectors at the "
                   "copy's rate")


SECTORS_EXPLAIN_SMALL_STRIDES = Claim(
    "sectors_explain_small_strides", "At strides 4 and 8 the kernel moves its sectors at 90% or more of the device "
    "copy's rate, so the sectors are the whole cost; at stride 1 it stays below 90%, because one 4-byte load per "
    "thread keeps too few bytes in flight.", COALESCING, _sectors_explain_small_strides)


def _overfetch_from_16(run: Recording) -> Verdict:
    share = _share_of_sectors(run)
    return verdict(all(0.4 <= share[s] <= 0.6 for s in (16, 32)),
                   f"stride 16 {share[16]:.0%}, stride 32 {share[32]:.0%} of the sectors at the copy's rate")


OVERFETCH_FROM_16 = Claim(
    "overfetch_from_16", "At strides 16 and 32, where the sectors a warp needs are 64 bytes or more apart, the "
    "kernel reaches only 40% to 60% of what its sectors allow at the copy's rate: the memory moves about twice what "
    "the warp uses.", COALESCING, _overfetch_from_16)


# --- the stencil -------------------------------------------------------------------------------------------------

def _barrier(run: Recording) -> Verdict:
    rows = ok_rows(run.rows)
    with_barrier = [r["wrong"] for r in rows if r["barrier"]]
    without = [r["wrong_fraction"] for r in rows if not r["barrier"]]
    at_risk = outputs_at_risk() / memory.STENCIL_BLOCK
    if not with_barrier or not without:
        raise KeyError("launches with and without the barrier")
    return verdict(sum(with_barrier) == 0 and min(without) > 0 and max(without) <= at_risk,
                   f"with the barrier {sum(with_barrier)} wrong in {len(with_barrier)} launches; without it "
                   f"{min(without):.1%} to {max(without):.1%} wrong, {at_risk:.1%} at risk")


BARRIER = Claim(
    "barrier", "With the barrier every output is right in every launch. Without it every launch gets outputs wrong, "
    "and no more than the outputs whose window holds a slot another warp writes.", STENCIL, _barrier)


# --- transposes --------------------------------------------------------------------------------------------------

def _kernels(run: Recording) -> dict[str, dict]:
    return {r["kernel"]: r for r in ok_rows(run.rows)}


def _transpose_order(run: Recording) -> Verdict:
    k = _kernels(run)
    share = {name: k[name]["fraction_of_copy"] for name in
             ("12_transpose_naive", "13_transpose_tiled", "14_transpose_padded", "11_copy_tiled")}
    naive, tiled, padded, copy = share.values()
    return verdict(naive < 0.2 and naive < tiled < padded < copy and copy >= 0.95,
                   f"naive {naive:.0%}, tiled {tiled:.0%}, padded {padded:.0%}, tiled copy {copy:.0%} of the copy")


TRANSPOSE_ORDER = Claim(
    "transpose_order", "The naive transpose moves less than a fifth of the copy's bytes per second; the tiled one "
    "does better, the padded one better again, and the tiled copy that sets the pace is within 5% of the device "
    "copy.", TRANSPOSE, _transpose_order)


def _conflicts_bound_tiled(run: Recording) -> Verdict:
    spec = _spec(run)
    tile = memory.TILE
    # one tile: 32 conflict-free row stores and 32 column loads of 32 cycles each, for tile * tile floats,
    # each read once from and written once to device memory (8 bytes)
    floats_per_clock = tile * tile / (tile + tile * memory.bank_conflict_degree(tile))
    bound = spec.sms * spec.boost_clock_ghz * 1e9 * floats_per_clock * 8 / 1e9
    rate = _kernels(run)["13_transpose_tiled"]["gbytes_per_s"]
    return verdict(0.7 <= rate / bound <= 1,
                   f"{rate:,.0f} GB/s, {rate / bound:.0%} of the {bound:,.0f} GB/s that {spec.sms} SMs allow at "
                   f"{spec.boost_clock_ghz} GHz")


CONFLICTS_BOUND_TILED = Claim(
    "conflicts_bound_tiled", "The tiled transpose runs at 70% to 100% of the rate its bank conflicts allow: with "
    "one column read taking 32 steps, an SM's shared memory passes about one float per clock, whatever the "
    "device memory could deliver.", TRANSPOSE, _conflicts_bound_tiled)


# --- bytes in flight ---------------------------------------------------------------------------------------------

def _latency_beyond_course(run: Recording) -> Verdict:
    latency = memory.unloaded_latency(run.rows)
    cycles = latency * _spec(run).boost_clock_ghz * 1e9
    return verdict(cycles > 2 * COURSE_LATENCY_CYCLES,
                   f"L = {latency * 1e9:,.0f} ns, {cycles:,.0f} cycles at the boost clock")


LATENCY_BEYOND_COURSE = Claim(
    "latency_beyond_course", f"The latency that Little's law reads from the slow runs is more than twice the course's "
    f"{COURSE_LATENCY_CYCLES} cycles.", IN_FLIGHT, _latency_beyond_course)


def _threads_beat_loads(run: Recording) -> Verdict:
    rows = ok_rows(run.rows)
    best = max(r["gbytes_per_s"] for r in rows)
    by_bytes: dict[int, list[dict]] = {}
    for r in rows:
        by_bytes.setdefault(r["bytes_in_flight"], []).append(r)
    pairs = []
    for group in by_bytes.values():
        group.sort(key=lambda r: r["loads"])
        pairs += [(a, b) for a, b in zip(group, group[1:], strict=False) if a["gbytes_per_s"] < 0.8 * best]
    if not pairs:
        raise ValueError("no two runs with the same bytes in flight below 80% of the best bandwidth")
    worst = max(pairs, key=lambda p: p[1]["gbytes_per_s"] / p[0]["gbytes_per_s"])
    return verdict(all(b["gbytes_per_s"] < a["gbytes_per_s"] for a, b in pairs),
                   f"{len(pairs)} pairs; closest: {worst[0]['loads']} load{'s' * (worst[0]['loads'] > 1)} per thread "
                   f"{worst[0]['gbytes_per_s']:,.0f} GB/s, {worst[1]['loads']} loads "
                   f"{worst[1]['gbytes_per_s']:,.0f} GB/s at "
                   f"{format_bytes(worst[0]['bytes_in_flight'])} in flight")


THREADS_BEAT_LOADS = Claim(
    "threads_beat_loads", "Below the peak, at the same bytes in flight, more threads with fewer loads each always "
    "move more than fewer threads with more loads each.", IN_FLIGHT, _threads_beat_loads)


def _about_a_mebibyte(run: Recording) -> Verdict:
    latency = memory.unloaded_latency(run.rows)
    read = max(r["gbytes_per_s"] for r in ok_rows(run.rows)) * 1e9 / 2  # the copy reads half of what it moves
    needed = read * latency
    return verdict(2**19 <= needed <= 2**22, f"{format_bytes(int(needed))} at {read / 1e9:,.0f} GB/s read and "
                   f"L = {latency * 1e9:,.0f} ns")


ABOUT_A_MEBIBYTE = Claim(
    "about_a_mebibyte", "At the best read rate, Little's law asks for about a mebibyte in flight across the whole "
    "GPU (between 0.5 and 4 MiB).", IN_FLIGHT, _about_a_mebibyte)


# --- the transposes' hardware counters (profiled in chapter 18) --------------------------------------------------

def _naive_bytes_in_l2(run: Recording) -> Verdict:
    naive, tiled, padded = counters.transposes(run)
    tiled_l2 = max(counters.l2_over_book(tiled), counters.l2_over_book(padded))
    holds = (naive["bytes_ratio"] > 1 and not naive["bytes_within"] and tiled["bytes_within"]
             and padded["bytes_within"] and counters.l2_over_book(naive) >= 3 * tiled_l2)
    return verdict(holds, f"DRAM bytes / the book's: naive {naive['bytes_ratio']:.2f}, tiled "
                   f"{tiled['bytes_ratio']:.2f}, padded {padded['bytes_ratio']:.2f}; L2 bytes / the book's: naive "
                   f"{counters.l2_over_book(naive):.1f}, tiled ones at most {tiled_l2:.1f}")


NAIVE_BYTES_IN_L2 = Claim(
    "naive_bytes_in_l2", "Only the naive transpose moves more DRAM bytes than the book counts (by more than 10%), and "
    "between L2 and the SMs it moves at least three times as many bytes as either tiled transpose: most of the waste "
    "of its scattered writes stays between the SMs and L2.",
    counters.EXPERIMENT, _naive_bytes_in_l2)


def _padding_moves_the_stall(run: Recording) -> Verdict:
    _, tiled, padded = counters.transposes(run)
    (tiled_stall, _), (padded_stall, _) = top_stall(tiled), top_stall(padded)
    faster = padded["dram_gbytes_per_s"] / tiled["dram_gbytes_per_s"]
    return verdict(tiled_stall == "mio_throttle" and padded_stall == "long_scoreboard" and faster >= 1.5,
                   f"top stalls: tiled {tiled_stall}, padded {padded_stall}; the padded one moves DRAM bytes "
                   f"{faster:.1f}x as fast")


PADDING_MOVES_THE_STALL = Claim(
    "padding_moves_the_stall", "The tiled transpose's warps wait most for room in the queue of shared-memory "
    "instructions (`mio_throttle`), which its bank conflicts fill; the padded transpose's wait most for global "
    "loads (`long_scoreboard`), as a kernel limited by DRAM should, and it moves DRAM bytes at least 1.5 times as "
    "fast.", counters.EXPERIMENT, _padding_moves_the_stall)
