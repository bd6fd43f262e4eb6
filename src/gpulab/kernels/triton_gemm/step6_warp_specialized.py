"""Step 6, warp specialization: some warps only issue TMA loads, the others only multiply.

**The one idea**: give each kind of work its own warps. In step 5 every warp does everything in turn: it waits
for a tile to arrive, issues the tensor-core instructions, issues the next TMA loads, and runs the epilogue.
The compiler interleaves these as well as it can, but one warp's instruction stream is one sequence. With
*warp specialization* the program's warps are split into partitions that run different code at once: a
*producer* (one warp is enough) that only issues TMA loads into the ring of shared-memory stages and signals an
mbarrier when each has landed, and *consumer* warpgroups that wait on those barriers, issue the warpgroup MMAs
and write the results. The SM's warp schedulers then overlap the two for free, and the producer, which needs
few registers, can give its registers to the consumers (Hopper's ``setmaxnreg``). It is how cuBLAS and
CUTLASS's Hopper GEMMs are built.

In Triton it is again one word: ``tl.range(..., warp_specialize=True)`` on the loop to split. This module
launches step 5's :func:`~.step5_persistent.persistent_kernel` with it on the tile loop. In Triton 3.6 the
NVIDIA back end runs an automatic warp-specialization pass for Hopper (``add_hopper_warpspec``, compute
capability 9.x) as well as Blackwell's; whether it splits *this* loop on an H100, or quietly compiles step 5
again, is a fact of the compiled kernel, not of the source, and the evidence must say which.

**Evidence on the GPU** (``ladder.evidence``): a warp-specialized kernel has more warps than ``num_warps``
asked for (the producer partition's are added), USETMAXREG instructions in the SASS (producer warps giving up
registers, consumers taking them), and the UTMALDG loads in a different branch of the code from the HGMMA.
If none of that is there, the pass did not apply and step 6 is step 5.

**What Triton 3.6.0 does on Hopper** (compiled for sm_90 without a GPU, ``ladder.cross_compile``): nothing. With
``warp_specialize=True`` on the persistent tile loop the kernel has no warp partitions and no USETMAXREG, and
its SASS is step 5's instruction for instruction (with 8 warps); on the K loop of step 4's kernel it is ignored
with 8 warps and makes the compiler fail (``NVGPUWarpSpecialization``) with 4. Automatic warp specialization in
Triton 3.6 is a Blackwell feature in practice; on Hopper it is written by hand in Gluon (Triton's lower-level
language), which this ladder does not go into. The step stays so that the recordings show it on the GPU.

**Interpreter**: runs (the option is a compile-time hint the interpreter ignores); on the CPU it is step 5.
"""

from __future__ import annotations

from gpulab.kernels.triton_gemm.common import settings
from gpulab.kernels.triton_gemm.step5_persistent import CONFIG as STEP5_CONFIG
from gpulab.kernels.triton_gemm.step5_persistent import KERNEL, launch  # noqa: F401 (the ladder reads KERNEL)

CONFIG = dict(STEP5_CONFIG)
LAUNCH_OPTIONS = {"warp_specialize": True}


def matmul(a, b, *, out=None, **config):
    """``a @ b`` by the persistent TMA kernel, warp-specialized on the GPU; ``config`` overrides :data:`CONFIG`."""
    return launch(a, b, out, settings(CONFIG, config, "step6_warp_specialized"), **LAUNCH_OPTIONS)[0]
