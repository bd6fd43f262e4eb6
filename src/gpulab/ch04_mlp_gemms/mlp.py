"""The MLP chapter's library: a fully-connected layer is three GEMMs, forward and backward.

A linear layer maps a batch of inputs ``X`` (batch x inputs) through weights ``W`` (inputs x
outputs, the course's "784 x 16 W matrix") and a bias ``b`` to ``Y = X W + b``. Training it needs
two more matrix products, so a training step is

- forward propagation:   ``Y  = X W``      (+ b, an elementwise add)
- activation gradient:   ``dX = dY W^T``   (what the layer below receives)
- weight gradient:       ``dW = X^T dY``   (and ``db``, the column sums of ``dY``)

Everything else (activations, the loss, the bias, the optimiser) is elementwise or a reduction.
This module writes those GEMMs out (:func:`linear_forward`, :func:`linear_backward`), trains a small
MLP with them and no autograd (:func:`train_digits`), counts a training step's operations
(:func:`training_step_operations`, :func:`flop_counter_totals`), and measures how fast a linear
layer's forward GEMM runs for different shapes, with the tile- and wave-quantization model of
NVIDIA's performance guides to predict where the rate steps (:func:`.waves.tile_waves`, :func:`.waves.wave_steps`).

Shapes follow the course (rows are samples). cuBLAS is column-major, so for a row-major ``Y = X W``
it computes ``Y^T = W^T X^T``: in NVIDIA's M x N x K language the forward GEMM has M = outputs,
N = batch, K = inputs (:func:`layer_gemms` gives all three).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from gpulab.core.correctness import relative_error
from gpulab.core.validation import positive_int, positive_ints

# The course's MNIST example {lapenna2022unit11}: 10 images of 28 x 28 = 784 pixels, 16 hidden neurons, 10 digits.
MNIST_BATCH, MNIST_PIXELS, MNIST_HIDDEN, MNIST_CLASSES = 10, 784, 16, 10
CHECK_ROWS = 64  # rows of a timed GEMM's result compared with the float64 reference
GPU_REPEATS, CPU_REPEATS = 25, 5  # timed repetitions per shape: CUDA events are precise, CPU runs are slow






@dataclass(frozen=True)
class Gradients:
    """The gradients of a loss with respect to one linear layer's input, weights and bias."""

    dX: torch.Tensor | None  # None where nobody needs it (the first layer's input)
    dW: torch.Tensor
    db: torch.Tensor


