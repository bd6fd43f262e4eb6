"""The experiments of the chapter "Tensor cores": matrix instructions, formats, a WMMA kernel, alignment.

A tensor core computes ``D = A B + C`` on small matrix tiles in one instruction, where a CUDA core
computes one fused multiply-add (FMA). This module measures what that buys and what it asks for:

- :func:`peak_rows` works out each GPU's tensor-core peak from its SMs, tensor cores per SM, FMA per
  clock and clock (:mod:`gpulab.core.specs`), beside the CUDA cores' float32 peak; :func:`tile_mma` is one
  tensor-core operation written out in plain arithmetic (float16 products, float32 or float16 sums);
- :func:`matmul_formats` multiplies the same float32 matrices in float32, TF32, float16, bfloat16 and
  (through ``torch._scaled_mm``, where the GPU has it) float8, and reports each one's rate and its error
  against float64;
- :func:`.wmma.wmma_comparison` checks and times the course's WMMA kernels (``25_wmma_naive.cu``,
  ``26_wmma_pipelined.cu`` and variants of it) against cuBLAS in float16 and against the best SGEMM of
  the chapter "GEMM on the GPU" (:mod:`gpulab.ch09_gemm_on_the_gpu.gemm`) and cuBLAS in float32;
- :func:`tf32_switch` runs a float32 matmul under each of PyTorch's TF32 switches and names the kernels
  that ran (from the profiler);
- :func:`layer_gemms_sweep` times the three GEMMs of a linear layer's training step for several shapes:
  the vocabulary-padding example and batch sizes around a multiple of 8.

Everything is checked against float64 on fresh random data before it is timed. The WMMA kernels need a
GPU (CUDA C through CuPy); without one they are only compiled (:func:`gpulab.kernels.cuda_c.compile_report`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from gpulab.ch04_mlp_gemms.mlp import layer_gemms
from gpulab.core import env, flops, profiling, specs, timing
from gpulab.core.correctness import check_close, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, float32_accumulation, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, supported_dtype, unsupported_reason

CHECK_ROWS = 256  # rows of a product compared with float64 (all of them for a smaller product)




# The PTX matrix instructions of each generation: a group of threads computes D = A B + C on an m x n x k
# tile: on Volta each quad-pair of 8 threads (a warp runs four such products at once), on Ampere a warp, on
# Hopper a warpgroup of four warps (the asynchronous wgmma, whose operands come straight from shared memory).
# WMMA's 16 x 16 x 16 fragments are built from these.
MATRIX_INSTRUCTIONS = (
    {"architecture": "Volta", "instruction": "mma.sync.m8n8k4", "issued by": "8 threads (4 per warp)",
     "m": 8, "n": 8, "k": 4},
    {"architecture": "Ampere", "instruction": "mma.sync.m16n8k16", "issued by": "a warp", "m": 16, "n": 8, "k": 16},
    {"architecture": "Hopper", "instruction": "wgmma.mma_async.m64n256k16", "issued by": "a warpgroup (4 warps)",
     "m": 64, "n": 256, "k": 16},
)
# The tile one tensor core multiplies per clock in float16, as NVIDIA's Volta and Ampere papers give it
# (m x n x k, FMA per clock); Hopper's papers give the rate (512 FMA per clock per tensor core), not a shape.
TILE_PER_CLOCK = {"Volta": (4, 4, 4), "Ampere": (8, 4, 8)}
PEAK_GPUS = ("V100 SXM2 32GB", "A100 SXM4 80GB", "H100 SXM5 80GB", "H200 SXM 141GB")


def peak_rows(names: Sequence[str] = PEAK_GPUS, precision: str = "float16") -> list[dict]:
    """The tensor-core peak of each GPU worked out from its hardware, with the CUDA cores' float32 peak beside it.

    peak = SMs x tensor cores per SM x FMA per clock per tensor core x 2 FLOP x clock (:func:`gpulab.core.specs.peak`).
    """
    rows = []
    for name in names:
        row = specs.gpu(name)
        tensor = specs.peak(row, precision, specs.TENSOR_CORES)
        fp32 = specs.peak(row, "float32", specs.CUDA_CORES)
        tile = TILE_PER_CLOCK.get(row.architecture)
        rows.append({
            "gpu": row.name, "architecture": row.architecture, "sms": row.sms,
            "tensor_cores_per_sm": row.tensor_cores_per_sm,
            "fma_per_clock_per_tensor_core": row.tensor_fma_per_clock[precision],
            "tile_per_clock": "x".join(map(str, tile)) if tile else None, "clock_ghz": tensor.clock_ghz,
            "tensor_tflops": tensor.tflops, "fp32_cuda_core_tflops": fp32.tflops,
            "ratio": tensor.tflops / fp32.tflops,
        })
    return rows


def tile_mma(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, accumulator: str = "float32") -> torch.Tensor:
    """``D = A B + C`` as a tensor core computes it: A and B rounded to float16, every product exact, the
    products of each output added to C one k at a time in the ``accumulator`` format ('float32' or 'float16').

    (Real tensor cores add several products at once inside one operation; this order is one of the
    orders they may use, and the rounding of the sum to the accumulator is the point.)
    """
    if A.dim() != 2 or B.dim() != 2 or C.dim() != 2 or A.shape[1] != B.shape[0] or C.shape != (A.shape[0], B.shape[1]):
        raise ValueError(f"A, B, C: shapes m x k, k x n and m x n, got {tuple(A.shape)}, {tuple(B.shape)}, "
                         f"{tuple(C.shape)}")
    if accumulator not in ("float32", "float16"):
        raise ValueError(f"accumulator: 'float32' or 'float16', got {accumulator!r}")
    dtype = getattr(torch, accumulator)
    a, b = A.to(torch.float16).double(), B.to(torch.float16).double()  # a product of two float16s is exact
    D = C.to(dtype)
    for k in range(A.shape[1]):
        D = (D.double() + torch.outer(a[:, k], b[k])).to(dtype)  # one rounding per addition
    return D





FORMATS_COMPARED = ("float32", "tf32", "float16", "bfloat16", "float8_e4m3fn")
# float8 with one scale per matrix: 3 fraction bits, unit roundoff 1/16, so an error of a few percent.
FP8_TOLERANCE = 0.15
PEAK_KEY = {"float32": "float32", "tf32": "tf32", "float16": "float16", "bfloat16": "bfloat16",
            "float8_e4m3fn": "float8"}


def fp8_unavailable(device: torch.device) -> str | None:
    """None if ``device`` multiplies float8 through ``torch._scaled_mm``; otherwise why not."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"this torch ({torch.__version__}) has no float8 matmul (torch._scaled_mm)"
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        return f"float8 tensor cores arrived with Ada and Hopper (compute capability 8.9); this GPU is {major}.{minor}"
    return None


