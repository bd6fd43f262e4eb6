"""cuDNN and its convolution algorithms: what torch hands cuDNN, the algorithm families, and what they cost.

A convolution in torch goes to a backend chosen for the tensors at hand (:func:`conv_backend`): cuDNN
for CUDA tensors, oneDNN (MKL-DNN) or torch's own im2col + GEMM on a CPU. cuDNN is told about the data
through *descriptors* -- sizes, strides and data type of each tensor (:func:`conv_descriptors`) --
and picks one of several *algorithms* for the same arithmetic. The families, as the cuDNN API names
them (``CUDNN_CONVOLUTION_FWD_ALGO_*``):

- ``GEMM``: im2col, then one GEMM (:func:`gpulab.conv.conv2d_im2col`); the workspace is the im2col matrix;
- ``IMPLICIT_GEMM`` and ``IMPLICIT_PRECOMP_GEMM``: the same GEMM, its tiles gathered on chip
  (:func:`gpulab.conv.conv2d_implicit_gemm`); the second precomputes the gather's offsets;
- ``FFT`` and ``FFT_TILING``: transform, multiply point by point, transform back
  (:func:`conv2d_fft`, :func:`conv2d_fft_tiled`); the cost hardly depends on the filter size;
- ``WINOGRAD`` and ``WINOGRAD_NONFUSED``: minimal filtering, 16 multiplies instead of 36 for a 2 x 2
  output tile of a 3 x 3 filter (:func:`conv2d_winograd`).

:func:`multiplies` and :func:`workspace_bytes` count what each family costs, and every implementation
here is checked against float64 ``F.conv2d`` (:func:`check_families`).

The experiments (:func:`benchmark_sweep`, :func:`layouts_precisions_sweep`, :func:`channels_sweep`,
:func:`filter_sizes_sweep`, :func:`deterministic_sweep`) time torch's convolution under cuDNN's
switches (``torch.backends.cudnn.benchmark``, ``deterministic``, ``allow_tf32``), layouts and number
formats, and read which kernels ran from ``torch.profiler`` (:func:`profile_kernels`). Each point runs
in a thread of its own (:func:`in_fresh_thread`): torch keeps the plan it chose for a convolution in a
cache per thread, so a new thread must choose again, and what an earlier cell ran cannot leak into a
measurement.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from gpulab import attention, conv, env, plots, profiling, specs, timing
from gpulab.correctness import check_close, random_tensor
from gpulab.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.provenance import experiment
from gpulab.sweep import ok_rows, run_sweep
from gpulab.validation import fits_in_memory, positive_int, positive_ints, supported_dtype, unsupported_reason

T = TypeVar("T")

LAYOUTS = ("NCHW", "NHWC")
FFT_TILE = 32  # the tile edge of conv2d_fft_tiled (cuDNN's FFT_TILING kernels are named for 32 x 32 tiles)
KERNELS_KEPT = 8  # kernels (or CPU operators) a row keeps, the longest first


# ----------------------------------------------------------------------------------------------
# What torch runs, and what it tells cuDNN

# torch's names for the backends of a convolution (torch._C._ConvBackend) and what each one is.
BACKENDS = {
    "Cudnn": "cuDNN",
    "CudnnTranspose": "cuDNN (transposed convolution)",
    "Miopen": "MIOpen (AMD GPUs)",
    "Mkldnn": "oneDNN (MKL-DNN), Intel's CPU library",
    "MkldnnEmpty": "oneDNN, empty input",
    "Slow2d": "torch's own im2col + GEMM (slow_conv2d)",
    "SlowDilated2d": "torch's own im2col + GEMM for dilated convolutions",
    "NnpackSpatial": "NNPACK (CPU)",
    "Xnnpack2d": "XNNPACK (mobile CPUs)",
    "CudaDepthwise2d": "torch's own CUDA kernel for depthwise convolutions",
    "Mps": "Metal Performance Shaders (Apple GPUs)",
    "Empty": "nothing to compute (an empty tensor)",
}

# cuDNN's data type for each torch dtype (cudnnDataType_t)
CUDNN_DATA_TYPES = {
    torch.float64: "CUDNN_DATA_DOUBLE",
    torch.float32: "CUDNN_DATA_FLOAT",
    torch.float16: "CUDNN_DATA_HALF",
    torch.bfloat16: "CUDNN_DATA_BFLOAT16",
    torch.int8: "CUDNN_DATA_INT8",
}


def backend_flags() -> list[dict]:
    """The switches torch offers for cuDNN (and, for a CPU, oneDNN), each with its value here and what it does."""
    cudnn, mkldnn = torch.backends.cudnn, torch.backends.mkldnn
    rows = [
        ("torch.backends.cudnn.is_available()", cudnn.is_available(), "torch was built with cuDNN and found it"),
        ("torch.backends.cudnn.version()", cudnn.version(), "cuDNN's version, e.g. 91900 for 9.19.0"),
        ("torch.backends.cudnn.enabled", cudnn.enabled, "False sends CUDA convolutions to torch's own kernels"),
        ("torch.backends.cudnn.benchmark", cudnn.benchmark,
         "True: time the candidate algorithms at a shape's first call and keep the fastest"),
        ("torch.backends.cudnn.benchmark_limit", getattr(cudnn, "benchmark_limit", None),
         "how many candidates the benchmark tries (0: all)"),
        ("torch.backends.cudnn.deterministic", cudnn.deterministic,
         "True: only algorithms that give bitwise the same result every run"),
        ("torch.backends.cudnn.allow_tf32", cudnn.allow_tf32,
         "float32 convolutions may use TF32 tensor cores (default True)"),
        ("torch.backends.cuda.matmul.allow_tf32", torch.backends.cuda.matmul.allow_tf32,
         "the same for cuBLAS matmuls, a separate switch (default False)"),
        ("torch.backends.mkldnn.is_available()", mkldnn.is_available(), "torch was built with oneDNN (CPU)"),
        ("torch.backends.mkldnn.enabled", mkldnn.enabled, "False sends CPU convolutions to torch's own code"),
    ]
    return [{"flag": flag, "value": value, "meaning": meaning} for flag, value, meaning in rows]


def conv_backend(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> str:
    """The backend torch picks for ``conv2d(x, weight)``: 'Cudnn', 'Mkldnn', 'Slow2d', ... ('unknown' if torch
    does not say). Asked of torch's own dispatcher (``torch._C._select_conv_backend``), a private function."""
    conv.ConvLayer.of(x, weight, stride, padding)  # ValueError for operands that do not fit
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None:
        return "unknown"
    try:
        chosen = select(x, weight, None, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1, None)
    except (RuntimeError, TypeError):  # a torch whose private signature differs
        return "unknown"
    return str(chosen).rsplit(".", 1)[-1]


