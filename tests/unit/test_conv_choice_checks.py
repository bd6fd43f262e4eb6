"""The graders of the lab "Pick the convolution algorithm" name the usual mistakes; its experiment times every setting.

Everything runs on the CPU here, where cuDNN's flags can still be set and read (they change nothing
there), on small tensors, so the whole file takes seconds.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
import torch

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.core import env, timing
from gpulab.core.precision import matmul_mode
from gpulab.core.validation import unsupported_reason
from gpulab.labs import grading
from gpulab.labs.lab09_pick_the_convolution_algorithm import diagnose, settings
from gpulab.labs.lab09_pick_the_convolution_algorithm.diagnose import Diagnosis
from gpulab.labs.lab09_pick_the_convolution_algorithm.settings import Setting

LAYER = settings.small_layers(settings.LAYERS[:1], n=1, size=8)[0]


@pytest.fixture(autouse=True)
def flags_kept():
    """Every test leaves cuDNN's switches as it found them, whatever a broken function did."""
    with settings.kept_flags():
        yield


# --- exercise 1: prepare ---------------------------------------------------------------------------

def only_input(x, weight, layout, dtype):
    x, weight = settings.reference_prepare(x, weight, layout, dtype)
    return x, weight.contiguous()


def only_weight(x, weight, layout, dtype):
    x, weight = settings.reference_prepare(x, weight, layout, dtype)
    return x.contiguous(), weight


def permuted(x, weight, layout, dtype):
    x, weight = settings.reference_prepare(x, weight, "NCHW", dtype)
    return (x.permute(0, 2, 3, 1), weight.permute(0, 2, 3, 1)) if layout == "NHWC" else (x, weight)


def reshaped(x, weight, layout, dtype):  # NHWC data read back with NCHW's shape: the values move
    x, weight = settings.reference_prepare(x, weight, "NCHW", dtype)
    if layout == "NHWC":
        x = x.permute(0, 2, 3, 1).contiguous().view(x.shape).to(memory_format=torch.channels_last)
        weight = weight.to(memory_format=torch.channels_last)
    return x, weight


def tf32_as_float16(x, weight, layout, dtype):
    return settings.reference_prepare(x, weight, layout, "float16" if dtype == "tf32" else dtype)


def float16_forgotten(x, weight, layout, dtype):
    return settings.reference_prepare(x, weight, layout, "float32")


def channels_last_always(x, weight, layout, dtype):
    return settings.reference_prepare(x, weight, "NHWC", dtype)


def test_prepare_right_passes():
    assert diagnose.diagnose_prepare(settings.reference_prepare).ok


@pytest.mark.parametrize(("prepare", "problem"), [
    (only_input, "weight not converted"), (only_weight, "input not converted"), (permuted, "shape changed"),
    (reshaped, "values changed"), (tf32_as_float16, "wrong dtype"), (float16_forgotten, "wrong dtype"),
    (channels_last_always, "wrong layout"), (lambda x, w, layout, dtype: None, "not a pair"),
    (lambda x, w, layout, dtype: (x, None), "not a pair"),
    (lambda x, w, layout, dtype: 1 / 0, "error"),
])
def test_prepare_mistakes_are_named(prepare, problem):
    diagnosis = diagnose.diagnose_prepare(prepare)
    assert diagnosis.problem == problem, diagnosis
    if problem == "shape changed":
        assert "permuted to N x H x W x C" in diagnosis.detail


# --- exercise 1: the TF32 switch ------------------------------------------------------------------

@contextmanager
def never_restores(dtype):
    torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    yield


@contextmanager
def restores_without_finally(dtype):
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    yield
    torch.backends.cudnn.allow_tf32 = saved


@contextmanager
def switches_off(dtype):  # TF32 off for everything
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


@contextmanager
def swallows(dtype):
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    try:
        yield
    except Exception:
        pass
    finally:
        torch.backends.cudnn.allow_tf32 = saved


