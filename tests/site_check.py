"""Checks of the built course site in a real, offline headless Chromium.

Used by ``tests/test_site.py``. The site is served from a local ``http.server`` thread; the
browser may reach that server and nothing else: every other request is aborted and
recorded. ``check_page`` loads one page, waits for MathJax, moves each widget's controls, and
returns a :class:`PageReport` whose ``failures()`` lists every problem found, each naming
the page (and the formula, link, image or widget concerned). ``check_layout_pages`` loads
pages again in a narrow window (a phone, 400 px) for the layout checks only. The layout
checks, at both widths: the page is no wider than the window, no formula is cut, no inline
formula scrolls in a box of its own unless it cannot fit its line (never at 1280 px, where
the test's browser draws scroll bars as Windows does), display formulas and code show all of
themselves at 1280 px and fade out the side that goes on where they scroll on a phone, every
figure (a widget's too) is whole, in no box that scrolls or cuts it, every table fits its
column, SVG text (figures) is at least 12 px at 1280 px and 11 px at 400 px.
``check_search`` runs a query on the search page and looks for raw TeX in the results.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "site_screenshots"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
TIMEOUT_MS = 20_000
WIDE, NARROW = 1280, 400  # px: a laptop and a phone (the theme's layout switches at 960)
# The smallest figure text (SVG) per window width: 12 px on a laptop, 11 px on a phone (body
# text is 16 px). Issue 35 found 9.0 to 9.7 px on a phone and 9.07 px at 1280 px.
MIN_SVG_TEXT_PX = {WIDE: 12.0, NARROW: 11.0}


def min_svg_text_px(width: int) -> float:
    return MIN_SVG_TEXT_PX[WIDE] if width >= WIDE else MIN_SVG_TEXT_PX[NARROW]

SOLUTION_SHOW, SOLUTION_HIDE = "Solution", "Hide the solution"  # tools/course_site.py
# Pages Sphinx writes besides the toc's: the general index and the search page.
GENERATED_PAGES = ["genindex", "search"]
SUMMARY_KEY = pytest.StashKey[list]()  # lines tests/conftest.py prints after the run


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def cjk_font_installed() -> bool:
    """Whether fontconfig (which Chromium uses on Linux) knows a font for Chinese."""
    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return False
    found = subprocess.run([fc_list, ":lang=zh", "family"], capture_output=True, text=True,
                           check=False)
    return bool(found.stdout.strip())


# ----------------------------------------------------------------------------- the toc


def toc_files(root: Path = ROOT) -> list[str]:
    """Every document of ``_toc.yml`` (root first, then in reading order), without suffix."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    found = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [f.removesuffix(".md").removesuffix(".ipynb") for f in found]


def notebook_source(doc: str, root: Path = ROOT) -> Path | None:
    path = root / f"{doc}.ipynb"
    return path if path.is_file() else None


def saved_widget_views(notebook: Path) -> int:
    """Widgets the notebook's outputs hold with their figures drawn ahead (what the page
    must show: ``viz.interactive_plot``'s HTML, which the site prefers to the widget view)."""
    nb = json.loads(notebook.read_text())
    count = 0
    for cell in nb["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] != "code" or tags & {"remove-output", "remove-cell"}:
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            count += WIDGET_VIEW in data and 'class="course-widget"' in "".join(
                data.get("text/html", ""))
    return count


# ----------------------------------------------------------------------- server, browser


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port) in a thread; yield the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, cache: dict[str, tuple[int, str]]) -> tuple[int, str]:
    """Status and (for HTML) text of a local URL, fetched outside the browser, no proxy."""
    if url not in cache:
        try:
            with _OPENER.open(url, timeout=10) as response:
                body = response.read()
                kind = response.headers.get("Content-Type", "")
                text = body.decode("utf-8", "replace") if "html" in kind else ""
                cache[url] = (response.status, text)
        except urllib.error.HTTPError as err:
            cache[url] = (err.code, "")
    return cache[url]


