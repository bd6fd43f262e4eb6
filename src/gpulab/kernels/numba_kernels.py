"""The course's first kernels written in Python with numba-cuda, beside their CUDA C twins.

Each function here is the ``NN_name.cu`` kernel of the same name, line for line where Python allows:
``cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x`` is CUDA C's global index, a launch is
``kernel[blocks, threads_per_block](arguments)``. On a GPU numba compiles them to machine code; on
a CPU they run in numba's CUDA simulator (see :mod:`gpulab.kernels`), slowly but faithfully, so
that a reader without a GPU can run, change and break them.
"""

from __future__ import annotations

import numpy as np

from gpulab.core import kernel_mode

cuda = kernel_mode.numba_cuda()

RADIUS = 3  # the stencil's, as in 10_stencil_1d.cu
BLOCK_SIZE = 256
WINDOW = BLOCK_SIZE + 2 * RADIUS  # a shared array's size must be a constant: numba on a GPU rejects an expression


@cuda.jit
def hello(line_count, block_of_line, thread_of_line):
    """01_hello.cu: each thread takes the next line of a guest book and signs it."""
    line = cuda.atomic.add(line_count, 0, 1)  # returns the old value: each thread gets its own line
    block_of_line[line] = cuda.blockIdx.x
    thread_of_line[line] = cuda.threadIdx.x


@cuda.jit
def add(a, b, c):
    """02_scalar_add.cu: one thread computes c = a + b (one-element arrays in device memory)."""
    c[0] = a[0] + b[0]


@cuda.jit
def vector_add(a, b, c):
    """03_vector_add.cu: thread i computes c[i] = a[i] + b[i]; threads past the end do nothing."""
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < c.size:
        c[i] = a[i] + b[i]


@cuda.jit
def saxpy(a, x, y):
    """04_saxpy.cu: y[i] = a * x[i] + y[i], one element per thread."""
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < y.size:
        y[i] = a * x[i] + y[i]


@cuda.jit
def who_wrote(owner):
    """07_grid_2d.cu: each thread writes its block and thread coordinates into ``owner[:, row, col]``."""
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # x runs along a row
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if row < owner.shape[1] and col < owner.shape[2]:
        owner[0, row, col] = cuda.blockIdx.x
        owner[1, row, col] = cuda.blockIdx.y
        owner[2, row, col] = cuda.threadIdx.x
        owner[3, row, col] = cuda.threadIdx.y


@cuda.jit
def stencil_1d(values, out, use_barrier):
    """10_stencil_1d.cu: out[i] = values[i] + ... + values[i + 6], through a shared-memory window."""
    window = cuda.shared.array(WINDOW, dtype=np.float32)
    first = cuda.blockIdx.x * BLOCK_SIZE  # window[j] holds values[first + j]
    j = cuda.threadIdx.x
    while j < WINDOW:
        if first + j < values.size:
            window[j] = values[first + j]
        j += BLOCK_SIZE
    if use_barrier:
        cuda.syncthreads()
    i = first + cuda.threadIdx.x
    if i < out.size:
        total = np.float32(0)
        for offset in range(2 * RADIUS + 1):
            total += window[cuda.threadIdx.x + offset]
        out[i] = total


TILE = 16  # the side of the square tiles of matmul_tiled: 16 x 16 threads per block


@cuda.jit
def matmul_naive(A, B, C):
    """17_sgemm_coalesced.cu: one thread per element of C = A @ B, reading a row of A and a column of B."""
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # x runs along a row of C: coalesced
    if row < C.shape[0] and col < C.shape[1]:
        total = np.float32(0)
        for k in range(A.shape[1]):
            total += A[row, k] * B[k, col]
        C[row, col] = total


@cuda.jit
def matmul_tiled(A, B, C):
    """18_sgemm_shared.cu, for sizes that are multiples of TILE: a block stages TILE x TILE tiles of A
    and B in shared memory, and each element it loads is used TILE times."""
    a_tile = cuda.shared.array((TILE, TILE), dtype=np.float32)
    b_tile = cuda.shared.array((TILE, TILE), dtype=np.float32)
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    total = np.float32(0)
    for step in range(A.shape[1] // TILE):
        a_tile[ty, tx] = A[row, step * TILE + tx]  # each thread loads one element of each tile
        b_tile[ty, tx] = B[step * TILE + ty, col]
        cuda.syncthreads()  # the tiles are complete before anyone reads them
        for k in range(TILE):
            total += a_tile[ty, k] * b_tile[k, tx]
        cuda.syncthreads()  # everyone is done with the tiles before they are overwritten
    C[row, col] = total
