"""Chapter 14's explorer: a batch of small GEMMs, read from each GPU's recording, against a model of the loop."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch14_batched_linear_algebra import batched
from gpulab.core import plots, recordings
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, nearest, render


def batched_gemm_explorer(n: int = 64, batch: int = 1000, gpu: str | None = None) -> w.Widget:
    """Pick a matrix order, a batch count, a format and a recorded GPU: that GPU's recorded times (``batched_gemm``)
    of the loop, ``torch.bmm`` and one tall GEMM at the nearest recorded point, and the launch-overhead model of the
    loop, batch x the cost of one launch (the loop's time per product at the smallest recorded order, where the
    arithmetic is negligible), against the recording. Pure arithmetic on recordings: it answers without a GPU."""

    runs = {run.device_name: run for run in recordings.newest_per_gpu("batched_gemm") if ok_rows(run.rows)}
    gpus = [(run.short_label, name) for name, run in runs.items()] or [("no recording", "")]
    order = w.BoundedIntText(value=n, min=1, max=65536, description="order n", style=WIDE)
    count = w.BoundedIntText(value=batch, min=1, max=10**6, description="batch", style=WIDE)
    formats = list(dict.fromkeys(r["dtype"] for run in runs.values() for r in ok_rows(run.rows))) or ["float32"]
    dtype = w.Dropdown(options=formats, description="format")
    device = w.Dropdown(options=gpus, value=next((v for _, v in gpus if gpu and gpu.lower() in v.lower()), gpus[0][1]),
                        description="GPU")
    output = w.Output()

    def update(_change=None) -> None:
        run = runs.get(device.value)
        chosen = [r for r in ok_rows(run.rows) if r["dtype"] == dtype.value] if run else []
        if not chosen:
            render(output, f"No recording of batched_gemm in {dtype.value} here for order {order.value} and a batch "
                           f"of {count.value}: nothing to show.")
            return
        near_n = nearest(sorted({r["n"] for r in chosen}), order.value)
        near_b = nearest(sorted({r["batch"] for r in chosen}), count.value)
        at = {(r["method"], r["n"]): r for r in chosen if r["batch"] == near_b}
        smallest = min(m for method, m in at if method == "loop")
        launch = at["loop", smallest]["seconds"] / near_b  # seconds per product where the arithmetic is negligible
        loop = at["loop", near_n]["seconds"]
        rows = [{"way": batched.METHOD_LABELS[method], "seconds": r["seconds"], "gflops": r["gflops"],
                 "speedup": loop / r["seconds"]} for method in batched.METHODS if (r := at.get((method, near_n)))]
        rows.append({"way": f"model: batch x {1e6 * launch:.2f} µs (the loop per product at n = {smallest})",
                     "seconds": near_b * launch})
        text = (f"{run.label}, {dtype.value}: the nearest recorded point to n = {order.value}, batch of "
                f"{count.value:,} is n = {near_n}, batch of {near_b:,}. The launch-overhead model, loop = batch x "
                f"one launch, gives "
                f"{near_b * launch / loop:.2f} times the recorded loop there; for a batch of {count.value:,} it "
                f"predicts about {1e3 * count.value * launch:,.3f} ms, whatever n.")
        shown = table(rows, [Column("way"),
                             Column("seconds", "time per call", "ms", format=lambda s: f"{1e3 * s:,.3f}"),
                             Column("gflops", "rate", "GFLOP/s", ",.1f"),
                             Column("speedup", "over the loop", format=lambda x: f"{x:,.1f}x")])
        curves = [{**r, "way": batched.METHOD_LABELS[r["method"]], "ms": 1e3 * r["seconds"]} for r in at.values()]
        figure = plots.sweep_figure(curves, "n", "ms", color="way", log_x=True, log_y=True,
                                    hover=("n", "seconds", "gflops"),
                                    title=f"{near_b:,} products of order n, {dtype.value}: {run.label}",
                                    x_title="matrix order n", y_title="time per call of the whole batch (ms)")
        model = [{"n": m, "ms": 1e3 * near_b * launch} for m in sorted({m for _, m in at})]
        plots.add_sweep(figure, model, "n", "ms", name="model: batch x one launch", dash="dash")
        plots.vertical_marker(figure, near_n, f"n = {near_n}")
        render(output, text, figure, shown)

    return assemble([[order, count], [dtype, device]], output, update)
