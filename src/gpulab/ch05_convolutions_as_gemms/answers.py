"""Worked answers to chapter 05's exercises, every number computed when the answer is shown: from the chapter's
layers and layouts, the GPU table (:mod:`gpulab.core.specs`) and each recorded GPU's measurements.

:func:`per_gpu` is the one way these answers (and chapters 06 to 08's) speak of every recorded GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gpulab.ch05_convolutions_as_gemms import conv, plan
from gpulab.core import budget, flops, recordings, specs
from gpulab.core.printing import Answer, format_bytes
from gpulab.core.recordings import Recording


def per_gpu(runs: Sequence[Recording], line: Callable[[Recording], str | None], missing: str) -> list[str]:
    """One list item per recorded GPU, ``line(run)`` (None: that GPU has nothing to say), or ``missing``."""
    lines = [f"- **{run.short_label}**: {text}" for run in runs if (text := line(run))]
    return lines or [missing]


def exercise_1() -> Answer:
    layer = conv.ConvLayer(1, 3, 7, 7, 2, 3, 3, stride=conv.COURSE_STRIDE)
    return Answer("Answer to exercise 1", (
        f"The output is P x Q = {layer.p} x {layer.q}: ({layer.h} - {layer.r}) / {layer.stride} + 1 = {layer.p} "
        f"along each axis. The GEMM's rows are the output pixels of the batch, M = N P Q = {layer.gemm_m}; its "
        f"columns are the filters, N = K = {layer.gemm_n}; its reduction is one window, K = C R S = "
        f"{layer.c} x {layer.r} x {layer.s} = {layer.gemm_k}.",
        f"The im2col matrix holds C R S x N P Q = {layer.gemm_k} x {layer.gemm_m} = {layer.im2col_elements} "
        f"numbers against the input's N C H W = {layer.input_elements}: {layer.blowup:.2f} times the input, "
        f"which is R S P Q / (H W) = {layer.r * layer.s} x {layer.p * layer.q} / {layer.h * layer.w}.",
        f"`conv.ConvLayer(1, 3, 7, 7, 2, 3, 3, stride=2)` agrees: `gemm_m`, `gemm_n`, `gemm_k` = {layer.gemm_m}, "
        f"{layer.gemm_n}, {layer.gemm_k}, `blowup` = {layer.blowup:.3f}, and `flops` = 2 M N K = {layer.flops}, the "
        "convolution's share of the worked example's arithmetic.",
    ))


def exercise_2() -> Answer:
    same = conv.ConvLayer(1, 1, 7, 7, 1, 3, 3, padding=1)
    valid = conv.ConvLayer(1, 1, 7, 7, 1, 3, 3, padding=0)
    strided = [conv.ConvLayer(1, 1, 7, 7, 1, 3, 3, stride=u, padding=1) for u in range(1, 6)]
    first = next(layer for layer in strided if layer.blowup < 1)
    taps, pixels = same.r * same.s, same.h * same.w
    return Answer("Answer to exercise 2", (
        "The ratio is R S P Q / (H W): padding and stride change it only through the output size P x Q.",
        f"Less padding, a smaller output: with no padding the {same.h} x {same.w} image gives P = Q = {valid.p}, "
        f"and the ratio falls from {same.blowup:g} to {taps} x {valid.p * valid.q} / {pixels} = "
        f"{valid.blowup:.2f}, {same.blowup / valid.blowup:.2f} times smaller (the border pixels are copied less "
        "often).",
        f"A stride u shrinks P and Q by about u each, so the ratio is about R S / u^2, below 1 once u^2 > {taps}. "
        f"With padding {same.padding} on the same image:",
        *(f"- stride {layer.stride}: P = Q = {layer.p}, ratio {layer.blowup:.2f}" for layer in strided),
        f"So stride {first.stride} is the first below 1: its windows no longer overlap (u > R = {first.r}), and some "
        "pixels are never read at all.",
    ))


def _speedups(run: Recording, method: str = "conv2d NHWC") -> dict[str, float]:
    """Per layer of a conv_layers recording: the float16 rate of ``method`` over its float32 rate."""
    rate = {(r["layer"], r["dtype"]): r["tflops"] for r in run.rows if r.get("method") == method}
    return {layer: rate[layer, "float16"] / rate[layer, "float32"] for layer, dtype in rate
            if dtype == "float32" and (layer, "float16") in rate}


def exercise_3() -> Answer:
    t4, hopper = specs.gpu("T4"), specs.gpu("H100 SXM5 80GB")
    peaks = [(g.name, specs.peak(g, "tf32").tflops, specs.peak(g, "float32").tflops)
             for g in (specs.gpu("A100 SXM4 80GB"), hopper)]
    ceilings = "; ".join(f"{name}: {tf32:,.0f} against {fp32:,.1f} TFLOP/s, {tf32 / fp32:.1f} times"
                         for name, tf32, fp32 in peaks)
    half = specs.peak(hopper, "tf32").ops_per_s / specs.peak(hopper, "float16").ops_per_s
    first = plan.layers(plan.FULL)[0]

    def gemm(run: Recording) -> str | None:
        rate = {r["dtype"]: r["measured"] for r in run.rows if str(r.get("work", "")).startswith("matmul")}
        if "tf32" not in rate or "float32" not in rate:
            return None
        return (f"its GEMM ran {rate['tf32']:,.0f} TFLOP/s in tf32 against {rate['float32']:,.1f} in float32, "
                f"{rate['tf32'] / rate['float32']:.1f} times (chapter 01)")

    def convolutions(run: Recording) -> str | None:
        gains = _speedups(run)
        if not gains:
            return None
        best, worst = max(gains, key=gains.get), min(gains, key=gains.get)
        return (f"float16 ran conv2d NHWC {gains[best]:.1f} times faster than float32 on {best}, "
                f"{gains[worst]:.1f} times on {worst}")

    return Answer("Answer to exercise 3", (
        f"The ceilings first. TF32 moves float32's multiply-adds to the tensor cores: {ceilings}. A T4 (compute "
        f"capability {t4.compute_capability}) has no TF32 rate at all (`specs.peak_tflops` gives "
        f"{specs.peak_tflops(t4, 'tf32')}), and the sweep records the dtype as not run.",
        f"What the recordings say, per GPU: the GEMM's TF32 gain, and float16's gain on the convolutions (TF32's "
        f"tensor-core rate is {half:.0%} of float16's, so expect at most about that share of it):",
        *per_gpu(recordings.recorded("hardware_peaks"), gemm, "- No GPU has recorded its GEMM rates yet."),
        *per_gpu(recordings.recorded("conv_layers"), convolutions, "- No GPU has recorded the layers yet."),
        f"Gain most: the layers with a long reduction K = C R S (res4, res5), whose GEMMs are compute-bound. Gain "
        f"least: the first layer (K = {first.gemm_k}) and the 1 x 1 layer, which move more bytes per operation; "
        "there TF32 only shortens the arithmetic part.",
    ))


def exercise_4() -> Answer:
    layers = plan.layers(plan.FULL)
    size = flops.bytes_per_element("float32")

    def tiles(layer: conv.ConvLayer, tile_bytes: int) -> str:
        rows = conv.tile_rows_for(layer, size, tile_bytes)
        count = -(-layer.gemm_m // rows)
        return f"{count:,} tile{'s' if count > 1 else ''} of {format_bytes(rows * layer.gemm_k * size)}"

    first, last = layers[0], layers[-1]
    smallest = -(-first.gemm_m // conv.tile_rows_for(first, size, 2**16))  # conv1's tiles at 2^16 bytes
    floor = smallest * plan.TILE_OPS * budget.HOST_CALL_SECONDS  # Python's time for them, whatever the GPU

    def recorded(run: Recording) -> str | None:
        rows = {r["method"]: r for r in run.rows if r.get("layer") == first.name and r.get("dtype") == "float32"}
        tiled, explicit = rows.get("implicit GEMM (tiled)"), rows.get("im2col + GEMM")
        if not tiled or not explicit:
            return None
        count = -(-tiled["gemm_m"] // conv.tile_rows_for(first, size, run.params["tile_bytes"]))
        return (f"{first.name} in float32, tiles of {format_bytes(run.params['tile_bytes'])}: the tiled version took "
                f"{tiled['seconds'] * 1e3:.2f} ms ({tiled['seconds'] / count * 1e3:.2f} ms a tile), im2col + GEMM "
                f"{explicit['seconds'] * 1e3:.2f} ms")

    return Answer("Answer to exercise 4", (
        "A tile holds `tile_bytes / (C R S x 4)` rows of the im2col matrix, and the layer takes ceil(M / rows) "
        f"tiles, each a Python iteration of GPU operations. For the recorded batch of {first.n}, in float32:",
        *(f"- {layer.name} (im2col {format_bytes(layer.im2col_elements * size)}): "
          + "; ".join(f"2^{exp}: {tiles(layer, 2**exp)}" for exp in (16, 24, 28)) for layer in (first, last)),
        f"At 2^16 the extra memory is tiny but the tiles are counted in thousands, each about {plan.TILE_OPS} "
        f"operations launched from Python: for {first.name} at least {floor:.2f} s "
        "a call, whatever the GPU. At 2^28 one tile is the whole matrix: the implicit GEMM becomes im2col + GEMM, "
        "with its memory. What a tile costs at 2^24, per recorded GPU:",
        *per_gpu(recordings.recorded("conv_layers"), recorded, "- No GPU has recorded the layers yet."),
        "A kernel that keeps its tile in shared memory and registers escapes the trade: its tiles are small (a few "
        "KiB an SM), never written to device memory, and all of them are handled inside one launch, so neither the "
        "memory nor the number of Python steps grows.",
    ))


def exercise_5() -> Answer:
    (_, channels, height, width), (n, c, h, w) = (1, 64, 5, 4), (0, 10, 2, 3)
    nchw, nhwc = (offset(n, c, h, w, channels, height, width) for offset in (conv.nchw_offset, conv.nhwc_offset))
    tensor = torch.empty(1, channels, height, width)
    last = tensor.to(memory_format=torch.channels_last)

    def by_strides(t: torch.Tensor) -> str:
        terms = [(i, s) for i, s in zip((n, c, h, w), t.stride(), strict=True) if i]
        return " + ".join(f"{i} x {s}" for i, s in terms) + f" = {sum(i * s for i, s in terms)}"

    return Answer("Answer to exercise 5", (
        f"NCHW, w fastest: ((n C + c) H + h) W + w = (({n} x {channels} + {c}) x {height} + {h}) x {width} + {w} = "
        f"{nchw}.",
        f"NHWC, c fastest: ((n H + h) W + w) C + c = (({n} x {height} + {h}) x {width} + {w}) x {channels} + {c} = "
        f"{nhwc}.",
        f"torch's strides say the same: a contiguous tensor has strides {tensor.stride()}, so {by_strides(tensor)}; "
        f"after `.to(memory_format=torch.channels_last)` they are {last.stride()}, so {by_strides(last)}.",
        f"In NCHW the element's neighbour in the next channel is {tensor.stride()[1]} floats away; in NHWC it is the "
        "next float in memory.",
    ))
