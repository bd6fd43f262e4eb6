"""The experiments of the chapter "GEMM on the GPU": a worklog of SGEMM kernels, and quantization.

The worklog is nine CUDA C kernels, ``16_sgemm_naive.cu`` to ``24_sgemm_prefetched.cu``, each one
step from the last (:data:`STEPS`). Every one computes ``C = A @ B`` for row-major float32 matrices and
is checked against float64 arithmetic on fresh random data before it is timed.

- :func:`sgemm` runs one step on torch tensors; :func:`worklog` checks and times every step at one size
  beside cuBLAS (TF32 off), with what the compiler reports about each kernel (registers, shared memory,
  resident blocks) and what the tiling implies (:func:`traffic`: loads per multiply-add);
- :func:`tuning` times variants of the last step, compiled with other tile sizes (:func:`prefetched`);
- :func:`size_sweep` measures the best kernel and cuBLAS over a range of sizes, where tile and wave quantization make
  the rate step: :func:`gpulab.ch04_mlp_gemms.waves.tile_waves` counts waves of slots (NVIDIA's model),
  :func:`sm_efficiency` counts the blocks of the busiest SM, with :func:`fit_partial` for the time of a block that
  runs alone on its SM.

CUDA C needs a GPU; in the simulator the chapter runs the numba twins of steps 2 and 3
(:mod:`gpulab.kernels.numba_kernels`) instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from gpulab.ch04_mlp_gemms.waves import tile_waves
from gpulab.core import env, flops, kernel_mode, occupancy, specs, timing
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import ok_rows, run_sweep
from gpulab.core.validation import fits_in_memory, matmul_operands, positive_int, positive_ints
from gpulab.kernels import cuda_c

LANES = (8, 4)  # steps 7 to 9: a warp's 32 lanes as an 8 x 4 grid, 4 x 4 outputs each per pass
FIRST_FILE = 16  # the worklog's step 1 is kernel file 16_sgemm_naive.cu
TUNABLE = {"BM": 128, "BN": 128, "BK": 8, "WM": 64, "WN": 32, "MIN_BLOCKS": 2}  # 24_sgemm_prefetched.cu's defaults


@dataclass(frozen=True)
class Step:
    """One kernel of the worklog: its file, how it is launched, and the tiling it implements."""

    file: str  # "16_sgemm_naive"
    kernel: str
    label: str
    tile: tuple[int, int]  # rows x columns of C per block
    threads: tuple[int, ...]  # the block's shape
    thread_tile: tuple[int, int] = (1, 1)  # rows x columns of C per thread
    depth: int = 1  # BK: the slice of K staged in shared memory per step (1: no shared memory)
    rows_on_x: bool = False  # step 1 maps threadIdx.x to rows of C
    float4: bool = False  # 16-byte loads: N and K must be multiples of 4
    shared_loads_per_k: int = 0  # shared-memory load instructions a thread issues per k
    defines: tuple[tuple[str, int], ...] = field(default=())

    @property
    def number(self) -> int:
        return int(self.file[:2]) - FIRST_FILE + 1

    def grid(self, m: int, n: int) -> tuple[int, int]:
        """Blocks along x and y for an M x N output."""
        rows, cols = math.ceil(m / self.tile[0]), math.ceil(n / self.tile[1])
        return (rows, cols) if self.rows_on_x else (cols, rows)


STEPS = (
    Step("16_sgemm_naive", "sgemm_naive", "naive", (32, 32), (32, 32), rows_on_x=True),
    Step("17_sgemm_coalesced", "sgemm_coalesced", "coalesced", (32, 32), (32, 32)),
    Step("18_sgemm_shared", "sgemm_shared", "shared-memory tiles", (32, 32), (32, 32), depth=32,
         shared_loads_per_k=2),
    Step("19_sgemm_1d_blocking", "sgemm_1d_blocking", "1D register blocking", (64, 64), (512,), (8, 1), depth=8,
         shared_loads_per_k=9),
    Step("20_sgemm_2d_blocking", "sgemm_2d_blocking", "2D register blocking", (128, 128), (256,), (8, 8), depth=8,
         shared_loads_per_k=16),
    Step("21_sgemm_vectorized", "sgemm_vectorized", "vectorised loads", (128, 128), (256,), (8, 8), depth=8,
         float4=True, shared_loads_per_k=4),
    Step("22_sgemm_warp_tiled", "sgemm_warp_tiled", "warp tiling", (128, 128), (256,), (8, 8), depth=8,
         float4=True, shared_loads_per_k=4),
    Step("23_sgemm_double_buffered", "sgemm_double_buffered", "double-buffered shared memory", (128, 128), (256,),
         (8, 8), depth=8, float4=True, shared_loads_per_k=4),
)


def prefetched(**defines: int) -> Step:
    """Step 9 (24_sgemm_prefetched.cu) compiled with ``defines`` in place of its default tile sizes."""
    unknown = set(defines) - set(TUNABLE)
    if unknown:
        raise ValueError(f"defines: 24_sgemm_prefetched.cu has {', '.join(TUNABLE)}; got {sorted(unknown)}")
    d = {**TUNABLE, **{k: positive_int(k, v) for k, v in defines.items()}}
    lanes_m, lanes_n = LANES
    if d["BM"] % d["WM"] or d["BN"] % d["WN"] or d["WM"] % (4 * lanes_m) or d["WN"] % (4 * lanes_n):
        raise ValueError(f"defines: the warp tile WM x WN must divide the block tile BM x BN, and be a multiple of "
                         f"{4 * lanes_m} x {4 * lanes_n}; got {d}")
    threads = 32 * (d["BM"] // d["WM"]) * (d["BN"] // d["WN"])
    if threads > 1024 or d["BK"] % 4 or (d["BM"] * d["BK"] // 4) % threads or (d["BK"] * d["BN"] // 4) % threads:
        raise ValueError(f"defines: {threads} threads must load whole float4s of the BM x BK and BK x BN tiles; "
                         f"got {d}")
    thread_tile = (d["WM"] // lanes_m, d["WN"] // lanes_n)
    changed = tuple(sorted((k, v) for k, v in d.items() if v != TUNABLE[k]))
    label = "prefetched fragments" + ("" if not changed else " (" + ", ".join(f"{k}={v}" for k, v in changed) + ")")
    return Step("24_sgemm_prefetched", "sgemm_prefetched", label, (d["BM"], d["BN"]), (threads,),
                thread_tile, depth=d["BK"], float4=True, shared_loads_per_k=sum(thread_tile) // 4, defines=changed)


STEPS = (*STEPS, prefetched())
BEST = STEPS[-1]


def step(number_or_file: int | str) -> Step:
    """A step of the worklog by its number (1-9) or its file name."""
    for s in STEPS:
        if number_or_file in (s.number, s.file, f"{s.file}.cu"):
            return s
    raise ValueError(f"step: 1 to {len(STEPS)} or a file name like {STEPS[0].file!r}; got {number_or_file!r}")


def traffic(s: Step) -> dict:
    """What the tiling of step ``s`` implies per multiply-add (FMA), before any cache helps.

    - ``global_floats_per_fma``: floats a block loads from global memory per FMA it computes: 2 with no
      reuse; (1/BN + 1/BM) when a BM x BN tile of C shares each loaded row of A and column of B;
    - ``shared_loads_per_fma``: shared-memory load instructions a thread issues per FMA.
    """
    global_floats = 2.0 if s.depth == 1 else 1 / s.tile[0] + 1 / s.tile[1]
    outputs = s.thread_tile[0] * s.thread_tile[1]
    return {"global_floats_per_fma": global_floats, "shared_loads_per_fma": s.shared_loads_per_k / outputs}


def prepared(s: Step, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor):
    """A function that runs step ``s`` to compute ``C = A @ B`` (arguments checked once, here)."""
    m, n, k = matmul_operands(A, B, C, torch.float32)
    if s.float4 and (n % 4 or k % 4):
        raise ValueError(f"B: step {s.number} ({s.label}) loads 16 bytes at a time, so N and K must be multiples "
                         f"of 4; got N = {n}, K = {k}")
    return cuda_c.prepared(s.file, s.kernel, s.grid(m, n), s.threads, A, B, C, m, n, k, defines=dict(s.defines))


def sgemm(s: Step | int, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B`` computed by step ``s`` of the worklog (a Step or its number), into a fresh tensor."""
    s = s if isinstance(s, Step) else step(s)
    kernel_mode.require_gpu(f"step {s.number} ({s.file}.cu)")
    C = poisoned((A.shape[0], B.shape[1]), torch.float32, A.device)
    prepared(s, A, B, C)()
    return C


