"""Sizes from a time budget: what a chapter runs in each profile, and how long that takes on each GPU of the book.

A chapter runs in one of two profiles, chosen by its ``PROFILE`` parameter (papermill can set it):

- ``"full"``: the sizes the book's recordings were made at;
- ``"class"``: sizes a class can wait for, at most :data:`CLASS_SECONDS` of compute for the whole chapter on a
  T4-class GPU (Colab's free GPU), and never more than the GPU in front of it holds.

A chapter describes itself once, as a :class:`Chapter`: its sizes in each setting (CI's smoke test, a CPU, the
class profile's candidates from small to large, the full profile) and its work as a function of its sizes. Its
notebook asks :meth:`Chapter.choose` for the sizes of the machine in front of it, and shows
:meth:`Chapter.prediction_table` at its top. The work is a list of :class:`Work` items (what one timed call
computes and moves, how many times it is measured, what it costs besides), plus fixed costs (compiling,
references on the host). From the rates of :mod:`gpulab.core.specs`, :func:`predicted_seconds` says how long the
chapter takes on a GPU. The model is the timer's own arithmetic (:func:`gpulab.core.timing.measure`: warm-up
calls, then repeats for about ``target_s``, at least ten) applied to a roofline time per call; ``make gpu-run``
records what each chapter really took, to hold the model to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab.core import env, specs
from gpulab.core.tables import Column, Table, table

PROFILES = ("class", "full")
CLASS_SECONDS = 180.0  # compute a class waits for, per chapter, on a T4-class GPU
CLASS_GPU = "T4"
PREDICTED = ("T4", "L4", "A100 SXM4 80GB", "H100 SXM5 80GB", "H200 SXM 141GB")  # the GPUs a class is likely to have
COMPUTE_EFFICIENCY = 0.6  # the share of a peak a library's dense kernel reaches at the sizes the book times
MEMORY_EFFICIENCY = 0.8  # the share of the datasheet bandwidth a copy reaches
MEMORY_SHARE = 0.8  # of a GPU's memory a plan may use: the CUDA context and the allocator's slack take the rest
LAUNCH_SECONDS = 5e-6  # the shortest a GPU call takes, however little it does
WARMUP, MIN_REPEATS, TARGET_SECONDS = 3, 10, 0.2  # gpulab.core.timing.measure's defaults on a GPU


@dataclass(frozen=True)
class Work:
    """One kind of timed call: ``flops`` of arithmetic in ``precision`` and ``bytes`` moved per call, timed in
    ``measurements`` separate measurements (each: warm-up, then repeats), with ``extra_seconds`` per measurement
    spent elsewhere (a check against a reference, a compile)."""

    label: str
    flops: float = 0.0
    bytes: float = 0.0
    precision: str = "float32"
    measurements: int = 1
    extra_seconds: float = 0.0
    memory_bytes: float = 0.0  # GPU memory the call needs at once (its operands), to check that a plan fits

    def call_seconds(self, gpu: specs.GPU) -> float:
        """The time of one call on ``gpu``: its arithmetic at the peak, or its bytes at the bandwidth, whichever is
        longer (the roofline), derated to what real kernels reach."""
        compute = self.flops / (specs.peak(gpu, self.precision).ops_per_s * COMPUTE_EFFICIENCY) if self.flops else 0
        memory = self.bytes / (gpu.bandwidth_gb_s * 1e9 * MEMORY_EFFICIENCY)
        return max(compute, memory, LAUNCH_SECONDS)


def measurement_seconds(call_seconds: float, target_seconds: float = TARGET_SECONDS) -> float:
    """Wall time of one :func:`gpulab.core.timing.measure` of a call that takes ``call_seconds``: the warm-up, the
    first call that picks the repeat count, and the repeats (enough for ``target_seconds``, at least ten)."""
    repeats = max(MIN_REPEATS, int(target_seconds / max(call_seconds, 1e-7)))
    return (WARMUP + 1 + repeats) * call_seconds


@dataclass(frozen=True)
class Plan:
    """What a chapter runs in one profile: its ``sizes`` (the parameters its cells use), its timed ``work`` and
    its ``fixed_seconds`` (compiles, host-side references, plotting), for one GPU."""

    profile: str
    sizes: dict
    work: Sequence[Work] = field(default_factory=tuple)
    fixed_seconds: float = 0.0

    def seconds_on(self, gpu: specs.GPU) -> float:
        return predicted_seconds(self.work, gpu, self.fixed_seconds)

    def fits(self, gpu: specs.GPU) -> bool:
        """Whether every call's memory fits in :data:`MEMORY_SHARE` of the GPU's."""
        return max((w.memory_bytes for w in self.work), default=0) <= MEMORY_SHARE * gpu.memory_gb * 1e9


def predicted_seconds(work: Sequence[Work], gpu: specs.GPU, fixed_seconds: float = 0.0) -> float:
    """How long ``work`` takes on ``gpu`` (see the module's docstring), plus ``fixed_seconds``."""
    return fixed_seconds + sum(w.measurements * (measurement_seconds(w.call_seconds(gpu)) + w.extra_seconds)
                               for w in work)


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"profile: one of {', '.join(PROFILES)}, got {profile!r}")
    return profile


