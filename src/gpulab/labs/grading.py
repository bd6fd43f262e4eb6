r"""The labs' grading framework: a check passes, or says what the answer was, what was expected, and the hint for
that kind of mistake -- never with a stack trace.

:class:`Grader` records the checks of a lab notebook. In a solution notebook (``strict=True``) a failed check
raises, so CI catches a broken solution; in the student version it prints its message and the notebook runs on, so
a student sees every hint at once. An exercise whose function still returns the stub's ``None`` (or raises
``NotImplementedError``) is "not answered yet", never a failure with an error message.

- :meth:`Grader.number` checks a number against the expected one, and names the usual mistakes: a factor (a
  multiply-add counted as one operation, milliseconds for seconds), a value of zero or below, NaN, no number at
  all; a lab adds its own :class:`Mistake`\ s;
- :meth:`Grader.tensor` checks a tensor: its type, its shape (transposed?), NaN, and a lab's known wrong tensors;
- :meth:`Grader.check` runs any test that says True or False;
- a lab that diagnoses a student's code returns a :class:`Diagnosis` (a lab subclasses it with its own kinds of
  problem) and records it with :func:`grade`. The kernel labs' tools are in :mod:`gpulab.labs.kernel_grading`.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from gpulab.core.correctness import relative_error

NOT_ANSWERED = "not answered yet"
WIDTH = 90  # no line a check prints is wider


def agrees_with(actual: object, reference: torch.Tensor, tolerance: float = 1e-6) -> bool:
    """True if ``actual`` is a tensor of the reference's shape within ``tolerance`` relative error; never raises.

    A student's None, a wrong shape or a NaN is simply False, which a check turns into its hint.
    """
    if not isinstance(actual, torch.Tensor) or actual.shape != reference.shape:
        return False
    return relative_error(actual, reference) <= tolerance  # NaN compares False


class CheckFailed(AssertionError):
    """A lab check failed (raised only by a strict grader)."""


@dataclass(frozen=True)
class Mistake:
    """A usual wrong answer, and the hint for it. It matches an answer that is ``factor`` times the expected one,
    or equals ``value`` (both within ``rel``), or for which ``test(answer)`` is true."""

    hint: str
    factor: float | None = None
    value: float | None = None
    test: Callable[[float], bool] | None = None
    rel: float = 0.02

    def matches(self, got: float, expected: float) -> bool:
        def near(a: float, b: float) -> bool:
            return abs(a - b) <= self.rel * abs(b)

        return ((self.factor is not None and near(got, self.factor * expected))
                or (self.value is not None and near(got, self.value))
                or (self.test is not None and bool(self.test(got))))


# The mistakes of a time in seconds: the wrong unit, and a clock that never started or stopped.
SECONDS = (Mistake("that is a time in milliseconds: return seconds (divide by 1,000)", factor=1e3, rel=0.5),
           Mistake("that is a time in microseconds: return seconds", factor=1e6, rel=0.5),
           Mistake("that is a time in nanoseconds: return seconds (time.perf_counter() already gives seconds)",
                   factor=1e9, rel=0.5))


def shown(value: object) -> str:
    """A student's answer, as the message quotes it: numbers readably, anything else by its type."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.6g}" if 1e-3 <= abs(value) < 1e15 or value == 0 else f"{value:.4g}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _unanswered(error: Exception) -> bool:
    """Whether ``error`` is a stub's doing: NotImplementedError, or arithmetic on the None a stub returns."""
    return isinstance(error, NotImplementedError) or (
        isinstance(error, TypeError | AttributeError) and "NoneType" in str(error))


def raised(error: Exception) -> str:
    """What an error in a student's code says to them: "not answered yet" for a stub's doing, else its first line."""
    if _unanswered(error):
        return NOT_ANSWERED
    first = (str(error).splitlines() or [""])[0][:120]
    return f"the code raised {type(error).__name__}: {first}"


def attempt(answer: Callable[[], object], named: Callable[[Exception], str] = lambda error: "") -> tuple[object, str]:
    """``(answer(), '')``, or ``(None, what went wrong)`` if it raised: the mistake ``named(error)`` names, else
    what :func:`raised` says."""
    try:
        return answer(), ""
    except Exception as error:  # a student's half-written code may fail in any way
        return None, named(error) or raised(error)


