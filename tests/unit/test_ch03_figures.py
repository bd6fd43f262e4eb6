"""Chapter 03's tables, figures and explorer, drawn from recordings of one GPU or several."""

from __future__ import annotations

import json

import plotly.io as pio
import pytest

from conftest import shown
from gpulab.ch03_blas_levels import figures
from gpulab.ch03_blas_levels.explorer import roofline_explorer
from gpulab.core import plots, rates
from gpulab.core.recordings import Recording


def recording(experiment: str, device: str, rows: list[dict], **params) -> Recording:
    return Recording(experiment, "gpulab.ch03_blas_levels.blas:x", params, rows, {
        "device": {"name": device, "kind": "cuda"}, "date": "2026-01-02", "recorded": True})


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def ceilings_rows(bandwidth_gbs: float = 1000.0, peaks: dict | None = None) -> list[dict]:
    peaks = peaks or {"float32": 50_000.0, "float16": 400_000.0}
    return [{"ceiling": "bandwidth", "gbytes_per_s": bandwidth_gbs, "status": "ok"},
            *({"ceiling": "compute", "dtype": d, "gflops": g, "status": "ok"} for d, g in peaks.items())]


def level_rows() -> list[dict]:
    rows = []
    for dtype in ("float32", "float16"):
        for op, n in (("axpy", 2**20), ("axpy", 2**22), ("gemm", 1024), ("gemm", 4096)):
            cost = rates.flops.blas(op, n, dtype)
            rows.append({"op": op, "n": n, "dtype": dtype, "intensity": cost.intensity, "status": "ok",
                         "gflops": min(500 * cost.intensity, 40_000.0) - 1 / n, "seconds": 1e-3, "gbytes_per_s": 500.0})
    return rows


H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def test_costs_table_gives_the_intensity_of_each_level():
    rows = {r["operation"]: r for r in cells(figures.costs_table(4096))}
    assert list(rows) == list(rates.OPS) and rows["axpy"]["intensity (FLOP/byte)"] == "0.17"
    assert rows["gemm"]["intensity (FLOP/byte)"] == "682.67"  # 2 n^3 / (3 n^2 x 4 bytes)


def test_ceilings_table_and_roofline_figure_cover_every_gpu():
    runs = [recording("blas_ceilings", H100, ceilings_rows(3000.0)), recording("blas_ceilings", H200, ceilings_rows())]
    rows = cells(figures.ceilings_table(runs))
    assert [(r["GPU"], r["number format"]) for r in rows] == [("H100 80GB HBM3", "float32"),
                                                              ("H100 80GB HBM3", "float16"), ("H200", "float32"),
                                                              ("H200", "float16")]
    assert rows[2]["ridge point (FLOP/byte)"] == "50.0" and rows[0]["copy (GB/s)"] == "3,000"
    fig = figures.roofline_figure(runs)
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["H100 80GB HBM3", "H200"]


def test_levels_figure_has_one_menu_of_gpus_and_formats():
    ceilings = [recording("blas_ceilings", name, ceilings_rows()) for name in (H100, H200)]
    levels = [recording("blas_levels", name, level_rows()) for name in (H100, H200)]
    fig = figures.levels_figure(ceilings, levels)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["H100 80GB HBM3: float32", "H100 80GB HBM3: float16", "H200: float32",
                                          "H200: float16"]
    per_gpu = len(fig.data) // 2
    for i, button in enumerate(buttons):
        visible = button.args[0]["visible"]
        assert not any(visible[:per_gpu]) if i >= 2 else not any(visible[per_gpu:])
        assert sum(visible) == 3  # the roof and the two operations of one format
    assert [t.visible for t in fig.data] == list(buttons[0].args[0]["visible"])
    assert buttons[3].args[1]["title.text"].startswith("BLAS levels on NVIDIA H200")
    one = figures.levels_figure(ceilings[:1], levels)  # a GPU without ceilings is left out
    assert [b.label for b in one.layout.updatemenus[0].buttons] == ["float32", "float16"]


