"""Gradients in 16 bits: a trained digits MLP's gradients, how many of them float16 loses at each loss
scale (predicted and measured), and a GradScaler's scale step by step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gpulab.ch11_mixed_precision.amp import Training, batch_order, digits_data, new_training
from gpulab.ch11_mixed_precision.autocast import AUTOCAST_DTYPES
from gpulab.core.precision import FORMATS, format_of, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.validation import positive_int, positive_ints


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
