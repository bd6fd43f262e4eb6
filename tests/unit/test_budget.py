"""The time model of gpulab.core.budget: a call's roofline time, the timer's repeats, a profile that fits."""

from __future__ import annotations

import pytest

from gpulab.core import budget, specs, timing
from gpulab.core.budget import Plan, Work

T4, H100 = specs.gpu("T4"), specs.gpu("H100 SXM5 80GB")


def flush(gpu: specs.GPU) -> float:
    return timing.L2_FLUSH_BYTES / (gpu.bandwidth_gb_s * 1e9 * budget.MEMORY_EFFICIENCY)


def test_a_call_takes_its_roofline_time_derated_or_its_floor():
    gemm = Work("gemm", flops=2 * 4096**3, bytes=3 * 4 * 4096**2)
    peak = specs.peak(T4, "float32").ops_per_s
    assert gemm.call_seconds(T4) == pytest.approx(2 * 4096**3 / (peak * budget.COMPUTE_EFFICIENCY))
    naive = Work("naive kernel", flops=2 * 4096**3, share=0.01)
    assert naive.call_seconds(T4) == pytest.approx(2 * 4096**3 / (peak * 0.01))
    copy = Work("copy", bytes=2 * 2**30)
    assert copy.call_seconds(H100) == pytest.approx(2 * 2**30 / (H100.bandwidth_gb_s * 1e9 * budget.MEMORY_EFFICIENCY))
    assert Work("nothing").call_seconds(H100) == budget.LAUNCH_SECONDS
    assert Work("a loop of 100 launches", launches=100).call_seconds(H100) == 100 * budget.LAUNCH_SECONDS
    assert Work("a Python loop", least_seconds=0.01).call_seconds(H100) == 0.01
    pinned = Work("to the host", bytes=2**30, link="pinned")
    assert pinned.call_seconds(H100) == pytest.approx(2**30 / (H100.pcie_gb_s * 1e9 * budget.PCIE_EFFICIENCY["pinned"]))


def test_a_measurement_is_the_timers_warmup_first_call_and_flushed_repeats():
    call = Work("copy", bytes=1e9)  # about 1 ms on an H100
    seconds = call.call_seconds(H100)
    repeats = int(budget.TARGET_SECONDS / seconds)
    assert call.measurement_seconds(H100) == pytest.approx(4 * seconds + repeats * (seconds + flush(H100)))
    long = Work("gemm", flops=2 * 16384**3, precision="float64")  # seconds a call on a T4: ten repeats
    assert long.measurement_seconds(T4) == pytest.approx(14 * long.call_seconds(T4) + 10 * flush(T4))
    short = Work("axpy", bytes=12 * 2**16, flush_l2=False)  # the cap: 2,000 repeats
    assert short.measurement_seconds(T4) == pytest.approx((4 + budget.MAX_REPEATS) * short.call_seconds(T4))
    fixed = Work("layer", bytes=1e9, repeats=25, flush_l2=False, extra_seconds=0.5, checked_elements=1e8)
    expected = (3 + 25) * fixed.call_seconds(H100) + 0.5 + 1e8 * budget.HOST_CHECK_SECONDS_PER_ELEMENT
    assert fixed.measurement_seconds(H100) == pytest.approx(expected)
    assert budget.once("reference", bytes=1e9).measurement_seconds(H100) == pytest.approx(call.call_seconds(H100))
    assert budget.host_seconds("training in Python", 7.0, measurements=3).seconds_on(T4) == 21.0


def test_a_format_a_gpu_lacks_runs_wider_or_not_at_all():
    tf32 = Work("gemm", flops=2 * 4096**3, precision="tf32")
    assert tf32.precision_on(T4) == "float32" and tf32.precision_on(H100) == "tf32"
    skipped = Work("gemm", flops=2 * 4096**3, precision="bfloat16", missing="skip")
    assert skipped.precision_on(T4) is None and skipped.seconds_on(T4) == 0 and skipped.seconds_on(H100) > 0
    assert Work("cp.async", bytes=1e6, min_capability="8.0").seconds_on(T4) == 0
    assert Work("sparse", flops=1e12, precision="float16", requires="tf32").seconds_on(T4) == 0
    with pytest.raises(ValueError, match="missing: 'fallback' or 'skip'"):
        Work("x", missing="drop")
    with pytest.raises(ValueError, match="share: a share of the peak"):
        Work("x", share=1.5)


