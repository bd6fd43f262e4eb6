"""The chapter 'From CPUs to GPUs': its experiments on a CPU, the latency fit, the clock log."""

from __future__ import annotations

import pytest

from gpulab.ch01_cpus_to_gpus import hardware
from gpulab.core import clocks


def test_copy_hierarchy_measures_hot_and_cold_copies_of_each_size():
    rows = hardware.copy_hierarchy([2**16, 2**18])
    assert [(r["cache"], r["nbytes"]) for r in rows] == [("hot", 2**16), ("hot", 2**18), ("cold", 2**16),
                                                        ("cold", 2**18)]
    for row in rows:
        assert row["status"] == "ok" and row["gbytes_per_s"] > 0 and row["copies"] >= 1
        assert row["gbytes_per_s"] == pytest.approx(2 * row["nbytes"] / row["seconds_per_copy"] / 1e9)


def test_latency_fit_recovers_the_model_it_fits():
    t0, bandwidth = 2e-6, 3e12
    rows = [{"cache": "cold", "nbytes": n, "seconds_per_copy": t0 + 2 * n / bandwidth, "status": "ok"}
            for n in (2**16, 2**20, 2**24, 2**28)]
    rows.append({"cache": "hot", "nbytes": 2**20, "seconds_per_copy": 1e-9, "status": "ok"})  # ignored
    fit = hardware.latency_fit(rows)
    assert fit["t0_s"] == pytest.approx(t0, rel=1e-6)
    assert fit["bandwidth"] == pytest.approx(bandwidth, rel=1e-6)
    assert fit["bytes_in_flight"] == pytest.approx(t0 * bandwidth, rel=1e-6)


def test_latency_fit_needs_three_sizes():
    with pytest.raises(ValueError, match="rows: the fit needs at least three"):
        hardware.latency_fit([{"cache": "cold", "nbytes": 4, "seconds_per_copy": 1.0, "status": "ok"}])


def test_bad_sizes_are_refused_with_their_name():
    with pytest.raises(ValueError, match="nbytes: must be a multiple of 4"):
        hardware.measure_copy_level(6, hot=True)
    with pytest.raises(ValueError, match="sizes: must be > 0"):
        hardware.copy_hierarchy([0])


def test_host_transfers_say_they_need_a_gpu(monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    with pytest.raises(ValueError, match="device: host-device transfers need a CUDA GPU"):
        hardware.measure_transfer(2**20, "h2d", "pinned")
    with pytest.raises(ValueError, match="direction: 'h2d' or 'd2h'"):
        hardware.measure_transfer(2**20, "up", "pinned")


def test_peaks_vs_measured_on_a_cpu_has_rates_but_no_peaks(monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    rows = hardware.peaks_vs_measured(64, ["float64", "float32"], 2**16, sustain_s=0.01)
    assert [r["work"] for r in rows] == ["matmul float64", "matmul float32", "copy"]
    for row in rows:
        assert row["measured"] > 0 and "peak" not in row
    assert rows[0]["clock_mhz"] is None  # no nvidia-smi on a CPU


def test_the_clock_log_reads_nvidia_smi_output_and_skips_what_it_cannot_parse():
    log = clocks.ClockLog()
    log.parse("1980, 350.5, 45\n1830, 690.1, 61\n[N/A], [N/A], 40\n1755, 7")
    assert log.sm_mhz == [1980, 1830] and log.power_w == [350.5, 690.1]
    assert log.median("sm_mhz") == 1905
    assert clocks.ClockLog().median("sm_mhz") is None
