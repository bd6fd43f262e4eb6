"""The lab's reference kernels, each usual mistake as a compile-time switch, and the lab's counts.

:func:`matmul_kernel` is the blocked GEMM of :mod:`gpulab.kernels.triton_gemm.step1_blocked` (the same signature
as the kernel the student writes), launched on a 2-D grid, or, with ``GROUP_M > 0``, on a 1-D grid whose program
ids are numbered group by group (:func:`grouped_tile`, step 3's numbering). ``MISTAKE`` selects one usual mistake
(:data:`KERNEL_MISTAKES`); 0 is the correct kernel. The graders (:mod:`.diagnose`) run each mistaken kernel on the
inputs a student's kernel got: when a student's output is what a mistaken kernel computes, the hint can name the
mistake. :func:`grouped_tile` has its usual mistakes too (:data:`NUMBERING_MISTAKES`), read back through
:func:`probe_kernel`, which stores the tile every program id is given.

The constants that select a mistake are ``tl.constexpr``: a branch on one of them is resolved when the kernel is
compiled, so each mistaken kernel is its own compiled kernel, with none of the other branches in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# What the MISTAKE argument selects (0: none). tl.constexpr, so that the kernels may read them as globals.
NO_K_MASK = tl.constexpr(1)
SHORT_K_LOOP = tl.constexpr(2)
POINTERS_NOT_ADVANCED = tl.constexpr(3)
A_STRIDES_SWAPPED = tl.constexpr(4)
B_STRIDES_SWAPPED = tl.constexpr(5)
C_STRIDES_SWAPPED = tl.constexpr(6)
NO_STORE_MASK = tl.constexpr(7)
STORE_MASK_ROWS_ONLY = tl.constexpr(8)
STORE_MASK_COLUMNS_ONLY = tl.constexpr(9)
PROGRAM_IDS_SWAPPED = tl.constexpr(10)
SIXTEEN_BIT_SUMS = tl.constexpr(11)
# ... and what the NUMBERING argument of grouped_tile selects
LAST_GROUP_NOT_CLAMPED = tl.constexpr(1)
ROW_NOT_WRAPPED = tl.constexpr(2)
COLUMN_DIVIDED_BY_GROUP_M = tl.constexpr(3)
GROUP_SPANS_ROWS = tl.constexpr(4)


@dataclass(frozen=True)
class Mistake:
    """A usual mistake: its ``problem`` (a kind of :class:`.diagnose.Diagnosis`, whose hint :mod:`.hints` gives),
    the ``code`` that switches it on, and what a kernel with it computes (``shows``), in words."""

    problem: str
    code: int
    shows: str


KERNEL_MISTAKES = (
    Mistake("no k mask", NO_K_MASK.value,
            "that is what a kernel computes whose loads along K have no mask: the last, partial step of the K loop "
            "adds products of whatever lies past the end of A's rows and B's columns (with a K that is a multiple "
            "of BLOCK_K it would be right)"),
    Mistake("short k loop", SHORT_K_LOOP.value,
            "that is what a kernel computes whose K loop runs K // BLOCK_K steps: the last, partial tile of K is "
            "never added"),
    Mistake("pointers not advanced", POINTERS_NOT_ADVANCED.value,
            "that is what a kernel computes that never moves its pointers along K: every step multiplies the "
            "first BLOCK_K columns of A by the first BLOCK_K rows of B again"),
    Mistake("a strides swapped", A_STRIDES_SWAPPED.value,
            "that is what a kernel computes that steps through A with its two strides swapped (stride_ak down the "
            "rows, stride_am along K)"),
    Mistake("b strides swapped", B_STRIDES_SWAPPED.value,
            "that is what a kernel computes that steps through B with its two strides swapped (stride_bn down K, "
            "stride_bk along the columns)"),
    Mistake("c strides swapped", C_STRIDES_SWAPPED.value,
            "that is what a kernel computes that stores its tile with C's two strides swapped"),
    Mistake("no store mask", NO_STORE_MASK.value,
            "that is what a kernel computes whose store has no mask: the tiles at C's bottom and right edges "
            "write past the ends of its rows and columns"),
    Mistake("store mask rows only", STORE_MASK_ROWS_ONLY.value,
            "that is what a kernel computes whose store mask checks the rows only: the tiles at C's right edge "
            "write past the end of its rows"),
    Mistake("store mask columns only", STORE_MASK_COLUMNS_ONLY.value,
            "that is what a kernel computes whose store mask checks the columns only: the tiles at C's bottom "
            "edge write past its last row"),
    Mistake("program ids swapped", PROGRAM_IDS_SWAPPED.value,
            "that is what a kernel computes that takes its tile's row from tl.program_id(1) and its column from "
            "tl.program_id(0)"),
    Mistake("16-bit sums", SIXTEEN_BIT_SUMS.value,
            "that is what a kernel computes that keeps its running sum in float16: rounded to 16 bits after every "
            "step of the K loop, it drifts further from the exact sum the longer K is"),
)
NUMBERING_MISTAKES = (
    Mistake("last group not clamped", LAST_GROUP_NOT_CLAMPED.value,
            "that is the numbering of a grouped_tile that takes GROUP_M rows for every group, the last one too"),
    Mistake("row not wrapped", ROW_NOT_WRAPPED.value,
            "that is the numbering of a grouped_tile whose row is first_m + tile_id % rows_in_group, without "
            "first taking tile_id % tiles_per_group"),
    Mistake("column divided by GROUP_M", COLUMN_DIVIDED_BY_GROUP_M.value,
            "that is the numbering of a grouped_tile whose column divides by GROUP_M instead of rows_in_group"),
    Mistake("group spans rows", GROUP_SPANS_ROWS.value,
            "that is the numbering of a grouped_tile whose groups hold GROUP_M x tiles_m tiles (the count of "
            "rows of tiles), not GROUP_M x tiles_n (the count of columns)"),
)


@triton.jit
def grouped_tile(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                 NUMBERING: tl.constexpr = 0):
    """Row and column ``(pid_m, pid_n)`` of tile ``tile_id`` when tiles are numbered group by group: ``GROUP_M``
    rows of tiles per group (fewer in the last), down each column of the group, then on to the next column."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    if NUMBERING == GROUP_SPANS_ROWS:
        tiles_per_group = GROUP_M * tiles_m
    first_m = (tile_id // tiles_per_group) * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)  # the last group may be shorter
    if NUMBERING == LAST_GROUP_NOT_CLAMPED:
        rows_in_group = GROUP_M
    within = tile_id % tiles_per_group  # the tile's place in its group
    pid_m = first_m + within % rows_in_group
    if NUMBERING == ROW_NOT_WRAPPED:
        pid_m = first_m + tile_id % rows_in_group
    pid_n = within // rows_in_group
    if NUMBERING == COLUMN_DIVIDED_BY_GROUP_M:
        pid_n = within // GROUP_M
    return pid_m, pid_n


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr = 0,
                  MISTAKE: tl.constexpr = 0):
    """C = A @ B, one ``BLOCK_M x BLOCK_N`` tile per program; ``GROUP_M > 0``: a 1-D grid numbered by groups."""
    if GROUP_M == 0:  # a 2-D grid: axis 0 counts the rows of tiles, axis 1 the columns
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if MISTAKE == PROGRAM_IDS_SWAPPED:
            pid_m = tl.program_id(1)
            pid_n = tl.program_id(0)
    else:
        pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    sam, sak, sbk, sbn, scm, scn = stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn
    if MISTAKE == A_STRIDES_SWAPPED:
        sam, sak = stride_ak, stride_am
    if MISTAKE == B_STRIDES_SWAPPED:
        sbk, sbn = stride_bn, stride_bk
    if MISTAKE == C_STRIDES_SWAPPED:
        scm, scn = stride_cn, stride_cm
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # rows past M (columns past N) wrap around to valid addresses; their results are never stored
    a_ptrs = a_ptr + (offs_m % M)[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + (offs_n % N)[None, :] * sbn
    sum_type = c_ptr.dtype.element_ty if MISTAKE == SIXTEEN_BIT_SUMS else tl.float32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=sum_type)
    steps = tl.cdiv(K, BLOCK_K)
    if MISTAKE == SHORT_K_LOOP:
        steps = K // BLOCK_K
    for k in range(0, steps):
        k_left = K - k * BLOCK_K  # what is left of K: all of BLOCK_K except in the last step
        if MISTAKE == NO_K_MASK:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, out_dtype=sum_type)  # 16-bit products, float32 sums
        if MISTAKE != POINTERS_NOT_ADVANCED:
            a_ptrs += BLOCK_K * stride_ak  # (a kernel with swapped strides still moves along K correctly)
            b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * scm + offs_n[None, :] * scn
    inside = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if MISTAKE == STORE_MASK_ROWS_ONLY:
        inside = (offs_m[:, None] < M) & (offs_n[None, :] >= 0)
    if MISTAKE == STORE_MASK_COLUMNS_ONLY:
        inside = (offs_m[:, None] >= 0) & (offs_n[None, :] < N)
    if MISTAKE == NO_STORE_MASK:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=inside)


