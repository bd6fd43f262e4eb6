"""Batched linear algebra: many small independent problems, and the LU factorisation on the CPU and the GPU.

A GPU is fast when thousands of its threads are busy. One small matrix product (64 x 64) is the work
of a few thread blocks and takes about as long as its launch, so a Python loop that launches one GEMM
per problem measures launches, not arithmetic. A *batched* routine (MAGMA's ``magma_dgemm_batched``,
cuBLAS's ``cublasGemmStridedBatched``, torch's ``bmm``) takes all the problems in one call and spreads
them over the whole GPU {abdelfattah2016batched}. When the problems share an operand, they need no
batched routine at all: stacked, they are one large GEMM. :func:`gemm_sweep` measures the three ways.

The second half measures the LU factorisation with partial pivoting (LAPACK's getrf) the way MAGMA's
tester ``testing_dgetrf`` does: GFLOP/s on the CPU and on the GPU, and the backward
error ||P^T A - L U||_F / (n ||A||_F) of every factorisation (:func:`lu_sweep`); then
many small factorisations, one call for the whole batch against a loop (:func:`small_lu_sweep`)
{haidar2015batched}.

Every experiment returns rows (one dict per measurement) and checks its results against float64
arithmetic on fresh random data before it times anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from gpulab.core import env, flops, timing
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.precision import FORMATS, MATMUL_TOLERANCE, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import ok_rows, run_sweep
from gpulab.core.validation import (
    DTYPES,
    dtype_name,
    fits_in_memory,
    positive_int,
    positive_ints,
    supported_dtype,
    unsupported_reason,
)

METHODS = ("loop", "bmm", "one_gemm")
METHOD_LABELS = {
    "loop": "Python loop of torch.mm",
    "bmm": "torch.bmm (one batched call)",
    "one_gemm": "one tall GEMM (shared B)",
}
LOOP_WARMUP = 1  # warm-up runs of a loop: each is a thousand launches, and one warms every kernel it uses


def _gemm_operands(method: str, n: int, batch: int, dtype: torch.dtype,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of A_i, the B_i (one shared B for ``one_gemm``), and a NaN-poisoned batch of C_i."""
    A = random_tensor((batch, n, n), dtype, device)
    B = random_tensor((n, n) if method == "one_gemm" else (batch, n, n), dtype, device)
    return A, B, poisoned((batch, n, n), dtype, device)


