"""Chapter 10's page: its tables and figures from given rows and runs, and the format explorer."""

from __future__ import annotations

import plotly.io as pio
import pytest

from conftest import shown
from gpulab.ch10_tensor_cores import figures, tensor_cores
from gpulab.ch10_tensor_cores.explorer import matmul_format_explorer
from gpulab.core import kernel_mode, plots, recordings
from gpulab.core.recordings import Recording


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses


def run(name: str, rows: list[dict], params: dict | None = None) -> Recording:
    provenance = {"device": {"name": name, "kind": "cuda"}, "date": "2026-11-25T10:00:00+00:00", "recorded": True}
    return Recording("demo", "gpulab.x:y", params or {}, rows, provenance)


def cells(t) -> list[list[str]]:
    return [dict(zip(t.headers, row, strict=True)) for row in t.cells]


def test_the_instruction_and_peak_tables_count_from_the_constants():
    rows = cells(figures.instructions_table())
    assert [r["architecture"] for r in rows] == ["Volta", "Ampere", "Hopper"]
    assert rows[2]["tile m x n x k"] == "64 x 256 x 16" and rows[2]["FMA per instruction"] == "262,144"
    peaks = tensor_cores.peak_rows()
    table = cells(figures.peaks_table(peaks))
    assert table[0]["ratio"] == f"{peaks[0]['ratio']:.1f}x" and table[0]["tile per clock"] == "4x4x4"
    assert "Hopper" not in str(figures.peaks_table(peaks)) and table[2]["tile per clock"] == "–"
    figure = figures.peaks_figure(peaks)
    assert len(figure.data) == 2 and figure.layout.yaxis.type == "log" and figure.layout.yaxis.title.text


def test_the_accumulators_one_tile_and_one_long_sum():
    rows = figures.accumulation_rows(seed=0, terms=4096)
    tile32, tile16, long32, long16 = rows
    assert tile32["error"] < 1e-6 < tile16["error"] < 1e-2
    assert long32["result"] == pytest.approx(long32["exact"], abs=0.05) and long32["error"] < 1e-5
    assert long16["result"] != long16["exact"] and long16["error"] > 1e-4  # the float16 sum drifts
    table = cells(figures.accumulation_table(rows))
    assert table[0]["result"] == "–" and table[2]["exact"] == f"{4096 * (1 + 2**-10):,.1f}"


FORMATS = [{"n": 64, "format": "float32", "unit": "CUDA cores", "tflops": 50.0, "relative_error": 1e-6,
            "fraction_of_peak": 0.75, "status": "ok"},
           {"n": 64, "format": "float16", "unit": "tensor cores", "tflops": 650.0, "relative_error": 3e-4,
            "fraction_of_peak": None, "status": "ok"},
           {"n": 64, "format": "tf32", "unit": "tensor cores", "status": "not available: a tensor-core mode"}]


def test_formats_each_gpu_behind_a_menu_and_stacked_in_a_table():
    runs = [run("NVIDIA H100 80GB HBM3", FORMATS, {"n": 64}), run("NVIDIA H200", FORMATS[:2], {"n": 64})]
    figure = figures.formats_by_gpu(runs)
    assert [b.label for b in figure.layout.updatemenus[0].buttons] == ["H100 80GB HBM3", "H200"]
    assert len(figure.data) == 4 and "H100" in figure.layout.title.text
    table = cells(figures.formats_table(runs))
    assert [r["GPU"] for r in table] == ["H100 80GB HBM3"] * 3 + ["H200"] * 2
    assert table[0]["rate (TFLOP/s)"] == "50" and table[0]["of peak"] == "75%" and table[1]["of peak"] == "–"
    assert table[2]["note"] == "not available: a tensor-core mode" and table[2]["rate (TFLOP/s)"] == "–"
    assert "note" not in figures.formats_table(runs[1:]).headers


WMMA = [{"name": "WMMA", "file": "26_wmma_pipelined", "unit": "tensor cores", "tflops": 300.0,
         "fraction_of_cublas_fp16": 0.45, "relative_error": 5e-6},
        {"name": "cuBLAS float16", "file": "cuBLAS", "unit": "tensor cores", "tflops": 660.0,
         "fraction_of_cublas_fp16": 1.0, "relative_error": 2e-4, "kernels": "Memset (Device), nvjet_sm90"},
        {"name": "SGEMM", "file": "24_sgemm_prefetched", "unit": "CUDA cores", "tflops": 46.0,
         "fraction_of_cublas_fp16": 0.07, "relative_error": 1e-6}]


def test_the_wmma_kernels_figure_table_and_verdict():
    figure = figures.wmma_figure([*WMMA, {"name": "WMMA, pipelined", "unit": "tensor cores", "file": "26",
                                          "status": "not available: cp.async needs Ampere"}], title="t")
    assert [list(trace.y) for trace in figure.data] == [["WMMA", "cuBLAS float16"], ["SGEMM"]]
    assert figure.layout.yaxis.title.text == "kernel"
    runs = [run("NVIDIA H200", WMMA, {"n": 4096})]
    assert figures.wmma_by_gpu(runs).layout.title.text.startswith("GEMM 4,096^3")
    table = cells(figures.wmma_table(runs))
    assert table[0]["of cuBLAS float16"] == "45.0%" and table[0]["of peak"] == "–"
    (said,) = figures.wmma_verdict(runs, 0.5)
    assert "`nvjet_sm90`" in said and "misses the 50% target" in said and "6.5x the best SGEMM" in said
    assert "meets the 40% target" in figures.wmma_verdict(runs, 0.4)[0]


