// Figures that fit their column. A figure is laid out for a wide column; on the book's pages, when its column is
// narrow (a phone), or when its menus would cover its title, it is laid out again:
// - the title is wrapped to the width (at the breaks it has, then between words) and sits at the top;
// - the menus sit in a row of their own under the title, over the plot;
// - on a narrow column the legend goes under the plot, in rows, so that the plot keeps the width.
// The figure's own layout comes back when the column is wide again. A menu that changes the title (a GPU's run)
// has its new title wrapped too. Loaded after plotly.js by book/_ext/page_scripts.py.
(() => {
  "use strict";
  const NARROW = 640; // px: a column narrower than this is a phone's
  const LINE = 1.35; // a title line's height, in font sizes
  const MENU_ROW = 36; // px: the height of a row of menus
  const CHAR = 0.56; // the width of an average character, in font sizes
  const TITLE_TOP = 16; // px: from the figure's top edge to its title's
  const SUB = 0.75; // a subtitle's size (<sub>), in title sizes
  const TOP_AXIS = 44; // px: the ticks and title of an x axis drawn above the plot
  const own = new WeakMap(); // div -> the layout the figure was drawn with
  const busy = new WeakSet(); // divs being laid out by this script (their relayout events are ours)

  const text = (title) => (typeof title === "string" ? title : (title && title.text) || "");

  // The title's lines, at most `chars` characters each; a subtitle line (<sub>...</sub>), set smaller, takes more
  // characters a line and keeps its <sub> on each of its lines (plotly spaces all lines alike).
  function wrapped(title, chars) {
    const lines = [];
    for (const part of title.split(/<br\s*\/?>/i)) {
      const sub = part.match(/^\s*<sub>(.*)<\/sub>\s*$/i);
      const words = (sub ? sub[1] : part).split(" ");
      const width = sub ? Math.floor(chars / SUB) : chars;
      let line = "";
      const push = () => lines.push(sub ? `<sub>${line}</sub>` : line);
      for (const word of words) {
        if (line && (line + " " + word).length > width) {
          push();
          line = word;
        } else {
          line = line ? line + " " + word : word;
        }
      }
      push();
    }
    return lines;
  }

  function overlaps(a, b) {
    return a.width && b.width && a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  }

  // How many pixels the title reaches down into a menu it overlaps (0: none)
  function menuOverlap(div) {
    const title = div.querySelector(".gtitle");
    if (!title) return 0;
    const box = title.getBoundingClientRect();
    return Math.max(0, ...[...div.querySelectorAll(".updatemenu-header, .updatemenu-button")]
      .map((menu) => menu.getBoundingClientRect()).filter((m) => overlaps(m, box)).map((m) => box.bottom - m.top));
  }

  const menuCoversTitle = (div) => menuOverlap(div) > 0;

  function remember(div) {
    if (!own.has(div)) {
      const layout = div.layout || {};
      own.set(div, JSON.parse(JSON.stringify({
        title: layout.title || {}, margin: layout.margin || {}, legend: layout.legend || {},
        height: layout.height || div._fullLayout.height, updatemenus: layout.updatemenus || [],
      })));
    }
    return own.get(div);
  }

  // plotly's HTML fixes the figure's height in the style of the div it draws in (and of the div around it)
  function setHeight(div, height) {
    for (const element of [div, div.parentElement]) {
      if (element && element.style.height) element.style.height = `${height}px`;
    }
  }

  function relayout(div, update) {
    busy.add(div);
    return Promise.resolve(window.Plotly.relayout(div, update)).finally(() => busy.delete(div));
  }

  function fit(div) {
    if (!div._fullLayout || !window.Plotly || busy.has(div) || !div.clientWidth) return;
    const original = remember(div);
    const narrow = div.clientWidth < NARROW;
    const crowded = narrow || div.dataset.gpulabStacked === "yes" || menuCoversTitle(div);
    if (!crowded) return;
    div.dataset.gpulabStacked = "yes";
    const size = (div._fullLayout.title && div._fullLayout.title.font && div._fullLayout.title.font.size) || 17;
    // a phone joins the title's lines to wrap them again, but keeps a subtitle on lines of its own
    const title = text(div.layout.title).replace(/<br\s*\/?>(?!\s*<sub>)/gi, narrow ? " " : "<br>");
    const lines = wrapped(title, Math.max(16, Math.floor((div.clientWidth - 24) / (size * CHAR))));
    const topAxis = Object.keys(div._fullLayout).some((key) => /^xaxis\d*$/.test(key) && div._fullLayout[key].side === "top");
    const menus = (div.layout.updatemenus || []).length;
    const rows = narrow ? menus : Math.min(menus, 1); // a phone stacks the menus, a wide column puts them in a row
    // The title sits over the plot, with room under it for the menus' rows, in a top margin made to hold both.
    // (plotly draws a title's further lines below its first, so the title hangs from the figure's top edge)
    const top = TITLE_TOP + lines.length * size * LINE + 8 + rows * MENU_ROW + (topAxis ? TOP_AXIS : 0);
    const update = {
      "title.text": lines.join("<br>"), "title.x": 0.5, "title.xanchor": "center", "title.xref": "container",
      "title.yref": "container", "title.y": 1, "title.yanchor": "top",
      "title.pad": {t: TITLE_TOP, r: 0, l: 0, b: 0}, "margin.t": top,
    };
    (div.layout.updatemenus || []).forEach((menu, i) => Object.assign(update, {
      [`updatemenus[${i}].x`]: narrow ? 0 : i / menus, [`updatemenus[${i}].xanchor`]: "left",
      [`updatemenus[${i}].y`]: 1, [`updatemenus[${i}].yanchor`]: "bottom", [`updatemenus[${i}].yref`]: "paper",
      [`updatemenus[${i}].pad`]: {t: 0, r: 0, l: 0, b: 6 + (narrow ? (menus - 1 - i) * MENU_ROW : 0)},
    }));
    let height = original.height || 440;
    if (narrow) {
      const entries = div.data.filter((t) => t.showlegend !== false && t.name).length;
      Object.assign(update, {
        "legend.orientation": "h", "legend.x": 0, "legend.xanchor": "left",
        "legend.y": -0.2, "legend.yanchor": "top", "legend.yref": "paper",
      });
      height += Math.max(0, top - (original.margin.t || 60)) + 24 * Math.ceil(Math.min(entries, 12) / 2);
    }
    update.height = height;
    setHeight(div, height);
    // plotly places a title of several lines only roughly: measure, and lift it clear of the menus if need be
    const lift = (tries) => {
      const overlap = menuOverlap(div);
      if (!overlap || !tries) return null;
      return relayout(div, {"margin.t": div.layout.margin.t + overlap + 6}).then(() => lift(tries - 1));
    };
    // a legend moved under the plot goes below the x axis's title too (plotly puts it a share of the plot's
    // height down, which on a short plot is where that title is)
    const lower = () => {
      const legend = div.querySelector(".legend"), axis = div.querySelector(".g-xtitle");
      if (!narrow || !legend || !axis || !div._fullLayout._size) return null;
      const overlap = axis.getBoundingClientRect().bottom + 6 - legend.getBoundingClientRect().top;
      if (overlap <= 0) return null;
      return relayout(div, {"legend.y": div.layout.legend.y - overlap / div._fullLayout._size.h});
    };
    relayout(div, update).then(() => lift(3)).then(lower);
  }

  function restore(div) {
    const original = own.get(div);
    if (!original || div.dataset.gpulabStacked !== "yes" || div.clientWidth < NARROW) return;
    div.dataset.gpulabStacked = "";
    setHeight(div, original.height);
    relayout(div, {title: {...original.title, text: text(div.layout.title)}, margin: original.margin,
                   legend: original.legend, height: original.height, updatemenus: original.updatemenus})
      .then(() => fit(div));
  }

  function watch(div) {
    if (div.dataset.gpulabFit) return;
    div.dataset.gpulabFit = "on";
    // a menu that picks a GPU's run sets that run's title: wrap it as well
    div.on("plotly_update", () => fit(div));
    // so does a slider's step that sets its own title (an animation frame)
    div.on("plotly_animated", () => fit(div));
    div.on("plotly_relayout", () => { if (!busy.has(div)) fit(div); });
    fit(div);
  }

  function watchAll(root) {
    root.querySelectorAll(".js-plotly-plot").forEach((div) => (div._fullLayout ? watch(div) : null));
  }

  let pending = null;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    pending = setTimeout(() => document.querySelectorAll(".js-plotly-plot").forEach((div) => {
      if (div.clientWidth >= NARROW) restore(div); else fit(div);
    }), 200);
  });
  // figures are drawn after the page's load, some (a saved widget's Output) much later
  let queued = false;
  new MutationObserver(() => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; watchAll(document); });
  }).observe(document.documentElement, {childList: true, subtree: true});
  window.addEventListener("load", () => watchAll(document));
})();
