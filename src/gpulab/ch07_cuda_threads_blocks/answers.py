"""Worked answers to chapter 07's exercises, every number computed when the answer is shown: from the occupancy
model, NVRTC's compile reports (no GPU needed), the chapter's time model (:mod:`.plan`) and each recorded GPU's runs."""

from __future__ import annotations

import statistics

import torch

from gpulab.ch05_convolutions_as_gemms.answers import per_gpu
from gpulab.ch07_cuda_threads_blocks import plan
from gpulab.core import occupancy, recordings, specs
from gpulab.core.printing import Answer
from gpulab.core.recordings import Recording
from gpulab.kernels import cuda_c

T4 = specs.gpu("T4")
KERNELS = ("01_hello", "02_scalar_add", "03_vector_add", "04_saxpy", "05_saxpy_per_thread", "06_saxpy_float4",
           "07_grid_2d", "08_divergence")


def exercise_1() -> Answer:
    blocks, per_block = 4, 64
    warps = per_block // occupancy.WARP
    return Answer("Answer to exercise 1", (
        f"`threads.hello({blocks}, {per_block})` launches {blocks} blocks of {per_block} threads: {warps} warps a "
        f"block, {blocks * warps} in all. Run it a few times and compare the `block` column of the guest book "
        "between runs, then the `thread` order inside each block.",
        f"The blocks: no order is promised. Each goes to whichever SM is free (a T4 has {T4.sms}, so each of the "
        f"{blocks} likely gets its own), they start within microseconds of each other, and the order in which "
        "their first writes land can change from run to run.",
        f"The threads of one warp: on today's GPUs the {occupancy.WARP} lanes of a warp usually execute the same "
        "instruction together, so they sign one after another in lane order. That is what the hardware tends to "
        "do, not what CUDA promises: since Volta each thread has its own program counter and a warp may split. The "
        "warps of a block, like the blocks, come in any order.",
        "Nothing is recorded here: the guest book's order is the lesson, not a rate, and numba's simulator (without "
        "a GPU) signs strictly in order, one Python thread after another.",
    ))


def _divergence_times(run: Recording) -> tuple[float, float] | None:
    """Median seconds of the launches whose warps take both paths, and of those whose warps take one."""
    both = [r["seconds"] for r in run.rows if r.get("paths_per_warp") == 2]
    one = [r["seconds"] for r in run.rows if r.get("paths_per_warp") == 1]
    return (statistics.median(both), statistics.median(one)) if both and one else None


def exercise_2() -> Answer:
    small, large, modulus, block, warp = 8, 64, 4, plan.DIVERGENCE_THREADS_PER_BLOCK, occupancy.WARP
    first_share = 1 / modulus  # of the threads (and, for group 64, of the warps) that take the first loop
    worst = 2 * (1 - first_share)  # the one-path time's factor when the second loop is all the cost
    model = {c.label: c.gpu_seconds(T4) for c in plan.work(plan.FULL) if c.label.startswith("divergence")}
    divergent, convergent = model["divergence, groups of 1"], model["divergence, groups of 64"]

    def predicted(run: Recording) -> str | None:
        times = _divergence_times(run)
        if times is None:
            return None
        both, one = times
        return (f"both paths in every warp took {both * 1e3:.3f} ms, one path per warp {one * 1e3:.3f} ms: predict "
                f"{both * 1e3:.3f} ms for group {small}, and {one * 1e3:.3f} to {worst * one * 1e3:.3f} ms for "
                f"group {large}")

    return Answer("Answer to exercise 2", (
        f"Group {small}: `(threadIdx.x / {small}) % {modulus} == 0` holds for lanes 0-{small - 1} of every warp and "
        f"fails for lanes {small}-{warp - 1}, so every warp runs the first loop for {first_share:.0%} of its lanes "
        f"and then the second for the rest: the time of both loops, as for any group below {warp}.",
        f"Group {large}: the condition holds for threads 0-{large - 1} of each block of {block} (its first "
        f"{large // warp} warps) and fails for the other {(block - large) // warp} warps. No warp diverges, but "
        f"{first_share:.0%} of the warps run the first loop and the rest the second. Where the recordings' one-path "
        f"time T has half the warps on each loop, this one is T x 2 ({first_share:g} c1 + {1 - first_share:g} c2) / "
        f"(c1 + c2): T if the loops cost the same, up to {worst:g} T as the square-root loop c2 dominates.",
        *per_gpu(recordings.recorded("threads_divergence"), predicted,
                 "- No GPU has recorded the divergence experiment yet."),
        f"On a T4 the chapter's model (a few operations an iteration at its float32 rate) puts the launch at "
        f"{divergent * 1e3:.2f} ms with both paths per warp and {convergent * 1e3:.2f} ms with one. Measure with "
        "`cuda_c.time_launch` after editing a copy of the kernel file.",
    ))


def exercise_3() -> Answer:
    hopper = occupancy.limits("9.0")
    threads = 256
    first = next(r for r in range(1, hopper.max_registers_per_thread + 1)
                 if occupancy.theoretical(threads, r, 0, hopper).fraction < 1)
    below, at = (occupancy.theoretical(threads, r, 0, hopper) for r in (first - 1, first))
    used = {kernel: resources.registers for name in KERNELS
            for kernel, resources in cuda_c.compile_report(name).resources.items()}
    most = max(used, key=used.get)
    return Answer("Answer to exercise 3", (
        f"An SM of compute capability 9.0 holds {hopper.registers:,} registers and {hopper.max_threads:,} threads: "
        f"full occupancy leaves {hopper.registers // hopper.max_threads} registers a thread, and registers are handed "
        f"to a warp in units of {hopper.register_unit}.",
        f"`occupancy.theoretical({threads}, r, 0, occupancy.limits(\"9.0\"))` for r = 1, 2, ...: at {first - 1} "
        f"registers {below.blocks_per_sm} blocks fit ({below.fraction:.0%}, limited by {below.limited_by}); at "
        f"{first} only {at.blocks_per_sm} ({at.fraction:.0%}, limited by {at.limited_by}). So {first} registers a "
        "thread is the first count that costs occupancy.",
        f"`cuda_c.compile_report` (NVRTC, for {cuda_c.device_arch()}) on the chapter's kernels: "
        + ", ".join(f"`{kernel}` {count}" for kernel, count in used.items())
        + f". The most is {used[most]}, in `{most}`, {first - used[most]} short of the count that would cost "
        f"occupancy in blocks of {threads}.",
    ))


def exercise_4() -> Answer:
    x = torch.empty(1024)
    offsets = {name: t.data_ptr() % 16 for name, t in (("x", x), ("x[1:]", x[1:]))}
    return Answer("Answer to exercise 4", (
        f"A tensor's storage starts aligned (here `x.data_ptr() % 16` = {offsets['x']}; torch's CUDA allocator hands "
        f"out blocks aligned to far more than 16 bytes). `x[1:]` is a view one float further: its pointer is "
        f"{offsets['x[1:]']} bytes past a 16-byte boundary.",
        "The kernel reinterprets the pointer as `float4 *` and loads 16 bytes at a time. A 16-byte load from an "
        "address that is not a multiple of 16 is not allowed: the GPU does not split it, the load faults, and the "
        "launch ends with `cudaErrorMisalignedAddress` (CuPy raises it at the next synchronisation).",
        "That error is sticky: the CUDA context is unusable afterwards, and every later call in the process fails "
        "until the Python process (the notebook's kernel) restarts.",
        "A library kernel avoids it by checking `data_ptr() % 16` and falling back to scalar loads for a misaligned "
        "head, or by copying the view to a fresh, aligned tensor first.",
    ))
