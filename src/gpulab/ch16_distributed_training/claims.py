"""What chapter 16 states about NCCL's all-reduce, DDP's scaling from one GPU to two, and tensor, pipeline and
sharded parallelism on several GPUs, as claims checked on every recorded machine (:mod:`gpulab.core.claims`). The
recordings are runs over several GPUs of one machine; a claim's GPU is the machine's GPU, and its evidence names
how many GPUs of it ran."""

from __future__ import annotations

from gpulab.ch16_distributed_training import machines, measured
from gpulab.core import recordings
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

NCCL = "distributed_nccl_allreduce"
SCALING = "distributed_ddp_scaling"
TARGET = 0.85  # the chapter's SCALING_TARGET


def _sizes(run: Recording) -> list[dict]:
    rows = sorted(ok_rows(run.rows), key=lambda r: r["bytes"])
    if len(rows) < 2:
        raise ValueError("fewer than two message sizes")
    return rows


def _pair(run: Recording) -> str:
    return f"{int(run.params.get('processes', 2))} GPUs"


def _latency(run: Recording) -> Verdict:
    rows = _sizes(run)
    first = rows[0]
    flat = [r for r in rows if r["seconds"] < 2 * first["seconds"]]
    reach = max(r["bytes"] for r in flat)
    return verdict(10e-6 <= first["seconds"] < 100e-6 and reach >= 2**20,
                   f"{_pair(run)}: {format_bytes(first['bytes'])} took {first['seconds'] * 1e6:.0f} µs; every size "
                   f"up to {format_bytes(reach)} less than twice that")


LATENCY = Claim(
    "latency", "NCCL's smallest all-reduces took tens of microseconds, and every message up to at least 1 MiB took "
    "less than twice as long as the smallest: below that size a fixed cost per call, not the bytes, sets the time.",
    NCCL, _latency)


def _plateau(run: Recording) -> Verdict:
    rows = _sizes(run)
    link = measured.machine_link(run)
    rate = measured.link_rate(link, run.device_name)
    if rate is None:
        raise KeyError(f"no bandwidth known for the link {link!r} between the GPUs")
    last, before = rows[-1], rows[-2]
    share = last["busbw_gbs"] * 1e9 / rate
    return verdict(last["busbw_gbs"] > before["busbw_gbs"] and 0.5 < share < 1,
                   f"{_pair(run)}, linked by {link} ({rate / 1e9:,.0f} GB/s each way): {format_bytes(last['bytes'])} "
                   f"at {last['busbw_gbs']:,.0f} GB/s, {share:.0%} of it ({format_bytes(before['bytes'])}: "
                   f"{before['busbw_gbs']:,.0f} GB/s)")


PLATEAU = Claim(
    "plateau", "The bus bandwidth was still rising at the largest message measured, and there it reached more than "
    "half, but not all, of the rate at which the link between the two GPUs carries data in one direction.",
    NCCL, _plateau)


def _bucket(run: Recording) -> Verdict:
    rows = _sizes(run)
    bucket = min(rows, key=lambda r: abs(r["bytes"] - measured.BUCKET_BYTES))
    peak = max(rows, key=lambda r: r["busbw_gbs"])
    share = bucket["busbw_gbs"] / peak["busbw_gbs"]
    return verdict(share < 0.9, f"{_pair(run)}: {format_bytes(bucket['bytes'])} at {bucket['busbw_gbs']:,.0f} GB/s, "
                                f"{share:.0%} of the peak {peak['busbw_gbs']:,.0f} GB/s")


BUCKET = Claim(
    "bucket", "An all-reduce of the size of DDP's default bucket (25 MiB) runs at less than 90% of the peak bus "
    "bandwidth: it sits on the rising part of the curve, below the plateau.", NCCL, _bucket)


def _one_batch(run: Recording, precision: str) -> dict[int, dict]:
    found = {r["batch_per_device"]: r for r in ok_rows(run.rows)
             if r["precision"] == precision and r.get("micro_batches", 1) == 1}
    if len(found) < 2:
        raise KeyError(f"fewer than two batches of {precision} with one batch per step")
    return dict(sorted(found.items()))


