"""The mixed-precision chapter's library: automatic mixed precision (AMP) taken apart and measured.

Mixed-precision training rests on three ideas {micikevicius2018mixed}:

1. compute in 16 bits (float16 or bfloat16) where that is safe -- matrix multiplies above all -- and
   keep the operations that need precision or range (reductions, losses, exp and log) in float32:
   ``torch.autocast`` decides per operation (:func:`.autocast.autocast_dtypes` shows its decisions);
2. keep the weights, and the updates to them, in float32 ("master weights"): an update smaller than
   half the spacing of the 16-bit numbers around a weight would be lost (:func:`.autocast.master_weight_updates`);
3. scale the loss so that small gradients do not flush to zero in float16 (:func:`.gradients.gradient_histogram`,
   :func:`.gradients.loss_scale_underflow`), adjusting the scale as training goes (``torch.amp.GradScaler``,
   traced by :func:`.gradients.loss_scale_trace`).

:class:`Training` trains an MLP (:func:`gpulab.ch04_mlp_gemms.mlp.torch_mlp`) in one of four precisions, the AMP way,
and the experiments :func:`digits_precisions` and :func:`wide_mlp_precisions` compare them for time per
step, memory and accuracy, on scikit-learn's digits and on a GEMM-heavy MLP learning generated data.
Every experiment returns rows of plain values, so that a GPU run can be recorded.
"""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch11_mixed_precision.autocast import AUTOCAST_DTYPES
from gpulab.core import env, timing
from gpulab.core.correctness import check_close
from gpulab.core.precision import FORMATS, MATMUL_TOLERANCE, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, supported_dtype, unsupported_reason

# The precisions a training run can use. float16 and bfloat16 mean AMP: torch.autocast in that dtype over
# float32 weights (and, for float16, a GradScaler); tf32 means float32 with TF32 tensor cores for the GEMMs.
PRECISIONS = ("float32", "tf32", "float16", "bfloat16")
PRECISION_LABELS = {"float32": "float32 (TF32 off)", "tf32": "TF32", "float16": "float16 AMP + GradScaler",
                    "bfloat16": "bfloat16 AMP"}


BASELINE = "float32"
LEARNING_RATE = 0.1  # of SGD with momentum MOMENTUM
MOMENTUM = 0.9


def amp_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
             X: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One AMP training step, the way PyTorch's AMP recipe writes it; returns the (unscaled) loss."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(X.device.type, dtype=dtype):  # the forward pass and the loss, and nothing else
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()  # outside autocast: each backward op runs in its forward op's dtype
    scaler.step(optimizer)  # unscales the gradients in float32; skips optimizer.step() if one is inf or NaN
    scaler.update()  # halves the scale after an overflow, doubles it after growth_interval clean steps
    return loss.detach()


