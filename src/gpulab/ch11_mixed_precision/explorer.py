"""Chapter 11's explorer: a loss scale and a narrow format against the recorded gradients of the digits MLP."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch11_mixed_precision import figures
from gpulab.core import plots, recordings
from gpulab.core.precision import FORMATS
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, render

NARROW = ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn")  # the formats a gradient might be stored in
LOG2_SCALES = (-8, 48)  # the loss scales the slider offers, as powers of two


def best_scale(rows: list[dict], fmt: str, scales: range = range(*LOG2_SCALES)) -> tuple[int, float] | None:
    """Of one kind's histogram rows: the largest power-of-two loss scale (log2) at which no bin overflows ``fmt``,
    and the share that still rounds to 0 there; None if every scale of ``scales`` overflows something."""
    fitting = [s for s in scales if figures.shares(rows, FORMATS[fmt], s)["overflow"] == 0]
    if not fitting:
        return None
    return max(fitting), figures.shares(rows, FORMATS[fmt], max(fitting))["zero"]


def loss_scale_explorer(log2_scale: int = 0, fmt: str = "float16") -> w.Widget:
    """Pick a loss scale (a power of two) and a 16- or 8-bit format: which share of each recorded GPU's gradient
    histogram of the trained digits MLP (the experiment ``amp_gradient_histogram``) would round to zero, be
    subnormal, be normal, or overflow, once multiplied by the scale and stored in that format, against the format's
    smallest subnormal and normal and its largest number (:data:`gpulab.core.precision.FORMATS`). The recordings
    and arithmetic: it answers without a GPU."""
    scale = w.IntSlider(value=log2_scale, min=LOG2_SCALES[0], max=LOG2_SCALES[1] - 1,
                        description="loss scale: log2 S", style=WIDE)
    format_menu = w.Dropdown(options=list(NARROW), value=fmt, description="stored in", style=WIDE)
    output = w.Output()
    runs = recordings.newest_per_gpu("amp_gradient_histogram")

    def update(_change=None) -> None:
        chosen = FORMATS[format_menu.value]
        e = figures.edges(chosen)
        lines = [f"{format_menu.value} at a loss scale S = 2^{scale.value}: a gradient g is stored as g x S, so it "
                 f"rounds to 0 below 2^{e['zero'] - scale.value:g} (half the smallest subnormal, "
                 f"{chosen.smallest_subnormal:.3g}, over S), is subnormal below 2^{e['normal'] - scale.value:g} "
                 f"and overflows from 2^{e['overflow'] - scale.value:g} on ({chosen.largest:g} over S)."]
        if not runs:
            lines.append("No GPU has recorded the gradient histogram yet (make gpu-run records it).")
            render(output, "\n".join(lines))
            return
        rows = [row for run in runs for row in figures.histogram_rows(run, chosen, scale.value)]
        for run in runs:
            for kind in dict.fromkeys(r["gradients"] for r in run.rows):
                best = best_scale([r for r in run.rows if r["gradients"] == kind], format_menu.value)
                lines.append(f"{run.short_label}, {kind} gradients: " + (
                    f"the largest scale that overflows none is 2^{best[0]}, where {best[1]:.2%} still round to 0."
                    if best else "every scale offered overflows some of them."))
        lines.append("The bins are whole powers of two: a bin that straddles a bound counts on the side of its "
                     "lower end.")
        made = iter(runs)
        figure = plots.by_gpu(runs, lambda _run: figures.histogram_figure(
            (run := next(made)).rows, [2.0**scale.value], fmt=format_menu.value,
            title=f"{format_menu.value} at loss scale 2^{scale.value}: {run.label}"))
        render(output, "\n".join(lines), figure=figure, table=table(rows, [
            Column("gpu", "GPU"), Column("gradients"), *figures.SHARE_COLUMNS]))

    return assemble([[scale, format_menu]], output, update)

