"""Graders for the lab "Train with AMP": run a student's training step on a small model and say what went wrong.

A mixed-precision training step in PyTorch {micikevicius2018mixed} is::

    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):  # the forward pass and the loss, nothing else
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()  # outside autocast: each backward op follows its forward op's dtype
    scaler.step(optimizer)  # unscales the gradients; skips optimizer.step() if one is inf or NaN
    scaler.update()  # lowers the scale after an overflow, raises it after a run of clean steps

(:func:`gpulab.ch11_mixed_precision.amp.amp_step`, here ``reference_step``; :func:`reference_clipped_step` clips the
gradients between a ``scaler.unscale_(optimizer)`` and the step). The usual mistakes leave traces that the functions
here look for, so that a lab can name the mistake instead of saying "wrong answer":

- forward hooks on the model's linear layers see the dtype each layer computed in: float32 means the
  forward pass ran outside ``torch.autocast`` (or under another device's autocast);
- a hook on the gradient of the model's output sees whether autocast was still on during backward;
- the step gets a :class:`.probe.RecordingScaler`, a ``GradScaler`` that notes which of its methods ran, in
  which order, and how large the gradients were when it unscaled them: unscaled gradients mean the
  loss was not scaled, gradients of exactly ``max_norm`` mean they were clipped while still scaled;
- the parameters' update is compared with the reference step's on an identical model and batch, and
  a second step on a second batch catches gradients left over from the first (no ``zero_grad``);
- in :func:`diagnose_overflow` the scale starts at 2^24, where float16 gradients must overflow: the
  parameters must not move, and the scale must halve.

Like :mod:`gpulab.labs.grading` (whose :func:`~gpulab.labs.grading.grade` and
:func:`~gpulab.labs.grading.safely` record these diagnoses), nothing here raises on a student's
mistake: an exception in the step becomes a :class:`Diagnosis` too. Everything runs on the device of
:func:`gpulab.core.env.device`, on a CPU as on a GPU (PyTorch's CPU autocast and ``GradScaler("cpu")``
behave like CUDA's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from gpulab.core import env
from gpulab.core.validation import dtype_name
from gpulab.labs import grading
from gpulab.labs.lab08_train_with_amp.probe import (
    OVERFLOW_SCALE,
    PROBE_SCALE,
    Probe,
    StepRun,
    reference_clipped_step,
    reference_step,
)

PROBLEMS = ("ok", "error", "no forward", "no autocast", "wrong dtype", "no backward", "autocast around backward",
            "loss not scaled", "no scaler step", "no update", "loss not returned", "scaled loss returned",
            "loss outside autocast", "wrong update", "stale gradients", "not clipped", "clipped while scaled",
            "stepped on overflow")

# What a lab can tell a student for each problem (a lab may pass its own mapping instead).
HINTS = {
    "error": "the step is amp_step(model, optimizer, scaler, X, labels, dtype): zero the gradients, run the model "
             "and the loss under torch.autocast, then scaler.scale(loss).backward(), scaler.step(optimizer), "
             "scaler.update(), and return the loss",
    "no forward": "run the model on X inside the autocast block: loss = F.cross_entropy(model(X), labels)",
    "no autocast": "wrap the forward pass and the loss in `with torch.autocast(X.device.type, dtype=dtype):`; "
                   "device_type must be the device the tensors are on (X.device.type), or autocast does nothing",
    "wrong dtype": "use the dtype the step is given: torch.autocast(X.device.type, dtype=dtype)",
    "no backward": "call backward on the scaled loss: scaler.scale(loss).backward()",
    "autocast around backward": "end the `with torch.autocast(...)` block after the loss and call backward outside "
                                "it: each backward op already runs in the dtype its forward op used",
    "loss not scaled": "call backward on the scaled loss, once: scaler.scale(loss).backward(); the scale lifts small "
                       "gradients out of float16's underflow, and scaler.step divides it out again",
    "no scaler step": "step through the scaler, scaler.step(optimizer), instead of optimizer.step(): it unscales "
                      "the gradients first, and skips the step when one of them is inf or NaN",
    "no update": "call scaler.update() once per step, after scaler.step(optimizer): it lowers the scale after an "
                 "overflow and raises it after a run of clean steps",
    "loss not returned": "return the loss itself (loss.detach(), or loss.item()), as the fp32 step does",
    "scaled loss returned": "return loss, not scaler.scale(loss): the scaled loss is the loss times the scale",
    "loss outside autocast": "compute the loss inside the autocast block too: there autocast runs cross_entropy in "
                             "float32; outside it, cross_entropy runs in the logits' 16-bit dtype",
    "wrong update": "compare your step with the reference order: zero_grad; autocast around the forward pass and "
                    "the loss; scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()",
    "stale gradients": "zero the gradients at the start of each step, optimizer.zero_grad(): backward adds to .grad",
    "not clipped": "clip between scaler.unscale_(optimizer) and scaler.step(optimizer), with "
                   "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm); after the step it is too late",
    "clipped while scaled": "the gradients were clipped while still multiplied by the scale, so max_norm cut them "
                            "far too short: call scaler.unscale_(optimizer) first, then clip, then scaler.step "
                            "(which knows they are unscaled already)",
    "stepped on overflow": "never call optimizer.step() yourself: scaler.step(optimizer) skips it when a gradient "
                           "is inf or NaN, so that one overflow does not ruin the weights",
}


TOLERANCE = 1e-2  # relative difference of a step's update from the reference step's; real mistakes are far larger
CLIP_FRACTION = 0.25  # the clipped step's max_norm, as a fraction of the gradient's true norm: clipping bites


@dataclass(frozen=True)
class Diagnosis(grading.Diagnosis):
    """What a training step did: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says what was seen.

    It is a :class:`gpulab.labs.grading.Diagnosis` with this module's problems, so
    :func:`gpulab.labs.grading.grade` records it as a lab check.
    """

    problems: ClassVar[tuple[str, ...]] = PROBLEMS


def _error(run: StepRun) -> str:
    return f"{type(run.error).__name__}: {run.error}"


def _scale_text(scale: float) -> str:
    return f"2^{int(math.log2(scale))}" if scale > 0 and math.log2(scale).is_integer() else f"{scale:g}"


def _forward_problem(run: StepRun, dtype: torch.dtype) -> Diagnosis | None:
    if not run.forward_dtypes:
        if run.error is not None:
            return Diagnosis("error", f"the step raised {_error(run)} before it ran the model")
        return Diagnosis("no forward", "the step never ran the model")
    if torch.float32 in run.forward_dtypes:
        ran = sum(d == torch.float32 for d in run.forward_dtypes)
        return Diagnosis("no autocast", f"{ran} of the {len(run.forward_dtypes)} linear-layer outputs were float32: "
                                        "the forward pass ran outside autocast")
    others = sorted({dtype_name(d) for d in run.forward_dtypes if d != dtype})
    if others:
        return Diagnosis("wrong dtype", f"the linear layers computed in {', '.join(others)}, not in the "
                                        f"{dtype_name(dtype)} the step was given")
    return None


def _backward_problem(run: StepRun) -> Diagnosis | None:
    if any(run.backward_autocast):
        return Diagnosis("autocast around backward", "backward() ran while autocast was still on")
    if not run.backward_autocast:
        if run.error is not None:
            return Diagnosis("error", f"the step raised {_error(run)} before backward() reached the model")
        return Diagnosis("no backward", "no gradient reached the model: backward() was never called on the loss")
    return None


def _scaled_problem(run: StepRun, reference: StepRun) -> Diagnosis | None:
    """The loss must be scaled once: the gradients reaching the scaler are the reference's, within a factor of 2."""
    if "scale" not in run.calls:
        return Diagnosis("loss not scaled", "scaler.scale(loss) was never called")
    if run.norms_at_unscale and reference.norms_at_unscale:
        ratio = run.norms_at_unscale[0] / reference.norms_at_unscale[0]
        if not 0.5 < ratio < 2:  # NaN fails too
            times = ratio * run.scale_before
            return Diagnosis("loss not scaled", f"the gradients reaching the scaler were {times:.3g} times the true "
                                                f"ones, not {_scale_text(run.scale_before)} times: backward ran on a "
                                                "loss that was not scaled exactly once")
    return None


