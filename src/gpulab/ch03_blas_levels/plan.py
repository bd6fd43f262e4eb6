"""Chapter 03's sizes in every setting, and the work they make: the roofline's two ceilings, the BLAS levels at
every size and format, the blocked GEMM (:class:`gpulab.core.budget.Chapter`).

A BLAS call and a copy cost what chapter 01's plan says :func:`gpulab.core.rates.measure_blas` and
:func:`gpulab.core.rates.measure_copy` cost (:func:`gpulab.ch01_cpus_to_gpus.plan.blas`, ``copy``).
"""

from __future__ import annotations

from gpulab.ch01_cpus_to_gpus.plan import BLAS_SETUP_SECONDS, FORMATS, blas, copy
from gpulab.core import budget, flops
from gpulab.core.rates import CHECK_ROWS

BLOCKS = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]

FULL = dict(vector_sizes=[2**k for k in range(16, 29, 2)], matrix_sizes=[256, 512, 1024, 2048, 4096, 8192, 16384],
            dtypes=FORMATS, copy_bytes=2**30, ceiling_n=8192, blocked_n=8192, blocks=BLOCKS)
CLASSES = [
    # every other size (vectors of 65 thousand to 33 million elements, matrices to 2048) still climbs to the
    # bandwidth roof, and gemm reaches the compute roof by 2048 on a T4; bfloat16 left out (its bytes and its
    # tensor-core rate are float16's); the ceiling's matmul of 2048 takes a T4's float64 a tenth of a second; the
    # blocked GEMM of 4096 keeps C (64 MiB) larger than any L2, blocks from 8 to all of it. Most of a T4's time is
    # the L2 flush before each repeat of the small calls (a millisecond, up to 2,000 times)
    dict(vector_sizes=[2**k for k in range(16, 26, 3)], matrix_sizes=[256, 512, 1024, 2048], dtypes=FORMATS[:-1],
         copy_bytes=2**28, ceiling_n=2048, blocked_n=4096, blocks=BLOCKS[:-1]),
    # every format, vectors to 67 million elements, matrices to 4096 (a T4's float64 gemm: a second a call)
    dict(vector_sizes=[2**k for k in range(16, 27, 2)], matrix_sizes=[256, 512, 1024, 2048, 4096], dtypes=FORMATS,
         copy_bytes=2**30, ceiling_n=4096, blocked_n=4096, blocks=BLOCKS[:-1]),
    # the recordings' sizes but the largest matrices (float64 gemms of 16384 take minutes on most GPUs)
    {**FULL, "matrix_sizes": [256, 512, 1024, 2048, 4096, 8192]},
    FULL,
]
CPU = dict(vector_sizes=[2**k for k in range(12, 23, 2)], matrix_sizes=[64, 128, 256, 512, 1024],
           dtypes=["float64", "float32", "bfloat16"], copy_bytes=2**27, ceiling_n=1024, blocked_n=1024,
           blocks=[8, 16, 32, 64, 128, 256, 512, 1024])
SMOKE = dict(vector_sizes=[2**12, 2**14], matrix_sizes=[64, 128], dtypes=["float64", "float32"], copy_bytes=2**22,
             ceiling_n=128, blocked_n=128, blocks=[8, 32, 128])


def blocked(n: int, block: int) -> list[budget.Work]:
    """blas.measure_blocked_gemm in float32: n / block rank updates (a launch each), checked once against float64
    on CHECK_ROWS rows, then timed (each update streams all of C: longer than Python takes to issue it); its host
    time per measurement is rates.measure_blas's."""
    cost = flops.blocked_gemm(n, block, "float32")
    updates = dict(flops=cost.flops, bytes=cost.bytes, launches=n // block + 1, memory_bytes=3 * n * n * (4 + 8))
    return [budget.once(f"{n // block} rank-{block} updates, checked", **updates),
            budget.once(f"float64 reference of {CHECK_ROWS} rows", flops=2 * CHECK_ROWS * n * n, bytes=8 * n * n,
                        precision="float64", checked_elements=CHECK_ROWS * n),
            budget.Work(f"{n // block} rank-{block} updates", extra_seconds=BLAS_SETUP_SECONDS, **updates)]


def work(sizes: dict) -> list[budget.Work]:
    dtypes = sizes["dtypes"]
    return [
        # blas_ceilings: a copy checked and timed (rates.measure_copy), a gemm per format checked and timed
        *copy(sizes["copy_bytes"]),
        *(w for dtype in dtypes for w in blas("gemm", sizes["ceiling_n"], dtype)),
        # blas_levels: axpy and dot at every vector size, gemv and gemm at every matrix size, in every format, each
        # checked and timed (rates.measure_blas)
        *(w for dtype in dtypes for op in ("axpy", "dot", "gemv", "gemm")
          for n in sizes["vector_sizes" if op in ("axpy", "dot") else "matrix_sizes"] for w in blas(op, n, dtype)),
        # blas_blocking: the rank updates of each block size, checked and timed
        *(w for block in sizes["blocks"] for w in blocked(sizes["blocked_n"], block)),
    ]


CHAPTER = budget.Chapter(name="03 BLAS levels", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=lambda sizes: budget.NOTEBOOK_SECONDS)
