"""Chapter 02's tables and figures: the formats' own, and those drawn from recordings of several GPUs."""

from __future__ import annotations

import math

import pytest

from gpulab.ch02_number_formats import figures, formats, rounding
from gpulab.core.precision import FORMATS
from gpulab.core.recordings import Recording


def recording(experiment: str, device: str, rows: list[dict], **params) -> Recording:
    return Recording(experiment, "gpulab.ch02_number_formats.rounding:x", params, rows, {
        "device": {"name": device, "kind": "cuda"}, "date": "2026-01-02", "recorded": True})


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def test_formats_table_derives_every_limit():
    rows = {r["format"]: r for r in cells(figures.formats_table(FORMATS.values()))}
    assert list(rows) == list(FORMATS)
    assert rows["float16"]["largest"] == "6.55e+04" and rows["bfloat16"]["fraction bits"] == "7"
    assert rows["float8_e4m3fn"]["largest"] == "448"


def test_course_table_finds_the_one_wrong_value_of_the_slide():
    rows = cells(figures.course_table())
    assert len(rows) == sum(len(r) for r in formats.COURSE_TABLE.values())
    assert [(r["format"], r["quantity"]) for r in rows if r["verdict"] == "differs"] == [("bfloat16", "largest")]


def test_the_finfo_check_checks_every_storage_format_and_names_a_wrong_one(monkeypatch):
    assert formats.check_against_finfo() == [name for name, f in FORMATS.items() if f.dtype is not None]
    wrong = {**FORMATS, "float16": FORMATS["bfloat16"].__class__("float16", 5, 9, FORMATS["float16"].dtype)}
    monkeypatch.setattr(formats, "FORMATS", wrong)
    with pytest.raises(AssertionError, match="^float16: derived values differ from torch.finfo"):
        formats.check_against_finfo()


def test_rounding_numbers_table_says_what_went_wrong():
    [row] = cells(figures.rounding_numbers_table([70000.0]))
    assert row["number"] == "70,000" and row["float16"] == "overflow: inf" and row["float32"] == "0.00e+00"
    [row] = cells(figures.rounding_numbers_table([1e-8]))
    assert row["float16"] == "flushed to 0" and float(row["bfloat16"]) < FORMATS["bfloat16"].unit_roundoff
    assert figures.float8_conversion().startswith("torch ") and "float8_e4m3fn" in figures.float8_conversion()


def test_stagnation_table_predicts_where_running_sums_stall():
    rows = cells(figures.stagnation_table(1e-4))
    assert [(r["running sum in"], r["stalls at"]) for r in rows] == [("float16", "0.25"), ("bfloat16", "0.03125"),
                                                                   ("float32", "2048")]


def test_summation_table_and_figure_draw_every_gpu():
    rows = rounding.summation_error([100, 1000], methods=["float16 running sum", "float16 pairwise"])
    runs = [recording("formats_summation", name, rows, sizes=[100, 1000], addend=1e-4)
            for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200")]
    table = cells(figures.summation_table(runs))
    assert [(r["GPU"], r["terms"]) for r in table] == [("H100 80GB HBM3", "1,000")] * 2 + [("H200", "1,000")] * 2
    fig = figures.summation_figure(runs)
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["H100 80GB HBM3", "H200"]
    assert any("stalls at" in t.name for t in fig.data) and fig.layout.yaxis.type == "log"


def test_softmax_tables_read_the_thresholds_and_outcomes():
    rows = rounding.softmax_overflow([4, 12], classes=100, batch=4)
    runs = [recording("formats_softmax", "NVIDIA H200", rows, classes=100)]
    thresholds = {r["naive softmax in"]: r for r in cells(figures.softmax_thresholds_table(runs))}
    assert thresholds["float16"]["NaN from L > ln(largest)"] == f"{math.log(65504):.2f}"
    outcomes = cells(figures.softmax_outcomes_table(runs))
    assert [r["largest logit L"] for r in outcomes] == ["4", "12"]
    assert outcomes[1]["naive float16"] == "NaN" and outcomes[1]["max-subtracted float16"] == "ok"
    fig = figures.softmax_figure(runs)
    assert any(t.name == "naive float16: e^L overflows" for t in fig.data)


def test_matmul_tables_compare_the_tensor_cores_with_the_emulations():
    def row(n, arithmetic, error, predicted=None):
        return {"n": n, "arithmetic": arithmetic, "relative_error": error, "predicted": predicted, "status": "ok"}
    rows = [row(n, a, e * (1 + n / 1e4), p) for n in (256, 512) for a, e, p in (
        ("float32", 1e-6, None), ("tf32 tensor cores", 3e-4, 3e-4), ("tf32 emulated", 3e-4, 3e-4),
        ("tf32 emulated, truncated", 8e-4, 6e-4), ("float16", 3.6e-4, 3.6e-4), ("bfloat16", 2.9e-3, 2.9e-3))]
    runs = [recording("formats_matmul_error", "NVIDIA H200", rows)]
    assert {r["order n"] for r in cells(figures.matmul_error_table(runs))} == {"512"}
    assert figures.matmul_error_ratios(runs)[0].endswith(
        "tf32 tensor cores has 300 times the error of float32; bfloat16 8.1 times that of float16.")
    ratio = {r["arithmetic"]: r["tensor cores / this"] for r in cells(figures.emulation_table(runs))}
    assert ratio == {"tf32 tensor cores": "1.00", "tf32 emulated": "1.00", "tf32 emulated, truncated": "0.37"}  # 3 / 8
    assert figures.emulation_verdict(runs)[0].endswith("closer to 'tf32 emulated'.")
    emulated = [r for r in rows if r["arithmetic"] != "tf32 tensor cores"]
    cpu = [recording("formats_matmul_error", "NVIDIA H200", emulated)]
    assert figures.emulation_table(cpu).cells == [] and figures.emulation_verdict(cpu)[0].startswith("No GPU run")
    fig = figures.matmul_error_figure(runs)
    assert fig.layout.xaxis.title.text == "matrix order n" and len(fig.data) == 6 + 4  # float32, truncated: none


def test_evidence_table_says_pass_or_fail():
    rows = [{"operation": "multiply", "format": "float16", "quantity": "largest relative error", "value": 4e-4,
             "limit": 4.9e-4, "passes": True},
            {"operation": "running sum", "format": "float16", "quantity": "relative error", "value": 1.0,
             "limit": 9.8e-4, "passes": False}]
    table = figures.evidence_table([recording("formats_sixteen_bits", "NVIDIA H200", rows)])
    assert [row[-1] for row in table.cells] == ["passes", "FAILS"] and table.cells[1][4] == "1.00e+00"
