"""The explorers of models and recordings (chapters 12 to 16): they build, answer a change of a control with
the chapter module's own numbers, and turn a bad value into a clamped control or a sentence, not a traceback."""

from __future__ import annotations

import math

import plotly.io as pio
import pytest

from conftest import shown as shown_in
from gpulab.ch12_cudnn_convolution_algorithms import algorithms
from gpulab.ch12_cudnn_convolution_algorithms.explorer import convolution_algorithms_explorer
from gpulab.ch13_memory_bound_layers_and_fusion import fusion
from gpulab.ch13_memory_bound_layers_and_fusion.explorer import fusion_explorer
from gpulab.ch14_batched_linear_algebra import batched
from gpulab.ch14_batched_linear_algebra.explorer import batched_gemm_explorer
from gpulab.ch15_structured_sparsity import patterns
from gpulab.ch15_structured_sparsity.explorer import sparsity_explorer
from gpulab.ch16_distributed_training import distributed
from gpulab.ch16_distributed_training.explorer import allreduce_explorer
from gpulab.core import plots, recordings, specs
from gpulab.core.printing import format_bytes
from gpulab.core.sweep import ok_rows


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses


def shown(explorer):
    """What an explorer's output area (its last child) shows: its text, and the plotly figures it displays."""
    return shown_in(explorer.children[-1])


def axis_titles(figure: dict) -> tuple[str, str, str]:
    layout = figure["layout"]
    return layout["title"]["text"], layout["xaxis"]["title"]["text"], layout["yaxis"]["title"]["text"]


def test_convolution_explorer_counts_with_cudnn_and_shows_winograd_for_3x3_only():
    explorer = convolution_algorithms_explorer(batch=2, channels=16, size=20, filter_size=3)
    (r, n), (c, hw) = explorer.children[0].children, explorer.children[1].children
    layer = algorithms.same_padding_layer(2, 16, 20, 16, 3)
    outputs = layer.n * layer.k * layer.p * layer.q
    text, (figure,) = shown(explorer)
    bars = dict(zip(figure["data"][0]["x"], figure["data"][0]["y"], strict=True))
    assert bars == pytest.approx({m: algorithms.multiplies(layer, m) / outputs for m in algorithms.COUNTED})
    assert bars["direct or GEMM"] == 16 * 3 * 3
    assert f"GEMM {format_bytes(algorithms.workspace_bytes(layer, 'GEMM'))}" in text
    assert "Fewest multiplies: Winograd F(2x2), 2.25x fewer than direct" in text
    assert all(axis_titles(figure))
    r.value = 11
    text, (figure,) = shown(explorer)
    layer = algorithms.same_padding_layer(2, 16, 20, 16, 11)
    assert "Winograd F(2x2)" not in figure["data"][0]["x"] and "3 x 3 filters only" in text
    fewest = min((m for m in algorithms.COUNTED if m != "Winograd F(2x2)"),
                 key=lambda m: algorithms.multiplies(layer, m))
    assert f"Fewest multiplies: {fewest}," in text
    n.value = 1
    text, (figure,) = shown(explorer)
    layer = algorithms.same_padding_layer(1, 16, 20, 16, 11)
    assert figure["data"][0]["y"][-1] == pytest.approx(algorithms.multiplies(layer, "FFT tiled") / (16 * 20 * 20))
    hw.value, c.value = 0, 10**6  # clamped by the controls
    assert (hw.value, c.value) == (1, c.max)
    r.value = 15  # a 15 x 15 filter on a 1 x 1 image: still a layer ("same" padding)
    text, figures = shown(explorer)
    assert "1 x 1 images, 15 x 15 filters" in text and len(figures) == 1


def test_fusion_explorer_predicts_at_the_recorded_copy_bandwidth():
    recording = recordings.load("fusion_compile")
    copy = next(r for r in recording.rows if r["chain"] == "copy")["gbytes_per_s"] * 1e9
    explorer = fusion_explorer(elements=2**20)
    (chain, dtype), (size,) = explorer.children[0].children, explorer.children[1].children
    chain.value, size.value = "add_layer_norm", 2**24
    text, (figure,) = shown(explorer)
    for fused in (False, True):
        cost = fusion.chain_cost("add_layer_norm", 2**24, "float32", fused)
        assert f"{format_bytes(cost.bytes)} moved, {cost.intensity:.2f} FLOP/byte, {1e6 * cost.bytes / copy:,.1f} us" \
            in text
    measured = [r for r in recording.rows if r["chain"] == "add_layer_norm"]
    for r in measured:
        assert f"recorded, {r['mode']}, {r['kernels']:g} kernels" in text and f"{1e6 * r['seconds']:,.1f} us" in text
    names = [trace["name"] for trace in figure["data"]]
    assert names == ["eager, model", "fused, model", "eager, measured", "torch.compile, measured"]
    assert all(axis_titles(figure))
    dtype.value = "bfloat16"  # the recording is float32: its times stay in the text, off the bfloat16 figure
    text, (figure,) = shown(explorer)
    assert [trace["name"] for trace in figure["data"]] == ["eager, model", "fused, model"]
    cost = fusion.chain_cost("add_layer_norm", 2**24, "bfloat16")
    assert f"{format_bytes(cost.bytes)} moved" in text


