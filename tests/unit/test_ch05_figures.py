"""Chapter 05's tables, figures and explorer: built from given rows and recordings, they say what the rows hold."""

from __future__ import annotations

import plotly.io as pio
import pytest
import torch

from conftest import shown
from gpulab.ch05_convolutions_as_gemms import conv, figures
from gpulab.ch05_convolutions_as_gemms.explorer import conv_layer_explorer, recorded_layers
from gpulab.core import plots, recordings
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses


def run(experiment: str, rows: list[dict], device: str = "NVIDIA H200", **params) -> Recording:
    return Recording(experiment, "f", params, rows, {"device": {"name": device, "kind": "cuda"}, "recorded": True,
                                                    "date": "2026-11-24"})


LAYER = conv.ConvLayer(32, 64, 56, 56, 64, 3, 3, stride=1, padding=1, name="res2 3x3")


def layer_rows(device_scale: float = 1.0) -> list[dict]:
    seconds = {"GEMM alone": 1e-3, "im2col + GEMM": 2e-3, "conv2d NCHW": 4e-3, "conv2d NHWC": 0.5e-3}
    return [{**LAYER.as_dict(), "layer": LAYER.name, "method": m, "dtype": "float32", "seconds": s * device_scale,
             "tflops": LAYER.flops / (s * device_scale) / 1e12, "status": "ok"} for m, s in seconds.items()]


def test_rates_table_gives_each_method_as_a_share_of_the_gemm_alone():
    runs = [run("conv_layers", layer_rows()), run("conv_layers", layer_rows(2.0), "NVIDIA H100 80GB HBM3")]
    text = str(figures.rates_table(runs))
    lines = text.splitlines()
    assert "GEMM alone (TFLOP/s)" in lines[0]
    h200, h100 = lines[2], lines[3]
    assert h200.startswith("H200") and h100.startswith("H100 80GB HBM3")
    assert "50%" in h200 and "25%" in h200 and "200%" in h200  # im2col + GEMM, NCHW, NHWC against 1 ms
    assert f"{LAYER.flops / 1e-3 / 1e12:,.2f}" in h200 and f"{LAYER.flops / 2e-3 / 1e12:,.2f}" in h100


def test_rates_table_skips_a_layer_missing_a_method():
    rows = [r for r in layer_rows() if r["method"] != "conv2d NHWC"]
    assert len(figures.rates_table([run("conv_layers", rows)]).cells) == 0


def test_memory_table_and_sentence_name_the_bytes_of_each_gpu():
    row = {**LAYER.as_dict(), "layer": LAYER.name, "status": "ok", "input_bytes": 2**20, "im2col_bytes": 9 * 2**20,
           "blowup": 9.0, "predicted_blowup": 9.0, "tile_bytes": 2**24, "im2col_peak_extra_bytes": 10 * 2**20,
           "implicit_peak_extra_bytes": 2**25, "torch_peak_extra_bytes": 0}
    runs = [run("conv_memory", [row, {"layer": "too big", "status": "out of memory"}])]
    table = figures.memory_table(runs)
    assert len(table.cells) == 1
    assert table.cells[0][:4] == ["H200", "res2 3x3", "1.0 MiB", "9.0 MiB"] and "0 B" in table.cells[0]
    (sentence,) = figures.largest_im2col(runs)
    assert sentence.endswith("res2 3x3, 9.0 MiB for an input of 1.0 MiB.")
    figure = figures.memory_figure(runs)
    assert [t.name for t in figure.data][:3] == ["input", "im2col matrix", "implicit GEMM tile"]
    assert figure.layout.yaxis.title.text and figure.layout.xaxis.title.text


def test_methods_by_gpu_draws_one_dtype_with_a_menu_per_gpu():
    half = [{**r, "dtype": "float16"} for r in layer_rows()]
    runs = [run("conv_layers", layer_rows() + half), run("conv_layers", layer_rows(), "NVIDIA H100 80GB HBM3")]
    assert figures.dtypes_of(runs) == ["float32", "float16"]
    both = figures.methods_by_gpu(runs, "float32")
    assert [b.label for b in both.layout.updatemenus[0].buttons] == ["H200", "H100 80GB HBM3"]
    only = figures.methods_by_gpu(runs, "float16")  # the H100 did not measure float16: no menu
    assert not only.layout.updatemenus and "float16" in only.layout.title.text


