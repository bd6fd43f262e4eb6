"""The batched linear algebra chapter's library: small GEMMs three ways, LU factorisation and its checks."""

from __future__ import annotations

import pytest
import torch

from conftest import needs_gpu
from gpulab.ch14_batched_linear_algebra import batched, figures
from gpulab.core.precision import FORMATS
from gpulab.core.recordings import Recording

CPU = torch.device("cpu")
H200 = {"device": {"name": "NVIDIA H200", "kind": "cuda"}, "date": "2026-11-24", "recorded": True}


@pytest.mark.parametrize("method", batched.METHODS)
def test_gemm_call_computes_every_problem(method):
    A, B, C = batched._gemm_operands(method, 8, 5, torch.float64, CPU)
    batched.gemm_call(method, A, B, C)()
    for i in range(5):
        b = B if method == "one_gemm" else B[i]
        torch.testing.assert_close(C[i], A[i] @ b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", batched.METHODS)
def test_measure_batched_gemm_checks_and_times(method):
    row = batched.measure_batched_gemm(method, 16, 12, "float32", CPU)
    assert (row["method"], row["n"], row["batch"], row["dtype"]) == (method, 16, 12, "float32")
    assert row["flops"] == 12 * 2 * 16**3 and row["seconds"] > 0
    assert row["gflops"] == pytest.approx(row["flops"] / row["seconds"] / 1e9)
    assert row["us_per_problem"] == pytest.approx(row["seconds"] / 12 * 1e6)
    assert 0 < row["relative_error"] < 1e-5


def test_measure_batched_gemm_catches_a_problem_left_unwritten(monkeypatch):
    real = batched.gemm_call

    def skips_the_last(method, A, B, C):
        return real(method, A[:-1], B[:-1], C[:-1])  # the last C stays poisoned with NaN

    monkeypatch.setattr(batched, "gemm_call", skips_the_last)
    with pytest.raises(AssertionError, match="relative error nan"):
        batched.measure_batched_gemm("bmm", 8, 4, "float32", CPU)


def test_one_gemm_reads_its_shared_operand_once():
    bmm, one = batched.gemm_cost("bmm", 64, 1000), batched.gemm_cost("one_gemm", 64, 1000)
    assert bmm.flops == one.flops == 1000 * 2 * 64**3
    assert bmm.bytes == 1000 * 3 * 64 * 64 * 4 and one.bytes == (2 * 1000 + 1) * 64 * 64 * 4


def test_gemm_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match="^method:"):
        batched.measure_batched_gemm("einsum", 8, 4, device=CPU)
    with pytest.raises(ValueError, match="^n:"):
        batched.measure_batched_gemm("bmm", 0, 4, device=CPU)
    with pytest.raises(ValueError, match="^batch:"):
        batched.measure_batched_gemm("bmm", 8, 2.5, device=CPU)
    with pytest.raises(ValueError, match="^batch: needs"):
        batched.measure_batched_gemm("bmm", 4096, 10**6, device=CPU)
    with pytest.raises(ValueError, match="^dtype: tf32 is a tensor-core mode"):
        batched.measure_batched_gemm("bmm", 8, 4, "tf32", CPU)
    with pytest.raises(ValueError, match="^methods:"):
        batched.gemm_sweep([8], [4], methods=["bmm", "gemv"])
    with pytest.raises(ValueError, match="^sizes:"):
        batched.gemm_sweep([], [4])


def test_gemm_sweep_reports_a_dtype_the_device_lacks(monkeypatch):
    monkeypatch.setattr(batched.env, "device", lambda: CPU)
    rows = batched.gemm_sweep([8, 16], [3], ["float32", "tf32"])
    [skipped] = [r for r in rows if r["status"] != "ok"]
    assert skipped["dtype"] == "tf32" and skipped["status"].startswith("not run: tf32 is a tensor-core mode")
    assert len(rows) == 1 + 2 * len(batched.METHODS)


def _row(method, n, batch, seconds, dtype="float32"):
    return {"method": method, "n": n, "batch": batch, "dtype": dtype, "seconds": seconds, "gflops": 1.0,
            "status": "ok"}


