"""Worked answers to the exercises of chapter 13 (``notebooks/13_memory_bound_layers_and_fusion.ipynb``).

Every number is computed when the answer is shown: from the chapter's byte and operation counts
(:mod:`.fusion`), its blocked attention (:mod:`.blocked_attention`), NVRTC's report on its kernel, the datasheet rows
of :mod:`gpulab.core.specs`, and the recordings of every GPU that ran the chapter. Nothing here runs an experiment.
"""

from __future__ import annotations

import math

from gpulab.ch08_memory_hierarchy import memory
from gpulab.ch13_memory_bound_layers_and_fusion import fusion, plan
from gpulab.ch13_memory_bound_layers_and_fusion.sweeps import roofline_of
from gpulab.core import budget, occupancy, recordings, specs
from gpulab.core.printing import Answer
from gpulab.kernels import cuda_c

T4 = specs.gpu(budget.CLASS_GPU)
SILU = fusion.Op("silu", "SiLU", 4, 1, 1, formula="x / (1 + exp(-x)): a negation, an exp, an add, a division")


def _row(run: recordings.Recording, **match) -> dict:
    return next(r for r in run.rows if all(r.get(k) == v for k, v in match.items()))


def _t4_ms(nbytes: float) -> float:
    """Milliseconds a T4 needs to move ``nbytes`` at its datasheet bandwidth: the best a kernel can do."""
    return nbytes / (T4.bandwidth_gb_s * 1e9) * 1e3


def exercise_1() -> Answer:
    intensity = SILU.flops_per_element / ((SILU.reads + SILU.writes) * 4)
    gelu = fusion.op_cost("gelu", 1)
    lines = [f"Count it as `fusion.OPS` counts GELU: SiLU is {SILU.formula}, **{SILU.flops_per_element}** operations "
             f"per element (GELU counts {gelu.flops:.0f}), for 4 bytes read and 4 written: an intensity of "
             f"**{intensity:.2f}** FLOP/byte, against GELU's {gelu.intensity:.3f}.",
             "To measure it, add `fusion.Op(\"silu\", \"SiLU\", 4, 1, 1)` to `fusion.OPS` and an entry "
             "`\"silu\": (lambda: F.silu(x), lambda: F.silu(x64))` to the layers of `sweeps.pointwise_roofline`, "
             "then run the roofline cell again."]
    for run in recordings.recorded("fusion_roofline"):
        roof, _ = roofline_of(run.rows, run.device_name)
        measured = _row(run, op="GELU")
        lines.append(f"- {run.short_label}: its measured float32 ridge is {roof.ridge('float32'):.1f} FLOP/byte, "
                     f"{roof.ridge('float32') / intensity:.0f} times SiLU's intensity, so SiLU is memory-bound and "
                     f"should take GELU's time, which moved its bytes at {measured['fraction_of_copy']:.0%} of the "
                     "copy: expect SiLU within a few percent of that.")
    n = 2**26
    lines.append(f"On a T4, {n:,} elements (the recorded size) move {8 * n / 2**20:.0f} MiB, at least "
                 f"{_t4_ms(8 * n):.1f} ms at its {T4.bandwidth_gb_s:.0f} GB/s, for SiLU and GELU alike: in a "
                 "memory-bound layer the exp and the erf hide under the bytes.")
    return Answer("Answer to exercise 1", tuple(lines))


def exercise_2() -> Answer:
    forward = fusion.chain_cost("bias_gelu_dropout", 1).bytes
    fused_forward = fusion.chain_cost("bias_gelu_dropout", 1, fused=True).bytes
    # the backward pass, float32: dropout's backward reads dy and the mask, writes its gradient; GELU's reads that and
    # its saved input x + b, writes its gradient; the bias's gradient sums it over the rows (a read)
    eager_backward = (4 + 1 + 4) + (4 + 4 + 4) + 4
    fused_backward = 4 + 4 + 1 + 4  # dy, the saved x, the mask; dx written; db summed in the same pass
    lines = [
        "The backward pass needs, per element, the output's gradient dy, the input of GELU (x + b, or x and the "
        "bias, to recompute it) for GELU's derivative, and which elements dropout kept. So the forward pass saves "
        "x + b (4 bytes) and PyTorch's one-byte mask.",
        f"- eager: dropout's backward reads dy and the mask and writes a gradient (9 bytes), GELU's reads that and x + "
        f"b and writes its own (12), the bias's gradient sums it over the rows (4): **{eager_backward}** bytes per "
        f"element, against the forward pass's {forward:.0f};",
        f"- fused: one kernel reads dy, x and the mask, writes dx and accumulates db: **{fused_backward}** bytes, "
        f"{eager_backward / fused_backward:.1f}x fewer.",
        f"A mask recomputed from the seed, as the hand-fused kernel's hash allows, saves 1 byte of the fused "
        f"backward's {fused_backward} ({1 / fused_backward:.0%}) and the byte the forward would write besides its "
        f"{fused_forward:.0f} ({1 / (fused_forward + 1):.0%} of it); and it frees the memory of one byte per "
        f"activation element for as long as the step holds its activations, which often matters more."]
    for run in recordings.recorded("fusion_hand_kernel"):
        copy = _row(run, kind="copy")
        per_byte = run.params["rows"] * run.params["cols"] / (copy["gbytes_per_s"] * 1e9) * 1e3
        lines.append(f"At the copy's rate on the {run.short_label} ({copy['gbytes_per_s']:,.0f} GB/s), the "
                     f"{run.params['rows']:,} x {run.params['cols']:,} matrix of the race would take "
                     f"{eager_backward * per_byte:.1f} ms backward eagerly, {fused_backward * per_byte:.1f} ms fused.")
    return Answer("Answer to exercise 2", tuple(lines))


