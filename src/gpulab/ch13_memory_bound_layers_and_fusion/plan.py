"""Chapter 13's sizes in every setting, and the work they make: the one place the notebook
``notebooks/13_memory_bound_layers_and_fusion.ipynb`` takes its sizes from (:class:`gpulab.core.budget.Chapter`).

The work follows the experiments' code: :func:`.sweeps.pointwise_roofline` (a copy and matmul ceilings, four
layers and two chains, each checked against float64 on the host, then one measurement),
:func:`.sweeps.compile_comparison` (two chains eager and compiled, each counted by the profiler, and a copy),
:func:`.sweeps.hand_kernel` (three variants of the CUDA C kernel, eager, compiled and a copy),
:func:`.sweeps.horizontal_fusion` (three ways per model width, each counted by the profiler) and
:func:`.blocked_attention.attention_sweep` (every method at every sequence length). Every measurement is
:func:`gpulab.core.timing.measure`'s, with an L2 flush before each repeat but where the experiment turns it off
(the hand kernel's race, the attention). The ceilings cost what chapter 01's plan says
:func:`gpulab.core.rates.measure_copy` and :func:`gpulab.core.rates.measure_blas` cost
(:func:`gpulab.ch01_cpus_to_gpus.plan.copy`, :func:`gpulab.ch01_cpus_to_gpus.plan.blas`).
"""

from __future__ import annotations

from gpulab.ch01_cpus_to_gpus.plan import blas, copy
from gpulab.ch13_memory_bound_layers_and_fusion import fusion, sweeps
from gpulab.ch13_memory_bound_layers_and_fusion.blocked_attention import DEFAULT_METHODS
from gpulab.core import budget, flops
from gpulab.core.budget import Work

FULL = dict(  # the sizes of the H200's recordings
    compile=True,  # run torch.compile (its compile times are part of the measurements)
    roofline_rows=16384, roofline_cols=4096,  # 2^26 floats, 256 MiB per tensor: far more than any L2
    copy_bytes=2**30, matmul_n=8192,  # the roofline's ceilings: a 1 GiB device copy, 8192^3 matmuls
    ceiling_dtypes=["float32", "bfloat16"],
    hand_rows=65536, hand_cols=4096,  # the hand-fused kernel's race: 2^28 floats, 1 GiB in and 1 GiB out
    horizontal_d_models=[256, 1024], horizontal_layers=12,  # transformers whose parameters get an update
    blocked_n=1024, blocked_d=64, blocked_blocks=[16, 64, 256, 1024],  # the NumPy blocked attention
    seq_lens=[512, 1024, 2048, 4096, 8192, 16384, 32768],  # attention on the device
    attention_batch=4, attention_heads=16, head_dim=64, attention_dtype="bfloat16",
)

# A T4 has neither bfloat16 nor room for the full hand-kernel race (52 bytes per element with its checks), so every
# class candidate measures in float16 (the same tensor-core rate as bfloat16 where both exist) and races a smaller
# matrix. Each keeps every experiment, and every matrix far larger than any GPU's L2.
CLASSES = [
    # the smallest: 128 MiB per tensor; attention up to 4,096 tokens (no size runs out of memory here, the sweep
    # shows the naive attention's memory growing as N^2 instead)
    {**FULL, "roofline_rows": 8192, "copy_bytes": 2**29, "matmul_n": 4096, "ceiling_dtypes": ["float32", "float16"],
     "hand_rows": 16384, "seq_lens": [512, 1024, 2048, 4096], "attention_dtype": "float16"},
    # the roofline at its full size; attention up to 8,192 tokens, where a T4's 16 GB no longer holds the naive
    # attention's two score matrices (8 GiB each in float16) while every fused backend still runs
    {**FULL, "ceiling_dtypes": ["float32", "float16"], "hand_rows": 32768,
     "seq_lens": [512, 1024, 2048, 4096, 8192], "attention_dtype": "float16"},
    # everything at full size but the last sequence length (and float16): for an A100 or an H100
    {**FULL, "ceiling_dtypes": ["float32", "float16"], "seq_lens": FULL["seq_lens"][:-1],
     "attention_dtype": "float16"},
]

