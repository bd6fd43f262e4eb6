"""Chapter 11's page: its tables, sentences and figures from given runs, and the loss-scale explorer."""

from __future__ import annotations

import plotly.io as pio
import pytest

from conftest import shown
from gpulab.ch11_mixed_precision import autocast, figures
from gpulab.ch11_mixed_precision.explorer import best_scale, loss_scale_explorer
from gpulab.core import plots, recordings
from gpulab.core.precision import FORMATS
from gpulab.core.recordings import Recording


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch):
    monkeypatch.setattr(pio.renderers, "default", plots.TEMPLATE)  # the renderer a kernel uses


def run(name: str, rows: list[dict], params: dict | None = None, kind: str = "cuda") -> Recording:
    provenance = {"device": {"name": name, "kind": kind}, "date": "2026-11-25T10:00:00+00:00",
                  "recorded": kind == "cuda"}
    return Recording("demo", "gpulab.x:y", params or {}, rows, provenance)


def cells(t) -> list[dict]:
    return [dict(zip(t.headers, row, strict=True)) for row in t.cells]


def autocast_rows(device: str, treatment: dict[str, str]) -> list[dict]:
    return [{"device": device, "autocast_dtype": "bfloat16", "op": op, "treatment": treatment.get(op, "casts"),
             "status": "ok"} for op, *_ in autocast.AUTOCAST_OPS]


def test_autocast_a_column_per_device_and_type_and_the_differences_named():
    cuda = run("NVIDIA H200", autocast_rows("cuda", {"softmax": "runs in float32"})
               + [{"device": "cuda", "autocast_dtype": "float16", "status": "not run", "reason": "no float16"}])
    cpu = run("AMD EPYC", autocast_rows("cpu", {"softmax": "follows its input"}), kind="cpu")
    table = cells(figures.autocast_table([cuda, cpu]))
    softmax = next(r for r in table if r["operation"] == "softmax")
    assert softmax["class"] == "reduction" and softmax["H200: autocast bfloat16"] == "runs in float32"
    assert softmax["this CPU: autocast bfloat16"] == "follows its input"
    said = figures.autocast_notes([cuda, cpu])
    assert said[0].endswith("autocast float16 not run: no float16.")
    assert said[1] == "Operations that CUDA's and the CPU's autocast treat differently: `softmax`."
    assert figures.autocast_notes([cpu]) == ["Only CPU autocast is shown here; its lists are that device's."]


def test_master_weights_table_says_the_exact_result():
    t = figures.master_weights_table(autocast.master_weight_updates(1.0, 1e-4, 1000))
    assert t.caption == "w = 1, 1,000 updates of 0.0001: the exact result is 0.9"
    assert cells(t)[0]["after all"] == "1.000000" and cells(t)[2]["after all"].startswith("0.8999")


HISTOGRAM = [{"gradients": kind, "log2_magnitude": e, "count": 1, "share": 0.25, "values": 8, "zeros": 4}
             for kind in ("activation", "weight") for e in (-30, -20, -5, 20)]


def test_a_format_s_range_in_whole_bins():
    assert figures.edges(FORMATS["float16"]) == {"zero": -25, "normal": -14, "overflow": 16}
    rows = HISTOGRAM[:4]
    assert figures.shares(rows, FORMATS["float16"]) == {"zero": 0.25, "subnormal": 0.25, "normal": 0.25,
                                                        "overflow": 0.25}
    assert figures.shares(rows, FORMATS["float16"], 8) == {"zero": 0.0, "subnormal": 0.25, "normal": 0.5,
                                                           "overflow": 0.25}
    assert figures.shares(rows, FORMATS["bfloat16"])["normal"] == 1.0
    assert figures.range_sentence() == ("float16: smallest subnormal 5.96e-08 = 2^-24, smallest normal 6.1e-05 = "
                                        "2^-14, largest 65504.")
    (row, _) = figures.histogram_rows(run("NVIDIA H200", HISTOGRAM), FORMATS["float16"])
    assert row["zeros"] == 0.5 and row["largest"] == 21
    table = cells(figures.histogram_table([run("NVIDIA H200", HISTOGRAM)]))
    assert table[0]["round to 0"] == "25.0%" and table[0]["largest below"] == "2^21"


def test_the_histogram_has_a_menu_per_gpu_beside_the_scale_menu():
    one = figures.histogram_by_gpu([run("NVIDIA H200", HISTOGRAM)], [1.0, 2.0**8])
    assert len(one.layout.updatemenus) == 1 and len(one.layout.updatemenus[0].buttons) == 2
    two = figures.histogram_by_gpu([run("NVIDIA H100 80GB HBM3", HISTOGRAM), run("NVIDIA H200", HISTOGRAM[:4])],
                                   [1.0, 2.0**8])
    (menu,) = two.layout.updatemenus
    assert [b.label for b in menu.buttons] == [f"{gpu}: float16 ranges at loss scale 2^{s}" for gpu in
                                               ("H100 80GB HBM3", "H200") for s in (0, 8)]
    assert menu.buttons[3].args[0]["visible"] == [False, False, True]
    assert menu.buttons[3].args[1]["shapes"][0]["x1"] == -25 - 8  # float16's zero edge, moved down by the scale
    assert len(two.data) == 3 and two.layout.xaxis.range == (-31, 22)
    assert len(figures.histogram_figure(HISTOGRAM, [1.0], title="t").layout.updatemenus) == 0


