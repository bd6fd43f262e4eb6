"""The device's measured rates: one BLAS call checked and timed, a copy's bandwidth, and the two ceilings of
the roofline (the copy bandwidth and the GEMM rate per dtype) that many chapters measure their kernels against.

Taught in chapter 03 (BLAS levels), which sweeps :func:`measure_blas` over sizes and dtypes. Each call checks its
result against a float64 reference on fresh random data before timing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gpulab.core import env, flops, timing
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import dtype_name, fits_in_memory, positive_int, positive_ints, supported_dtype

OPS = ("axpy", "dot", "gemv", "gemm")
LEVEL = {"axpy": 1, "dot": 1, "gemv": 2, "gemm": 3}
CHECK_ROWS = 64  # rows of a GEMM result compared with the float64 reference
AXPY_ALPHA = 1e-3  # small, so thousands of timed y += alpha*x stay far from overflow in float16


def _operands(op: str, n: int, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    if op in ("axpy", "dot"):
        return {"x": random_tensor((n,), dtype, device), "y": random_tensor((n,), dtype, device)}
    if op == "gemv":
        return {"A": random_tensor((n, n), dtype, device), "x": random_tensor((n,), dtype, device),
                "y": random_tensor((n,), dtype, device)}
    return {"A": random_tensor((n, n), dtype, device), "B": random_tensor((n, n), dtype, device),
            "C": poisoned((n, n), dtype, device)}


def _operation(op: str, t: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
    """The call that is timed; each writes its result in place, as the BLAS routine does."""
    if op == "axpy":
        return lambda: t["y"].add_(t["x"], alpha=AXPY_ALPHA)
    if op == "dot":
        return lambda: torch.dot(t["x"], t["y"])
    if op == "gemv":
        return lambda: t["y"].addmv_(t["A"], t["x"])
    return lambda: torch.mm(t["A"], t["B"], out=t["C"])


def _check(op: str, t: dict[str, torch.Tensor], dtype_label: str) -> float:
    """Run ``op`` once on fresh data and compare it with float64 arithmetic on the same inputs."""
    d = {name: value.to(torch.float64, copy=True) for name, value in t.items()}  # copy: ops write in place
    result = _operation(op, t)()
    scale = None
    if op == "axpy":
        reference = d["y"] + AXPY_ALPHA * d["x"]
    elif op == "dot":
        reference = torch.dot(d["x"], d["y"])
        scale = torch.dot(d["x"].abs(), d["y"].abs()).item()  # a sum of random terms cancels: bound by |x|.|y|
    elif op == "gemv":
        reference = d["y"] + d["A"] @ d["x"]
    else:
        rows = torch.randperm(d["A"].shape[0], device=d["A"].device)[:CHECK_ROWS]
        return check_close(result[rows], d["A"][rows] @ d["B"], MATMUL_TOLERANCE[dtype_label], f"{op} {dtype_label}")
    return check_close(result.reshape(reference.shape), reference, MATMUL_TOLERANCE[dtype_label], f"{op} {dtype_label}",
                       scale)


def measure_blas(op: str, n: int, dtype: str = "float32", device: torch.device | None = None) -> dict:
    """Check then time one BLAS call of size ``n``; returns a row with time, GFLOP/s and GB/s."""
    if op not in OPS:
        raise ValueError(f"op: unknown operation {op!r}; choose one of {', '.join(OPS)}")
    device = device or env.device()
    n, label = positive_int("n", n), supported_dtype("dtype", dtype, device)
    cost = flops.blas(op, n, label)
    # the operands, plus float64 copies for the check
    elements = {"axpy": 2 * n, "dot": 2 * n, "gemv": n * n + 2 * n, "gemm": 3 * n * n}[op]
    fits_in_memory("n", elements * (flops.bytes_per_element(label) + 8), device)
    with matmul_mode(label) as torch_dtype:
        operands = _operands(op, n, torch_dtype, device)
        error = _check(op, operands, label)
        operands = _operands(op, n, torch_dtype, device)  # fresh data for the timed runs
        measured = timing.measure(_operation(op, operands), device=device)
    return {
        "op": op, "level": LEVEL[op], "n": n, "dtype": label,
        "seconds": measured.median_s, "spread": measured.spread,
        "flops": cost.flops, "bytes": cost.bytes, "intensity": cost.intensity,
        "gflops": cost.flops / measured.median_s / 1e9, "gbytes_per_s": cost.bytes / measured.median_s / 1e9,
        "relative_error": error,
    }


def blas_sweep(ops: Sequence[str], sizes: Sequence[int], dtypes: Sequence[str]) -> list[dict]:
    """Every op at every size and dtype; a size that does not fit is a row saying 'out of memory'."""
    sizes = positive_ints("sizes", sizes)
    points = [{"op": op, "n": n, "dtype": dtype_name(dt)} for dt in dtypes for op in ops for n in sizes]
    return run_sweep(measure_blas, points)



def measure_copy(nbytes: int, device: torch.device | None = None) -> dict:
    """Bandwidth of a device-to-device copy of ``nbytes``, counting the bytes read and the bytes written."""
    nbytes = positive_int("nbytes", nbytes)
    device = device or env.device()
    fits_in_memory("nbytes", 2 * nbytes, device)
    source = torch.randint(0, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=device)
    target = torch.full_like(source, -1)
    target.copy_(source)
    if not torch.equal(target, source):
        raise AssertionError("copy: the target differs from the source")
    measured = timing.measure(lambda: target.copy_(source), device=device)
    moved = 2 * source.numel() * 4
    return {"nbytes": source.numel() * 4, "seconds": measured.median_s, "spread": measured.spread,
            "gbytes_per_s": moved / measured.median_s / 1e9}


@experiment("blas_ceilings")
def ceilings(copy_bytes: int, matmul_n: int, dtypes: Sequence[str]) -> list[dict]:
    """The roofline's two ceilings on this device: copy bandwidth, and matmul rate per dtype."""
    rows = [{"ceiling": "bandwidth", **row} for row in run_sweep(measure_copy, [{"nbytes": copy_bytes}])]
    for row in blas_sweep(["gemm"], [matmul_n], dtypes):
        rows.append({"ceiling": "compute", **row})
    return rows
