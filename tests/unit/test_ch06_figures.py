"""Chapter 06's tables, figures and explorer: the cell's checks, the slides' numbers, the LSTM layer's and the
training step's runs, and the arithmetic of a transformer block."""

from __future__ import annotations

import plotly.io as pio
import pytest

from conftest import shown
from gpulab.ch06_recurrent_and_attention import attention, figures, recurrent
from gpulab.ch06_recurrent_and_attention.explorer import attention_explorer, block_rows
from gpulab.core import plots
from gpulab.core.recordings import Recording


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses


def run(experiment: str, rows: list[dict], device: str = "NVIDIA H200", kind: str = "cuda", **params) -> Recording:
    return Recording(experiment, "f", params, rows, {"device": {"name": device, "kind": kind}, "recorded": True,
                                                    "date": "2026-11-24"})


def test_both_forms_of_the_cell_equal_lstm_cell_and_a_wrong_one_is_caught(monkeypatch):
    rows = recurrent.compare_cell_forms(batch=3, inputs=5, hidden=4)
    assert [r["form"] for r in rows] == ["gate by gate", "one stacked GEMM"]
    assert all(r["difference"] < 1e-12 and r["weight"] == "(16, 9)" for r in rows)
    assert figures.cell_forms_table(rows).cells[0][0] == "gate by gate"
    monkeypatch.setattr(recurrent, "lstm_cell_by_gates", lambda x, h, c, weight, bias: (h, c))
    with pytest.raises(AssertionError, match="gate by gate differs from nn.LSTMCell"):
        recurrent.compare_cell_forms()


def test_the_worked_example_tables_hold_the_slides_numbers():
    forward = figures.forward_table(recurrent.forward_trace())
    assert forward.cells[1] == ["0", "slide", "0.81775", "0.96083", "0.85195", "0.81757", "0.78572", "0.53631"]
    labels = figures.labels_table()
    assert labels.cells[1][:2] == ["+1.25", "-0.47802"] and labels.cells[2][1] == "-0.47803"
    exact = recurrent.compare_with_slides(recurrent.worked_example_values())
    rounded = recurrent.compare_with_slides(recurrent.worked_example_values(rounded=True))
    table = figures.slides_table(exact, rounded)
    assert len(table.cells) == len(recurrent.SLIDE_VALUES)
    flagged = [row[0] for row in table.cells if row[4]]
    assert flagged == [e["quantity"] for e in exact if not e["within_one_unit"]]
    first, second = figures.slides_summary(exact, rounded)
    assert f"{len(exact) - len(flagged)} of {len(exact)}" in first and f"all {len(rounded)}" in second
    with pytest.raises(AssertionError, match="rounded as they did"):
        figures.slides_summary(exact, [{**rounded[0], "within_one_unit": False}])


def test_gradients_table_gives_autograd_and_the_difference():
    by_autograd = recurrent.autograd_gradients()
    by_hand = {**by_autograd, "dW": by_autograd["dW"] + 1e-3}
    table = figures.gradients_table(by_hand, by_autograd)
    assert "dW 1.0e-03, dU 0.0e+00" in table.caption
    assert table.cells[0] == ["a", *(f"{float(v):.5f}" for v in (by_autograd["dW"][0, 0], by_autograd["dW"][0, 1],
                                                                by_autograd["dU"][0, 0], by_autograd["db"][0]))]


def lstm_rows(dtype: str = "float32") -> list[dict]:
    seconds = {"per-step GEMM": 8e-3, "hoisted input GEMM": 6e-3, "torch.nn.LSTM": 1e-3}
    return [{"dtype": dtype, "seq_len": 64, "hidden": 256, "batch": 128, "implementation": name, "seconds": s,
             "ms_per_step": s / 64 * 1e3, "gflops": 100.0, "relative_error": 1e-7, "status": "ok"}
            for name, s in seconds.items()]