def describe_backend(name: str) -> str:
    """What a backend name of :func:`conv_backend` stands for."""
    return BACKENDS.get(name, name)


def layout_of(t: torch.Tensor) -> str:
    """The layout letters of a 4-d tensor, slowest to fastest index, as cuDNN names formats: 'NCHW', 'NHWC', ...

    torch's own tests come first (a dimension of size 1 makes the strides ambiguous); otherwise the
    letters are sorted by decreasing stride.
    """
    if t.dim() != 4:
        raise ValueError(f"t: expected a 4-d tensor (N x C x H x W), got shape {tuple(t.shape)}")
    if t.is_contiguous():
        return "NCHW"
    if t.is_contiguous(memory_format=torch.channels_last):
        return "NHWC"
    return "".join(sorted("NCHW", key=lambda letter: -t.stride("NCHW".index(letter))))


def tensor_descriptor(t: torch.Tensor, name: str = "x") -> dict:
    """What a cuDNN tensor descriptor holds for ``t``: sizes (always N, C, H, W), strides, data type, and the
    format those strides make ('NCHW', 'NHWC' or another order; 'packed' says if it has no gaps)."""
    if t.dtype not in CUDNN_DATA_TYPES:
        raise ValueError(f"{name}: cuDNN has no data type for {t.dtype}")
    packed = t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)
    return {"tensor": name, "sizes": list(t.shape), "strides": list(t.stride()),
            "data_type": CUDNN_DATA_TYPES[t.dtype], "format": layout_of(t), "packed": packed}


