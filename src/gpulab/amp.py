"""The mixed-precision chapter's library: automatic mixed precision (AMP) taken apart and measured.

Mixed-precision training rests on three ideas {micikevicius2018mixed}:

1. compute in 16 bits (float16 or bfloat16) where that is safe -- matrix multiplies above all -- and
   keep the operations that need precision or range (reductions, losses, exp and log) in float32:
   ``torch.autocast`` decides per operation (:func:`autocast_dtypes` shows its decisions);
2. keep the weights, and the updates to them, in float32 ("master weights"): an update smaller than
   half the spacing of the 16-bit numbers around a weight would be lost (:func:`master_weight_updates`);
3. scale the loss so that small gradients do not flush to zero in float16 (:func:`gradient_histogram`,
   :func:`loss_scale_underflow`), adjusting the scale as training goes (``torch.amp.GradScaler``,
   traced by :func:`loss_scale_trace`).

:class:`Training` trains an MLP (:func:`gpulab.mlp.torch_mlp`) in one of four precisions, the AMP way,
and the experiments :func:`digits_precisions` and :func:`wide_mlp_precisions` compare them for time per
step, memory and accuracy, on scikit-learn's digits and on a GEMM-heavy MLP learning generated data.
Every experiment returns rows of plain values, so that a GPU run can be recorded.
"""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from gpulab import env, mlp, plots, timing
from gpulab.correctness import check_close
from gpulab.precision import FORMATS, MATMUL_TOLERANCE, format_of, matmul_mode
from gpulab.provenance import experiment
from gpulab.validation import fits_in_memory, positive_int, positive_ints, supported_dtype, unsupported_reason

# The precisions a training run can use. float16 and bfloat16 mean AMP: torch.autocast in that dtype over
# float32 weights (and, for float16, a GradScaler); tf32 means float32 with TF32 tensor cores for the GEMMs.
PRECISIONS = ("float32", "tf32", "float16", "bfloat16")
PRECISION_LABELS = {"float32": "float32 (TF32 off)", "tf32": "TF32", "float16": "float16 AMP + GradScaler",
                    "bfloat16": "bfloat16 AMP"}
AUTOCAST_DTYPES = ("float16", "bfloat16")
BASELINE = "float32"
LEARNING_RATE = 0.1  # of SGD with momentum MOMENTUM
MOMENTUM = 0.9


# ---------------------------------------------------------------------------------------------
# Idea 2 in numbers: float32 master weights