@dataclass
class Training:
    """An MLP with its optimizer (SGD with momentum) and loss scaler, trained in one of :data:`PRECISIONS`.

    The weights, their gradients and the optimizer's state are float32 in every precision: AMP's master
    weights. The scaler is a real ``torch.amp.GradScaler`` only for float16; for bfloat16 it is
    disabled, and its calls pass the loss and the step straight through (float32 and tf32 do not use it).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: str
    device: torch.device
    optimizer_steps: int = 0  # updates the optimizer made: fewer than the steps where the scaler skipped some

    def count_update(self, *_) -> None:
        """The optimizer's step hook: counts the updates that really happened."""
        self.optimizer_steps += 1

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype autocast computes in, or None where autocast is off (float32, tf32)."""
        return FORMATS[self.precision].dtype if self.precision in AUTOCAST_DTYPES else None

    def step(self, X: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One training step; returns the (unscaled) loss, without waiting for it.

        In float16 and bfloat16 it is PyTorch's AMP recipe, :func:`amp_step`:
        the forward pass and the loss under ``torch.autocast``, the backward pass of the scaled loss,
        ``scaler.step`` (which unscales the gradients and skips the update if any is inf or NaN) and
        ``scaler.update``. In float32 and tf32 it is the plain step, with TF32 on only for tf32.
        """
        with matmul_mode("tf32" if self.precision == "tf32" else "float32"):  # float32 means TF32 off
            if self.autocast_dtype is not None:
                return amp_step(self.model, self.optimizer, self.scaler, X, labels, self.autocast_dtype)
            self.optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(X), labels)
            loss.backward()
            self.optimizer.step()
        return loss.detach()

    @torch.no_grad()
    def accuracy(self, X: torch.Tensor, labels: torch.Tensor, chunk: int = 8192) -> float:
        """The share of ``labels`` the model predicts, computed in the training precision."""
        correct = 0
        with matmul_mode("tf32" if self.precision == "tf32" else "float32"):
            for start in range(0, len(labels), chunk):
                with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                                    enabled=self.autocast_dtype is not None):
                    logits = self.model(X[start:start + chunk])
                correct += (logits.argmax(dim=1) == labels[start:start + chunk]).sum().item()
        return correct / len(labels)


def new_training(sizes: Sequence[int], precision: str, *, learning_rate: float = LEARNING_RATE, seed: int = 0,
                 init_scale: float = 2.0**16, growth_interval: int = 2000,
                 device: torch.device | None = None) -> Training:
    """A fresh :func:`gpulab.ch04_mlp_gemms.mlp.torch_mlp` of ``sizes`` (seeded: the same weights in every precision),
    ready to train in ``precision``. ``init_scale`` and ``growth_interval`` configure float16's GradScaler.

    Raises ValueError naming ``precision`` where this device cannot compute in it (TF32 off NVIDIA GPUs).
    """
    device = device or env.device()
    if precision not in PRECISIONS:
        raise ValueError(f"precision: choose one of {', '.join(PRECISIONS)}; got {precision!r}")
    supported_dtype("precision", precision, device)
    if not learning_rate > 0:
        raise ValueError(f"learning_rate: must be > 0, got {learning_rate!r}")
    if not init_scale > 0:
        raise ValueError(f"init_scale: must be > 0, got {init_scale!r}")
    model = mlp.torch_mlp(sizes, seed=seed).to(device)
    # SGD rather than Adam: Adam's running mean of squared gradients turns tiny gradients into float32
    # subnormals, which a CPU computes a hundred times slower than normal numbers.
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=MOMENTUM)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=precision == "float16",
                                  growth_interval=positive_int("growth_interval", growth_interval))
    training = Training(model, optimizer, scaler, precision, device)
    optimizer.register_step_post_hook(training.count_update)
    return training


