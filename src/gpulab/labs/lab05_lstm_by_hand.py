"""Graders of the lab "LSTM by hand" (``labs/05_lstm_by_hand.ipynb``): the course's worked LSTM forward, its
backpropagation through time, the weight gradients summed over the steps, and the four gates as one GEMM.

Each check quotes the first number that differs from the slides (:func:`matches_slide`) and names the mistake
whose arithmetic gives the student's numbers: an activation swapped, a term, bias or tanh left out, f on the
previous output, PyTorch's row order; Delta's sign, a missing derivative or a term from the next step; one step of
the gradient sum, out_t for out_{t-1}; PyTorch's gate order, one bias, more than one GEMM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab.ch06_recurrent_and_attention import recurrent
from gpulab.core.tables import Column, Table, table
from gpulab.labs.grading import NOT_ANSWERED, Grader, attempt, shown, tensor_problem

EXAMPLE = recurrent.COURSE_EXAMPLE  # the slides' LSTM: one hidden unit, two inputs, two time steps
TENSORS = EXAMPLE.tensors()
SLIDE = dict(recurrent.SLIDE_VALUES)  # every number the slides print, as printed
EXACT = recurrent.worked_example_values(EXAMPLE)  # the same numbers in float64
NAMES = ("a", "i", "f", "o", "state", "out")  # what lstm_step returns


def matches_slide(name: str, value: object) -> bool:
    """Within one unit of the slide's last printed digit. For the few numbers the slides computed from
    already-rounded intermediates (out_1, and dW[i,1], dW[f,1], dW[o,1]; the chapter shows it), exact
    arithmetic lands up to two units away, and the check allows what exact arithmetic gives."""
    printed = float(SLIDE[name])
    allowed = max(recurrent.printed_unit(SLIDE[name]), abs(EXACT[name] - printed)) * (1 + 1e-9)
    number = _number(value)
    return number is not None and math.isfinite(number) and abs(number - printed) <= allowed


def _number(value: object) -> float | None:  # a number, a one-element tensor or array; else None
    try:
        return float(value) if not isinstance(value, bool | str) and value is not None else None
    except (TypeError, ValueError, RuntimeError):
        return None


def slide_problem(values: Mapping[str, object], names: Mapping[str, str]) -> str:
    """'' if each ``values[key]`` matches the slide's ``name`` ({name: key}); otherwise the first that does not."""
    for name, key in names.items():
        value = values.get(key)
        if not matches_slide(name, value):
            number = _number(value)
            said = f"{number:.5f}" if number is not None else shown(value)
            return f"{name} = {said}, the slide prints {SLIDE[name]}"
    return ""


def named_mistake(values: Mapping[str, object], variants: Mapping[str, Mapping[str, object]],
                  keys: Sequence[str]) -> str:
    """The hint of the first variant ({hint: what that mistake computes}) that gives the student's ``values``
    at every key, to rounding."""
    def same(mine: float | None, theirs: float) -> bool:
        return mine is not None and abs(mine - theirs) <= 1e-9 * max(1.0, abs(theirs))

    return next((hint for hint, other in variants.items()
                 if all(same(_number(values.get(k)), float(other[k])) for k in keys)), "")


# --- exercise 1: one time step, gate by gate ---------------------------------------------------------------------

STEP_HINT = ("each gate is one activation of (W_g . x_t + U_g * out_{t-1} + b_g): tanh for a, sigmoid for i, f, o; "
             "then state_t = a i + f state_{t-1} and out_t = tanh(state_t) o. Step 1 starts from step 0's out and "
             "state")


