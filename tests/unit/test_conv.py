"""The convolutions of chapter 05: the implementations against conv2d, the im2col blow-up, the layouts and the
course's example."""

from __future__ import annotations

import json

import plotly.io as pio
import pytest
import torch
import torch.nn.functional as F

from gpulab.ch05_convolutions_as_gemms import conv, figures, sweeps

CASES = [
    conv.ConvLayer(2, 3, 7, 7, 4, 3, 3),
    conv.ConvLayer(1, 5, 9, 6, 3, 3, 2, stride=2, padding=1),  # non-square filter and image
    conv.ConvLayer(2, 4, 8, 8, 6, 1, 1),  # 1 x 1: im2col is the input itself
    conv.ConvLayer(1, 2, 5, 5, 2, 5, 5, padding=2),
    conv.ConvLayer(3, 8, 12, 10, 5, 3, 3, stride=3, padding=2),  # stride larger than the filter's overlap
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.describe())
def test_every_implementation_matches_conv2d(case):
    rows = conv.check_implementations([case], "float32", torch.device("cpu"))
    assert {r["method"] for r in rows} == set(conv.IMPLEMENTATIONS)
    assert all(r["relative_error"] < 1e-5 for r in rows)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.describe())
def test_im2col_is_unfold_rearranged(case):
    x = torch.randn(case.n, case.c, case.h, case.w)
    columns = conv.im2col(x, case.r, case.s, case.stride, case.padding)
    unfolded = F.unfold(x, (case.r, case.s), stride=case.stride, padding=case.padding)
    assert columns.shape == (case.gemm_k, case.gemm_m)
    assert torch.equal(columns, unfolded.transpose(0, 1).reshape(case.gemm_k, case.gemm_m))


def test_implicit_gemm_with_tiles_that_do_not_divide_the_rows():
    case = CASES[1]
    x, weight = torch.randn(case.n, case.c, case.h, case.w), torch.randn(case.k, case.c, case.r, case.s)
    reference = F.conv2d(x, weight, stride=case.stride, padding=case.padding)
    for rows in (1, 7, case.gemm_m, 10 * case.gemm_m):
        actual = conv.conv2d_implicit_gemm(x, weight, case.stride, case.padding, tile_rows=rows)
        torch.testing.assert_close(actual, reference, rtol=1e-5, atol=1e-5)


def test_a_wrong_implementation_is_caught(monkeypatch):
    monkeypatch.setitem(conv.IMPLEMENTATIONS, "im2col + GEMM",
                        lambda x, w, stride, padding: conv.conv2d_im2col(x, w, stride, padding) * 1.01)
    with pytest.raises(AssertionError, match="im2col \\+ GEMM.*relative error"):
        conv.check_implementations([CASES[0]], "float32", torch.device("cpu"))


def test_shapes_and_gemm_dimensions():
    layer = conv.ConvLayer(32, 64, 56, 56, 128, 3, 3, stride=1, padding=1, name="res2")
    assert (layer.p, layer.q) == (56, 56)
    assert (layer.gemm_m, layer.gemm_n, layer.gemm_k) == (32 * 56 * 56, 128, 64 * 9)
    assert layer.flops == 2 * layer.gemm_m * layer.gemm_n * layer.gemm_k
    assert layer.blowup == 9  # stride 1, 'same' padding: exactly R x S
    strided = conv.ConvLayer(1, 3, 224, 224, 64, 7, 7, stride=2, padding=3)
    assert (strided.p, strided.blowup) == (112, 49 / 4)
    assert conv.output_size(7, 3, 2) == 3 and conv.output_size(5, 3, 1, 1) == 5 and conv.output_size(6, 3, 2) == 2
    fields = {k: v for k, v in layer.as_dict().items() if k in conv.ConvLayer.__dataclass_fields__}
    assert conv.layer(fields) == layer


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="^kernel:"):
        conv.output_size(2, 5)
    with pytest.raises(ValueError, match="^padding:"):
        conv.output_size(8, 3, 1, -1)
    with pytest.raises(ValueError, match="^stride:"):
        conv.ConvLayer(1, 1, 8, 8, 1, 3, 3, stride=0)
    with pytest.raises(ValueError, match="^weight: has 4 channels"):
        conv.conv2d_im2col(torch.randn(1, 3, 8, 8), torch.randn(2, 4, 3, 3))
    with pytest.raises(ValueError, match="^x: expected N x C x H x W"):
        conv.conv2d_direct(torch.randn(3, 8, 8), torch.randn(2, 3, 3, 3))
    with pytest.raises(ValueError, match="^x: .* too many for the scalar loop nest"):
        conv.conv2d_loops(torch.randn(8, 64, 32, 32), torch.randn(64, 64, 3, 3))
    with pytest.raises(ValueError, match="^layer: unknown field"):
        conv.layer({"n": 1, "channels": 3})
    with pytest.raises(ValueError, match="^methods:"):
        sweeps.measure_layer(CASES[0], methods=["winograd"])
    with pytest.raises(ValueError, match="^dtype: tf32"):
        sweeps.measure_layer(CASES[0], "tf32", device=torch.device("cpu"))
    with pytest.raises(ValueError, match="^layer: needs"):
        sweeps.measure_layer(conv.ConvLayer(4096, 512, 512, 512, 512, 3, 3, padding=1))


