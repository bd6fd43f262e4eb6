"""Step 4, TMA tensor descriptors: Hopper's copy engine moves whole tiles from global into shared memory.

**The one idea**: stop computing addresses. Up to step 3 every thread computes the addresses of its share of
each tile, checks them against the edges, and issues its own loads (asynchronous ones since step 2): for a
128 x 64 tile of 16-bit numbers and 256 threads, that is address arithmetic and predicates for 32 elements per
thread per tile, on the same warps that should be issuing tensor-core instructions. Hopper's *Tensor Memory
Accelerator* (TMA) is a copy engine beside each SM that moves a whole box of a 2-D (up to 5-D) array between
global and shared memory from a single instruction, given a *tensor descriptor*: the array's base, shapes and
strides, and the box's size. It also does the edges: a box reaching past the array is filled with zeros on
loading and clipped on storing, so the kernel has no masks.

In Triton 3.6 the descriptor is built on the host, ``TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K])``
(``triton.tools.tensor_descriptor``), and passed as an argument; in the kernel ``a_desc.load([row, col])``
returns the ``BLOCK_M x BLOCK_K`` tile whose top-left element is (row, col), and ``c_desc.store`` writes one.
(``tl.make_tensor_descriptor`` builds one inside the kernel instead, which needs a global scratch allocator on
the GPU; the host form is simpler.) TMA asks for 16-byte alignment: the base and every row stride must be a
multiple of 16 bytes, so K and N must be multiples of 8 for 16-bit types (:func:`launch` says so if not).

Tiles, stages and the grouped order are step 3's. The pipelining of step 2 still applies: the compiler now
issues TMA loads for the next stages and waits on shared-memory barriers (mbarrier) for them.

**Evidence on the GPU**: UTMALDG (TMA loads) and UTMASTG (the TMA store of C) in the SASS, with SYNCS (mbarrier)
instructions, in place of step 2's LDGSTS; fewer integer instructions per loop iteration (no address or mask
arithmetic); the HGMMA tensor-core instructions unchanged; shared memory as in step 2 plus the barriers: C is staged
(STSM) in the stages' buffers, free once the loop ends, for the UTMASTG. **Interpreter**: runs (Triton 3.6 emulates
descriptors with NumPy loads and stores, zero padding included); only the GPU shows the TMA instructions.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gpulab.kernels.triton_gemm.common import operands, output, settings
from gpulab.kernels.triton_gemm.step3_grouped import CONFIG as STEP3_CONFIG
from gpulab.kernels.triton_gemm.step3_grouped import grouped_tile

CONFIG = dict(STEP3_CONFIG)
LAUNCH_OPTIONS: dict = {}
TMA_ALIGNMENT_BYTES = 16


@triton.jit
def tma_tile_product(a_desc, b_desc, off_m, off_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """The float32 ``BLOCK_M x BLOCK_N`` tile of A @ B whose top-left element is (off_m, off_n), tiles by TMA."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])  # BLOCK_M x BLOCK_K, zeros past the edges
        b = b_desc.load([k * BLOCK_K, off_n])  # BLOCK_K x BLOCK_N
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def tma_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr):
    """Step 3's kernel with every tile moved by TMA: no pointers, no masks."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tma_tile_product(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


KERNEL = tma_kernel


def descriptors(a, b, c, config: dict) -> tuple[TensorDescriptor, TensorDescriptor, TensorDescriptor]:
    """Host tensor descriptors of A, B and C with the tile shapes of ``config``; a ValueError if TMA cannot
    address the matrices (a row that is not a multiple of 16 bytes)."""
    for name, t in (("a", a), ("b", b), ("out", c)):
        row_bytes = t.stride(0) * t.element_size()
        if row_bytes % TMA_ALIGNMENT_BYTES or t.data_ptr() % TMA_ALIGNMENT_BYTES:
            raise ValueError(f"{name}: TMA needs rows of a multiple of {TMA_ALIGNMENT_BYTES} bytes and a 16-byte "
                             f"aligned start; a row of {name} is {t.shape[1]} x {t.element_size()} = {row_bytes} "
                             f"bytes (for 16-bit types K and N must be multiples of 8)")
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    return (TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]),
            TensorDescriptor.from_tensor(c, [bm, bn]))


def launch(a, b, out, config: dict):
    """Check the inputs, build the descriptors, launch :func:`tma_kernel`; return ``(c, compiled kernel)``."""
    m, n, k = operands(a, b)
    c = output(a, m, n, out)
    a_desc, b_desc, c_desc = descriptors(a, b, c, config)
    grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
    return c, tma_kernel[grid](a_desc, b_desc, c_desc, m, n, k, **config)


def matmul(a, b, *, out=None, **config):
    """``a @ b`` with TMA loads and stores; ``config`` overrides :data:`CONFIG`."""
    return launch(a, b, out, settings(CONFIG, config, "step4_tma"))[0]
