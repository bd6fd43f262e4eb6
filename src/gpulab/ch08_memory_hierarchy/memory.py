"""The experiments of the chapter "The GPU memory hierarchy".

- :func:`memory_sizes`: how much of each memory space this GPU has, from the driver;
- :func:`sectors_per_warp` and :func:`coalescing`: what a warp's access pattern costs, predicted from
  32-byte sectors and measured with a strided read (09_strided_read.cu);
- :func:`stencil`: the shared-memory 1D stencil (10_stencil_1d.cu) with and without its barrier;
- :func:`bank_conflict_degree` and :func:`transpose`: shared-memory banks, predicted and measured with
  naive, tiled and padded transposes (11-14);
- :func:`bytes_in_flight`: bandwidth against the data in flight, the latency that Little's law
  reads from it (15_copy_in_flight.cu).

The stencil runs everywhere (CUDA C on a GPU, numba in the simulator); the timed experiments need a GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from gpulab.core import env, kernel_mode, occupancy, rates, specs
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.provenance import experiment
from gpulab.core.sweep import ok_rows
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints
from gpulab.kernels import cuda_c

SECTOR_BYTES = 32  # the unit in which L1/L2 and DRAM move data
BANKS = 32  # shared memory: 32 banks, 4 bytes wide
CONSTANT_BYTES = 64 * 1024  # the constant memory a kernel can use, the same on every GPU of the book
STENCIL_RADIUS, STENCIL_BLOCK = 3, 256  # as in 10_stencil_1d.cu
TILE, BLOCK_ROWS = 32, 8  # as in 11-14


@experiment("memory_sizes")
def memory_sizes() -> list[dict]:
    """The memory spaces of this GPU with their sizes, as its driver reports them (and the spec table's L1)."""
    kernel_mode.require_gpu("memory_sizes")
    props = torch.cuda.get_device_properties(env.device())
    sms = props.multi_processor_count
    row = specs.present()
    l1_shared = row.l1_shared_kb * 1024 if row else None
    return [
        {"space": "registers", "scope": "one thread", "per_sm_bytes": props.regs_per_multiprocessor * 4,
         "total_bytes": props.regs_per_multiprocessor * 4 * sms},
        {"space": "shared memory", "scope": "one block", "per_sm_bytes": props.shared_memory_per_multiprocessor,
         "total_bytes": props.shared_memory_per_multiprocessor * sms},
        {"space": "L1 cache + shared memory", "scope": "one SM", "per_sm_bytes": l1_shared,
         "total_bytes": l1_shared * sms if l1_shared else None},
        {"space": "L2 cache", "scope": "the whole GPU", "per_sm_bytes": None, "total_bytes": props.L2_cache_size},
        {"space": "constant memory", "scope": "the whole GPU, read-only", "per_sm_bytes": None,
         "total_bytes": CONSTANT_BYTES},
        {"space": "global memory", "scope": "the whole GPU, and the host by copies", "per_sm_bytes": None,
         "total_bytes": props.total_memory},
    ]


def sectors_per_warp(stride: int, element_bytes: int = 4, warp: int = occupancy.WARP) -> int:
    """Distinct 32-byte sectors a warp touches when thread t reads element ``t * stride``."""
    stride, element_bytes = positive_int("stride", stride), positive_int("element_bytes", element_bytes)
    return len({t * stride * element_bytes // SECTOR_BYTES for t in range(warp)})


@experiment("memory_coalescing")
def coalescing(n: int, strides: Sequence[int]) -> list[dict]:
    """Strided-read bandwidth (09_strided_read.cu): ``out[i] = in[i * stride]`` for ``n`` outputs.

    ``useful_gbytes_per_s`` counts the 8 bytes per element the program asks for (4 read, 4 written);
    ``predicted_gbytes_per_s`` scales the stride-1 rate by useful bytes over bytes moved in sectors.
    """
    n, strides = positive_int("n", n), positive_ints("strides", strides)
    kernel_mode.require_gpu("coalescing")
    device = env.device()
    fits_in_memory("n", 4 * n * (max(strides) + 1), device)
    source = random_tensor((n * max(strides),), torch.float32, device)
    rows = []
    blocks = (n + 255) // 256
    for stride in strides:
        out = poisoned((n,), torch.float32, device)
        cuda_c.launch("09_strided_read", "strided_read", blocks, 256, source, out, n, stride)
        check_close(out, source[: n * stride : stride], 0.0, f"strided read, stride {stride}")
        t = cuda_c.time_launch("09_strided_read", "strided_read", blocks, 256, source, out, n, stride)
        sectors = sectors_per_warp(stride)
        rows.append({"stride": stride, "seconds": t.median_s, "spread": t.spread,
                     "useful_gbytes_per_s": 8 * n / t.median_s / 1e9, "sectors_per_warp_read": sectors,
                     "bytes_moved_per_element": 4 + sectors * SECTOR_BYTES / occupancy.WARP})
    base = rows[0]["useful_gbytes_per_s"] * rows[0]["bytes_moved_per_element"] / 8 if strides[0] == 1 else None
    for row in rows:
        row["predicted_gbytes_per_s"] = base * 8 / row["bytes_moved_per_element"] if base else None
    return rows


def stencil_reference(values: torch.Tensor, radius: int = STENCIL_RADIUS) -> torch.Tensor:
    """``out[i] = values[i] + ... + values[i + 2 radius]`` for the len(values) - 2 radius outputs, in float64."""
    return values.double().unfold(0, 2 * radius + 1, 1).sum(dim=1)


@experiment("memory_stencil")
def stencil(n: int, trials: int = 3) -> list[dict]:
    """Run the shared-memory stencil with and without ``__syncthreads()``: wrong outputs per trial.

    With the barrier every output must be right (else this raises); without it, the rows count the
    outputs that came out wrong. On a GPU this is CUDA C; in the simulator, its numba twin.
    """
    n, trials = positive_int("n", n), positive_int("trials", trials)
    device = kernel_mode.device()
    blocks = (n + STENCIL_BLOCK - 1) // STENCIL_BLOCK
    if not kernel_mode.on_gpu() and blocks > 16:
        raise ValueError(f"n: the simulator runs at most 16 blocks of {STENCIL_BLOCK} threads here; got {n}")
    fits_in_memory("n", 2 * 4 * n, device)
    rows = []
    for use_barrier in (True, False):
        for trial in range(trials):
            values = random_tensor((n + 2 * STENCIL_RADIUS,), torch.float32, device)
            out = poisoned((n,), torch.float32, device)
            if kernel_mode.on_gpu():
                cuda_c.launch("10_stencil_1d", "stencil_1d", blocks, STENCIL_BLOCK, values, out, n, use_barrier)
            else:
                from gpulab.kernels import numba_kernels

                numba_kernels.stencil_1d[blocks, STENCIL_BLOCK](kernel_mode.device_array(values),
                                                                kernel_mode.device_array(out), use_barrier)
            kernel_mode.synchronize()
            expected = stencil_reference(values)
            wrong = ~torch.isclose(out.double(), expected, rtol=1e-5, atol=1e-5)
            if use_barrier:
                check_close(out, expected, 1e-6, "stencil_1d with its barrier")
            rows.append({"barrier": use_barrier, "trial": trial, "n": n, "wrong": int(wrong.sum()),
                         "wrong_fraction": float(wrong.double().mean())})
    return rows


def bank_conflict_degree(row_floats: int, warp: int = occupancy.WARP) -> int:
    """Threads of a warp that hit the same bank when they read one column of a tile with rows of ``row_floats``.

    1 means no conflict; 32 means the 32 reads are served one after another.
    """
    row_floats = positive_int("row_floats", row_floats)
    banks = [(r * row_floats) % BANKS for r in range(warp)]
    return max(banks.count(b) for b in set(banks))


TRANSPOSES = (
    ("11_copy_tiled", "copy_tiled", "tiled copy (no transpose)"),
    ("12_transpose_naive", "transpose_naive", "naive transpose"),
    ("13_transpose_tiled", "transpose_tiled", "tiled transpose (shared memory)"),
    ("14_transpose_padded", "transpose_padded", "tiled transpose, padded tile"),
)


@experiment("memory_transpose")
def transpose(n: int = 16384) -> list[dict]:
    """Bandwidth of the copy and the three transposes of an n x n float32 matrix, and of a device copy.

    Each kernel's output is checked against ``torch.t`` (the copy's against the input) first.
    """
    n = positive_int("n", n)
    if n % TILE:
        raise ValueError(f"n: a multiple of the tile width {TILE}, got {n}")
    kernel_mode.require_gpu("transpose")
    device = env.device()
    fits_in_memory("n", 2 * 4 * n * n, device)
    a = random_tensor((n, n), torch.float32, device)
    grid, block = (n // TILE, n // TILE), (TILE, BLOCK_ROWS)
    rows = []
    for file, kernel, label in TRANSPOSES:
        out = poisoned((n, n), torch.float32, device)
        cuda_c.launch(file, kernel, grid, block, a, out, n)
        expected = a if kernel == "copy_tiled" else a.t()
        check_close(out, expected, 0.0, label)
        t = cuda_c.time_launch(file, kernel, grid, block, a, out, n)
        rows.append({"kernel": file, "label": label, "seconds": t.median_s, "spread": t.spread,
                     "gbytes_per_s": 8 * n * n / t.median_s / 1e9})
    del a, out  # the copy needs the memory
    copy = {"kernel": "copy", "label": "device copy (cudaMemcpy)", **rates.measure_copy(4 * n * n, device)}
    rows.append(copy)
    for row in rows:
        row["fraction_of_copy"] = row["gbytes_per_s"] / copy["gbytes_per_s"]
    return rows


@experiment("memory_bytes_in_flight")
def bytes_in_flight(nbytes: int, blocks_per_sm: Sequence[float], loads: Sequence[int],
                    threads_per_block: int = 256) -> list[dict]:
    """Copy bandwidth (15_copy_in_flight.cu) for grids of a few threads, each with ``loads`` 16-byte loads in flight.

    A row's ``bytes_in_flight`` is resident threads x loads x 16 B; ``latency_s`` is what Little's
    law makes of it: bytes in flight / bandwidth.
    """
    nbytes = positive_int("nbytes", nbytes)
    if nbytes % 16:
        raise ValueError(f"nbytes: a multiple of 16 (float4 elements), got {nbytes}")
    loads = positive_ints("loads", loads)
    if max(loads) > 8:
        raise ValueError(f"loads: at most 8 (MAX_LOADS in 15_copy_in_flight.cu), got {max(loads)}")
    if any(b <= 0 for b in blocks_per_sm):
        raise ValueError(f"blocks_per_sm: positive numbers, got {list(blocks_per_sm)}")
    kernel_mode.require_gpu("bytes_in_flight")
    device = env.device()
    fits_in_memory("nbytes", 2 * nbytes, device)
    info = env.describe()
    kernel = cuda_c.function("15_copy_in_flight", "copy_in_flight")
    resident = occupancy.theoretical(threads_per_block, kernel.attributes["num_regs"], 0,
                                     occupancy.limits(info.compute_capability)).blocks_per_sm
    n4 = nbytes // 16
    source = random_tensor((4 * n4,), torch.float32, device)
    rows = []
    for per_sm in blocks_per_sm:
        blocks = max(1, round(per_sm * info.multiprocessors))
        for count in loads:
            out = poisoned((4 * n4,), torch.float32, device)
            cuda_c.launch("15_copy_in_flight", "copy_in_flight", blocks, threads_per_block, source, out, n4, count)
            check_close(out, source, 0.0, f"copy_in_flight, {blocks} blocks, {count} loads")
            t = cuda_c.time_launch("15_copy_in_flight", "copy_in_flight", blocks, threads_per_block, source, out,
                                   n4, count)
            threads = min(blocks, resident * info.multiprocessors) * threads_per_block
            bandwidth = 2 * nbytes / t.median_s
            in_flight = threads * count * 16
            rows.append({"blocks": blocks, "blocks_per_sm": blocks / info.multiprocessors, "loads": count,
                         "resident_threads": threads, "bytes_in_flight": in_flight, "seconds": t.median_s,
                         "spread": t.spread, "gbytes_per_s": bandwidth / 1e9,
                         "latency_s": in_flight / (bandwidth / 2)})
    return rows


def unloaded_latency(rows: Sequence[dict], below: float = 0.5) -> float:
    """Little's-law latency (s) from the rows whose bandwidth is below ``below`` of the best: their median.

    Far from the peak the memory is not the bottleneck, and in-flight bytes / bandwidth reads the
    latency itself; near the peak, queueing inflates it.
    """
    rows = ok_rows(rows)
    if not rows:
        raise ValueError("rows: no measurements")
    best = max(r["gbytes_per_s"] for r in rows)
    low = [r["latency_s"] for r in rows if r["gbytes_per_s"] < below * best]
    if not low:
        raise ValueError(f"rows: no measurement below {below:.0%} of the best bandwidth; add smaller grids")
    return statistics.median(low)