def linear_forward(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Y = X W (+ b): one GEMM, (batch x inputs) times (inputs x outputs), and a broadcast add."""
    _check_linear_shapes(X, W, b)
    Y = torch.matmul(X, W)
    return Y if b is None else Y + b


def linear_backward(X: torch.Tensor, W: torch.Tensor, dY: torch.Tensor, need_dX: bool = True) -> Gradients:
    """The two backward GEMMs of Y = X W + b, given dY = dLoss/dY (batch x outputs).

    dX = dY W^T (batch x inputs) and dW = X^T dY (inputs x outputs); db sums dY over the batch.
    """
    _check_linear_shapes(X, W, None)
    if dY.shape != (X.shape[0], W.shape[1]):
        raise ValueError(f"dY: expected shape {(X.shape[0], W.shape[1])} (batch x outputs), got {tuple(dY.shape)}")
    dX = torch.matmul(dY, W.T) if need_dX else None
    return Gradients(dX=dX, dW=torch.matmul(X.T, dY), db=dY.sum(dim=0))


def _check_linear_shapes(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> None:
    if X.dim() != 2 or W.dim() != 2:
        raise ValueError(f"X, W: expected matrices, got X of shape {tuple(X.shape)} and W of {tuple(W.shape)}")
    if X.shape[1] != W.shape[0]:
        raise ValueError(f"W: has {W.shape[0]} rows but X has {X.shape[1]} columns (inputs); W is inputs x outputs")
    if b is not None and b.shape != (W.shape[1],):
        raise ValueError(f"b: expected shape ({W.shape[1]},) (one bias per output), got {tuple(b.shape)}")


def relu_backward(Z: torch.Tensor, dA: torch.Tensor) -> torch.Tensor:
    """dZ for A = relu(Z): the gradient passes where Z > 0 and stops elsewhere (elementwise, no GEMM)."""
    if Z.shape != dA.shape:
        raise ValueError(f"dA: expected the shape of Z {tuple(Z.shape)}, got {tuple(dA.shape)}")
    return dA * (Z > 0)


def layer_gemms(batch: int, inputs: int, outputs: int) -> list[dict]:
    """The three GEMMs of a linear layer with their shapes, in the course's and in NVIDIA's M x N x K terms.

    Row-major ``C = A B`` with A of m x k and B of k x n. cuBLAS computes the column-major transpose
    ``C^T = B^T A^T``, so NVIDIA's M is our n, its N our m, and K is the summed dimension in both.
    """
    batch, inputs, outputs = (positive_int(n, v) for n, v in (("batch", batch), ("inputs", inputs),
                                                                ("outputs", outputs)))
    sizes = {"batch": batch, "inputs": inputs, "outputs": outputs}
    phases = [  # (phase, formula, A, B, C, NVIDIA's M, N, K as layer dimensions)
        ("forward propagation", "Y = X W", ("X", "batch", "inputs"), ("W", "inputs", "outputs"),
         ("Y", "batch", "outputs"), ("outputs", "batch", "inputs")),
        ("activation gradient", "dX = dY W^T", ("dY", "batch", "outputs"), ("W^T", "outputs", "inputs"),
         ("dX", "batch", "inputs"), ("inputs", "batch", "outputs")),
        ("weight gradient", "dW = X^T dY", ("X^T", "inputs", "batch"), ("dY", "batch", "outputs"),
         ("dW", "inputs", "outputs"), ("outputs", "inputs", "batch")),
    ]
    rows = []
    for phase, formula, a, b, c, (m, n, k) in phases:
        def shape(operand):
            name, rows_dim, cols_dim = operand
            return f"{name}: {sizes[rows_dim]} x {sizes[cols_dim]} ({rows_dim} x {cols_dim})"

        rows.append({
            "phase": phase, "formula": formula, "A": shape(a), "B": shape(b), "C": shape(c),
            "M": sizes[m], "N": sizes[n], "K": sizes[k], "M is": m, "N is": n, "K is": k,
            "flops": 2 * batch * inputs * outputs,
        })
    return rows






@dataclass
class Layer:
    """One linear layer: W is inputs x outputs (the course's layout; nn.Linear stores its transpose)."""

    W: torch.Tensor
    b: torch.Tensor


def init_mlp(sizes: Sequence[int], *, seed: int = 0, dtype: torch.dtype = torch.float32,
             device: torch.device | None = None) -> list[Layer]:
    """Layers for ``sizes`` = [inputs, hidden..., outputs], He-initialised (suited to ReLU), biases zero."""
    sizes = positive_ints("sizes", sizes)
    if len(sizes) < 2:
        raise ValueError(f"sizes: need at least an input and an output size, got {sizes}")
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        W = torch.randn(fan_in, fan_out, generator=generator, dtype=torch.float64) * math.sqrt(2 / fan_in)
        layers.append(Layer(W.to(dtype=dtype, device=device), torch.zeros(fan_out, dtype=dtype, device=device)))
    return layers


def mlp_forward(layers: Sequence[Layer], X: torch.Tensor) -> tuple[torch.Tensor, list[tuple]]:
    """Logits of the MLP (ReLU between layers, none after the last) and the cache the backward pass needs.

    The cache holds, per layer, its input and its pre-activation Z = A W + b.
    """
    cache, A = [], X
    for i, layer in enumerate(layers):
        Z = linear_forward(A, layer.W, layer.b)
        cache.append((A, Z))
        A = torch.relu(Z) if i < len(layers) - 1 else Z
    return A, cache


def softmax_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of softmax(logits) against integer ``labels``, and its gradient dLoss/dlogits.

    The gradient is the famous (softmax - one_hot) / batch: elementwise, no GEMM.
    """
    if logits.dim() != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"labels: expected one label per row of logits {tuple(logits.shape)}, "
                         f"got shape {tuple(labels.shape)}")
    log_probabilities = torch.log_softmax(logits, dim=1)
    loss = -log_probabilities.gather(1, labels[:, None]).mean()
    dlogits = log_probabilities.exp()
    dlogits[torch.arange(len(labels)), labels] -= 1
    return loss, dlogits / len(labels)


def mlp_backward(layers: Sequence[Layer], cache: Sequence[tuple], dlogits: torch.Tensor) -> list[Gradients]:
    """Backpropagation as two GEMMs per layer (the first layer skips dX: nobody needs it) plus ReLU masks."""
    grads: list[Gradients] = []
    dZ = dlogits
    for i in reversed(range(len(layers))):
        A, _ = cache[i]
        g = linear_backward(A, layers[i].W, dZ, need_dX=i > 0)
        grads.append(g)
        if i > 0:
            dZ = relu_backward(cache[i - 1][1], g.dX)  # through the ReLU that made this layer's input
    return grads[::-1]


def autograd_gradients(layers: Sequence[Layer], X: torch.Tensor, labels: torch.Tensor) -> tuple[float, list[Gradients]]:
    """The loss and its gradients from PyTorch's autograd, through nn.functional's own layers: the reference."""
    params = [(layer.W.detach().clone().requires_grad_(), layer.b.detach().clone().requires_grad_())
              for layer in layers]
    A = X
    for i, (W, b) in enumerate(params):
        A = F.linear(A, W.T, b)
        if i < len(params) - 1:
            A = F.relu(A)
    loss = F.cross_entropy(A, labels)
    loss.backward()
    return loss.item(), [Gradients(None, W.grad, b.grad) for W, b in params]


def gradient_errors(mine: Sequence[Gradients], reference: Sequence[Gradients]) -> list[dict]:
    """Relative error of each layer's dW and db against the reference (NaN if anything is not finite)."""
    return [{"layer": i + 1, "dW": relative_error(a.dW, b.dW), "db": relative_error(a.db, b.db)}
            for i, (a, b) in enumerate(zip(mine, reference, strict=True))]


def load_digits_split(test_fraction: float = 0.2, seed: int = 0) -> dict[str, torch.Tensor]:
    """scikit-learn's 8 x 8 digits (1797 images; shipped with the package), pixels scaled to [0, 1], split."""
    from sklearn.datasets import load_digits

    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction: must be between 0 and 1, got {test_fraction}")
    digits = load_digits()
    X = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return {"X_train": X[train], "y_train": y[train], "X_test": X[test], "y_test": y[test]}


@dataclass
class Training:
    """What :func:`train_digits` returns: one row per epoch, and the trained layers."""

    rows: list[dict]
    layers: list[Layer]
    steps: int


def accuracy(layers: Sequence[Layer], X: torch.Tensor, labels: torch.Tensor) -> float:
    logits, _ = mlp_forward(layers, X)
    return (logits.argmax(dim=1) == labels).float().mean().item()


def train_digits(hidden: Sequence[int] = (32,), *, epochs: int = 30, batch: int = 64, learning_rate: float = 0.1,
                 seed: int = 0) -> Training:
    """Train an MLP on the digits with mini-batch SGD, the backward pass written as GEMMs (no autograd)."""
    epochs, batch = positive_int("epochs", epochs), positive_int("batch", batch)
    if not learning_rate > 0:
        raise ValueError(f"learning_rate: must be > 0, got {learning_rate}")
    data = load_digits_split(seed=seed)
    X, y = data["X_train"], data["y_train"]
    layers = init_mlp([X.shape[1], *hidden, 10], seed=seed)
    generator = torch.Generator().manual_seed(seed)
    rows, steps = [], 0
    for epoch in range(1, epochs + 1):
        order, losses = torch.randperm(len(y), generator=generator), []
        for start in range(0, len(y), batch):
            rows_in_batch = order[start:start + batch]
            logits, cache = mlp_forward(layers, X[rows_in_batch])
            loss, dlogits = softmax_cross_entropy(logits, y[rows_in_batch])
            for layer, g in zip(layers, mlp_backward(layers, cache, dlogits), strict=True):
                layer.W -= learning_rate * g.dW  # plain SGD: two elementwise operations per parameter
                layer.b -= learning_rate * g.db
            losses.append(loss.item())
            steps += 1
        if not math.isfinite(losses[-1]):
            raise AssertionError(f"training diverged at epoch {epoch}: the loss is {losses[-1]}")
        rows.append({"epoch": epoch, "loss": sum(losses) / len(losses),
                     "train_accuracy": accuracy(layers, X, y),
                     "test_accuracy": accuracy(layers, data["X_test"], data["y_test"])})
    return Training(rows, layers, steps)






def training_step_operations(sizes: Sequence[int], batch: int) -> list[dict]:
    """Every operation of one SGD step of an MLP (ReLU between layers, softmax cross-entropy), with its FLOP.

    GEMMs count 2 FLOP per multiply-add. Elementwise work is counted roughly (one FLOP per element
    per simple operation, five per logit for softmax and cross-entropy with their gradient): it is
    there to be compared with the GEMMs, which it never comes close to.
    """
    sizes, batch = positive_ints("sizes", sizes), positive_int("batch", batch)
    ops = []

    def add(layer, phase, kind, shape, count):
        ops.append({"layer": layer, "operation": phase, "kind": kind, "shape": shape, "flops": count})

    last = len(sizes) - 1
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True), start=1):
        add(i, "forward Y = X W", "GEMM", f"{batch}x{n_in} . {n_in}x{n_out}", 2 * batch * n_in * n_out)
        add(i, "forward + b", "elementwise", f"{batch}x{n_out}", batch * n_out)
        if i < last:
            add(i, "ReLU", "elementwise", f"{batch}x{n_out}", batch * n_out)
    add(last, "softmax cross-entropy and its gradient", "elementwise", f"{batch}x{sizes[-1]}", 5 * batch * sizes[-1])
    for i in range(last, 0, -1):
        n_in, n_out = sizes[i - 1], sizes[i]
        add(i, "weight gradient dW = X^T dY", "GEMM", f"{n_in}x{batch} . {batch}x{n_out}", 2 * batch * n_in * n_out)
        add(i, "bias gradient db = sum dY", "elementwise", f"{batch}x{n_out}", batch * n_out)
        if i > 1:
            add(i, "activation gradient dX = dY W^T", "GEMM", f"{batch}x{n_out} . {n_out}x{n_in}",
                2 * batch * n_in * n_out)
            add(i - 1, "ReLU gradient", "elementwise", f"{batch}x{n_in}", batch * n_in)
        add(i, "SGD update of W and b", "elementwise", f"{n_in}x{n_out} + {n_out}", 2 * (n_in + 1) * n_out)
    return ops