def test_memory_sweep_measures_the_blowup():
    layers = [conv.ConvLayer(1, 16, 20, 20, 8, 3, 3, padding=1, name="same 3x3"),
              conv.ConvLayer(1, 3, 32, 32, 8, 7, 7, stride=2, padding=3, name="7x7 stride 2")]
    rows = sweeps.memory_sweep(layers, "float32", tile_bytes=4096)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert rows[0]["blowup"] == rows[0]["predicted_blowup"] == 9
    assert rows[1]["blowup"] == pytest.approx(49 / 4)
    assert all(r["tile_bytes"] <= 4096 or r["tile_rows"] == 1 for r in rows)
    if torch.cuda.is_available():  # measured on GPUs only: im2col allocates at least its matrix
        assert rows[0]["im2col_peak_extra_bytes"] >= rows[0]["im2col_bytes"]
    else:
        assert rows[0]["im2col_peak_extra_bytes"] is None
    json.dumps(rows)  # a recording must be JSON


def test_layers_sweep_checks_times_and_skips_direct_on_large_layers():
    layers = [conv.ConvLayer(1, 8, 12, 12, 8, 3, 3, padding=1, name="small"),
              conv.ConvLayer(1, 4, 40, 40, 4, 3, 3, padding=1, name="wide")]
    rows = sweeps.layers_sweep(layers, ["float32"], direct_max_positions=144, tile_bytes=2048)
    methods = {(r["layer"], r["method"]) for r in rows}
    assert ("small", "direct") in methods and ("wide", "direct") not in methods
    assert {m for _, m in methods} == set(sweeps.METHODS)
    assert all(r["seconds"] > 0 and r["relative_error"] < 1e-5 and r["status"] == "ok" for r in rows)
    row = rows[0]
    assert row["tflops"] == pytest.approx(row["flops"] / row["seconds"] / 1e12)
    json.dumps(rows)
    fig = figures.methods_figure(rows, title="t", y_title="TFLOP/s")
    assert len(fig.data) == len(sweeps.METHODS)  # one dtype: a bar series per method
    pio.to_json(fig)


def test_layouts_match_torch_strides():
    shape = (1, 64, 5, 4)
    nchw, nhwc = conv.layout_offsets(shape, "NCHW"), conv.layout_offsets(shape, "NHWC")
    x = torch.empty(shape)
    assert x.stride() == (1280, 20, 4, 1)
    assert torch.equal(conv.offsets_from_strides(x), nchw)
    last = x.to(memory_format=torch.channels_last)
    assert last.stride() == (1280, 1, 256, 64)
    assert torch.equal(conv.offsets_from_strides(last), nhwc)
    assert nchw[0, 1, 0, 0] == 20 and nchw[0, 63, 4, 3] == 1279  # the course's figure: channel 1 starts at 20
    assert nhwc[0, 1, 0, 0] == 1 and nhwc[0, 0, 0, 1] == 64
    assert sorted(nhwc.flatten().tolist()) == list(range(1280))  # a permutation: every offset used once
    with pytest.raises(ValueError, match="^layout:"):
        conv.layout_offsets(shape, "CHWN")
    pio.to_json(figures.layout_figure())


def test_memory_order_figure_shows_which_channel_sits_at_each_offset():
    (heatmap,) = figures.memory_order_figure(64, 5, 4, count=24).data  # one trace: two one-row heatmaps break plotly.js
    assert list(heatmap.y) == ["NCHW", "NHWC"]
    nchw, nhwc = heatmap.z
    assert list(nchw) == [0] * 20 + [1] * 4  # a channel's 5 x 4 pixels, then the next channel
    assert list(nhwc) == list(range(24))  # the channels of pixel (0, 0) side by side
    assert heatmap.text[0][20] == "c1<br>h0<br>w0" and heatmap.text[1][1] == "c1<br>h0<br>w0"


def test_course_example():
    model = conv.course_network()
    assert conv.parameter_count(model) == conv.COURSE_PARAMETERS == 146
    assert conv.hidden_units_for() == 8
    qa = torch.tensor(conv.COURSE_CONV_OUTPUT_NHWC).permute(0, 3, 1, 2)  # NHWC -> NCHW
    qb = torch.relu(qa)
    assert torch.equal(qb.permute(0, 2, 3, 1), torch.tensor(conv.COURSE_RELU_NHWC))
    qc = F.max_pool2d(qb, 2, stride=1)
    assert torch.equal(qc.permute(0, 2, 3, 1), torch.tensor(conv.COURSE_POOLED_NHWC))
    qd = qc.flatten(1)
    assert qd[0].tolist() == conv.COURSE_FLATTENED
    torch.testing.assert_close(torch.softmax(qd[0], 0), torch.tensor(conv.COURSE_SOFTMAX), rtol=1e-6, atol=0)
    with torch.no_grad():
        probabilities = model(torch.randn(1, 3, 7, 7))
    assert probabilities.shape == (1, 2) and float(probabilities.sum()) == pytest.approx(1)