def _fit(prefix: str, text: str, indent: str) -> str:
    """``text`` in lines that, printed after ``prefix``, are at most :data:`WIDTH` wide (after a long prefix: from
    the next line on). "not answered yet" is never split."""
    if not text:
        return ""
    room = len(prefix) <= WIDTH - 20
    kept = text.replace(NOT_ANSWERED, NOT_ANSWERED.replace(" ", "\0"))
    lines = textwrap.wrap(kept, WIDTH, initial_indent=" " * len(prefix) if room else indent,
                          subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    lines[0] = lines[0][len(prefix):] if room else "\n" + lines[0]
    return "\n".join(lines).replace("\0", " ")


def number_problem(got: object, expected: float, rel: float, mistakes: Sequence[Mistake] = ()) -> str:
    """'' if ``got`` is a number within ``rel`` of ``expected``; otherwise what is wrong with it, in words."""
    if got is None:
        return NOT_ANSWERED
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, int | float):
        return f"returned {shown(got)}, not a number"
    if math.isnan(got) or math.isinf(got):
        return f"returned {got}"
    if abs(got - expected) <= rel * abs(expected):
        return ""
    said = f"returned {shown(got)}, expected about {shown(expected)}"
    for mistake in mistakes:
        if mistake.matches(got, expected):
            return f"{said}: {mistake.hint}"
    if expected > 0 >= got:
        return f"{said}: it must be above zero"
    if got and expected:
        ratio = got / expected
        return f"{said} ({ratio:.3g} times too much)" if ratio > 1 else f"{said} ({1 / ratio:.3g} times too little)"
    return said


class Grader:
    """The checks of one lab notebook (see the module's docstring)."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.passed: list[str] = []
        self.failed: list[str] = []

    def record(self, name: str, problem: str, hint: str) -> bool:
        """PASS ``name`` if ``problem`` is '', else NOT YET with the problem and ``hint`` (in lines of at most
        :data:`WIDTH`); True if it passed."""
        if not problem:
            self.passed.append(name)
            print(f"PASS  {name}")
            return True
        self.failed.append(name)
        said = f"NOT YET  {name}: "
        fitted = _fit(said, problem, " " * 5)
        message = (said.rstrip() if fitted.startswith("\n") else said) + fitted
        if hint:
            message += "\n   hint: " + _fit("   hint: ", hint, " " * 9)
        if self.strict:
            raise CheckFailed(message)
        print(message)
        return False

    def check(self, name: str, test: Callable[[], bool], hint: str) -> bool:
        """Run ``test()``: True passes; False, or an error in the student's code, fails with ``hint``."""
        try:
            problem = "" if test() else "not right yet"
        except Exception as error:  # a student's half-written code may fail in any way
            problem = raised(error)
        return self.record(name, problem, hint)

    def number(self, name: str, answer: Callable[[], object], expected: float, *, rel: float, hint: str,
               mistakes: Sequence[Mistake] = ()) -> bool:
        """``answer()`` must be a finite number within ``rel`` (relative) of ``expected``; a wrong one is quoted
        beside the expected one, with the hint of the first of ``mistakes`` it matches (see :func:`number_problem`)."""
        try:
            problem = number_problem(answer(), expected, rel, mistakes)
        except Exception as error:
            problem = raised(error)
        return self.record(name, problem, hint)

    def close(self, name: str, actual: Callable[[], float], expected: float, rel: float, hint: str) -> bool:
        """:meth:`Grader.number` without named mistakes."""
        return self.number(name, actual, expected, rel=rel, hint=hint)

    def tensor(self, name: str, answer: Callable[[], object], reference: torch.Tensor, *, tolerance: float,
               hint: str, mistakes: Mapping[str, torch.Tensor] = {}) -> bool:  # noqa: B006 (read only)
        """``answer()`` must be a tensor of the reference's shape within ``tolerance`` relative error. A wrong one is
        told apart: no tensor, a transposed or otherwise wrong shape, NaN, or equal to one of ``mistakes`` ({hint:
        what that mistake computes})."""
        try:
            got = answer()
        except Exception as error:
            problem = raised(error)
            return self.record(name, problem, hint)
        problem = tensor_problem(got, reference, tolerance, mistakes)
        return self.record(name, problem, hint)

    def summary(self) -> None:
        print(f"{len(self.passed)} of {len(self.passed) + len(self.failed)} checks pass")


