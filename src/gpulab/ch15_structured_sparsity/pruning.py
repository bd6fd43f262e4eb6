"""Pruning and accuracy: a digits MLP pruned to 2:4, at random, or by magnitude, then fine-tuned, over seeds."""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch15_structured_sparsity.patterns import (
    GROUP,
    compress,
    decompress,
    is_2_4,
    magnitude_2_4_mask,
    magnitude_mask,
    random_2_4_mask,
)
from gpulab.core.correctness import check_close
from gpulab.core.validation import positive_int, positive_ints


def _masked(W: torch.Tensor, method: str, generator: torch.Generator) -> torch.Tensor:
    if method == "2:4 magnitude":
        return magnitude_2_4_mask(W)
    if method == "2:4 random":
        return random_2_4_mask(W, generator)
    return magnitude_mask(W, 0.5)


PRUNING_METHODS = ("2:4 magnitude", "2:4 random", "unstructured 50% magnitude")
DENSE = "dense"


def linear_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The ``nn.Linear`` layers of ``model``, in order."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def train_with_masks(model: torch.nn.Module, data: dict[str, torch.Tensor], *, epochs: int, batch: int,
                     learning_rate: float, seed: int, masks: Sequence[torch.Tensor] = ()) -> None:
    """Train ``model`` in place with SGD and momentum on ``data`` (X_train, y_train of
    :func:`gpulab.ch04_mlp_gemms.mlp.load_digits_split`), shuffled by ``seed``. With ``masks`` (one boolean mask per
    linear layer, in order), the pruned weights stay zero: the gradients are masked before each step and the weights
    after it, as ASP does."""
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    X, y = data["X_train"], data["y_train"]
    layers = linear_layers(model)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch):
            rows = order[start:start + batch]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(X[rows]), y[rows]).backward()
            if masks:
                for layer, mask in zip(layers, masks, strict=True):
                    layer.weight.grad.mul_(mask)
            optimizer.step()
            if masks:
                with torch.no_grad():
                    for layer, mask in zip(layers, masks, strict=True):
                        layer.weight.mul_(mask)


