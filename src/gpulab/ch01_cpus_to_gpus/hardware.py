"""The experiments of the chapter "From CPUs to GPUs": the machine measured against its datasheet.

- :func:`peaks_vs_measured`: a large matmul per dtype and a large copy, against the peaks that
  :mod:`gpulab.core.specs` derives, with the clock the GPU actually ran at (from :mod:`gpulab.core.clocks`);
- :func:`copy_hierarchy`: copy bandwidth against the size of the data, with the data either still in
  cache from the previous copy (hot) or evicted (cold): the levels of the memory hierarchy;
- :func:`latency_fit`: the fixed cost per copy and the asymptotic bandwidth of the cold copies,
  the two numbers of Little's law;
- :func:`host_transfers`: host-to-device and device-to-host copies from pinned and pageable memory.

Every experiment checks what it moved or computed before it times it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from gpulab.core import clocks, env, flops, rates, specs, timing
from gpulab.core.correctness import random_tensor
from gpulab.core.precision import matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import ok_rows, run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints

COLD_BYTES = 512 * 2**20  # cold copies cycle through this many bytes of buffers: far more than any L2
MAX_COPIES = 1024  # copies per timed batch (and nodes in one CUDA graph)
BATCH_BYTES = 256 * 2**20  # a timed batch moves at least this much, so that one batch takes ~0.1 ms or more


def _sustained_matmul(n: int, label: str, device: torch.device, seconds: float) -> tuple[float, clocks.ClockLog]:
    """FLOP/s of back-to-back n^3 matmuls run for about ``seconds``, and the clock samples taken meanwhile."""
    with matmul_mode(label) as torch_dtype:
        a, b = random_tensor((n, n), torch_dtype, device), random_tensor((n, n), torch_dtype, device)
        one = timing.measure(lambda: torch.mm(a, b), device=device, repeats=3).median_s
        count = max(3, math.ceil(seconds / one))

        def loop() -> None:
            for _ in range(count):
                torch.mm(a, b)

        with clocks.sampled(device) as log:
            elapsed = timing.once(loop, device)
    return count * flops.gemm(n, n, n, label).flops / elapsed, log


@experiment("hardware_peaks")
def peaks_vs_measured(matmul_n: int, dtypes: Sequence[str], copy_bytes: int, sustain_s: float = 2.0) -> list[dict]:
    """Measured matmul rate per dtype and copy bandwidth, beside this GPU's derived peaks and its real clock.

    A matmul row has the checked median rate (:func:`gpulab.core.rates.measure_blas`), the rate of a
    ``sustain_s``-second run of back-to-back matmuls, the median SM clock and power during that run,
    and, for a GPU of the table, the peak at the rated clock and at the measured clock.
    """
    device = env.device()
    row_spec = specs.present(device)
    rows = []
    for point in run_sweep(rates.measure_blas, [{"op": "gemm", "n": matmul_n, "dtype": d} for d in dtypes]):
        row = {"work": f"matmul {point['dtype']}", "dtype": point["dtype"], "status": point["status"]}
        if point["status"] == "ok":
            sustained, log = _sustained_matmul(matmul_n, point["dtype"], device, sustain_s)
            row.update(n=matmul_n, measured=point["gflops"] / 1e3, sustained=sustained / 1e12, unit="TFLOP/s",
                       clock_mhz=log.median("sm_mhz"), power_w=log.median("power_w"),
                       temperature_c=log.median("temperature_c"))
            if row_spec is not None:
                peak = specs.peak(row_spec, point["dtype"])
                row.update(peak=peak.tflops, rated_clock_mhz=peak.clock_ghz * 1e3, unit_kind=peak.unit,
                           formula=peak.formula())
        rows.append(row)
    copy = rates.measure_copy(copy_bytes, device)
    row = {"work": "copy", "nbytes": copy["nbytes"], "measured": copy["gbytes_per_s"], "unit": "GB/s", "status": "ok"}
    if row_spec is not None:
        row["peak"] = row_spec.bandwidth_gb_s
    rows.append(row)
    for row in rows:
        if row.get("peak") and row.get("measured"):
            row["fraction"] = row["measured"] / row["peak"]
        if row.get("clock_mhz") and row.get("rated_clock_mhz"):
            row["peak_at_clock"] = row["peak"] * row["clock_mhz"] / row["rated_clock_mhz"]
            row["fraction_at_clock"] = row["sustained"] / row["peak_at_clock"]
    return rows


def _copy_batch(nbytes: int, hot: bool, device: torch.device) -> tuple[Callable[[], None], int]:
    """A function doing ``count`` copies of ``nbytes``, and ``count``.

    Hot: the same source and target every time, so a working set that fits in cache stays there.
    Cold: a ring of distinct buffers totalling ``COLD_BYTES``, so each copy finds its data evicted.
    On a GPU a batch of several copies is captured in a CUDA graph, which removes the CPU's launch
    cost per copy. (A single copy runs as it is: a graph's memcpy node of 512 MiB or more measured
    20% slower on an H100 than the same copy launched directly.)
    """
    count = max(1, min(MAX_COPIES, BATCH_BYTES // (2 * nbytes)))
    buffers = 1 if hot else max(1, min(count, COLD_BYTES // (2 * nbytes)))
    elements = nbytes // 4
    sources = [torch.randint(-2**31, 2**31 - 1, (elements,), dtype=torch.int32, device=device) for _ in range(buffers)]
    targets = [torch.full_like(s, -1) for s in sources]
    for source, target in zip(sources, targets, strict=True):
        target.copy_(source)
        if not torch.equal(source, target):
            raise AssertionError(f"copy of {nbytes} bytes: the target differs from the source")

    def batch() -> None:
        for i in range(count):
            targets[i % buffers].copy_(sources[i % buffers])

    if device.type != "cuda" or count == 1:  # one large copy: the CPU's launch cost is not on the GPU's clock
        return batch, count
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        batch()  # warm-up outside the capture, as CUDA graphs require
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        batch()
    return graph.replay, count


def measure_copy_level(nbytes: int, hot: bool) -> dict:
    """Bandwidth of copies of ``nbytes`` (bytes read + bytes written per second), hot or cold in cache."""
    nbytes = positive_int("nbytes", nbytes)
    if nbytes % 4:
        raise ValueError(f"nbytes: must be a multiple of 4 (int32 elements), got {nbytes}")
    device = env.device()
    fits_in_memory("nbytes", 2 * nbytes if hot else max(2 * nbytes, COLD_BYTES), device)
    batch, count = _copy_batch(nbytes, hot, device)
    measured = timing.measure(batch, device=device, flush_l2=False, target_s=0.05)
    seconds = measured.median_s / count
    return {"seconds_per_copy": seconds, "copies": count, "spread": measured.spread,
            "gbytes_per_s": 2 * nbytes / seconds / 1e9}


@experiment("hardware_copy_hierarchy")
def copy_hierarchy(sizes: Sequence[int]) -> list[dict]:
    """Copy bandwidth for each size in bytes, hot (still cached) and cold (evicted): rows per size and mode."""
    sizes = positive_ints("sizes", sizes)
    points = [{"nbytes": s, "hot": hot} for hot in (True, False) for s in sizes]
    rows = run_sweep(measure_copy_level, points)
    for row in rows:
        row["cache"] = "hot" if row.pop("hot") else "cold"
    return rows


def latency_fit(rows: Sequence[dict]) -> dict:
    """Fit t = t0 + bytes / B to the cold copies: the fixed cost t0 (s), the bandwidth B (bytes/s) and B t0.

    ``bytes`` counts read plus written. B t0 is the data that must be in flight to keep the memory
    busy (Little's law); a copy of that size reaches half the bandwidth B.
    """
    cold = [r for r in ok_rows(rows) if r["cache"] == "cold"]
    if len(cold) < 3:
        raise ValueError("rows: the fit needs at least three cold copy sizes")
    moved = np.array([2.0 * r["nbytes"] for r in cold])
    seconds = np.array([r["seconds_per_copy"] for r in cold])
    # least squares on the relative error: each size counts alike, small or large
    design = np.stack([np.ones_like(moved), moved], axis=1) / seconds[:, None]
    (t0, inverse_bandwidth), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    bandwidth = 1 / inverse_bandwidth
    return {"t0_s": float(t0), "bandwidth": float(bandwidth), "bytes_in_flight": float(t0 * bandwidth)}


def measure_transfer(nbytes: int, direction: str, memory: str) -> dict:
    """Bandwidth of one copy of ``nbytes`` between host and GPU: 'h2d' or 'd2h', from 'pinned' or 'pageable' memory."""
    nbytes = positive_int("nbytes", nbytes)
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction: 'h2d' or 'd2h', got {direction!r}")
    if memory not in ("pinned", "pageable"):
        raise ValueError(f"memory: 'pinned' or 'pageable', got {memory!r}")
    device = env.device()
    if device.type != "cuda":
        raise ValueError("device: host-device transfers need a CUDA GPU; this machine has none")
    fits_in_memory("nbytes", nbytes, device)
    elements = nbytes // 4
    host = torch.randint(-2**31, 2**31 - 1, (elements,), dtype=torch.int32, pin_memory=memory == "pinned")
    gpu = torch.full((elements,), -1, dtype=torch.int32, device=device)
    if direction == "h2d":
        source, target = host, gpu
    else:
        gpu.copy_(host)
        target = torch.full_like(host, -1)
        source, target = gpu, target.pin_memory() if memory == "pinned" else target
    target.copy_(source)
    timing.synchronize(device)
    if not torch.equal(target.cpu(), source.cpu()):
        raise AssertionError(f"{direction} copy of {nbytes} bytes: the target differs from the source")
    measured = timing.measure(lambda: target.copy_(source, non_blocking=True), device=device, flush_l2=False,
                              target_s=0.1)
    return {"seconds": measured.median_s, "spread": measured.spread, "gbytes_per_s": nbytes / measured.median_s / 1e9}


@experiment("hardware_host_transfers")
def host_transfers(sizes: Sequence[int]) -> list[dict]:
    """Host-device copy bandwidth for each size: both directions, pinned and pageable host memory."""
    sizes = positive_ints("sizes", sizes)
    points = [{"nbytes": s, "direction": d, "memory": m} for d in ("h2d", "d2h") for m in ("pinned", "pageable")
              for s in sizes]
    return run_sweep(measure_transfer, points)
