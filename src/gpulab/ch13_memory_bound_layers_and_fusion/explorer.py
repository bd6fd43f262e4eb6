"""Chapter 13's explorer: the bytes a chain of layers moves, eager and fused."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch13_memory_bound_layers_and_fusion import fusion
from gpulab.core import plots, recordings, specs
from gpulab.core.printing import format_bytes
from gpulab.core.widgets import WIDE, assemble, nearest, render


def fusion_explorer(elements: int = 2**26) -> w.Widget:
    """Pick a chain of :data:`gpulab.ch13_memory_bound_layers_and_fusion.fusion.CHAINS`, a tensor size and a format:
    the bytes the chain moves eagerly and fused
    (:func:`gpulab.ch13_memory_bound_layers_and_fusion.fusion.chain_cost`), its intensity, and the time each takes at
    the device copy's bandwidth in the H200's recording ``fusion_compile``, beside the times that recording measured.
    Pure arithmetic on a recording: it answers without a GPU."""

    recording = recordings.load("fusion_compile")
    copy = next((r for r in recording.rows if r["chain"] == "copy"), None) if recording else None
    bandwidth = 1e9 * (copy["gbytes_per_s"] if copy else specs.gpu("H200 SXM 141GB").bandwidth_gb_s)
    source = (f"the device copy measured with the chains ({recording.label}, fusion_compile)" if copy
              else "the H200's datasheet bandwidth (no recording of fusion_compile here)")
    sizes = [2**k for k in range(10, 31)]
    chain = w.Dropdown(options=[(c.label, name) for name, c in fusion.CHAINS.items()], description="chain")
    size = w.SelectionSlider(options=[(f"2^{n.bit_length() - 1} = {n:,}", n) for n in sizes],
                             value=nearest(sizes, elements), description="elements per tensor", style=WIDE)
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

    return assemble([[chain, dtype], [size]], output, update)
