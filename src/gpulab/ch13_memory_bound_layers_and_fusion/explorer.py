"""Chapter 13's explorer: the bytes a chain of layers moves, eager and fused, turned into time on a recorded GPU."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch13_memory_bound_layers_and_fusion import fusion
from gpulab.core import plots, recordings, specs
from gpulab.core.printing import format_bytes
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, nearest, render

DATASHEET_GPU = "H200 SXM 141GB"  # the bandwidth the explorer uses where no GPU has recorded fusion_compile
SIZES = [2**k for k in range(10, 31)]


def size_label(n: int) -> str:
    """'2^26 = 67,108,864': a size as the explorer's slider shows it."""
    return f"2^{n.bit_length() - 1} = {n:,}"


def microseconds(seconds: float) -> str:
    """'406.8', '3.41', '0.00970': a time in µs with at least three significant digits."""
    us = 1e6 * seconds
    return f"{us:,.1f}" if us >= 10 else f"{us:.3g}"


def fusion_explorer(elements: int = 2**26, gpu: str | None = None) -> w.Widget:
    """Pick a chain of :data:`gpulab.ch13_memory_bound_layers_and_fusion.fusion.CHAINS`, a tensor size, a format and
    a recorded GPU: the bytes the chain moves eagerly and fused
    (:func:`gpulab.ch13_memory_bound_layers_and_fusion.fusion.chain_cost`), its intensity, and the time each takes at
    the bandwidth of the device copy that GPU's recording ``fusion_compile`` measured with the chains, beside the
    times that recording measured. Without a recording it uses the H200's datasheet bandwidth. Pure arithmetic on
    recordings: it answers without a GPU."""

    copies = {}  # device name -> (its recording, the copy row measured with the chains)
    for run in recordings.newest_per_gpu("fusion_compile"):
        copy = next((r for r in run.rows if r["chain"] == "copy" and r.get("gbytes_per_s")), None)
        if copy is not None:
            copies[run.device_name] = (run, copy)
    gpus = [(run.short_label, name) for name, (run, _) in copies.items()] or [(f"{DATASHEET_GPU} (datasheet)", "")]
    chain = w.Dropdown(options=[(c.label, name) for name, c in fusion.CHAINS.items()], description="chain")
    size = w.SelectionSlider(options=[(size_label(n), n) for n in SIZES], value=nearest(SIZES, elements),
                             description="elements per tensor", style=WIDE)
    dtype = w.Dropdown(options=["float32", "bfloat16"], description="format")
    device = w.Dropdown(options=gpus, value=next((v for _, v in gpus if gpu and gpu.lower() in v.lower()), gpus[0][1]),
                        description="GPU")
    output = w.Output()

    def update(_change=None) -> None:
        spec = fusion.CHAINS[chain.value]
        run, copy = copies.get(device.value, (None, None))
        bandwidth = 1e9 * (copy["gbytes_per_s"] if copy else specs.gpu(DATASHEET_GPU).bandwidth_gb_s)
        source = (f"the device copy measured with the chains ({run.label})" if run
                  else f"the {DATASHEET_GPU}'s datasheet bandwidth (no recording of fusion_compile here)")

        def cost(n: int, fused: bool, dtype: str = dtype.value):
            return fusion.chain_cost(chain.value, n, dtype, fused)

        rows = [{"case": f"{mode}, model", "bytes": cost(size.value, fused).bytes,
                 "intensity": cost(size.value, fused).intensity, "model": cost(size.value, fused).bytes / bandwidth}
                for mode, fused in ((f"eager, {len(spec.kernels)} kernels", False), ("fused, 1 kernel", True))]
        measured = [r for r in (run.rows if run else []) if r["chain"] == chain.value and r.get("seconds")]
        for r in measured:  # compile_comparison runs float32
            modelled = cost(r["n"], r["mode"] != "eager", "float32")
            kernels = f", {r['kernels']:g} kernel{'s' if r['kernels'] != 1 else ''}" if r.get("kernels") else ""
            rows.append({"case": f"recorded, {r['mode']}{kernels}, {r['rows']:,} x {r['cols']:,} float32",
                         "bytes": modelled.bytes, "intensity": modelled.intensity,
                         "model": modelled.bytes / bandwidth, "recorded": r["seconds"]})
        text = [f"{spec.label} on {size.value:,} {dtype.value} elements per tensor: time = bytes / "
                f"{bandwidth / 1e9:,.0f} GB/s, {source}."]
        if not measured:
            text.append("The recording has no measured times of this chain.")
        elif dtype.value != "float32":
            text.append("The recorded times are float32's: they stay in the table, off the figure.")
        us = {"unit": "µs", "format": microseconds}
        shown = table(rows, [Column("case"), Column("bytes", "bytes moved", format=lambda b: format_bytes(int(b))),
                             Column("intensity", "intensity", "FLOP/byte", ".2f"),
                             Column("model", "time at the copy's bandwidth", **us),
                             Column("recorded", "time recorded", **us)])
        curves = [{"mode": f"{mode}, model", "elements": n, "seconds": cost(n, fused).bytes / bandwidth}
                  for mode, fused in (("eager", False), ("fused", True)) for n in SIZES]
        curves = [{**c, "us": 1e6 * c["seconds"]} for c in curves]
        figure = plots.sweep_figure(curves, "elements", "us", color="mode", log_x=True, log_y=True,
                                    title=f"{spec.label}, {dtype.value}: time at {bandwidth / 1e9:,.0f} GB/s",
                                    x_title="elements per tensor", y_title="time (µs)", hover=("elements", "seconds"))
        if dtype.value == "float32":
            for r in measured:
                figure.add_scatter(x=[r["n"]], y=[1e6 * r["seconds"]], mode="markers", name=f"{r['mode']}, measured",
                                   marker=dict(size=12, symbol="diamond",  # in its model's colour
                                               color=plots.PALETTE[int(r["mode"] != "eager")]))
        plots.vertical_marker(figure, size.value, "chosen size")
        render(output, "\n".join(text), figure, shown)

    return assemble([[chain, dtype, device], [size]], output, update)
