"""The grading framework teaches: a wrong answer is quoted beside the expected one with the hint for its mistake,
an unanswered exercise says so, and no stack trace reaches the student."""

from __future__ import annotations

import math

import pytest
import torch

from gpulab.labs import grading
from gpulab.labs.grading import NOT_ANSWERED, SECONDS, Grader, Mistake, attempt, number_problem, tensor_problem

FLOPS = (Mistake("a multiply-add is two operations: count both", factor=0.5),
         Mistake("n**3 counts the multiplications only", value=4000**3),
         Mistake("2 n**2 is the work of a matrix-vector product", value=2 * 4000**2))


@pytest.mark.parametrize(("answer", "said"), [
    (None, NOT_ANSWERED),
    ("128e9", "returned a str, not a number"),
    (math.nan, "returned nan"),
    (4000**3, "returned 64,000,000,000, expected about 128,000,000,000: a multiply-add is two operations"),
    (2 * 4000**2, "returned 32,000,000, expected about 128,000,000,000: 2 n**2 is the work of a matrix-vector"),
    (-1.0, "returned -1, expected about 128,000,000,000: it must be above zero"),
    (3 * 4000**3, "returned 192,000,000,000, expected about 128,000,000,000 (1.5 times too much)"),
])
def test_a_wrong_number_is_quoted_with_the_hint_for_its_mistake(answer, said):
    assert number_problem(answer, 2 * 4000**3, 1e-9, FLOPS).startswith(said)


def test_the_right_number_passes_and_a_one_element_tensor_counts_as_a_number():
    assert number_problem(2 * 4000**3, 2 * 4000**3, 1e-9, FLOPS) == ""
    assert number_problem(torch.tensor(3.0), 3.0, 1e-6) == ""


@pytest.mark.parametrize(("seconds", "said"), [(12.0, "milliseconds"), (12_000.0, "microseconds"),
                                                (1.2e7, "nanoseconds")])
def test_a_time_in_the_wrong_unit_is_named(seconds, said):
    assert said in number_problem(seconds, 0.012, 0.5, SECONDS)


def test_a_wrong_tensor_is_told_apart():
    reference = torch.arange(6.0).reshape(2, 3)
    assert tensor_problem(None, reference, 1e-6) == NOT_ANSWERED
    assert tensor_problem([1, 2], reference, 1e-6) == "returned a list, not a tensor"
    assert tensor_problem(reference.T, reference, 1e-6) == "returned shape (3, 2), expected (2, 3): transposed?"
    assert tensor_problem(torch.zeros(6), reference, 1e-6).startswith("returned shape (6,), expected (2, 3)")
    assert tensor_problem(torch.full((2, 3), math.nan), reference, 1e-6) == "returned 6 NaN of 6 elements"
    assert tensor_problem(reference + 1, reference, 1e-6, {"the bias added twice": reference + 1}) == (
        "the values are wrong: the bias added twice")
    assert tensor_problem(reference * 2, reference, 1e-6).startswith("the values are wrong: a relative error of")
    assert tensor_problem(reference.clone(), reference, 1e-6) == ""


def test_a_stub_is_not_answered_yet_and_a_real_error_is_named(capsys):
    grader = grading.Grader(strict=False)
    assert not grader.number("flops", lambda: None, 1.0, rel=0.1, hint="count them")
    assert not grader.check("a check on a stub", lambda: None + 1, "fill it in")  # arithmetic on the stub's None
    assert not grader.number("raises", lambda: {}["x"], 1.0, rel=0.1, hint="look again")
    assert not grader.tensor("tensor", lambda: None, torch.ones(2), tolerance=1e-6, hint="compute it")
    assert grader.number("right", lambda: 1.05, 1.0, rel=0.1, hint="")
    out = capsys.readouterr().out
    assert "NOT YET  flops: not answered yet\n   hint: count them" in out
    assert "NOT YET  a check on a stub: not answered yet" in out and "Traceback" not in out
    assert "NOT YET  raises: the code raised KeyError: 'x'" in out and "PASS  right" in out
    grader.summary()
    assert capsys.readouterr().out.strip() == "1 of 5 checks pass"


def test_a_strict_grader_raises_with_the_same_message():
    with pytest.raises(grading.CheckFailed, match="returned 2, expected about 1 .2 times too much.\n   hint: halve"):
        grading.Grader(strict=True).number("x", lambda: 2.0, 1.0, rel=0.1, hint="halve")


def test_a_usual_wrong_shape_is_named():
    reference = torch.zeros(3, 4)
    said = tensor_problem(torch.zeros(3, 5), reference, 1e-6, shapes={(3, 5): "one column too many"})
    assert said == "returned shape (3, 5), expected (3, 4): one column too many"


def test_a_long_message_is_wrapped_and_the_unanswered_phrase_kept_whole(capsys):
    grader = Grader(strict=False)
    grader.record("a name", "word " * 40 + NOT_ANSWERED, "hint " * 40)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 90 and len(lines) > 3
    assert any(line.rstrip().endswith(NOT_ANSWERED) for line in lines)


def test_attempt_names_a_stub_a_named_mistake_and_any_other_error():
    assert attempt(lambda: 3) == (3, "")
    assert attempt(lambda: None + 1) == (None, NOT_ANSWERED)
    named = attempt(lambda: 1 / 0, lambda error: "divided by zero" if isinstance(error, ZeroDivisionError) else "")
    assert named == (None, "divided by zero")
    said = "the code raised ValueError: invalid literal for int() with base 10: 'x'"
    assert attempt(lambda: int("x")) == (None, said)
