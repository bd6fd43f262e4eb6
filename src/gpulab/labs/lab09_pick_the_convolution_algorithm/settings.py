"""The ways to run a convolution -- a layout, a precision, cuDNN's autotuner on or off -- with the reference
answers to the lab's exercises, and the lab's experiment ``lab_conv_choice``: every setting checked, then timed
on the lab's layers (:func:`measure_settings`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.core import env, plots, timing
from gpulab.core.correctness import check_close
from gpulab.core.precision import MATMUL_TOLERANCE
from gpulab.core.provenance import experiment
from gpulab.core.sweep import ok_rows, run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, supported_dtype

LAYOUTS = ("NCHW", "NHWC")
DTYPES = ("float32", "tf32", "float16")  # "tf32": float32 data, multiplied on the tensor cores in TF32
BENCHMARKS = (False, True)


FIRST_CALL_DELAY_S = 0.05  # diagnose_timer's first call sleeps this long, standing in for the autotuner

# The lab's layers, at full size: a ResNet-50's first layer and two of its first stage's {he2016resnet},
# and a 3x3 layer whose channels (60) are not a multiple of 8.
LAYERS = (
    conv.ConvLayer(32, 64, 56, 56, 64, 3, 3, 1, 1, name="res2 3x3"),
    conv.ConvLayer(32, 256, 56, 56, 64, 1, 1, 1, 0, name="res2 1x1"),
    conv.ConvLayer(32, 3, 224, 224, 64, 7, 7, 2, 3, name="conv1 7x7/2"),
    conv.ConvLayer(32, 60, 56, 56, 60, 3, 3, 1, 1, name="3x3, C=60"),
)


def _microseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


@dataclass(frozen=True)
class Setting:
    """One way to run a convolution: a layout, a precision and whether cuDNN autotunes."""

    layout: str
    dtype: str
    benchmark: bool

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.benchmark, bool):
            raise ValueError(f"benchmark: True or False, got {self.benchmark!r}")

    @property
    def label(self) -> str:
        """'NHWC, float16, benchmark on'."""
        return f"{self.layout}, {self.dtype}, benchmark {'on' if self.benchmark else 'off'}"

    @classmethod
    def of(cls, value: object) -> Setting:
        """A Setting from itself, a (layout, dtype, benchmark) tuple or a dict with those keys; ValueError if not."""
        if isinstance(value, Setting):
            return value
        if isinstance(value, dict):
            missing = {"layout", "dtype", "benchmark"} - set(value)
            if missing:
                raise ValueError(f"setting: the dict lacks {', '.join(sorted(missing))}")
            return cls(value["layout"], value["dtype"], value["benchmark"])
        if isinstance(value, tuple | list) and len(value) == 3:
            return cls(*value)
        raise ValueError(f"setting: a (layout, dtype, benchmark) tuple, got {value!r}")

    @classmethod
    def of_row(cls, row: dict) -> Setting:
        return cls(row["layout"], row["dtype"], bool(row["benchmark"]))


def settings(layouts: Sequence[str] = LAYOUTS, dtypes: Sequence[str] = DTYPES,
             benchmarks: Sequence[bool] = BENCHMARKS) -> list[Setting]:
    """Every combination of the given layouts, precisions and benchmark flags."""
    return [Setting(layout, dtype, benchmark) for benchmark in benchmarks for layout in layouts for dtype in dtypes]


def small_layers(layers: Sequence[conv.ConvLayer] = LAYERS, n: int = 2, size: int = 16) -> list[conv.ConvLayer]:
    """The layers with ``n`` images of ``size`` x ``size`` pixels (a strided layer keeps its output size):
    the same channels and filters, small enough for a CPU."""
    n, size = positive_int("n", n), positive_int("size", size)
    return [conv.ConvLayer(n, shape.c, size * shape.stride, size * shape.stride, shape.k, shape.r, shape.s,
                           shape.stride, shape.padding, shape.name) for shape in layers]






def storage_dtype(dtype: str) -> torch.dtype:
    """The dtype a tensor is stored in for a precision: float16, or float32 (for both float32 and TF32)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: one of {', '.join(DTYPES)}, got {dtype!r}")
    return torch.float16 if dtype == "float16" else torch.float32


