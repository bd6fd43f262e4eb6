"""Chapter 02's sizes in every setting, and the work they make (:class:`gpulab.core.budget.Chapter`).

Nothing in this chapter is timed: every experiment computes a result once and compares it with float64. Its time
on a GPU is the matrix products of the matmul errors, their float64 references and the comparisons on the host;
the sums, the softmaxes and the evidence take a second or two on any GPU.
"""

from __future__ import annotations

from gpulab.ch02_number_formats.rounding import CHECK_ROWS, MATMUL_ARITHMETIC
from gpulab.core import budget

SMALL_EXPERIMENTS_SECONDS = 1.0  # the softmaxes, the evidence's launches (about 4,000: updates, rank-1 products)
ATOMIC_SECONDS = 2e-9  # one add of a running sum: index_add_ into one element, one atomic add after another

FULL = dict(sum_sizes=[int(10 ** (k / 4)) for k in range(8, 29)],
            logits=[1, 2, 4, 6, 7, 8, 10, 11, 12, 16, 32, 64, 80, 84, 86, 88, 89, 96, 128],
            softmax_classes=1000, softmax_batch=64, matmul_sizes=[256, 512, 1024, 2048, 4096, 8192],
            evidence_n=2**24, evidence_matmul_n=1024, evidence_steps=1000)
CLASSES = [
    # matmul errors up to 4096 (their error is flat in n from 256 on; the sums and softmaxes as recorded): a
    # quarter of the comparisons on the host
    {**FULL, "matmul_sizes": [256, 512, 1024, 2048, 4096]},
    FULL,  # the recordings' sizes: well within the budget on a T4
]
CPU = {**FULL, "matmul_sizes": [64, 128, 256, 512, 1024], "evidence_n": 2**20, "evidence_matmul_n": 256}
SMOKE = dict(sum_sizes=[100, 1000, 10_000], logits=[2, 8, 12, 90], softmax_classes=100, softmax_batch=4,
             matmul_sizes=[32, 64], evidence_n=2**12, evidence_matmul_n=32, evidence_steps=20)


def _matmul_error(n: int, arithmetic: str, compared: bool = True) -> list[budget.Work]:
    """rounding.measure_matmul_error: the operands (random, rounded, in float64), the product, its float64
    reference on CHECK_ROWS rows and, if ``compared``, the comparisons on the host (the input's rounding, n x n
    elements, and CHECK_ROWS rows of the product). An arithmetic the GPU lacks is left out, as the experiment
    leaves it out (rounding.available)."""
    precision = MATMUL_ARITHMETIC[arithmetic][2]  # the format it runs as: tf32 emulations run as float32
    return [budget.once("operands: random, rounded, in float64", bytes=(4 * 4 + 8) * n * n, launches=10,
                        requires=precision),
            budget.once(f"matmul {n} in {arithmetic}", flops=2 * n**3, bytes=3 * 4 * n * n, precision=precision,
                        missing="skip", memory_bytes=n * n * (4 * 4 + 8)),
            budget.once(f"float64 reference of {CHECK_ROWS} rows", flops=2 * CHECK_ROWS * n * n, precision="float64",
                        requires=precision, checked_elements=(n * n + CHECK_ROWS * n) if compared else 0)]


def work(sizes: dict) -> list[budget.Work]:
    evidence = 64 * sizes["evidence_n"]  # bytes: rounding.sixteen_bit_evidence's own bound on its memory
    return [
        # formats_summation: the data and the indices, five methods; three running sums (float16, bfloat16,
        # float32) add term by term, one atomic add after another
        *(budget.once(f"sum of {n}", bytes=(2 + 4 + 8) * n, measurements=5) for n in sizes["sum_sizes"]),
        *(budget.once(f"running sums of {n}", least_seconds=3 * n * ATOMIC_SECONDS) for n in sizes["sum_sizes"]),
        # formats_matmul_error: every arithmetic at every size
        *(w for n in sizes["matmul_sizes"] for arithmetic in MATMUL_ARITHMETIC for w in _matmul_error(n, arithmetic)),
        # formats_sixteen_bits: elementwise work, sums and gradients of evidence_n elements, float16 matmuls
        budget.once("evidence: elementwise work, sums, gradients", bytes=evidence, launches=100, memory_bytes=evidence),
        *_matmul_error(sizes["evidence_matmul_n"], "float16", compared=False),
        # formats_softmax and the evidence's thousands of small launches
        budget.host_seconds("softmaxes, the evidence's small launches", SMALL_EXPERIMENTS_SECONDS),
    ]


CHAPTER = budget.Chapter(name="02 Number formats", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=lambda sizes: budget.NOTEBOOK_SECONDS)
