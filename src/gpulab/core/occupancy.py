"""Occupancy: how many threads an SM holds at once for a given kernel and launch configuration.

An SM keeps every resident thread's registers and every resident block's shared memory on chip, so
the blocks it can hold at once are limited four ways: by its thread slots, its block slots, its
register file and its shared memory. The fewest wins. Occupancy is the resident warps over the
most the SM could hold; more resident warps give the scheduler more independent work to switch to
while others wait on memory (see the chapter "The GPU memory hierarchy").

:func:`theoretical` follows NVIDIA's occupancy calculator: registers are allocated per warp in units
of 256, to the SM's four partitions separately; shared memory in units of 128 bytes, plus 1 KiB the
system reserves per block from compute capability 8.0 on. The chapters check it against the driver's
own answer (``cudaOccupancyMaxActiveBlocksPerMultiprocessor``) on the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WARP = 32
PARTITIONS = 4  # an SM is four partitions, each with its own scheduler and a quarter of the registers


@dataclass(frozen=True)
class SMLimits:
    """What one SM of a compute capability can hold (CUDA C Programming Guide, technical specifications)."""

    compute_capability: str
    max_threads: int
    max_blocks: int
    registers: int = 65536  # 32-bit registers
    shared_bytes: int = 0  # the most shared memory all blocks of an SM can use together
    reserved_shared_per_block: int = 0
    register_unit: int = 256  # registers are handed to a warp in multiples of this
    shared_unit: int = 128
    max_registers_per_thread: int = 255


LIMITS = {limits.compute_capability: limits for limits in (
    SMLimits("7.0", max_threads=2048, max_blocks=32, shared_bytes=96 * 1024),  # V100
    SMLimits("7.5", max_threads=1024, max_blocks=16, shared_bytes=64 * 1024),  # T4
    SMLimits("8.0", max_threads=2048, max_blocks=32, shared_bytes=164 * 1024, reserved_shared_per_block=1024),  # A100
    SMLimits("8.6", max_threads=1536, max_blocks=16, shared_bytes=100 * 1024, reserved_shared_per_block=1024),  # 3090
    SMLimits("8.9", max_threads=1536, max_blocks=24, shared_bytes=100 * 1024, reserved_shared_per_block=1024),  # L4
    SMLimits("9.0", max_threads=2048, max_blocks=32, shared_bytes=228 * 1024, reserved_shared_per_block=1024),  # H100
    SMLimits("10.0", max_threads=2048, max_blocks=32, shared_bytes=228 * 1024, reserved_shared_per_block=1024),
)}


def limits(compute_capability: str) -> SMLimits:
    """The SM limits of ``compute_capability`` (e.g. ``"9.0"``)."""
    try:
        return LIMITS[compute_capability]
    except KeyError:
        known = ", ".join(LIMITS)
        raise ValueError(f"compute_capability: the table has {known}; got {compute_capability!r}") from None


@dataclass(frozen=True)
class Occupancy:
    threads_per_block: int
    blocks_per_sm: int
    limited_by: str  # "threads", "blocks", "registers" or "shared memory"
    fraction: float  # resident threads over the SM's maximum

    @property
    def threads_per_sm(self) -> int:
        return self.blocks_per_sm * self.threads_per_block


def theoretical(threads_per_block: int, registers_per_thread: int, shared_bytes_per_block: int,
                sm: SMLimits) -> Occupancy:
    """Blocks per SM and occupancy of a kernel using these resources, launched with ``threads_per_block``."""
    if not isinstance(threads_per_block, int) or not 1 <= threads_per_block <= 1024:
        raise ValueError(f"threads_per_block: 1 to 1024, got {threads_per_block!r}")
    if not 0 <= registers_per_thread <= sm.max_registers_per_thread:
        raise ValueError(f"registers_per_thread: 0 to {sm.max_registers_per_thread}, got {registers_per_thread}")
    if shared_bytes_per_block < 0:
        raise ValueError(f"shared_bytes_per_block: must be >= 0, got {shared_bytes_per_block}")
    warps = math.ceil(threads_per_block / WARP)
    by = {"threads": sm.max_threads // (warps * WARP), "blocks": sm.max_blocks}
    if registers_per_thread:
        per_warp = math.ceil(registers_per_thread * WARP / sm.register_unit) * sm.register_unit
        warps_per_partition = (sm.registers // PARTITIONS) // per_warp
        by["registers"] = warps_per_partition * PARTITIONS // warps
    if shared_bytes_per_block:
        shared = math.ceil((shared_bytes_per_block + sm.reserved_shared_per_block) / sm.shared_unit) * sm.shared_unit
        by["shared memory"] = sm.shared_bytes // shared
    limited_by = min(by, key=by.get)
    blocks = by[limited_by]
    return Occupancy(threads_per_block, blocks, limited_by, blocks * warps * WARP / sm.max_threads)
