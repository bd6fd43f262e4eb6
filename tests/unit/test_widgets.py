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
from gpulab.ch13_memory_bound_layers_and_fusion.explorer import fusion_explorer, microseconds, size_label
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
    (chain, dtype, gpu), (size,) = explorer.children[0].children, explorer.children[1].children
    assert gpu.value == recording.device_name
    chain.value, size.value = "add_layer_norm", 2**24
    text, (figure,) = shown(explorer)
    for fused in (False, True):
        cost = fusion.chain_cost("add_layer_norm", 2**24, "float32", fused)
        row = next(line for line in text.splitlines() if line.startswith("eager, 2" if not fused else "fused, 1"))
        assert row.split()[-5:-1] == [*format_bytes(cost.bytes).split(), f"{cost.intensity:.2f}",
                                      microseconds(cost.bytes / copy)]
    measured = [r for r in recording.rows if r["chain"] == "add_layer_norm"]
    for r in measured:
        kernels = f"{r['kernels']:g} kernel{'s' if r['kernels'] != 1 else ''}"
        assert f"recorded, {r['mode']}, {kernels}" in text and microseconds(r["seconds"]) in text
    names = [trace["name"] for trace in figure["data"]]
    assert names == ["eager, model", "fused, model", "eager, measured", "torch.compile, measured"]
    assert all(axis_titles(figure))
    dtype.value = "bfloat16"  # the recording is float32: its times stay in the table, off the bfloat16 figure
    text, (figure,) = shown(explorer)
    assert [trace["name"] for trace in figure["data"]] == ["eager, model", "fused, model"]
    cost = fusion.chain_cost("add_layer_norm", 2**24, "bfloat16")
    assert format_bytes(cost.bytes) in text and "off the figure" in text


def test_fusion_explorer_output_always_names_the_controls_values():
    explorer = fusion_explorer(elements=2**26)
    (chain, dtype, gpu), (size,) = explorer.children[0].children, explorer.children[1].children

    def said() -> str:
        return shown(explorer)[0].splitlines()[0]

    def expected() -> str:
        return f"{fusion.CHAINS[chain.value].label} on {size.value:,} {dtype.value} elements per tensor"

    assert said().startswith(expected()) and said().startswith("bias + GELU + dropout on 67,108,864 float32")
    assert size_label(size.value) == size.label == "2^26 = 67,108,864"
    for control, value in ((chain, "add_layer_norm"), (size, 2**12), (dtype, "bfloat16"), (chain, "bias_gelu_dropout"),
                           (size, 2**30), (dtype, "float32")):
        control.value = value
        assert said().startswith(expected()), (control.description, value)
    assert said().endswith(f"({recordings.load('fusion_compile', gpu.value).label}).")
    for name in ("h200", "h100"):  # the GPU asked for, whichever recording is newest
        chosen = fusion_explorer(gpu=name).children[0].children[2].value
        assert chosen == recordings.load("fusion_compile", name).device_name


def test_fusion_explorer_without_a_recording_says_whose_bandwidth_it_uses(monkeypatch):
    monkeypatch.setattr(recordings, "newest_per_gpu", lambda *args, **kwargs: [])
    explorer = fusion_explorer()
    text, (figure,) = shown(explorer)
    assert "datasheet" in text and "no measured times" in text
    assert f"{specs.gpu('H200 SXM 141GB').bandwidth_gb_s:,.0f} GB/s" in text
    assert explorer.children[0].children[2].label == "H200 SXM 141GB (datasheet)"


def test_batched_explorer_picks_the_nearest_recorded_point_and_models_the_loop():
    recording = recordings.load("batched_gemm")
    rows = ok_rows(recording.rows)
    explorer = batched_gemm_explorer(n=100, batch=7)  # nearest: n = 128, a batch of 50
    (order, count), (dtype, gpu) = explorer.children[0].children, explorer.children[1].children
    assert gpu.value == recording.device_name
    text, (figure,) = shown(explorer)
    at = {(r["method"], r["n"]): r for r in rows if r["dtype"] == "float32" and r["batch"] == 50}
    assert text.startswith(f"{recording.label}, float32:") and "is n = 128, batch of 50" in text
    for method in batched.METHODS:
        line = next(line for line in text.splitlines() if line.startswith(batched.METHOD_LABELS[method]))
        assert f"{1e3 * at[method, 128]['seconds']:,.3f}" in line
    launch = at["loop", 8]["seconds"] / 50
    assert f"model: batch x {1e6 * launch:.2f} µs" in text
    assert f"for a batch of 7 it predicts about {1e3 * 7 * launch:,.3f} ms" in text
    assert len(figure["data"]) == len(batched.METHODS) + 1 and all(axis_titles(figure))
    count.value, dtype.value = 5000, "float16"
    text, _ = shown(explorer)
    assert "float16" in text and "batch of 1,000" in text
    order.value = 0
    assert order.value == 1


