"""Chapter 12's page: its tables and sentences from given rows and runs, and its figures per GPU."""

from __future__ import annotations

import plotly.io as pio
import pytest
import torch

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.ch12_cudnn_convolution_algorithms import algorithms, figures, measured, tables
from gpulab.core import plots
from gpulab.core.recordings import Recording


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses


def run(name: str, rows: list[dict], params: dict | None = None) -> Recording:
    provenance = {"device": {"name": name, "kind": "cuda"}, "date": "2026-11-25T10:00:00+00:00", "recorded": True}
    return Recording("demo", "gpulab.x:y", params or {}, rows, provenance)


def cells(t) -> list[dict]:
    return [dict(zip(t.headers, row, strict=True)) for row in t.cells]


def kernel(name: str, family: str, share: float) -> dict:
    return {"name": name, "family": family, "seconds": share * 1e-3, "launches": 1.0, "share": share}


# --- what needs no GPU ----------------------------------------------------------------------------------------------

def test_switches_backends_and_descriptors():
    flags = cells(tables.flags_table())
    assert flags[0]["switch"] == "torch.backends.cudnn.is_available()" and all(r["meaning"] for r in flags)
    assert cells(tables.tf32_switches_table()) == [
        {"inside": "matmul_mode('float32')", "torch.backends.cudnn.allow_tf32": "False",
         "torch.backends.cuda.matmul.allow_tf32": "False"},
        {"inside": "matmul_mode('tf32')", "torch.backends.cudnn.allow_tf32": "True",
         "torch.backends.cuda.matmul.allow_tf32": "True"}]
    backends = cells(tables.backends_table(torch.device("cpu")))
    assert backends[2]["data"] == "float64, NCHW" and backends[2]["backend"] in ("Slow2d", "unknown")
    example, filters = torch.randn(1, 8, 5, 4), torch.randn(8, 8, 3, 3)
    rows = cells(tables.descriptors_table({"gaps": torch.randn(1, 16, 5, 4)[:, ::2]}, filters))
    assert [r["tensor"] for r in rows] == ["torch's x", "x (input)", "w (filters)", "y (output)"]
    assert rows[0]["format"] == "NCHW, with gaps" and rows[1]["strides"] == "[160, 20, 4, 1]"
    assert "`CUDNN_CROSS_CORRELATION`, compute type `CUDNN_DATA_FLOAT`" in tables.convolution_sentence(example,
                                                                                                      filters)


def test_the_talks_table_read_against_the_peak():
    talk = cells(tables.talk_table())
    gemm = next(r for r in talk if r["CUDNN_CONVOLUTION_FWD_ALGO_"] == "GEMM")
    assert gemm["3 x 3 (ms)"] == "0.76" and gemm["11 x 11 workspace (MB)"] == "968"
    assert gemm["11 x 11 / 3 x 3"] == "11.1x"
    assert next(r for r in talk if r["CUDNN_CONVOLUTION_FWD_ALGO_"] == "WINOGRAD")["11 x 11 (ms)"] == "–"
    readings = algorithms.talk_rates([128, 1])
    read = cells(tables.talk_readings_table(readings))
    assert [r["batch N"] for r in read] == ["128", "1"] and read[1]["rows above the peak"] == "1 of 12"
    assert read[1]["GEMM 3 x 3: im2col matrix"] == "72.0 MiB (talk: 72 MB)" and read[1]["which"] == "WINOGRAD"
    assert tables.plausible_sentence(readings) == "Batches whose GEMM rows stay below the peak: 1."
    assert tables.peak_sentence().startswith("The GV100's float32 peak: 80 SMs")
    model = cells(tables.workspace_model_table(readings))
    assert model[0]["model / talk"] == "1.00" and model[2]["model / talk"] == "–"  # the talk's 0 MB


def test_the_families_checked_and_counted():
    matrices = cells(tables.winograd_table())
    assert len(matrices) == 10 and matrices[4]["matrix"] == "G (filter transform)" and matrices[4]["column 4"] == "–"
    cases = [conv.ConvLayer(1, 2, 6, 6, 2, 3, 3, name="3x3"), conv.ConvLayer(1, 2, 6, 6, 2, 1, 1, name="1x1")]
    checked = algorithms.check_families(cases, "float64", torch.device("cpu"))
    table = cells(tables.check_table(checked, list(algorithms.FAMILY_IMPLEMENTATIONS)))
    assert [r["case"] for r in table] == ["3x3", "1x1"] and table[1]["Winograd F(2x2, 3x3)"] == "–"
    float32 = algorithms.check_families([cases[0]], "float32", torch.device("cpu"))
    assert "Winograd's error is" in tables.float32_sentence(float32)
    counts = algorithms.multiply_counts([1, 32], 128, 128, [1, 3, 5, 7])
    crossings = cells(tables.crossover_table(counts))
    assert crossings[0] == {"batch N": "1", "Winograd F(2x2)": "3 x 3", "FFT": "5 x 5", "FFT tiled": "3 x 3"}
    per_output = cells(tables.per_output_table(counts, 1))
    assert [r["filter"] for r in per_output] == ["3 x 3"] and per_output[0]["direct or GEMM"] == "1,152"
    assert "FFT_TILING 3.69 ms" in tables.talk_measured_sentence()


