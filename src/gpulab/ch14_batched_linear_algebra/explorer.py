"""Chapter 14's explorer: a batch of small GEMMs, measured against the recording."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch14_batched_linear_algebra import batched
from gpulab.core import plots, recordings
from gpulab.core.sweep import ok_rows
from gpulab.core.widgets import WIDE, assemble, nearest, render


def batched_gemm_explorer(n: int = 64, batch: int = 1000) -> w.Widget:
    """Pick a matrix order, a batch count and a format: the H200's recorded times (``batched_gemm``) of the loop,
    ``torch.bmm`` and one tall GEMM at the nearest recorded point, and the launch-overhead model of the loop,
    batch x the cost of one launch (the loop's time per product at the smallest recorded order, where the
    arithmetic is negligible), against the recording. Pure arithmetic on a recording: it answers without a GPU."""

    recording = recordings.load("batched_gemm")
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
        near_n = nearest(sorted({r["n"] for r in chosen}), order.value)
        near_b = nearest(sorted({r["batch"] for r in chosen}), count.value)
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

    return assemble([[order, count, dtype]], output, update)
