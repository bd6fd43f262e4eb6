"""The GPU table: derived peaks against the vendors' published figures, and matching the device by name."""

from __future__ import annotations

import pytest

from conftest import shown
from gpulab.ch01_cpus_to_gpus.explorer import gpu_comparison
from gpulab.core import specs

# Published dense peaks (TFLOP/s; TOPS for int8), from the whitepapers and datasheets cited in the
# table's `source` keys. Each derived peak must come within 1.5%.
PUBLISHED = {
    "V100 SXM2 32GB": {"float16": 125, "float32": 15.7, "float64": 7.8},
    "V100 PCIe 32GB": {"float16": 112, "float32": 14, "float64": 7},
    "T4": {"float16": 65, "float32": 8.1, "int8": 130},
    "A100 SXM4 40GB": {"float16": 312, "bfloat16": 312, "tf32": 156, "float32": 19.5, "float64": 19.5, "int8": 624},
    "A100 PCIe 80GB": {"float16": 312, "tf32": 156, "float32": 19.5},
    "RTX 3090": {"float32": 35.6, "tf32": 35.6, "float16": 71, "float16/acc16": 142, "int8": 284},
    "L4": {"float32": 30.3, "tf32": 60, "float16": 121, "float8": 242.5, "int8": 242.5},
    "H100 SXM5 80GB": {"bfloat16": 989.4, "float16": 989.4, "tf32": 494.7, "float8": 1978.9, "float32": 66.9,
                       "float64": 66.9},
    "H100 PCIe 80GB": {"bfloat16": 756, "tf32": 378, "float8": 1513, "float32": 51.2, "float64": 51.2},
    "H200 SXM 141GB": {"bfloat16": 989.5, "float8": 1979, "float32": 67, "float64": 67},
}
# The H200 datasheet rounds the H100 whitepaper's 33.5 (the same chip and clock) to 34.
PUBLISHED_CUDA_CORE_FP64 = {"A100 SXM4 40GB": 9.7, "H100 SXM5 80GB": 33.5, "H200 SXM 141GB": 33.5,
                            "V100 SXM2 32GB": 7.8}


@pytest.mark.parametrize(("name", "precision", "published"),
                         [(n, p, v) for n, rates in PUBLISHED.items() for p, v in rates.items()])
def test_derived_peak_matches_the_published_figure(name, precision, published):
    derived = specs.peak(specs.gpu(name), precision).tflops
    assert derived == pytest.approx(published, rel=0.015)


@pytest.mark.parametrize(("name", "published"), PUBLISHED_CUDA_CORE_FP64.items())
def test_fp64_on_the_cuda_cores(name, published):
    assert specs.peak(specs.gpu(name), "float64", specs.CUDA_CORES).tflops == pytest.approx(published, rel=0.015)


def test_the_course_worked_examples():
    v100 = specs.peak(specs.gpu("V100 SXM2 32GB"), "float16")
    assert (v100.sms, v100.fma_per_clock_per_sm * 2, v100.clock_ghz) == (80, 1024, 1.53)
    a100 = specs.peak(specs.gpu("A100 SXM4 40GB"), "float16")
    assert (a100.sms, a100.fma_per_clock_per_sm * 2, a100.clock_ghz) == (108, 2048, 1.41)
    assert a100.formula() == "108 SMs x 1,024 FMA/clock x 2 x 1.41 GHz = 311.9 TFLOP/s"
    assert specs.gpu("RTX 3090").cuda_cores == 10496


def test_the_table_has_the_gpus_the_book_promises():
    archs = {row.architecture for row in specs.GPUS.values()}
    assert {"Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper"} <= archs
    for wanted in ("V100", "A100", "H100 SXM", "H100 PCIe", "H200", "T4", "L4", "RTX 3090"):
        assert any(wanted in name for name in specs.GPUS), wanted


def test_every_row_has_the_fields_a_peak_needs():
    for row in specs.GPUS.values():
        assert {"float64", "float32", "int32"} <= set(row.cuda_cores_per_sm), row.name
        assert row.tensor_fma_per_clock and row.tensor_cores_per_sm > 0, row.name
        assert row.bandwidth_gb_s > 0 and row.l2_mb > 0 and row.memory_gb > 0 and row.source, row.name


@pytest.mark.parametrize(("driver_name", "row"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"), ("NVIDIA H100 PCIe", "H100 PCIe 80GB"),
    ("NVIDIA H200", "H200 SXM 141GB"),
    ("Tesla T4", "T4"), ("NVIDIA L4", "L4"), ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"), ("Tesla V100-SXM2-16GB", "V100 SXM2 32GB"),
    ("NVIDIA GeForce RTX 3090", "RTX 3090"),
])
def test_driver_names_find_their_row(driver_name, row):
    assert specs.find(driver_name).name == row


@pytest.mark.parametrize("driver_name", ["NVIDIA H200 NVL", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA A10", "AMD EPYC"])
def test_other_devices_match_no_row(driver_name):
    assert specs.find(driver_name) is None


def test_an_unknown_gpu_is_described_from_the_driver_with_what_is_missing():
    report = specs.DriverReport("NVIDIA RTX 6000 Ada Generation", 142, "8.9", 48 * 2**30, 96 * 2**20, 1536)
    text = specs.describe_unknown(report)
    assert "142 SMs" in text and "8.9" in text and "48.0 GiB" in text and "96 MB of L2" in text
    assert "boost clock" in text and "memory bandwidth" in text and "no peak rate can be derived" in text


def test_bad_names_and_missing_precisions_raise_clear_errors():
    with pytest.raises(ValueError, match="name: no GPU called 'P100'"):
        specs.gpu("P100")
    with pytest.raises(ValueError, match="precision: the T4 .* has no tf32"):
        specs.peak(specs.gpu("T4"), "tf32")


def test_on_a_cpu_nothing_is_present(monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    assert specs.present() is None
    assert "No GPU here" in specs.summary()


def test_comparison_rows_and_ratios():
    rows = {r["metric"]: r for r in specs.comparison(specs.gpu("V100 SXM2 32GB"), specs.gpu("A100 SXM4 40GB"))}
    assert rows["SMs"]["ratio"] == pytest.approx(108 / 80)
    assert rows["peak float16"]["ratio"] == pytest.approx(312 / 125, rel=0.01)
    assert rows["peak tf32"]["a"] is None and rows["peak tf32"]["ratio"] is None


def test_the_comparison_widget_redraws_for_the_chosen_gpus():

    explorer = gpu_comparison("V100 SXM2 32GB", "A100 SXM4 40GB")
    (_first, second), output = explorer.children[0].children, explorer.children[1]
    assert "1.35x" in shown(output)[0]  # 108 SMs against 80
    second.value = "V100 SXM2 32GB"
    assert "1.35x" not in shown(output)[0] and "1.00x" in shown(output)[0]


def test_the_cpu_peak_is_derived():
    cpu = specs.THREADRIPPER_3970X
    assert cpu.peak_tflops == pytest.approx(32 * 3.7 * 32 / 1e3)


def test_peak_tflops_is_none_where_a_gpu_lacks_the_precision():
    assert specs.peak_tflops(specs.gpu("T4"), "tf32") is None
    a100 = specs.gpu("A100 SXM4 40GB")
    assert specs.peak_tflops(a100, "tf32") == specs.peak(a100, "tf32").tflops
