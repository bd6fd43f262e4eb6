"""The sizes of chapter 12 in every setting, and the work they make (:class:`gpulab.core.budget.Chapter`).

Every timed point of the chapter is one convolution measured by ``cudnn.measure_conv`` (or, for the deterministic
sweep, a layer's three passes by ``cudnn.measure_passes``), each in a fresh thread: a first call (with ``benchmark``
on, the autotuner times its candidates), a check against float64 ``F.conv2d`` on the GPU compared on the host, the
median of ``timing.measure`` (the L2 flushed before every repeat, up to 2,000 repeats of a short call), one call for
the workspace, and the kernels of two more calls from ``torch.profiler``. On a T4 the flush (a millisecond) outlasts
most of these convolutions, and TF32 and bfloat16 do not run.

:func:`measure_conv` and :func:`measure_passes` say what one such point costs.
"""

from __future__ import annotations

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.ch12_cudnn_convolution_algorithms.algorithms import applies, same_padding_layer, workspace_bytes
from gpulab.ch12_cudnn_convolution_algorithms.cudnn import FILTER_METHODS, PASSES
from gpulab.core import budget, flops
from gpulab.core.budget import Work, once

LAYERS = [  # convolutions of ResNet-50, as in chapter 5
    dict(name="conv1 7x7/2", c=3, h=224, w=224, k=64, r=7, s=7, stride=2, padding=3),
    dict(name="res2 3x3", c=64, h=56, w=56, k=64, r=3, s=3, stride=1, padding=1),
    dict(name="res2 1x1", c=256, h=56, w=56, k=64, r=1, s=1, stride=1, padding=0),
    dict(name="res4 3x3", c=256, h=14, w=14, k=256, r=3, s=3, stride=1, padding=1),
    dict(name="res5 3x3", c=512, h=7, w=7, k=512, r=3, s=3, stride=1, padding=1),
]
FULL = {
    "batch": 32,
    "layers": LAYERS,
    "precisions": ["float32", "tf32", "float16", "bfloat16"],  # float32 means TF32 off
    "layouts": ["NCHW", "NHWC"],
    "channels": [56, 60, 62, 63, 64, 65, 66, 68, 72],  # C = K, 3x3 filters on CHANNELS_SIZE^2 images
    "channels_batch": 32, "channels_size": 56, "channels_dtype": "float16",
    "talk_batch": 1, "talk_channels": 128, "talk_size": 128,  # the talk's convolution (N = 1: see "Which convolution?")
    "filter_sizes": [3, 11],
    "count_channels": 128, "count_size": 128,  # multiply counts are formulas: the talk's sizes even without a GPU
    "deterministic_layers": ["conv1 7x7/2", "res2 3x3", "res4 3x3"],
    "repeats": 3,  # runs of each pass compared bit for bit
    "count_batches": [1, 32], "count_filters": [1, 3, 5, 7, 9, 11, 13, 15],
}
# Without a GPU: the same experiments, small, so that a CPU computes them in seconds. tf32 stays in the list: it
# shows how a precision the device lacks is reported.
CPU = {**FULL, "batch": 1, "precisions": ["float32", "tf32", "bfloat16"],
       "layers": [{**spec, "h": max(7, spec["h"] // 2), "w": max(7, spec["w"] // 2)} for spec in LAYERS],
       "channels": [56, 60, 63, 64, 65, 68, 72], "channels_batch": 1, "channels_size": 28, "channels_dtype": "float32",
       "talk_channels": 32, "talk_size": 64, "deterministic_layers": ["res2 3x3", "res4 3x3"]}
SMOKE = {**FULL, "batch": 1, "precisions": ["float32"],
         "layers": [dict(name="3x3", c=8, h=12, w=12, k=8, r=3, s=3, stride=1, padding=1),
                    dict(name="5x5/2", c=3, h=16, w=16, k=8, r=5, s=5, stride=2, padding=2)],
         "channels": [7, 8], "channels_batch": 1, "channels_size": 8, "channels_dtype": "float32",
         "talk_channels": 4, "talk_size": 12, "filter_sizes": [3, 5], "deterministic_layers": ["3x3"], "repeats": 2,
         "count_filters": [1, 3, 5]}
CLASSES = [
    # Fewer points, full sizes (on a T4 a measurement's time is mostly its L2 flushes, one a millisecond before each
    # of up to 2,000 repeats: a smaller convolution gets more repeats and costs more, not less). Four of the five
    # layers (res5, the smallest, out); the channel counts 56, 63, 64, 65 and 72 (a multiple of 8 on each side of
    # the odd ones); the deterministic passes of conv1 and res4, whose gradients varied on the H200.
    {**FULL, "layers": LAYERS[:4], "channels": [56, 63, 64, 65, 72],
     "deterministic_layers": ["conv1 7x7/2", "res4 3x3"]},
    # All five layers; the channel counts 56, 60, 63, 64, 65, 66 and 72.
    {**FULL, "channels": [56, 60, 63, 64, 65, 66, 72]},
    FULL,  # the recordings' sizes
]

FIRST_CALL_SECONDS = 0.01  # a fresh thread, its settling convolution and the operands, on the host
AUTOTUNE_SECONDS, AUTOTUNE_CALLS = 0.1, 20  # benchmark=True's first call: up to 10 candidates timed (H200: 0.03 to
# 0.1 s in float32, up to 1 s where float16 channel counts are not multiples of 8; 0.13 s on average)
# backend.profile_kernels: two calls under torch.profiler in a point's thread, the profiler started once before
# (backend._prime_profiler): a session each, budget.PROFILER_SESSION_SECONDS (the H200 took 4 s between recordings
# for the 13 points of the filter sweep, 4 of them profiled, and 10 s for the 18 profiled points of the channel
# sweep, autotuning and checks included).
FP64_CONV_SHARE = 0.15  # cuDNN's float64 convolutions: generic kernels on the CUDA cores, no tensor cores
# The first cuDNN call of a process (loading its engine libraries) and of cuFFT: the H200 run took 80 s from chapter
# 10's last recording to this chapter's first, but chapter 11 ran in between (make gpu-run runs every notebook; its
# recordings of that run were replaced later), about 58 s by its own gaps: some 22 s are left for this chapter's
# cells before the benchmark sweep, its imports, its first profiler session and the sweep itself.
CUDNN_FIRST_USE_SECONDS = 10.0
BOOK_METHOD_SHARE = 0.05  # the book's own families in plain torch (a loop of tiles, transforms through memory)
SCRATCH = {"FFT": "FFT", "FFT tiled": "FFT tiled", "Winograd F(2x2, 3x3)": "Winograd nonfused"}  # method: workspace


def _operands(shape: conv.ConvLayer, size: int) -> float:
    return (shape.input_elements + shape.filter_elements + shape.output_elements) * size


def _host(label: str, seconds: float, measurements: int, dtype: str) -> Work:
    """``seconds`` on the host per point, where the GPU computes in ``dtype`` (elsewhere the sweep's row says "not
    run")."""
    return Work(label, measurements=measurements, extra_seconds=seconds, launches=0, requires=dtype)


def measure_conv(label: str, shape: conv.ConvLayer, dtype: str = "float32", method: str = "conv2d",
                 benchmark: bool = True, profile: bool = True, count: int = 1) -> list[Work]:
    """``count`` calls of ``cudnn.measure_conv`` on ``shape`` (see the module's docstring)."""
    size = flops.bytes_per_element(dtype)
    if method == "conv2d":
        call = dict(flops=shape.flops, bytes=_operands(shape, size), precision=dtype)
    elif method == "im2col + GEMM":  # the im2col matrix written and read, then one GEMM in the format
        call = dict(flops=shape.flops, bytes=2 * shape.im2col_elements * size + _operands(shape, size),
                    precision=dtype)
    else:  # the book's FFTs, Winograd and tiled implicit GEMM: float32 torch operations through memory
        scratch = workspace_bytes(shape, SCRATCH[method]) if method in SCRATCH else 0
        call = dict(flops=shape.flops, bytes=4 * scratch + _operands(shape, size), precision=dtype,
                    share=BOOK_METHOD_SHARE)
    autotune = benchmark and method == "conv2d"
    untimed = (AUTOTUNE_CALLS if autotune else 1) + 1 + 2 * profile  # first call (or autotuning), workspace, profile
    host = FIRST_CALL_SECONDS + AUTOTUNE_SECONDS * autotune + budget.PROFILER_SESSION_SECONDS * profile
    memory = 3 * _operands(shape, size) + 8 * _operands(shape, 1) + 2 * call["bytes"]
    return [once(f"{label}: first call, workspace, kernels", measurements=count * untimed, missing="skip", **call),
            _host(f"{label}: on the host", host, count, dtype),
            once(f"{label}: float64 reference", flops=shape.flops, precision="float64",
                 checked_elements=shape.output_elements, measurements=count, share=FP64_CONV_SHARE, requires=dtype),
            Work(f"{label}: timed", measurements=count, missing="skip", memory_bytes=memory, **call)]


def _layers(sizes: dict, names: list[str] | None = None) -> list[conv.ConvLayer]:
    return [conv.ConvLayer(n=sizes["batch"], **spec) for spec in sizes["layers"]
            if names is None or spec["name"] in names]


def measure_passes(shape: conv.ConvLayer, repeats: int) -> list[Work]:
    """One ``cudnn.measure_passes`` of ``shape`` in float32 with benchmark on: per pass, a float64 reference,
    autotuning, the repeats compared bit for bit, a check, the timing and the profile. The three passes do the same
    arithmetic; their results are the output, the input and the filters."""
    passes = len(PASSES)
    call = dict(flops=shape.flops, bytes=_operands(shape, 4))
    compared = (shape.output_elements + shape.input_elements + shape.filter_elements) / passes
    host = FIRST_CALL_SECONDS + AUTOTUNE_SECONDS + budget.PROFILER_SESSION_SECONDS  # repeats compared on the GPU
    return [once("deterministic: autotuning, repeats, kernels", measurements=passes * (AUTOTUNE_CALLS + repeats + 2),
                 **call),
            budget.host_seconds("deterministic: on the host", host, measurements=passes),
            once("deterministic: float64 reference", flops=shape.flops, precision="float64", checked_elements=compared,
                 measurements=passes, share=FP64_CONV_SHARE),
            Work("deterministic: timed", measurements=passes,
                 memory_bytes=2 * (3 * _operands(shape, 4) + 8 * _operands(shape, 1)), **call)]


def work(sizes: dict) -> list[Work]:
    layers = _layers(sizes)
    found = []
    for shape in layers:  # benchmark off and on
        found += measure_conv("benchmark: off", shape, benchmark=False) + measure_conv("benchmark: on", shape)
    for dtype in sizes["precisions"]:
        for shape in layers:
            found += measure_conv(f"layouts: {dtype}", shape, dtype, count=len(sizes["layouts"]))
            found += measure_conv(f"layouts: {dtype} im2col", shape, dtype, "im2col + GEMM", benchmark=False,
                                  profile=False)
    for c in sizes["channels"]:
        shape = same_padding_layer(sizes["channels_batch"], c, sizes["channels_size"], c, 3)
        found += measure_conv("channels", shape, sizes["channels_dtype"], count=len(sizes["layouts"]))
    for r in sizes["filter_sizes"]:
        shape = same_padding_layer(sizes["talk_batch"], sizes["talk_channels"], sizes["talk_size"],
                                   sizes["talk_channels"], r)
        for method in FILTER_METHODS:
            if not applies(method, shape):
                continue
            if method == "conv2d":
                found += (measure_conv("filter sizes: off", shape, benchmark=False)
                          + measure_conv("filter sizes: on", shape))
            else:
                found += measure_conv(f"filter sizes: {method}", shape, method=method, benchmark=False,
                                      profile=False)
    for shape in _layers(sizes, sizes["deterministic_layers"]):
        found += measure_passes(shape, sizes["repeats"]) * 2  # deterministic off and on
    return found


def fixed_seconds(sizes: dict) -> float:
    """The notebook; cuDNN's and cuFFT's first use; the profiler's first session (``backend._prime_profiler``)."""
    return budget.NOTEBOOK_SECONDS + CUDNN_FIRST_USE_SECONDS + budget.PROFILER_START_SECONDS


CHAPTER = budget.Chapter(name="12 cuDNN and convolution algorithms", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE,
                         work=work, fixed_seconds=fixed_seconds)
