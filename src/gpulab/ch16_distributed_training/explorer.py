"""Chapter 16's explorer: the all-reduce's time by algorithm, workers and message size."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch16_distributed_training import distributed, figures
from gpulab.core import plots
from gpulab.core.printing import format_bytes
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, nearest, render


def allreduce_explorer(workers: int = 8, nbytes: int = 2**26, latency_us: float = 5.0,
                       bandwidth_gbs: float = 100.0) -> w.Widget:
    """Pick the workers, a message size, and a link's latency and bandwidth: the time of a ring, a tree and a naive
    all-reduce by the latency-bandwidth model (:func:`gpulab.ch16_distributed_training.distributed.model_seconds`),
    the bytes the busiest worker sends (counted by
    :func:`gpulab.ch16_distributed_training.distributed.allreduce_traffic`), algbw and busbw, and the model's time
    against the message size with the chosen size marked. Pure arithmetic: it answers without a GPU."""

    sizes = [2**k for k in range(3, 33)]
    p = w.IntSlider(value=workers, min=2, max=64, description="workers p", style=WIDE)
    size = w.SelectionSlider(options=[(format_bytes(s), s) for s in sizes], value=nearest(sizes, nbytes),
                             description="message", style=WIDE)
    latency = w.FloatLogSlider(value=latency_us, base=10, min=-1, max=3, step=0.1, description="latency (µs)",
                               style=WIDE)
    bandwidth = w.FloatLogSlider(value=bandwidth_gbs, base=10, min=0, max=3, step=0.1,
                                 description="link bandwidth (GB/s)", style=WIDE)
    output = w.Output()

    def update(_change=None) -> None:
        alpha, beta = latency.value * 1e-6, bandwidth.value * 1e9
        busiest = {r["algorithm"]: r for r in distributed.allreduce_traffic([p.value], p.value)}  # one element a chunk
        rows = []
        for name in distributed.ALGORITHMS:
            t = distributed.model_seconds(name, p.value, size.value, alpha, beta)
            rows.append({"algorithm": name, "rounds": busiest[name]["rounds"], "seconds": t,
                         "sent": round(busiest[name]["sent_over_size"] * size.value),
                         "algbw": distributed.algorithm_bandwidth(size.value, t) / 1e9,
                         "busbw": distributed.bus_bandwidth(size.value, t, p.value) / 1e9})
        fastest = min(rows, key=lambda r: r["seconds"])["algorithm"]
        text = (f"{format_bytes(size.value)} on {p.value} workers, alpha = {latency.value:.3g} µs, "
                f"{bandwidth.value:.3g} GB/s per link direction: fastest here, {fastest}.")
        shown = table(rows, [Column("algorithm"), Column("rounds"),
                             Column("seconds", "modelled time", "µs", format=lambda t: f"{1e6 * t:,.1f}"),
                             Column("sent", "the busiest worker sends", format=lambda b: format_bytes(int(b))),
                             Column("algbw", "algbw", "GB/s", ".3g"), Column("busbw", "busbw", "GB/s", ".3g")])
        figure = figures.model_time_figure(p.value, sizes, alpha, beta,
                                           title=f"Modelled all-reduce time on {p.value} workers")
        plots.vertical_marker(figure, size.value, format_bytes(size.value))
        render(output, text, figure, shown)

    return assemble([[p, size], [latency, bandwidth]], output, update)
