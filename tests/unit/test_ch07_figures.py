"""Chapter 07's tables, figures and explorer: drawn from given rows and from the recordings, the explorer without a
GPU from the recordings and the occupancy arithmetic."""

from __future__ import annotations

import plotly.io as pio
import pytest

from conftest import needs_gpu, shown
from gpulab.ch07_cuda_threads_blocks import figures, threads
from gpulab.ch07_cuda_threads_blocks.explorer import configuration_row, launch_configuration_explorer
from gpulab.core import kernel_mode, occupancy, plots, recordings
from gpulab.core.recordings import Recording


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses


DEVICE = {"name": "NVIDIA H200", "kind": "cuda", "compute_capability": "9.0", "multiprocessors": 132}


def run(experiment: str, rows: list[dict], device: dict = DEVICE, **params) -> Recording:
    return Recording(experiment, "f", params, rows, {"device": device, "recorded": True, "date": "2026-11-24"})


def launch_rows() -> list[dict]:
    rows = []
    for size in (32, 256):
        for per in (1, 8):
            fit = occupancy.theoretical(size, 30, 0, occupancy.limits("9.0"))
            rows.append({"threads_per_block": size, "elements_per_thread": per, "blocks": 2**20 // (size * per),
                         "gbytes_per_s": 1000.0 * per if size == 256 else 500.0, "registers": 30,
                         "blocks_per_sm": fit.blocks_per_sm, "occupancy": fit.fraction, "limited_by": fit.limited_by,
                         "driver_blocks_per_sm": fit.blocks_per_sm, "waves": 1.0})
    return rows


def test_the_first_launches_become_tables():
    books = {(2, 2): [{"block": 1, "thread": 0}, {"block": 1, "thread": 1}, {"block": 0, "thread": 0},
                      {"block": 0, "thread": 1}]}
    assert figures.guest_book_table(books).cells == [["<<<2, 2>>>", "b1t0 b1t1 b0t0 b0t1"]]
    added = threads.vector_add(100, 32)
    assert figures.launch_table([added]).cells == [["100", "32", "4", "128", "28"]]
    table = figures.occupancy_table(30, [32, 256], "9.0", arch="sm_90")
    assert table.cells == [["32", "32", "1,024", "50%", "blocks"], ["256", "8", "2,048", "100%", "threads"]]
    assert table.caption.startswith("30 registers per thread (NVRTC for sm_90)")


def test_divergence_figure_and_sentence_per_gpu():
    rows = [{"group": g, "paths_per_warp": 2 if g < 32 else 1, "seconds": 4e-4 if g < 32 else 2e-4, "spread": 0.0,
             "relative_time": 2.0 if g < 32 else 1.0} for g in (1, 16, 32, 64)]
    runs = [run("threads_divergence", rows), run("threads_divergence", rows, {**DEVICE, "name": "NVIDIA H100"})]
    figure = figures.divergence_figure(runs)
    assert [b.label for b in figure.layout.updatemenus[0].buttons] == ["H200", "H100"]
    assert figure.layout.xaxis.title.text and figure.layout.yaxis.title.text
    first, _ = figures.divergence_sentences(runs)
    assert "400.0 to 400.0 µs while warps hold both paths, 200.0 to 200.0 µs" in first and "2.00 times" in first


def test_launch_figure_and_sentences():
    runs = [run("threads_launch_configuration", launch_rows(), n=2**20)]
    figure = figures.launch_figure(runs)
    assert list(figure.data[0].x) == ["32", "256"] and list(figure.data[0].y) == ["1", "8"]
    (sentence,) = figures.launch_sentences(runs)
    assert "best 8,000 GB/s with 256 threads x 8 elements" in sentence
    assert "the course's 256 x 1 reaches 1,000 GB/s; 32 x 1 only 500 GB/s" in sentence
    assert sentence.endswith("on every configuration.")
    wrong = [{**r, "driver_blocks_per_sm": 1} for r in launch_rows()]
    assert figures.launch_sentences([run("x", wrong, n=2**20)])[0].endswith("on some configuration.")


def test_saxpy_table_figure_and_target():
    rows = [{"kernel": "04_saxpy", "how": "one element", "blocks": 4, "gbytes_per_s": 80.0, "fraction_of_copy": 0.8},
            {"kernel": "copy", "how": "a copy", "blocks": None, "gbytes_per_s": 100.0, "fraction_of_copy": 1.0}]
    runs = [run("threads_saxpy_vs_copy", rows, n=2**28)]
    table = figures.saxpy_table(runs)
    assert table.headers == ["kernel", "H200: of the copy", "how"]
    assert table.cells[0] == ["04_saxpy", "80.0%", "one element"]
    assert figures.saxpy_target(runs) == ["NVIDIA H200, recorded 2026-11-24: the best kernel, 04_saxpy, moves 80.0% "
                                          "of the copy's bandwidth and misses the target of 90%."]
    assert list(figures.saxpy_figure(runs).data[0].x) == ["04_saxpy", "copy"]


def test_a_configuration_row_follows_the_occupancy_arithmetic():
    row = configuration_row("H200", DEVICE, 30, 2**20, 32, 1, launch_rows())
    assert (row["blocks_per_sm"], row["occupancy"], row["limited_by"]) == (32, 0.5, "blocks")
    assert row["blocks"] == 2**15 and row["waves"] == pytest.approx(2**15 / (32 * 132))
    assert row["gbytes_per_s"] == 500.0 and row["of_best"] == pytest.approx(500 / 8000)
    unmeasured = configuration_row("H200", DEVICE, 128, 2**20, 96, 2, launch_rows())
    assert unmeasured["gbytes_per_s"] is None and unmeasured["limited_by"] == "registers"


def test_the_explorer_answers_from_the_recordings_without_a_gpu(monkeypatch):
    monkeypatch.setattr(kernel_mode, "on_gpu", lambda: False)
    recorded = recordings.newest_per_gpu("threads_launch_configuration")
    explorer = launch_configuration_explorer(2**20)
    size, per = explorer.children[0].children  # no Measure button without a GPU
    text, _ = shown(explorer.children[-1])
    assert "256 threads per block (8 warps), 1 elements per thread" in text and "no GPU here to measure" in text
    for run in recorded:
        at = next(r for r in run.rows if r["threads_per_block"] == 256 and r["elements_per_thread"] == 1)
        assert f"{at['gbytes_per_s']:,.0f}" in text and run.short_label in text
    size.value, per.value = 96, 16
    text, _ = shown(explorer.children[-1])
    assert "96 threads per block (3 warps)" in text
    if recorded:
        assert "A dash under 'measured'" in text and "32, 64, 128, 256, 512, 1024 threads per block" in text


def test_the_explorer_without_a_recording_counts_on_a_hopper_sm(monkeypatch):
    monkeypatch.setattr(kernel_mode, "on_gpu", lambda: False)
    monkeypatch.setattr(recordings, "newest_per_gpu", lambda experiment: [])
    text, _ = shown(launch_configuration_explorer(2**20, threads_per_block=1024).children[-1])
    assert "a Hopper SM, compiled for sm_90" in text and "100%" in text


@needs_gpu
def test_the_explorer_measures_on_a_gpu():
    explorer = launch_configuration_explorer(2**22)
    size, per, button = explorer.children[0].children
    button.click()
    text, _ = shown(explorer.children[-1])
    assert "(live)" in text and "Not measured" not in text
