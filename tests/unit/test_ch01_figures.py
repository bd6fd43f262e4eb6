"""Chapter 01's tables and figures: the hardware table's, and those drawn from recordings of several GPUs."""

from __future__ import annotations

import pytest

from conftest import shown
from gpulab.ch01_cpus_to_gpus import figures
from gpulab.ch01_cpus_to_gpus.explorer import gpu_comparison
from gpulab.core import specs
from gpulab.core.recordings import Recording


def recording(experiment: str, device: str, rows: list[dict]) -> Recording:
    return Recording(experiment, "gpulab.ch01_cpus_to_gpus.hardware:x", {}, rows, {
        "device": {"name": device, "kind": "cuda", "multiprocessors": 132}, "date": "2026-01-02", "recorded": True})


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def test_the_cpu_and_gpu_table_derives_both_peaks():
    cpu, rtx = specs.THREADRIPPER_3970X, specs.gpu("RTX 3090")
    rows = cells(figures.cpu_gpu_table(cpu, rtx))
    assert [r["peak FP32 (TFLOP/s)"] for r in rows] == ["3.8", "35.6"]
    assert rows[1]["threads in flight"] == f"{82 * 1536:,}"
    said = figures.cpu_gpu_peaks(cpu, rtx)
    assert said[0].startswith("CPU: 32 cores x 3.7 GHz x 32 FLOP/cycle = 3.79 TFLOP/s")
    assert "float16/acc16: 82 SMs x 512 FMA/clock" in said[1] and "9x the arithmetic" in said[2]


def test_the_sm_table_has_a_column_per_gpu_and_a_row_per_figure():
    table = figures.sm_generations_table(["V100 SXM2 32GB", "H100 SXM5 80GB"])
    assert table.headers == ["hardware figure", "V100 SXM2 32GB", "H100 SXM5 80GB"]
    rows = {row[0]: row[1:] for row in table.cells}
    assert rows["FP16 FMA per clock per SM"] == ["512", "2,048"] and rows["L2 cache (MB)"] == ["6", "50"]
    assert len(table.cells) == len(figures.SM_FIGURES)


def test_the_tensor_core_table_multiplies_the_figures_out():
    rows = cells(figures.tensor_core_peaks_table(["A100 SXM4 40GB"]))
    assert rows[0]["FMA per clock per SM"] == "1,024" and rows[0]["FLOP per clock per SM"] == "2,048"
    assert rows[0]["float16 peak"].endswith("= 311.9 TFLOP/s")


def test_the_peaks_table_lists_every_gpu_and_marks_missing_units():
    rows = {r["GPU"]: r for r in cells(figures.peaks_table())}
    assert list(rows) == list(specs.GPUS)
    assert rows["T4"]["tf32 (TFLOP/s)"] == "–" and rows["T4"]["int8 (TOPS)"] == "130.3"


def test_measured_tables_stack_every_gpu():
    rows = [{"work": "matmul float16", "dtype": "float16", "status": "ok", "measured": 600.0, "unit": "TFLOP/s",
             "peak": 989.4, "fraction": 0.606, "sustained": 590.0, "clock_mhz": 1400.0, "power_w": 690.0,
             "peak_at_clock": 757.0, "fraction_at_clock": 0.78, "unit_kind": "tensor cores", "formula": "f16"},
            {"work": "copy", "status": "ok", "measured": 3000.0, "unit": "GB/s", "peak": 3350, "fraction": 0.9},
            {"work": "matmul float8", "dtype": "float8", "status": "out of memory"}]
    runs = [recording("hardware_peaks", "NVIDIA H100 80GB HBM3", rows), recording("hardware_peaks", "NVIDIA H200",
                                                                                    rows)]
    table = cells(figures.measured_table(runs))
    assert [r["GPU"] for r in table] == ["H100 80GB HBM3"] * 3 + ["H200"] * 3
    assert table[0]["of the peak"] == "61%" and table[0]["sustained, of the peak at that clock"] == "78%"
    assert table[1]["sustained (TFLOP/s)"] == "–" and table[2]["work"] == "matmul float8 (out of memory)"
    formulas = cells(figures.recorded_formulas_table(runs))
    assert [(r["GPU"], r["peak from the hardware"]) for r in formulas] == [("H100 80GB HBM3", "f16"), ("H200", "f16")]
    fig = figures.peaks_figure(runs)
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["H100 80GB HBM3", "H200"]
    assert len(fig.data) == 6 and fig.layout.yaxis.type == "log"  # three bars per GPU: only the matmul with a peak