def step_totals(operations: Sequence[dict]) -> dict[str, float]:
    """FLOP of a step's operations by kind, and the share the GEMMs do."""
    gemm = sum(op["flops"] for op in operations if op["kind"] == "GEMM")
    other = sum(op["flops"] for op in operations if op["kind"] != "GEMM")
    forward_gemm = sum(op["flops"] for op in operations if op["operation"].startswith("forward Y"))
    return {"gemm": gemm, "elementwise": other, "gemm_share": gemm / (gemm + other),
            "forward_gemm": forward_gemm, "step_over_forward": gemm / forward_gemm}


def torch_mlp(sizes: Sequence[int], seed: int = 0) -> torch.nn.Sequential:
    """The same MLP as :func:`init_mlp` builds, as nn.Linear layers with ReLU between them."""
    sizes = positive_ints("sizes", sizes)
    torch.manual_seed(seed)
    modules: list[torch.nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        modules.append(torch.nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules)


def flop_counter_totals(model: torch.nn.Module, X: torch.Tensor, labels: torch.Tensor) -> dict[str, int]:
    """FLOP that ``torch.utils.flop_counter.FlopCounterMode`` counts in a forward and a backward pass.

    The counter sees matrix products (mm, addmm, bmm, convolutions, attention) and nothing else, so
    its totals are the GEMM work of the step.
    """
    with FlopCounterMode(display=False) as forward:
        loss = F.cross_entropy(model(X), labels)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return {"forward": forward.get_total_flops(), "backward": backward.get_total_flops(),
            "total": forward.get_total_flops() + backward.get_total_flops()}
