"""Chapter 18's sizes in every setting, and the work they make: the one place the notebook
``notebooks/18_flash_attention_and_counters.ipynb`` takes its sizes from (:class:`gpulab.core.budget.Chapter`).

The work follows the experiments' code:

- the kernels checked live (:func:`.figures.kernel_checks`): for each head size and mask, the forward against
  float64 (output and log-sum-exp), then forward and backward (output and three gradients), at one small shape;
- the race, :func:`gpulab.kernels.triton_attention.measure.attention_race`: per head size and mask, every
  implementation checked once at 256 tokens, then per sequence length one measurement of the forward and one of
  forward + backward (:func:`gpulab.core.timing.measure`, an L2 flush before each repeat). The Triton kernels
  compile once per head size, mask and specialisation (a length divisible by 16 or not);
- the compiled code's evidence (:func:`.figures.compiled_evidence`): a Python process that compiles the kernels
  for sm_90, on any machine;
- the hardware counters (:func:`.profiled.profile_kernels`): every kernel in one process under Nsight Compute,
  which replays each profiled launch tens of times (a pass per group of counters, the caches flushed and the clocks
  locked before each): the session's measured time (:data:`NCU_SESSION_SECONDS`).

Where the Triton kernels run: under Triton's interpreter without a GPU, compiled on a GPU of compute capability
8.0 or later. Their tiles were chosen for an H100 (up to 128 KiB of shared memory per program at head size 128),
and a T4 (compute capability 7.5, 64 KiB per block, no bfloat16) runs none of the GPU work: its page shows the
recordings (:func:`triton_unavailable` says so in a sentence). The class profile races head size 64 only, whose
tiles fit every GPU of compute capability 8.0 or later (an L4 offers 99 KiB per block), in float16.
"""

from __future__ import annotations

import torch

from gpulab.ch18_flash_attention_and_counters import profiled
from gpulab.core import budget, flops, kernel_mode
from gpulab.core.budget import Work
from gpulab.kernels.triton_attention import measure

MIN_CAPABILITY = "8.0"  # the GPUs the Triton kernels are compiled for here

FULL = dict(  # the sizes of the recordings (attention_race's defaults)
    check_batch=2, check_heads=3, check_seq_len=1000, check_head_dims=[64, 128], check_dtype="bfloat16",
    evidence_kernels=list(measure.KERNELS), evidence_head_dim=128,
    seq_lens=[1024, 2048, 4096, 8192, 16384], head_dims=[64, 128], implementations=list(measure.IMPLEMENTATIONS),
    tokens=16384, model_dim=2048, dtype="bfloat16",
    profile_counters=True,
)

# Every class candidate measures in float16 (a T4 has no bfloat16, and runs none of it anyway), at head size 64 only,
# and profiles nothing: Nsight Compute needs access to the GPU's performance counters, which a hosted notebook may
# not give, and replays each kernel tens of times.
CLASSES = [
    {**FULL, "check_head_dims": [64], "check_dtype": "float16", "head_dims": [64], "dtype": "float16",
     "seq_lens": [1024, 2048, 4096], "tokens": 8192, "profile_counters": False},
    {**FULL, "check_head_dims": [64], "check_dtype": "float16", "head_dims": [64], "dtype": "float16",
     "seq_lens": [1024, 2048, 4096, 8192], "profile_counters": False},
    {**FULL, "check_head_dims": [64], "check_dtype": "float16", "head_dims": [64], "dtype": "float16",
     "profile_counters": False},
]

# Without a GPU: the kernels under Triton's interpreter in float32 (it has no bfloat16 arithmetic), at a length no
# tile divides, with the tiles of the GPU; the race and the counters are GPU-only, and the page draws their
# recordings.
CPU = {**FULL, "check_batch": 1, "check_heads": 2, "check_seq_len": 300, "check_dtype": "float32",
       "profile_counters": False}

SMOKE = {**CPU, "check_seq_len": 96, "check_head_dims": [32], "evidence_kernels": ["forward"],
         "seq_lens": [256], "head_dims": [64], "tokens": 512, "model_dim": 128, "dtype": "float16"}

# Shares of the 16-bit tensor-core peak (forward, forward + backward), about those the H100's recording measured from
# 4,096 tokens on; the math backend is modelled by its bytes instead (MATH_SCORE_PASSES).
SHARES = {"triton": (0.45, 0.36), "sdpa-cudnn": (0.6, 0.52), "sdpa-flash": (0.33, 0.3),
          "sdpa-efficient": (0.17, 0.14), "sdpa-math": (0.6, 0.6)}
# The math backend moves its float32 scores through memory: passes over them (forward, forward + backward), fitted
# to the H100's recording (about 15 and 24 TFLOP/s at head size 64)
MATH_SCORE_PASSES = (12, 25)
# Triton compiling one kernel for one specialisation, ptxas included: 2.0 s for the forward at head size 128 for sm_90
# on the book's 2-core build machine (then cached on disk); taken for a GPU machine too
TRITON_COMPILE_SECONDS = 2.0
KERNELS_PER_ATTENTION = 4  # the forward, D = rowsum(dO O), dK and dV, dQ
CHECK_SECONDS = 0.1  # an implementation's check at 256 tokens: float64 autograd on the host
EVIDENCE_START_SECONDS = 4.5  # a Python process importing torch, Triton and gpulab (the build machine, cold)
# Nsight Compute, the 20 kernels at their default sizes in one session, start to end, tens of replays of each kernel
# included: 55.7 s on the H100 and 50.7 s on the H200 (session_seconds in results/*/kernel_counters.json, 2026-11-26)
NCU_SESSION_SECONDS = 56.0


