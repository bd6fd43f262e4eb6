"""Worked answers to the exercises of chapter 18 (``notebooks/18_flash_attention_and_counters.ipynb``).

Every number is computed when the answer is shown: from the kernels' tile sizes and source
(:mod:`gpulab.kernels.triton_attention`), the tiles a program computes (:func:`.figures.tile_states`), float64
attention on the host, the datasheet rows of :mod:`gpulab.core.specs`, and the recordings of every GPU that ran
the race. Nothing here runs an experiment.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from gpulab.ch18_flash_attention_and_counters import figures
from gpulab.ch18_flash_attention_and_counters.claims import RACE
from gpulab.core import counters, recordings, specs
from gpulab.core.correctness import relative_error
from gpulab.core.precision import MATMUL_TOLERANCE
from gpulab.core.printing import Answer
from gpulab.kernels.triton_attention import forward, measure
from gpulab.kernels.triton_attention.reference import random_inputs, reference_attention

H100 = specs.gpu("H100 SXM5 80GB")


def _computed_share(seq_len: int, block_m: int, block_n: int) -> float:
    """Tiles a causal forward computes, as a share of a full forward's."""
    causal = Counter(s for row in figures.tile_states(seq_len, block_m, block_n) for s in row)
    total = sum(causal.values())
    return (causal["unmasked"] + causal["masked"]) / total


def exercise_1() -> Answer:
    config = forward.CONFIGS[128]
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    lines = [f"Count with `figures.tile_states`, which follows the kernel's loops: a program of {bm} queries computes "
             f"the tiles left of its diagonal without a mask and the {bm // bn} tiles of its diagonal block with one. "
             "Shares of a full forward's tiles:"]
    for n in (1024, 4096, 16384):
        lines.append(f"- {n:,} tokens: {bm} x {bn} tiles {_computed_share(n, bm, bn):.2%}; 64 x 64 tiles "
                     f"{_computed_share(n, 64, 64):.2%}")
    lines.append(f"With `n / {bm}` query blocks the share is `(1 + {bm} / n) / 2`: it tends to the half of the FLOP "
                 "count as the sequence grows, and smaller query blocks bring it closer sooner (the diagonal is "
                 "thinner). The difference is work that is done but not counted: the masked half of each diagonal "
                 "tile, one reason why causal rates can sit below full ones at short lengths. Smaller blocks would "
                 "cost more elsewhere: K and V are loaded once per query block, so halving BLOCK_M doubles their "
                 "traffic (exercise 3).")
    return Answer("Answer to exercise 1", tuple(lines))


def exercise_2(shape: tuple[int, int, int, int] = (1, 2, 256, 64)) -> Answer:
    q, k, v, _ = random_inputs(shape, torch.float64, torch.device("cpu"), seed=1)
    scale = 1 / math.sqrt(shape[-1])
    right, _ = reference_attention(q, k, v, scale=scale)
    wrong, _ = reference_attention(q, k, v, scale=scale * math.log(2))
    error = relative_error(wrong, right)
    lines = ["`tl.exp2(x)` is `2^x = e^(x ln 2)`. With `qk_scale = scale` instead of `scale * log2(e)`, every score "
             f"would be exponentiated as `e^(ln 2 * scale * s)`: the softmax of the scores multiplied by `ln 2 = "
             f"{math.log(2):.3f}`, a flatter distribution over the keys. The running maximum and the "
             "rescaling stay consistent (they use the same base), so nothing overflows and nothing looks wrong; the "
             "output is simply another function.",
             f"How much another: float64 attention with that scale, against the right one, on random inputs of "
             f"shape {shape} (queries spread as in the checks), differs by a relative error of **{error:.2f}**, "
             f"against tolerances of {MATMUL_TOLERANCE['float32']:.0e} (float32) and "
             f"{MATMUL_TOLERANCE['bfloat16']:.0e} (bfloat16): `reference.check_forward` fails at once. The "
             "log-sum-exp the kernel saves would be wrong too, so the backward would recompute a `P` that matches "
             "neither softmax; the gradients' checks fail as well."]
    return Answer("Answer to exercise 2", tuple(lines))


