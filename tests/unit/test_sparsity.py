"""The structured-sparsity chapter's library: the 2:4 format and its size, masks, pruning a trained MLP, sparse
peaks, and torch's semi-structured matmuls (on a GPU; on a CPU, the rows that say why they cannot run)."""

from __future__ import annotations

import itertools

import plotly.graph_objects as go
import pytest
import torch

from conftest import needs_gpu
from gpulab.ch15_structured_sparsity import figures, patterns, pruning, speedup
from gpulab.core import specs
from gpulab.core.precision import MATMUL_TOLERANCE

HAS_SPARSE_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)


# ---------------------------------------------------------------------------------------------
# The format's arithmetic


@pytest.mark.parametrize(("bits", "overhead", "fraction"), [(16, 0.125, 0.5625), (8, 0.25, 0.625)])
def test_metadata_overhead_of_2_4(bits, overhead, fraction):
    size = patterns.compressed_size(bits)
    assert size.index_bits == 2 and size.metadata_bits == 4  # 2 bits per kept value, 2 kept per group of 4
    assert size.metadata_overhead == overhead and size.fraction_of_dense == fraction


def test_compressed_size_of_other_patterns_and_bad_arguments():
    one_of_two = patterns.compressed_size(32, kept=1, group=2)  # 1 bit says which of two
    assert one_of_two.metadata_bits == 1 and one_of_two.fraction_of_dense == pytest.approx(33 / 64)
    assert patterns.compressed_size(16, kept=2, group=8).index_bits == 3
    for kwargs, name in (({"value_bits": 0}, "value_bits"), ({"value_bits": 16, "kept": 4}, "kept"),
                         ({"value_bits": 16, "kept": 0}, "kept"), ({"value_bits": 16, "group": 1}, "group")):
        with pytest.raises(ValueError, match=f"^{name}:"):
            patterns.compressed_size(**kwargs)


def test_storage_rows_follow_the_bits_per_value():
    rows = {r["format"]: r for r in patterns.storage_rows()}
    assert rows["float16"]["fraction_of_dense"] == rows["bfloat16"]["fraction_of_dense"] == 0.5625
    assert rows["int8"]["metadata_overhead"] == 0.25


# ---------------------------------------------------------------------------------------------
# Masks and the pattern


def test_magnitude_mask_keeps_the_two_largest_of_each_group():
    W = torch.tensor([[9.0, -1.0, 7.0, 4.0, 1.0, 2.0, -3.0, 0.0],
                      [0.5, -8.0, 5.0, 4.0, 0.0, 0.0, 0.0, 6.0]])
    expected = torch.tensor([[9.0, 0.0, 7.0, 0.0, 0.0, 2.0, -3.0, 0.0],
                             [0.0, -8.0, 5.0, 0.0, 0.0, 0.0, 0.0, 6.0]])
    assert torch.equal(patterns.prune_2_4(W), expected)
    assert patterns.is_2_4(expected) and not patterns.is_2_4(W)
    assert patterns.nonzeros_per_group(W).tolist() == [[4, 3], [4, 1]]


def test_masks_have_the_pattern_and_the_sparsity_they_promise():
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(32, 64, generator=generator)
    for mask in (patterns.magnitude_2_4_mask(W), patterns.random_2_4_mask(W, generator)):
        assert mask.dtype == torch.bool and (patterns.nonzeros_per_group(mask.float()) == 2).all()
    unstructured = patterns.magnitude_mask(W, 0.5)
    assert unstructured.sum() == W.numel() // 2
    assert W[unstructured].abs().min() >= W[~unstructured].abs().max()  # the largest half, wherever it is
    # the best 2:4 mask keeps at most what the unrestricted one keeps, and a random one less than both
    kept = {name: (W * m).square().sum() for name, m in (("2:4", patterns.magnitude_2_4_mask(W)),
                                                         ("any", unstructured))}
    assert kept["2:4"] <= kept["any"]


def test_bad_shapes_and_sparsities_are_refused():
    with pytest.raises(ValueError, match="^W: its 6 columns"):
        patterns.prune_2_4(torch.ones(2, 6))
    with pytest.raises(ValueError, match="^W: expected a matrix"):
        patterns.magnitude_2_4_mask(torch.ones(8))
    with pytest.raises(ValueError, match="^sparsity:"):
        patterns.magnitude_mask(torch.ones(4, 4), 1.0)


