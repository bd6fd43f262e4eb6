"""Lab 02's graders (``gpulab.labs.lab02_gflops_vs_n``): the FLOP count, a NumPy time, and a PyTorch time that must
wait for the device. On a runtime without a GPU, ``setup`` makes ``torch.cuda.synchronize`` a recorded no-op and
the check asks whether the code synchronises: a call the recorder saw, or one behind a device check in its source."""

from __future__ import annotations

import contextlib
import io
import time

import numpy as np
import pytest
import torch

from gpulab.core import env
from gpulab.core.tables import table
from gpulab.labs import grading
from gpulab.labs import lab02_gflops_vs_n as lab02
from gpulab.labs.grading import NOT_ANSWERED

N = 64
STEADY = 0.004  # the time every clock in these tests reads: a busy machine's noise must not decide a test


@pytest.fixture
def steady(monkeypatch):
    """gpulab's timer, as the check uses it, reads STEADY whatever the machine's load."""
    monkeypatch.setattr(lab02.timing, "measure", lambda work, **options: lab02.timing.Timing((STEADY,)))


def graded(check, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(grading.Grader(strict=False), *args)
    return " ".join(out.getvalue().split())  # the lines are wrapped at 90 characters: compare the words


@pytest.mark.parametrize(("count", "said"), [
    (lambda n: 2 * n**3, "PASS matmul_flops(4000)"),
    (lambda n: n**3, "returned 64,000,000,000, expected about 128,000,000,000: that counts the multiply-adds"),
    (lambda n: 2 * n**2, "the work of a matrix-vector product"),
    (lambda n: n**2, "the number of outputs"),
    (lambda n: 2 * n**3 - n**2, "n - 1 additions per output"),
    (lambda n: 2 * n ^ 3, "^ is the bitwise exclusive or"),
    (lambda n: None, NOT_ANSWERED),
])
def test_matmul_flops(count, said):
    assert said in graded(lab02.check_matmul_flops, count)


@pytest.mark.parametrize(("times", "said"), [
    ([0.012, 0.011], ""),
    ([12.0, 11.0], "a time in milliseconds"),
    ([-0.011, -0.012], "the clock was read backwards"),
    ([0.0, 0.0], "both clock readings are the same moment"),
    ([1e-6, 2e-6], "the timed region misses A @ B"),
    ([0.5, 0.6], "holds more than A @ B"),
    ([None, 0.01], NOT_ANSWERED),
    (["0.01"], "returned a str, not a number of seconds"),
    ([np.float32(0.011)], ""),
])
def test_a_numpy_time_is_graded_against_gpulabs(times, said):
    problem = lab02.times_problem(times, 0.011, lab02.numpy_mistakes(0.011))
    assert (said in problem) if said else problem == ""


def test_on_a_gpu_a_time_far_too_short_means_no_synchronisation():
    mistakes = lab02.torch_mistakes(0.02, torch.device("cuda"))
    assert "the clock stopped while the GPU was still working" in lab02.times_problem([3e-5], 0.02, mistakes)
    assert "milliseconds" in lab02.times_problem([20.0], 0.02, mistakes)


def timed_numpy(A, B):
    A @ B
    A @ B  # between two readings of the clock, which reads STEADY apart
    return STEADY


def test_time_numpy_matmul_end_to_end(steady):
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((N, N), dtype=np.float32), rng.standard_normal((N, N), dtype=np.float32)
    assert f"PASS time_numpy_matmul at n = {N}" in graded(lab02.check_time_numpy_matmul, timed_numpy, A, B)
    milliseconds = graded(lab02.check_time_numpy_matmul, lambda A, B: timed_numpy(A, B) * 1e3, A, B)
    assert "NOT YET" in milliseconds and "milliseconds" in milliseconds
    assert NOT_ANSWERED in graded(lab02.check_time_numpy_matmul, lambda A, B: None, A, B)


def test_a_real_clock_around_numpy_passes():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)

    def honest(A, B):
        A @ B
        start = time.perf_counter()
        A @ B
        return time.perf_counter() - start

    times, reference, problem = lab02.timed(lambda: honest(A, B), lambda: A @ B, torch.device("cpu"))
    assert problem == "" and len(times) == 5 and all(t > 0 for t in times) and reference > 0


