"""Chapter 18's own modules (gpulab.ch18_flash_attention_and_counters: plan, figures, claims, answers): the plan's
sizes and times, the race's figures, tables and sentences drawn from synthetic recordings of two GPUs in a results
folder of the test's own, the claims holding and failing on synthetic rows, the kernels' live checks and pages,
and the worked answers. The counters' modules (profiled, driver, counter_figures) are tested in
test_kernel_counters.py."""

from __future__ import annotations

import copy
import subprocess

import pytest
import torch

from gpulab.ch18_flash_attention_and_counters import answers, claims, figures, plan
from gpulab.core import budget, counters, kernel_mode, recordings, specs
from gpulab.core.claims import ClaimFailed, check, sentence, verify
from gpulab.core.recordings import Recording
from gpulab.kernels.triton_attention import measure

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
# Forward TFLOP/s per implementation at head size 128 (64 runs at 85% of it, Triton at 95%); forward + backward 80%
RATES = {"triton": 470.0, "sdpa-math": 20.0, "sdpa-efficient": 170.0, "sdpa-flash": 340.0, "sdpa-cudnn": 600.0}
LENGTHS = (1024, 4096, 16384)


def race_rows(rates: dict[str, float] = RATES, lengths=LENGTHS) -> list[dict]:
    """Rows as attention_race writes them; the math backend runs out of memory at the last length of head size 64."""
    rows = []
    for head_dim in (64, 128):
        for causal in (False, True):
            for name, rate in rates.items():
                for n in lengths:
                    batch, heads = 16384 // n, 2048 // head_dim
                    row = {"implementation": name, "label": measure.IMPLEMENTATIONS[name], "seq_len": n,
                           "batch": batch, "heads": heads, "head_dim": head_dim, "causal": causal,
                           "dtype": "bfloat16"}
                    if name == "sdpa-math" and head_dim == 64 and n == lengths[-1]:
                        rows.append({**row, "status": "out of memory"})
                        continue
                    forward = rate * (0.95 if name == "triton" else 0.85) if head_dim == 64 else rate
                    work = measure.forward_flops(batch, heads, n, head_dim, causal)
                    both = 0.8 * forward
                    rows.append({**row, "forward_seconds": work / forward / 1e12, "forward_tflops": forward,
                                 "backward_status": "ok", "forward_backward_tflops": both,
                                 "forward_backward_seconds": 3.5 * work / both / 1e12, "status": "ok"})
    return rows