def lstm_step_as(x: torch.Tensor, out_prev: torch.Tensor, state_prev: torch.Tensor, *, rows=(0, 1, 2, 3),
                 a=torch.tanh, gate=torch.sigmoid, recurrent_term: bool = True, bias: bool = True,
                 forget: str = "state", squash: bool = True) -> dict[str, torch.Tensor]:
    """One step of the course's LSTM, right by default; each keyword makes one mistake: ``rows`` (the rows of
    W, U, b read as a, i, f, o), ``a`` and ``gate`` (the activations), no ``recurrent_term``, no ``bias``,
    ``forget='out'`` (f times the previous output), no ``squash`` (out = state o)."""
    W, U, b = TENSORS["W"], TENSORS["U"], TENSORS["b"]
    pre = [W[k] @ x + (U[k] * out_prev if recurrent_term else 0) + (b[k] if bias else 0) for k in rows]
    values = {"a": a(pre[0]), "i": gate(pre[1]), "f": gate(pre[2]), "o": gate(pre[3])}
    values["state"] = values["a"] * values["i"] + values["f"] * (state_prev if forget == "state" else out_prev)
    values["out"] = (torch.tanh(values["state"]) if squash else values["state"]) * values["o"]
    return values


STEP_MISTAKES = {
    "a, the input activation, uses tanh; the three gates i, f, o use the sigmoid": dict(a=torch.sigmoid),
    "i, f and o are gates between 0 and 1: the sigmoid, not tanh": dict(gate=torch.tanh),
    "the recurrent term U_g out_{t-1} is missing (it is 0 at step 0, not at step 1)": dict(recurrent_term=False),
    "the bias b_g is missing": dict(bias=False),
    "the forget gate keeps part of the previous state, not of the previous output: f state_{t-1}":
        dict(forget="out"),
    "out_t = tanh(state_t) o: squash the state before the output gate": dict(squash=False),
    "the rows are in the course's order a, i, f, o (row 0 is a), not PyTorch's i, f, g, o": dict(rows=(2, 0, 1, 3)),
}


def forward_as(step: Callable) -> tuple[list[dict], str]:
    """Both steps of ``step(x, out_prev, state_prev)`` from zeros, each its dict plus the out and state it got
    (``out_prev``, ``state_prev``); and '' or what went wrong at the step where it stopped."""
    out, state, trace = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), []
    for x in TENSORS["x"]:
        values, problem = attempt(lambda x=x, out=out, state=state: step(x.clone(), out.clone(), state.clone()))
        problem = problem or _keyed(values, NAMES, "lstm_step")
        if not problem and (_number(values["out"]) is None or _number(values["state"]) is None):
            problem = "out and state must be numbers or one-element tensors"
        if problem:
            return trace, problem
        trace.append({**values, "out_prev": out, "state_prev": state})
        out = torch.tensor([_number(values["out"])], dtype=torch.float64)
        state = torch.tensor([_number(values["state"])], dtype=torch.float64)
    return trace, ""


def _keyed(values: object, keys: Sequence[str], what: str) -> str:
    if values is None:
        return NOT_ANSWERED
    if not isinstance(values, Mapping):
        return f"returned {shown(values)}, expected a dict with the keys {', '.join(keys)}"
    missing = [k for k in keys if k not in values]
    return f"the dict has no {missing[0]!r}: {what} returns {', '.join(keys)}" if missing else ""


STEP_VARIANTS = {hint: forward_as(lambda x, o, s, k=keywords: lstm_step_as(x, o, s, **k))[0]
                 for hint, keywords in STEP_MISTAKES.items()}


def lstm_step_problems(lstm_step: Callable) -> dict[int, str]:
    """{0: step 0's problem, 1: step 1's} ('' if right) of the student's ``lstm_step``, run for both steps."""
    trace, stopped = forward_as(lstm_step)
    problems = {}
    for t in (0, 1):
        if t >= len(trace):
            problems[t] = stopped if stopped == NOT_ANSWERED or t == len(trace) else "not checked: step 0 stopped"
            continue
        problem = slide_problem(trace[t], {f"{n}_{t}": n for n in NAMES})
        if problem:
            hint = named_mistake(trace[t], {h: v[t] for h, v in STEP_VARIANTS.items()}, NAMES)
            problem = f"{problem}: {hint}" if hint else problem
        problems[t] = problem
    return problems


