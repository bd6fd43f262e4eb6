"""Chapter 08's sizes in every setting, and what they cost: the one place the notebook's sizes are set.

Four experiments time kernels (strided reads, the transposes, the copy with a set number of bytes in flight) or
run them (the stencil, with and without its barrier); each launch is checked on the host first, and as in chapter
07 the checks take longer than the timing: by this model, the four checks of the 16384 x 16384 transpose took 14 of
its 15 s on the H200. The strided read keeps ``COALESCING_N`` times the largest stride of floats on the GPU: 16 GiB
at the recorded sizes, more than a T4 has.
"""

from __future__ import annotations

from gpulab.ch01_cpus_to_gpus.plan import copy
from gpulab.ch07_cuda_threads_blocks.plan import launch
from gpulab.ch08_memory_hierarchy import memory
from gpulab.core import budget, occupancy

# The recorded sizes, from the notebook's parameters cell: strided reads of 2**26 outputs, the stencil over 2**24
# outputs five times with and without its barrier, a 16384 x 16384 float transpose (1 GiB), and a copy of 2**28
# bytes (4x the largest L2 of the book) with grids of an eighth of a block to four blocks per SM, 1 to 8 loads each.
FULL = dict(coalescing_n=2**26, strides=[1, 2, 4, 8, 16, 32, 64], stencil_n=2**24, stencil_trials=5,
            transpose_n=16384, in_flight_bytes=2**28, blocks_per_sm=[0.125, 0.25, 0.5, 1, 2, 4], loads=[1, 2, 4, 8])
CPU = dict(FULL, stencil_n=1000, stencil_trials=3)  # the stencil runs in numba's simulator: 4 blocks of 256 threads
SMOKE = dict(coalescing_n=2**16, strides=[1, 2, 8, 32], stencil_n=300, stencil_trials=1, transpose_n=256,
             in_flight_bytes=2**22, blocks_per_sm=[0.25, 1], loads=[1, 4])
CLASSES = [
    # Every stride, grid and load count stays, so the figures keep their points; the data shrinks, and stays larger
    # than every L2 of the book (the H200's 60 MB, the L4's 48 MB): 2**24 strided outputs read and write 128 MiB at
    # stride 1 and keep 4 GiB of input on the GPU (a T4 has 16 GB); an 8192 x 8192 transpose moves 512 MiB; the
    # in-flight copy moves 2 x 128 MiB.
    dict(FULL, coalescing_n=2**24, transpose_n=8192, in_flight_bytes=2**27),
    # 2**25 strided outputs (8 GiB of input), the recorded transpose and in-flight copy.
    dict(FULL, coalescing_n=2**25, in_flight_bytes=2**28),
]

COMPILED = 7  # CUDA C files CuPy compiles and loads: 09 to 15 (their compile reports, NVRTC alone, take milliseconds)
LATENCY_S = 600e-9  # a load's latency under light traffic, Little's law's L (the H200 recorded 500 to 700 ns)
IN_FLIGHT_THREADS = 256  # memory.bytes_in_flight's default
T4_SMS, T4_BLOCKS_PER_SM = 40, 4  # a T4's SMs, and its resident blocks of 256 threads (1,024 threads an SM)


def _checked(label: str, nbytes: float, elements: float) -> budget.Work:
    """The launch that is checked before a kernel is timed: it moves ``nbytes``, and ``elements`` of its output are
    compared on the host."""
    return budget.once(f"{label}: checked launch", bytes=nbytes, checked_elements=elements)


def _in_flight_work(nbytes: int, blocks_per_sm: float, loads: int) -> list[budget.Work]:
    """One grid of the in-flight copy, checked then timed: it reads ``nbytes`` no faster than Little's law allows,
    (resident threads x loads x 16 B) / latency, and writes them. Counted with a T4's SMs, the fewest of the table:
    the smallest grids then take longest (on larger GPUs, with more SMs, their calls are shorter, and the timer's
    0.2 s the same)."""
    resident = min(blocks_per_sm, T4_BLOCKS_PER_SM) * T4_SMS * IN_FLIGHT_THREADS
    in_flight = resident * loads * 16
    label = f"copy in flight, {blocks_per_sm:g} blocks an SM, {loads} loads"
    return [_checked(label, 2 * nbytes, nbytes // 4),
            launch(label, bytes=2 * nbytes, memory_bytes=2 * nbytes, least_seconds=nbytes / (in_flight / LATENCY_S))]


def work(sizes: budget.Sizes) -> list[budget.Work]:
    """Every measurement of ``memory_coalescing``, ``memory_stencil``, ``memory_transpose`` and
    ``memory_bytes_in_flight`` at ``sizes``."""
    n, strides, items = sizes["coalescing_n"], sizes["strides"], []
    for stride in strides:  # per output: 4 bytes written, and the sectors a warp's read touches, shared by 32
        moved = n * (4 + memory.sectors_per_warp(stride) * memory.SECTOR_BYTES / occupancy.WARP)
        label = f"strided read, stride {stride}"
        items += [_checked(label, moved, n), launch(label, bytes=moved, memory_bytes=4 * n * (max(strides) + 1))]
    stencil = sizes["stencil_n"]  # untimed: a launch, a float64 reference on the GPU, a host check with the barrier
    items.append(budget.Work(f"stencil, {sizes['stencil_trials']} trials with and without the barrier",
                             measurements=0, memory_bytes=(2 * 4 + 3 * 8) * stencil))
    matrix = sizes["transpose_n"] ** 2
    for _file, _kernel, label in memory.TRANSPOSES:  # read and write the matrix; the check on the host
        items += [_checked(label, 8 * matrix, matrix), launch(label, bytes=8 * matrix, memory_bytes=8 * matrix)]
    items += copy(4 * matrix)  # rates.measure_copy of the matrix
    for per_sm in sizes["blocks_per_sm"]:
        for loads in sizes["loads"]:
            items += _in_flight_work(sizes["in_flight_bytes"], per_sm, loads)
    return items


def fixed_seconds(sizes: budget.Sizes) -> float:
    """Start and imports, the NVRTC compiles, the stencil's host checks (those with the barrier), and the explorer."""
    stencil_checks = sizes["stencil_trials"] * sizes["stencil_n"] * budget.HOST_CHECK_SECONDS_PER_ELEMENT
    return budget.NOTEBOOK_SECONDS + COMPILED * budget.NVRTC_SECONDS + stencil_checks + 1.0


CHAPTER = budget.Chapter(name="08 The GPU memory hierarchy", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE,
                         work=work, fixed_seconds=fixed_seconds)
