"""The convolution algorithms cuDNN chooses among, written out: FFT (whole and tiled) and Winograd's F(2x2, 3x3),
each checked against float64; their multiplications and workspace counted; and the GTC talk's table of times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.core import env, specs
from gpulab.core.correctness import check_close, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.core.validation import positive_int, positive_ints, supported_dtype

FFT_TILE = 32  # the tile edge of conv2d_fft_tiled (cuDNN's FFT_TILING kernels are named for 32 x 32 tiles)


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





TALK_SETUP = "128x128x128x128 convolution, FP32, NCHW, Quadro GV100"
TALK_GPU_ROW = "V100 SXM2 32GB"  # gpulab.core.specs' row of the same GV100 chip (80 SMs); the Quadro card is not listed
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
    as if computed directly), against the float32 peak of a GV100 (:data:`TALK_GPU_ROW` of gpulab.core.specs), and
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