def _registers(unroll: int) -> int:
    report = cuda_c.compile_report(fusion.KERNEL, arch="sm_75", defines={"UNROLL": unroll})
    return report.resources[fusion.KERNEL_FUNCTION].registers


def _short(needed_kib: float, fit: dict[int, int]) -> str:
    """The (UNROLL, blocks per SM) combinations whose bytes in flight per SM fall short of ``needed_kib``."""
    short = [f"{u} at {b}" for u in fit for b in (1, 4)
             if min(b, fit[u]) * fusion.THREADS_PER_BLOCK * u * 16 / 1024 < needed_kib]
    return ", ".join(short) or "none"


def exercise_3() -> Answer:
    sm = occupancy.limits(T4.compute_capability)
    threads = fusion.THREADS_PER_BLOCK
    registers = {u: _registers(u) for u in (1, 2, 4, 8)}
    fit = {u: occupancy.theoretical(threads, registers[u], 0, sm).blocks_per_sm for u in registers}
    lines = ["`cuda_c.compile_report(fusion.KERNEL, defines={\"UNROLL\": u})` gives the registers per thread; here "
             f"for a T4 (sm_75), with the blocks of {threads} threads its SM then holds at once and the bytes each "
             "block has in flight (threads x UNROLL x 16):",
             *(f"- UNROLL {u}: {registers[u]} registers, {fit[u]} blocks per SM, {threads * u * 16 // 1024} KiB per "
               "block" for u in registers)]
    for run in recordings.recorded("memory_bytes_in_flight"):
        latency, row = memory.unloaded_latency(run.rows), specs.find(run.device_name)
        if row is None:
            continue
        needed = {name: gpu.bandwidth_gb_s * 1e9 * latency / gpu.sms / 1024 for name, gpu in
                  ((run.short_label, row), ("T4", T4))}
        lines.append(f"Little's law: an SM needs bandwidth x latency / SMs in flight to keep the memory busy. With the "
                     f"{run.short_label}'s measured latency ({latency * 1e9:.0f} ns, chapter 08), "
                     f"{needed[run.short_label]:.0f} KiB on it; on a T4, if its latency is similar, "
                     f"{needed['T4']:.0f} KiB. Short of that (UNROLL at blocks per SM): on the {run.short_label} "
                     f"{_short(needed[run.short_label], fit)}; on a T4 {_short(needed['T4'], fit)}. Those should fall "
                     "short of the copy; the others should reach it, more bytes in flight adding nothing.")
    for run in recordings.recorded("fusion_hand_kernel"):
        four, eight = (_row(run, kind="CUDA C", approximate="none", blocks_per_sm=b) for b in (4, 8))
        lines.append(f"The {run.short_label}'s recording (UNROLL 4) agrees: 8 blocks per SM instead of 4 changed the "
                     f"bandwidth by {eight['gbytes_per_s'] / four['gbytes_per_s'] - 1:+.1%}.")
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4() -> Answer:
    lines = ["Set `os.environ[\"TORCH_LOGS\"] = \"output_code\"` before importing torch (or run the notebook with "
             "the variable set), call the compiled chain once, and read the Triton kernel it prints "
             "(`triton_poi_fused_...`). Look for three things:",
             "- the random numbers: a `tl.rand(seed, offset)` per element, Triton's Philox (ten rounds of "
             "multiplications), against the hand kernel's two-multiply hash;",
             "- the loads and stores: `tl.load(in_ptr0 + (x0), xmask)` over an `XBLOCK` of elements; whether they "
             "become 16-byte accesses depends on alignment and on the index arithmetic the compiler can prove;",
             "- what the kernel writes besides the output: a mask or the random numbers would add bytes."]
    hands = {run.device_name: run for run in recordings.recorded("fusion_hand_kernel")}
    for compiled in recordings.recorded("fusion_compile"):
        hand = hands.get(compiled.device_name)
        ran = _row(compiled, chain="bias_gelu_dropout", mode="torch.compile")
        if hand is None or ran.get("status") != "ok":
            continue
        best = max((r for r in hand.rows if r["kind"] == "CUDA C"), key=lambda r: r["fraction_of_copy"])
        lines.append(f"On the {compiled.short_label} the compiled chain reached {ran['fraction_of_copy']:.0%} of the "
                     f"copy, the best hand kernel {best['fraction_of_copy']:.0%}: with the same 8 bytes per element, "
                     "the gap is instructions per element, so change the random numbers first.")
    extra = 8 + 4 + 4  # the compiled pass, plus a float32 random tensor written by a separate kernel and read back
    lines.append(f"`torch._inductor.config.fallback_random = True` draws the random numbers with PyTorch's own "
                 f"generator, as eager does, in a kernel of its own: the fused pass then reads them, about {extra} "
                 f"bytes per element in all instead of 8, so expect it slower, {extra / 8:.0f}x the bytes if both "
                 "kernels run at the copy's rate.")
    return Answer("Answer to exercise 4", tuple(lines))


