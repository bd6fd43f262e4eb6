"""Chapter 02's figures: how a format lays out its sign, exponent and fraction bits."""

from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go

FIELD_COLOURS = {"sign": "#e4572e", "exponent": "#1f6fb4", "fraction": "#29a35a", "unused by tf32": "#d9d9d9"}


def bit_layout_figure(formats: Iterable, *, title: str = "Bit layouts of the number formats") -> go.Figure:
    """One row of boxes per :class:`gpulab.core.precision.Format`: sign, exponent and fraction bits, drawn to scale.

    tf32 is drawn in the float32 word it lives in, its 13 lowest bits greyed: TF32 arithmetic drops them.
    """
    formats = list(formats)
    names = [f.name for f in formats]
    fields: dict[str, list[tuple[str, int, int]]] = {field: [] for field in FIELD_COLOURS}  # (format, start, bits)
    for f in formats:
        fraction_end = 1 + f.exponent_bits + f.mantissa_bits
        fields["sign"].append((f.name, 0, 1))
        fields["exponent"].append((f.name, 1, f.exponent_bits))
        fields["fraction"].append((f.name, 1 + f.exponent_bits, f.mantissa_bits))
        if f.storage_bits > fraction_end:
            fields["unused by tf32"].append((f.name, fraction_end, f.storage_bits - fraction_end))
    fig = go.Figure()
    for field, parts in fields.items():
        if parts:
            fig.add_trace(go.Bar(
                y=[p[0] for p in parts], x=[p[2] for p in parts], base=[p[1] for p in parts], orientation="h",
                name=field, marker=dict(color=FIELD_COLOURS[field], line=dict(color="white", width=1)),
                text=[str(p[2]) if p[2] > 1 else "" for p in parts], textposition="inside", insidetextanchor="middle",
                hovertemplate=f"%{{y}}: %{{x}} {field} bit(s)<extra></extra>",
            ))
    for row, f in enumerate(formats):  # a thin white line between neighbouring bits
        for bit in range(1, f.storage_bits):
            fig.add_shape(type="line", x0=bit, x1=bit, y0=row - 0.4, y1=row + 0.4,
                          line=dict(color="white", width=0.6), layer="above")
        fig.add_annotation(x=f.storage_bits, y=f.name, xanchor="left", showarrow=False, font=dict(size=11),
                           text=f"  eps {f.epsilon:.3g}, max {f.largest:.3g}")
    fig.update_layout(title=title, barmode="overlay", bargap=0.25, height=120 + 45 * len(formats),
                      xaxis=dict(title="bits, most significant first", range=[0, 84], dtick=8, showgrid=False),
                      yaxis=dict(title="format", automargin=True, categoryorder="array", categoryarray=names,
                                 autorange="reversed", showgrid=False),
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=110))
    return fig
