"""Chapter 17 (gpulab.ch17_hopper_tensor_cores): its sizes, the live checks and the machine code, and its tables,
figures, sentences, claims and answers built from synthetic recordings in a results folder of the test's own."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gpulab.ch17_hopper_tensor_cores import (
    answers,
    claims,
    figures,
    fp8_figures,
    measure,
    plan,
    quantization,
    sass_evidence,
)
from gpulab.core import budget, kernel_mode, recordings, specs
from gpulab.core import claims as core_claims
from gpulab.core.printing import exercise_answers
from gpulab.kernels import fp8
from gpulab.kernels.triton_gemm import ladder, step2_pipelined

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
STEPS = ("step1_blocked", "step2_pipelined", "step3_grouped", "step4_tma", "step5_persistent",
         "step6_warp_specialized")


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def record(root, gpu: str, experiment: str, rows: list[dict], date: str = "2026-11-26T00:00:00") -> None:
    folder = root / gpu.lower().replace(" ", "-")
    folder.mkdir(parents=True, exist_ok=True)
    data = {"schema": recordings.SCHEMA, "experiment": experiment, "function": "m:f", "params": {}, "rows": rows,
            "provenance": {"device": {"name": gpu, "kind": "cuda"}, "date": date}}
    (folder / f"{experiment}.json").write_text(json.dumps(data))


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    return tmp_path


# ---- synthetic recordings -----------------------------------------------------------------------------------------

def ladder_rows(rates: dict[str, float], cublas: float = 700.0, sizes=(4096, 8192),
                dtypes=("bfloat16", "float16")) -> list[dict]:
    """A ladder recording's rows: cuBLAS at ``cublas`` TFLOP/s, each kernel at ``rates[kernel]``."""
    rows = []
    for n in sizes:
        for dtype in dtypes:
            rows.append({"n": n, "dtype": dtype, "kernel": "cuBLAS", "tflops": cublas, "share_of_cublas": 1.0,
                         "seconds": 1e-3, "relative_error": 1e-3})
            for kernel, rate in rates.items():
                tma = kernel.startswith(("step4", "step5", "step6"))
                _, _, depth = kernel.partition("(num_stages=")
                stages = int(depth.rstrip(")")) if depth else 1 if kernel.startswith("step1") else 3
                rows.append({"n": n, "dtype": dtype, "kernel": kernel, "tflops": rate, "share_of_cublas": rate / cublas,
                             "seconds": 1e-3, "relative_error": 1e-3, "tensor_core": "HGMMA (wgmma)",
                             "sass_HMMA": 0, "sass_HGMMA": 4, "sass_USETMAXREG": 0,
                             "sass_instructions": 1040 if tma else 824,
                             "sass_LDG": 0 if tma else 8, "sass_LDGSTS": 0 if tma else 36,
                             "sass_UTMALDG": 6 if tma else 0, "registers": 160 if tma else 210, "spills": 0,
                             "shared_bytes": 147456, "num_stages": stages, "warp_specialized": False})
    return rows


LADDER_RATES = {"step1_blocked": 200.0, "step2_pipelined": 300.0, "step2_pipelined (num_stages=4)": 310.0,
                "step3_grouped": 320.0, "step4_tma": 650.0, "step5_persistent": 680.0,
                "step6_warp_specialized": 679.0}
# a ladder shaped like the recorded ones, against cuBLAS at 700 TFLOP/s: every ladder claim holds on it
LADDER_AS_RECORDED = {"step1_blocked": 280.0, "step2_pipelined": 660.0, "step2_pipelined (num_stages=1)": 320.0,
                      "step2_pipelined (num_stages=2)": 450.0, "step2_pipelined (num_stages=4)": 665.0,
                      "step3_grouped": 675.0, "step4_tma": 685.0, "step5_persistent": 700.0,
                      "step6_warp_specialized": 698.0}


