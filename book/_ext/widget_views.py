"""Sphinx extension: the notebooks' saved widget views, drawn offline by the book's own copy of the widget manager.

MyST-NB writes each widget output as a ``<script type="application/vnd.jupyter.widget-view+json">`` and,
on a page that has any, the notebook's saved widget state and the scripts named in ``nb_ipywidgets_js``
(``_config.yml``): ``embed.js``, the standalone build of ``@jupyter-widgets/html-manager`` (base, controls and
output widgets, no require.js) that ``make`` fetches from npm into ``book/_vendor/html-manager/``, and
``widgets_mathjax.js`` beside this file. This extension copies them into the built ``_static/jupyter-widgets/``.

A saved view shows an explorer as the build left it, and no kernel answers its controls on a static page. So that
the page never lies, the extension disables every control in the saved state (a reader cannot set a control that
would not change the output) and puts a note just above each view, beside its controls: what the view shows, and
how to run it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from docutils import nodes

HERE = Path(__file__).resolve().parent
VENDOR = HERE.parent / "_vendor" / "html-manager"
OWN = [HERE / "widgets_mathjax.js"]
VIEW_SCRIPT = '<script type="application/vnd.jupyter.widget-view+json">'
STATE_TYPE = "application/vnd.jupyter.widget-state+json"
NOTE = ("Explorer, shown as the book's build left it: its controls are switched off here, because they need a "
        "running kernel. Launch this notebook (the Colab button at the top of the page, or Jupyter on your own "
        "machine) to use them.")


def _note_widget_views(app, doctree) -> None:
    for raw in list(doctree.findall(nodes.raw)):
        if raw.get("format") == "html" and raw.astext().startswith(VIEW_SCRIPT):
            note = nodes.paragraph("", "", nodes.emphasis(text=NOTE), classes=["gpulab-needs-kernel"])
            raw.parent.insert(raw.parent.index(raw), note)


def disabled_state(body: str) -> str:
    """The saved widget state ``body`` (JSON) with every control that has a ``disabled`` trait disabled."""
    state = json.loads(body)
    for model in state.get("state", {}).values():
        if "disabled" in model.get("state", {}):
            model["state"]["disabled"] = True
    return json.dumps(state).replace("</", "<\\/")  # as MyST-NB writes it: no '</' inside a script element


def _disable_controls(app, pagename, templatename, context, doctree) -> None:
    for script in context.get("script_files") or []:
        attributes = getattr(script, "attributes", {})
        if attributes.get("type") == STATE_TYPE and attributes.get("body"):
            attributes["body"] = disabled_state(attributes["body"])  # the script object is immutable, its dict not


def _copy_widget_manager(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static" / "jupyter-widgets"
        shutil.copytree(VENDOR, static, dirs_exist_ok=True)
        for path in OWN:
            shutil.copyfile(path, static / path.name)


def setup(app):
    if not (VENDOR / "embed.js").exists():
        raise FileNotFoundError(f"no widget manager at {VENDOR}: `make book` fetches it from npm")
    app.connect("doctree-read", _note_widget_views)
    app.connect("html-page-context", _disable_controls, priority=900)
    app.connect("build-finished", _copy_widget_manager)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