def cudnn_memory_format(x: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The layout torch runs a cuDNN convolution in: NHWC if the input or the filters are channels_last
    (and the data is not float64), NCHW otherwise -- torch's ``cudnn_conv_suggest_memory_format``."""
    if torch.float64 in (x.dtype, weight.dtype):
        return torch.contiguous_format
    if "NHWC" in (layout_of(x), layout_of(weight)):  # strides in NHWC order, whether packed or not
        return torch.channels_last
    return torch.contiguous_format


def conv_descriptors(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> list[dict]:
    """The descriptors torch builds for a cuDNN convolution of ``x`` by ``weight``: input, filters, output,
    and the convolution itself (padding, stride, dilation, mode and the compute type).

    torch first makes both operands contiguous in :func:`cudnn_memory_format` (a copy if they are not),
    and the output has that layout too; the 16-bit formats are computed (accumulated) in float32.
    """
    shape = conv.ConvLayer.of(x, weight, stride, padding)
    layout = cudnn_memory_format(x, weight)
    x, weight = x.contiguous(memory_format=layout), weight.contiguous(memory_format=layout)
    y = torch.empty((shape.n, shape.k, shape.p, shape.q), dtype=x.dtype, device="meta").contiguous(
        memory_format=layout)
    compute = "CUDNN_DATA_DOUBLE" if x.dtype == torch.float64 else "CUDNN_DATA_FLOAT"
    return [tensor_descriptor(x, "x (input)"), tensor_descriptor(weight, "w (filters)"),
            tensor_descriptor(y, "y (output)"),
            {"tensor": "convolution", "padding": [padding] * 2, "stride": [stride] * 2, "dilation": [1, 1],
             "mode": "CUDNN_CROSS_CORRELATION", "compute_type": compute}]


@contextmanager
def cudnn_settings(*, benchmark: bool | None = None, deterministic: bool | None = None) -> Iterator[None]:
    """Within the block, ``torch.backends.cudnn.benchmark`` and ``deterministic`` take the given values
    (None leaves one as it is); both are restored afterwards. For ``allow_tf32`` use
    :func:`gpulab.precision.matmul_mode`."""
    cudnn = torch.backends.cudnn
    saved = cudnn.benchmark, cudnn.deterministic
    if benchmark is not None:
        cudnn.benchmark = bool(benchmark)
    if deterministic is not None:
        cudnn.deterministic = bool(deterministic)
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = saved


# ----------------------------------------------------------------------------------------------
# The algorithm families, in torch: FFT, tiled FFT, Winograd F(2x2, 3x3)


def _fft_dtype(x: torch.Tensor) -> None:
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"x: the FFT convolutions here compute in float32 or float64, got {x.dtype}")


def conv2d_fft(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """The convolution by the convolution theorem: transform, multiply frequency by frequency, transform back.

    The padded input (Hp x Wp) and the filters, zero-padded to the same size, are transformed with a
    real FFT. A cross-correlation is a product with the *conjugate* of the filter's transform; the sum over
    the C channels then happens frequency by frequency, as one small complex GEMM per frequency,
    (N x C) times (C x K). The inverse FFT gives the circular correlation, whose first Hp - R + 1 rows and
    Wp - S + 1 columns are the stride-1 result (no index wraps around there). A stride keeps every u-th of
    them: the FFT computes all u^2 as many outputs and throws most away, which is why it suits stride 1.
    """
    shape = conv.ConvLayer.of(x, weight, stride, padding)
    _fft_dtype(x)
    size = (shape.h + 2 * padding, shape.w + 2 * padding)
    spectrum = torch.fft.rfft2(F.pad(x, (padding,) * 4), s=size)  # N x C x Hp x (Wp/2 + 1), complex
    filters = torch.fft.rfft2(weight, s=size).conj()  # K x C x Hp x (Wp/2 + 1)
    # one GEMM per frequency: (N x C) @ (C x K) -> N x K, batched over the Hp x (Wp/2 + 1) frequencies;
    # contiguous operands: a batched complex matmul of strided views is many times slower on a CPU
    product = spectrum.permute(2, 3, 0, 1).contiguous() @ filters.permute(2, 3, 1, 0).contiguous()
    full = torch.fft.irfft2(product.permute(2, 3, 0, 1), s=size)  # N x K x Hp x Wp, stride 1
    return full[:, :, :(shape.p - 1) * stride + 1:stride, :(shape.q - 1) * stride + 1:stride].contiguous()


def conv2d_fft_tiled(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0,
                     tile: int = FFT_TILE) -> torch.Tensor:
    """The FFT convolution on ``tile`` x ``tile`` pieces of the input (overlap-save), as cuDNN's FFT_TILING.

    Each tile of the padded input yields (tile - R + 1) x (tile - S + 1) outputs; neighbouring tiles
    overlap by R - 1 rows and S - 1 columns so that every output is computed once. The filters are
    transformed at the tile's size, not the image's: K C tile (tile/2 + 1) complex numbers, whatever the
    image, instead of K C Hp (Wp/2 + 1). Filters larger than the tile are refused.
    """
    shape = conv.ConvLayer.of(x, weight, stride, padding)
    _fft_dtype(x)
    tile = positive_int("tile", tile)
    if shape.r > tile or shape.s > tile:
        raise ValueError(f"tile: a {tile} x {tile} tile cannot hold a {shape.r} x {shape.s} filter")
    out_h, out_w = tile - shape.r + 1, tile - shape.s + 1  # outputs per tile
    full_p, full_q = shape.h + 2 * padding - shape.r + 1, shape.w + 2 * padding - shape.s + 1  # stride-1 output
    tiles_p, tiles_q = math.ceil(full_p / out_h), math.ceil(full_q / out_w)
    # pad bottom and right with zeros so that the last tiles are whole
    extra_h = (tiles_p - 1) * out_h + tile - (shape.h + 2 * padding)  # >= 0: tiles_p out_h >= full_p
    extra_w = (tiles_q - 1) * out_w + tile - (shape.w + 2 * padding)
    padded = F.pad(x, (padding, padding + extra_w, padding, padding + extra_h))
    pieces = padded.unfold(2, tile, out_h).unfold(3, tile, out_w)  # N x C x tiles_p x tiles_q x tile x tile
    spectrum = torch.fft.rfft2(pieces)  # N x C x tp x tq x tile x (tile/2 + 1)
    filters = torch.fft.rfft2(weight, s=(tile, tile)).conj()  # K x C x tile x (tile/2 + 1)
    n, count = shape.n, shape.n * tiles_p * tiles_q
    # one GEMM per frequency: (N tp tq x C) @ (C x K)
    product = (spectrum.permute(4, 5, 0, 2, 3, 1).reshape(tile, -1, count, shape.c)
               @ filters.permute(2, 3, 1, 0).contiguous())
    product = product.reshape(tile, tile // 2 + 1, n, tiles_p, tiles_q, shape.k).permute(2, 5, 3, 4, 0, 1)
    tiles = torch.fft.irfft2(product, s=(tile, tile))[..., :out_h, :out_w]  # N x K x tp x tq x out_h x out_w
    full = tiles.permute(0, 1, 2, 4, 3, 5).reshape(n, shape.k, tiles_p * out_h, tiles_q * out_w)
    return full[:, :, :(shape.p - 1) * stride + 1:stride, :(shape.q - 1) * stride + 1:stride].contiguous()


# Winograd's minimal filtering F(2, 3) {lavin2016fast}: two outputs of a 3-tap filter from 4 multiplies.
# Y = A^T [(G g G^T) * (B^T d B)] A for a 4 x 4 input tile d and a 3 x 3 filter g (* element by element).
WINOGRAD_BT = ((1.0, 0.0, -1.0, 0.0), (0.0, 1.0, 1.0, 0.0), (0.0, -1.0, 1.0, 0.0), (0.0, 1.0, 0.0, -1.0))
WINOGRAD_G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))
WINOGRAD_AT = ((1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, -1.0))


def winograd_matrices(dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The transforms of F(2x2, 3x3): B^T (4 x 4, input), G (4 x 3, filter) and A^T (2 x 4, output)."""
    return tuple(torch.tensor(m, dtype=dtype, device=device) for m in (WINOGRAD_BT, WINOGRAD_G, WINOGRAD_AT))


def conv2d_winograd(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """A 3 x 3, stride-1 convolution by Winograd's F(2x2, 3x3), on 4 x 4 input tiles that overlap by 2.

    Each tile d becomes V = B^T d B, each filter U = G g G^T (both 4 x 4). The sum over channels of the
    element-by-element products U * V is 16 independent GEMMs, one per position (i, j) of the 4 x 4
    tile: (K x C) times (C x tiles), 16 multiplies per tile and channel pair where the direct method
    needs 2 x 2 x 9 = 36. The output transform Y = A^T M A gives the 2 x 2 outputs of each tile. This is
    cuDNN's WINOGRAD_NONFUSED; its fused WINOGRAD keeps the transformed tiles on chip.
    """
    shape = conv.ConvLayer.of(x, weight, stride, padding)
    if (shape.r, shape.s) != (3, 3):
        raise ValueError(f"weight: Winograd F(2x2, 3x3) needs 3 x 3 filters, got {shape.r} x {shape.s}")
    if stride != 1:
        raise ValueError(f"stride: Winograd F(2x2, 3x3) computes stride 1 only, got {stride}")
    bt, g, at = winograd_matrices(x.dtype, x.device)
    tiles_p, tiles_q = math.ceil(shape.p / 2), math.ceil(shape.q / 2)
    # tiles of 4 x 4 every 2 pixels; pad bottom and right so that the last tiles are whole
    extra_h, extra_w = 2 * tiles_p - shape.p, 2 * tiles_q - shape.q
    padded = F.pad(x, (padding, padding + extra_w, padding, padding + extra_h))
    tiles = padded.unfold(2, 4, 2).unfold(3, 4, 2)  # N x C x tiles_p x tiles_q x 4 x 4
    v = bt @ tiles @ bt.T  # input transform, every tile of every channel
    u = g @ weight @ g.T  # filter transform: K x C x 4 x 4
    count = shape.n * tiles_p * tiles_q
    v16 = v.permute(4, 5, 1, 0, 2, 3).reshape(16, shape.c, count)  # 16 x C x (N tp tq)
    u16 = u.permute(2, 3, 0, 1).reshape(16, shape.k, shape.c)  # 16 x K x C
    m = torch.bmm(u16, v16)  # the 16 GEMMs: 16 x K x (N tp tq)
    m = m.reshape(4, 4, shape.k, shape.n, tiles_p, tiles_q).permute(3, 2, 4, 5, 0, 1)  # N K tp tq 4 4
    y = at @ m @ at.T  # output transform: N x K x tp x tq x 2 x 2
    out = y.permute(0, 1, 2, 4, 3, 5).reshape(shape.n, shape.k, 2 * tiles_p, 2 * tiles_q)
    return out[:, :, :shape.p, :shape.q].contiguous()


FAMILY_IMPLEMENTATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "im2col + GEMM": conv.conv2d_im2col,
    "implicit GEMM (tiled)": conv.conv2d_implicit_gemm,
    "FFT": conv2d_fft,
    "FFT tiled": conv2d_fft_tiled,
    "Winograd F(2x2, 3x3)": conv2d_winograd,
}


def applies(method: str, spec: conv.ConvLayer | dict) -> bool:
    """Whether ``method`` (a key of :data:`FAMILY_IMPLEMENTATIONS` or 'conv2d') computes this layer."""
    shape = conv.layer(spec)
    if method == "Winograd F(2x2, 3x3)":
        return (shape.r, shape.s, shape.stride) == (3, 3, 1)
    if method == "FFT tiled":
        return max(shape.r, shape.s) <= FFT_TILE
    return method in FAMILY_IMPLEMENTATIONS or method == "conv2d"


def check_families(cases: Sequence[conv.ConvLayer | dict], dtype: str = "float64",
                   device: torch.device | None = None) -> list[dict]:
    """Every implementation of :data:`FAMILY_IMPLEMENTATIONS` that applies, against float64 ``F.conv2d`` on fresh
    random data, case by case; AssertionError on the first wrong (or NaN) result. A row per case and method
    with the relative error. ``dtype`` is float64 or float32 (the FFTs compute in nothing narrower)."""
    device = device or env.device()
    label = supported_dtype("dtype", dtype, device)
    if label not in ("float64", "float32"):
        raise ValueError(f"dtype: float64 or float32, got {label}")
    rows = []
    with matmul_mode(label) as torch_dtype:
        for case in map(conv.layer, cases):
            x = random_tensor((case.n, case.c, case.h, case.w), torch_dtype, device)
            weight = random_tensor((case.k, case.c, case.r, case.s), torch_dtype, device)
            reference = F.conv2d(x.double(), weight.double(), stride=case.stride, padding=case.padding)
            for method, implementation in FAMILY_IMPLEMENTATIONS.items():
                if not applies(method, case):
                    continue
                actual = implementation(x, weight, case.stride, case.padding)
                error = check_close(actual, reference, MATMUL_TOLERANCE[label], f"{method}, {case.describe()}")
                rows.append({**case.as_dict(), "method": method, "dtype": label, "relative_error": error})
    return rows


# ----------------------------------------------------------------------------------------------
# What each family costs: multiplies and workspace, by formula

COUNTED = ("direct or GEMM", "Winograd F(2x2)", "FFT", "FFT tiled")


def _tiles(shape: conv.ConvLayer, tile: int) -> tuple[int, int, int]:
    """(tiles, outputs per tile along h, along w) of the tiled FFT: the stride-1 output cut into pieces."""
    out_h, out_w = tile - shape.r + 1, tile - shape.s + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"tile: a {tile} x {tile} tile cannot hold a {shape.r} x {shape.s} filter")
    full_p, full_q = shape.h + 2 * shape.padding - shape.r + 1, shape.w + 2 * shape.padding - shape.s + 1
    return math.ceil(full_p / out_h) * math.ceil(full_q / out_w), out_h, out_w


def multiplies(spec: conv.ConvLayer | dict, method: str, *, tile: int = FFT_TILE) -> float:
    """Real multiplications of one forward convolution by ``method`` (one of :data:`COUNTED`).

    - direct or GEMM: N K P Q x C R S, one per filter weight per output (im2col + GEMM does the same);
    - Winograd F(2x2): N K C x ceil(P/2) ceil(Q/2) x (R + 1)(S + 1), the element-wise products of the
      transformed tiles (stride 1 only); the transforms are additions and multiplies by constants such
      as 1/2 and are not counted, as in {lavin2016fast};
    - FFT: the transforms of N C input planes, K C filters and N K outputs, each L log2 L for a real FFT of
      L = Hp Wp points (half the (L/2) log2 L complex multiplies of a radix-2 complex FFT, 4 real ones each),
      plus 4 real multiplies per complex product, N K C Hp (Wp/2 + 1) of them. It hardly grows with R S;
    - FFT tiled: the same with L = tile^2 per tile, and the filters transformed once per tile size.
    """
    shape = conv.layer(spec)
    if method == "direct or GEMM":
        return float(shape.n * shape.k * shape.p * shape.q * shape.c * shape.r * shape.s)
    if method == "Winograd F(2x2)":
        if shape.stride != 1:
            raise ValueError(f"spec: Winograd counts are for stride 1, got stride {shape.stride}")
        tiles = math.ceil(shape.p / 2) * math.ceil(shape.q / 2)
        return float(shape.n * shape.k * shape.c * tiles * (shape.r + 1) * (shape.s + 1))
    if method == "FFT":
        hp, wp = shape.h + 2 * shape.padding, shape.w + 2 * shape.padding
        points = hp * wp
        planes = shape.n * shape.c + shape.k * shape.c + shape.n * shape.k
        return planes * points * math.log2(points) + 4.0 * shape.n * shape.k * shape.c * hp * (wp // 2 + 1)
    if method == "FFT tiled":
        tiles, _, _ = _tiles(shape, positive_int("tile", tile))
        points = tile * tile
        planes = shape.n * shape.c * tiles + shape.k * shape.c + shape.n * shape.k * tiles
        return planes * points * math.log2(points) + 4.0 * shape.n * shape.k * shape.c * tiles * tile * (tile // 2 + 1)
    raise ValueError(f"method: choose one of {', '.join(COUNTED)}; got {method!r}")


WORKSPACE_METHODS = ("GEMM", "implicit GEMM", "FFT", "FFT tiled", "Winograd fused", "Winograd nonfused")


def workspace_bytes(spec: conv.ConvLayer | dict, method: str, element_bytes: int = 4, *,
                    tile: int = FFT_TILE) -> int:
    """The scratch memory ``method`` (one of :data:`WORKSPACE_METHODS`) needs for one layer, by the simplest
    model of each family: the im2col matrix for GEMM, nothing for the implicit GEMM, the transforms of
    the inputs, filters and outputs for the FFTs (complex: twice ``element_bytes`` each) and for a
    nonfused Winograd F(2x2, 3x3) (16 numbers per tile), the transformed filters alone for a fused one (its
    tiles stay on chip). cuDNN's real buffers are its own; the model gives their size where it is forced
    (GEMM) and their order of magnitude elsewhere."""
    shape, element_bytes = conv.layer(spec), positive_int("element_bytes", element_bytes)
    if method == "GEMM":
        return shape.im2col_elements * element_bytes
    if method == "implicit GEMM":
        return 0
    if method == "FFT":
        hp, wp = shape.h + 2 * shape.padding, shape.w + 2 * shape.padding
        planes = shape.n * shape.c + shape.k * shape.c + shape.n * shape.k
        return planes * hp * (wp // 2 + 1) * 2 * element_bytes
    if method == "FFT tiled":
        tiles, _, _ = _tiles(shape, positive_int("tile", tile))
        planes = shape.n * shape.c * tiles + shape.k * shape.c + shape.n * shape.k * tiles
        return planes * tile * (tile // 2 + 1) * 2 * element_bytes
    if method == "Winograd fused":
        return shape.k * shape.c * 16 * element_bytes
    if method == "Winograd nonfused":
        tiles = math.ceil(shape.p / 2) * math.ceil(shape.q / 2)
        return (shape.n * shape.c * tiles + shape.k * shape.c + shape.n * shape.k * tiles) * 16 * element_bytes
    raise ValueError(f"method: choose one of {', '.join(WORKSPACE_METHODS)}; got {method!r}")


def same_padding_layer(n: int, c: int, size: int, k: int, filter_size: int, name: str = "") -> conv.ConvLayer:
    """N x C x size x size images, K filters of filter_size^2, stride 1, padding filter_size // 2: the output
    keeps the image's size for odd filters."""
    filter_size = positive_int("filter_size", filter_size)
    return conv.ConvLayer(n, c, size, size, k, filter_size, filter_size, 1, filter_size // 2,
                          name=name or f"{filter_size}x{filter_size}")


def multiply_counts(batches: Sequence[int], channels: int, size: int, filter_sizes: Sequence[int],
                    tile: int = FFT_TILE) -> list[dict]:
    """:func:`multiplies` of every method in :data:`COUNTED`, for C = K = ``channels``, ``size`` x ``size``
    images and each batch and filter size ("same" padding); per output element as well as in total.
    Winograd is counted for every filter size, though cuDNN uses it for 3 x 3 (and 5 x 5) only."""
    rows = []
    for n in positive_ints("batches", batches):
        for r in positive_ints("filter_sizes", filter_sizes):
            shape = same_padding_layer(n, channels, size, channels, r)
            for method in COUNTED:
                if method == "FFT tiled" and r > tile:
                    continue
                total = multiplies(shape, method, tile=tile)
                outputs = shape.n * shape.k * shape.p * shape.q
                rows.append({"batch": n, "filter": r, "method": method, "multiplies": total,
                             "per_output": total / outputs, "channels": channels, "size": size})
    return rows


def crossover(rows: Sequence[dict], method: str, batch: int, baseline: str = "direct or GEMM") -> int | None:
    """The smallest filter size at which ``method`` needs fewer multiplies than ``baseline`` (None: never)."""
    counts = {(r["method"], r["filter"]): r["multiplies"] for r in rows if r["batch"] == batch}
    for filter_size in sorted({f for (_, f) in counts}):
        mine, theirs = counts.get((method, filter_size)), counts.get((baseline, filter_size))
        if mine is not None and theirs is not None and mine < theirs:
            return filter_size
    return None


# ----------------------------------------------------------------------------------------------
# The talk's table {fredman2021accelerating}: one convolution, every cuDNN forward algorithm, on a GV100

TALK_SETUP = "128x128x128x128 convolution, FP32, NCHW, Quadro GV100"
TALK_GPU_ROW = "V100 SXM2 32GB"  # gpulab.specs' row of the same GV100 chip (80 SMs); the Quadro card is not listed
TALK_SIZES = {"c": 128, "h": 128, "w": 128, "k": 128}  # the interpretation the workspace column confirms, N = 1
# (algorithm, filter size, milliseconds, workspace in MB as printed); None where the talk says "Unsupported"
TALK_TABLE = (
    ("GEMM", 3, 0.76, 72.0), ("GEMM", 11, 8.47, 968.0),
    ("IMPLICIT_GEMM", 3, 0.62, 0.0), ("IMPLICIT_GEMM", 11, 6.82, 0.0),
    ("IMPLICIT_PRECOMP_GEMM", 3, 0.47, 0.01), ("IMPLICIT_PRECOMP_GEMM", 11, 6.58, 0.01),
    ("FFT", 3, 45.3, 8322.0), ("FFT", 11, 44.7, 8328.0),
    ("FFT_TILING", 3, 3.69, 70.0), ("FFT_TILING", 11, 5.13, 70.0),
    ("WINOGRAD", 3, 0.26, 1.56), ("WINOGRAD", 11, None, None),
    ("WINOGRAD_NONFUSED", 3, 2.73, 578.0), ("WINOGRAD_NONFUSED", 11, None, None),
)
# each algorithm's family, for the workspace model
TALK_FAMILIES = {"GEMM": "GEMM", "IMPLICIT_GEMM": "implicit GEMM", "IMPLICIT_PRECOMP_GEMM": "implicit GEMM",
                 "FFT": "FFT", "FFT_TILING": "FFT tiled", "WINOGRAD": "Winograd fused",
                 "WINOGRAD_NONFUSED": "Winograd nonfused"}


def talk_layer(batch: int, filter_size: int) -> conv.ConvLayer:
    """The talk's convolution with N = ``batch``: C = K = 128 channels of 128 x 128 pixels, "same" padding."""
    return same_padding_layer(batch, TALK_SIZES["c"], TALK_SIZES["h"], TALK_SIZES["k"], filter_size,
                              name=f"{filter_size}x{filter_size}, N={batch}")


def talk_rates(batches: Sequence[int] = (128, 1)) -> list[dict]:
    """The talk's table read two ways: for each batch N, the rate each row's time implies (2 N K P Q C R S FLOP,
    as if computed directly), against the float32 peak of a GV100 (:data:`TALK_GPU_ROW` of gpulab.specs), and
    the size of the im2col matrix that the GEMM algorithm would need as its workspace (MiB)."""
    peak = specs.peak(specs.gpu(TALK_GPU_ROW), "float32")
    rows = []
    for n in positive_ints("batches", batches):
        for algorithm, r, ms, workspace in TALK_TABLE:
            shape = talk_layer(n, r)
            rate = None if ms is None else shape.flops / (ms * 1e-3) / 1e12
            rows.append({
                "batch": n, "algorithm": algorithm, "filter": r, "milliseconds": ms, "workspace_mb": workspace,
                "flops": shape.flops, "implied_tflops": rate, "peak_tflops": peak.tflops,
                "over_peak": None if rate is None else rate / peak.tflops,
                "im2col_mib": shape.im2col_elements * 4 / 2**20,
                "model_workspace_mib": workspace_bytes(shape, TALK_FAMILIES[algorithm]) / 2**20,
            })
    return rows


# ----------------------------------------------------------------------------------------------
# Which kernels ran: torch.profiler, and the names sorted into families

# GPU kernel names (lower case), first match wins. NVIDIA does not document which kernel belongs to which
# algorithm, so the families are read off the names, an inference: 'winograd', 'fft' and 'im2col' say so
# plainly; the transposes between NCHW and NHWC and the split-K reductions (adding partial sums) come
# before the GEMM patterns; 'precomp', and the 'scudnn'/'hcudnn' kernels of older cuDNN versions, are taken
# for the precomputed-offset implicit GEMM; 'implicit_gemm', 'fprop' (forward), 'dgrad' (data gradient)
# and 'wgrad' (weight gradient) name implicit-GEMM kernels; cuBLAS's GEMMs (gpulab's im2col + GEMM) last.
KERNEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("Winograd", r"winograd"),
    ("FFT", r"fft|flip_filter|r2c|c2r|_cf32|cgemm"),  # cf32: the complex GEMM of each frequency
    ("im2col (GEMM algorithm)", r"im2col"),
    ("layout transform", r"nchwtonhwc|nhwctonchw|nchw_to_nhwc|nhwc_to_nchw|transpose|permute|convert|"
                         r"tensortransform|addpadding|scalepackedtensor"),
    ("split-K reduction", r"splitk|split_k"),
    ("implicit precomputed GEMM", r"precomputed_convolve|kern_precompute|implicit_precomp|scudnn|hcudnn"),
    ("direct convolution", r"direct"),
    ("implicit GEMM", r"implicit|fprop|dgrad|wgrad|convolve|conv2d|conv_|cudnn"),
    ("GEMM", r"gemm|gemv|nvjet|cublas|cutlass|xmma|sm\d\d_"),
    ("elementwise", r"elementwise|vectorized|unrolled|fill|memset|memcpy|copy|reduce"),
)
# CPU operator names (their own time): oneDNN's convolution, torch's im2col + GEMM, and the rest.
OPERATOR_FAMILIES: tuple[tuple[str, str], ...] = (
    ("oneDNN", r"mkldnn|onednn"),
    ("NNPACK", r"nnpack"),
    ("FFT", r"fft"),
    ("im2col (GEMM algorithm)", r"slow_conv|thnn_conv|im2col|unfold"),
    ("backward convolution", r"convolution_backward"),  # the backend's backward runs inside this operator
    ("GEMM", r"^aten::(mm|addmm|bmm|baddbmm|matmul)$"),
    ("layout transform", r"^aten::(copy_|_to_copy|contiguous|clone|permute|to)$"),
    ("elementwise", r"^aten::(add|mul|sub|div|neg|conj|conj_physical|fill_|zero_|masked_fill_|constant_pad_nd)\w*$"),
)
# families that do the convolution's arithmetic (the rest move data or tidy up around it)
ARITHMETIC_FAMILIES = ("Winograd", "FFT", "im2col (GEMM algorithm)", "implicit precomputed GEMM", "direct convolution",
                       "implicit GEMM", "GEMM", "oneDNN", "NNPACK", "backward convolution")


def kernel_family(name: str, device_type: str = "cuda") -> str:
    """The family of a GPU kernel's name (:data:`KERNEL_FAMILIES`) or a CPU operator's (:data:`OPERATOR_FAMILIES`)."""
    if device_type == "cuda":
        return attention.classify(name.lower(), KERNEL_FAMILIES)
    return attention.classify(name, OPERATOR_FAMILIES)


_profiler_ready = False


def _prime_profiler() -> None:
    """Start and stop the profiler once in the calling thread (the main one): kineto must be set up in the
    thread that first registers it, or it complains on stderr when a worker thread profiles. Its log
    level is read once, at that first use."""
    global _profiler_ready
    if _profiler_ready:
        return
    profiling.profile_calls(lambda: None, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    _profiler_ready = True


def profile_kernels(fn: Callable[[], object], device: torch.device, calls: int = 2) -> list[dict]:
    """Run ``fn()`` ``calls`` times under ``torch.profiler``; a row per kernel name (on a GPU) or CPU operator
    (on a CPU: its own time), the longest first: name, family, seconds and launches per call, share of the time."""
    calls = positive_int("calls", calls)
    prof = profiling.profile_calls(fn, device, calls)
    if device.type == "cuda":
        timed = profiling.device_kernels(prof)
    else:
        timed = [(e.name, e.self_cpu_time_total / 1e6) for e in prof.events()]
    totals: dict[str, list[float]] = {}
    for name, seconds in timed:
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
    everything = sum(seconds for seconds, _ in totals.values()) or 1.0
    rows = [{"name": name, "family": kernel_family(name, device.type), "seconds": seconds / calls,
             "launches": count / calls, "share": seconds / everything}
            for name, (seconds, count) in totals.items()]
    return sorted(rows, key=lambda r: -r["seconds"])


def main_family(kernels: Sequence[dict]) -> str:
    """The arithmetic family (:data:`ARITHMETIC_FAMILIES`) that took the most time, or the top family if none did."""
    time_of: dict[str, float] = {}
    for k in kernels:
        time_of[k["family"]] = time_of.get(k["family"], 0.0) + k["seconds"]
    arithmetic = {f: s for f, s in time_of.items() if f in ARITHMETIC_FAMILIES}
    pool = arithmetic or time_of
    return max(pool, key=pool.get) if pool else "none"


def setting_label(row: dict) -> str:
    """A row's setting in words: 'float16 NHWC, benchmark on', or 'gpulab FFT' for gpulab's own implementations."""
    if row.get("method", "conv2d") != "conv2d":
        return f"gpulab {row['method']}"
    label = f"{row['dtype']} {row['layout']}"
    if row.get("benchmark") is not None:
        label += ", benchmark " + ("on" if row["benchmark"] else "off")
    return label


def short_name(name: str, width: int = 90) -> str:
    """A kernel's name cut to ``width`` characters (C++ template arguments make some hundreds long)."""
    return name if len(name) <= width else name[:width - 3] + "..."


def algorithm_rows(rows: Sequence[dict], kernels: int = 3, width: int = 90) -> list[dict]:
    """For each measured row: its layer, setting, the family that did the arithmetic, and its ``kernels`` longest
    kernels as 'name [family, share]' strings (the raw names, cut to ``width``)."""
    found = []
    for r in ok_rows(rows):
        if not r.get("kernels"):
            continue
        names = [f"{short_name(k['name'], width)} [{k['family']}, {k['share']:.0%}]" for k in r["kernels"][:kernels]]
        found.append({"layer": r["layer"], "setting": setting_label(r), "algorithm": r["algorithm"],
                      "kernels": names})
    return found


# ----------------------------------------------------------------------------------------------
# Measuring one convolution


def in_fresh_thread(fn: Callable[[], T]) -> T:
    """``fn()`` run in a new thread; its result, or its exception raised here.

    torch keeps the cuDNN plan it picked for a convolution (by heuristics, or by timing with
    ``benchmark=True``) in a cache per thread (aten/src/ATen/native/cudnn/Conv_v8.cpp). Its key holds the
    shapes, dtype, layout, ``deterministic`` and ``allow_tf32`` but not ``benchmark``: in one thread, a
    shape run once with benchmark off is never benchmarked. A new thread starts with an empty cache.
    """
    box: dict = {}
    current = torch.cuda.current_device() if torch.cuda.is_available() else None

    def target() -> None:
        try:
            if current is not None:
                torch.cuda.set_device(current)  # the device is per host thread in CUDA
            box["result"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed to the caller, who re-raises it
            box["error"] = error

    worker = threading.Thread(target=target, name="gpulab-cudnn")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


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
    ``F.conv2d`` (AssertionError if wrong), the steady-state time (:func:`gpulab.timing.measure`), the
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
            extra = conv.peak_extra_bytes(call, device)
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


# ----------------------------------------------------------------------------------------------
# The experiments: each returns rows, so that a GPU run can be recorded


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
    named = conv.layers_by_name(layers)

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
    named, device, rows = conv.layers_by_name(layers), env.device(), []
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
    named = conv.layers_by_name(layers)

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


# ----------------------------------------------------------------------------------------------
# Figures


def _bars_with_menu(rows: Sequence[dict], *, x: str, series: str, menu: str, value: str, scale: float = 1.0,
                    title: str, y_title: str, log_y: bool = False, hover: Sequence[str] = ()) -> go.Figure:
    """Grouped bars: x = ``row[x]``, one bar per ``row[series]``; a menu picks ``row[menu]`` (static in the book)."""
    rows = ok_rows(rows)
    options = list(dict.fromkeys(r[menu] for r in rows))
    names = list(dict.fromkeys(r[series] for r in rows))
    fig, owners = go.Figure(), []
    for option in options:
        for i, name in enumerate(names):
            chosen = [r for r in rows if r[menu] == option and r[series] == name]
            if not chosen:
                continue
            fig.add_trace(go.Bar(
                x=[r[x] for r in chosen], y=[r[value] * scale for r in chosen], name=str(name),
                visible=option == options[0], marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                marker_pattern_shape=plots.PATTERNS[i % len(plots.PATTERNS)],
                hovertext=[plots.hover_text(r, hover) for r in chosen], hoverinfo="text+name",
            ))
            owners.append(option)
    buttons = [dict(label=str(o), method="update", args=[{"visible": [w == o for w in owners]}]) for o in options]
    fig.update_layout(title=title, yaxis_title=y_title, barmode="group", legend=dict(orientation="h", y=-0.25),
                      updatemenus=[dict(buttons=buttons, x=0.0, y=1.14, xanchor="left", direction="down")]
                      if len(options) > 1 else [], margin=dict(t=100))
    fig.update_yaxes(type="log" if log_y else "linear")
    return fig


def multiplies_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Multiplies per output element against the filter size, a line per method (and batch where it matters)."""
    fig = go.Figure()
    batches = sorted({r["batch"] for r in rows})
    for i, method in enumerate(COUNTED):
        for j, n in enumerate(batches):
            chosen = sorted((r for r in rows if r["method"] == method and r["batch"] == n), key=lambda r: r["filter"])
            if not chosen or (j > 0 and method in ("direct or GEMM", "Winograd F(2x2)")):
                continue  # per output, direct and Winograd do not depend on the batch
            label = method if method in ("direct or GEMM", "Winograd F(2x2)") else f"{method}, N={n}"
            fig.add_trace(go.Scatter(
                x=[r["filter"] for r in chosen], y=[r["per_output"] for r in chosen], name=label,
                mode="lines+markers", line=dict(color=plots.PALETTE[i], dash="solid" if j == 0 else "dash"),
                marker=dict(symbol=plots.SYMBOLS[i]),
                hovertemplate=f"{label}<br>%{{x}} x %{{x}} filter: %{{y:,.0f}} multiplies per output<extra></extra>",
            ))
    fig.update_layout(title=title, xaxis_title="filter size R = S", yaxis_title="real multiplies per output element",
                      legend=dict(orientation="h", y=-0.25))
    fig.update_yaxes(type="log")
    fig.update_xaxes(dtick=2)
    return fig


def benchmark_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Per layer, with cudnn.benchmark off and on: the first call (left) and a steady-state call (right), ms."""
    rows = ok_rows(rows)
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("first call (wall time)", "steady state (median)"),
                        horizontal_spacing=0.1)
    for i, flag in enumerate((False, True)):
        chosen = {r["layer"]: r for r in rows if r["benchmark"] == flag}
        name = "benchmark on (autotuned)" if flag else "benchmark off (heuristics)"
        for col, key in ((1, "first_call_seconds"), (2, "seconds")):
            fig.add_trace(go.Bar(
                x=[layer for layer in layers if layer in chosen], y=[1e3 * chosen[layer][key] for layer in layers
                                                                     if layer in chosen],
                name=name, legendgroup=name, showlegend=col == 1, marker_color=plots.PALETTE[i],
                marker_pattern_shape=plots.PATTERNS[i],
                hovertext=[f"{layer}, {name}<br>{1e3 * chosen[layer][key]:.3g} ms<br>algorithm: "
                           f"{chosen[layer].get('algorithm')}" for layer in layers if layer in chosen],
                hoverinfo="text",
            ), row=1, col=col)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=1)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=2)
    fig.update_xaxes(title_text="layer")
    fig.update_layout(title=title, barmode="group", legend=dict(orientation="h", y=-0.3), margin=dict(t=100))
    return fig