class _ResourceParser(html.parser.HTMLParser):
    """Collects the URLs a page makes the browser load by itself (scripts, styles, images)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        rel = set(a.get("rel", "").lower().split())
        if tag in {"script", "img", "iframe"} and a.get("src"):
            self.urls.append(a["src"])
        elif tag == "link" and rel & {"stylesheet", "preload", "modulepreload", "icon"}:
            self.urls.append(a.get("href", ""))


def page_resources(page_file: Path) -> list[str]:
    """Scripts, stylesheets and images that a built page makes the browser load."""
    parser = _ResourceParser()
    parser.feed(page_file.read_text(encoding="utf-8"))
    return parser.urls


def remote_resources(page_file: Path) -> list[str]:
    """Scripts, stylesheets and images that a built page loads from another host."""
    return [u for u in page_resources(page_file)
            if re.match(r"(?i)^(?:[a-z][a-z0-9+.-]*:)?//", u)]


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ------------------------------------------------------------------------- the report


@dataclass
class PageReport:
    page: str
    status: int | None = None
    title: str = ""
    heading: str = ""
    failed_requests: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    broken_links: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    figure_problems: list[str] = field(default_factory=list)
    links_checked: int = 0
    images_checked: int = 0
    formulas: int = 0
    math_errors: list[str] = field(default_factory=list)
    widgets: int = 0
    widget_errors: list[str] = field(default_factory=list)
    chapter: bool = False
    output_cells: int = 0
    output_images: int = 0
    # layout, per window width: the page's width, cut formulas, small SVG text
    page_widths: dict[int, int] = field(default_factory=dict)
    overflow: list[str] = field(default_factory=list)
    cut_formulas: list[str] = field(default_factory=list)
    # boxes that scroll sideways, per window width: inline formulas, display formulas, code
    scrolling: dict[int, dict[str, int]] = field(default_factory=dict)
    scrollbar_px: dict[int, int] = field(default_factory=dict)  # 0: the browser hides them
    formula_scrollbars: list[str] = field(default_factory=list)
    display_hidden_px: dict[int, int] = field(default_factory=dict)
    code_problems: list[str] = field(default_factory=list)
    # figures, a widget's too, per window width: how many were measured and cut (issue 44)
    figures_measured: dict[int, int] = field(default_factory=dict)
    figures_clipped: dict[int, int] = field(default_factory=dict)
    figure_layout: list[str] = field(default_factory=list)
    tables_measured: int = 0
    wide_tables: list[str] = field(default_factory=list)
    svg_texts: int = 0
    smallest_svg_text_px: float | None = None
    small_svg_text: list[str] = field(default_factory=list)
    # text: raw TeX in the prose; Chinese glyphs drawn as missing-glyph boxes (kept out of
    # failures(): without a CJK font the test skips outside CI, see tests/test_site.py)
    raw_tex: list[str] = field(default_factory=list)
    cjk_chars: int = 0
    cjk_missing: list[str] = field(default_factory=list)
    # exercise solutions: one toggle titled "Solution" hiding what the tags hide
    solutions: int = 0
    solution_problems: list[str] = field(default_factory=list)
    layout_only: bool = False  # check_layout_pages: only the layout was checked
    book_pdf_link: str | None = None  # the download menu's "whole book .pdf" (make pdf)
    other: list[str] = field(default_factory=list)

    def failures(self) -> list[str]:
        out = [f"{self.page}: {msg}" for msg in self.other]
        if self.status != 200:
            out.append(f"{self.page}: HTTP status {self.status}")
        if not self.layout_only and (not self.title or not self.heading):
            out.append(f"{self.page}: no rendered title (title={self.title!r}, "
                       f"h1={self.heading!r})")
        for kind, items in [
            ("failed request", self.failed_requests),
            ("request to another host (aborted)", self.external_requests),
            ("console error", self.console_errors),
            ("broken internal link", self.broken_links),
            ("broken image", self.broken_images),
            ("figure", self.figure_problems),
            ("math", self.math_errors),
            ("widget", self.widget_errors),
            ("page wider than the window", self.overflow),
            ("formula cut off", self.cut_formulas),
            ("formula scrolls", self.formula_scrollbars),
            ("code", self.code_problems),
            ("figure or widget box", self.figure_layout),
            ("table wider than its column", self.wide_tables),
            ("SVG text too small", self.small_svg_text),
            ("raw TeX in the text", self.raw_tex),
            ("exercise solution", self.solution_problems),
        ]:
            out += [f"{self.page}: {kind}: {item}" for item in items]
        if self.chapter and self.output_cells == 0:
            out.append(f"{self.page}: chapter page shows no code outputs")
        if self.chapter and self.output_images == 0:
            out.append(f"{self.page}: chapter page shows no figure image")
        if self.chapter and self.solutions == 0:
            out.append(f"{self.page}: chapter page shows no exercise solution")
        return out


# ------------------------------------------------------------------- in-page JavaScript

_WAIT_MATHJAX = """() => !document.querySelector('.math') ||
    !!(window.MathJax && MathJax.startup && MathJax.startup.promise && MathJax.startup.document)"""

# Each MathJax item: its TeX source, any error node, and undefined macros (the noundefined
# package draws those in red instead of raising an error). Then the Sphinx math elements
# left untypeset, and raw TeX delimiters left anywhere in the visible prose.
_CHECK_MATH = r"""async () => {
  const out = {formulas: 0, errors: [], untypeset: [], raw: []};
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
    for (const item of MathJax.startup.document.math) {
      out.formulas += 1;
      const tex = String(item.math).trim();
      const root = item.typesetRoot;
      const err = root && root.querySelector('mjx-merror');
      if (err) {
        out.errors.push({tex, message: err.getAttribute('data-mjx-error') || err.textContent});
        continue;
      }
      const mml = MathJax.startup.toMML ? MathJax.startup.toMML(item.root) : '';
      const undef = mml.match(/<mtext[^>]*mathcolor="red"[^>]*>(\\[A-Za-z]+)/);
      if (undef) out.errors.push({tex, message: 'undefined control sequence ' + undef[1]});
    }
  }
  const attributed = out.errors.length;
  const stray = document.querySelectorAll('mjx-merror').length;
  if (stray > attributed) {
    const message = (stray - attributed) + ' MathJax error node(s) not tied to a formula';
    out.errors.push({tex: '?', message});
  }
  for (const el of document.querySelectorAll('.math')) {
    if (!el.querySelector('mjx-container')) out.untypeset.push(el.textContent.trim().slice(0, 200));
  }
  const skip = 'pre, code, script, style, textarea, mjx-container, .highlight, .math';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.nodeValue;
    const at = text.search(/\\\(|\\\[|\$\$/);
    if (at >= 0 && !node.parentElement.closest(skip)) {
      out.raw.push(text.slice(Math.max(0, at - 40), at + 80).trim());
    }
  }
  return out;
}"""

# Each chapter's widget as the site shows it (src/course_attn/lab/site_frames.py): its own
# controls over figures drawn ahead. Per widget: its controls, the one figure shown and its
# alt text, a static figure (an output image outside every widget) after it; then each
# control is moved to another value, as a reader would, and the figure shown must change
# (and move back).
_CHECK_WIDGETS = """() => {
  const shownFrames = box => Array.from(box.querySelectorAll('img.course-widget-frame'))
      .filter(img => !img.hidden && img.getBoundingClientRect().width > 0);
  const fallbacks = Array.from(document.querySelectorAll('.cell_output img'))
      .filter(img => !img.closest('.course-widget'));
  const move = (control, back) => {
    if (control.type === 'checkbox') control.checked = !control.checked;
    else if (control.tagName === 'SELECT') {
      const n = control.options.length;
      control.selectedIndex = (control.selectedIndex + (back ? n - 1 : 1)) % n;
    } else {
      const n = Number(control.max) + 1;
      control.value = String((Number(control.value) + (back ? n - 1 : 1)) % n);
    }
    control.dispatchEvent(new Event('input', {bubbles: true}));
    control.dispatchEvent(new Event('change', {bubbles: true}));
  };
  return Array.from(document.querySelectorAll('div.course-widget')).map((box, index) => {
    const controls = Array.from(box.querySelectorAll('[data-control]'));
    const first = shownFrames(box);
    const moves = controls.map(control => {
      const label = (control.closest('label') || control).textContent.trim().split(/\\s+/)[0];
      const before = shownFrames(box).map(img => img.src);
      move(control, false);
      const after = shownFrames(box).map(img => img.src);
      move(control, true);
      const back = shownFrames(box).map(img => img.src);
      return {label, shown: after.length, changed: after.length === 1 && after[0] !== before[0],
              restored: back.join() === before.join()};
    });
    const after = fallbacks.filter(img =>
        box.compareDocumentPosition(img) & Node.DOCUMENT_POSITION_FOLLOWING);
    return {index, controls: controls.length, frames: box.querySelectorAll('img').length,
            shown: first.length, alt: first.length ? first[0].alt : '', moves,
            fallbacks_after: after.length, fallbacks_total: fallbacks.length,
            views: box.closest('.cell_output').querySelectorAll(
                'script[type="application/vnd.jupyter.widget-view+json"]').length};
  });
}"""

_COLLECT = """() => {
  document.querySelectorAll('img[loading="lazy"]').forEach(img => { img.loading = 'eager'; });
  const h1 = Array.from(document.querySelectorAll('article h1, main h1'))
      .find(el => el.getBoundingClientRect().height > 0);
  let heading = '';
  if (h1) {
    const copy = h1.cloneNode(true);
    copy.querySelectorAll('.headerlink').forEach(a => a.remove());
    heading = copy.textContent.trim();
  }
  return {
    title: document.title.trim(),
    heading,
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    outputs: Array.from(document.querySelectorAll('.cell_output'))
        .filter(o => o.textContent.trim() || o.querySelector('img, svg, .widget-subarea')).length,
    output_images: document.querySelectorAll('.cell_output img').length,
    icon: (document.querySelector('link[rel~="icon"]') || {}).href || null,
    // Font Awesome icons the icon script did not draw (it turns each <i> into an <svg>)
    undrawn_icons: Array.from(document.querySelectorAll('i[class*="fa-"], span[class*="fa-"]'))
        .map(i => i.className),
    book_pdf: (document.querySelector('a.course-book-pdf') || {}).href || null,
  };
}"""

# Every image: its URL, whether it decoded, where it is. A widget's figure not shown yet has
# no src, only the data-src course.js loads it from (tools/course_site.py): not loaded is not
# broken (ok: null), but its file must be there (checked over HTTP).
_IMAGES = """() => Array.from(document.images).map(img => {
  const waiting = !img.getAttribute('src') && img.dataset.src;
  return {
    src: waiting ? new URL(img.dataset.src, location.href).href : img.currentSrc || img.src,
    ok: waiting ? null : img.complete && img.naturalWidth > 0,
    output: !!img.closest('.cell_output'), alt: img.getAttribute('alt') || '',
    linked: !!img.closest('a.course-figure-link'),
    widget: !!img.closest('.course-widget')};
})"""


# Layout at the current window width, after MathJax and the web fonts, with every <details>
# opened (a folded solution is part of the page too):
# - the document may not be wider than the window; if it is, the innermost elements that
#   stick out (and are not inside a box that clips or scrolls them) are named;
# - a formula is cut when its MathJax content reaches past a box that clips it (overflow
#   hidden) without a scroll box in between; a scroll box must itself fit the clipping boxes
#   around it, and the last clipping box is the window (formulas in hidden or fixed-position
#   boxes, such as the theme's closed sidebar drawers on a phone, are left out);
# - SVG text (inline <svg>, and <img> of an .svg file, redrawn off-screen at the image's
#   size): the rendered font size of each <text> (computed size x the scale of its screen
#   transform), and matplotlib's text drawn as paths (svg.fonttype "path": a group
#   "text_N" scaled by fontsize / 100, matplotlib.textpath.FONT_SCALE). PNG text cannot be
#   measured.
_LAYOUT = r"""async ([minPx, wide]) => {
  if (document.fonts) await document.fonts.ready;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  // course.js sizes formulas, tables and figures; again now that every fold is open
  if (window.courseSite) await window.courseSite.fit();
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const root = document.documentElement, vw = root.clientWidth;
  const out = {width: root.scrollWidth, viewport: vw, widest: [], cut: [], texts: [], images: 0};
  const describe = el => {
    const cls = (el.getAttribute('class') || '').trim().split(/\s+/).slice(0, 2).join('.');
    const text = (el.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 60);
    return el.tagName.toLowerCase() + (cls ? '.' + cls : '') + (text ? ` "${text}"` : '');
  };
  const clipsX = el => getComputedStyle(el).overflowX !== 'visible';
  const texOf = new Map();
  if (window.MathJax && MathJax.startup && MathJax.startup.document) {
    for (const item of MathJax.startup.document.math) {
      texOf.set(item.typesetRoot, String(item.math));
    }
  }
  const offCanvas = el => {  // in a fixed drawer (the theme's sidebars on a phone)
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).position === 'fixed') return true;
    }
    return false;
  };
  const scrollsX = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  if (root.scrollWidth > vw) {
    const sticking = [];
    for (const el of document.body.querySelectorAll('*')) {
      const r = el.getBoundingClientRect();
      if (r.width === 0 || r.right <= vw + 1) continue;
      let hidden = getComputedStyle(el).visibility === 'hidden';
      for (let p = el.parentElement; p && p !== document.body && !hidden; p = p.parentElement) {
        const s = getComputedStyle(p);
        if (s.position === 'fixed') hidden = true;
        else if (clipsX(p) && p.getBoundingClientRect().right <= vw + 1) hidden = true;
      }
      if (!hidden) sticking.push(el);
      if (sticking.length > 400) break;
    }
    const leaves = sticking.filter(el => !sticking.some(o => o !== el && el.contains(o)));
    const right = el => Math.round(el.getBoundingClientRect().right);
    out.widest = leaves.sort((a, b) => right(b) - right(a)).slice(0, 3)
        .map(el => `${describe(el)} reaches ${right(el)} px`);
  }
  for (const box of document.querySelectorAll('mjx-container')) {
    const content = box.querySelector('mjx-math') || box;
    let r = content.getBoundingClientRect();
    const hidden = !box.checkVisibility({visibilityProperty: true}) || offCanvas(box);
    if (r.width === 0 || hidden) continue;
    let cut = null;
    for (let el = box; el && el !== root && !cut; el = el.parentElement) {
      if (!clipsX(el)) continue;
      const b = el.getBoundingClientRect();
      const inside = r.left >= b.left - 1 && r.right <= b.right + 1;
      if (scrollsX(el)) r = b;  // what does not fit scrolls; the box itself must fit
      else if (!inside) {
        cut = `${Math.round(r.width)} px of formula in a ${Math.round(b.width)} px box ` +
              `that clips it (${describe(el).split(' ')[0]})`;
      }
    }
    if (!cut && (r.right > vw + 1 || r.left < -1)) {
      cut = `reaches past the window (${Math.round(r.left)} to ${Math.round(r.right)} px of ${vw})`;
    }
    if (cut) {
      const tex = texOf.get(box) || box.textContent;
      out.cut.push(`${cut}: ${tex.replace(/\s+/g, ' ').trim().slice(0, 80)}`);
    }
  }
  // Boxes that scroll sideways (overflow-x auto or scroll, content wider than the box): in a
  // browser that shows scroll bars each one draws a bar. An inline formula may scroll only
  // where it cannot fit its line (course.js marks it course-wide), never at 1280 px; a
  // display formula and a code block must show all of themselves at 1280 px and, where they
  // scroll on a phone, mark the side that goes on (course-more-right: course.css fades it).
  const lineWidth = el => {  // the content box of the first block around el
    for (let p = el.parentElement; p; p = p.parentElement) {
      const s = getComputedStyle(p);
      if (!s.display.startsWith('inline') && s.display !== 'contents') {
        return p.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
      }
    }
    return Infinity;
  };
  const px = v => Math.round(v);
  const bar = el => {  // the height a horizontal scroll bar takes from the box
    const s = getComputedStyle(el);
    return el.offsetHeight - el.clientHeight - parseFloat(s.borderTopWidth) -
        parseFloat(s.borderBottomWidth);
  };
  const visible = el => el.checkVisibility({visibilityProperty: true}) && !offCanvas(el);
  out.scroll = {inline: 0, display: 0, code: 0, figure: 0, inline_bad: [], display_bad: [],
                code_bad: []};
  const probe = document.createElement('div');  // does this browser draw scroll bars?
  probe.style.cssText = 'position:absolute; top:0; width:100px; height:50px; overflow:scroll';
  document.body.appendChild(probe);
  out.scroll.bar_px = probe.offsetHeight - probe.clientHeight;
  probe.remove();
  const cue = el => el.scrollLeft > 1 || el.classList.contains('course-more-right');
  // Figures (issue 44): every figure a cell shows, a widget's too, is whole: no part of it
  // past the window or outside a box that clips or scrolls it (code may scroll, figures may
  // not: a reader cannot tell that a figure goes on).
  out.figures = {measured: 0, clipped: 0, bad: []};
  for (const img of document.querySelectorAll('article div.cell_output img')) {
    const r = img.getBoundingClientRect();
    if (r.width === 0 || !visible(img)) continue;
    out.figures.measured += 1;
    const what = (img.closest('.course-widget') ? 'widget figure ' : 'figure ') +
        (img.getAttribute('alt') || (img.currentSrc || img.src).split('/').pop()).slice(0, 50);
    let cut = r.left < -1 || r.right > vw + 1
      ? `reaches past the window (${px(r.left)} to ${px(r.right)} px of ${vw})` : null;
    for (let el = img.parentElement; el && el !== root && !cut; el = el.parentElement) {
      if (!clipsX(el)) continue;
      const b = el.getBoundingClientRect();
      const lost = Math.max(0, b.left - r.left) + Math.max(0, r.right - b.right);
      if (lost > 1) {
        cut = `${px(lost)} px cut by its box (${describe(el).split(' ')[0]}` +
              `${scrollsX(el) ? ', which scrolls' : ''})`;
      }
    }
    if (cut) {
      out.figures.clipped += 1;
      out.figures.bad.push(`${what}: ${cut}`);
    }
  }
  for (const el of document.querySelectorAll('article *')) {
    if (!scrollsX(el) || el.scrollWidth <= el.clientWidth || el.clientWidth === 0) continue;
    if (!visible(el)) continue;
    const hidden = el.scrollWidth - el.clientWidth, name = `${describe(el).slice(0, 70)}`;
    const math = el.closest('span.math, div.math, mjx-container');
    if (math && !el.closest('div.math')) {
      out.scroll.inline += 1;
      const content = el.querySelector('mjx-math') || el;
      const width = content.getBoundingClientRect().width, room = lineWidth(el);
      const tex = (texOf.get(el.querySelector('mjx-container') || el) || el.textContent)
          .replace(/\s+/g, ' ').trim().slice(0, 60);
      if (wide || width <= room + 1) {
        out.scroll.inline_bad.push(`inline formula scrolls (${px(hidden)} px hidden, a ` +
            `${px(bar(el))} px scroll bar; ${px(width)} px of formula, ${px(room)} px of ` +
            `line): ${tex}`);
      } else if (!cue(el)) {
        out.scroll.inline_bad.push(`inline formula wider than its line hides ${px(hidden)} px ` +
            `without a fade (course-more-right): ${tex}`);
      }
    } else if (math) {
      out.scroll.display += 1;
      const tex = (texOf.get(el.closest('mjx-container') || el) || el.textContent)
          .replace(/\s+/g, ' ').trim().slice(0, 60);
      if (wide) {
        out.scroll.display_bad.push(`display formula hides ${px(hidden)} px of ` +
            `${px(el.scrollWidth)} in a ${px(el.clientWidth)} px box: ${tex}`);
      } else if (!cue(el)) {
        out.scroll.display_bad.push(`display formula hides ${px(hidden)} px without a fade ` +
            `(course-more-right): ${tex}`);
      }
      out.scroll.display_hidden = Math.max(out.scroll.display_hidden || 0, hidden);
    } else if (el.querySelector('img')) {  // a figure's box, or a widget's (issue 44)
      out.scroll.figure += 1;
      out.figures.bad.push(`figure box scrolls, hiding ${px(hidden)} px: ${name}`);
    } else if (el.matches('pre')) {
      out.scroll.code += 1;
      if (wide) {
        out.scroll.code_bad.push(`code block cut by ${px(hidden)} px: ${name}`);
      } else if (!cue(el)) {
        out.scroll.code_bad.push(`code block hides ${px(hidden)} px without a fade ` +
            `(course-more-right): ${name}`);
      }
    }
  }
  // Tables: each table of the article fits the box around it (the theme's scroll box).
  out.tables = {measured: 0, wide: []};
  for (const table of document.querySelectorAll('article table')) {
    if (!visible(table) || table.closest('.cell_output .jupyter-widgets')) continue;
    out.tables.measured += 1;
    const width = table.getBoundingClientRect().width, room = table.parentElement.clientWidth;
    if (width > room + 1) {
      const rows = Array.from(table.rows).map(r => r.getBoundingClientRect().height);
      out.tables.wide.push(`table ${px(width)} px wide in a ${px(room)} px column, rows up ` +
          `to ${px(Math.max(...rows))} px tall: ${describe(table).slice(0, 80)}`);
    }
  }
  const scale = m => Math.sqrt(Math.abs(m.a * m.d - m.b * m.c));
  const measure = (svgRoot, where) => {
    for (const t of svgRoot.querySelectorAll('text')) {
      const ctm = t.getScreenCTM(), label = t.textContent.replace(/\s+/g, ' ').trim();
      if (!ctm || !label) continue;
      const px = parseFloat(getComputedStyle(t).fontSize) * scale(ctm);
      out.texts.push({px, where, label: label.slice(0, 40)});
    }
    for (const g of svgRoot.querySelectorAll('g[id^="text_"] > g[transform*="scale("]')) {
      const ctm = g.getScreenCTM();
      if (!ctm) continue;
      let label = '';
      for (const n of g.parentElement.childNodes) {
        if (n.nodeType === Node.COMMENT_NODE) { label = n.textContent.trim(); break; }
      }
      out.texts.push({px: 100 * scale(ctm), where, label: label.slice(0, 40)});
    }
  };
  document.querySelectorAll('svg').forEach((svg, i) => {
    const r = svg.getBoundingClientRect();
    if (r.width > 0 && r.height > 0 && svg.querySelector('text, g[id^="text_"]')) {
      measure(svg, `inline svg ${i + 1}`);
    }
  });
  const shelf = document.createElement('div');
  shelf.style.cssText = 'position:absolute; left:-20000px; top:0; visibility:hidden';
  document.body.appendChild(shelf);
  for (const img of Array.from(document.images)) {
    const url = img.currentSrc || img.src, r = img.getBoundingClientRect();
    if (!/\.svg(?:[?#]|$)|^data:image\/svg/i.test(url) || r.width === 0) continue;
    let svgText = '';
    try { svgText = await (await fetch(url)).text(); } catch (e) { continue; }
    const doc = new DOMParser().parseFromString(svgText, 'image/svg+xml');
    const svg = doc.documentElement;
    if (svg.tagName.toLowerCase() !== 'svg') continue;
    if (!svg.getAttribute('viewBox')) {
      const w = parseFloat(svg.getAttribute('width')), h = parseFloat(svg.getAttribute('height'));
      if (!(w > 0 && h > 0)) continue;  // no size of its own: the image decides, cannot measure
      svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
    }
    svg.setAttribute('width', r.width);
    svg.setAttribute('height', r.height);
    shelf.replaceChildren(document.importNode(svg, true));
    out.images += 1;
    measure(shelf.firstElementChild, url.split('/').pop().slice(0, 40));
  }
  shelf.remove();
  return out;
}"""

# Chinese characters of the page drawn with the page's own font on a canvas (the same font
# fallback as the text): a character is a missing-glyph box ("tofu") when its drawing is
# blank, equals the drawing of an unassigned code point (U+0378), or equals the drawing of
# another Chinese character (real glyphs of different characters never coincide).
_CJK = r"""async () => {
  if (document.fonts) await document.fonts.ready;
  const han = /\p{Script=Han}/u, chars = new Map();
  const main = document.querySelector('main') || document.body;
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement.closest('script, style')) continue;
    for (const c of node.nodeValue) {
      if (han.test(c) && !chars.has(c) && chars.size < 80) {
        const s = getComputedStyle(node.parentElement);
        chars.set(c, `${s.fontStyle} ${s.fontWeight} 32px ${s.fontFamily}`);
      }
    }
  }
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 48;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  const draw = (text, font) => {
    ctx.clearRect(0, 0, 48, 48);
    ctx.font = font;
    ctx.fillStyle = '#000';
    ctx.fillText(text, 4, 38);
    const data = ctx.getImageData(0, 0, 48, 48).data;
    let ink = 0, hash = 0;
    for (let i = 3; i < data.length; i += 4) { ink += data[i]; hash = (hash * 31 + data[i]) | 0; }
    return ink === 0 ? 'blank' : `${hash}:${ink}`;
  };
  const drawings = new Map(), tofu = new Map(), missing = [];
  for (const [c, font] of chars) {
    if (!tofu.has(font)) tofu.set(font, draw('\u0378', font));
    const d = draw(c, font);
    if (d === 'blank' || d === tofu.get(font)) missing.push(c);
    drawings.set(d, [...(drawings.get(d) || []), c]);
  }
  for (const same of drawings.values()) {
    if (same.length > 1) missing.push(...same.filter(c => !missing.includes(c)));
  }
  return {checked: chars.size, missing};
}"""

# Raw TeX left in the visible text outside code and formulas: a control sequence (\\sqrt,
# \\"o, \\&), a $...$ pair, or {\\ (a BibTeX accent). "--" is typography, not raw TeX.
_RAW_TEX_RE = r"""/\\[A-Za-z]+|\\[&%$#_{}"'`^~]|\$[^$\s][^$]*\$|\{\\/"""
_RAW_TEX = r"""() => {
  const RAW = """ + _RAW_TEX_RE + r""", out = [];
  const skip = 'pre, code, kbd, samp, script, style, textarea, mjx-container, .math, .highlight';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const m = node.nodeValue.match(RAW);
    const parent = node.parentElement;
    if (!m || parent.closest(skip) || !parent.getClientRects().length) continue;
    const at = m.index, text = node.nodeValue;
    out.push(text.slice(Math.max(0, at - 40), at + 40).replace(/\s+/g, ' ').trim());
  }
  return out;
}"""

# Every exercise solution (a cell tagged hide-input or hide-cell) has one toggle that reads
# "Solution", closed on arrival, hiding the code, and the output too where the cell is also
# tagged hide-output (or hide-cell); a click shows them and the toggle reads "Hide the
# solution"; a second click folds it again.
_SOLUTIONS = r"""([show, hide]) => {
  const out = {solutions: 0, problems: []};
  // a closed <details> keeps its content laid out (content-visibility: hidden), so rects
  // alone do not tell; checkVisibility() does
  const shown = el => !!el && el.checkVisibility() && el.getBoundingClientRect().height > 0;
  const say = JSON.stringify;
  const cells = document.querySelectorAll('div.cell.tag_hide-input, div.cell.tag_hide-cell');
  cells.forEach((cell, i) => {
    out.solutions += 1;
    const name = `solution ${i + 1} of ${cells.length}`;
    const folds = cell.querySelectorAll(':scope > details');
    if (folds.length !== 1) out.problems.push(`${name}: ${folds.length} toggles, expected one`);
    if (!folds.length) return;
    const fold = folds[0], summary = fold.querySelector(':scope > summary');
    const hidesOutput = cell.matches('.tag_hide-output, .tag_hide-cell');
    const code = cell.querySelector('.cell_input'), output = cell.querySelector('.cell_output');
    const label = summary ? summary.innerText.trim() : '';
    if (label !== show) out.problems.push(`${name}: the toggle reads ${say(label)}, not ${show}`);
    if (fold.open || shown(code)) out.problems.push(`${name}: the code shows before a click`);
    if (hidesOutput && shown(output)) {
      out.problems.push(`${name}: the output (the answer) shows before a click`);
    }
    if (!summary) return;
    summary.click();
    if (!shown(code)) out.problems.push(`${name}: a click does not show the code`);
    if (hidesOutput && output && !shown(output)) {
      out.problems.push(`${name}: a click does not show the output`);
    }
    const open = summary.innerText.trim();
    if (open !== hide) out.problems.push(`${name}: open, it reads ${say(open)}, not ${hide}`);
    summary.click();
    if (fold.open) out.problems.push(`${name}: a second click does not fold it again`);
  });
  return out;
}"""

# The search page once every result has its snippet; then the text of each result (title
# and snippet) and the titles Search will list from searchindex.js.
_SEARCH_DONE = """() => {
  const status = document.querySelector('#search-results .search-summary');
  const items = Array.from(document.querySelectorAll('#search-results ul.search > li'));
  return !!status && status.textContent.trim() !== '' &&
      items.every(li => li.querySelector('p.context, span'));
}"""
_SEARCH_RESULTS = r"""() => {
  const RAW = """ + _RAW_TEX_RE + r""";
  const items = Array.from(document.querySelectorAll('#search-results ul.search > li'));
  const index = (typeof Search !== 'undefined' && Search._index) || {};
  const titles = [...(index.titles || []), ...Object.keys(index.alltitles || {}),
                  ...Object.keys(index.indexentries || {})];
  const top = items.slice(0, 5).map(li => {
    const link = li.querySelector('a'), context = li.querySelector('p.context');
    const href = link ? link.getAttribute('href') : '';
    return {page: href.split('#')[0].replace(/\.html$/, ''), anchor: href.split('#')[1] || '',
            title: link ? link.textContent.trim() : '',
            snippet: context ? context.textContent.replace(/\s+/g, ' ').trim() : ''};
  });
  return {results: items.length, snippets: items.filter(li => li.querySelector('p.context')).length,
          raw: items.map(li => li.innerText.replace(/\s+/g, ' ').trim()).filter(t => RAW.test(t)),
          raw_titles: titles.filter(t => RAW.test(t)), top};
}"""


def _check_figure(src: str, image: dict, report: PageReport) -> None:
    """A figure a cell printed: it opens at full size on click (tools/course_site.py)."""
    name = src.rsplit("/", 1)[-1][:16]
    if not image["linked"]:
        report.figure_problems.append(f"{name}... does not open at full size on click")


def _check_layout(page, report: PageReport, width: int) -> None:
    """Page width, cut formulas and SVG text size at the window's current ``width``."""
    least = min_svg_text_px(width)
    result = page.evaluate(_LAYOUT, [least, width >= WIDE])
    at = f"at {width} px"
    report.page_widths[width] = result["width"]
    if result["width"] > result["viewport"]:
        report.overflow.append(f"{at} the page is {result['width']} px wide: "
                               + "; ".join(result["widest"]))
    report.cut_formulas += [f"{at}: {cut}" for cut in result["cut"]]
    scroll = result["scroll"]
    report.scrolling[width] = {kind: scroll[kind]
                               for kind in ("inline", "display", "code", "figure")}
    report.display_hidden_px[width] = scroll.get("display_hidden", 0)
    report.scrollbar_px[width] = scroll["bar_px"]
    report.formula_scrollbars += [f"{at}: {msg}" for msg in scroll["inline_bad"]]
    report.cut_formulas += [f"{at}: {msg}" for msg in scroll["display_bad"]]
    report.code_problems += [f"{at}: {msg}" for msg in scroll["code_bad"]]
    figures = result["figures"]
    report.figures_measured[width] = figures["measured"]
    report.figures_clipped[width] = figures["clipped"]
    report.figure_layout += [f"{at}: {msg}" for msg in figures["bad"]]
    report.tables_measured += result["tables"]["measured"]
    report.wide_tables += [f"{at}: {msg}" for msg in result["tables"]["wide"]]
    texts = result["texts"]
    report.svg_texts += len(texts)
    if texts:
        smallest = min(text["px"] for text in texts)
        previous = report.smallest_svg_text_px
        report.smallest_svg_text_px = smallest if previous is None else min(previous, smallest)
    report.small_svg_text += [f"{at}: {text['where']}: {text['label']!r} is "
                              f"{text['px']:.1f} px (under {least:g})" for text in texts
                              if text["px"] < least]


def _check_text(page, report: PageReport) -> None:
    report.raw_tex += page.evaluate(_RAW_TEX)
    cjk = page.evaluate(_CJK)
    report.cjk_chars = cjk["checked"]
    report.cjk_missing = cjk["missing"]


def _check_solutions(page, report: PageReport) -> None:
    result = page.evaluate(_SOLUTIONS, [SOLUTION_SHOW, SOLUTION_HIDE])
    report.solutions = result["solutions"]
    report.solution_problems += result["problems"]


def _settle(page) -> None:
    """MathJax has typeset, web fonts and images have loaded."""
    page.wait_for_function(_WAIT_MATHJAX, timeout=TIMEOUT_MS)
    page.evaluate("""async () => {
      const mj = window.MathJax;
      if (mj && mj.startup && mj.startup.promise) await mj.startup.promise;
      if (document.fonts) await document.fonts.ready;
    }""")
    page.evaluate(_COLLECT)  # lazy images load now
    page.wait_for_function("() => Array.from(document.images).every(i => i.complete)",
                           timeout=TIMEOUT_MS)


def check_layout_pages(context, base_url: str, page_paths: list[str], width: int,
                       parallel: int = 2) -> dict[str, PageReport]:
    """Load each page in ``context`` (whose window is ``width`` px wide) for the layout
    checks only (everything else about a page does not depend on the window), ``parallel``
    pages loading at a time: a page spends most of its load in its own renderer process."""
    reports: dict[str, PageReport] = {}
    waiting, loading = list(page_paths), []

    def start(path: str) -> tuple:
        report = PageReport(page=path, layout_only=True)
        page = context.new_page()
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base_url)
                   else r.abort())
        try:
            response = page.goto(base_url + path, wait_until="commit", timeout=TIMEOUT_MS)
            report.status = response.status if response else None
        except Exception as err:
            report.other.append(f"{type(err).__name__}: {str(err).splitlines()[0]}")
        return page, report

    while waiting or loading:
        while waiting and len(loading) < parallel:
            loading.append(start(waiting.pop(0)))
        page, report = loading.pop(0)
        try:
            if not report.other:
                page.wait_for_load_state("load", timeout=TIMEOUT_MS)
                _settle(page)
                _check_layout(page, report, width)
        except Exception as err:
            report.other.append(f"{type(err).__name__}: {str(err).splitlines()[0]}")
        finally:
            page.close()
        reports[report.page] = report
    return reports