@contextmanager
def also_benchmarks(dtype):
    with settings.reference_precision(dtype):
        torch.backends.cudnn.benchmark = True
        yield


def test_precision_context_right_passes():
    assert diagnose.diagnose_precision_context(settings.reference_precision).ok


def test_matmul_mode_also_passes():

    assert diagnose.diagnose_precision_context(matmul_mode).ok


@pytest.mark.parametrize(("context", "problem"), [
    (never_restores, "flag not restored"), (restores_without_finally, "not restored after an error"),
    (switches_off, "flag not set"), (swallows, "error swallowed"), (also_benchmarks, "benchmark touched"),
    (lambda dtype: None, "error"),
])
def test_precision_context_mistakes_are_named(context, problem):
    diagnosis = diagnose.diagnose_precision_context(context)
    assert diagnosis.problem == problem, diagnosis


def test_the_grader_puts_the_flags_back():
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = False, True
    diagnose.diagnose_precision_context(never_restores)
    diagnose.diagnose_timer(never_restoring_timer, LAYER)
    assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cudnn.benchmark is True


# --- exercise 2: timing one setting ----------------------------------------------------------------

def never_restoring_timer(run, benchmark, device):
    torch.backends.cudnn.benchmark = benchmark
    return {"first_call_s": timing.once(run, device), "seconds": timing.measure(run, device=device).median_s}


def no_first_call(run, benchmark, device):
    with_flag = settings.reference_time(run, benchmark, device)
    return {"first_call_s": with_flag["seconds"], "seconds": with_flag["seconds"]}


def first_call_averaged_in(run, benchmark, device):  # the autotuning ends up in the steady-state time
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        times = [timing.once(run, device) for _ in range(5)]
    finally:
        torch.backends.cudnn.benchmark = saved
    return {"first_call_s": times[0], "seconds": sum(times) / len(times)}


def ignores_the_flag(run, benchmark, device):
    return settings.reference_time(run, not benchmark, device)


def launch_only(run, benchmark, device):  # what a host clock without synchronisation reads on a GPU
    result = settings.reference_time(run, benchmark, device)
    return {**result, "seconds": result["seconds"] / 100}


def called_once(run, benchmark, device):
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    start = time.perf_counter()
    run()
    torch.backends.cudnn.benchmark = saved
    seconds = time.perf_counter() - start
    return {"first_call_s": seconds, "seconds": seconds}


def test_timer_right_passes():
    diagnosis = diagnose.diagnose_timer(settings.reference_time, LAYER)
    assert diagnosis.ok, diagnosis


def test_one_slow_reading_is_retaken():
    calls = []

    def slow_once(run, benchmark, device):  # a right answer, read while the machine was busy the first time
        result = settings.reference_time(run, benchmark, device)
        calls.append(benchmark)
        return {**result, "seconds": result["seconds"] * (100 if len(calls) == 1 else 1)}

    diagnosis = diagnose.diagnose_timer(slow_once, LAYER)
    assert diagnosis.ok, diagnosis
    assert calls == [True, True, False]


@pytest.mark.parametrize(("timer", "problem"), [
    (never_restoring_timer, "flag not restored"), (no_first_call, "first call not timed apart"),
    (first_call_averaged_in, "too slow"), (ignores_the_flag, "flag not set"), (launch_only, "too fast"),
    (called_once, "too few calls"), (lambda run, benchmark, device: None, "not a result"),
    (lambda run, benchmark, device: {"first_call_s": 1.0}, "not a result"),
    (lambda run, benchmark, device: 1 / 0, "error"),
])
def test_timer_mistakes_are_named(timer, problem):
    diagnosis = diagnose.diagnose_timer(timer, LAYER)
    assert diagnosis.problem == problem, diagnosis


# --- exercise 3: the experiment and the predictions -------------------------------------------------

