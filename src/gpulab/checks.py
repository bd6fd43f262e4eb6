"""Lab graders: a check passes with a tick, or fails with a hint -- never with a stack trace.

In a solution notebook (``strict=True``) a failed check raises, so CI catches a broken solution. In
the student version it prints the hint and the notebook runs on, so a student sees every hint at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from gpulab.correctness import relative_error


def agrees_with(actual: object, reference: torch.Tensor, tolerance: float = 1e-6) -> bool:
    """True if ``actual`` is a tensor of the reference's shape within ``tolerance`` relative error; never raises.

    A student's None, a wrong shape or a NaN is simply False, which a check turns into its hint.
    """
    if not isinstance(actual, torch.Tensor) or actual.shape != reference.shape:
        return False
    return relative_error(actual, reference) <= tolerance  # NaN compares False


class CheckFailed(AssertionError):
    """A lab check failed (raised only by a strict grader)."""


class Grader:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.passed: list[str] = []
        self.failed: list[str] = []

    def check(self, name: str, test: Callable[[], bool], hint: str) -> None:
        """Run ``test()``; a False result, or any exception inside it, counts as a failure with ``hint``."""
        try:
            ok = bool(test())
            detail = ""
        except Exception as error:  # a student's half-written code may fail in any way
            ok, detail = False, f" ({type(error).__name__}: {error})"
        if ok:
            self.passed.append(name)
            print(f"PASS  {name}")
            return
        self.failed.append(name)
        message = f"NOT YET  {name}{detail}\n   hint: {hint}"
        if self.strict:
            raise CheckFailed(message)
        print(message)

    def close(self, name: str, actual: Callable[[], float], expected: float, rel: float, hint: str) -> None:
        """Check that ``actual()`` is a finite number within ``rel`` (relative) of ``expected``."""
        def test() -> bool:
            value = actual()
            return value is not None and math.isfinite(value) and abs(value - expected) <= rel * abs(expected)
        self.check(name, test, hint)

    def summary(self) -> None:
        print(f"{len(self.passed)} of {len(self.passed) + len(self.failed)} checks pass")
