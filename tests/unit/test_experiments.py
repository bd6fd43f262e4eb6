"""The BLAS experiments, recordings, figures and widgets, run small on the CPU."""

from __future__ import annotations

import json
import math

import plotly.graph_objects as go
import pytest
import torch

from gpulab.ch01_cpus_to_gpus.figures import gpu_comparison_figure
from gpulab.ch03_blas_levels import blas
from gpulab.core import plots, rates, recordings
from gpulab.core.roofline import Roofline


@pytest.mark.parametrize("op", rates.OPS)
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_measure_blas_checks_and_times(op, dtype):
    row = rates.measure_blas(op, 64, dtype)
    assert row["op"] == op and row["dtype"] == dtype and row["seconds"] > 0
    assert row["gflops"] == pytest.approx(row["flops"] / row["seconds"] / 1e9)
    assert row["relative_error"] < 0.05


def test_measure_blas_catches_a_wrong_result(monkeypatch):
    real = rates._operation

    def off_by_one(op, t):
        fn = real(op, t)
        return lambda: fn().add_(1)

    monkeypatch.setattr(rates, "_operation", off_by_one)
    with pytest.raises(AssertionError, match="relative error"):
        rates.measure_blas("gemm", 32, "float32")


def test_measure_blas_rejects_bad_arguments():
    with pytest.raises(ValueError, match="^op:"):
        rates.measure_blas("trsm", 64)
    with pytest.raises(ValueError, match="^dtype:"):
        rates.measure_blas("gemm", 64, "int8")
    with pytest.raises(ValueError, match="^dtype: tf32 is a tensor-core mode"):
        rates.measure_blas("gemm", 64, "tf32", torch.device("cpu"))
    with pytest.raises(ValueError, match="^n:"):
        rates.measure_blas("gemm", 0)
    with pytest.raises(ValueError, match="^n: needs"):
        rates.measure_blas("gemm", 10**7)


def test_blocked_gemm_and_ceilings():
    rows = blas.blocked_gemm_sweep(128, [8, 128])
    assert [r["block"] for r in rows] == [8, 128] and all(r["status"] == "ok" for r in rows)
    assert rows[0]["intensity"] < rows[1]["intensity"]
    roof = Roofline.from_rows(rates.ceilings(2**20, 64, ["float32"]), "cpu")
    assert roof.bandwidth > 0 and roof.peak("float32") > 0


