"""Chapter 07's sizes in every setting, and what they cost: the one place the notebook's sizes are set.

Three experiments need a GPU: warp divergence (a fixed 2**22 threads, seven group widths), SAXPY's bandwidth for 30
launch configurations, and three SAXPY kernels against a copy. Every kernel launch is checked before it is timed,
and the check, on the host in float64, takes far longer than the timing: at the recorded 2**28 elements about
3.5 s a configuration, 105 of the 122 s that the launch-configuration sweep took on the H200.
"""

from __future__ import annotations

from gpulab.ch01_cpus_to_gpus.plan import copy
from gpulab.ch07_cuda_threads_blocks import threads
from gpulab.core import budget, flops

# threads.divergence's defaults: the notebook does not set them
DIVERGENCE_N, DIVERGENCE_ITERATIONS, DIVERGENCE_THREADS_PER_BLOCK = 2**22, 200, 256

# The recorded sizes, from the notebook's parameters cell: the course's vector addition (50,000 elements, 256 threads
# a block), group widths around the warp's 32, and SAXPY at 2**28 floats (1 GiB a vector) for the launch
# configurations and the contest with a copy.
FULL = dict(n_vector=50_000, threads_per_block=256, divergence_groups=[1, 2, 4, 8, 16, 32, 64], launch_n=2**28,
            launch_threads=[32, 64, 128, 256, 512, 1024], launch_elements=[1, 2, 4, 8, 16])
SMOKE = dict(FULL, n_vector=1_000, launch_n=2**20)  # the simulator runs one Python thread per CUDA thread
CPU = SMOKE  # without a GPU the kernels run in numba's simulator, at the smoke test's sizes
CLASSES = [
    # Every group width and all 30 launch configurations stay: the figures keep their rows and columns. Only SAXPY's
    # length shrinks, and with it each check on the host. 2**25 floats are 128 MiB a vector, twice the largest L2 of
    # the book (the H200's 60 MB) per vector; one element per thread still makes 131,072 blocks of 256 threads.
    dict(FULL, launch_n=2**25),
    # 2**26: 256 MiB a vector.
    dict(FULL, launch_n=2**26),
    # 2**27: 512 MiB a vector, half the recorded length.
    dict(FULL, launch_n=2**27),
]

DIVERGENCE_FLOP = 8  # per thread and iteration of one path: a multiply-add and a product, or a square root (slow)
# The float64 reference of the divergence check: eight elementwise passes an iteration, each reading and writing 8 B
DIVERGENCE_REFERENCE_BYTES = 8 * 2 * 8
COMPILED = 8  # CUDA C files CuPy compiles and loads: 01-04, 07 and 08 before the divergence, then 05 and 06


def _checked_saxpy(n: int, measurements: int = 1) -> list[budget.Work]:
    """What the experiments do before a SAXPY of ``n`` floats is timed, ``measurements`` times: a copy of y, the
    checked launch, its float64 reference on the GPU (x and y read, widened, combined), the comparison on the host."""
    saxpy = flops.axpy(n)
    return [budget.once("y.clone()", bytes=8 * n, measurements=measurements),
            budget.once("checked launch", bytes=saxpy.bytes, measurements=measurements),
            budget.once("a * x.double() + y.double()", bytes=16 * n + 16 * n + 24 * n, measurements=measurements,
                        checked_elements=n)]


def launch(label: str, **work) -> budget.Work:
    """One measurement of :func:`gpulab.kernels.cuda_c.time_launch`: the timer's defaults but no L2 flush (the
    kernels it times stream far more data than L2 holds, or compute from registers); ``work`` as for
    :class:`gpulab.core.budget.Work`."""
    return budget.Work(label, flush_l2=False, **work)


def work(sizes: budget.Sizes) -> list[budget.Work]:
    """Every measurement of ``threads_divergence``, ``threads_launch_configuration`` and ``threads_saxpy_vs_copy``."""
    n, items = sizes["launch_n"], []
    for group in sizes["divergence_groups"]:
        paths = 2 if group < 32 else 1
        # the float64 reference, a Python loop of eight elementwise operations an iteration; the checked launch,
        # compared on the host; then the launch timed
        items += [budget.once(f"divergence's float64 reference, groups of {group}",
                              bytes=DIVERGENCE_ITERATIONS * DIVERGENCE_N * DIVERGENCE_REFERENCE_BYTES,
                              least_seconds=DIVERGENCE_ITERATIONS * 8 * budget.HOST_CALL_SECONDS,
                              checked_elements=DIVERGENCE_N),
                  launch(f"divergence, groups of {group}", warmup=1 + budget.WARMUP,
                         flops=DIVERGENCE_N * DIVERGENCE_ITERATIONS * DIVERGENCE_FLOP * paths,
                         memory_bytes=(2 * 4 + 3 * 8) * DIVERGENCE_N)]
    saxpy = flops.axpy(n)
    # x, y, the checked y, and the float64 reference: 36 bytes an element at the check
    common = dict(flops=saxpy.flops, bytes=saxpy.bytes, memory_bytes=36 * n)
    configurations = [(size, per) for size in sizes["launch_threads"] for per in sizes["launch_elements"]]
    items += _checked_saxpy(n, len(configurations))
    items += [launch(f"SAXPY, {size} threads x {per} elements, {threads.blocks_for(n, size * per):,} blocks", **common)
              for size, per in configurations]
    contest = ("04_saxpy", "05 x 8", "06_saxpy_float4")
    items += _checked_saxpy(n, len(contest))
    items += [launch(f"SAXPY contest: {kernel}", **common) for kernel in contest]
    items += copy(6 * n)  # rates.measure_copy of SAXPY's 12 n bytes, read and written
    return items


def fixed_seconds(sizes: budget.Sizes) -> float:
    """Start and imports, the NVRTC compiles, the small launches of the first sections (the guest book, the course's
    vector addition and SAXPY of ``n_vector`` elements, the 2D grid), and the explorer."""
    return budget.NOTEBOOK_SECONDS + COMPILED * budget.NVRTC_SECONDS + 1.0


CHAPTER = budget.Chapter(name="07 CUDA threads, blocks and grids", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE,
                         work=work, fixed_seconds=fixed_seconds)