# ---------------------------------------------------------------------------------------------
# Compress, decompress, metadata


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_compress_round_trip_is_exact(dtype):
    W = patterns.prune_2_4(torch.randn(16, 32, generator=torch.Generator().manual_seed(1))).to(dtype)
    W[0, :4] = 0  # a group with no nonzeros, and one with a single nonzero: both still store two values
    W[1, 4:8] = torch.tensor([0, 0, 3, 0], dtype=dtype)
    packed = patterns.compress(W)
    assert packed.values.shape == packed.indices.shape == (16, 16) and packed.values.dtype == dtype
    assert torch.equal(patterns.decompress(packed), W)
    assert packed.indices[1, 2:4].tolist() == [0, 2]  # the nonzero at position 2 plus the first free position
    steps = packed.indices.reshape(16, 8, 2)
    assert (steps[..., 0] < steps[..., 1]).all()  # ascending positions within each group


def test_compress_refuses_a_matrix_that_is_not_2_4():
    W = torch.tensor([[1.0, 0, 1, 0, 1, 0, 1, 0], [0, 0, 1, 0, 0, 1, 1, 1]])  # 2, 2 and 1, 3 nonzeros
    with pytest.raises(ValueError, match="^W: group 1 of row 1 .* holds 3 nonzeros"):
        patterns.compress(W)


def test_metadata_packs_four_indices_to_a_byte():
    indices = torch.tensor([list(p) for p in itertools.product(range(4), repeat=4)], dtype=torch.uint8)
    packed = patterns.pack_indices(indices)
    assert packed.shape == (256, 1) and sorted(packed.flatten().tolist()) == list(range(256))
    assert torch.equal(patterns.unpack_indices(packed, 4), indices)
    assert patterns.pack_indices(torch.tensor([[1, 2, 3, 0, 3]])).tolist() == [[1 | 2 << 2 | 3 << 4, 3]]
    with pytest.raises(ValueError, match="^indices:"):
        patterns.pack_indices(torch.tensor([[4]]))


@pytest.mark.parametrize(("dtype", "fraction"), [(torch.float16, 0.5625), (torch.bfloat16, 0.5625),
                                                 (torch.int8, 0.625)])
def test_compressed_bytes_match_the_arithmetic(dtype, fraction):
    W = patterns.prune_2_4(torch.randn(64, 128) * 10).to(dtype)
    packed = patterns.compress(W)
    assert packed.nbytes / packed.dense_nbytes == fraction
    assert packed.metadata().numel() * 8 == 4 * W.numel() // 4  # 4 bits per group of 4


def test_pattern_figure():
    W = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    fig = figures.pattern_figure(W, patterns.prune_2_4(W), title="t")
    assert isinstance(fig, go.Figure) and len(fig.data) == 3
    assert fig.data[2].text[0][0].endswith(")")  # values labelled with their index
    with pytest.raises(ValueError, match="^W:"):
        figures.pattern_figure(W, W, title="not pruned")


# ---------------------------------------------------------------------------------------------
# Pruning a trained MLP


@pytest.fixture(scope="module")
def pruning_rows():
    return pruning.pruning_accuracy((16,), epochs=3, finetune_epochs=2, seeds=(0, 1))


def test_pruning_accuracy_rows(pruning_rows):
    stages = {(r["method"], r["stage"]) for r in pruning_rows}
    assert stages == {(pruning.DENSE, "trained"), (pruning.DENSE, "fine-tuned"),
                      *((m, s) for m in pruning.PRUNING_METHODS for s in ("pruned", "fine-tuned"))}
    assert len(pruning_rows) == 2 * len(stages)
    for r in pruning_rows:
        assert 0 <= r["test_accuracy"] <= 1 and r["test_samples"] == 359
        if r["method"] == pruning.DENSE:
            assert r["zeros"] < 0.01 and r["kept_norm"] == 1
        else:
            assert r["zeros"] >= 0.5 and 0 < r["kept_norm"] < 1
    trained = {r["seed"]: r["test_accuracy"] for r in pruning_rows if r["stage"] == "trained"}
    assert min(trained.values()) > 0.8  # three epochs are enough to learn the digits
    kept = {m: [r["kept_norm"] for r in pruning_rows if r["method"] == m] for m in pruning.PRUNING_METHODS}
    assert min(kept["2:4 magnitude"]) > max(kept["2:4 random"])
    assert min(kept["unstructured 50% magnitude"]) >= max(kept["2:4 magnitude"]) - 1e-12