def check_lstm_step(grader: Grader, lstm_step: Callable) -> None:
    """Exercise 1: both steps of ``lstm_step`` from out = state = 0, every quantity against the slides."""
    for t, problem in lstm_step_problems(lstm_step).items():
        grader.record(f"step {t}: a, i, f, o, state, out", problem, STEP_HINT)


def forward_table(lstm_step: Callable) -> Table | None:
    """The student's forward pass beside the slides' numbers, or None until ``lstm_step`` returns something."""
    trace, _ = forward_as(lstm_step)
    if not trace:
        return None
    mine = [[_number(step.get(name)) for step in trace] + [None] * (2 - len(trace)) for name in NAMES]
    rows = [{"quantity": name, "mine_0": m[0], "slide_0": SLIDE[f"{name}_0"], "mine_1": m[1],
             "slide_1": SLIDE[f"{name}_1"]} for name, m in zip(NAMES, mine, strict=True)]
    return table(rows, [Column("quantity"), Column("mine_0", "t = 0, yours", "", ".5f"),
                        Column("slide_0", "slide"), Column("mine_1", "t = 1, yours", "", ".5f"),
                        Column("slide_1", "slide")])


# --- exercise 2: backpropagation through time -----------------------------------------------------------------------

BACK_KEYS = ("Delta", "delta_out", "delta_state", "gates", "delta_x", "Delta_out_prev")
BACK_HINT = ("follow the equations in order: Delta_t = out_t - y_t first, then delta out, delta state (at step 0 it "
             "also receives delta state_1 * f_1), then the four gate deltas; delta f_0 is 0 because state_{-1} = 0. "
             "delta x = W^T gates, Delta out_prev = U^T gates")
REFERENCE_STEPS = [{**s, "state_prev": s["previous_state"], "out_prev": s["previous_out"]}
                   for s in recurrent.forward_trace(EXAMPLE)]  # exercise 1's forward pass, done by gpulab


def backward_step_as(step: Mapping, y: torch.Tensor, Delta_out: torch.Tensor, delta_state_next: torch.Tensor,
                     f_next: torch.Tensor, *, sign: int = 1, tanh_derivative: bool = True, carry: bool = True,
                     passed: bool = True, forget_prev: bool = True, o_tanh: bool = True, order=(0, 1, 2, 3)) -> dict:
    """One backward step of the course's LSTM, right by default; each keyword makes one mistake: ``sign=-1``
    (Delta = y - out), no ``tanh_derivative``, no ``carry`` (delta state_{t+1} f_{t+1}), not ``passed``
    (Delta out_t), not ``forget_prev`` (delta f with state_t), not ``o_tanh`` (delta o with state_t), ``order``."""
    W, U = TENSORS["W"], TENSORS["U"]
    Delta = (step["out"] - y) * sign
    delta_out = Delta + (Delta_out if passed else 0)
    tanh_state = torch.tanh(step["state"])
    delta_state = (delta_out * step["o"] * ((1 - tanh_state**2) if tanh_derivative else 1)
                   + (delta_state_next * f_next if carry else 0))
    deltas = [delta_state * step["i"] * (1 - step["a"] ** 2),
              delta_state * step["a"] * step["i"] * (1 - step["i"]),
              delta_state * (step["state_prev"] if forget_prev else step["state"]) * step["f"] * (1 - step["f"]),
              delta_out * (tanh_state if o_tanh else step["state"]) * step["o"] * (1 - step["o"])]
    gates = torch.cat([deltas[k].reshape(1) for k in order])
    return {"Delta": Delta, "delta_out": delta_out, "delta_state": delta_state, "gates": gates,
            "delta_x": W.T @ gates, "Delta_out_prev": U.T @ gates}


BACK_MISTAKES = {
    "Delta_t = out_t - y_t, the derivative of (out_t - y_t)^2 / 2 by out_t: the sign is flipped": dict(sign=-1),
    "the derivative of tanh(state) is 1 - tanh^2(state): delta state needs that factor": dict(tanh_derivative=False),
    "at step 0 delta state also receives delta state_1 f_1, passed back from step 1": dict(carry=False),
    "delta out_t adds Delta out_t, passed back from step t + 1": dict(passed=False),
    "delta f_t multiplies state_{t-1}, the state the forget gate acts on, not state_t": dict(forget_prev=False),
    "delta o_t uses tanh(state_t), the value the output gate multiplied, not state_t": dict(o_tanh=False),
    "the gate deltas go in the course's order a, i, f, o (PyTorch's is i, f, g, o)": dict(order=(1, 2, 0, 3)),
}


