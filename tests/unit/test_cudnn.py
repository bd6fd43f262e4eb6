"""Chapter 12: the algorithm families against conv2d, the counts, the descriptors, the kernel families and the
experiments, run small on the CPU (and, where there is one, checked on a GPU)."""

from __future__ import annotations

import json
import math
import threading

import plotly.io as pio
import pytest
import torch
import torch.nn.functional as F

from conftest import needs_gpu
from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.ch12_cudnn_convolution_algorithms import algorithms, backend, cudnn
from gpulab.ch12_cudnn_convolution_algorithms.figures import (
    benchmark_figure,
    channels_figure,
    deterministic_figure,
    filter_sizes_figure,
    multiplies_figure,
    settings_figure,
    workspace_figure,
)

CASES = [
    conv.ConvLayer(2, 3, 7, 7, 4, 3, 3),
    conv.ConvLayer(1, 5, 9, 6, 3, 3, 2, stride=2, padding=1),  # non-square filter and image, stride 2
    conv.ConvLayer(2, 4, 8, 8, 6, 1, 1),
    conv.ConvLayer(1, 2, 5, 5, 2, 5, 5, padding=2),
    conv.ConvLayer(3, 8, 12, 10, 5, 3, 3, stride=3, padding=2),
    conv.ConvLayer(2, 4, 17, 13, 5, 3, 3, padding=1),  # odd output: Winograd's last tiles are partial
    conv.ConvLayer(1, 3, 45, 40, 4, 11, 11, padding=5),  # several FFT tiles, 11 x 11
]
TINY = [conv.ConvLayer(1, 4, 10, 10, 4, 3, 3, padding=1, name="3x3"),
        conv.ConvLayer(1, 3, 12, 12, 4, 5, 5, stride=2, padding=2, name="5x5/2")]
CPU = torch.device("cpu")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.describe())
def test_every_family_matches_conv2d_in_float64(case):
    rows = algorithms.check_families([case], "float64", CPU)
    expected = {m for m in algorithms.FAMILY_IMPLEMENTATIONS if algorithms.applies(m, case)}
    assert {r["method"] for r in rows} == expected
    assert all(r["relative_error"] < 1e-12 for r in rows)
    winograd = (case.r, case.s, case.stride) == (3, 3, 1)
    assert ("Winograd F(2x2, 3x3)" in expected) == winograd


def test_float32_families_are_close():
    rows = algorithms.check_families([conv.ConvLayer(2, 16, 20, 18, 8, 3, 3, padding=1)], "float32", CPU)
    assert len(rows) == len(algorithms.FAMILY_IMPLEMENTATIONS) and all(r["relative_error"] < 1e-5 for r in rows)


def test_tiled_fft_is_right_for_every_tile_size():
    x, weight = torch.randn(1, 3, 23, 19, dtype=torch.float64), torch.randn(2, 3, 4, 3, dtype=torch.float64)
    reference = F.conv2d(x, weight, padding=1)
    for tile in (4, 5, 8, 16, 64):
        torch.testing.assert_close(algorithms.conv2d_fft_tiled(x, weight, padding=1, tile=tile), reference)