def _forward_bytes(seq_len: int, head_dim: int, block_m: int, element: int = 2) -> tuple[float, float]:
    """HBM bytes per head of the forward: without reuse (each program loads all of K and V) and with every K and V
    tile read from memory once; Q read and O written once, four bytes of log-sum-exp per row, in both."""
    programs = math.ceil(seq_len / block_m)
    once = element * seq_len * head_dim * 2 + 4 * seq_len
    return once + programs * element * 2 * seq_len * head_dim, once + element * 2 * seq_len * head_dim


def exercise_3(seq_len: int = 4096, head_dim: int = 128) -> Answer:
    bm = forward.CONFIGS[head_dim]["BLOCK_M"]
    work = measure.forward_flops(1, 1, seq_len, head_dim, False)
    cold, reused = _forward_bytes(seq_len, head_dim, bm)
    ridge = specs.peak(H100, "bfloat16").ops_per_s / (H100.bandwidth_gb_s * 1e9)
    head_kv = 2 * 2 * seq_len * head_dim
    lines = [f"Per head, at {seq_len:,} tokens and head size {head_dim} in bfloat16, the forward does "
             f"`4 s^2 d` = {work / 1e9:.2f} GFLOP. Its {math.ceil(seq_len / bm)} programs (blocks of {bm} queries) "
             f"each load Q's block once and every K and V tile once.",
             f"- with no reuse from any cache: {cold / 2**20:.1f} MiB from HBM, an intensity of "
             f"**{work / cold:.0f} FLOP/byte** (about `BLOCK_M`: each loaded key meets {bm} queries);",
             f"- with each head's K and V read from HBM once: {reused / 2**20:.2f} MiB, **{work / reused:,.0f} "
             "FLOP/byte**.",
             f"The {H100.name}'s datasheet ridge for bfloat16 is {ridge:.0f} FLOP/byte: without reuse the forward "
             "would sit left of it, bounded by memory; with it, far right. What decides is the L2: the grid's "
             "first dimension is the query block, and a GPU starts programs in the order of their index, first "
             "dimension fastest (in practice, not by contract), so the programs that run together mostly share a "
             "head, and one "
             f"head's K and V are {head_kv / 2**20:.0f} MiB against an L2 of {H100.l2_mb:.0f} MB. The counters tell "
             "the two cases apart: `dram__bytes_read.sum` close to the second count means the L2 served the "
             "re-reads, and `lts__t_bytes.sum` close to the first shows the loads still went through the L2. "
             "The point's intensity against DRAM bytes and against L2 bytes, in the counters' roofline, is this "
             "exercise measured."]
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4(head_dim: int = 128) -> Answer:
    executed = 2 + figures.TRITON_BACKWARD_PRODUCTS
    counted = 2 + figures.COUNTED_BACKWARD_PRODUCTS
    lines = [f"`key_block_step` and `query_block_step` contain {figures.TRITON_BACKWARD_PRODUCTS} `tl.dot` calls "
             "between them: the dK/dV kernel recomputes S, then forms dV, dP and dK; the dQ kernel recomputes S and "
             f"dP again and forms dQ. The count has {figures.COUNTED_BACKWARD_PRODUCTS} (S, dV, dP, dQ, dK): "
             "FlashAttention-2 computes dQ in the key-block program and adds it with atomics, which saves the "
             "second S and dP at the cost of a result that depends on the order of the additions.",
             f"A forward + backward therefore computes {executed} products where the rates count {counted}. If each "
             f"ran at the forward's rate, the counted rate would be the forward's times {counted}/{executed} = "
             f"{counted / executed:.2f}:"]
    for run in recordings.recorded(RACE):
        rows = [r for r in run.rows if r["implementation"] == "triton" and r["head_dim"] == head_dim
                and not r["causal"] and r.get("status") == "ok" and r.get("forward_backward_tflops")]
        if not rows:
            continue
        row = max(rows, key=lambda r: r["seq_len"])
        lines.append(f"- {run.short_label}, {row['seq_len']:,} tokens: forward {row['forward_tflops']:,.0f} TFLOP/s, "
                     f"so {row['forward_tflops'] * counted / executed:,.0f} expected; measured "
                     f"{row['forward_backward_tflops']:,.0f}.")
    lines.append("What is left of the gap is the backward's kernels running slower per product than the forward; "
                 "candidates: three launches, a float32 row sum D read back, and programs that hold more state in "
                 "registers (dK and dV, or dQ, besides the tiles).")
    return Answer("Answer to exercise 4", tuple(lines))


