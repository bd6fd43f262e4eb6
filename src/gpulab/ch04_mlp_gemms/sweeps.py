"""Chapter 04's measurements: a linear layer's forward and backward GEMMs timed against the batch size,
the feature sizes and their alignment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from gpulab.ch04_mlp_gemms.mlp import CHECK_ROWS, CPU_REPEATS, GPU_REPEATS
from gpulab.core import env, flops, timing
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import ok_rows, run_sweep
from gpulab.core.validation import dtype_name, fits_in_memory, positive_int, positive_ints, supported_dtype


def measure_linear(batch: int, inputs: int, outputs: int, dtype: str = "float16",
                   device: torch.device | None = None, repeats: int | None = None) -> dict:
    """Check, then time, a linear layer's forward GEMM Y = X W^T as nn.Linear computes it (no bias).

    X is batch x inputs and W is outputs x inputs, both contiguous (nn.Linear's layout), so cuBLAS
    runs M = outputs, N = batch, K = inputs. Returns a row with the time and TFLOP/s.
    """
    device = device or env.device()
    batch, inputs = positive_int("batch", batch), positive_int("inputs", inputs)
    outputs = positive_int("outputs", outputs)
    label = supported_dtype("dtype", dtype, device)
    if label == "float64":
        raise ValueError("dtype: the layer is measured in float32, tf32, float16 or bfloat16; float64 is the reference")
    size = flops.bytes_per_element(label)
    fits_in_memory("batch", (batch * inputs + outputs * inputs + batch * outputs) * size + outputs * inputs * 8, device)
    repeats = repeats or (GPU_REPEATS if device.type == "cuda" else CPU_REPEATS)
    with matmul_mode(label) as torch_dtype:
        X = random_tensor((batch, inputs), torch_dtype, device) / math.sqrt(inputs)  # keeps |Y| near 1 in float16
        W = random_tensor((outputs, inputs), torch_dtype, device)
        Y = poisoned((batch, outputs), torch_dtype, device)
        forward = _forward_gemm(X, W, Y)
        rows = torch.randperm(batch, device=device)[:CHECK_ROWS]
        error = check_close(forward()[rows], X[rows].double() @ W.double().T, MATMUL_TOLERANCE[label],
                            f"linear layer {batch}x{inputs} -> {outputs} in {label}")
        measured = timing.measure(forward, device=device, repeats=repeats)
    work = 2 * batch * inputs * outputs
    return {"batch": batch, "inputs": inputs, "outputs": outputs, "dtype": label, "M": outputs, "N": batch,
            "K": inputs, "seconds": measured.median_s, "spread": measured.spread, "flops": work,
            "tflops": work / measured.median_s / 1e12, "relative_error": error}


def _forward_gemm(X: torch.Tensor, W: torch.Tensor, Y: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch.mm(X, W.T, out=Y)


@experiment("mlp_fc_batch_sweep")
def fc_batch_sweep(batches: Sequence[int], inputs: int, outputs: int, dtypes: Sequence[str]) -> list[dict]:
    """The forward GEMM's rate against batch size (NVIDIA's N), inputs and outputs fixed."""
    batches = positive_ints("batches", batches)
    points = [{"batch": b, "inputs": inputs, "outputs": outputs, "dtype": dtype_name(d)} for d in dtypes
              for b in batches]
    return run_sweep(measure_linear, points)


@experiment("mlp_fc_feature_sweep")
def fc_feature_sweep(features: Sequence[int], batch: int, fixed: int, dtypes: Sequence[str]) -> list[dict]:
    """The rate against the number of outputs (NVIDIA's M), then of inputs (K); the other feature count is ``fixed``.

    Each row says which dimension it varies in 'vary' and its value in 'features'.
    """
    features = positive_ints("features", features)
    points = []
    for d in dtypes:
        points += [{"vary": "outputs", "features": f, "batch": batch, "inputs": fixed, "outputs": f,
                    "dtype": dtype_name(d)} for f in features]
        points += [{"vary": "inputs", "features": f, "batch": batch, "inputs": f, "outputs": fixed,
                    "dtype": dtype_name(d)} for f in features]

    def measure(vary, features, **point):
        return measure_linear(**point)

    return run_sweep(measure, points)


@experiment("mlp_alignment", "tensor_alignment")
def alignment_sweep(base: int, sizes: Sequence[int], dtypes: Sequence[str]) -> list[dict]:
    """The multiple-of-8 rule: each of batch, inputs and outputs in turn takes each of ``sizes``, the others ``base``.

    Rows carry 'vary', 'size', 'multiple_of_8' and 'relative', the rate over that dimension's rate at ``base``.
    """
    base, sizes = positive_int("base", base), positive_ints("sizes", sizes)
    if base not in sizes:
        sizes = [base, *sizes]
    points = [{"vary": dim, "size": s, "dtype": dtype_name(d), "batch": base, "inputs": base, "outputs": base, dim: s}
              for d in dtypes for dim in ("batch", "inputs", "outputs") for s in sizes]

    def measure(vary, size, **point):
        return measure_linear(**point)

    rows = run_sweep(measure, points)
    at_base = {(r["vary"], r["dtype"]): r["tflops"] for r in ok_rows(rows) if r["size"] == base}
    for row in rows:
        row["multiple_of_8"] = row["size"] % 8 == 0
        if row["status"] == "ok" and (row["vary"], row["dtype"]) in at_base:
            row["relative"] = row["tflops"] / at_base[row["vary"], row["dtype"]]
    return rows
