"""Chapter 01's sizes in every setting, and the work they make: the peaks held against matmuls and a copy, the
copy hierarchy, the host transfers (:class:`gpulab.core.budget.Chapter`).

It also says, as :class:`gpulab.core.budget.Work`, what the core's two measurements this chapter is the first to
use cost: :func:`blas` (:func:`gpulab.core.rates.measure_blas`, which chapter 03 sweeps) and :func:`copy`
(:func:`gpulab.core.rates.measure_copy`).
"""

from __future__ import annotations

from dataclasses import replace

from gpulab.ch01_cpus_to_gpus.hardware import BATCH_BYTES, COLD_BYTES, MAX_COPIES
from gpulab.core import budget, flops
from gpulab.core.rates import CHECK_ROWS

FORMATS = ["float64", "float32", "tf32", "float16", "bfloat16"]
# rates.measure_blas on the host, per call: its operands made twice (for the check, then fresh for the timing),
# the check's bookkeeping, Python: about 7 s of the H200's 55 s of blas_levels (140 measurements)
BLAS_SETUP_SECONDS = 0.05
CLOCK_SAMPLER_SECONDS = 0.3  # clocks.sampled starting and stopping nvidia-smi around each sustained run
# hardware.measure_transfer's host side, per byte moved: a random fill of the host buffer, pinning it, the
# check's copies and comparison (about 14 s of the H200's 25 s of hardware_host_transfers)
HOST_SECONDS_PER_BYTE = 2.5e-9
# hardware.measure_copy_level per size: buffers filled and checked, a CUDA graph of up to 1,024 copies captured
GRAPH_SETUP_SECONDS = 0.02

FULL = dict(matmul_n=8192, dtypes=FORMATS, sustain_s=2.0, copy_bytes=2**30,
            hierarchy_sizes=[2**k for k in range(16, 32)], transfer_sizes=[2**k for k in range(12, 31, 2)])
CLASSES = [
    # matmuls of 2048, still compute-bound in every format (a T4's float64 takes a tenth of a second each); one
    # second of load still shows the clock a busy GPU runs at; copies to 256 MiB pass every L2 (60 MB at most) and
    # reach the host link's plateau
    dict(matmul_n=2048, dtypes=FORMATS, sustain_s=1.0, copy_bytes=2**28,
         hierarchy_sizes=[2**k for k in range(16, 29)], transfer_sizes=[2**k for k in range(12, 29, 2)]),
    # matmuls of 4096 (a T4's float64 takes about a second each), the full copies and the recordings' 2 s of load
    dict(matmul_n=4096, dtypes=FORMATS, sustain_s=2.0, copy_bytes=2**30,
         hierarchy_sizes=[2**k for k in range(16, 31)], transfer_sizes=[2**k for k in range(12, 31, 2)]),
    FULL,  # the recordings' sizes, for a GPU fast enough
]
CPU = dict(matmul_n=1024, dtypes=["float64", "float32", "bfloat16"], sustain_s=0.5, copy_bytes=2**26,
           hierarchy_sizes=[2**k for k in range(16, 27)], transfer_sizes=[2**k for k in range(12, 31, 2)])
SMOKE = dict(matmul_n=128, dtypes=["float64", "float32"], sustain_s=0.05, copy_bytes=2**20,
             hierarchy_sizes=[2**16, 2**18, 2**20], transfer_sizes=[2**12, 2**16])

_ELEMENTS = {"axpy": lambda n: 2 * n, "dot": lambda n: 2 * n, "gemv": lambda n: n * n + 2 * n,
             "gemm": lambda n: 3 * n * n}  # rates.measure_blas's operands


def blas_call(op: str, n: int, dtype: str, **work) -> budget.Work:
    """One BLAS call of :func:`gpulab.core.rates.measure_blas` (``work`` as for :class:`gpulab.core.budget.Work`).
    A format the GPU lacks is left out, as the notebooks leave it out
    (:func:`gpulab.core.validation.supported_dtypes`)."""
    cost = flops.blas(op, n, dtype)
    memory = _ELEMENTS[op](n) * (flops.bytes_per_element(dtype) + 8)  # the operands and their float64 copies
    return budget.Work(f"{op} {n} {dtype}", flops=cost.flops, bytes=cost.bytes, precision=dtype,
                       memory_bytes=memory, missing="skip", **work)