def check(s: Step, m: int, n: int, k: int, device: torch.device) -> float:
    """Relative error of step ``s`` against float64 on fresh random M x K and K x N operands; raises above
    float32's matmul tolerance."""
    A, B = random_tensor((m, k), torch.float32, device), random_tensor((k, n), torch.float32, device)
    C = sgemm(s, A, B)
    return check_close(C, A.double() @ B.double(), MATMUL_TOLERANCE["float32"], f"step {s.number} ({s.label})")


def resources(s: Step) -> dict:
    """Registers per thread, shared memory per block and spills (from the compiler), and the resident
    blocks per SM they allow (:func:`gpulab.core.occupancy.theoretical`) on this GPU, or on an H100 without one."""
    report = cuda_c.compile_report(s.file, defines=dict(s.defines)).resources[s.kernel]
    capability = env.describe().compute_capability if kernel_mode.on_gpu() else "9.0"
    threads = math.prod(s.threads)
    resident = occupancy.theoretical(threads, report.registers, report.shared_bytes, occupancy.limits(capability))
    return {"registers": report.registers, "shared_bytes": report.shared_bytes,
            "spill_bytes": report.spill_stores_bytes + report.spill_loads_bytes, "threads": threads,
            "blocks_per_sm": resident.blocks_per_sm, "occupancy": resident.fraction,
            "occupancy_limited_by": resident.limited_by}


