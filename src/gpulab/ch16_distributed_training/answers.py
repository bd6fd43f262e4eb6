"""Worked answers to the exercises of chapter 16 (``notebooks/16_distributed_training.ipynb``).

Every number is computed when the answer is shown: from the chapter's traffic counts and simulator
(:mod:`.distributed`), its MLP's arithmetic (:mod:`gpulab.ch04_mlp_gemms.mlp`), the datasheet rows of
:mod:`gpulab.core.specs`, and the recordings of every GPU that ran the chapter. Exercise 2's all-reduce is written
here and checked by the chapter's simulator on NumPy vectors; nothing here starts a process or times anything.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch16_distributed_training import distributed, plan
from gpulab.ch16_distributed_training.distributed import Message
from gpulab.core import budget, recordings, specs
from gpulab.core.printing import Answer

T4 = specs.gpu(budget.CLASS_GPU)
LATENCY_S, BANDWIDTH = 5e-6, 100e9  # the chapter's illustrative link (its MODEL_LATENCY_S and MODEL_BANDWIDTH)
RESNET50_PARAMETERS, IMAGENET_IMAGES = 25.6e6, 1.28e6  # as the exercise gives them


def exercise_1() -> Answer:
    width, depth = 12288, 96  # GPT-3's width, and its 96 layers (a pipeline needs a layer per worker)
    lines = ["`distributed.parallelism_traffic(width, depth, batch, p)` counts, per worker and step, "
             "2(p - 1)/p x depth x width^2 x 4 bytes for data parallelism (the gradients) and 2 ceil(depth/2) x "
             "2(p - 1)/p x batch x width x 4 for tensor parallelism (the activations). Tensor parallelism sends less "
             "while batch < depth x width / (2 ceil(depth / 2)): about the width itself for an even depth.",
             f"For width {width:,} (GPT-3's, with its {depth} layers), from the function:"]
    for workers in (2, 8, 64):
        rows = {r["strategy"]: r["sent_bytes"] for r in distributed.parallelism_traffic(width, depth, workers, workers)}
        per_sample = rows["tensor"] / workers  # the tensor traffic grows in proportion to the batch
        crossover = rows["data"] / per_sample
        lines.append(f"- p = {workers}: data parallelism sends {rows['data'] / 2**30:,.1f} GiB whatever the batch; "
                     f"tensor parallelism {per_sample / 2**20:.2f} MiB per sample, so it sends less below a global "
                     f"batch of **{crossover:,.0f}** samples")
    lines.append("The number of workers does not move the crossover: both counts carry the same ring factor "
                 "2(p - 1)/p (the batch only has to split evenly). What the workers change is the data-parallel "
                 "batch per worker, and whether one worker can hold the model at all, which is why large models "
                 "use tensor parallelism inside a server whatever the traffic.")
    return Answer("Answer to exercise 1", tuple(lines))


def halving_doubling_rounds(elements: int, workers: int) -> list[list[Message]]:
    """Recursive halving, then doubling: at step k, worker r exchanges half of its current range with r xor 2^k
    (reduce-scatter, adding), then, in reverse order of k, its whole range (all-gather, overwriting)."""
    steps = round(math.log2(workers))
    if 2**steps != workers:
        raise ValueError(f"workers: a power of 2, got {workers}")
    ranges = [(0, elements)] * workers
    rounds = []
    for k in range(steps):  # reduce-scatter: partners share a range; the one whose bit k is 0 keeps the lower half
        kept, messages = [], []
        for r, (start, stop) in enumerate(ranges):
            middle, low = (start + stop) // 2, not (r >> k) & 1
            messages.append(Message(r, r ^ 2**k, *((middle, stop) if low else (start, middle)), add=True))
            kept.append((start, middle) if low else (middle, stop))
        rounds.append(messages)
        ranges = kept
    for k in reversed(range(steps)):  # all-gather: each sends its summed range to its partner, and the ranges merge
        rounds.append([Message(r, r ^ 2**k, *ranges[r], add=False) for r in range(workers)])
        ranges = [(min(ranges[r][0], ranges[r ^ 2**k][0]), max(ranges[r][1], ranges[r ^ 2**k][1]))
                  for r in range(workers)]
    return rounds


def exercise_2() -> Answer:
    workers, elements = 8, 840
    vectors = [np.random.default_rng(r).standard_normal(elements).astype(np.float32) for r in range(workers)]
    run = distributed.simulate(vectors, halving_doubling_rounds(elements, workers))
    total = np.sum(np.asarray(vectors, dtype=np.float64), axis=0)
    error = max(float(np.max(np.abs(v - total)) / np.max(np.abs(total))) for v in run.results)
    size = elements * 4
    lines = ["In reduce-scatter, at step k, partners r and r xor 2^k hold the same range: each keeps one half and "
             "sends the other, which the partner adds; after log2 p steps each worker holds 1/p of the sum. "
             "All-gather undoes it: in reverse order of k each sends its range to the same partner, and the ranges "
             "double. This chapter's `answers.halving_doubling_rounds` writes it as rounds of `distributed.Message`.",
             f"`distributed.simulate` on {workers} workers: every worker ends with the sum (largest relative error "
             f"{error:.1e}), in **{run.rounds}** rounds (2 log2 p), each worker sending "
             f"**{max(run.sent_bytes) / size:.3f} S** (the ring's 2(p - 1)/p = "
             f"{distributed.ring_factor(workers):.3f}), {run.critical_bytes / size:.3f} S carried one round after "
             "another.",
             f"So it has the tree's rounds and the ring's bytes. On the chapter's illustrative link "
             f"({LATENCY_S * 1e6:.0f} us a message, {BANDWIDTH / 1e9:.0f} GB/s), the model rounds x latency + "
             "critical bytes / bandwidth gives:"]
    for nbytes in (8, 2**20, 2**30):
        times = {name: distributed.model_seconds(name, workers, nbytes, LATENCY_S, BANDWIDTH) for name in ("ring",
                                                                                                        "tree")}
        times["halving-doubling"] = run.rounds * LATENCY_S + run.critical_bytes / size * nbytes / BANDWIDTH
        lines.append(f"- {nbytes:,} bytes: " + ", ".join(f"{name} {t * 1e6:,.1f} us" for name, t in times.items()))
    lines.append("It is never slower than either (for a power of 2 workers); NCCL gets a similar effect from its "
                 "pipelined double binary trees.")
    return Answer("Answer to exercise 2", tuple(lines))


def exercise_3() -> Answer:
    batch, processes = plan.FULL["ddp_batch"], 2
    share = batch // processes
    third = Fraction(1, 3)
    weights = (1 / (processes * third), 1 / (processes * (1 - third)))  # per sample, in units of the whole batch's 1/B
    lines = [f"With `reduction=\"sum\"` each rank's loss is the sum over its {share} samples, and DDP averages the two "
             f"ranks' gradients: (sum over rank 0 + sum over rank 1) / {processes}, the whole batch's sum divided by "
             f"{processes}. The whole batch's gradient is the mean, the sum divided by {batch}. So DDP's gradients "
             f"come out **{batch // processes}** times too large: the samples per rank.",
             f"With unequal shares, rank 0 taking a third of the batch, DDP's average of the two means weighs each of "
             f"rank 0's samples by 1/({processes} x B/3) = {float(weights[0]):g}/B and each of rank 1's by "
             f"1/({processes} x 2B/3) = {float(weights[1]):g}/B, instead of 1/B each. No single factor: rank 0's "
             f"samples count {float(weights[0]):.2f} times, rank 1's {float(weights[1]):.2f} times, so the gradient "
             "points elsewhere, and the check's relative difference is of the order of one, not of float32's rounding.",
             f"(With {batch} samples a third is not a whole number: take 24 of 72, say; `ddp.ddp_gradients` refuses "
             "unequal shares on purpose, so the task's slice must be changed by hand.)"]
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4() -> Answer:
    lines = ["Call `ddp.allreduce_bandwidth(NCCL_SIZES, processes=2, backend=\"nccl\", dtype=\"bfloat16\")` beside the "
             "float32 run. The sizes are bytes, so a bfloat16 message of the same size holds twice the elements. The "
             "link moves bytes, and NCCL adds bfloat16 as fast as float32, so the bus bandwidth at the same bytes "
             "should match, within the run-to-run noise.",
             "Then set `os.environ[\"NCCL_ALGO\"] = \"Tree\"`, then `\"Ring\"`, and run it again (the workers inherit "
             "the notebook's environment). With two workers the ring and the tree are nearly the same exchange, one "
             "partner each, so expect small differences; what moves a small message's time is the protocol NCCL "
             "picks (`NCCL_PROTO`) and the call's fixed cost from Python."]
    for run in recordings.recorded("distributed_nccl_allreduce"):
        small, large = min(run.rows, key=lambda r: r["bytes"]), max(run.rows, key=lambda r: r["bytes"])
        lines.append(f"The {run.short_label}'s float32 recording, to compare with: {small['bytes']} bytes took "
                     f"{small['seconds'] * 1e6:.0f} us; {large['bytes'] / 2**30:.0f} GiB reached "
                     f"{large['busbw_gbs']:.0f} GB/s of bus bandwidth.")
    lines.append(f"Two T4s have no NVLink: their all-reduce crosses PCIe {T4.pcie_generation}, at most "
                 f"{T4.pcie_gb_s:.1f} GB/s each way on 16 lanes, the ceiling their bus bandwidth can approach.")
    return Answer("Answer to exercise 4", tuple(lines))


def exercise_5() -> Answer:
    goyal = next(r for r in distributed.large_batch_rows() if r["key"] == "goyal2017accurate")
    gradients = RESNET50_PARAMETERS * 4
    per_step = distributed.ring_factor(goyal["processors"]) * gradients
    steps = IMAGENET_IMAGES / goyal["batch"]
    lines = [f"The gradients: {RESNET50_PARAMETERS / 1e6:.1f} M float32 values, {gradients / 1e6:.1f} MB. A ring "
             f"all-reduce over {goyal['processors']} GPUs makes each send 2(p - 1)/p = "
             f"{distributed.ring_factor(goyal['processors']):.4f} times that: **{per_step / 1e6:.1f} MB** per GPU per "
             "step, and receive as much.",
             f"An epoch of {IMAGENET_IMAGES / 1e6:.2f} M images at a global batch of {goyal['batch']:,} is "
             f"{steps:.2f}, so **{math.ceil(steps)}** steps (the last one short), "
             f"{goyal['batch'] // goyal['processors']} images per GPU each.",
             f"Per epoch that is {math.ceil(steps) * per_step / 1e9:.1f} GB sent by every GPU, whatever the number of "
             "GPUs: the traffic per GPU is set by the model, and the samples per GPU set how much computation hides "
             "it."]
    return Answer("Answer to exercise 5", tuple(lines))


def _gemm_seconds(batch: int, gpu: specs.GPU, precision: str) -> float:
    """A training step's GEMMs of the chapter's MLP at ``batch`` samples, at the book's share of ``gpu``'s peak."""
    work = mlp.step_totals(mlp.training_step_operations(plan.FULL["scaling_sizes"], batch))["gemm"]
    return work / (specs.peak(gpu, precision).ops_per_s * budget.COMPUTE_EFFICIENCY)


def exercise_6() -> Answer:
    lines = ["Time `step` of the chapter's MLP (`ddp._training_step` on one GPU, bfloat16 autocast) with "
             "`timing.measure` at 256 and 1024 samples, then the same with `torch.compile(model, "
             "mode=\"reduce-overhead\")`, which records the step's kernels once and replays them as a CUDA graph."]
    for run in recordings.recorded("distributed_ddp_scaling"):
        row = specs.find(run.device_name)
        rows = {r["batch_per_device"]: r for r in run.rows if r.get("status") == "ok" and r["precision"] == "bfloat16"
                and r["micro_batches"] == 1}
        if row is None or 256 not in rows or 1024 not in rows:
            continue
        small, large = rows[256], rows[1024]
        gemm = _gemm_seconds(256, row, "bfloat16")
        extra = small["ddp_seconds"] - small["single_seconds"]
        lines.append(f"- {run.short_label}: as written, the step took {small['single_seconds'] * 1e3:.2f} ms at 256 "
                     f"and {large['single_seconds'] * 1e3:.2f} ms at 1024, for four times the work: the host sets it. "
                     f"Its GEMMs at {budget.COMPUTE_EFFICIENCY:.0%} of the bfloat16 peak take {gemm * 1e3:.2f} ms at "
                     "256: a replayed step should fall towards that and grow with the work.")
        lines.append(f"- What it does to the efficiency: DDP added {extra * 1e3:.2f} ms to the step at 256 "
                     f"(efficiency {small['efficiency']:.0%}). A step of {gemm * 1e3:.2f} ms with the same addition "
                     f"would give {gemm / (gemm + extra):.0%}: a faster step has less to hide the all-reduce behind, "
                     "so the bfloat16 rows would fall further, unless the all-reduce overlaps the backward pass.")
    t4 = _gemm_seconds(256, T4, "float32")
    lines.append(f"A T4 has no bfloat16 (and float16 would need a GradScaler), and in float32 its GEMMs at 256 samples "
                 f"take {t4 * 1e3:.0f} ms, far above the host's {plan.STEP_HOST_SECONDS * 1e3:.0f} ms or so per step: "
                 "there the step already grows with the work, and a graph saves little.")
    return Answer("Answer to exercise 6", tuple(lines))