CPU = {**FULL, "roofline_rows": 256, "roofline_cols": 1024, "copy_bytes": 2**24, "matmul_n": 256,
       "ceiling_dtypes": ["float32"], "horizontal_d_models": [64, 256], "horizontal_layers": 4,
       "seq_lens": [128, 256, 512, 1024], "attention_batch": 1, "attention_heads": 4, "attention_dtype": "float32"}

SMOKE = {**FULL, "compile": False, "roofline_rows": 64, "roofline_cols": 256, "copy_bytes": 2**20, "matmul_n": 64,
         "ceiling_dtypes": ["float32"], "hand_rows": 64, "hand_cols": 256, "horizontal_d_models": [32],
         "horizontal_layers": 2, "blocked_n": 128, "blocked_d": 16, "blocked_blocks": [8, 32, 128],
         "seq_lens": [64, 128], "attention_batch": 1, "attention_heads": 2, "head_dim": 16,
         "attention_dtype": "float32"}

FUSED_METHODS = ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")  # the scores never reach memory
BACKEND_PROFILE_SECONDS = 0.2  # attention's backend_used: one call under a CPU-only profiler
# measure_attention's calls besides the timer's: one before the memory is measured, one that measures it, and the
# one backend_used runs under the profiler
ATTENTION_EXTRA_CALLS = 3
# The NumPy blocked attention of blocked_n = 1024 with four block sizes: about a second on a CPU (this machine)
BLOCKED_SECONDS = 1.0


def _chain(name: str, n: int, fused: bool, label: str, memory: float, **timer) -> Work:
    """One measurement of a chain on ``n`` elements (one kernel, or one per layer), after its check against
    float64 on the host."""
    cost = fusion.chain_cost(name, n, fused=fused)
    launches = 1 if fused else len(fusion.CHAINS[name].kernels)
    return Work(label, flops=cost.flops, bytes=cost.bytes, launches=launches, memory_bytes=memory,
                checked_elements=n, **timer)


def _roofline(s: dict) -> list[Work]:
    """fusion_roofline: the ceilings (rates.ceilings: a copy, a matmul per format, each checked and timed), four
    layers, the eager chain and the hand-fused one."""
    n, m = s["roofline_rows"] * s["roofline_cols"], s["matmul_n"]
    memory = 4 * n * 4 + 8 * n * 2  # the experiment's own fits_in_memory: x, its copies, the float64 checks
    work = [*copy(s["copy_bytes"]), *(w for dtype in s["ceiling_dtypes"] for w in blas("gemm", m, dtype))]
    for op in ("relu", "gelu", "layer_norm", "softmax"):
        cost = fusion.op_cost(op, n)
        work.append(Work(op, flops=cost.flops, bytes=cost.bytes, memory_bytes=memory, checked_elements=n))
    return [*work, _chain("bias_gelu_dropout", n, False, "eager chain", memory),
            _chain("bias_gelu_dropout", n, True, "hand-fused chain", memory)]


def _compile(s: dict) -> list[Work]:
    """fusion_compile: each chain eager and (with compile) compiled, then a copy of the matrix
    (rates.measure_copy)."""
    n = s["roofline_rows"] * s["roofline_cols"]
    memory = 4 * n * 6 + 8 * n * 3
    modes = (False, True) if s["compile"] else (False,)
    work = [_chain(chain, n, fused, f"{chain}, {'compiled' if fused else 'eager'}", memory)
            for chain in fusion.CHAINS for fused in modes]
    return [*work, *copy(4 * n)]


