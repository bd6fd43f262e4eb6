"""Distributed training: the traffic of each parallelism, the ring all-reduce simulated, and real processes (DDP)."""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gpulab
from conftest import needs_gpu
from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch16_distributed_training import ddp, distributed, figures, launch
from gpulab.ch16_distributed_training.distributed import Message
from gpulab.core.correctness import relative_error

# ---------------------------------------------------------------------------------------------
# On paper


def test_parameter_count_of_an_mlp():
    assert distributed.parameter_count([3, 4, 2]) == (3 + 1) * 4 + (4 + 1) * 2
    with pytest.raises(ValueError, match="^sizes:"):
        distributed.parameter_count([5])


def test_parallelism_traffic_counts_gradients_activations_and_boundaries():
    rows = {r["strategy"]: r for r in distributed.parallelism_traffic(width=8, depth=4, batch=16, workers=4)}
    weights = 4 * 8 * 8 * 4  # bytes of float32 weights
    assert rows["data"]["sent_bytes"] == pytest.approx(2 * 3 / 4 * weights)
    assert rows["tensor"]["sent_bytes"] == pytest.approx(2 * 2 * 2 * 3 / 4 * 16 * 8 * 4)  # 2 pairs, fwd + bwd
    assert rows["pipeline"]["sent_bytes"] == 2 * 16 * 8 * 4
    assert rows["data"]["weight_bytes"] == weights and rows["tensor"]["weight_bytes"] == weights / 4
    # Data parallelism sends gradients (~ width^2), tensor parallelism activations (~ batch x width): equal at
    # batch = width.
    even = {r["strategy"]: r["sent_bytes"] for r in distributed.parallelism_traffic(64, 4, 64, 2, "bfloat16")}
    assert even["data"] == pytest.approx(even["tensor"])
    for bad, match in (({"workers": 1}, "^workers:"), ({"depth": 2}, "^depth:"), ({"batch": 15}, "^batch:")):
        with pytest.raises(ValueError, match=match):
            distributed.parallelism_traffic(**{"width": 8, "depth": 4, "batch": 16, "workers": 4, **bad})


def test_chunk_bounds_are_as_even_as_array_split():
    for n in (0, 1, 3, 10, 17):
        for p in (1, 2, 3, 4, 7):
            expected = [(int(c[0]), int(c[-1]) + 1) if c.size else None for c in np.array_split(np.arange(n), p)]
            bounds = distributed.chunk_bounds(n, p)
            assert [b if b[1] > b[0] else None for b in bounds] == expected
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert [len(c) for c in torch.tensor_split(torch.arange(n), p)] == [b - a for a, b in bounds]
    with pytest.raises(ValueError, match="^elements:"):
        distributed.chunk_bounds(-1, 2)


def test_ring_schedule_passes_each_chunk_on_to_the_neighbour():
    for p in (2, 3, 5):
        for step in range(p - 1):
            for rank in range(p):
                send, _ = distributed.reduce_scatter_chunks(rank, step, p)
                _, receive = distributed.reduce_scatter_chunks((rank + 1) % p, step, p)
                assert send == receive  # what r sends is what r + 1 receives
                if step:
                    assert send == distributed.reduce_scatter_chunks(rank, step - 1, p)[1]  # passed on
        assert distributed.all_gather_chunks(0, 0, p)[0] == 1 % p  # starts from the complete chunk (r + 1) mod p
    rows = distributed.ring_schedule(4)
    assert len(rows) == 2 * 3 * 4 and {r["phase"] for r in rows} == {"reduce-scatter", "all-gather"}
    with pytest.raises(ValueError, match="^step:"):
        distributed.reduce_scatter_chunks(0, 3, 4)
    with pytest.raises(ValueError, match="^rank:"):
        distributed.all_gather_chunks(4, 0, 4)


