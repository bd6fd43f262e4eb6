"""Claims as code: a sentence a page states about GPUs, and its test on every recorded GPU.

A measured sentence ("best 3,984 GB/s with 64 threads x 8 elements") is printed from its recording with
:func:`gpulab.core.printing.say`. A sentence that generalises ("eight elements per thread beat one") is a
:class:`Claim`: the sentence, the experiment it rests on, and a test that reads one GPU's recording and returns a
:class:`Verdict` (whether it holds, and the numbers that decide it). :func:`state` checks the claim on the newest
recording of every recorded GPU and prints the sentence with those numbers, GPU by GPU.

- A **rule** (``Claim(...)``) must hold on every recorded GPU. Where it fails on one, :func:`state` raises
  :class:`ClaimFailed`, naming the GPU and its numbers: the chapter stops, so the book's build fails (and the unit
  test that checks every chapter's claims fails) until the author rewrites the sentence or scopes it.
- A **scoped** claim (``Claim(..., scoped=True)``) is printed with the GPUs where it holds and those where it does
  not; it fails only where it holds on none.

A third GPU's recordings are checked the day they are committed, with no edit to the chapter. Each chapter keeps its
claims in ``gpulab.chNN_topic.claims``; ``gpulab.course.claims()`` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulab.core import recordings
from gpulab.core.printing import say
from gpulab.core.recordings import Recording


@dataclass(frozen=True)
class Verdict:
    """What one GPU's recording says of a claim: ``holds``, and ``evidence``, the numbers that decide it
    ('8 elements per thread: 3,984 GB/s; 1 element: 3,366 GB/s')."""

    holds: bool
    evidence: str


@dataclass(frozen=True)
class Claim:
    """A sentence (Markdown) the page states, the experiment it rests on, and its test on one GPU's recording."""

    name: str
    sentence: str
    experiment: str
    test: Callable[[Recording], Verdict]
    scoped: bool = False  # False: a rule, true on every recorded GPU; True: the page says where it holds

    def __post_init__(self):
        if not self.sentence.strip():
            raise ValueError(f"claim {self.name!r}: an empty sentence")
        if not callable(self.test):
            raise TypeError(f"claim {self.name!r}: test must be a function of a Recording, got {self.test!r}")


@dataclass(frozen=True)
class Check:
    """One claim on one GPU: the recording it was tested on and the verdict."""

    recording: Recording
    verdict: Verdict

    @property
    def gpu(self) -> str:
        return self.recording.short_label


class ClaimFailed(AssertionError):
    """A rule that does not hold on a recorded GPU, or a scoped claim that holds on none."""


def verdict(holds: bool, evidence: str) -> Verdict:
    return Verdict(bool(holds), evidence)


def same_gpu(run: Recording, experiment: str, root: Path | None = None) -> Recording:
    """The newest recording of ``experiment`` made on the GPU that made ``run`` (a claim that rests on two
    experiments: a kernel's rate and its GPU's ceilings). KeyError, which :func:`check` reports, where there is none.
    """
    for recording in recordings.newest_per_gpu(experiment, root):
        if recording.device_name == run.device_name:
            return recording
    raise KeyError(f"no recording of {experiment} on {run.device_name}")


def check(claim: Claim, root: Path | None = None) -> list[Check]:
    """The claim's verdict on the newest GPU recording of each GPU (``root``: the results folder; the book's own
    by default). A GPU without a recording of the experiment is not checked."""
    checks = []
    for recording in recordings.newest_per_gpu(claim.experiment, root):
        if not recording.on_gpu:
            continue
        try:
            found = claim.test(recording)
        except (KeyError, ValueError, IndexError) as error:
            raise ClaimFailed(f"claim {claim.name!r}: its test cannot read {recording.label} of "
                              f"{claim.experiment!r} ({type(error).__name__}: {error})") from error
        if not isinstance(found, Verdict):
            raise TypeError(f"claim {claim.name!r}: its test returned {found!r}, not a Verdict")
        checks.append(Check(recording, found))
    return checks


def verify(claim: Claim, root: Path | None = None) -> list[Check]:
    """:func:`check`, raising :class:`ClaimFailed` where a rule fails on a GPU or a scoped claim holds on none."""
    checks = check(claim, root)
    failed = [c for c in checks if not c.verdict.holds]
    if failed and (not claim.scoped or len(failed) == len(checks)):
        where = "; ".join(f"{c.recording.label}: {c.verdict.evidence}" for c in failed)
        advice = ("rewrite the sentence" if claim.scoped else
                  "scope the sentence to the GPUs where it holds (Claim(..., scoped=True)) or rewrite it")
        raise ClaimFailed(f"claim {claim.name!r} ({claim.experiment}) does not hold on {where}. "
                          f"The sentence: \"{claim.sentence}\" - {advice}.")
    return checks


def _gpus(checks: Sequence[Check]) -> str:
    names = [c.gpu for c in checks]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def sentence(claim: Claim, checks: Sequence[Check]) -> str:
    """The claim as the page prints it: the sentence, then the numbers of each GPU it was checked on."""
    if not checks:
        return f"{claim.sentence} *(No GPU recording of {claim.experiment} to check this against yet.)*"
    evidence = "; ".join(f"{c.gpu}: {c.verdict.evidence}" for c in checks)
    if not claim.scoped:
        return f"{claim.sentence} *(Checked on every recorded GPU. {evidence}.)*"
    holds = [c for c in checks if c.verdict.holds]
    fails = [c for c in checks if not c.verdict.holds]
    text = f"On the {_gpus(holds)}: {claim.sentence}"
    if fails:
        text += f" Not on the {_gpus(fails)}."
    return f"{text} *({evidence}.)*"


def state(claim: Claim) -> None:
    """Check ``claim`` on every recorded GPU and print it with their numbers (raises :class:`ClaimFailed`)."""
    say(sentence(claim, verify(claim)))
