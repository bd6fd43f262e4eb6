"""What autocast does to each kind of op: which run in 16 bits and which it keeps in float32, measured on this
device from the ops' output dtypes; and why the weights themselves stay in float32 (updates lost in 16 bits).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from gpulab.core import env
from gpulab.core.precision import FORMATS
from gpulab.core.provenance import experiment
from gpulab.core.validation import positive_int, unsupported_reason

AUTOCAST_DTYPES = ("float16", "bfloat16")


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
