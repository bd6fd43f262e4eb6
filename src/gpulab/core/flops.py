"""Operation and byte counts: how much arithmetic an operation does and how much memory it must touch.

Counts follow the usual conventions: one fused multiply-add is 2 floating-point operations (FLOP),
and the bytes are the fewest that must cross the memory bus: every input read once and every output
written once. A real kernel can move more (re-reads, cache misses), never fewer; so ``flops / bytes``
is the best arithmetic intensity the operation can have.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpulab.core.validation import positive_int, torch_dtype


@dataclass(frozen=True)
class Cost:
    """The work of one operation: floating-point operations and bytes moved to and from memory."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte."""
        return self.flops / self.bytes


def bytes_per_element(dtype: str | torch.dtype) -> int:
    return torch.empty((), dtype=torch_dtype(dtype)).element_size()


def axpy(n: int, dtype: str | torch.dtype = "float32") -> Cost:
    """y <- a*x + y (BLAS level 1): n multiply-adds; read x and y, write y."""
    n = positive_int("n", n)
    return Cost(flops=2 * n, bytes=3 * n * bytes_per_element(dtype))


def dot(n: int, dtype: str | torch.dtype = "float32") -> Cost:
    """x . y (BLAS level 1): n multiply-adds; read x and y."""
    n = positive_int("n", n)
    return Cost(flops=2 * n, bytes=2 * n * bytes_per_element(dtype))


def gemv(m: int, n: int, dtype: str | torch.dtype = "float32") -> Cost:
    """y <- A x + y with A of m x n (BLAS level 2): read A, x and y, write y."""
    m, n = positive_int("m", m), positive_int("n", n)
    return Cost(flops=2 * m * n, bytes=(m * n + n + 2 * m) * bytes_per_element(dtype))


def gemm(m: int, n: int, k: int, dtype: str | torch.dtype = "float32", beta_nonzero: bool = False) -> Cost:
    """C <- A B (+ C) with A of m x k, B of k x n (BLAS level 3): read A and B (and C), write C."""
    m, n, k = positive_int("m", m), positive_int("n", n), positive_int("k", k)
    c_traffic = 2 if beta_nonzero else 1
    return Cost(flops=2 * m * n * k, bytes=(m * k + k * n + c_traffic * m * n) * bytes_per_element(dtype))


def blas(op: str, n: int, dtype: str | torch.dtype = "float32") -> Cost:
    """The cost of the chapter's square-size version of ``op`` ('axpy', 'dot', 'gemv' or 'gemm')."""
    if op == "axpy":
        return axpy(n, dtype)
    if op == "dot":
        return dot(n, dtype)
    if op == "gemv":
        return gemv(n, n, dtype)
    if op == "gemm":
        return gemm(n, n, n, dtype)
    raise ValueError(f"op: unknown operation {op!r}; choose one of axpy, dot, gemv, gemm")


def blocked_gemm(n: int, block: int, dtype: str | torch.dtype = "float32") -> Cost:
    """C <- C + A B computed as n/block rank-``block`` updates, C streaming through memory each time.

    With N = n/block blocks along each dimension, every update reads and writes all of C (2 n^2
    words) and reads one n x block panel of A and of B (2 n block words): in total
    m = (2N + 2) n^2 words for f = 2 n^3 FLOP, so q = f/m ~ n/N = block.
    """
    n, block = positive_int("n", n), positive_int("block", block)
    if n % block:
        raise ValueError(f"block: must divide n={n}, got {block}")
    steps = n // block
    words = steps * (2 * n * n + 2 * n * block)
    return Cost(flops=2 * n**3, bytes=words * bytes_per_element(dtype))