@triton.jit
def probe_kernel(out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                 TILE_OF: tl.constexpr, NUMBERING: tl.constexpr = 0):
    """Store ``TILE_OF(program id, ...)``, the tile a numbering gives each program, as two int32 per program.
    ``NUMBERING`` > 0 passes a mistake's code to the lab's :func:`grouped_tile`."""
    tile_id = tl.program_id(0)
    if NUMBERING == 0:
        pid_m, pid_n = TILE_OF(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    else:
        pid_m, pid_n = TILE_OF(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M, NUMBERING)
    tl.store(out_ptr + 2 * tile_id, pid_m)
    tl.store(out_ptr + 2 * tile_id + 1, pid_n)


def launch(kernel, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, grid: Sequence[int], config: Mapping):
    """``kernel[grid](a, b, c, M, N, K, the six strides, **config)``: the launch of a kernel with the signature of
    :func:`matmul_kernel`; returns what Triton returns (the compiled kernel, on a GPU)."""
    (m, k), n = a.shape, b.shape[1]
    return kernel[tuple(grid)](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                               c.stride(1), **config)


def tiles(m: int, n: int, block_m: int, block_n: int) -> tuple[int, int]:
    """How many tiles of ``block_m x block_n`` cover an ``m x n`` matrix, along its rows and its columns."""
    return triton.cdiv(m, block_m), triton.cdiv(n, block_n)


def blocked_grid(m: int, n: int, block_m: int, block_n: int) -> tuple[int, int]:
    """The 2-D grid of the blocked kernel: one program per tile, axis 0 down the rows of tiles."""
    return tiles(m, n, block_m, block_n)


def grouped_grid(m: int, n: int, block_m: int, block_n: int) -> tuple[int]:
    """The 1-D grid of the grouped kernel: one program per tile."""
    tiles_m, tiles_n = tiles(m, n, block_m, block_n)
    return (tiles_m * tiles_n,)


def grouped_order(m: int, n: int, block_m: int, block_n: int, group_m: int) -> list[tuple[int, int]]:
    """The tile ``(pid_m, pid_n)`` of each program id in grouped order: :func:`grouped_tile` in plain Python."""
    tiles_m, tiles_n = tiles(m, n, block_m, block_n)
    order = []
    for tile_id in range(tiles_m * tiles_n):
        first_m = tile_id // (group_m * tiles_n) * group_m
        rows_in_group = min(tiles_m - first_m, group_m)
        within = tile_id % (group_m * tiles_n)
        order.append((first_m + within % rows_in_group, within // rows_in_group))
    return order


def grid_order(m: int, n: int, block_m: int, block_n: int) -> list[tuple[int, int]]:
    """The tiles in the order a 2-D grid of :func:`blocked_grid` numbers its programs: axis 0 varies fastest, so
    the ids go down the first column of tiles, then the next."""
    tiles_m, tiles_n = tiles(m, n, block_m, block_n)
    return [(pid_m, pid_n) for pid_n in range(tiles_n) for pid_m in range(tiles_m)]


def row_major_order(m: int, n: int, block_m: int, block_n: int) -> list[tuple[int, int]]:
    """The tiles row by row: the order of a 1-D grid whose id is split as ``pid_m = id // tiles_n``."""
    tiles_m, tiles_n = tiles(m, n, block_m, block_n)
    return [(pid_m, pid_n) for pid_m in range(tiles_m) for pid_n in range(tiles_n)]


def wave_panels(order: Sequence[tuple[int, int]], programs: int) -> tuple[int, int]:
    """``(row panels of A, column panels of B)``: how many distinct ones the first ``programs`` tiles of ``order``
    read (a tile ``(i, j)`` reads the ``BLOCK_M x K`` row panel ``i`` of A and the ``K x BLOCK_N`` column panel
    ``j`` of B)."""
    wave = list(order)[:programs]
    return len({i for i, _ in wave}), len({j for _, j in wave})


def wave_bytes(order: Sequence[tuple[int, int]], programs: int, k: int, block_m: int, block_n: int,
               element_bytes: int = 2) -> int:
    """Bytes of the distinct panels of A and B the first ``programs`` tiles of ``order`` read: what that wave must
    fetch from memory at the least, if every panel it shares stays in L2 while the programs use it."""
    rows, cols = wave_panels(order, programs)
    return (rows * block_m + cols * block_n) * k * element_bytes


def pipeline_shared_bytes(block_m: int, block_n: int, block_k: int, num_stages: int, element_bytes: int = 2) -> int:
    """Shared memory of a software-pipelined K loop: ``num_stages`` slots, each holding a ``BLOCK_M x BLOCK_K``
    tile of A and a ``BLOCK_K x BLOCK_N`` tile of B."""
    return num_stages * (block_m + block_n) * block_k * element_bytes
