"""Lab 03's graders (``gpulab.labs.lab03_backprop_is_gemm``): each gradient against autograd with its usual
mistakes named, the FLOP of a training step against FlopCounterMode, the arithmetic intensity and the prediction."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from gpulab.labs import grading
from gpulab.labs import lab03_backprop_is_gemm as lab03
from gpulab.labs.grading import NOT_ANSWERED

BATCH, INPUTS, HIDDEN, OUTPUTS = 12, 20, 16, 10


def graded(check, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(grading.Grader(strict=False), *args)
    return " ".join(out.getvalue().split())  # the lines are wrapped at 90 characters: compare the words


def linear(X, W, dY):
    return dY @ W.T, X.T @ dY, dY.sum(dim=0)


def relu(Z, dA):
    return dA * (Z > 0)


def test_the_right_linear_gradients_pass_and_a_stub_is_not_answered():
    assert lab03.linear_problems(linear, BATCH, INPUTS, OUTPUTS) == {"dX": "", "dW": "", "db": ""}
    for stub in (lambda X, W, dY: None, lambda X, W, dY: (None, None, None)):
        assert set(lab03.linear_problems(stub, BATCH, INPUTS, OUTPUTS).values()) == {NOT_ANSWERED}
    assert graded(lab03.check_linear_backward, linear, BATCH, INPUTS, OUTPUTS).count("PASS") == 3


@pytest.mark.parametrize(("mistake", "said"), [
    (lambda X, W, dY: (W @ dY.T, X.T @ dY, dY.sum(0)), {"dX": "transposed: dX is shaped like X"}),
    (lambda X, W, dY: (dY @ W.T, dY.T @ X, dY.sum(0)), {"dW": "transposed: dY.T @ X is outputs x inputs"}),
    (lambda X, W, dY: (dY @ W.T, X.T @ dY / X.shape[0], dY.mean(0)),
     {"dW": "divided by the batch", "db": "that is the mean over the batch"}),
    (lambda X, W, dY: (-(dY @ W.T), X.T @ dY, dY.sum(0)), {"dX": "the sign is flipped"}),
    (lambda X, W, dY: (dY @ W.T, X.T @ dY, dY.sum(1)), {"db": "summed over the outputs (dim=1)"}),
    (lambda X, W, dY: (dY @ W.T, X.T @ dY, dY.sum()), {"db": "summed everything into one number"}),
    (lambda X, W, dY: (dY @ W.T, X.T @ dY, dY), {"db": "that is dY itself"}),
    (lambda X, W, dY: (dY @ W.T, X.T @ dY, dY.sum(0, keepdim=True)), {"db": "keepdim=True leaves a row"}),
])
def test_a_wrong_linear_gradient_is_named(mistake, said):
    problems = lab03.linear_problems(mistake, BATCH, INPUTS, OUTPUTS)
    for name, problem in problems.items():
        assert (said[name] in problem) if name in said else problem == "", (name, problem)


def test_a_product_of_mismatched_shapes_or_a_lone_tensor_is_named():
    problems = lab03.linear_problems(lambda X, W, dY: (dY @ W, X.T @ dY, dY.sum(0)), BATCH, INPUTS, OUTPUTS)
    assert "a product of mismatched shapes (12x10 and 20x10)" in problems["dX"] and "Traceback" not in problems["dX"]
    assert "see dX" in problems["dW"]
    assert "expected three gradients" in lab03.linear_problems(lambda X, W, dY: dY @ W.T, BATCH, INPUTS,
                                                              OUTPUTS)["dX"]


@pytest.mark.parametrize(("mistake", "said"), [
    (relu, "PASS ReLU gradient"),
    (lambda Z, dA: dA * (Z >= 0), "use Z > 0, not Z >= 0"),
    (lambda Z, dA: torch.relu(dA), "the mask comes from Z"),
    (lambda Z, dA: dA * torch.relu(Z), "multiplied by relu(Z)"),
    (lambda Z, dA: dA * Z, "multiplied by Z"),
    (lambda Z, dA: dA * (Z < 0), "the wrong way round"),
    (lambda Z, dA: dA, "that is dA unchanged"),
    (lambda Z, dA: Z > 0, "that is the mask alone"),
    (lambda Z, dA: None, NOT_ANSWERED),
])
def test_the_relu_gradient(mistake, said):
    assert said in graded(lab03.check_relu_backward, mistake, BATCH, HIDDEN)


def mlp(linear_backward=linear, relu_backward=relu, layer2_input="A1", skip_relu=False):
    def backward(cache, W1, W2, dZ2):
        X, Z1, A1 = cache
        dA1, dW2, db2 = linear_backward(A1 if layer2_input == "A1" else Z1, W2, dZ2)
        dZ1 = dA1 if skip_relu else relu_backward(Z1, dA1)
        _, dW1, db1 = linear_backward(X, W1, dZ1)
        return {"W1": dW1, "b1": db1, "W2": dW2, "b2": db2}

    return backward


def problems(backward, *parts):
    return lab03.mlp_problems(backward, BATCH, INPUTS, HIDDEN, OUTPUTS, *parts)


def test_the_mlp_gradients():
    assert problems(mlp()) == {2: "", 1: ""}
    assert problems(lambda *args: None) == {2: NOT_ANSWERED, 1: NOT_ANSWERED}
    skipped = problems(mlp(skip_relu=True))
    assert skipped[2] == "" and skipped[1].startswith("W1: the values are wrong: the ReLU was skipped")
    z1 = problems(mlp(layer2_input="Z1"))
    assert "layer 2's input is A1 = relu(Z1)" in z1[2] and z1[1] == ""
    assert "expected a dict of the gradients" in problems(lambda *args: (1, 2))[2]
    without_b1 = problems(lambda *args: {k: v for k, v in mlp()(*args).items() if k != "b1"})
    assert without_b1[2] == "" and "the dict has no 'b1'" in without_b1[1]


def test_a_wrong_exercise_1_is_named_first():
    mean = lambda X, W, dY: (dY @ W.T, X.T @ dY / X.shape[0], dY.mean(0))  # noqa: E731
    wrong = problems(mlp(linear_backward=mean), mean, relu)
    assert wrong[2].endswith("your linear_backward of exercise 1 does not pass yet: fix it first")
    never = problems(mlp(relu_backward=lambda Z, dA: dA), linear, lambda Z, dA: dA)
    assert never[1].endswith("your relu_backward of exercise 2 does not pass yet: fix it first")


def step_flops(sizes, batch):
    return sum((2 if layer == 1 else 3) * 2 * batch * sizes[layer - 1] * sizes[layer]
               for layer in range(1, len(sizes)))


def forward_flops(sizes, batch):
    return sum(2 * batch * a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


@pytest.fixture(scope="module")
def counted():
    return lab03.flop_counts()


@pytest.mark.parametrize(("count", "said"), [
    (step_flops, "PASS training_step_flops([784, 16, 10], 10)"),
    (lambda s, b: 3 * forward_flops(s, b), "that counts the first layer's activation gradient too"),
    (lambda s, b: 2 * forward_flops(s, b), "leaves out the activation-gradient GEMMs"),
    (forward_flops, "that is the forward pass alone"),
    (lambda s, b: step_flops(s, b) // 2, "a multiply-add is 2 FLOP"),
    (lambda s, b: 3 * forward_flops(s, b) - 2 * b * s[-2] * s[-1], "it is the first layer that skips dX"),
    (lambda s, b: None, NOT_ANSWERED),
])
def test_the_flop_of_a_training_step(counted, count, said):
    assert said in graded(lab03.check_training_step_flops, count, counted)


def test_flopcountermode_counts_what_the_lab_teaches(counted):
    assert [row["total"] for row in counted] == [step_flops(row["sizes"], row["batch"]) for row in counted]


def intensity(batch, inputs, outputs, size):
    return 2 * batch * inputs * outputs / ((batch * inputs + inputs * outputs + batch * outputs) * size)


@pytest.mark.parametrize(("formula", "said"), [
    (intensity, "PASS gemm_intensity"),
    (lambda b, i, o, s: 2 * b * i * o / (b * i + i * o + b * o), "that counts elements, not bytes"),
    (lambda b, i, o, s: 2 * b * i * o / ((b * i + i * o) * s), "the output Y is written to memory too"),
    (lambda b, i, o, s: 2 * b * i * o / ((b * i + i * o + 2 * b * o) * s), "count it once"),
    (lambda b, i, o, s: 2 * b * i * o / (i * o * s), "that counts the weights alone"),
    (lambda b, i, o, s: 1 / intensity(b, i, o, s), "that is bytes per FLOP"),
    (lambda b, i, o, s: b * i * o / ((b * i + i * o + b * o) * s), "a multiply-add is 2 FLOP"),
    (lambda b, i, o, s: b * i * o / (b * i + i * o + b * o), "with 2-byte elements the two mistakes cancel"),
    (lambda b, i, o, s: None, NOT_ANSWERED),
])
def test_the_arithmetic_intensity(formula, said):
    assert said in graded(lab03.check_gemm_intensity, formula)


@pytest.mark.parametrize(("prediction", "said"), [
    ("batched", "PASS your prediction"),
    ("one at a time", "you predicted 'one at a time', but per sample, a batch of 512 took 0.10 µs"),
    ("batch", "PREDICTION is 'batch': set it to 'one at a time' or 'batched'"),
    (None, NOT_ANSWERED),
])
def test_the_prediction(prediction, said):
    assert said in graded(lab03.check_prediction, prediction, {1: 2e-5, 512: 1e-7})
