"""Chapter 16's tables, sentences and figures: the models' and simulations' (figures), and the measured all-reduces
and DDP steps (measured), labelled by the machine that ran them."""

from __future__ import annotations

import copy

import pytest
import torch

from gpulab.ch16_distributed_training import ddp, distributed, figures, measured
from gpulab.core import recordings
from gpulab.core.recordings import Recording


def run_of(experiment: str, device: str = "NVIDIA H200", recorded: bool = True) -> Recording:
    source = recordings.load(experiment, "H200")
    provenance = {"device": {"name": device, "kind": "cuda"}, "date": "2026-11-24", "recorded": recorded}
    return Recording(experiment, source.function, dict(source.params), copy.deepcopy(source.rows), provenance)


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def test_traffic_table_sentence_and_figure_of_the_worked_example():
    table = figures.traffic_table(4096, 4, 1024, 4)
    rows = {r["strategy"]: r for r in cells(table)}
    assert rows["data"]["sent per step"] == "384.0 MiB" and rows["pipeline"]["messages"] == "2"
    assert table.caption.startswith("MLP of 4 layers of 4,096 x 4,096: 67.1 M parameters")
    assert figures.traffic_statement(4096, 4, 1024, 4).startswith("Data parallelism sends 4 times what tensor")
    fig = figures.traffic_by_batch_figure(4096, 4, [64, 1024, 65536], 4)
    assert len(fig.data) == 3 and fig.layout.shapes[0].x0 == 4096


def test_simulated_traffic_at_the_largest_number_of_workers():
    rows = distributed.allreduce_traffic([2, 4], 840)
    table = cells(figures.simulated_traffic_table(rows))
    assert [r["algorithm"] for r in table] == list(distributed.ALGORITHMS)
    assert table[0]["the busiest worker sends (x S)"] == "1.5"  # 2 (p - 1) / p for p = 4
    assert figures.simulated_check(rows).startswith("Every algorithm left every worker with the exact sum, for p = 2 "
                                                    "to 4")


def test_model_table_and_the_crossover():
    rows = cells(figures.model_time_table(8, [8, 2**30], 5e-6, 100e9))
    assert rows[0]["fastest"] == "tree" and rows[1]["fastest"] == "ring"
    assert rows[0]["ring (µs)"] == f"{1e6 * distributed.model_seconds('ring', 8, 8, 5e-6, 100e9):,.1f}"
    sizes = [2**k for k in range(3, 31)]
    assert figures.crossover(8, sizes, 5e-6, 100e9) == ("In this model the tree is faster below 1.0 MiB and the ring "
                                                        "from there on (of the sizes drawn, powers of two).")
    assert figures.crossover(8, [8], 5e-6, 100e9) == "In this model the tree is faster at every size drawn."


def test_large_batch_table_and_sentences():
    rows = distributed.large_batch_rows()
    table = cells(figures.large_batch_table(rows))
    assert table[2]["global batch"] == "8,192 to 16,384" and table[2]["processor-hours"] == "–"
    said = figures.large_batch_statements(rows)
    assert said[0].startswith("Mikami et al. trained 466 times faster than He et al.")
    assert said[1].endswith("Akiba et al., 1.40 points.")


def test_ddp_check_table_compares_with_the_whole_batch_and_catches_a_wrong_average():
    sizes, batch = [6, 8, 3], 4
    model, X, labels = ddp.gradient_problem(sizes, batch)
    torch.nn.functional.cross_entropy(model(X), labels).backward()
    averaged = {name: p.grad.clone() for name, p in model.named_parameters()}
    rows = cells(measured.ddp_check_table(averaged, sizes, batch))
    assert [r["shape"] for r in rows] == ["8 x 6", "8", "3 x 8", "3"]
    averaged["0.weight"] *= 2  # a summed loss: twice the mean
    with pytest.raises(AssertionError, match="DDP's gradient of 0.weight"):
        measured.ddp_check_table(averaged, sizes, batch)