UNDERFLOW = [{"gradients": "activation", "log2_scale": s, "cast_flushed": 0.5 / (1 + s), "backward_lost": 0.5,
              "cast_subnormal": 0.1, "backward_not_finite": 0.0 if s < 24 else 0.5,
              "relative_error": None if s >= 24 else 2e-3} for s in (0, 8, 24)]


def test_underflow_table_and_figure():
    runs = [run("NVIDIA H200", UNDERFLOW)]
    table = cells(figures.underflow_table(runs))
    assert [r["loss scale"] for r in table] == ["2^0", "2^8", "2^24"]
    assert table[0]["predicted 0"] == "50.00%" and table[0]["error of the unscaled gradients"] == "2.00e-03"
    assert table[2]["error of the unscaled gradients"] == "none: not finite"
    assert len(figures.underflow_by_gpu(runs).data) == 3


def test_the_trace_in_a_sentence_and_a_figure():
    rows = [{"step": i + 1, "loss_scale": 2.0 ** (10 - i), "log2_scale": 10 - i, "skipped": i < 2, "loss": 2 - i / 10}
            for i in range(4)]
    runs = [run("NVIDIA H200", rows, {"growth_interval": 10})]
    (said,) = figures.trace_summary(runs)
    assert "started at 2^10; the first update at step 3, with a scale of 2^8; 2 of 4 steps skipped" in said
    figure = figures.trace_by_gpu(runs)
    assert "growth interval 10" in figure.layout.title.text and figure.data[1].hovertext
    with pytest.raises(AssertionError, match="skipped every step"):
        figures.trace_summary([run("NVIDIA H200", [{**r, "skipped": True} for r in rows])])


def precision_rows(precision: str, label: str, seconds: float, accuracy: float) -> list[dict]:
    return [{"precision": precision, "label": label, "seed": s, "steps": 30, "batch": 64, "step_seconds": seconds,
             "peak_memory_bytes": 2**20, "test_accuracy": accuracy + s / 1000, "test_samples": 1000,
             "skipped_steps": 0, "status": "ok", "first_loss_error": 1e-5, "majority_share": 0.125}
            for s in range(2)]


def test_the_precisions_tables_and_verdicts():
    rows = (precision_rows("float32", "float32 (TF32 off)", 0.01, 0.8)
            + precision_rows("bfloat16", "bfloat16 AMP", 0.004, 0.8)
            + [{"precision": "tf32", "label": "TF32", "status": "not run", "reason": "a GPU mode"}])
    params = {"inputs": 16, "width": 32, "depth": 2, "batch": 64}
    runs = [run("NVIDIA H200", rows, params)]
    table = cells(figures.precisions_table(runs))
    assert table[0]["precision"] == "TF32" and table[0]["note"] == "not run: a GPU mode"
    bf16 = next(r for r in table if r["precision"] == "bfloat16 AMP")
    assert bf16["speed-up"] == "2.50" and bf16["within the noise"] == "same" and bf16["steps x batch"] == "30 x 64"
    assert bf16["peak memory"] == "1.0 MiB" and bf16["accuracy (%)"] == "80.05"
    rates = cells(figures.wide_rates_table(runs))
    assert {r["precision"] for r in rates} == {"TF32", "float32 (TF32 off)", "bfloat16 AMP"}
    assert next(r for r in rates if r["precision"] == "bfloat16 AMP")["peak / float32's"] == "14.8x"
    assert figures.wide_rates_table([]).caption.startswith("the peaks of the H200")
    (said,) = figures.wide_verdicts(runs)
    assert "is met: bfloat16 is 2.5x faster" in said and "would score 12.5%" in said
    figure = figures.precisions_by_gpu(runs)
    assert figure.layout.title.text.startswith("Wide MLP 16 -> 32 x 2 -> 10") and len(figure.data) == 2
    assert figures.tolerance_sentence(["float32", "bfloat16"]) == (
        "Tolerance of the first losses against float32's: bfloat16 0.05.")


def test_the_best_scale_overflows_nothing():
    rows = HISTOGRAM[:4]  # the largest bin is 2^20: float16 overflows from 2^16, so no scale of 2^0 or more fits
    assert best_scale(rows, "float16") == (-5, 0.25)  # at 2^-5 the bin of 2^-30 rounds to 0, 2^20 just fits
    assert best_scale(rows, "float16", range(0, 10)) is None
    assert best_scale(rows, "bfloat16")[0] == 47


def test_the_loss_scale_explorer_answers_from_the_recordings():
    recorded = recordings.newest_per_gpu("amp_gradient_histogram")
    explorer = loss_scale_explorer(log2_scale=0, fmt="float16")
    scale, fmt = explorer.children[0].children
    text, figures_shown = shown(explorer.children[-1])
    assert "rounds to 0 below 2^-25" in text and "overflows from 2^16 on (65504 over S)" in text
    for recording in recorded:
        row = figures.histogram_rows(recording, FORMATS["float16"])[0]
        assert f"{row['zero']:.1%}" in text and "the largest scale that overflows none" in text
    assert len(figures_shown) == (1 if recorded else 0)
    scale.value = 8
    text, _ = shown(explorer.children[-1])
    assert "rounds to 0 below 2^-33" in text and "overflows from 2^8 on" in text
    fmt.value = "float8_e4m3fn"
    text, _ = shown(explorer.children[-1])
    assert "float8_e4m3fn at a loss scale S = 2^8" in text and "(448 over S)" in text
    scale.value = 10**6  # clamped by the slider
    assert scale.value == scale.max
