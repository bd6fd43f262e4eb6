"""The sizes of chapter 11 in every setting, and the work they make (:class:`gpulab.core.budget.Chapter`).

The chapter trains: the digits MLP (64 -> 256 -> 256 -> 10) for its gradients, its loss scales and the GradScaler's
trace, then in four precisions for several seeds; and a wide MLP made of large GEMMs in the same four precisions.
A step of the digits MLP is too small to keep a GPU busy: its time is Python's (the host's), whatever the GPU. A step
of the wide MLP is its GEMMs. A T4 runs neither TF32 nor bfloat16: those rows say "not run".
"""

from __future__ import annotations

from gpulab.ch04_mlp_gemms.mlp import training_step_operations
from gpulab.ch11_mixed_precision.amp import PRECISIONS
from gpulab.core import budget
from gpulab.core.budget import Work, once

FULL = {
    "digits_hidden": [256, 256],  # the digits MLP: 64 pixels -> 256 -> 256 -> 10 digits
    "digits_epochs": 30,  # epochs of 22 steps of 64 images, per run
    "seeds": [0, 1, 2, 3, 4],  # independent runs per precision, to measure the run-to-run noise
    "gradient_epochs": 30,  # float32 training before the gradients are looked at
    "trace_growth_interval": 10,  # the GradScaler experiment: steps between growths,
    "trace_steps": 200,  # and steps
    "wide_inputs": 1024, "wide_width": 4096, "wide_depth": 3,  # the GEMM-heavy MLP: 1024 -> 4096 x 3 -> 10
    "wide_batch": 2048, "wide_steps": 300, "wide_learning_rate": 0.05,  # 300 steps of 2048 fresh samples
    "wide_seeds": [0, 1, 2],
    "wide_test_samples": 8192,
}
# Without a GPU: the same digits MLP trained for fewer epochs, and a small wide MLP (the book builds on a CPU).
CPU = {**FULL, "digits_epochs": 10, "seeds": [0, 1, 2], "wide_inputs": 128, "wide_width": 256, "wide_batch": 256,
       "wide_steps": 100, "wide_learning_rate": 0.1}
SMOKE = {**FULL, "digits_hidden": [16], "digits_epochs": 1, "seeds": [0, 1], "gradient_epochs": 2,
         "trace_growth_interval": 5, "trace_steps": 30, "wide_inputs": 32, "wide_width": 32, "wide_depth": 2,
         "wide_batch": 64, "wide_steps": 10, "wide_seeds": [0], "wide_test_samples": 1024}
CLASSES = [
    # Every experiment, with three seeds (the noise is still measured) and two for the wide MLP, whose 300 steps
    # of 2048 samples stay: its float32 steps are the slow ones, and the book's target (2x) is read from them.
    {**FULL, "seeds": [0, 1, 2], "wide_seeds": [0, 1]},
    FULL,  # the recordings' sizes: a T4 runs them in about two and a half minutes
]

DIGITS_IMAGES, DIGITS_BATCH = 1797, 64  # scikit-learn's digits, a fifth held out (mlp.load_digits_split)
DIGITS_STEPS_PER_EPOCH = (DIGITS_IMAGES - DIGITS_IMAGES // 5) // DIGITS_BATCH
# Python's time for one training step of the digits MLP on the H200 machine's host, per precision: the H200 run
# trained 660 float32 steps and five backward passes in about 1 s (amp_loss_scale_underflow), and 13,200 steps of
# the four precisions in 25 s (amp_digits_precisions). AMP adds autocast's casts and, for float16, the scaler's
# check, which waits for the GPU once per step. Colab's two vCPUs may take twice as long.
STEP_HOST_SECONDS = {"float32": 1.2e-3, "tf32": 1.2e-3, "float16": 2.5e-3, "bfloat16": 2.2e-3}
TRACE_STEP_SECONDS = 3.5e-3  # a float16 step of the trace: also reads the loss and copies the weights twice
FIRST_USE_SECONDS = 5.0  # scikit-learn's import, the digits, the first autocast and the figures (H200: 9 s of the
# gradient histogram's gap were not training)


def _steps(epochs: int) -> int:
    return epochs * DIGITS_STEPS_PER_EPOCH


def _training(label: str, sizes: list[int], batch: int, steps: int, precision: str, data_bytes: float = 0.0,
              **work) -> Work:
    """``steps`` training steps of an MLP of ``sizes``, each a single call: its GEMMs and elementwise work (counted
    as GEMM flops), and the optimizer's and AMP's memory-bound passes over the weights (about 32 bytes a weight), or
    Python's time for the step (:data:`STEP_HOST_SECONDS`), whichever is longer; in memory, the weights four times
    over (float32, gradient, momentum, a 16-bit copy), activations and the data. A GPU without ``precision`` runs
    none of them (the experiment's row says "not run")."""
    step_flops = sum(op["flops"] for op in training_step_operations(sizes, batch))
    weights = sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    activations = batch * sum(sizes[1:])
    return once(label, measurements=steps, flops=step_flops, bytes=32 * weights + 16 * activations,
                precision=precision, missing="skip", least_seconds=STEP_HOST_SECONDS[precision],
                memory_bytes=16 * (weights + activations) + data_bytes, **work)


def _digits(sizes: dict) -> list[int]:
    return [64, *sizes["digits_hidden"], 10]


def work(sizes: dict) -> list[Work]:
    digits = _digits(sizes)
    gradients = _steps(sizes["gradient_epochs"])
    found = [_training("gradients: float32 training, twice", digits, DIGITS_BATCH, 2 * gradients, "float32"),
             _training("loss scale trace: float16 AMP", digits, DIGITS_BATCH, sizes["trace_steps"], "float16",
                       extra_seconds=TRACE_STEP_SECONDS - STEP_HOST_SECONDS["float16"])]
    runs = len(sizes["seeds"])
    for precision in PRECISIONS:
        found.append(_training(f"digits: {precision}", digits, DIGITS_BATCH, runs * _steps(sizes["digits_epochs"]),
                               precision))
    wide = [sizes["wide_inputs"], *[sizes["wide_width"]] * sizes["wide_depth"], 10]
    samples = sizes["wide_steps"] * sizes["wide_batch"] + sizes["wide_test_samples"]
    data = 4 * samples * (sizes["wide_inputs"] + 2)  # teacher_data's inputs and labels, on the GPU throughout
    for precision in PRECISIONS:
        found.append(_training(f"wide MLP: {precision}", wide, sizes["wide_batch"],
                               len(sizes["wide_seeds"]) * sizes["wide_steps"], precision, data_bytes=data))
    found.append(once("wide MLP: the teacher's data", bytes=2 * data, memory_bytes=data))
    return found


def fixed_seconds(sizes: dict) -> float:
    return budget.NOTEBOOK_SECONDS + FIRST_USE_SECONDS


CHAPTER = budget.Chapter(name="11 Mixed precision", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=fixed_seconds)
