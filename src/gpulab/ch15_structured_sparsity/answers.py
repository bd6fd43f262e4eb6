"""Worked answers to the exercises of chapter 15 (``notebooks/15_structured_sparsity.ipynb``).

Every number is computed when the answer is shown: from the chapter's format arithmetic (:mod:`.patterns`), its
pruning set-up (:mod:`.pruning`, :mod:`.plan`), the datasheet rows of :mod:`gpulab.core.specs`, and the recordings
of every GPU that ran the chapter. Nothing here trains a network or times a product.
"""

from __future__ import annotations

import math

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch15_structured_sparsity import patterns, plan, speedup
from gpulab.core import budget, recordings, specs
from gpulab.core.printing import Answer

T4 = specs.gpu(budget.CLASS_GPU)


def _describe(name: str, size: patterns.CompressedSize) -> str:
    return (f"- {name}: {size.kept} of {size.group} values of {size.value_bits} bits kept, {size.index_bits} "
            f"index bit{'s' if size.index_bits > 1 else ''} per kept value, {size.metadata_bits} bit"
            f"{'s' if size.metadata_bits > 1 else ''} of metadata per "
            f"group: {size.metadata_overhead:.1%} on top of the kept values, {size.fraction_of_dense:.2%} of the dense "
            "size")


def exercise_1() -> Answer:
    one_two, four_eight, two_four = (patterns.compressed_size(32, 1, 2), patterns.compressed_size(8, 4, 8),
                                     patterns.compressed_size(8))
    lines = ["`sparsity.compressed_size(value_bits, kept, group)` (here `patterns.compressed_size`):",
             _describe("1:2, float32", one_two), _describe("4:8, 8-bit", four_eight),
             _describe("2:4, 8-bit, for comparison", two_four),
             f"4:8 needs more metadata per kept value, {four_eight.index_bits} bits against {one_two.index_bits}: an "
             "index names one position of the group, so it takes ceil(log2(group)) bits, and a longer group needs a "
             "longer index. Narrow values make it weigh more: "
             f"{four_eight.index_bits} bits on an 8-bit value is {four_eight.metadata_overhead:.1%}, where 1:2's "
             f"single bit on a 32-bit value is {one_two.metadata_overhead:.1%}."]
    return Answer("Answer to exercise 1", tuple(lines))


def _steps_per_epoch() -> int:
    data = mlp.load_digits_split(seed=0)
    return math.ceil(len(data["y_train"]) / 64)  # pruning_accuracy's batch of 64


def exercise_2() -> Answer:
    steps = _steps_per_epoch()
    seeds = len(plan.FULL["seeds"])
    lines = ["Run `pruning.pruning_accuracy(HIDDEN, epochs=EPOCHS, finetune_epochs=k, seeds=SEEDS)` for k = 1, 3 "
             "and 10, summarise each with `pruning.summarize_pruning`, and set the fine-tuned accuracy of each mask "
             "beside its accuracy right after pruning (k = 0, the table's 'pruned' column) and the dense network's.",
             f"An epoch of the digits' training images is {steps} steps of SGD at a batch of 64: k = 1, 3 and 10 are "
             f"{steps}, {3 * steps} and {10 * steps} steps, against {plan.FULL['finetune_epochs'] * steps} for the "
             f"page's {plan.FULL['finetune_epochs']} epochs. Each run trains {seeds} seeds x (dense + 4 x k) epochs, "
             f"seconds on one CPU thread (about {plan.EPOCH_SECONDS * 1e3:.0f} ms an epoch on the book's build "
             "machine).",
             "What to look for: the mask that lost least when pruned (magnitude) starts closest and needs the fewest "
             "steps; the random mask starts far lower, and how fast it closes the gap says how much of the result "
             "the retraining does rather than the choice of mask. If every mask is within the noise of the dense "
             "network after a few epochs, the retraining does most of the work on this task; the mask matters most "
             "when the retraining budget is short."]
    return Answer("Answer to exercise 2", tuple(lines))