def fp8_rows(path_speedup: float = 0.8, large_speedup: float = 1.8, error: float = 0.0375) -> list[dict]:
    """An fp8_matmul recording's rows, shaped like the sweep's: the matmul alone gains at the large sizes only, the
    whole path reaches ``path_speedup`` at the largest size, errors follow the unit roundoffs."""
    rows = []
    sizes = (256, 1024, 4096, 8192)
    for n in sizes:
        bf16_seconds = 2 * n**3 / 700e12 + 2e-5
        for fmt, ratio in (("e4m3", 1.0), ("e5m2 x e4m3", quantization.error_ratio_model())):
            for granularity in ("tensor", "row"):
                speedup = large_speedup if n >= 4096 else 0.95
                path = path_speedup * (n / sizes[-1])
                quantize = 2 * 41 * n * n / 2.4e12 + 2e-5
                rows.append({"n": n, "device": "gpu", "bfloat16_tflops": 2 * n**3 / bf16_seconds / 1e12,
                             "bfloat16_seconds": bf16_seconds, "bfloat16_error": 0.0017, "format": fmt,
                             "granularity": granularity, "relative_error": error * ratio,
                             "error_vs_bfloat16": error * ratio / 0.0017,
                             "fp8_tflops": 2 * n**3 / (bf16_seconds / speedup) / 1e12,
                             "fp8_seconds": bf16_seconds / speedup, "path_tflops": 1.0,
                             "path_seconds": bf16_seconds / path, "quantize_seconds": quantize,
                             "quantize_share": min(1.0, quantize * path / bf16_seconds),
                             "speedup_matmul": speedup, "speedup_path": path})
    return rows


COPY = [{"ceiling": "bandwidth", "gbytes_per_s": 3000.0, "status": "ok"}]


# ---- the plan ------------------------------------------------------------------------------------------------------

def test_every_setting_names_sizes_the_kernels_accept():
    for sizes in (plan.FULL, plan.CPU, plan.SMOKE, *plan.CLASSES):
        m, n, k = sizes["check_shape"]
        assert n % 8 == 0 and k % 8 == 0, "TMA needs N and K multiples of 8"
        assert all(s % fp8.MULTIPLE == 0 for s in sizes["fp8_sizes"])
        assert set(sizes["ladder_dtypes"]) <= set(ladder.DTYPES)
        assert len(sizes["error_shape"]) == 3 and 0.0 in sizes["spreads"]
    assert plan.SMOKE["check_shape"][0] * plan.SMOKE["check_shape"][1] < plan.CPU["check_shape"][0] * plan.CPU[
        "check_shape"][1]
    # the recordings' sizes are the sweeps' own defaults, so that a GPU run of the page re-records the same thing
    assert plan.FULL["ladder_sizes"] == [4096, 8192] and plan.FULL["ladder_stages"] == list(step2_pipelined.STAGES)
    assert plan.FULL["fp8_sizes"] == list(fp8.SWEEP_SIZES)
    assert [tuple(f) if isinstance(f, list) else f for f in plan.FULL["fp8_formats"]] == list(fp8.SWEEP_FORMATS)


def test_a_gpu_without_tma_or_fp8_runs_neither_and_a_hopper_runs_the_ladder_within_three_minutes():
    t4, l4, h100 = (specs.gpu(name) for name in ("T4", "L4", "H100 SXM5 80GB"))
    full = plan.CHAPTER.plan("full", t4)
    assert full.seconds_on(t4) == pytest.approx(plan.fixed_seconds(full.sizes) + sum(
        w.seconds_on(t4) for w in plan.live_work(full.sizes)))
    assert all(w.seconds_on(t4) == 0 for w in [*plan.ladder_work(full.sizes), *plan.fp8_work(full.sizes)])
    assert all(w.seconds_on(l4) == 0 for w in plan.ladder_work(full.sizes))
    assert sum(w.seconds_on(l4) for w in plan.fp8_work(full.sizes)) > 0
    ladder_seconds = sum(w.seconds_on(h100) for w in plan.ladder_work(full.sizes))
    assert 20 < ladder_seconds <= 180, ladder_seconds
    assert plan.CHAPTER.plan("class", l4).seconds_on(l4) <= budget.CLASS_SECONDS


# ---- the live checks and the machine code --------------------------------------------------------------------------

def test_live_checks_pass_every_step_and_refuse_bad_shapes():
    rows = measure.live_checks((40, 48, 32))
    assert [r["kernel"] for r in rows] == list(STEPS)
    assert all(r["status"] == "ok" and r["relative_error"] < r["tolerance"] for r in rows)
    shown = cells(figures.checks_table(rows))
    assert shown[0]["step"] == "1 blocked" and shown[0]["check"] == "passed" and shown[3]["M x N x K"] == "40 x 48 x 32"
    for bad in ((40, 44, 32), (40, 48), (0, 48, 32)):
        with pytest.raises(ValueError, match="shape"):
            measure.live_checks(bad)
    with pytest.raises(ValueError, match="dtype"):
        measure.live_checks((40, 48, 32), dtype="float32")
    assert "1.0" not in measure.tolerance_note("float16", 256) and "sqrt(K)" in measure.tolerance_note("float16", 256)


