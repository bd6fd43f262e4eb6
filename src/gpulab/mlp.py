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
NVIDIA's performance guides to predict where the rate steps (:func:`tile_waves`, :func:`wave_steps`).

Shapes follow the course (rows are samples). cuBLAS is column-major, so for a row-major ``Y = X W``
it computes ``Y^T = W^T X^T``: in NVIDIA's M x N x K language the forward GEMM has M = outputs,
N = batch, K = inputs (:func:`layer_gemms` gives all three).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from gpulab import env, flops, plots, timing
from gpulab.correctness import check_close, poisoned, random_tensor, relative_error
from gpulab.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.provenance import experiment
from gpulab.sweep import ok_rows, run_sweep
from gpulab.validation import dtype_name, fits_in_memory, positive_int, positive_ints, supported_dtype

# The course's MNIST example {lapenna2022unit11}: 10 images of 28 x 28 = 784 pixels, 16 hidden neurons, 10 digits.
MNIST_BATCH, MNIST_PIXELS, MNIST_HIDDEN, MNIST_CLASSES = 10, 784, 16, 10
CHECK_ROWS = 64  # rows of a timed GEMM's result compared with the float64 reference
GPU_REPEATS, CPU_REPEATS = 25, 5  # timed repetitions per shape: CUDA events are precise, CPU runs are slow


# ---------------------------------------------------------------------------------------------
# The three GEMMs of a linear layer


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


# ---------------------------------------------------------------------------------------------
# A small MLP, trained with the three GEMMs per layer and no autograd


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


# ---------------------------------------------------------------------------------------------
# Counting a training step's operations


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


# ---------------------------------------------------------------------------------------------
# Tile and wave quantization: where a GEMM's rate steps


@dataclass(frozen=True)
class TileWaves:
    """How an M x N output is cut into tiles, and the tiles into waves over the SMs.

    Each tile is one thread block; each SM runs one at a time (the model of NVIDIA's matmul guide).
    On Hopper a *cluster* of thread blocks can share one larger tile across ``cluster`` SMs: the
    waves are then counted in clusters, ``sms // cluster`` of them side by side.
    """

    m: int
    n: int
    tile_m: int
    tile_n: int
    sms: int
    cluster: int = 1

    @property
    def slots(self) -> int:
        """How many tiles run at once: one per SM, or one per cluster of SMs."""
        return self.sms // self.cluster

    @property
    def tiles(self) -> int:
        return math.ceil(self.m / self.tile_m) * math.ceil(self.n / self.tile_n)

    @property
    def waves(self) -> int:
        return math.ceil(self.tiles / self.slots)

    @property
    def tile_efficiency(self) -> float:
        """Useful outputs over computed ones: below 1 when a dimension is not a multiple of the tile."""
        return self.m * self.n / (self.tiles * self.tile_m * self.tile_n)

    @property
    def wave_efficiency(self) -> float:
        """Busy SM-slots over all slots of all waves: below 1 when the last wave is partly empty."""
        return self.tiles / (self.waves * self.slots)

    @property
    def efficiency(self) -> float:
        """The share of the GPU's peak the model allows: the useful work over waves x SMs x tile."""
        return self.tile_efficiency * self.wave_efficiency


# Tile models the chapter's figures offer: (tile_m, tile_n, SMs per tile). cuBLAS picks its tile per shape.
TILE_MODELS = ((128, 128, 1), (256, 128, 2), (128, 256, 1))


def tile_label(tile: Sequence[int]) -> str:
    """'128x128 per SM' or '256x128 per 2-SM cluster'."""
    tile_m, tile_n, cluster = _tile(tile)
    return f"{tile_m}x{tile_n} per SM" if cluster == 1 else f"{tile_m}x{tile_n} per {cluster}-SM cluster"


def _tile(tile: Sequence[int]) -> tuple[int, int, int]:
    if isinstance(tile, str | bytes) or len(tile) not in (2, 3):
        raise ValueError(f"tile: expected (tile_m, tile_n) or (tile_m, tile_n, SMs per tile), got {tile!r}")
    tile_m, tile_n, *cluster = (positive_int("tile", t) for t in tile)
    return tile_m, tile_n, cluster[0] if cluster else 1