def test_recording_round_trip_and_staleness(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    recording = recordings.run("blas_levels", blas.levels_sweep, vector_sizes=[256], matrix_sizes=[16],
                               dtypes=["float32"])
    assert not recording.provenance.get("recorded") and recording.label.endswith("live")
    path = recordings.save(recording)
    assert path.parent.parent == tmp_path and path.name == "blas_levels.json"
    loaded = recordings.load("blas_levels")
    assert loaded.rows == json.loads(json.dumps(recording.rows)) and loaded.label.startswith(recording.device_name)
    assert {"device", "date", "git_commit", "code"} <= set(loaded.provenance)
    assert not recordings.is_stale(loaded) and recordings.stale_recordings() == []
    [row] = recordings.inventory()
    assert (row["gpu"], row["experiment"], row["stale"]) == (recording.device_name, "blas_levels", False)
    data = json.loads(path.read_text())
    data["provenance"]["code"]["parts"]["gpulab.core.rates.measure_blas"] = "0" * 12
    data["provenance"]["code"]["hash"] = "0" * 16
    path.write_text(json.dumps(data))
    [stale] = recordings.stale_recordings()
    assert stale.path == path and stale.changes == ("gpulab.core.rates.measure_blas changed",)
    assert recordings.inventory()[0]["stale"]
    assert recordings.load("no-such-experiment") is None


def test_committed_recordings_are_complete():
    """Every recording under results/ has rows and provenance (their freshness: tests/unit/test_provenance.py)."""
    for recording_path in sorted(recordings.results_dir().glob("*/*.json")):
        data = json.loads(recording_path.read_text())
        assert data["rows"] and data["provenance"]["device"]["kind"] == "cuda", recording_path
        assert {"date", "code", "git_commit"} <= set(data["provenance"]), recording_path


def test_renderer_emits_plotly_json_and_html():
    fig = plots.sweep_figure([{"n": 1, "y": 2.0, "status": "ok"}, {"n": 2, "status": "out of memory"}],
                             "n", "y", title="t", x_title="n", y_title="y")
    bundle = plots.BookRenderer(config={}).to_mimebundle(fig.to_dict())
    assert "application/vnd.plotly.v1+json" in bundle
    assert "Plotly.newPlot" in bundle["text/html"] and "<script src" not in bundle["text/html"]
    assert any("out of memory at 2" in a.text for a in fig.layout.annotations)


def test_a_figure_with_frames_opens_at_its_first_frame_on_the_page():
    fig = go.Figure(data=[go.Scatter(y=[0])],
                    frames=[go.Frame(name=str(i), data=[go.Scatter(y=[i])]) for i in range(3)])
    html = plots.BookRenderer(config={}).to_mimebundle(fig.to_dict())["text/html"]
    assert "Plotly.addFrames" in html and "Plotly.animate" not in html


def test_roofline_figure_draws_a_roof_per_dtype_and_the_points():
    roof = Roofline("gpu", 1e12, {"float32": 5e13, "float16": 4e14})
    points = [rates.measure_blas("gemm", 32, "float32")]
    assert len(plots.roofline_figure(roof, points).data) == 3  # two roofs, one point


def test_shared_figures_title_every_axis():
    """The book's browser test fails a figure with an untitled axis: the shared builders title theirs."""
    rows = [{"layer": "a", "t": 1.0}, {"layer": "b", "t": 2.0}]
    assert plots.bars_figure(rows, "layer", {"time": "t"}, title="t", y_title="s").layout.xaxis.title.text == "layer"
    named = plots.bars_figure(rows, "layer", {"time": "t"}, title="t", y_title="s", x_title="convolution layer")
    assert named.layout.xaxis.title.text == "convolution layer"
    table = {g: [{"metric": "peak float16", "value": v, "peak": True}] for g, v in (("A", 1.0), ("B", 2.0))}
    comparison = gpu_comparison_figure(table, "A", "B", title="c").layout
    assert comparison.xaxis.title.text and comparison.yaxis.title.text


def test_dot_check_is_relative_to_the_sum_of_magnitudes():
    """A long float32 dot of random data cancels; its error is judged against |x|.|y|, so it passes every time."""
    for _ in range(3):
        assert rates.measure_blas("dot", 2**22, "float32")["relative_error"] < 1e-6


def test_out_of_memory_marks_sit_at_their_size_on_a_log_axis():
    rows = [{"n": 1024, "t": 1.0, "status": "ok"}, {"n": 4096, "t": None, "status": "out of memory"}]
    log = plots.sweep_figure(rows, "n", "t", title="t", x_title="n", y_title="t", log_x=True)
    linear = plots.sweep_figure(rows, "n", "t", title="t", x_title="n", y_title="t")
    assert [a.x for a in log.layout.annotations] == [pytest.approx(math.log10(4096))]
    assert [a.x for a in linear.layout.annotations] == [4096]


def test_bar_labels_have_no_exponent_below_ten_million():
    assert [plots.short_number(v) for v in (3.14159, 999.4, 1061.7, 4_332_000.0, 2.5e9)] == [
        "3.14", "999", "1,062", "4,332,000", "2.5e+09"]


def test_menus_over_the_plot_stand_under_a_title_that_hangs_from_the_top():
    """A menu over the plot never covers the title: the renderer lifts the title to the figure's top edge and
    makes the top margin hold the title's lines (the longest a menu entry sets) and the menus' row."""
    fig = go.Figure(go.Scatter(x=[1], y=[2]), layout=dict(title="A short title", updatemenus=[dict(
        x=0, y=1.14, buttons=[dict(label="b", method="update", args=[{}, {"title.text": "two<br>lines"}])])]))
    plots.pio.renderers[plots.TEMPLATE].to_mimebundle(fig_dict := fig.to_dict())
    layout = fig_dict["layout"]
    assert layout["updatemenus"][0]["y"] == 1 and layout["updatemenus"][0]["yanchor"] == "bottom"
    assert layout["title"]["yref"] == "container" and layout["title"]["yanchor"] == "top"
    assert layout["margin"]["t"] == plots.TITLE_TOP + 2 * plots.TITLE_LINE + 8 + plots.MENU_ROW
    beside = go.Figure(layout=dict(title="t", updatemenus=[dict(x=1.02, y=0.5, buttons=[])]))
    plots.pio.renderers[plots.TEMPLATE].to_mimebundle(beside_dict := beside.to_dict())
    assert beside_dict["layout"]["updatemenus"][0]["y"] == 0.5  # a menu beside the plot stays where it is


def test_a_title_of_three_lines_gets_the_room_the_template_lacks():
    """The template's top margin holds two lines of title; a third (a subtitle under a wrapped title) would run
    into the plot, so the renderer hangs such a title from the top and makes the margin hold every line."""
    three = go.Figure(layout=dict(title="A subject:<br>NVIDIA H100 80GB HBM3, recorded 2026-11-26<br><sub>s</sub>"))
    plots.pio.renderers[plots.TEMPLATE].to_mimebundle(three_dict := three.to_dict())
    assert three_dict["layout"]["title"]["yanchor"] == "top"
    assert three_dict["layout"]["margin"]["t"] == plots.TITLE_TOP + 3 * plots.TITLE_LINE + 8
    two = go.Figure(layout=dict(title="A subject:<br>NVIDIA H200, recorded 2026-11-24"))
    plots.pio.renderers[plots.TEMPLATE].to_mimebundle(two_dict := two.to_dict())
    assert "yanchor" not in two_dict["layout"]["title"]  # two lines: the template's margin, untouched
