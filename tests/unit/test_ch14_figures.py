"""Chapter 14's figures and tables: built from runs (every recorded GPU behind a menu, a GPU column in the tables),
their cells and sentences read from the rows."""

from __future__ import annotations

import copy

import pytest
import torch

from gpulab.ch14_batched_linear_algebra import batched, figures
from gpulab.core import recordings
from gpulab.core.recordings import Recording


def run_of(experiment: str, device: str = "NVIDIA H200", recorded: bool = True) -> Recording:
    """The H200's recording of ``experiment``, as if made on ``device`` (recorded, or a live run)."""
    source = recordings.load(experiment, "H200")
    provenance = {"device": {"name": device, "kind": "cuda"}, "date": "2026-11-24", "recorded": recorded}
    return Recording(experiment, source.function, dict(source.params), copy.deepcopy(source.rows), provenance)


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def test_small_problem_table_per_recorded_gpu():
    rows = cells(figures.small_problem_table([run_of("batched_gemm"), run_of("batched_gemm", "NVIDIA H100 80GB HBM3")],
                                             sizes=(64, 1024)))
    assert [r["order n"] for r in rows] == ["64", "1,024"] * 2
    gpus = [r["GPU (float32 peak)"] for r in rows]
    assert gpus[0].startswith("H200 SXM 141GB (132 SMs") and gpus[2].startswith("H100 SXM5 80GB")
    assert rows[1]["thread blocks"] == "64" and rows[1]["blocks per SM"] == "0.48"
    assert cells(figures.small_problem_table([], sizes=(8,)))[0]["GPU (float32 peak)"].startswith("H200")


def test_gemm_target_and_sentences_from_the_rows():
    run = run_of("batched_gemm")
    said = figures.gemm_target([run], 64, 1000, 20)[0]
    assert "is 443.7 times faster than the loop. The book's target (at least 20x on a GPU) is met." in said
    assert "float32 444x, tf32 914x, float16 866x" in said
    assert "is not met" in figures.gemm_target([run], 64, 1000, 1000)[0]
    assert "cannot be judged" in figures.gemm_target([run], 65, 1000, 20)[0]
    lacking = run_of("batched_gemm")
    lacking.rows.append({"dtype": "tf32", "status": "not run: the CPU has no TF32"})
    assert "tf32 was not run: the CPU has no TF32." in figures.gemm_target([lacking], 64, 1000, 20)[0]
    said = figures.gemm_statements([run], 64)[0]
    assert "the loop takes 10.0 µs per product at n = 8 and 17.4 µs at n = 256" in said
    assert "= 68% of the H200 SXM 141GB's float32 peak" in said
    assert "The same ratio in float16, over n: batch of 50: 0.99 to 1.04" in said


def test_methods_by_gpu_has_a_menu_entry_per_gpu_and_format():
    runs = [run_of("batched_gemm"), run_of("batched_gemm", "NVIDIA H100 80GB HBM3")]
    fig = figures.methods_by_gpu(runs, "Many small GEMMs")
    [menu] = fig.layout.updatemenus
    labels = [b.label for b in menu.buttons]
    assert labels[:3] == ["H200, float32", "H200, tf32", "H200, float16"] and labels[3] == "H100 80GB HBM3, float32"
    assert menu.buttons[3].args[1]["title.text"].endswith("NVIDIA H100 80GB HBM3, recorded 2026-11-24, float32")
    assert sum(t.visible for t in fig.data) == len(fig.data) // 6
    assert fig.layout.title.text == "Many small GEMMs: NVIDIA H200, recorded 2026-11-24, float32"
    assert figures.methods_by_gpu([], "x").layout.title.text == "No recording yet"


def test_permutation_table_tells_the_directions_apart():
    A = torch.tensor([[1.0, 2, 1, 4], [2, 1, 3, 1], [8, 1, 1, 2], [1, 9, 2, 1]], dtype=torch.float64)
    LU, pivots = torch.linalg.lu_factor(A)
    table = figures.permutation_table(A, LU, pivots)
    values = {row[0]: row[1] for row in table.cells}
    assert values["||A - P L U||_F"] == values["||P^T A - L U||_F"] == "0" and float(values["||P A - L U||_F"]) > 1
    assert "[3, 4, 4, 4]" in table.caption


def test_lu_figure_sentences_and_intensities():
    run = run_of("batched_lu")
    fig = figures.lu_by_gpu([run, run_of("batched_lu", "NVIDIA H100 80GB HBM3")])
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["H200", "H100 80GB HBM3"]
    said = figures.lu_statements([run])[0]
    assert "GPU best 21,229 GFLOP/s at n = 16,384 = 32% of its 66.9 TFLOP/s peak (tensor cores)" in said
    assert "1.33x the CPU at the smallest, n = 512, 35.5x at n = 8,192" in said
    assert "float32 over float64 on the CPU at n = 8,192: 3.31x." in said
    rows = cells(figures.lu_intensity_table([run], sizes=(8, 256)))
    assert rows[0]["intensity (FLOP/byte)"] == f"{batched.lu_flops(8) / 1024:.2f}" and rows[1]["the ridge"] == "below"


def test_small_lu_sentences_read_the_large_run_of_the_same_machine_only():
    small, large = run_of("batched_small_lu"), run_of("batched_lu")
    said = figures.small_lu_statements([small], [large])[0]
    assert "the batched call is 3,330x faster at n = 8 and 64x at n = 256" in said
    assert "The batched rate did not grow from n = 32 (397 GFLOP/s) to n = 64 (297 GFLOP/s)." in said
    assert "8% of the large getrf's best rate (21,229 GFLOP/s)" in said
    other = figures.small_lu_statements([small], [run_of("batched_lu", recorded=False)])[0]
    assert "large getrf" not in other and "of the roofline bound" in other


@pytest.mark.parametrize("labels", [None, batched.LU_METHOD_LABELS])
def test_methods_figure_keeps_its_one_dtype_title(labels):
    rows = [{"method": "loop", "n": n, "batch": 8, "dtype": "float64", "seconds": 1e-3, "gflops": 1.0,
             "us_per_problem": 1.0, "status": "ok"} for n in (8, 16)]
    fig = figures.methods_figure(rows, title="LU", labels=labels)
    assert fig.layout.title.text == "LU, float64" and not fig.layout.updatemenus
