"""What chapter 01 states about peaks, clocks, the memory hierarchy and Little's law, as claims checked on every
recorded GPU (:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch01_cpus_to_gpus import hardware
from gpulab.core import specs
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

PEAKS = "hardware_peaks"
HIERARCHY = "hardware_copy_hierarchy"
TRANSFERS = "hardware_host_transfers"
TENSOR_FORMATS = ("tf32", "float16", "bfloat16")  # the formats only the tensor cores multiply


def _matmuls(run: Recording) -> dict[str, dict]:
    """The checked matmul rows of a ``hardware_peaks`` run that carry a peak, by number format."""
    found = {r["dtype"]: r for r in ok_rows(run.rows) if r["work"] != "copy" and r.get("peak")}
    if not found:
        raise KeyError("no matmul row with a peak")
    return found


def _row(run: Recording) -> specs.GPU:
    row = specs.find(run.device_name)
    if row is None:
        raise KeyError(f"{run.device_name!r} is not a GPU of gpulab.core.specs")
    return row


def _below_peak(run: Recording) -> Verdict:
    rows = _matmuls(run)
    return verdict(all(max(r["measured"], r["sustained"]) < r["peak"] for r in rows.values()),
                   ", ".join(f"{d} {r['fraction']:.0%}" for d, r in rows.items()) + " of the datasheet peak")


BELOW_PEAK = Claim(
    "below_peak", "No number format's matrix multiply reaches its datasheet peak, neither timed alone nor sustained "
    "for two seconds.", PEAKS, _below_peak)


def _float64_on_tensor_cores(run: Recording) -> Verdict:
    row, measured = _row(run), _matmuls(run)["float64"]["measured"]
    units = specs.peak(row, "float64", specs.CUDA_CORES).tflops
    tensor = specs.peak(row, "float64", specs.TENSOR_CORES).tflops
    return verdict(measured > units, f"float64 matmul {measured:.1f} TFLOP/s; the FP64 units' peak {units:.1f}, "
                                     f"the FP64 tensor cores' {tensor:.1f}")


FLOAT64_ON_TENSOR_CORES = Claim(
    "float64_on_tensor_cores", "cuBLAS's float64 matrix multiply runs faster than the peak of the FP64 units, so "
    "it cannot run on them: it runs on the FP64 tensor cores.", PEAKS, _float64_on_tensor_cores)


def _tensor_load_lowers_clock(run: Recording) -> Verdict:
    rows = _matmuls(run)
    tensor = [d for d, r in rows.items() if r.get("unit_kind") == specs.TENSOR_CORES]
    fp32 = rows["float32"]
    holds = (bool(tensor) and all(rows[d]["clock_mhz"] < rows[d]["rated_clock_mhz"] for d in tensor)
             and fp32["clock_mhz"] >= 0.99 * fp32["rated_clock_mhz"])
    power = max(r["power_w"] for r in rows.values())
    return verdict(holds, ", ".join(f"{d} {r['clock_mhz']:,.0f} of {r['rated_clock_mhz']:,.0f} MHz"
                                    for d, r in rows.items()) + f"; power up to {power:,.0f} W")


TENSOR_LOAD_LOWERS_CLOCK = Claim(
    "tensor_load_lowers_clock", "Every matrix multiply on the tensor cores (float64 included) ran below the clock "
    "its peak is quoted at, while the float32 multiply on the FP32 units ran within 1% of its rated clock.",
    PEAKS, _tensor_load_lowers_clock)


def _clock_explains(run: Recording) -> Verdict:
    rows = _matmuls(run)
    gains = {d: rows[d]["fraction_at_clock"] - rows[d]["fraction"] for d in TENSOR_FORMATS}
    return verdict(all(g >= 0.1 for g in gains.values()), ", ".join(
        f"{d} {rows[d]['fraction']:.0%} against {rows[d]['fraction_at_clock']:.0%}" for d in TENSOR_FORMATS)
        + " (datasheet peak against sustained, of the peak at its clock)")


CLOCK_EXPLAINS = Claim(
    "clock_explains", "Judged against the peak at the clock it ran at, each TF32 and 16-bit matrix multiply is at "
    "least 10 points closer to its peak than against the datasheet.", PEAKS, _clock_explains)


def _float32_furthest(run: Recording) -> Verdict:
    rows = _matmuls(run)
    others = [d for d in rows if d != "float32"]
    return verdict(all(rows["float32"]["fraction_at_clock"] < rows[d]["fraction_at_clock"] for d in others),
                   ", ".join(f"{d} {r['fraction_at_clock']:.0%}" for d, r in rows.items())
                   + " of the peak at its clock")


FLOAT32_FURTHEST = Claim(
    "float32_furthest", "At the clock it ran at, the float32 multiply on the FP32 units is the furthest of all the "
    "formats from its peak.", PEAKS, _float32_furthest)


def _float64_closest(run: Recording) -> Verdict:
    rows = _matmuls(run)
    others = [d for d in rows if d != "float64"]
    return verdict(all(rows["float64"]["fraction_at_clock"] > rows[d]["fraction_at_clock"] for d in others),
                   f"float64 {rows['float64']['fraction_at_clock']:.0%} of the peak at its clock, the best of the "
                   f"others {max(rows[d]['fraction_at_clock'] for d in others):.0%}")


FLOAT64_CLOSEST = Claim(
    "float64_closest", "At the clock it ran at, the float64 multiply on the FP64 tensor cores comes closer to its "
    "peak than any other format.", PEAKS, _float64_closest)


def _copy_share(run: Recording) -> Verdict:
    copy = next(r for r in ok_rows(run.rows) if r["work"] == "copy")
    return verdict(0.85 <= copy["fraction"] <= 0.90, f"{copy['measured']:,.0f} of {copy['peak']:,.0f} GB/s, "
                                                     f"{copy['fraction']:.1%}")


COPY_SHARE = Claim(
    "copy_share", "A copy of a GiB within device memory reaches between 85% and 90% of the datasheet bandwidth.",
    PEAKS, _copy_share)


def _best(run: Recording, cache: str) -> dict:
    rows = [r for r in ok_rows(run.rows) if r["cache"] == cache]
    if not rows:
        raise KeyError(f"no {cache} copy")
    return max(rows, key=lambda r: r["gbytes_per_s"])


def _hot_beats_cold(run: Recording) -> Verdict:
    hot, cold, l2 = _best(run, "hot"), _best(run, "cold"), _row(run).l2_mb * 1e6
    ratio = hot["gbytes_per_s"] / cold["gbytes_per_s"]
    return verdict(1 < ratio < 1.5 and 2 * hot["nbytes"] <= l2,
                   f"best hot {hot['gbytes_per_s']:,.0f} GB/s with {2 * hot['nbytes'] / 1e6:,.0f} MB of source and "
                   f"target (L2 {l2 / 1e6:,.0f} MB); best cold {cold['gbytes_per_s']:,.0f} GB/s ({ratio:.2f}x)")


HOT_BEATS_COLD = Claim(
    "hot_beats_cold", "The fastest hot copy, whose source and target fit in the L2 together, is faster than any copy "
    "from device memory, though by less than a factor of 1.5.", HIERARCHY, _hot_beats_cold)


def _curves_meet(run: Recording) -> Verdict:
    l2 = _row(run).l2_mb * 1e6
    cold = {r["nbytes"]: r["gbytes_per_s"] for r in ok_rows(run.rows) if r["cache"] == "cold"}
    pairs = [(r["nbytes"], r["gbytes_per_s"] / cold[r["nbytes"]]) for r in ok_rows(run.rows)
             if r["cache"] == "hot" and 2 * r["nbytes"] >= 2 * l2]
    if not pairs:
        raise KeyError("no copy of twice the L2 or more")
    worst = max(pairs, key=lambda p: abs(p[1] - 1))
    return verdict(abs(worst[1] - 1) <= 0.05, f"from {2 * pairs[0][0] / 1e6:,.0f} MB of source and target, hot "
                                              f"and cold within {abs(worst[1] - 1):.1%}")


CURVES_MEET = Claim(
    "curves_meet", "Once source and target fill twice the L2 or more, the hot and cold copies run within 5% of each "
    "other: both are limited by the device memory.", HIERARCHY, _curves_meet)


def _host_slower(run: Recording) -> Verdict:
    rows = ok_rows(run.rows)
    best = {(d, m): max(r["gbytes_per_s"] for r in rows if (r["direction"], r["memory"]) == (d, m))
            for d in ("h2d", "d2h") for m in ("pinned", "pageable")}
    row = _row(run)
    ordered = all(best[(d, "pageable")] < best[(d, "pinned")] <= row.pcie_gb_s for d in ("h2d", "d2h"))
    factor = row.bandwidth_gb_s / max(best.values())
    return verdict(ordered and factor >= 50, ", ".join(f"{d} {m} {v:,.0f} GB/s" for (d, m), v in best.items())
                   + f"; PCIe {row.pcie_generation}.0 x16 {row.pcie_gb_s:.0f} GB/s; device memory "
                   f"{row.bandwidth_gb_s:,} GB/s, {factor:.0f}x the fastest host copy")


HOST_SLOWER = Claim(
    "host_slower", "Pageable host memory is slower than pinned in both directions; pinned copies stay below the "
    "PCIe link's rate, and the device memory's datasheet bandwidth is 50 times theirs or more.", TRANSFERS,
    _host_slower)


def _little(run: Recording) -> Verdict:
    fit, row = hardware.latency_fit(run.rows), _row(run)
    per_thread = fit["bytes_in_flight"] / (row.sms * row.max_threads_per_sm)
    return verdict(0.5e-6 <= fit["t0_s"] <= 2.5e-6 and 16 <= per_thread <= 32,
                   f"t0 {fit['t0_s'] * 1e6:.2f} µs, B t0 {fit['bytes_in_flight'] / 2**20:.1f} MiB, "
                   f"{per_thread:.0f} bytes per resident thread")


LITTLE = Claim(
    "little", "The fitted $t_0$ is a microsecond or two, and $B\\,t_0$ spread over every thread the GPU can hold is "
    "between 16 and 32 bytes each: one or two 16-byte loads in flight per thread, all the time.", HIERARCHY, _little)