def gemm_call(method: str, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> Callable[[], object]:
    """The call that is timed: C_i <- A_i B_i for every i, written into ``C`` (batch x n x n).

    - ``loop``: one ``torch.mm`` per problem, so one kernel launch per problem;
    - ``bmm``: one ``torch.bmm`` for the whole batch (cuBLAS's strided batched GEMM on a GPU);
    - ``one_gemm``: every problem has the same B (an n x n matrix), so the A_i stacked on top of each
      other are one (batch n) x n matrix, and one GEMM computes all the C_i. ``view`` makes no copy:
      a contiguous batch of A_i already *is* the stacked matrix.
    """
    if method == "loop":
        problems = list(zip(A.unbind(0), B.unbind(0), C.unbind(0), strict=True))  # views, made once, outside

        def loop() -> None:
            for a, b, c in problems:
                torch.mm(a, b, out=c)

        return loop
    if method == "bmm":
        return lambda: torch.bmm(A, B, out=C)
    if method == "one_gemm":
        batch, n, _ = A.shape
        stacked_A, stacked_C = A.view(batch * n, n), C.view(batch * n, n)
        return lambda: torch.mm(stacked_A, B, out=stacked_C)
    raise ValueError(f"method: unknown method {method!r}; choose one of {', '.join(METHODS)}")


def gemm_cost(method: str, n: int, batch: int, dtype: str = "float32") -> flops.Cost:
    """FLOP and fewest bytes of ``batch`` products of n x n matrices: the same FLOP for every method,
    but ``one_gemm`` reads its shared B once instead of ``batch`` different B_i."""
    if method == "one_gemm":
        return flops.gemm(batch * n, n, n, dtype)
    one = flops.gemm(n, n, n, dtype)
    return flops.Cost(flops=batch * one.flops, bytes=batch * one.bytes)


def measure_batched_gemm(method: str, n: int, batch: int, dtype: str = "float32",
                         device: torch.device | None = None) -> dict:
    """Check, then time, ``batch`` products of n x n matrices computed by ``method``; returns a row."""
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r}; choose one of {', '.join(METHODS)}")
    device = device or env.device()
    n, batch = positive_int("n", n), positive_int("batch", batch)
    label = supported_dtype("dtype", dtype, device)
    cost = gemm_cost(method, n, batch, label)
    # the operands and the float64 reference, with its float64 copies of A and B
    fits_in_memory("batch", 3 * batch * n * n * (flops.bytes_per_element(label) + 8), device)
    with matmul_mode(label) as torch_dtype:
        A, B, C = _gemm_operands(method, n, batch, torch_dtype, device)
        gemm_call(method, A, B, C)()
        reference = A.double() @ B.double()  # for one_gemm, B (n x n) broadcasts over the batch
        error = check_close(C, reference, MATMUL_TOLERANCE[label], f"{method}, n = {n}, batch {batch}, {label}")
        del reference
        A, B, C = _gemm_operands(method, n, batch, torch_dtype, device)  # fresh data for the timed runs
        measured = timing.measure(gemm_call(method, A, B, C), device=device,
                                  warmup=LOOP_WARMUP if method == "loop" else 3)
    return {
        "method": method, "n": n, "batch": batch, "dtype": label,
        "seconds": measured.median_s, "spread": measured.spread, "us_per_problem": measured.median_s / batch * 1e6,
        "flops": cost.flops, "bytes": cost.bytes, "intensity": cost.intensity,
        "gflops": cost.flops / measured.median_s / 1e9, "relative_error": error,
    }


@experiment("batched_gemm")
def gemm_sweep(sizes: Sequence[int], batches: Sequence[int], dtypes: Sequence[str] = ("float32",),
               methods: Sequence[str] = METHODS) -> list[dict]:
    """Every method at every matrix order, batch count and dtype, on this chapter's device.

    A dtype the device lacks (tf32 on a CPU, or on a GPU older than Ampere) is one row with status
    'not run: <why>'; a point that does not fit in memory is a row with status 'out of memory'.
    """
    sizes, batches = positive_ints("sizes", sizes), positive_ints("batches", batches)
    for method in methods:
        if method not in METHODS:
            raise ValueError(f"methods: unknown method {method!r}; choose from {', '.join(METHODS)}")
    device, labels = env.device(), [dtype_name(d) for d in dtypes]
    reasons = {label: unsupported_reason(label, device) for label in labels}
    runnable = [label for label, reason in reasons.items() if reason is None]
    rows = [{"dtype": label, "status": f"not run: {reason}"} for label, reason in reasons.items() if reason]
    points = [{"method": m, "n": n, "batch": b, "dtype": d} for d in runnable for b in batches for m in methods
              for n in sizes]
    return rows + run_sweep(measure_batched_gemm, points)


def speedups(rows: Iterable[dict], baseline: str = "loop") -> list[dict]:
    """For each measured point: its time and how many times faster it is than ``baseline`` at the same
    (dtype, batch, n). Points without a baseline measurement are left out."""
    good = ok_rows(rows)
    base = {(r["dtype"], r["batch"], r["n"]): r["seconds"] for r in good if r["method"] == baseline}
    return [{"dtype": r["dtype"], "batch": r["batch"], "n": r["n"], "method": r["method"], "seconds": r["seconds"],
             "speedup": base[key] / r["seconds"]}
            for r in good if (key := (r["dtype"], r["batch"], r["n"])) in base]