def test_summarize_pruning_and_figure(pruning_rows):
    summary = pruning.summarize_pruning(pruning_rows)
    trained = next(s for s in summary if s["method"] == pruning.DENSE and s["stage"] == "trained")
    values = [r["test_accuracy"] for r in pruning_rows if r["method"] == pruning.DENSE and r["stage"] == "trained"]
    assert trained["runs"] == 2 and trained["accuracy_mean"] == pytest.approx(sum(values) / 2)
    assert trained["accuracy_min"] <= trained["accuracy_mean"] <= trained["accuracy_max"]
    assert "gap_to_dense" not in trained  # the dense rows are the reference
    fig = figures.accuracy_figure(summary, title="t")
    assert len(fig.data) == 2 and len(fig.data[0].x) == len(pruning.PRUNING_METHODS)


def test_gaps_are_judged_seed_by_seed():
    def rows(method, stage, accuracies):
        return [{"seed": s, "method": method, "stage": stage, "test_accuracy": a, "zeros": 0.5, "kept_norm": 0.9}
                for s, a in enumerate(accuracies)]

    dense = rows(pruning.DENSE, "trained", [0.90, 0.95, 0.80]) + rows(pruning.DENSE, "fine-tuned", [0.9] * 3)
    steady = rows("2:4 magnitude", "pruned", [0.89, 0.94, 0.79])  # one point below its own seed, every time
    noisy = rows("2:4 random", "pruned", [0.80, 0.99, 0.80])  # one point below on average, but by chance
    tuned = rows("2:4 random", "fine-tuned", [0.9] * 3)
    summary = {(s["method"], s["stage"]): s for s in pruning.summarize_pruning(dense + steady + noisy + tuned)}
    assert summary["2:4 magnitude", "pruned"]["gap_to_dense"] == pytest.approx(-0.01)
    assert summary["2:4 magnitude", "pruned"]["within_noise"] is False  # paired: the spread of differences is ~0
    assert summary["2:4 random", "pruned"]["gap_to_dense"] == pytest.approx(-0.02)
    assert summary["2:4 random", "pruned"]["within_noise"] is True
    assert summary["2:4 random", "fine-tuned"]["gap_to_dense"] == 0  # against the dense network trained as long
    single = pruning.summarize_pruning(dense[:1] + steady[:1])
    assert single[1]["noise"] is None and single[1]["within_noise"] is None


