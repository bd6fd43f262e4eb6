"""Chapter 05's measurements: the memory each convolution method needs beyond its output, and its time on
the course's layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from gpulab.ch05_convolutions_as_gemms.conv import (
    TILE_BYTES,
    ConvLayer,
    _reference,
    conv2d_direct,
    conv2d_im2col,
    conv2d_implicit_gemm,
    im2col,
    layer,
    tile_rows_for,
)
from gpulab.core import env, timing
from gpulab.core.correctness import check_close, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, supported_dtype


def peak_extra_bytes(fn: Callable[[], torch.Tensor], device: torch.device) -> int | None:
    """Bytes ``fn()`` allocates on a CUDA device at its peak beyond its result (None on a CPU).

    Measured with the caching allocator's statistics, which also see cuDNN's workspace (torch
    allocates it). A CPU has no such counter; there the chapter accounts for the buffers instead.
    """
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return max(0, peak - before - result.numel() * result.element_size())


def measure_memory(spec: ConvLayer | dict, dtype: str = "float32", tile_bytes: int = TILE_BYTES,
                   device: torch.device | None = None) -> dict:
    """The im2col matrix of one layer, built and weighed, against its input; peak extra memory of each method.

    ``input_bytes`` and ``im2col_bytes`` are the sizes of the tensors actually built; the im2col
    matrix is first checked against ``torch.nn.functional.unfold``. On a GPU, ``*_peak_extra_bytes``
    are measured; everywhere, ``tile_bytes`` is the size of the implicit GEMM's one tile (at most the
    ``tile_bytes`` asked for).
    """
    device = device or env.device()
    shape, label = layer(spec), supported_dtype("dtype", dtype, device)
    with matmul_mode(label) as torch_dtype:
        size = torch.empty((), dtype=torch_dtype).element_size()
        tile_rows = tile_rows_for(shape, size, tile_bytes)
        fits_in_memory("layer", (2 * shape.im2col_elements + shape.input_elements + 2 * shape.output_elements) * size,
                       device)
        x = random_tensor((shape.n, shape.c, shape.h, shape.w), torch_dtype, device)
        weight = random_tensor((shape.k, shape.c, shape.r, shape.s), torch_dtype, device)
        columns = im2col(x, shape.r, shape.s, shape.stride, shape.padding)
        unfolded = F.unfold(x, (shape.r, shape.s), stride=shape.stride, padding=shape.padding)  # N x CRS x PQ
        if not torch.equal(columns, unfolded.transpose(0, 1).reshape(shape.gemm_k, shape.gemm_m)):
            raise AssertionError(f"im2col: differs from torch.nn.functional.unfold for {shape.describe()}")
        row = {
            **shape.as_dict(), "dtype": label, "input_bytes": x.numel() * x.element_size(),
            "filter_bytes": weight.numel() * weight.element_size(),
            "im2col_bytes": columns.numel() * columns.element_size(),
            "tile_rows": tile_rows, "tile_bytes": tile_rows * shape.gemm_k * size,
            "output_bytes": shape.output_elements * size,
        }
        del columns, unfolded
        row["blowup"] = row["im2col_bytes"] / row["input_bytes"]
        row["predicted_blowup"] = shape.r * shape.s * shape.p * shape.q / (shape.h * shape.w)
        methods = {"im2col": lambda: conv2d_im2col(x, weight, shape.stride, shape.padding),
                   "implicit": lambda: conv2d_implicit_gemm(x, weight, shape.stride, shape.padding, tile_rows),
                   "torch": lambda: F.conv2d(x, weight, stride=shape.stride, padding=shape.padding)}
        for name, fn in methods.items():
            fn()  # a first call loads kernels (and cuDNN's) so that their one-off allocations are not counted
            row[f"{name}_peak_extra_bytes"] = peak_extra_bytes(fn, device)
    return row


def layers_by_name(layers: Sequence[ConvLayer | dict]) -> dict[str, ConvLayer]:
    """The layers keyed by their names (or descriptions); an empty list or two layers of one name is an error."""
    shapes = [layer(spec) for spec in layers]
    if not shapes:
        raise ValueError("layers: expected at least one layer, got an empty list")
    named = {shape.name or shape.describe(): shape for shape in shapes}
    if len(named) != len(shapes):
        raise ValueError("layers: two layers have the same name; give each its own")
    return named


@experiment("conv_memory")
def memory_sweep(layers: Sequence[ConvLayer | dict], dtype: str = "float32",
                 tile_bytes: int = TILE_BYTES) -> list[dict]:
    """:func:`measure_memory` for every layer; a layer too big for memory is a row saying so."""
    named = layers_by_name(layers)
    return run_sweep(lambda layer, dtype: measure_memory(named[layer], dtype, tile_bytes),
                     [{"layer": label, "dtype": dtype} for label in named])






METHODS = ("direct", "im2col + GEMM", "GEMM alone", "implicit GEMM (tiled)", "conv2d NCHW", "conv2d NHWC")


def _method_calls(shape: ConvLayer, x: torch.Tensor, weight: torch.Tensor,
                  tile_rows: int) -> dict[str, Callable[[], torch.Tensor]]:
    st, pad = shape.stride, shape.padding
    columns = im2col(x, shape.r, shape.s, st, pad)  # for "GEMM alone": the matrix is given, only the multiply runs
    filters = weight.reshape(shape.k, shape.gemm_k)
    x_last, weight_last = (t.to(memory_format=torch.channels_last) for t in (x, weight))
    return {
        "direct": lambda: conv2d_direct(x, weight, st, pad),
        "im2col + GEMM": lambda: conv2d_im2col(x, weight, st, pad),
        "GEMM alone": lambda: filters @ columns,
        "implicit GEMM (tiled)": lambda: conv2d_implicit_gemm(x, weight, st, pad, tile_rows),
        "conv2d NCHW": lambda: F.conv2d(x, weight, stride=st, padding=pad),
        "conv2d NHWC": lambda: F.conv2d(x_last, weight_last, stride=st, padding=pad),
    }


def measure_layer(spec: ConvLayer | dict, dtype: str = "float32", methods: Sequence[str] = METHODS,
                  direct_max_positions: int = 784, tile_bytes: int = TILE_BYTES,
                  device: torch.device | None = None) -> list[dict]:
    """Check, then time, each method on one layer: a row per method with seconds, TFLOP/s and the GEMM sizes.

    ``direct`` runs only where P Q <= ``direct_max_positions`` (it makes P Q Python iterations).
    ``conv2d NCHW`` and ``conv2d NHWC`` are torch's own convolution (cuDNN on a GPU) on the input in
    each layout. Each method's result is compared with float64 ``F.conv2d`` on the same fresh
    random data before it is timed.
    """
    device = device or env.device()
    shape, label = layer(spec), supported_dtype("dtype", dtype, device)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(METHODS)}")
    positive_int("direct_max_positions", direct_max_positions)
    rows = []
    with matmul_mode(label) as torch_dtype:
        size = torch.empty((), dtype=torch_dtype).element_size()
        # input (twice: both layouts), filters, im2col matrix, outputs, and the float64 reference
        fits_in_memory("layer", (2 * shape.input_elements + shape.im2col_elements + 3 * shape.output_elements) * size
                       + (shape.input_elements + shape.output_elements) * 8, device)
        x = random_tensor((shape.n, shape.c, shape.h, shape.w), torch_dtype, device)
        weight = random_tensor((shape.k, shape.c, shape.r, shape.s), torch_dtype, device)
        reference = _reference(x, weight, shape.stride, shape.padding)
        calls = _method_calls(shape, x, weight, tile_rows_for(shape, size, tile_bytes))
        for method in methods:
            if method == "direct" and shape.p * shape.q > direct_max_positions:
                continue
            result = calls[method]()
            if method == "GEMM alone":  # K x NPQ: compare in the same order
                result = result.reshape(shape.k, shape.n, shape.p, shape.q).transpose(0, 1)
            error = check_close(result, reference, MATMUL_TOLERANCE[label], f"{method}, {shape.describe()}")
            del result
            measured = timing.measure(calls[method], device=device)
            rows.append({
                "layer": shape.name or shape.describe(), "method": method, "dtype": label, **shape.as_dict(),
                "seconds": measured.median_s, "spread": measured.spread,
                "tflops": shape.flops / measured.median_s / 1e12, "relative_error": error,
            })
    return rows


@experiment("conv_layers")
def layers_sweep(layers: Sequence[ConvLayer | dict], dtypes: Sequence[str], methods: Sequence[str] = METHODS,
                 direct_max_positions: int = 784, tile_bytes: int = TILE_BYTES) -> list[dict]:
    """:func:`measure_layer` for every dtype and layer; a layer too big for memory is one row saying so."""
    named = layers_by_name(layers)

    def measure(layer: str, dtype: str) -> dict:
        return {"rows": measure_layer(named[layer], dtype, methods, direct_max_positions, tile_bytes)}

    rows = []
    for outcome in run_sweep(measure, [{"layer": label, "dtype": dtype} for dtype in dtypes for label in named]):
        if outcome["status"] == "ok":
            rows.extend({**r, "status": "ok"} for r in outcome["rows"])
        else:
            rows.append({**named[outcome["layer"]].as_dict(), **outcome})
    return rows