def exercise_5() -> Answer:
    float32, bfloat16 = 2 * 4, 2 * 2
    lines = [f"Reading and writing 2-byte values moves **{bfloat16}** bytes per element instead of {float32} (the "
             "bias, one row, comes from cache; the arithmetic stays float32 in registers). The kernel is memory-bound "
             "either way, so it should reach the same share of the copy, at least the target of "
             f"{fusion.TARGET_FRACTION:.0%}, in GB/s: then it processes {float32 // bfloat16} times as many elements "
             "per second.",
             "The changes: load eight bfloat16 values as one 16-byte `uint4` (or four as an 8-byte `uint2`), convert "
             "each with `__bfloat162float`, compute in float32 as now, and round back with `__float2bfloat16`."]
    for run in recordings.recorded("fusion_hand_kernel"):
        copy = _row(run, kind="copy")
        n = run.params["rows"] * run.params["cols"]
        target = fusion.TARGET_FRACTION * copy["gbytes_per_s"] * 1e9
        best = max((r for r in run.rows if r["kind"] == "CUDA C"), key=lambda r: r["gbytes_per_s"])
        lines.append(f"- {run.short_label}: float32 took {best['seconds'] * 1e3:.3f} ms for {n:,} elements; bfloat16 "
                     f"at the target's {target / 1e9:,.0f} GB/s would take {bfloat16 * n / target * 1e3:.3f} ms.")
    n = plan.FULL["hand_rows"] * plan.FULL["hand_cols"]
    lines.append(f"On a T4, {n:,} elements in bfloat16 move {bfloat16 * n / 2**30:.0f} GiB, at least "
                 f"{_t4_ms(bfloat16 * n):.1f} ms at its datasheet bandwidth (float32: {_t4_ms(float32 * n):.1f} ms).")
    return Answer("Answer to exercise 5", tuple(lines))


def exercise_6() -> Answer:
    n, d, block = 4096, 64, 64
    gemms = 4 * n * n * d  # S = Q K^T and O = P V: 2 N^2 d each
    pairs = (n // block) ** 2  # (query block, key block) pairs
    rescale = pairs * block * (d + 2)  # alpha times O (block x d), alpha times l, and alpha itself, per pair
    lines = [f"For N = {n:,}, d = {d} and blocks of {block}, `blocked_attention` visits {pairs:,} pairs of a query "
             f"block and a key block. In each it rescales the {block} x {d} partial output and the {block} running "
             f"sums by alpha = exp(m - m'), and computes the {block} alphas: about {block * (d + 2):,} operations.",
             f"In all {rescale:,} operations, against {gemms:,} FLOP for the two GEMMs (4 N^2 d): "
             f"**{rescale / gemms:.2%}**. The share is (d + 2) / (4 d B_k), about 1 / (4 B_k), whatever N.",
             "Not worth worrying about in the arithmetic. What costs FlashAttention time instead is the exp of every "
             "score, which the naive attention pays too, and the code that keeps the tensor cores fed; skipping the "
             "rescale when the maximum did not grow saves almost nothing."]
    return Answer("Answer to exercise 6", tuple(lines))


def exercise_7() -> Answer:
    lines = ["With equal blocks for queries and keys, causal attention needs score (i, j) only for key j <= query i. "
             "A key block whose first key comes after the query block's last query is all masked: the loop over "
             "key blocks can stop at the diagonal block. Blocks on the diagonal are computed with the mask applied "
             "inside; blocks below it need no mask at all.",
             "With T blocks per side, T(T - 1)/2 of the T^2 block pairs are skipped: a share of (T - 1)/(2T), which "
             "tends to half of the work for long sequences."]
    block = 128
    for n in (1024, 8192, 32768):
        blocks = math.ceil(n / block)
        lines.append(f"- N = {n:,} in blocks of {block}: T = {blocks}, {blocks * (blocks - 1) // 2:,} of "
                     f"{blocks * blocks:,} block pairs skipped, {(blocks - 1) / (2 * blocks):.1%} of the work.")
    return Answer("Answer to exercise 7", tuple(lines))