def memory_format(layout: str) -> torch.memory_format:
    """``torch.channels_last`` for NHWC, ``torch.contiguous_format`` for NCHW."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: one of {', '.join(LAYOUTS)}, got {layout!r}")
    return torch.channels_last if layout == "NHWC" else torch.contiguous_format


def allow_tf32() -> bool | None:
    """cuDNN's TF32 switch, ``torch.backends.cudnn.allow_tf32``; None where PyTorch refuses to say.

    Recent PyTorch has a second API for the same switch (``torch.backends.cudnn.conv.fp32_precision``);
    after a mix of the two leaves convolutions and RNNs set differently, reading the old one raises.
    """
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        return None


@contextmanager
def kept_flags() -> Iterator[None]:
    """Within the block anything may change ``cudnn.allow_tf32`` and ``cudnn.benchmark``; afterwards both are back."""
    saved_tf32, saved_benchmark = allow_tf32(), torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = True if saved_tf32 is None else saved_tf32
        torch.backends.cudnn.benchmark = saved_benchmark


@contextmanager
def reference_precision(dtype: str) -> Iterator[None]:
    """Within the block cuDNN may use TF32 for float32 convolutions if and only if ``dtype == 'tf32'``."""
    storage_dtype(dtype)  # checks the name
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


def reference_prepare(x: torch.Tensor, weight: torch.Tensor, layout: str,
                      dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` and ``weight`` (NCHW) stored in ``layout`` and ``dtype``'s storage type, both of them."""
    target = dict(dtype=storage_dtype(dtype), memory_format=memory_format(layout))
    return x.to(**target), weight.to(**target)


def reference_time(run: Callable[[], object], benchmark: bool, device: torch.device | None = None) -> dict:
    """Seconds of ``run()``'s first call (where cuDNN autotunes if ``benchmark``) and its median after that."""
    device = device or env.device()
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        first_call_s = timing.once(run, device)  # nothing has run yet: this call pays for the autotuning
        seconds = timing.measure(run, device=device).median_s  # warms up, synchronises, takes the median
    finally:
        torch.backends.cudnn.benchmark = saved
    return {"first_call_s": first_call_s, "seconds": seconds}


def _unsupported(dtype: str, device: torch.device) -> str | None:
    """Why ``dtype`` cannot run on ``device`` (the row's status), or None if it can."""
    try:
        supported_dtype("dtype", dtype, device)
    except ValueError as reason:
        return str(reason)
    return None


def _measure_in_thread(data: dict, points: list[dict], benchmark: bool, device: torch.device,
                       target_s: float | None) -> list[dict]:
    """Time every point with ``cudnn.benchmark = benchmark``, in the calling (fresh) thread."""

    def measure(layer: str, layout: str, dtype: str) -> dict:
        shape, x, weight, reference = data[layer]
        with reference_precision(dtype):
            xp, wp = reference_prepare(x, weight, layout, dtype)
            out: dict[str, torch.Tensor] = {}

            def first() -> None:
                out["y"] = F.conv2d(xp, wp, stride=shape.stride, padding=shape.padding)

            first_call_s = timing.once(first, device)  # with benchmark on: cuDNN tries its algorithms here
            error = check_close(out.pop("y"), reference, MATMUL_TOLERANCE[dtype],
                                f"{layer}, {Setting(layout, dtype, benchmark).label}")
            measured = timing.measure(lambda: F.conv2d(xp, wp, stride=shape.stride, padding=shape.padding),
                                      device=device, target_s=target_s)
        return {"seconds": measured.median_s, "spread": measured.spread, "first_call_s": first_call_s,
                "tflops": shape.flops / measured.median_s / 1e12, "relative_error": error,
                "c": shape.c, "k": shape.k, "flops": shape.flops}

    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        return run_sweep(measure, points)
    finally:
        torch.backends.cudnn.benchmark = saved