_DRAWER_STATE = """() => {
  const open = id => !!(document.getElementById(id) || {}).open;
  const header = document.querySelector('.bd-header-article');  // the book theme's bar
  const bar = header ? header.getBoundingClientRect() : {top: 0, bottom: 56};
  const tips = Array.from(document.querySelectorAll('.tooltip')).filter(t => {
    const r = t.getBoundingClientRect();
    return r.width > 0 && r.top < bar.bottom && r.bottom > bar.top;
  }).map(t => t.textContent.trim());
  return {primary: open('pst-primary-sidebar-modal'),
          secondary: open('pst-secondary-sidebar-modal'), tips, y: window.scrollY};
}"""


def check_drawer(context, base_url: str, page_path: str) -> list[str]:
    """On a phone (``context``: a narrow window with touch), tap the toggle of the page's
    contents drawer, then one of its sections: the drawer must open without a tooltip over
    the header, and close after the tap on the section, the page scrolled to it. Returns
    the problems found."""
    problems: list[str] = []
    page = context.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base_url)
               else r.abort())
    try:
        page.goto(base_url + page_path, wait_until="load", timeout=TIMEOUT_MS)
        _settle(page)
        page.tap("button.secondary-toggle", timeout=TIMEOUT_MS)
        page.wait_for_timeout(700)  # Bootstrap shows a tooltip after 500 ms
        state = page.evaluate(_DRAWER_STATE)
        if not state["secondary"]:
            problems.append("a tap on the contents toggle does not open the contents drawer")
        if state["tips"]:
            problems.append(f"a tooltip covers the header after the tap: {state['tips']}")
        links = page.locator("#pst-secondary-sidebar-modal a[href^='#']")
        if links.count() < 3:
            problems.append(f"the contents drawer lists {links.count()} sections")
            return problems
        links.nth(2).tap(timeout=TIMEOUT_MS)
        page.wait_for_timeout(500)
        after = page.evaluate(_DRAWER_STATE)
        if after["secondary"]:
            problems.append("the contents drawer stays open after a tap on a section")
        if after["y"] <= state["y"]:
            problems.append("a tap on a section does not scroll the page to it")
    except Exception as err:
        problems.append(f"{type(err).__name__}: {str(err).splitlines()[0]}")
    finally:
        page.close()
    return problems