def backward_as(backward_step: Callable) -> tuple[list[dict | None], str]:
    """Step 1's deltas, then step 0's from what step 1 passes back, on the reference forward pass; returned in
    time order (None for a step not reached), with '' or what went wrong."""
    zero = torch.zeros(1, dtype=torch.float64)
    steps, ys = REFERENCE_STEPS, TENSORS["y"]
    back_1, problem = attempt(lambda: backward_step(steps[1], ys[1], zero, zero, zero))
    problem = problem or _keyed(back_1, BACK_KEYS, "backward_step")
    if problem:
        return [None, None], problem
    back_0, problem = attempt(lambda: backward_step(steps[0], ys[0], back_1["Delta_out_prev"], back_1["delta_state"],
                                                    steps[1]["f"]))
    problem = problem or _keyed(back_0, BACK_KEYS, "backward_step")
    return ([None, back_1] if problem else [back_0, back_1]), problem


def flat(deltas: Mapping, t: int) -> dict[str, object]:
    """A step's deltas under the slides' names (``delta_a_1``, ``delta_x_1[0]``, ``Delta_out_0``, ...)."""
    values = {f"Delta_{t}": deltas["Delta"], f"delta_out_{t}": deltas["delta_out"],
              f"delta_state_{t}": deltas["delta_state"], f"Delta_out_{t - 1}": deltas["Delta_out_prev"]}
    gates, delta_x = deltas["gates"], deltas["delta_x"]
    if isinstance(gates, torch.Tensor) and gates.numel() == 4:
        values.update({f"delta_{g}_{t}": v for g, v in zip(recurrent.GATES, gates.flatten().tolist(), strict=True)})
    if isinstance(delta_x, torch.Tensor) and delta_x.numel() == 2:
        values.update({f"delta_x_{t}[{j}]": v for j, v in enumerate(delta_x.flatten().tolist())})
    return values


def _slide_names(t: int) -> list[str]:
    return [f"Delta_{t}", f"delta_out_{t}", f"delta_state_{t}", *(f"delta_{g}_{t}" for g in recurrent.GATES),
            f"delta_x_{t}[0]", f"delta_x_{t}[1]", f"Delta_out_{t - 1}"]


BACK_VARIANTS = {hint: backward_as(lambda *args, k=keywords: backward_step_as(*args, **k))[0]
                 for hint, keywords in BACK_MISTAKES.items()}


def backward_step_problems(backward_step: Callable) -> dict[int, str]:
    """{1: step 1's problem, 0: step 0's} ('' if right) of the student's ``backward_step``."""
    trace, stopped = backward_as(backward_step)
    problems = {}
    for t in (1, 0):
        if trace[t] is None:
            problems[t] = stopped
            continue
        values = flat(trace[t], t)
        names = _slide_names(t)
        for key, size in (("gates", 4), ("delta_x", 2)):
            value = trace[t][key]
            if not isinstance(value, torch.Tensor) or value.numel() != size:
                problems[t] = f"{key} is {shown(value)}: return a tensor of {size} numbers"
                break
        else:
            problem = slide_problem(values, dict(zip(names, names, strict=True)))
            if problem:
                hint = named_mistake(values, {h: flat(v[t], t) for h, v in BACK_VARIANTS.items()}, names)
                problem = f"{problem}: {hint}" if hint else problem
            problems[t] = problem
    return problems


def check_backward_step(grader: Grader, backward_step: Callable) -> None:
    """Exercise 2: step 1's deltas, then step 0's, against the slides."""
    for t, problem in backward_step_problems(backward_step).items():
        grader.record(f"backward step {t}: Delta, delta out, delta state, delta gates, delta x, Delta out",
               problem, BACK_HINT)


