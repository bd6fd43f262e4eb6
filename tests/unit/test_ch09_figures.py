"""Chapter 09's tables and figures: the worklog, the tuning and the quantization sweeps as tables with a column per
GPU, built from given rows."""

from __future__ import annotations

import plotly.io as pio
import pytest

from gpulab.ch04_mlp_gemms.waves import tile_waves
from gpulab.ch09_gemm_on_the_gpu import figures, gemm
from gpulab.core import plots, specs
from gpulab.core.recordings import Recording


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses


def run(experiment: str, rows: list[dict], device: str = "NVIDIA H200", **params) -> Recording:
    return Recording(experiment, "f", params, rows, {"device": {"name": device, "kind": "cuda"}, "recorded": True,
                                                    "date": "2026-11-24"})


def worklog_rows(scale: float = 1.0) -> list[dict]:
    rows = [{"step": s.number, "label": s.label, "file": s.file, "tflops": scale * 5.0 * s.number,
             "relative_error": 1e-6} for s in gemm.STEPS]
    rows.append({"step": 0, "label": "cuBLAS", "file": "cuBLAS", "tflops": scale * 50.0, "relative_error": 2e-6})
    for r in rows:
        r.update(fraction_of_cublas=r["tflops"] / (scale * 50.0), fraction_of_peak=r["tflops"] / 100.0)
    return rows


def test_worklog_table_has_a_column_group_per_gpu():
    runs = [run("gemm_worklog", worklog_rows(), n=4096),
            run("gemm_worklog", worklog_rows(0.5), "NVIDIA H100 80GB HBM3", n=4096)]
    table = figures.worklog_table(runs)
    assert table.headers[:5] == ["step", "H200: rate (TFLOP/s)", "over the step before", "of cuBLAS", "of the peak"]
    assert table.headers[5] == "H100 80GB HBM3: rate (TFLOP/s)"
    assert table.cells[1][:5] == ["2. coalesced", "10.00", "2.00x", "20.0%", "10%"]
    assert table.cells[-1][0] == "cuBLAS" and table.cells[-1][2] == "–" and table.cells[-1][3] == "100.0%"
    assert table.caption == "float32, 4,096^3, cuBLAS with TF32 off"
    first, second = figures.worklog_target(runs)
    assert "step 9 (prefetched fragments), reaches 90.0% of cuBLAS and meets the 80% target" in first
    assert "relative error of 2.0e-06 or less" in first
    assert "misses" in figures.worklog_target(runs, target=0.95)[0]
    figure = figures.worklog_by_gpu(runs)
    assert [b.label for b in figure.layout.updatemenus[0].buttons] == ["H200", "H100 80GB HBM3"]
    peak = specs.peak(specs.find("NVIDIA H200"), "float32", "CUDA cores").tflops
    assert any(f"FP32 peak {peak:.1f}" == a.text for a in figure.layout.annotations)
    assert figure.layout.xaxis.title.text == "kernel step"


def tuning_rows() -> list[dict]:
    variants = [({}, 46.0, 0), ({"BK": 16}, 40.0, 176), ({"MIN_BLOCKS": 1}, 46.2, 0)]
    return [{"label": gemm.prefetched(**d).label, "tflops": t, "threads": 256, "thread_tile": "8x8",
             "registers": 128, "spill_bytes": spills, "blocks_per_sm": 2} for d, t, spills in variants]


def test_tuning_table_figure_and_sentences():
    runs = [run("gemm_tuning", tuning_rows(), n=4096)]
    table = figures.tuning_table(runs)
    assert [row[0] for row in table.cells] == ["MIN_BLOCKS=1", "defaults", "BK=16"]
    assert table.cells[2][4:] == ["176", "2", "16", "40.00"]
    (sentence,) = figures.tuning_sentences(runs)
    assert "the fastest variant is MIN_BLOCKS=1 at 46.20 TFLOP/s; variants that spill registers: BK=16." in sentence
    assert list(figures.tuning_figure(runs).data[0].x) == ["MIN_BLOCKS=1", "defaults", "BK=16"]


