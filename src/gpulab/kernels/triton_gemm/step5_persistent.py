"""Step 5, a persistent kernel: one program per SM, each walking over many tiles of C.

**The one idea**: launch as many programs as the GPU runs at once, and let each loop over tiles. Up to step 4
the grid has one program per tile (32 x 64 = 2048 of them at 8192^3 with 128 x 256 tiles), and an SM that
finishes a tile must retire its program and start the next one: the new program sets up, fills its pipeline
from empty (its first loads have nothing to hide behind), and its last tile's result is written while the
tensor cores idle. A *persistent* kernel launches ``min(SMs, tiles)`` programs; program p computes tiles p,
p + SMs, p + 2 SMs, ... (in step 3's grouped order). Within a program the compiler can now overlap the end of
one tile with the start of the next: ``tl.range(..., flatten=True)`` asks it to flatten the tile loop and the
K loop into one loop and pipeline across the tile boundary, so the loads of the next tile's first K steps are
in flight while this tile's last steps multiply and its result is stored. It also removes the *tail*: with one
program per tile, the last wave of tiles occupies only some SMs (2048 tiles = 15.5 waves on 132 SMs).
Tiles, stages and TMA are step 4's.

The number of programs is a constant of the compiled kernel (``NUM_SMS``, the SM count of the GPU the kernel
runs on). Under the interpreter there are no SMs; :data:`INTERPRETER_PROGRAMS` programs stand in, few enough
that each walks several tiles in the tests.

**Evidence on the GPU**: the grid is the SM count (132 on an H100 SXM, also 132 on an H200), a loop around the
tile in the SASS (a backward branch enclosing the epilogue's UTMASTG), UTMALDG and HGMMA as in step 4, and a few
more registers for the loop's state. What it should gain is the time between tiles, largest where the tiles
are few per SM (4096^3: 512 tiles, under 4 waves).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpulab.kernels.triton_gemm.common import operands, output, settings
from gpulab.kernels.triton_gemm.step3_grouped import grouped_tile
from gpulab.kernels.triton_gemm.step4_tma import CONFIG as STEP4_CONFIG
from gpulab.kernels.triton_gemm.step4_tma import descriptors, tma_tile_product

CONFIG = dict(STEP4_CONFIG)
LAUNCH_OPTIONS: dict = {}
INTERPRETER_PROGRAMS = 3


@triton.jit
def persistent_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                      WARP_SPECIALIZE: tl.constexpr):
    """Program p computes tiles p, p + NUM_SMS, ...; ``WARP_SPECIALIZE`` is step 6's switch (off here)."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = grouped_tile(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tma_tile_product(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_M, BLOCK_N, BLOCK_K)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


KERNEL = persistent_kernel


def programs(device: torch.device) -> int:
    """How many programs a persistent kernel launches on ``device``: its SM count (a stand-in on the CPU)."""
    if device.type == "cpu":
        return INTERPRETER_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch(a, b, out, config: dict, warp_specialize: bool = False):
    """Check the inputs, launch :func:`persistent_kernel` on ``min(SMs, tiles)`` programs; return
    ``(c, compiled kernel)``. Step 6 launches it with ``warp_specialize=True``."""
    m, n, k = operands(a, b)
    c = output(a, m, n, out)
    a_desc, b_desc, c_desc = descriptors(a, b, c, config)
    sms = programs(a.device)
    tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
    compiled = persistent_kernel[(min(sms, tiles),)](a_desc, b_desc, c_desc, m, n, k, NUM_SMS=sms,
                                                     WARP_SPECIALIZE=warp_specialize, **config)
    return c, compiled


def matmul(a, b, *, out=None, **config):
    """``a @ b`` by the persistent TMA kernel; ``config`` overrides :data:`CONFIG`."""
    return launch(a, b, out, settings(CONFIG, config, "step5_persistent"))[0]