def test_course_tables_show_the_slides_layout():
    output = torch.zeros(1, 2, 3, 3)
    table = figures.course_convolution_table(torch.zeros(1, 7, 7, 3), torch.zeros(3, 3, 3, 2), output)
    assert table.cells[2][1:3] == ["(1, 3, 3, 2) (N P Q K)", "(1, 2, 3, 3) (N K P Q)"]
    steps = figures.course_steps_table([("qd", torch.tensor([[9.0, 7.0]]))])
    assert steps.cells == [["qd", "(1, 2)", "[9, 7]"]]
    softmax = figures.softmax_table(torch.tensor(conv.COURSE_SOFTMAX, dtype=torch.float64))
    assert softmax.caption == "largest relative difference 0.0e+00: float64's rounding (epsilon 2.2e-16)"
    assert figures.output_size_table(7, 3, 3, max_padding=0).cells == [
        ["0", "2", "floor((7 + 2 x 0 - 3) / 2) + 1", "3", "yes"]]
    parameters = figures.parameter_table(conv.course_network())
    assert parameters.cells[-1] == ["total", "–", str(conv.COURSE_PARAMETERS)]


def test_every_padding_and_stride_that_turns_seven_pixels_into_three_is_found_by_the_formula():
    choices = figures.output_size_choices(7, 3, 3)
    assert choices == [(0, 2), (1, 3), (2, 3), (2, 4), (3, 4), (3, 5)]
    assert all(conv.output_size(7, 3, stride, padding) == 3 for padding, stride in choices)
    assert [(p, u) for p, u in choices if not figures.windows_touch_the_image(7, 3, u, p)] == [(3, 4), (3, 5)]
    said = figures.output_size_choices_said(7, 3, 3)
    assert said.startswith("6 choices") and "(3, 5)" in said and said.endswith("only stride 2 does.")
    assert (0, conv.COURSE_STRIDE) in choices
    table = figures.output_size_table(7, 3, 3)
    assert [row[:2] for row in table.cells] == [[str(p), str(u)] for p, u in choices]


def test_checks_and_layouts_tables():
    rows = conv.check_implementations([conv.ConvLayer(1, 2, 5, 5, 2, 3, 3, name="small")], "float32",
                                      torch.device("cpu"))
    table = figures.checks_table(rows)
    assert table.headers == ["dtype", "case", *conv.IMPLEMENTATIONS] and table.cells[0][:2] == ["float32", "small"]
    layouts = figures.layouts_table((1, 64, 5, 4))
    assert layouts.cells[0][0] == "NCHW" and layouts.cells[1][2:] == ["1", "64", "1,279"]
    gemm = figures.gemm_table([LAYER])
    assert gemm.cells[0][4:7] == [f"{LAYER.gemm_m:,}", "64", "576"]


def test_the_explorer_answers_for_a_recorded_layer_and_for_any_other():
    known = recorded_layers()
    explorer = conv_layer_explorer()  # res2 3x3 at batch 32: recorded on the H200
    text, figures_shown = shown(explorer.children[-1])
    layer = conv.ConvLayer(32, 64, 56, 56, 64, 3, 3, stride=1, padding=1)
    assert f"M = NPQ = {layer.gemm_m:,}, N = K = 64, K = CRS = 576" in text
    assert f"{format_bytes(layer.im2col_elements * 4)} in float32" in text and "9.00 times the input" in text
    recorded = recordings.load("conv_layers")
    if recorded is not None and "res2 3x3" in known:
        measured = next(r for r in recorded.rows if r["layer"] == "res2 3x3" and r["method"] == "GEMM alone"
                        and r["dtype"] == "float32")
        assert "Recorded on a GPU at these sizes" in text and f"{measured['seconds'] * 1e3:,.3f}" in text
    (preset, dtype), (n, c, h, w), (k, r, s), (stride, padding) = (row.children for row in explorer.children[:-1])
    stride.value = 2
    text, _ = shown(explorer.children[-1])
    assert "P x Q = 28 x 28" in text and "No GPU recording has this layer" in text
    r.value, padding.value = 60, 0  # a 60 x 3 filter on a 56 x 56 image: not a layer
    text, _ = shown(explorer.children[-1])
    assert text.startswith("Not a layer: kernel: 60 is larger")
    if "conv1 7x7/2" in known:
        preset.value = "conv1 7x7/2"
        assert (r.value, s.value, stride.value, padding.value, c.value) == (7, 7, 2, 3, 3)
        text, _ = shown(explorer.children[-1])
        assert "P x Q = 112 x 112" in text and "12.25 times the input" in text
        n.value = 1  # no longer the recorded layer
        assert preset.value == "(your own sizes)"
    dtype.value = "float16"
    text, _ = shown(explorer.children[-1])
    assert "in float16" in text and not figures_shown
