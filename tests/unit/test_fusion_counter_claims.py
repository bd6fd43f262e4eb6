"""Chapter 13's counter claims on the recorded GPUs and on recordings that contradict them."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import ROOT
from gpulab.ch13_memory_bound_layers_and_fusion import claims
from gpulab.core.claims import ClaimFailed, check, verify

GPUS = ("nvidia-h100-80gb-hbm3", "nvidia-h200")


@pytest.fixture
def results(tmp_path, monkeypatch):
    """The recorded kernel_counters of both GPUs, in a folder of their own that a test may edit."""
    for gpu in GPUS:
        (tmp_path / gpu).mkdir()
        shutil.copy(ROOT / "results" / gpu / "kernel_counters.json", tmp_path / gpu)
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    return tmp_path


def _edit_fused(results, gpu, **changes):
    path = results / gpu / "kernel_counters.json"
    data = json.loads(path.read_text())
    data["rows"] = [{**r, **changes} if r["kernel"] == "fused_bias_gelu_dropout" else r for r in data["rows"]]
    path.write_text(json.dumps(data))


def test_which_unit_is_busier_is_said_per_gpu(results):
    checks = check(claims.FUSED_MEMORY_BUSIER, results)
    holds = {c.recording.device_name: c.verdict.holds for c in checks}
    rows = {gpu: next(r for r in json.loads((results / gpu / "kernel_counters.json").read_text())["rows"]
                      if r["kernel"] == "fused_bias_gelu_dropout") for gpu in GPUS}
    assert sorted(holds.values()) == sorted(r["memory_throughput_pct"] > r["sm_throughput_pct"] for r in rows.values())
    for gpu in GPUS:  # SMs busier everywhere: the scoped sentence holds nowhere
        _edit_fused(results, gpu, sm_throughput_pct=99.0)
    with pytest.raises(ClaimFailed, match="fused_memory_busier"):
        verify(claims.FUSED_MEMORY_BUSIER, results)


def test_the_kernel_waits_for_loads_on_every_gpu_or_the_claim_fails(results):
    assert all(c.verdict.holds for c in verify(claims.FUSED_WAITS_FOR_MEMORY, results))
    _edit_fused(results, GPUS[1], top_stalls=[["math_pipe_throttle", 3.0], ["long_scoreboard", 2.0]],
                stalls={"math_pipe_throttle": 3.0, "long_scoreboard": 2.0})
    with pytest.raises(ClaimFailed, match="math_pipe_throttle"):
        verify(claims.FUSED_WAITS_FOR_MEMORY, results)
