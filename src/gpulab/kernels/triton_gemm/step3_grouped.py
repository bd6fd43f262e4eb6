"""Step 3, grouped ordering: launch the tiles in an order that lets them share A and B in L2.

**The one idea**: the order of the programs is a choice, and it decides what the L2 cache holds. A GPU runs
as many programs at once as fit on its SMs (132 on an H100 with one 128 x 256 tile program per SM), in the
order of their ids. Steps 1 and 2 number the tiles down a column of C: the programs running together need
the same few columns of B but a hundred different rows of A. Every tile of C reads a whole row panel of A
(``BLOCK_M x K``) and a whole column panel of B (``K x BLOCK_N``); programs that run together and share panels
find them in L2 instead of DRAM.

:func:`grouped_tile` numbers the tiles by *groups* of ``GROUP_M`` rows of tiles: within a group the ids go
down the ``GROUP_M`` rows of one column of tiles, then on to the next column. So a wave of programs covers a
block of tiles about ``GROUP_M`` tall and (programs in flight / ``GROUP_M``) wide, and loads about
``GROUP_M + programs / GROUP_M`` panels instead of about ``programs + 1``. The grid becomes one-dimensional:
the program id is the tile's number in that order. (The same numbering as the persistent kernels of steps 5
and 6 use, so :func:`grouped_tile` is shared.)

**Evidence on the GPU**: the compiled kernel has step 2's loads, tensor-core instructions, stages and
shared memory; only integer arithmetic differs (the mapping, and the addressing the compiler schedules around
it), and with it the register count. The gain, if any, is in the
memory system: fewer bytes read from DRAM and a higher L2 hit rate, which the SASS cannot show; Nsight
Compute's ``dram__bytes_read.sum`` and ``lts__t_sector_hit_rate.pct`` can. At 4096^3 in 16 bits all of A and B
(64 MiB) nearly fits the 50 MiB L2 of an H100 and the gain should be small; at 8192^3 (256 MiB) it should be
larger.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gpulab.kernels.triton_gemm.common import operands, output, settings
from gpulab.kernels.triton_gemm.step1_blocked import store_tile, tile_product
from gpulab.kernels.triton_gemm.step2_pipelined import CONFIG as STEP2_CONFIG

CONFIG = {**STEP2_CONFIG, "GROUP_M": 8}
LAUNCH_OPTIONS: dict = {}


@triton.jit
def grouped_tile(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Row and column ``(pid_m, pid_n)`` of tile number ``tile_id`` when tiles are numbered group by group."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n  # GROUP_M rows of tiles, all their columns
    group = tile_id // tiles_per_group
    first_m = group * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)  # the last group may be shorter
    pid_m = first_m + (tile_id % tiles_per_group) % rows_in_group
    pid_n = (tile_id % tiles_per_group) // rows_in_group
    return pid_m, pid_n


@triton.jit
def grouped_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Step 2's kernel on a 1-D grid whose program ids are mapped to tiles group by group."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tile_product(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
                       BLOCK_M, BLOCK_N, BLOCK_K)
    store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N)


KERNEL = grouped_kernel


def launch(a, b, out, config: dict):
    """Check the inputs, launch :func:`grouped_kernel`; return ``(c, compiled kernel)``."""
    m, n, k = operands(a, b)
    c = output(a, m, n, out)
    grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
    compiled = grouped_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                    c.stride(0), c.stride(1), **config)
    return c, compiled


def matmul(a, b, *, out=None, **config):
    """``a @ b`` with tiles in grouped order; ``config`` overrides :data:`CONFIG` (GROUP_M=1 numbers row by row)."""
    return launch(a, b, out, settings(CONFIG, config, "step3_grouped"))[0]