def tile_waves(m: int, n: int, tile: Sequence[int] = (128, 128), sms: int = 132) -> TileWaves:
    """The tile/wave model of an output of M x N (NVIDIA's terms: for a linear layer's forward GEMM, M = outputs
    and N = batch), computed in tiles of ``tile`` = (tile_m, tile_n[, SMs per tile]) on ``sms`` SMs."""
    tile_m, tile_n, cluster = _tile(tile)
    sms = positive_int("sms", sms)
    if cluster > sms:
        raise ValueError(f"tile: a tile spread over {cluster} SMs needs at least that many, the device has {sms}")
    return TileWaves(positive_int("m", m), positive_int("n", n), tile_m, tile_n, sms, cluster)


def wave_steps(lo: int, hi: int, fixed: int, *, vary: str, tile: Sequence[int] = (128, 128),
               sms: int = 132) -> list[int]:
    """The sizes in (lo, hi] at which one more wave starts, as ``vary`` ('m' or 'n') grows with the other fixed.

    Each is the first size whose tiles no longer fit in the waves of the size before: a step down in rate.
    """
    if vary not in ("m", "n"):
        raise ValueError(f"vary: must be 'm' or 'n', got {vary!r}")
    lo, hi, fixed = positive_int("lo", lo), positive_int("hi", hi), positive_int("fixed", fixed)

    def waves(x):
        return tile_waves(x, fixed, tile, sms).waves if vary == "m" else tile_waves(fixed, x, tile, sms).waves

    return [x for x in range(lo + 1, hi + 1) if waves(x) > waves(x - 1)]


def measured_drops(rows: Sequence[dict], x: str, threshold: float = 0.04) -> list[dict]:
    """Where a measured rate falls, per dtype: each point more than ``threshold`` (a fraction) below the one before."""
    drops = []
    good = ok_rows(rows)
    for dtype in dict.fromkeys(r["dtype"] for r in good):
        series = sorted((r for r in good if r["dtype"] == dtype), key=lambda r: r[x])
        for before, after in zip(series, series[1:], strict=False):
            if after["tflops"] < (1 - threshold) * before["tflops"]:
                drops.append({"dtype": dtype, x: after[x], "from": before[x],
                              "drop": 1 - after["tflops"] / before["tflops"]})
    return drops


def step_agreement(rows: Sequence[dict], x: str, *, vary: str, tile: Sequence[int], sms: int,
                   threshold: float = 0.04) -> list[dict]:
    """Per dtype: how many of the model's wave steps show as a measured drop, and how many drops it explains.

    A predicted step at s is *seen* if the rate falls by more than ``threshold`` between the last
    measured size below s and the first at or above it.
    """
    good = ok_rows(rows)
    summary = []
    for dtype in dict.fromkeys(r["dtype"] for r in good):
        series = sorted((r for r in good if r["dtype"] == dtype), key=lambda r: r[x])
        fixed = series[0]["N"] if vary == "m" else series[0]["M"]
        steps = wave_steps(series[0][x], series[-1][x], fixed, vary=vary, tile=tile, sms=sms)
        drops = {d[x] for d in measured_drops(series, x, threshold)}
        seen = [s for s in steps if min(r[x] for r in series if r[x] >= s) in drops]
        summary.append({"dtype": dtype, "tile": tile_label(tile), "predicted": len(steps), "seen": len(seen),
                        "drops": len(drops), "explained": len(seen) / len(drops) if drops else 0.0,
                        "steps": steps})
    return summary


# ---------------------------------------------------------------------------------------------
# Measuring a linear layer's forward GEMM


def measure_linear(batch: int, inputs: int, outputs: int, dtype: str = "float16",
                   device: torch.device | None = None, repeats: int | None = None) -> dict:
    """Check, then time, a linear layer's forward GEMM Y = X W^T as nn.Linear computes it (no bias).

    X is batch x inputs and W is outputs x inputs, both contiguous (nn.Linear's layout), so cuBLAS
    runs M = outputs, N = batch, K = inputs. Returns a row with the time and TFLOP/s.
    """
    device = device or env.device()
    batch, inputs = positive_int("batch", batch), positive_int("inputs", inputs)
    outputs = positive_int("outputs", outputs)
    label = supported_dtype("dtype", dtype, device)
    if label == "float64":
        raise ValueError("dtype: the layer is measured in float32, tf32, float16 or bfloat16; float64 is the reference")
    size = flops.bytes_per_element(label)
    fits_in_memory("batch", (batch * inputs + outputs * inputs + batch * outputs) * size + outputs * inputs * 8, device)
    repeats = repeats or (GPU_REPEATS if device.type == "cuda" else CPU_REPEATS)
    with matmul_mode(label) as torch_dtype:
        X = random_tensor((batch, inputs), torch_dtype, device) / math.sqrt(inputs)  # keeps |Y| near 1 in float16
        W = random_tensor((outputs, inputs), torch_dtype, device)
        Y = poisoned((batch, outputs), torch_dtype, device)
        forward = _forward_gemm(X, W, Y)
        rows = torch.randperm(batch, device=device)[:CHECK_ROWS]
        error = check_close(forward()[rows], X[rows].double() @ W.double().T, MATMUL_TOLERANCE[label],
                            f"linear layer {batch}x{inputs} -> {outputs} in {label}")
        measured = timing.measure(forward, device=device, repeats=repeats)
    work = 2 * batch * inputs * outputs
    return {"batch": batch, "inputs": inputs, "outputs": outputs, "dtype": label, "M": outputs, "N": batch,
            "K": inputs, "seconds": measured.median_s, "spread": measured.spread, "flops": work,
            "tflops": work / measured.median_s / 1e12, "relative_error": error}