def test_lstm_table_and_figure_per_run():
    runs = [run("rnn_lstm_layer", lstm_rows() + lstm_rows("float16"), batch=128),
            run("rnn_lstm_layer", lstm_rows(), "AMD EPYC", kind="cpu", batch=16)]
    table = figures.lstm_table(runs)
    assert [row[0] for row in table.cells] == ["H200", "H200", "this CPU"]
    assert table.cells[0][4:8] == ["125.0", "93.8", "15.6", "8.0"]
    assert figures.lstm_dtypes(runs) == ["float32", "float16"]
    figure = figures.lstm_figure(runs, "float32")
    assert [b.label for b in figure.layout.updatemenus[0].buttons] == ["H200", "this CPU"]
    assert figure.layout.yaxis.title.text.startswith("time per time step")
    assert not figures.lstm_figure(runs, "float16").layout.updatemenus


def profile_rows(precision: str, source: str = "GPU kernels") -> list[dict]:
    shares = {"GEMM": 0.6, "attention (fused)": 0.2, "dropout": 0.2}
    return [{"precision": precision, "source": source, "category": c, "seconds": shares.get(c, 0.0) * 0.01,
             "share": shares.get(c, 0.0), "count": 1.0, "step_seconds": 0.02, "profiled_seconds": 0.01}
            for c in attention.CATEGORIES]


def test_profile_table_sentences_and_figure():
    params = {"layers": 4, "d_model": 1024, "batch": 16, "seq_len": 512}
    runs = [run("attention_training_step", profile_rows("float32") + profile_rows("bfloat16"), **params)]
    table = figures.profile_table(runs)
    assert table.headers[1:3] == ["H200, float32: per step (ms)", "share"]
    assert [row[0] for row in table.cells] == ["GEMM", "attention (fused)", "dropout"]
    assert table.cells[0][1:3] == ["6.00", "60.0%"]
    first, second = figures.profile_sentences(runs)
    assert "float32" in first and "GEMM takes 60%" in first and "together 80%" in first
    assert "a step took 20.00 ms, and the GPU's kernels ran for 50% of it." in first
    figure = figures.profile_figure(runs)
    assert len(figure.data) == 2 and list(figure.data[0].x) == ["GEMM", "attention (fused)", "dropout"]


def test_share_and_parts_figures_mark_the_crossover():
    figure = figures.share_figure([64, 1024, 16384], [512])
    assert figure.layout.annotations[0].text == f"L* = {attention.quadratic_crossover(512, 2048):,}"
    parts = figures.parts_figure([64, 1024], 512, 2048)
    assert {t.name for t in parts.data} == set(attention.BLOCK_PARTS)


def test_block_rows_follow_block_flops():
    rows = block_rows(batch=2, seq_len=64, d_model=128, heads=4, d_ff=512)
    flops = attention.block_flops(2, 64, 128, 512)
    assert [r["gflop"] * 1e9 for r in rows] == pytest.approx(list(flops.values()))
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    scores = next(r for r in rows if r["part"] == "scores QK^T")
    assert scores["gemm"] == "64 x 32 by 32 x 64" and scores["count"] == 8


def test_the_explorer_answers_with_the_block_and_the_lstm_layer():
    explorer = attention_explorer(seq_len=512, d_model=1024, heads=16, batch=16, ff_multiple=4)
    (length, width, heads), (batch, multiple) = (row.children for row in explorer.children[:-1])
    text, (figure,) = shown(explorer.children[-1])
    assert "take over at L* = 2d + d_ff = 6,144 tokens; L = 512 is below it" in text
    assert f"does {recurrent.layer_flops(1024, 512, 16, 1024) / 1e9:,.1f} GFLOP" in text
    assert "one GEMM of 8,192 x 1,024 by 1,024 x 4,096 before the loop" in text
    assert "64 x 512 by 512 x 64" not in text and "scores QK^T" in text
    assert [a["text"] for a in figure["layout"]["annotations"]] == ["L* = 6,144", "L = 512"]
    length.value = 8192
    text, _ = shown(explorer.children[-1])
    assert "L = 8,192 is at or above it" in text
    heads.value = 96  # does not divide 1024
    text, figures_shown = shown(explorer.children[-1])
    assert text.startswith("96 heads do not divide the width d = 1,024") and not figures_shown
    width.value, multiple.value, batch.value = 12288, 4, 1
    text, _ = shown(explorer.children[-1])
    assert "L* = 2d + d_ff = 73,728 tokens" in text and "1 x 8,192 tokens" in text