def test_batched_explorer_without_a_recording_says_so(monkeypatch):
    monkeypatch.setattr(recordings, "newest_per_gpu", lambda *args, **kwargs: [])
    text, figures = shown(batched_gemm_explorer())
    assert text.startswith("No recording of batched_gemm") and figures == []


def test_sparsity_explorer_uses_compressed_size_and_refuses_a_partial_group():
    recording = recordings.load("sparsity_linear_speedup")
    explorer = sparsity_explorer(n=4096, value_bits=16)
    (bits, pattern), (order, gpu) = explorer.children[0].children, explorer.children[1].children
    assert gpu.value == recording.device_name
    text, (figure,) = shown(explorer)
    assert text.startswith("4,096 x 4,096, 16-bit values, 2:4: compressed, 56.25% of dense")
    rows = [line.split() for line in text.splitlines() if line.startswith("2:4: ")]
    assert rows[0][-3:] == ["16.0", "MiB", "50.00%"] and rows[1][-3:] == ["2.0", "MiB", "6.25%"]
    speedups = [r for r in recording.rows if r.get("n") == 4096 and "speedup" in r]
    assert f"best speed-up {max(r['speedup'] for r in speedups):.2f}x" in text and recording.label in text
    assert all(axis_titles(figure))
    bits.value, pattern.value = 32, "1:2"
    text, (figure,) = shown(explorer)
    size = patterns.compressed_size(32, 1, 2)
    assert f"1:2: compressed, {size.fraction_of_dense:.2%} of dense" in text and "take 32-bit data as 1:2." in text
    assert "only 16-bit 2:4 products were recorded" in text
    assert figure["data"][1]["y"][1] == pytest.approx(4096**2 // 2 * size.metadata_bits / 8 / 2**20)
    pattern.value, order.value = "4:8", 4100
    text, figures = shown(explorer)
    assert text.startswith("n = 4100: the columns") and "multiple of 8 for 4:8" in text and figures == []


def test_sparsity_explorer_without_a_recording_still_counts_bytes(monkeypatch):
    monkeypatch.setattr(recordings, "newest_per_gpu", lambda *args, **kwargs: [])
    text, (figure,) = shown(sparsity_explorer(n=1024, value_bits=8))
    assert "62.50% of dense" in text and "no recording of sparsity_linear_speedup here" in text


def test_allreduce_explorer_times_with_the_model_and_marks_the_size():
    explorer = allreduce_explorer(workers=4, nbytes=2**20, latency_us=10, bandwidth_gbs=50)
    (p, size), (latency, bandwidth) = explorer.children[0].children, explorer.children[1].children
    p.value = 6
    text, (figure,) = shown(explorer)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.split()[:1] in (["ring"], ["tree"],
                                                                                                  ["naive"])}
    for name in distributed.ALGORITHMS:
        t = distributed.model_seconds(name, 6, 2**20, 10e-6, 50e9)
        assert rows[name][2] == f"{1e6 * t:,.1f}"
    ring = distributed.model_seconds("ring", 6, 2**20, 10e-6, 50e9)
    assert rows["ring"][-1] == f"{distributed.bus_bandwidth(2**20, ring, 6) / 1e9:.3g}"
    assert " ".join(rows["ring"][3:5]) == format_bytes(round(distributed.ring_factor(6) * 2**20))
    assert all(axis_titles(figure))
    assert [shape["x0"] for shape in figure["layout"]["shapes"]] == [2**20]  # the chosen size, marked
    size.value, latency.value, bandwidth.value = 8, 100, 10
    text, _ = shown(explorer)
    assert text.startswith("8 B on 6 workers") and "fastest here, tree." in text
    assert f"{1e6 * distributed.model_seconds('tree', 6, 8, 100e-6, 10e9):,.1f}" in text
    latency.value = 10**6  # beyond the slider: clamped to its largest latency
    assert math.isclose(latency.value, 1000)