def batch_order(samples: int, batch: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Index tensors of ``steps`` mini-batches of ``batch`` samples: epoch after epoch of a seeded shuffle
    (each epoch drops its last, incomplete batch, so that every step does the same work)."""
    samples, batch, steps = positive_int("samples", samples), positive_int("batch", batch), positive_int("steps", steps)
    if batch > samples:
        raise ValueError(f"batch: {batch} is more than the {samples} samples")
    generator = torch.Generator().manual_seed(seed)
    batches: list[torch.Tensor] = []
    while len(batches) < steps:
        order = torch.randperm(samples, generator=generator)
        batches += list(order[: samples // batch * batch].split(batch))
    return batches[:steps]


def _memory_baseline(device: torch.device) -> int:
    """Bytes allocated on a GPU now, after resetting its peak counter; 0 on a CPU (not measured there).

    The previous run's model and optimizer hold each other in reference cycles, which only the garbage
    collector frees. Collected first, so that they are not counted in the baseline and then freed during
    the run, which would hide the run's own memory (the GPU unit test once saw a peak of 0 bytes).
    """
    if device.type != "cuda":
        return 0
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def train_and_time(sizes: Sequence[int], data: dict[str, torch.Tensor], precision: str, *, batch: int, steps: int,
                   learning_rate: float = LEARNING_RATE, seed: int = 0) -> dict:
    """Train a fresh MLP of ``sizes`` for ``steps`` steps in ``precision``; time every step; test it.

    ``data`` holds X_train, y_train, X_test, y_test on the device. The first step runs on its own, so
    that whether the scaler skipped it is known; the others are timed one by one with
    :func:`gpulab.core.timing.measure` (CUDA events on a GPU), and are the training itself. Returns a row:
    median seconds per step, peak GPU memory of the training beyond the data (None on a CPU), the losses
    of the first two steps (for the correctness check), the last loss, test accuracy, skipped steps.
    """
    steps = positive_int("steps", steps)
    if steps < 2:
        raise ValueError(f"steps: need at least 2 (the first is checked, the rest timed), got {steps}")
    device = data["X_train"].device
    batches = [b.to(device) for b in batch_order(len(data["y_train"]), batch, steps, seed)]
    baseline = _memory_baseline(device)
    training = new_training(sizes, precision, learning_rate=learning_rate, seed=seed, device=device)
    X, y = data["X_train"], data["y_train"]
    scale_before = training.scaler.get_scale()
    losses = [training.step(X[batches[0]], y[batches[0]])]
    first_step_skipped = training.scaler.get_scale() < scale_before
    remaining = iter(batches[1:])

    def next_step() -> None:
        rows = next(remaining)
        losses.append(training.step(X[rows], y[rows]))

    measured = timing.measure(next_step, device=device, warmup=0, repeats=steps - 1, flush_l2=False)
    peak = torch.cuda.max_memory_allocated(device) - baseline if device.type == "cuda" else None
    losses = torch.stack(losses).float().cpu()
    if not torch.isfinite(losses[-1]):
        raise AssertionError(f"training in {precision} diverged: the last loss is {losses[-1].item()}")
    return {"precision": precision, "label": PRECISION_LABELS[precision], "seed": seed, "steps": steps,
            "batch": batch, "step_seconds": measured.median_s, "spread": measured.spread,
            "peak_memory_bytes": peak, "first_losses": losses[:2].tolist(), "first_step_skipped": first_step_skipped,
            "final_loss": losses[-10:].mean().item(),  # the mean of the last ten steps: one batch is noisy
            "test_accuracy": training.accuracy(data["X_test"], data["y_test"]), "test_samples": len(data["y_test"]),
            "skipped_steps": steps - training.optimizer_steps, "status": "ok"}


def check_first_losses(row: dict, reference: dict) -> float:
    """Raise unless ``row``'s first two losses match the float32 run's ``reference`` within the tolerance of
    its format (:data:`gpulab.core.precision.MATMUL_TOLERANCE`); NaN never passes. Returns the relative error.

    Same seed, same weights, same batches: the first loss checks the forward pass in 16 bits, the
    second the update (a gradient left scaled would move the weights 65536 times too far). Where the
    scaler skipped the first step, the update is not compared.
    """
    compared = 1 if row["first_step_skipped"] else 2
    return check_close(torch.tensor(row["first_losses"][:compared]), torch.tensor(reference["first_losses"][:compared]),
                       MATMUL_TOLERANCE[row["precision"]],
                       f"{row['precision']}: loss of the first steps against float32's (seed {row['seed']})")


def compare_precisions(sizes: Sequence[int], data: dict[str, torch.Tensor], precisions: Sequence[str], *,
                       batch: int, steps: int, learning_rate: float, seeds: Sequence[int]) -> list[dict]:
    """For each seed, train in float32 and then in each other precision, checking their first losses against
    float32's before their times count. A precision this device cannot run gives a row saying why."""
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"precisions: choose from {', '.join(PRECISIONS)}; got {unknown}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    device = data["X_train"].device
    rows, runnable = [], []
    for precision in dict.fromkeys([BASELINE, *precisions]):
        reason = unsupported_reason(precision, device)
        if reason is None:
            runnable.append(precision)
        else:  # e.g. tf32 on a CPU: the row says why, the others still run
            rows.append({"precision": precision, "label": PRECISION_LABELS[precision], "status": "not run",
                         "reason": reason})
    for seed in seeds:
        reference = None
        for precision in runnable:
            row = train_and_time(sizes, data, precision, batch=batch, steps=steps, learning_rate=learning_rate,
                                 seed=seed)
            reference = reference or row
            row["first_loss_error"] = check_first_losses(row, reference)
            rows.append(row)
    return rows


def digits_data(device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """scikit-learn's digits (:func:`gpulab.ch04_mlp_gemms.mlp.load_digits_split`), on the device."""
    device = device or env.device()
    return {key: value.to(device) for key, value in mlp.load_digits_split().items()}


@experiment("amp_digits_precisions")
def digits_precisions(precisions: Sequence[str] = PRECISIONS, hidden: Sequence[int] = (256, 256), epochs: int = 30,
                      batch: int = 64, learning_rate: float = LEARNING_RATE,
                      seeds: Sequence[int] = (0, 1, 2)) -> list[dict]:
    """A digits MLP (64 -> ``hidden`` -> 10) trained ``epochs`` epochs in each precision, for each seed."""
    hidden, epochs = positive_ints("hidden", hidden), positive_int("epochs", epochs)
    data = digits_data()
    steps = epochs * (len(data["y_train"]) // positive_int("batch", batch))
    return compare_precisions([64, *hidden, 10], data, precisions, batch=batch, steps=steps,
                              learning_rate=learning_rate, seeds=seeds)


TEACHER_SEED = 1234  # the teacher network is the same for every data set drawn from it


def teacher_data(train_samples: int, test_samples: int, inputs: int, classes: int = 10, teacher_hidden: int = 32,
                 seed: int = 0, device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """Gaussian inputs labelled by a fixed random "teacher" network, argmax(tanh(X A) B): a task with a right
    answer that a student MLP can learn, for as many samples as wanted, made on the device.

    B's columns have one length, so that no class wins by a larger column; the test samples are drawn apart
    from the training ones.
    """
    train_samples = positive_int("train_samples", train_samples)
    test_samples = positive_int("test_samples", test_samples)
    inputs, classes = positive_int("inputs", inputs), positive_int("classes", classes)
    teacher_hidden = positive_int("teacher_hidden", teacher_hidden)
    device = device or env.device()
    fits_in_memory("train_samples", (train_samples + test_samples) * (inputs + 2) * 4, device)
    teacher = torch.Generator().manual_seed(TEACHER_SEED)
    A = (torch.randn(inputs, teacher_hidden, generator=teacher) / math.sqrt(inputs)).to(device)
    B = torch.randn(teacher_hidden, classes, generator=teacher)
    B = (B / torch.linalg.vector_norm(B, dim=0)).to(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    data = {}
    with matmul_mode("float32"):
        for part, n in (("train", train_samples), ("test", test_samples)):
            X = torch.randn(n, inputs, device=device, generator=generator)
            data[f"X_{part}"], data[f"y_{part}"] = X, (torch.tanh(X @ A) @ B).argmax(dim=1)
    return data


@experiment("amp_wide_mlp")
def wide_mlp_precisions(precisions: Sequence[str] = PRECISIONS, inputs: int = 1024, width: int = 4096,
                        depth: int = 3, batch: int = 2048, steps: int = 300, learning_rate: float = 0.05,
                        seeds: Sequence[int] = (0, 1, 2), test_samples: int = 8192) -> list[dict]:
    """A GEMM-heavy MLP (``inputs`` -> ``depth`` hidden layers of ``width`` -> 10) learning :func:`teacher_data`,
    ``steps`` steps of ``batch`` fresh samples in each precision, for each seed. Every row also gives
    'majority_share', the test accuracy of always guessing the commonest class."""
    width, depth = positive_int("width", width), positive_int("depth", depth)
    steps, batch = positive_int("steps", steps), positive_int("batch", batch)
    data = teacher_data(steps * batch, test_samples, inputs)
    rows = compare_precisions([inputs, *[width] * depth, 10], data, precisions, batch=batch, steps=steps,
                              learning_rate=learning_rate, seeds=seeds)
    majority = torch.bincount(data["y_test"]).max().item() / len(data["y_test"])  # what guessing one class scores
    return [{**row, "majority_share": majority} for row in rows]






def _standard_error(values: Sequence[float], test_samples: int) -> float:
    """The standard error of a mean accuracy over seeds; never below that of one accuracy measured on
    ``test_samples`` examples, sqrt(p (1 - p) / n), so that a few identical runs do not claim no noise."""
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return max(spread, math.sqrt(mean * (1 - mean) / test_samples))


def summarize(rows: Sequence[dict]) -> list[dict]:
    """One row per precision: runs, mean and standard deviation of the test accuracy, mean time per step,
    speed-up over float32, mean peak memory, and whether the accuracy is float32's within the noise.

    "Within the noise" means the difference of the mean accuracies is at most twice its standard error
    (from the spread over seeds, and at least the sampling error of the test set). Rows that did not
    run are passed on with their reason.
    """
    summary = []
    by_precision: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("status", "ok") != "ok":
            summary.append({"precision": row["precision"], "label": row["label"], "runs": 0, "reason": row["reason"]})
        else:
            by_precision.setdefault(row["precision"], []).append(row)
    base = by_precision.get(BASELINE)
    for precision, runs in by_precision.items():
        accuracies = [r["test_accuracy"] for r in runs]
        memory = [r["peak_memory_bytes"] for r in runs if r["peak_memory_bytes"] is not None]
        entry = {"precision": precision, "label": runs[0]["label"], "runs": len(runs),
                 "accuracy_mean": statistics.fmean(accuracies),
                 "accuracy_sd": statistics.stdev(accuracies) if len(runs) > 1 else 0.0,
                 "step_seconds": statistics.fmean(r["step_seconds"] for r in runs),
                 "peak_memory_bytes": statistics.fmean(memory) if memory else None,
                 "skipped_steps": sum(r["skipped_steps"] for r in runs),
                 "first_loss_error": max(r["first_loss_error"] for r in runs)}
        if base:
            base_accuracies = [r["test_accuracy"] for r in base]
            noise = math.hypot(_standard_error(accuracies, runs[0]["test_samples"]),
                               _standard_error(base_accuracies, base[0]["test_samples"]))
            entry["speedup"] = statistics.fmean(r["step_seconds"] for r in base) / entry["step_seconds"]
            entry["accuracy_gap"] = entry["accuracy_mean"] - statistics.fmean(base_accuracies)
            entry["noise"] = noise
            entry["within_noise"] = abs(entry["accuracy_gap"]) <= 2 * noise
        summary.append(entry)
    return summary


def target_met(summary: Sequence[dict], factor: float = 2.0) -> dict:
    """Whether the faster of float16 and bfloat16 AMP trains at least ``factor`` times faster per step than
    float32 with TF32 off, at float32's accuracy within the noise. Returns that precision's numbers and the verdict."""
    amp = [s for s in summary if s["precision"] in AUTOCAST_DTYPES and s["runs"] and "speedup" in s]
    if not amp:
        return {"met": False, "reason": "no AMP run to compare with float32"}
    best = max(amp, key=lambda s: s["speedup"])
    return {"met": best["speedup"] >= factor and best["within_noise"], "precision": best["precision"],
            "speedup": best["speedup"], "within_noise": best["within_noise"], "factor": factor}