# --- exercise 3: the weight gradients, summed over time ----------------------------------------------------------

GRADIENT_HINT = ("add one outer product per time step: delta gates_t (4 numbers) times x_t (2 numbers) for dW, "
                 "times out_{t-1} (which is 0 at t = 0) for dU; db is the plain sum of the delta gates")
REFERENCE_DELTAS = recurrent.backward_trace(recurrent.forward_trace(EXAMPLE), EXAMPLE)["steps"]
SHAPES = {"dW": (4, 2), "dU": (4, 1), "db": (4,)}


def _gradients_as(pairs: Sequence[int] = (0, 1), inputs: Sequence[int] = (0, 1), outputs: str = "out_prev",
                  scale: float = 1.0) -> dict[str, torch.Tensor]:
    """dW, dU, db summed over the steps ``pairs``; each keyword makes one mistake: ``inputs`` (which step's x
    goes with each step's gate deltas), ``outputs='out'`` (out_t for out_{t-1}), ``scale`` (a mean)."""
    gates = [REFERENCE_DELTAS[t]["gates"].flatten() for t in pairs]
    xs = [TENSORS["x"][inputs[t]] for t in pairs]
    outs = [REFERENCE_STEPS[t][outputs].flatten() for t in pairs]
    return {"dW": sum(torch.outer(g, x) for g, x in zip(gates, xs, strict=True)) * scale,
            "dU": sum(torch.outer(g, o) for g, o in zip(gates, outs, strict=True)) * scale,
            "db": sum(gates) * scale}


GRADIENT_MISTAKES = {
    "the weights are shared by both steps: add the outer products of both, not the last step's alone":
        _gradients_as(pairs=(1,)),
    "the weights are shared by both steps: add the outer products of both, not the first step's alone":
        _gradients_as(pairs=(0,)),
    "dU multiplies each step's gate deltas by out_{t-1}, the output that step received, not by out_t":
        _gradients_as(outputs="out"),
    "pair each step's gate deltas with that step's own input x_t": _gradients_as(inputs=(1, 0)),
    "that is the mean over the steps: the gradient is their sum": _gradients_as(scale=0.5),
}


def student_gradients(weight_gradients: Callable) -> tuple[dict[str, torch.Tensor], str]:
    """The student's dW (4 x 2), dU (4 x 1) and db (4) on the reference passes, and '' or what is wrong with
    their types and shapes."""
    steps = [dict(s) for s in REFERENCE_STEPS]
    deltas = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()} for d in REFERENCE_DELTAS]
    got, problem = attempt(lambda: weight_gradients(steps, deltas))
    if problem or got is None or (isinstance(got, tuple | list) and all(g is None for g in got)):
        return {}, problem or NOT_ANSWERED
    if not isinstance(got, tuple | list) or len(got) != 3:
        return {}, f"returned {shown(got)}, expected three tensors (dW, dU, db)"
    gradients = {}
    for (name, shape), value in zip(SHAPES.items(), got, strict=True):
        if not isinstance(value, torch.Tensor):
            return {}, f"{name} is {shown(value)}, not a tensor"
        if name == "dW" and tuple(value.shape) == (2, 4):
            return {}, "dW is 2 x 4: transposed? torch.outer(delta gates, x) is 4 x 2"
        if value.numel() != math.prod(shape) or (name == "dW" and tuple(value.shape) != shape):
            return {}, f"{name} has shape {tuple(value.shape)}, expected {shape}"
        gradients[name] = value.detach().to(torch.float64).reshape(shape)
    return gradients, ""


def _named(gradients: Mapping[str, torch.Tensor]) -> dict[str, float]:
    named = {f"dW[{g},{j}]": float(gradients["dW"][k, j]) for k, g in enumerate(recurrent.GATES) for j in range(2)}
    named.update({f"dU[{g}]": float(gradients["dU"][k, 0]) for k, g in enumerate(recurrent.GATES)})
    named.update({f"db[{g}]": float(gradients["db"][k]) for k, g in enumerate(recurrent.GATES)})
    return named