def sweep_rows(ns: list[int], m: int = 2048, sms: int = 132, resident: int = 2) -> list[dict]:
    rows = []
    for n in ns:
        model = tile_waves(m, n, (128, 128), sms * resident)
        row = {"m": m, "n": n, "k": 4096, "tiles": model.tiles, "waves": model.waves,
               "tile_efficiency": model.tile_efficiency, "wave_efficiency": model.wave_efficiency,
               "efficiency": model.efficiency, "status": "ok", "kernel": "prefetched fragments", "tile": "128x128",
               "tile_m": 128, "tile_n": 128, "slots": sms * resident, "sms": sms, "resident": resident}
        row["kernel_tflops"] = 40.0 * gemm.sm_efficiency(row, 0.6)
        row["cublas_tflops"] = 45.0
        rows.append(row)
    return rows


def test_quantization_tables_fit_the_model_per_gpu():
    waves = [run("gemm_wave_quantization", sweep_rows([128 * c for c in range(8, 40)]))]
    tiles = [run("gemm_tile_quantization", sweep_rows(list(range(3584, 4609, 64)), m=4096))]
    partial = figures.fitted_partials(waves)
    assert partial["NVIDIA H200"] == pytest.approx(0.6, abs=0.01)
    sweeps = {"wave": waves, "tile": tiles}
    fit = figures.model_fit_table(sweeps, partial)
    assert [row[:2] for row in fit.cells] == [["wave", "H200"], ["tile", "H200"]]
    assert fit.cells[0][4] == "1.000"  # the per-SM model with the fitted p is the kernel here
    assert fit.cells[0][5] == "–"  # cuBLAS ran at one rate: no correlation
    steps = figures.model_steps_table(sweeps, partial)
    assert steps.cells[0][:4] == ["wave", "H200", "1,024 -> 1,152", "1 -> 2"]
    assert steps.cells[0][4] == steps.cells[0][5]  # model and kernel step alike
    figure = figures.quantization_by_gpu(waves, "tiles", partial, title="Wave quantization", x_title="tiles")
    assert figure.layout.title.text == "Wave quantization: NVIDIA H200, recorded 2026-11-24"
    assert "partial group 0.60" in figure.data[2].name
    divisible = figures.divisibility_table(tiles)
    assert divisible.headers == ["N is a", "sizes", "H200: step 9", "cuBLAS"]
    assert divisible.cells[0][:2] == ["multiple of 256", "5"]


def test_arithmetic_tables():
    ridge = figures.ridge_table(("H200 SXM 141GB",))
    row = specs.gpu("H200 SXM 141GB")
    ridge_point = specs.peak(row, "float32", "CUDA cores").ops_per_s / (row.bandwidth_gb_s * 1e9)
    assert ridge.cells[0][3] == f"{ridge_point:.1f}"
    blocking = figures.blocking_table(4096, (1, 32))
    assert blocking.cells == [["1 x 1", "2.0000", "0.2"], ["32 x 32", "0.0625", "8.0"]]
    assert blocking.caption.endswith("683 FLOP per byte")
    model = figures.model_table(1024, (2560, 2688), (256, 128), 80)
    assert model.cells == [["2,560", "80", "1", "100.0%"], ["2,688", "84", "2", "52.5%"]]
    assert [t.name for t in figures.model_figure(1024, range(1024, 3000, 128), (256, 128), 80).data] == [
        "tile x wave efficiency", "wave efficiency"]
    simulated = figures.simulation_table([{"kernel": "matmul_tiled", "relative_error": 1e-7, "loads": 12288.0}],
                                         (3, 2), 16)
    assert simulated.cells == [["matmul_tiled", "1.0e-07", "12,288"]] and simulated.caption.startswith("3 x 2 blocks")


def test_steps_table_reports_every_step():
    table = figures.steps_table(gemm.STEPS[:2])
    assert [row[0] for row in table.cells] == ["1. naive", "2. coalesced"]
    assert table.cells[0][3] == "1,024" and table.caption.startswith("compiled for sm_")
