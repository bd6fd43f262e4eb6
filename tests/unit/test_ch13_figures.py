"""Chapter 13's figures and tables: built from runs (every recorded GPU behind a menu, a GPU column in the tables),
their cells and sentences read from the rows."""

from __future__ import annotations

import copy

import pytest

from gpulab.ch13_memory_bound_layers_and_fusion import attention_figures, blocked_attention, figures, fusion
from gpulab.core import recordings
from gpulab.core.recordings import Recording


def run_of(experiment: str, device: str = "NVIDIA H200", recorded: bool = True, rows=None) -> Recording:
    """The H200's recording of ``experiment``, as if made on ``device`` (recorded, or a live run)."""
    source = recordings.load(experiment, "H200")
    provenance = {"device": {"name": device, "kind": "cuda"}, "date": "2026-11-24", "recorded": recorded}
    return Recording(experiment, source.function, dict(source.params), copy.deepcopy(rows or source.rows),
                     provenance)


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def test_layer_costs_table_counts_per_element():
    rows = {r["layer or chain"]: r for r in cells(figures.layer_costs_table())}
    assert rows["ReLU"]["work (FLOP per element)"] == "1" and rows["ReLU"]["traffic (bytes per element)"] == "8"
    assert rows["ReLU"]["arithmetic intensity (FLOP/byte)"] == "0.125"
    assert rows["bias + GELU + dropout (eager)"]["traffic (bytes per element)"] == "25"
    assert rows["bias + GELU + dropout (fused)"]["traffic (bytes per element)"] == "8"
    assert rows["residual add + LayerNorm (eager)"]["operations counted"] == "x + residual -> LayerNorm, a kernel each"


def test_datasheet_ridges_per_recorded_gpu_and_the_h200_without_one():
    runs = [run_of("fusion_roofline"), run_of("fusion_roofline", "NVIDIA H100 80GB HBM3")]
    both = cells(figures.datasheet_ridges(runs))
    assert [r["GPU"] for r in both] == ["H200 SXM 141GB"] * 2 + ["H100 SXM5 80GB"] * 2
    assert both[0]["precision (units)"] == "float32 (CUDA cores)" and both[0]["ridge point (FLOP/byte)"] == "14"
    assert [r["GPU"] for r in cells(figures.datasheet_ridges([]))] == ["H200 SXM 141GB"] * 2
    assert len(cells(figures.datasheet_ridges([run_of("fusion_roofline", "Some Future GPU")]))) == 2


def test_roofline_tables_figure_and_sentences_per_gpu():
    runs = [run_of("fusion_roofline"), run_of("fusion_roofline", "NVIDIA H100 80GB HBM3")]
    runs[1].rows[0]["gbytes_per_s"] = 3000.0  # the H100's copy
    ceilings = cells(figures.ceilings_table(runs))
    assert [r["GPU"] for r in ceilings] == ["H200", "H100 80GB HBM3"]
    assert ceilings[0]["device copy (GB/s)"] == "4,244" and ceilings[1]["device copy (GB/s)"] == "3,000"
    assert ceilings[0]["float32 matmul (TFLOP/s)"] == "51.3" and ceilings[0]["ridge, bfloat16 (FLOP/byte)"] == "160.2"
    layers = cells(figures.layers_table(runs[:1]))
    relu = next(r for r in layers if r["layer"] == "ReLU")
    assert relu["of the copy"] == "97%" and relu["of the float32 matmul"] == "1.0%"
    fig = figures.layers_roofline_figure(runs)
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["H200", "H100 80GB HBM3"]
    assert "NVIDIA H200, recorded 2026-11-24" in fig.layout.title.text
    assert fig.layout.legend.title.text == "float32, 256.0 MiB per tensor"
    named = [t.name for t in fig.data if t.visible]
    assert "ReLU" in named and "bias + GELU + dropout (fused, CUDA C)" in named
    said = figures.roofline_statements(runs[:1])
    assert said[0].startswith("NVIDIA H200, recorded 2026-11-24: 6 of 6 layers lie left of the lowest ridge")
    assert "3.12x the intensity and 3.46x the rate" in said[1]
    single = figures.layers_roofline_figure(runs[:1])
    assert not single.layout.updatemenus


def test_compile_table_says_why_a_case_did_not_run_and_the_sentences_compare_with_the_bytes():
    run = run_of("fusion_compile")
    run.rows[1] = {**{k: run.rows[1][k] for k in ("chain", "label", "mode", "rows", "cols", "n")},
                   "status": "skipped: turned off (use_compile=False)"}
    rows = cells(figures.compile_table([run]))
    assert rows[1]["mode"] == "torch.compile (skipped: turned off (use_compile=False))"
    assert rows[1]["time (ms)"] == "–" and rows[0]["time (ms)"] == "0.507" and rows[0]["GPU kernels"] == "3"
    said = figures.compile_statements([run])
    assert said[0].endswith("bias + GELU + dropout: no compiled run to compare.")
    assert "compiled, 1.97x eager's speed (the bytes predict 1.67x) after 0.7 s of compiling" in said[1]
    names = cells(figures.kernel_names_table([run]))
    assert [(r["chain"], r["mode"]) for r in names][-1] == ("residual add + LayerNorm", "torch.compile")
    assert names[-1]["kernels launched by one call"] == "triton_red_fused_add_native_layer_norm_0"
    assert len(figures.compile_figure([run, run_of("fusion_compile", "NVIDIA H100 80GB HBM3")]).layout.updatemenus[0]
               .buttons) == 2