def test_the_compilers_report_of_every_variant():
    table = cells(figures.wmma_resources_table([{}, {"STAGES": 4}]))
    assert [r["kernel"] for r in table] == ["WMMA, fragments from global memory", "WMMA, pipelined",
                                            "WMMA, pipelined (STAGES=4)"]
    assert table[1]["block tile"] == "128 x 128" and int(table[1]["registers"]) <= 255
    assert figures.wmma_resources_table([]).caption.startswith("compiled for sm_")


def test_the_tf32_table_names_the_kernels():
    rows = [{"setting": "allow_tf32 = True", "allow_tf32": True, "matmul_precision": "high", "tflops": 360.0,
             "relative_error": 3e-4, "kernels": ["Memset (Device)", "sm90_xmma_gemm_tf32"]}]
    (row,) = cells(figures.tf32_table([run("NVIDIA H200", rows)]))
    assert row["allow_tf32"] == "True" and row["kernels that ran"] == "Memset (Device), sm90_xmma_gemm_tf32"


def alignment_rows(dtype: str) -> list[dict]:
    rates = {62: 0.2, 63: 0.1, 64: 1.0, 65: 0.15, 72: 0.9}
    return [{"vary": vary, "size": size, "dtype": dtype, "relative": rate if vary != "batch" else 1.0,
             "multiple_of_8": size % 8 == 0, "status": "ok"} for vary in ("batch", "inputs", "outputs")
            for size, rate in rates.items()]


def test_alignment_tables_mark_the_row_lengths_that_break_16_bytes():
    runs = [run("NVIDIA H200", alignment_rows("float16") + alignment_rows("tf32"), {"base": 64})]
    table = cells(figures.alignment_table(runs))
    by = {(r["dtype"], r["new size"]): r for r in table}
    assert by["float16", "64"]["rows of this length are a multiple of 16 B"] == "yes"
    assert by["float16", "62"]["rows of this length are a multiple of 16 B"] == "no"
    assert by["tf32", "72"]["rows of this length are a multiple of 16 B"] == "yes"
    assert by["float16", "63"]["inputs changed"] == "0.10" and by["float16", "63"]["batch changed"] == "1.00"
    summary = cells(figures.alignment_summary(runs))
    first = summary[0]
    assert (first["dtype"], first["dimension changed"]) == ("float16", "inputs")
    assert first["rows a multiple of 16 B: mean"] == "0.95" and first["the other sizes: mean"] == "0.15"
    assert first["the other sizes: lowest"] == "0.10"
    figure = figures.alignment_by_gpu(runs)
    assert figure.layout.xaxis.title.text == "the dimension changed, and its new size"


def layer_rows(outputs: list[int]) -> list[dict]:
    rows = []
    for o, rate in zip(outputs, (250.0, 650.0), strict=True):
        gemms = [{"batch": 16, "inputs": 32, "outputs": o, "dtype": "float16", "gemm": g, "seconds": 1e-3,
                  "tflops": rate, "status": "ok", "M": o, "N": 16, "K": 32}
                 for g in ("forward propagation", "activation gradient", "weight gradient")]
        rows += [*gemms, {"batch": 16, "inputs": 32, "outputs": o, "dtype": "float16", "gemm": "step",
                          "seconds": 3e-3, "tflops": rate, "status": "ok"}]
    return rows


def test_the_layers_gemms_per_size_against_the_padded_one():
    runs = [run("NVIDIA H200", layer_rows([1001, 1008]))]
    table = cells(figures.layer_table(runs, "outputs"))
    assert [r["outputs"] for r in table] == ["1,001", "1,008"]
    assert table[0]["step rate / that at 1,008"] == "0.38" and table[1]["step rate / that at 1,008"] == "1.00"
    assert table[0]["forward propagation (TFLOP/s)"] == "250" and table[0]["step (ms)"] == "3.000"
    figure = figures.layer_by_gpu(runs, "outputs")
    assert len(figure.data) == 4 and list(figure.data[0].x) == ["1,001", "1,008 (x8)"]
    assert "vocabulary" in figure.layout.title.text and figure.layout.xaxis.title.text
    batch = cells(figures.layer_table([run("NVIDIA H200", layer_rows([32, 31]))], "batch"))
    assert batch[0]["batch"] == "16" and batch[0]["step rate / that at 32"] == "–"  # no batch of 32 measured


def test_the_format_explorer_shows_the_recordings_then_measures_here():
    recorded = recordings.newest_per_gpu("tensor_formats")
    explorer = matmul_format_explorer([32, 64], ["float16", "float32", "tf32"])
    format_menu, size, button = explorer.children[0].children
    text, _ = shown(explorer.children[-1])
    for recording in recorded:
        row = next(r for r in recording.rows if r["format"] == "float16")
        assert f"{recording.short_label}, recorded" in text and f"{row['relative_error']:.2e}" in text
    format_menu.value = "float32"
    size.value = 64
    button.click()
    text, _ = shown(explorer.children[-1])
    assert "this device" in text and "float32" in text
    format_menu.value = "tf32"
    button.click()
    text, _ = shown(explorer.children[-1])
    if not kernel_mode.on_gpu():
        assert "Not measured: fmt: tf32 is a tensor-core mode" in text
    measured = [line for line in text.splitlines() if line.startswith("this device")]
    assert len(measured) == 1 + kernel_mode.on_gpu()
    format_menu.value = "float16"  # moving a control drops the refusal
    assert "Not measured" not in shown(explorer.children[-1])[0]
