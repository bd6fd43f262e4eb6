"""Worked answers to the exercises of chapter 14 (``notebooks/14_batched_linear_algebra.ipynb``).

Every number is computed when the answer is shown: from :mod:`gpulab.core.flops`, the chapter's LU arithmetic and
checks (:mod:`.batched`), the datasheet rows of :mod:`gpulab.core.specs`, and the recordings of every GPU that ran
the chapter. Nothing here times anything; exercise 5 factorises one small matrix on the CPU to show the two checks.
"""

from __future__ import annotations

import torch

from gpulab.ch14_batched_linear_algebra import batched
from gpulab.core import budget, flops, recordings, specs
from gpulab.core.precision import FORMATS
from gpulab.core.printing import Answer

T4 = specs.gpu(budget.CLASS_GPU)
N, BATCH = 64, 1000  # the book's target point


def _point(run: recordings.Recording, **match) -> dict | None:
    return next((r for r in run.rows if r.get("status") == "ok" and all(r.get(k) == v for k, v in match.items())),
                None)


def _t4_us(work: flops.Cost, precision: str = "float32") -> float:
    """Microseconds a T4 needs at the faster of its peak and its bandwidth: the best any kernel can do."""
    return max(work.flops / specs.peak(T4, precision).ops_per_s, work.bytes / (T4.bandwidth_gb_s * 1e9)) * 1e6


def exercise_1() -> Answer:
    shared = torch.empty(N, N).expand(BATCH, N, N)
    product = flops.gemm(BATCH * N, N, N)
    copy_bytes = 2 * BATCH * N * N * 4  # the expanded operand, read and written as a contiguous batch
    lines = [f"`W.expand({BATCH}, {N}, {N})` is a view: its strides are {shared.stride()}, the batch stride 0, so "
             f"`is_contiguous()` is {shared.is_contiguous()} and nothing was copied yet.",
             "cuBLAS's strided batched GEMM takes a batch stride per operand, and 0 is a legal stride: torch can hand "
             "the view over as it is. If it copies it to a contiguous batch instead, the time shows it: time "
             "`torch.bmm(A, W.expand(b, n, n))`, the same with `.contiguous()` added, and the tall GEMM, and profile "
             "the first for a copy kernel before the GEMM.",
             f"On a T4 the copy would move {copy_bytes / 2**20:.0f} MiB, at least "
             f"{_t4_us(flops.Cost(0, copy_bytes)):.0f} us at its bandwidth, against at least {_t4_us(product):.0f} "
             f"us for the {BATCH} products themselves (the larger of their FLOP at float32's peak and their bytes at "
             "the bandwidth): a copy would double the time, so it cannot hide."]
    for run in recordings.recorded("batched_gemm"):
        bmm, tall = (_point(run, method=m, n=N, batch=BATCH, dtype="float32") for m in ("bmm", "one_gemm"))
        if bmm and tall:
            lines.append(f"For scale, the {run.short_label}'s recording: `bmm` with {BATCH} different B_i took "
                         f"{bmm['seconds'] * 1e6:.0f} us, the tall GEMM {tall['seconds'] * 1e6:.0f} us; a stride-0 "
                         "`bmm` that copies nothing should land near them.")
    return Answer("Answer to exercise 1", tuple(lines))


def exercise_2() -> Answer:
    lines = ["Record the loop once and replay it: warm it up on a side stream, then `g = torch.cuda.CUDAGraph()`, "
             "`with torch.cuda.graph(g): loop()`, and time `g.replay()` with `timing.measure`, beside the loop and "
             "`torch.bmm`. The replay launches all the recorded kernels with one call: Python, the dispatcher and "
             "the launch of each `torch.mm` are gone; each kernel's own time on the GPU is not."]
    floor = BATCH * budget.LAUNCH_SECONDS
    for run in recordings.recorded("batched_gemm"):
        loop, bmm = (_point(run, method=m, n=N, batch=BATCH, dtype="float32") for m in ("loop", "bmm"))
        if loop and bmm:
            lines.append(f"- {run.short_label}, {BATCH} products of order {N}: the loop took "
                         f"{loop['seconds'] * 1e3:.1f} ms ({loop['us_per_problem']:.1f} us a product), `bmm` "
                         f"{bmm['seconds'] * 1e3:.3f} ms. A replay of {BATCH} kernels of up to "
                         f"{budget.LAUNCH_SECONDS * 1e6:.0f} us each (the book's shortest GPU call) takes up to "
                         f"{floor * 1e3:.0f} ms: {loop['seconds'] / floor:.1f}x faster than the loop or more, still "
                         f"{floor / bmm['seconds']:.0f}x slower than `bmm` at most.")
    lines.append("So the loop's time went to the host, issuing calls, and what the replay leaves is one small kernel "
                 "after another, each too small to fill the GPU; `bmm` removes both, one kernel for the whole batch.")
    return Answer("Answer to exercise 2", tuple(lines))