def test_winograd_f23_in_one_dimension_uses_four_products():
    bt, g, at = algorithms.winograd_matrices()
    d, taps = torch.randn(4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    products = (g @ taps) * (bt @ d)  # the 4 multiplies
    direct = torch.stack([d[0:3] @ taps, d[1:4] @ taps])  # the 6 of the direct method
    assert products.numel() == 4
    torch.testing.assert_close(at @ products, direct)


def test_a_wrong_family_is_caught(monkeypatch):
    monkeypatch.setitem(algorithms.FAMILY_IMPLEMENTATIONS, "FFT",
                        lambda x, w, stride, padding: algorithms.conv2d_fft(x, w, stride, padding) * 1.001)
    with pytest.raises(AssertionError, match="FFT.*relative error"):
        algorithms.check_families([CASES[0]], "float64", CPU)


def test_bad_arguments_are_named():
    x, w3, w5 = torch.randn(1, 2, 8, 8), torch.randn(2, 2, 3, 3), torch.randn(2, 2, 5, 5)
    with pytest.raises(ValueError, match="^weight: Winograd"):
        algorithms.conv2d_winograd(x, w5)
    with pytest.raises(ValueError, match="^stride:"):
        algorithms.conv2d_winograd(x, w3, stride=2)
    with pytest.raises(ValueError, match="^x: the FFT"):
        algorithms.conv2d_fft(x.half(), w3.half())
    with pytest.raises(ValueError, match="^tile:"):
        algorithms.conv2d_fft_tiled(x, w5, tile=4)
    with pytest.raises(ValueError, match="^weight: has 3 channels"):
        algorithms.conv2d_fft(x, torch.randn(2, 3, 3, 3))
    with pytest.raises(ValueError, match="^method:"):
        algorithms.multiplies(CASES[0], "magic")
    with pytest.raises(ValueError, match="^method:"):
        algorithms.workspace_bytes(CASES[0], "magic")
    with pytest.raises(ValueError, match="^dtype: float64 or float32"):
        algorithms.check_families(CASES[:1], "bfloat16", CPU)
    with pytest.raises(ValueError, match="^layout:"):
        cudnn.measure_conv(TINY[0], layout="CHWN", device=CPU)
    with pytest.raises(ValueError, match="^layout: gpulab's FFT"):
        cudnn.measure_conv(TINY[0], "FFT", layout="NHWC", device=CPU)
    with pytest.raises(ValueError, match="^method: Winograd"):
        cudnn.measure_conv(TINY[1], "Winograd F(2x2, 3x3)", device=CPU)
    with pytest.raises(ValueError, match="^dtype: tf32 is a tensor-core mode"):
        cudnn.measure_conv(TINY[0], dtype="tf32", device=CPU)
    with pytest.raises(ValueError, match="^repeats: at least 2"):
        cudnn.measure_passes(TINY[0], repeats=1, device=CPU)
    with pytest.raises(ValueError, match="^layers: two layers"):
        cudnn.benchmark_sweep([TINY[0], TINY[0]])
    with pytest.raises(ValueError, match="^methods: unknown"):
        cudnn.filter_sizes_sweep([3], methods=["conv2d", "magic"])


def test_multiply_counts():
    layer = algorithms.same_padding_layer(2, 16, 32, 8, 3)
    assert algorithms.multiplies(layer, "direct or GEMM") == layer.flops / 2
    # 16 products per 2 x 2 tile instead of 36: 2.25 times fewer when the tiles divide the output
    assert algorithms.multiplies(layer, "direct or GEMM") / algorithms.multiplies(layer, "Winograd F(2x2)") == 2.25
    rows = algorithms.multiply_counts([1, 32], 128, 128, [1, 3, 5, 7, 9, 11])
    direct = {r["filter"]: r["per_output"] for r in rows if r["method"] == "direct or GEMM" and r["batch"] == 1}
    fft = {r["filter"]: r["per_output"] for r in rows if r["method"] == "FFT" and r["batch"] == 1}
    assert direct[11] / direct[1] == 121 and fft[11] / fft[1] < 1.5  # the FFT hardly grows with the filter
    assert algorithms.crossover(rows, "FFT", 1) == 5 and algorithms.crossover(rows, "FFT", 32) == 3
    assert algorithms.crossover(rows, "direct or GEMM", 1) is None
    with pytest.raises(ValueError, match="^spec: Winograd counts are for stride 1"):
        algorithms.multiplies(CASES[1], "Winograd F(2x2)")


def test_workspace_models_match_the_tensors_built():
    layer = CASES[6]
    x, weight = torch.randn(layer.n, layer.c, layer.h, layer.w), torch.randn(layer.k, layer.c, layer.r, layer.s)
    size = (layer.h + 2 * layer.padding, layer.w + 2 * layer.padding)
    spectra = [torch.fft.rfft2(x, s=size), torch.fft.rfft2(weight, s=size), torch.empty(
        layer.n, layer.k, size[0], size[1] // 2 + 1, dtype=torch.complex64)]
    assert algorithms.workspace_bytes(layer, "FFT") == sum(t.numel() * t.element_size() for t in spectra)
    assert algorithms.workspace_bytes(layer, "GEMM") == conv.im2col(x, 11, 11, 1, 5).numel() * 4
    assert algorithms.workspace_bytes(layer, "implicit GEMM") == 0
    assert algorithms.workspace_bytes(layer, "FFT tiled") < algorithms.workspace_bytes(layer, "FFT") * 4


def test_the_talks_gemm_workspace_is_the_im2col_matrix_of_one_image():
    assert algorithms.workspace_bytes(algorithms.talk_layer(1, 3), "GEMM") == 72 * 2**20
    assert algorithms.workspace_bytes(algorithms.talk_layer(1, 11), "GEMM") == 968 * 2**20
    rows = algorithms.talk_rates([128, 1])
    gemm = {(r["batch"], r["filter"]): r for r in rows if r["algorithm"] == "GEMM"}
    assert gemm[128, 3]["implied_tflops"] > 10 * gemm[128, 3]["peak_tflops"]  # impossible on a GV100
    assert gemm[1, 3]["implied_tflops"] < gemm[1, 3]["peak_tflops"]
    assert gemm[1, 11]["im2col_mib"] == gemm[1, 11]["workspace_mb"] == 968
    assert all(r["implied_tflops"] is None for r in rows if r["milliseconds"] is None)


def test_descriptors_follow_torchs_rules():
    x, weight = torch.randn(2, 8, 6, 5), torch.randn(4, 8, 3, 3)
    last = x.to(memory_format=torch.channels_last)
    described = backend.conv_descriptors(last, weight, padding=1)
    assert [d.get("format") for d in described[:3]] == ["NHWC"] * 3  # one channels_last operand is enough
    assert described[0]["strides"] == [240, 1, 40, 8] and described[2]["sizes"] == [2, 4, 6, 5]
    assert [d.get("format") for d in backend.conv_descriptors(last.double(), weight.double())[:3]] == ["NCHW"] * 3
    gappy = torch.randn(2, 16, 6, 5)[:, ::2]
    assert backend.tensor_descriptor(gappy)["packed"] is False
    assert backend.conv_descriptors(gappy, weight)[0]["strides"] == [240, 30, 5, 1]  # copied to a packed tensor
    half = backend.conv_descriptors(x.half(), weight.half())
    assert half[0]["data_type"] == "CUDNN_DATA_HALF" and half[3]["compute_type"] == "CUDNN_DATA_FLOAT"
    assert backend.layout_of(x.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)) == "CNHW"
    with pytest.raises(ValueError, match="^x: cuDNN has no data type"):
        backend.tensor_descriptor(x.long())
    with pytest.raises(ValueError, match="^t: expected a 4-d tensor"):
        backend.layout_of(torch.randn(3, 4))


def test_backend_and_flags():
    x, weight = torch.randn(1, 8, 10, 10), torch.randn(8, 8, 3, 3)
    assert backend.conv_backend(x.double(), weight.double(), padding=1) in ("Slow2d", "unknown")
    assert backend.conv_backend(x, weight, padding=1) in (*backend.BACKENDS, "unknown")
    flags = {f["flag"]: f["value"] for f in backend.backend_flags()}
    assert flags["torch.backends.cudnn.benchmark"] == torch.backends.cudnn.benchmark
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    with backend.cudnn_settings(benchmark=not saved[0], deterministic=True):
        assert torch.backends.cudnn.benchmark is (not saved[0]) and torch.backends.cudnn.deterministic
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == saved


def test_in_fresh_thread_returns_and_raises():
    caller = threading.get_ident()
    assert backend.in_fresh_thread(threading.get_ident) != caller

    def fail():
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        backend.in_fresh_thread(fail)


@pytest.mark.parametrize(("name", "family"), [
    ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_cudnn", "implicit GEMM"),
    ("sm90_xmma_wgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc", "implicit GEMM"),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(...)", "Winograd"),
    ("void fft2d_r2c_32x32<float, false, 1u, false>(...)", "FFT"),
    ("void im2col4d_kernel<float, int>(...)", "im2col (GEMM algorithm)"),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>(...)", "layout transform"),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "implicit precomputed GEMM"),
    ("void splitKreduce_kernel<32, 16, int, float, float>(...)", "split-K reduction"),
    ("sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x16_warpgroupsize1x1x1", "GEMM"),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_NNN", "GEMM"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(...)", "elementwise"),
    ("sm80_xmma_gemm_cf32cf32_f32f32_cf32_tn_n_tilesize32x64x8_stage3_warpsize2x2x1_ffma", "FFT"),
    ("void precomputed_convolve_sgemm<float, 128, 6, 7, 3, 3, 5, 1, false>(...)", "implicit precomputed GEMM"),
    ("void cudnn::engines_precompiled::scalePackedTensor_kernel<float, float>(...)", "layout transform"),
    ("void cudnn::ops::nhwcAddPaddingKernel<__half, __half, float, true>(...)", "layout transform"),
    ("void cudnn::ops::tensorTransformGeneric<float, float, float, true, false, false>(...)", "layout transform"),
    ("something_new_and_unknown", "other"),
])
def test_kernel_names_sort_into_families(name, family):
    assert backend.kernel_family(name) == family


def test_cpu_operators_sort_into_families():
    assert backend.kernel_family("aten::mkldnn_convolution", "cpu") == "oneDNN"
    assert backend.kernel_family("aten::_slow_conv2d_forward", "cpu") == "im2col (GEMM algorithm)"
    assert backend.kernel_family("aten::_fft_r2c", "cpu") == "FFT"
    assert backend.main_family([{"family": "layout transform", "seconds": 2.0}, {"family": "GEMM", "seconds": 1.0}]) \
        == "GEMM"
    assert backend.main_family([]) == "none"


def test_profile_kernels_names_what_ran():
    x, weight = torch.randn(1, 4, 12, 12, dtype=torch.float64), torch.randn(4, 4, 3, 3, dtype=torch.float64)
    backend._prime_profiler()
    rows = backend.profile_kernels(lambda: F.conv2d(x, weight, padding=1), CPU)
    assert rows and rows[0]["seconds"] >= rows[-1]["seconds"] and abs(sum(r["share"] for r in rows) - 1) < 1e-9
    assert backend.main_family(rows) == "im2col (GEMM algorithm)"  # float64 on a CPU: torch's slow_conv2d


def test_measure_conv_checks_then_times():
    row = cudnn.measure_conv(TINY[0], "conv2d", "float32", "NHWC", benchmark=True, device=CPU)
    assert (row["layer"], row["layout"], row["benchmark"], row["dtype"]) == ("3x3", "NHWC", True, "float32")
    assert row["seconds"] > 0 and row["first_call_seconds"] > 0 and row["relative_error"] < 1e-5
    assert row["tflops"] == pytest.approx(TINY[0].flops / row["seconds"] / 1e12)
    assert row["peak_extra_bytes"] is None and row["im2col_bytes"] == TINY[0].im2col_elements * 4
    assert row["kernels"] and row["algorithm"] in backend.ARITHMETIC_FAMILIES
    ours = cudnn.measure_conv(TINY[0], "Winograd F(2x2, 3x3)", device=CPU, profile=False)
    assert ours["backend"] == "gpulab" and ours["benchmark"] is None and ours["kernels"] == []
    json.dumps([row, ours])  # a recording must be able to hold the rows


def test_measure_conv_catches_a_wrong_result(monkeypatch):
    real = cudnn._call

    def off_a_little(*args):
        call = real(*args)
        return lambda: call() + 1e-2

    monkeypatch.setattr(cudnn, "_call", off_a_little)
    with pytest.raises(AssertionError, match="relative error"):
        cudnn.measure_conv(TINY[0], device=CPU, profile=False)


def test_measure_passes_checks_each_pass_and_compares_runs():
    rows = cudnn.measure_passes(TINY[1], "float32", deterministic=True, repeats=2, device=CPU, profile=False)
    assert [r["pass"] for r in rows] == list(cudnn.PASSES)
    assert all(r["identical"] and r["max_difference"] == 0 and r["relative_error"] < 1e-5 for r in rows)


def test_experiments_and_figures_run_small():
    layers = [layer.spec() for layer in TINY]
    bench = cudnn.benchmark_sweep(layers)
    assert [(r["layer"], r["benchmark"], r["status"]) for r in bench] == [
        ("3x3", False, "ok"), ("3x3", True, "ok"), ("5x5/2", False, "ok"), ("5x5/2", True, "ok")]
    settings = cudnn.layouts_precisions_sweep(layers, ["float32", "tf32"], benchmark=False)
    assert {(r["method"], r["layout"]) for r in settings if r["status"] == "ok"} == {
        ("conv2d", "NCHW"), ("conv2d", "NHWC"), ("im2col + GEMM", "NCHW")}
    skipped = [r for r in settings if r["status"] != "ok"]
    if torch.cuda.is_available():  # a GPU of Ampere or later runs TF32 too
        assert not skipped and {r["dtype"] for r in settings} == {"float32", "tf32"}
    else:
        [row] = skipped
        assert row["dtype"] == "tf32" and row["status"] == "not run" and "tensor-core" in row["reason"]
    channels = cudnn.channels_sweep([7, 8], batch=1, size=8, dtype="float32", layouts=["NHWC"])
    assert [(r["c"], r["multiple_of_8"]) for r in channels] == [(7, False), (8, True)]
    filters = cudnn.filter_sizes_sweep([3, 5], batch=1, channels=4, size=12)
    methods = {(r["filter_size"], r["method"]) for r in filters}
    assert (3, "Winograd F(2x2, 3x3)") in methods and (5, "Winograd F(2x2, 3x3)") not in methods
    assert sum(r["method"] == "conv2d" for r in filters) == 4  # benchmark off and on, for each filter
    determinism = cudnn.deterministic_sweep(layers[:1], repeats=2)
    assert len(determinism) == 2 * len(cudnn.PASSES) and all(r["identical"] for r in determinism)
    counts = algorithms.multiply_counts([1, 8], 16, 16, [1, 3, 5])
    figures = [
        multiplies_figure(counts, title="t"), benchmark_figure(bench, title="t"),
        settings_figure(settings, title="t"), channels_figure(channels, title="t"),
        filter_sizes_figure(algorithms.talk_rates([1]), filters, title="t", measured_label="m"),
        deterministic_figure(determinism, title="t"),
    ]
    for fig in figures:
        assert fig.data and fig.layout.title.text == "t"
        pio.to_json(fig, validate=True)
    assert figures[1].layout.yaxis.title.text == "milliseconds"
    shown = backend.algorithm_rows(bench)
    assert len(shown) == 4 and all(r["kernels"] for r in shown)


def test_workspace_figure_needs_gpu_rows():
    rows = [{"layer": "a", "benchmark": flag, "status": "ok", "im2col_bytes": 2**20, "peak_extra_bytes": 0,
             "first_call_extra_bytes": 2**22} for flag in (False, True)]
    fig = workspace_figure(rows, title="t")
    assert len(fig.data) == 4 and fig.layout.yaxis.type == "log"
    assert math.isclose(fig.data[3].y[0], 4.0)


@needs_gpu
def test_on_a_gpu_cudnn_runs_and_shows_its_kernels():
    device = torch.device("cuda")
    off = cudnn.measure_conv(TINY[0], "conv2d", "float32", benchmark=False, device=device)
    on = cudnn.measure_conv(TINY[0], "conv2d", "float32", benchmark=True, device=device)
    assert off["backend"] == on["backend"] == "Cudnn"
    assert off["peak_extra_bytes"] is not None and on["first_call_extra_bytes"] is not None
    assert off["kernels"] and on["kernels"]
    rows = cudnn.measure_passes(TINY[0], "float32", deterministic=True, repeats=3, device=device)
    assert all(r["identical"] for r in rows)