def test_a_gpu_experiment_without_a_gpu_draws_the_recordings(results, capsys):
    record(results, H100, "fp8_matmul", fp8_rows())
    found = measure.runs_where_supported("fp8_matmul", fp8.fp8_sweep, measure.FP8_CAPABILITY)
    assert [run.device_name for run in found] == [H100] and found.live is None
    if not kernel_mode.on_gpu():
        assert measure.missing_capability((9, 0)) == "there is no GPU here"
        none = measure.runs_where_supported("triton_gemm_ladder", ladder.ladder_sweep, measure.LADDER_CAPABILITY)
        assert len(none) == 0 and "no recording yet" in capsys.readouterr().out


def evidence_row(kernel: str, target: str = "sm_90", **values) -> dict:
    row = {"kernel": kernel, "source": kernel, "target": target, **{f"sass_{op}": 0 for op in ladder.SIGNATURE_OPCODES},
           "sass_instructions": 800, "sass_digest": kernel, "registers": 200, "local_bytes": 0,
           "shared_bytes": 147456, "num_stages": 3, "num_warps": 8, "warp_specialized": False,
           "tensor_core": "HGMMA (wgmma)"}
    row.update(values)
    return row


def test_evidence_sentences_read_the_instruction_counts():
    rows = [evidence_row(sass_evidence.WMMA_LABEL, sass_HMMA=64, sass_LDGSTS=16, tensor_core="HMMA (mma.sync)")]
    rows += [evidence_row(s, sass_HGMMA=4, sass_LDG=8 if s == "step1_blocked" else 0,
                          sass_LDGSTS=36 if s in ("step2_pipelined", "step3_grouped") else 0,
                          sass_UTMALDG=6 if s[4] in "456" else 0, registers=160 if s[4] in "456" else 210,
                          sass_digest="same" if s[4] in "56" else s) for s in STEPS]
    rows.append(evidence_row("step2_pipelined", "sm_80", sass_HMMA=128, tensor_core="HMMA (mma.sync)"))
    said = figures.evidence_statements(rows)
    assert said[0].startswith("For sm_90, chapter 10's WMMA kernel holds 64 HMMA instructions and no HGMMA")
    assert "holds 128 HMMA instructions where its sm_90 code holds 4 HGMMA" in said[1]
    assert "where Ampere's code needs 32 HMMA" in said[1]
    assert said[2].startswith("Steps 1 to 3 load") and "160 to 160 registers" in said[2]
    assert said[3].startswith("Step 6 asks for warp specialization and gets none")
    rows[-2]["sass_digest"] = "different"
    assert figures.evidence_statements(rows)[3].startswith("Step 6's machine code differs from step 5's")
    shown = cells(figures.evidence_table(rows))
    assert shown[0]["tensor-core instructions"] == "64 HMMA" and shown[4]["global loads"] == "6 UTMALDG"
    assert shown[1]["shared memory (KiB)"] == "144"
    assert figures.evidence_statements([]) == []


def test_the_compiled_kernels_show_hmma_for_wmma_hgmma_for_triton_and_step_6_as_step_5():
    rows, reason = sass_evidence.evidence_or_reason()
    assert reason is None, reason
    hopper = {r["kernel"]: r for r in rows if r["target"] == "sm_90"}
    assert hopper[sass_evidence.WMMA_LABEL]["sass_HMMA"] > 0 and hopper[sass_evidence.WMMA_LABEL]["sass_HGMMA"] == 0
    assert all(hopper[s]["sass_HGMMA"] > 0 and hopper[s]["sass_HMMA"] == 0 for s in STEPS)
    assert hopper["step4_tma"]["sass_UTMALDG"] > 0 and hopper["step3_grouped"]["sass_UTMALDG"] == 0
    assert hopper["step6_warp_specialized"]["sass_digest"] == hopper["step5_persistent"]["sass_digest"]
    ampere = next(r for r in rows if r["target"] == "sm_80")
    assert ampere["sass_HMMA"] > 0 and ampere["sass_HGMMA"] == 0
    assert all(r["registers"] > 0 and r["local_bytes"] == 0 for r in rows)