def exercise_3() -> Answer:
    sizes = range(8, N + 1)
    useful = sum(flops.gemm(n, n, n).flops for n in sizes) / len(sizes)
    padded = flops.gemm(N, N, N).flops
    drawn = torch.randint(8, N + 1, (BATCH,), generator=torch.Generator().manual_seed(0))
    drawn_useful = sum(flops.gemm(n, n, n).flops for n in drawn.tolist())
    lines = [f"Padding every problem to {N} does {padded:,.0f} FLOP per problem (`flops.gemm({N}, {N}, {N})`); with n "
             f"drawn uniformly from 8 to {N}, a problem needs {useful:,.0f} on average: **{1 - useful / padded:.0%}** "
             f"of the padded arithmetic is wasted (for one draw of {BATCH} with seed 0: "
             f"{1 - drawn_useful / (BATCH * padded):.0%}). The cube makes it so: most problems are far smaller "
             f"than the largest.",
             "Yet the padded batch should win by far, because the loop pays a launch per problem whatever its size:"]
    for run in recordings.recorded("batched_gemm"):
        bmm = _point(run, method="bmm", n=N, batch=BATCH, dtype="float32")
        loops = [_point(run, method="loop", n=n, batch=BATCH, dtype="float32") for n in (8, N)]
        if bmm and all(loops):
            lines.append(f"- {run.short_label}: the padded `bmm` at n = {N} took {bmm['seconds'] * 1e3:.3f} ms; a loop "
                         f"of {BATCH} took {loops[0]['seconds'] * 1e3:.1f} ms at n = 8 and "
                         f"{loops[1]['seconds'] * 1e3:.1f} ms at n = {N}, so the unpadded loop lies between: "
                         f"about {loops[0]['seconds'] / bmm['seconds']:.0f}x slower than padding at least.")
    call = budget.HOST_CALL_SECONDS
    lines.append(f"On a T4 the padded batch is at least {_t4_us(flops.gemm(BATCH * N, N, N)):.0f} us of float32 "
                 f"arithmetic at its peak, the loop about {BATCH} launches of some {call * 1e6:.0f} us of "
                 f"host time each, {BATCH * call * 1e3:.0f} ms. Padding wastes arithmetic the GPU has "
                 "to spare; grouping problems of similar sizes into a few batches wastes less.")
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4() -> Answer:
    lines = ["Profile each call with `torch.profiler` (CUDA activity on) after a warm-up, as "
             "`gpulab.core.profiling.profile_calls` does, and list the kernels with `profiling.device_kernels`. The "
             "names tell the library: cuSOLVER's and MAGMA's carry their own prefixes, cuBLAS's batched getrf says "
             "batched, and the GEMMs of a large factorisation are cuBLAS's.",
             "For one matrix of order 8192, expect a blocked getrf: per panel a few small kernels (the panel, the "
             "pivot swaps, a triangular solve) and one large GEMM update. For the batch of 1000 of order 32, expect "
             "a handful of batched kernels for all of them. For the loop, count the kernels per matrix."]
    for lu, gemm in zip(recordings.recorded("batched_small_lu"), recordings.recorded("batched_gemm"), strict=False):
        if lu.device_name != gemm.device_name:
            continue
        mm = _point(gemm, method="loop", n=32, batch=BATCH, dtype="float32")
        loops = {d: _point(lu, method="loop", n=32, batch=BATCH, dtype=d) for d in ("float64", "float32")}
        if mm and all(loops.values()):
            each = " and ".join(f"{r['us_per_problem']:.0f} us in {d}" for d, r in loops.items())
            ratio = min(r["us_per_problem"] for r in loops.values()) / mm["us_per_problem"]
            lines.append(f"What to expect, from the {lu.short_label}'s recordings at order 32: one factorisation "
                         f"in the loop took {each}, at least {ratio:.1f} times one `torch.mm` in its loop "
                         f"({mm['us_per_problem']:.1f} us): that many launches' worth, so several kernels (or a wait "
                         "for the GPU) per factorisation.")
    return Answer("Answer to exercise 4", tuple(lines))


