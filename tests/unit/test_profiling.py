"""gpulab.profiling: the profiler runs the function the number of times asked, and sees what it ran."""

from __future__ import annotations

import pytest
import torch

from gpulab import profiling

CPU = torch.device("cpu")


def test_profile_calls_runs_the_function_and_records_its_operators():
    a = torch.randn(16, 16)
    calls = []

    def work():
        calls.append(1)
        return a @ a

    prof = profiling.profile_calls(work, CPU, calls=3)
    assert len(calls) == 3
    names = [e.name for e in prof.events()]
    assert names.count("aten::mm") == 3


def test_a_cpu_profile_has_no_device_kernels():
    prof = profiling.profile_calls(lambda: torch.ones(4) + 1, CPU)
    assert profiling.device_kernels(prof) == []


def test_calls_must_be_positive():
    with pytest.raises(ValueError, match="calls"):
        profiling.profile_calls(lambda: None, CPU, calls=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_profile_lists_the_kernels_with_their_durations():
    device = torch.device("cuda")
    a = torch.randn(512, 512, device=device)
    kernels = profiling.device_kernels(profiling.profile_calls(lambda: a @ a, device, calls=2))
    assert len(kernels) >= 2 and all(seconds > 0 for _, seconds in kernels)
