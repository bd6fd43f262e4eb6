"""Chapter 08's explorer: a warp's strided read, counted in sectors and set against each recorded GPU."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch08_memory_hierarchy import figures, memory
from gpulab.core import occupancy, recordings
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, render


def coalescing_explorer(stride: int = 4, element: str = "float32 (4 B)") -> w.Widget:
    """Pick a stride and an element size: the sectors one warp's read touches, the share of their bytes it uses,
    and, for each recorded GPU, the useful bandwidth those sectors allow at its device copy's rate (with the
    measured strided read, where the recording has that stride). Arithmetic and recordings: it answers without
    a GPU."""
    strides = w.IntSlider(value=stride, min=1, max=64, description="stride s (elements)", style=WIDE)
    size = w.Dropdown(options=list(figures.ELEMENTS), value=element, description="element", style=WIDE)
    output = w.Output()
    peaks = recordings.newest_per_gpu("hardware_peaks")
    measured = {run.device_name: run for run in recordings.newest_per_gpu("memory_coalescing")}

    def update(_change=None) -> None:
        element_bytes = figures.ELEMENTS[size.value]
        sectors = memory.sectors_per_warp(strides.value, element_bytes)
        fetched = sectors * memory.SECTOR_BYTES
        useful = occupancy.WARP * element_bytes
        rows = []
        for peak in peaks:
            copy = next(r["measured"] for r in peak.rows if r["work"] == "copy")  # GB/s, read + written
            # per output: element_bytes written (coalesced) and fetched / warp read; useful: 2 x element_bytes
            moved = element_bytes + fetched / occupancy.WARP
            run = measured.get(peak.device_name)
            at_stride = next((r for r in run.rows if r["stride"] == strides.value), None) if run else None
            rows.append({"gpu": peak.short_label, "copy": copy, "predicted": copy * 2 * element_bytes / moved,
                         "measured": at_stride["useful_gbytes_per_s"] if at_stride and element_bytes == 4 else None})
        render(output, f"A warp reads {occupancy.WARP} elements of {element_bytes} B at stride {strides.value}: "
                       f"{sectors} sectors of {memory.SECTOR_BYTES} B ({fetched:,} B) for {useful} useful bytes, "
                       f"{useful / fetched:.1%} of what it fetches.",
               table=table(rows, [Column("gpu", "GPU"), Column("copy", "device copy", "GB/s", ",.0f"),
                                  Column("predicted", "useful, at the copy's rate", "GB/s", ",.0f"),
                                  Column("measured", "useful, measured (float32)", "GB/s", ",.0f")]))

    return assemble([[strides, size]], output, update)