# --- the measurements -------------------------------------------------------------------------------------------------

def bench_rows() -> list[dict]:
    rows = []
    for layer, (off, on) in {"a": (2e-3, 1e-3), "b": (1e-3, 1e-3)}.items():
        for flag, seconds in ((False, off), (True, on)):
            rows.append({"layer": layer, "benchmark": flag, "status": "ok", "seconds": seconds,
                         "first_call_seconds": 0.05 if flag else 0.01, "algorithm": "FFT" if flag and layer == "a"
                         else "implicit GEMM", "im2col_bytes": 2**20, "peak_extra_bytes": 2**21 if flag else 0,
                         "backend": "Cudnn", "first_call_extra_bytes": 2**24, "method": "conv2d", "dtype": "float32",
                         "layout": "NCHW",
                         "kernels": [kernel("fft2d_r2c_16x16", "FFT", 1.0)]})
    return rows


def test_benchmark_workspace_and_kernels():
    runs = [run("NVIDIA H200", bench_rows())]
    table = cells(measured.benchmark_table(runs))
    assert table[0]["calls to repay"] == "40" and table[1]["calls to repay"] == "never"
    assert table[0]["on / off"] == "0.50" and table[0]["algorithm: off -> on"] == "implicit GEMM -> FFT"
    assert table[0]["first call, on (ms)"] == "50.000" and table[0]["backend"] == "Cudnn"
    (said,) = measured.benchmark_summary(runs)
    assert said.startswith("In short, NVIDIA H200") and "a (implicit GEMM -> FFT, 0.50x the time)" in said
    space = cells(measured.workspace_table(runs))
    assert space[0]["workspace, on"] == "2.0 MiB" and space[0]["autotuner's first call"] == "16.0 MiB"
    (said,) = measured.workspace_summary(runs)
    assert "a with benchmark on (FFT) needs 2.0x its im2col matrix" in said
    kernels = cells(measured.algorithms_table(runs))
    assert kernels[0]["the 3 longest kernels [family, share of the time]"] == "fft2d_r2c_16x16 [FFT, 100%]"
    cpu = run("NVIDIA H200", [{**r, "peak_extra_bytes": None} for r in bench_rows()])
    assert measured.workspace_table([cpu]).cells == [] and measured.workspace_summary([cpu]) == []
    assert figures.workspace_by_gpu([cpu]).layout.title.text == "No recording yet"
    assert figures.benchmark_by_gpu(runs).layout.title.text.endswith("NVIDIA H200, recorded 2026-11-25")


def settings_rows() -> list[dict]:
    rows = []
    for dtype, scale in (("float32", 1.0), ("float16", 4.0)):
        for layer in ("a", "b"):
            for method, layout, rate in (("conv2d", "NCHW", 10.0), ("conv2d", "NHWC", 15.0),
                                         ("im2col + GEMM", "NCHW", 5.0)):
                rows.append({"dtype": dtype, "layer": layer, "method": method, "layout": layout, "status": "ok",
                             "tflops": rate * scale, "seconds": 1e-3, "algorithm": "implicit GEMM",
                             "kernels": [kernel("nchwToNhwcKernel", "layout transform", 0.25)]})
    return [*rows, {"dtype": "tf32", "status": "not run", "reason": "a tensor-core mode"}]


def test_layouts_and_precisions():
    runs = [run("NVIDIA H200", settings_rows())]
    assert measured.settings_notes(runs) == ["NVIDIA H200, recorded 2026-11-25: tf32 not run: a tensor-core mode."]
    table = cells(measured.settings_table(runs))
    assert table[0]["NHWC / NCHW"] == "1.50x" and table[0]["im2col + GEMM / NCHW"] == "0.50x"
    assert table[0]["NCHW / float32's"] == "–" and table[2]["NCHW / float32's"] == "4.00x"
    assert table[0]["NCHW: time in layout transforms"] == "25%"
    summary = cells(measured.settings_summary(runs))
    assert summary[1]["format"] == "float16" and summary[1]["fastest"] == "a NHWC"
    assert summary[1]["its rate (TFLOP/s)"] == "60"
    assert summary[1]["of the peak"] == "6%"  # 60 of the H200's 989 TFLOP/s in float16
    two = figures.settings_by_gpu([run("NVIDIA H100 80GB HBM3", settings_rows()), *runs])
    labels = [b.label for b in two.layout.updatemenus[0].buttons]
    assert labels == ["H100 80GB HBM3: float32", "H100 80GB HBM3: float16", "H200: float32", "H200: float16"]
    assert two.layout.updatemenus[0].buttons[2].args[1]["title.text"].endswith("NVIDIA H200, recorded 2026-11-25")
    assert sum(trace.visible for trace in two.data) == 3


