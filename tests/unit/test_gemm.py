"""The GEMM chapter: the worklog's steps, their tiling arithmetic, compile-time variants, the numba tiling
in the simulator, and (on a GPU) every step against float64 on fresh random data."""

from __future__ import annotations

import pytest
import torch

from conftest import needs_gpu
from gpulab.ch04_mlp_gemms.waves import tile_waves
from gpulab.ch09_gemm_on_the_gpu import figures, gemm
from gpulab.core import kernel_mode
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.kernels import cuda_c, numba_kernels


def test_the_worklog_is_every_sgemm_file_in_order():
    sgemm_files = [p.stem for p in cuda_c.files() if "sgemm" in p.stem]
    assert [s.file for s in gemm.STEPS] == sgemm_files
    assert [s.number for s in gemm.STEPS] == list(range(1, len(gemm.STEPS) + 1))
    assert gemm.step(9) is gemm.BEST and gemm.step("18_sgemm_shared.cu").label == "shared-memory tiles"
    with pytest.raises(ValueError, match="step: 1 to 9"):
        gemm.step(10)


def test_launch_grids_cover_the_output():
    naive, shared, best = gemm.step(1), gemm.step(3), gemm.BEST
    assert naive.grid(100, 70) == (4, 3)  # x runs along rows of C
    assert shared.grid(100, 70) == (3, 4)  # x runs along a row
    assert best.grid(4096, 4097) == (33, 32)


def test_traffic_follows_the_tiles():
    assert gemm.traffic(gemm.step(2)) == {"global_floats_per_fma": 2.0, "shared_loads_per_fma": 0.0}
    assert gemm.traffic(gemm.step(3))["global_floats_per_fma"] == pytest.approx(2 / 32)
    assert gemm.traffic(gemm.step(4))["shared_loads_per_fma"] == pytest.approx(9 / 8)
    assert gemm.traffic(gemm.step(5))["shared_loads_per_fma"] == pytest.approx(16 / 64)
    assert gemm.traffic(gemm.BEST) == {"global_floats_per_fma": pytest.approx(1 / 64),
                                       "shared_loads_per_fma": pytest.approx(4 / 64)}


def test_variants_of_the_last_step_are_validated_and_compile_with_their_defines():
    wide = gemm.prefetched(BN=256, WN=64, MIN_BLOCKS=1)
    assert wide.tile == (128, 256) and wide.thread_tile == (8, 16) and wide.threads == (256,)
    assert wide.label == "prefetched fragments (BN=256, MIN_BLOCKS=1, WN=64)"
    default, uncapped = gemm.resources(gemm.BEST), gemm.resources(wide)
    assert default["registers"] <= 128 and default["blocks_per_sm"] == 2 and default["spill_bytes"] == 0
    assert uncapped["registers"] > 128 and uncapped["blocks_per_sm"] == 1
    with pytest.raises(ValueError, match="has BM, BN"):
        gemm.prefetched(TM=4)
    with pytest.raises(ValueError, match="warp tile"):
        gemm.prefetched(WM=48)
    with pytest.raises(ValueError, match="BK: must be > 0"):
        gemm.prefetched(BK=0)


def test_a_variant_past_the_shared_memory_limit_fails_with_its_flags():
    with pytest.raises(cuda_c.CompileError, match=r"(?s)-DBK=16 -DBN=256.*too much shared data"):
        cuda_c.compile_report("24_sgemm_prefetched", arch="sm_90", defines={"BK": 16, "BN": 256, "WN": 64,
                                                                            "MIN_BLOCKS": 1})


def test_defines_must_be_macro_names_with_int_values():
    with pytest.raises(ValueError, match="upper-case"):
        cuda_c.compile_report("24_sgemm_prefetched", defines={"bk": 16})
    with pytest.raises(ValueError, match="BK must be an int"):
        cuda_c.compile_report("24_sgemm_prefetched", defines={"BK": "16"})


def test_divisibility_groups_sizes_by_their_largest_power_of_two():
    rows = [{"n": n, "kernel_tflops": float(n % 128 == 0) + 1, "cublas_tflops": 2.0} for n in range(3840, 4353, 16)]
    groups = {g["sizes"]: g for g in gemm.divisibility(rows)}
    assert list(groups) == ["multiple of 256", "multiple of 128", "multiple of 64", "multiple of 32",
                            "multiple of 16"]
    assert groups["multiple of 256"]["count"] == 3 and groups["multiple of 128"]["kernel_relative"] == 1.0
    assert groups["multiple of 16"]["kernel_relative"] == 0.5 and groups["multiple of 16"]["cublas_relative"] == 1.0
    with pytest.raises(ValueError, match="no measurements"):
        gemm.divisibility([])


