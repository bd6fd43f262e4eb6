"""The sizes of chapter 09 in every setting, and the work they make (:class:`gpulab.core.budget.Chapter`).

Every timed call of the chapter is a float32 GEMM: the nine kernels of the worklog and cuBLAS at N^3, nine variants
of step 9 at N^3, and step 9 and cuBLAS at every point of the two quantization sweeps. Each is checked against
float64 arithmetic first (on the GPU, then compared on the host), and on a T4, whose float64 units run at 1/32 of
its float32 rate, those references cost more than the timing: the class sizes shrink K and the sweeps.

:func:`checked_gemm` and :func:`worklog_work` say what ``gemm``'s checked and timed GEMMs cost; chapter 10 times
the best SGEMM beside its WMMA kernels through them.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpulab.core import budget, flops
from gpulab.core.budget import Work

FULL = {
    "n": 4096,  # the worklog's size: M = N = K, float32
    # Variants of step 9 (24_sgemm_prefetched.cu) for the tuning sweep: block tile BM x BN, depth BK,
    # warp tile WM x WN, and the resident blocks per SM that __launch_bounds__ asks for.
    "tuning": [{}, {"MIN_BLOCKS": 1}, {"BK": 16}, {"BK": 16, "MIN_BLOCKS": 1}, {"WM": 32, "WN": 64}, {"WN": 64},
               {"BN": 64, "MIN_BLOCKS": 4}, {"BN": 256, "WN": 64, "MIN_BLOCKS": 1},
               {"BM": 256, "WM": 128, "MIN_BLOCKS": 1}],
    "tile_sweep": (3584, 4608, 16),  # tile quantization: N from, to, step
    "tile_mk": 4096,  # ... with M = K = this
    "wave_sweep": (8, 72),  # wave quantization: N = 128 c for c from, to
    "wave_mk": (2048, 4096),  # ... with M, K
    "simulator_shape": (32, 48, 64),  # M, N, K of the numba tiled kernel in the simulator: 6 blocks of 16 x 16
}
# Without a GPU the experiments are not run (the page draws the recordings) and the simulator runs its shape as is.
CPU = FULL
SMOKE = {**FULL, "n": 256, "tuning": [{}, {"MIN_BLOCKS": 1}], "simulator_shape": (16, 16, 32),
         "tile_sweep": (4096, 4240, 48), "wave_sweep": (16, 18)}
CLASSES = [
    # Every step of the worklog and every tuning variant at 2048^3 (16 x 16 tiles of 128: three waves of a T4's 80
    # slots). The wave sweep keeps M = 2048 and every column of tiles from 8 to 40 (the slot model's drops every
    # 5 columns on a T4, every 16.5 on an H100) with K = 1024; the tile sweep keeps N in steps of 16 over two
    # columns of tiles either side of 2048, with M = K = 2048.
    {**FULL, "n": 2048, "tile_sweep": (1792, 2304, 16), "tile_mk": 2048, "wave_sweep": (8, 40),
     "wave_mk": (2048, 1024)},
    # The worklog at 4096^3, the book's size; the sweeps as above with K = 2048.
    {**FULL, "tile_sweep": (1792, 2304, 16), "tile_mk": 2048, "wave_sweep": (8, 40), "wave_mk": (2048, 2048)},
    FULL,  # the recordings' sizes, where a GPU runs them in time
]

# The share of the FP32 peak each step of the worklog reached at 4096^3, rounded from the H200 recording
# (gemm_worklog): the naive kernel's uncoalesced loads hold it under 1%, step 9 reaches about 70%.
STEP_SHARES = (0.0075, 0.09, 0.13, 0.25, 0.4, 0.5, 0.54, 0.6, 0.7)
STEP9_SHARE = STEP_SHARES[-1]  # the tuning variants reached 0.53 to 0.7 of it on the H200
CHECK_SIZE = (1000, 1204, 772)  # gemm.worklog's check_size (N and K rounded down to multiples of 4 for steps 6-9)
NUMBA_SECONDS = 1.5  # numba-cuda's JIT of one kernel signature (the simulator's two kernels, on a GPU): a rough figure


def _operands(m: int, n: int, k: int) -> float:
    """GPU memory of a checked GEMM: the float32 operands and result, and their float64 copies for the reference."""
    return (4 + 8) * (m * k + k * n + m * n)


def _check(label: str, m: int, n: int, k: int, share: float, measurements: int = 1) -> list[Work]:
    """``gemm.check`` (or cuBLAS's check in ``gemm._cublas``): one float32 call at M x N x K, its float64 reference
    on the GPU, the two compared on the host."""
    cost = flops.gemm(m, n, k)
    return [budget.once(f"{label}: checked call", flops=cost.flops, bytes=cost.bytes, share=share,
                        measurements=measurements),
            budget.once(f"{label}: float64 reference", flops=cost.flops, precision="float64",
                        checked_elements=m * n, measurements=measurements, memory_bytes=_operands(m, n, k))]


def checked_gemm(label: str, m: int, n: int, k: int, share: float = budget.COMPUTE_EFFICIENCY) -> list[Work]:
    """A float32 GEMM of ``gemm`` (a kernel of the worklog at ``share`` of the peak, or cuBLAS with TF32 off): checked
    against float64 at its size, then one measurement by ``gemm._measure`` (the L2 not flushed)."""
    cost = flops.gemm(m, n, k)
    return [*_check(label, m, n, k, share),
            Work(label, flops=cost.flops, bytes=cost.bytes, share=share, flush_l2=False,
                 memory_bytes=_operands(m, n, k))]


def worklog_work(n: int, steps: Iterable[int] = range(1, len(STEP_SHARES) + 1)) -> list[Work]:
    """``gemm.worklog(n, steps)``: cuBLAS checked and timed at n^3, then each step checked at :data:`CHECK_SIZE` (its
    edges), checked at n^3 and timed (:func:`checked_gemm`)."""
    found = checked_gemm("worklog: cuBLAS", n, n, n)
    for number in steps:
        share = STEP_SHARES[number - 1]
        found += [*_check(f"worklog: step {number}, edges", *CHECK_SIZE, share),
                  *checked_gemm(f"worklog: step {number}", n, n, n, share)]
    return found


def sweep_points(sizes: dict) -> dict[str, list[tuple[int, int, int]]]:
    """The (M, N, K) of every point of the two quantization sweeps."""
    start, stop, step = sizes["tile_sweep"]
    first, last = sizes["wave_sweep"]
    wave_m, wave_k = sizes["wave_mk"]
    return {"tile": [(sizes["tile_mk"], n, sizes["tile_mk"]) for n in range(start, stop + 1, step)],
            "wave": [(wave_m, 128 * c, wave_k) for c in range(first, last + 1)]}


def work(sizes: dict) -> list[Work]:
    n = sizes["n"]
    found = worklog_work(n)
    for variant in sizes["tuning"]:
        found += checked_gemm(f"tuning: {variant or 'defaults'}", n, n, n, STEP9_SHARE)
    for sweep, points in sweep_points(sizes).items():  # gemm.size_sweep: step 9, then cuBLAS, at each point
        for m, columns, k in points:
            found += checked_gemm(f"{sweep} sweep: step 9", m, columns, k, STEP9_SHARE)
            found += checked_gemm(f"{sweep} sweep: cuBLAS", m, columns, k)
    return found


def fixed_seconds(sizes: dict) -> float:
    """The notebook; the simulator's two numba kernels; NVRTC for each kernel file and set of defines (for the
    compiler's report, then for CuPy to launch it): the worklog's nine, and each tuning variant but the defaults,
    which are step 9 itself."""
    kernels = len(STEP_SHARES) + sum(1 for variant in sizes["tuning"] if variant)
    return budget.NOTEBOOK_SECONDS + 2 * NUMBA_SECONDS + kernels * budget.NVRTC_SECONDS


CHAPTER = budget.Chapter(name="09 GEMM on the GPU", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=fixed_seconds)