def _hand(s: dict) -> list[Work]:
    """fusion_hand_kernel: three variants, eager and compiled, each checked then timed without the L2 flush, and a
    copy (rates.measure_copy)."""
    n = s["hand_rows"] * s["hand_cols"]
    memory = 4 * n * 5 + 8 * n * 4
    racers = [_chain("bias_gelu_dropout", n, True, f"CUDA C variant {v}", memory, flush_l2=False) for v in range(3)]
    racers.append(_chain("bias_gelu_dropout", n, False, "eager chain (race)", memory, flush_l2=False))
    if s["compile"]:
        racers.append(_chain("bias_gelu_dropout", n, True, "compiled chain (race)", memory, flush_l2=False))
    return [*racers, *copy(4 * n)]


def _horizontal(s: dict) -> list[Work]:
    """fusion_horizontal: three ways to update every parameter (p, g: 12 bytes an element), per model width, each
    checked on the host then timed. One kernel per tensor is a Python loop of launches, one torch call each."""
    work = []
    for d_model in s["horizontal_d_models"]:
        sizes = sweeps.parameter_sizes(s["horizontal_layers"], d_model)
        total = sum(sizes)
        loop = dict(launches=len(sizes), least_seconds=len(sizes) * budget.HOST_CALL_SECONDS)
        for method in sweeps.HORIZONTAL_METHODS:
            host = loop if method == "one kernel per tensor" else {}
            work.append(Work(f"update, d_model {d_model}, {method}", bytes=12 * total,
                             memory_bytes=4 * total * 9 + 8 * total, checked_elements=total, **host))
    return work


def _attention(s: dict) -> list[Work]:
    """fusion_attention: every method at every length, without the L2 flush. The naive attention writes its scores,
    reads them for the division, the softmax and the second matmul (six passes); SDPA's math backend does the same
    in float32. Their memory is left out: where the scores do not fit, the sweep's row says 'out of memory' and it
    goes on, which is a lesson of the page, not a failure; the time such a row saves is not subtracted."""
    b, h, d, dtype = s["attention_batch"], s["attention_heads"], s["head_dim"], s["attention_dtype"]
    size = flops.bytes_per_element(dtype)
    work = []
    for method in DEFAULT_METHODS:
        for n in s["seq_lens"]:
            inputs = 4 * b * h * n * d * size  # q, k, v and the output
            scores = b * h * n * n * (4 if method == "sdpa-math" else size)
            moved = inputs if method in FUSED_METHODS else inputs + 6 * scores
            work.append(Work(f"{method}, N = {n}", flops=4 * b * h * n * n * d, bytes=moved, precision=dtype,
                             warmup=budget.WARMUP + ATTENTION_EXTRA_CALLS, flush_l2=False,
                             extra_seconds=BACKEND_PROFILE_SECONDS, memory_bytes=inputs))
    return work


def work(s: dict) -> list[Work]:
    return [*_roofline(s), *_compile(s), *_hand(s), *_horizontal(s), *_attention(s)]


def fixed_seconds(s: dict) -> float:
    """Imports and the notebook; NVRTC for the kernel's two forms of GELU, each compiled twice (for its register
    report and for CuPy); torch.compile, cold, three times (two chains, then the race's); the profiler sessions of
    fusion_compile and fusion_horizontal; the NumPy blocked attention."""
    compiles = budget.TORCH_COMPILE_FIRST_SECONDS + 2 * budget.TORCH_COMPILE_SECONDS if s["compile"] else 0.0
    sessions = 2 * (1 + s["compile"]) + 3 * len(s["horizontal_d_models"])
    profiles = budget.PROFILER_START_SECONDS + sessions * budget.PROFILER_SESSION_SECONDS
    blocked = BLOCKED_SECONDS * (s["blocked_n"] / 1024) ** 2 * len(s["blocked_blocks"]) / 4
    return budget.NOTEBOOK_SECONDS + 4 * budget.NVRTC_SECONDS + compiles + profiles + blocked


CHAPTER = budget.Chapter(name="13 memory-bound layers and fusion", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE,
                         work=work, fixed_seconds=fixed_seconds)
