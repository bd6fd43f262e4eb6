"""The experiments of the chapter "CUDA threads, blocks and grids".

Every kernel here exists twice, as CUDA C (``gpulab/kernels/NN_name.cu``) and as numba-cuda
(:mod:`gpulab.kernels.numba_kernels`). On a GPU the CUDA C runs; without one the numba twin runs in
the CUDA simulator (:mod:`gpulab.kernels` decides, once). Results are checked against NumPy or
torch on fresh random data, with outputs poisoned before the launch, before anything is timed.
The timing experiments (:func:`divergence`, :func:`launch_configuration`, :func:`saxpy_vs_copy`)
need a GPU: a simulator's time says nothing about one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gpulab.core import env, kernel_mode, occupancy, rates
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.provenance import experiment
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints
from gpulab.kernels import cuda_c

SIMULATOR_MAX_THREADS = 4096  # the simulator runs a Python thread per CUDA thread: keep launches small


def blocks_for(n: int, threads_per_block: int) -> int:
    """The course's ``(N + M - 1) / M``: the fewest blocks of M threads that cover N elements."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (n, threads_per_block)):
        raise ValueError(f"n and threads_per_block: both ints >= 1, got {n!r} and {threads_per_block!r}")
    return (n + threads_per_block - 1) // threads_per_block


def _numba():
    from gpulab.kernels import numba_kernels  # imports numba: only when a numba kernel runs

    return numba_kernels


def _check_launch(blocks: int, threads_per_block: int) -> None:
    if not 1 <= threads_per_block <= 1024:
        raise ValueError(f"threads_per_block: 1 to 1024 (the most a block can have), got {threads_per_block}")
    if not kernel_mode.on_gpu() and blocks * threads_per_block > SIMULATOR_MAX_THREADS:
        raise ValueError(f"blocks x threads_per_block = {blocks * threads_per_block}: the simulator runs at most "
                         f"{SIMULATOR_MAX_THREADS} threads in reasonable time; use fewer")


def hello(blocks: int, threads_per_block: int) -> list[dict]:
    """Launch the guest-book kernel: one row per thread, in the order the threads signed."""
    blocks, threads_per_block = positive_int("blocks", blocks), positive_int("threads_per_block", threads_per_block)
    _check_launch(blocks, threads_per_block)
    device = kernel_mode.device()
    threads = blocks * threads_per_block
    count = torch.zeros(1, dtype=torch.int32, device=device)
    block_of, thread_of = (torch.full((threads,), -1, dtype=torch.int32, device=device) for _ in range(2))
    if kernel_mode.on_gpu():
        cuda_c.launch("01_hello", "hello", blocks, threads_per_block, count, block_of, thread_of)
    else:
        _numba().hello[blocks, threads_per_block](*map(kernel_mode.device_array, (count, block_of, thread_of)))
    kernel_mode.synchronize()
    signed = sorted(zip(block_of.tolist(), thread_of.tolist(), strict=True))
    expected = [(b, t) for b in range(blocks) for t in range(threads_per_block)]
    if count.item() != threads or signed != expected:
        raise AssertionError(f"hello: expected every one of {threads} threads to sign once, got {count.item()} lines")
    return [{"line": line, "block": b, "thread": t}
            for line, (b, t) in enumerate(zip(block_of.tolist(), thread_of.tolist(), strict=True))]


def scalar_add(a: int, b: int) -> int:
    """``a + b`` computed by one GPU thread (the course's first kernel with arguments)."""
    device = kernel_mode.device()
    inputs = [torch.tensor([v], dtype=torch.int32, device=device) for v in (a, b)]
    c = torch.full((1,), -1, dtype=torch.int32, device=device)
    if kernel_mode.on_gpu():
        cuda_c.launch("02_scalar_add", "add", 1, 1, *inputs, c)
    else:
        _numba().add[1, 1](*map(kernel_mode.device_array, (*inputs, c)))
    kernel_mode.synchronize()
    return int(c.item())


def vector_add(n: int, threads_per_block: int = 256) -> dict:
    """Add two random vectors of ``n`` floats with (n + M - 1) / M blocks of M threads; check it; say how."""
    blocks = blocks_for(n, threads_per_block)
    _check_launch(blocks, threads_per_block)
    device = kernel_mode.device()
    fits_in_memory("n", 3 * 4 * n, device)
    a, b = random_tensor((n,), torch.float32, device), random_tensor((n,), torch.float32, device)
    c = poisoned((n,), torch.float32, device)
    if kernel_mode.on_gpu():
        cuda_c.launch("03_vector_add", "vector_add", blocks, threads_per_block, a, b, c, n)
    else:
        _numba().vector_add[blocks, threads_per_block](*map(kernel_mode.device_array, (a, b, c)))
    kernel_mode.synchronize()
    check_close(c, a + b, 0.0, f"vector_add of {n} elements")
    return {"n": n, "threads_per_block": threads_per_block, "blocks": blocks,
            "threads": blocks * threads_per_block, "idle_threads": blocks * threads_per_block - n}


