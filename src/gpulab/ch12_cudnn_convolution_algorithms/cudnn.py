"""cuDNN and its convolution algorithms: what torch hands cuDNN, the algorithm families, and what they cost.

A convolution in torch goes to a backend chosen for the tensors at hand (:func:`conv_backend`): cuDNN
for CUDA tensors, oneDNN (MKL-DNN) or torch's own im2col + GEMM on a CPU. cuDNN is told about the data
through *descriptors* -- sizes, strides and data type of each tensor (:func:`.backend.conv_descriptors`) --
and picks one of several *algorithms* for the same arithmetic. The families, as the cuDNN API names
them (``CUDNN_CONVOLUTION_FWD_ALGO_*``):

- ``GEMM``: im2col, then one GEMM (:func:`gpulab.ch05_convolutions_as_gemms.conv.conv2d_im2col`); the workspace is the
  im2col matrix;
- ``IMPLICIT_GEMM`` and ``IMPLICIT_PRECOMP_GEMM``: the same GEMM, its tiles gathered on chip
  (:func:`gpulab.ch05_convolutions_as_gemms.conv.conv2d_implicit_gemm`); the second precomputes the gather's offsets;
- ``FFT`` and ``FFT_TILING``: transform, multiply point by point, transform back
  (:func:`.algorithms.conv2d_fft`, :func:`.algorithms.conv2d_fft_tiled`); the cost hardly depends on the filter size;
- ``WINOGRAD`` and ``WINOGRAD_NONFUSED``: minimal filtering, 16 multiplies instead of 36 for a 2 x 2
  output tile of a 3 x 3 filter (:func:`.algorithms.conv2d_winograd`).

:func:`.algorithms.multiplies` and :func:`workspace_bytes` count what each family costs, and every implementation
here is checked against float64 ``F.conv2d`` (:func:`.algorithms.check_families`).

The experiments (:func:`benchmark_sweep`, :func:`layouts_precisions_sweep`, :func:`channels_sweep`,
:func:`filter_sizes_sweep`, :func:`deterministic_sweep`) time torch's convolution under cuDNN's
switches (``torch.backends.cudnn.benchmark``, ``deterministic``, ``allow_tf32``), layouts and number
formats, and read which kernels ran from ``torch.profiler`` (:func:`profile_kernels`). Each point runs
in a thread of its own (:func:`in_fresh_thread`): torch keeps the plan it chose for a convolution in a
cache per thread, so a new thread must choose again, and what an earlier cell ran cannot leak into a
measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from gpulab.ch05_convolutions_as_gemms import conv, sweeps
from gpulab.ch12_cudnn_convolution_algorithms.algorithms import (
    FAMILY_IMPLEMENTATIONS,
    TALK_SIZES,
    applies,
    same_padding_layer,
    workspace_bytes,
)
from gpulab.ch12_cudnn_convolution_algorithms.backend import (
    KERNELS_KEPT,
    _prime_profiler,
    conv_backend,
    cudnn_settings,
    in_fresh_thread,
    main_family,
    profile_kernels,
)
from gpulab.core import env, timing
from gpulab.core.correctness import check_close, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, supported_dtype, unsupported_reason

LAYOUTS = ("NCHW", "NHWC")


METHODS = ("conv2d", *FAMILY_IMPLEMENTATIONS)


def _call(method: str, shape: conv.ConvLayer, x: torch.Tensor, weight: torch.Tensor) -> Callable[[], torch.Tensor]:
    stride, padding = shape.stride, shape.padding
    if method == "conv2d":
        return lambda: F.conv2d(x, weight, stride=stride, padding=padding)
    if method == "implicit GEMM (tiled)":
        rows = conv.tile_rows_for(shape, x.element_size(), conv.TILE_BYTES)
        return lambda: conv.conv2d_implicit_gemm(x, weight, stride, padding, rows)
    implementation = FAMILY_IMPLEMENTATIONS[method]
    return lambda: implementation(x, weight, stride, padding)


def _first_call(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[float, int | None, torch.Tensor]:
    """(wall seconds, peak bytes beyond the result on a GPU or None, result) of one call from an idle device."""
    timing.synchronize(device)
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    result = fn()
    timing.synchronize(device)
    seconds = time.perf_counter() - start
    if device.type != "cuda":
        return seconds, None, result
    extra = torch.cuda.max_memory_allocated(device) - before - result.numel() * result.element_size()
    return seconds, max(0, extra), result


def _operand_bytes(shape: conv.ConvLayer, element_bytes: int, method: str) -> int:
    """Memory a measurement needs: operands in both layouts, outputs, the float64 reference, and the method's
    scratch memory by the model of :func:`workspace_bytes` (the im2col matrix for the explicit GEMM)."""
    scratch = {"im2col + GEMM": "GEMM", "FFT": "FFT", "FFT tiled": "FFT tiled",
               "Winograd F(2x2, 3x3)": "Winograd nonfused"}.get(method)
    work = workspace_bytes(shape, scratch, element_bytes) if scratch and applies(method, shape) else 0
    return ((2 * shape.input_elements + shape.filter_elements + 3 * shape.output_elements) * element_bytes
            + (shape.input_elements + shape.filter_elements + shape.output_elements) * 8 + 2 * work)


def _settle_thread(dtype: torch.dtype, layout: str, device: torch.device) -> None:
    """A small convolution of another shape, so that a thread's one-off costs (its cuDNN handle, loading
    the library) are not charged to the first call that is measured."""
    x = torch.ones((1, 8, 8, 8), dtype=dtype, device=device)
    weight = torch.ones((8, 8, 3, 3), dtype=dtype, device=device)
    if layout == "NHWC":
        x, weight = x.to(memory_format=torch.channels_last), weight.to(memory_format=torch.channels_last)
    F.conv2d(x, weight, padding=1)
    timing.synchronize(device)


def measure_conv(spec: conv.ConvLayer | dict, method: str = "conv2d", dtype: str = "float32", layout: str = "NCHW",
                 benchmark: bool = False, deterministic: bool = False, profile: bool = True,
                 device: torch.device | None = None) -> dict:
    """One convolution, measured in a fresh thread (:func:`in_fresh_thread`): a row of plain values.

    ``method`` is 'conv2d' (torch's convolution: cuDNN on a GPU) or one of :data:`FAMILY_IMPLEMENTATIONS`
    (NCHW only); ``dtype`` a book dtype ('tf32': float32 data, TF32 allowed; 'float32': TF32 off);
    ``layout`` NCHW or NHWC (channels_last input and filters); ``benchmark`` and ``deterministic`` are cuDNN's
    switches. In order: the first call on fresh random data (wall time, and on a GPU the peak memory
    beyond its output: with ``benchmark`` that is the autotuner at work), its result checked against float64
    ``F.conv2d`` (AssertionError if wrong), the steady-state time (:func:`gpulab.core.timing.measure`), the
    steady-state peak extra memory (the workspace, on a GPU), and the kernels of two more calls.
    """
    device = device or env.device()
    shape, label = conv.layer(spec), supported_dtype("dtype", dtype, device)
    if method not in METHODS:
        raise ValueError(f"method: choose one of {', '.join(METHODS)}; got {method!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: choose one of {', '.join(LAYOUTS)}; got {layout!r}")
    if method != "conv2d" and layout != "NCHW":
        raise ValueError(f"layout: gpulab's {method} takes NCHW input; only conv2d runs on NHWC")
    if not applies(method, shape):
        raise ValueError(f"method: {method} does not compute {shape.describe()}")
    if method in ("FFT", "FFT tiled") and label not in ("float32", "tf32", "float64"):
        raise ValueError(f"dtype: gpulab's {method} computes in float32 or float64, got {label}")
    if profile:
        _prime_profiler()
    size = torch.empty((), dtype=torch.float32 if label == "tf32" else getattr(torch, label)).element_size()
    fits_in_memory("layer", _operand_bytes(shape, size, method), device)

    def work() -> dict:
        with cudnn_settings(benchmark=benchmark, deterministic=deterministic), matmul_mode(label) as torch_dtype:
            _settle_thread(torch_dtype, layout, device)
            x = random_tensor((shape.n, shape.c, shape.h, shape.w), torch_dtype, device)
            weight = random_tensor((shape.k, shape.c, shape.r, shape.s), torch_dtype, device)
            if layout == "NHWC":
                x, weight = x.to(memory_format=torch.channels_last), weight.to(memory_format=torch.channels_last)
            call = _call(method, shape, x, weight)
            first_seconds, first_extra, result = _first_call(call, device)
            reference = F.conv2d(x.double(), weight.double(), stride=shape.stride, padding=shape.padding)
            error = check_close(result, reference, MATMUL_TOLERANCE[label], f"{method} {label} {layout}, "
                                f"{shape.describe()}")
            del result, reference
            measured = timing.measure(call, device=device)
            extra = sweeps.peak_extra_bytes(call, device)
            kernels = profile_kernels(call, device) if profile else []
            backend = conv_backend(x, weight, shape.stride, shape.padding) if method == "conv2d" else "gpulab"
        return {
            "layer": shape.name or shape.describe(), "method": method, "dtype": label, "layout": layout,
            "benchmark": benchmark if method == "conv2d" else None,
            "deterministic": deterministic if method == "conv2d" else None, "backend": backend,
            **shape.as_dict(), "first_call_seconds": first_seconds, "first_call_extra_bytes": first_extra,
            "seconds": measured.median_s, "spread": measured.spread, "tflops": shape.flops / measured.median_s / 1e12,
            "relative_error": error, "peak_extra_bytes": extra, "im2col_bytes": shape.im2col_elements * size,
            "algorithm": main_family(kernels) if kernels else None, "kernels": kernels[:KERNELS_KEPT],
        }

    return in_fresh_thread(work)


PASSES = ("forward", "data gradient", "weight gradient")


def _pass_call(which: str, shape: conv.ConvLayer, x: torch.Tensor, weight: torch.Tensor,
               grad: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The forward pass, or one of the two backward convolutions alone (aten's convolution_backward with one
    output asked for): dL/dx from dL/dy and the filters, dL/dw from dL/dy and the input."""
    stride, padding = [shape.stride] * 2, [shape.padding] * 2
    if which == "forward":
        return lambda: F.conv2d(x, weight, stride=shape.stride, padding=shape.padding)
    index = PASSES.index(which) - 1  # 0: data gradient, 1: weight gradient
    mask = [index == 0, index == 1, False]
    return lambda: torch.ops.aten.convolution_backward(grad, x, weight, None, stride, padding, [1, 1], False,
                                                       [0, 0], 1, mask)[index]


def measure_passes(spec: conv.ConvLayer | dict, dtype: str = "float32", deterministic: bool = False,
                   benchmark: bool = True, repeats: int = 3, profile: bool = True,
                   device: torch.device | None = None) -> list[dict]:
    """The forward pass and both backward convolutions of one layer, in a fresh thread: a row per pass.

    Each pass is checked against float64 on fresh random data, then run ``repeats`` times on the same
    data: ``identical`` says whether every repeat equals the first bit for bit, ``max_difference`` is the
    largest difference between repeats over the largest value. Then it is timed, and its kernels listed.
    """
    device = device or env.device()
    shape, label = conv.layer(spec), supported_dtype("dtype", dtype, device)
    repeats = positive_int("repeats", repeats)
    if repeats < 2:
        raise ValueError(f"repeats: at least 2 to compare runs, got {repeats}")
    if profile:
        _prime_profiler()
    size = torch.empty((), dtype=torch.float32 if label == "tf32" else getattr(torch, label)).element_size()
    fits_in_memory("layer", _operand_bytes(shape, size, "conv2d") * 2, device)

    def work() -> list[dict]:
        rows = []
        with cudnn_settings(benchmark=benchmark, deterministic=deterministic), matmul_mode(label) as torch_dtype:
            _settle_thread(torch_dtype, "NCHW", device)
            x = random_tensor((shape.n, shape.c, shape.h, shape.w), torch_dtype, device)
            weight = random_tensor((shape.k, shape.c, shape.r, shape.s), torch_dtype, device)
            grad = random_tensor((shape.n, shape.k, shape.p, shape.q), torch_dtype, device)
            operands64 = (x.double(), weight.double(), grad.double())
            for which in PASSES:
                call = _pass_call(which, shape, x, weight, grad)
                reference = _pass_call(which, shape, *operands64)()
                results = [call().clone() for _ in range(repeats)]
                error = check_close(results[0], reference, MATMUL_TOLERANCE[label],
                                    f"{which} {label}, {shape.describe()}")
                scale = results[0].abs().max().item() or 1.0
                difference = max((r - results[0]).abs().max().item() for r in results[1:]) / scale
                identical = all(torch.equal(results[0], r) for r in results[1:])
                del results, reference
                measured = timing.measure(call, device=device)
                kernels = profile_kernels(call, device) if profile else []
                rows.append({
                    "layer": shape.name or shape.describe(), "pass": which, "dtype": label, "benchmark": benchmark,
                    "deterministic": deterministic, **shape.as_dict(), "repeats": repeats, "identical": identical,
                    "max_difference": difference, "relative_error": error, "seconds": measured.median_s,
                    "spread": measured.spread, "tflops": shape.flops / measured.median_s / 1e12,
                    "algorithm": main_family(kernels) if kernels else None, "kernels": kernels[:KERNELS_KEPT],
                })
        return rows

    return in_fresh_thread(work)






def _sweep(measure: Callable[..., dict], points: list[dict], fixed: dict) -> list[dict]:
    """run_sweep over ``points``: a point too big for memory is a row saying so, with ``fixed`` added."""
    return [{**fixed, **row} for row in run_sweep(measure, points)]


@experiment("cudnn_benchmark")
def benchmark_sweep(layers: Sequence[conv.ConvLayer | dict], dtype: str = "float32",
                    layout: str = "NCHW") -> list[dict]:
    """Each layer's torch convolution with ``cudnn.benchmark`` off (cuDNN's heuristics pick the algorithm) and
    on (the autotuner times the candidates at the first call): a row per layer and setting, from
    :func:`measure_conv`, with the first call's time and memory, the steady-state time and workspace, the
    im2col matrix's size for comparison, and the kernels that ran."""
    named = sweeps.layers_by_name(layers)

    def measure(layer: str, benchmark: bool) -> dict:
        return measure_conv(named[layer], "conv2d", dtype, layout, benchmark=benchmark)

    return _sweep(measure, [{"layer": name, "benchmark": flag} for name in named for flag in (False, True)],
                  {"method": "conv2d", "dtype": dtype, "layout": layout})


@experiment("cudnn_layouts_precisions")
def layouts_precisions_sweep(layers: Sequence[conv.ConvLayer | dict], precisions: Sequence[str],
                             layouts: Sequence[str] = LAYOUTS, benchmark: bool = True,
                             im2col: bool = True) -> list[dict]:
    """torch's convolution on every layer in every precision and layout (and, with ``im2col``, gpulab's
    im2col + GEMM on NCHW data beside it), with ``cudnn.benchmark`` as given. A precision this device does
    not compute in gives one row with status 'not run' and the reason."""
    named, device, rows = sweeps.layers_by_name(layers), env.device(), []
    for precision in precisions:
        reason = unsupported_reason(precision, device)
        if reason is not None:
            rows.append({"dtype": precision, "status": "not run", "reason": reason})
            continue
        points = [{"layer": name, "method": "conv2d", "layout": layout} for name in named for layout in layouts]
        points += [{"layer": name, "method": "im2col + GEMM", "layout": "NCHW"} for name in named] if im2col else []

        def measure(layer: str, method: str, layout: str, precision: str = precision) -> dict:
            return measure_conv(named[layer], method, precision, layout, benchmark=benchmark,
                                profile=method == "conv2d")  # the im2col method's kernels are known

        rows += _sweep(measure, points, {"dtype": precision})
    return rows


@experiment("cudnn_channels")
def channels_sweep(channels: Sequence[int], batch: int, size: int, filter_size: int = 3, dtype: str = "float16",
                   layouts: Sequence[str] = LAYOUTS, benchmark: bool = True) -> list[dict]:
    """torch's convolution with C = K = each of ``channels`` (``batch`` images of ``size`` x ``size``, "same"
    padding) in ``dtype`` and each layout: does a channel count that is not a multiple of 8 cost more than
    its extra arithmetic? A row per point from :func:`measure_conv`, with ``multiple_of_8``."""
    batch, size = positive_int("batch", batch), positive_int("size", size)
    shapes = {c: same_padding_layer(batch, c, size, c, filter_size, name=f"C=K={c}")
              for c in positive_ints("channels", channels)}

    def measure(c: int, layout: str) -> dict:
        return {**measure_conv(shapes[c], "conv2d", dtype, layout, benchmark=benchmark), "multiple_of_8": c % 8 == 0}

    return _sweep(measure, [{"c": c, "layout": layout} for c in shapes for layout in layouts], {"dtype": dtype})


FILTER_METHODS = ("conv2d", "im2col + GEMM", "implicit GEMM (tiled)", "FFT", "FFT tiled", "Winograd F(2x2, 3x3)")


@experiment("cudnn_filter_sizes")
def filter_sizes_sweep(filter_sizes: Sequence[int], batch: int = 1, channels: int = TALK_SIZES["c"],
                       size: int = TALK_SIZES["h"], dtype: str = "float32",
                       methods: Sequence[str] = FILTER_METHODS) -> list[dict]:
    """The talk's convolution (C = K = ``channels`` of ``size`` x ``size``, N = ``batch``, "same" padding) for
    each filter size: torch's convolution with ``cudnn.benchmark`` off and on, and gpulab's implementation
    of each family that applies (:data:`FAMILY_IMPLEMENTATIONS`), in ``dtype`` (float32: TF32 off, as the talk).
    A row per filter and method from :func:`measure_conv`, with its multiply count and workspace model."""
    unknown = [m for m in methods if m not in FILTER_METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(FILTER_METHODS)}")
    shapes = {r: same_padding_layer(positive_int("batch", batch), channels, size, channels, r)
              for r in positive_ints("filter_sizes", filter_sizes)}
    points = []
    for r, shape in shapes.items():
        for method in methods:
            if not applies(method, shape):
                continue
            flags = (False, True) if method == "conv2d" else (False,)
            points += [{"filter_size": r, "method": method, "benchmark": flag} for flag in flags]

    def measure(filter_size: int, method: str, benchmark: bool) -> dict:
        return measure_conv(shapes[filter_size], method, dtype, "NCHW", benchmark=benchmark,
                            profile=method == "conv2d")  # gpulab's own methods: their algorithm is their name

    return _sweep(measure, points, {"dtype": dtype, "batch": batch, "channels": channels, "size": size})


@experiment("cudnn_deterministic")
def deterministic_sweep(layers: Sequence[conv.ConvLayer | dict], dtype: str = "float32", repeats: int = 3,
                        benchmark: bool = True) -> list[dict]:
    """Each layer's forward pass and both backward convolutions with ``cudnn.deterministic`` off and on: a row
    per layer, setting and pass from :func:`measure_passes`, with the time and whether repeats agreed bit for bit."""
    named = sweeps.layers_by_name(layers)

    def measure(layer: str, deterministic: bool) -> dict:
        return {"rows": measure_passes(named[layer], dtype, deterministic, benchmark, repeats)}

    rows = []
    for outcome in run_sweep(measure, [{"layer": name, "deterministic": flag} for name in named
                                       for flag in (False, True)]):
        if outcome["status"] == "ok":
            rows += [{**r, "status": "ok"} for r in outcome["rows"]]
        else:  # too big for memory: one row that says so
            rows.append({**named[outcome["layer"]].as_dict(), **outcome, "dtype": dtype})
    return rows