# ---- the ladder's figure, table and sentences ----------------------------------------------------------------------

def test_ladder_figure_table_and_sentences_per_gpu(results):
    record(results, H100, "triton_gemm_ladder", ladder_rows(LADDER_RATES))
    record(results, H200, "triton_gemm_ladder", ladder_rows({**LADDER_RATES, "step5_persistent": 600.0}))
    runs = recordings.recorded("triton_gemm_ladder")
    fig = figures.ladder_figure(runs)
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert labels[0] == "H100 80GB HBM3: bfloat16, 4,096^3" and len(labels) == 8
    assert [bar.x for bar in fig.data[:1]][0][:3] == ("cuBLAS", "1 blocked", "2 pipelined")
    assert fig.data[0].text[5] == f"{650 / 700:.0%}"
    assert fig.layout.shapes[0].y0 == pytest.approx(0.9 * 700)
    table = cells(figures.ladder_table(runs))
    tma = next(r for r in table if r["kernel"] == "4 TMA")
    assert tma["global loads"] == "6 UTMALDG" and tma["tensor cores"] == "HGMMA" and tma["of cuBLAS"] == "93%"
    assert any(r["kernel"] == "2 pipelined, 4 stages" for r in table)
    said = figures.ladder_statements(runs)
    assert said[0].startswith("NVIDIA H100 80GB HBM3, recorded 2026-11-26, bfloat16 at 8,192^3: step 1 (blocked) ran "
                              f"at 200 TFLOP/s, {200 / 700:.0%} of cuBLAS's 700. Each step against the one before: "
                              f"step 2 (pipelined) {300 / 200:.2f}x, step 3 (grouped) {320 / 300:.2f}x, ")
    assert f"step 4 (TMA) {650 / 320:.2f}x" in said[0] and f"step 6 (warp-specialized) {679 / 680:.2f}x." in said[0]
    assert ("The best, step 5 (persistent), ran at 680 TFLOP/s, 97% of cuBLAS in the same run: it meets the target "
            "of 90%.") in said[0]
    assert "misses" not in said[0] and said[0].endswith("Step 6 was not warp-specialized in its code.")
    assert "The best, step 6 (warp-specialized), ran at 679 TFLOP/s, 97% of cuBLAS" in said[1]
    assert figures.ladder_figure([]) is None and figures.ladder_table([]) is None


def test_the_ladder_says_nothing_where_nothing_was_recorded(results, capsys):
    runs = recordings.recorded("triton_gemm_ladder")
    assert "triton_gemm_ladder: no recording yet." in capsys.readouterr().out
    figures.show_ladder(runs)
    assert figures.ladder_statements(runs) == [] and capsys.readouterr().out == ""


def test_step_labels():
    assert figures.step_label("step2_pipelined (num_stages=4)") == "2 pipelined, 4 stages"
    assert figures.step_label("step2_pipelined (num_stages=1)") == "2 pipelined, 1 stage"
    assert figures.step_label("cuBLAS") == "cuBLAS" and figures.step_label("step4_tma") == "4 TMA"


# ---- FP8 -----------------------------------------------------------------------------------------------------------

def test_the_formats_come_from_finfo():
    rows = {r["format"]: r for r in quantization.format_rows()}
    assert rows["e4m3"]["max"] == torch.finfo(torch.float8_e4m3fn).max
    assert (rows["e4m3"]["exponent_bits"], rows["e4m3"]["fraction_bits"]) == (4, 3)
    assert (rows["e5m2"]["exponent_bits"], rows["e5m2"]["fraction_bits"]) == (5, 2)
    assert (rows["bfloat16"]["exponent_bits"], rows["bfloat16"]["fraction_bits"]) == (8, 7)
    assert rows["e4m3"]["unit_roundoff"] == fp8.UNIT_ROUNDOFF["e4m3"]
    assert rows["e4m3"]["smallest_subnormal"] == 2.0**-9
    assert cells(fp8_figures.formats_table(list(rows.values())))[2]["largest"] == "448"
    with pytest.raises(ValueError, match="names"):
        quantization.format_rows(["int8"])