def check_search(context, base_url: str, query: str) -> dict:
    """Search the site for ``query``: how many results and snippets, those (and the titles
    of the search index) that show raw TeX, and the first five results (page, anchor, title,
    snippet) in the order shown."""
    page = context.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base_url)
               else r.abort())
    try:
        page.goto(f"{base_url}search.html?q={urllib.parse.quote(query)}", wait_until="load",
                  timeout=TIMEOUT_MS)
        page.wait_for_function(_SEARCH_DONE, timeout=TIMEOUT_MS)
        return page.evaluate(_SEARCH_RESULTS)
    finally:
        page.close()


def _ids_in(html: str) -> set[str]:
    return set(re.findall(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""", html))


def check_page(context, base_url: str, page_path: str, *, chapter: bool = False,
               screenshot: Path | None = None, redirect_to: str | None = None,
               cache: dict[str, tuple[int, str]] | None = None) -> PageReport:
    """Load ``base_url + page_path`` in a new tab of ``context`` and check everything.

    ``redirect_to``: the page ``page_path`` must forward to (checked there).
    ``cache`` holds local URLs already fetched (share it between pages of one server).
    """
    report = PageReport(page=page_path, chapter=chapter)
    cache = {} if cache is None else cache
    page = context.new_page()

    def route(route_obj) -> None:
        url = route_obj.request.url
        if url.startswith(base_url):
            route_obj.continue_()
        else:
            report.external_requests.append(url)
            route_obj.abort()

    page.route("**/*", route)
    pending: set = set()  # requests in flight (playwright Request objects)
    page.on("request", lambda r: pending.add(r))
    page.on("requestfinished", lambda r: pending.discard(r))
    page.on("requestfailed", lambda r: pending.discard(r))
    page.on("requestfailed", lambda r: report.failed_requests.append(
        f"{r.url} ({r.failure})") if r.url.startswith(base_url) else None)
    page.on("response", lambda r: report.failed_requests.append(f"{r.url} (HTTP {r.status})")
            if r.status >= 400 else None)
    page.on("console", lambda m: report.console_errors.append(m.text)
            if m.type == "error" else None)
    page.on("pageerror", lambda e: report.console_errors.append(f"uncaught: {e}"))
    try:
        response = page.goto(base_url + page_path, wait_until="load", timeout=TIMEOUT_MS)
        report.status = response.status if response else None
        if redirect_to is not None:
            page.wait_for_url(base_url + redirect_to, timeout=TIMEOUT_MS)
            page.wait_for_load_state("load", timeout=TIMEOUT_MS)
        _check_math(page, report)
        _check_widgets(page, report)
        info = page.evaluate(_COLLECT)
        report.title, report.heading = info["title"], info["heading"]
        report.output_cells, report.output_images = info["outputs"], info["output_images"]
        page.wait_for_function("() => Array.from(document.images).every(i => i.complete)",
                               timeout=TIMEOUT_MS)
        for image in page.evaluate(_IMAGES):
            report.images_checked += 1
            src = image["src"]
            status = http_get(src, cache)[0] if src.startswith(base_url) else None
            if image["ok"] is False or status not in (None, 200) or not src:
                report.broken_images.append(f"{src} (HTTP {status}, decoded={image['ok']})")
            if image["output"] and not image["widget"]:  # a widget's figures stay unlinked
                _check_figure(src, image, report)
        _check_links(info["links"], base_url, report, cache)
        _check_icon(info["icon"], base_url, report, cache)
        report.other += [f"icon not drawn (no such icon in the icon script): {name}"
                         for name in info["undrawn_icons"]]
        report.book_pdf_link = info["book_pdf"]
        _wait_quiet(page, pending, report)
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        _check_solutions(page, report)
        _check_text(page, report)
        _check_layout(page, report, page.viewport_size["width"] if page.viewport_size else 0)
    except Exception as err:  # a timeout or a crash is a finding about this page
        report.other.append(f"{type(err).__name__}: {str(err).splitlines()[0]}")
    finally:
        page.close()
    return report


def _wait_quiet(page, pending: set, report: PageReport, quiet_ms: int = 300) -> None:
    """Wait until no request has been in flight for ``quiet_ms`` (late fonts, images)."""
    waited = quiet = 0
    while quiet < quiet_ms and waited < TIMEOUT_MS:
        page.wait_for_timeout(50)
        waited += 50
        quiet = quiet + 50 if not pending else 0
    if pending:
        report.other.append(f"requests still pending after {TIMEOUT_MS} ms: "
                            + ", ".join(sorted(r.url for r in pending)))


def _check_math(page, report: PageReport) -> None:
    try:
        page.wait_for_function(_WAIT_MATHJAX, timeout=TIMEOUT_MS)
    except Exception:
        report.math_errors.append("MathJax never loaded, formulas are left as raw TeX")
    result = page.evaluate(_CHECK_MATH)
    report.formulas = result["formulas"]
    report.math_errors += [f"formula `{e['tex']}`: {e['message']}" for e in result["errors"]]
    report.math_errors += [f"formula not typeset: `{tex}`" for tex in result["untypeset"]]
    report.math_errors += [f"raw TeX left in the rendered text: `{text}`"
                           for text in result["raw"]]


def _check_widgets(page, report: PageReport) -> None:
    views = page.evaluate(_CHECK_WIDGETS)
    report.widgets = len(views)
    for view in views:
        name = f"widget {view['index'] + 1}"
        if view["controls"] == 0 or view["frames"] < 2:
            report.widget_errors.append(f"{name}: {view['controls']} controls, "
                                        f"{view['frames']} figures (nothing to move)")
        if view["shown"] != 1:
            report.widget_errors.append(f"{name} shows {view['shown']} figures, not 1")
        elif not view["alt"].strip():
            report.widget_errors.append(f"{name}: its figure has no alt text")
        if view["views"]:
            report.widget_errors.append(f"{name}: the widget view (which needs a kernel) "
                                        f"is on the page too")
        for move in view["moves"]:
            if not move["changed"]:
                report.widget_errors.append(f"{name}: moving {move['label']!r} did not change "
                                            f"the figure ({move['shown']} shown)")
            elif not move["restored"]:
                report.widget_errors.append(f"{name}: moving {move['label']!r} back did not "
                                            f"bring the figure back")
        if view["fallbacks_after"] == 0:
            report.widget_errors.append(f"{name} has no static fallback figure after it")
    if views and views[0]["fallbacks_total"] < len(views):
        report.widget_errors.append(
            f"{len(views)} widgets but {views[0]['fallbacks_total']} static figures")


def _check_icon(icon: str | None, base_url: str, report: PageReport,
                cache: dict[str, tuple[int, str]]) -> None:
    """A page names its icon (without one the browser asks for /favicon.ico: a 404 in the
    console of every page), and the icon loads."""
    if not icon:
        report.other.append("no icon (<link rel=icon>): the browser asks for /favicon.ico")
    elif icon.startswith(base_url) and http_get(icon, cache)[0] != 200:
        report.other.append(f"its icon {icon} does not load (HTTP {http_get(icon, cache)[0]})")


def _check_links(links: list[str], base_url: str, report: PageReport,
                 cache: dict[str, tuple[int, str]]) -> None:
    for href in dict.fromkeys(links):
        if not href.startswith(base_url):
            continue  # external links are for the reader; the browser never requests them
        report.links_checked += 1
        target, _, fragment = href.partition("#")
        status, html = http_get(target, cache)
        if status != 200:
            report.broken_links.append(f"{href} (HTTP {status})")
        elif fragment and html and urllib.parse.unquote(fragment) not in _ids_in(html):
            report.broken_links.append(f"{href} (no element with id {fragment!r})")
