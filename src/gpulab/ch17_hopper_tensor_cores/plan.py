"""Chapter 17's sizes in every setting, and the work they make: the one place ``notebooks/17_hopper_tensor_cores.ipynb``
takes its sizes from (:class:`gpulab.core.budget.Chapter`).

The work follows the experiments' code. :func:`gpulab.kernels.triton_gemm.ladder.ladder_sweep` (compute capability
9.0: TMA and ``wgmma``) checks cuBLAS and every kernel of the ladder against float64 twice, at
:data:`gpulab.kernels.triton_gemm.ladder.CHECK_SIZE` and at n^3, launches each kernel once more for its evidence and
times it (10 warm-up calls, repeats for 0.5 s), per size and dtype; Triton compiles every kernel twice per dtype (the
odd check size and the aligned sizes are two specializations). :func:`gpulab.kernels.fp8.fp8_sweep` (8.9: FP8 tensor
cores) checks and times bfloat16 per size, then per format and granularity checks the scaled matmul and times three
things: the FP8 matmul alone, the quantization alone, and the whole path. Live on any machine: each step checked at a
small shape (:func:`.measure.live_checks`), the SASS of the compiled kernels (:mod:`.sass_evidence`, a Python process
of its own) and the FP8 errors emulated on the host (:func:`.quantization.error_rows`).
"""

from __future__ import annotations

from gpulab.ch17_hopper_tensor_cores import quantization
from gpulab.core import budget, flops
from gpulab.core.budget import Work, once
from gpulab.kernels import fp8
from gpulab.kernels.triton_gemm import ladder, step2_pipelined

FULL = {  # the sizes of the recordings: the sweeps' own defaults
    "check_shape": list(ladder.CHECK_SIZE),  # the live check of each step: no multiple of any tile
    "ladder_sizes": [4096, 8192],
    "ladder_dtypes": list(ladder.DTYPES),
    "ladder_stages": list(step2_pipelined.STAGES),  # step 2 timed at these pipeline depths too
    "fp8_sizes": list(fp8.SWEEP_SIZES),
    "fp8_formats": [list(f) if isinstance(f, tuple) else f for f in fp8.SWEEP_FORMATS],
    "fp8_granularities": list(fp8.GRANULARITIES),
    "error_shape": [512, 512, 1024],  # the FP8 errors, emulated on the host in float64
    "spreads": [0.0, 3.0],  # rows of A and columns of B spread over 10^±spread
}
# A class: the ladder in one dtype at its pipeline depth, FP8 up to 4096 or 8192; a T4 runs neither (no TMA, no FP8),
# an L4 runs FP8 only, an H100 or H200 both.
CLASSES = [
    {**FULL, "ladder_sizes": [4096], "ladder_dtypes": ["float16"], "ladder_stages": [3],
     "fp8_sizes": [256, 1024, 4096], "fp8_formats": ["e4m3"]},
    {**FULL, "ladder_sizes": [4096, 8192], "ladder_dtypes": ["bfloat16"], "ladder_stages": [3],
     "fp8_sizes": [256, 1024, 4096, 8192]},
    FULL,
]
CPU = {**FULL, "check_shape": [392, 520, 264], "error_shape": [256, 256, 512]}  # the interpreter: a few seconds a step
SMOKE = {**FULL, "check_shape": [72, 80, 48], "error_shape": [32, 32, 64]}

LADDER_CAPABILITY, FP8_CAPABILITY = "9.0", "8.9"
# Shares of the tensor-core peak the ladder's kernels are assumed to reach until the ladder is recorded: the TMA steps
# at a library's rate, the pointer steps at half of it.
TMA_SHARE, POINTER_SHARE = budget.COMPUTE_EFFICIENCY, budget.COMPUTE_EFFICIENCY / 2
SWEEP_WARMUP, SWEEP_TARGET_SECONDS = 10, 0.5  # what ladder_sweep and fp8_sweep ask of the timer
TRITON_COMPILE_SECONDS = 1.5  # Triton compiling one kernel for one specialization, from a cold cache
EVIDENCE_SECONDS = 12.0  # sass_evidence: a Python process compiling seven kernels for sm_90 and one for sm_80
HOST_FLOAT64_FLOPS = 5e9  # the host's float64 matmuls of the emulated FP8 errors (two cores of this machine: ~10e9)


def _checked(label: str, m: int, n: int, k: int, precision: str, share: float, capability: str) -> list[Work]:
    """common.check or check_close on the GPU: one call of the kernel, its float64 reference on the GPU, compared
    there."""
    cost = flops.gemm(m, n, k).flops
    where = dict(min_capability=capability, memory_bytes=(m * k + k * n + m * n) * (2 + 8))
    return [once(f"{label}: checked call", flops=cost, precision=precision, share=share, **where),
            once(f"{label}: float64 reference", flops=cost, precision="float64", **where)]