def test_the_quantization_is_counted_operation_by_operation():
    operations = quantization.quantize_operations()
    assert operations[0]["operation"] == "abs" and operations[-2]["operation"] == "_to_copy"
    traffic = quantization.quantize_traffic()
    assert traffic["operations"] == len(operations) and traffic["whole_tensor_passes"] >= 3
    assert traffic["bytes_per_element"] > traffic["least_current"] > traffic["least_delayed"] == 3
    assert quantization.quantize_traffic("e4m3", "row")["bytes_per_element"] >= traffic["bytes_per_element"]
    table = cells(fp8_figures.operations_table(operations))
    assert table[-1]["ATen operation (one GPU kernel)"] == "total"
    assert float(table[-1]["moved (bytes per element)"]) == pytest.approx(traffic["bytes_per_element"], abs=0.01)
    with pytest.raises(ValueError, match="granularity"):
        quantization.quantize_operations("e4m3", "block")
    row = {"n": 1024, "format": "e5m2 x e4m3", "granularity": "tensor", "quantize_seconds": 1e-3}
    assert quantization.quantized_bytes(row) == pytest.approx(2 * traffic["bytes_per_element"] * 1024**2, rel=0.01)


def test_emulated_errors_and_their_sentences():
    rows = quantization.error_rows(64, 64, 128)
    assert len(rows) == 2 * 3 * 2
    said = fp8_figures.error_statements(rows)
    assert said[0].startswith("On operands of one scale, e4m3's error is") and "predict 1.58" in said[0]
    assert said[1].startswith("With rows spread over 10^±3, one scale for the whole tensor")
    shown = cells(fp8_figures.errors_table(rows))
    assert shown[0]["operands"] == "one scale" and shown[-1]["operands"] == "rows over 10^±3"
    assert quantization.error_ratio_model() == pytest.approx(math.sqrt(2.5))


def test_fp8_figure_tables_and_sentences_per_gpu(results):
    refused = {"n": 256, "format": "e5m2 x e4m3", "granularity": "row", "unsupported": "no kernel"}
    record(results, H100, "fp8_matmul", [*fp8_rows(), refused])
    record(results, H100, "blas_ceilings", COPY)
    record(results, H200, "fp8_matmul", fp8_rows(path_speedup=1.2))
    runs = recordings.recorded("fp8_matmul")
    fig = fp8_figures.fp8_figure(runs)
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert labels[0] == "H100 80GB HBM3: e4m3, tensor-wise" and len(labels) == 8
    assert [t.name for t in fig.data[:3]] == [name for name, _, _ in fp8_figures.SERIES]
    assert fig.layout.xaxis.type == "log"
    said = fp8_figures.pays_statements(runs)
    assert "beats bfloat16 in every configuration from n = 4,096 on" in said[0] and "never does" in said[0]
    assert said[1].endswith("beats it from n = 8,192 on.")
    assert fp8_figures.unsupported_statements(runs) == [
        "NVIDIA H100 80GB HBM3, recorded 2026-11-26: e5m2 x e4m3, row-wise did not run (no kernel)."]
    table = cells(fp8_figures.quantization_table(runs))
    h100 = next(r for r in table if r["GPU"] == "H100 80GB HBM3" and r["n"] == "8,192")
    assert h100["of the copy"].endswith("%") and next(r for r in table if r["GPU"] == "H200")["of the copy"] == "–"
    assert len(cells(fp8_figures.fp8_table(runs))) == 2 * 16


# ---- the claims ----------------------------------------------------------------------------------------------------

FP8_CLAIMS = [claims.MATMUL_PAYS_WHEN_LARGE, claims.SMALL_GAINS_LITTLE, claims.PATH_SLOWER,
              claims.QUANTIZATION_MEMORY_BOUND, claims.FORMAT_ERROR_RATIO, claims.ERRORS_FLAT]


def test_the_claims_hold_on_a_recording_that_bears_them_out(results):
    record(results, H100, "fp8_matmul", fp8_rows())
    record(results, H100, "blas_ceilings", COPY)
    for claim in FP8_CLAIMS:
        checks = core_claims.verify(claim)
        assert checks and all(c.verdict.holds for c in checks), (claim.name, checks)


