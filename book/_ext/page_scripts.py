"""Sphinx extension: the pages' JavaScript -- plotly.js from the book itself, and no script twice.

The notebooks' figures carry a ``text/html`` div that calls the global ``Plotly`` (see
``gpulab.core.plots``). This extension copies the plotly.js bundled with the installed plotly package --
the same version that wrote the figures -- into the built ``_static/`` and loads it in every page's
head, before any other script, so pages draw with no network. Loading it first also keeps it clear
of require.js, which would otherwise capture plotly.js as an anonymous AMD module.

sphinx-thebe registers its inline configuration script once per read of the sources, and a
Jupyter Book build reads them more than once, so pages declared ``const THEBE_JS_URL`` twice (a
JavaScript error). Each page's script list is made unique here.
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


def _unique_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    unique, seen = [], set()
    for script in scripts:
        # the two copies differ only in filename: None in one, "" in the other
        key = (getattr(script, "filename", script) or "", repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique  # in place: this list is the builder's, which later handlers still append to


def setup(app):
    if not PLOTLY_JS.exists():
        raise FileNotFoundError(f"plotly.js not found at {PLOTLY_JS}; is plotly installed?")
    app.add_js_file("plotly.min.js", priority=100)
    app.connect("build-finished", _copy_plotly)
    app.connect("html-page-context", _unique_scripts, priority=900)  # after the handlers that add scripts
    return {"parallel_read_safe": True, "parallel_write_safe": True}
