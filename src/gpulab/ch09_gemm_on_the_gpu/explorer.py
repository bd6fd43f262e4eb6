"""Chapter 09's explorer: how a GEMM's size splits into tiles and waves on a GPU's SMs."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w

from gpulab.ch04_mlp_gemms import waves
from gpulab.ch09_gemm_on_the_gpu import figures
from gpulab.core.widgets import assemble, render


def quantization_explorer(m: int = 1536, n: int = 1024, sms: Sequence[int] = (8, 80, 108, 132)) -> w.Widget:
    """Pick an output size, a tile and an SM count: the tiles coloured by wave, and what the model predicts.

    Pure arithmetic (:func:`gpulab.ch04_mlp_gemms.waves.tile_waves`): it answers without a GPU.
    """

    rows = w.BoundedIntText(value=m, min=1, max=65536, step=64, description="M (rows)")
    cols = w.BoundedIntText(value=n, min=1, max=65536, step=64, description="N (columns)")
    tile = w.Dropdown(options=[(waves.tile_label(t), t) for t in ((128, 128), (256, 128), (128, 256), (64, 64))],
                      description="tile")
    count = w.Dropdown(options=list(sms), value=sms[0], description="SMs")
    output = w.Output()

    def update(_change=None) -> None:
        model = waves.tile_waves(rows.value, cols.value, tile.value, count.value)
        text = (f"{model.tiles} tiles in {model.waves} wave(s) of {model.slots}: tile efficiency "
                f"{model.tile_efficiency:.1%}, wave efficiency {model.wave_efficiency:.1%}, "
                f"at best {model.efficiency:.1%} of the peak\n")
        figure = figures.waves_figure(rows.value, cols.value, tile.value, count.value) if model.tiles <= 4096 else None
        render(output, text + ("" if figure else "(too many tiles to draw)\n"), figure)

    return assemble([[rows, cols], [tile, count]], output, update)
