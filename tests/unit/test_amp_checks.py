"""The AMP graders name the usual mistakes: each step function below makes one of them.

They run on the CPU here (PyTorch's CPU autocast and GradScaler("cpu")), on the graders' small MLP,
so the whole file takes seconds; on a GPU machine the same steps run on the GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpulab.labs import grading
from gpulab.labs.lab08_train_with_amp import diagnose
from gpulab.labs.lab08_train_with_amp.diagnose import Diagnosis
from gpulab.labs.lab08_train_with_amp.probe import (
    OVERFLOW_SCALE,
    PROBE_SCALE,
    Probe,
    forward_dtypes,
    reference_clipped_step,
    reference_step,
)

DTYPES = [torch.bfloat16, torch.float16]
# One step below asks for the other device's autocast on purpose; without a GPU, torch warns that it disables it.
pytestmark = pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")


# --- steps: the right one, and one for each mistake -------------------------------------------------

def right(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()  # a float is a fine answer too


def zero_grad_at_the_end(model, optimizer, scaler, X, labels, dtype):
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return loss.detach()


def nothing(model, optimizer, scaler, X, labels, dtype):
    return None


def no_autocast(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def autocast_of_another_device(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast("cuda" if X.device.type == "cpu" else "cpu", dtype=dtype, enabled=True):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def other_dtype(model, optimizer, scaler, X, labels, dtype):
    return reference_step(model, optimizer, scaler, X, labels,
                                     torch.float16 if dtype == torch.bfloat16 else torch.bfloat16)


def backward_under_autocast(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss.detach()


def no_backward(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    return loss.detach()


def loss_not_scaled(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    loss.backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def scaled_but_backward_on_the_loss(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss)
    loss.backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def optimizer_steps_itself(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    optimizer.step()
    return loss.detach()


def steps_twice(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    optimizer.step()  # the mistake: a second step, on whatever gradients there are
    scaler.update()
    return loss.detach()


def no_update(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    return loss.detach()


def update_before_step(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.update()
    scaler.step(optimizer)
    return loss.detach()


def returns_scaled_loss(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.step(optimizer)
    scaler.update()
    return scaled.detach()


def returns_nothing(model, optimizer, scaler, X, labels, dtype):
    reference_step(model, optimizer, scaler, X, labels, dtype)


def loss_outside_autocast(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        logits = model(X)
    loss = F.cross_entropy(logits, labels)  # in the logits' 16-bit dtype
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def no_zero_grad(model, optimizer, scaler, X, labels, dtype):
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def another_loss(model, optimizer, scaler, X, labels, dtype):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels, label_smoothing=0.5)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def raises(model, optimizer, scaler, X, labels, dtype):
    raise TypeError("unsupported operand")


MISTAKES = [
    (nothing, "no forward"),
    (no_autocast, "no autocast"),
    (autocast_of_another_device, "no autocast"),
    (other_dtype, "wrong dtype"),
    (backward_under_autocast, "autocast around backward"),
    (no_backward, "no backward"),
    (loss_not_scaled, "loss not scaled"),
    (scaled_but_backward_on_the_loss, "loss not scaled"),
    (optimizer_steps_itself, "no scaler step"),
    (steps_twice, "wrong update"),
    (no_update, "no update"),
    (update_before_step, "no update"),
    (returns_scaled_loss, "scaled loss returned"),
    (returns_nothing, "loss not returned"),
    (loss_outside_autocast, "loss outside autocast"),
    (no_zero_grad, "stale gradients"),
    (another_loss, "wrong update"),
    (raises, "error"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("step", [right, zero_grad_at_the_end, reference_step], ids=lambda f: f.__name__)
def test_right_steps_pass(step, dtype):
    diagnosis = diagnose.diagnose_step(step, dtype)
    assert diagnosis.ok, diagnosis


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("step", "problem"), MISTAKES, ids=lambda x: getattr(x, "__name__", x))
def test_step_mistakes_are_named(step, problem, dtype):
    diagnosis = diagnose.diagnose_step(step, dtype)
    assert diagnosis.problem == problem, diagnosis


def test_details_say_what_was_seen():
    assert "TypeError: unsupported operand" in diagnose.diagnose_step(raises, "bfloat16").detail
    assert "3 of the 3 linear-layer outputs were float32" in diagnose.diagnose_step(no_autocast, "bfloat16").detail
    assert diagnose.diagnose_step(loss_not_scaled, "float16").detail == "scaler.scale(loss) was never called"
    unscaled = diagnose.diagnose_step(scaled_but_backward_on_the_loss, "float16").detail
    assert "were 1 times the true ones, not 2^12 times" in unscaled
    assert "the optimizer stepped on its own" in diagnose.diagnose_step(optimizer_steps_itself, "float16").detail
    assert "scaler.update() was called before scaler.step(optimizer), which raised AssertionError" in \
        diagnose.diagnose_step(update_before_step, "float16").detail
    assert "moved 2 times as far" in diagnose.diagnose_step(steps_twice, "float16").detail


# --- clipping ---------------------------------------------------------------------------------------

def clipped_right(model, optimizer, scaler, X, labels, dtype, max_norm):
    return reference_clipped_step(model, optimizer, scaler, X, labels, dtype, max_norm)


def clipped_before_unscale(model, optimizer, scaler, X, labels, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def clipped_then_unscaled(model, optimizer, scaler, X, labels, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def clipped_after_step(model, optimizer, scaler, X, labels, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    return loss.detach()


def unclipped(model, optimizer, scaler, X, labels, dtype, max_norm):
    return reference_step(model, optimizer, scaler, X, labels, dtype)


def clipped_unscaled_twice(model, optimizer, scaler, X, labels, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def clipped_loss_not_scaled(model, optimizer, scaler, X, labels, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    loss.backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_clipping_right_passes_and_mistakes_are_named(dtype):
    assert diagnose.diagnose_clipped_step(clipped_right, dtype).ok
    for step, problem in ((clipped_before_unscale, "clipped while scaled"),
                          (clipped_then_unscaled, "clipped while scaled"),
                          (clipped_after_step, "not clipped"), (unclipped, "not clipped"),
                          (clipped_unscaled_twice, "error"), (clipped_loss_not_scaled, "loss not scaled"),
                          (lambda *args: None, "no forward")):
        diagnosis = diagnose.diagnose_clipped_step(step, dtype)
        assert diagnosis.problem == problem, (step, diagnosis)
    assert "already been called" in diagnose.diagnose_clipped_step(clipped_unscaled_twice, dtype).detail


# --- an overflow --------------------------------------------------------------------------------------

def test_overflow_right_step_skips_and_halves_the_scale():
    diagnosis = diagnose.diagnose_overflow(right)
    assert diagnosis == Diagnosis("ok", "the gradients overflowed, no parameter moved, and the scale fell from 2^24 "
                                        "to 2^23")


@pytest.mark.parametrize(("step", "problem", "detail"), [
    (optimizer_steps_itself, "stepped on overflow", "scaler.step(optimizer) was never called, and the gradients "
                                                    "overflowed, yet some parameters are now inf or NaN"),
    (steps_twice, "stepped on overflow", "yet some parameters are now inf or NaN"),
    (no_update, "no update", "scaler.update() was not called"),
    (loss_not_scaled, "loss not scaled", "scaler.scale(loss) was never called"),
    (scaled_but_backward_on_the_loss, "loss not scaled", "gradients reaching the scaler were finite"),
    (no_autocast, "no autocast", "float32"),
    (other_dtype, "wrong dtype", "bfloat16"),
])
def test_overflow_mistakes_are_named(step, problem, detail):
    diagnosis = diagnose.diagnose_overflow(step)
    assert diagnosis.problem == problem and detail in diagnosis.detail, diagnosis


def test_bfloat16_does_not_overflow_where_float16_does():
    probe = Probe(torch.device("cpu"), OVERFLOW_SCALE)
    run = probe.run(reference_step, 0, torch.bfloat16)
    assert run.moved and run.finite and run.scale_after == OVERFLOW_SCALE


# --- the pieces ---------------------------------------------------------------------------------------

def test_recording_scaler_notes_calls_in_order():
    probe = Probe(torch.device("cpu"), PROBE_SCALE)
    run = probe.run(reference_step, 0, torch.bfloat16)
    assert run.calls == ["scale", "step", "unscale_ in step", "update"]
    clipped = probe.run(reference_clipped_step, 1, torch.bfloat16, 0.1)
    assert clipped.calls == ["scale", "unscale_", "step", "update"]
    assert run.forward_dtypes == [torch.bfloat16] * 3 and run.backward_autocast == [False]


def test_probes_leave_the_global_generator_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    Probe(torch.device("cpu"), PROBE_SCALE)
    assert torch.equal(torch.rand(3), expected)


def test_forward_dtypes_sees_every_linear_layer_in_the_block_only():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    X = torch.randn(5, 4)
    with forward_dtypes() as seen:
        model(X)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(X)
    model(X)
    assert seen == [torch.float32, torch.float32, torch.bfloat16, torch.bfloat16]


def test_every_problem_has_a_hint_and_diagnoses_are_validated():
    assert set(diagnose.HINTS) == set(diagnose.PROBLEMS) - {"ok"}
    with pytest.raises(ValueError, match="^problem:"):
        Diagnosis("race", "a kernel problem, not an AMP one")
    with pytest.raises(ValueError, match="^dtype:"):
        diagnose.diagnose_step(right, torch.float32)


def test_a_diagnosis_grades_as_a_lab_check(capsys):
    grader = grading.Grader(strict=False)
    assert not grading.grade(grader, "amp step", diagnose.diagnose_step(no_update, "bfloat16"),
                                   diagnose.HINTS)
    assert grading.grade(grader, "amp step", diagnose.diagnose_step(right, "bfloat16"), diagnose.HINTS)
    printed = capsys.readouterr().out
    assert "NOT YET  amp step" in printed and "amp step: scaler.update() was not called" in printed
    assert "call scaler.update() once per step" in printed and "PASS  amp step" in printed