def _efficiencies(rows: dict[int, dict]) -> str:
    return ", ".join(f"{b:,} per GPU {r['efficiency']:.0%}" for b, r in rows.items())


def _float32_target(run: Recording) -> Verdict:
    rows = _one_batch(run, "float32")
    efficiency = [r["efficiency"] for r in rows.values()]
    met = [b for b, r in rows.items() if r["efficiency"] >= TARGET]
    rising = all(a < b for a, b in zip(efficiency, efficiency[1:], strict=False))
    from_then_on = bool(met) and met == [b for b in rows if b >= met[0]] and met[0] != min(rows)
    return verdict(rising and from_then_on, f"{_pair(run)}, float32: {_efficiencies(rows)}")


FLOAT32_TARGET = Claim(
    "float32_target", f"In float32 the efficiency rises with the batch per GPU, and it meets the {TARGET:.0%} target "
    "once the batch is large enough, and at every larger batch measured, but not at the smallest.", SCALING,
    _float32_target)


def _bfloat16_faster_scales_worse(run: Recording) -> Verdict:
    f32, bf16 = _one_batch(run, "float32"), _one_batch(run, "bfloat16")
    both = [b for b in f32 if b in bf16]
    if not both:
        raise KeyError("no batch per GPU measured in both precisions")
    largest = max(both)
    speedup = f32[largest]["single_seconds"] / bf16[largest]["single_seconds"]
    worse = all(bf16[b]["efficiency"] < f32[b]["efficiency"] for b in both)
    pairs = ", ".join(f"{b:,}: {bf16[b]['efficiency']:.0%} against {f32[b]['efficiency']:.0%}" for b in both)
    return verdict(speedup > 4 and worse, f"{_pair(run)}: at {largest:,} per GPU one GPU's bfloat16 step is "
                                          f"{speedup:.1f}x shorter; efficiency bfloat16 against float32 {pairs}")


BFLOAT16_FASTER_SCALES_WORSE = Claim(
    "bfloat16_faster_scales_worse", "At the largest batch per GPU a bfloat16 step is more than four times shorter "
    "than a float32 step, and at every batch measured in both precisions bfloat16 scales less well.", SCALING,
    _bfloat16_faster_scales_worse)


def _growth(rows: dict[int, dict]) -> tuple[float, float]:
    low, high = rows[min(rows)], rows[max(rows)]
    return high["batch_per_device"] / low["batch_per_device"], high["single_seconds"] / low["single_seconds"]


def _host_bound(run: Recording) -> Verdict:
    (work32, time32), (work16, time16) = _growth(_one_batch(run, "float32")), _growth(_one_batch(run, "bfloat16"))
    return verdict(time32 >= 0.5 * work32 and time16 <= 0.25 * work16,
                   f"{_pair(run)}: float32 {work32:.0f}x the samples in {time32:.1f}x the time; bfloat16 "
                   f"{work16:.0f}x the samples in {time16:.1f}x the time")


HOST_BOUND = Claim(
    "host_bound", "From the smallest batch per GPU to the largest, one GPU's float32 step time grows at least half as "
    "fast as the work, while its bfloat16 step time grows less than a quarter as fast: the small bfloat16 steps are "
    "set by something other than the arithmetic.", SCALING, _host_bound)


def _ddp_cost_flat(run: Recording) -> Verdict:
    rows = [r for precision in ("float32", "bfloat16") for r in _one_batch(run, precision).values()]
    added = [r["ddp_seconds"] - r["single_seconds"] for r in rows]
    work = max(r["batch_per_device"] for r in rows) / min(r["batch_per_device"] for r in rows)
    return verdict(min(added) > 0 and max(added) < 2 * min(added),
                   f"{_pair(run)}: DDP added {min(added) * 1e3:.2f} to {max(added) * 1e3:.2f} ms, while the batch "
                   f"per GPU varied {work:.0f}-fold")