def _updated(gradients: Mapping[str, torch.Tensor]) -> dict[str, float]:
    rate, W, U, b = EXAMPLE.learning_rate, TENSORS["W"], TENSORS["U"], TENSORS["b"]
    new = {f"W_new[{g},{j}]": float(W[k, j] - rate * gradients["dW"][k, j])
           for k, g in enumerate(recurrent.GATES) for j in range(2)}
    new.update({f"U_new[{g}]": float(U[k, 0] - rate * gradients["dU"][k, 0]) for k, g in enumerate(recurrent.GATES)})
    new.update({f"b_new[{g}]": float(b[k] - rate * gradients["db"][k]) for k, g in enumerate(recurrent.GATES)})
    return new


def _which(quantity: str) -> str:
    """The gradient a quantity comes from: 'dW[a,0]' and 'W_new[a,0]' from 'dW'."""
    base = quantity.split("[")[0]
    return base if base.startswith("d") else "d" + base.removesuffix("_new")


def weight_gradient_problems(weight_gradients: Callable) -> dict[str, str]:
    """{'slides' | 'autograd' | 'update': '' if right, else what is wrong} for the student's weight_gradients."""
    gradients, problem = student_gradients(weight_gradients)
    if problem:
        return dict.fromkeys(("slides", "autograd", "update"), problem)
    names = [name for name, _ in recurrent.SLIDE_VALUES if name[:3] in ("dW[", "dU[", "db[")]
    slides = slide_problem(_named(gradients), dict(zip(names, names, strict=True)))
    if slides:
        which = _which(slides.split(" ")[0])
        hint = next((h for h, wrong in GRADIENT_MISTAKES.items()
                     if torch.allclose(gradients[which], wrong[which], rtol=1e-9, atol=1e-12)), "")
        slides = f"{slides}: {hint}" if hint else slides
    reference = recurrent.autograd_gradients(EXAMPLE)
    autograd = ""
    for name in SHAPES:
        wrong = tensor_problem(gradients[name], reference[name].reshape(SHAPES[name]), 1e-12,
                               {h: v[name] for h, v in GRADIENT_MISTAKES.items()})
        if wrong:
            autograd = f"{name}: {wrong}"
            break
    names = [name for name, _ in recurrent.SLIDE_VALUES if "_new" in name]
    update = slide_problem(_updated(gradients), dict(zip(names, names, strict=True)))
    if update and (slides or autograd):
        update += f" (it follows from {_which(update.split(' ')[0])}: fix that first)"
    return {"slides": slides, "autograd": autograd, "update": update}


def check_weight_gradients(grader: Grader, weight_gradients: Callable) -> None:
    """Exercise 3: dW, dU and db against the slides and autograd, and one step of gradient descent."""
    problems = weight_gradient_problems(weight_gradients)
    grader.record("dW, dU and db match the slides", problems["slides"], GRADIENT_HINT)
    grader.record("dW, dU and db match autograd", problems["autograd"], GRADIENT_HINT + "; autograd differentiates "
           "the same two steps, so any difference above rounding is a slip")
    grader.record("one step of gradient descent (learning rate 0.1) gives the slides' new weights",
           problems["update"], "W_new = W - 0.1 dW, and likewise for U and b; if dW is right this follows")


# --- exercise 4: four gates, one GEMM -----------------------------------------------------------------------------

CELL_HINT = ("stack torch.cat([weight_hh, weight_ih], dim=1) so that it multiplies torch.cat([h, x], dim=1); add "
             "both biases; the chunks of the result are i, f, g, o in PyTorch's order, with tanh for g only")
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot"}  # what F.linear and @ end in


class _CountProducts(TorchDispatchMode):
    products = 0  # counted per instance: += makes an instance attribute

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.products += func.overloadpacket.__name__ in GEMMS
        return func(*args, **(kwargs or {}))