def recording(device: str, rows: list[dict], date: str = "2026-11-25") -> Recording:
    provenance = {"device": {"name": device, "kind": "cuda"}, "date": date}
    return Recording("triton_attention", "gpulab.kernels.triton_attention.measure:attention_race", {},
                     copy.deepcopy(rows), provenance)


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A results folder holding two GPUs' recordings of the race (the H200's Triton a little faster)."""
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    recordings.save(recording(H100, race_rows()))
    recordings.save(recording(H200, race_rows({**RATES, "triton": 500.0})))
    return tmp_path


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


# plan

def test_the_plan_fits_a_class_on_every_gpu_and_a_t4_runs_no_gpu_work():
    t4, l4 = specs.gpu("T4"), specs.gpu("L4")
    for name in budget.PREDICTED:
        gpu = specs.gpu(name)
        chosen = plan.CHAPTER.plan("class", gpu)
        assert chosen.seconds_on(gpu) <= budget.CLASS_SECONDS and chosen.fits(gpu)
        assert chosen.sizes["head_dims"] == [64] and chosen.sizes["dtype"] == "float16"
        assert not chosen.sizes["profile_counters"]
    t4_class = plan.CHAPTER.plan("class", t4)
    assert t4_class.seconds_on(t4) == pytest.approx(plan.fixed_seconds(t4_class.sizes))  # no Triton on a T4
    assert plan.CHAPTER.plan("class", l4).seconds_on(l4) > t4_class.seconds_on(t4)
    full = plan.CHAPTER.plan("full", specs.gpu("H100 SXM5 80GB"))
    assert full.sizes == plan.FULL and full.sizes["head_dims"] == [64, 128]
    labels = [w.label for w in full.work]
    assert sum(label.startswith("Nsight Compute") for label in labels) == 1
    assert any(label.startswith("sdpa-math, 16,384 tokens, d = 128, causal: forward + backward") for label in labels)


def test_the_full_profile_records_the_race_at_its_defaults():
    defaults = measure.attention_race.__wrapped__.__defaults__ if hasattr(measure.attention_race, "__wrapped__") \
        else measure.attention_race.__defaults__
    seq_lens, head_dims, _, implementations, tokens, model_dim, dtype = defaults[:7]
    assert (list(seq_lens), list(head_dims), list(implementations)) == (
        plan.FULL["seq_lens"], plan.FULL["head_dims"], plan.FULL["implementations"])
    assert (tokens, model_dim, dtype) == (plan.FULL["tokens"], plan.FULL["model_dim"], plan.FULL["dtype"])


def test_where_the_kernels_and_the_counters_run(monkeypatch):
    if not kernel_mode.on_gpu():
        assert plan.triton_unavailable() == "" and plan.counters_skipped(True) == ""
    monkeypatch.setattr(kernel_mode, "on_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    said = plan.triton_unavailable()
    assert said.startswith("This GPU (Tesla T4, compute capability 7.5) does not run") and "recordings" in said
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert plan.triton_unavailable() == ""
    assert "class profile" in plan.counters_skipped(False)

    def no_ncu():
        raise kernel_mode.MissingPackage("profile_kernels: Nsight Compute's command line (ncu) is not on the PATH")
    monkeypatch.setattr(plan.profiled, "find_ncu", no_ncu)
    assert plan.counters_skipped(True).endswith("not on the PATH. The section shows the recordings instead.")


# figures: the race

def test_race_tables_from_two_gpus(results):
    runs = recordings.recorded("triton_attention")
    table = cells(figures.race_table(runs))
    assert {r["GPU"] for r in table} == {"H100 80GB HBM3", "H200"}
    h100_64 = [r for r in table if r["GPU"] == "H100 80GB HBM3" and r["head size, mask"] == "d = 64, full"]
    assert {r["tokens"] for r in h100_64} == {"4,096"}  # the math backend ran out of memory at 16,384
    assert next(r for r in h100_64 if r["implementation"] == "Triton FlashAttention")["forward (TFLOP/s)"] == "446"
    target = cells(figures.target_table(runs))
    assert len(target) == 2 * 2 * 2  # two GPUs, two masks, the lengths from 4,096 on
    assert {r["fastest SDPA backend"] for r in target} == {"cuDNN backend"}
    assert target[0]["forward share"] == "78%" and target[0]["forward at 80% or more"] == "no"
    said = figures.target_statements(runs)
    assert "**not met at any of its 4 points**" in said[0] and "78%" in said[0]
    assert "**met at every one of its 4 points**" in said[1] and "83%" in said[1]


def test_race_sentences_name_the_fastest_backend_and_the_backward_alone(results):
    runs = recordings.recorded("triton_attention")
    said = figures.race_statements(runs)[0]
    assert "the fastest SDPA backend was the cuDNN backend at 12 of 12 points" in said
    assert "at head size 64, 88%; at head size 128, 78%" in said
    # forward + backward at 0.8 of the forward rate: the backward alone at 2.5 / (3.5 / 0.8 - 1) of it
    alone = 470 * 2.5 / (3.5 / 0.8 - 1)
    assert f"Triton {alone:,.0f} TFLOP/s counted ({alone * 7 / 5:,.0f} for the 7 tile products" in said
    peak = figures.peak_statements(runs)[0]
    assert peak.startswith("H100 80GB HBM3, forward at 16,384 tokens, head size 128, full mask")
    assert "cuDNN backend 61%, Triton FlashAttention 48%" in peak
    row = next(r for r in runs[0].rows if r["implementation"] == "sdpa-math" and r["status"] != "ok")
    assert figures.backward_alone(row) is None


def test_race_figures_have_a_menu_per_gpu_and_point_and_mark_what_did_not_run(results):
    runs = recordings.recorded("triton_attention")
    fig = figures.race_figure(runs)
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert labels[:4] == ["H100 80GB HBM3: head size 64, full", "H100 80GB HBM3: head size 64, causal",
                          "H100 80GB HBM3: head size 128, full", "H100 80GB HBM3: head size 128, causal"]
    assert len(labels) == 8 and len(fig.data) == 2 * 4 * 5
    assert sum(t.visible for t in fig.data) == 5
    notes = fig.layout.updatemenus[0].buttons[0].args[1]["annotations"]
    assert [n["text"] for n in notes] == ["SDPA, math backend: out of memory"]
    assert not fig.layout.updatemenus[0].buttons[2].args[1]["annotations"]
    with pytest.raises(ValueError, match="key: one of forward_tflops"):
        figures.race_figure(runs, "tflops")
    ratio = figures.ratio_figure(runs)
    assert [b.label for b in ratio.layout.updatemenus[0].buttons] == [
        "H100 80GB HBM3: forward", "H100 80GB HBM3: forward + backward", "H200: forward", "H200: forward + backward"]
    assert ratio.data[2].y[0] == pytest.approx(470 / 600)
    single = figures.race_figure(runs[:1])
    assert [b.label for b in single.layout.updatemenus[0].buttons][0] == "head size 64, full"


def test_a_refused_backend_is_named_in_the_table_without_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    rows = [r for r in race_rows() if r["implementation"] != "sdpa-cudnn" or r["head_dim"] != 64]
    rows += [{"implementation": "sdpa-cudnn", "label": measure.IMPLEMENTATIONS["sdpa-cudnn"], "head_dim": 64,
              "causal": c, "dtype": "bfloat16", "seq_len": None, "status": "not available: No available kernel"}
             for c in (False, True)]
    recordings.save(recording(H100, rows))
    table = cells(figures.race_table(recordings.recorded("triton_attention")))
    refused = [r for r in table if r["implementation"].startswith("SDPA, cuDNN backend (not available")]
    assert len(refused) == 2 and refused[0]["forward (TFLOP/s)"] == "–"
    fig = figures.race_figure(recordings.recorded("triton_attention"))
    assert len(fig.data) == 2 * 4 + 2 * 5  # no line for a backend that ran nowhere at head size 64


# claims

def test_the_claims_hold_on_the_synthetic_recordings(results):
    for claim in (claims.BEATS_SLOW_BACKENDS, claims.BEATS_FLASH_AT_128, claims.CUDNN_FASTEST,
                  claims.SLOWER_AT_64, claims.SMALLER_HEAD_CLOSER):
        checks = verify(claim, results)
        assert [c.gpu for c in checks] == ["H100 80GB HBM3", "H200"] and all(c.verdict.holds for c in checks)
    said = sentence(claims.SMALLER_HEAD_CLOSER, verify(claims.SMALLER_HEAD_CLOSER, results))
    assert "H100 80GB HBM3: head size 64: 88% to 88% of the fastest backend; head size 128: 78% to 78%" in said
    with pytest.raises(ClaimFailed, match="backward_further"):  # forward + backward at 0.8 of the forward, evenly
        verify(claims.BACKWARD_FURTHER, results)


def test_the_claims_fail_where_the_rows_say_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    recordings.save(recording(H100, race_rows({**RATES, "sdpa-flash": 480.0})))  # flash beats Triton at 128
    with pytest.raises(ClaimFailed, match="at least 0.98x the flash backend"):
        verify(claims.BEATS_FLASH_AT_128, tmp_path)
    slow = [r if r["implementation"] != "triton" or r["head_dim"] != 128 or r["seq_len"] < 4096
            else {**r, "forward_backward_tflops": 0.5 * r["forward_tflops"]} for r in race_rows()]
    recordings.save(recording(H200, slow))
    [h100, h200] = check(claims.BACKWARD_FURTHER, tmp_path)
    assert not h100.verdict.holds and h200.verdict.holds
    recordings.save(recording(H200, race_rows({**RATES, "sdpa-flash": 700.0})))  # flash fastest on the H200
    [h100, h200] = verify(claims.CUDNN_FASTEST, tmp_path)  # scoped: holds on one GPU, printed as such
    text = sentence(claims.CUDNN_FASTEST, [h100, h200])
    assert text.startswith("On the H100 80GB HBM3: the fastest SDPA backend is cuDNN's") and "Not on the H200." in text
    no_128 = [r for r in race_rows() if r["head_dim"] == 64]
    recordings.save(recording(H100, no_128))
    with pytest.raises(ClaimFailed, match="cannot read"):
        verify(claims.SMALLER_HEAD_CLOSER, tmp_path)


# figures: the kernels

def test_the_kernels_checked_live_at_a_small_shape():
    dtype = "float16" if kernel_mode.on_gpu() else "float32"
    rows = figures.kernel_checks(1, 2, 96, [32], dtype, seed=3)
    assert [(r["head_dim"], r["mask"]) for r in rows] == [(32, "full"), (32, "causal")]
    assert all(r[k] < r["tolerance"] for r in rows for k in ("out", "dq", "dk", "dv"))
    table = figures.checks_table(rows)
    assert "seed 3" in table.caption and table.headers[2] == "output"
    assert figures.checks_sentence(rows).startswith("The largest relative error of an output or a gradient is ")
    with pytest.raises(ValueError, match="seq_len"):
        figures.kernel_checks(1, 2, 0, [32], dtype)
    with pytest.raises(ValueError, match="dtype"):
        figures.kernel_checks(1, 2, 64, [32], "float12")


def test_the_tiles_a_program_computes():
    causal = figures.tile_states(1024, 128, 64)
    assert len(causal) == 8 and len(causal[0]) == 16
    assert causal[0][:3] == ["masked", "masked", "skipped"] and causal[7][-3:] == ["unmasked", "masked", "masked"]
    full = figures.tile_states(1000, 128, 64, causal=False)
    assert all(row[-1] == "masked" and row.count("masked") == 1 for row in full)  # the partial last tile only
    assert "computes 72 of the 128 tiles a full one computes (56.2%), 16 of them masked" in figures.tiles_sentence()
    with pytest.raises(ValueError, match="block_m: a multiple of block_n"):
        figures.tile_states(1024, 96, 64)
    with pytest.raises(ValueError, match="seq_len"):
        figures.tile_states(-1, 128, 64)
    fig = figures.causal_tiles_figure(512, 64)
    assert len(fig.data[0].z) == 4 and "queries 0-127, keys 0-63: masked" in fig.data[0].text[0][0]


EVIDENCE = [{"kernel": k, "tensor_core": "HGMMA (wgmma)", "sass_HGMMA": 24, "sass_HMMA": 0, "sass_LDG": 8,
             "sass_LDGSTS": 48, "sass_UTMALDG": 0, "warp_specialized": False, "shared_bytes": 131072,
             "num_warps": 8, "num_stages": 3} for k in ("forward", "query_grads")]


def test_the_compiled_code_evidence_and_its_errors(monkeypatch):
    table = cells(figures.evidence_table(EVIDENCE))
    assert table[0]["tensor-core instructions"] == "HGMMA (wgmma): 24" and table[0]["shared memory (KiB)"] == "128.0"
    assert figures.evidence_sentence(EVIDENCE) == (
        "Of the 2 kernels, 2 of 2 use Hopper's warpgroup instructions (HGMMA), 2 of 2 copy their tiles to shared "
        "memory with cp.async (LDGSTS), 0 of 2 load with the Tensor Memory Accelerator (UTMALDG), and 0 of 2 are "
        "warp-specialized.")
    with pytest.raises(ValueError, match="kernels: some of forward, key_value_grads, query_grads"):
        figures.compiled_evidence(["backward"])
    with pytest.raises(ValueError, match="head_dim"):
        figures.compiled_evidence(["forward"], 48)
    failed = subprocess.CompletedProcess([], 1, "", "Traceback ...\nRuntimeError: ptxas not found")
    monkeypatch.setattr(figures.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(RuntimeError, match="compiled_evidence: compiling for sm_90 failed: RuntimeError: ptxas"):
        figures.compiled_evidence(["forward"])


def test_the_metrics_table_covers_every_metric_the_counters_ask_for():
    families = [m for m, _, _ in figures.METRIC_MEANINGS]
    for metric in counters.METRICS:
        assert any(metric in text or metric.startswith(text.split("{")[0].split("<")[0]) for text in families), metric
    assert len(cells(figures.metrics_table())) == len(figures.METRIC_MEANINGS)


def test_the_backward_products_are_counted_from_the_kernels():
    assert (figures.TRITON_BACKWARD_PRODUCTS, figures.COUNTED_BACKWARD_PRODUCTS) == (7, 5)


# answers

def test_the_worked_answers(results):
    shown = {n: repr(getattr(answers, f"exercise_{n}")()) for n in range(1, 7)}
    assert "- 1,024 tokens: 128 x 64 tiles 56.25%; 64 x 64 tiles 53.12%" in shown[1]
    assert "relative error of **0." in shown[2] and "check_forward` fails" in shown[2]
    assert "**124 FLOP/byte**" in shown[3] and "**2,040 FLOP/byte**" in shown[3]
    assert "- H100 80GB HBM3, 16,384 tokens: forward 470 TFLOP/s, so 366 expected; measured 376." in shown[4]
    assert "- H100 80GB HBM3, 4,096 tokens, full: share 78.3%, 2.1% faster needed" in shown[5]
    assert "- H200, 4,096 tokens, full: share 83.3%, already met" in shown[5]
    assert "**1.031x** the book's count, inside the 10%" in shown[6] and "1.125x, outside" in shown[6]


def test_head_size_64_is_compared_from_2048_tokens_on(tmp_path, monkeypatch):
    """A tie at 1,024 tokens (as one H100 run had) leaves the claim standing; one at 2,048 or more fails it."""
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))

    def tied_at(length):
        rows = race_rows(lengths=(1024, 2048, 4096))
        rate = {(r["implementation"], r["seq_len"], r["causal"]): r["forward_tflops"] for r in rows
                if r["head_dim"] == 128 and r.get("status") == "ok"}
        return [{**r, "forward_tflops": rate["triton", length, r["causal"]]}
                if r["implementation"] == "triton" and r["head_dim"] == 64 and r["seq_len"] == length else r
                for r in rows]

    recordings.save(recording(H100, tied_at(1024)))
    assert verify(claims.SLOWER_AT_64, tmp_path)[0].verdict.holds
    recordings.save(recording(H100, tied_at(2048)))
    with pytest.raises(ClaimFailed, match="slower_at_64"):
        verify(claims.SLOWER_AT_64, tmp_path)