def _on_gpu(label: str, **work) -> Work:
    """Work that runs only where the Triton kernels do (compute capability 8.0 or later)."""
    return Work(label, min_capability=MIN_CAPABILITY, **work)


def _checks(s: dict) -> list[Work]:
    """kernel_checks: per head size and mask, the forward and forward + backward at one small shape; on a GPU they
    compile each kernel for a length not divisible by 16."""
    work = []
    b, h, n = s["check_batch"], s["check_heads"], s["check_seq_len"]
    for d in s["check_head_dims"]:
        for causal in (False, True):
            label = f"check, d = {d}{', causal' if causal else ''}"
            once = measure.forward_flops(b, h, n, d, causal)
            work.append(_on_gpu(f"{label}: forward", flops=once, precision=s["check_dtype"], warmup=0, repeats=1,
                                flush_l2=False, checked_elements=b * h * n * n))
            work.append(_on_gpu(f"{label}: compile", launches=0, extra_seconds=KERNELS_PER_ATTENTION *
                                TRITON_COMPILE_SECONDS))
    return work


def _point(name: str, n: int, d: int, causal: bool, s: dict) -> list[Work]:
    """One implementation at one length: a measurement of the forward and one of forward + backward."""
    batch, heads = max(1, s["tokens"] // n), s["model_dim"] // d
    size = flops.bytes_per_element(s["dtype"])
    work = measure.forward_flops(batch, heads, n, d, causal)
    tensors = 4 * batch * heads * n * d * size  # q, k, v and o (the backward reads and writes as many again)
    scores = batch * heads * n * n * 4 / (2 if causal else 1)  # the math backend's float32 scores
    label = f"{name}, {n:,} tokens, d = {d}{', causal' if causal else ''}"
    items = []
    for i, (what, factor, moved) in enumerate((("forward", 1.0, tensors),
                                               ("forward + backward", 1 + measure.BACKWARD_FACTOR, 2 * tensors))):
        if name == "sdpa-math":
            moved += MATH_SCORE_PASSES[i] * scores
        items.append(_on_gpu(f"{label}: {what}", flops=factor * work, bytes=moved, precision=s["dtype"],
                             share=SHARES[name][i], memory_bytes=2 * tensors))
    return items


def _race(s: dict) -> list[Work]:
    work = []
    for d in s["head_dims"]:
        for causal in (False, True):
            work.append(_on_gpu(f"race checks, d = {d}{', causal' if causal else ''}", launches=0,
                                extra_seconds=len(s["implementations"]) * CHECK_SECONDS +
                                KERNELS_PER_ATTENTION * TRITON_COMPILE_SECONDS))
            work += [w for name in s["implementations"] for n in s["seq_lens"] for w in _point(name, n, d, causal, s)]
    return work


def _counters(s: dict) -> list[Work]:
    if not s["profile_counters"]:
        return []
    return [Work(f"Nsight Compute, one session of {len(profiled.KERNELS)} kernels", launches=0,
                 extra_seconds=NCU_SESSION_SECONDS)]


def work(s: dict) -> list[Work]:
    return [*_checks(s), *_race(s), *_counters(s)]


def fixed_seconds(s: dict) -> float:
    """Imports and the notebook; the compiled code's evidence (a process that compiles each kernel for sm_90)."""
    evidence = EVIDENCE_START_SECONDS + len(s["evidence_kernels"]) * TRITON_COMPILE_SECONDS
    return budget.NOTEBOOK_SECONDS + evidence


CHAPTER = budget.Chapter(name="18 flash attention and counters", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE,
                         work=work, fixed_seconds=fixed_seconds)


def triton_unavailable() -> str:
    """'' where the chapter's Triton kernels run here: without a GPU (Triton's interpreter) or on a GPU of compute
    capability 8.0 or later; otherwise the sentence the page prints instead of running them."""
    if not kernel_mode.on_gpu():
        return ""
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) >= tuple(int(p) for p in MIN_CAPABILITY.split(".")):
        return ""
    return (f"This GPU ({torch.cuda.get_device_name()}, compute capability {major}.{minor}) does not run the chapter's "
            f"Triton kernels, whose tiles were chosen for GPUs of compute capability {MIN_CAPABILITY} and later (up to "
            "128 KiB of shared memory per program): the sections below show the recordings instead.")


def counters_skipped(profile_counters: bool) -> str:
    """'' where the notebook profiles the kernels live (the full profile on a GPU with Nsight Compute) or cannot
    anyway (no GPU: :func:`gpulab.core.recordings.runs` says so); otherwise the sentence that says why it does not."""
    if not kernel_mode.on_gpu():
        return ""
    if not profile_counters:
        return ("The class profile shows the recordings instead of profiling this GPU: Nsight Compute replays each "
                "kernel tens of times, and needs access to the GPU's performance counters, which a hosted notebook "
                'may not give. Set PROFILE = "full" to profile it.')
    try:
        profiled.find_ncu()
    except kernel_mode.MissingPackage as missing:
        return f"{missing}. The section shows the recordings instead."
    return ""