def exercise_5() -> Answer:
    lines = [f"The factor is `{measure.TARGET:.0%} / share` at each point the target covers (head size "
             f"{measure.TARGET_FROM['head_dim']}, from {measure.TARGET_FROM['seq_len']:,} tokens):"]
    for run in recordings.recorded(RACE):
        for p in figures.target_points(run):
            need = measure.TARGET / p["ratio"]
            lines.append(f"- {run.short_label}, {p['seq_len']:,} tokens, {figures.mask_name(p['causal'])}: share "
                         f"{p['ratio']:.1%}, " + (f"{need - 1:.1%} faster needed" if need > 1 else "already met"))
    lines += ["First, load K and V with the Tensor Memory Accelerator (TMA) through tensor descriptors, as the GEMM "
              "ladder's step 4 does: one thread issues a whole tile's copy, which frees the warps from address "
              "arithmetic and load instructions. The compiled code would show it: `figures.compiled_evidence` "
              "would count UTMALDG where the table above counts LDGSTS. Second, overlap the softmax of one tile "
              "with the products of the next (two query blocks per program, or the loop software-pipelined by "
              "hand), which is what FlashAttention-3's ping-pong schedule does; asking Triton 3.6 for warp "
              "specialization gave the GEMM ladder's step 6 no warp-specialized code on Hopper, so check the "
              "compiled code before timing anything. Then run the race again: the fingerprint of the recording "
              "changes with the kernel, and the claims above are checked against the new numbers."]
    return Answer("Answer to exercise 5", tuple(lines))


def _within(ratio: float) -> str:
    inside = abs(ratio - 1) <= counters.TOLERANCE
    return f"{'inside' if inside else 'outside'} the {counters.TOLERANCE:.0%} the counters' table allows"


def exercise_6(seq_len: int = 4096, head_dim: int = 128) -> Answer:
    config = forward.CONFIGS[head_dim]
    share = _computed_share(seq_len, config["BLOCK_M"], config["BLOCK_N"])
    short = _computed_share(1024, config["BLOCK_M"], config["BLOCK_N"])
    lines = ["The tensor-core counters count every operation the tensor cores execute, masked or not: a causal "
             f"forward at {seq_len:,} tokens executes the products of {share:.1%} of a full forward's tiles "
             "(exercise 1), where the book's count takes 50%. So expect the counters' FLOPs at "
             f"**{share / 0.5:.3f}x** the book's count, {_within(share / 0.5)}; at 1,024 tokens it would be "
             f"{short / 0.5:.3f}x, {_within(short / 0.5)}. "
             "A full forward should read 1.00x, plus the softmax's few float32 operations per score (a scale, a "
             "subtraction, a sum, the rescaling), which the counters add from their CUDA-core columns and the "
             f"book does not count: a few against the `4d` = {4 * head_dim} tensor-core FLOPs per score, about "
             f"{4 / (4 * head_dim):.1%} for four. The exponentials run on the special-function units, which none of "
             "the FLOP counters counts."]
    return Answer("Answer to exercise 6", tuple(lines))
