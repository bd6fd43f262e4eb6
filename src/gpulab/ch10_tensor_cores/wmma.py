"""The course's WMMA kernels (``25_wmma_naive.cu``, ``26_wmma_pipelined.cu`` and variants of it): compiled,
checked against a float64 reference on fresh random data, and timed against cuBLAS in float16 and against the best
SGEMM of chapter 09.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from gpulab.ch09_gemm_on_the_gpu import gemm
from gpulab.ch10_tensor_cores.tensor_cores import kernels_run
from gpulab.core import env, flops, kernel_mode, occupancy, specs, timing
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, float32_accumulation
from gpulab.core.provenance import experiment
from gpulab.core.validation import fits_in_memory, matmul_operands, positive_int, positive_ints
from gpulab.kernels import cuda_c


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
    if kernel.file == PIPELINED.file and kernel_mode.on_gpu() and torch.cuda.get_device_capability() < (8, 0):
        major, minor = torch.cuda.get_device_capability()
        return (f"cp.async, which {kernel.file}.cu uses, needs compute capability 8.0 (Ampere) or later; "
                f"this GPU is {major}.{minor}")
    return None


def resources(kernel: WmmaKernel) -> dict:
    """Registers (from the compiler), shared memory, and the resident blocks per SM they allow on this GPU
    (or on an H100 without one)."""
    report = cuda_c.compile_report(kernel.file, defines=dict(kernel.defines)).resources[kernel.kernel]
    shared = report.shared_bytes + kernel.shared_bytes
    capability = env.describe().compute_capability if kernel_mode.on_gpu() else "9.0"
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
    kernel_mode.require_gpu(f"{kernel.file}.cu")
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
    """The WMMA kernels (step 1, and step 2 compiled with each of ``variants``), cuBLAS in float16, the best SGEMM of
    :mod:`gpulab.ch09_gemm_on_the_gpu.gemm` and cuBLAS in float32 (TF32 off), each checked against float64 and timed
    at n^3.

    Each kernel is first checked at ``check_size`` (multiples of 16 but of no block tile, so the edges are
    exercised), then at n^3. Rows carry 'fraction_of_cublas_fp16' and, on a GPU of :mod:`gpulab.core.specs`,
    'fraction_of_peak' (of the float16 tensor-core peak, or of the float32 CUDA-core peak for SGEMM); the
    cuBLAS float16 row names the kernels it ran.
    """
    n = positive_int("n", n)
    check_m, check_n, check_k = positive_ints("check_size", check_size)
    if n % 16 or check_m % 16 or check_n % 16 or check_k % 16:
        raise ValueError(f"n, check_size: multiples of 16 (whole WMMA fragments); got {n} and {check_size}")
    kernel_mode.require_gpu("wmma_comparison")
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
