"""What chapter 07 states about launch configurations and SAXPY, as claims checked on every recorded GPU
(:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

LAUNCH = "threads_launch_configuration"
SAXPY = "threads_saxpy_vs_copy"


def _config(run: Recording, threads: int, elements: int) -> dict:
    found = [r for r in ok_rows(run.rows) if (r["threads_per_block"], r["elements_per_thread"]) == (threads, elements)]
    if not found:
        raise KeyError(f"no row for {threads} threads x {elements} elements")
    return found[0]


def _block_rate(run: Recording) -> Verdict:
    rates = {t: _config(run, t, 1)["blocks"] / _config(run, t, 1)["seconds"] for t in (32, 64, 128)}
    spread = max(rates.values()) / min(rates.values()) - 1
    evidence = ", ".join(f"{t} threads {rate / 1e9:.2f}" for t, rate in rates.items()) + " billion blocks/s"
    return verdict(spread < 0.05, evidence)


BLOCK_RATE = Claim(
    "block_rate", "With one element per thread, blocks of 32, 64 and 128 threads are retired at the same number of "
    "blocks per second, so the bandwidth grows in step with the block size: what limits these launches is the rate "
    "at which the GPU starts and retires blocks, not occupancy (64-thread blocks fill every thread slot of an SM "
    "and still reach only half the bandwidth of 128-thread blocks).", LAUNCH, _block_rate)


def _occupancy_at_many_elements(run: Recording) -> Verdict:
    small, full = _config(run, 32, 16), _config(run, 64, 16)
    share = small["gbytes_per_s"] / full["gbytes_per_s"]
    return verdict(small["occupancy"] <= 0.5 < full["occupancy"] and share < 0.9,
                   f"32 x 16 at {small['occupancy']:.0%} occupancy {small['gbytes_per_s']:,.0f} GB/s, 64 x 16 at "
                   f"{full['occupancy']:.0%} {full['gbytes_per_s']:,.0f} GB/s ({share:.0%})")


OCCUPANCY_AT_MANY_ELEMENTS = Claim(
    "occupancy_at_many_elements", "With 16 elements per thread there are few blocks to start, and there occupancy "
    "is the limit: 32-thread blocks, which fill only half of an SM's thread slots, keep too few loads in flight and "
    "reach less than 90% of the bandwidth of 64-thread blocks.", LAUNCH, _occupancy_at_many_elements)


def _kernels(run: Recording) -> dict[str, dict]:
    return {r["kernel"]: r for r in ok_rows(run.rows)}


def _one_element_slowest(run: Recording) -> Verdict:
    rows = _kernels(run)
    others = [k for k in rows if k not in ("copy", "04_saxpy")]
    slowest = all(rows["04_saxpy"]["gbytes_per_s"] < rows[k]["gbytes_per_s"] for k in others)
    shares = ", ".join(f"{k} {rows[k]['fraction_of_copy']:.1%} of the copy" for k in rows if k != "copy")
    return verdict(slowest, shares)


ONE_ELEMENT_SLOWEST = Claim(
    "one_element_slowest", "The course's one-element kernel is the slowest of the three: more work per thread, or "
    "wider loads in a loop over a small grid, move the same bytes faster.", SAXPY, _one_element_slowest)


def _one_element_leaves_bandwidth(run: Recording) -> Verdict:
    share = _kernels(run)["04_saxpy"]["fraction_of_copy"]
    return verdict(share < 0.9, f"one element per thread at {share:.1%} of the copy")


ONE_ELEMENT_LEAVES_BANDWIDTH = Claim(
    "one_element_leaves_bandwidth", "the one-element kernel leaves more than a tenth of the copy's bandwidth unused.",
    SAXPY, _one_element_leaves_bandwidth, scoped=True)


def _best_near_copy(run: Recording) -> Verdict:
    rows = _kernels(run)
    best = max((k for k in rows if k != "copy"), key=lambda k: rows[k]["gbytes_per_s"])
    return verdict(rows[best]["fraction_of_copy"] >= 0.95, f"the best, {best}, at {rows[best]['fraction_of_copy']:.1%}")


BEST_NEAR_COPY = Claim(
    "best_near_copy", "The best of the three moves bytes at 95% or more of the copy's rate, past the chapter's "
    "target of 90%.", SAXPY, _best_near_copy)