def tensor_problem(got: object, reference: torch.Tensor, tolerance: float,
                   mistakes: Mapping[str, torch.Tensor] = {},  # noqa: B006 (read only)
                   shapes: Mapping[tuple[int, ...], str] = {}) -> str:  # noqa: B006 (read only)
    """'' if ``got`` agrees with ``reference``; otherwise what is wrong with it, in words. ``mistakes``: {hint:
    the tensor that mistake computes}; ``shapes``: {a usual wrong shape: what returning it means}."""
    if got is None:
        return NOT_ANSWERED
    if not isinstance(got, torch.Tensor):
        return f"returned {shown(got)}, not a tensor"
    expected = tuple(reference.shape)
    if tuple(got.shape) != expected:
        said = f"returned shape {tuple(got.shape)}, expected {expected}"
        if tuple(got.shape) in shapes:
            return f"{said}: {shapes[tuple(got.shape)]}"
        if got.dim() == 2 and tuple(got.shape) == expected[::-1]:
            return f"{said}: transposed?"
        return said
    if torch.isnan(got).any():
        return f"returned {int(torch.isnan(got).sum())} NaN of {got.numel()} elements"
    if relative_error(got, reference) <= tolerance:
        return ""
    for hint, wrong in mistakes.items():
        if tuple(wrong.shape) == tuple(got.shape) and relative_error(got, wrong) <= tolerance:
            return f"the values are wrong: {hint}"
    return f"the values are wrong: a relative error of {relative_error(got, reference):.3g} (at most {tolerance:g})"


PROBLEMS = ("ok", "error")  # what any diagnosis can say; a lab's own Diagnosis adds its kinds of mistake


@dataclass(frozen=True)
class Diagnosis:
    """What a student's code did: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says what was seen.

    A lab's grader module makes its own kind by subclassing with its own ``problems``; :func:`grade`
    records any of them as a lab check.
    """

    problem: str
    detail: str
    problems: ClassVar[tuple[str, ...]] = PROBLEMS

    def __post_init__(self) -> None:
        if self.problem not in self.problems:
            raise ValueError(f"problem: one of {self.problems}, got {self.problem!r}")

    @property
    def ok(self) -> bool:
        return self.problem == "ok"

    def hint(self, hints: Mapping[str, str], default: str = "") -> str:
        """The detail, then the lab's advice for this kind of problem (``hints[problem]``, else ``default``)."""
        advice = hints.get(self.problem, default)
        return f"{self.detail}. {advice}".strip() if advice else self.detail


def safely(diagnose: Callable[[], Diagnosis]) -> Diagnosis:
    """``diagnose()``, or an "error" Diagnosis if it raised (say, in the student's code it called first)."""
    try:
        return diagnose()
    except Exception as error:  # a grader reports, never raises
        return Diagnosis("error", f"{type(error).__name__}: {error}")


def first_failure(diagnoses: Iterable[Callable[[], Diagnosis]]) -> Diagnosis:
    """Run the diagnoses in turn (each :func:`safely`); the first that is not ok, else the last one."""
    diagnosis = Diagnosis("error", "nothing was checked")
    for diagnose in diagnoses:
        diagnosis = safely(diagnose)
        if not diagnosis.ok:
            break
    return diagnosis


def grade(grader: Grader, name: str, diagnosis: Diagnosis, hints: Mapping[str, str], default: str = "") -> bool:
    """Record ``diagnosis`` as the check ``name``: PASS, or NOT YET with what was seen and the hint for its kind of
    problem (``hints[problem]``, else ``default``)."""
    return grader.record(name, "" if diagnosis.ok else diagnosis.detail, hints.get(diagnosis.problem, default))