def test_speedups_and_the_target_come_from_the_rows():
    rows = [_row("loop", 64, 1000, 5e-3), _row("bmm", 64, 1000, 1e-4), _row("one_gemm", 64, 1000, 2e-4),
            _row("bmm", 32, 1000, 1e-4), {"dtype": "tf32", "status": "not run: no tensor cores"}]
    found = {r["method"]: r["speedup"] for r in batched.speedups(rows)}
    assert found == pytest.approx({"loop": 1.0, "bmm": 50.0, "one_gemm": 25.0})  # n = 32 has no loop: left out
    assert batched.gemm_target(rows) == {"ratio": pytest.approx(50.0), "met": True, "reason": None}
    assert not batched.gemm_target(rows, factor=60)["met"]
    missing = batched.gemm_target(rows, n=32)
    assert missing["ratio"] is None and not missing["met"] and "n = 32" in missing["reason"]


def test_lu_flops_count_every_division_multiply_and_subtraction():
    for n in range(1, 30):
        assert batched.lu_flops(n) == pytest.approx(sum(r + 2 * r * r for r in range(1, n)))
    assert batched.lu_flops(10_000) / (2 * 10_000**3 / 3) == pytest.approx(1, rel=1e-3)
    with pytest.raises(ValueError, match="^n:"):
        batched.lu_flops(0)


def test_the_permutation_goes_the_way_torch_says():
    generator = torch.Generator().manual_seed(1)
    A = torch.randn(12, 12, dtype=torch.float64, generator=generator)
    LU, pivots = torch.linalg.lu_factor(A)
    P, L, U = torch.lu_unpack(LU, pivots)
    assert not torch.equal(P, P.mT)  # a permutation that is not its own inverse tells the two directions apart
    torch.testing.assert_close(P @ L @ U, A)  # torch's convention: A = P L U
    torch.testing.assert_close(P.mT @ A, L @ U)  # so MAGMA's "PA" is P^T A here
    error = batched.lu_backward_error(A, LU, pivots).item()
    explicit = torch.linalg.matrix_norm(P.mT @ A - L @ U) / (12 * torch.linalg.matrix_norm(A))
    assert error == pytest.approx(explicit.item(), rel=1e-6, abs=1e-20) and error < FORMATS["float64"].unit_roundoff
    wrong = torch.linalg.matrix_norm(P @ A - L @ U) / (12 * torch.linalg.matrix_norm(A))
    assert wrong > 1e6 * batched.lu_tolerance("float64")  # the other direction fails any tolerance


def test_lu_backward_error_of_a_batch_and_of_a_wrong_factorisation():
    A = torch.randn(7, 10, 10, dtype=torch.float32)
    LU, pivots, info = torch.linalg.lu_factor_ex(A)
    errors = batched.lu_backward_error(A, LU, pivots)
    assert errors.shape == (7,) and (errors < batched.lu_tolerance("float32")).all()
    assert batched.check_lu(A, LU, pivots, info, "float32", "batch") == pytest.approx(errors.max().item())
    spoiled = LU.clone()
    spoiled[3, 4, 5] += 1e-3
    with pytest.raises(AssertionError, match="backward error .* exceeds"):
        batched.check_lu(A, spoiled, pivots, info, "float32", "spoiled")
    spoiled[3, 4, 5] = float("nan")
    with pytest.raises(AssertionError, match="backward error nan"):
        batched.check_lu(A, spoiled, pivots, info, "float32", "nan")
    singular = torch.zeros(4, 4, dtype=torch.float64)
    with pytest.raises(AssertionError, match="zero pivot"):
        batched.check_lu(singular, *torch.linalg.lu_factor_ex(singular), "float64", "singular")


def test_lu_tolerance_is_thirty_unit_roundoffs():
    assert batched.lu_tolerance("float64") == 30 * 2.0**-53
    assert batched.lu_tolerance("float32") == 30 * 2.0**-24
    with pytest.raises(ValueError, match="^dtype: the LU factorisation runs in float64 or float32"):
        batched.lu_tolerance("float16")


