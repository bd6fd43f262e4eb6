"""Lab 01's graders (``gpulab.labs.lab01_peak_rates_and_precision``): the right answers pass, a stub is "not
answered yet", and each usual wrong answer gets its own message."""

from __future__ import annotations

import contextlib
import io
import math

import pytest

from gpulab.labs import grading
from gpulab.labs import lab01_peak_rates_and_precision as lab01
from gpulab.labs.grading import NOT_ANSWERED


def graded(check, *args) -> str:
    """What a student sees: the output of ``check(grader, *args)`` with a grader that prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(grading.Grader(strict=False), *args)
    return " ".join(out.getvalue().split())  # the lines are wrapped at 90 characters: compare the words


def right_peak(sms, fma, clock_ghz):
    return sms * fma * 2 * clock_ghz * 1e9 / 1e12


@pytest.mark.parametrize(("peak", "said"), [
    (lambda s, f, c: s * f * c * 1e9 / 1e12, "an FMA is two operations"),
    (lambda s, f, c: s * f * 2 * c, "that is GFLOP/s"),
    (lambda s, f, c: s * f * 2 * c * 1e9, "that is FLOP/s: divide by 1e12"),
    (lambda s, f, c: s * f * 2 * c / 1e12, "the clock is in GHz"),
    (lambda s, f, c: s * f * 2 * 1e9 / 1e12, "the clock is missing"),
    (lambda s, f, c: f * 2 * c * 1e9 / 1e12, "multiply by the number of SMs"),
])
def test_a_wrong_peak_is_named(peak, said):
    assert said in lab01.peak_problem(peak, 80, 512, 1.53)
    assert "returned" in lab01.peak_problem(peak, 108, 64, 1.41)


def test_the_peak_checks_pass_and_a_stub_is_not_answered():
    out = graded(lab01.check_peak_tflops, right_peak)
    assert "PASS V100 float16 tensor cores" in out and "PASS A100 float32 units" in out
    assert graded(lab01.check_peak_tflops, lambda s, f, c: None).count(NOT_ANSWERED) == 2


def tensor_peak(gpu, precision, clock=None):
    fma = gpu.tensor_cores_per_sm * gpu.tensor_fma_per_clock[precision]
    return right_peak(gpu.sms, fma, clock or gpu.tensor_clock_ghz or gpu.boost_clock_ghz)


def test_tensor_peaks_pass_and_hoppers_clock_is_named():
    assert graded(lab01.check_tensor_peak, tensor_peak).count("PASS") == 4
    boost = lab01.tensor_peak_problem(lambda g, p: tensor_peak(g, p, g.boost_clock_ghz), "H100 SXM5 80GB",
                                      "bfloat16", 989.4)
    assert "returned 1,070.53, expected about 989.4: that is the peak at the boost clock" in boost
    assert lab01.tensor_peak_problem(lambda g, p: tensor_peak(g, p, g.boost_clock_ghz), "T4", "float16", 65) == ""


def test_a_wrong_tensor_peak_is_named():
    per_core = lab01.tensor_peak_problem(
        lambda g, p: right_peak(g.sms, g.tensor_fma_per_clock[p], g.boost_clock_ghz), "T4", "float16", 65)
    assert "is per tensor core: multiply by gpu.tensor_cores_per_sm" in per_core
    cuda = lab01.tensor_peak_problem(
        lambda g, p: right_peak(g.sms, g.cuda_cores_per_sm["float32"], g.boost_clock_ghz), "L4", "float8", 242.5)
    assert "the CUDA cores' float32 peak" in cuda


def tensor_clock_always(gpu, precision):
    return right_peak(gpu.sms, gpu.tensor_cores_per_sm * gpu.tensor_fma_per_clock[precision], gpu.tensor_clock_ghz)


def test_the_none_of_a_row_without_a_tensor_clock_is_not_taken_for_a_stub():
    said = lab01.tensor_peak_problem(tensor_clock_always, "T4", "float16", 65)
    assert "tensor_clock_ghz is None" in said and "boost_clock_ghz" in said
    assert lab01.tensor_peak_problem(lambda g, p: None, "T4", "float16", 65) == NOT_ANSWERED
    out = graded(lab01.check_tensor_peak, lambda g, p: None)
    assert out.count(NOT_ANSWERED) == 4 and "use gpu.tensor_clock_ghz" in out  # Hopper's own hint


@pytest.mark.parametrize(("minimum", "said"), [
    (lambda n, p: 2 * n**3 / (p * 1e12) * 1e3, "that is milliseconds"),
    (lambda n, p: 2 * n**3 / p, "multiply it by 1e12"),
    (lambda n, p: n**3 / (p * 1e12), "2 n^3 FLOP"),
    (lambda n, p: 2 * n**2 / (p * 1e12), "matrix-vector product"),
    (lambda n, p: p * 1e12 / (2 * n**3), "time = work / rate"),
    (lambda n, p: None, NOT_ANSWERED),
])
def test_a_wrong_minimum_time_is_named(minimum, said):
    assert said in graded(lab01.check_minimum_seconds, minimum)


def test_the_minimum_time_passes_and_the_comparison_table_waits_for_an_answer():
    assert "PASS minimum_seconds(4096, 125)" in graded(lab01.check_minimum_seconds, lambda n, p: 2 * n**3 / p / 1e12)
    gpu = lab01.specs.gpu("H100 SXM5 80GB")
    measured = {"float32": {"seconds": 0.02}, "bfloat16": {"seconds": 0.002}}
    shown = str(lab01.prediction_table(lambda n, p: 2 * n**3 / p / 1e12, gpu, 8192, measured, "a test"))
    assert "a test" in shown and "measured / minimum" in shown and "–" not in shown
    assert str(lab01.prediction_table(lambda n, p: None, gpu, 8192, measured, "")).count("–") == 4


@pytest.mark.parametrize(("roundoff", "said"), [
    (lambda m: 2.0**-(m + 1), "PASS unit_roundoff"),
    (lambda m: 2.0**-m, "that is machine epsilon"),
    (lambda m: 2**-m + 1, "put the exponent in parentheses"),
    (lambda m: 2.0**(m + 1), "the exponent must be negative"),
    (lambda m: 2.0**-(m - 1), "the implicit leading bit"),
    (lambda m: None, NOT_ANSWERED),
])
def test_the_unit_roundoff(roundoff, said):
    assert said in graded(lab01.check_unit_roundoff, roundoff)


@pytest.mark.parametrize(("estimate", "said"), [
    (lambda n, u: math.sqrt(n) * u, "PASS typical_sum_error"),
    (lambda n, u: n * u, "n u is the worst case"),
    (lambda n, u: u, "u is the error of one rounding"),
    (lambda n, u: math.sqrt(n * u), "the square root of n alone"),
    (lambda n, u: math.log2(n) * u, "pairwise summation"),
    (lambda n, u: None, NOT_ANSWERED),
])
def test_the_typical_sum_error(estimate, said):
    assert said in graded(lab01.check_typical_sum_error, estimate)


def rows(predicted):
    return [{"dtype": "float16", "n": 100, "relative_error": 1e-3, "stagnated": False, "predicted": predicted},
            {"dtype": "bfloat16", "n": 1000, "relative_error": 0.5, "stagnated": True, "predicted": 0.1}]


def test_the_estimate_against_the_measured_errors():
    assert lab01.sum_errors_problem(rows(4.9e-3)) == ""  # the stagnated sum does not count
    assert "times less accurate than you predict" in lab01.sum_errors_problem(rows(1e-4))
    assert "times too pessimistic" in lab01.sum_errors_problem(rows(1.0))
    assert lab01.sum_errors_problem(rows(None)) == NOT_ANSWERED
    assert "not an error above zero" in lab01.sum_errors_problem(rows(-1.0))


def test_no_printed_line_is_wider_than_90_characters(capsys):
    grader = grading.Grader(strict=False)
    lab01.check_tensor_peak(grader, lambda g, p: None)
    lab01.check_minimum_seconds(grader, lambda n, p: n**3)
    grader.record("a check whose name is long enough to leave no room for what went wrong",
                   "returned 1, expected 2", "a hint")  # its problem starts on the next line
    lines = capsys.readouterr().out.splitlines()
    assert lines and max(len(line) for line in lines) <= 90
    assert f"     {NOT_ANSWERED}" not in lines  # the phrase is never split
