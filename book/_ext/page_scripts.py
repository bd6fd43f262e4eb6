"""Sphinx extension: each page loads the scripts it uses, from the book itself, and no script twice.

- **plotly.js**: the notebooks' figures carry a ``text/html`` div that calls the global ``Plotly`` (see
  ``gpulab.core.plots``). The book serves plotly.js's cartesian bundle (every trace type the book draws, 1.5 MB
  against the full library's 4.8 MB), which ``make`` fetches from npm into ``book/_vendor/plotly/``; its version
  must be that of the plotly.js bundled with the installed plotly package, the version that wrote the figures
  (the build stops if not). It is copied into the built ``_static/`` and loaded in the head of the pages that draw
  a figure (in the page, or inside a saved widget view), before any other script: that keeps it clear of
  require.js, which would otherwise capture it as an anonymous AMD module. A page without a figure does not load
  it. ``figures_fit.js`` beside this file comes with it: it lays a figure out again where its column is narrow (a
  phone) or its menus would cover its title.
- **MathJax**: loaded only by pages with a formula, or with a saved widget view (the widgets typeset their labels).
- **Icons**: the theme loads Font Awesome's whole library (1.5 MB of JavaScript) to draw a dozen icons. The build
  replaces that file with a script that holds just the icons the pages use, taken from the same library, and draws
  them as the library does (an inline SVG in place of each ``<i class="fa-... fa-name">``).
- **Styles**: ``book.css`` beside this file, on every page (tables, wide formulas, icons, saved widget views).
- sphinx-thebe registers its inline configuration script once per read of the sources, and a Jupyter Book build
  reads them more than once, so pages declared ``const THEBE_JS_URL`` twice (a JavaScript error). Each page's
  script list is made unique here.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import plotly
from docutils import nodes

HERE = Path(__file__).resolve().parent
PLOTLY_JS = HERE.parent / "_vendor" / "plotly" / "plotly-cartesian.min.js"
PLOTLY_PACKAGE_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"  # the version figures are for
FIGURES_FIT = HERE / "figures_fit.js"
BOOK_CSS = HERE / "book.css"  # the book's own styles, on every page
DRAWS_A_FIGURE = "Plotly.newPlot"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
ICON_CLASS = re.compile(r'class="([^"]*\bfa-[^"]*)"')
STYLE_CLASSES = {"fa-solid", "fa-regular", "fa-brands", "fa-lg", "fa-fw", "fa-xs", "fa-sm", "fa-2x", "fa-spin"}
PACKS = (("fab", 'd("fab",p)'), ("far", 'd("far",p)'), ("fas", 'd("fas",p)'))  # where each pack's icons end
PREFIX = {"fa-solid": "fas", "fa-regular": "far", "fa-brands": "fab", "fas": "fas", "far": "far", "fab": "fab"}


def _scripts(context) -> list:
    return context.get("script_files") if isinstance(context.get("script_files"), list) else []


def _unique_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = _scripts(context)
    unique, seen = [], set()
    for script in scripts:
        # the two copies differ only in filename: None in one, "" in the other
        key = (getattr(script, "filename", script) or "", repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique  # in place: this list is the builder's, which later handlers still append to


def _page_assets(app, pagename, templatename, context, doctree) -> None:
    """plotly.js where a figure is drawn; MathJax only where there is math or a widget view."""
    states = [getattr(s, "attributes", {}).get("body", "") for s in _scripts(context)
              if getattr(s, "attributes", {}).get("type") == WIDGET_STATE]
    if DRAWS_A_FIGURE in context.get("body", "") or any(DRAWS_A_FIGURE in state for state in states):
        app.add_js_file("plotly.min.js", priority=100)
        app.add_js_file("figures_fit.js", priority=101)
    has_math = doctree is not None and any(doctree.findall(lambda n: isinstance(n, nodes.math | nodes.math_block)))
    if not has_math and not states:
        _scripts(context)[:] = [s for s in _scripts(context)
                                if "mathjax" not in str(getattr(s, "filename", "") or "")]


def icon_definitions(library: str) -> dict[tuple[str, str], tuple[int, int, str]]:
    """{(pack, name): (width, height, SVG path)} of every single-path icon in Font Awesome's ``all.js`` build,
    aliases included; the pack ('fas', 'far', 'fab') is the part of the file the definition sits in."""
    ends = [(pack, library.index(marker)) for pack, marker in PACKS]
    found = {}
    pattern = re.compile(r'(?:"([\w-]+)"|([a-zA-Z_]\w*)):\[(\d+),(\d+),\[([^\]]*)\],"[0-9a-f]+","(M[^"]+)"\]')
    for match in pattern.finditer(library):
        pack = next((p for p, end in ends if match.start() < end), None)
        if pack is None:
            continue
        name = match.group(1) or match.group(2)
        aliases = re.findall(r'"([\w-]+)"', match.group(5))
        for each in (name, *aliases):
            found.setdefault((pack, each), (int(match.group(3)), int(match.group(4)), match.group(6)))
    return found


def used_icons(html_root: Path) -> set[tuple[str, str]]:
    """(pack, name) of every ``<i class="fa-solid fa-name">`` in the built pages."""
    used = set()
    for page in html_root.rglob("*.html"):
        for classes in ICON_CLASS.findall(page.read_text(errors="replace")):
            words = classes.split()
            pack = next((PREFIX[w] for w in words if w in PREFIX), "fas")
            used |= {(pack, w[3:]) for w in words if w.startswith("fa-") and w not in STYLE_CLASSES}
    return used


ICON_SCRIPT = """// The icons this book's pages use, drawn as Font Awesome draws them: an SVG in place of each <i>.
(() => {
  const icons = %s;
  const draw = (root) => root.querySelectorAll("i[class*='fa-']").forEach((i) => {
    const has = (...names) => names.some((n) => i.classList.contains(n));
    const pack = has("fa-brands", "fab") ? "fab" : has("fa-regular", "far") ? "far" : "fas";
    const name = [...i.classList].find((c) => c.startsWith("fa-") && icons[pack + " " + c.slice(3)]);
    if (!name) return;
    const [w, h, d] = icons[pack + " " + name.slice(3)];
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("class", `${i.className} svg-inline--fa`);
    svg.innerHTML = `<path fill="currentColor" d="${d}"></path>`;
    i.replaceWith(svg);
  });
  draw(document);
  new MutationObserver((changes) => changes.forEach((c) => c.addedNodes.forEach((n) => {
    if (n.nodeType === 1) draw(n.tagName === "I" ? n.parentNode : n);
  }))).observe(document.documentElement, {childList: true, subtree: true});
})();
"""


def _finish(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PLOTLY_JS, static / "plotly.min.js")
    shutil.copyfile(FIGURES_FIT, static / "figures_fit.js")
    shutil.copyfile(BOOK_CSS, static / "book.css")
    library = static / "scripts" / "fontawesome.js"
    text = library.read_text(errors="replace") if library.exists() else ""
    if all(marker in text for _, marker in PACKS):  # the theme's library, copied by this build (not ours already)
        definitions = icon_definitions(text)
        used = used_icons(Path(app.outdir))
        icons = {f"{pack} {name}": definitions[pack, name] for pack, name in sorted(used)
                 if (pack, name) in definitions}
        library.write_text(ICON_SCRIPT % json.dumps(icons, separators=(",", ":")))
        (static / "scripts" / "fontawesome.js.map").unlink(missing_ok=True)


def plotly_js_version(path: Path) -> str:
    """'4.1.1' from the licence header of a plotly.js build ('plotly.js (cartesian - minified) v4.1.1')."""
    found = re.search(r"plotly\.js[^\n]*? v(\d+\.\d+\.\d+)", path.read_text(errors="replace")[:500])
    if not found:
        raise ValueError(f"{path}: no plotly.js version in its header")
    return found.group(1)


def setup(app):
    if not PLOTLY_JS.exists():
        raise FileNotFoundError(f"no plotly.js bundle at {PLOTLY_JS}: `make book` fetches it from npm")
    served, written_for = plotly_js_version(PLOTLY_JS), plotly_js_version(PLOTLY_PACKAGE_JS)
    if served != written_for:
        raise RuntimeError(f"the book serves plotly.js {served}, but the installed plotly writes figures for "
                           f"{written_for}: set PLOTLY_JS in the Makefile to {written_for} (and its hash)")
    app.add_css_file("book.css")
    app.connect("build-finished", _finish)
    app.connect("html-page-context", _page_assets, priority=950)  # after the handlers that add scripts
    app.connect("html-page-context", _unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
