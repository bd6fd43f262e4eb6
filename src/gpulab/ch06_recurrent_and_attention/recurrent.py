"""The recurrent chapter's LSTM: four gates as one GEMM, the course's worked example, and a timed layer.

An LSTM cell computes four gates from the previous output ``h`` and the input ``x``. Stacking the
four gates' weights into one matrix of ``4H x (H + D)`` turns the four small products into one GEMM
over the concatenated vector ``[h; x]``; everything after it is elementwise. This module keeps the
course's gate order (LAPENNA Unit 11), ``a, i, f, o`` (input activation, input, forget,
output gate; PyTorch calls the input activation ``g``), and converts to and from PyTorch's
``i, f, g, o`` with its two biases.

The worked example is the course's two-step LSTM with one hidden unit and two inputs
(:data:`COURSE_EXAMPLE`), worked forward and backward by hand exactly as the slides do
(:func:`forward_trace`, :func:`backward_trace`) and checked against autograd. :data:`SLIDE_VALUES`
holds the numbers the slides print, as printed, so that each can be compared to one unit of its
last printed digit.

The timed experiment (:func:`lstm_layer_sweep`) runs one LSTM layer three ways: a Python loop of one
stacked GEMM plus pointwise work per time step, the same loop with the input GEMM of every time step
hoisted into one large GEMM before it, and ``torch.nn.LSTM`` (cuDNN's kernels on a GPU).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpulab.core import env, timing
from gpulab.core.correctness import check_close, random_tensor
from gpulab.core.precision import matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, supported_dtype

GATES = ("a", "i", "f", "o")  # the course's order: input activation (tanh), input, forget, output (sigmoid)
TORCH_GATES = ("i", "f", "g", "o")  # torch.nn.LSTM's order of the row blocks of weight_ih and weight_hh
TORCH_TO_COURSE = (2, 0, 1, 3)  # course gate k is torch's row block TORCH_TO_COURSE[k]
COURSE_TO_TORCH = (1, 2, 0, 3)
IMPLEMENTATIONS = ("per-step GEMM", "hoisted input GEMM", "torch.nn.LSTM")
# Relative error allowed between an implementation and the float64 reference, over a whole sequence.
LAYER_TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}






def stack_weights(W: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """The ``4H x (H + D)`` matrix ``[U | W]`` that multiplies ``[h; x]``: one GEMM for all four gates.

    ``W`` (``4H x D``) holds the input weights and ``U`` (``4H x H``) the recurrent weights, each
    with the gates' row blocks stacked in the same order.
    """
    if W.dim() != 2 or U.dim() != 2 or W.shape[0] != U.shape[0] or W.shape[0] % 4:
        raise ValueError(f"W, U: expected 4H x D and 4H x H matrices, got {tuple(W.shape)} and {tuple(U.shape)}")
    if U.shape[1] * 4 != U.shape[0]:
        raise ValueError(f"U: expected 4H x H with H = {U.shape[0] // 4}, got {tuple(U.shape)}")
    return torch.cat([U, W], dim=1)


def lstm_cell(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """One LSTM step in the course's gate order: returns the new output, the new state, and the gates.

    ``x`` is ``B x D``, ``h`` and ``c`` are ``B x H``, ``weight`` is ``4H x (H + D)`` (see
    :func:`stack_weights`) and ``bias`` has ``4H`` entries. The four pre-activations come from one GEMM.
    """
    hidden = h.shape[-1]
    if weight.shape != (4 * hidden, hidden + x.shape[-1]) or bias.shape != (4 * hidden,):
        raise ValueError(f"weight, bias: expected {(4 * hidden, hidden + x.shape[-1])} and {(4 * hidden,)} "
                         f"for H = {hidden}, D = {x.shape[-1]}; got {tuple(weight.shape)} and {tuple(bias.shape)}")
    z = torch.addmm(bias, torch.cat([h, x], dim=-1), weight.t())  # B x 4H: all four gates in one GEMM
    a, i, f, o = z.chunk(4, dim=-1)
    a, i, f, o = torch.tanh(a), torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o)
    c_new = a * i + f * c
    h_new = torch.tanh(c_new) * o
    return h_new, c_new, {"a": a, "i": i, "f": f, "o": o}


def from_torch(weight_ih: torch.Tensor, weight_hh: torch.Tensor, bias_ih: torch.Tensor | None = None,
               bias_hh: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's LSTM parameters (gates i, f, g, o; two biases) as the course's stacked ``weight`` and ``bias``.

    The row blocks are reordered to a, i, f, o (PyTorch's g is the course's a), the recurrent and
    input weights are put side by side to multiply ``[h; x]``, and the two biases, which PyTorch
    only ever adds together, become one.
    """
    hidden = weight_hh.shape[1]
    if weight_ih.shape[0] != 4 * hidden or weight_hh.shape != (4 * hidden, hidden):
        raise ValueError(f"weight_ih, weight_hh: expected 4H rows and a 4H x H recurrent matrix, got "
                         f"{tuple(weight_ih.shape)} and {tuple(weight_hh.shape)}")
    order = torch.cat([torch.arange(k * hidden, (k + 1) * hidden) for k in TORCH_TO_COURSE]).to(weight_ih.device)
    bias = torch.zeros(4 * hidden, dtype=weight_ih.dtype, device=weight_ih.device)
    for b in (bias_ih, bias_hh):
        if b is not None:
            bias = bias + b
    return stack_weights(weight_ih[order], weight_hh[order]), bias[order]


