"""Graders of the lab "Backpropagation is GEMM" (``labs/03_backprop_is_gemm.ipynb``): a linear layer's three
gradients, the ReLU's, a two-layer MLP's backward pass, the FLOP of a training step and the arithmetic intensity
of a layer, each on fresh data against autograd or ``FlopCounterMode``. A wrong tensor is told apart from the
usual mistakes: a transposed product, a sum over the wrong axis, a mean for a sum, a sign, a mask from the wrong
tensor or with Z >= 0, a skipped ReLU, Z1 for A1; a wrong count from 3 GEMMs in every layer, the forward pass
alone, multiply-adds for FLOP, elements for bytes, a forgotten output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from gpulab.ch04_mlp_gemms import mlp
from gpulab.core import flops
from gpulab.core.tables import Column
from gpulab.labs.grading import NOT_ANSWERED, Grader, Mistake, attempt, number_problem, shown, tensor_problem

TOLERANCE = 1e-10  # relative error allowed of a float64 gradient


def _mismatched(error: Exception) -> str:
    """A product of mismatched shapes, named: the lab's sizes all differ, so a wrong product fails."""
    text = str(error)
    if isinstance(error, RuntimeError) and ("cannot be multiplied" in text or "size of tensor" in text
                                            or "must match the size" in text):
        shapes = f" {text[text.find('('):text.find(')') + 1]}" if "(" in text else ""
        return (f"a product of mismatched shapes{shapes}: let the shapes guide you, an (a x b) matrix multiplies "
                "a (b x c) one; transpose the operand whose shape is the wrong way round (.T)")
    return ""


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fresh(generator: torch.Generator, *shape: int) -> torch.Tensor:
    """Standard-normal float64 numbers (never zeros: zeros hide a wrong formula)."""
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


def _distinct(**sizes: int) -> None:
    if len(set(sizes.values())) != len(sizes):
        raise ValueError(f"sizes: all different, so that a transposed product fails; got {sizes}")


# --- exercise 1: the backward GEMMs of a linear layer -------------------------------------------------------------

LINEAR_HINTS = {
    "dX": "dX_ik = sum_j dY_ij W_kj: that is dY @ W.T, shape batch x inputs",
    "dW": "dW_kj = sum_i X_ik dY_ij: that is X.T @ dY, shape inputs x outputs",
    "db": "b_j is added to every sample's Y_ij, so db_j = sum over i of dY_ij: dY.sum(dim=0)",
}


