"""The experiments of the chapter "Tensor cores": matrix instructions, formats, a WMMA kernel, alignment.

A tensor core computes ``D = A B + C`` on small matrix tiles in one instruction, where a CUDA core
computes one fused multiply-add (FMA). This module measures what that buys and what it asks for:

- :func:`peak_rows` works out each GPU's tensor-core peak from its SMs, tensor cores per SM, FMA per
  clock and clock (:mod:`gpulab.specs`), beside the CUDA cores' float32 peak; :func:`tile_mma` is one
  tensor-core operation written out in plain arithmetic (float16 products, float32 or float16 sums);
- :func:`matmul_formats` multiplies the same float32 matrices in float32, TF32, float16, bfloat16 and
  (through ``torch._scaled_mm``, where the GPU has it) float8, and reports each one's rate and its error
  against float64;
- :func:`wmma_comparison` checks and times the course's WMMA kernels (``25_wmma_naive.cu``,
  ``26_wmma_pipelined.cu`` and variants of it) against cuBLAS in float16 and against the best SGEMM of
  the chapter "GEMM on the GPU" (:mod:`gpulab.gemm`) and cuBLAS in float32;
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
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from gpulab import env, flops, gemm, kernels, occupancy, plots, profiling, specs, timing
from gpulab.correctness import check_close, poisoned, random_tensor
from gpulab.kernels import cuda_c
from gpulab.mlp import layer_gemms
from gpulab.precision import MATMUL_TOLERANCE, float32_accumulation, matmul_mode
from gpulab.provenance import experiment
from gpulab.sweep import run_sweep
from gpulab.validation import (
    fits_in_memory,
    matmul_operands,
    positive_int,
    positive_ints,
    supported_dtype,
    unsupported_reason,
)

CHECK_ROWS = 256  # rows of a product compared with float64 (all of them for a smaller product)

# ---------------------------------------------------------------------------------------------
# Matrix instructions and the peak they imply

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

    peak = SMs x tensor cores per SM x FMA per clock per tensor core x 2 FLOP x clock (:func:`gpulab.specs.peak`).
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


# ---------------------------------------------------------------------------------------------
# The formats side by side: rate and error

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
    """Every format at n^3: rate, error and, on a GPU of :mod:`gpulab.specs`, the share of its peak.

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