def test_settings_and_their_names():
    assert len(settings.settings()) == 12 and Setting("NHWC", "float16", True).label == "NHWC, float16, benchmark on"
    assert Setting.of(("NCHW", "tf32", False)) == Setting.of({"layout": "NCHW", "dtype": "tf32", "benchmark": False})
    for bad in (("NHCW", "float16", True), ("NHWC", "half", True), ("NHWC", "float16", "on"), ("NHWC",), 3):
        with pytest.raises(ValueError):
            Setting.of(bad)


def test_small_layers_keep_channels_and_filters():
    for big, small in zip(settings.LAYERS, settings.small_layers(n=2, size=8), strict=True):
        assert (small.c, small.k, small.r, small.stride, small.name) == (big.c, big.k, big.r, big.stride, big.name)
        assert small.n == 2 and small.p == 8


def test_measure_settings_checks_and_times_every_setting():
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = True, False
    layers = settings.small_layers(settings.LAYERS[2:4], n=1, size=6)  # the 7x7/2 layer with C = 3, and C = 60
    rows = settings.measure_settings(layers, target_s=0.005)
    assert len(rows) == len(layers) * 12
    measured = [r for r in rows if r["status"] == "ok"]
    tf32_runs = unsupported_reason("tf32", env.device()) is None  # on a GPU of Ampere or later
    assert {r["dtype"] for r in measured} == {"float32", "float16", *(["tf32"] if tf32_runs else [])}
    assert tf32_runs or all("tf32" in r["status"] for r in rows if r["dtype"] == "tf32")  # elsewhere, rows say why
    assert all(r["seconds"] > 0 and r["first_call_s"] > 0 and r["relative_error"] < 1e-2 for r in measured)
    assert {(r["layer"], r["setting"]) for r in rows} == {(layer.name, s.label) for layer in layers
                                                          for s in settings.settings()}
    assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cudnn.benchmark is False


def test_measure_settings_refuses_bad_arguments():
    with pytest.raises(ValueError, match="layout"):
        settings.measure_settings([LAYER], layouts=["NHCW"])
    with pytest.raises(ValueError, match="own name"):
        settings.measure_settings([LAYER, LAYER])
    with pytest.raises(ValueError, match="dtypes"):
        settings.measure_settings([LAYER], dtypes=[])


def row(layer, layout, dtype, benchmark, microseconds, c=64, k=64):
    setting = Setting(layout, dtype, benchmark)
    return {"layer": layer, "layout": layout, "dtype": dtype, "benchmark": benchmark, "setting": setting.label,
            "seconds": microseconds * 1e-6, "first_call_s": 1e-3, "tflops": 1.0, "c": c, "k": k, "status": "ok"}


ROWS = [  # shaped like the H200's: float16 in NHWC wins, autotuning helps the NCHW float16 kernel
    row("a", "NCHW", "float32", False, 256), row("a", "NHWC", "float32", False, 318),
    row("a", "NCHW", "float16", False, 80), row("a", "NCHW", "float16", True, 55),
    row("a", "NHWC", "float16", False, 28.5), row("a", "NHWC", "float16", True, 27.5),
    row("b", "NCHW", "float32", False, 100, c=3), row("b", "NHWC", "float16", True, 40, c=3),
    {**row("b", "NHWC", "tf32", True, 1), "status": "dtype: tf32 needs an NVIDIA GPU", "seconds": None},
]


def test_predictions_within_the_tie_pass():
    assert diagnose.diagnose_prediction(("NHWC", "float16", True), "a", ROWS).ok
    tie = diagnose.diagnose_prediction(("NHWC", "float16", False), "a", ROWS)
    assert tie.ok and "a tie" in tie.detail


