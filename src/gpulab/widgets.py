"""ipywidgets explorers that measure live, built on the same functions the chapters call.

A live control needs a running kernel. In the static book there is none, so every explorer is
displayed with a fallback: pages built without a kernel show a line saying to launch the notebook
(the book's configuration prefers that ``text/html`` over the widget view), while JupyterLab and
Colab show the widget itself. The static page gets its exploration from recorded data instead
(see :func:`gpulab.plots.roofline_explorer_figure`).

Explorers write their results into an ``Output`` widget by setting its state (:func:`render`), never
with ``with output:``. The notebook executor behind papermill and the book build (nbclient) imitates a
capturing ``Output`` by writing to the kernel's shell socket while it waits on that socket for the
cell's reply; now and then it misses the reply and waits forever (jupyter/nbclient#312).
"""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w
import plotly.graph_objects as go
import torch
from IPython.display import display

from gpulab import blas, plots, specs
from gpulab.roofline import Roofline

NEEDS_KERNEL = (
    "This explorer measures live and needs a running kernel: launch this notebook (the Colab button at "
    "the top of the page, or Jupyter on your own machine) to use it."
)


def show(widget: w.Widget) -> None:
    """Display ``widget``; where no kernel can answer it (the static book) show how to launch it instead."""
    display({
        "application/vnd.jupyter.widget-view+json": {
            "version_major": 2, "version_minor": 0, "model_id": widget.model_id,
        },
        "text/plain": NEEDS_KERNEL,
        "text/html": f'<p class="gpulab-needs-kernel"><em>{NEEDS_KERNEL}</em></p>',
    }, raw=True)


def render(output: w.Output, text: str = "", figure: go.Figure | None = None) -> None:
    """Make ``output`` show ``text`` and then ``figure``, replacing what it showed.

    The figure goes in as the mime bundle of plotly's current renderer (``display(figure)`` would
    not do: a plotly figure displays itself, into whichever cell is running, not into ``output``).
    """
    outputs = [{"output_type": "stream", "name": "stdout", "text": text}] if text else []
    if figure is not None:
        outputs.append({"output_type": "display_data", "data": figure._repr_mimebundle_(), "metadata": {}})
    output.outputs = tuple(outputs)