def _solve_check(n: int, dtype: torch.dtype) -> tuple[float, float]:
    """Backward error of getrf and MAGMA's --check 2 residual of a solve, for one random n x n matrix."""
    generator = torch.Generator().manual_seed(0)
    A = torch.randn(n, n, generator=generator, dtype=torch.float64).to(dtype)
    b = torch.randn(n, 1, generator=generator, dtype=torch.float64).to(dtype)
    LU, pivots = torch.linalg.lu_factor(A)
    x = torch.linalg.lu_solve(LU, pivots, b)
    A64, x64, b64 = A.double(), x.double(), b.double()
    residual = torch.linalg.norm(A64 @ x64 - b64) / (n * torch.linalg.matrix_norm(A64) * torch.linalg.norm(x64))
    return batched.lu_backward_error(A, LU, pivots).item(), residual.item()


def exercise_5() -> Answer:
    n = 512
    lines = ["`x = torch.linalg.lu_solve(LU, pivots, b)` solves with the factors; the check is "
             "`norm(A @ x - b) / (n * norm(A) * norm(x))`, computed in float64 (Frobenius norm of A). On one random "
             f"matrix of order {n}, on this machine's CPU, in units of each format's unit roundoff u:"]
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).removeprefix("torch.")
        u = FORMATS[name].unit_roundoff
        backward, residual = _solve_check(n, dtype)
        lines.append(f"- {name}: backward error {backward / u:.3f} u, solve residual {residual / u:.3f} u")
    for run in recordings.recorded("batched_lu"):
        errors = [r["backward_error"] / FORMATS[r["dtype"]].unit_roundoff for r in run.rows if r.get("status") == "ok"]
        lines.append(f"The {run.short_label}'s recorded backward errors ran from {min(errors):.3f} to "
                     f"{max(errors):.3f} u. The two checks are of the same size: a backward-stable factorisation "
                     "gives a backward-stable solve, and both sit far below MAGMA's 30 u.")
    return Answer("Answer to exercise 5", tuple(lines))


def exercise_6() -> Answer:
    block, share = 256, 0.05
    n = round(3 * block / (4 * share))

    def panel_flops(m: int, k: int) -> float:  # LU of an m x k panel (m >= k): sum over its k columns
        return sum((m - j) + 2 * (m - j) * (k - j) for j in range(1, k + 1))

    exact = sum(panel_flops(n - start, min(block, n - start)) for start in range(0, n, block)) / batched.lu_flops(n)
    lines = ["Panel j factorises the n - j nb remaining rows of nb columns: about (n - j nb) nb^2 operations. "
             "Summed over the n / nb panels that is about n^2 nb / 2, against 2 n^3 / 3 for the whole "
             "factorisation: a share of (n^2 nb / 2) / (2 n^3 / 3) = 3 nb / (4 n).",
             f"For nb = {block}, the share is {share:.0%} at n = 3 nb / (4 x {share}) = **{n:,}**. Summing each "
             f"panel's exact count (`batched.lu_flops` for the whole) gives {exact:.1%} there."]
    for run in recordings.recorded("batched_lu"):
        gpu = [r for r in run.rows if r.get("status") == "ok" and r["device"] == "cuda" and r["dtype"] == "float64"]
        if gpu:
            near = min(gpu, key=lambda r: abs(r["n"] - n))
            best = max(gpu, key=lambda r: r["gflops"])
            lines.append(f"The {run.short_label}'s float64 getrf ran at {near['gflops'] / best['gflops']:.0%} of its "
                         f"best rate at n = {near['n']:,} (best at n = {best['n']:,}): the panels' share of the time "
                         "is far larger than their share of the arithmetic, as they run far below GEMM's rate.")
    return Answer("Answer to exercise 6", tuple(lines))
