"""ipywidgets explorers that measure live or explore a model, built on the same functions the chapters call.

A live control needs a running kernel. JupyterLab and Colab show the widget itself. The static book
has no kernel: it draws each explorer's saved view (the state the build left, with the book's own copy
of the Jupyter widgets HTML manager) and a note under it that its controls need a running kernel
(book/_ext/widget_views.py); a viewer that draws no widgets shows :func:`show`'s ``text/html`` line
instead. The static page gets its exploration from recorded data (see
:func:`gpulab.plots.roofline_explorer_figure`).

Explorers write their results into an ``Output`` widget by setting its state (:func:`render`), never
with ``with output:``. The notebook executor behind papermill and the book build (nbclient) imitates a
capturing ``Output`` by writing to the kernel's shell socket while it waits on that socket for the
cell's reply; now and then it misses the reply and waits forever (jupyter/nbclient#312).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import ipywidgets as w
import plotly.graph_objects as go
import torch
from IPython.display import display

from gpulab import blas, plots, specs
from gpulab.printing import format_bytes
from gpulab.roofline import Roofline

NEEDS_KERNEL = (
    "This explorer needs a running kernel to answer its controls: launch this notebook (the Colab button at "
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


def _live(rows: Sequence[Sequence[w.Widget]], output: w.Output, update: Callable[..., None]) -> w.Widget:
    """An explorer: ``rows`` of controls above ``output``; any control's change calls ``update``, which runs once
    now to fill ``output``. The explorer is displayed (:func:`show`) and returned."""
    for row in rows:
        for control in row:
            control.observe(update, names="value")
    update()
    explorer = w.VBox([w.HBox(list(row)) for row in rows] + [output])
    show(explorer)
    return explorer


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

    return _live([[rows, cols], [tile, count]], output, update)


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


# ---------------------------------------------------------------------------------------------
# Explorers of models and recordings: pure arithmetic, the same on a CPU, in CI and on a GPU

WIDE = {"description_width": "initial"}  # a control's whole description, not the first dozen letters


def _nearest(values: Sequence[float], target: float) -> float:
    """The one of ``values`` (all > 0) nearest to ``target`` on a logarithmic scale."""
    return min(values, key=lambda v: abs(math.log(v / target)))


def convolution_algorithms_explorer(batch: int = 1, channels: int = 128, size: int = 128,
                                    filter_size: int = 3) -> w.Widget:
    """Pick a filter size, a batch, C = K and an image size ("same" padding, stride 1): each algorithm family's
    multiplies per output element (:func:`gpulab.cudnn.multiplies`) as bars, the family with the fewest, and the
    float32 workspace each needs (:func:`gpulab.cudnn.workspace_bytes`). Pure arithmetic: it answers without a GPU.
    """
    from gpulab import cudnn

    # each counted family: its implementation's name (for cudnn.applies) and its workspace models
    families = {"direct or GEMM": ("im2col + GEMM", ("GEMM", "implicit GEMM")),
                "Winograd F(2x2)": ("Winograd F(2x2, 3x3)", ("Winograd nonfused", "Winograd fused")),
                "FFT": ("FFT", ("FFT",)), "FFT tiled": ("FFT tiled", ("FFT tiled",))}
    r = w.IntSlider(value=filter_size, min=1, max=15, step=2, description="filter R = S", style=WIDE)
    n = w.BoundedIntText(value=batch, min=1, max=4096, description="batch N", style=WIDE)
    c = w.BoundedIntText(value=channels, min=1, max=4096, description="channels C = K", style=WIDE)
    hw = w.BoundedIntText(value=size, min=1, max=2048, description="image H = W", style=WIDE)
    output = w.Output()

    def update(_change=None) -> None:
        layer = cudnn.same_padding_layer(n.value, c.value, hw.value, c.value, r.value)
        outputs = layer.n * layer.k * layer.p * layer.q
        rows = [{"family": family, "multiplies": (count := cudnn.multiplies(layer, family)),
                 "per_output": count / outputs,
                 "workspace": ", ".join(f"{m} {format_bytes(cudnn.workspace_bytes(layer, m))}" for m in models)}
                for family, (implementation, models) in families.items() if cudnn.applies(implementation, layer)]
        lines = [f"N = {n.value}, C = K = {c.value}, {hw.value} x {hw.value} images, {r.value} x {r.value} filters: "
                 f"{outputs:,} outputs", f"{'family':16} {'multiplies':>11} {'per output':>11}   workspace (float32)"]
        lines += [f"{row['family']:16} {row['multiplies']:>11.3g} {row['per_output']:>11,.0f}   {row['workspace']}"
                  for row in rows]
        best = min(rows, key=lambda row: row["multiplies"])  # rows[0] is the direct method, which always applies
        fewer = "" if best is rows[0] else f", {rows[0]['multiplies'] / best['multiplies']:.2f}x fewer than direct"
        lines.append(f"Fewest multiplies: {best['family']}{fewer}; its workspace: {best['workspace']}. "
                     "Multiplies are not time.")
        if r.value != 3:
            lines.append("Winograd F(2x2, 3x3) is drawn for 3 x 3 filters only, as cuDNN uses it.")
        figure = plots.bars_figure(rows, "family", {"multiplies per output": "per_output"}, log_y=True,
                                   title=f"Multiplies per output element, {r.value} x {r.value} filters",
                                   y_title="real multiplies per output element (log)", x_title="algorithm family")
        render(output, "\n".join(lines) + "\n", figure)

    return _live([[r, n], [c, hw]], output, update)


def fusion_explorer(elements: int = 2**26) -> w.Widget:
    """Pick a chain of :data:`gpulab.fusion.CHAINS`, a tensor size and a format: the bytes the chain moves eagerly
    and fused (:func:`gpulab.fusion.chain_cost`), its intensity, and the time each takes at the device copy's
    bandwidth in the H200's recording ``fusion_compile``, beside the times that recording measured.
    Pure arithmetic on a recording: it answers without a GPU."""
    from gpulab import fusion, results

    recording = results.load("fusion_compile")
    copy = next((r for r in recording.rows if r["chain"] == "copy"), None) if recording else None
    bandwidth = 1e9 * (copy["gbytes_per_s"] if copy else specs.gpu("H200 SXM 141GB").bandwidth_gb_s)
    source = (f"the device copy measured with the chains ({recording.label}, fusion_compile)" if copy
              else "the H200's datasheet bandwidth (no recording of fusion_compile here)")
    sizes = [2**k for k in range(10, 31)]
    chain = w.Dropdown(options=[(c.label, name) for name, c in fusion.CHAINS.items()], description="chain")
    size = w.SelectionSlider(options=[(f"2^{n.bit_length() - 1} = {n:,}", n) for n in sizes],
                             value=_nearest(sizes, elements), description="elements per tensor", style=WIDE)
    dtype = w.Dropdown(options=["float32", "bfloat16"], description="format")
    output = w.Output()

    def update(_change=None) -> None:
        spec = fusion.CHAINS[chain.value]

        def seconds(n: int, fused: bool, dtype: str = dtype.value) -> float:
            return fusion.chain_cost(chain.value, n, dtype, fused).bytes / bandwidth

        lines = [f"{spec.label} on {size.value:,} {dtype.value} elements; time = bytes / {bandwidth / 1e9:,.0f} GB/s, "
                 f"{source}:"]
        for mode, fused in ((f"eager, {len(spec.kernels)} kernels", False), ("fused, 1 kernel", True)):
            cost = fusion.chain_cost(chain.value, size.value, dtype.value, fused)
            lines.append(f"  {mode:18} {format_bytes(cost.bytes):>10} moved, {cost.intensity:.2f} FLOP/byte, "
                         f"{1e6 * seconds(size.value, fused):,.1f} us")
        curves = [{"mode": f"{mode}, model", "elements": n, "us": 1e6 * seconds(n, fused)}
                  for mode, fused in (("eager", False), ("fused", True)) for n in sizes]
        figure = plots.sweep_figure(curves, "elements", "us", color="mode", log_x=True, log_y=True,
                                    title=f"{spec.label}, {dtype.value}: time at {bandwidth / 1e9:,.0f} GB/s",
                                    x_title="elements per tensor", y_title="time (µs)")
        measured = [r for r in (recording.rows if recording else []) if r["chain"] == chain.value and r.get("seconds")]
        for r in measured:  # compile_comparison runs float32
            model = 1e6 * seconds(r["n"], r["mode"] != "eager", "float32")
            kernels = f", {r['kernels']:g} kernels" if r.get("kernels") else ""
            lines.append(f"  recorded, {r['mode']}{kernels}, at {r['rows']:,} x {r['cols']:,} float32: "
                         f"{1e6 * r['seconds']:,.1f} us (the model: {model:,.1f} us)")
            if dtype.value == "float32":
                figure.add_scatter(x=[r["n"]], y=[1e6 * r["seconds"]], mode="markers", name=f"{r['mode']}, measured",
                                   marker=dict(size=12, symbol="diamond",  # in its model's colour
                                               color=plots.PALETTE[int(r["mode"] != "eager")]))
        if not measured:
            lines.append("  (no measured times of this chain in the recording)")
        plots.vertical_marker(figure, size.value, "chosen size")
        render(output, "\n".join(lines) + "\n", figure)

    return _live([[chain, dtype], [size]], output, update)


def batched_gemm_explorer(n: int = 64, batch: int = 1000) -> w.Widget:
    """Pick a matrix order, a batch count and a format: the H200's recorded times (``batched_gemm``) of the loop,
    ``torch.bmm`` and one tall GEMM at the nearest recorded point, and the launch-overhead model of the loop,
    batch x the cost of one launch (the loop's time per product at the smallest recorded order, where the
    arithmetic is negligible), against the recording. Pure arithmetic on a recording: it answers without a GPU."""
    from gpulab import batched, results
    from gpulab.sweep import ok_rows

    recording = results.load("batched_gemm")
    rows = ok_rows(recording.rows) if recording else []
    order = w.BoundedIntText(value=n, min=1, max=65536, description="order n", style=WIDE)
    count = w.BoundedIntText(value=batch, min=1, max=10**6, description="batch", style=WIDE)
    dtype = w.Dropdown(options=list(dict.fromkeys(r["dtype"] for r in rows)) or ["float32"], description="format")
    output = w.Output()

    def update(_change=None) -> None:
        chosen = [r for r in rows if r["dtype"] == dtype.value]
        if not chosen:
            render(output, f"No recording of batched_gemm in {dtype.value} here: nothing to show.\n")
            return
        near_n = _nearest(sorted({r["n"] for r in chosen}), order.value)
        near_b = _nearest(sorted({r["batch"] for r in chosen}), count.value)
        at = {(r["method"], r["n"]): r for r in chosen if r["batch"] == near_b}
        smallest = min(n for method, n in at if method == "loop")
        launch = at["loop", smallest]["seconds"] / near_b  # seconds per product where the arithmetic is negligible
        lines = [f"{recording.label}, {dtype.value}: the nearest recorded point to n = {order.value}, batch of "
                 f"{count.value} is n = {near_n}, batch of {near_b}"]
        for method in batched.METHODS:
            r = at.get((method, near_n))
            if r:
                lines.append(f"  {batched.METHOD_LABELS[method]:32} {1e3 * r['seconds']:9.3f} ms {r['gflops']:10,.1f} "
                             f"GFLOP/s  {at['loop', near_n]['seconds'] / r['seconds']:8.1f}x the loop's speed")
        loop = at["loop", near_n]["seconds"]
        lines += [f"Launch-overhead model: loop = batch x {1e6 * launch:.2f} us (the loop's time per product at "
                  f"n = {smallest}): {1e3 * near_b * launch:.3f} ms at this point, recorded {1e3 * loop:.3f} ms "
                  f"(model / recorded = {near_b * launch / loop:.2f}); for a batch of {count.value}: about "
                  f"{1e3 * count.value * launch:,.3f} ms whatever n"]
        curves = [{**r, "way": batched.METHOD_LABELS[r["method"]], "ms": 1e3 * r["seconds"]} for r in at.values()]
        figure = plots.sweep_figure(curves, "n", "ms", color="way", log_x=True, log_y=True, hover=("n", "ms", "gflops"),
                                    title=f"{near_b} products of order n, {dtype.value}: {recording.label}",
                                    x_title="matrix order n", y_title="time per call of the whole batch (ms)")
        model = [{"n": n, "ms": 1e3 * near_b * launch} for n in sorted({n for _, n in at})]
        plots.add_sweep(figure, model, "n", "ms", name="model: batch x one launch", dash="dash")
        plots.vertical_marker(figure, near_n, f"n = {near_n}")
        render(output, "\n".join(lines) + "\n", figure)

    return _live([[order, count, dtype]], output, update)


def sparsity_explorer(n: int = 4096, value_bits: int = 16) -> w.Widget:
    """Pick the bits per value, an N:M pattern and an n x n matrix: its dense and compressed bytes, values and
    metadata (:func:`gpulab.sparsity.compressed_size`), and for 16-bit 2:4 the best and worst speed-up of the
    H200's recording ``sparsity_linear_speedup`` at the nearest recorded weight size. Pure arithmetic on a
    recording: it answers without a GPU."""
    from gpulab import results, sparsity

    hardware = {8: "2:4", 16: "2:4", 32: "1:2"}  # the pattern the sparse tensor cores take for each width
    recording = results.load("sparsity_linear_speedup")
    speedups = [r for r in (recording.rows if recording else []) if r["status"] == "ok" and "speedup" in r]
    bits = w.Dropdown(options=[("8 (int8, float8)", 8), ("16 (float16, bfloat16)", 16), ("32 (float32, tf32)", 32)],
                      value=value_bits, description="bits per value", style=WIDE)
    pattern = w.Dropdown(options=["2:4", "1:2", "4:8", "2:8", "1:4"], description="N:M", style=WIDE)
    order = w.BoundedIntText(value=n, min=8, max=65536, step=64, description="matrix n x n, n =", style=WIDE)
    output = w.Output()

    def update(_change=None) -> None:
        kept, group = map(int, pattern.value.split(":"))
        if order.value % group:
            render(output, f"n = {order.value}: the columns (the reduction dimension) split into groups of {group}: "
                   f"pick a multiple of {group}.\n")
            return
        size = sparsity.compressed_size(bits.value, kept, group)
        groups = order.value**2 // group
        dense, values, metadata = (math.ceil(groups * b / 8) for b in
                                   (size.dense_bits, size.value_bits_per_group, size.metadata_bits))
        lines = [f"{order.value:,} x {order.value:,}, {bits.value}-bit values, {pattern.value}: dense "
                 f"{format_bytes(dense)}; compressed {format_bytes(values)} of values + {format_bytes(metadata)} of "
                 f"metadata ({size.index_bits} bits per kept value) = {size.fraction_of_dense:.2%} of dense",
                 f"the metadata: {size.metadata_overhead:.1%} on top of the values, "
                 f"{metadata / (values + metadata):.1%} of the compressed bytes",
                 f"the sparse tensor cores take {bits.value}-bit data as {hardware[bits.value]}"
                 + ("" if pattern.value == hardware[bits.value] else f": {pattern.value} is storage arithmetic only")]
        if bits.value == 16 and pattern.value == "2:4" and speedups:
            near = _nearest(sorted({r["n"] for r in speedups}), order.value)
            at = [r for r in speedups if r["n"] == near]
            best, worst = max(at, key=lambda r: r["speedup"]), min(at, key=lambda r: r["speedup"])
            lines.append(f"recorded ({recording.label}), F.linear with a {near:,} x {near:,} weight: best speed-up "
                         f"{best['speedup']:.2f}x ({best['dtype']}, {best['tokens']:,} tokens, {best['backend']}), "
                         f"worst {worst['speedup']:.2f}x ({worst['dtype']}, {worst['tokens']:,} tokens)")
        else:
            lines.append("recorded speed-ups: only 16-bit 2:4 products were recorded" if recording
                         else "recorded speed-ups: no recording of sparsity_linear_speedup here")
        figure = go.Figure([go.Bar(x=["dense", pattern.value], y=[dense / 2**20, values / 2**20], name="values"),
                            go.Bar(x=["dense", pattern.value], y=[0, metadata / 2**20], name="metadata")])
        figure.update_layout(barmode="stack", title=f"Bytes of a {order.value:,} x {order.value:,} matrix, "
                             f"{bits.value}-bit values", xaxis_title="storage", yaxis_title="MiB")
        render(output, "\n".join(lines) + "\n", figure)

    return _live([[bits, pattern, order]], output, update)


def allreduce_explorer(workers: int = 8, nbytes: int = 2**26, latency_us: float = 5.0,
                       bandwidth_gbs: float = 100.0) -> w.Widget:
    """Pick the workers, a message size, and a link's latency and bandwidth: the time of a ring, a tree and a naive
    all-reduce by the latency-bandwidth model (:func:`gpulab.distributed.model_seconds`), the bytes the busiest
    worker sends (counted by :func:`gpulab.distributed.allreduce_traffic`), algbw and busbw, and the model's
    time against the message size with the chosen size marked. Pure arithmetic: it answers without a GPU."""
    from gpulab import distributed

    sizes = [2**k for k in range(3, 33)]
    p = w.IntSlider(value=workers, min=2, max=64, description="workers p", style=WIDE)
    size = w.SelectionSlider(options=[(format_bytes(s), s) for s in sizes], value=_nearest(sizes, nbytes),
                             description="message", style=WIDE)
    latency = w.FloatLogSlider(value=latency_us, base=10, min=-1, max=3, step=0.1, description="latency (µs)",
                               style=WIDE)
    bandwidth = w.FloatLogSlider(value=bandwidth_gbs, base=10, min=0, max=3, step=0.1,
                                 description="link bandwidth (GB/s)", style=WIDE)
    output = w.Output()

    def update(_change=None) -> None:
        alpha, beta = latency.value * 1e-6, bandwidth.value * 1e9
        busiest = {r["algorithm"]: r for r in distributed.allreduce_traffic([p.value], p.value)}  # one element a chunk
        lines = [f"{format_bytes(size.value)} on {p.value} workers, alpha = {latency.value:.3g} us, "
                 f"{bandwidth.value:.3g} GB/s per link direction:",
                 f"{'':6} {'rounds':>6} {'time':>13} {'busiest sends':>14} {'algbw':>11} {'busbw':>11}"]
        times = {}
        for name in distributed.ALGORITHMS:
            t = times[name] = distributed.model_seconds(name, p.value, size.value, alpha, beta)
            lines.append(f"{name:6} {busiest[name]['rounds']:6} {1e6 * t:>10,.1f} us "
                         f"{format_bytes(round(busiest[name]['sent_over_size'] * size.value)):>14} "
                         f"{distributed.algorithm_bandwidth(size.value, t) / 1e9:>6.3g} GB/s "
                         f"{distributed.bus_bandwidth(size.value, t, p.value) / 1e9:>6.3g} GB/s")
        lines.append(f"fastest here: {min(times, key=times.get)}")
        figure = distributed.model_time_figure(p.value, sizes, alpha, beta,
                                               title=f"Modelled all-reduce time on {p.value} workers")
        plots.vertical_marker(figure, size.value, format_bytes(size.value))
        render(output, "\n".join(lines) + "\n", figure)

    return _live([[p, size], [latency, bandwidth]], output, update)
