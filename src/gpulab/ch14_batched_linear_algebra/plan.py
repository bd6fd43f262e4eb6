"""Chapter 14's sizes in every setting, and the work they make: the one place the notebook
``notebooks/14_batched_linear_algebra.ipynb`` takes its sizes from (:class:`gpulab.core.budget.Chapter`).

The work follows the experiments' code in :mod:`.batched`: :func:`~.batched.gemm_sweep` checks, then times,
every method at every order, batch and format; :func:`~.batched.lu_sweep` factorises one matrix of each order on
the host CPU (up to ``cpu_max_n``) and on the GPU; :func:`~.batched.small_lu_sweep` factorises batches of small
matrices in a loop and in one call. Every timed call on the GPU flushes L2 before each repeat, and most calls here
are short, so the flushes are a large share of the time on a T4 (:class:`gpulab.core.budget.Work`); a loop's call
lasts as long as Python takes to issue its calls, one torch call per problem.
"""

from __future__ import annotations

from gpulab.ch14_batched_linear_algebra import batched
from gpulab.core import budget, flops
from gpulab.core.budget import Work

FULL = dict(  # the sizes of the H200's recordings
    gemm_sizes=[8, 16, 32, 64, 128, 256],  # order n of each small product
    batches=[50, 300, 1000],  # the batch counts of the course's batched-GEMM figure
    gemm_dtypes=["float32", "tf32", "float16"],
    lu_sizes=[512, 1024, 2048, 4096, 8192, 12288, 16384],  # n of the getrf sweep: 16384^2 float64 is 2 GiB
    lu_dtypes=["float64", "float32"],
    cpu_max_n=8192,  # the host CPU factorises up to this order; its rows above say "not run"
    small_lu_sizes=[8, 16, 32, 64, 128, 256],
    small_lu_batches=[50, 300, 1000],
)

# Each candidate keeps the book's target point (1000 products of order 64 in float32), the smallest and the largest
# order (the loop's flat cost per product against n^3 of arithmetic), two batch counts or more (what a batch does to
# bmm's rate), the GPU crossing the host CPU in getrf and the GPU's rate still climbing at its largest order, and
# both precisions of every factorisation. A T4's float64 runs at a thirty-second of its float32, so its getrf stops
# at 4,096 (which takes it a third of a second), and most calls here are short enough that the flush before each
# repeat costs a T4 more than the call.
CLASSES = [
    # float32 and float16 at three orders and two batches; getrf to 4,096 on the GPU and 2,048 on the host
    {**FULL, "gemm_sizes": [8, 64, 256], "batches": [50, 1000], "gemm_dtypes": ["float32", "float16"],
     "lu_sizes": [512, 1024, 2048, 4096], "cpu_max_n": 2048, "small_lu_sizes": [8, 64, 256],
     "small_lu_batches": [50, 1000]},
    # every order and batch of the GEMMs in float32 and float16; getrf to 8,192 (4,096 on the host)
    {**FULL, "gemm_dtypes": ["float32", "float16"], "lu_sizes": [512, 1024, 2048, 4096, 8192], "cpu_max_n": 4096,
     "small_lu_sizes": [8, 32, 64, 128, 256], "small_lu_batches": [50, 1000]},
    # TF32 too, getrf to 12,288, every small factorisation: for an A100 or an H100
    {**FULL, "lu_sizes": [512, 1024, 2048, 4096, 8192, 12288], "cpu_max_n": 4096},
]

CPU = {**FULL, "gemm_sizes": [8, 16, 32, 64], "batches": [50, 1000], "gemm_dtypes": ["float32"],
       "lu_sizes": [128, 256, 512, 1024], "cpu_max_n": 1024, "small_lu_sizes": [8, 16, 32, 64],
       "small_lu_batches": [50, 1000]}  # tf32, float16: GPU features
SMOKE = {**FULL, "gemm_sizes": [8, 16], "batches": [8], "gemm_dtypes": ["float32"], "lu_sizes": [32, 64],
         "cpu_max_n": 64, "small_lu_sizes": [8], "small_lu_batches": [8]}

# The host CPU's getrf and float64 GEMM (the check's L U): the H200 recording's host, 16 threads of MKL, ran getrf
# at 270-360 GFLOP/s in float64 and 570-900 in float32 at n = 4096 to 8192. Colab's two vCPUs run about a tenth of
# that: the class candidates factorise on the host only up to 2,048 or 4,096, seconds even there.
HOST_GETRF_FLOPS = {"float64": 300e9, "float32": 600e9}
HOST_GEMM64_FLOPS = 400e9
# gpulab.core.timing.measure on a CPU: repeats for 0.5 s, at least 3, at most 50, after warm-up calls
CPU_TARGET_SECONDS, CPU_MIN_REPEATS, CPU_MAX_REPEATS = 0.5, 3, 50
# One small factorisation in the loop (lu_factor_ex on one matrix): the H200 recording of batched_small_lu took
# 37-56 us per matrix up to n = 32, then about 1.55 us per unit of n (0.40 ms at n = 256): a chain of small kernels.
LOOP_LU_SECONDS, LOOP_LU_SECONDS_PER_N = 45e-6, 1.55e-6