def saxpy(n: int, a: float = 2.0, threads_per_block: int = 256) -> dict:
    """Run SAXPY (the course's kernel, one element per thread) on random data and check it."""
    blocks = blocks_for(n, threads_per_block)
    _check_launch(blocks, threads_per_block)
    device = kernel_mode.device()
    fits_in_memory("n", 3 * 4 * n, device)
    x, y = random_tensor((n,), torch.float32, device), random_tensor((n,), torch.float32, device)
    expected = a * x.double() + y.double()
    if kernel_mode.on_gpu():
        cuda_c.launch("04_saxpy", "saxpy", blocks, threads_per_block, n, float(a), x, y)
    else:
        _numba().saxpy[blocks, threads_per_block](np.float32(a), *map(kernel_mode.device_array, (x, y)))
    kernel_mode.synchronize()
    error = check_close(y, expected, 1e-6, f"saxpy of {n} elements")
    return {"n": n, "a": a, "threads_per_block": threads_per_block, "blocks": blocks, "relative_error": error}


def grid_2d(grid: tuple[int, int] = (3, 2), block: tuple[int, int] = (4, 3)) -> list[dict]:
    """Which block and thread wrote each element of a matrix covered by a ``grid`` of ``block``s (x, y).

    The matrix has ``grid[1] * block[1]`` rows and ``grid[0] * block[0]`` columns; one row per element.
    """
    (gx, gy), (bx, by) = positive_ints("grid", grid), positive_ints("block", block)
    _check_launch(gx * gy, bx * by)
    rows, cols = gy * by, gx * bx
    device = kernel_mode.device()
    owner = torch.full((4, rows, cols), -1, dtype=torch.int32, device=device)
    if kernel_mode.on_gpu():
        cuda_c.launch("07_grid_2d", "who_wrote", (gx, gy), (bx, by), owner, rows, cols)
    else:
        _numba().who_wrote[(gx, gy), (bx, by)](kernel_mode.device_array(owner))
    kernel_mode.synchronize()
    owner = owner.cpu()
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    expected = torch.stack([c // bx, r // by, c % bx, r % by]).to(torch.int32)
    if not torch.equal(owner, expected):
        raise AssertionError("grid_2d: some element was written by the wrong thread, or not at all")
    return [{"row": i, "col": j, "block_x": int(owner[0, i, j]), "block_y": int(owner[1, i, j]),
             "thread_x": int(owner[2, i, j]), "thread_y": int(owner[3, i, j])}
            for i in range(rows) for j in range(cols)]


def _divergence_reference(x: torch.Tensor, iterations: int, group: int, threads_per_block: int) -> torch.Tensor:
    v = x.double().clone()
    first = ((torch.arange(x.numel(), device=x.device) % threads_per_block) // group) % 2 == 0
    for _ in range(iterations):
        v = torch.where(first, v * v * 0.5 + 0.25, torch.sqrt(v + 1.0) - 0.5)
    return v


@experiment("threads_divergence")
def divergence(group_widths: Sequence[int], n: int = 2**22, iterations: int = 200,
               threads_per_block: int = 256) -> list[dict]:
    """Time the two-path kernel (08_divergence.cu) for each width of the groups of threads that share a path.

    Widths below 32 put both paths inside every warp. Each row also gives how many distinct paths
    a warp runs (1 or 2) and the time relative to the widest group.
    """
    groups = positive_ints("group_widths", group_widths)
    kernel_mode.require_gpu("divergence")
    device = kernel_mode.device()
    fits_in_memory("n", 2 * 4 * n, device)
    blocks = blocks_for(n, threads_per_block)
    rows = []
    for group in groups:
        x = torch.rand(n, device=device)  # in [0, 1): both loops stay finite
        expected = _divergence_reference(x, iterations, group, threads_per_block)
        cuda_c.launch("08_divergence", "divergent_paths", blocks, threads_per_block, x, n, iterations, group)
        check_close(x, expected, 1e-5, f"divergent_paths with groups of {group}")

        t = cuda_c.time_launch("08_divergence", "divergent_paths", blocks, threads_per_block, x, n, iterations, group)
        rows.append({"group": group, "paths_per_warp": 2 if group < occupancy.WARP else 1,
                     "seconds": t.median_s, "spread": t.spread})
    fastest = min(r["seconds"] for r in rows)
    for row in rows:
        row["relative_time"] = row["seconds"] / fastest
    return rows


def _driver_occupancy(kernel, threads_per_block: int) -> int:
    import cupy

    return int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads_per_block, 0))


@experiment("threads_launch_configuration")
def launch_configuration(n: int, threads_per_block: Sequence[int], elements_per_thread: Sequence[int],
                         a: float = 2.0) -> list[dict]:
    """SAXPY bandwidth for every (threads per block, elements per thread), with its occupancy.

    Kernel 05_saxpy_per_thread.cu. A row gives the blocks launched, the achieved bandwidth (bytes
    read and written per second: 12 n), the theoretical occupancy from :mod:`gpulab.core.occupancy` and
    the driver's own figure, and what limits it.
    """
    n = positive_int("n", n)
    sizes, counts = positive_ints("threads_per_block", threads_per_block), positive_ints("elements_per_thread",
                                                                                          elements_per_thread)
    kernel_mode.require_gpu("launch_configuration")
    device = kernel_mode.device()
    fits_in_memory("n", 3 * 4 * n, device)
    info = env.describe()
    sm = occupancy.limits(info.compute_capability)
    kernel = cuda_c.function("05_saxpy_per_thread", "saxpy_per_thread")
    registers = kernel.attributes["num_regs"]
    x, y = random_tensor((n,), torch.float32, device), random_tensor((n,), torch.float32, device)
    rows = []
    for size in sizes:
        _check_launch(1, size)
        for per in counts:
            blocks = blocks_for(n, size * per)
            check_y = y.clone()
            cuda_c.launch("05_saxpy_per_thread", "saxpy_per_thread", blocks, size, n, a, x, check_y, per)
            check_close(check_y, a * x.double() + y.double(), 1e-6, f"saxpy, {size} threads x {per} elements")
            t = cuda_c.time_launch("05_saxpy_per_thread", "saxpy_per_thread", blocks, size, n, a, x, y, per)
            theory = occupancy.theoretical(size, registers, 0, sm)
            rows.append({"threads_per_block": size, "elements_per_thread": per, "blocks": blocks,
                         "seconds": t.median_s, "spread": t.spread, "gbytes_per_s": 12 * n / t.median_s / 1e9,
                         "registers": registers, "blocks_per_sm": theory.blocks_per_sm,
                         "occupancy": theory.fraction, "limited_by": theory.limited_by,
                         "driver_blocks_per_sm": _driver_occupancy(kernel, size),
                         "waves": blocks / (theory.blocks_per_sm * info.multiprocessors)})
    return rows


@experiment("threads_saxpy_vs_copy")
def saxpy_vs_copy(n: int = 2**28, a: float = 2.0) -> list[dict]:
    """Bandwidth of three SAXPY kernels and of a device-to-device copy of the same bytes (12 n), at ``n`` floats.

    The copy moves 6 n floats' worth of reads and writes, as SAXPY does (read x and y, write y):
    ``fraction_of_copy`` is each kernel's bandwidth over the copy's.
    """
    n = positive_int("n", n)
    kernel_mode.require_gpu("saxpy_vs_copy")
    device = kernel_mode.device()
    fits_in_memory("n", 6 * 4 * n, device)
    sms = env.describe().multiprocessors
    x, y = random_tensor((n,), torch.float32, device), random_tensor((n,), torch.float32, device)
    variants = [
        ("04_saxpy", "saxpy", "one element per thread, 256 threads per block",
         blocks_for(n, 256), 256, (n, a, x, y)),
        ("05_saxpy_per_thread", "saxpy_per_thread", "8 elements per thread, 256 threads per block",
         blocks_for(n, 256 * 8), 256, (n, a, x, y, 8)),
        ("06_saxpy_float4", "saxpy_float4", "float4 loads, grid-stride loop over 4 blocks per SM",
         4 * sms, 256, (n, a, x, y)),
    ]
    rows = []
    for file, name, how, blocks, size, args in variants:
        check_y = y.clone()
        cuda_c.launch(file, name, blocks, size, *args[:3], check_y, *args[4:])
        check_close(check_y, a * x.double() + y.double(), 1e-6, f"{file} at n = {n}")
        t = cuda_c.time_launch(file, name, blocks, size, *args)
        rows.append({"kernel": file, "how": how, "blocks": blocks, "threads_per_block": size,
                     "seconds": t.median_s, "spread": t.spread, "gbytes_per_s": 12 * n / t.median_s / 1e9})
    del x, y  # the copy needs the memory
    copy = {"kernel": "copy", "how": "torch copy_ (cudaMemcpy device to device) of the same bytes", "blocks": None,
            "threads_per_block": None, **rates.measure_copy(6 * n, device)}
    rows.append(copy)
    for row in rows:
        row["fraction_of_copy"] = row["gbytes_per_s"] / copy["gbytes_per_s"]
    return rows
