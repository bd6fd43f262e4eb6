"""make gpu-run's timing-fidelity check: each work's timers may differ by its own limit (a copy 3%, a matmul at the
power limit 5%), and every recorded GPU's timing_fidelity recording passes it."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import gpu_run  # noqa: E402  (tools/ is not a package)


def rows(matmul: float, copy: float) -> list[dict]:
    return [{"work": "matmul 4096^3 float16", "difference": matmul}, {"work": "copy 1 GiB", "difference": copy}]


@pytest.mark.parametrize("matmul, copy, beyond", [
    (-0.032, 0.0, []),  # the 4-GPU H100's recording: a matmul 3.2% faster passes
    (0.049, -0.029, []),
    (-0.06, 0.0, ["matmul 4096^3 float16"]),  # past the matmul's 5%
    (0.0, 0.035, ["copy 1 GiB"]),  # the copy is held to 3%
    (0.5, -0.5, ["matmul 4096^3 float16", "copy 1 GiB"]),  # a broken timer
])
def test_each_work_is_held_to_its_own_limit(matmul, copy, beyond):
    assert gpu_run.fidelity_beyond(rows(matmul, copy)) == beyond


def test_every_recorded_gpu_passes():
    recorded = sorted((ROOT / "results").glob("*/timing_fidelity.json"))
    assert recorded
    for path in recorded:
        assert gpu_run.fidelity_beyond(json.loads(path.read_text())["rows"]) == [], path.parent.name