def workspace_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Per layer (rows of :func:`benchmark_sweep` on a GPU): the im2col matrix, and the memory cuDNN used beyond
    the output, with benchmark off and on in steady state, and during the autotuner's first call (MiB)."""
    rows = ok_rows(rows)
    table: dict[str, dict] = {}
    for r in rows:
        entry = table.setdefault(r["layer"], {"layer": r["layer"], "im2col": r["im2col_bytes"] / 2**20})
        if r.get("peak_extra_bytes") is None:
            continue
        setting = "on" if r["benchmark"] else "off"
        entry[f"steady_{setting}"] = r["peak_extra_bytes"] / 2**20
        entry[f"first_{setting}"] = r["first_call_extra_bytes"] / 2**20
    series = {"im2col matrix (the GEMM algorithm's workspace)": "im2col", "steady state, benchmark off": "steady_off",
              "steady state, benchmark on": "steady_on", "first call, benchmark on (autotuner)": "first_on"}
    fig = plots.bars_figure(list(table.values()), "layer", series, title=title,
                            y_title="MiB beyond the output (log; 0 has no bar)", log_y=True)
    fig.update_traces(texttemplate="%{y:,.3g}")
    fig.update_layout(legend=dict(orientation="h", y=-0.25), xaxis_title="layer")
    return fig