# --- exercise 3 on a CPU: the recorder and the source ----------------------------------------------------------

@pytest.fixture
def recorder(monkeypatch):
    """The lab's setup, undone after the test (a notebook never undoes it)."""
    if env.has_gpu():
        pytest.skip("on a GPU the lab leaves torch.cuda.synchronize alone")
    monkeypatch.setattr(torch.cuda, "synchronize", torch.cuda.synchronize)  # restored at the end
    return lab02.setup()


# Timers as students write them; each returns what its clock would read (STEADY), so that only how it waits
# for the device differs.
def unconditional(A, B):
    A @ B
    torch.cuda.synchronize()
    A @ B
    torch.cuda.synchronize()
    return STEADY


def guarded(A, B):
    def wait():
        if A.device.type == "cuda":
            torch.cuda.synchronize(A.device)

    A @ B
    wait()
    A @ B
    wait()
    return STEADY


def wait_for_gpu():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def with_a_helper(A, B):
    A @ B
    wait_for_gpu()
    A @ B
    wait_for_gpu()
    return STEADY


def naive(A, B):
    A @ B
    A @ B
    return STEADY


def test_setup_makes_synchronize_a_recorded_no_op_and_is_safe_twice(recorder):
    assert isinstance(recorder, lab02.SynchronizeRecorder) and lab02.setup() is recorder
    torch.cuda.synchronize()
    torch.cuda.synchronize(torch.device("cpu"))  # a student's torch.cuda.synchronize(A.device) on a CPU
    assert recorder.calls == 2 and lab02.installed() is recorder


def test_the_source_shows_a_guarded_synchronisation():
    assert lab02.calls_synchronize(unconditional) and lab02.calls_synchronize(guarded)
    assert lab02.calls_synchronize(with_a_helper)  # one level down, in a function of the same module
    assert not lab02.calls_synchronize(naive)


@pytest.mark.parametrize("timer", [unconditional, guarded, with_a_helper])
def test_on_a_cpu_a_synchronised_timer_passes_and_says_why_nothing_shows(recorder, steady, timer):
    A, B = torch.randn(N, N), torch.randn(N, N)
    out = graded(lab02.check_time_torch_matmul, timer, A, B)
    assert f"PASS time_torch_matmul at n = {N}" in out
    assert "A CPU finishes A @ B before it returns" in out and "GPU recording below" in out


def test_on_a_cpu_a_timer_that_never_waits_is_not_yet(recorder, steady):
    A, B = torch.randn(N, N), torch.randn(N, N)
    out = graded(lab02.check_time_torch_matmul, naive, A, B)
    assert "NOT YET" in out and "never waits for the device" in out and "torch.cuda.synchronize()" in out
    assert "plausible on this CPU" in out
    assert NOT_ANSWERED in graded(lab02.check_time_torch_matmul, lambda A, B: None, A, B)
    milliseconds = graded(lab02.check_time_torch_matmul, lambda A, B: unconditional(A, B) * 1e3, A, B)
    assert "milliseconds" in milliseconds and "never waits" not in milliseconds


def test_without_the_setup_an_unconditional_call_is_explained(monkeypatch, steady):
    if torch.cuda.is_available():
        pytest.skip("needs a torch without CUDA")
    def no_cuda(*args):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda)
    out = graded(lab02.check_time_torch_matmul, unconditional, torch.randn(64, 64), torch.randn(64, 64))
    assert "needs a GPU, and this runtime has none" in out and "Torch not compiled" not in out


def test_the_tables_fit_90_characters():
    rows = [{"n": 16000, "naive_seconds": 1.25e-4, "naive_gflops": 65_758_527.0, "seconds": 0.16205,
             "gflops": 50552.0}]
    widest = max(len(line) for line in str(table(rows, lab02.RECORDED)).splitlines())
    assert widest <= 90
