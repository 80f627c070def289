"""Checks of the built course site in a real, offline headless Chromium.

Used by ``tests/test_site.py``. The site is served from a local ``http.server`` thread; the
browser may reach that server and nothing else: every other request is aborted and
recorded. ``check_page`` loads one page, waits for MathJax and the widget manager, and
returns a :class:`PageReport` whose ``failures()`` lists every problem found, each naming
the page (and the formula, link, image or widget concerned).
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import json
import os
import re
import shutil
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
SUMMARY_KEY = pytest.StashKey[list]()  # lines tests/conftest.py prints after the run


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


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
    """Widget views the notebook's outputs hold (what the page must render)."""
    nb = json.loads(notebook.read_text())
    count = 0
    for cell in nb["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] != "code" or tags & {"remove-output", "remove-cell"}:
            continue
        count += sum(WIDGET_VIEW in out.get("data", {}) for out in cell.get("outputs", []))
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


def remote_resources(page_file: Path) -> list[str]:
    """Scripts, stylesheets and images that a built page loads from another host."""
    parser = _ResourceParser()
    parser.feed(page_file.read_text(encoding="utf-8"))
    return [u for u in parser.urls if re.match(r"(?i)^(?:[a-z][a-z0-9+.-]*:)?//", u)]


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
    other: list[str] = field(default_factory=list)

    def failures(self) -> list[str]:
        out = [f"{self.page}: {msg}" for msg in self.other]
        if self.status != 200:
            out.append(f"{self.page}: HTTP status {self.status}")
        if not self.title or not self.heading:
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
        ]:
            out += [f"{self.page}: {kind}: {item}" for item in items]
        if self.chapter and self.output_cells == 0:
            out.append(f"{self.page}: chapter page shows no code outputs")
        if self.chapter and self.output_images == 0:
            out.append(f"{self.page}: chapter page shows no figure image")
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

_VIEWS = """() => Array.from(document.querySelectorAll(
    'script[type="application/vnd.jupyter.widget-view+json"]'))"""

_WAIT_WIDGETS = f"""() => ({_VIEWS})().every(
    s => s.parentElement.querySelector('.widget-subarea .jupyter-widgets'))"""

# Each saved view: did the manager draw it (visible, with which widget classes), and is a
# static figure (an output image outside every widget) placed after it on the page?
_CHECK_WIDGETS = f"""() => {{
  const fallbacks = Array.from(document.querySelectorAll('.cell_output img'))
      .filter(img => !img.closest('.widget-subarea, .jupyter-widgets'));
  return ({_VIEWS})().map((script, index) => {{
    let model = '?';
    try {{ model = JSON.parse(script.textContent).model_id; }} catch (e) {{}}
    const area = script.parentElement.querySelector('.widget-subarea');
    const widget = area && area.querySelector('.jupyter-widgets');
    const box = widget ? widget.getBoundingClientRect() : null;
    const classes = widget ? Array.from(area.querySelectorAll('[class*="widget-"]'))
        .flatMap(el => Array.from(el.classList)).filter(c => c.startsWith('widget-')) : [];
    const kinds = Array.from(new Set(classes));
    const after = fallbacks.filter(img =>
        script.compareDocumentPosition(img) & Node.DOCUMENT_POSITION_FOLLOWING);
    return {{index, model, rendered: !!widget, visible: !!box && box.width > 0 && box.height > 0,
             kinds, fallbacks_after: after.length, fallbacks_total: fallbacks.length}};
  }});
}}"""

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
  };
}"""

_IMAGES = """() => Array.from(document.images).map(img => ({
    src: img.currentSrc || img.src, ok: img.complete && img.naturalWidth > 0,
    output: !!img.closest('.cell_output'), alt: img.getAttribute('alt') || '',
    linked: !!img.closest('a.course-figure-link')}))"""


def _check_figure(src: str, image: dict, report: PageReport) -> None:
    """A figure a cell printed: it opens at full size on click (tools/course_site.py)."""
    name = src.rsplit("/", 1)[-1][:16]
    if not image["linked"]:
        report.figure_problems.append(f"{name}... does not open at full size on click")


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
            if not image["ok"] or status not in (None, 200):
                report.broken_images.append(f"{src} (HTTP {status}, decoded={image['ok']})")
            if image["output"] and not src.startswith("data:"):  # data: = drawn by a widget
                _check_figure(src, image, report)
        _check_links(info["links"], base_url, report, cache)
        _wait_quiet(page, pending, report)
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
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
    try:
        page.wait_for_function(_WAIT_WIDGETS, timeout=TIMEOUT_MS)
    except Exception:
        pass  # the per-view check below names each view that did not render
    views = page.evaluate(_CHECK_WIDGETS)
    report.widgets = len(views)
    for view in views:
        name = f"view {view['index']} (model {view['model']})"
        if not view["rendered"]:
            report.widget_errors.append(f"{name} did not render as a widget")
        elif not view["visible"]:
            report.widget_errors.append(f"{name} rendered with zero size")
        if view["fallbacks_after"] == 0:
            report.widget_errors.append(f"{name} has no static fallback figure after it")
    if views and views[0]["fallbacks_total"] < len(views):
        report.widget_errors.append(
            f"{len(views)} widget views but {views[0]['fallbacks_total']} static figures")


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
