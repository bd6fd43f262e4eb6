"""Chapter 13's figures: elementwise and row-wise layers on the measured roofline."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.ch13_memory_bound_layers_and_fusion.sweeps import roofline_of
from gpulab.core import plots


def roofline_figure(rows: Sequence[dict], device_name: str, *, title: str) -> go.Figure:
    """The layers of :func:`.sweeps.pointwise_roofline` as points on the roofline of the ceilings measured with them."""
    roofline, points = roofline_of(rows, device_name)
    fig = plots.roofline_figure(roofline, points, title=title)
    for dtype in roofline.peaks:
        plots.vertical_marker(fig, roofline.ridge(dtype), f"ridge {dtype}")
    return fig
