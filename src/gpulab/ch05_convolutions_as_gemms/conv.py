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

import torch
import torch.nn.functional as F

from gpulab.core import env
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, matmul_mode
from gpulab.core.validation import positive_int, supported_dtype

LOOP_LIMIT = 2_000_000  # multiply-adds the scalar loop nest accepts (pure Python: about a second)
TILE_ROWS = 2048  # rows of the (transposed) im2col matrix that conv2d_implicit_gemm builds at a time
TILE_BYTES = 2**24  # the experiments size that tile to 16 MiB






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