def _forward_gemm(X: torch.Tensor, W: torch.Tensor, Y: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch.mm(X, W.T, out=Y)


@experiment("mlp_fc_batch_sweep")
def fc_batch_sweep(batches: Sequence[int], inputs: int, outputs: int, dtypes: Sequence[str]) -> list[dict]:
    """The forward GEMM's rate against batch size (NVIDIA's N), inputs and outputs fixed."""
    batches = positive_ints("batches", batches)
    points = [{"batch": b, "inputs": inputs, "outputs": outputs, "dtype": dtype_name(d)} for d in dtypes
              for b in batches]
    return run_sweep(measure_linear, points)


@experiment("mlp_fc_feature_sweep")
def fc_feature_sweep(features: Sequence[int], batch: int, fixed: int, dtypes: Sequence[str]) -> list[dict]:
    """The rate against the number of outputs (NVIDIA's M), then of inputs (K); the other feature count is ``fixed``.

    Each row says which dimension it varies in 'vary' and its value in 'features'.
    """
    features = positive_ints("features", features)
    points = []
    for d in dtypes:
        points += [{"vary": "outputs", "features": f, "batch": batch, "inputs": fixed, "outputs": f,
                    "dtype": dtype_name(d)} for f in features]
        points += [{"vary": "inputs", "features": f, "batch": batch, "inputs": f, "outputs": fixed,
                    "dtype": dtype_name(d)} for f in features]

    def measure(vary, features, **point):
        return measure_linear(**point)

    return run_sweep(measure, points)


@experiment("mlp_alignment", "tensor_alignment")
def alignment_sweep(base: int, sizes: Sequence[int], dtypes: Sequence[str]) -> list[dict]:
    """The multiple-of-8 rule: each of batch, inputs and outputs in turn takes each of ``sizes``, the others ``base``.

    Rows carry 'vary', 'size', 'multiple_of_8' and 'relative', the rate over that dimension's rate at ``base``.
    """
    base, sizes = positive_int("base", base), positive_ints("sizes", sizes)
    if base not in sizes:
        sizes = [base, *sizes]
    points = [{"vary": dim, "size": s, "dtype": dtype_name(d), "batch": base, "inputs": base, "outputs": base, dim: s}
              for d in dtypes for dim in ("batch", "inputs", "outputs") for s in sizes]

    def measure(vary, size, **point):
        return measure_linear(**point)

    rows = run_sweep(measure, points)
    at_base = {(r["vary"], r["dtype"]): r["tflops"] for r in ok_rows(rows) if r["size"] == base}
    for row in rows:
        row["multiple_of_8"] = row["size"] % 8 == 0
        if row["status"] == "ok" and (row["vary"], row["dtype"]) in at_base:
            row["relative"] = row["tflops"] / at_base[row["vary"], row["dtype"]]
    return rows


# ---------------------------------------------------------------------------------------------
# Figures


def predicted_rows(rows: Sequence[dict], x: str, *, tile: Sequence[int], sms: int) -> list[dict]:
    """The tile/wave model's rate at each measured point, per dtype, scaled to that dtype's best measured rate.

    The model predicts the *shape* (the share of the peak the quantization leaves), not the height.
    """
    good = ok_rows(rows)
    predictions = []
    for dtype in dict.fromkeys(r["dtype"] for r in good):
        series = [r for r in good if r["dtype"] == dtype]
        models = [tile_waves(r["M"], r["N"], tile, sms) for r in series]
        best = max(range(len(series)), key=lambda j: series[j]["tflops"])
        scale = series[best]["tflops"] / models[best].efficiency  # the model meets the best measurement
        for r, model in zip(series, models, strict=True):
            predictions.append({x: r[x], "tflops": scale * model.efficiency, "dtype": dtype, "tiles": model.tiles,
                                "waves": model.waves, "efficiency": model.efficiency})
    return predictions


def quantization_figure(rows: Sequence[dict], x: str, *, sms: int, vary: str, title: str, x_title: str,
                        tiles: Sequence[Sequence[int]] = TILE_MODELS, max_markers: int = 12) -> go.Figure:
    """Measured TFLOP/s against ``x`` per dtype, with the tile/wave prediction (dashed) and its wave steps (dotted).

    A menu picks the tile shape of the prediction; every variant is in the figure, so it works in the
    static book. ``vary`` says which GEMM dimension ``x`` is: 'm' (outputs) or 'n' (batch).
    """
    rows = ok_rows(rows)
    fig = go.Figure()
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    colors = {d: plots.PALETTE[i % len(plots.PALETTE)] for i, d in enumerate(dtypes)}
    plots.add_sweep(fig, rows, x, "tflops", color="dtype", name="measured", colors=colors,
                    hover=("batch", "inputs", "outputs", "seconds", "tflops"))
    measured_traces = len(fig.data)
    owners: list[int | None] = [None] * measured_traces  # None: always shown
    menus_layout = []
    lo, hi = min(r[x] for r in rows), max(r[x] for r in rows)
    fixed = rows[0]["N"] if vary == "m" else rows[0]["M"]
    for i, tile in enumerate(tiles):
        predicted = predicted_rows(rows, x, tile=tile, sms=sms)
        before = len(fig.data)
        plots.add_sweep(fig, predicted, x, "tflops", color="dtype", name=f"model, {tile_label(tile)}:", dash="dash",
                        colors=colors, hover=("tiles", "waves", "efficiency"))
        for trace in fig.data[before:]:
            trace.visible = i == 0
            trace.mode = "lines"
        owners += [i] * (len(fig.data) - before)
        steps = wave_steps(lo, hi, fixed, vary=vary, tile=tile, sms=sms)[:max_markers]
        shapes = [dict(type="line", x0=s, x1=s, y0=0, y1=1, yref="paper", line=dict(dash="dot", color="#444444"))
                  for s in steps]
        notes = [dict(x=s, y=1.0, yref="paper", text=f"wave {k + 2}", showarrow=False, xanchor="left",
                      yanchor="top", xshift=2, font=dict(size=10), bgcolor="rgba(255,255,255,0.8)")
                 for k, s in enumerate(steps)]
        menus_layout.append((f"model: {tile_label(tile)}", shapes, notes))
    buttons = [dict(label=label, method="update",
                    args=[{"visible": [o is None or o == i for o in owners]}, {"shapes": shapes, "annotations": notes}])
               for i, (label, shapes, notes) in enumerate(menus_layout)]
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title="TFLOP/s", shapes=menus_layout[0][1],
                      annotations=menus_layout[0][2],
                      updatemenus=[dict(buttons=buttons, x=0.0, y=1.14, xanchor="left", direction="down")],
                      margin=dict(t=100))
    return fig