@pytest.mark.parametrize("dtype", batched.LU_DTYPES)
def test_measure_lu_checks_and_times(dtype):
    row = batched.measure_lu(64, dtype, CPU)
    assert (row["n"], row["dtype"], row["device"]) == (64, dtype, "cpu") and row["processor"].startswith("CPU, ")
    assert row["gflops"] == pytest.approx(batched.lu_flops(64) / row["seconds"] / 1e9)
    assert 0 < row["backward_error"] < row["tolerance"] == batched.lu_tolerance(dtype)


def test_measure_lu_rejects_bad_arguments():
    with pytest.raises(ValueError, match="^dtype: the LU factorisation"):
        batched.measure_lu(16, "bfloat16", CPU)
    with pytest.raises(ValueError, match="^n:"):
        batched.measure_lu(-3, "float64", CPU)
    with pytest.raises(ValueError, match="^n: needs"):
        batched.measure_lu(10**6, "float64", CPU)


def test_lu_sweep_caps_the_cpu_and_tables_like_magma(monkeypatch):
    monkeypatch.setattr(batched.env, "device", lambda: CPU)
    rows = batched.lu_sweep([16, 32, 48], ["float64"], cpu_max_n=32)
    assert [(r["n"], r["status"]) for r in rows] == [(16, "ok"), (32, "ok"), (48, "not run: n above cpu_max_n = 32")]
    run = Recording("batched_lu", "f", {}, rows, H200)
    table = figures.lu_table([run])
    assert "|PA-LU|/(n|A|), CPU" in table.headers and "H200's host: " in table.caption
    cells = {row[2]: dict(zip(table.headers, row, strict=True)) for row in table.cells}
    assert cells["16"]["check"] == "ok" and cells["48"]["CPU (GFLOP/s)"] == "not run" and cells["48"]["check"] == "–"
    with pytest.raises(ValueError, match="^dtype:"):
        batched.lu_sweep([16], ["float16"])


@pytest.mark.parametrize("method", batched.LU_METHODS)
def test_measure_small_lu_checks_and_times(method):
    row = batched.measure_small_lu(method, 8, 20, "float64", CPU)
    assert (row["method"], row["n"], row["batch"]) == (method, 8, 20)
    assert row["flops"] == pytest.approx(20 * batched.lu_flops(8))
    assert 0 < row["backward_error"] < row["tolerance"]


def test_the_loop_and_the_batched_call_give_the_same_factors():
    A = torch.randn(6, 9, 9, dtype=torch.float64)
    looped, whole = batched._factors("loop", A), batched._factors("batched", A)
    for a, b in zip(looped, whole, strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="^method:"):
        batched.lu_call("qr", A)
    with pytest.raises(ValueError, match="^methods:"):
        batched.small_lu_sweep([8], [4], methods=["loop", "qr"])


def test_figures_draw_every_dtype_behind_a_menu():
    rows = [_row(m, n, b, 1e-4 * n, d) for d in ("float32", "float16") for b in (50, 1000)
            for m in batched.METHODS for n in (8, 16, 32)]
    fig = figures.methods_figure(rows + [{"dtype": "tf32", "status": "not run: no"}], title="GEMMs")
    assert len(fig.data) == 2 * 2 * len(batched.METHODS) * 2  # dtypes x batches x methods x (rate, time)
    [menu] = fig.layout.updatemenus
    assert [b.label for b in menu.buttons] == ["float32", "float16"]
    assert sum(fig.layout.updatemenus[0].buttons[1].args[0]["visible"]) == len(fig.data) // 2
    assert sum(t.visible for t in fig.data) == len(fig.data) // 2
    single = figures.methods_figure([r for r in rows if r["dtype"] == "float32"], title="GEMMs")
    assert not single.layout.updatemenus and single.layout.title.text == "GEMMs, float32"
    small_lu = figures.methods_figure([{**r, "method": "batched"} for r in rows[:3]], title="LU",
                                      labels=batched.LU_METHOD_LABELS)
    assert small_lu.data[0].name == batched.LU_METHOD_LABELS["batched"]
    lu_rows = [{"n": n, "dtype": d, "device": dev, "processor": dev, "gflops": n / 10, "seconds": 1.0,
                "backward_error": 1e-18, "status": "ok"} for dev in ("cpu", "cuda") for d in batched.LU_DTYPES
               for n in (64, 128)]
    fig = figures.lu_figure(lu_rows, title="getrf")
    assert [t.name for t in fig.data] == ["CPU float64", "CPU float32", "GPU float64", "GPU float32"]
    with pytest.raises(ValueError, match="^rows:"):
        figures.lu_figure([{"status": "out of memory"}], title="none")