def test_best_float32_table_picks_each_operations_best_size():
    rows = cells(figures.best_float32_table([recording("blas_levels", H200, level_rows())]))
    assert [(r["operation"], r["at n"]) for r in rows] == [("axpy", "4,194,304"), ("gemm", "4,096")]


def test_blocking_figure_and_table_hold_each_block_to_its_gpus_bound():
    blocks = [{"block": b, "intensity": b / 4, "gflops": 100.0 * b, "dtype": "float32", "status": "ok"}
              for b in (8, 256)]
    runs = [recording("blas_blocking", H200, blocks, n=1024, dtype="float32")]
    ceilings = [recording("blas_ceilings", H200, ceilings_rows(1000.0))]
    measured, bound = figures.blocking_figure(runs, ceilings).data
    assert list(bound.y) == [2000.0, 50_000.0]  # min(P, B q): 1000 GB/s x 2 FLOP/byte, then the float32 roof
    rows = cells(figures.blocking_table(runs, ceilings))
    assert [r["of the bound"] for r in rows] == ["40%", "51%"]
    assert [r["the bound is"] for r in rows] == ["memory-bound", "compute-bound"]
    assert figures.blocking_table(runs, [recording("blas_ceilings", H100, ceilings_rows())]).cells == []


def test_the_explorer_answers_from_the_recordings_and_measures_here_on_request(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses
    ceilings = [recording("blas_ceilings", H200, ceilings_rows())]
    levels = [recording("blas_levels", H200, level_rows())]
    here = Recording("blas_ceilings", "x", {}, ceilings_rows(10.0, {"float32": 100.0}), {
        "device": {"name": "a CPU", "kind": "cpu"}, "date": "2026-01-02"})
    explorer = roofline_explorer(ceilings, levels, here=here)
    (op, size, dtype), (button,) = explorer.children[0].children, explorer.children[1].children
    output = explorer.children[-1]
    assert (op.value, size.value, dtype.value) == ("gemm", 4096, "float32")
    assert list(dtype.options) == ["float32", "float16"]  # the formats with a measured peak
    text, plotted = shown(output)
    assert text.startswith("gemm (level 3) at n = 4,096 in float32: 137,438,953,472 FLOP")
    [row] = [line for line in text.splitlines() if line.startswith("H200")]
    assert "40,000.0" in row and "compute-bound" in row  # the recorded rate, and the bound it is under
    assert len(plotted) == 1 and "gemm n=4096 float32" in json.dumps(plotted[0])
    op.value = "axpy"
    assert list(size.options) == [2**20, 2**22] and size.value == 2**20  # the size nearest the last
    assert "memory-bound" in shown(output)[0]
    size.value = 2**20
    button.click()  # a real measurement of axpy on this machine, held against here's ceilings
    text, plotted = shown(output)
    assert "this CPU, measured" in text or "build machine (CPU), measured" in text
    assert [b["label"] for b in plotted[0]["layout"]["updatemenus"][0]["buttons"]][0] == "H200"
    monkeypatch.setattr(rates, "measure_blas", lambda *a: (_ for _ in ()).throw(ValueError("n: needs 9 GiB")))
    button.click()
    text, plotted = shown(output)
    assert "Not measured: n: needs 9 GiB" in text and len(plotted) == 1  # the earlier point stays
    assert output.msg_id == ""  # results are set as state, never captured (see gpulab.core.widgets)


@pytest.mark.parametrize("op", ["gemv", "dot"])
def test_the_explorer_offers_default_sizes_without_recordings(op):
    explorer = roofline_explorer([], [], sizes=(64, 128))
    chosen_op, size, dtype = explorer.children[0].children
    chosen_op.value = op
    assert list(size.options) == [64, 128] and list(dtype.options) == ["float32"]
    assert shown(explorer.children[-1])[0].startswith(f"{op} (level ")
