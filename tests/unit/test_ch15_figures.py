"""Chapter 15's figures and tables: built from runs (every recorded GPU behind a menu, a GPU column in the tables),
their cells and sentences read from the rows."""

from __future__ import annotations

import copy

import pytest
import torch

from gpulab.ch15_structured_sparsity import figures, patterns, pruning
from gpulab.core import recordings
from gpulab.core.recordings import Recording


def run_of(experiment: str, device: str = "NVIDIA H200") -> Recording:
    source = recordings.load(experiment, "H200")
    provenance = {"device": {"name": device, "kind": "cuda"}, "date": "2026-11-24", "recorded": True}
    return Recording(experiment, source.function, dict(source.params), copy.deepcopy(source.rows), provenance)


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def test_the_pattern_in_a_sentence_and_a_row_group_by_group():
    W = torch.tensor([[1.0, -4.0, 2.0, 0.5, 3.0, 0.1, -0.2, 5.0]])
    pruned = patterns.prune_2_4(W)
    packed = patterns.compress(pruned)
    said = figures.pattern_summary(W, pruned, packed)
    assert "2:4 before pruning False, after True (nonzeros per group after: [2])" in said
    rows = cells(figures.compressed_row_table(pruned, packed))
    assert rows[0]["compressed: values kept"] == "-4.00   2.00" and rows[0]["their positions 0-3"] == "1 2"
    assert rows[1]["their positions 0-3"] == "0 3"


def test_storage_table_counts_real_matrices_and_refuses_a_wrong_formula(monkeypatch):
    rows = {r["format"]: r for r in cells(figures.storage_table())}
    assert rows["float16"]["compressed / dense"] == rows["float16"]["counted on a 64 x 256 matrix"] == "0.5625"
    assert rows["int8"]["metadata overhead"] == "25.0%" and rows["float8_e4m3"]["counted on a 64 x 256 matrix"] == "–"
    monkeypatch.setattr(figures, "storage_rows", lambda: [{**patterns.storage_rows()[0], "fraction_of_dense": 0.5}])
    with pytest.raises(AssertionError, match="float16: .* bytes counted"):
        figures.storage_table()


def test_peaks_table_gives_a_reason_where_there_are_no_sparse_tensor_cores():
    rows = cells(figures.peaks_table(["V100 SXM2 32GB", "A100 SXM4 80GB"]))
    assert rows[0]["2:4 sparse (TFLOP/s)"] == "–" and "no sparse tensor cores" in rows[0]["from"]
    assert rows[1]["dense float16 (TFLOP/s)"] == "312" and rows[1]["2:4 sparse (TFLOP/s)"] == "624"


def test_pruning_table_and_sentences_from_the_summary():
    summary = [{"method": pruning.DENSE, "stage": "trained", "runs": 2, "accuracy_mean": 0.9, "accuracy_sd": 0.01,
                "accuracy_min": 0.89, "accuracy_max": 0.91, "zeros": 0.0, "kept_norm": 1.0}]
    for i, method in enumerate(pruning.PRUNING_METHODS):
        for stage, gap, within in (("pruned", -0.1 * (3 - i), False), ("fine-tuned", -0.001, True)):
            summary.append({**summary[0], "method": method, "stage": stage, "zeros": 0.5, "kept_norm": 0.5 + 0.1 * i,
                            "gap_to_dense": gap, "within_noise": within})
    rows = cells(figures.pruning_table(summary))
    assert rows[0]["against dense (points)"] == "–" and rows[0]["accuracy, mean (%)"] == "90.00"
    assert rows[1]["against dense (points)"] == "-30.00 *" and rows[2]["against dense (points)"] == "-0.10"
    said = figures.pruning_statements(summary)
    assert said[0] == ("2:4 magnitude: keeps 50% of the weights' squared norm; pruning moves the accuracy -30.0 points "
                       "(beyond the noise); after fine-tuning it is -0.1 points from the dense network (within the "
                       "noise).")
    assert "the fall right after pruning shrinks in step" in said[-1] and "still below it: none." in said[-1]


def test_orientation_tables_and_sentences():
    run = run_of("sparsity_orientations")
    rows = cells(figures.orientations_table([run]))
    assert rows[0]["output"] == "512 x 1024, a transposed view" and rows[1]["output"] == "1024 x 512, contiguous"
    assert rows[2]["result"].startswith("not supported:") and rows[2]["relative error"] == "–"
    assert figures.orientation_statements([run]) == [
        "NVIDIA H200, recorded 2026-11-24: the layer's product, F.linear(X, Ws), runs correctly through cusparselt; "
        "cutlass refuses it."]


def test_speedup_tables_figures_and_sentences():
    run = run_of("sparsity_linear_speedup")
    table = figures.speedup_table([run])
    first = cells(table)[0]
    assert first["dense (ms)"] == "0.009" and first["cusparselt over dense"] == "0.02"
    assert first["cutlass (ms)"] == "not available" and first["cutlass (TFLOP/s)"] == "–"
    assert figures.speedup_refusals([run]) == [
        "NVIDIA H200, recorded 2026-11-24, cutlass: none of its 32 products ran (not available: "
        "sparse_semi_structured_mad_op : Supported only on GPUs with compute capability 8.x)."]
    said = figures.speedup_summary([run])
    assert said[0] == "NVIDIA H200, recorded 2026-11-24:" and all(line.startswith("- ") for line in said[1:])
    assert any("sparse won 11 of 32 products" in line for line in said)
    assert any("3 of the 11 products sparse won ran faster" in line for line in said)
    two = [run, run_of("sparsity_linear_speedup", "NVIDIA H100 80GB HBM3")]
    assert [b.label for b in figures.speedup_by_gpu(two).layout.updatemenus[0].buttons] == ["H200", "H100 80GB HBM3"]
    rate = figures.rate_by_gpu([run])
    assert "16,384 x 16,384 weight" in rate.layout.title.text
    assert [a.text for a in rate.layout.annotations] == ["H200 SXM 141GB dense peak (float16 and bfloat16)",
                                                         "H200 SXM 141GB 2:4 sparse peak (float16 and bfloat16)"]
    nothing = run_of("sparsity_linear_speedup")
    nothing.rows = [r for r in nothing.rows if r["backend"] == "dense"]
    assert figures.speedup_summary([nothing]) == [
        "NVIDIA H200, recorded 2026-11-24: no sparse product ran, so there is nothing to compare."]
    assert figures.speedup_by_gpu([nothing]).layout.title.text == "No recording yet"


def test_constraints_table_names_the_installed_pytorch():
    assert torch.__version__ in figures.constraints_table().caption
