"""Step 2, tile sizes and software pipelining: the kernel of step 1 with larger tiles and several K steps in flight.

**The one idea**: keep the tensor cores fed. In step 1 every step of the K loop loads its two tiles, waits for
them, then multiplies: the tensor cores idle while the loads are in flight, and the loads wait while the
tensor cores work. The chapter "GEMM on the GPU" cured that by hand with double buffering (``23_sgemm_double_
buffered.cu``) and ``cp.async`` copies (``26_wmma_pipelined.cu``). In Triton it is one launch setting:
``num_stages=S`` asks the compiler to *software-pipeline* the K loop, keeping S tiles of A and of B in shared
memory in a ring, with the loads for steps k+1 .. k+S-1 issued (asynchronously) before step k multiplies. The
kernel's source does not change; this module launches step 1's :func:`~.step1_blocked.blocked_kernel` with
another :data:`CONFIG`.

The tile grows too, from 128 x 128 x 32 to 128 x 256 x 64 with 8 warps: a larger tile does more multiply-adds
per byte loaded (a ``BM x BN`` tile loads ``(BM + BN) x BK`` elements for ``BM x BN x BK`` multiply-adds), and
a deeper K step gives each asynchronous copy more work to hide behind. The price is shared memory,
``S x (BM + BN) x BK x 2`` bytes: 3 x 48 KiB = 144 KiB here, under the 227 KiB an H100 or H200 block may have.

**Evidence on the GPU** (``ladder.evidence``): the compiled kernel's ``num_stages`` is 3 and its shared memory
grows with the stages; the SASS has asynchronous global-to-shared copies (LDGSTS, Ampere's ``cp.async``, with
their LDGDEPBAR/DEPBAR barriers) beside step 1's plain loads (LDG, then STS into shared memory), and the same
tensor-core instructions (HGMMA on Hopper). Compiled here for sm_90 (``ladder.cross_compile``) it has
LDGSTS only and no LDG; the STS left write the tile of C through shared memory after the loop. :data:`STAGES` lists the
depths the ladder also times, to show the gain per stage.
"""

from __future__ import annotations

from gpulab.kernels.triton_gemm.common import settings
from gpulab.kernels.triton_gemm.step1_blocked import KERNEL, LAUNCH_OPTIONS, launch  # noqa: F401 (the ladder reads them)

CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
STAGES = (1, 2, 3, 4)  # the pipeline depths ladder_sweep times for this step (4 x 48 KiB still fits)


def matmul(a, b, *, out=None, **config):
    """``a @ b`` by step 1's kernel with this step's tiles and stages; ``config`` overrides :data:`CONFIG`."""
    return launch(a, b, out, settings(CONFIG, config, "step2_pipelined"))[0]