def channel_rows() -> list[dict]:
    rates = {56: 100.0, 63: 40.0, 64: 200.0, 65: 50.0, 72: 150.0}
    return [{"c": c, "k": c, "n": 1, "h": 8, "w": 8, "r": 3, "s": 3, "stride": 1, "padding": 1, "dtype": "float16",
             "layout": "NHWC", "status": "ok", "tflops": rate, "seconds": c * c / rate, "algorithm": "implicit GEMM",
             "kernels": [kernel("f16f16_gemm", "implicit GEMM", 0.6),
                         kernel("nhwcAddPaddingKernel", "layout transform", 0.4 if c % 8 else 0.0)]}
            for c, rate in rates.items()]


def test_channel_counts():
    runs = [run("NVIDIA H200", channel_rows())]
    table = {r["C = K"]: r for r in cells(measured.channels_table(runs))}
    assert table["65"]["nearest multiple of 8"] == "64" and table["65"]["its rate, times"] == "0.25x"
    assert table["65"]["time padding the channels"] == "40%" and table["64"]["its rate, times"] == "–"
    twin = run("NVIDIA H200", [{**channel_rows()[2], "layer": "res2", "method": "conv2d", "tflops": 210.0}])
    said = measured.channels_summary(runs, [twin])
    assert said[0].startswith("In short, H200, NHWC: multiples of 8 100 to 200 TFLOP/s, the others 40 to 50;")
    assert "C = K = 63 took" in said[0] and "`f16f16_gemm`" in said[0]
    assert said[1] == ("H200: the same convolution in section 4 (res2, float16 NHWC) ran at 210 TFLOP/s against 200 "
                       "here, 5% apart.")


def filter_rows() -> list[dict]:
    rows = []
    for r, times in ((3, {"off": 1e-4, "on": 1e-4, "FFT tiled": 5e-4}), (11, {"off": 3e-3, "on": 2e-3,
                                                                          "FFT tiled": 6e-4})):
        shape = {"n": 1, "c": 128, "h": 128, "w": 128, "k": 128, "r": r, "s": r, "status": "ok", "dtype": "float32",
                 "layout": "NCHW", "peak_extra_bytes": 0, "algorithm": "implicit GEMM"}
        rows += [{**shape, "method": "conv2d", "benchmark": False, "seconds": times["off"], "tflops": 1.0},
                 {**shape, "method": "conv2d", "benchmark": True, "seconds": times["on"], "tflops": 1.0},
                 {**shape, "method": "FFT tiled", "benchmark": None, "seconds": times["FFT tiled"], "tflops": 100.0,
                  "algorithm": None}]
    return rows


def test_filter_sizes():
    runs = [run("NVIDIA H200", filter_rows())]
    table = cells(measured.filter_table(runs))
    assert table[0]["method"] == "float32 NCHW, benchmark off" and table[2]["method"] == "gpulab FFT tiled"
    assert measured.filter_table(runs).caption.startswith("N = 1, C = K = 128")
    said = measured.filter_summary(runs)
    assert said[0].startswith("H200, 3 x 3: fastest float32 NCHW, benchmark off") and "takes 5.0x as long" in said[0]
    assert "is 3.3x faster than torch's conv2d with benchmark on" in said[1]
    assert "the book's FFT tiled 1.2x (the talk's GV100: IMPLICIT_PRECOMP_GEMM 14.0x, FFT_TILING 1.4x)" in said[2]
    assert said[3].startswith("The book's FFT tiled rate, 100 TFLOP/s, is an effective rate")
    figure = figures.filter_sizes_by_gpu(runs)
    assert figure.layout.annotations[1].text == "NVIDIA H200, recorded 2026-11-25"


def determinism_rows() -> list[dict]:
    rows = []
    for which in ("forward", "weight gradient"):
        for flag in (False, True):
            varies = which == "weight gradient" and not flag
            rows.append({"layer": "a", "pass": which, "deterministic": flag, "status": "ok", "identical": not varies,
                         "max_difference": 2**-22 if varies else 0.0, "seconds": 2e-3 if flag and varies is False
                         and which == "weight gradient" else 1e-3, "algorithm": "implicit GEMM",
                         "kernels": [kernel("wgrad_alg1" if flag and which == "weight gradient" else "wgrad_alg0",
                                            "implicit GEMM", 1.0)]})
    return rows


def test_determinism():
    runs = [run("NVIDIA H200", determinism_rows())]
    table = cells(measured.deterministic_table(runs))
    assert table[1]["off: repeated runs"] == "differ by 2e-07" and table[1]["on: repeated runs"] == "identical"
    assert table[1]["on / off"] == "2.00"
    said = measured.deterministic_summary(runs)
    assert said[0].startswith("In short, NVIDIA H200, recorded 2026-11-25: with the flag off, 1 of 2 passes differed")
    assert "by at most 2.0 times float32's epsilon" in said[0] and "exactly the passes that differed" in said[0]
    assert said[1] == ("The flag changed the kernels of a weight gradient (2.00x the time): off `wgrad_alg0`; on "
                       "`wgrad_alg1`.")
    figure = figures.deterministic_by_gpu(runs)
    assert [b.label for b in figure.layout.updatemenus[0].buttons] == ["forward", "weight gradient"]