def master_weight_updates(weight: float, update: float, steps: int) -> list[dict]:
    """Subtract ``update`` from ``weight`` ``steps`` times, with the weight kept in 16 or in 32 bits.

    Rows for weights stored and updated in float16 and in bfloat16, and for float32 master weights
    with the 16-bit copy a GEMM would read. Each row gives the spacing of the storage format around
    the weight, the weight after one update and after all of them, the exact result, and the 16-bit copy.
    """
    steps = positive_int("steps", steps)
    if not (math.isfinite(weight) and weight != 0):
        raise ValueError(f"weight: expected a finite nonzero number, got {weight!r}")
    if not (math.isfinite(update) and update > 0):
        raise ValueError(f"update: expected a finite number > 0, got {update!r}")
    rows = []
    for storage, copy in (("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "float16"),
                          ("float32", "bfloat16")):
        w = torch.tensor(weight, dtype=FORMATS[storage].dtype)
        step = torch.tensor(update, dtype=FORMATS[storage].dtype)
        after = []
        for _ in range(steps):
            w = w - step  # computed and rounded in the storage format, as an optimizer would
            after.append(w.item())
        stored = torch.tensor(weight, dtype=FORMATS[storage].dtype).item()
        rows.append({
            "weights": f"{storage} weights" if storage == copy else f"float32 master weights ({copy} copy)",
            "storage": storage, "copy": copy, "weight": stored, "update": update, "steps": steps,
            "spacing": FORMATS[storage].spacing(stored), "after_one": after[0], "after_all": after[-1],
            "exact": weight - steps * update, "copy_after_all": w.to(FORMATS[copy].dtype).item(),
        })
    return rows


# ---------------------------------------------------------------------------------------------
# Idea 1: which operations autocast runs in 16 bits


# The course's classes of operations {lapenna2022unit11} and what it advises for each: (op, class, advice).
AUTOCAST_OPS = (
    ("linear", "matrix multiplication", "16 bits"),
    ("matmul", "matrix multiplication", "16 bits"),
    ("bmm", "matrix multiplication", "16 bits"),
    ("conv2d", "matrix multiplication", "16 bits"),
    ("batch_norm", "reduction", "float32: precision"),
    ("layer_norm", "reduction", "float32: precision"),
    ("sum", "reduction", "float32: precision"),
    ("softmax", "reduction", "float32: precision"),
    ("log_softmax", "reduction", "float32: precision"),
    ("cross_entropy", "loss function", "float32: range"),
    ("mse_loss", "loss function", "float32: range"),
    ("relu", "pointwise", "16 bits"),
    ("sigmoid", "pointwise", "16 bits"),
    ("tanh", "pointwise", "16 bits"),
    ("add", "pointwise", "16 bits"),
    ("exp", "pointwise", "float32 or bfloat16: range"),
    ("log", "pointwise", "float32 or bfloat16: range"),
    ("pow", "pointwise", "float32 or bfloat16: range"),
)


def _autocast_operands(dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Data in ``dtype`` (what the layer below hands on) and parameters in float32 (what a model stores)."""
    generator = torch.Generator(device=device).manual_seed(0)

    def data(*shape):
        return torch.randn(*shape, device=device, generator=generator).to(dtype)

    def parameter(*shape):
        return torch.randn(*shape, device=device, generator=generator)

    return {"x": data(8, 16), "image": data(2, 3, 8, 8), "positive": data(8, 16).abs() + 1, "target": data(8, 16),
            "weight": parameter(16, 16), "kernel": parameter(4, 3, 3, 3), "channel_scale": parameter(3),
            "feature_scale": parameter(16), "labels": torch.zeros(8, dtype=torch.long, device=device)}


_OP_CALLS: dict[str, Callable[[dict], torch.Tensor]] = {
    "linear": lambda t: F.linear(t["x"], t["weight"]),
    "matmul": lambda t: torch.matmul(t["x"], t["weight"]),
    "bmm": lambda t: torch.bmm(t["x"][None], t["weight"][None]),
    "conv2d": lambda t: F.conv2d(t["image"], t["kernel"]),
    "batch_norm": lambda t: F.batch_norm(t["image"], None, None, t["channel_scale"], None, training=True),
    "layer_norm": lambda t: F.layer_norm(t["x"], (16,), t["feature_scale"]),
    "sum": lambda t: t["x"].sum(),
    "softmax": lambda t: torch.softmax(t["x"], dim=-1),
    "log_softmax": lambda t: torch.log_softmax(t["x"], dim=-1),
    "cross_entropy": lambda t: F.cross_entropy(t["x"], t["labels"]),
    "mse_loss": lambda t: F.mse_loss(t["x"], t["target"]),
    "relu": lambda t: torch.relu(t["x"]),
    "sigmoid": lambda t: torch.sigmoid(t["x"]),
    "tanh": lambda t: torch.tanh(t["x"]),
    "add": lambda t: t["x"] + t["x"],
    "exp": lambda t: torch.exp(t["x"]),
    "log": lambda t: torch.log(t["positive"]),
    "pow": lambda t: torch.pow(t["x"], 2),
}


def autocast_treatment(from_float32: str, from_low: str, low: str) -> str:
    """What autocast did to an op, from its output dtypes on float32 data and on ``low`` (16-bit) data.

    Low from both: autocast casts it down. float32 from both: autocast runs it in float32. Each input's own
    type back: autocast leaves it alone, and it runs in whatever type it receives.
    """
    if from_float32 == from_low == low:
        return f"casts to {low}"
    if from_float32 == from_low == "float32":
        return "runs in float32"
    if (from_float32, from_low) == ("float32", low):
        return "follows its input"
    return f"other ({from_float32} from float32, {from_low} from {low})"


@experiment("amp_autocast_dtypes")
def autocast_dtypes(dtypes: Sequence[str] = AUTOCAST_DTYPES) -> list[dict]:
    """Run each of :data:`AUTOCAST_OPS` inside ``torch.autocast`` on this device, in each autocast dtype.

    Every op runs twice: on float32 data, and on data already in the 16-bit type (as it arrives from a
    layer that autocast ran in 16 bits); parameters (weights, norm scales) are float32 both times, as in
    a model. A row per (dtype, op): the two output dtypes and what they say autocast did. A dtype this
    device does not compute in gets one row, with status 'not run' and the reason.
    """
    device = env.device()
    rows = []
    for name in dtypes:
        if name not in AUTOCAST_DTYPES:
            raise ValueError(f"dtypes: autocast computes in {' or '.join(AUTOCAST_DTYPES)}, got {name!r}")
        reason = unsupported_reason(name, device)
        if reason is not None:  # bfloat16 before Ampere (a T4): a row says why, the other dtype still runs
            rows.append({"device": device.type, "autocast_dtype": name, "status": "not run", "reason": reason})
            continue
        low = FORMATS[name].dtype
        operands = {"float32": _autocast_operands(torch.float32, device), name: _autocast_operands(low, device)}
        for op, kind, advice in AUTOCAST_OPS:
            out = {}
            for given, tensors in operands.items():
                with torch.autocast(device.type, dtype=low):
                    result = _OP_CALLS[op](tensors)
                if not torch.isfinite(result).all():
                    raise AssertionError(f"{op} under autocast({name}) returned non-finite values")
                out[given] = str(result.dtype).removeprefix("torch.")
            rows.append({"device": device.type, "autocast_dtype": name, "op": op, "kind": kind, "advice": advice,
                         "from_float32": out["float32"], "from_low": out[name],
                         "treatment": autocast_treatment(out["float32"], out[name], name), "status": "ok"})
    return rows


# ---------------------------------------------------------------------------------------------
# Training in one precision, the AMP way


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
    """A fresh :func:`gpulab.mlp.torch_mlp` of ``sizes`` (seeded: the same weights in every precision), ready
    to train in ``precision``. ``init_scale`` and ``growth_interval`` configure float16's GradScaler.

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
    :func:`gpulab.timing.measure` (CUDA events on a GPU), and are the training itself. Returns a row:
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
    its format (:data:`gpulab.precision.MATMUL_TOLERANCE`); NaN never passes. Returns the relative error.

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
    """scikit-learn's digits (:func:`gpulab.mlp.load_digits_split`), on the device."""
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


# ---------------------------------------------------------------------------------------------
# Comparing precisions: speed-up, memory, and accuracy within run-to-run noise


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


# ---------------------------------------------------------------------------------------------
# Idea 3: gradients, underflow and loss scaling


def trained_digits_model(hidden: Sequence[int], epochs: int, batch: int, seed: int = 0) -> tuple[Training, dict]:
    """A digits MLP trained ``epochs`` epochs in float32, and the digits data on the device."""
    data = digits_data()
    steps = positive_int("epochs", epochs) * (len(data["y_train"]) // positive_int("batch", batch))
    training = new_training([64, *positive_ints("hidden", hidden), 10], "float32", seed=seed)
    for rows in batch_order(len(data["y_train"]), batch, steps, seed):
        rows = rows.to(training.device)
        training.step(data["X_train"][rows], data["y_train"][rows])
    return training, data


def captured_gradients(model: torch.nn.Sequential, X: torch.Tensor, labels: torch.Tensor, precision: str = "float32",
                       loss_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The gradients of one backward pass of the mean cross-entropy times ``loss_scale``, as computed, flattened:

    - 'activation': of every linear layer's output (what flows backwards between layers), in the dtype
      the backward pass produced them in (float16 under float16 autocast);
    - 'weight': of every weight and bias, in float32 (autocast's float16 weight gradients, converted).

    They are *not* unscaled: divide by ``loss_scale`` to compare them with float32's.
    """
    if precision not in ("float32", *AUTOCAST_DTYPES):
        raise ValueError(f"precision: float32, float16 or bfloat16; got {precision!r}")
    if not (math.isfinite(loss_scale) and loss_scale > 0):
        raise ValueError(f"loss_scale: must be a finite number > 0, got {loss_scale!r}")
    low = FORMATS[precision].dtype if precision in AUTOCAST_DTYPES else None
    model.zero_grad(set_to_none=True)
    outputs = []
    with matmul_mode("float32"), torch.autocast(X.device.type, dtype=low, enabled=low is not None):
        A = X
        for module in model:
            A = module(A)
            if isinstance(module, torch.nn.Linear):
                A.retain_grad()  # keep the gradient of this intermediate result
                outputs.append(A)
        loss = F.cross_entropy(A, labels)
    with matmul_mode("float32"):
        (loss * loss_scale).backward()
    gradients = {"activation": torch.cat([a.grad.flatten() for a in outputs]),
                 "weight": torch.cat([p.grad.flatten() for p in model.parameters()])}
    model.zero_grad(set_to_none=True)
    return gradients


def _reference_gradients(hidden: Sequence[int], epochs: int, batch: int, seed: int):
    """The trained digits model, a training batch, and float32's gradients on it."""
    training, data = trained_digits_model(hidden, epochs, batch, seed)
    rows = batch_order(len(data["y_train"]), batch, 1, seed + 1)[0].to(data["y_train"].device)
    X, labels = data["X_train"][rows], data["y_train"][rows]
    return training.model, X, labels, captured_gradients(training.model, X, labels)


@experiment("amp_gradient_histogram")
def gradient_histogram(hidden: Sequence[int] = (256, 256), epochs: int = 20, batch: int = 64,
                       seed: int = 0) -> list[dict]:
    """Histogram of log2 |gradient| of a trained digits MLP on one training batch, computed in float32.

    A row per (kind of gradient, power of two): 'log2_magnitude' k counts the values in [2^k, 2^(k+1)).
    Each row also carries the kind's number of values and of exact zeros (ReLU stops many gradients).
    """
    *_, gradients = _reference_gradients(hidden, epochs, batch, seed)
    rows = []
    for kind, values in gradients.items():
        values = values.detach().double().cpu()
        nonzero = values[values != 0].abs()
        exponents = torch.floor(torch.log2(nonzero)).long()
        counts = torch.bincount(exponents - exponents.min())
        for offset, count in enumerate(counts.tolist()):
            rows.append({"gradients": kind, "log2_magnitude": int(exponents.min()) + offset, "count": count,
                         "share": count / len(nonzero), "values": len(values), "zeros": len(values) - len(nonzero)})
    return rows


def flushed_share(values: torch.Tensor, loss_scale: float, dtype: str = "float16") -> dict:
    """What storing ``values`` x ``loss_scale`` in ``dtype`` does to the nonzero ones: the shares that round to
    zero, become subnormal, or overflow to infinity."""
    if not (math.isfinite(loss_scale) and loss_scale > 0):
        raise ValueError(f"loss_scale: must be a finite number > 0, got {loss_scale!r}")
    fmt = format_of(dtype)
    nonzero = values[values != 0].double()
    if not len(nonzero):
        raise ValueError("values: no nonzero value to store")
    stored = (nonzero * loss_scale).to(fmt.dtype)
    return {"flushed": (stored == 0).double().mean().item(),
            "subnormal": ((stored != 0) & (stored.abs() < fmt.smallest_normal)).double().mean().item(),
            "overflowed": torch.isinf(stored).double().mean().item()}


@experiment("amp_loss_scale_underflow")
def loss_scale_underflow(scales: Sequence[float] = (1.0, 2.0**8, 2.0**16, 2.0**24, 2.0**32),
                         hidden: Sequence[int] = (256, 256), epochs: int = 20, batch: int = 64,
                         seed: int = 0) -> list[dict]:
    """Gradients lost to float16 at each loss scale, predicted and measured, on a trained digits MLP.

    Predicted: float32's gradients times the scale, stored in float16 (:func:`flushed_share`).
    Measured: a real float16 autocast backward pass of the loss times the scale: the share of the
    gradients that float32 has nonzero which come out zero, or not finite. Also the relative error of
    the gradients, unscaled, against float32's (None once anything overflowed).
    """
    if not scales or not all(math.isfinite(s) and s > 0 for s in scales):
        raise ValueError(f"scales: expected finite loss scales > 0, got {list(scales)!r}")
    model, X, labels, reference = _reference_gradients(hidden, epochs, batch, seed)
    rows = []
    for scale in scales:
        measured = captured_gradients(model, X, labels, "float16", scale)
        for kind, values in reference.items():
            nonzero = values != 0
            got = measured[kind].double()
            error = (torch.linalg.vector_norm(got / scale - values.double()) / torch.linalg.vector_norm(values.double())
                     ).item() if torch.isfinite(got).all() else None  # None: no error to speak of, and valid JSON
            rows.append({"gradients": kind, "loss_scale": scale, "log2_scale": math.log2(scale),
                         **{f"cast_{key}": value for key, value in flushed_share(values, scale).items()},
                         "backward_lost": ((got == 0) & nonzero).double().sum().item() / nonzero.sum().item(),
                         "backward_not_finite": (~torch.isfinite(got)).double().mean().item(),
                         "relative_error": error, "nonzero": nonzero.sum().item()})
    return rows


@experiment("amp_loss_scale_trace")
def loss_scale_trace(init_scale: float = 2.0**24, growth_interval: int = 10, steps: int = 200,
                     hidden: Sequence[int] = (256, 256), batch: int = 64, seed: int = 0) -> list[dict]:
    """Train the digits MLP in float16 AMP with a GradScaler started at ``init_scale``, recording every step.

    A row per step: the scale the step used, whether the step was skipped (the scale went down: a
    gradient overflowed), and the loss. Checks, and raises otherwise, that the weights stayed exactly
    as they were in every skipped step and changed in every other.
    """
    data = digits_data()
    training = new_training([64, *positive_ints("hidden", hidden), 10], "float16", seed=seed, init_scale=init_scale,
                            growth_interval=growth_interval, device=data["X_train"].device)
    rows = []
    for step, indices in enumerate(batch_order(len(data["y_train"]), batch, steps, seed), start=1):
        indices = indices.to(training.device)
        before = torch.nn.utils.parameters_to_vector(training.model.parameters()).detach().clone()
        scale = training.scaler.get_scale()
        loss = training.step(data["X_train"][indices], data["y_train"][indices]).item()
        skipped = training.scaler.get_scale() < scale
        changed = not torch.equal(before, torch.nn.utils.parameters_to_vector(training.model.parameters()))
        if changed == skipped:
            raise AssertionError(f"step {step}: the scaler {'skipped' if skipped else 'took'} the step, but the "
                                 f"weights {'changed' if changed else 'did not change'}")
        rows.append({"step": step, "loss_scale": scale, "log2_scale": math.log2(scale), "skipped": skipped,
                     "loss": loss})
    return rows


# ---------------------------------------------------------------------------------------------
# Figures


def histogram_figure(rows: Sequence[dict], scales: Sequence[float], *, title: str) -> go.Figure:
    """The gradient histogram, with float16's ranges shaded for a loss scale that a menu picks.

    Multiplying by a scale S moves every gradient up by log2 S; the figure moves float16's bounds
    down instead, so that the histogram stays put: below 2^-25 / S a gradient rounds to zero, up to
    2^-14 / S it is subnormal, beyond 65504 / S it overflows.
    """
    fmt = FORMATS["float16"]
    fig = go.Figure()
    for i, kind in enumerate(dict.fromkeys(r["gradients"] for r in rows)):
        series = [r for r in rows if r["gradients"] == kind]
        fig.add_trace(go.Bar(x=[r["log2_magnitude"] + 0.5 for r in series], y=[100 * r["share"] for r in series],
                             name=f"{kind} gradients", marker_color=plots.PALETTE[i],
                             marker_pattern_shape="" if i == 0 else "/", opacity=0.75,
                             hovertext=[plots.hover_text(r, ("gradients", "log2_magnitude", "count")) for r in series],
                             hoverinfo="text"))
    low, high = min(r["log2_magnitude"] for r in rows), max(r["log2_magnitude"] for r in rows) + 1
    edges = {"zero": math.log2(fmt.smallest_subnormal) - 1, "normal": math.log2(fmt.smallest_normal),
             "overflow": math.log2(fmt.largest)}

    def regions(scale: float) -> tuple[list[dict], list[dict]]:
        shift = math.log2(scale)
        zero, normal, overflow = (edges[k] - shift for k in ("zero", "normal", "overflow"))
        boxes = [("rounds to 0", min(low, zero) - 1, zero, "rgba(0,0,0,0.22)", 0.98),
                 ("subnormal", zero, normal, "rgba(0,0,0,0.08)", 0.90),
                 ("overflows", overflow, max(high, overflow) + 1, "rgba(0,0,0,0.22)", 0.98)]
        shapes = [dict(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, fillcolor=colour, line_width=0,
                       layer="below") for _, x0, x1, colour, _ in boxes]
        notes = [dict(x=(max(x0, low - 1) + min(x1, high + 1)) / 2, y=y, yref="paper", yanchor="top", text=name,
                      showarrow=False, font=dict(size=11), bgcolor="rgba(255,255,255,0.7)")
                 for name, x0, x1, _, y in boxes if x1 > low - 1 and x0 < high + 1]
        return shapes, notes

    buttons = []
    for scale in scales:
        shapes, notes = regions(scale)
        buttons.append(dict(label=f"float16 ranges at loss scale 2^{math.log2(scale):g}", method="relayout",
                            args=[{"shapes": shapes, "annotations": notes}]))
    shapes, notes = regions(scales[0])
    fig.update_layout(title=title, barmode="overlay", bargap=0.05, shapes=shapes, annotations=notes,
                      xaxis=dict(title="log2 |gradient| (bins of one power of two)", range=[low - 1, high + 1]),
                      yaxis_title="share of the nonzero gradients (%)", margin=dict(t=100),
                      updatemenus=[dict(buttons=buttons, active=0, x=0.0, y=1.14, xanchor="left", direction="down")],
                      legend=dict(x=0.01, y=0.8))
    return fig


def underflow_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Per loss scale, the share of the nonzero gradients that float16 loses: predicted by storing float32's
    gradients (dotted) and measured in a float16 backward pass (solid); and the share that overflowed (dash-dot)."""
    series = []
    for r in rows:
        kind = r["gradients"]
        series += [{"log2_scale": r["log2_scale"], "series": f"{kind}: rounded to 0, predicted",
                    "percent": 100 * r["cast_flushed"]},
                   {"log2_scale": r["log2_scale"], "series": f"{kind}: lost in the float16 backward",
                    "percent": 100 * r["backward_lost"]},
                   {"log2_scale": r["log2_scale"], "series": f"{kind}: inf or NaN in the float16 backward",
                    "percent": 100 * r["backward_not_finite"]}]
    kinds = list(dict.fromkeys(r["gradients"] for r in rows))
    colors = {s["series"]: plots.PALETTE[kinds.index(s["series"].split(":")[0]) % len(plots.PALETTE)] for s in series}
    fig = plots.sweep_figure(series, "log2_scale", "percent", color="series", colors=colors, title=title,
                             x_title="log2 of the loss scale", y_title="share of the nonzero gradients (%)",
                             hover=("series", "log2_scale", "percent"))
    for trace in fig.data:
        trace.line.dash = "dot" if "predicted" in trace.name else "dashdot" if "inf" in trace.name else "solid"
        trace.marker.symbol = "circle" if trace.name.startswith(kinds[0]) else "square"
    fig.update_xaxes(dtick=8)
    return fig


def loss_scale_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """The loss scale at every step (a line, log2), the skipped steps marked with crosses."""
    fig = plots.sweep_figure(rows, "step", "log2_scale", name="loss scale", title=title, x_title="training step",
                             y_title="log2 of the loss scale", hover=("step", "loss_scale", "skipped", "loss"))
    fig.data[0].mode = "lines"
    skipped = [r for r in rows if r["skipped"]]
    fig.add_trace(go.Scatter(x=[r["step"] for r in skipped], y=[r["log2_scale"] for r in skipped], mode="markers",
                             name="skipped step (inf or NaN found)", marker=dict(symbol="x", size=9, color="#e4572e")))
    return fig


def precision_figure(summary: Sequence[dict], *, title: str) -> go.Figure:
    """Side by side, per precision: the time per training step, and the test accuracy (mean, with a bar of
    one standard deviation over the seeds)."""
    ran = [s for s in summary if s["runs"]]
    labels = [s["label"] for s in ran]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per training step", "test accuracy"),
                        horizontal_spacing=0.12)
    fig.add_trace(go.Bar(x=labels, y=[1e3 * s["step_seconds"] for s in ran], marker_color=plots.PALETTE[0],
                         text=[f"{1e3 * s['step_seconds']:.3g}" for s in ran], textposition="outside",
                         name="ms per step", showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[100 * s["accuracy_mean"] for s in ran], marker_color="#7f7f7f",
                         error_y=dict(type="data", array=[100 * s["accuracy_sd"] for s in ran]),
                         text=[f"{100 * s['accuracy_mean']:.1f}" for s in ran], textposition="inside",
                         name="accuracy", showlegend=False), row=1, col=2)
    low = min(100 * (s["accuracy_mean"] - s["accuracy_sd"]) for s in ran)
    fig.update_xaxes(title_text="precision")
    fig.update_yaxes(title_text="milliseconds per step", row=1, col=1)
    fig.update_yaxes(title_text="test accuracy (%, mean over seeds)", range=[max(0, low - 10), 100], row=1, col=2)
    fig.update_layout(title=title, margin=dict(t=100))
    return fig
