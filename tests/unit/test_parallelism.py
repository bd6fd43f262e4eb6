"""Tensor, pipeline and fully sharded parallelism: on paper, and on real gloo processes against one process."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import needs_gpu
from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch16_distributed_training import (
    ddp,
    measured,
    parallel,
    parallel_figures,
    pipeline,
    sharded,
    tensor_parallel,
)
from gpulab.core.correctness import relative_error

SIZES, BATCH, SEED = [12, 16, 8, 8, 5], 8, 3  # four linear layers: two tensor-parallel blocks, or up to four stages

# ---------------------------------------------------------------------------------------------
# On paper


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 1), (2, 4), (3, 5), (4, 4), (4, 16), (8, 3)])
def test_the_bubble_of_unit_time_stages_is_exactly_the_formula(schedule, p, m):
    for forward, backward in ((1.0, 1.0), (1.0, 2.0)):
        rows = pipeline.timeline(p, m, schedule, forward, backward)
        assert len(rows) == 2 * p * m
        assert pipeline.bubble_fraction(rows) == pytest.approx(pipeline.bubble_formula(p, m), abs=1e-12)
        assert max(r["end"] for r in rows) == pytest.approx((m + p - 1) * (forward + backward))
    for stage in range(p):  # 1F1B holds at most p - s micro-batches' activations; GPipe all m
        expected = m if schedule == "gpipe" else min(p - stage, m)
        assert pipeline.peak_activations(stage, p, m, schedule) == expected


def test_pipeline_stage_order_and_cuts():
    assert pipeline.stage_order(0, 2, 3, "1f1b") == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert pipeline.stage_order(1, 2, 2, "gpipe") == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    model = mlp.torch_mlp(SIZES)  # Linear ReLU Linear ReLU Linear ReLU Linear: positions 0 to 6
    # weights per layer 192, 128, 64, 40: the cut that makes the largest stage least is 192 | 232
    assert pipeline.stage_bounds(model, 2) == [(0, 2), (2, 7)] and pipeline.stage_bounds(model, 3)[0] == (0, 2)
    assert [n for n, _ in pipeline.stage_module(model, 1, 2).named_parameters()][0] == "2.weight"
    assert pipeline.sent_bytes(model, 2, BATCH) == [4 * BATCH * 16, 4 * BATCH * 16]
    # four equal layers and a small classifier: two and two on two stages, one each on four
    wide = mlp.torch_mlp([64] * 5 + [3])
    assert pipeline.stage_bounds(wide, 2) == [(0, 4), (4, 9)]
    assert pipeline.stage_bounds(wide, 4) == [(0, 2), (2, 4), (4, 6), (6, 9)]
    with pytest.raises(ValueError, match="^schedule:"):
        pipeline.timeline(2, 2, "zero-bubble")


def test_traffic_and_memory_on_paper():
    t = tensor_parallel.traffic(SIZES, BATCH, 2)  # forward: both blocks' outputs; backward: the second block's input
    assert (t["forward"], t["backward"]) == (2, 1) and t["message_bytes"] == 4 * BATCH * (8 + 5 + 8)
    ddp_bytes = sharded.predicted_state_bytes(SIZES, 4, "ddp")
    fsdp_bytes = sharded.predicted_state_bytes(SIZES, 4, "fsdp")
    parameters = sum((a + 1) * b for a, b in zip(SIZES[:-1], SIZES[1:], strict=False))
    assert ddp_bytes == {"parameter_bytes": 4 * parameters, "gradient_bytes": 4 * parameters,
                         "optimizer_bytes": 8 * parameters}
    # rank 0 holds ceil(rows / 4) of each tensor: a quarter, plus the rounding up of the 5-row last layer
    assert fsdp_bytes["parameter_bytes"] == 4 * ((12 + 1) * 4 + (16 + 1) * 2 + (8 + 1) * 2 + (8 + 1) * 2)
    fsdp_sent, ddp_sent = (sharded.communication_bytes(1000, 4, s) for s in ("fsdp", "ddp"))
    assert fsdp_sent == pytest.approx(1.5 * ddp_sent)
    assert sharded.communication_bytes(1000, 4, "ddp") == pytest.approx(2 * 3 / 4 * 4000)


def test_bad_input_says_what_was_wrong():
    with pytest.raises(ValueError, match="^sizes: the hidden width 16"):
        parallel.parallel_gradients("tensor", SIZES, BATCH, processes=3)
    with pytest.raises(ValueError, match="^stages: 5 stages need at least 5 linear layers"):
        parallel.parallel_gradients("pipeline", SIZES, BATCH, processes=5)
    with pytest.raises(ValueError, match="^micro_batches: the batch of 8 samples does not split into 3"):
        parallel.parallel_gradients("pipeline", SIZES, BATCH, processes=2, micro_batches=3)
    with pytest.raises(ValueError, match="^batch: 8 does not split into 3"):
        parallel.parallel_gradients("fsdp", SIZES, BATCH, processes=3)
    with pytest.raises(ValueError, match="^strategy:"):
        parallel.parallel_gradients("zero", SIZES, BATCH)
    with pytest.raises(ValueError, match="^world size: 3 ranks cannot split a layer's 16 outputs"):
        tensor_parallel.shard_mlp(mlp.torch_mlp(SIZES), 0, 3)
    if torch.cuda.device_count() < 64:
        with pytest.raises(ValueError, match="^processes: nccl runs one process per GPU; 64 asked for"):
            parallel.parallel_scaling(SIZES, [BATCH], processes=(2, 64), backend="nccl")


def test_figures():
    fig = parallel_figures.timeline_figure(pipeline.timeline(4, 4, "1f1b"), title="t")
    assert [trace.name for trace in fig.data] == ["forward", "backward"] and len(fig.data[0].x) == 16
    assert "bubble): 42.9%" in fig.layout.title.text  # 3 / 7
    rows = [{"devices": 2, "micro_batches": 4, "bubble": 0.25, "schedule": "gpipe"}]
    assert len(parallel_figures.bubble_figure([2, 4], [1, 2, 4, 8], rows, title="t").data) == 3


# ---------------------------------------------------------------------------------------------
# On real processes (gloo, CPU): 10 to 25 s per launch on two busy cores, mostly torch's import in every process


def _one_process() -> tuple[torch.nn.Sequential, torch.Tensor, float]:
    model, X, labels = ddp.gradient_problem(SIZES, BATCH, SEED)
    output = model(X)
    loss = F.cross_entropy(output, labels)
    loss.backward()
    return model, output.detach(), loss.item()


def _same_gradients(model: torch.nn.Module, gradients: dict[str, torch.Tensor]) -> None:
    assert set(gradients) == {name for name, _ in model.named_parameters()}
    for name, parameter in model.named_parameters():
        assert relative_error(gradients[name], parameter.grad) < 1e-5, name


def test_tensor_parallel_step_equals_one_process_on_the_whole_batch():
    model, output, loss = _one_process()
    result = parallel.parallel_gradients("tensor", SIZES, BATCH, processes=2, seed=SEED)
    assert relative_error(result["output"], output) < 1e-5 and result["loss"] == pytest.approx(loss, rel=1e-5)
    _same_gradients(model, result["gradients"])
    for row in result["rows"]:  # two blocks: forward, forward, then the second block's input gradient in backward
        assert [entry["phase"] for entry in row["allreduces"]] == ["forward", "forward", "backward"]
        assert sum(e["bytes"] for e in row["allreduces"]) == tensor_parallel.traffic(SIZES, BATCH, 2)["message_bytes"]


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
def test_pipeline_step_equals_one_process_on_the_whole_batch(schedule):
    model, _, loss = _one_process()
    result = parallel.parallel_gradients("pipeline", SIZES, BATCH, processes=2, micro_batches=4, schedule=schedule,
                                         seed=SEED)
    assert result["loss"] == pytest.approx(loss, rel=1e-5)
    _same_gradients(model, result["gradients"])
    for stage, row in enumerate(result["rows"]):
        order = [(i["phase"][0].upper(), i["micro_batch"]) for i in row["intervals"]]
        assert order == pipeline.stage_order(stage, 2, 4, schedule)


def test_fsdp_step_equals_one_process_and_stores_a_pth_of_ddp():
    model, _, loss = _one_process()
    result = parallel.parallel_gradients("fsdp", SIZES, BATCH, processes=2, seed=SEED)
    assert result["loss"] == pytest.approx(loss, rel=1e-5)
    _same_gradients(model, result["gradients"])
    rows = result["rows"]
    for kind in ("parameter_bytes", "gradient_bytes", "optimizer_bytes"):
        assert all(row["ddp"][kind] == sharded.predicted_state_bytes(SIZES, 2, "ddp")[kind] for row in rows)
        assert sum(row["fsdp"][kind] for row in rows) == rows[0]["ddp"][kind]  # one copy, cut in two
        assert rows[0]["fsdp"][kind] == sharded.predicted_state_bytes(SIZES, 2, "fsdp")[kind]  # ceil(rows / 2) each


def test_measurements_run_on_gloo():
    rows = parallel.parallel_scaling(SIZES, [BATCH], processes=[2], precisions=["float32"], micro_batches=4, warmup=1,
                                     repeats=2)  # all four strategies, in one launch
    assert [r["strategy"] for r in rows] == list(parallel.STRATEGIES)
    for r in rows:
        assert r["devices"] == 2 and r["seconds"] > 0 and r["peak_memory_bytes"] is None and r["backend"] == "gloo"
        assert r["predicted_sent_bytes"] > 0 and r["state_bytes"] > 0
    by = {r["strategy"]: r for r in rows}
    assert by["tensor"]["counted_allreduce_bytes"] == tensor_parallel.traffic(SIZES, BATCH, 2)["message_bytes"]
    assert by["fsdp"]["state_bytes"] < by["ddp"]["state_bytes"]
    assert by["pipeline"]["bubble_formula"] == pytest.approx(1 / 5) and 0 < by["pipeline"]["bubble"] < 1
    assert len(by["pipeline"]["intervals"]) == 2 * 2 * 4


@needs_gpu(gpus=2)
def test_nccl_parallelism_on_two_gpus():
    rows = parallel.parallel_scaling([1024] * 5, [256], processes=[2], backend="nccl", warmup=2, repeats=5)
    assert all(r["peak_memory_bytes"] > 0 and 0 < r["efficiency"] < 1.5 for r in rows)


@needs_gpu(gpus=2)
def test_1f1b_with_messages_larger_than_nccls_buffers_does_not_deadlock():
    # 32 MiB activations each way: with one process group the two stages' send/receive queues cross and hang
    rows = parallel.pipeline_bubble([4096] * 3 + [10], 4096, micro_batches=[2], schedules=["1f1b"], processes=[2],
                                    backend="nccl", precision="float32", warmup=1, repeats=2, timeout_s=120)
    assert rows[0]["bubble_formula"] == pytest.approx(1 / 3) and 0 < rows[0]["bubble"] < 1


def test_the_page_check_passes_the_whole_batch_gradients_and_names_a_wrong_one():
    sizes, batch = [8, 16, 4], 8
    loss, gradients = measured.whole_batch_step(sizes, batch)
    right = {"loss": loss, "gradients": gradients}
    assert parallel_figures.check_rows({"tensor": right}, sizes, batch)[0]["error"] == 0.0
    wrong = {**right, "gradients": {n: 2 * g for n, g in right["gradients"].items()}}
    with pytest.raises(AssertionError, match="pipeline: the gradient of"):
        parallel_figures.check_rows({"pipeline": wrong}, sizes, batch)


def test_the_memory_table_gives_fsdp_a_pth_of_ddps_state():
    sizes = [64, 128, 128, 10]
    rows = parallel_figures.memory_rows(sizes, [1, 2, 4], batch_per_gpu=16)
    activations = sharded.activation_bytes(sizes, 16)
    assert rows[0]["ddp"] == rows[0]["fsdp"]
    for row in rows:
        state = row["ddp"] - activations
        assert row["fsdp"] - activations == pytest.approx(state / row["gpus"], rel=0.05)


def test_the_page_says_which_machine_sizes_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    assert parallel_figures.recorded_statement().startswith("Not yet measured on 2, 4 and 8 GPUs")


def test_a_bfloat16_block_all_reduces_bfloat16_both_ways(tmp_path):
    """Under bfloat16 autocast the row-parallel bias is added in bfloat16, so the block's output, and the gradient
    the next column-parallel layer all-reduces in its backward, stay 2 bytes a number (a one-process gloo group)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        log: list = []
        first, second, third = (torch.nn.Linear(8, 8) for _ in range(3))
        column = tensor_parallel.ColumnParallelLinear(first, 0, 1, log)
        row = tensor_parallel.RowParallelLinear(second, 0, 1, log)
        after = tensor_parallel.ColumnParallelLinear(third, 0, 1, log)
        x = torch.randn(4, 8)  # the model's input: no gradient, so the first layer all-reduces none
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = row(column(x))
            assert y.dtype == torch.bfloat16
            out = after(y)
        out.float().sum().backward()
        assert row.bias.grad is not None and row.bias.grad.dtype == torch.float32
        backward = [entry for entry in log if entry["phase"] == "backward"]
        assert [entry["bytes"] for entry in backward] == [2 * 4 * 8], log  # 4 x 8 bfloat16 numbers
    finally:
        dist.destroy_process_group()