def test_hand_kernel_target_meets_or_misses_and_the_table_names_the_launch():
    run = run_of("fusion_hand_kernel")
    assert " meets it with 3,861 GB/s, 91.2%; the variants run from 88.2% to 91.2%." in figures.hand_kernel_target(
        [run])[0]
    slow = run_of("fusion_hand_kernel")
    for r in slow.rows:
        if r["kind"] == "CUDA C":
            r["fraction_of_copy"] = 0.5
    assert " misses it " in figures.hand_kernel_target([slow])[0]
    rows = cells(figures.hand_kernel_table([run]))
    assert rows[0]["launch"] == "grid 4 x 132, block 256 x 1, 57 registers" and rows[4]["launch"] == "compiled in 1.5 s"
    said = figures.hand_kernel_statements([run])[0]
    assert "the erf costs 2.1% of the bandwidth" in said and "8 blocks per SM against 4: +1.2%" in said
    fig = figures.hand_kernel_figure([run])
    assert fig.layout.shapes[0].y0 == pytest.approx(fusion.TARGET_FRACTION * run.rows[-1]["gbytes_per_s"])


def test_horizontal_sentences_use_the_copy_of_the_same_machine_only():
    horizontal, roofline = run_of("fusion_horizontal"), run_of("fusion_roofline")
    said = figures.horizontal_statements([horizontal], [roofline])
    assert "70 GB/s (1.6% of the copy)" in said[0] and "the flat buffer 50.4x" in said[0]
    assert said[-1] == ("From d_model 256 to 1024 the bytes grow 15.9x, the time of one kernel per tensor 0.71x, the "
                        "flat buffer's 13.0x.")
    live = run_of("fusion_roofline", recorded=False)  # a live run on the same GPU is another machine's session
    assert "of the copy" not in figures.horizontal_statements([horizontal], [live])[0]
    table = cells(figures.horizontal_table([horizontal]))
    assert table[0]["time per step (µs)"] == "1,632.6" and table[2]["speed-up over a kernel per tensor"] == "50.37"
    assert [t.name for t in figures.horizontal_figure([horizontal]).data] == list(
        figures.HORIZONTAL_METHODS)


def test_the_online_softmax_table_shows_the_overflow():
    rows = cells(attention_figures.online_softmax_table())
    assert rows[0]["x = 1000"] == "NaN" and rows[1]["x = 1001"] == rows[2]["x = 1001"] == "0.6308"
    assert "1e-15" in attention_figures.online_softmax_error() or "e-16" in attention_figures.online_softmax_error()


def test_blocked_target_checks_the_error_and_the_working_set():
    rows = blocked_attention.blocked_vs_naive(64, 8, [8, 64])
    assert attention_figures.blocked_target(rows).startswith("Target (relative error at most 1e-06) met")
    assert cells(attention_figures.blocked_table(rows))[0]["block"] == "8"
    with pytest.raises(AssertionError, match="relative error"):
        attention_figures.blocked_target([{**rows[0], "relative_error": 1e-3}])
    with pytest.raises(AssertionError, match="working set"):
        attention_figures.blocked_target([{**rows[0], "working_elements": 1}])
    fig = attention_figures.attention_memory_figure(block=128, d=64, sizes=(512, 1024))
    assert [t.y[0] for t in fig.data] == [2 * 512**2, 128 * 128 + 128 * 64 + 2 * 128, 4 * 512 * 64]


def test_attention_tables_figures_and_sentences():
    run, roofline = run_of("fusion_attention"), run_of("fusion_roofline")
    rows = {r["method"]: r for r in cells(attention_figures.attention_methods_table([run]))}
    naive = rows[blocked_attention.METHODS["naive"]]
    assert naive["longest N run"] == "16,384" and naive["out of memory at N"] == "32,768"
    assert rows[blocked_attention.METHODS["sdpa"]]["backend that ran"] == "cuDNN"
    said = attention_figures.attention_statements([run], [roofline])[0]
    assert "SDPA (cuDNN) took 9.43 ms against the naive 66.07 ms (7.0x)" in said
    assert "of which the fastest attention reaches 69%" in said
    time = attention_figures.attention_time_figure([run])
    assert time.layout.yaxis.type == "log" and any("out of memory" in a.text for a in time.layout.annotations)
    # a run that measured no peak memory (a CPU) has no memory figure
    cpu_rows = [{k: v for k, v in r.items() if k != "peak_extra_bytes"} for r in run.rows if r["status"] == "ok"]
    no_peak = run_of("fusion_attention", rows=cpu_rows)
    assert attention_figures.attention_memory_peak_figure([no_peak]).layout.title.text == "No recording yet"
    memory = attention_figures.attention_memory_peak_figure([run, no_peak])
    peak = max((r.get("peak_extra_bytes") or 0) for r in run.rows) / 2**30
    assert not memory.layout.updatemenus and max(max(t.y) for t in memory.data if t.y) == pytest.approx(peak)