def test_autotuning_that_kept_a_slower_kernel_is_not_the_students_mistake():
    unlucky = [row("a", "NHWC", "tf32", False, 61.3), row("a", "NHWC", "tf32", True, 68.3),
               row("a", "NHWC", "float16", True, 75.7)]  # the H100's 3x3, C=60 on one run of four
    on = diagnose.diagnose_prediction(("NHWC", "tf32", True), "a", unlucky)
    assert on.ok and "1.11x slower, and right all the same" in on.detail and "first call" in on.detail
    assert diagnose.diagnose_prediction(("NHWC", "float16", True), "a", unlucky).problem == "slower"  # not its twin
    also_beaten = [*unlucky, row("a", "NHWC", "float16", False, 62.0)]  # another setting beat it too: a real loss
    assert diagnose.diagnose_prediction(("NHWC", "tf32", True), "a", also_beaten).problem == "slower"
    far = [row("a", "NHWC", "tf32", False, 61.3), row("a", "NHWC", "tf32", True, 200.0),
           row("a", "NHWC", "float16", True, 65.0), row("a", "NCHW", "float16", False, 70.0)]
    assert diagnose.diagnose_prediction(("NHWC", "tf32", True), "a", far).problem == "slower"
    heuristic_lost = [row("a", "NCHW", "float16", False, 80), row("a", "NCHW", "float16", True, 55)]
    assert diagnose.diagnose_prediction(("NCHW", "float16", False), "a", heuristic_lost).problem == "slower"


def test_a_slower_prediction_says_why():
    precision = diagnose.diagnose_prediction(("NCHW", "float32", False), "a", ROWS)
    assert precision.problem == "slower" and "9.31x slower" in precision.detail
    assert "tensor cores" in precision.detail and "transposes" in precision.detail
    autotune = diagnose.diagnose_prediction(("NCHW", "float16", False), "a", ROWS)
    assert "transposes" in autotune.detail and "1.45x as fast" in autotune.detail  # both differences cost time
    layout_only = diagnose.diagnose_prediction(("NCHW", "float16", True), "a", ROWS)
    assert "transposes" in layout_only.detail and "heuristic" not in layout_only.detail
    channels = diagnose.diagnose_prediction(("NCHW", "float32", False), "b", ROWS)
    assert "C = 3 is not a multiple of 8" in channels.detail
    heuristic = diagnose.explain(Setting("NCHW", "float16", False), Setting("NCHW", "float16", True), ROWS[:6])
    assert "1.45x as fast" in heuristic and "heuristic" in heuristic


def test_predictions_that_are_not_settings_or_not_measured():
    assert diagnose.diagnose_prediction(None, "a", ROWS).problem == "not a setting"
    assert diagnose.diagnose_prediction(("NHWC", "fp16", True), "a", ROWS).problem == "not a setting"
    missing = diagnose.diagnose_prediction(("NHWC", "tf32", True), "b", ROWS)
    assert missing.problem == "not measured" and "needs an NVIDIA GPU" in missing.detail
    assert diagnose.diagnose_prediction(("NHWC", "float16", True), "c", ROWS).problem == "not measured"
    assert diagnose.diagnose_prediction(("NHWC", "float16", True), "a", None).ok  # the form only


def test_diagnoses_are_graded_like_kernel_checks():
    grader = grading.Grader(strict=False)
    assert grading.grade(grader, "ok", Diagnosis("ok", "fine"), {}) and grader.passed == ["ok"]
    with pytest.raises(ValueError, match="problem"):
        Diagnosis("nonsense", "")


def test_settings_figure_draws_each_layer():
    fig = settings.settings_figure(ROWS, title="t")
    assert len(fig.data) == 4 and {a.text for a in fig.layout.annotations} == {"a", "b"}
    assert sum(len(trace.x) for trace in fig.data) == 8  # the unmeasured TF32 row is left out
    with pytest.raises(ValueError, match="rows"):
        settings.settings_figure([], title="t")


def test_layers_are_the_labs():
    assert [layer.name for layer in settings.LAYERS] == ["res2 3x3", "res2 1x1", "conv1 7x7/2", "3x3, C=60"]
    assert all(isinstance(layer, conv.ConvLayer) for layer in settings.LAYERS)
