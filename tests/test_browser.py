"""Open every page of the built book in Chromium with the network cut off, as a reader offline would.

Every request that is not to the local server is blocked. A page fails if it asks for anything from outside the
book, raises a JavaScript error, leaves a saved widget view, a plotly figure (one in a widget's Output too) or a
formula undrawn, or weighs more than its budget. It also fails on what keeps a page from its reader: an image
without alt text, a figure without a title or with an axis that does not say what it measures, headings that skip
a level; a printed block wider than the text column at 1400 px, or anything that widens a 390 px page; a control
of a saved widget view that looks as if it answered without a kernel; a traceback or an exception's message on the
page; Markdown table pipes printed as text; an issue by number or tracker (a page speaks of its subject, not of
the work that made it); hover text that shows raw field names; a figure's title cut off at 390 px, or covered by its
menu; an icon drawn higher than two lines of its text. The local server compresses text with gzip, as GitHub Pages
and other web servers do; the test prints each page's weight uncompressed and compressed.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import shutil
import threading
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from conftest import book_pages
from gpulab.core import specs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
COMPRESSED = {".html", ".js", ".css", ".json", ".svg", ".txt", ".map"}  # what web servers gzip
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def server(built_book: Path):
    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            path = Path(self.translate_path(self.path))
            if not (path.is_file() and path.suffix in COMPRESSED and "gzip" in self.headers.get("Accept-Encoding", "")):
                return super().do_GET()
            body = gzip.compress(path.read_bytes())
            self.send_response(200)
            self.send_header("Content-Type", self.guess_type(str(path)))
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None

    handler = functools.partial(QuietHandler, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync",
        ])
        yield browser
        browser.close()


# Bytes of the page and of everything it loaded: [uncompressed, as transferred (gzip)].
WEIGHT = """() => [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')]
    .reduce(([decoded, encoded], e) => [decoded + (e.decodedBodySize || 0), encoded + (e.encodedBodySize || 0)],
            [0, 0])"""
LANDING_BUDGET = 1.5e6  # bytes, uncompressed: the landing page has no figure, formula or widget
PAGE_BUDGET = 7.5e6  # bytes, uncompressed: plotly.js (its 1.5 MB cartesian bundle), MathJax, widgets where used

# Each drawn figure's problems: no title, or a visible x/y axis of a chart with no axis title.
FIGURE_PROBLEMS = """divs => divs.flatMap(div => {
    const layout = div._fullLayout, given = div.layout || {};  // plotly fills placeholders into _fullLayout
    if (!layout) return [];
    const text = title => ((typeof title === 'string' ? title : title && title.text) || '').trim();
    const title = text(given.title);
    const problems = title ? [] : ['a figure without a title'];
    // An axis needs a title unless it shares its place with one that has it: the x axes of one column
    // of subplots (the same domain) are titled once, below the column; the y axes of one row likewise.
    const axes = [];
    for (const subplot of layout._subplots.cartesian || []) {
        const [, x, y] = subplot.match(/^x(\\d*)y(\\d*)$/);
        for (const name of ['xaxis' + x, 'yaxis' + y]) {
            const axis = layout[name];
            if (axis && axis.visible !== false && !axes.some(a => a.name === name)) {
                const titled = !!text((given[name] || {}).title);
                axes.push({name, place: name[0] + JSON.stringify(axis.domain), titled});
            }
        }
    }
    for (const axis of axes) {
        if (!axes.some(other => other.place === axis.place && other.titled)) {
            problems.push(`"${title.slice(0, 60)}": ${axis.name} has no title`);
        }
    }
    return problems;
})"""
# Widget views the page saved, and how many of them the widget manager has drawn.
WIDGET_VIEW = 'script[type="application/vnd.jupyter.widget-view+json"]'
WIDGETS_DRAWN = "() => [...document.querySelectorAll('.widget-subarea')].filter(area => area.children.length).length"
# Heading levels of the article itself (the theme repeats the title in its header bar).
HEADING_LEVELS = "() => [...document.querySelectorAll('article h1, article h2, article h3, article h4, article h5, " \
                 "article h6')].map(heading => Number(heading.tagName[1]))"


def visit(browser, server: str, path: str, width: int = 1400) -> dict:
    """Load one page offline, ``width`` pixels wide; return its JavaScript errors, blocked requests, figure states,
    weight and the problems a reader would meet."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors, blocked = [], []
    page.on("pageerror", lambda error: errors.append(str(error)))

    def route(route):
        if route.request.url.startswith(server):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.route("**/*", route)
    page.goto(f"{server}/{path}", wait_until="load")
    page.wait_for_timeout(300)
    views = page.eval_on_selector_all(WIDGET_VIEW, "scripts => scripts.length")
    if views:  # the widget manager draws them after the load event, and a figure in an Output after that
        try:
            page.wait_for_function(f"() => ({WIDGETS_DRAWN})() >= {views}", timeout=10_000)
            page.wait_for_timeout(300)
        except PlaywrightTimeout:
            pass  # counted below: fewer drawn than saved
    widgets = (page.evaluate(WIDGETS_DRAWN), views)
    drawn = "divs => divs.map(d => d.classList.contains('js-plotly-plot') && !!d.querySelector('svg.main-svg'))"
    figures = page.eval_on_selector_all(".plotly-graph-div", drawn)
    math = page.eval_on_selector_all("span.math, div.math", "spans => spans.length")
    if math:
        page.wait_for_selector("mjx-container", timeout=10_000)
    typeset = page.eval_on_selector_all("mjx-container", "nodes => nodes.length")
    weight = page.evaluate(WEIGHT)
    problems = accessibility_problems(page) + reading_problems(page)
    page.close()
    return {"errors": errors, "blocked": blocked, "figures": figures, "math": math, "typeset": typeset,
            "widgets": widgets, "bytes": weight, "accessibility": problems}


def accessibility_problems(page) -> list[str]:
    """Images without alt text, figures without a title or an axis title, and headings that skip a level."""
    unlabelled = page.eval_on_selector_all("article img", "imgs => imgs.filter(i => !(i.alt || '').trim())"
                                                          ".map(i => i.getAttribute('src'))")
    problems = [f"image without alt text: {src}" for src in unlabelled]
    problems += page.eval_on_selector_all(".plotly-graph-div", FIGURE_PROBLEMS)
    levels = page.evaluate(HEADING_LEVELS)
    if levels and levels[0] != 1:
        problems.append(f"headings start at h{levels[0]}")
    problems += [f"heading h{a} followed by h{b}" for a, b in zip(levels, levels[1:], strict=False) if b > a + 1]
    return problems


# What a reader must not meet on a page (each script returns a list of problems, in words).
WIDE_OUTPUT = """() => [...document.querySelectorAll('article .cell_output pre, article .cell_output table')]
    .filter(e => e.scrollWidth > e.clientWidth + 1 && !e.closest('.gpulab-table, .gpulab-listing'))
    .map(e => `an output ${e.scrollWidth - e.clientWidth}px wider than the column: "${e.innerText.slice(0, 50)}"`)"""
PAGE_WIDER_THAN_SCREEN = """() => document.documentElement.scrollWidth > window.innerWidth + 1
    ? [`the page is ${document.documentElement.scrollWidth - window.innerWidth}px wider than the screen`] : []"""
LIVE_CONTROLS = """() => [...document.querySelectorAll('.widget-subarea input, .widget-subarea select, '
        + '.widget-subarea button, .widget-subarea textarea')]
    .filter(c => !c.disabled && !c.closest('.js-plotly-plot'))  // a figure's own zoom and menus work offline
    .map(c => `a widget control that looks live without a kernel: <${c.tagName.toLowerCase()}>`)"""
LEAKED_TEXT = """() => {
    const problems = [];
    for (const out of document.querySelectorAll('article .cell_output')) {
        const text = out.innerText;
        const match = text.match(/Traceback \\(most recent call last\\)|\\b[A-Z]\\w*(Error|Exception): \\S/);
        if (match) problems.push(`an exception's text on the page: "${text.slice(Math.max(0, match.index - 20),
                                                                                 match.index + 60)}"`);
    }
    const prose = [...document.querySelectorAll('article p, article li, article td, article th, article h1, '
        + 'article h2, article h3, article figcaption')].filter(e => !e.closest('pre, code, .cell_input'));
    for (const e of prose) {
        if (/^\\s*\\|.*\\|\\s*$/m.test(e.innerText) || e.innerText.includes('|---')) {
            problems.push(`Markdown table pipes printed as text: "${e.innerText.slice(0, 60)}"`);
        }
        // the work that made the page: an issue by number, a tracker ('a warp issues an instruction' is GPU talk)
        const tracker = /\\b(issues? #?\\d+|issue tracker|(open|closed|github|this) issues?|the issue th)/i;
        const issue = e.innerText.match(tracker);
        if (issue) problems.push(`"${issue[0]}": "${e.innerText.slice(0, 80)}"`);
    }
    return problems;
}"""
OVERSIZED_ICONS = """() => [...document.querySelectorAll('svg.svg-inline--fa')]
    .map(svg => [svg, svg.getBoundingClientRect().height, parseFloat(getComputedStyle(svg.parentElement).fontSize)])
    .filter(([svg, height, font]) => height > 2 * font)
    .map(([svg, height]) => `an icon ${Math.round(height)}px high: "${svg.getAttribute('class')}"`)"""
FIGURE_POLISH = """divs => divs.flatMap(div => {
    const problems = [], title = div.querySelector('.gtitle');
    const name = (title && title.textContent || '').slice(0, 50);
    for (const trace of div.data || []) {
        const texts = [].concat(trace.hovertext || [], trace.text || []).filter(t => typeof t === 'string');
        const raw = texts.find(t => /\\b[a-z]+_[a-z_]+ = /.test(t));
        if (raw) problems.push(`"${name}": hover text with a raw field name: "${raw.slice(0, 60)}"`);
    }
    if (title) {
        const box = title.getBoundingClientRect(), frame = div.getBoundingClientRect();
        if (box.left < frame.left - 1 || box.right > frame.right + 1) problems.push(`"${name}": title cut off`);
        for (const menu of div.querySelectorAll('.updatemenu-container .updatemenu-button, .updatemenu-header')) {
            const m = menu.getBoundingClientRect();
            if (m.width && m.left < box.right && box.left < m.right && m.top < box.bottom && box.top < m.bottom) {
                problems.push(`"${name}": a menu covers the title`);
            }
        }
    }
    return problems;
})"""


def reading_problems(page) -> list[str]:
    """What keeps a reader from reading the page, at the viewport's width (see the module's docstring)."""
    width = page.viewport_size["width"]
    problems = page.evaluate(LIVE_CONTROLS) + page.evaluate(LEAKED_TEXT)
    problems += page.evaluate(WIDE_OUTPUT) if width >= 1000 else page.evaluate(PAGE_WIDER_THAN_SCREEN)
    problems += page.eval_on_selector_all(".plotly-graph-div", FIGURE_POLISH) + page.evaluate(OVERSIZED_ICONS)
    return [f"{p} (at {width} px)" for p in problems]


def test_every_page_loads_offline_and_reads_well_at_1400_and_390_px(built_book, server, browser, capsys):
    failures, blocked, sizes = [], set(), {}
    for page in book_pages(built_book):
        path = page.relative_to(built_book).as_posix()
        for width in (1400, 390):
            result = visit(browser, server, path, width)
            blocked.update(result["blocked"])
            budget = LANDING_BUDGET if path == "book/intro.html" else PAGE_BUDGET
            if width == 1400:
                sizes[path] = result["bytes"]
                if result["bytes"][0] > budget:
                    failures.append(f"{path}: weighs {result['bytes'][0] / 1e6:.2f} MB, over {budget / 1e6:g} MB")
            if result["errors"]:
                failures.append(f"{path} at {width} px: JavaScript errors {result['errors']}")
            if not all(result["figures"]):
                missing = result["figures"].count(False)
                failures.append(f"{path}: {missing} of {len(result['figures'])} figures did not draw")
            if result["widgets"][0] < result["widgets"][1]:
                failures.append(f"{path}: {result['widgets'][0]} of {result['widgets'][1]} saved widget views drawn")
            if result["accessibility"]:
                failures.append(f"{path}: {'; '.join(result['accessibility'])}")
            if result["typeset"] < result["math"]:
                failures.append(f"{path}: {result['math'] - result['typeset']} of {result['math']} formulas not "
                                "typeset")
    if blocked:
        failures.append("pages asked for outside resources: " + ", ".join(sorted(blocked)))
    with capsys.disabled():
        print(f"\n{'page':<48} {'MB, uncompressed':>17} {'MB, gzip':>9}")
        for path, (decoded, encoded) in sorted(sizes.items(), key=lambda item: -item[1][0]):
            print(f"{path:<48} {decoded / 1e6:17.2f} {encoded / 1e6:9.2f}")
    assert not failures, "\n".join(dict.fromkeys(failures))


def test_chapter_figures_draw(built_book, server, browser):
    """The BLAS chapter has figures, and they all draw with the network cut off."""
    result = visit(browser, server, "notebooks/03_blas_levels.html")
    assert len(result["figures"]) >= 4 and all(result["figures"]), result


def test_gpu_comparison_menus_work_without_a_kernel(built_book, server, browser):
    """On the static page, picking another GPU B in its menu redraws B's bars with that GPU's peaks."""
    page = browser.new_page()
    page.goto(f"{server}/notebooks/01_cpus_to_gpus.html", wait_until="load")
    figure = page.locator(".plotly-graph-div", has=page.locator("text=Compare two GPUs")).first
    figure.locator(".updatemenu-header-group").nth(1).click()
    figure.locator(".updatemenu-item-text", has_text="B: T4").first.click()
    page.wait_for_timeout(500)
    name, formats, rates = figure.evaluate("div => [div.data[1].name, div.data[1].x, div.data[1].y]")
    legend = figure.evaluate("div => [...div.querySelectorAll('.legendtext')].map(t => t.textContent)")
    page.close()
    assert name == "T4" and "T4" in legend, (name, legend)
    t4 = {r["metric"].removeprefix("peak "): r["value"] for r in specs.figures(specs.gpu("T4")) if r["peak"]}
    assert dict(zip(formats, rates, strict=True)) == {k: v for k, v in t4.items() if v is not None}


def test_accessibility_check_names_each_problem(built_book, browser):
    """The page check is not vacuous: on a page with each fault, it names all three."""
    page = browser.new_page()
    page.set_content("<article><h1>Title</h1><h3>Skipped a level</h3><img src='x.png'>"
                     "<div id='figure' class='plotly-graph-div'></div></article>")
    page.add_script_tag(path=str(built_book / "_static" / "plotly.min.js"))
    page.evaluate("() => Plotly.newPlot('figure', [{x: [1, 2], y: [3, 4]}], "
                  "{title: {text: 'Rate'}, xaxis: {title: {text: 'n'}}})")
    problems = accessibility_problems(page)
    page.close()
    assert problems == ["image without alt text: x.png", '"Rate": yaxis has no title', "heading h1 followed by h3"]


def test_reading_check_names_each_problem(browser):
    """The reading checks are not vacuous: a page with each fault gets each named, and what is fine passes."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_content(
        "<article><div class='cell_output'><pre style='width:300px;overflow:auto'>" + "x" * 200 + "</pre>"
        "<div class='gpulab-listing' style='width:300px;overflow:auto'><pre>" + "y" * 200 + "</pre></div>"
        "<pre>NOT YET (TypeError: '&lt;' not supported)</pre></div>"
        "<p>| layer | time |<br>|---|---|</p><p>See issue 12 for the plan.</p>"
        "<p>Four warps issue an instruction each clock.</p>"
        "<div class='widget-subarea'><select><option>a</option></select><button disabled>b</button>"
        "<div class='js-plotly-plot'><button class='modebar-btn'>zoom</button></div></div>"
        "<p>Contents <svg class='fa-list svg-inline--fa' viewBox='0 0 512 512'><path d='M0 0h512v512z'/></svg></p>"
        "<p>Code <svg class='fa-code svg-inline--fa' viewBox='0 0 640 512' style='height:1em'></svg></p></article>")
    problems = reading_problems(page)
    page.close()
    assert len(problems) == 6, problems
    assert problems[0].startswith("a widget control that looks live without a kernel: <select>")
    assert "an exception's text on the page" in problems[1] and "TypeError: '<'" in problems[1]
    assert problems[2].startswith("Markdown table pipes") and problems[3].startswith('"issue 12"')
    assert problems[4].startswith("an output") and "wider than the column" in problems[4]
    assert problems[5].startswith("an icon") and "fa-list" in problems[5]  # the one sized by a line of text passes


def test_saved_widget_view_draws_with_its_figure_and_note(built_book, server, browser):
    """The GEMM chapter's wave explorer, offline: its controls switched off, the model's sentence, its figure in the
    Output, and the note that says why the controls do not answer."""
    result = visit(browser, server, "notebooks/09_gemm_on_the_gpu.html")
    assert result["widgets"] == (1, 1) and not result["errors"] and not result["blocked"], result
    page = browser.new_page()
    page.goto(f"{server}/notebooks/09_gemm_on_the_gpu.html", wait_until="load")
    view = page.locator(".widget-subarea").first
    view.locator(".widget-output .plotly-graph-div svg.main-svg").first.wait_for(timeout=10_000)
    controls = view.locator(".widget-dropdown select, .widget-text input")
    disabled = [controls.nth(i).is_disabled() for i in range(controls.count())]
    line = view.locator(".widget-output p").first.text_content()
    note = page.locator(".cell_output:has(.widget-subarea) .gpulab-needs-kernel").count()
    page.close()
    assert disabled == [True] * 4 and "tiles in" in line and note == 1, (disabled, line, note)