def _scaled(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` in float8_e4m3fn, scaled so that its largest magnitude maps to 448 (the format's largest), and the
    scale that undoes it."""
    scale = (x.abs().max() / torch.finfo(torch.float8_e4m3fn).max).float()
    return (x / scale).to(torch.float8_e4m3fn), scale


def _product(fmt: str, A: torch.Tensor, B: torch.Tensor) -> tuple[Callable[[], torch.Tensor], float]:
    """The timed product of float32 A and B in ``fmt``, and the tolerance of its error against float64."""
    if fmt in ("float32", "tf32"):
        def run() -> torch.Tensor:
            with matmul_mode(fmt):
                return A @ B
        return run, MATMUL_TOLERANCE[fmt]
    if fmt in ("float16", "bfloat16"):
        a, b = A.to(getattr(torch, fmt)), B.to(getattr(torch, fmt))

        def run() -> torch.Tensor:
            with float32_accumulation():  # products summed in float32, as the tensor cores can
                return a @ b
        return run, MATMUL_TOLERANCE[fmt]
    a8, scale_a = _scaled(A)
    b8, scale_b = _scaled(B)
    b8 = b8.t().contiguous().t()  # _scaled_mm wants its second operand column-major

    def run() -> torch.Tensor:
        result = torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
        return result[0] if isinstance(result, tuple) else result  # older torch also returned the amax
    return run, FP8_TOLERANCE


def format_unavailable(fmt: str, device: torch.device) -> str | None:
    """None if ``device`` can multiply in ``fmt``; otherwise why not (a tensor-core mode on a CPU, say)."""
    if fmt not in FORMATS_COMPARED:
        raise ValueError(f"fmt: one of {', '.join(FORMATS_COMPARED)}, got {fmt!r}")
    if fmt == "float8_e4m3fn":
        return fp8_unavailable(device)
    return unsupported_reason(fmt, device)


def measure_format(n: int, fmt: str, device: torch.device | None = None) -> dict:
    """Check, then time, the n x n x n product of random float32 matrices in ``fmt``.

    The error is measured against float64 arithmetic on the float32 inputs, so it includes rounding the
    inputs to the format. A, B are seeded by n: every format multiplies the same matrices.
    """
    device = device or env.device()
    n = positive_int("n", n)
    reason = format_unavailable(fmt, device)
    if reason is not None:
        raise ValueError(f"fmt: {reason}")
    fits_in_memory("n", n * n * (3 * 4 + 2 * 2 + 8), device)
    generator = torch.Generator(device=device).manual_seed(n)
    A = random_tensor((n, n), torch.float32, device, generator)
    B = random_tensor((n, n), torch.float32, device, generator)
    run, tolerance = _product(fmt, A, B)
    rows = torch.randperm(n, device=device, generator=generator)[:CHECK_ROWS]
    error = check_close(run()[rows], A[rows].double() @ B.double(), tolerance, f"{n}^3 matmul in {fmt}")
    measured = timing.measure(run, device=device)
    return {"seconds": measured.median_s, "spread": measured.spread,
            "tflops": flops.gemm(n, n, n).flops / measured.median_s / 1e12, "relative_error": error}


@experiment("tensor_formats")
def matmul_formats(n: int, formats: Sequence[str] = FORMATS_COMPARED) -> list[dict]:
    """Every format at n^3: rate, error and, on a GPU of :mod:`gpulab.core.specs`, the share of its peak.

    A format this device lacks gets a row saying why instead of a measurement.
    """
    device = env.device()
    row = specs.present()
    rows = []
    for fmt in formats:
        reason = format_unavailable(fmt, device)
        unit = specs.CUDA_CORES if fmt == "float32" else specs.TENSOR_CORES
        if reason is not None:
            rows.append({"format": fmt, "unit": unit, "n": n, "status": f"not available: {reason}"})
            continue
        (measured,) = run_sweep(lambda **point: measure_format(point["n"], point["format"], device),
                                [{"n": n, "format": fmt}])
        peak = specs.peak(row, PEAK_KEY[fmt], unit).tflops if row else None
        rows.append({**measured, "unit": unit, "peak_tflops": peak,
                     "fraction_of_peak": measured["tflops"] / peak if peak and "tflops" in measured else None})
    return rows


TF32_SETTINGS = {  # a name a reader recognises: what it sets
    "allow_tf32 = False": {"allow_tf32": False, "precision": "highest"},
    "allow_tf32 = True": {"allow_tf32": True, "precision": None},
    'set_float32_matmul_precision("highest")': {"allow_tf32": None, "precision": "highest"},
    'set_float32_matmul_precision("high")': {"allow_tf32": None, "precision": "high"},
    'set_float32_matmul_precision("medium")': {"allow_tf32": None, "precision": "medium"},
}


def _with_setting(setting: Mapping, fn: Callable[[], object]) -> object:
    """Run ``fn()`` with PyTorch's float32 matmul switches set as ``setting`` says, then restore them."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    try:
        if setting["precision"] is not None:
            torch.set_float32_matmul_precision(setting["precision"])
        if setting["allow_tf32"] is not None:
            torch.backends.cuda.matmul.allow_tf32 = setting["allow_tf32"]
        return fn()
    finally:
        torch.set_float32_matmul_precision(saved[1])
        torch.backends.cuda.matmul.allow_tf32 = saved[0]


def kernels_run(fn: Callable[[], object], device: torch.device) -> list[str]:
    """The names of the GPU kernels one call of ``fn()`` launched (from ``torch.profiler``); on a CPU, the
    names of the operators it ran."""
    prof = profiling.profile_calls(fn, device)
    if device.type == "cuda":
        names = [name for name, _ in profiling.device_kernels(prof)]
    else:
        names = [e.name for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    return list(dict.fromkeys(names))  # each name once, in order


@experiment("tensor_tf32_switch")
def tf32_switch(n: int = 4096) -> list[dict]:
    """A float32 n^3 matmul under each of :data:`TF32_SETTINGS`: whether TF32 was allowed, the kernels that ran,
    the time and the error against float64 (TF32's larger error shows which arithmetic was used)."""
    device = env.device()
    n = positive_int("n", n)
    fits_in_memory("n", n * n * (3 * 4 + 8), device)
    A, B = random_tensor((n, n), torch.float32, device), random_tensor((n, n), torch.float32, device)
    rows = torch.randperm(n, device=device)[:CHECK_ROWS]
    reference = A[rows].double() @ B.double()

    def run() -> torch.Tensor:
        return A @ B

    found = []
    for name, setting in TF32_SETTINGS.items():
        def work(name: str = name) -> dict:
            error = check_close(run()[rows], reference, MATMUL_TOLERANCE["tf32"], name)
            return {"allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                    "matmul_precision": torch.get_float32_matmul_precision(), "relative_error": error,
                    "seconds": timing.measure(run, device=device).median_s, "kernels": kernels_run(run, device)}
        result = _with_setting(setting, work)
        found.append({"setting": name, **result, "tflops": flops.gemm(n, n, n).flops / result["seconds"] / 1e12})
    return found






def layer_gemms_timed(batch: int, inputs: int, outputs: int, dtype: str = "float16",
                      device: torch.device | None = None) -> list[dict]:
    """Check, then time, the three GEMMs of a linear layer's training step as autograd runs them for
    ``nn.Linear`` (weights outputs x inputs): ``X W^T``, ``dY W`` and ``dY^T X``. A row per GEMM with NVIDIA's
    M, N, K (:func:`gpulab.ch04_mlp_gemms.mlp.layer_gemms`), its time and TFLOP/s."""
    device = device or env.device()
    batch, inputs, outputs = (positive_int(k, v) for k, v in (("batch", batch), ("inputs", inputs),
                                                                ("outputs", outputs)))
    label = supported_dtype("dtype", dtype, device)
    size = flops.bytes_per_element(label)
    fits_in_memory("batch", 2 * (batch * inputs + outputs * inputs + batch * outputs) * size
                   + 8 * CHECK_ROWS * max(inputs, outputs, batch), device)
    with matmul_mode(label) as torch_dtype:
        X = random_tensor((batch, inputs), torch_dtype, device) / math.sqrt(inputs)  # |Y| near 1 in float16
        W = random_tensor((outputs, inputs), torch_dtype, device)
        dY = random_tensor((batch, outputs), torch_dtype, device) / math.sqrt(max(batch, outputs))
        products = {  # phase: (the product, its reference on a few rows of the result)
            "forward propagation": (lambda: X @ W.T, lambda r: X[r].double() @ W.double().T),
            "activation gradient": (lambda: dY @ W, lambda r: dY[r].double() @ W.double()),
            "weight gradient": (lambda: dY.T @ X, lambda r: dY[:, r].double().T @ X.double()),
        }
        found = []
        with float32_accumulation():
            for shape in layer_gemms(batch, inputs, outputs):
                run, reference = products[shape["phase"]]
                result = run()
                picked = torch.randperm(result.shape[0], device=device)[:CHECK_ROWS]
                error = check_close(result[picked], reference(picked), MATMUL_TOLERANCE[label],
                                    f"{shape['phase']} of a {batch} x {inputs} -> {outputs} layer in {label}")
                measured = timing.measure(run, device=device)
                found.append({"gemm": shape["phase"], "M": shape["M"], "N": shape["N"], "K": shape["K"],
                              "seconds": measured.median_s, "tflops": shape["flops"] / measured.median_s / 1e12,
                              "relative_error": error})
    return found


@experiment("tensor_batch_sizes", "tensor_vocabulary")
def layer_gemms_sweep(shapes: Sequence[Mapping[str, int]], dtype: str = "float16") -> list[dict]:
    """:func:`layer_gemms_timed` for each shape ({'batch', 'inputs', 'outputs'}): a row per shape and GEMM, plus
    a row per shape for the whole step ('gemm': 'step', its time the sum of the three)."""
    device = env.device()
    found = []
    for shape in shapes:
        point = {key: positive_int(key, shape[key]) for key in ("batch", "inputs", "outputs")}
        for row in run_sweep(lambda **p: {"gemms": layer_gemms_timed(**p, dtype=dtype, device=device)}, [point]):
            if row["status"] != "ok":
                found.append({**point, "dtype": dtype, "gemm": "step", "status": row["status"]})
                continue
            for g in row["gemms"]:
                found.append({**point, "dtype": dtype, **g, "status": "ok"})
            seconds = sum(g["seconds"] for g in row["gemms"])
            work = 3 * 2 * point["batch"] * point["inputs"] * point["outputs"]
            found.append({**point, "dtype": dtype, "gemm": "step", "seconds": seconds, "tflops": work / seconds / 1e12,
                          "status": "ok"})
    return found
