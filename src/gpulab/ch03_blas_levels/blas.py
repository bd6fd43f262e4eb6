"""The BLAS chapter's experiments: levels 1, 2 and 3 measured, and the two ceilings of the roofline.

Each experiment returns rows (one dict per measurement) and checks its result against a float64
reference on fresh random data before timing anything.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from gpulab.core import env, flops, timing
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.rates import CHECK_ROWS, blas_sweep
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, supported_dtype


@experiment("blas_levels")
def levels_sweep(vector_sizes: Sequence[int], matrix_sizes: Sequence[int], dtypes: Sequence[str]) -> list[dict]:
    """Levels 1 (axpy, dot) over ``vector_sizes`` and levels 2 and 3 (gemv, gemm) over ``matrix_sizes``."""
    return blas_sweep(["axpy", "dot"], vector_sizes, dtypes) + blas_sweep(["gemv", "gemm"], matrix_sizes, dtypes)


def measure_blocked_gemm(n: int, block: int, dtype: str = "float32", device: torch.device | None = None) -> dict:
    """C <- A B as n/block rank-``block`` updates C += A[:, k:k+b] B[k:k+b, :]: each update streams all of C.

    This is the blocking argument made measurable: per update, 2 n^2 b FLOP against 2 n^2 words of
    C traffic, so the intensity, and with it the attainable rate, grows with the block size.
    """
    device = device or env.device()
    n, block, label = positive_int("n", n), positive_int("block", block), supported_dtype("dtype", dtype, device)
    cost = flops.blocked_gemm(n, block, label)  # also checks that block divides n
    fits_in_memory("n", 3 * n * n * (flops.bytes_per_element(label) + 8), device)
    with matmul_mode(label) as torch_dtype:
        def rank_updates(A, B, C):
            C.zero_()
            for k in range(0, n, block):
                C.addmm_(A[:, k:k + block], B[k:k + block, :])
            return C

        A, B = random_tensor((n, n), torch_dtype, device), random_tensor((n, n), torch_dtype, device)
        C = poisoned((n, n), torch_dtype, device)
        rows = torch.randperm(n, device=device)[:CHECK_ROWS]
        error = check_close(rank_updates(A, B, C)[rows], A[rows].double() @ B.double(),
                            MATMUL_TOLERANCE[label], f"blocked gemm, block {block}")
        measured = timing.measure(lambda: rank_updates(A, B, C), device=device)
    return {"n": n, "block": block, "dtype": label, "seconds": measured.median_s, "spread": measured.spread,
            "flops": cost.flops, "bytes": cost.bytes, "intensity": cost.intensity,
            "gflops": cost.flops / measured.median_s / 1e9, "relative_error": error}


@experiment("blas_blocking")
def blocked_gemm_sweep(n: int, blocks: Sequence[int], dtype: str = "float32") -> list[dict]:
    blocks = positive_ints("blocks", blocks)
    return run_sweep(measure_blocked_gemm, [{"n": n, "block": b, "dtype": dtype} for b in blocks])


def _unsynchronized_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    """The timing trap: read the host clock right after the call, without waiting for the device."""
    samples = []
    for _ in range(repeats):
        timing.synchronize(device)  # start from an idle device, as a first measurement would
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    timing.synchronize(device)
    return statistics.median(samples)


@experiment("lab_gflops_vs_n")
def timing_trap(sizes: Sequence[int], numpy_sizes: Sequence[int], dtype: str = "float32") -> list[dict]:
    """C = A B timed the wrong way (no synchronisation) and the right way on this device, plus NumPy on the CPU.

    Rows have 'n', 'engine' ('torch on cuda', 'torch on cpu' or 'numpy on cpu'), 'seconds' and
    'gflops' from the honest timer, and for torch rows 'naive_seconds' and 'naive_gflops'.
    """
    device = env.device()
    label, rows = supported_dtype("dtype", dtype, device), []
    with matmul_mode(label) as torch_dtype:
        for n in positive_ints("sizes", sizes):
            fits_in_memory("sizes", 3 * n * n * (flops.bytes_per_element(label) + 8), device)
            A, B = random_tensor((n, n), torch_dtype, device), random_tensor((n, n), torch_dtype, device)
            check = torch.randperm(n, device=device)[:CHECK_ROWS]
            error = check_close((A @ B)[check], A[check].double() @ B.double(), MATMUL_TOLERANCE[label], "matmul")
            work = flops.gemm(n, n, n, label).flops
            naive = _unsynchronized_seconds(lambda A=A, B=B: A @ B, device)
            honest = timing.measure(lambda A=A, B=B: A @ B, device=device).median_s
            rows.append({"n": n, "engine": f"torch on {device.type}", "naive_seconds": naive,
                         "naive_gflops": work / naive / 1e9, "seconds": honest, "gflops": work / honest / 1e9,
                         "relative_error": error})
            del A, B
    generator = np.random.default_rng(0)
    for n in positive_ints("numpy_sizes", numpy_sizes):
        A, B = (generator.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        reference = A[:CHECK_ROWS].astype(np.float64) @ B.astype(np.float64)
        check_close(torch.from_numpy(A[:CHECK_ROWS] @ B), torch.from_numpy(reference), 1e-4, "numpy matmul")
        honest = timing.measure(lambda A=A, B=B: A @ B, device=torch.device("cpu"), repeats=3).median_s
        rows.append({"n": n, "engine": "numpy on cpu", "seconds": honest,
                     "gflops": flops.gemm(n, n, n, "float32").flops / honest / 1e9})
    return rows