def _order_problem(run: StepRun) -> Diagnosis | None:
    if "update" in run.calls and ("step" not in run.calls or run.calls.index("update") < run.calls.index("step")):
        raised = f", which raised {_error(run)}" if run.error is not None else ""
        return Diagnosis("no update", f"scaler.update() was called before scaler.step(optimizer){raised}")
    if run.error is not None:
        return Diagnosis("error", f"the step raised {_error(run)}")
    if "step" not in run.calls:
        moved = ("; the optimizer stepped on its own, with the gradients still multiplied by the scale"
                 if run.moved else "; no parameter moved")
        return Diagnosis("no scaler step", "scaler.step(optimizer) was never called" + moved)
    if "update" not in run.calls:
        return Diagnosis("no update", "scaler.update() was not called after scaler.step(optimizer)")
    return None


def _as_float(value: object) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.detach().float().item()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _returned_problem(run: StepRun, reference: StepRun) -> Diagnosis | None:
    value, true = _as_float(run.returned), _as_float(reference.returned)
    if value is None:
        what = "None" if run.returned is None else f"a {type(run.returned).__name__}"
        return Diagnosis("loss not returned", f"the step returned {what}, not the loss")
    if math.isclose(value, true * run.scale_before, rel_tol=TOLERANCE):
        return Diagnosis("scaled loss returned", f"the step returned {value:.6g}, the loss times the scale "
                                                 f"{_scale_text(run.scale_before)}; the loss is {true:.4f}")
    if not math.isclose(value, true, rel_tol=TOLERANCE):
        return Diagnosis("loss not returned", f"the step returned {value:.6g}; the loss is {true:.4f}")
    if isinstance(run.returned, torch.Tensor) and run.returned.dtype != torch.float32:
        return Diagnosis("loss outside autocast", f"the loss is {dtype_name(run.returned.dtype)}: cross_entropy ran "
                                                  "outside autocast")
    return None


