"""Lab 05's graders (``gpulab.labs.lab05_lstm_by_hand``): the worked LSTM against the slides, forward and backward,
the weight gradients against the slides and autograd, and the one-GEMM cell against nn.LSTMCell; each usual
mistake named by the arithmetic that gives the student's numbers."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from gpulab.labs import grading
from gpulab.labs import lab05_lstm_by_hand as lab05
from gpulab.labs.grading import NOT_ANSWERED

W, U, b, XS = lab05.TENSORS["W"], lab05.TENSORS["U"], lab05.TENSORS["b"], lab05.TENSORS["x"]


def graded(check, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(grading.Grader(strict=False), *args)
    return " ".join(out.getvalue().split())  # the lines are wrapped at 90 characters: compare the words


def lstm_step(x, out_prev, state_prev):  # the solution, as a student writes it
    a = torch.tanh(W[0] @ x + U[0] * out_prev + b[0])
    i = torch.sigmoid(W[1] @ x + U[1] * out_prev + b[1])
    f = torch.sigmoid(W[2] @ x + U[2] * out_prev + b[2])
    o = torch.sigmoid(W[3] @ x + U[3] * out_prev + b[3])
    state = a * i + f * state_prev
    return {"a": a, "i": i, "f": f, "o": o, "state": state, "out": torch.tanh(state) * o}


def test_the_forward_pass_passes_in_tensors_or_floats():
    assert lab05.lstm_step_problems(lstm_step) == {0: "", 1: ""}
    floats = lambda *args: {k: float(v) for k, v in lstm_step(*args).items()}  # noqa: E731
    assert lab05.lstm_step_problems(floats) == {0: "", 1: ""}
    shown = str(lab05.forward_table(lstm_step))
    assert "t = 1, yours" in shown and "0.81775" in shown and "1.5176" in shown
    assert lab05.forward_table(lambda *args: None) is None


@pytest.mark.parametrize(("keywords", "steps", "said"), [
    (dict(a=torch.sigmoid), (0, 1), "a, the input activation, uses tanh"),
    (dict(gate=torch.tanh), (0, 1), "the sigmoid, not tanh"),
    (dict(recurrent_term=False), (1,), "the recurrent term U_g out_{t-1} is missing"),
    (dict(bias=False), (0, 1), "the bias b_g is missing"),
    (dict(forget="out"), (1,), "not of the previous output"),
    (dict(squash=False), (0, 1), "squash the state before the output gate"),
    (dict(rows=(2, 0, 1, 3)), (0, 1), "not PyTorch's i, f, g, o"),
])
def test_a_wrong_step_is_named(keywords, steps, said):
    problems = lab05.lstm_step_problems(lambda x, o, s: lab05.lstm_step_as(x, o, s, **keywords))
    for t in (0, 1):
        if t in steps:
            assert said in problems[t] and "the slide prints" in problems[t]
        else:
            assert problems[t] == ""


def test_a_stub_or_a_wrong_return_is_not_graded_further():
    assert lab05.lstm_step_problems(lambda *args: None) == {0: NOT_ANSWERED, 1: NOT_ANSWERED}
    tuple_ = lab05.lstm_step_problems(lambda *args: (1, 2))
    assert "expected a dict with the keys a, i, f, o, state, out" in tuple_[0] and "step 0 stopped" in tuple_[1]
    assert "the dict has no 'i'" in lab05.lstm_step_problems(lambda *args: {"a": 1.0})[0]
    out = graded(lab05.check_lstm_step, lstm_step)
    assert "PASS step 0: a, i, f, o, state, out" in out and "PASS step 1" in out


def backward_step(step, y, Delta_out, delta_state_next, f_next):  # the solution
    return lab05.backward_step_as(step, y, Delta_out, delta_state_next, f_next)


@pytest.mark.parametrize(("keywords", "steps", "said"), [
    ({}, (), ""),
    (dict(sign=-1), (1, 0), "the sign is flipped"),
    (dict(tanh_derivative=False), (1, 0), "1 - tanh^2(state)"),
    (dict(carry=False), (0,), "delta state_1 f_1, passed back from step 1"),
    (dict(passed=False), (0,), "delta out_t adds Delta out_t"),
    (dict(forget_prev=False), (1, 0), "delta f_t multiplies state_{t-1}"),
    (dict(o_tanh=False), (1, 0), "delta o_t uses tanh(state_t)"),
    (dict(order=(1, 2, 0, 3)), (1, 0), "the course's order a, i, f, o"),
])
def test_a_wrong_backward_step_is_named(keywords, steps, said):
    problems = lab05.backward_step_problems(lambda *args: lab05.backward_step_as(*args, **keywords))
    for t in (1, 0):
        assert (said in problems[t]) if t in steps else problems[t] == "", (t, problems[t])


def test_a_backward_stub_or_wrong_types():
    assert lab05.backward_step_problems(lambda *args: None) == {1: NOT_ANSWERED, 0: NOT_ANSWERED}
    as_list = lambda *args: {**backward_step(*args), "gates": [0.0] * 4}  # noqa: E731
    assert "gates is a list: return a tensor of 4 numbers" in lab05.backward_step_problems(as_list)[1]
    assert graded(lab05.check_backward_step, backward_step).count("PASS") == 2


def weight_gradients(steps, deltas, shared=(0, 1), out_key="out_prev"):
    pairs = [(deltas[t]["gates"].flatten(), XS[t], steps[t][out_key].flatten()) for t in shared]
    return (sum(torch.outer(g, x) for g, x, _ in pairs), sum(torch.outer(g, o) for g, _, o in pairs),
            sum(g for g, _, _ in pairs))


def test_the_weight_gradients():
    assert lab05.weight_gradient_problems(weight_gradients) == {"slides": "", "autograd": "", "update": ""}
    assert graded(lab05.check_weight_gradients, weight_gradients).count("PASS") == 3
    stub = lab05.weight_gradient_problems(lambda steps, deltas: (None, None, None))
    assert set(stub.values()) == {NOT_ANSWERED}


@pytest.mark.parametrize(("fn", "said", "tensor"), [
    (lambda s, d: weight_gradients(s, d, shared=(1,)), "not the last step's alone", "dW"),
    (lambda s, d: weight_gradients(s, d, shared=(0,)), "not the first step's alone", "dW"),
    (lambda s, d: weight_gradients(s, d, out_key="out"), "by out_{t-1}, the output that step received", "dU"),
    (lambda s, d: tuple(g / 2 for g in weight_gradients(s, d)), "the gradient is their sum", "dW"),
])
def test_a_wrong_weight_gradient_is_named(fn, said, tensor):
    problems = lab05.weight_gradient_problems(fn)
    assert said in problems["slides"] and problems["slides"].startswith(tensor)
    assert problems["autograd"].startswith(f"{tensor}: the values are wrong: ") and said in problems["autograd"]
    assert f"(it follows from {tensor}: fix that first)" in problems["update"]


def test_wrong_shapes_of_the_weight_gradients():
    transposed = lambda s, d: (weight_gradients(s, d)[0].T, *weight_gradients(s, d)[1:])  # noqa: E731
    assert "dW is 2 x 4: transposed?" in lab05.weight_gradient_problems(transposed)["slides"]
    three = lambda s, d: weight_gradients(s, d)[0]  # noqa: E731
    assert "expected three tensors (dW, dU, db)" in lab05.weight_gradient_problems(three)["autograd"]
    flat_dU = lambda s, d: (lambda dW, dU, db: (dW, dU.flatten(), db))(*weight_gradients(s, d))  # noqa: E731
    assert lab05.weight_gradient_problems(flat_dU)["slides"] == ""  # dU of shape (4,) is fine


def cell_one_gemm(x, h, c, cell, **keywords):
    return lab05.cell_as(x, h, c, cell, **keywords)


def two_gemms(x, h, c, cell):
    z = x @ cell.weight_ih.T + h @ cell.weight_hh.T + cell.bias_ih + cell.bias_hh
    i, f, g, o = z.chunk(4, dim=1)
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c_new), c_new


@pytest.mark.parametrize(("fn", "said"), [
    (cell_one_gemm, ""),
    (lambda x, h, c, cell: cell_one_gemm(x, h, c, cell, order="gifo"), "PyTorch's row blocks are i, f, g, o"),
    (lambda x, h, c, cell: cell_one_gemm(x, h, c, cell, biases=1), "add both biases"),
    (lambda x, h, c, cell: cell_one_gemm(x, h, c, cell, blocks="xh"), "must line up with the input"),
    (lambda x, h, c, cell: cell_one_gemm(x, h, c, cell, g=torch.sigmoid), "g (the course's a) uses tanh"),
    (lambda x, h, c, cell: cell_one_gemm(x, h, c, cell, squash=False), "h = o tanh(c_new)"),
    (lambda x, h, c, cell: cell_one_gemm(x, h, c, cell)[::-1], "returned (c, h)"),
    (two_gemms, "the values are right, but the gates took 2 matrix products"),
    (lambda x, h, c, cell: cell(x, (h, c)), "took 2 matrix products"),
    (lambda x, h, c, cell: cell_one_gemm(x, h, c, cell)[0], "expected the pair (h, c)"),
    (lambda x, h, c, cell: (None, None), NOT_ANSWERED),
])
def test_the_lstm_cell_in_one_gemm(fn, said):
    problem = lab05.lstm_cell_problem(fn)
    assert (said in problem) if said else problem == ""


def test_the_cell_check_reports():
    assert "PASS one stacked GEMM equals torch.nn.LSTMCell" in graded(lab05.check_lstm_cell_one_gemm, cell_one_gemm)
