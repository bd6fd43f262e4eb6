"""The kernels, their switch, the occupancy calculator, and the experiments of the CUDA chapters.

Without a GPU these run the numba kernels in the CUDA simulator and compile the CUDA C with NVRTC;
on a GPU (``PYTHONPATH=src pytest tests/unit`` there) the GPU-only tests run too.
"""

from __future__ import annotations

import pytest
import torch

from conftest import needs_gpu
from gpulab.ch07_cuda_threads_blocks import threads
from gpulab.ch08_memory_hierarchy import memory
from gpulab.core import banner, env, kernel_mode, occupancy
from gpulab.kernels import cuda_c

simulator_only = pytest.mark.skipif(kernel_mode.on_gpu(), reason="checks the simulator's behaviour")


@pytest.mark.parametrize("file", cuda_c.files(), ids=lambda p: p.stem)
def test_every_kernel_file_compiles_and_reports_its_resources(file):
    report = cuda_c.compile_report(file.stem, arch="sm_90")
    entries = cuda_c.entry_points(file.read_text())
    assert entries and sorted(report.resources) == sorted(entries)
    assert all(r.registers > 0 and r.spill_stores_bytes == 0 for r in report.resources.values())


def test_shared_memory_of_the_tiles_is_reported():
    assert cuda_c.compile_report("13_transpose_tiled").resources["transpose_tiled"].shared_bytes == 32 * 32 * 4
    assert cuda_c.compile_report("14_transpose_padded").resources["transpose_padded"].shared_bytes == 32 * 33 * 4


def test_a_broken_kernel_fails_with_the_compiler_log(tmp_path, monkeypatch):
    (tmp_path / "99_broken.cu").write_text('extern "C" __global__ void broken(float *x) { x[0] = y; }\n')
    monkeypatch.setattr(cuda_c, "FOLDER", tmp_path)
    with pytest.raises(cuda_c.CompileError, match="identifier \"y\" is undefined"):
        cuda_c.compile_report("99_broken")


def test_unknown_kernel_files_and_architectures_are_named():
    with pytest.raises(ValueError, match="no kernel file '99_nothing'.*04_saxpy"):
        cuda_c.path("99_nothing")
    with pytest.raises(ValueError, match="arch"):
        cuda_c.compile_report("04_saxpy", arch="hopper")


def test_resource_lines_are_parsed_per_kernel():
    log = ("ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
           "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 4224 bytes smem\n"
           "ptxas info    : Compiling entry function 'b' for 'sm_90'\n"
           "ptxas info    : Used 10 registers, used 0 barriers\n")
    found = cuda_c.parse_resources(log)
    assert found["a"] == cuda_c.Resources("a", 40, 4224, 8, 4, 4)
    assert found["b"] == cuda_c.Resources("b", 10, 0, 0, 0, 0)


def test_the_banner_says_where_kernels_run():
    assert str(banner.banner()).splitlines()[-1] == kernel_mode.describe() + "."
    assert ("simulator" in kernel_mode.describe()) != kernel_mode.on_gpu()


@pytest.mark.parametrize(("threads_per_block", "registers", "shared", "blocks", "limit", "fraction"), [
    (256, 10, 0, 8, "threads", 1.0),
    (32, 10, 0, 32, "blocks", 0.5),  # 32 block slots x 32 threads = half the SM
    (1024, 64, 0, 1, "registers", 0.5),  # 64 x 1024 registers = the whole file: only one block
    (256, 56, 0, 4, "registers", 0.5),
    (256, 32, 48 * 1024, 4, "shared memory", 0.5),  # 4 x (48 KiB + 1 KiB reserved) <= 228 KiB < 5 x
])
def test_occupancy_follows_the_calculator(threads_per_block, registers, shared, blocks, limit, fraction):
    result = occupancy.theoretical(threads_per_block, registers, shared, occupancy.limits("9.0"))
    assert (result.blocks_per_sm, result.limited_by, result.fraction) == (blocks, limit, fraction)


def test_occupancy_rejects_impossible_input():
    with pytest.raises(ValueError, match="threads_per_block"):
        occupancy.theoretical(2048, 32, 0, occupancy.limits("9.0"))
    with pytest.raises(ValueError, match="compute_capability"):
        occupancy.limits("1.0")


def test_hello_signs_every_thread_once():
    rows = threads.hello(3, 4)
    assert sorted((r["block"], r["thread"]) for r in rows) == [(b, t) for b in range(3) for t in range(4)]
    assert [r["line"] for r in rows] == list(range(12))


def test_first_kernels_compute_the_right_thing():
    assert threads.scalar_add(2, 7) == 9
    added = threads.vector_add(1000, 256)  # checked inside against torch
    assert (added["blocks"], added["idle_threads"]) == (4, 24)
    assert threads.saxpy(777, 3.0, 128)["relative_error"] < 1e-6
    assert threads.blocks_for(50_000, 256) == 196  # the course's launch


def test_the_course_grid_is_drawn_from_what_the_threads_wrote():
    rows = threads.grid_2d((3, 2), (4, 3))
    assert len(rows) == 72
    element = next(r for r in rows if (r["row"], r["col"]) == (4, 9))  # row 4 = block y 1, thread y 1; col 9 = 2, 1
    assert (element["block_x"], element["block_y"], element["thread_x"], element["thread_y"]) == (2, 1, 1, 1)


@simulator_only
def test_the_simulator_refuses_launches_it_cannot_run_in_time():
    with pytest.raises(ValueError, match="simulator"):
        threads.vector_add(10**6)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        threads.divergence([1, 32])
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        memory.transpose(64)


def test_coalescing_and_bank_predictions():
    assert [memory.sectors_per_warp(s) for s in (1, 2, 4, 8, 64)] == [4, 8, 16, 32, 32]
    assert memory.bank_conflict_degree(32) == 32
    assert memory.bank_conflict_degree(33) == 1
    assert memory.bank_conflict_degree(34) == 2


def test_the_stencil_needs_its_barrier():
    rows = memory.stencil(600, trials=1)  # with the barrier it checks itself against torch
    with_barrier, without = (next(r for r in rows if r["barrier"] is b) for b in (True, False))
    assert with_barrier["wrong"] == 0
    if not kernel_mode.on_gpu():  # the simulator runs a thread to its barrier before the next: the race always shows
        assert without["wrong"] > 0


@needs_gpu
def test_launch_checks_its_arguments():
    x = torch.zeros(4, device="cuda")
    with pytest.raises(ValueError, match="32-bit"):
        cuda_c.launch("04_saxpy", "saxpy", 1, 4, 2**40, 1.0, x, x)
    with pytest.raises(ValueError, match="contiguous CUDA tensor"):
        cuda_c.launch("04_saxpy", "saxpy", 1, 4, 4, 1.0, x.cpu(), x)
    with pytest.raises(ValueError, match="has no kernel"):
        cuda_c.function("04_saxpy", "axpy")


@needs_gpu
def test_occupancy_agrees_with_the_driver():
    import cupy

    kernel = cuda_c.function("15_copy_in_flight", "copy_in_flight")
    sm = occupancy.limits(env.describe().compute_capability)
    for size in (32, 64, 128, 256, 512, 1024):
        ours = occupancy.theoretical(size, kernel.attributes["num_regs"], 0, sm).blocks_per_sm
        assert ours == cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, size, 0)
