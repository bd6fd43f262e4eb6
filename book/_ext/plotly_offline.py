"""Sphinx extension: serve plotly.js from the book's own _static/, once per page.

The notebooks' figures carry a ``text/html`` div that calls the global ``Plotly`` (see
``gpulab.plots``). This extension copies the plotly.js bundled with the installed plotly package --
the same version that wrote the figures -- into the built ``_static/`` and loads it in every page's
head, before any other script, so pages draw with no network. Loading it first also keeps it clear
of require.js, which would otherwise capture plotly.js as an anonymous AMD module.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import plotly

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _copy_plotly(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PLOTLY_JS, static / "plotly.min.js")


def setup(app):
    if not PLOTLY_JS.exists():
        raise FileNotFoundError(f"plotly.js not found at {PLOTLY_JS}; is plotly installed?")
    app.add_js_file("plotly.min.js", priority=100)
    app.connect("build-finished", _copy_plotly)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
