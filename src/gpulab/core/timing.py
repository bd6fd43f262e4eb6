"""Honest timers: warm up, synchronise, repeat, report the median and the spread.

GPU work is asynchronous: a kernel launch returns to Python long before the kernel finishes, so a
host clock read right after a launch measures the launch, not the work. On a GPU these timers put
CUDA events around every repetition and read them after one final synchronisation; on a CPU they
use ``time.perf_counter``. Before each repetition the L2 cache can be flushed (by writing a buffer
larger than any L2) so that a kernel cannot reuse the previous repetition's data from cache --
the same method as ``triton.testing.do_bench``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpulab.core import env
from gpulab.core.provenance import experiment

L2_FLUSH_BYTES = 256 * 2**20  # larger than the L2 of any GPU in the book (H200: 60 MB)


@dataclass(frozen=True)
class Timing:
    """Wall times of repeated runs of one piece of work, in seconds."""

    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    @property
    def max_s(self) -> float:
        return max(self.samples_s)

    @property
    def spread(self) -> float:
        """Interquartile range over the median: 0.02 means the middle half lies within 2%."""
        if len(self.samples_s) < 4:
            return (self.max_s - self.min_s) / self.median_s
        q1, _, q3 = statistics.quantiles(self.samples_s, n=4)
        return (q3 - q1) / self.median_s

    def rate(self, work: float) -> float:
        """``work`` per second at the median time (e.g. FLOP/s for work in FLOP)."""
        return work / self.median_s


def synchronize(device: torch.device) -> None:
    """Wait until all work queued on ``device`` has finished (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds that one call of ``fn()`` keeps ``device`` busy, starting from an idle device."""
    synchronize(device)
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _choose_repeats(seconds_per_run: float, target_s: float, low: int, high: int) -> int:
    return max(low, min(high, int(target_s / max(seconds_per_run, 1e-7))))


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device | None = None,
    warmup: int = 3,
    repeats: int | None = None,
    target_s: float | None = None,
    flush_l2: bool = True,
) -> Timing:
    """Time ``fn()`` on ``device`` and return every repetition's time.

    ``repeats=None`` picks a count so that the timed runs take about ``target_s`` seconds
    (0.2 s by default on a GPU, 0.5 s on a CPU). ``flush_l2`` applies to GPUs only.
    """
    device = device or env.device()
    if warmup < 0:
        raise ValueError(f"warmup: must be >= 0, got {warmup}")
    if repeats is not None and repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    synchronize(device)

    if device.type != "cuda":
        if repeats is None:
            start = time.perf_counter()
            fn()
            repeats = _choose_repeats(time.perf_counter() - start, target_s or 0.5, 3, 50)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return Timing(tuple(samples))

    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device) if flush_l2 else None
    if repeats is None:
        repeats = _choose_repeats(once(fn, device), target_s or 0.2, 10, 2000)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush.zero_()  # evicts the previous run's data from L2; not inside the timed region
        start.record()
        fn()
        end.record()
    synchronize(device)
    return Timing(tuple(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)))


@experiment("timing_fidelity")
def compare_with_do_bench(matmul_n: int = 4096, copy_bytes: int = 2**30, rounds: int = 6) -> list[dict]:
    """Median times of :func:`measure` and of ``triton.testing.do_bench`` for the same work (GPU only).

    The work: an ``matmul_n``^3 float16 matmul and a ``copy_bytes`` device-to-device copy. Both timers
    flush L2 between repetitions and use CUDA events, so their medians should agree closely. The matmul
    holds an H200 at its power limit, where the clock, and with it the matmul's time, wanders by a few
    per cent from one half-second to the next, and drops as the chip warms. So the two timers take turns
    over ``rounds`` rounds, each going first in half of them (a timer that always went first would be
    handed the cooler chip), and a row compares their medians over all rounds. ``round_differences``
    gives each round's own difference, to show how far a single pair of runs can disagree.
    """
    if rounds < 2 or rounds % 2:
        raise ValueError(f"rounds: an even number >= 2, so that each timer goes first equally often; got {rounds}")
    device = env.device()
    if device.type != "cuda":
        raise ValueError("device: the timing comparison with triton's do_bench needs a CUDA GPU")
    import triton.testing  # only on GPU machines; imported here so the CPU build never needs it

    a = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.float16)
    b = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.float16)
    source = torch.randn(copy_bytes // 4, device=device)
    target = torch.empty_like(source)
    work = {
        f"matmul {matmul_n}^3 float16": lambda: torch.mm(a, b),
        f"copy {copy_bytes / 2**30:g} GiB": lambda: target.copy_(source),
    }
    timers = {
        "gpulab": lambda fn: measure(fn, device=device, warmup=10, target_s=0.5).median_s,
        "do_bench": lambda fn: triton.testing.do_bench(fn, warmup=100, rep=500, return_mode="median") / 1e3,
    }
    rows = []
    for name, fn in work.items():
        medians: dict[str, list[float]] = {timer: [] for timer in timers}
        for round_number in range(rounds):
            for timer in sorted(timers, reverse=round_number % 2 == 1):  # gpulab first, then do_bench first
                medians[timer].append(timers[timer](fn))
        ours, theirs = (statistics.median(medians[timer]) for timer in ("gpulab", "do_bench"))
        rows.append({"work": name, "rounds": rounds, "gpulab_seconds": ours, "do_bench_seconds": theirs,
                     "difference": ours / theirs - 1,
                     "round_differences": [g / d - 1 for g, d in zip(medians["gpulab"], medians["do_bench"],
                                                                     strict=True)]})
    return rows