def test_fine_tuning_keeps_the_mask_and_the_check_catches_a_broken_one(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    W = model[0].weight
    mask = patterns.magnitude_2_4_mask(W.detach())
    with torch.no_grad():
        W.mul_(mask)
    pruning._check_pruned(model, [mask], "2:4 magnitude", torch.randn(3, 8))
    with torch.no_grad():
        W[~mask] = 1.0  # a pruned weight that came back
    with pytest.raises(AssertionError, match="nonzero weights where the mask pruned them"):
        pruning._check_pruned(model, [mask], "2:4 magnitude", torch.randn(3, 8))


def test_pruning_accuracy_checks_its_arguments():
    with pytest.raises(ValueError, match="^hidden: every layer's input size must be a multiple of 4"):
        pruning.pruning_accuracy((30,))
    with pytest.raises(ValueError, match="^seeds:"):
        pruning.pruning_accuracy((16,), seeds=())
    with pytest.raises(ValueError, match="^learning_rate:"):
        pruning.pruning_accuracy((16,), learning_rate=0)


# ---------------------------------------------------------------------------------------------
# Peaks


def test_sparse_peaks_are_twice_the_dense_ones():
    a100 = speedup.sparse_peak(specs.gpu("A100 SXM4 80GB"), "float16")
    assert a100.tflops == pytest.approx(624, rel=0.01)  # the course's "A100 FP16 TC with sparsity: 624 TFLOPS"
    tf32 = speedup.sparse_peak(specs.gpu("A100 SXM4 80GB"), "tf32")
    assert tf32.tflops == pytest.approx(312, rel=0.01)
    h200 = specs.gpu("H200 SXM 141GB")
    assert speedup.sparse_peak(h200, "bfloat16").tflops == pytest.approx(2 * specs.peak(h200, "bfloat16").tflops)
    with pytest.raises(ValueError, match="^row: .*Volta.*no sparse tensor cores"):
        speedup.sparse_peak(specs.gpu("V100 SXM2 32GB"), "float16")
    with pytest.raises(ValueError, match="^precision:"):
        speedup.sparse_peak(h200, "float64")
    rows = {r["gpu"]: r for r in speedup.peak_rows(["V100 SXM2 32GB", "H200 SXM 141GB"])}
    assert rows["V100 SXM2 32GB"]["sparse_tflops"] is None and "Ampere" in rows["V100 SXM2 32GB"]["reason"]
    assert rows["H200 SXM 141GB"]["sparse_tflops"] == pytest.approx(2 * rows["H200 SXM 141GB"]["dense_tflops"])


# ---------------------------------------------------------------------------------------------
# torch.sparse's semi-structured matmuls


def test_constraints_are_read_from_torch():
    rows = speedup.semi_structured_constraints()
    assert {r["backend"] for r in rows} == set(speedup.BACKENDS)
    assert any(r["backend"] == "cusparselt" and r["dtype"] == "float16" for r in rows)


def test_the_switch_between_backends_is_restored():
    cls = torch.sparse.SparseSemiStructuredTensor
    before = cls._FORCE_CUTLASS
    with speedup.semi_structured_backend("cutlass"):
        assert cls._FORCE_CUTLASS is True
    with speedup.semi_structured_backend("cusparselt"):
        assert cls._FORCE_CUTLASS is False
    assert before is cls._FORCE_CUTLASS
    with pytest.raises(ValueError, match="^backend:"):
        speedup.semi_structured_unavailable(torch.device("cpu"), "float16", "magma")


@pytest.mark.skipif(HAS_SPARSE_GPU, reason="on a GPU with sparse tensor cores the experiments run")
def test_gpu_experiments_give_rows_with_a_reason_on_a_cpu():
    rows = speedup.linear_speedup([64], [64], dtypes=["float16"])
    assert [r["backend"] for r in rows] == list(speedup.BACKENDS)
    assert all(r["status"].startswith("not available: torch's 2:4 sparse matmuls run on NVIDIA GPUs") for r in rows)
    assert all(r["status"].startswith("not available") for r in speedup.orientations(64, 64))


def test_linear_speedup_checks_its_arguments():
    with pytest.raises(ValueError, match="^weight_sizes: multiples of 64"):
        speedup.linear_speedup([100], [64])
    with pytest.raises(ValueError, match="^backends:"):
        speedup.linear_speedup([64], [64], backends=["magma"])
    with pytest.raises(ValueError, match="^dtypes:"):
        speedup.linear_speedup([64], [64], dtypes=["float32"])
    with pytest.raises(ValueError, match="^tokens:"):
        speedup.linear_speedup([64], [0])


def test_speedup_figure_from_rows():
    rows = [{"dtype": "float16", "n": 1024, "tokens": t, "backend": b, "seconds": 1e-3, "tflops": 1.0,
             "speedup": s, "status": "ok"} for t, s in ((256, 0.8), (1024, 1.3)) for b in speedup.BACKENDS]
    rows.append({"dtype": "bfloat16", "backend": "cutlass", "status": "not available: reason"})
    fig = figures.speedup_figure(rows, title="t")
    assert len(fig.data) == 2 and list(fig.data[0].y) == [0.8, 1.3]
    dense = [{**r, "backend": "dense"} for r in rows[:2]]
    assert len(figures.rate_figure(rows + dense, 1024, title="t", peaks={"peak": 10.0}).data) == 3


@needs_gpu(capability=(8, 0))
def test_linear_speedup_on_the_gpu():
    rows = speedup.linear_speedup([256], [256, 512], dtypes=["float16"])
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["backend"] for r in ok} >= {"dense"}
    for r in ok:
        assert r["relative_error"] < 1e-2 and r["tflops"] > 0
        if r["backend"] != "dense":
            assert r["speedup"] > 0 and r["backend_used"] == r["backend"] and 0.4 < r["stored_fraction"] < 1.5


@needs_gpu(capability=(8, 0))
def test_orientations_on_the_gpu():
    # Not every backend runs on every GPU (torch 2.11's CUTLASS 2:4 kernels refuse compute capability 9.0), so a
    # row may say "not supported" in torch's words; what must hold is that no row is ever wrong, and that the layer's
    # own product runs correctly through at least one backend: PyTorch's default, cuSPARSELt, wherever it is built.
    rows = speedup.orientations(256, 128)
    for r in rows:
        if r["status"] == "ok":
            assert r["relative_error"] <= MATMUL_TOLERANCE["float16"]
        else:
            kind, _, message = r["status"].partition(": ")
            assert kind in ("not supported", "not available") and message.strip(), r
    linear = {r["backend"]: r for r in rows if r.get("expression") == "F.linear(X, Ws)"}
    ok = [r for r in linear.values() if r["status"] == "ok"]
    assert ok and all(r["output_shape"] == [128, 256] for r in ok)  # tokens x outputs, as nn.Linear gives
    if torch.backends.cusparselt.is_available():
        assert linear.get("cusparselt", {}).get("status") == "ok", [r for r in rows if r["backend"] == "cusparselt"]