def _fp32_peak_tflops() -> float | None:
    row = specs.present()
    return specs.peak(row, "float32", "CUDA cores").tflops if row else None


def _measure(run, m: int, n: int, k: int, device: torch.device) -> dict:
    t = timing.measure(run, device=device, flush_l2=False)
    return {"seconds": t.median_s, "spread": t.spread, "tflops": flops.gemm(m, n, k).flops / t.median_s / 1e12}


def _cublas(m: int, n: int, k: int, device: torch.device) -> dict:
    A, B = random_tensor((m, k), torch.float32, device), random_tensor((k, n), torch.float32, device)
    C = poisoned((m, n), torch.float32, device)
    with matmul_mode("float32"):  # TF32 off: cuBLAS on the same CUDA cores as the kernels
        torch.mm(A, B, out=C)
        error = check_close(C, A.double() @ B.double(), MATMUL_TOLERANCE["float32"], "cuBLAS")
        return {**_measure(lambda: torch.mm(A, B, out=C), m, n, k, device), "relative_error": error}


def _kernel(s: Step, m: int, n: int, k: int, device: torch.device) -> dict:
    error = check(s, m, n, k, device)
    A, B = random_tensor((m, k), torch.float32, device), random_tensor((k, n), torch.float32, device)
    C = poisoned((m, n), torch.float32, device)
    return {**_measure(prepared(s, A, B, C), m, n, k, device), "relative_error": error}


@experiment("gemm_worklog")
def worklog(n: int = 4096, steps: Sequence[Step] = STEPS,
            check_size: tuple[int, int, int] = (1000, 1204, 772)) -> list[dict]:
    """Check and time every step at ``n`` x ``n`` x ``n`` beside cuBLAS (TF32 off), one row each.

    Each step is first checked at ``check_size`` (M, N, K: not multiples of any tile, so that the edges
    are exercised), then at the timed size. Rows carry the compiler's resources and :func:`traffic`.
    """
    n = positive_int("n", n)
    check_m, check_n, check_k = positive_ints("check_size", check_size)
    kernel_mode.require_gpu("worklog")
    device = env.device()
    fits_in_memory("n", 2 * 3 * 4 * n * n, device)  # the operands, and the check's float64 copies
    cublas = {"step": 0, "file": "cuBLAS", "label": "cuBLAS", **_cublas(n, n, n, device)}
    peak = _fp32_peak_tflops()
    rows = []
    for s in steps:
        check(s, check_m, check_n - check_n % 4, check_k - check_k % 4, device)
        rows.append({"step": s.number, "file": s.file, "label": s.label, "tile": f"{s.tile[0]}x{s.tile[1]}",
                     "thread_tile": f"{s.thread_tile[0]}x{s.thread_tile[1]}", "depth": s.depth,
                     **_kernel(s, n, n, n, device), **resources(s), **traffic(s)})
    rows.append(cublas)
    for row in rows:
        row.update(n=n, fraction_of_cublas=row["tflops"] / cublas["tflops"],
                   fraction_of_peak=row["tflops"] / peak if peak else None)
    return rows


@experiment("gemm_tuning")
def tuning(n: int = 4096, variants: Sequence[Mapping[str, int]] = ({},)) -> list[dict]:
    """Step 9 compiled with each of ``variants`` (tile sizes, see :func:`prefetched`): checked, timed at n^3."""
    n = positive_int("n", n)
    kernel_mode.require_gpu("tuning")
    device = env.device()
    fits_in_memory("n", 2 * 3 * 4 * n * n, device)
    rows = []
    for defines in variants:
        s = prefetched(**defines)
        d = {**TUNABLE, **defines}
        rows.append({**d, "label": s.label, "thread_tile": f"{s.thread_tile[0]}x{s.thread_tile[1]}",
                     **_kernel(s, n, n, n, device), **resources(s), **traffic(s)})
    return rows


