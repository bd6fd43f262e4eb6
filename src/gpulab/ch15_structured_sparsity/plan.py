"""Chapter 15's sizes in every setting, and the work they make: the one place the notebook
``notebooks/15_structured_sparsity.ipynb`` takes its sizes from (:class:`gpulab.core.budget.Chapter`).

The work follows the experiments' code: :func:`.pruning.pruning_accuracy` trains the digits MLP on one CPU thread
(every machine, at full size); :func:`.speedup.orientations` tries four products through each backend (no timing);
:func:`.speedup.linear_speedup` checks, then times, the dense product and each 2:4 backend at every weight size and
token count, in two formats. A GPU older than Ampere (a T4) has no sparse tensor cores: there the two GPU
experiments return at once, saying so, and the chapter's time is the pruning's (``min_capability`` of
:class:`gpulab.core.budget.Work`).
"""

from __future__ import annotations

from gpulab.ch15_structured_sparsity.patterns import compressed_size
from gpulab.ch15_structured_sparsity.speedup import BACKENDS, CHECK_ROWS, SPARSE_TENSOR_CORES_FROM
from gpulab.core import budget, flops
from gpulab.core.budget import Work

FULL = dict(  # the sizes of the H200's recordings
    pattern_shape=[8, 16],  # the small matrix drawn before and after pruning
    hidden=[64, 64],  # the digits MLP: 64 pixels -> 64 -> 64 -> 10 digits; every layer is pruned
    epochs=30, finetune_epochs=30,  # dense training, then retraining as long with the mask fixed
    seeds=list(range(10)),  # independent networks per method, for the run-to-run noise
    weight_sizes=[1024, 4096, 8192, 16384],  # square n x n weights of the sparse-vs-dense layer
    tokens=[256, 1024, 4096, 16384],  # rows of the layer's input X
    sparse_dtypes=["float16", "bfloat16"],
    orientation_n=1024, orientation_tokens=512,  # the products tried with a sparse operand
)

# The lessons of the sweep: a small weight loses to dense at every token count (the sparse call's fixed floor), a
# large one wins from some token count on, and never by 2x. Every candidate keeps the 1,024 weight, a weight of
# 4,096 or more, and token counts from 256 to 16,384; the pruning keeps its epochs (its recovery is the lesson).
CLASSES = [
    # five seeds (the noise is still estimated), one format, weights of 1,024 and 4,096
    {**FULL, "seeds": list(range(5)), "weight_sizes": [1024, 4096], "sparse_dtypes": ["float16"]},
    # ten seeds, one format, weights up to 8,192
    {**FULL, "weight_sizes": [1024, 4096, 8192], "sparse_dtypes": ["float16"]},
    # both formats, weights up to 8,192: all but the largest weight
    {**FULL, "weight_sizes": [1024, 4096, 8192]},
]

CPU = {**FULL, "weight_sizes": [256], "tokens": [256], "orientation_n": 256, "orientation_tokens": 256}
SMOKE = {**FULL, "pattern_shape": [4, 8], "hidden": [16], "epochs": 2, "finetune_epochs": 1, "seeds": [0, 1],
         "weight_sizes": [64], "tokens": [64], "orientation_n": 64, "orientation_tokens": 64}

# One epoch of the digits MLP [64, 64, 64, 10] on one CPU thread: 10 seeds x 150 epochs took 18 s on this 2-core
# machine (the book's build), 12 ms an epoch; scaled by the weights for other widths.
EPOCH_SECONDS, EPOCH_WEIGHTS = 12e-3, 64 * 64 + 64 * 64 + 64 * 10
ORIENTATION_SECONDS = 2.0  # cuSPARSELt's first use, two compressions, eight small products and their references
SPARSE_WEIGHT_SHARE = compressed_size(16).fraction_of_dense  # the 2:4 weight's bytes: values and metadata
# Neither GPU experiment runs below Ampere (a T4): there each returns at once, one row per backend saying why.
SPARSE_CAPABILITY = ".".join(map(str, SPARSE_TENSOR_CORES_FROM))


def _pruning_seconds(s: dict) -> float:
    """Per seed: the dense training, the dense network trained as long again, and each of three masks
    fine-tuned."""
    sizes = [64, *s["hidden"], 10]
    weights = sum(a * b for a, b in zip(sizes, sizes[1:], strict=False))
    epochs = s["epochs"] + 4 * s["finetune_epochs"]
    return len(s["seeds"]) * epochs * EPOCH_SECONDS * max(1.0, weights / EPOCH_WEIGHTS)


def _product(label: str, cost: flops.Cost, n: int, dtype: str, memory: float) -> list[Work]:
    """One point of linear_speedup: the product once and its check (CHECK_ROWS rows in float64 on the GPU, compared
    on the host), then one measurement."""
    size = flops.bytes_per_element(dtype)
    timed = dict(flops=cost.flops, bytes=cost.bytes, precision=dtype, memory_bytes=memory,
                 min_capability=SPARSE_CAPABILITY)
    return [budget.once(f"{label}, checked", **timed),
            budget.once(f"float64 rows of the check, {label}", flops=2 * CHECK_ROWS * n * n,
                        bytes=n * n * (size + 8), precision="float64", checked_elements=CHECK_ROWS * n,
                        min_capability=SPARSE_CAPABILITY),
            Work(label, **timed)]


def _speedup(s: dict) -> list[Work]:
    """linear_speedup: per format and weight, the weight compressed for each backend (once, then timed: one warm-up,
    three repeats, no flush); per token count, the dense product and each backend's (the 2:4 product does half the
    multiplications at the dense rate's double, reads half the weight plus its metadata)."""
    work = []
    for dtype in s["sparse_dtypes"]:
        size = flops.bytes_per_element(dtype)
        for n in s["weight_sizes"]:
            memory = n * n * (3 * 4 + 3 * size + 8)
            work += [Work(f"{backend} compression, n = {n}, {dtype}", bytes=(1 + SPARSE_WEIGHT_SHARE) * n * n * size,
                          warmup=2, repeats=3, flush_l2=False, min_capability=SPARSE_CAPABILITY)
                     for backend in BACKENDS]
            for tokens in s["tokens"]:
                dense = flops.gemm(tokens, n, n, dtype)
                sparse = flops.Cost(dense.flops / 4, 2 * tokens * n * size + SPARSE_WEIGHT_SHARE * n * n * size)
                point = memory + 3 * tokens * n * size
                work += _product(f"dense, n = {n}, {tokens} tokens, {dtype}", dense, n, dtype, point)
                for backend in BACKENDS:
                    work += _product(f"{backend}, n = {n}, {tokens} tokens, {dtype}", sparse, n, dtype, point)
    return work


def work(s: dict) -> list[Work]:
    """The pruning on the CPU (every machine), the orientations (not timed) and linear_speedup."""
    return [budget.host_seconds("pruning_accuracy on one CPU thread", _pruning_seconds(s)),
            Work("orientations", extra_seconds=ORIENTATION_SECONDS, launches=0, min_capability=SPARSE_CAPABILITY),
            *_speedup(s)]


CHAPTER = budget.Chapter(name="15 structured sparsity", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=lambda s: budget.NOTEBOOK_SECONDS)
