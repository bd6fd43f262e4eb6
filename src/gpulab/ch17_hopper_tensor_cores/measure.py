"""What chapter 17 runs live: each step of the Triton ladder checked against float64 at a small shape (in Triton's
interpreter on a CPU, compiled on a GPU), and the GPU experiments where the GPU in front of the notebook has what
they need (:func:`runs_where_supported`): TMA and ``wgmma`` for the ladder (compute capability 9.0), FP8 tensor
cores for the scaled matmuls (8.9).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gpulab.core import env, kernel_mode, recordings
from gpulab.core.recordings import Runs
from gpulab.core.validation import positive_ints
from gpulab.kernels import triton_gemm
from gpulab.kernels.triton_gemm import common, interpreter

LADDER_CAPABILITY = (9, 0)  # TMA descriptors and warpgroup MMA: Hopper
FP8_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada and Hopper
TMA_STEPS = ("step4_tma", "step5_persistent", "step6_warp_specialized")  # they need a Hopper to compile


def step_name(step) -> str:
    """'step1_blocked' for the module :mod:`gpulab.kernels.triton_gemm.step1_blocked`."""
    return step.__name__.rsplit(".", 1)[-1]


def where_kernels_run() -> str:
    """A sentence: where this notebook's Triton kernels run."""
    if interpreter.interpreting():
        return "Triton's interpreter, on this CPU (NumPy runs each program of the grid in turn)"
    return f"the GPU, compiled by Triton ({env.describe().name})"


def missing_capability(needed: tuple[int, int]) -> str | None:
    """None when kernels run on a GPU of at least compute capability ``needed``; otherwise a sentence saying why
    not (no GPU here, or which GPU it is)."""
    if not kernel_mode.on_gpu():
        return "there is no GPU here"
    have = torch.cuda.get_device_capability()
    if have >= needed:
        return None
    return (f"this GPU ({torch.cuda.get_device_name()}) has compute capability {have[0]}.{have[1]}, and this needs "
            f"{needed[0]}.{needed[1]}")


def live_checks(shape: Sequence[int], dtype: str = "float16", seed: int = 0) -> list[dict]:
    """Each ladder step, with its own configuration, checked against float64 on fresh random ``M x N x K`` operands
    (:func:`gpulab.kernels.triton_gemm.common.check`: the output poisoned with NaN first, the tolerance from the
    arithmetic). A step that this GPU cannot compile (TMA below compute capability 9.0, or more shared memory than
    a block may have: step 2's three stages on a T4 or an L4) gets a row that says so."""
    sizes = positive_ints("shape", shape)
    if len(sizes) != 3:
        raise ValueError(f"shape: (M, N, K), got {sizes}")
    m, n, k = sizes
    if n % 8 or k % 8:
        raise ValueError(f"shape: N and K multiples of 8 (TMA's 16-byte rows in 16-bit types), got {sizes}")
    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"dtype: 'float16' or 'bfloat16', got {dtype!r}")
    if dtype == "bfloat16" and interpreter.interpreting():
        raise ValueError("dtype: bfloat16 runs on a GPU only (Triton's interpreter has no bfloat16 arithmetic)")
    from triton.runtime.errors import OutOfResources  # triton after gpulab.kernels.triton_gemm chose the mode

    hopper = missing_capability(LADDER_CAPABILITY) if kernel_mode.on_gpu() else None
    rows = []
    for number, step in enumerate(triton_gemm.STEPS, 1):
        name = step_name(step)
        config = {key: value for key, value in step.CONFIG.items() if not key.startswith("num_")}
        row = {"step": number, "kernel": name, "m": m, "n": n, "k": k, "dtype": dtype,
               "tile": f"{config['BLOCK_M']} x {config['BLOCK_N']} x {config['BLOCK_K']}",
               "stages": step.CONFIG["num_stages"], "warps": step.CONFIG["num_warps"]}
        if hopper and name in TMA_STEPS:
            rows.append({**row, "status": f"not run: TMA needs compute capability 9.0; {hopper}"})
            continue
        try:
            error = common.check(step.matmul, m, n, k, getattr(torch, dtype), seed=seed + number, what=name)
        except OutOfResources as short:  # a GPU with less shared memory per block than the step's stages take
            rows.append({**row, "status": f"not run: this GPU has {short.limit:,} of {short.name} per block, the "
                                          f"step needs {short.required:,}"})
            continue
        rows.append({**row, "relative_error": error, "tolerance": common.tolerance(getattr(torch, dtype), k),
                     "status": "ok"})
    return rows


def runs_where_supported(experiment: str, fn: Callable[..., list[dict]], needed: tuple[int, int],
                         **params) -> Runs:
    """:func:`gpulab.core.recordings.runs` for an experiment that needs a GPU of compute capability ``needed``: run
    live on such a GPU (and drawn beside every recording); on any other GPU, say in a sentence why not and draw the
    recordings alone. Without a GPU, the recordings (and the line that says when there is none)."""
    reason = missing_capability(needed)
    if reason is not None and kernel_mode.on_gpu():
        print(f"{experiment} does not run here: {reason}. The page shows the recorded GPUs.")
        return recordings.recorded(experiment)
    return recordings.runs(experiment, fn, needs_gpu=True, **params)


def tolerance_note(dtype: str, k: int) -> str:
    """How :func:`gpulab.kernels.triton_gemm.common.tolerance` comes about for K = ``k``, in a sentence."""
    precision = getattr(torch, dtype)
    return (f"The tolerance at K = {k:,}, {common.tolerance(precision, k):.2e}, is twice the sum of the {dtype} unit "
            f"roundoff ({common.unit_roundoff(precision):.2e}: C is rounded once to {dtype}) and sqrt(K) float32 "
            f"unit roundoffs ({k ** 0.5:.1f} x {common.unit_roundoff(torch.float32):.2e}: the rounding of K-term "
            "float32 sums grows like a random walk). A kernel that kept its running sum in 16 bits adds one 16-bit "
            "rounding per step along K, and at a K this short it may still pass: a check with a long K catches it "
            "(lab 12 has one).")