def _timed(label: str, n: int, precision: str, capability: str, **work) -> Work:
    return Work(label, precision=precision, warmup=SWEEP_WARMUP, target_seconds=SWEEP_TARGET_SECONDS,
                min_capability=capability, **{"flops": flops.gemm(n, n, n).flops, **work})


def live_work(s: dict) -> list[Work]:
    """measure.live_checks: each step checked once at the small shape (the TMA steps on a Hopper only)."""
    m, n, k = s["check_shape"]
    return [w for number in range(1, 7) for w in _checked(
        f"live check, step {number}", m, n, k, "float16", TMA_SHARE if number > 3 else POINTER_SHARE,
        LADDER_CAPABILITY if number > 3 else "0.0")]


def ladder_work(s: dict) -> list[Work]:
    """ladder_sweep: per size and dtype, cuBLAS and every kernel (six steps, step 2 at the other depths) checked at
    the check size and at n^3, launched once for its evidence, then timed; each kernel compiled twice per dtype."""
    kernels = [("cuBLAS", TMA_SHARE)] + [(f"step {i}", TMA_SHARE if i > 3 else POINTER_SHARE) for i in range(1, 7)]
    kernels += [(f"step 2, {d} stages", POINTER_SHARE) for d in s["ladder_stages"]
                if d != step2_pipelined.CONFIG["num_stages"]]
    work = []
    for n in s["ladder_sizes"]:
        for dtype in s["ladder_dtypes"]:
            for name, share in kernels:
                label = f"ladder {n}, {dtype}, {name}"
                work += [*_checked(label, *ladder.CHECK_SIZE, dtype, share, LADDER_CAPABILITY),
                         *_checked(label, n, n, n, dtype, share, LADDER_CAPABILITY),
                         _timed(label, n, dtype, LADDER_CAPABILITY, share=share, memory_bytes=n * n * 30)]
                if name != "cuBLAS":
                    work.append(once(f"{label}: evidence launch", flops=flops.gemm(n, n, n).flops, precision=dtype,
                                     share=share, min_capability=LADDER_CAPABILITY))
    compiles = (len(kernels) - 1) * len(s["ladder_dtypes"]) * 2
    work.append(Work("ladder: Triton compiles", extra_seconds=TRITON_COMPILE_SECONDS, measurements=compiles,
                     launches=0, min_capability=LADDER_CAPABILITY))
    return work


def fp8_work(s: dict) -> list[Work]:
    """fp8_sweep: per size, bfloat16 checked and timed; per format and granularity the scaled matmul checked, then the
    FP8 matmul alone, the quantization alone (memory-bound: the bytes :mod:`.quantization` counts, one launch per
    operation) and the whole path timed."""
    traffic = quantization.quantize_traffic()
    configs = len(s["fp8_formats"]) * len(s["fp8_granularities"])
    work = []
    for n in s["fp8_sizes"]:
        moved = 2 * traffic["bytes_per_element"] * n * n  # both operands
        launches = 2 * traffic["operations"]
        work += [*_checked(f"fp8 {n}: bfloat16", n, n, n, "bfloat16", TMA_SHARE, FP8_CAPABILITY),
                 _timed(f"fp8 {n}: bfloat16", n, "bfloat16", FP8_CAPABILITY, memory_bytes=n * n * 32),
                 _timed(f"fp8 {n}: FP8 matmul", n, "float8", FP8_CAPABILITY, missing="skip", measurements=configs),
                 _timed(f"fp8 {n}: quantization", n, "float8", FP8_CAPABILITY, flops=0, bytes=moved,
                        launches=launches, missing="skip", measurements=configs),
                 _timed(f"fp8 {n}: whole path", n, "float8", FP8_CAPABILITY, bytes=moved, launches=launches + 1,
                        missing="skip", measurements=configs),
                 once(f"fp8 {n}: checked scaled matmul", flops=flops.gemm(n, n, n).flops, precision="float8",
                      bytes=moved, launches=launches + 1, missing="skip", measurements=configs,
                      min_capability=FP8_CAPABILITY)]
    return work


def work(s: dict) -> list[Work]:
    return [*live_work(s), *ladder_work(s), *fp8_work(s)]


def fixed_seconds(s: dict) -> float:
    """The notebook, the SASS of the compiled kernels (a Python process of its own) and the FP8 errors emulated on
    the host (two float64 products per format, granularity and spread)."""
    m, n, k = s["error_shape"]
    products = 2 * 3 * len(fp8.GRANULARITIES) * len(s["spreads"])
    return budget.NOTEBOOK_SECONDS + EVIDENCE_SECONDS + products * 2 * m * n * k / HOST_FLOAT64_FLOPS


CHAPTER = budget.Chapter(name="17 Hopper's tensor cores from Python", full=FULL, classes=CLASSES, cpu=CPU,
                         smoke=SMOKE, work=work, fixed_seconds=fixed_seconds)
