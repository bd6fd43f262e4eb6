"""Chapter 16's view of tensor, pipeline and sharded parallelism measured on several GPUs (machines) and the claims
it states: values from the H100 recordings (four H100s), and each claim failing on a recording that contradicts it."""

from __future__ import annotations

import copy

import pytest

from gpulab.ch16_distributed_training import claims, machines
from gpulab.core import recordings
from gpulab.core.recordings import Recording


def run_of(experiment: str, change=None) -> Recording:
    source = recordings.load(experiment, "H100")
    rows = copy.deepcopy(source.rows)
    for row in rows:
        if change:
            change(row)
    return Recording(experiment, source.function, dict(source.params), rows, dict(source.provenance))


def test_speedup_is_p_times_the_efficiency_and_the_figure_has_a_menu_per_configuration():
    run = run_of(machines.SCALING)
    row = next(r for r in run.rows if r["strategy"] == "tensor" and r["devices"] == 4)
    assert machines.speedup(row) == pytest.approx(row["single_seconds"] / row["seconds"])  # strong: t1 / tp
    fig = machines.speedup_figure([run])
    configs = machines.configurations(run)
    assert len(fig.layout.updatemenus[0].buttons) == len(configs) == 4
    assert len(fig.data) == len(configs) * (len(machines.LABELS) + 1)  # a line per method and the ideal
    assert [t.x for t in fig.data if t.visible][0][0] == 1  # every line starts at one GPU, speed-up 1
    shown = fig.layout.updatemenus[0].active  # the case the sentences under the figure describe
    assert fig.layout.updatemenus[0].buttons[shown].label == "float32, batch 4,096"


def test_memory_rows_share_the_state_as_one_over_p():
    rows = machines.memory_rows(run_of(machines.SCALING))
    assert {r["devices"] for r in rows} == {2, 4}
    for r in rows:
        assert r["state_share"] == pytest.approx(1 / r["devices"], rel=0.01)


def test_bubble_statements_count_the_gaps_of_the_most_micro_batches():
    said = machines.bubble_statements([run_of(machines.BUBBLE)])
    assert len(said) == 2 and "with 16, " in said[0] and "such gaps" in said[0]
    fig = machines.measured_timeline(run_of(machines.BUBBLE), devices=4, micro_batches=8)
    assert fig.layout.xaxis.title.text == "time (ms)"
    with pytest.raises(KeyError, match="no pipelined step on 8 GPUs"):
        machines.measured_timeline(run_of(machines.BUBBLE), devices=8, micro_batches=8)


@pytest.mark.parametrize(("claim", "experiment", "change"), [
    (claims.WEAK_SCALING_TARGET, machines.SCALING,
     lambda r: r.update(efficiency=0.8) if r["strategy"] == "fsdp" and r["precision"] == "float32" else None),
    (claims.EVERY_METHOD_WORSE_IN_BFLOAT16, machines.SCALING,
     lambda r: r.update(efficiency=0.99) if r["precision"] == "bfloat16" and r["strategy"] == "ddp" else None),
    (claims.TENSOR_BEATS_PIPELINE, machines.SCALING,
     lambda r: r.update(efficiency=0.6) if r["strategy"] == "pipeline" else None),
    (claims.FSDP_FIXED_COST, machines.SCALING,
     lambda r: r.update(seconds=2 * r["single_seconds"]) if r["strategy"] == "fsdp" else None),
    (claims.FSDP_STATE_SHARDED, machines.SCALING,
     lambda r: r.update(state_bytes=r["state_bytes"] * 1.5) if r["strategy"] == "fsdp" else None),
    (claims.BUBBLE_GROWS_APART, machines.BUBBLE,
     lambda r: r.update(bubble=r["bubble_formula"] * 1.5) if r["micro_batches"] == 16 else None),
    (claims.ONE_F_ONE_B_HOLDS_LESS, machines.BUBBLE,  # messages kept to the end of the step: equal peaks
     lambda r: r.update(peak_memory_bytes=10**9) if r["micro_batches"] == 16 else None),
])
def test_each_claim_holds_on_the_recording_and_fails_on_a_contradicting_one(claim, experiment, change):
    assert claim.test(run_of(experiment)).holds
    assert not claim.test(run_of(experiment, change)).holds