def formats_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Each format as a point: its error against float64 (x, log) and its rate (y, log)."""
    fig = go.Figure()
    for i, r in enumerate(r for r in rows if r.get("status") == "ok"):
        fig.add_trace(go.Scatter(
            x=[r["relative_error"]], y=[r["tflops"]], mode="markers+text", name=r["format"], text=[r["format"]],
            textposition="top center", marker=dict(size=14, color=plots.PALETTE[i % len(plots.PALETTE)],
                                                   symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)]),
            hovertext=plots.hover_text(r, ("unit", "tflops", "relative_error", "fraction_of_peak")), hoverinfo="text",
        ))
    fig.update_layout(title=title, showlegend=False)
    fig.update_xaxes(type="log", title="relative error against float64 (lower is better)")
    fig.update_yaxes(type="log", title="TFLOP/s (higher is better)")
    return fig


# ---------------------------------------------------------------------------------------------
# The course's WMMA kernels


@dataclass(frozen=True)
class WmmaKernel:
    """One WMMA kernel file, how it is launched, and the tile each block computes."""

    file: str
    kernel: str
    label: str
    tile: tuple[int, int]  # rows x columns of C per block
    threads: int
    shared_bytes: int = 0  # dynamic shared memory per block
    defines: tuple[tuple[str, int], ...] = ()

    def grid(self, m: int, n: int) -> tuple[int, int]:
        return math.ceil(n / self.tile[1]), math.ceil(m / self.tile[0])


NAIVE = WmmaKernel("25_wmma_naive", "wmma_gemm_naive", "WMMA, fragments from global memory", (32, 32), 128)
# 26_wmma_pipelined.cu's defaults: tile sizes, pipeline depth, block order and epilogue
TUNABLE = {"BM": 128, "BN": 128, "BK": 32, "WM": 64, "WN": 64, "STAGES": 3, "GROUP_M": 1, "STAGED_EPILOGUE": 0}
SKEW = 8  # the halves each staged row is padded by (26_wmma_pipelined.cu)
MAX_SHARED_BYTES = 227 * 1024  # per block, opted in, on Hopper (and 163 KB on an A100)


def pipelined(**defines: int) -> WmmaKernel:
    """Step 2 (26_wmma_pipelined.cu) compiled with ``defines`` in place of its default sizes."""
    unknown = set(defines) - set(TUNABLE)
    if unknown:
        raise ValueError(f"defines: 26_wmma_pipelined.cu has {', '.join(TUNABLE)}; got {sorted(unknown)}")
    if defines.get("STAGED_EPILOGUE", 0) not in (0, 1):
        raise ValueError(f"defines: STAGED_EPILOGUE is 0 or 1, got {defines['STAGED_EPILOGUE']!r}")
    d = {**TUNABLE, **{k: v if k == "STAGED_EPILOGUE" else positive_int(k, v) for k, v in defines.items()}}
    if d["BM"] % d["WM"] or d["BN"] % d["WN"] or d["WM"] % 16 or d["WN"] % 16 or d["BK"] % 16:
        raise ValueError(f"defines: warp tiles WM x WN must divide BM x BN, all multiples of 16, and BK too; got {d}")
    threads = 32 * (d["BM"] // d["WM"]) * (d["BN"] // d["WN"])
    chunks_a, chunks_b = d["BM"] * d["BK"] // 8, d["BK"] * d["BN"] // 8
    if threads > 1024 or chunks_a % threads or chunks_b % threads or d["STAGES"] < 2:
        raise ValueError(f"defines: {threads} threads must copy whole 16-byte pieces of both tiles, and STAGES >= 2; "
                         f"got {d}")
    pipeline = d["STAGES"] * (d["BM"] * (d["BK"] + SKEW) + d["BK"] * (d["BN"] + SKEW)) * 2
    epilogue = threads // 32 * d["WM"] * (d["WN"] + 4) * 4 if d["STAGED_EPILOGUE"] else 0  # staged C, rows padded
    shared = max(pipeline, epilogue)
    if shared > MAX_SHARED_BYTES:
        raise ValueError(f"defines: {shared:,} bytes of shared memory per block, over the {MAX_SHARED_BYTES:,} a "
                         f"block may have; got {d}")
    changed = tuple(sorted((k, v) for k, v in d.items() if v != TUNABLE[k]))
    label = "WMMA, pipelined" + ("" if not changed else " (" + ", ".join(f"{k}={v}" for k, v in changed) + ")")
    return WmmaKernel("26_wmma_pipelined", "wmma_gemm_pipelined", label, (d["BM"], d["BN"]), threads, shared, changed)


PIPELINED = pipelined()
KERNELS = (NAIVE, PIPELINED)


def unavailable(kernel: WmmaKernel) -> str | None:
    """None if this GPU can run ``kernel``; otherwise why not (the pipelined kernel's cp.async needs Ampere)."""
    if kernel.file == PIPELINED.file and kernels.on_gpu() and torch.cuda.get_device_capability() < (8, 0):
        major, minor = torch.cuda.get_device_capability()
        return (f"cp.async, which {kernel.file}.cu uses, needs compute capability 8.0 (Ampere) or later; "
                f"this GPU is {major}.{minor}")
    return None


def resources(kernel: WmmaKernel) -> dict:
    """Registers (from the compiler), shared memory, and the resident blocks per SM they allow on this GPU
    (or on an H100 without one)."""
    report = cuda_c.compile_report(kernel.file, defines=dict(kernel.defines)).resources[kernel.kernel]
    shared = report.shared_bytes + kernel.shared_bytes
    capability = env.describe().compute_capability if kernels.on_gpu() else "9.0"
    resident = occupancy.theoretical(kernel.threads, report.registers, shared, occupancy.limits(capability))
    return {"registers": report.registers, "shared_bytes": shared,
            "spill_bytes": report.spill_stores_bytes + report.spill_loads_bytes, "threads": kernel.threads,
            "blocks_per_sm": resident.blocks_per_sm, "warps_per_sm": resident.blocks_per_sm * kernel.threads // 32}


def prepared(kernel: WmmaKernel, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> Callable[[], None]:
    """A function that runs ``kernel`` to compute ``C = A B`` (float16 A, B; float32 C), arguments checked here."""
    m, n, k = matmul_operands(A, B, C, torch.float16)
    if m % 16 or n % 16 or k % 16:
        raise ValueError(f"A, B: the WMMA kernels work on whole 16 x 16 fragments, so M, N and K must be multiples "
                         f"of 16; got {m} x {n} x {k}")
    return cuda_c.prepared(kernel.file, kernel.kernel, kernel.grid(m, n), kernel.threads, A, B, C, m, n, k,
                           shared_bytes=kernel.shared_bytes, defines=dict(kernel.defines))


def wmma_gemm(kernel: WmmaKernel, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B`` (float16) computed by ``kernel`` into a fresh float32 tensor (poisoned with NaN first)."""
    kernels.require_gpu(f"{kernel.file}.cu")
    C = poisoned((A.shape[0], B.shape[1]), torch.float32, A.device)
    prepared(kernel, A, B, C)()
    return C


def _fp16_operands(m: int, n: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return random_tensor((m, k), torch.float16, device), random_tensor((k, n), torch.float16, device)


def check(kernel: WmmaKernel, m: int, n: int, k: int, device: torch.device) -> float:
    """Relative error of ``kernel`` against float64 on fresh random float16 operands; raises above float32's
    matmul tolerance (the inputs are exact in float64, so only the float32 sums differ)."""
    A, B = _fp16_operands(m, n, k, device)
    return check_close(wmma_gemm(kernel, A, B), A.double() @ B.double(), MATMUL_TOLERANCE["float32"], kernel.label)


def _measure(run: Callable[[], object], m: int, n: int, k: int, device: torch.device) -> dict:
    t = timing.measure(run, device=device, flush_l2=False)  # as the SGEMM worklog times its kernels
    return {"seconds": t.median_s, "spread": t.spread, "tflops": flops.gemm(m, n, k).flops / t.median_s / 1e12}


def _cublas_fp16(n: int, device: torch.device) -> dict:
    A, B = _fp16_operands(n, n, n, device)
    C = poisoned((n, n), torch.float16, device)
    def run() -> torch.Tensor:
        return torch.mm(A, B, out=C)

    with float32_accumulation():  # float16 in, float32 sums, float16 out: what cuBLAS's HGEMM does for torch.mm
        error = check_close(run(), A.double() @ B.double(), MATMUL_TOLERANCE["float16"], "cuBLAS float16")
        return {**_measure(run, n, n, n, device), "relative_error": error,
                "kernels": ", ".join(kernels_run(run, device))}


@experiment("tensor_wmma")
def wmma_comparison(n: int = 4096, variants: Sequence[Mapping[str, int]] = ({},),
                    check_size: tuple[int, int, int] = (1008, 1200, 784)) -> list[dict]:
    """The WMMA kernels (step 1, and step 2 compiled with each of ``variants``), cuBLAS in float16, the best SGEMM
    of :mod:`gpulab.gemm` and cuBLAS in float32 (TF32 off), each checked against float64 and timed at n^3.

    Each kernel is first checked at ``check_size`` (multiples of 16 but of no block tile, so the edges are
    exercised), then at n^3. Rows carry 'fraction_of_cublas_fp16' and, on a GPU of :mod:`gpulab.specs`,
    'fraction_of_peak' (of the float16 tensor-core peak, or of the float32 CUDA-core peak for SGEMM); the
    cuBLAS float16 row names the kernels it ran.
    """
    n = positive_int("n", n)
    check_m, check_n, check_k = positive_ints("check_size", check_size)
    if n % 16 or check_m % 16 or check_n % 16 or check_k % 16:
        raise ValueError(f"n, check_size: multiples of 16 (whole WMMA fragments); got {n} and {check_size}")
    kernels.require_gpu("wmma_comparison")
    device = env.device()
    fits_in_memory("n", n * n * (2 * 2 + 4 + 3 * 8), device)  # operands, C, and the float64 check
    peak = specs.present()
    rows = []
    for kernel in (NAIVE, *(pipelined(**v) for v in variants)):
        reason = unavailable(kernel)
        if reason is not None:
            rows.append({"name": kernel.label, "file": kernel.file, "unit": specs.TENSOR_CORES,
                         "status": f"not available: {reason}"})
            continue
        check(kernel, check_m, check_n, check_k, device)
        error = check(kernel, n, n, n, device)
        A, B = _fp16_operands(n, n, n, device)
        C = poisoned((n, n), torch.float32, device)
        rows.append({"name": kernel.label, "file": kernel.file, "unit": specs.TENSOR_CORES,
                     "tile": f"{kernel.tile[0]}x{kernel.tile[1]}", **dict(kernel.defines),
                     **_measure(prepared(kernel, A, B, C), n, n, n, device), "relative_error": error,
                     **resources(kernel), "status": "ok"})
    rows.append({"name": "cuBLAS float16", "file": "cuBLAS", "unit": specs.TENSOR_CORES, **_cublas_fp16(n, device),
                 "status": "ok"})
    for r in gemm.worklog(n, steps=[gemm.BEST]):
        rows.append({"name": f"SGEMM step {r['step']}, {r['label']}" if r["step"] else "cuBLAS float32 (TF32 off)",
                     "file": r["file"], "unit": specs.CUDA_CORES, "tile": r.get("tile"), "seconds": r["seconds"],
                     "spread": r["spread"], "tflops": r["tflops"], "relative_error": r["relative_error"],
                     **{key: r[key] for key in ("registers", "shared_bytes", "spill_bytes", "threads",
                                                "blocks_per_sm") if key in r}, "status": "ok"})
    cublas = next(r["tflops"] for r in rows if r["name"] == "cuBLAS float16")
    for r in rows:
        if r["status"] != "ok":
            continue
        precision = "float16" if r["unit"] == specs.TENSOR_CORES else "float32"
        r.update(n=n, fraction_of_cublas_fp16=r["tflops"] / cublas,
                 fraction_of_peak=r["tflops"] / specs.peak(peak, precision, r["unit"]).tflops if peak else None)
    return rows


def wmma_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """TFLOP/s of every kernel of :func:`wmma_comparison` as horizontal bars in the table's order, tensor cores
    and CUDA cores in two colours and fills, each bar labelled with its share of cuBLAS float16; a dotted line
    at half of cuBLAS float16."""
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    fig = go.Figure()
    for i, unit in enumerate((specs.TENSOR_CORES, specs.CUDA_CORES)):
        chosen = [r for r in ok if r["unit"] == unit]
        fig.add_trace(go.Bar(
            orientation="h", y=[r["name"] for r in chosen], x=[r["tflops"] for r in chosen], name=f"on the {unit}",
            marker_color=plots.PALETTE[i], marker_pattern_shape=plots.PATTERNS[i], textposition="outside",
            text=[f"{r['tflops']:.0f} ({r['fraction_of_cublas_fp16']:.0%})" for r in chosen], cliponaxis=False,
            hovertext=[plots.hover_text(r, ("tflops", "relative_error", "registers", "shared_bytes", "blocks_per_sm"))
                       for r in chosen], hoverinfo="text",
        ))
    cublas = next((r["tflops"] for r in ok if r["name"] == "cuBLAS float16"), None)
    if cublas:
        fig.add_vline(x=cublas / 2, line_dash="dot", line_color="#444444", annotation_text="half of cuBLAS float16",
                      annotation_position="bottom right")
    fig.update_yaxes(autorange="reversed", automargin=True)  # the first row of the table at the top
    fig.update_layout(title=title, xaxis_title="TFLOP/s (labels: TFLOP/s and the share of cuBLAS float16)",
                      height=160 + 30 * len(ok), legend=dict(orientation="h", y=-0.15), margin=dict(r=90))
    return fig


# ---------------------------------------------------------------------------------------------
# Which kernels ran: TF32 switched on and off

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


# ---------------------------------------------------------------------------------------------
# A linear layer's three GEMMs: padding the vocabulary, batch sizes around a multiple of 8


def layer_gemms_timed(batch: int, inputs: int, outputs: int, dtype: str = "float16",
                      device: torch.device | None = None) -> list[dict]:
    """Check, then time, the three GEMMs of a linear layer's training step as autograd runs them for
    ``nn.Linear`` (weights outputs x inputs): ``X W^T``, ``dY W`` and ``dY^T X``. A row per GEMM with NVIDIA's
    M, N, K (:func:`gpulab.mlp.layer_gemms`), its time and TFLOP/s."""
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


def layer_gemms_figure(rows: Sequence[dict], x: str, *, title: str, x_title: str) -> go.Figure:
    """TFLOP/s of each GEMM of the layer (and the step) against ``x`` ('batch' or 'outputs'), as grouped bars;
    sizes that are multiples of 8 are marked in the axis labels."""
    ok = [r for r in rows if r.get("status") == "ok"]
    sizes = sorted({r[x] for r in ok})
    labels = {s: f"{s:,}" + (" (x8)" if s % 8 == 0 else "") for s in sizes}
    fig = go.Figure()
    for i, phase in enumerate(dict.fromkeys(r["gemm"] for r in ok)):
        chosen = sorted((r for r in ok if r["gemm"] == phase), key=lambda r: r[x])
        fig.add_trace(go.Bar(x=[labels[r[x]] for r in chosen], y=[r["tflops"] for r in chosen], name=phase,
                             marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                             marker_pattern_shape=plots.PATTERNS[i % len(plots.PATTERNS)],
                             hovertext=[plots.hover_text(r, ("M", "N", "K", "seconds", "tflops")) for r in chosen],
                             hoverinfo="text"))
    fig.update_layout(title=title, barmode="group", yaxis_title="TFLOP/s", xaxis_title=x_title,
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(type="category")
    return fig