def _first(*problems: Callable[[], Diagnosis | None]) -> Diagnosis | None:
    for problem in problems:
        found = problem()
        if found is not None:
            return found
    return None


def _same_update(run: StepRun, reference: StepRun) -> bool:
    return grading.agrees_with(run.update, reference.update, TOLERANCE)


def _update_problem(run: StepRun, reference: StepRun) -> Diagnosis | None:
    return None if _same_update(run, reference) else Diagnosis("wrong update", _how_far(run, reference))


def _how_far(run: StepRun, reference: StepRun) -> str:
    norm = torch.linalg.vector_norm(run.update).item()
    if not math.isfinite(norm):
        return "some parameters became inf or NaN"
    ratio = norm / torch.linalg.vector_norm(reference.update).item()
    return f"the parameters moved {ratio:.3g} times as far as the reference step moved them"


def _amp_dtype(dtype: torch.dtype | str) -> torch.dtype:
    name = dtype_name(dtype)
    if name not in ("float16", "bfloat16"):
        raise ValueError(f"dtype: autocast's dtype is float16 or bfloat16, got {name}")
    return getattr(torch, name)






def diagnose_step(step: Callable, dtype: torch.dtype | str, device: torch.device | None = None) -> Diagnosis:
    """Run ``step(model, optimizer, scaler, X, labels, dtype)`` twice beside :func:`reference_step` and compare.

    Checks, in this order: the model ran under autocast in ``dtype``; backward ran outside autocast on the
    loss scaled once; ``scaler.step`` and then ``scaler.update`` were called; the parameters moved as the
    reference step moves them; the step returned the loss (unscaled, float32); and a second step, from a
    scale of 1 so that gradients left over from the first would show, moved them as the reference does.
    """
    dtype, device = _amp_dtype(dtype), device or env.device()
    reference, student = Probe(device, PROBE_SCALE), Probe(device, PROBE_SCALE)
    expected, got = reference.run(reference_step, 0, dtype), student.run(step, 0, dtype)
    problem = _first(lambda: _forward_problem(got, dtype), lambda: _backward_problem(got),
                     lambda: _scaled_problem(got, expected), lambda: _order_problem(got),
                     lambda: _update_problem(got, expected),
                     lambda: _returned_problem(got, expected))
    if problem is not None:
        return problem
    # The second step runs at a scale of 1. At 2^12, gradients left over from the first step (no zero_grad) would
    # be divided by the scale before they are added to the new ones, and hide.
    for probe in (reference, student):
        probe.scaler.update(new_scale=1.0)
    expected, got = reference.run(reference_step, 1, dtype), student.run(step, 1, dtype)
    if got.error is not None:
        return Diagnosis("error", f"the second step raised {_error(got)}")
    if not _same_update(got, expected):
        return Diagnosis("stale gradients", "the first step was right, the second was not: "
                                            f"{_how_far(got, expected)}")
    return Diagnosis("ok", f"the forward pass ran in {dtype_name(dtype)}, backward on the loss scaled by "
                           f"{_scale_text(PROBE_SCALE)}, and two steps moved the parameters as the reference does")