@experiment("gemm_tile_quantization", "gemm_wave_quantization")
def size_sweep(ms: Sequence[int], ns: Sequence[int], k: int, s: Step = BEST) -> list[dict]:
    """Step ``s`` and cuBLAS (TF32 off) at every (M, N) of ``zip(ms, ns)`` with depth ``k``; each row also
    carries the tile and wave model of step ``s``'s tile on this GPU's SMs (its resident blocks per SM
    count as that many slots per SM)."""
    ms, ns, k = positive_ints("ms", ms), positive_ints("ns", ns), positive_int("k", k)
    if len(ms) != len(ns):
        raise ValueError(f"ms, ns: one M per N; got {len(ms)} and {len(ns)}")
    kernel_mode.require_gpu("size_sweep")
    device = env.device()
    fits_in_memory("ms, ns", 4 * (max(ms) * k + k * max(ns) + max(ms) * max(ns)) * 2, device)
    sms = env.describe().multiprocessors
    resident = resources(s)["blocks_per_sm"]
    slots = sms * resident

    def measure(m: int, n: int) -> dict:
        model = tile_waves(m, n, s.tile, slots)
        return {"kernel_tflops": _kernel(s, m, n, k, device)["tflops"],
                "cublas_tflops": _cublas(m, n, k, device)["tflops"],
                "tiles": model.tiles, "waves": model.waves, "tile_efficiency": model.tile_efficiency,
                "wave_efficiency": model.wave_efficiency, "efficiency": model.efficiency}

    rows = run_sweep(measure, [{"m": m, "n": n} for m, n in zip(ms, ns, strict=True)])
    for row in rows:
        row.update(k=k, kernel=s.label, tile=f"{s.tile[0]}x{s.tile[1]}", tile_m=s.tile[0], tile_n=s.tile[1],
                   slots=slots, sms=sms, resident=resident)
    return rows


def divisibility(rows: Sequence[dict], x: str = "n", multiples: Sequence[int] = (256, 128, 64, 32, 16)) -> list[dict]:
    """The dimension rules, measured: the rows of a :func:`size_sweep` grouped by the largest of ``multiples``
    that divides ``row[x]``, with each group's mean rate relative to the sweep's best, kernel and cuBLAS."""
    rows, multiples = ok_rows(rows), sorted(positive_ints("multiples", multiples), reverse=True)
    if not rows:
        raise ValueError("rows: no measurements")
    best = {key: max(r[key] for r in rows) for key in ("kernel_tflops", "cublas_tflops")}
    groups: dict[str, list[dict]] = {f"multiple of {d}": [] for d in multiples}  # in this order
    groups[f"not a multiple of {multiples[-1]}"] = []
    for r in rows:
        divisor = next((d for d in multiples if r[x] % d == 0), None)
        groups.setdefault(f"multiple of {divisor}" if divisor else f"not a multiple of {multiples[-1]}", []).append(r)
    return [{"sizes": label, "count": len(group),
             **{f"{key.removesuffix('_tflops')}_relative": sum(r[key] for r in group) / len(group) / best[key]
                for key in best}}
            for label, group in groups.items() if group]


def blocks_per_busiest_sm(row: Mapping) -> int:
    """Blocks the busiest SM runs for a :func:`size_sweep` row: the tiles are dealt out to the SMs in turn."""
    return math.ceil(row["tiles"] / row["sms"])


def sm_efficiency(row: Mapping, partial: float) -> float:
    """The share of the full-occupancy rate that a :func:`size_sweep` row allows, counted per SM.

    The tiles are dealt out to the SMs in turn; an SM runs ``resident`` blocks at a time, and a last group of fewer
    blocks takes ``partial`` of a full group's time (more than 1/resident of it: a block that is alone on its SM has
    the SM's issue slots to itself, so it runs faster than it would beside others). ``partial = 1`` gives the slot
    model of :func:`gpulab.ch04_mlp_gemms.waves.tile_waves` (a partly filled wave costs a whole wave); ``partial =
    1/resident`` would mean that a lone block runs ``resident`` times faster.
    """
    model = tile_waves(row["m"], row["n"], (row["tile_m"], row["tile_n"]), row["sms"] * row["resident"])
    groups, rest = divmod(math.ceil(model.tiles / row["sms"]), row["resident"])
    return model.tile_efficiency * (model.tiles / model.slots) / (groups + (partial if rest else 0.0))


def fit_partial(rows: Sequence[dict]) -> float:
    """The ``partial`` of :func:`sm_efficiency` that fits the kernel's measured rates best (least squares,
    each candidate's prediction scaled to the measurements), searched between 1/resident and 1."""
    rows = ok_rows(rows)
    if len(rows) < 3:
        raise ValueError(f"rows: at least 3 measurements to fit a model, got {len(rows)}")
    measured = [r["kernel_tflops"] for r in rows]
    resident = rows[0]["resident"]
    candidates = [1 / resident + i * (1 - 1 / resident) / 200 for i in range(201)]

    def residual(partial: float) -> float:
        predicted = [sm_efficiency(r, partial) for r in rows]
        scale = sum(p * m for p, m in zip(predicted, measured, strict=True)) / sum(p * p for p in predicted)
        return sum((m - scale * p) ** 2 for p, m in zip(predicted, measured, strict=True))

    return min(candidates, key=residual)