DDP_COST_FLAT = Claim(
    "ddp_cost_flat", "The time DDP adds to a step hardly depends on the batch or the precision: across every batch per "
    "GPU and both precisions it stays within a factor of two.", SCALING, _ddp_cost_flat)


def _overlap(run: Recording) -> Verdict:
    algbw, bucket = measured._bucket_algbw(run, recordings.newest_per_gpu(NCCL))
    if not algbw:
        raise KeyError("no NCCL recording of the same machine")
    rows = [r for precision in ("float32", "bfloat16") for r in _one_batch(run, precision).values()]
    margins = [r["efficiency"] - measured._no_overlap(r, algbw) for r in rows]
    return verdict(all(m > 0 for m in margins),
                   f"{_pair(run)}: the measured efficiency exceeds the one without overlap (at "
                   f"{algbw / 1e9:,.0f} GB/s, the algbw of {format_bytes(bucket['bytes'])}) by "
                   f"{min(margins) * 100:.1f} to {max(margins) * 100:.1f} points")


OVERLAP = Claim(
    "overlap", "In every configuration the measured efficiency beats the efficiency DDP would have if it waited "
    "until the backward pass ended and then all-reduced all the gradients at the algorithm bandwidth that the NCCL "
    "run measured for a bucket-sized message: part of the all-reduce ran while the backward pass was still "
    "computing.", SCALING, _overlap)


def _accumulation(run: Recording) -> Verdict:
    single = {(r["precision"], r["batch_per_device"]): r for r in ok_rows(run.rows) if r.get("micro_batches", 1) == 1}
    accumulated = [r for r in ok_rows(run.rows) if r.get("micro_batches", 1) > 1]
    if not accumulated:
        raise KeyError("no step that accumulates micro-batches")
    raised = all(r["efficiency"] > single[r["precision"], r["batch_per_device"]]["efficiency"] for r in accumulated)
    bf16_one = [r for (p, _), r in single.items() if p == "bfloat16"]
    bf16_many = [r for r in accumulated if r["precision"] == "bfloat16"]
    if not (bf16_one and bf16_many):
        raise KeyError("no bfloat16 rows")
    holds = (raised and all(r["efficiency"] < TARGET for r in bf16_one)
             and all(r["efficiency"] >= TARGET for r in bf16_many))
    return verdict(holds, f"{_pair(run)}, bfloat16: one batch per step "
                          + ", ".join(f"{r['batch_per_device']:,} {r['efficiency']:.0%}" for r in bf16_one)
                          + f"; {bf16_many[0]['micro_batches']} micro-batches of "
                          + ", ".join(f"{r['batch_per_device']:,} {r['efficiency']:.0%}" for r in bf16_many))


ACCUMULATION = Claim(
    "accumulation", "Accumulating micro-batches, with one all-reduce per step, raises the efficiency above that of one "
    f"batch of the micro-batch's size in every configuration. In bfloat16, one batch per step meets the {TARGET:.0%} "
    "target at no batch measured, and four accumulated micro-batches meet it at every one.", SCALING, _accumulation)


def _throughput(run: Recording) -> Verdict:
    single = _one_batch(run, "bfloat16")
    pairs = [(r, single[r["samples_per_step"]]) for r in ok_rows(run.rows)
             if r["precision"] == "bfloat16" and r.get("micro_batches", 1) > 1 and r["samples_per_step"] in single]
    if not pairs:
        raise KeyError("no bfloat16 step of micro-batches beside one batch of the same samples")
    holds = all(one["ddp_samples_per_s"] > many["ddp_samples_per_s"] and one["efficiency"] < many["efficiency"]
                for many, one in pairs)
    return verdict(holds, f"{_pair(run)}: " + "; ".join(
        f"{many['samples_per_step']:,} samples as {many['micro_batches']} micro-batches {many['efficiency']:.0%}, "
        f"{many['ddp_samples_per_s']:,.0f}/s, as one batch {one['efficiency']:.0%}, {one['ddp_samples_per_s']:,.0f}/s"
        for many, one in pairs))


