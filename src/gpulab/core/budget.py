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

from gpulab.core import env, specs, timing
from gpulab.core.tables import Column, Table, table

PROFILES = ("class", "full")
CLASS_SECONDS = 180.0  # compute a class waits for, per chapter, on a T4-class GPU
CLASS_GPU = "T4"
PREDICTED = ("T4", "L4", "A100 SXM4 80GB", "H100 SXM5 80GB", "H200 SXM 141GB")  # the GPUs a class is likely to have
COMPUTE_EFFICIENCY = 0.6  # the share of a peak a library's dense kernel reaches at the sizes the book times
MEMORY_EFFICIENCY = 0.8  # the share of the datasheet bandwidth a copy reaches
MEMORY_SHARE = 0.8  # of a GPU's memory a plan may use: the CUDA context and the allocator's slack take the rest
LAUNCH_SECONDS = 5e-6  # the shortest a GPU call takes, however little it does
# gpulab.core.timing.measure on a GPU: 3 warm-up calls, one call that picks the repeats, then repeats for about
# 0.2 s (at least 10, at most 2,000), each after a write of timing.L2_FLUSH_BYTES that evicts the last one's data
WARMUP, MIN_REPEATS, MAX_REPEATS, TARGET_SECONDS = 3, 10, 2000, 0.2
# A host copy reaches this share of the PCIe link: pinned memory goes at the link's pace (55 of 63 GB/s on the
# recorded H200); pageable memory is staged through a pinned buffer by the CPU (9 to 15 GB/s there).
PCIE_EFFICIENCY = {"pinned": 0.85, "pageable": 0.15}
FALLBACK = {"tf32": "float32", "bfloat16": "float16", "float8": "float16"}  # what torch runs where a GPU lacks one

# What the host spends, whatever the GPU, calibrated on the gaps between the recordings of the H200's full run
# (a 16-core server; Colab's two vCPUs are slower, which the class budget leaves room for):
# - gpulab.core.correctness checks a result on the host (a copy in float64, two norms): 2**28 elements took 3.0 to
#   3.8 s (threads_saxpy_vs_copy, threads_launch_configuration, memory_transpose), 2**26 about 0.7 s;
HOST_CHECK_SECONDS_PER_ELEMENT = 1.25e-8
# - Python issuing one torch call (dispatch, checks, launch): 10-18 ms for the 1,000 torch.mm of batched_gemm's
#   loop, 0.12-0.17 ms for an LSTM step's dozen operations;
HOST_CALL_SECONDS = 12e-6
# A notebook's kernel start and papermill (5.0 to 6.5 s outside its cells), its setup and import cells (4 to 6 s):
# measured in the H100 runs of 2026-11-25 (results/nvidia-h100-80gb-hbm3/gpu_run/), 18 notebooks
NOTEBOOK_SECONDS = 11.0
NVRTC_SECONDS = 1.0  # CuPy compiling one CUDA C file with NVRTC
# torch.profiler: its first session in a process starts CUPTI (about 0.7 s: fusion_horizontal's 6 sessions and
# 480 M checked elements took 8 s); each session after it, around a few calls, about 0.1 s (chapter 12's 18
# profiled points of the channel sweep took 10 s, autotuning and checks included)
PROFILER_START_SECONDS, PROFILER_SESSION_SECONDS = 0.7, 0.1
# torch.compile from a cold cache: the first in a process also starts inductor (fusion_compile: 3.5 s for the first
# chain, 0.7 and 1.5 s for the next); a rough upper figure for each
TORCH_COMPILE_FIRST_SECONDS, TORCH_COMPILE_SECONDS = 8.0, 3.0
TORCHRUN_SECONDS = 8.0  # torchrun starting two Python processes that import torch and join a process group