def settings_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """TFLOP/s per layer, one bar per method and layout; a menu picks the precision."""
    shown = [{**r, "setting": r["method"] if r["method"] != "conv2d" else f"conv2d {r['layout']}"}
             for r in ok_rows(rows) if "method" in r]
    fig = _bars_with_menu(shown, x="layer", series="setting", menu="dtype", value="tflops", title=title,
                          y_title="TFLOP/s (2 N K P Q C R S / time)",
                          hover=("layer", "dtype", "layout", "seconds", "tflops", "algorithm"))
    fig.update_xaxes(title_text="layer")
    return fig


def channels_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """TFLOP/s against C = K, a line per layout, with the multiples of 8 marked."""
    fig = plots.sweep_figure(ok_rows(rows), "c", "tflops", color="layout", title=title,
                             x_title="channels C = K", y_title="TFLOP/s (2 N K P Q C R S / time)",
                             hover=("c", "layout", "seconds", "tflops", "algorithm"))
    for i, trace in enumerate(fig.data):
        trace.marker.symbol = plots.SYMBOLS[i % len(plots.SYMBOLS)]
    channels = sorted({r["c"] for r in ok_rows(rows)})
    for c in channels:
        if c % 8 == 0:
            fig.add_vline(x=c, line_dash="dot", line_color="#999999")
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return fig