THROUGHPUT = Claim(
    "throughput", "In bfloat16, one batch of a step's samples moves more samples per second than the same samples as "
    "accumulated micro-batches, at a lower efficiency: efficiency says how well the GPUs share the work, not how fast "
    "the work goes.", SCALING, _throughput)


# Tensor, pipeline and sharded parallelism on machines of several GPUs (.machines; tools/record_parallelism.py)

def _machine(run: Recording) -> str:
    return f"{max(r['devices'] for r in ok_rows(run.rows))}-GPU machine"


def _rows_of(run: Recording, **match) -> list[dict]:
    rows = machines.rows_where(run, **match)
    if not rows:
        raise KeyError(f"no row with {match}")
    return rows


def _weak_scaling_target(run: Recording) -> Verdict:
    batch = max(r["batch_per_device"] for r in _rows_of(run, precision="float32"))
    rows = [r for r in _rows_of(run, precision="float32", batch_per_device=batch) if r["strategy"] in ("ddp", "fsdp")]
    text = ", ".join(f"{r['strategy'].upper()} on {r['devices']} {r['efficiency']:.1%}" for r in rows)
    return verdict(len(rows) >= 2 and all(r["efficiency"] >= TARGET for r in rows),
                   f"{_machine(run)}, float32, {batch:,} samples per GPU: {text}")


WEAK_SCALING_TARGET = Claim(
    "weak_scaling_target", f"In float32 with the largest batch per GPU measured, DDP and FSDP both kept at least "
    f"{TARGET:.0%} of one GPU's throughput per GPU, on every number of GPUs measured.", machines.SCALING,
    _weak_scaling_target)


def _every_method_worse_in_bfloat16(run: Recording) -> Verdict:
    pairs = []
    for r in _rows_of(run, precision="bfloat16"):
        twin = _rows_of(run, precision="float32", strategy=r["strategy"], devices=r["devices"],
                        batch_per_device=r["batch_per_device"])[0]
        pairs.append((r["efficiency"] < twin["efficiency"], r, twin))
    worst = max(pairs, key=lambda p: p[1]["efficiency"] / p[2]["efficiency"])
    return verdict(all(p[0] for p in pairs), f"{_machine(run)}: {len(pairs)} pairs; the closest, "
                   f"{worst[1]['strategy']} on {worst[1]['devices']} GPUs at {worst[1]['batch_per_device']:,}: "
                   f"{worst[1]['efficiency']:.0%} in bfloat16 against {worst[2]['efficiency']:.0%} in float32")


EVERY_METHOD_WORSE_IN_BFLOAT16 = Claim(
    "every_method_worse_in_bfloat16", "Every method, at every batch and number of GPUs, kept a smaller share of one "
    "GPU's throughput in bfloat16 than in float32: the shorter one GPU's step, the less time there is to hide "
    "anything a method adds to it.", machines.SCALING, _every_method_worse_in_bfloat16)


def _tensor_beats_pipeline(run: Recording) -> Verdict:
    most = max(r["devices"] for r in ok_rows(run.rows))
    batch = max(r["batch_per_device"] for r in _rows_of(run, precision="float32"))
    tensor, piped = (_rows_of(run, precision="float32", batch_per_device=batch, devices=most, strategy=s)[0]
                     for s in ("tensor", "pipeline"))
    return verdict(machines.speedup(tensor) >= 3 and machines.speedup(piped) < 2,
                   f"{most} GPUs, float32, {batch:,} samples: tensor parallel {machines.speedup(tensor):.2f}x one "
                   f"GPU, pipeline {machines.speedup(piped):.2f}x")


TENSOR_BEATS_PIPELINE = Claim(
    "tensor_beats_pipeline", "Split over the most GPUs measured, the float32 step on the largest batch ran at least "
    "three times as fast as on one GPU with tensor parallelism, and less than twice as fast with the pipeline, whose "
    "timed step synchronizes the host before and after every pass.",
    machines.SCALING,
    _tensor_beats_pipeline)