def test_the_guides_examples():
    assert tile_waves(3 * 128, 4 * 128, (128, 128), 8).wave_efficiency == 0.75
    tail = tile_waves(1024, 2688, (256, 128), 80)
    assert (tail.tiles, tail.waves, tail.efficiency) == (84, 2, pytest.approx(84 / 160))


def test_figures_draw_from_rows():
    rows = [{"step": s.number, "label": s.label, "tflops": 10.0 * s.number, "fraction_of_cublas": s.number / 10}
            for s in gemm.STEPS] + [{"step": 0, "label": "cuBLAS", "tflops": 100.0, "fraction_of_cublas": 1.0}]
    fig = figures.worklog_figure(rows, peak_tflops=120.0, title="t")
    assert len(fig.data[0].x) == 9 and fig.data[0].text[-1] == "90%"
    assert len(figures.schedule_figure(64, 96, 80, 16, block=(1, 2)).layout.sliders[0].steps) == 5
    with pytest.raises(ValueError, match="block"):
        figures.schedule_figure(64, 96, 80, 16, block=(4, 0))
    waves = figures.waves_figure(3 * 128, 4 * 128, (128, 128), 8)
    assert waves.data[0].z[2] == (2, 2, 2, 2) or list(waves.data[0].z[2]) == [2, 2, 2, 2]


def test_the_numba_tiled_kernel_matches_torch_in_either_mode():
    device = kernel_mode.device()
    A, B = random_tensor((32, 48), torch.float32, device), random_tensor((48, 16), torch.float32, device)
    C = poisoned((32, 16), torch.float32, device)
    tile = numba_kernels.TILE
    numba_kernels.matmul_tiled[(16 // tile, 32 // tile), (tile, tile)](
        kernel_mode.device_array(A), kernel_mode.device_array(B), kernel_mode.device_array(C))
    kernel_mode.synchronize()
    check_close(C, A.double() @ B.double(), 1e-5, "matmul_tiled")


def test_the_kernels_need_a_gpu_and_say_so():
    if kernel_mode.on_gpu():
        pytest.skip("checks the message without a GPU")
    with pytest.raises(ValueError, match="step 9 .*needs a CUDA GPU"):
        gemm.sgemm(9, torch.ones(4, 4), torch.ones(4, 4))
    with pytest.raises(ValueError, match="worklog"):
        gemm.worklog(256)


@needs_gpu
@pytest.mark.parametrize("number", range(1, 10))
def test_every_step_matches_float64_on_ragged_sizes(number):
    error = gemm.check(gemm.step(number), 131, 260, 68, torch.device("cuda"))
    assert error < 1e-5


@needs_gpu
def test_bad_operands_are_named():
    A, B = torch.ones(64, 30, device="cuda"), torch.ones(30, 64, device="cuda")
    with pytest.raises(ValueError, match="multiples of 4"):
        gemm.sgemm(9, A, B)
    with pytest.raises(ValueError, match="needs 30 rows"):
        gemm.sgemm(2, A, torch.ones(31, 8, device="cuda"))
    with pytest.raises(ValueError, match="float32"):
        gemm.sgemm(2, A.half(), B.half())


def _sweep_row(tiles_m: int, tiles_n: int, sms: int = 8, resident: int = 2) -> dict:
    return {"m": 128 * tiles_m, "n": 128 * tiles_n, "tile_m": 128, "tile_n": 128, "tiles": tiles_m * tiles_n,
            "sms": sms, "resident": resident}


def test_the_per_sm_model_counts_the_busiest_sm():
    full, odd, lone = _sweep_row(4, 4), _sweep_row(3, 3), _sweep_row(2, 4)  # 16, 9 and 8 tiles on 8 SMs
    assert gemm.blocks_per_busiest_sm(odd) == 2 and gemm.blocks_per_busiest_sm(_sweep_row(17, 1)) == 3
    assert gemm.sm_efficiency(full, 0.6) == 1.0
    assert gemm.sm_efficiency(odd, 0.6) == pytest.approx(9 / 16)  # one SM runs a pair: a whole group's time
    assert gemm.sm_efficiency(lone, 0.6) == pytest.approx(0.5 / 0.6)  # every SM runs one block, alone
    slot_model = tile_waves(lone["m"], lone["n"], (128, 128), 8 * 2).efficiency
    assert gemm.sm_efficiency(lone, 1.0) == pytest.approx(slot_model) == 0.5  # a half-empty wave costs a whole one


def test_fit_partial_recovers_the_time_of_a_lone_block():
    rows = [_sweep_row(t, 1) for t in range(4, 40)]
    for r in rows:
        r["kernel_tflops"] = 50 * gemm.sm_efficiency(r, 0.7)
    assert gemm.fit_partial(rows) == pytest.approx(0.7, abs=0.003)
    with pytest.raises(ValueError, match="at least 3"):
        gemm.fit_partial(rows[:2])
