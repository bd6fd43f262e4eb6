"""Chapter 05's figures and tables: the course's example, layouts in memory, im2col's matrix, the layers as GEMMs,
and the methods' time and memory, drawn from runs of :mod:`.sweeps` (each recorded GPU behind a menu)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.ch05_convolutions_as_gemms.conv import LAYOUTS, ConvLayer, im2col, layout_offsets, output_size
from gpulab.ch05_convolutions_as_gemms.sweeps import METHODS
from gpulab.core import plots
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, stacked, table
from gpulab.core.validation import positive_int

SIZE = {"format": lambda b: format_bytes(int(b))}  # a byte count in the largest binary unit


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
                      yaxis=dict(title="layout", autorange="reversed", showgrid=False, automargin=True))
    return fig

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


def output_size_choices(size: int = 7, kernel: int = 3, output: int = 3,
                        max_padding: int | None = None) -> list[tuple[int, int]]:
    """Every (padding, stride) that turns a ``size``-pixel image under a ``kernel``-pixel filter into ``output``
    pixels, by the output-size formula, for paddings from 0 to ``max_padding`` (the filter's size by default) and
    every stride that leaves more than one position."""
    size, kernel, output = positive_int("size", size), positive_int("kernel", kernel), positive_int("output", output)
    max_padding = kernel if max_padding is None else max_padding
    return [(padding, stride) for padding in range(max_padding + 1) if kernel <= size + 2 * padding
            for stride in range(1, size + 2 * padding + 1) if output_size(size, kernel, stride, padding) == output]


def windows_touch_the_image(size: int, kernel: int, stride: int, padding: int) -> bool:
    """Whether every window of the filter covers at least one pixel of the image (none reads padding only)."""
    starts = [j * stride - padding for j in range(output_size(size, kernel, stride, padding))]
    return all(start + kernel - 1 >= 0 and start <= size - 1 for start in starts)


def output_size_table(size: int = 7, kernel: int = 3, output: int = 3, max_padding: int | None = None) -> Table:
    """Each (padding, stride) of :func:`output_size_choices`, with the formula and whether every window covers part of
    the image."""
    rows = [{"padding": pad, "stride": u, "formula": f"floor(({size} + 2 x {pad} - {kernel}) / {u}) + 1",
             "p": output_size(size, kernel, u, pad),
             "inside": "yes" if windows_touch_the_image(size, kernel, u, pad) else "no: one reads padding only"}
            for pad, u in output_size_choices(size, kernel, output, max_padding)]
    top = kernel if max_padding is None else max_padding
    return table(rows, [Column("padding", "padding"), Column("stride", "stride u"),
                        Column("formula", "P = floor((H + 2 pad - R) / u) + 1"), Column("p", "P"),
                        Column("inside", "every window covers image pixels")],
                 caption=f"every choice that turns a {size} x {size} image and a {kernel} x {kernel} filter into "
                         f"{output} x {output}, for padding 0 to {top}")


def output_size_choices_said(size: int = 7, kernel: int = 3, output: int = 3) -> str:
    """A sentence naming every (padding, stride) of :func:`output_size_choices` and those without padding."""
    choices = output_size_choices(size, kernel, output)
    unpadded = [u for pad, u in choices if pad == 0]
    listed = ", ".join(f"({pad}, {u})" for pad, u in choices)
    return (f"{len(choices)} choices of (padding, stride), padding from 0 to {kernel}, give a {output} x {output} "
            f"output: {listed}. Without padding, only stride "
            f"{' or '.join(map(str, unpadded)) if unpadded else 'none'} does.")


def _values(tensor: torch.Tensor) -> str:
    """A small tensor's values as nested lists of whole numbers."""
    return str(tensor.int().tolist())


def course_convolution_table(image_nhwc: torch.Tensor, filters_hwcm: torch.Tensor, output: torch.Tensor) -> Table:
    """Step 1 of the course's example: each tensor's shape in the slide's layout and in torch's, and the output's
    values (``output`` is N K P Q, shown in the slide's N P Q K order)."""
    rows = [{"tensor": "input", "slide": f"{tuple(image_nhwc.shape)} (N H W C)",
             "torch": f"{tuple(image_nhwc.permute(0, 3, 1, 2).shape)} (N C H W)"},
            {"tensor": "filters", "slide": f"{tuple(filters_hwcm.shape)} (H W C M)",
             "torch": f"{tuple(filters_hwcm.permute(3, 2, 0, 1).shape)} (K C R S)"},
            {"tensor": "convolution output", "slide": f"{tuple(output.permute(0, 2, 3, 1).shape)} (N P Q K)",
             "torch": f"{tuple(output.shape)} (N K P Q)", "values": _values(output.permute(0, 2, 3, 1)[0])}]
    return table(rows, [Column("tensor"), Column("slide", "shape in the slide's layout"),
                        Column("torch", "shape in torch's"), Column("values", "values (P Q K)")])


def course_steps_table(steps: Sequence[tuple[str, torch.Tensor]]) -> Table:
    """Steps 2 to 5 of the course's example: (name, tensor) pairs, a 4-dimensional tensor given in N C H W order and
    shown in the slide's N H W C order, each with its shape and values."""
    rows = []
    for name, tensor in steps:
        shown = tensor.permute(0, 2, 3, 1) if tensor.dim() == 4 else tensor
        rows.append({"step": name, "shape": str(tuple(shown.shape)), "values": _values(shown[0])})
    return table(rows, [Column("step"), Column("shape", "shape (the slide's layout)"), Column("values")])


def softmax_table(probabilities: torch.Tensor, printed: Sequence[float] = conv.COURSE_SOFTMAX) -> Table:
    """The softmax of the flattened vector against the slide's printout, element by element."""
    ours = probabilities.double().tolist()
    rows = [{"i": i, "ours": p, "slide": q, "relative": abs(p - q) / q}
            for i, (p, q) in enumerate(zip(ours, printed, strict=True))]
    eps, largest = torch.finfo(probabilities.dtype).eps, max(r["relative"] for r in rows)
    name = str(probabilities.dtype).removeprefix("torch.")
    return table(rows, [Column("i", "element"), Column("ours", "softmax of qd", format=".7e"),
                        Column("slide", "the slide printed", format=".7e"),
                        Column("relative", "relative difference", format=".1e")],
                 caption=f"largest relative difference {largest:.1e}: {name}'s rounding (epsilon {eps:.1e})")


def parameter_table(model: torch.nn.Module, input_shape: Sequence[int] = (1, 3, 7, 7)) -> Table:
    """Each module's output shape on an input of ``input_shape`` and its trainable parameters, with the total."""
    activation, rows = torch.randn(*input_shape), []
    with torch.no_grad():
        for module in model:
            activation = module(activation)
            rows.append({"layer": type(module).__name__, "shape": str(tuple(activation.shape)),
                         "parameters": conv.parameter_count(module)})
    rows.append({"layer": "total", "parameters": conv.parameter_count(model)})
    return table(rows, [Column("layer"), Column("shape", "output shape"), Column("parameters")])


def checks_table(rows: Sequence[dict]) -> Table:
    """The relative errors of :func:`gpulab.ch05_convolutions_as_gemms.conv.check_implementations`: a row per dtype and
    case, a column per implementation (a dash where the loop nest was too slow to run)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    wide: dict[tuple[str, str], dict] = {}
    for r in rows:
        wide.setdefault((r["dtype"], r["name"]), {"dtype": r["dtype"], "case": r["name"]})[r["method"]] = (
            r["relative_error"])
    return table(wide.values(), [Column("dtype"), Column("case"), *(Column(m, format=".1e") for m in methods)],
                 caption="relative error against float64 conv2d")


def layouts_table(shape: Sequence[int] = (1, 64, 5, 4),
                  elements: Sequence[tuple[int, int, int]] = ((1, 0, 0), (0, 0, 1), (63, 4, 3))) -> Table:
    """Per layout: torch's strides and the offsets of a few elements (c, h, w), after checking the formula against
    torch's strides on every element (AssertionError if they differ)."""
    contiguous = torch.empty(tuple(shape))
    rows = []
    for layout, tensor in (("NCHW", contiguous), ("NHWC", contiguous.to(memory_format=torch.channels_last))):
        formula = layout_offsets(shape, layout)
        if not torch.equal(formula, conv.offsets_from_strides(tensor)):
            raise AssertionError(f"{layout}: the offset formula differs from torch's strides {tensor.stride()}")
        rows.append({"layout": layout, "strides": str(tensor.stride()),
                     **{str(e): int(formula[(0, *e)]) for e in elements}})
    return table(rows, [Column("layout"), Column("strides", "torch's strides (N, C, H, W)"),
                        *(Column(str(e), f"offset of (c, h, w) = {e}") for e in elements)],
                 caption=f"both formulas equal torch's strides on all {contiguous.numel():,} elements")


def gemm_table(layers: Sequence[ConvLayer]) -> Table:
    """Each layer's sizes and the GEMM of its forward pass, in the letters of NVIDIA's guide."""
    rows = [{"layer": x.name or x.describe(), "nchw": f"{x.n} {x.c} {x.h} {x.w}",
             "krs": f"{x.k} {x.r}x{x.s} /{x.stride}", "pq": f"{x.p} x {x.q}", "m": x.gemm_m, "n": x.gemm_n,
             "k": x.gemm_k, "gflop": x.flops / 1e9, "blowup": x.blowup} for x in layers]
    return table(rows, [Column("layer"), Column("nchw", "N C H W"), Column("krs", "K, R x S /u"),
                        Column("pq", "P x Q"), Column("m", "M = NPQ"), Column("n", "N = K"), Column("k", "K = CRS"),
                        Column("gflop", "work", "GFLOP", ",.2f"), Column("blowup", "im2col / input", format=".2f")])


MEMORY_COLUMNS = (Column("layer"), Column("input_bytes", "input", **SIZE), Column("im2col_bytes", "im2col", **SIZE),
                  Column("blowup", "blow-up", format=".2f"), Column("predicted_blowup", "R S PQ / HW", format=".2f"),
                  Column("tile_bytes", "implicit GEMM tile", **SIZE),
                  Column("im2col_peak_extra_bytes", "measured extra: im2col + GEMM", **SIZE),
                  Column("implicit_peak_extra_bytes", "implicit GEMM", **SIZE),
                  Column("torch_peak_extra_bytes", "conv2d", **SIZE))


def memory_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and layer: the input, the im2col matrix, its blow-up against R S PQ / HW, the implicit GEMM's tile,
    and the memory each method allocated beyond its output at its peak."""
    return stacked(runs, MEMORY_COLUMNS, where=lambda r: r.get("status") == "ok",
                   caption="float32; the measured extras are peaks of the GPU's allocator beyond the output")


def largest_im2col(runs: Sequence[Recording]) -> list[str]:
    """A sentence per run: its largest im2col matrix against its input."""
    said = []
    for run in runs:
        largest = max(ok_rows(run.rows), key=lambda r: r["im2col_bytes"])
        said.append(f"{run.label}: the largest im2col matrix is that of {largest['layer']}, "
                    f"{format_bytes(largest['im2col_bytes'])} for an input of {format_bytes(largest['input_bytes'])}.")
    return said


def memory_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        rows = ok_rows(run.rows)
        series = {"input": "input_bytes", "im2col matrix": "im2col_bytes", "implicit GEMM tile": "tile_bytes"}
        if rows and rows[0].get("im2col_peak_extra_bytes") is not None:
            series |= {"measured extra, im2col + GEMM": "im2col_peak_extra_bytes",
                       "measured extra, implicit GEMM": "implicit_peak_extra_bytes",
                       "measured extra, conv2d (cuDNN)": "torch_peak_extra_bytes"}
        return plots.bars_figure(rows, "layer", series, log_y=True, x_title="convolution layer",
                                 title=f"Memory of a convolution, float32: {run.label}", y_title="bytes (log scale)",
                                 hover=("layer", "blowup", "gemm_m", "gemm_k"))
    return plots.by_gpu(runs, figure)


def dtypes_of(runs: Sequence[Recording]) -> list[str]:
    """The number formats the runs measured, in the order they first appear."""
    return list(dict.fromkeys(r["dtype"] for run in runs for r in ok_rows(run.rows)))


def methods_by_gpu(runs: Sequence[Recording], dtype: str) -> go.Figure:
    """The rate of every method on every layer in ``dtype``, one GPU at a time (a menu picks it)."""
    having = [run for run in runs if any(r["dtype"] == dtype for r in ok_rows(run.rows))]

    def figure(run: Recording) -> go.Figure:
        fig = methods_figure([r for r in run.rows if r.get("dtype") == dtype],
                             title=f"Convolution rate by method, {dtype}: {run.label}",
                             y_title="TFLOP/s (2 M N K / time, log scale)")
        return fig.update_xaxes(title_text="convolution layer")
    return plots.by_gpu(having, figure)


def rate(rows: Sequence[dict], layer: str, method: str, dtype: str) -> float | None:
    """The measured TFLOP/s of one method on one layer, or None where it did not run."""
    found = [r for r in rows if r.get("layer") == layer and r.get("method") == method and r.get("dtype") == dtype]
    return found[0]["tflops"] if found and found[0].get("status") == "ok" else None


def rates_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, number format and layer: the GEMM alone's rate, and im2col + GEMM and torch's conv2d in each layout
    as shares of it."""
    rows = []
    for run in runs:
        for dtype in dict.fromkeys(r["dtype"] for r in ok_rows(run.rows)):
            for name in dict.fromkeys(r["layer"] for r in ok_rows(run.rows)):
                measured = {m: rate(run.rows, name, m, dtype)
                            for m in ("GEMM alone", "im2col + GEMM", "conv2d NCHW", "conv2d NHWC")}
                gemm = measured.pop("GEMM alone")
                if gemm is None or None in measured.values():
                    continue
                rows.append({"gpu": run.short_label, "dtype": dtype, "layer": name, "gemm": gemm,
                             **{m: value / gemm for m, value in measured.items()}})
    share = {"format": ".0%"}
    return table(rows, [Column("gpu", "GPU"), Column("dtype"), Column("layer"),
                        Column("gemm", "GEMM alone", "TFLOP/s", ",.2f"),
                        Column("im2col + GEMM", "im2col + GEMM, of GEMM alone", **share),
                        Column("conv2d NCHW", "conv2d NCHW, of it", **share),
                        Column("conv2d NHWC", "conv2d NHWC, of it", **share)])