def test_measured_runs_are_labelled_by_their_machine():
    nccl = run_of("distributed_nccl_allreduce")
    [machine] = measured.machine_runs([nccl])
    assert machine.label == "2 x NVIDIA H200, recorded 2026-11-24" and machine.short_label == "2 x H200"
    gloo = [{**r, "device": "cpu"} for r in nccl.rows[:4]]
    said = measured.bandwidth_statements([nccl], gloo)
    assert said[0].startswith("NCCL 2.28.9, 2 x NVIDIA H200, recorded 2026-11-24: 8 B take 75.9 µs")
    assert "peaks at 330 GB/s (1.0 GiB, the largest size measured) and reaches half of that from 16.0 MiB" in said[0]
    assert said[1].startswith(measured.GLOO)
    assert "not measured yet" in measured.bandwidth_statements([], gloo)[0]
    names = [t.name for t in measured.allreduce_bandwidth_figure([nccl], gloo).data]
    assert names[0] == "NCCL: 2 x NVIDIA H200, recorded 2026-11-24" and "not a GPU number" in names[1]
    assert cells(measured.bandwidth_table(gloo, "c"))[0]["message"] == "8 B"


def test_scaling_tables_sentences_and_figure():
    scaling, nccl = run_of("distributed_ddp_scaling"), run_of("distributed_nccl_allreduce")
    table = measured.scaling_table([scaling], [nccl])
    rows = cells(table)
    assert rows[0]["machine"] == "2 x H200" and rows[0]["efficiency"] == "76%" and rows[0]["without overlap"] == "70%"
    assert "GPUs linked by NV18" in table.caption
    assert cells(measured.scaling_table([scaling], [run_of("distributed_nccl_allreduce", recorded=False)]))[0][
        "without overlap"] == "–"  # another machine's all-reduce is no measure of this one's
    said = measured.scaling_statements([scaling], [nccl], 0.85)[0]
    assert said.startswith("2 x NVIDIA H200, recorded 2026-11-24: the target (efficiency at least 85%) is met: best "
                           "98% (float32, 4,096 per GPU); met by 2 of 6 configurations.")
    assert "one all-reduce of 256.0 MiB, about the gradients' size, took 0.90 ms" in said
    assert "not met" in measured.scaling_statements([scaling], [nccl], 0.99)[0]
    assert "not measured yet" in measured.scaling_statements([], [nccl], 0.85)[0]
    accumulated = cells(measured.accumulation_table([scaling]))
    assert accumulated[0]["micro-batches x samples"] == "4 x 256 = 1,024" and accumulated[0]["efficiency"] == "93%"
    fig = measured.scaling_figure([scaling, run_of("distributed_ddp_scaling", "NVIDIA H100 80GB HBM3")], 0.85)
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["2 x H200", "2 x H100 80GB HBM3"]
    assert fig.layout.title.text.startswith("DDP scaling efficiency, 1 to 2 GPUs: 2 x NVIDIA H200")


def test_the_link_between_the_gpus_and_its_rate():
    nccl = run_of("distributed_nccl_allreduce")
    assert measured.machine_link(nccl) == "NV18"  # from the DDP scaling recording of the same machine
    assert measured.machine_link(run_of("distributed_ddp_scaling")) == "NV18"  # from the run's own rows
    assert measured.link_rate("NV18", "NVIDIA H200") == pytest.approx(450e9)  # 18 NVLinks x 25 GB/s each way
    assert measured.link_rate("NV12", "NVIDIA A100-SXM4-80GB") == pytest.approx(300e9)
    assert measured.link_rate("PIX", "NVIDIA H200") == pytest.approx(63.015e9, rel=1e-3)  # 16 lanes of PCIe 5
    assert measured.link_rate(None, "NVIDIA H200") is None and measured.link_rate("NV18", "a CPU") is None
    [said] = measured.link_statements([nccl])
    assert said.startswith("2 x NVIDIA H200, recorded 2026-11-24: `nvidia-smi topo -m` reports NV18")
    assert "450 GB/s in each direction, 900 GB/s counting both" in said


def test_the_traffic_sentence_finds_the_equal_batch_for_an_odd_depth_too():
    assert figures.traffic_statement(4096, 3, 1023, 3).endswith("at a global batch of depth x width / (depth + 1) = "
                                                               "3,072.")