def test_a_chapter_is_its_work_plus_its_fixed_costs_and_faster_gpus_take_less():
    work = [Work("gemm", flops=2 * 8192**3, precision="float32", measurements=3, extra_seconds=0.5)]
    plan = Plan("full", {"n": 8192}, work, fixed_seconds=10)
    assert plan.seconds_on(T4) == pytest.approx(10 + 3 * work[0].measurement_seconds(T4))
    assert plan.seconds_on(H100) < plan.seconds_on(T4)


def test_the_class_profile_takes_the_largest_plan_that_fits_the_budget():
    plans = [Plan("class", {"n": n}, [Work("gemm", flops=2 * n**3, measurements=20)]) for n in (1024, 4096, 16384)]
    chosen = budget.largest_fitting(plans, T4)
    assert chosen.sizes["n"] == 4096 and chosen.seconds_on(T4) <= budget.CLASS_SECONDS
    assert plans[-1].seconds_on(T4) > budget.CLASS_SECONDS
    assert budget.largest_fitting(plans[-1:], T4) is plans[-1]  # nothing fits: the smallest there is


def test_the_prediction_table_names_each_gpu_a_class_may_have():
    plan = Plan("full", {}, [Work("copy", bytes=2**30, measurements=4)])
    rows = budget.prediction_rows(lambda gpu: plan)
    assert [r["gpu"] for r in rows] == list(budget.PREDICTED)
    assert rows[0]["seconds"] > rows[-1]["seconds"]  # a T4 against an H200
    assert "predicted time (min)" in budget.prediction_table(lambda gpu: plan).headers
    with pytest.raises(ValueError, match="^profile: one of class, full"):
        budget.check_profile("fast")


def _chapter(**changes) -> budget.Chapter:
    settings = dict(name="gemm chapter", full={"n": 16384}, classes=[{"n": 1024}, {"n": 4096}, {"n": 16384}],
                    cpu={"n": 512}, smoke={"n": 64},
                    work=lambda s: [Work("gemm", flops=2 * s["n"] ** 3, measurements=20,
                                         memory_bytes=12 * s["n"] ** 2)],
                    fixed_seconds=lambda s: 5.0)
    return budget.Chapter(**{**settings, **changes})


def test_a_chapter_plans_the_full_sizes_or_the_largest_class_candidate_that_fits():
    chapter = _chapter()
    assert chapter.plan("full", T4).sizes == {"n": 16384}
    chosen = chapter.plan("class", T4)
    assert chosen.sizes == {"n": 4096} and chosen.seconds_on(T4) <= budget.CLASS_SECONDS
    assert chosen.seconds_on(T4) == pytest.approx(5.0 + 20 * Work("gemm", flops=2 * 4096**3).measurement_seconds(T4))
    assert chapter.plan("class", H100).sizes == {"n": 16384}  # an H100 runs the largest candidate in time


def test_a_class_candidate_must_fit_the_gpus_memory():
    huge = _chapter(classes=[{"n": 1024}, {"n": 80_000}], full={"n": 80_000},
                    work=lambda s: [Work("gemm", flops=1e9, memory_bytes=12 * s["n"] ** 2)])
    assert huge.plan("class", H100).sizes == {"n": 1024}  # 77 GB of operands do not fit 80% of 80 GB


def test_a_chapter_chooses_smoke_or_cpu_sizes_without_a_gpu(monkeypatch):
    monkeypatch.setattr(budget.env, "has_gpu", lambda: False)
    chapter = _chapter()
    assert chapter.choose("full", smoke=True).sizes == {"n": 64}
    assert chapter.choose("class").sizes == {"n": 512}
    with pytest.raises(ValueError, match="^profile: one of class, full"):
        chapter.choose("quick")


def test_every_setting_of_a_chapter_names_the_same_sizes():
    with pytest.raises(ValueError, match="cpu names \\['m', 'n'\\] differently"):
        _chapter(cpu={"m": 3})
    rows = _chapter().prediction_table("class")
    assert "predicted time (min)" in rows.headers