@experiment("lab_conv_choice")
def measure_settings(layers: Sequence[conv.ConvLayer | dict] = LAYERS, layouts: Sequence[str] = LAYOUTS,
                     dtypes: Sequence[str] = DTYPES, benchmarks: Sequence[bool] = BENCHMARKS,
                     target_s: float | None = None) -> list[dict]:
    """Check, then time, ``F.conv2d`` on each layer in every layout, precision and benchmark setting.

    Returns a row per (layer, setting) with ``seconds`` (median), ``first_call_s`` (the first call
    alone: with benchmark on, that is where cuDNN autotunes), ``tflops`` and the relative error
    against a float64 convolution of the same data, and ``status``: "ok", "out of memory", or why the
    precision cannot run here (TF32 on a CPU or a GPU older than Ampere). Each benchmark setting is
    measured in a fresh thread, with a fresh plan cache (see the module's docstring). On a CPU the
    cuDNN flags change nothing, and the rows measure PyTorch's CPU convolutions. ``target_s`` is
    :func:`gpulab.core.timing.measure`'s.
    """
    device = env.device()
    shapes = [conv.layer(spec) for spec in layers]
    names = [shape.name or shape.describe() for shape in shapes]
    if not shapes or len(set(names)) != len(names):
        raise ValueError("layers: expected at least one layer, each with its own name")
    for name, values in (("layouts", layouts), ("dtypes", dtypes)):
        if not values:
            raise ValueError(f"{name}: expected at least one, got none")
    settings(layouts, dtypes, benchmarks)  # checks every name
    data = {}
    generator = torch.Generator().manual_seed(0)
    for name, shape in zip(names, shapes, strict=True):
        # the input and filters twice (float32 and the prepared copy), the outputs, and the float64 reference
        fits_in_memory("layers", 8 * (shape.input_elements + shape.filter_elements) + 16 * shape.output_elements,
                       device)
        x = torch.randn(shape.n, shape.c, shape.h, shape.w, generator=generator).to(device)
        weight = torch.randn(shape.k, shape.c, shape.r, shape.s, generator=generator).to(device)
        reference = F.conv2d(x.double(), weight.double(), stride=shape.stride, padding=shape.padding)
        data[name] = (shape, x, weight, reference)
    rows = []
    for benchmark in benchmarks:
        points, skipped = [], []
        for name in names:
            for layout in layouts:
                for dtype in dtypes:
                    point = {"layer": name, "layout": layout, "dtype": dtype}
                    reason = _unsupported(dtype, device)
                    (skipped if reason else points).append({**point, "status": reason} if reason else point)
        with ThreadPoolExecutor(max_workers=1) as fresh_thread:
            measured = fresh_thread.submit(_measure_in_thread, data, points, benchmark, device, target_s).result()
        for row in measured + skipped:
            rows.append({**row, "benchmark": benchmark, "setting": Setting(row["layout"], row["dtype"],
                                                                            benchmark).label})
    return rows


def best_by_layer(rows: Sequence[dict]) -> dict[str, dict]:
    """The fastest measured row of each layer."""
    best: dict[str, dict] = {}
    for row in ok_rows(rows):
        if row["layer"] not in best or row["seconds"] < best[row["layer"]]["seconds"]:
            best[row["layer"]] = row
    return best


def settings_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """One panel per layer: the median time of each layout and precision, benchmark off and on side by side."""
    measured = ok_rows(rows)
    layers = list(dict.fromkeys(r["layer"] for r in measured))
    if not layers:
        raise ValueError("rows: no measured row to draw")
    columns = 2 if len(layers) > 1 else 1
    fig = make_subplots(rows=math.ceil(len(layers) / columns), cols=columns, subplot_titles=layers,
                        vertical_spacing=0.18, horizontal_spacing=0.1)
    for index, layer in enumerate(layers):
        where = dict(row=index // columns + 1, col=index % columns + 1)
        for j, benchmark in enumerate(BENCHMARKS):
            present = [r for r in measured if r["layer"] == layer and bool(r["benchmark"]) == benchmark]
            fig.add_trace(go.Bar(
                x=[f"{r['layout']}<br>{r['dtype']}" for r in present], y=[r["seconds"] * 1e6 for r in present],
                name=f"benchmark {'on' if benchmark else 'off'}", legendgroup=str(benchmark), showlegend=index == 0,
                marker=dict(color=plots.PALETTE[j], pattern_shape=plots.PATTERNS[j]),
                hovertext=[f"{r['setting']}<br>{r['seconds'] * 1e6:,.1f} us, {r['tflops']:,.1f} TFLOP/s<br>"
                           f"first call {_microseconds(r['first_call_s'])}" for r in present],
                hoverinfo="text",
            ), **where)
        fig.update_yaxes(title_text="time (us)", **where)
    fig.update_layout(title=title, barmode="group", height=330 * math.ceil(len(layers) / columns) + 80)
    return fig