@torch.no_grad()
def _accuracy(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    return (model(X).argmax(dim=1) == y).double().mean().item()


def _check_pruned(model: torch.nn.Module, masks: Sequence[torch.Tensor], method: str, X: torch.Tensor) -> None:
    """Raise unless every pruned weight is still zero; for 2:4, unless every layer is 2:4 and the network computes
    the same with each weight passed through :func:`compress` and :func:`decompress`."""
    for i, (layer, mask) in enumerate(zip(linear_layers(model), masks, strict=True), start=1):
        if (layer.weight[~mask] != 0).any():
            raise AssertionError(f"{method}: layer {i} has nonzero weights where the mask pruned them")
        if method.startswith("2:4") and not is_2_4(layer.weight):
            raise AssertionError(f"{method}: layer {i} is not 2:4 after fine-tuning")
    if method.startswith("2:4"):
        rebuilt = copy.deepcopy(model)
        with torch.no_grad():
            for layer in linear_layers(rebuilt):
                layer.weight.copy_(decompress(compress(layer.weight)))
            check_close(rebuilt(X), model(X), 0.0, f"{method}: the network through compress/decompress")


@contextmanager
def _one_thread() -> Iterator[None]:
    """Within the block, torch computes on one CPU thread: for matrices of a few thousand elements, more threads
    only add synchronisation (three times slower on two cores)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def pruning_accuracy(hidden: Sequence[int] = (64, 64), *, epochs: int = 30, finetune_epochs: int = 30,
                     seeds: Sequence[int] = (0, 1, 2), batch: int = 64, learning_rate: float = 0.05) -> list[dict]:
    """Train an MLP (64 pixels -> ``hidden`` -> 10 digits) on scikit-learn's digits, then prune every linear layer
    each way of :data:`PRUNING_METHODS` and fine-tune for ``finetune_epochs`` with the mask fixed.

    A row per seed, method and stage ('trained', 'pruned', 'fine-tuned'): the test accuracy, the share of
    weights that are zero, and the share of the weights' squared norm the mask kept. The dense network is
    also trained for ``finetune_epochs`` more ('fine-tuned'), so that the extra epochs alone can be told
    apart from recovering what pruning lost. Before its accuracy counts, every fine-tuned network is
    checked: pruned weights still zero, 2:4 layers still 2:4 and unchanged by compress/decompress.
    Runs on the CPU: the network is too small for a GPU to help.
    """
    hidden = positive_ints("hidden", hidden) if len(hidden) else []
    bad = [h for h in hidden if h % GROUP]
    if bad:
        raise ValueError(f"hidden: every layer's input size must be a multiple of {GROUP} (the groups of 2:4), "
                         f"got {bad}")
    epochs, batch = positive_int("epochs", epochs), positive_int("batch", batch)
    finetune_epochs = positive_int("finetune_epochs", finetune_epochs)
    if not learning_rate > 0:
        raise ValueError(f"learning_rate: must be > 0, got {learning_rate!r}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    data = mlp.load_digits_split(seed=0)  # the same split for every seed: the seeds vary the weights and batches
    sizes = [data["X_train"].shape[1], *hidden, 10]
    rows = []
    with _one_thread():
        for seed in seeds:
            rows += _prune_one_seed(seed, sizes, data, epochs=epochs, finetune_epochs=finetune_epochs, batch=batch,
                                    learning_rate=learning_rate)
    return rows


def _row(seed: int, method: str, stage: str, model: torch.nn.Module, data: dict[str, torch.Tensor],
         kept_norm: float = 1.0) -> dict:
    """One row of :func:`pruning_accuracy`: ``model``'s test accuracy and its share of zero weights."""
    weights = torch.cat([layer.weight.detach().flatten() for layer in linear_layers(model)])
    return {"seed": seed, "method": method, "stage": stage,
            "test_accuracy": _accuracy(model, data["X_test"], data["y_test"]),
            "zeros": (weights == 0).double().mean().item(), "kept_norm": kept_norm,
            "test_samples": len(data["y_test"])}


def _prune_one_seed(seed: int, sizes: list[int], data: dict[str, torch.Tensor], *, epochs: int, finetune_epochs: int,
                    batch: int, learning_rate: float) -> list[dict]:
    """The rows of :func:`pruning_accuracy` for one seed."""
    train = dict(batch=batch, learning_rate=learning_rate)
    model = mlp.torch_mlp(sizes, seed=seed)
    train_with_masks(model, data, epochs=epochs, seed=seed, **train)
    longer = copy.deepcopy(model)
    # the dense network trained as long again, on the same batches as the fine-tuning of the pruned ones
    train_with_masks(longer, data, epochs=finetune_epochs, seed=seed + 1000, **train)
    rows = [_row(seed, DENSE, "trained", model, data), _row(seed, DENSE, "fine-tuned", longer, data)]
    generator = torch.Generator().manual_seed(seed)
    for method in PRUNING_METHODS:
        pruned = copy.deepcopy(model)
        layers = linear_layers(pruned)
        masks = [_masked(layer.weight.detach(), method, generator) for layer in layers]
        with torch.no_grad():
            total = sum(layer.weight.square().sum() for layer in layers)
            for layer, mask in zip(layers, masks, strict=True):
                layer.weight.mul_(mask)
            kept_norm = (sum(layer.weight.square().sum() for layer in layers) / total).item()
        rows.append(_row(seed, method, "pruned", pruned, data, kept_norm))
        train_with_masks(pruned, data, epochs=finetune_epochs, seed=seed + 1000, masks=masks, **train)
        _check_pruned(pruned, masks, method, data["X_test"])
        rows.append(_row(seed, method, "fine-tuned", pruned, data, kept_norm))
    return rows


def summarize_pruning(rows: Sequence[dict]) -> list[dict]:
    """Per method and stage, over the seeds: the mean, standard deviation, lowest and highest test accuracy, the
    mean share of zero weights and of the kept squared norm; and the gap to the dense network (after pruning:
    to the network as trained; after fine-tuning: to the dense network trained as many epochs more).

    The gap is judged seed by seed (paired): each pruned network is compared with the dense network of its
    own seed on the same test images, so the noise is the standard error of those per-seed differences.
    'within_noise' is True where the mean gap is at most twice that; None with a single seed.
    """
    groups: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["stage"]), {})[r["seed"]] = r
    reference = {"pruned": groups.get((DENSE, "trained"), {}), "fine-tuned": groups.get((DENSE, "fine-tuned"), {})}
    summary = []
    for (method, stage), by_seed in groups.items():
        accuracies = [r["test_accuracy"] for r in by_seed.values()]
        entry = {"method": method, "stage": stage, "runs": len(accuracies),
                 "accuracy_mean": statistics.fmean(accuracies),
                 "accuracy_sd": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                 "accuracy_min": min(accuracies), "accuracy_max": max(accuracies),
                 "zeros": statistics.fmean(r["zeros"] for r in by_seed.values()),
                 "kept_norm": statistics.fmean(r["kept_norm"] for r in by_seed.values())}
        base = reference.get(stage, {}) if method != DENSE else {}
        differences = [r["test_accuracy"] - base[seed]["test_accuracy"] for seed, r in by_seed.items() if seed in base]
        if differences:
            noise = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else None
            entry.update(gap_to_dense=statistics.fmean(differences), noise=noise,
                         within_noise=None if noise is None else abs(statistics.fmean(differences)) <= 2 * noise)
        summary.append(entry)
    return summary