def cell_as(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, cell: torch.nn.LSTMCell, *, order="ifgo",
            biases: int = 2, blocks: str = "hx", g=torch.tanh, squash: bool = True) -> tuple[torch.Tensor, ...]:
    """``nn.LSTMCell`` as one GEMM, right by default; each keyword makes one mistake: ``order`` (how the chunks
    are read), ``biases=1``, ``blocks='xh'`` ([x, h] against [weight_hh, weight_ih]), ``g``, no ``squash``."""
    weight = torch.cat([cell.weight_hh, cell.weight_ih], dim=1)
    inputs = torch.cat([h, x] if blocks == "hx" else [x, h], dim=1)
    z = inputs @ weight.T + cell.bias_ih + (cell.bias_hh if biases == 2 else 0)
    chunks = dict(zip(order, z.chunk(4, dim=1), strict=True))
    c_new = torch.sigmoid(chunks["f"]) * c + torch.sigmoid(chunks["i"]) * g(chunks["g"])
    h_new = torch.sigmoid(chunks["o"]) * (torch.tanh(c_new) if squash else c_new)
    return h_new, c_new


CELL_MISTAKES = {
    "PyTorch's row blocks are i, f, g, o (its g is the course's a), not the course's a, i, f, o": dict(order="gifo"),
    "add both biases, bias_ih + bias_hh: PyTorch always adds the two": dict(biases=1),
    "the blocks of the stacked matrix must line up with the input: torch.cat([weight_hh, weight_ih], dim=1) "
    "multiplies torch.cat([h, x], dim=1)": dict(blocks="xh"),
    "g (the course's a) uses tanh; i, f and o use the sigmoid": dict(g=torch.sigmoid),
    "h = o tanh(c_new): squash the new cell state before the output gate": dict(squash=False),
}


def lstm_cell_problem(lstm_cell_one_gemm: Callable, batch: int = 5, inputs: int = 3, hidden: int = 4,
                      seed: int = 5) -> str:
    """'' if ``lstm_cell_one_gemm(x, h, c, cell)`` equals ``cell(x, (h, c))`` with one matrix product."""
    torch.manual_seed(seed)  # nn.LSTMCell draws its weights from the global generator
    cell = torch.nn.LSTMCell(inputs, hidden, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    x, h, c = (torch.randn(batch, n, generator=generator, dtype=torch.float64) for n in (inputs, hidden, hidden))
    with torch.no_grad():
        expected = cell(x, (h, c))
        variants = {hint: cell_as(x, h, c, cell, **keywords) for hint, keywords in CELL_MISTAKES.items()}
        with _CountProducts() as counter:
            got, problem = attempt(lambda: lstm_cell_one_gemm(x.clone(), h.clone(), c.clone(), cell))
    if problem:
        return problem
    if got is None or (isinstance(got, tuple | list) and all(part is None for part in got)):
        return NOT_ANSWERED
    if not isinstance(got, tuple | list) or len(got) != 2:
        return f"returned {shown(got)}, expected the pair (h, c)"
    if all(isinstance(part, torch.Tensor) for part in got) and all(
            tensor_problem(mine, theirs, 1e-12) == "" for mine, theirs in zip(got[::-1], expected, strict=True)):
        return "returned (c, h): return the new output first, (h, c)"
    for k, name in enumerate(("h", "c")):
        wrong = tensor_problem(got[k], expected[k], 1e-12, {hint: v[k] for hint, v in variants.items()})
        if wrong:
            return f"{name}: {wrong}"
    if counter.products > 1:
        return (f"the values are right, but the gates took {counter.products} matrix products: stack the weights "
                "into one 4H x (H + D) matrix and compute all four gates with one")
    return ""


def check_lstm_cell_one_gemm(grader: Grader, lstm_cell_one_gemm: Callable) -> None:
    """Exercise 4: ``lstm_cell_one_gemm`` against ``torch.nn.LSTMCell`` on random data, with one GEMM."""
    grader.record("one stacked GEMM equals torch.nn.LSTMCell", lstm_cell_problem(lstm_cell_one_gemm), CELL_HINT)
