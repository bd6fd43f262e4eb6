"""Step 1, a blocked GEMM: one program computes one ``BLOCK_M x BLOCK_N`` tile of C with ``tl.dot``.

**From CUDA C to Triton.** The tiled CUDA C GEMM of the chapter "GEMM on the GPU" was written per *thread*: a
block of threads loads a tile of A and one of B into ``__shared__`` arrays, synchronises, and each thread
accumulates its few elements of C from them. A Triton kernel is written per *program*, the Triton name for a
thread block, and its variables are whole blocks of numbers: ``tl.arange(0, BLOCK_M)`` is a vector of
``BLOCK_M`` row indices, ``a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]`` a ``BLOCK_M x BLOCK_K``
block of addresses (broadcast as in NumPy), ``tl.load`` of it the whole tile of A, and ``tl.dot(a, b, acc)``
the product of two tiles added to a ``BLOCK_M x BLOCK_N`` float32 accumulator. Which thread holds which
element, the shared-memory staging, the ``__syncthreads`` and the tensor-core instructions are the compiler's
choice. What the programmer still chooses is what this ladder is about: the tile sizes, how many tiles are
in flight, the order of the tiles, and how the data moves.

The launch is the CUDA grid: ``kernel[grid](args, BLOCK_M=..., num_warps=4)`` runs one program per grid
point, ``tl.program_id(axis)`` is ``blockIdx``, and the arguments marked ``tl.constexpr`` are compile-time
constants (as template parameters are in C++): a new value compiles a new kernel.

**Edges.** M, N and K need not be multiples of the blocks. Rows of A (columns of B) past the edge are wrapped around
(``offs % M``) to rows that exist: they read valid memory, and the rows of C they produce are never stored. The last
step of K is masked: elements past K load as 0 and add nothing.

**The one idea of this step**: the tile product on tensor cores, no more. Pipelining is switched off
(``num_stages=1``): each step of the K loop loads its tiles and waits for them before the tensor cores start.
On the GPU the evidence (``ladder.evidence``) should show tensor-core instructions in the SASS (HGMMA, the
Hopper warpgroup MMA, or HMMA, the Ampere-style per-warp MMA), ordinary global loads (LDG) staged through
shared memory (STS, then LDS or HGMMA reading shared memory), no TMA (UTMALDG) and no asynchronous copies
(LDGSTS), and shared memory for one stage only.

:func:`tile_product` and :func:`store_tile` are reused by the later steps that load through pointers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gpulab.kernels.triton_gemm.common import operands, output, settings

CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
LAUNCH_OPTIONS: dict = {}  # extra arguments of launch() (step 6 has one)


@triton.jit
def tile_product(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The float32 ``BLOCK_M x BLOCK_N`` tile (pid_m, pid_n) of A @ B: the loop over K in steps of BLOCK_K."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # wrap around: a valid address whose result is never stored. Written as % (not tl.where(offs < M, offs, 0)) so
    # that the compiler still sees runs of 16 consecutive indices (M and N divisible by 16) and loads 16 bytes at
    # a time; with tl.where it loaded B one 2-byte element at a time (LDG.E.U16), many times slower on an H100
    rows = offs_m % M
    cols = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # BLOCK_M x BLOCK_K addresses
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn  # BLOCK_K x BLOCK_N addresses
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):  # a run-time bound (see interpreter.py for NumPy 2.4)
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)  # on tensor cores: 16-bit products, float32 sums
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Round ``acc`` to C's type and store the part of the tile that lies inside C."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def blocked_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per tile of C, on a 2-D grid: axis 0 walks the rows of tiles, axis 1 the columns."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    acc = tile_product(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
                       BLOCK_M, BLOCK_N, BLOCK_K)
    store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N)


KERNEL = blocked_kernel


def launch(a, b, out, config: dict):
    """Check the inputs, launch :func:`blocked_kernel` with ``config`` and return ``(c, compiled kernel)``.

    Step 2 launches the same kernel with its own ``config``; the compiled kernel is what
    :func:`gpulab.kernels.triton_gemm.ladder.evidence` reads (on the GPU).
    """
    m, n, k = operands(a, b)
    c = output(a, m, n, out)
    grid = (triton.cdiv(m, config["BLOCK_M"]), triton.cdiv(n, config["BLOCK_N"]))
    compiled = blocked_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                    c.stride(0), c.stride(1), **config)
    return c, compiled


def matmul(a, b, *, out=None, **config):
    """``a @ b`` by the blocked kernel; ``config`` overrides :data:`CONFIG` (tile sizes, num_warps, num_stages)."""
    return launch(a, b, out, settings(CONFIG, config, "step1_blocked"))[0]