def hierarchy_rows(t0: float = 2e-6, bandwidth: float = 3e12) -> list[dict]:
    rows = []
    for cache in ("hot", "cold"):
        for n in (2**16, 2**20, 2**24, 2**28):
            seconds = t0 + 2 * n / (bandwidth * (1.5 if cache == "hot" else 1))
            rows.append({"cache": cache, "nbytes": n, "seconds_per_copy": seconds, "copies": 1, "status": "ok",
                         "gbytes_per_s": 2 * n / seconds / 1e9})
    return rows


def test_levels_table_sets_each_level_against_device_memory():
    hierarchy = [recording("hardware_copy_hierarchy", "NVIDIA H200", hierarchy_rows())]
    host = [{"direction": d, "memory": m, "nbytes": 2**20, "gbytes_per_s": 50.0 if m == "pinned" else 10.0,
             "status": "ok"} for d in ("h2d", "d2h") for m in ("pinned", "pageable")]
    transfers = [recording("hardware_host_transfers", "NVIDIA H200", host)]
    rows = cells(figures.levels_table(hierarchy, transfers))
    assert [r["level"] for r in rows] == ["cache (hot copies)", "device memory (cold copies)", "host h2d, pinned",
                                          "host h2d, pageable", "host d2h, pinned", "host d2h, pageable"]
    cold = max(r["gbytes_per_s"] for r in hierarchy_rows() if r["cache"] == "cold")
    assert rows[1]["against device memory"] == "the reference"
    assert rows[0]["against device memory"].endswith("x faster")
    assert rows[2]["against device memory"] == f"{cold / 50:,.0f}x slower"
    other_gpu = [recording("hardware_host_transfers", "NVIDIA H100 80GB HBM3", host)]
    assert len(figures.levels_table(hierarchy, other_gpu).cells) == 2  # host copies only of the same GPU


def test_latency_table_and_figure_read_the_fit():
    runs = [recording("hardware_copy_hierarchy", "NVIDIA H200", hierarchy_rows())]
    [row] = cells(figures.latency_table(runs))
    assert row["t0 (µs)"] == "2.00" and row["B (GB/s)"] == "3,000"
    resident = 132 * 2048
    assert row["resident threads (SMs x threads per SM)"] == f"{resident:,}"
    assert row["B t0 per thread (bytes)"] == f"{2e-6 * 3e12 / resident:,.0f}"
    fig = figures.latency_figure(runs)
    assert [t.name for t in fig.data] == ["measured (cold)", "t0 + m / B"]
    assert "B t0 = 5.7 MiB" in fig.layout.annotations[0].text


def test_a_fit_without_a_positive_latency_is_drawn_without_the_model():
    rows = [{**r, "seconds_per_copy": 2 * r["nbytes"] / 3e12 - 1e-6} for r in hierarchy_rows()]
    runs = [recording("hardware_copy_hierarchy", "NVIDIA H200", rows)]
    assert cells(figures.latency_table(runs))[0]["t0 (µs)"] == "–"
    assert [t.name for t in figures.latency_figure(runs).data] == ["measured (cold)"]


def test_hierarchy_and_host_figures_mark_the_datasheet():
    runs = [recording("hardware_copy_hierarchy", "NVIDIA H200", hierarchy_rows())]
    fig = figures.hierarchy_figure(runs)
    assert "datasheet HBM3e: 4,800 GB/s" in {a.text for a in fig.layout.annotations}
    host = [{"direction": "h2d", "memory": "pinned", "nbytes": 2**20, "seconds": 1e-4, "gbytes_per_s": 10.0,
             "status": "ok"}]
    fig = figures.host_copies_figure([recording("hardware_host_transfers", "NVIDIA H200", host)])
    assert any("PCIe 5.0 x16" in a.text for a in fig.layout.annotations)
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_the_comparison_explorer_shows_a_table_of_both_gpus_and_their_ratio():
    explorer = gpu_comparison("V100 SXM2 32GB", "A100 SXM4 40GB")
    (first, second), output = explorer.children[0].children, explorer.children[-1]
    text, plotted = shown(output)
    assert not plotted and "A: V100 SXM2 32GB" in text and "B: A100 SXM4 40GB" in text
    sms = next(line for line in text.splitlines() if line.startswith("SMs"))
    assert sms.split() == ["SMs", "80", "108", "1.35x"]
    tf32 = next(line for line in text.splitlines() if line.startswith("peak tf32"))
    assert tf32.split() == ["peak", "tf32", "–", "155.9", "–"]  # a V100 has no tf32: no ratio either
    first.value = "A100 SXM4 40GB"
    assert "1.35x" not in shown(output)[0]
    with pytest.raises(Exception):  # noqa: B017 -- a name outside the table is refused by the dropdown itself
        second.value = "no such GPU"
