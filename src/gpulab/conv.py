"""Convolutions as GEMMs: the direct loop nest, im2col + GEMM, implicit GEMM, and the NCHW/NHWC layouts.

The conventions are torch's. The input ``x`` is N x C x H x W (images, channels, height, width), the
filters ``weight`` are K x C x R x S (K filters of C channels, R x S each), and the output is
N x K x P x Q with

    P = floor((H + 2 padding - R) / stride) + 1,   Q = floor((W + 2 padding - S) / stride) + 1.

A DNN "convolution" is a cross-correlation: the filter is not flipped. Every implementation here
computes the same thing as ``torch.nn.functional.conv2d(x, weight, stride=stride, padding=padding)``
and is checked against it (in float64) on fresh random data before it is timed.

The three implementations are the three ways of seeing the same arithmetic:

- :func:`conv2d_loops` and :func:`conv2d_direct`: the loop nest, output pixel by output pixel;
- :func:`im2col` and :func:`conv2d_im2col`: copy every input window into a column of a
  (C R S) x (N P Q) matrix, then one GEMM with the K x (C R S) filter matrix does all the work;
- :func:`conv2d_implicit_gemm`: the same GEMM, with the im2col matrix built for one tile of output
  positions at a time and thrown away, so that the extra memory is a few tiles (set by the tile size),
  not the whole matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from gpulab import env, plots, timing
from gpulab.correctness import check_close, poisoned, random_tensor
from gpulab.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.provenance import experiment
from gpulab.sweep import ok_rows, run_sweep
from gpulab.validation import fits_in_memory, positive_int, supported_dtype

LOOP_LIMIT = 2_000_000  # multiply-adds the scalar loop nest accepts (pure Python: about a second)
TILE_ROWS = 2048  # rows of the (transposed) im2col matrix that conv2d_implicit_gemm builds at a time
TILE_BYTES = 2**24  # the experiments size that tile to 16 MiB


# ----------------------------------------------------------------------------------------------
# Shapes: output size, GEMM dimensions, memory of the im2col matrix


def output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, name: str = "size") -> int:
    """Output length of a convolution along one axis: floor((size + 2 padding - kernel) / stride) + 1."""
    size, kernel, stride = positive_int(name, size), positive_int("kernel", kernel), positive_int("stride", stride)
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"padding: expected a whole number >= 0, got {padding!r}")
    if kernel > size + 2 * padding:
        raise ValueError(f"kernel: {kernel} is larger than the padded {name} {size} + 2 x {padding}; "
                         "no output position fits")
    return (size + 2 * padding - kernel) // stride + 1


@dataclass(frozen=True)
class ConvLayer:
    """The sizes of one convolution: N images of C x H x W, K filters of C x R x S, a stride and a padding."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: int = 1
    padding: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        for field in ("n", "c", "h", "w", "k", "r", "s", "stride"):
            positive_int(field, getattr(self, field))
        output_size(self.h, self.r, self.stride, self.padding, "h")
        output_size(self.w, self.s, self.stride, self.padding, "w")

    @classmethod
    def of(cls, x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> ConvLayer:
        """The layer that ``conv2d(x, weight, stride, padding)`` computes; ValueError for operands that do not fit."""
        if x.dim() != 4:
            raise ValueError(f"x: expected N x C x H x W (4 dimensions), got shape {tuple(x.shape)}")
        if weight.dim() != 4:
            raise ValueError(f"weight: expected K x C x R x S (4 dimensions), got shape {tuple(weight.shape)}")
        if weight.shape[1] != x.shape[1]:
            raise ValueError(f"weight: has {weight.shape[1]} channels but x has {x.shape[1]}")
        if weight.dtype != x.dtype or weight.device != x.device:
            raise ValueError(f"weight: is {weight.dtype} on {weight.device} but x is {x.dtype} on {x.device}")
        n, c, h, w = x.shape
        k, _, r, s = weight.shape
        return cls(n, c, h, w, k, r, s, stride, padding)

    @property
    def p(self) -> int:
        """Output height."""
        return output_size(self.h, self.r, self.stride, self.padding, "h")

    @property
    def q(self) -> int:
        """Output width."""
        return output_size(self.w, self.s, self.stride, self.padding, "w")

    # The GEMM of the forward pass in the terms of NVIDIA's convolution guide: M x K times K x N.
    @property
    def gemm_m(self) -> int:
        return self.n * self.p * self.q

    @property
    def gemm_n(self) -> int:
        return self.k

    @property
    def gemm_k(self) -> int:
        return self.c * self.r * self.s

    @property
    def flops(self) -> int:
        """2 M N K: one multiply-add per filter weight per output element."""
        return 2 * self.gemm_m * self.gemm_n * self.gemm_k

    @property
    def input_elements(self) -> int:
        return self.n * self.c * self.h * self.w

    @property
    def filter_elements(self) -> int:
        return self.k * self.c * self.r * self.s

    @property
    def output_elements(self) -> int:
        return self.n * self.k * self.p * self.q

    @property
    def im2col_elements(self) -> int:
        """(C R S) x (N P Q): every output position gets its own copy of its input window."""
        return self.gemm_k * self.gemm_m

    @property
    def blowup(self) -> float:
        """Elements of the im2col matrix per element of the input: R S P Q / (H W), R S for stride 1 'same'."""
        return self.im2col_elements / self.input_elements

    def describe(self) -> str:
        label = f"{self.name}: " if self.name else ""
        return (f"{label}N={self.n} C={self.c} H={self.h} W={self.w} -> K={self.k} filters {self.r}x{self.s}, "
                f"stride {self.stride}, padding {self.padding} -> P={self.p} Q={self.q}")

    def spec(self) -> dict:
        """The fields the layer is made from (``ConvLayer(**layer.spec())`` is the same layer), for a recording."""
        return asdict(self)

    def as_dict(self) -> dict:
        """The fields and the derived sizes: output P and Q, the GEMM's M, N and K, and the FLOP."""
        return {**asdict(self), "p": self.p, "q": self.q, "gemm_m": self.gemm_m, "gemm_n": self.gemm_n,
                "gemm_k": self.gemm_k, "flops": self.flops}


def layer(spec: ConvLayer | dict) -> ConvLayer:
    """A :class:`ConvLayer` from itself or from a dict of its fields (as a recording's parameters hold it)."""
    if isinstance(spec, ConvLayer):
        return spec
    if not isinstance(spec, dict):
        raise ValueError(f"layer: expected a ConvLayer or a dict of its fields, got {type(spec).__name__}")
    unknown = set(spec) - set(ConvLayer.__dataclass_fields__)
    if unknown:
        raise ValueError(f"layer: unknown field(s) {', '.join(sorted(unknown))}")
    return ConvLayer(**spec)


# ----------------------------------------------------------------------------------------------
# Three implementations of the same convolution


def conv2d_loops(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """The convolution as its seven nested loops, one scalar multiply-add at a time (tiny sizes only).

    Padding is not copied: a filter tap that falls outside the image reads a zero.
    """
    shape = ConvLayer.of(x, weight, stride, padding)
    if shape.flops // 2 > LOOP_LIMIT:
        raise ValueError(f"x: {shape.flops // 2:,} multiply-adds is too many for the scalar loop nest "
                         f"(limit {LOOP_LIMIT:,}); use conv2d_direct")
    xs, ws = x.tolist(), weight.tolist()
    out = [[[[0.0] * shape.q for _ in range(shape.p)] for _ in range(shape.k)] for _ in range(shape.n)]
    for n in range(shape.n):  # every image
        for k in range(shape.k):  # every filter
            for p in range(shape.p):  # every output row
                for q in range(shape.q):  # every output column
                    total = 0.0
                    for c in range(shape.c):  # the reduction: channels ...
                        for r in range(shape.r):  # ... and filter rows ...
                            h = p * stride + r - padding
                            if not 0 <= h < shape.h:
                                continue
                            for s in range(shape.s):  # ... and filter columns
                                w = q * stride + s - padding
                                if 0 <= w < shape.w:
                                    total += xs[n][c][h][w] * ws[k][c][r][s]
                    out[n][k][p][q] = total
    return torch.tensor(out, dtype=x.dtype, device=x.device)


def conv2d_direct(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """The loop nest with its inner loops vectorised: for each output pixel (p, q), one small GEMM.

    At pixel (p, q) the window x[:, :, p*stride : p*stride + R, q*stride : q*stride + S] of every image
    is multiplied by all K filters at once: (N x CRS) times (CRS x K). P x Q Python iterations, so it is
    for small layers only.
    """
    shape = ConvLayer.of(x, weight, stride, padding)
    padded = F.pad(x, (padding, padding, padding, padding))
    filters = weight.reshape(shape.k, shape.gemm_k).t()  # CRS x K
    out = poisoned((shape.n, shape.k, shape.p, shape.q), x.dtype, x.device)  # an unwritten pixel stays NaN
    for p in range(shape.p):
        for q in range(shape.q):
            window = padded[:, :, p * stride:p * stride + shape.r, q * stride:q * stride + shape.s]
            out[:, :, p, q] = window.reshape(shape.n, shape.gemm_k) @ filters
    return out


def im2col(x: torch.Tensor, r: int, s: int, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """Copy every R x S window of every channel into one column: a (C R S) x (N P Q) matrix.

    Row (c, r, s) (c slowest, s fastest, as in ``weight.reshape(K, C*R*S)``) and column (n, p, q) hold
    the padded input at channel c, row p*stride + r, column q*stride + s of image n. Built from R x S
    strided slices of the padded input, one per filter tap: each slice is a whole block of rows.
    """
    if x.dim() != 4:
        raise ValueError(f"x: expected N x C x H x W (4 dimensions), got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    p, q = output_size(h, r, stride, padding, "h"), output_size(w, s, stride, padding, "w")
    padded = F.pad(x, (padding, padding, padding, padding))
    columns = x.new_empty((c, r, s, n, p, q))
    for i in range(r):
        for j in range(s):
            taps = padded[:, :, i:i + stride * (p - 1) + 1:stride, j:j + stride * (q - 1) + 1:stride]  # N C P Q
            columns[:, i, j] = taps.transpose(0, 1)
    return columns.reshape(c * r * s, n * p * q)


def conv2d_im2col(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """im2col, then one GEMM: (K x CRS) times (CRS x NPQ); the K x NPQ result is put back in N K P Q order."""
    shape = ConvLayer.of(x, weight, stride, padding)
    columns = im2col(x, shape.r, shape.s, stride, padding)
    out = weight.reshape(shape.k, shape.gemm_k) @ columns  # K x (N P Q)
    # The GEMM leaves the output as K x N x P x Q; NCHW wants N x K x P x Q: one more pass over the output.
    return out.reshape(shape.k, shape.n, shape.p, shape.q).transpose(0, 1).contiguous()


def conv2d_implicit_gemm(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0,
                         tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """The im2col GEMM without the im2col matrix: build a tile of ``tile_rows`` of its rows, multiply, discard.

    This is the GEMM in the orientation of NVIDIA's convolution guide, (N P Q) x (C R S) times
    (C R S) x K, whose first operand is the transposed im2col matrix. For each tile of output positions
    (n, p, q), the tile's rows are gathered straight from ``x``: the address of every element is computed
    from its output position and its filter tap (r, s), all C channels of a tap at once, and a tap that
    falls in the padding reads zero, so not even a padded copy of the input is made. Each row is
    ordered (r, s, c), channels fastest, as on NHWC data; the filters are reordered to match. The extra
    memory is one tile (T x CRS), its T x K result and the index vectors, whatever the size of the layer.
    cuDNN's implicit-GEMM kernels do the same with small tiles in on-chip shared memory and registers.
    """
    shape = ConvLayer.of(x, weight, stride, padding)
    tile_rows = positive_int("tile_rows", tile_rows)
    filters = weight.permute(0, 2, 3, 1).reshape(shape.k, shape.gemm_k).t()  # (R S C) x K, the GEMM's B
    taps_r = torch.arange(shape.r, device=x.device)
    taps_s = torch.arange(shape.s, device=x.device)
    out = poisoned((shape.n, shape.k, shape.p, shape.q), x.dtype, x.device)  # an unwritten pixel stays NaN
    for start in range(0, shape.gemm_m, tile_rows):
        row = torch.arange(start, min(start + tile_rows, shape.gemm_m), device=x.device)
        n, p, q = row // (shape.p * shape.q), row // shape.q % shape.p, row % shape.q
        h = p[:, None] * stride + taps_r - padding  # T x R: input row of each output row and filter row
        w = q[:, None] * stride + taps_s - padding  # T x S
        tile = x[n[:, None, None], :, h.clamp(0, shape.h - 1)[:, :, None], w.clamp(0, shape.w - 1)[:, None, :]]
        inside = ((h >= 0) & (h < shape.h))[:, :, None] & ((w >= 0) & (w < shape.w))[:, None, :]  # T x R x S
        tile.masked_fill_(~inside[..., None], 0)  # tile is T x R x S x C: taps in the padding read zero
        out[n, :, p, q] = tile.reshape(row.numel(), shape.gemm_k) @ filters  # T x K
    return out


def tile_rows_for(spec: ConvLayer | dict, element_bytes: int, tile_bytes: int) -> int:
    """The most rows of the implicit GEMM's tile (C R S elements each) that fit in ``tile_bytes``, at least 1."""
    shape = layer(spec)
    return max(1, min(shape.gemm_m, positive_int("tile_bytes", tile_bytes) // (shape.gemm_k * element_bytes)))


IMPLEMENTATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "loop nest": conv2d_loops,
    "direct": conv2d_direct,
    "im2col + GEMM": conv2d_im2col,
    "implicit GEMM (tiled)": conv2d_implicit_gemm,
}


def _reference(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    return F.conv2d(x.double(), weight.double(), stride=stride, padding=padding)


def check_implementations(cases: Sequence[ConvLayer | dict], dtype: str = "float32",
                          device: torch.device | None = None) -> list[dict]:
    """Every implementation against float64 ``F.conv2d`` on fresh random data, for every case.

    Raises AssertionError on the first wrong (or NaN) result; returns a row per case and implementation
    with the relative error. The scalar loop nest runs only where it is small enough.
    """
    device = device or env.device()
    label = supported_dtype("dtype", dtype, device)
    rows = []
    with matmul_mode(label) as torch_dtype:
        for case in map(layer, cases):
            x = random_tensor((case.n, case.c, case.h, case.w), torch_dtype, device)
            weight = random_tensor((case.k, case.c, case.r, case.s), torch_dtype, device)
            reference = _reference(x, weight, case.stride, case.padding)
            for name, implementation in IMPLEMENTATIONS.items():
                if implementation is conv2d_loops and case.flops // 2 > LOOP_LIMIT:
                    continue
                actual = implementation(x, weight, case.stride, case.padding)
                error = check_close(actual, reference, MATMUL_TOLERANCE[label], f"{name}, {case.describe()}")
                rows.append({**case.as_dict(), "method": name, "dtype": label, "relative_error": error})
    return rows


# ----------------------------------------------------------------------------------------------
# Memory: the im2col blow-up, measured


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


# ----------------------------------------------------------------------------------------------
# Time: each method on each layer, checked first


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


# ----------------------------------------------------------------------------------------------
# Memory layouts: where element (n, c, h, w) lives


def nchw_offset(n: int, c: int, h: int, w: int, channels: int, height: int, width: int) -> int:
    """Position of element (n, c, h, w) in an NCHW tensor: w fastest, then h, then c, then n."""
    return ((n * channels + c) * height + h) * width + w


def nhwc_offset(n: int, c: int, h: int, w: int, channels: int, height: int, width: int) -> int:
    """Position of element (n, c, h, w) in an NHWC tensor: c fastest, then w, then h, then n."""
    return ((n * height + h) * width + w) * channels + c


LAYOUTS = {"NCHW": nchw_offset, "NHWC": nhwc_offset}


def layout_offsets(shape: Sequence[int], layout: str) -> torch.Tensor:
    """An N x C x H x W tensor of int64 holding each element's memory offset in ``layout`` (by the formula)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: unknown {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if len(shape) != 4:
        raise ValueError(f"shape: expected (N, C, H, W), got {tuple(shape)}")
    sizes = [positive_int(name, v) for name, v in zip("NCHW", shape, strict=True)]
    n, c, h, w = torch.meshgrid(*(torch.arange(v) for v in sizes), indexing="ij")
    return LAYOUTS[layout](n, c, h, w, *sizes[1:])


def offsets_from_strides(tensor: torch.Tensor) -> torch.Tensor:
    """Each element's offset from the start of ``tensor``'s storage, from ``tensor.stride()`` (what torch does)."""
    grids = torch.meshgrid(*(torch.arange(v) for v in tensor.shape), indexing="ij")
    return sum(g * stride for g, stride in zip(grids, tensor.stride(), strict=True))


def layout_figure(c: int = 64, h: int = 5, w: int = 4, *, title: str | None = None) -> go.Figure:
    """Memory offset of every (c, h, w) element of a 1 x C x H x W tensor, in NCHW (left) and NHWC (right).

    Rows are channels, columns the H x W pixels in row-major order; colour and hover give the offset.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("NCHW: w, then h, then c", "NHWC: c, then w, then h"),
                        horizontal_spacing=0.12)
    pixels = [f"h{i} w{j}" for i in range(h) for j in range(w)]
    for col, name in enumerate(LAYOUTS, start=1):
        offsets = layout_offsets((1, c, h, w), name)[0].reshape(c, h * w)
        hover = [[f"c = {ci}, h = {p // w}, w = {p % w}<br>{name} offset {offsets[ci, p].item()}"
                  for p in range(h * w)] for ci in range(c)]
        fig.add_trace(go.Heatmap(
            z=offsets.tolist(), x=pixels, y=list(range(c)), colorscale="Viridis", showscale=col == 2,
            text=offsets.tolist(), texttemplate="%{text}", textfont=dict(size=8), hovertext=hover,
            hoverinfo="text", colorbar=dict(title="offset"), zmin=0, zmax=c * h * w - 1,
        ), row=1, col=col)
        fig.update_xaxes(title_text="pixel (h, w)", tickangle=-60, row=1, col=col)
        fig.update_yaxes(title_text="channel c", autorange="reversed", row=1, col=col)
    fig.update_layout(title=title or f"Where each element of a 1 x {c} x {h} x {w} tensor lives in memory",
                      height=max(440, 16 * c + 160))
    return fig


def memory_order_figure(c: int = 64, h: int = 5, w: int = 4, count: int = 24, *, title: str | None = None) -> go.Figure:
    """The first ``count`` elements of memory, in order, for each layout: which (c, h, w) sits at each offset.

    One heatmap with a row per layout (two one-row heatmaps on a category axis break plotly.js's calc).
    """
    count = positive_int("count", count)
    channels, labels = [], []
    for name in LAYOUTS:
        flat = layout_offsets((1, c, h, w), name)[0].flatten()
        order = torch.argsort(flat)[:count].tolist()  # element index (c, h, w) row-major, sorted by its offset
        channels.append([i // (h * w) for i in order])
        labels.append([f"c{i // (h * w)}<br>h{i // w % h}<br>w{i % w}" for i in order])
    fig = go.Figure(go.Heatmap(
        z=channels, x=list(range(len(labels[0]))), y=list(LAYOUTS), text=labels, texttemplate="%{text}",
        textfont=dict(size=9), colorscale="Viridis", zmin=0, zmax=c - 1, showscale=False,
        hovertemplate="%{y} offset %{x}: %{text}<extra></extra>", xgap=2, ygap=6,
    ))
    fig.update_layout(title=title or f"The first {count} elements in memory (colour: channel)", height=330,
                      xaxis=dict(title="memory offset", dtick=1, showgrid=False),
                      yaxis=dict(autorange="reversed", showgrid=False))
    return fig


# ----------------------------------------------------------------------------------------------
# Figures of the measurements


def methods_figure(rows: Sequence[dict], *, value: str = "tflops", title: str, y_title: str,
                   log_y: bool = True) -> go.Figure:
    """Grouped bars, one group per layer and one bar per method; a menu picks the dtype (static in the book)."""
    rows = ok_rows(rows)
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    fig, owners = go.Figure(), []
    for dtype in dtypes:
        for i, method in enumerate(methods):
            series = [r for r in rows if r["dtype"] == dtype and r["method"] == method]
            fig.add_trace(go.Bar(
                x=[r["layer"] for r in series], y=[r[value] for r in series], name=method,
                visible=dtype == dtypes[0], marker_color=plots.PALETTE[i % len(plots.PALETTE)],
                hovertext=[f"{r['layer']}, {method}, {dtype}<br>{r['seconds'] * 1e3:.3g} ms, "
                           f"{r['tflops']:.3g} TFLOP/s<br>GEMM M={r['gemm_m']:,} N={r['gemm_n']:,} K={r['gemm_k']:,}"
                           for r in series], hoverinfo="text",
            ))
            owners.append(dtype)
    buttons = [dict(label=d, method="update", args=[{"visible": [o == d for o in owners]}]) for d in dtypes]
    fig.update_layout(title=title, yaxis_title=y_title, barmode="group", legend=dict(orientation="h", y=-0.25),
                      updatemenus=[dict(buttons=buttons, x=0.0, y=1.14, xanchor="left", direction="down")]
                      if len(dtypes) > 1 else [])
    fig.update_yaxes(type="log" if log_y else "linear")
    return fig


# ----------------------------------------------------------------------------------------------
# The course's worked example {LAPENNA Unit 11}: 7x7x3 input, two 3x3x3 filters, stride 2, ReLU,
# 2x2 max-pool of stride 1, flatten, dense, softmax. The slides print the convolution's output
# (NHWC, 1 x 3 x 3 x 2) but not the input and filters it came from.

COURSE_CONV_OUTPUT_NHWC = [[[[-2.0, 7.0], [1.0, 1.0], [4.0, -7.0]],
                            [[1.0, 6.0], [9.0, -8.0], [6.0, -6.0]],
                            [[2.0, -7.0], [1.0, -4.0], [2.0, -8.0]]]]
COURSE_RELU_NHWC = [[[[0.0, 7.0], [1.0, 1.0], [4.0, 0.0]],
                     [[1.0, 6.0], [9.0, 0.0], [6.0, 0.0]],
                     [[2.0, 0.0], [1.0, 0.0], [2.0, 0.0]]]]
COURSE_POOLED_NHWC = [[[[9.0, 7.0], [9.0, 1.0]], [[9.0, 6.0], [9.0, 0.0]]]]
COURSE_FLATTENED = [9.0, 9.0, 9.0, 9.0, 7.0, 1.0, 6.0, 0.0]
COURSE_SOFTMAX = [2.3891544e-01, 2.3891544e-01, 2.3891544e-01, 2.3891544e-01,
                  3.2333687e-02, 8.0147205e-05, 1.1894900e-02, 2.9484507e-05]
COURSE_PARAMETERS = 146
COURSE_STRIDE = 2  # 7 -> 3 with a 3 x 3 filter and no padding needs stride 2: (7 - 3) / 2 + 1 = 3


def course_network(hidden: int = 8, classes: int = 2) -> torch.nn.Sequential:
    """The worked example as torch modules: conv 3->2 (3x3, stride 2), ReLU, max-pool 2x2/1, flatten, dense, softmax.

    The slides name a fully connected layer of neurons after the flatten and a last layer of 2
    softmax neurons; ``hidden`` is the size of the first, which the slides do not print.
    """
    hidden, classes = positive_int("hidden", hidden), positive_int("classes", classes)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 2, kernel_size=3, stride=COURSE_STRIDE),  # 1x3x7x7 -> 1x2x3x3
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(kernel_size=2, stride=1),  # -> 1x2x2x2
        torch.nn.Flatten(),  # -> 1x8
        torch.nn.Linear(8, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes),
        torch.nn.Softmax(dim=1),
    )


def parameter_count(model: torch.nn.Module) -> int:
    """Trainable parameters of ``model``: what Keras' summary calls 'Trainable params'."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def hidden_units_for(total: int = COURSE_PARAMETERS, conv: int = 3 * 3 * 3 * 2 + 2, flat: int = 8,
                     classes: int = 2) -> float:
    """Solve conv + (flat + 1) H + (H + 1) classes = total for the hidden layer's width H."""
    return (total - conv - classes) / (flat + 1 + classes)


def im2col_figure(h: int = 4, w: int = 4, r: int = 3, s: int = 3, stride: int = 1, padding: int = 1, *,
                  title: str | None = None) -> go.Figure:
    """The im2col matrix of a one-channel h x w image whose pixels are numbered: each pixel is copied up to R S times.

    Each column is one output position's window; a cell shows which input pixel was copied there
    (blank: a tap in the zero padding).
    """
    image = torch.arange(1, h * w + 1, dtype=torch.float64).reshape(1, 1, h, w)  # 1-based: padding reads 0
    columns = (im2col(image, r, s, stride, padding) - 1).long()  # pixel number, -1 in the padding
    cells = [[None if v < 0 else v for v in row] for row in columns.tolist()]
    fig = go.Figure(go.Heatmap(
        z=cells, text=[["" if v is None else str(v) for v in row] for row in cells], texttemplate="%{text}",
        colorscale="Viridis", showscale=False, xgap=1, ygap=1,
        x=[f"p{j // output_size(w, s, stride, padding)} q{j % output_size(w, s, stride, padding)}"
           for j in range(columns.shape[1])],
        y=[f"r{i // s} s{i % s}" for i in range(r * s)],
        hovertemplate="output position %{x}, filter tap %{y}: input pixel %{text}<extra></extra>",
    ))
    copies = torch.bincount(columns[columns >= 0].flatten(), minlength=h * w)
    fig.update_layout(
        title=title or (f"im2col of a {h} x {w} image, {r} x {s} filter, stride {stride}, padding {padding}: "
                        f"{columns.numel()} cells for {h * w} pixels (each copied up to {int(copies.max())} times)"),
        xaxis=dict(title="column: output position (p, q)", tickangle=-60, showgrid=False),
        yaxis=dict(title="row: filter tap (r, s)", autorange="reversed", showgrid=False), height=420,
    )
    return fig