def autograd_linear(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor, dY: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """PyTorch's answer: dL/dX, dL/dW and dL/db of Y = X W + b, given dL/dY."""
    X, W, b = (t.clone().requires_grad_() for t in (X, W, b))
    (X @ W + b).backward(dY)
    return X.grad, W.grad, b.grad


def linear_mistakes(X: torch.Tensor, W: torch.Tensor, dY: torch.Tensor) -> dict[str, tuple[dict, dict]]:
    """Per gradient: ({hint: the wrong tensor a mistake computes}, {wrong shape: hint})."""
    batch, inputs, outputs = X.shape[0], X.shape[1], W.shape[1]
    mean = "divided by the batch: the gradient sums over the samples (a loss's 1/batch is already in dY)"
    sign = "the sign is flipped: the gradient is +, the minus belongs to the descent step"
    return {
        "dX": ({sign: -(dY @ W.T), mean: dY @ W.T / batch},
               {(inputs, batch): "transposed: dX is shaped like X, (batch x outputs) @ (outputs x inputs) = "
                                 "dY @ W.T"}),
        "dW": ({sign: -(X.T @ dY), mean: X.T @ dY / batch},
               {(outputs, inputs): "transposed: dY.T @ X is outputs x inputs; dW is shaped like W: X.T @ dY"}),
        "db": ({sign: -dY.sum(0), "that is the mean over the batch: the bias gradient is the sum, "
                                  "dY.sum(dim=0)": dY.mean(0)},
               {(batch,): "summed over the outputs (dim=1): the bias gradient sums over the batch, dim=0",
                (): "summed everything into one number: sum over the batch only, dim=0",
                (batch, outputs): "that is dY itself: each b_j collects the sum over the batch of dY_ij",
                (1, outputs): "keepdim=True leaves a row; the bias is a vector of shape (outputs,)"}),
    }


def _three(got: object) -> tuple[tuple[object, ...], str]:
    if isinstance(got, tuple | list) and len(got) == 3:
        return tuple(got), ""
    if got is None or (isinstance(got, tuple | list) and all(part is None for part in got)):
        return (None, None, None), ""
    return (None, None, None), f"returned {shown(got)}, expected three gradients (dX, dW, db)"


def linear_problems(linear_backward: Callable, batch: int, inputs: int, outputs: int, seed: int = 0
                    ) -> dict[str, str]:
    """{'dX' | 'dW' | 'db': '' if right, else what is wrong} for ``linear_backward(X, W, dY)`` on fresh data."""
    _distinct(batch=batch, inputs=inputs, outputs=outputs)
    generator = seeded(seed)
    X, W, b, dY = (fresh(generator, batch, inputs), fresh(generator, inputs, outputs), fresh(generator, outputs),
                   fresh(generator, batch, outputs))
    reference = dict(zip(("dX", "dW", "db"), autograd_linear(X, W, b, dY), strict=True))
    got, problem = attempt(lambda: linear_backward(X.clone(), W.clone(), dY.clone()), _mismatched)
    parts, problem = _three(got) if not problem else ((None, None, None), problem)
    if problem:
        return {"dX": problem, **dict.fromkeys(("dW", "db"), "not checked: linear_backward stopped before "
                                                             "returning (see dX)" if problem != NOT_ANSWERED
                                                else NOT_ANSWERED)}
    mistakes = linear_mistakes(X, W, dY)
    return {name: tensor_problem(part, reference[name], TOLERANCE, *mistakes[name])
            for name, part in zip(("dX", "dW", "db"), parts, strict=True)}


def check_linear_backward(grader: Grader, linear_backward: Callable, batch: int, inputs: int, outputs: int) -> None:
    """Exercise 1: dX, dW and db of ``linear_backward(X, W, dY)`` against autograd's."""
    for name, problem in linear_problems(linear_backward, batch, inputs, outputs).items():
        grader.record(f"linear layer {name} equals autograd's", problem, LINEAR_HINTS[name])


# --- exercise 2: through a ReLU ---------------------------------------------------------------------------------

RELU_HINT = "the gradient passes unchanged where Z > 0 and is 0 elsewhere: dA * (Z > 0)"


def relu_data(batch: int, hidden: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Z (with a few exact zeros, where ReLU's gradient is 0 by convention), dA, and autograd's dZ."""
    generator = seeded(seed)
    Z, dA = fresh(generator, batch, hidden), fresh(generator, batch, hidden)
    Z.view(-1)[::7] = 0.0
    leaf = Z.clone().requires_grad_()
    torch.relu(leaf).backward(dA)
    return Z, dA, leaf.grad


def relu_mistakes(Z: torch.Tensor, dA: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "at Z = 0 ReLU's gradient is taken as 0, as PyTorch does: use Z > 0, not Z >= 0": dA * (Z >= 0),
        "the mask comes from Z, the forward input, not from the sign of dA": torch.relu(dA),
        "multiplied by relu(Z), the forward output: the derivative is 1 where Z > 0, not Z": dA * torch.relu(Z),
        "multiplied by Z: the derivative of max(0, Z) is 1 or 0, not Z": dA * Z,
        "the mask is the wrong way round: the gradient passes where Z > 0": dA * (Z < 0),
        "that is dA unchanged: set it to 0 where Z <= 0": dA,
        "that is the mask alone: multiply dA by it": (Z > 0).double(),
    }


def check_relu_backward(grader: Grader, relu_backward: Callable, batch: int, hidden: int) -> None:
    """Exercise 2: ``relu_backward(Z, dA)`` against autograd's, with zeros in Z."""
    Z, dA, reference = relu_data(batch, hidden)
    got, problem = attempt(lambda: relu_backward(Z.clone(), dA.clone()))
    grader.record("ReLU gradient equals autograd's",
           problem or tensor_problem(got, reference, TOLERANCE, relu_mistakes(Z, dA)), RELU_HINT)


# --- exercise 3: a whole MLP ------------------------------------------------------------------------------------

MLP_HINTS = {
    2: "layer 2 is a linear layer whose input is A1 and whose dY is dZ2: linear_backward(A1, W2, dZ2)",
    1: "take layer 2's dX (the gradient for A1), pass it through relu_backward with Z1, then "
       "linear_backward(X, W1, that gradient)",
}
KEYS = ("W1", "b1", "W2", "b2")


def mlp_data(batch: int, inputs: int, hidden: int, outputs: int, seed: int = 2) -> dict:
    """A two-layer MLP on fresh data: its parameters, the cache (X, Z1, A1), dZ2 and autograd's gradients."""
    generator = seeded(seed)
    params = {"W1": fresh(generator, inputs, hidden), "b1": fresh(generator, hidden),
              "W2": fresh(generator, hidden, outputs), "b2": fresh(generator, outputs)}
    X, labels = fresh(generator, batch, inputs), torch.randint(0, outputs, (batch,), generator=generator)

    def forward(p: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        Z1 = X @ p["W1"] + p["b1"]
        A1 = torch.relu(Z1)
        return Z1, A1, A1 @ p["W2"] + p["b2"]

    Z1, A1, scores = forward(params)
    _, dZ2 = mlp.softmax_cross_entropy(scores, labels)
    leaves = {name: value.clone().requires_grad_() for name, value in params.items()}
    F.cross_entropy(forward(leaves)[2], labels).backward()
    return {"params": params, "cache": (X, Z1, A1), "dZ2": dZ2, "reference": {k: v.grad for k, v in leaves.items()}}


def mlp_mistakes(data: dict) -> dict[str, dict[str, torch.Tensor]]:
    """Per gradient, {hint: the wrong tensor a mistake computes}."""
    (X, Z1, _), dZ2, W2 = data["cache"], data["dZ2"], data["params"]["W2"]
    dA1 = dZ2 @ W2.T
    no_relu = "the ReLU was skipped: pass layer 2's dX through relu_backward(Z1, ...) before layer 1"
    return {"W2": {"layer 2's input is A1 = relu(Z1), the ReLU's output, not Z1": Z1.T @ dZ2},
            "b2": {},
            "W1": {no_relu: X.T @ dA1},
            "b1": {no_relu: dA1.sum(0)}}


def _parts_problem(linear_backward: Callable | None, relu_backward: Callable | None, sizes: tuple[int, ...]) -> str:
    """What to fix first, if the student's exercise 1 or 2 is not right yet ('' if both are, or unknown)."""
    if linear_backward is not None and any(linear_problems(linear_backward, *sizes).values()):
        return "; your linear_backward of exercise 1 does not pass yet: fix it first"
    if relu_backward is not None:
        Z, dA, reference = relu_data(sizes[0], sizes[2])
        got, problem = attempt(lambda: relu_backward(Z.clone(), dA.clone()))
        if problem or tensor_problem(got, reference, TOLERANCE):
            return "; your relu_backward of exercise 2 does not pass yet: fix it first"
    return ""


def mlp_problems(mlp_backward: Callable, batch: int, inputs: int, hidden: int, outputs: int,
                 linear_backward: Callable | None = None, relu_backward: Callable | None = None) -> dict[int, str]:
    """{2: layer 2's problem, 1: layer 1's} ('' if right) of ``mlp_backward(cache, W1, W2, dZ2)``, which must
    return a dict of the gradients W1, b1, W2, b2."""
    _distinct(batch=batch, inputs=inputs, hidden=hidden, outputs=outputs)
    data = mlp_data(batch, inputs, hidden, outputs)
    cache = tuple(t.clone() for t in data["cache"])
    got, problem = attempt(lambda: mlp_backward(cache, data["params"]["W1"].clone(), data["params"]["W2"].clone(),
                                                data["dZ2"].clone()), _mismatched)
    if not problem and got is None:
        problem = NOT_ANSWERED
    if not problem and not isinstance(got, Mapping):
        problem = f"returned {shown(got)}, expected a dict of the gradients W1, b1, W2, b2"
    if not problem and all(got.get(k) is None for k in KEYS):
        problem = NOT_ANSWERED
    if problem:
        return {2: problem, 1: problem}
    mistakes = mlp_mistakes(data)
    problems = {}
    for layer in (2, 1):
        found = ""
        for key in (f"W{layer}", f"b{layer}"):
            if key not in got:
                found = f"the dict has no {key!r}: return the four gradients under the keys W1, b1, W2, b2"
                break
            wrong = tensor_problem(got[key], data["reference"][key], TOLERANCE, mistakes[key])
            if wrong:
                found = f"{key}: {wrong}"
                break
        sizes = (batch, inputs, hidden)
        problems[layer] = found + (_parts_problem(linear_backward, relu_backward, sizes) if found else "")
    return problems


def check_mlp_backward(grader: Grader, mlp_backward: Callable, batch: int, inputs: int, hidden: int, outputs: int,
                       linear_backward: Callable | None = None, relu_backward: Callable | None = None) -> None:
    """Exercise 3: the gradients of layer 2, then of layer 1, against autograd's (with exercise 1 and 2's
    functions, if given, checked first when a layer is wrong)."""
    problems = mlp_problems(mlp_backward, batch, inputs, hidden, outputs, linear_backward, relu_backward)
    grader.record("layer 2 gradients (W2, b2) equal autograd's", problems[2], MLP_HINTS[2])
    grader.record("layer 1 gradients (W1, b1) equal autograd's", problems[1], MLP_HINTS[1])


# --- exercise 4: the FLOP of a training step --------------------------------------------------------------------

STEP_CASES = (([784, 16, 10], 10), ([64, 128, 64, 10], 32))
STEP_HINT = ("per layer: forward and weight gradient, 2 x batch x inputs x outputs each; the activation gradient "
             "too, except in the first layer")


def flop_counts(cases: Sequence[tuple[list[int], int]] = STEP_CASES) -> list[dict]:
    """What ``FlopCounterMode`` counts in a training step of each MLP (nn.Linear layers, cross-entropy loss)."""
    rows = []
    for sizes, batch in cases:
        counted = mlp.flop_counter_totals(mlp.torch_mlp(sizes), torch.randn(batch, sizes[0]),
                                          torch.randint(0, sizes[-1], (batch,)))
        rows.append({"mlp": " -> ".join(map(str, sizes)), "sizes": list(sizes), "batch": batch, **counted})
    return rows


COUNT_COLUMNS = [Column("mlp", "MLP"), Column("batch", "batch"), Column("forward", "forward", "FLOP"),
                 Column("backward", "backward", "FLOP"), Column("total", "training step", "FLOP")]


def step_mistakes(sizes: Sequence[int], batch: int) -> list[Mistake]:
    gemm = [2 * batch * a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    return [
        Mistake("that counts the first layer's activation gradient too: its input is the data, which needs no "
                "gradient, so it has 2 GEMMs and the layers above 3", value=3 * sum(gemm), rel=1e-9),
        Mistake("that leaves out the activation-gradient GEMMs (dX) of the layers above the first",
                value=2 * sum(gemm), rel=1e-9),
        Mistake("that is the forward pass alone: a training step adds the backward GEMMs", value=sum(gemm),
                rel=1e-9),
        Mistake("it is the first layer that skips dX (its input is the data), not the last",
                value=3 * sum(gemm) - gemm[-1], rel=1e-9),
        Mistake("a multiply-add is 2 FLOP: each GEMM is 2 x batch x inputs x outputs", factor=0.5, rel=1e-9),
    ]


def check_training_step_flops(grader: Grader, training_step_flops: Callable, counted: Sequence[dict]) -> None:
    """Exercise 4: ``training_step_flops(sizes, batch)`` equals ``FlopCounterMode``'s count exactly (rows of
    :func:`flop_counts`)."""
    for row in counted:
        sizes, batch = row["sizes"], row["batch"]
        got, problem = attempt(lambda sizes=sizes, batch=batch: training_step_flops(list(sizes), batch))
        problem = problem or number_problem(got, row["total"], 0, step_mistakes(sizes, batch))
        grader.record(f"training_step_flops({sizes}, {batch})", problem, STEP_HINT)


# --- exercise 5: arithmetic intensity, and one sample at a time or a batch ---------------------------------------

INTENSITY_CASES = ((256, 4096, 4096, 2), (1, 1024, 1024, 4))  # float16 on a batch, float32 one sample at a time
INTENSITY_HINT = ("FLOP = 2 x batch x inputs x outputs; bytes = (batch x inputs + inputs x outputs + batch x "
                  "outputs) x bytes per element")


def intensity_mistakes(batch: int, inputs: int, outputs: int, size: int) -> list[Mistake]:
    work, x, w, y = 2 * batch * inputs * outputs, batch * inputs, inputs * outputs, batch * outputs
    return [
        Mistake("that counts elements, not bytes: multiply them by bytes_per_element", value=work / (x + w + y)),
        Mistake("the output Y is written to memory too: count its bytes", value=work / ((x + w) * size)),
        Mistake("the output Y is only written (no bias or beta here): count it once", value=work / ((x + w + 2 * y)
                                                                                                  * size)),
        Mistake("that counts the weights alone: X is read and Y written too", value=work / (w * size)),
        Mistake("that is bytes per FLOP: intensity is FLOP / bytes", value=(x + w + y) * size / work),
        Mistake("a multiply-add is 2 FLOP: the work is 2 x batch x inputs x outputs", factor=0.5),
        Mistake("that counts multiply-adds (each is 2 FLOP) and elements (not bytes): with 2-byte elements the "
                "two mistakes cancel, with 4-byte ones they do not", value=work / 2 / (x + w + y)),
    ]


def check_gemm_intensity(grader: Grader, gemm_intensity: Callable) -> None:
    """Exercise 5a: ``gemm_intensity`` of a 4096 x 4096 float16 layer on a batch of 256, and of a 1024 x 1024
    float32 layer on one sample (two cases, so that two mistakes that cancel in one do not pass)."""
    problem = ""
    for batch, inputs, outputs, size in INTENSITY_CASES:
        expected = flops.gemm(batch, outputs, inputs, "float16" if size == 2 else "float32").intensity
        got, problem = attempt(lambda b=batch, i=inputs, o=outputs, s=size: gemm_intensity(b, i, o, s))
        problem = problem or number_problem(got, expected, 1e-9, intensity_mistakes(batch, inputs, outputs, size))
        if problem:
            if problem != NOT_ANSWERED:
                problem = f"gemm_intensity({batch}, {inputs}, {outputs}, {size}) {problem}"
            break
    grader.record("gemm_intensity of a batch of 256 in float16 and of one sample in float32", problem,
           INTENSITY_HINT)


CHOICES = ("one at a time", "batched")
PREDICTION_HINT = ("with one sample each weight, read from memory, is used once; with a batch it is reused for every "
                   "sample, so the GEMM stops waiting for memory. Set PREDICTION to 'one at a time' or 'batched'")


def check_prediction(grader: Grader, prediction: object, per_sample: Mapping[int, float]) -> None:
    """Exercise 5b: ``prediction`` names the faster way per sample, as ``per_sample`` ({batch: seconds per
    sample}) measured it."""
    small, large = min(per_sample), max(per_sample)
    faster = "batched" if per_sample[large] < per_sample[small] else "one at a time"
    measured = (f"per sample, a batch of {large} took {per_sample[large] * 1e6:,.2f} µs and a batch of {small} "
                f"{per_sample[small] * 1e6:,.2f} µs")
    if prediction is None:
        problem = NOT_ANSWERED
    elif prediction not in CHOICES:
        problem = f"PREDICTION is {prediction!r}: set it to 'one at a time' or 'batched'"
    else:
        problem = "" if prediction == faster else f"you predicted {prediction!r}, but {measured}"
    grader.record("your prediction matches the measurement", problem, PREDICTION_HINT)


MEASURE_COLUMNS = [Column("batch", "batch"), Column("call", "per call", "µs", ",.1f"),
                   Column("sample", "per sample", "µs", ",.2f"), Column("gflops", "rate", "GFLOP/s", ",.1f"),
                   Column("intensity", "your intensity", "FLOP/byte", ".1f")]
