"""What chapter 13 states about memory-bound layers, fusion and attention, as claims checked on every recorded GPU
(:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch13_memory_bound_layers_and_fusion import counters, fusion
from gpulab.ch13_memory_bound_layers_and_fusion.sweeps import HORIZONTAL_METHODS, roofline_of
from gpulab.core.claims import Claim, Verdict, same_gpu, verdict
from gpulab.core.counter_figures import top_stall
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

ROOFLINE = "fusion_roofline"
COMPILE = "fusion_compile"
HAND = "fusion_hand_kernel"
HORIZONTAL = "fusion_horizontal"
ATTENTION = "fusion_attention"
EAGER_CHAIN = "bias + GELU + dropout (eager)"
HAND_CHAIN = "bias + GELU + dropout (fused, CUDA C)"


def _layers(run: Recording) -> dict[str, dict]:
    return {r["op"]: r for r in ok_rows(roofline_of(run.rows, run.device_name)[1])}


def _left_of_ridge(run: Recording) -> Verdict:
    roof, layers = roofline_of(run.rows, run.device_name)
    ridge = min(roof.ridge(d) for d in roof.peaks)
    share = max(r["gflops"] * 1e9 / roof.peak("float32") for r in layers)
    most = max(r["intensity"] for r in layers)
    return verdict(most < ridge and share < 0.1, f"intensities up to {most:.2f} FLOP/byte against the lowest ridge, "
                   f"{ridge:.1f}; at most {share:.1%} of the float32 matmul rate")


LEFT_OF_RIDGE = Claim(
    "left_of_ridge", "Every layer and chain lies left of the lowest measured ridge and uses less than a tenth of the "
    "float32 matmul rate, whatever it computes.", ROOFLINE, _left_of_ridge)


def _pointwise_vs_rowwise(run: Recording) -> Verdict:
    layers = _layers(run)
    share = {k: layers[k]["fraction_of_copy"] for k in ("ReLU", "GELU", "LayerNorm", "softmax")}
    holds = min(share["ReLU"], share["GELU"]) >= 0.9 and max(share["LayerNorm"], share["softmax"]) < 0.85
    return verdict(holds, ", ".join(f"{k} {v:.0%}" for k, v in share.items()) + " of the copy")


POINTWISE_VS_ROWWISE = Claim(
    "pointwise_vs_rowwise", "The pointwise layers, ReLU and GELU, reach at least 90% of the copy's bandwidth; the "
    "row-wise layers, LayerNorm and softmax, which must reduce each row before they write it, stay below 85% of it.",
    ROOFLINE, _pointwise_vs_rowwise)


def _gelu_free(run: Recording) -> Verdict:
    layers = _layers(run)
    relu, gelu = layers["ReLU"]["gbytes_per_s"], layers["GELU"]["gbytes_per_s"]
    return verdict(gelu >= 0.95 * relu, f"GELU {gelu:,.0f} GB/s, ReLU {relu:,.0f} GB/s")


GELU_FREE = Claim(
    "gelu_free", "GELU, with an erf per element, moves its bytes within 5% of the rate of ReLU, with one comparison.",
    ROOFLINE, _gelu_free)


def _fused_chain(run: Recording) -> Verdict:
    layers = _layers(run)
    eager, fused = layers[EAGER_CHAIN], layers[HAND_CHAIN]
    right, up = fused["intensity"] / eager["intensity"], fused["gflops"] / eager["gflops"]
    return verdict(up > right, f"{right:.2f}x the intensity, {up:.2f}x the rate (eager at "
                   f"{eager['fraction_of_copy']:.0%} of the copy, fused at {fused['fraction_of_copy']:.0%})")


FUSED_CHAIN = Claim(
    "fused_chain", "The hand-fused chain's point sits further above the eager chain's than it sits to its right: it "
    "moves a third of the bytes, and moves them faster.", ROOFLINE, _fused_chain)


def _chains(run: Recording, chain: str) -> dict[str, dict]:
    return {r["mode"]: r for r in ok_rows(run.rows) if r["chain"] == chain}


def _compile_kernels(run: Recording) -> Verdict:
    gelu, norm = _chains(run, "bias_gelu_dropout"), _chains(run, "add_layer_norm")
    triton = {k: sum(name.startswith("triton") for name in c["torch.compile"]["kernel_names"].split("; "))
              for k, c in (("gelu", gelu), ("norm", norm))}
    holds = (gelu["eager"]["kernels"], norm["eager"]["kernels"]) == (3, 2) and triton == {"gelu": 1, "norm": 1}
    return verdict(holds, f"eager {gelu['eager']['kernels']:g} and {norm['eager']['kernels']:g} kernels; compiled "
                   f"{gelu['torch.compile']['kernels']:g} ({triton['gelu']} Triton) and "
                   f"{norm['torch.compile']['kernels']:g} ({triton['norm']} Triton)")


COMPILE_KERNELS = Claim(
    "compile_kernels", "Eager PyTorch runs bias + GELU + dropout as three kernels and add + LayerNorm as two; "
    "`torch.compile` fuses each chain into a single Triton kernel (plus, for dropout, a small kernel that draws the "
    "seed).", COMPILE, _compile_kernels)


def _speedups(run: Recording, chain: str) -> tuple[float, float, dict]:
    rows = _chains(run, chain)
    eager, fast = rows["eager"], rows["torch.compile"]
    return fast["speedup"], eager["bytes"] / fast["bytes"], fast


def _compile_layer_norm(run: Recording) -> Verdict:
    speedup, predicted, fast = _speedups(run, "add_layer_norm")
    return verdict(speedup > predicted and fast["fraction_of_copy"] >= 0.9,
                   f"{speedup:.2f}x (bytes {predicted:.2f}x), at {fast['fraction_of_copy']:.0%} of the copy")


COMPILE_LAYER_NORM = Claim(
    "compile_layer_norm", "Compiled, residual add + LayerNorm gains more than its bytes predict: its one kernel moves "
    "its bytes at 90% or more of the copy's rate, faster than eager's LayerNorm alone.", COMPILE, _compile_layer_norm)


def _compile_dropout(run: Recording) -> Verdict:
    speedup, predicted, fast = _speedups(run, "bias_gelu_dropout")
    return verdict(speedup < 0.8 * predicted and fast["fraction_of_copy"] < 2 / 3,
                   f"{speedup:.2f}x (bytes {predicted:.2f}x), at {fast['fraction_of_copy']:.0%} of the copy")


COMPILE_DROPOUT = Claim(
    "compile_dropout", "Compiled, bias + GELU + dropout gains much less than its bytes predict (under 80% of their "
    "ratio): its kernel reads once and writes once, but at less than two thirds of the copy's rate.", COMPILE,
    _compile_dropout)


def _hand(run: Recording) -> tuple[list[dict], dict]:
    rows = ok_rows(run.rows)
    kernels = [r for r in rows if r["kind"] == "CUDA C"]
    if not kernels:
        raise KeyError("no CUDA C variant")
    return kernels, {r["kind"]: r for r in rows if r["kind"] != "CUDA C"}


def _hand_target(run: Recording) -> Verdict:
    kernels, _ = _hand(run)
    low = min(kernels, key=lambda r: r["fraction_of_copy"])
    return verdict(low["fraction_of_copy"] >= fusion.TARGET_FRACTION,
                   "; ".join(f"{r['contender']} {r['fraction_of_copy']:.1%}" for r in kernels) + " of the copy")


HAND_TARGET = Claim(
    "hand_target", f"Every variant of the hand-fused kernel moves its bytes at {fusion.TARGET_FRACTION:.0%} or more "
    "of the copy measured in the same run: the target is met.", HAND, _hand_target)


def _gelu_forms(run: Recording) -> Verdict:
    kernels, _ = _hand(run)
    erf = max((r for r in kernels if r["approximate"] == "none"), key=lambda r: r["gbytes_per_s"])
    tanh = max((r for r in kernels if r["approximate"] == "tanh"), key=lambda r: r["gbytes_per_s"])
    four, eight = ([r for r in kernels if r["approximate"] == "none" and r["blocks_per_sm"] == b][0] for b in (4, 8))
    forms, blocks = tanh["gbytes_per_s"] / erf["gbytes_per_s"] - 1, eight["gbytes_per_s"] / four["gbytes_per_s"] - 1
    return verdict(abs(forms) < 0.05 and abs(blocks) < 0.05,
                   f"tanh against erf {forms:+.1%}, 8 blocks per SM against 4 {blocks:+.1%}")


GELU_FORMS = Claim(
    "gelu_forms", "The exact and the tanh forms of GELU differ by less than 5% in bandwidth, and so do 8 blocks per "
    "SM and 4.", HAND, _gelu_forms)


def _hand_beats_bytes(run: Recording) -> Verdict:
    kernels, others = _hand(run)
    best = max(kernels, key=lambda r: r["gbytes_per_s"])
    speedup = others["eager"]["seconds"] / best["seconds"]
    predicted = fusion.chain_cost("bias_gelu_dropout", 1).bytes / 8
    compiled = best["gbytes_per_s"] / others["torch.compile"]["gbytes_per_s"]
    return verdict(speedup > predicted and compiled >= 1.25,
                   f"{speedup:.2f}x eager (bytes {predicted:.2f}x); torch.compile takes {compiled:.2f}x its time")


HAND_BEATS_BYTES = Claim(
    "hand_beats_bytes", "The best hand-fused kernel beats eager PyTorch by more than the ratio of the bytes, 25 to 8, "
    "and `torch.compile`'s kernel takes at least a quarter longer.", HAND, _hand_beats_bytes)


def _horizontal(run: Recording) -> Verdict:
    widths = list(dict.fromkeys(r["d_model"] for r in run.rows))
    steps = {d: {r["method"]: r for r in ok_rows(run.rows) if r["d_model"] == d} for d in widths}
    (loop_s, foreach_s, flat_s), (loop_l, _, flat_l) = ([steps[d][m] for m in HORIZONTAL_METHODS]
                                                        for d in (widths[0], widths[-1]))
    narrow = flat_s["speedup"] >= 10 and loop_s["speedup"] < foreach_s["speedup"] < flat_s["speedup"]
    shrinks = flat_l["speedup"] < flat_s["speedup"] / 3 and loop_l["seconds"] < 2 * loop_s["seconds"]
    return verdict(narrow and shrinks, f"d_model {widths[0]}: foreach {foreach_s['speedup']:.1f}x, flat buffer "
                   f"{flat_s['speedup']:.1f}x; d_model {widths[-1]}: flat buffer {flat_l['speedup']:.1f}x, one "
                   f"kernel per tensor {loop_l['seconds'] / loop_s['seconds']:.2f}x the narrow model's time for "
                   f"{loop_l['elements'] / loop_s['elements']:.1f}x the bytes")


HORIZONTAL_GAIN = Claim(
    "horizontal_gain", "For the narrow model the flat buffer is more than ten times as fast as one kernel per tensor, "
    "with foreach in between; for the wide model the gain shrinks to less than a third of that, because the time of "
    "one kernel per tensor hardly grows with the bytes (less than twice, for many times the bytes): it is a cost "
    "per tensor.", HORIZONTAL, _horizontal)


def _attention(run: Recording) -> dict[tuple[str, int], dict]:
    return {(r["method"], r["seq_len"]): r for r in run.rows}


def _fused_attention(run: Recording) -> Verdict:
    rows, lengths = _attention(run), sorted({r["seq_len"] for r in run.rows})
    both = max(n for n in lengths if all(rows[(m, n)]["status"] == "ok" for m in ("naive", "sdpa")))
    naive_oom = [n for n in lengths if rows[("naive", n)]["status"] != "ok"]
    fused = ("sdpa", "sdpa-flash", "sdpa-efficient")
    ran_there = bool(naive_oom) and all(rows[(m, naive_oom[0])]["status"] == "ok" for m in fused)
    speedup = rows[("naive", both)]["seconds"] / rows[("sdpa", both)]["seconds"]
    return verdict(speedup >= 3 and ran_there,
                   f"at N = {both:,} SDPA ({rows[('sdpa', both)]['backend']}) {speedup:.1f}x the naive speed; naive "
                   f"out of memory from N = {naive_oom[0]:,}" if naive_oom else "naive never ran out of memory")


FUSED_ATTENTION = Claim(
    "fused_attention", "PyTorch's default SDPA is at least three times as fast as the naive attention at the longest "
    "sequence both ran, and at the first length where the naive attention runs out of memory, the flash and "
    "memory-efficient backends and SDPA's own choice still run.", ATTENTION, _fused_attention)


def _math_backend(run: Recording) -> Verdict:
    rows, lengths = _attention(run), sorted({r["seq_len"] for r in run.rows})
    ok = {m: [n for n in lengths if rows[(m, n)]["status"] == "ok"] for m in ("naive", "sdpa-math")}
    longest = max(ok["sdpa-math"])
    slower = rows[("sdpa-math", longest)]["seconds"] / rows[("naive", longest)]["seconds"]
    return verdict(max(ok["sdpa-math"]) < max(ok["naive"]) and slower > 1,
                   f"math backend up to N = {longest:,}, naive up to N = {max(ok['naive']):,}; at N = {longest:,} the "
                   f"math backend took {slower:.1f}x the naive time")


MATH_BACKEND = Claim(
    "math_backend", "SDPA's math backend, the naive algorithm inside, is slower than the naive attention and runs out "
    "of memory at a shorter sequence.", ATTENTION, _math_backend)


def _attention_rate(run: Recording) -> Verdict:
    rows = _attention(run)
    longest = max(r["seq_len"] for r in run.rows if r["status"] == "ok")
    best = max((r for r in ok_rows(run.rows) if r["seq_len"] == longest), key=lambda r: r["tflops"])
    roof, _ = roofline_of(same_gpu(run, ROOFLINE).rows, run.device_name)
    share = best["tflops"] * 1e12 / roof.peak("bfloat16")
    default_best = rows[("sdpa", longest)]["tflops"] >= 0.95 * best["tflops"]
    return verdict(share >= 0.5 and default_best,
                   f"at N = {longest:,} the fastest, {best['backend']}, {best['tflops']:,.0f} TFLOP/s = {share:.0%} of "
                   f"the bfloat16 matmul; SDPA's default ran {rows[('sdpa', longest)]['backend']}")


ATTENTION_RATE = Claim(
    "attention_rate", "At the longest sequence, SDPA's default choice is the fastest method (within 5%), and the "
    "fastest attention runs at half or more of the bfloat16 matmul rate measured in the roofline run: with its scores "
    "kept on chip, attention is no longer memory-bound.", ATTENTION, _attention_rate)


# --- the hand-fused kernel's hardware counters (profiled in chapter 18) ------------------------------------------

def _fused_reads_once(run: Recording) -> Verdict:
    row, roof = counters.fused(run)
    ridge = roof.ridge(row["dtype"])
    return verdict(row["bytes_within"] and row["flops_ratio"] > 1.1 and row["intensity"] < ridge,
                   f"DRAM bytes {row['bytes_ratio']:.3f}x the book's, FLOPs {row['flops_ratio']:.2f}x; "
                   f"{row['intensity']:.1f} FLOP per DRAM byte against a {row['dtype']} ridge of {ridge:.1f}")


FUSED_READS_ONCE = Claim(
    "fused_reads_once", "The counters confirm the fusion: the hand-fused kernel's DRAM bytes are within 10% of the "
    "book's count, its input read once and its output written once. They find more FLOPs than the book counts (an "
    "erf is one operation in the count and many instructions on the GPU), and the kernel stays left of the float32 "
    "ridge all the same.", counters.EXPERIMENT, _fused_reads_once)


def _fused_waits_for_memory(run: Recording) -> Verdict:
    row, _ = counters.fused(run)
    reason, cycles = top_stall(row)
    return verdict(reason == "long_scoreboard" and row["memory_throughput_pct"] > 50,
                   f"top stall {reason} at {cycles:.1f} cycles per instruction; memory units "
                   f"{row['memory_throughput_pct']:.0f}% busy")


FUSED_WAITS_FOR_MEMORY = Claim(
    "fused_waits_for_memory", "The hand-fused kernel's warps wait most for the data of global loads "
    "(`long_scoreboard`), and its memory units are more than half busy.", counters.EXPERIMENT,
    _fused_waits_for_memory)


def _fused_memory_busier(run: Recording) -> Verdict:
    row, _ = counters.fused(run)
    return verdict(row["memory_throughput_pct"] > row["sm_throughput_pct"],
                   f"memory units {row['memory_throughput_pct']:.0f}% busy, SMs {row['sm_throughput_pct']:.0f}%")


FUSED_MEMORY_BUSIER = Claim(
    "fused_memory_busier", "The hand-fused kernel's memory units are busier than its SMs: its distance to the roof "
    "is the memory's, not the arithmetic's, as for a kernel left of the ridge it should be.", counters.EXPERIMENT,
    _fused_memory_busier, scoped=True)