def gemm_target(rows: Iterable[dict], n: int = 64, batch: int = 1000, dtype: str = "float32",
                factor: float = 20.0, method: str = "bmm") -> dict:
    """Whether ``method`` ran ``batch`` products of order ``n`` at least ``factor`` times faster than the loop.

    Returns {'ratio', 'met', 'reason'}: the measured ratio (None when a row is missing, and then
    'reason' says which), and whether it reaches ``factor``.
    """
    found = {r["method"]: r for r in speedups(rows) if (r["n"], r["batch"], r["dtype"]) == (n, batch, dtype)}
    if "loop" not in found or method not in found:
        return {"ratio": None, "met": False,
                "reason": f"no measurement of both the loop and {method} at n = {n}, batch {batch}, {dtype}"}
    ratio = found[method]["speedup"]
    return {"ratio": ratio, "met": ratio >= factor, "reason": None}





LU_DTYPES = ("float64", "float32")  # LAPACK's d and s: torch factorises in these (and complex) only
TOLERANCE_FACTOR = 30  # MAGMA's testers pass an error below 30 * lamch('E'), LAPACK's unit roundoff


def lu_flops(n: int) -> float:
    """Floating-point operations of the LU factorisation of an n x n matrix: 2n^3/3 - n^2/2 - n/6.

    Step k (k = 1 ... n-1) has r = n - k rows below the pivot: r divisions make the multipliers (the
    column of L), and the r x r trailing matrix takes a rank-1 update, r^2 multiplies and r^2
    subtractions. Summed over r = 1 ... n-1: (n^2 - n)/2 + (n - 1) n (2n - 1)/3. Pivoting compares and
    swaps, and does no arithmetic. The leading term, 2n^3/3, is the one usually quoted.
    """
    n = positive_int("n", n)
    return 2 * n**3 / 3 - n**2 / 2 - n / 6


def lu_dtype(dtype: str) -> str:
    """``dtype`` if torch can LU-factorise in it (float64 or float32); otherwise ValueError naming it."""
    label = dtype_name(dtype)
    if label not in LU_DTYPES:
        raise ValueError(f"dtype: the LU factorisation runs in {' or '.join(LU_DTYPES)} (LAPACK's d and s "
                         f"routines), not {label}")
    return label


def lu_tolerance(dtype: str) -> float:
    """30 unit roundoffs of ``dtype``: the largest backward error MAGMA's testers pass as 'ok'."""
    return TOLERANCE_FACTOR * FORMATS[lu_dtype(dtype)].unit_roundoff