def roofline_explorer(roofline: Roofline, *, sizes: Sequence[int], dtypes: Sequence[str],
                      ops: Sequence[str] = blas.OPS) -> w.Widget:
    """Pick an operation, a size and a dtype, press Measure: the measurement lands on this device's roofline.

    Each measurement stays on the plot, so a reader can build up the picture point by point.
    """
    op = w.Dropdown(options=list(ops), value="gemm" if "gemm" in ops else ops[0], description="operation")
    size = w.SelectionSlider(options=list(sizes), value=sizes[len(sizes) // 2], description="n")
    dtype = w.Dropdown(options=[d for d in dtypes if d in roofline.peaks], description="dtype")
    button = w.Button(description="Measure", button_style="primary", icon="play")
    output = w.Output()
    points: list[dict] = []

    def measure(_button=None) -> None:
        problem = ""
        try:
            points.append(blas.measure_blas(op.value, size.value, dtype.value))
        except (ValueError, AssertionError) as error:  # too big, a dtype the device lacks, a failed check
            problem = f"Not measured: {error}\n"
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            problem = f"Not measured: {op.value} at n = {size.value} in {dtype.value} ran out of GPU memory\n"
        render(output, problem,
               plots.roofline_figure(roofline, points, dtypes=sorted({p["dtype"] for p in points}) or None))

    button.on_click(measure)
    explorer = w.VBox([w.HBox([op, size, dtype, button]), output])
    show(explorer)
    return explorer


def gpu_comparison(a: str, b: str) -> w.Widget:
    """Pick any two GPUs of :mod:`gpulab.specs`: their figures side by side, and the ratio of B to A."""
    first = w.Dropdown(options=list(specs.GPUS), value=a, description="GPU A")
    second = w.Dropdown(options=list(specs.GPUS), value=b, description="GPU B")
    output = w.Output()

    def refresh(_change=None) -> None:
        lines = [f"{'':26} {first.value:>16} {second.value:>16} {'B / A':>8}"]
        for r in specs.comparison(specs.gpu(first.value), specs.gpu(second.value)):
            values = ["n/a" if v is None else f"{v:,.4g}" for v in (r["a"], r["b"])]
            ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
            lines.append(f"{r['metric']:26} {values[0]:>16} {values[1]:>16} {ratio:>8}")
        render(output, "\n".join(lines) + "\n")

    first.observe(refresh, names="value")
    second.observe(refresh, names="value")
    refresh()
    explorer = w.VBox([w.HBox([first, second]), output])
    show(explorer)
    return explorer


def rounding_explorer(value: str = "0.1") -> w.Widget:
    """Type a number: how each format of :mod:`gpulab.precision` stores it, with its relative error and spacing."""
    from gpulab import precision

    number = w.Text(value=value, description="number", continuous_update=False)
    output = w.Output()

    def refresh(_change=None) -> None:
        try:
            rows = precision.rounding_table(number.value)
        except ValueError as error:
            render(output, f"Not a number: {error}\n")
            return
        lines = [f"{'format':>14} {'stored as':>24} {'relative error':>15} {'spacing there':>14}"]
        for r in rows:
            lines.append(f"{r['format']:>14} {r['stored']:>24.17g} {r['relative_error']:>15.3g} "
                         f"{r['spacing']:>14.3g}  {r['note']}")
        render(output, "\n".join(lines) + "\n")

    number.observe(refresh, names="value")
    refresh()
    explorer = w.VBox([number, output])
    show(explorer)
    return explorer


def launch_configuration_explorer(n: int, threads_per_block: Sequence[int],
                                  elements_per_thread: Sequence[int]) -> w.Widget:
    """Pick threads per block and elements per thread, press Measure: SAXPY's bandwidth and occupancy on this GPU.

    Each measurement is added to a table, so a reader can compare configurations side by side.
    """
    from gpulab import threads  # the kernels' module: imported only where an explorer of kernels is built

    size = w.SelectionSlider(options=list(threads_per_block), value=256, description="threads/block")
    per = w.SelectionSlider(options=list(elements_per_thread), value=1, description="elements/thread")
    button = w.Button(description="Measure", button_style="primary", icon="play")
    output = w.Output()
    lines = [f"{'threads/block':>13} {'elements/thread':>15} {'blocks':>10} {'GB/s':>8} {'occupancy':>9} limited by"]

    def measure(_button=None) -> None:
        try:
            (row,) = threads.launch_configuration(n, [size.value], [per.value])
            lines.append(f"{row['threads_per_block']:>13} {row['elements_per_thread']:>15} {row['blocks']:>10,} "
                         f"{row['gbytes_per_s']:>8,.0f} {row['occupancy']:>9.0%} {row['limited_by']}")
            render(output, "\n".join(lines) + "\n")
        except (ValueError, AssertionError) as error:  # no GPU, too big, a failed check
            render(output, "\n".join(lines) + f"\nNot measured: {error}\n")

    button.on_click(measure)
    explorer = w.VBox([w.HBox([size, per, button]), output])
    show(explorer)
    return explorer


def quantization_explorer(m: int = 1536, n: int = 1024, sms: Sequence[int] = (8, 80, 108, 132)) -> w.Widget:
    """Pick an output size, a tile and an SM count: the tiles coloured by wave, and what the model predicts.

    Pure arithmetic (:func:`gpulab.mlp.tile_waves`): it answers without a GPU.
    """
    from gpulab import gemm, mlp

    rows = w.BoundedIntText(value=m, min=1, max=65536, step=64, description="M (rows)")
    cols = w.BoundedIntText(value=n, min=1, max=65536, step=64, description="N (columns)")
    tile = w.Dropdown(options=[(mlp.tile_label(t), t) for t in ((128, 128), (256, 128), (128, 256), (64, 64))],
                      description="tile")
    count = w.Dropdown(options=list(sms), value=sms[0], description="SMs")
    output = w.Output()

    def update(_change=None) -> None:
        model = mlp.tile_waves(rows.value, cols.value, tile.value, count.value)
        text = (f"{model.tiles} tiles in {model.waves} wave(s) of {model.slots}: tile efficiency "
                f"{model.tile_efficiency:.1%}, wave efficiency {model.wave_efficiency:.1%}, "
                f"at best {model.efficiency:.1%} of the peak\n")
        figure = gemm.waves_figure(rows.value, cols.value, tile.value, count.value) if model.tiles <= 4096 else None
        render(output, text + ("" if figure else "(too many tiles to draw)\n"), figure)

    for control in (rows, cols, tile, count):
        control.observe(update, names="value")
    update()
    explorer = w.VBox([w.HBox([rows, cols]), w.HBox([tile, count]), output])
    show(explorer)
    return explorer


def matmul_format_explorer(sizes: Sequence[int], formats: Sequence[str]) -> w.Widget:
    """Pick a format and a size, press Measure: the rate and the error against float64 of an n^3 matmul in that
    format on this device (:func:`gpulab.tensor_cores.measure_format`), added to a table to compare side by side."""
    from gpulab import tensor_cores

    fmt = w.Dropdown(options=list(formats), description="format")
    size = w.SelectionSlider(options=list(sizes), value=sizes[0], description="n")
    button = w.Button(description="Measure", button_style="primary", icon="play")
    output = w.Output()
    lines = [f"{'format':>14} {'n':>6} {'TFLOP/s':>9} {'relative error':>15}"]

    def measure(_button=None) -> None:
        try:
            row = tensor_cores.measure_format(size.value, fmt.value)
            lines.append(f"{fmt.value:>14} {size.value:>6} {row['tflops']:>9.3g} {row['relative_error']:>15.2e}")
            render(output, "\n".join(lines) + "\n")
        except (ValueError, AssertionError, RuntimeError) as error:  # a format this device lacks, too big, a check
            render(output, "\n".join(lines) + f"\nNot measured: {error}\n")

    button.on_click(measure)
    explorer = w.VBox([w.HBox([fmt, size, button]), output])
    show(explorer)
    return explorer