def blas(op: str, n: int, dtype: str) -> list[budget.Work]:
    """What :func:`gpulab.core.rates.measure_blas` does for ``op`` of size ``n``: its check (the operands in
    float64, the call once, the float64 reference, the comparison on the host; a gemm is checked on CHECK_ROWS
    rows), then one measurement, with its host time."""
    elements, size = _ELEMENTS[op](n), flops.bytes_per_element(dtype)
    cost = flops.blas(op, n, dtype)
    reference_flops = cost.flops * CHECK_ROWS / n if op == "gemm" else cost.flops
    compared = {"axpy": n, "dot": 1, "gemv": n, "gemm": CHECK_ROWS * n}[op]
    return [
        budget.once(f"{op} {n}: operands in float64", bytes=elements * (size + 8), requires=dtype),
        replace(blas_call(op, n, dtype), label=f"{op} {n} {dtype}, checked", warmup=0, repeats=1, flush_l2=False),
        budget.once(f"float64 reference of {op} {n}", flops=reference_flops, bytes=elements * 8,
                    precision="float64", requires=dtype, checked_elements=compared),
        blas_call(op, n, dtype, extra_seconds=BLAS_SETUP_SECONDS),
    ]


def copy(nbytes: int) -> list[budget.Work]:
    """What :func:`gpulab.core.rates.measure_copy` does: a copy checked once, then one measurement of it."""
    return [budget.once(f"copy of {nbytes} bytes, checked", bytes=2 * nbytes, memory_bytes=2 * nbytes),
            budget.Work(f"copy of {nbytes} bytes", bytes=2 * nbytes, memory_bytes=2 * nbytes)]


def _peaks(n: int, dtypes: list[str], sustain: float, copy_bytes: int) -> list[budget.Work]:
    """hardware_peaks: each format's matmul checked and timed (rates.measure_blas); then timed three times (for the
    length of one) and run back to back for sustain_s (at least three calls) while nvidia-smi samples the clock; a
    copy checked, then timed (rates.measure_copy)."""
    work = []
    for dtype in dtypes:
        loop = flops.gemm(n, n, n, dtype).flops * 3  # at least three calls, else as many as fill sustain_s
        work += [*blas("gemm", n, dtype),
                 blas_call("gemm", n, dtype, repeats=3, extra_seconds=CLOCK_SAMPLER_SECONDS),
                 budget.once(f"gemm {n} {dtype} back to back", flops=loop, precision=dtype, missing="skip",
                             least_seconds=sustain)]
    return work + copy(copy_bytes)


def work(sizes: dict) -> list[budget.Work]:
    copies = [(s, max(1, min(MAX_COPIES, BATCH_BYTES // (2 * s)))) for s in sizes["hierarchy_sizes"]]
    return [
        *_peaks(sizes["matmul_n"], sizes["dtypes"], sizes["sustain_s"], sizes["copy_bytes"]),
        # hardware_copy_hierarchy: a batch of copies (a CUDA graph) per size, hot then cold, for about 0.05 s each
        *(budget.Work(f"{count} {cache} copies of {s} bytes", bytes=2 * s * count,
                      memory_bytes=max(2 * s, COLD_BYTES), target_seconds=0.05, flush_l2=False,
                      extra_seconds=GRAPH_SETUP_SECONDS)
          for cache in ("hot", "cold") for s, count in copies),
        # hardware_host_transfers: each size, both directions, pinned and pageable, for about 0.1 s each
        *(budget.Work(f"{direction} {memory} copy of {s} bytes", bytes=s, link=memory, memory_bytes=s,
                      target_seconds=0.1, flush_l2=False, extra_seconds=HOST_SECONDS_PER_BYTE * s)
          for direction in ("h2d", "d2h") for memory in ("pinned", "pageable") for s in sizes["transfer_sizes"]),
    ]


CHAPTER = budget.Chapter(name="01 From CPUs to GPUs", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=lambda sizes: budget.NOTEBOOK_SECONDS)
