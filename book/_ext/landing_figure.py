"""Sphinx extension: the landing page's picture, drawn from the recordings when the book builds.

The landing page shows where the book goes: the SGEMM worklog of chapter 09, from a naive kernel to cuBLAS, on
every recorded GPU. It is a small static SVG (no plotly.js on the landing page) written, with a sentence that
quotes its numbers, into ``book/_generated/`` at the start of each build; ``book/intro.md`` includes both. Nothing
in them is typed by hand: a new recording changes them at the next build.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "book" / "_generated"
EXPERIMENT = "gemm_worklog"
COLOURS = ["#1f6fb4", "#e4572e", "#29a35a", "#8e44ad"]


def worklogs() -> list[tuple[str, list[dict]]]:
    """(GPU name, rows) of every recording of the worklog, newest per GPU, in the order of the GPUs' names."""
    found = {}
    for path in sorted((ROOT / "results").glob(f"*/{EXPERIMENT}.json")):
        data = json.loads(path.read_text())
        name = data["provenance"]["device"]["name"].removeprefix("NVIDIA ")
        found[name] = sorted(data["rows"], key=lambda r: (r["step"] == 0, r["step"]))  # cuBLAS last
    return sorted(found.items())


def svg(runs: list[tuple[str, list[dict]]], width: int = 720, height: int = 300) -> str:
    """Grouped bars: each step's share of cuBLAS on each GPU (cuBLAS = 100%)."""
    left, bottom, top = 46, 70, 28
    steps = [r["label"] for r in runs[0][1]]
    group = (width - left - 10) / len(steps)
    bar = min(18.0, group * 0.8 / len(runs))
    plot_height = height - bottom - top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
             'font-family="Helvetica, Arial, sans-serif" font-size="11">',
             f'<title>Share of cuBLAS of each SGEMM step, on {", ".join(name for name, _ in runs)}</title>']
    for share in (0, 0.25, 0.5, 0.75, 1.0):
        y = top + plot_height * (1 - share)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{share:.0%}</text>')
    for g, (name, rows) in enumerate(runs):
        colour = COLOURS[g % len(COLOURS)]
        for i, row in enumerate(rows):
            x = left + i * group + (group - bar * len(runs)) / 2 + g * bar
            h = plot_height * min(row["fraction_of_cublas"], 1.05)
            parts.append(f'<rect x="{x:.1f}" y="{top + plot_height - h:.1f}" width="{bar - 2:.1f}" height="{h:.1f}" '
                         f'fill="{colour}"><title>{html.escape(name)}: {html.escape(row["label"])}, '
                         f'{row["tflops"]:.1f} TFLOP/s, {row["fraction_of_cublas"]:.0%} of cuBLAS</title></rect>')
        parts.append(f'<rect x="{left + 8 + g * 140}" y="6" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{left + 22 + g * 140}" y="15">{html.escape(name)}</text>')
    for i, label in enumerate(steps):
        x = left + (i + 0.5) * group
        name = "cuBLAS" if label == "cuBLAS" else f"{i + 1}. {label}"
        parts.append(f'<text transform="translate({x:.1f},{top + plot_height + 10}) rotate(30)" fill="#333">'
                     f'{html.escape(name[:22])}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def sentence(runs: list[tuple[str, list[dict]]]) -> str:
    said = []
    for name, rows in runs:
        first, best = rows[0], max((r for r in rows if r["label"] != "cuBLAS"), key=lambda r: r["tflops"])
        said.append(f"on the {name}, from {first['tflops']:.1f} TFLOP/s ({first['fraction_of_cublas']:.0%} of "
                    f"cuBLAS) to {best['tflops']:.1f} ({best['fraction_of_cublas']:.0%})")
    return ("*Chapter 09's nine SGEMM kernels, each a step of the worklog, as a share of cuBLAS at n = 4096 in "
            f"float32: {'; '.join(said)}. Each bar is a recorded run (hover for its rate).*\n")


def write(app=None) -> None:
    OUT.mkdir(exist_ok=True)
    runs = worklogs()
    if not runs:
        (OUT / "worklog.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"/>\n')
        (OUT / "worklog.md").write_text("*No recording of the worklog yet.*\n")
        return
    (OUT / "worklog.svg").write_text(svg(runs) + "\n")
    (OUT / "worklog.md").write_text(sentence(runs))


def setup(app):
    app.connect("builder-inited", write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