def _gemm(s: dict) -> list[Work]:
    """batched_gemm: per format, batch and order, each method checked (one call, the product in float64 on the GPU,
    the comparison on the host), then timed; the loop issues one torch.mm per problem."""
    work = []
    for dtype in s["gemm_dtypes"]:
        size = flops.bytes_per_element(dtype)
        for batch in s["batches"]:
            for n in s["gemm_sizes"]:
                memory = 3 * batch * n * n * (size + 8)
                for method in batched.METHODS:
                    cost = batched.gemm_cost(method, n, batch, dtype)  # a loop: the FLOP and bytes of bmm
                    loop = dict(launches=batch, least_seconds=batch * budget.HOST_CALL_SECONDS)
                    timed = dict(flops=cost.flops, bytes=cost.bytes, precision=dtype, memory_bytes=memory,
                                 missing="skip", **(loop if method == "loop" else {}))  # skip: a row says why
                    warmup = batched.LOOP_WARMUP if method == "loop" else budget.WARMUP
                    label = f"{method}, b = {batch}, n = {n}, {dtype}"
                    work += [budget.once(f"{label}, checked", **timed),
                             budget.once(f"float64 product of the check, {label}", flops=2 * batch * n**3,
                                         precision="float64", requires=dtype, checked_elements=batch * n * n),
                             Work(label, warmup=warmup, **timed)]
    return work


def _host_getrf(n: int, dtype: str) -> float:
    """A host measurement of getrf (a warm-up call, one to choose the count, the repeats) and its check: one more
    factorisation, and L U in float64."""
    call = batched.lu_flops(n) / HOST_GETRF_FLOPS[dtype]
    calls = 2 + max(CPU_MIN_REPEATS, min(CPU_MAX_REPEATS, int(CPU_TARGET_SECONDS / call)))
    return (calls + 1) * call + 2 * n**3 / HOST_GEMM64_FLOPS


def _lu(s: dict) -> list[Work]:
    """batched_lu: per format and order, getrf checked (one call, L U in float64) then timed on the GPU (one
    warm-up call), and on the host CPU up to cpu_max_n."""
    work = []
    for dtype in s["lu_dtypes"]:
        size = flops.bytes_per_element(dtype)
        for n in s["lu_sizes"]:
            timed = dict(flops=batched.lu_flops(n), bytes=2 * n * n * size, precision=dtype,
                         memory_bytes=batched.LU_CHECK_MATRICES * n * n * 8)
            work += [budget.once(f"getrf, n = {n}, {dtype}, checked", **timed),
                     budget.once(f"float64 L U of the check, n = {n}", flops=2 * n**3, precision="float64"),
                     Work(f"getrf, n = {n}, {dtype}", warmup=1, **timed)]
            if n <= s["cpu_max_n"]:
                work.append(budget.host_seconds(f"host getrf, n = {n}, {dtype}", _host_getrf(n, dtype)))
    return work


def _small_lu(s: dict) -> list[Work]:
    """batched_small_lu: per format, batch and order, the loop (one lu_factor_ex per matrix, as long as the host
    takes to issue it) and the batched call, each checked (one call, L U in float64) then timed."""
    work = []
    for dtype in s["lu_dtypes"]:
        size = flops.bytes_per_element(dtype)
        for batch in s["small_lu_batches"]:
            for n in s["small_lu_sizes"]:
                timed = dict(flops=batch * batched.lu_flops(n), bytes=2 * batch * n * n * size, precision=dtype,
                             memory_bytes=batched.LU_CHECK_MATRICES * batch * n * n * 8)
                loop = dict(launches=batch, least_seconds=batch * max(LOOP_LU_SECONDS, LOOP_LU_SECONDS_PER_N * n))
                for method, host in (("loop", loop), ("batched", {})):
                    label = f"{method} getrf, b = {batch}, n = {n}, {dtype}"
                    warmup = batched.LOOP_WARMUP if method == "loop" else budget.WARMUP
                    work += [budget.once(f"{label}, checked", **timed, **host),
                             budget.once(f"float64 L U of the check, {label}", flops=2 * batch * n**3,
                                         precision="float64"),
                             Work(label, warmup=warmup, **timed, **host)]
    return work


def work(s: dict) -> list[Work]:
    return [*_gemm(s), *_lu(s), *_small_lu(s)]


CHAPTER = budget.Chapter(name="14 batched linear algebra", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE,
                         work=work, fixed_seconds=lambda s: budget.NOTEBOOK_SECONDS)