def diagnose_clipped_step(step: Callable, dtype: torch.dtype | str, device: torch.device | None = None) -> Diagnosis:
    """Run ``step(model, optimizer, scaler, X, labels, dtype, max_norm)`` beside :func:`reference_clipped_step`.

    ``max_norm`` is :data:`CLIP_FRACTION` of the gradient's true norm, so a clipped step moves the
    parameters that much less far than an unclipped one. Besides :func:`diagnose_step`'s problems it
    names "not clipped" (the update is the unclipped one) and "clipped while scaled" (the gradients
    reaching the scaler had a norm of ``max_norm``: they were clipped before ``scaler.unscale_``).
    """
    dtype, device = _amp_dtype(dtype), device or env.device()
    unclipped = Probe(device, PROBE_SCALE).run(reference_step, 0, dtype)
    max_norm = CLIP_FRACTION * unclipped.norms_at_unscale[0] / PROBE_SCALE
    expected = Probe(device, PROBE_SCALE).run(reference_clipped_step, 0, dtype, max_norm)
    got = Probe(device, PROBE_SCALE).run(step, 0, dtype, max_norm)

    def never_scaled() -> Diagnosis | None:  # how far it was scaled is judged below: clipping changes the norm
        return None if "scale" in got.calls else Diagnosis("loss not scaled", "scaler.scale(loss) was never called")

    problem = _first(lambda: _forward_problem(got, dtype), lambda: _backward_problem(got), never_scaled,
                     lambda: _order_problem(got))
    if problem is not None:
        return problem
    if not _same_update(got, expected):
        if _same_update(got, unclipped):
            return Diagnosis("not clipped", "the parameters moved exactly as far as an unclipped step moves them")
        if got.norms_at_unscale and got.norms_at_unscale[0] <= max_norm * (1 + TOLERANCE):
            return Diagnosis("clipped while scaled", f"the gradients reaching the scaler had a norm of "
                                                     f"{got.norms_at_unscale[0]:.3g}, max_norm itself, instead of "
                                                     f"about {expected.norms_at_unscale[0]:.3g}: they were clipped "
                                                     "before they were unscaled")
        return _scaled_problem(got, expected) or _update_problem(got, expected)
    return _returned_problem(got, expected) or Diagnosis(
        "ok", f"the gradients were unscaled, then clipped to max_norm = {max_norm:.3g}, and the parameters moved as "
              "the reference step moves them")


def diagnose_overflow(step: Callable, device: torch.device | None = None) -> Diagnosis:
    """Run ``step(model, optimizer, scaler, X, labels, torch.float16)`` with the scale at :data:`OVERFLOW_SCALE`.

    There the scaled float16 gradients overflow, so a right step moves no parameter and halves the
    scale (GradScaler's ``backoff_factor``). Names "stepped on overflow" (a parameter moved, or became
    inf or NaN), "loss not scaled" (the gradients did not overflow) and "no update" (the scale stayed).
    """
    dtype, device = torch.float16, device or env.device()
    expected = Probe(device, OVERFLOW_SCALE).run(reference_step, 0, dtype)
    if expected.moved or math.isfinite(expected.norms_at_unscale[0]):
        raise AssertionError("the overflow probe did not overflow: the grader needs a larger OVERFLOW_SCALE")
    got = Probe(device, OVERFLOW_SCALE).run(step, 0, dtype)
    scale = _scale_text(OVERFLOW_SCALE)

    def stepped() -> Diagnosis | None:
        if not got.moved:
            return None
        how = "scaler.step(optimizer) was never called, and " if "step" not in got.calls else ""
        broken = "some parameters are now inf or NaN" if not got.finite else "the parameters moved"
        return Diagnosis("stepped on overflow", f"{how}the gradients overflowed, yet {broken}")

    def overflowed() -> Diagnosis | None:
        if "scale" not in got.calls:
            return Diagnosis("loss not scaled", "scaler.scale(loss) was never called")
        if got.norms_at_unscale and math.isfinite(got.norms_at_unscale[0]):
            return Diagnosis("loss not scaled", f"at a scale of {scale} the float16 gradients must overflow, but the "
                                                "gradients reaching the scaler were finite: the loss was not scaled")
        return None

    problem = _first(lambda: _forward_problem(got, dtype), lambda: _backward_problem(got), overflowed, stepped,
                     lambda: _order_problem(got))
    if problem is not None:
        return problem
    if got.scale_after != expected.scale_after:
        return Diagnosis("no update", f"the scale went from {scale} to {_scale_text(got.scale_after)}, not to "
                                      f"{_scale_text(expected.scale_after)}")
    return Diagnosis("ok", f"the gradients overflowed, no parameter moved, and the scale fell from {scale} to "
                           f"{_scale_text(got.scale_after)}")