def _capability(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


@dataclass(frozen=True)
class Work:
    """Calls as an experiment times them: ``measurements`` measurements of a call that does ``flops`` of arithmetic
    in ``precision`` and moves ``bytes``, each made as :func:`gpulab.core.timing.measure` makes it.

    A call lasts its roofline time at ``share`` of the peak (a library's kernel, :data:`COMPUTE_EFFICIENCY`; a
    hand-written one less) and at :data:`MEMORY_EFFICIENCY` of the bandwidth, or over PCIe for a ``link`` of
    'pinned' or 'pageable' host memory; but never less than ``launches`` kernel launches, nor than
    ``least_seconds`` (the host's time for a Python loop of calls, a latency floor). A measurement is the timer's:
    ``warmup`` calls, one that picks the repeats (unless ``repeats`` is given), the repeats (enough for
    ``target_seconds``, at least :data:`MIN_REPEATS`, at most :data:`MAX_REPEATS`), each after an L2 flush when
    ``flush_l2`` (the timer's default). :func:`once` makes single calls instead (a reference, a first call). Each
    measurement also spends ``extra_seconds`` on the host and checks ``checked_elements`` there.

    A GPU without ``precision`` runs the wider one of :data:`FALLBACK` (``missing='fallback'``, as torch runs TF32
    as float32), or nothing (``missing='skip'``: the experiment leaves the format out); nor does it run work that
    ``requires`` a precision it lacks or a compute capability above its own (``min_capability``).
    """

    label: str
    flops: float = 0.0
    bytes: float = 0.0
    precision: str = "float32"
    measurements: float = 1
    extra_seconds: float = 0.0
    memory_bytes: float = 0.0  # GPU memory the call needs at once (its operands), to check that a plan fits
    share: float = COMPUTE_EFFICIENCY
    launches: int = 1
    least_seconds: float = 0.0
    link: str = "device"
    warmup: int = WARMUP
    repeats: int | None = None
    target_seconds: float = TARGET_SECONDS
    flush_l2: bool = True
    checked_elements: float = 0.0
    missing: str = "fallback"
    requires: str = ""
    min_capability: str = "0.0"

    def __post_init__(self) -> None:
        if self.missing not in ("fallback", "skip"):
            raise ValueError(f"missing: 'fallback' or 'skip', got {self.missing!r}")
        if self.link not in ("device", *PCIE_EFFICIENCY):
            raise ValueError(f"link: 'device', 'pinned' or 'pageable', got {self.link!r}")
        if not 0 < self.share <= 1:
            raise ValueError(f"share: a share of the peak in (0, 1], got {self.share!r}")

    def precision_on(self, gpu: specs.GPU) -> str | None:
        """The precision the call runs in on ``gpu``; None where the experiment does not run it there."""
        if _capability(gpu.compute_capability) < _capability(self.min_capability):
            return None
        if self.requires and specs.peak_tflops(gpu, self.requires) is None:
            return None
        precision = self.precision
        while self.flops and specs.peak_tflops(gpu, precision) is None:
            if self.missing == "skip" or precision not in FALLBACK:
                return None
            precision = FALLBACK[precision]
        return precision

    def gpu_seconds(self, gpu: specs.GPU) -> float:
        """One call's time on the GPU: its roofline (see the class's docstring), or 0 where it does not run."""
        precision = self.precision_on(gpu)
        if precision is None:
            return 0.0
        compute = self.flops / (specs.peak(gpu, precision).ops_per_s * self.share) if self.flops else 0.0
        if self.link == "device":
            memory = self.bytes / (gpu.bandwidth_gb_s * 1e9 * MEMORY_EFFICIENCY)
        else:
            memory = self.bytes / (gpu.pcie_gb_s * 1e9 * PCIE_EFFICIENCY[self.link])
        return max(compute, memory, self.launches * LAUNCH_SECONDS)

    def call_seconds(self, gpu: specs.GPU) -> float:
        """One call, as the host sees it: the GPU's time or the host's floor, whichever is longer."""
        return max(self.gpu_seconds(gpu), self.least_seconds)

    def measurement_seconds(self, gpu: specs.GPU) -> float:
        """One measurement on ``gpu`` (see the class's docstring); 0 where the experiment does not run it there."""
        if self.precision_on(gpu) is None:
            return 0.0
        host = self.extra_seconds + self.checked_elements * HOST_CHECK_SECONDS_PER_ELEMENT
        gpu_time, call = self.gpu_seconds(gpu), self.call_seconds(gpu)
        if not call:  # work of the host alone
            return host
        if self.repeats is None:
            repeats, first = max(MIN_REPEATS, min(MAX_REPEATS, int(self.target_seconds / call))), 1
        else:
            repeats, first = self.repeats, 0
        flush = timing.L2_FLUSH_BYTES / (gpu.bandwidth_gb_s * 1e9 * MEMORY_EFFICIENCY) if self.flush_l2 else 0.0
        repeat = max(call, gpu_time + flush)  # a host loop goes on while the GPU flushes
        return (self.warmup + first) * call + repeats * repeat + host

    def seconds_on(self, gpu: specs.GPU) -> float:
        return self.measurements * self.measurement_seconds(gpu)


def once(label: str, **work) -> Work:
    """Single calls, untimed or timed by :func:`gpulab.core.timing.once` (no warm-up, no repeats, no flush):
    ``measurements`` of them, each with its host time (a check's comparison); ``work`` as for :class:`Work`."""
    return Work(label, warmup=0, repeats=1, flush_l2=False, **work)


def host_seconds(label: str, seconds: float, measurements: float = 1) -> Work:
    """``seconds`` the host spends, whatever the GPU, ``measurements`` times (a model trained in Python, a reference
    on the CPU, a compile)."""
    return Work(label, measurements=measurements, extra_seconds=seconds, launches=0)


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
    """How long ``work`` takes on ``gpu`` (see :class:`Work`), plus ``fixed_seconds``."""
    return fixed_seconds + sum(w.seconds_on(gpu) for w in work)


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