def to_torch(weight: torch.Tensor, bias: torch.Tensor, hidden: int) -> dict[str, torch.Tensor]:
    """The course's ``weight`` and ``bias`` as PyTorch's ``weight_ih, weight_hh, bias_ih, bias_hh`` (bias_hh zero)."""
    hidden = positive_int("hidden", hidden)
    if weight.shape[0] != 4 * hidden or bias.shape != (4 * hidden,):
        raise ValueError(f"weight, bias: expected 4H = {4 * hidden} rows, got {tuple(weight.shape)} and "
                         f"{tuple(bias.shape)}")
    order = torch.cat([torch.arange(k * hidden, (k + 1) * hidden) for k in COURSE_TO_TORCH]).to(weight.device)
    weight = weight[order]
    return {"weight_ih": weight[:, hidden:].contiguous(), "weight_hh": weight[:, :hidden].contiguous(),
            "bias_ih": bias[order].contiguous(), "bias_hh": torch.zeros_like(bias)}


def lstm_cell_by_gates(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step gate by gate, eight small products as the course's equations are written: the same
    ``weight`` (``4H x (H + D)``, see :func:`stack_weights`) and ``bias`` as :func:`lstm_cell`, cut into each gate's
    ``U_g`` and ``W_g``. Returns the new output and state."""
    hidden = h.shape[-1]
    U = {g: weight[k * hidden:(k + 1) * hidden, :hidden] for k, g in enumerate(GATES)}
    W = {g: weight[k * hidden:(k + 1) * hidden, hidden:] for k, g in enumerate(GATES)}
    b = dict(zip(GATES, bias.chunk(4), strict=True))
    pre = {g: x @ W[g].T + h @ U[g].T + b[g] for g in GATES}
    a, i, f, o = torch.tanh(pre["a"]), torch.sigmoid(pre["i"]), torch.sigmoid(pre["f"]), torch.sigmoid(pre["o"])
    c_new = a * i + f * c
    return torch.tanh(c_new) * o, c_new


def compare_cell_forms(batch: int = 8, inputs: int = 10, hidden: int = 16, tolerance: float = 1e-12) -> list[dict]:
    """One step of a random ``torch.nn.LSTMCell`` (float64) computed gate by gate (:func:`lstm_cell_by_gates`) and
    as one stacked GEMM (:func:`lstm_cell`) on its weights (:func:`from_torch`): a row per form with its largest
    difference from the cell's own output and state; AssertionError above ``tolerance``."""
    batch, inputs, hidden = (positive_int(k, v) for k, v in (("batch", batch), ("inputs", inputs),
                                                              ("hidden", hidden)))
    cell = torch.nn.LSTMCell(inputs, hidden, dtype=torch.float64)
    x, h, c = (torch.randn(batch, n, dtype=torch.float64) for n in (inputs, hidden, hidden))
    weight, bias = from_torch(cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    rows = []
    with torch.no_grad():
        h_torch, c_torch = cell(x, (h, c))
        forms = {"gate by gate": lstm_cell_by_gates(x, h, c, weight, bias),
                 "one stacked GEMM": lstm_cell(x, h, c, weight, bias)[:2]}
        for name, (h_ours, c_ours) in forms.items():
            difference = max((h_ours - h_torch).abs().max().item(), (c_ours - c_torch).abs().max().item())
            if not difference < tolerance:
                raise AssertionError(f"{name} differs from nn.LSTMCell by {difference:.2e}")
            rows.append({"form": name, "weight": str(tuple(weight.shape)), "difference": difference})
    return rows






@dataclass(frozen=True)
class WorkedExample:
    """An LSTM with one hidden unit, two inputs and two time steps, as on the course's slides."""

    W: tuple[tuple[float, float], ...]  # input weights, one row per gate (a, i, f, o)
    U: tuple[float, ...]  # recurrent weights, one per gate
    b: tuple[float, ...]  # biases, one per gate
    inputs: tuple[tuple[float, float], ...]  # x_0, x_1
    labels: tuple[float, ...]  # y_0, y_1
    learning_rate: float

    def tensors(self, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        """W (4 x 2), U (4 x 1), b (4), x (2 steps x 2), y (2) as tensors."""
        return {"W": torch.tensor(self.W, dtype=dtype), "U": torch.tensor(self.U, dtype=dtype).reshape(4, 1),
                "b": torch.tensor(self.b, dtype=dtype), "x": torch.tensor(self.inputs, dtype=dtype),
                "y": torch.tensor(self.labels, dtype=dtype)}


# The slides print the second label as -1.25 but compute Delta_1 = 0.77197 - 1.25: the arithmetic,
# and every number after it, uses +1.25 (see the chapter). The loss is E = sum_t (out_t - y_t)^2 / 2.
COURSE_EXAMPLE = WorkedExample(
    W=((0.45, 0.25), (0.95, 0.80), (0.70, 0.45), (0.60, 0.40)),
    U=(0.15, 0.80, 0.10, 0.25),
    b=(0.20, 0.65, 0.15, 0.10),
    inputs=((1.0, 2.0), (0.5, 3.0)),
    labels=(0.5, 1.25),
    learning_rate=0.1,
)
SLIDE_LABELS = (0.5, -1.25)  # the labels as the slide's text gives them

# Every number the slides print, as printed: (name, printed text). Names: gate or quantity, '_', step;
# 'dW[g,j]' etc. for the summed gradients, 'W_new[g,j]' etc. for the weights after one update.
SLIDE_VALUES: tuple[tuple[str, str], ...] = (
    ("a_0", "0.81775"), ("i_0", "0.96083"), ("f_0", "0.85195"), ("o_0", "0.81757"),
    ("state_0", "0.78572"), ("out_0", "0.53631"),
    ("a_1", "0.84980"), ("i_1", "0.98118"), ("f_1", "0.87030"), ("o_1", "0.84993"),
    ("state_1", "1.5176"), ("out_1", "0.77197"),
    ("Delta_1", "-0.47803"), ("delta_out_1", "-0.47803"), ("delta_state_1", "-0.07111"),
    ("delta_a_1", "-0.01938"), ("delta_i_1", "-0.00112"), ("delta_f_1", "-0.00631"), ("delta_o_1", "-0.05538"),
    ("delta_x_1[0]", "-0.04743"), ("delta_x_1[1]", "-0.03073"), ("Delta_out_0", "-0.01828"),
    ("Delta_0", "0.03631"), ("delta_out_0", "0.01803"), ("delta_state_0", "-0.05349"),
    ("delta_a_0", "-0.01703"), ("delta_i_0", "-0.00165"), ("delta_f_0", "0"), ("delta_o_0", "0.00176"),
    ("delta_x_0[0]", "-0.00817"), ("delta_x_0[1]", "-0.00487"), ("Delta_out_-1", "-0.00343"),
    ("dW[a,0]", "-0.02672"), ("dW[a,1]", "-0.0922"), ("dW[i,0]", "-0.00221"), ("dW[i,1]", "-0.00666"),
    ("dW[f,0]", "-0.00316"), ("dW[f,1]", "-0.01893"), ("dW[o,0]", "-0.02593"), ("dW[o,1]", "-0.16262"),
    ("dU[a]", "-0.01039"), ("dU[i]", "-0.00060"), ("dU[f]", "-0.00338"), ("dU[o]", "-0.02970"),
    ("db[a]", "-0.03641"), ("db[i]", "-0.00277"), ("db[f]", "-0.00631"), ("db[o]", "-0.05362"),
    ("W_new[a,0]", "0.45267"), ("W_new[a,1]", "0.25922"), ("U_new[a]", "0.15104"), ("b_new[a]", "0.20364"),
    ("W_new[i,0]", "0.95022"), ("W_new[i,1]", "0.80067"), ("U_new[i]", "0.80006"), ("b_new[i]", "0.65028"),
    ("W_new[f,0]", "0.70031"), ("W_new[f,1]", "0.45189"), ("U_new[f]", "0.10034"), ("b_new[f]", "0.15063"),
    ("W_new[o,0]", "0.60259"), ("W_new[o,1]", "0.41626"), ("U_new[o]", "0.25297"), ("b_new[o]", "0.10536"),
)


def printed_unit(text: str) -> float:
    """One unit of the last printed digit: '0.81775' -> 1e-5, '1.5176' -> 1e-4, '0' -> 1."""
    _, _, decimals = text.partition(".")
    return 10.0 ** -len(decimals)


def round_like_slides(value: torch.Tensor) -> torch.Tensor:
    """Round as the slides print: 5 decimals below 1 (0.81775), 5 significant digits from 1 on (1.5176)."""
    digits_before_point = torch.floor(torch.log10(value.abs().clamp_min(1e-300))).add(1).clamp_min(0)
    scale = 10.0 ** (5 - digits_before_point)
    return torch.round(value * scale) / scale


def _keep(rounded: bool):
    return round_like_slides if rounded else (lambda value: value)


def forward_trace(example: WorkedExample = COURSE_EXAMPLE, labels: Sequence[float] | None = None,
                  rounded: bool = False) -> list[dict]:
    """The forward pass, one dict per time step: the gates a, i, f, o, the state, the output, x and y.

    Written per gate, as the slides do: ``a_t = tanh(W_a . x_t + U_a . out_{t-1} + b_a)`` and so on.
    ``rounded=True`` rounds every printed quantity before it is used again, as the slides did
    (:func:`round_like_slides`); the default keeps full float64 precision.
    """
    keep = _keep(rounded)
    t = example.tensors()
    y = torch.tensor(labels if labels is not None else example.labels, dtype=torch.float64)
    out, state, steps = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), []
    for step, x in enumerate(t["x"]):
        pre = {g: t["W"][k] @ x + t["U"][k] @ out + t["b"][k] for k, g in enumerate(GATES)}
        a, i = keep(torch.tanh(pre["a"])), keep(torch.sigmoid(pre["i"]))
        f, o = keep(torch.sigmoid(pre["f"])), keep(torch.sigmoid(pre["o"]))
        new_state = keep(a * i + f * state)
        new_out = keep(torch.tanh(new_state) * o)
        steps.append({"t": step, "x": x, "y": y[step], "a": a, "i": i, "f": f, "o": o,
                      "previous_state": state, "previous_out": out, "state": new_state, "out": new_out.reshape(1)})
        state, out = new_state, new_out.reshape(1)
    return steps


def backward_trace(steps: list[dict], example: WorkedExample = COURSE_EXAMPLE, rounded: bool = False) -> dict:
    """Backpropagation through time by hand, from the last step to the first, as the slides do it.

    With the loss ``E = sum_t (out_t - y_t)^2 / 2``, ``Delta_t = out_t - y_t``. At each step
    ``delta out_t = Delta_t + Delta out_t`` (the second term passed back from step t+1), then

    - ``delta state_t = delta out_t o_t (1 - tanh^2 state_t) + delta state_{t+1} f_{t+1}``,
    - ``delta a_t = delta state_t i_t (1 - a_t^2)``, ``delta i_t = delta state_t a_t i_t (1 - i_t)``,
      ``delta f_t = delta state_t state_{t-1} f_t (1 - f_t)``, ``delta o_t = delta out_t tanh(state_t) o_t (1 - o_t)``,
    - ``delta x_t = W^T delta gates_t`` and ``Delta out_{t-1} = U^T delta gates_t``;

    and the weight gradients are sums of outer products over the steps:
    ``dW = sum_t delta gates_t x_t^T``, ``dU = sum_t delta gates_t out_{t-1}``, ``db = sum_t delta gates_t``.
    Returns the per-step deltas (a list, step 0 first) and dW, dU, db. ``rounded`` as in :func:`forward_trace`.
    """
    keep = _keep(rounded)
    t = example.tensors()
    W, U = t["W"], t["U"]
    deltas: list[dict] = [{} for _ in steps]
    Delta_out = torch.zeros(1, dtype=torch.float64)  # nothing comes back from beyond the last step
    delta_state_next, f_next = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    for s in reversed(steps):
        Delta = keep(s["out"] - s["y"])
        delta_out = keep(Delta + Delta_out)
        tanh_state = torch.tanh(s["state"])
        delta_state = keep(delta_out * s["o"] * (1 - tanh_state**2) + delta_state_next * f_next)
        gates = keep(torch.cat([
            delta_state * s["i"] * (1 - s["a"] ** 2),
            delta_state * s["a"] * s["i"] * (1 - s["i"]),
            delta_state * s["previous_state"] * s["f"] * (1 - s["f"]),
            delta_out * tanh_state * s["o"] * (1 - s["o"]),
        ]))
        Delta_out_previous = keep(U.t() @ gates)
        deltas[s["t"]] = {"Delta": Delta, "delta_out": delta_out, "delta_state": delta_state, "gates": gates,
                          "delta_x": keep(W.t() @ gates), "Delta_out_previous": Delta_out_previous}
        Delta_out, delta_state_next, f_next = Delta_out_previous, delta_state, s["f"]
    dW = keep(sum(torch.outer(d["gates"], s["x"]) for d, s in zip(deltas, steps, strict=True)))
    dU = keep(sum(torch.outer(d["gates"], s["previous_out"]) for d, s in zip(deltas, steps, strict=True)))
    db = keep(sum(d["gates"] for d in deltas))
    return {"steps": deltas, "dW": dW, "dU": dU, "db": db}


def worked_example_values(example: WorkedExample = COURSE_EXAMPLE, labels: Sequence[float] | None = None,
                          rounded: bool = False) -> dict[str, float]:
    """Every quantity the slides print, computed in float64, under the names of :data:`SLIDE_VALUES`.

    ``rounded=True`` redoes the slides' arithmetic with their rounded intermediates (:func:`forward_trace`).
    """
    steps = forward_trace(example, labels, rounded)
    back = backward_trace(steps, example, rounded)
    values: dict[str, float] = {}
    for s in steps:
        for name in ("a", "i", "f", "o", "state", "out"):
            values[f"{name}_{s['t']}"] = float(s[name])
    for step, d in enumerate(back["steps"]):
        values[f"Delta_{step}"] = float(d["Delta"])
        values[f"delta_out_{step}"] = float(d["delta_out"])
        values[f"delta_state_{step}"] = float(d["delta_state"])
        for k, g in enumerate(GATES):
            values[f"delta_{g}_{step}"] = float(d["gates"][k])
        for j in range(2):
            values[f"delta_x_{step}[{j}]"] = float(d["delta_x"][j])
        values[f"Delta_out_{step - 1}"] = float(d["Delta_out_previous"])
    t, rate = example.tensors(), example.learning_rate
    for k, g in enumerate(GATES):
        for j in range(2):
            values[f"dW[{g},{j}]"] = float(back["dW"][k, j])
            values[f"W_new[{g},{j}]"] = float(t["W"][k, j] - rate * back["dW"][k, j])
        values[f"dU[{g}]"] = float(back["dU"][k, 0])
        values[f"db[{g}]"] = float(back["db"][k])
        values[f"U_new[{g}]"] = float(t["U"][k, 0] - rate * back["dU"][k, 0])
        values[f"b_new[{g}]"] = float(t["b"][k] - rate * back["db"][k])
    return values


def compare_with_slides(values: dict[str, float] | None = None) -> list[dict]:
    """One row per printed number: the slide's text, the computed value, and whether it is within one printed unit."""
    values = values if values is not None else worked_example_values()
    rows = []
    for name, text in SLIDE_VALUES:
        unit, computed = printed_unit(text), values[name]
        difference = computed - float(text)
        rows.append({"quantity": name, "slide": text, "computed": computed, "difference": difference,
                     "units": difference / unit, "within_one_unit": abs(difference) <= unit * (1 + 1e-9)})
    return rows


def autograd_gradients(example: WorkedExample = COURSE_EXAMPLE) -> dict[str, torch.Tensor]:
    """dE/dW, dE/dU, dE/db of the worked example from torch.autograd (float64), via :func:`lstm_cell`."""
    t = example.tensors()
    W, U, b = (t[k].clone().requires_grad_(True) for k in ("W", "U", "b"))
    h = torch.zeros(1, 1, dtype=torch.float64)
    c = torch.zeros(1, 1, dtype=torch.float64)
    loss = torch.zeros((), dtype=torch.float64)
    for x, y in zip(t["x"], t["y"], strict=True):
        h, c, _ = lstm_cell(x.reshape(1, 2), h, c, stack_weights(W, U), b)
        loss = loss + 0.5 * (h.squeeze() - y) ** 2
    loss.backward()
    return {"dW": W.grad, "dU": U.grad, "db": b.grad, "loss": loss.detach()}






def lstm_layer_per_step(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """An LSTM layer over ``x`` (``T x B x D``) as a loop of one stacked GEMM and pointwise work per step.

    Returns the outputs of every step (``T x B x H``); the initial output and state are zero.
    """
    steps, batch, _ = x.shape
    hidden = weight.shape[0] // 4
    h = x.new_zeros(batch, hidden)
    c = x.new_zeros(batch, hidden)
    outputs = x.new_empty(steps, batch, hidden)
    for t in range(steps):
        h, c, _ = lstm_cell(x[t], h, c, weight, bias)
        outputs[t] = h
    return outputs


def lstm_layer_hoisted(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The same layer with the input half of every step's GEMM hoisted out of the loop (Appleyard et al. 2016).

    ``W x_t`` does not depend on the previous step, so one GEMM of ``(T B) x D`` by ``D x 4H``
    computes it for all steps at once; inside the loop only ``U h_{t-1}`` (``B x H`` by ``H x 4H``) remains.
    """
    steps, batch, inputs = x.shape
    hidden = weight.shape[0] // 4
    recurrent, input_weight = weight[:, :hidden], weight[:, hidden:]
    all_inputs = torch.addmm(bias, x.reshape(steps * batch, inputs), input_weight.t()).view(steps, batch, 4 * hidden)
    h = x.new_zeros(batch, hidden)
    c = x.new_zeros(batch, hidden)
    outputs = x.new_empty(steps, batch, hidden)
    for t in range(steps):
        z = torch.addmm(all_inputs[t], h, recurrent.t())
        a, i, f, o = z.chunk(4, dim=-1)
        c = torch.tanh(a) * torch.sigmoid(i) + torch.sigmoid(f) * c
        h = torch.tanh(c) * torch.sigmoid(o)
        outputs[t] = h
    return outputs


def layer_flops(hidden: int, seq_len: int, batch: int, inputs: int) -> int:
    """FLOPs of the GEMMs of one LSTM layer's forward pass: per step ``2 B (H + D) 4H``."""
    return 2 * seq_len * batch * (hidden + inputs) * 4 * hidden


def measure_lstm_layer(hidden: int, seq_len: int, batch: int, dtype: str = "float32",
                       implementation: str = "torch.nn.LSTM", device: torch.device | None = None) -> dict:
    """Check, then time, one LSTM layer (input size = hidden size) run by ``implementation``; returns a row.

    Every implementation runs the weights of the same seeded ``torch.nn.LSTM``, and its output
    sequence is compared with that module's output in float64 before anything is timed.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation: unknown {implementation!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    device = device or env.device()
    hidden, seq_len = positive_int("hidden", hidden), positive_int("seq_len", seq_len)
    batch, label = positive_int("batch", batch), supported_dtype("dtype", dtype, device)
    if label not in LAYER_TOLERANCE:
        raise ValueError(f"dtype: the LSTM layer runs in {', '.join(LAYER_TOLERANCE)}, not {label}")
    if device.type != "cuda" and label in ("float16", "bfloat16"):
        raise ValueError(f"dtype: {label} LSTM layers are a GPU feature here; on a CPU use float32 or float64")
    torch_dtype = getattr(torch, label)
    element = torch.empty((), dtype=torch_dtype).element_size()
    # inputs, outputs and the hoisted pre-activations, plus their float64 reference copies
    fits_in_memory("seq_len", seq_len * batch * 6 * hidden * (element + 8) + 16 * hidden * hidden * 8, device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        module = torch.nn.LSTM(hidden, hidden).to(device)
    reference_module = copy.deepcopy(module).double()
    module = module.to(torch_dtype)
    x = random_tensor((seq_len, batch, hidden), torch_dtype, device)
    weight, bias = from_torch(module.weight_ih_l0.detach(), module.weight_hh_l0.detach(),
                              module.bias_ih_l0.detach(), module.bias_hh_l0.detach())
    run = {
        "per-step GEMM": lambda: lstm_layer_per_step(x, weight, bias),
        "hoisted input GEMM": lambda: lstm_layer_hoisted(x, weight, bias),
        "torch.nn.LSTM": lambda: module(x)[0],
    }[implementation]
    with torch.no_grad(), matmul_mode(label):  # float32 means float32, in cuBLAS and cuDNN
        reference = reference_module(x.double())[0]
        error = check_close(run(), reference, LAYER_TOLERANCE[label], f"LSTM layer, {implementation}, {label}")
        del reference, reference_module
        measured = timing.measure(run, device=device, warmup=2)
    work = layer_flops(hidden, seq_len, batch, hidden)
    return {"seconds": measured.median_s, "spread": measured.spread, "ms_per_step": measured.median_s / seq_len * 1e3,
            "flops": work, "gflops": work / measured.median_s / 1e9, "relative_error": error}


@experiment("rnn_lstm_layer")
def lstm_layer_sweep(hidden_sizes: Sequence[int], seq_lens: Sequence[int], batch: int,
                     dtypes: Sequence[str], implementations: Sequence[str] = IMPLEMENTATIONS) -> list[dict]:
    """:func:`measure_lstm_layer` for every dtype, sequence length, hidden size and implementation."""
    hidden_sizes, seq_lens = positive_ints("hidden_sizes", hidden_sizes), positive_ints("seq_lens", seq_lens)
    batch = positive_int("batch", batch)
    points = [{"dtype": dtype, "seq_len": seq_len, "hidden": hidden, "batch": batch, "implementation": name}
              for dtype in dtypes for seq_len in seq_lens for hidden in hidden_sizes for name in implementations]
    return run_sweep(measure_lstm_layer, points)