def test_fusion_explorer_without_a_recording_says_whose_bandwidth_it_uses(monkeypatch):
    monkeypatch.setattr(recordings, "load", lambda *args, **kwargs: None)
    text, (figure,) = shown(fusion_explorer())
    assert "datasheet" in text and "no measured times" in text
    assert f"{specs.gpu('H200 SXM 141GB').bandwidth_gb_s:,.0f} GB/s" in text


def test_batched_explorer_picks_the_nearest_recorded_point_and_models_the_loop():
    rows = ok_rows(recordings.load("batched_gemm").rows)
    explorer = batched_gemm_explorer(n=100, batch=7)  # nearest: n = 128, a batch of 50
    order, count, dtype = explorer.children[0].children
    text, (figure,) = shown(explorer)
    at = {(r["method"], r["n"]): r for r in rows if r["dtype"] == "float32" and r["batch"] == 50}
    assert "is n = 128, batch of 50" in text
    for method in batched.METHODS:
        assert f"{1e3 * at[method, 128]['seconds']:9.3f} ms" in text
    launch = at["loop", 8]["seconds"] / 50
    assert f"loop = batch x {1e6 * launch:.2f} us" in text
    assert f"for a batch of 7: about {1e3 * 7 * launch:,.3f} ms" in text
    assert len(figure["data"]) == len(batched.METHODS) + 1 and all(axis_titles(figure))
    count.value, dtype.value = 5000, "float16"
    text, _ = shown(explorer)
    assert "float16" in text and "batch of 1000" in text
    order.value = 0
    assert order.value == 1


def test_batched_explorer_without_a_recording_says_so(monkeypatch):
    monkeypatch.setattr(recordings, "load", lambda *args, **kwargs: None)
    text, figures = shown(batched_gemm_explorer())
    assert text.startswith("No recording of batched_gemm") and figures == []


def test_sparsity_explorer_uses_compressed_size_and_refuses_a_partial_group():
    explorer = sparsity_explorer(n=4096, value_bits=16)
    bits, pattern, order = explorer.children[0].children
    text, (figure,) = shown(explorer)
    assert "16.0 MiB of values + 2.0 MiB of metadata" in text and "= 56.25% of dense" in text
    speedups = [r for r in recordings.load("sparsity_linear_speedup").rows if r.get("n") == 4096 and "speedup" in r]
    assert f"best speed-up {max(r['speedup'] for r in speedups):.2f}x" in text
    assert all(axis_titles(figure))
    bits.value, pattern.value = 32, "1:2"
    text, (figure,) = shown(explorer)
    size = patterns.compressed_size(32, 1, 2)
    assert f"= {size.fraction_of_dense:.2%} of dense" in text and "take 32-bit data as 1:2" in text
    assert "only 16-bit 2:4 products were recorded" in text
    assert figure["data"][1]["y"][1] == pytest.approx(4096**2 // 2 * size.metadata_bits / 8 / 2**20)
    pattern.value, order.value = "4:8", 4100
    text, figures = shown(explorer)
    assert text.startswith("n = 4100: the columns") and "multiple of 8" in text and figures == []


def test_allreduce_explorer_times_with_the_model_and_marks_the_size():
    explorer = allreduce_explorer(workers=4, nbytes=2**20, latency_us=10, bandwidth_gbs=50)
    (p, size), (latency, bandwidth) = explorer.children[0].children, explorer.children[1].children
    p.value = 6
    text, (figure,) = shown(explorer)
    for name in distributed.ALGORITHMS:
        t = distributed.model_seconds(name, 6, 2**20, 10e-6, 50e9)
        assert f"{1e6 * t:,.1f} us" in text
    ring = distributed.model_seconds("ring", 6, 2**20, 10e-6, 50e9)
    assert f"{distributed.bus_bandwidth(2**20, ring, 6) / 1e9:>6.3g} GB/s" in text
    assert format_bytes(round(distributed.ring_factor(6) * 2**20)) in text
    assert all(axis_titles(figure))
    assert [shape["x0"] for shape in figure["layout"]["shapes"]] == [2**20]  # the chosen size, marked
    size.value, latency.value, bandwidth.value = 8, 100, 10
    text, _ = shown(explorer)
    assert text.startswith("8 B on 6 workers") and "fastest here: tree" in text
    assert f"{1e6 * distributed.model_seconds('tree', 6, 8, 100e-6, 10e9):,.1f} us" in text
    latency.value = 10**6  # beyond the slider: clamped to its largest latency
    assert math.isclose(latency.value, 1000)