@pytest.mark.parametrize("claim, rows", [
    (claims.MATMUL_PAYS_WHEN_LARGE, fp8_rows(large_speedup=1.1)),
    (claims.PATH_SLOWER, fp8_rows(path_speedup=1.05)),
    (claims.FORMAT_ERROR_RATIO, [{**r, "relative_error": 0.0375} for r in fp8_rows()]),
    (claims.ERRORS_FLAT, [{**r, "relative_error": r["relative_error"] * r["n"] / 256} for r in fp8_rows()]),
], ids=lambda x: getattr(x, "name", ""))
def test_a_claim_fails_on_a_recording_that_contradicts_it(results, claim, rows):
    record(results, H100, "fp8_matmul", rows)
    record(results, H100, "blas_ceilings", COPY)
    with pytest.raises(core_claims.ClaimFailed, match=claim.name):
        core_claims.verify(claim)


def test_the_quantization_claim_needs_the_copy_of_the_same_gpu(results):
    record(results, H100, "fp8_matmul", fp8_rows())
    with pytest.raises(core_claims.ClaimFailed, match="cannot read"):
        core_claims.verify(claims.QUANTIZATION_MEMORY_BOUND)
    record(results, H100, "blas_ceilings", [{"ceiling": "bandwidth", "gbytes_per_s": 9000.0}])
    with pytest.raises(core_claims.ClaimFailed, match="does not hold"):
        core_claims.verify(claims.QUANTIZATION_MEMORY_BOUND)


LADDER_CLAIMS = [claims.LADDER_TARGET, claims.HGMMA_EVERYWHERE, claims.PIPELINE_IS_THE_JUMP, claims.STAGES_CLIMB,
                 claims.LATER_STEPS_SMALL, claims.STEP6_IS_STEP5]


def test_the_ladder_claims_hold_on_a_ladder_shaped_like_the_recorded_ones(results):
    record(results, H100, "triton_gemm_ladder", ladder_rows(LADDER_AS_RECORDED))
    record(results, H200, "triton_gemm_ladder", ladder_rows({**LADDER_AS_RECORDED, "step3_grouped": 655.0}))
    for claim in LADDER_CLAIMS:
        checks = core_claims.verify(claim)
        assert len(checks) == 2 and all(c.verdict.holds for c in checks), (claim.name, checks)
    evidence = {claim.name: core_claims.check(claim)[1].verdict.evidence for claim in LADDER_CLAIMS}
    assert evidence["ladder_target"] == "5 persistent at 100% of cuBLAS (700 against 700 TFLOP/s)"
    assert evidence["pipeline_is_the_jump"] == (f"step 2 over step 1 {660 / 280:.2f}x; its tile at one stage over "
                                                f"step 1 {320 / 280:.2f}x; three stages over one on that tile "
                                                f"{660 / 320:.2f}x")
    assert f"four over three {665 / 660 - 1:+.1%} to {665 / 660 - 1:+.1%}" in evidence["stages_climb"]
    assert evidence["later_steps_small"].endswith(f"4 TMA against 3 grouped, {685 / 655 - 1:+.1%} (bfloat16 at "
                                                  "4,096^3)")
    assert "no USETMAXREG, the same instructions" in evidence["step6_is_step5"]


def _with(rates: dict, **changes) -> list[dict]:
    """Rows of ``rates``, each row of a kernel named in ``changes`` updated with its fields."""
    return [{**r, **changes.get(r["kernel"].replace(" ", "_").replace("(", "").replace(")", "").replace("=", ""), {})}
            for r in ladder_rows(rates)]