def exercise_3() -> Answer:
    sizes = [64, *plan.FULL["hidden"], 10]
    weights = sum(a * b for a, b in zip(sizes, sizes[1:], strict=False))
    total = plan.FULL["epochs"] + plan.FULL["finetune_epochs"]
    lines = ["Build `mlp.torch_mlp(sizes, seed)`, draw one mask per layer with "
             "`patterns.random_2_4_mask(layer.weight)`, multiply the weights by it, and train with "
             f"`pruning.train_with_masks(model, data, epochs={total}, batch=64, learning_rate=0.05, seed=seed, "
             "masks=masks)`: the masks zero the gradients before each step and the weights after it, so the network "
             "is 2:4 from the first step to the last.",
             f"The recipe trains {plan.FULL['epochs']} epochs dense and {plan.FULL['finetune_epochs']} sparse, "
             f"{total} in all, so compare after {total}, over the same seeds, with the 2:4 rows of the page's table. "
             f"The MLP {sizes} has {weights:,} weights; both keep {weights // 2:,}.",
             "What to look for: whether a network that was never dense catches up. The recipe's magnitude mask keeps "
             "the weights that dense training made large; a fixed random mask from the start gives the optimizer a "
             "smaller network to fill from scratch. On a task this easy the difference may vanish in the noise; "
             "Mishra et al.'s recipe, dense first, is what holds the accuracy of large networks."]
    return Answer("Answer to exercise 3", tuple(lines))


def _floor(run: recordings.Recording) -> tuple[dict, dict] | None:
    """The fastest sparse product of a run, and the dense product at the same point."""
    sparse = [r for r in run.rows if r.get("status") == "ok" and r.get("backend") in speedup.BACKENDS]
    if not sparse:
        return None
    fastest = min(sparse, key=lambda r: r["seconds"])
    dense = next(r for r in run.rows if r.get("status") == "ok" and r["backend"] == speedup.DENSE_BACKEND
                 and (r["dtype"], r["n"], r["tokens"]) == (fastest["dtype"], fastest["n"], fastest["tokens"]))
    return fastest, dense


def exercise_4() -> Answer:
    lines = ["Profile a few calls of `F.linear(X, Ws)` after a warm-up (`profiling.profile_calls`, as "
             "`tensor_cores.kernels_run` does) and list the kernels with their times (`profiling.device_kernels`): "
             "besides the sparse GEMM, look for small kernels (a transpose or copy of the output, a memset of the "
             "workspace). Then add up the kernels' times and compare with the call's time: what is left is the GPU "
             "waiting for the host, which on the CPU side shows as cuSPARSELt's descriptor and plan calls."]
    for run in recordings.recorded("sparsity_linear_speedup"):
        found = _floor(run)
        if found:
            fastest, dense = found
            lines.append(f"The floor to explain, from the {run.short_label}'s recording: no sparse call took less "
                         f"than {fastest['seconds'] * 1e6:.0f} us ({fastest['backend']}, n = {fastest['n']:,}, "
                         f"{fastest['tokens']:,} tokens), where the dense product took {dense['seconds'] * 1e6:.0f} "
                         f"us: if the kernels add up to little more than the dense one's time, the other "
                         f"{(fastest['seconds'] - dense['seconds']) * 1e6:.0f} us are idle, and the idle time is the "
                         "floor.")
    major, minor = speedup.SPARSE_TENSOR_CORES_FROM
    lines.append(f"On a T4 (compute capability {T4.compute_capability}) there is nothing to profile: sparse tensor "
                 f"cores start at {major}.{minor}, and PyTorch refuses the 2:4 product. Colab's L4 or A100 have them.")
    return Answer("Answer to exercise 4", tuple(lines))


def exercise_5() -> Answer:
    lines = ["Compressing the weight costs `compress_seconds` once; each product then saves the dense time minus the "
             "sparse time. It pays for itself after compress / (dense - sparse) products, where that difference is "
             "positive. At the largest weight and the most tokens of each recording:"]
    for run in recordings.recorded("sparsity_linear_speedup"):
        ok = [r for r in run.rows if r.get("status") == "ok"]
        n, tokens = max(r["n"] for r in ok), max(r["tokens"] for r in ok)
        dense = {r["dtype"]: r for r in ok if (r["n"], r["tokens"], r["backend"]) == (n, tokens, speedup.DENSE_BACKEND)}
        for r in ok:
            if (r["n"], r["tokens"]) != (n, tokens) or r["backend"] not in speedup.BACKENDS:
                continue
            saved = dense[r["dtype"]]["seconds"] - r["seconds"]
            verdict = (f"**{math.ceil(r['compress_seconds'] / saved)}** products" if saved > 0
                       else "never: the sparse product is not faster")
            lines.append(f"- {run.short_label}, {r['backend']}, {r['dtype']}, n = {n:,}, {tokens:,} tokens: "
                         f"compress {r['compress_seconds'] * 1e3:.1f} ms, dense "
                         f"{dense[r['dtype']]['seconds'] * 1e3:.1f} ms, sparse {r['seconds'] * 1e3:.1f} ms: {verdict}")
    lines.append("For inference, where one weight serves many requests, that is nothing; in training, where the "
                 "weight changes at every step, it is paid at every step, against one step's saving.")
    return Answer("Answer to exercise 5", tuple(lines))