@pytest.mark.parametrize("algorithm", list(distributed.ALGORITHMS))
@pytest.mark.parametrize(("p", "n"), [(1, 5), (2, 8), (3, 7), (4, 4), (5, 3), (8, 101)])
def test_every_algorithm_leaves_the_exact_sum_on_every_worker(algorithm, p, n):
    rng = np.random.default_rng(p * 100 + n)
    vectors = [rng.standard_normal(n) for _ in range(p)]
    run = distributed.simulate(vectors, distributed.ALGORITHMS[algorithm](n, p))
    for result in run.results:
        np.testing.assert_allclose(result, np.sum(vectors, axis=0), rtol=1e-12, atol=1e-12)


def test_traffic_matches_the_closed_forms():
    n = 840  # divisible by 2..8: the ring's chunks are equal
    rows = distributed.allreduce_traffic(range(2, 9), n)
    size = 4 * n
    for r in rows:
        p = r["workers"]
        expected = {"ring": 2 * (p - 1) / p, "tree": math.ceil(math.log2(p)), "naive": p - 1}[r["algorithm"]]
        assert r["sent_over_size"] == pytest.approx(expected)
        model = distributed.model_seconds(r["algorithm"], p, size, latency_s=1.0, bandwidth=1.0)
        assert model == pytest.approx(r["rounds"] + r["critical_bytes"])  # the model counts what the simulator did
    ring = [r for r in rows if r["algorithm"] == "ring"]
    assert all(r["max_sent_bytes"] == r["max_received_bytes"] for r in ring)
    assert max(r["sent_over_size"] for r in ring) < 2  # bandwidth-optimal: below 2 for every p


def test_simulation_refuses_more_than_one_message_per_port_and_counts_bytes():
    vectors = [np.ones(4, np.float32), np.ones(4, np.float32), np.ones(4, np.float32)]
    with pytest.raises(ValueError, match="^rounds:"):
        distributed.simulate(vectors, [[Message(1, 0, 0, 4, True), Message(2, 0, 0, 4, True)]])
    run = distributed.simulate(vectors, [[Message(1, 0, 0, 2, True), Message(0, 2, 2, 4, False)]], keep_history=True)
    assert run.sent_bytes == [8, 8, 0] and run.received_bytes == [8, 0, 8] and run.critical_bytes == 8
    assert run.results[0].tolist() == [2, 2, 1, 1] and len(run.history) == 2
    assert vectors[0].tolist() == [1, 1, 1, 1]  # the caller's vectors are left alone


def test_model_seconds_ring_wins_for_large_messages_and_tree_for_small():
    small = {a: distributed.model_seconds(a, 16, 8, 1e-5, 1e11) for a in distributed.ALGORITHMS}
    large = {a: distributed.model_seconds(a, 16, 2**30, 1e-5, 1e11) for a in distributed.ALGORITHMS}
    assert min(small, key=small.get) == "tree" and min(large, key=large.get) == "ring"
    with pytest.raises(ValueError, match="^algorithm:"):
        distributed.model_seconds("butterfly", 4, 8, 1e-5, 1e9)


def test_bandwidths_follow_nccl_tests():
    assert distributed.algorithm_bandwidth(1e9, 0.5) == 2e9
    assert distributed.bus_bandwidth(1e9, 0.5, 8) == pytest.approx(2e9 * 2 * 7 / 8)
    assert distributed.bus_bandwidth(1e9, 0.5, 2) == distributed.algorithm_bandwidth(1e9, 0.5)
    with pytest.raises(ValueError):
        distributed.algorithm_bandwidth(1e9, 0)


def test_large_batch_rows_derive_time_and_the_linear_scaling_rule():
    rows = {r["who"]: r for r in distributed.large_batch_rows()}
    assert rows["Goyal et al."]["linear_rule_lr"] == pytest.approx(3.2)  # 0.1 x 8192 / 256
    assert rows["Goyal et al."]["processor_hours"] == 256 and rows["Smith et al."]["processor_hours"] is None
    assert rows["Mikami et al."]["speedup"] == pytest.approx(29 * 3600 / 224)
    assert "3.73 minutes" in distributed.describe_result(rows["Mikami et al."])
    assert "2,176 x Tesla V100" in distributed.describe_result(rows["Mikami et al."])