def largest_fitting(candidates: Sequence[Plan], gpu: specs.GPU, budget_seconds: float = CLASS_SECONDS) -> Plan:
    """The last of ``candidates`` (ordered from small to large) that fits ``budget_seconds`` on ``gpu`` and its
    memory; the first one if none does."""
    fitting = [plan for plan in candidates if plan.seconds_on(gpu) <= budget_seconds and plan.fits(gpu)]
    return fitting[-1] if fitting else candidates[0]


def prediction_rows(plan_for: Callable[[specs.GPU], Plan], gpus: Sequence[str] = PREDICTED) -> list[dict]:
    """For each GPU of ``gpus``: the plan it would run (``plan_for(gpu)``) and its predicted seconds."""
    rows = []
    for name in gpus:
        gpu = specs.gpu(name)
        plan = plan_for(gpu)
        rows.append({"gpu": name, "profile": plan.profile, "seconds": plan.seconds_on(gpu),
                     "minutes": plan.seconds_on(gpu) / 60})
    return rows


def prediction_table(plan_for: Callable[[specs.GPU], Plan], gpus: Sequence[str] = PREDICTED) -> Table:
    """The predicted compute time of a chapter's profile on each GPU a class is likely to have."""
    rows = prediction_rows(plan_for, gpus)
    return table(rows, [Column("gpu", "GPU"), Column("profile"), Column("minutes", "predicted time", "min", ",.1f")],
                 caption="predicted from the chapter's work and each GPU's datasheet rates (gpulab.core.budget)")


Sizes = Mapping[str, Any]


@dataclass(frozen=True)
class Chapter:
    """A chapter's sizes in every setting and its work as a function of them: the one place its sizes are set.

    ``full``: the sizes of the book's recordings; ``classes``: candidate sizes for the class profile, smallest
    first (the largest that fits :data:`CLASS_SECONDS` on the GPU is taken); ``cpu``: the sizes a CPU runs (the
    book's build, a laptop); ``smoke``: CI's tiny sizes. Every setting names the same keys. ``work(sizes)`` lists
    the timed calls those sizes make, and ``fixed_seconds(sizes)`` what else they cost on a GPU (compiles, host
    references, model training).
    """

    name: str
    full: Sizes
    classes: Sequence[Sizes]
    cpu: Sizes
    smoke: Sizes
    work: Callable[[Sizes], Sequence[Work]]
    fixed_seconds: Callable[[Sizes], float] = lambda sizes: 0.0

    def __post_init__(self) -> None:
        keys = set(self.full)
        for setting, sizes in (("cpu", self.cpu), ("smoke", self.smoke), *(("classes", s) for s in self.classes)):
            if set(sizes) != keys:
                raise ValueError(f"{self.name}: {setting} names {sorted(set(sizes) ^ keys)} differently from full")
        if not self.classes:
            raise ValueError(f"{self.name}: classes: at least one candidate")

    def _plan(self, profile: str, sizes: Sizes) -> Plan:
        return Plan(profile, dict(sizes), tuple(self.work(sizes)), self.fixed_seconds(sizes))

    def plan(self, profile: str, gpu: specs.GPU) -> Plan:
        """What ``profile`` runs on ``gpu``: the full sizes, or the largest class candidate that fits."""
        if check_profile(profile) == "full":
            return self._plan("full", self.full)
        return largest_fitting([self._plan("class", sizes) for sizes in self.classes], gpu)

    def choose(self, profile: str, smoke: bool = False) -> Plan:
        """The plan for the machine in front of the notebook: CI's smoke sizes, a CPU's sizes, or ``profile`` for
        its GPU (a GPU the book's table lacks is planned for as a T4, the slowest it knows)."""
        check_profile(profile)
        if smoke:
            return self._plan("smoke", self.smoke)
        if not env.has_gpu():
            return self._plan("cpu", self.cpu)
        return self.plan(profile, specs.present() or specs.gpu(CLASS_GPU))

    def prediction_table(self, profile: str, gpus: Sequence[str] = PREDICTED) -> Table:
        """The predicted compute time of ``profile`` on each GPU a class is likely to have."""
        check_profile(profile)
        return prediction_table(lambda gpu: self.plan(profile, gpu), gpus)