def _fsdp_fixed_cost(run: Recording) -> Verdict:
    rows = _rows_of(run, precision="bfloat16", strategy="fsdp")
    ratios = [r["seconds"] / r["single_seconds"] for r in rows]
    return verdict(min(ratios) >= 4, f"{_machine(run)}: FSDP's bfloat16 step {min(ratios):.1f}x to "
                                     f"{max(ratios):.1f}x one GPU's step alone, over {len(rows)} runs")


FSDP_FIXED_COST = Claim(
    "fsdp_fixed_cost", "In bfloat16, FSDP's step took at least four times as long as the same GPU's step alone, at "
    "every batch and number of GPUs.", machines.SCALING, _fsdp_fixed_cost)


def _fsdp_state_sharded(run: Recording) -> Verdict:
    rows = machines.memory_rows(run)
    exact = all(abs(r["state_share"] * r["devices"] - 1) < 0.01 for r in rows)
    lower = all(1 / r["devices"] < r["peak_share"] < 1 for r in rows)
    state, peak = [r["state_share"] for r in rows], [r["peak_share"] for r in rows]
    return verdict(exact and lower, f"{_machine(run)}: FSDP's weights and gradients {min(state):.1%} to "
                                    f"{max(state):.1%} of DDP's; its peak {min(peak):.0%} to {max(peak):.0%} of DDP's")


FSDP_STATE_SHARDED = Claim(
    "fsdp_state_sharded", "On p GPUs, FSDP kept 1/p of DDP's weights and gradients on each GPU (within 1%), and its "
    "peak memory per GPU was lower than DDP's in every run, though never as low as 1/p of it.", machines.SCALING,
    _fsdp_state_sharded)


def _bubble_grows_apart(run: Recording) -> Verdict:
    rows = ok_rows(run.rows)
    fewest, most = min(r["micro_batches"] for r in rows), max(r["micro_batches"] for r in rows)
    low = [r["bubble"] / r["bubble_formula"] for r in rows if r["micro_batches"] == fewest]
    high = [r["bubble"] / r["bubble_formula"] for r in rows if r["micro_batches"] == most]
    return verdict(all(abs(x - 1) <= 0.05 for x in low) and all(x > 2 for x in high),
                   f"{_machine(run)}: measured / formula {min(low):.2f} to {max(low):.2f} with {fewest} micro-batch; "
                   f"{min(high):.2f} to {max(high):.2f} with {most}")


BUBBLE_GROWS_APART = Claim(
    "bubble_grows_apart", "With one micro-batch, the measured bubble was within 5% of (p - 1)/(m + p - 1) on every "
    "number of stages and both schedules; with the most micro-batches measured, it was more than twice the formula.",
    machines.BUBBLE,
    _bubble_grows_apart)


def _one_f_one_b_holds_less(run: Recording) -> Verdict:
    rows = ok_rows(run.rows)
    most = max(r["micro_batches"] for r in rows)
    peaks = {(r["devices"], r["schedule"]): r["peak_memory_bytes"] for r in rows if r["micro_batches"] == most}
    stages = sorted({p for p, _ in peaks})
    if any((p, s) not in peaks or not peaks[p, s] for p in stages for s in ("gpipe", "1f1b")):
        raise KeyError(f"no peak memory for both schedules at {most} micro-batches")
    shares = {p: peaks[p, "1f1b"] / peaks[p, "gpipe"] for p in stages}
    return verdict(all(share < 0.9 for share in shares.values()),
                   f"{_machine(run)}, {most} micro-batches: 1F1B's peak "
                   + ", ".join(f"{shares[p]:.0%} of GPipe's on {p} stages" for p in stages))


ONE_F_ONE_B_HOLDS_LESS = Claim(
    "one_f_one_b_holds_less", "With the most micro-batches measured, 1F1B's peak memory on the busiest stage was "
    "at least 10% below GPipe's on every number of stages: it starts a micro-batch's backward pass as soon as it can, "
    "and a stage drops each message once it has been sent.", machines.BUBBLE, _one_f_one_b_holds_less)