def test_figures():
    who = figures.parallelism_figure(4, 4)
    heatmaps = [trace for trace in who.data if trace.type == "heatmap"]
    assert len(heatmaps) == 3 and [list(row) for row in heatmaps[0].z][1] == [1] * 16  # data: row 1 is worker 1
    assert list(heatmaps[1].z[0][:4]) == [0, 1, 2, 3] and list(heatmaps[2].z[0][4:8]) == [1] * 4
    steps = figures.ring_steps_figure(4)
    assert len(steps.frames) == 1 + 2 * 3 and [list(row) for row in steps.frames[-1].data[0].z] == [[4] * 4] * 4
    assert steps.frames[3].data[0].text[0][1] == "A+B+C+D"  # after reduce-scatter worker 0 holds chunk 1 complete
    rows = distributed.allreduce_traffic([2, 4], 16)
    assert len(figures.traffic_vs_workers_figure(rows, title="t").data) == 3
    assert len(figures.model_time_figure(8, [8, 2**20], 1e-5, 1e11, title="t").data) == 3
    rows = [{"batch": b, **r} for b in (64, 1024) for r in distributed.parallelism_traffic(256, 4, b, 4)]
    assert len(figures.traffic_figure(rows, title="t").data) == 3
    assert len(figures.large_batch_figure(distributed.large_batch_rows(), title="t").data) == 4
    band = [{"bytes": 8, "algbw_gbs": 1.0, "busbw_gbs": 1.0, "seconds": 1e-5}]
    assert figures.bandwidth_figure([("a", band)], title="t").layout.xaxis.type == "log"
    with pytest.raises(ValueError, match="^workers:"):
        figures.ring_steps_figure(9)


# ---------------------------------------------------------------------------------------------
# On real processes (gloo, CPU): a few seconds each, mostly torch's import in every process


def test_worker_environment_and_free_port():
    environment = launch.worker_environment({"EXTRA": "1"})
    assert environment["PYTHONPATH"].split(":")[0] == str(gpulab.SRC) and (gpulab.SRC / "gpulab").is_dir()
    assert environment["OMP_NUM_THREADS"] == "1" and environment["EXTRA"] == "1"
    assert 0 < launch.free_port() < 65536


def test_ddp_averages_the_gradients_of_equal_shares_into_the_whole_batch_gradient():
    sizes, batch = [12, 16, 5], 8
    averaged = ddp.ddp_gradients(sizes, batch, processes=2, seed=3)
    model, X, labels = ddp.gradient_problem(sizes, batch, seed=3)
    F.cross_entropy(model(X), labels).backward()
    assert set(averaged) == {name for name, _ in model.named_parameters()}
    for name, parameter in model.named_parameters():
        assert relative_error(averaged[name], parameter.grad) < 1e-6, name
    with pytest.raises(ValueError, match="^batch:"):
        ddp.ddp_gradients(sizes, 7, processes=2)


def test_allreduce_bandwidth_on_gloo():
    rows = ddp.allreduce_bandwidth([8, 4096], processes=2, warmup=1, least=3, most=3)
    assert [r["bytes"] for r in rows] == [8, 4096] and all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert r["seconds"] > 0 and r["max_error"] < 1e-6 and r["repeats"] == 3 and r["backend"] == "gloo"
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"])  # p = 2: 2 (p - 1) / p = 1