@needs_gpu
def test_on_a_gpu_bmm_beats_the_loop_by_twenty_times():
    rows = [batched.measure_batched_gemm(m, 64, 1000, "float32") for m in ("loop", "bmm")]
    verdict = batched.gemm_target([{**r, "status": "ok"} for r in rows])
    assert verdict["met"], verdict


@needs_gpu
@pytest.mark.parametrize("dtype", batched.LU_DTYPES)
def test_gpu_lu_passes_magmas_check(dtype):
    row = batched.measure_lu(1024, dtype)
    assert row["device"] == "cuda" and row["backward_error"] < row["tolerance"]
    small = batched.measure_small_lu("batched", 32, 100, dtype)
    assert small["backward_error"] < small["tolerance"]


def test_speedup_table_gives_times_and_speedups_at_the_largest_batch():
    rows = [_row("loop", 8, 50, 4e-3), _row("bmm", 8, 50, 1e-4), _row("bmm", 16, 50, 2e-4), _row("bmm", 8, 10, 1.0)]
    rows = [{**r, "us_per_problem": r["seconds"] / r["batch"] * 1e6} for r in rows]
    run = Recording("batched_gemm", "f", {}, rows, H200)
    table = figures.speedup_table([run], dtype="float32")
    assert table.headers == ["GPU", "format, batch", "order n", "Python loop of torch.mm (ms)",
                             "torch.bmm (one batched call) (ms)", "loop, per problem (µs)", "bmm over the loop"]
    assert table.cells[0] == ["H200", "float32, batch of 50", "8", "4.0000", "0.1000", "80.00", "40x"]
    assert table.cells[1] == ["H200", "float32, batch of 50", "16", "–", "0.2000", "–", "–"]
    assert figures.speedup_table([run], dtype="float16").cells == []
    lu = Recording("batched_small_lu", "f", {}, [{**r, "method": "batched" if r["method"] == "bmm" else "loop"}
                                                 for r in rows], run.provenance)
    assert "lu_factor_ex on the batch (one call) (ms)" in figures.speedup_table([lu]).headers


def test_lu_comparison_finds_the_crossover_and_the_ratio():
    def lu_row(n, device, gflops, dtype="float64"):
        return {"n": n, "dtype": dtype, "device": device, "gflops": gflops, "status": "ok"}

    rows = [lu_row(512, "cpu", 40), lu_row(1024, "cpu", 60), lu_row(2048, "cpu", 80),
            {"n": 4096, "dtype": "float64", "device": "cpu", "status": "not run: n above cpu_max_n = 2048"},
            lu_row(512, "cuda", 30), lu_row(1024, "cuda", 90), lu_row(2048, "cuda", 400), lu_row(4096, "cuda", 900),
            lu_row(512, "cpu", 70, "float32")]
    double, single = batched.lu_comparison(rows)
    assert double["crossover_n"] == 1024 and double["largest_common_n"] == 2048
    assert double["gpu_over_cpu"] == pytest.approx(5.0)
    assert double["gpu_best"]["n"] == 4096 and double["cpu_best"]["n"] == 2048
    assert single == {"dtype": "float32", "cpu_best": rows[-1], "gpu_best": None, "crossover_n": None,
                      "largest_common_n": None, "gpu_over_cpu": None}