def lu_backward_error(A: torch.Tensor, LU: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """||P^T A - L U||_F / (n ||A||_F) of each matrix (of a batch ... x n x n), computed in float64.

    This is the check of MAGMA's getrf testers, |PA - LU| / (n |A|) with Frobenius norms. Mind the
    direction of the permutation: LAPACK's getrf, and so ``torch.linalg.lu_factor``, computes
    P_lapack A = L U, while ``torch.lu_unpack`` returns P = P_lapack^T, with A = P L U. So
    the rows of A in pivot order are P^T A, and they, not P A, equal L U.
    Row i of P^T A is row k of A, where P[k, i] = 1: the rows are gathered instead of multiplied by P.
    """
    A64 = A.to(torch.float64)
    P, L, U = torch.lu_unpack(LU.to(torch.float64), pivots)
    order = P.argmax(dim=-2)  # order[..., i] = the row k of A with P[k, i] = 1
    pivoted = torch.take_along_dim(A64, order.unsqueeze(-1), dim=-2)  # P^T A
    residual = torch.linalg.matrix_norm(pivoted - L @ U)
    return residual / (A.shape[-1] * torch.linalg.matrix_norm(A64))


def check_lu(A: torch.Tensor, LU: torch.Tensor, pivots: torch.Tensor, info: torch.Tensor, dtype: str,
             what: str) -> float:
    """The largest backward error of the factorisations of ``A`` (one matrix or a batch); raises
    AssertionError if a factorisation failed (info != 0), or if the error is NaN or above :func:`lu_tolerance`."""
    if (info != 0).any():
        raise AssertionError(f"{what}: getrf reported a zero pivot (info = {info.max().item()})")
    error = lu_backward_error(A, LU, pivots).max().item()
    if not error <= lu_tolerance(dtype):  # written this way so that NaN fails
        raise AssertionError(f"{what}: backward error {error:.3g} exceeds {lu_tolerance(dtype):.2g} "
                             f"({TOLERANCE_FACTOR} unit roundoffs of {dtype})")
    return error


def processor(device: torch.device) -> str:
    """What factorises on ``device``: the GPU's name, or the CPU with torch's threads and LAPACK."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    config = torch.__config__.show()
    lapack = next((part.split("=", 1)[1] for part in config.replace("\n", ",").split(",")
                   if part.strip().startswith("LAPACK_INFO=")), "LAPACK")
    return f"CPU, {torch.get_num_threads()} threads, {lapack.strip()}"


# The check's float64 copies on the device: A, L U, P, L, U, P^T A and their difference, besides the factors.
LU_CHECK_MATRICES = 8


def measure_lu(n: int, dtype: str = "float64", device: torch.device | None = None) -> dict:
    """Check, then time, the LU factorisation (``torch.linalg.lu_factor_ex``) of a random n x n matrix.

    Returns a row with the time, GFLOP/s (from :func:`lu_flops`), the backward error of the checked
    factorisation and the tolerance it passed.
    """
    device = device or env.device()
    n, label = positive_int("n", n), lu_dtype(dtype)
    fits_in_memory("n", LU_CHECK_MATRICES * n * n * 8, device)
    torch_dtype = DTYPES[label]
    with matmul_mode(label):  # TF32 off for the check's float64 products (and for anything getrf calls)
        A = random_tensor((n, n), torch_dtype, device)
        error = check_lu(A, *torch.linalg.lu_factor_ex(A), label, f"getrf, n = {n}, {label}, {device.type}")
        A = random_tensor((n, n), torch_dtype, device)  # fresh data for the timed runs
        # lu_factor_ex leaves the info check to us, so nothing inside the timed call waits for the GPU
        measured = timing.measure(lambda: torch.linalg.lu_factor_ex(A), device=device, warmup=1)
    work = lu_flops(n)
    return {"n": n, "dtype": label, "device": device.type, "processor": processor(device),
            "seconds": measured.median_s, "spread": measured.spread, "flops": work,
            "gflops": work / measured.median_s / 1e9, "backward_error": error, "tolerance": lu_tolerance(label)}


def _measure_lu_on(n: int, dtype: str, device: str) -> dict:
    return measure_lu(n, dtype, torch.device("cpu") if device == "cpu" else env.device())


@experiment("batched_lu")
def lu_sweep(sizes: Sequence[int], dtypes: Sequence[str] = LU_DTYPES, cpu_max_n: int = 8192) -> list[dict]:
    """getrf at every size and dtype on the host CPU (up to ``cpu_max_n``) and, where there is one, on the GPU.

    The CPU is torch's LAPACK on the host (MKL or OpenBLAS, all of torch's threads). Sizes above
    ``cpu_max_n`` get a CPU row with status 'not run: ...': a CPU takes minutes over what a GPU does in a second.
    """
    sizes, cpu_max_n = positive_ints("sizes", sizes), positive_int("cpu_max_n", cpu_max_n)
    dtypes = [lu_dtype(d) for d in dtypes]
    devices = ["cpu", "cuda"] if env.device().type == "cuda" else ["cpu"]
    rows = []
    for dtype in dtypes:
        for device in devices:
            points = [{"n": n, "dtype": dtype, "device": device} for n in sizes if device != "cpu" or n <= cpu_max_n]
            rows += run_sweep(_measure_lu_on, points)
        rows += [{"n": n, "dtype": dtype, "device": "cpu", "status": f"not run: n above cpu_max_n = {cpu_max_n}"}
                 for n in sizes if n > cpu_max_n]
    return rows


def lu_comparison(rows: Iterable[dict]) -> list[dict]:
    """What the rows of :func:`lu_sweep` say, one dict per dtype: the best row on each processor
    ('cpu_best', 'gpu_best'), the smallest n at which the GPU was faster than the CPU ('crossover_n'),
    and the GPU's speed over the CPU's at the largest n both measured ('largest_common_n', 'gpu_over_cpu').
    A value is None where there is nothing to compare."""
    good = ok_rows(rows)
    found = []
    for dtype in dict.fromkeys(r["dtype"] for r in good):
        cpu = {r["n"]: r for r in good if r["dtype"] == dtype and r["device"] == "cpu"}
        gpu = {r["n"]: r for r in good if r["dtype"] == dtype and r["device"] == "cuda"}
        common = sorted(set(cpu) & set(gpu))
        faster = [n for n in common if gpu[n]["gflops"] > cpu[n]["gflops"]]
        found.append({
            "dtype": dtype,
            "cpu_best": max(cpu.values(), key=lambda r: r["gflops"]) if cpu else None,
            "gpu_best": max(gpu.values(), key=lambda r: r["gflops"]) if gpu else None,
            "crossover_n": faster[0] if faster else None,
            "largest_common_n": common[-1] if common else None,
            "gpu_over_cpu": gpu[common[-1]]["gflops"] / cpu[common[-1]]["gflops"] if common else None,
        })
    return found





LU_METHODS = ("loop", "batched")
LU_METHOD_LABELS = {"loop": "Python loop of lu_factor_ex", "batched": "lu_factor_ex on the batch (one call)"}


def lu_call(method: str, A: torch.Tensor) -> Callable[[], object]:
    """The timed call: factorise every matrix of the batch ``A`` (batch x n x n), one call per matrix
    (``loop``) or one call for them all (``batched``)."""
    if method == "loop":
        matrices = A.unbind(0)

        def loop() -> list:
            return [torch.linalg.lu_factor_ex(a) for a in matrices]

        return loop
    if method == "batched":
        return lambda: torch.linalg.lu_factor_ex(A)
    raise ValueError(f"method: unknown method {method!r}; choose one of {', '.join(LU_METHODS)}")


def _factors(method: str, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    result = lu_call(method, A)()
    if method == "loop":
        return tuple(torch.stack(parts) for parts in zip(*result, strict=True))  # type: ignore[return-value]
    return result


def measure_small_lu(method: str, n: int, batch: int, dtype: str = "float64",
                     device: torch.device | None = None) -> dict:
    """Check, then time, the LU factorisations of ``batch`` random n x n matrices by ``method``; returns a row."""
    if method not in LU_METHODS:
        raise ValueError(f"method: unknown method {method!r}; choose one of {', '.join(LU_METHODS)}")
    device = device or env.device()
    n, batch, label = positive_int("n", n), positive_int("batch", batch), lu_dtype(dtype)
    fits_in_memory("batch", LU_CHECK_MATRICES * batch * n * n * 8, device)
    with matmul_mode(label):
        A = random_tensor((batch, n, n), DTYPES[label], device)
        error = check_lu(A, *_factors(method, A), label, f"{method} getrf, n = {n}, batch {batch}, {label}")
        A = random_tensor((batch, n, n), DTYPES[label], device)
        measured = timing.measure(lu_call(method, A), device=device, warmup=LOOP_WARMUP if method == "loop" else 3)
    work = batch * lu_flops(n)
    return {"method": method, "n": n, "batch": batch, "dtype": label, "seconds": measured.median_s,
            "spread": measured.spread, "us_per_problem": measured.median_s / batch * 1e6, "flops": work,
            "gflops": work / measured.median_s / 1e9, "backward_error": error, "tolerance": lu_tolerance(label)}


@experiment("batched_small_lu")
def small_lu_sweep(sizes: Sequence[int], batches: Sequence[int], dtypes: Sequence[str] = LU_DTYPES,
                   methods: Sequence[str] = LU_METHODS) -> list[dict]:
    """Both methods at every matrix order, batch count and dtype, on this chapter's device."""
    sizes, batches = positive_ints("sizes", sizes), positive_ints("batches", batches)
    dtypes = [lu_dtype(d) for d in dtypes]
    for method in methods:
        if method not in LU_METHODS:
            raise ValueError(f"methods: unknown method {method!r}; choose from {', '.join(LU_METHODS)}")
    points = [{"method": m, "n": n, "batch": b, "dtype": d} for d in dtypes for b in batches for m in methods
              for n in sizes]
    return run_sweep(measure_small_lu, points)