def filter_sizes_figure(talk_rows: Sequence[dict], measured: Sequence[dict], *, title: str,
                        measured_label: str) -> go.Figure:
    """Side by side, milliseconds per filter size: the talk's GV100 table (left) and a measurement (right)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("Quadro GV100 (the talk), cuDNN algorithms", measured_label))
    talk = [r for r in talk_rows if r["milliseconds"] is not None]
    algorithms = list(dict.fromkeys(r["algorithm"] for r in talk))
    for i, algorithm in enumerate(algorithms):
        chosen = [r for r in talk if r["algorithm"] == algorithm]
        fig.add_trace(go.Bar(x=[f"{r['filter']}x{r['filter']}" for r in chosen], y=[r["milliseconds"] for r in chosen],
                             name=algorithm, legendgroup="talk", legendgrouptitle_text="the talk",
                             marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                             marker_pattern_shape=plots.PATTERNS[i % len(plots.PATTERNS)],
                             hovertemplate=f"{algorithm}<br>%{{x}}: %{{y}} ms<extra></extra>"), row=1, col=1)
    ran = ok_rows(measured)
    settings = list(dict.fromkeys(_filter_setting(r) for r in ran))
    for i, setting in enumerate(settings):
        chosen = [r for r in ran if _filter_setting(r) == setting]
        fig.add_trace(go.Bar(x=[f"{r['r']}x{r['s']}" for r in chosen], y=[1e3 * r["seconds"] for r in chosen],
                             name=setting, legendgroup="measured", legendgrouptitle_text="measured",
                             marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                             marker_pattern_shape=plots.PATTERNS[(i + 3) % len(plots.PATTERNS)],
                             hovertext=[f"{setting}, {r['r']}x{r['s']}<br>{1e3 * r['seconds']:.3g} ms<br>"
                                        f"algorithm: {r.get('algorithm') or r['method']}" for r in chosen],
                             hoverinfo="text"), row=1, col=2)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=1)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=2)
    fig.update_xaxes(title_text="filter")
    fig.update_layout(title=title, barmode="group", height=560, margin=dict(t=100))
    return fig


def _filter_setting(row: dict) -> str:
    if row["method"] != "conv2d":
        return setting_label(row)
    return "torch conv2d, benchmark " + ("on" if row["benchmark"] else "off")


def deterministic_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Milliseconds per layer with cudnn.deterministic off and on; a menu picks the pass."""
    shown = [{**r, "setting": "deterministic on" if r["deterministic"] else "deterministic off"}
             for r in ok_rows(rows) if "pass" in r]
    fig = _bars_with_menu(shown, x="layer", series="setting", menu="pass", value="seconds", scale=1e3, title=title,
                          y_title="milliseconds", hover=("layer", "pass", "seconds", "identical", "algorithm"))
    fig.update_xaxes(title_text="layer")
    return fig