def test_ddp_scaling_runs_on_gloo_and_reports_efficiency():
    rows = ddp.ddp_scaling([16, 32, 4], [8], ["float32"], processes=2, micro_batches=[1, 3], warmup=1, repeats=3)
    one, three = rows
    for row, count in ((one, 1), (three, 3)):
        assert row["devices"] == 2 and row["backend"] == "gloo" and row["parameters"] == (17 * 32 + 33 * 4)
        assert row["micro_batches"] == count and row["samples_per_step"] == 8 * count
        assert row["efficiency"] == pytest.approx(row["single_seconds"] / row["ddp_seconds"])
        assert row["ddp_samples_per_s"] == pytest.approx(2 * 8 * count / row["ddp_seconds"])


def test_accumulated_micro_batches_take_the_step_of_their_union():
    generator = torch.Generator().manual_seed(0)
    X, labels = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)
    whole, parts = (mlp.torch_mlp([6, 5, 3], seed=1) for _ in range(2))
    ddp._training_step(whole, [(X, labels)], "float32", 0.1)()
    ddp._training_step(parts, [(X[:4], labels[:4]), (X[4:], labels[4:])], "float32", 0.1)()  # equal halves
    for a, b in zip(whole.parameters(), parts.parameters(), strict=True):
        torch.testing.assert_close(a, b)  # up to rounding: the same mean gradient, summed in another order


def test_a_worker_error_reaches_the_notebook_with_its_message():
    with pytest.raises(launch.LaunchError, match="precisions: one of float32, tf32, bfloat16") as caught:
        ddp.ddp_scaling([4, 4], [2], ["float16"], processes=2, warmup=0, repeats=1)
    assert "rank 0" in str(caught.value)


def test_a_launch_past_its_limit_is_stopped_and_leaves_no_process():
    def sleepers():  # processes whose command line is the one launched below
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if cmdline.read_bytes().split(b"\0")[:2] == [b"sleep", b"31.7"]:
                    found.append(cmdline.parent.name)
        return found

    start = time.perf_counter()
    with pytest.raises(launch.LaunchError, match="past its limit") as caught:
        launch.launch(["--no-python", "sleep", "31.7"], 2, timeout_s=3)  # two workers that would sleep for 31.7 s
    assert caught.value.timed_out and time.perf_counter() - start < 25
    assert not sleepers()


def test_ranks_killed_by_a_signal_are_tried_once_more_and_their_own_words_are_kept(tmp_path):
    worker = tmp_path / "abort.py"  # each rank notes that it started, says so on stderr, then aborts
    worker.write_text("import os, sys\n"
                      f"open({str(tmp_path / 'starts')!r}, 'a').write('x')\n"
                      "print(f\"rank {os.environ['RANK']}: giving up\", file=sys.stderr, flush=True)\n"
                      "os.abort()\n")
    with pytest.raises(launch.LaunchError, match="exited with status") as caught:
        launch.launch([str(worker)], 2, attempts=2)
    assert (tmp_path / "starts").read_text() == "xxxx"  # two ranks, two attempts
    message = str(caught.value)
    assert "rank 0: giving up" in message and "rank 1: giving up" in message  # not pushed out by torchrun's report
    assert "SIGABRT" in message and "ChildFailedError" not in message


def test_gpu_link_reads_nvidia_smi_topology(monkeypatch):
    # as the two-H200 machine printed it, with the header underlined by terminal escape codes
    table = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
             "GPU0\t X \tNV18\t0-31\t0\t\tN/A\nGPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n  X    = Self\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=table))
    assert ddp.gpu_link() == "NV18"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=""))
    assert ddp.gpu_link() is None


@needs_gpu(gpus=2)
def test_nccl_allreduce_and_scaling_on_two_gpus():
    rows = ddp.allreduce_bandwidth([8, 2**24], processes=2, backend="nccl", warmup=2, least=5, most=20)
    assert all(r["busbw_gbs"] > 0 and r["nccl_version"] for r in rows)
    (row,) = ddp.ddp_scaling([1024, 1024, 1024, 10], [256], ["bfloat16"], processes=2, warmup=2, repeats=5)
    assert 0 < row["efficiency"] < 1.5
