"""gpulab.core.profiling: the profiler runs the function the number of times asked, and sees what it ran."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import needs_gpu
from gpulab.core import profiling

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


@needs_gpu
def test_a_gpu_profile_lists_the_kernels_with_their_durations():
    device = torch.device("cuda")
    a = torch.randn(512, 512, device=device)
    kernels = profiling.device_kernels(profiling.profile_calls(lambda: a @ a, device, calls=2))
    assert len(kernels) >= 2 and all(seconds > 0 for _, seconds in kernels)


@pytest.mark.parametrize(("name", "annotation"), [
    ("Optimizer.step#AdamW.step", True),
    ("ProfilerStep#3", True),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
     "at::native::GeluType)::{lambda()#1}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >", False),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", False),
    ("triton_poi_fused_add_gelu_native_dropout_0", False),
])
def test_lambda_kernels_are_kernels_and_ranges_are_annotations(name, annotation):
    assert profiling.is_annotation(SimpleNamespace(name=name)) is annotation


def test_a_user_annotation_is_recognised_by_its_flag():
    assert profiling.is_annotation(SimpleNamespace(name="my range", is_user_annotation=True))


@pytest.mark.parametrize(("raw", "short"), [
    ("void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>"
     "(at::cuda::detail::TensorInfo<float const, unsigned int>, float)",
     "at::native::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
     "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
     "at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"),
    ("triton_poi_fused_add_gelu_native_dropout_0", "triton_poi_fused_add_gelu_native_dropout_0"),
])
def test_kernel_names_lose_return_type_namespace_and_arguments(raw, short):
    assert profiling.short_name(raw) == short