def test_the_sweep_and_its_checks_run_end_to_end_with_a_stand_in_backend(monkeypatch):
    # No sparse GPU here: let "cusparselt" hand back the dense weight itself, and "cutlass" refuse, so that the
    # sweep's own logic (checks, timing, speed-ups, refusals as rows) runs on the CPU.
    def stand_in(W, backend):
        if backend == "cutlass":
            raise RuntimeError("shape not supported\nsecond line")
        return W

    monkeypatch.setattr(speedup, "semi_structured_unavailable", lambda device, dtype, backend: None)
    monkeypatch.setattr(speedup, "to_semi_structured", stand_in)
    rows = speedup.linear_speedup([64], [16, 32], dtypes=["float16"])
    ok = {(r["backend"], r["tokens"]): r for r in rows if r["status"] == "ok"}
    assert set(ok) == {(b, t) for b in ("dense", "cusparselt") for t in (16, 32)}
    for t in (16, 32):
        sparse, dense = ok["cusparselt", t], ok["dense", t]
        assert sparse["speedup"] == pytest.approx(dense["seconds"] / sparse["seconds"])
        assert sparse["tflops"] == pytest.approx(2 * t * 64 * 64 / sparse["seconds"] / 1e12)
        assert sparse["relative_error"] < 1e-2 and sparse["compress_seconds"] >= 0
    refused = [r for r in rows if r["backend"] == "cutlass"]
    assert len(refused) == 2 and all(r["status"] == "not available: shape not supported" for r in refused)

    orientation = {r["expression"]: r for r in speedup.orientations(64, 16, dtype="float32", backends=["cusparselt"])}
    assert all(r["status"] == "ok" for r in orientation.values())  # a dense stand-in supports every product
    monkeypatch.setattr(speedup, "to_semi_structured", lambda W, backend: W.T.contiguous())  # a wrong "compression"
    wrong = {r["expression"]: r["status"] for r in speedup.orientations(64, 16, dtype="float32",
                                                                          backends=["cusparselt"])}
    assert wrong["F.linear(X, Ws)"] == "wrong result"


def test_the_sweep_raises_on_a_wrong_product(monkeypatch):
    monkeypatch.setattr(speedup, "semi_structured_unavailable", lambda device, dtype, backend: None)
    monkeypatch.setattr(speedup, "to_semi_structured", lambda W, backend: W.T.contiguous())
    with pytest.raises(AssertionError, match="relative error"):
        speedup.linear_speedup([64], [16], dtypes=["float16"], backends=["cusparselt"])


def test_speedup_statements_read_the_rows():
    def row(backend, tokens, seconds, **extra):
        return {"dtype": "float16", "n": 1024, "tokens": tokens, "backend": backend, "seconds": seconds,
                "tflops": 2 * tokens * 1024**2 / seconds / 1e12, "status": "ok", **extra}

    sparse = dict(compress_seconds=2e-3, backend_used="cusparselt", stored_fraction=0.5625, output_contiguous=False)
    rows = [row("dense", 256, 1e-4), row("cusparselt", 256, 2e-4, speedup=0.5, **sparse),
            row("dense", 4096, 1e-3), row("cusparselt", 4096, 8e-4, speedup=1.25, **sparse),
            {"dtype": "bfloat16", "backend": "cutlass", "status": "not available: reason"}]
    lines = speedup.speedup_statements(rows, specs.gpu("H200 SXM 141GB"))
    assert lines[0].startswith("float16, cusparselt: best speed-up 1.25x at n = 1,024 and 4,096 tokens")
    assert "of the sparse peak" in lines[0] and lines[0].endswith("for n = 1,024: from 4,096 tokens")
    assert lines[1].startswith("float16, dense: at best") and "of the dense peak" in lines[1]
    assert "2.0 ms, the time of 2.0 dense products" in lines[2] and "56.25%" in lines[2]
    assert "transposed view" in lines[2]
    assert speedup.speedup_statements(rows[:1] + rows[-1:]) == []
