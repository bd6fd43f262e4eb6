"""Which kernels ran: one call of a function under ``torch.profiler``, and the GPU kernels of a profile.

Several chapters ask the same question of different code (which GEMM kernel cuBLAS chose, which
algorithm cuDNN picked, how many kernels a fused chain launches, where a training step spends its
time), so the profiler is set up here, once. On a GPU the answer is the list of kernels, copies and
memsets the device ran, each with its duration; on a CPU there are no kernels, only the operators the
profiler saw, which callers read from the returned profile themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from gpulab.core import timing
from gpulab.core.validation import positive_int


def profile_calls(fn: Callable[[], object], device: torch.device, calls: int = 1):
    """Run ``fn()`` ``calls`` times under ``torch.profiler`` (CPU activity, and CUDA on a GPU); return the profile.

    The device is synchronised before the profile closes, so every kernel the calls launched is in it.
    """
    from torch.profiler import ProfilerActivity, profile

    calls = positive_int("calls", calls)
    # kineto writes a line to stderr at every profiler start and stop; it reads this once, at its first use
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, acc_events=True) as prof:
        for _ in range(calls):
            fn()
        timing.synchronize(device)
    return prof


def is_annotation(event) -> bool:
    """A record_function range drawn on the GPU's timeline (e.g. 'Optimizer.step#AdamW.step'), not a kernel:
    it spans kernels that are counted on their own.

    A '#' alone does not make an annotation: kernels written as C++ lambdas carry one in their names
    ('at::native::vectorized_elementwise_kernel<4, ...{lambda(float)#1}...>'), always with a namespace.
    """
    name = event.name
    return (bool(getattr(event, "is_user_annotation", False)) or name.startswith("ProfilerStep")
            or ("#" in name and "::" not in name))


def device_kernels(profile) -> list[tuple[str, float]]:
    """(name, seconds) of every kernel, memcpy and memset the GPU ran during ``profile``, in order."""
    from torch.autograd import DeviceType

    found = [(e.name, e.time_range.elapsed_us() / 1e6) for e in profile.events()
             if e.device_type == DeviceType.CUDA and not is_annotation(e)]
    if not found:  # older profilers attach kernels to the CPU operator that launched them
        found = [(k.name, k.duration / 1e6) for e in profile.events() for k in getattr(e, "kernels", [])]
    return found


def short_name(name: str) -> str:
    """A kernel's name without its return type, anonymous namespaces and argument list, at most 120 characters:
    'void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, ...>(...)' becomes
    'at::native::fused_dropout_kernel_vec<float, ...>'. The argument list is the first '(' outside the
    template's angle brackets (a template argument may hold parentheses of its own)."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    depth = 0
    for i, char in enumerate(name):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "(" and depth == 0:
            name = name[:i]
            break
    return name[:120]
