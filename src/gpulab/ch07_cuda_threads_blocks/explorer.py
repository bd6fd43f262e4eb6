"""Chapter 07's explorer: a launch configuration's blocks, occupancy and waves on each recorded GPU, with the
bandwidth it measured there, and a live measurement where this machine has a GPU."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w

from gpulab.ch07_cuda_threads_blocks import threads
from gpulab.core import env, kernel_mode, occupancy, recordings
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, render
from gpulab.kernels import cuda_c

KERNEL = ("05_saxpy_per_thread", "saxpy_per_thread")
COLUMNS = [Column("gpu", "GPU"), Column("registers", "registers per thread"), Column("blocks_per_sm", "blocks per SM"),
           Column("occupancy", format=".0%"), Column("limited_by", "limited by"),
           Column("blocks", "blocks launched"), Column("waves", "waves", format=",.1f"),
           Column("gbytes_per_s", "measured", "GB/s", ",.0f"), Column("of_best", "of its best", format=".0%")]


def configuration_row(label: str, device: dict, registers: int, n: int, size: int, per: int,
                      measured: Sequence[dict] = ()) -> dict:
    """What a launch of ``size`` threads per block, ``per`` elements each, over ``n`` elements is on a GPU described
    by ``device`` (compute capability, SMs): its blocks, occupancy (:func:`gpulab.core.occupancy.theoretical`) and
    waves, and the bandwidth ``measured`` (rows of ``threads_launch_configuration``) at that configuration, if any."""
    fit = occupancy.theoretical(size, registers, 0, occupancy.limits(device.get("compute_capability", "9.0")))
    blocks = threads.blocks_for(n, size * per)
    sms = device.get("multiprocessors")
    at = next((r for r in measured if r["threads_per_block"] == size and r["elements_per_thread"] == per), None)
    best = max((r["gbytes_per_s"] for r in measured), default=None)
    return {"gpu": label, "registers": registers, "blocks_per_sm": fit.blocks_per_sm, "occupancy": fit.fraction,
            "limited_by": fit.limited_by, "blocks": blocks,
            "waves": blocks / (fit.blocks_per_sm * sms) if sms else None,
            "gbytes_per_s": at["gbytes_per_s"] if at else None,
            "of_best": at["gbytes_per_s"] / best if at and best else None}


def launch_configuration_explorer(n: int = 2**28, threads_per_block: int = 256,
                                  elements_per_thread: Sequence[int] = (1, 2, 4, 8, 16)) -> w.Widget:
    """Pick threads per block and elements per thread: the blocks that cover ``n`` elements, and on each recorded GPU
    the occupancy and waves they make (from the kernel's registers) and the bandwidth measured there. Recordings and
    arithmetic, so it answers without a GPU; with one, a button measures the configuration on it and adds the row."""
    size = w.IntSlider(value=threads_per_block, min=32, max=1024, step=32, description="threads per block",
                       style=WIDE)
    per = w.SelectionSlider(options=list(elements_per_thread), value=elements_per_thread[0],
                            description="elements per thread", style=WIDE)
    output = w.Output()
    recorded = recordings.newest_per_gpu("threads_launch_configuration")
    live: dict[tuple[int, int], dict] = {}
    live_device = env.describe().as_dict() if kernel_mode.on_gpu() else None
    button = w.Button(description="Measure on this GPU", button_style="primary", icon="play",
                      layout=w.Layout(width="16em"))
    problem: list[str] = []

    def update(_change=None) -> None:
        rows = [configuration_row(run.short_label, run.provenance.get("device", {}), run.rows[0]["registers"],
                                  run.params["n"], size.value, per.value, run.rows) for run in recorded if run.rows]
        if live_device is not None and (size.value, per.value) in live:
            row = live[size.value, per.value]
            rows.append(configuration_row(f"{live_device['name'].removeprefix('NVIDIA ')} (live)", live_device,
                                          row["registers"], n, size.value, per.value, [row]) | {"of_best": None})
        if not rows:  # no recording and no measurement: the compiler's registers on a Hopper SM
            report = cuda_c.compile_report(KERNEL[0], "sm_90").resources[KERNEL[1]]
            rows.append(configuration_row("a Hopper SM, compiled for sm_90", {"compute_capability": "9.0"},
                                          report.registers, n, size.value, per.value))
        text = [f"{size.value} threads per block ({size.value // occupancy.WARP} warps), {per.value} elements per "
                f"thread: each block covers {size.value * per.value:,} elements, and the grid as many blocks as the "
                "elements of each GPU's run need."]
        if recorded and any(r["gbytes_per_s"] is None for r in rows):
            sizes = sorted({s for run in recorded for s in run.params["threads_per_block"]})
            counts = sorted({c for run in recorded for c in run.params["elements_per_thread"]})
            text.append(f"A dash under 'measured': that GPU did not run this configuration; the recordings hold "
                        f"{', '.join(map(str, sizes))} threads per block and {', '.join(map(str, counts))} elements "
                        "per thread.")
        if live_device is None:
            text.append("There is no GPU here to measure on: the table is the recordings and the occupancy "
                        "arithmetic.")
        text += problem
        render(output, "\n".join(text), table=table(rows, COLUMNS))

    def measure(_button=None) -> None:
        problem.clear()
        try:
            (row,) = threads.launch_configuration(n, [size.value], [per.value])
            live[size.value, per.value] = row
        except (ValueError, AssertionError) as error:  # too big for this GPU's memory, a failed check
            problem.append(f"Not measured: {error}")
        update()

    button.on_click(measure)
    controls = [size, per] + ([button] if live_device is not None else [])
    return assemble([controls], output, update)