@pytest.mark.parametrize("claim, rows", [
    (claims.LADDER_TARGET, ladder_rows({k: v * 0.85 for k, v in LADDER_AS_RECORDED.items()})),
    (claims.HGMMA_EVERYWHERE, _with(LADDER_AS_RECORDED, step1_blocked={"tensor_core": "HMMA (mma.sync)",
                                                                      "sass_HMMA": 16, "sass_HGMMA": 0})),
    (claims.PIPELINE_IS_THE_JUMP, ladder_rows({**LADDER_AS_RECORDED, "step1_blocked": 400.0})),
    (claims.PIPELINE_IS_THE_JUMP, ladder_rows({**LADDER_AS_RECORDED, "step2_pipelined (num_stages=1)": 600.0})),
    (claims.STAGES_CLIMB, ladder_rows({**LADDER_AS_RECORDED, "step2_pipelined (num_stages=2)": 300.0})),
    (claims.STAGES_CLIMB, ladder_rows({**LADDER_AS_RECORDED, "step2_pipelined (num_stages=4)": 720.0})),
    (claims.LATER_STEPS_SMALL, ladder_rows({**LADDER_AS_RECORDED, "step4_tma": 760.0})),
    (claims.LATER_STEPS_SMALL, ladder_rows({**LADDER_AS_RECORDED, "step2_pipelined": 600.0})),
    (claims.STEP6_IS_STEP5, ladder_rows({**LADDER_AS_RECORDED, "step6_warp_specialized": 600.0})),
    (claims.STEP6_IS_STEP5, _with(LADDER_AS_RECORDED, step6_warp_specialized={"warp_specialized": True,
                                                                             "sass_USETMAXREG": 2})),
], ids=lambda x: getattr(x, "name", ""))
def test_a_ladder_claim_fails_on_a_recording_that_contradicts_it(results, claim, rows):
    record(results, H100, "triton_gemm_ladder", ladder_rows(LADDER_AS_RECORDED))
    record(results, H200, "triton_gemm_ladder", rows)
    with pytest.raises(core_claims.ClaimFailed, match=f"{claim.name}.*does not hold on NVIDIA H200"):
        core_claims.verify(claim)


def test_a_ladder_claim_names_a_step_the_recording_lacks(results):
    rates = {k: v for k, v in LADDER_AS_RECORDED.items() if k != "step4_tma"}
    record(results, H100, "triton_gemm_ladder", ladder_rows(rates))
    with pytest.raises(core_claims.ClaimFailed, match=r"cannot read.*no row for step4_tma"):
        core_claims.verify(claims.LATER_STEPS_SMALL)


# ---- the answers ---------------------------------------------------------------------------------------------------

def test_the_answers_are_computed_with_and_without_recordings(results):
    bare = {a.title: "\n".join(a.lines) for a in exercise_answers(answers)}
    assert len(bare) == 6
    assert "4 stages 192 KiB, 5 stages 240 KiB (too much)" in bare["Answer to exercise 1"]
    assert "64 panels of A and 3 of B" in bare["Answer to exercise 2"]
    assert "8 panels of A and 17 of B" in bare["Answer to exercise 2"]
    assert "no GPU has recorded the ladder yet" in bare["Answer to exercise 2"]
    assert "**4 HGMMA**" in bare["Answer to exercise 3"] and "**128 HMMA**" in bare["Answer to exercise 3"]
    assert "No GPU has recorded fp8_matmul yet" in bare["Answer to exercise 4"]
    assert "**1.581**" in bare["Answer to exercise 6"]
    record(results, H100, "fp8_matmul", fp8_rows())
    record(results, H100, "blas_ceilings", COPY)
    record(results, H100, "triton_gemm_ladder", ladder_rows(LADDER_RATES))
    full = {a.title: "\n".join(a.lines) for a in exercise_answers(answers)}
    assert f"step 3 ran at {320 / 300:.2f}x step 2's rate" in full["Answer to exercise 2"]
    assert "NVIDIA H100 80GB HBM3, recorded 2026-11-26: n = 256" in full["Answer to exercise 4"]
    assert "n = 8,192: at the copy's 3,000 GB/s" in full["Answer to exercise 5"]
    assert "over the sizes of the sweep" in full["Answer to exercise 6"]


def test_executed_gmma_from_the_counters_and_its_claim_fails_on_a_wmma_kernel_that_ran_gmma():
    import copy

    from gpulab.ch17_hopper_tensor_cores import claims, figures
    from gpulab.core import recordings
    from gpulab.core.recordings import Recording

    run = recordings.recorded("kernel_counters")[0]
    said = figures.executed_tensor_instructions([run])
    assert len(said) == 1 and "0 of them GMMA" in said[0] and "FLOP each" in said[0]
    assert claims.EXECUTED_GMMA.test(run).holds
    rows = copy.deepcopy(run.rows)
    for row in rows:
        if row["kernel"] == "wmma_gemm_pipelined":
            row["tensor_instructions"]["gmma"] = row["tensor_instructions"]["hmma"]
    assert not claims.EXECUTED_GMMA.test(Recording(run.experiment, run.function, run.params, rows,
                                                   run.provenance)).holds