def alignment_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Rate relative to the base size, per varied dimension and size, one bar per dtype."""
    good = [r for r in ok_rows(rows) if "relative" in r]
    categories: dict[str, dict] = {}
    for r in good:
        key = f"{r['vary']} = {r['size']}" + ("" if r["multiple_of_8"] else " (not x8)")
        categories.setdefault(key, {"shape": key})[r["dtype"]] = r["relative"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in good))
    fig = plots.bars_figure(list(categories.values()), "shape", {d: d for d in dtypes}, title=title,
                            y_title="rate relative to the base size")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#444444")
    return fig


def loss_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Training loss and accuracies against epoch."""
    fig = plots.sweep_figure(rows, "epoch", "loss", name="training loss", title=title, x_title="epoch",
                             y_title="mean cross-entropy", hover=("epoch", "loss", "train_accuracy", "test_accuracy"))
    for key, name in (("train_accuracy", "training accuracy"), ("test_accuracy", "test accuracy")):
        fig.add_trace(go.Scatter(x=[r["epoch"] for r in rows], y=[r[key] for r in rows], name=name, yaxis="y2",
                                 mode="lines", line=dict(dash="dash")))
    fig.update_layout(yaxis2=dict(title="accuracy", overlaying="y", side="right", range=[0, 1.02], showgrid=False),
                      legend=dict(x=0.55, y=0.5))
    return fig
