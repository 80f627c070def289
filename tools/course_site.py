"""Sphinx extension: make the course site self-contained and free of console errors.

1. No ipywidgets scripts: a chapter's widget saves its figures drawn ahead as HTML with
   controls of its own (``src/course_attn/lab/site_frames.py``), which the site shows instead
   of the widget view (``nb_mime_priority_overrides`` in ``_config.yml``); ``course.js``
   switches them. Without a kernel the ipywidgets manager could only draw controls that do
   nothing, so myst-nb is told to load none (``nb_ipywidgets_js``). MathJax is served
   locally by the ``sphinx-mathjax-offline`` extension.
2. Every figure a cell outputs opens at full size when clicked (a link to the image file,
   added when the page loads): the column shows figures at most 700 px wide. The figures
   of a widget stay unlinked (the widget shows them in turn).
3. Exact duplicate inline scripts are dropped: under Sphinx 7 the inline ``<script>`` bodies
   that extensions add while reading (sphinx-thebe's ``const THEBE_JS_URL ...``) are
   written twice, and the second ``const`` is a SyntaxError in the console of every page.
   So is the widgets' saved state that myst-nb writes into each chapter for the ipywidgets
   manager, which the site does not load.
4. ``tools/static/course.css`` and ``course.js``: pages that fit a phone and a laptop. A
   formula a little too wide is drawn smaller; what still does not fit (code, long formulas)
   scrolls inside its own box, whose hidden side fades out; inline formulas are no scroll
   boxes (no scroll bar under each where scroll bars show); tables fit a phone; figures are
   shown large enough for 12 px text (11 px on a phone) but never wider than the column (the
   screen on a phone), so that no figure scrolls or is cut; long inline code breaks, and
   the page itself is never wider than the screen (``tests/site_check.py`` measures every
   page at 400 px and 1280 px).
5. Exercise solutions (code cells tagged ``hide-input``, with ``hide-output`` or as
   ``hide-cell``) fold behind one toggle titled "Solution" instead of myst-nb's "Show code
   cell source" and a second "Show code cell output": :class:`SolutionCells` runs just before
   myst-nb's own fold and folds code and output together where the tags hide both.
6. ``tools/static/course_search.js`` on the search page: formulas in the result titles and
   snippets become plain text instead of TeX source; a snippet is taken from the article (not
   the page's table of contents), and a glossary hit shows the term's definition.
7. Search ranks the chapter that teaches a term first. The glossary lists each term under
   the chapter that introduces it ("## Chapter 8: ..."); :func:`_teaching_entries` adds the
   term as a main index entry of that chapter (in the search index only, when the chapter's
   page is written), and ``tools/search_scorer.js`` (``html_search_scorer``) puts that
   chapter first, then its sections titled with the term, then the glossary's definition.
8. The whole book as one PDF: ``make pdf`` writes ``_build/pdf/course_attn.pdf``
   (``tools/print_pdf.py``). When it exists, the html builder copies it into the site
   (``course_attn.pdf`` at the root) and every page's download menu gets an entry for it
   (course.js, from ``window.COURSE_BOOK_PDF``); without it, neither (no dead link).
9. Figures and equations are numbered by chapter, as in print: the second numbered figure
    of chapter 4 is "Figure 4.2" and its third numbered equation "(4.3)". Sphinx numbers
    them by section number, which needs a numbered table of contents; the chapters number
    their own headings ("Chapter 4: ...", "4.2 ..."), and a numbered toctree would number
    them again. Without it, Sphinx counts through the whole book ("Figure 17"), so
    :func:`_number_by_chapter` puts the chapter's number (from the notebook's file name,
    ``notebooks/04_...``) in front and counts each chapter from 1 (``numfig_format`` in
    ``_config.yml`` spells "Figure %s").
10. Lighter pages (issue 44): every page loaded the theme's icon script, Font Awesome's
    whole set (1.49 MB) for the 18 icons the site shows; :func:`_icon_subset` writes, in its
    place, a script of the icons the built pages name (a few kB), which draws them the same
    way (an ``<i class="fa-solid fa-sun">`` becomes that icon's ``<svg>``).
11. Lighter pages (issue 44): a widget's figures drawn ahead are saved in the notebook as
    data URLs (up to 72 per widget), which made chapters 9 to 11's HTML 1.3 to 1.4 MB.
    :func:`_widget_frame_files` writes each as a file of the site (``_images/widgets/``,
    named by its content) and the page refers to it: the figure shown first loads when the
    widget comes near the screen (``loading="lazy"``), the others when the reader reaches
    for a control (``data-src``, course.js). Each keeps its size (``width``, ``height``), so
    the page does not move as it loads.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import urllib.parse
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.environment import BuildEnvironment
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

FIGURE_LINKS = """\
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll(".cell_output img").forEach(function (img) {
    if (img.closest("a, .course-widget")) return;
    var link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.target = "_blank";
    link.title = "Open the figure at full size";
    link.className = "course-figure-link";
    img.parentNode.insertBefore(link, img);
    link.appendChild(img);
    img.style.cursor = "zoom-in";
  });
});"""


SOLUTION_SHOW = "Solution"
SOLUTION_HIDE = "Hide the solution"


class SolutionCells(SphinxPostTransform):
    """Exercise solutions get one toggle titled "Solution" (CONTRIBUTING.md: a solution is
    the code cell tagged ``hide-input``; its output, the answer, is tagged ``hide-output``).

    myst-nb reads the tags into ``hide_mode`` and folds the cell in its ``HideInputCells``
    post-transform (priority 199): "input+output" becomes two folds, "Show code cell
    source" and "Show code cell output". This transform runs first and turns
    "input+output" into "all" (one fold over code and output) and titles the fold of every
    mode that hides the code. Notebooks are not touched.
    """

    default_priority = 198  # myst_nb.sphinx_.HideInputCells is 199
    formats = ("html",)

    def run(self, **kwargs: object) -> None:
        for node in self.document.findall(nodes.container):
            if node.get("nb_element") != "cell_code":
                continue
            mode = node.get("hide_mode")
            if mode not in {"input", "input+output", "all"}:
                continue
            if mode == "input+output":
                node["hide_mode"] = "all"
            node["prompt_show"] = SOLUTION_SHOW
            node["prompt_hide"] = SOLUTION_HIDE
            node["classes"].append("course-solution")


def _no_widget_scripts(app: Sphinx, config: Config) -> None:
    config.nb_ipywidgets_js = {}


def _figure_links(app: Sphinx, pagename: str, templatename: str, context: dict,
                  doctree: object) -> None:
    if pagename.startswith("notebooks/"):  # the chapters: the pages with cell outputs
        app.add_js_file(None, body=FIGURE_LINKS)


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _drop_duplicate_inline_scripts(app: Sphinx, pagename: str, templatename: str,
                                   context: dict, doctree: object) -> None:
    seen: set[tuple] = set()
    unique = []
    for script in context.get("script_files", []):
        if getattr(script, "attributes", {}).get("type") == WIDGET_STATE:
            continue  # the saved widget state (34 kB in chapter 9): no script here reads it
        attributes = tuple(sorted(getattr(script, "attributes", {}).items()))
        key = (getattr(script, "filename", script) or "", attributes)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"][:] = unique


def _course_static(app: Sphinx, config: Config) -> None:
    config.html_static_path = [*config.html_static_path,
                               str(Path(__file__).resolve().parent / "static")]


def _search_page_script(app: Sphinx, pagename: str, templatename: str, context: dict,
                        doctree: object) -> None:
    if pagename == "search":
        app.add_js_file("course_search.js")


GLOSSARY = "book/glossary"
_CHAPTER_HEADING = re.compile(r"Chapter (\d+)\b")


def _glossary_chapters(app: Sphinx) -> dict[str, list[str]]:
    """Chapter docname -> the glossary terms listed under its heading (read once per
    process from the glossary's doctree; every name of a term "a / b" on its own)."""
    cached = getattr(app, "_course_glossary_chapters", None)
    if cached is not None:
        return cached
    env = app.env
    chapters: dict[str, list[str]] = {}
    if GLOSSARY in env.found_docs:
        by_number = {}
        for docname in env.found_docs:
            found = re.match(r"notebooks/(\d+)_", docname)
            if found:
                by_number[int(found.group(1))] = docname
        for section in env.get_doctree(GLOSSARY).findall(nodes.section):
            heading = section.next_node(nodes.title)
            number = _CHAPTER_HEADING.match(heading.astext()) if heading else None
            if not number or int(number.group(1)) not in by_number:
                continue
            names = chapters.setdefault(by_number[int(number.group(1))], [])
            for term in section.findall(nodes.term):
                text = term.astext().replace("$", "").strip()
                names += [name.strip() for name in text.split(" / ") if name.strip()]
    app._course_glossary_chapters = chapters  # type: ignore[attr-defined]
    return chapters


def _teaching_entries(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Each glossary term becomes a main index entry of the chapter that teaches it, aimed
    at the page itself (no anchor), so that the search ranks that chapter with the glossary's
    own entry (100 points) instead of among every page that names the term in a heading."""
    terms = _glossary_chapters(app).get(docname)
    if terms:
        entries = [("single", term, "", "main", None) for term in terms]
        doctree.append(addnodes.index(entries=entries, inline=False))
    if docname == GLOSSARY:  # "causal mask / look-ahead mask": each name finds the term
        for term in doctree.findall(nodes.term):
            names = [n.strip() for n in term.astext().replace("$", "").split(" / ")]
            if len(names) > 1 and term["ids"]:
                entries = [("single", name, term["ids"][0], "main", None)
                           for name in names if name]
                term.parent.append(addnodes.index(entries=entries, inline=False))


def _search_scorer(app: Sphinx, config: Config) -> None:
    if not config.html_search_scorer:
        config.html_search_scorer = str(Path(__file__).resolve().parent / "search_scorer.js")


CHAPTER_PAGE = re.compile(r"notebooks/(\d+)_")


def _number_by_chapter(app: Sphinx, env: BuildEnvironment) -> list[str]:
    """Give every numbered figure, equation (``displaymath``) and other numbered node of a
    chapter page the number ``(chapter, k)``, k counting from 1 in the page's order.

    Runs after Sphinx's ``TocTreeCollector.assign_figure_numbers`` (same event, later
    priority), which rebuilds ``env.toc_fignumbers`` on every build; captions and references
    read the numbers from it.
    """
    for docname, by_type in env.toc_fignumbers.items():
        chapter = CHAPTER_PAGE.match(docname)
        if not chapter:
            continue
        for numbers in by_type.values():  # {node id: number}, inserted in document order
            for k, node_id in enumerate(numbers, start=1):
                numbers[node_id] = (int(chapter.group(1)), k)
    return []


BOOK_PDF = Path("_build") / "pdf" / "course_attn.pdf"  # written by make pdf


def _book_pdf(app: Sphinx) -> Path | None:
    pdf = Path(app.srcdir) / BOOK_PDF
    return pdf if app.builder.name == "html" and pdf.is_file() else None


def _book_pdf_link(app: Sphinx, pagename: str, templatename: str, context: dict,
                   doctree: object) -> None:
    if _book_pdf(app) is not None:
        target = json.dumps(context["pathto"](BOOK_PDF.name, 1))
        app.add_js_file(None, body=f"window.COURSE_BOOK_PDF = {target};")


def _copy_book_pdf(app: Sphinx, exception: Exception | None) -> None:
    pdf = _book_pdf(app)
    if exception is None and pdf is not None:
        shutil.copyfile(pdf, Path(app.outdir) / BOOK_PDF.name)
        logger.info("course_site: %s copied into the site", BOOK_PDF)


WIDGET_FRAMES = Path("_images") / "widgets"
_FRAME = re.compile(r'<img class="course-widget-frame"([^>]*?) src="data:image/svg\+xml,'
                    r'([^"]*)">')
_SVG_SIZE = re.compile(r'<svg\b[^>]*?\bwidth="([\d.]+)pt"[^>]*?\bheight="([\d.]+)pt"')


def _widget_frame_files(app: Sphinx, pagename: str, templatename: str, context: dict,
                        doctree: object) -> None:
    """A widget's figures (data URLs in the page, site_frames.py) become files of the site:
    the shown one with ``loading="lazy"``, the hidden ones with ``data-src`` for course.js."""
    body = context.get("body", "")
    if app.builder.name != "html" or "course-widget-frame" not in body:
        return
    folder = Path(app.outdir) / WIDGET_FRAMES
    folder.mkdir(parents=True, exist_ok=True)

    def to_file(found: re.Match) -> str:
        attributes, svg = found.group(1), urllib.parse.unquote(found.group(2))
        data = svg.encode("utf-8")
        name = hashlib.sha256(data).hexdigest()[:20] + ".svg"
        if not (folder / name).is_file():
            (folder / name).write_bytes(data)
        url = html.escape(context["pathto"](f"{WIDGET_FRAMES.as_posix()}/{name}", 1))
        size = _SVG_SIZE.search(svg)  # matplotlib writes points: 1 pt = 4/3 CSS px
        box = (f' width="{round(float(size.group(1)) * 4 / 3)}"'
               f' height="{round(float(size.group(2)) * 4 / 3)}"' if size else "")
        hidden = re.search(r"\shidden\b", re.sub(r'"[^"]*"', '""', attributes))
        where = f' data-src="{url}"' if hidden else f' src="{url}" loading="lazy"'
        return f'<img class="course-widget-frame"{attributes}{box}{where}>'

    context["body"] = _FRAME.sub(to_file, body)


ICON_SCRIPT = Path("_static") / "scripts" / "fontawesome.js"  # the theme's, every page
# Font Awesome's packs in that script: `var p={name:[width,height,[aliases],"unicode",path],
# ...}` then `d("fab",p)`; brands, regular and solid, in that order.
_ICON_PACK = re.compile(r'var p=\{(.*?)\};?\s*[^;]*?\bd\("(fa[bsr])",p\)', re.S)
_ICON = re.compile(r'(?:"([\w-]+)"|([\w$]+)):\[(\d+),(\d+),\[([^\]]*)\],"[0-9a-f]+",'
                   r'("(?:[^"\\]|\\.)*"|\[[^\]]*\])\]')
_ICON_CLASS = re.compile(r"\bfa-([a-z0-9]+(?:-[a-z0-9]+)*)\b")

ICON_JS = """/*! The icons these pages show, from
 * Font Awesome Free 6 by @fontawesome - https://fontawesome.com
 * License - https://fontawesome.com/license/free
 *   (Icons: CC BY 4.0, Fonts: SIL OFL 1.1, Code: MIT License)
 * Copyright 2024 Fonticons, Inc.
 * Written by tools/course_site.py in place of the theme's whole set (1.49 MB): each
 * <i class="fa-solid fa-NAME"> (or <span>) becomes the icon's <svg>, as Font Awesome's own
 * script does.
 */
(function () {
  "use strict";
  var ICONS = %(icons)s;
  var PREFIX = {fab: "fab", "fa-brands": "fab", far: "far", "fa-regular": "far"};
  var css = document.createElement("style");
  css.textContent = "svg:not(:host).svg-inline--fa,svg:not(:root).svg-inline--fa{" +
    "overflow:visible;box-sizing:content-box}.svg-inline--fa{display:var(--fa-display," +
    "inline-block);height:1em;overflow:visible;vertical-align:-.125em}" +
    ".svg-inline--fa.fa-lg{vertical-align:-.2em}";
  document.head.appendChild(css);
  function draw(el) {
    var prefix = "fas", name = null, classes = Array.prototype.slice.call(el.classList);
    classes.forEach(function (c) { if (PREFIX[c]) prefix = PREFIX[c]; });
    var pack = ICONS[prefix] || {};
    classes.forEach(function (c) {
      if (!name && c.indexOf("fa-") === 0 && pack[c.slice(3)]) name = c.slice(3);
    });
    if (!name) return;
    var icon = pack[name], ns = "http://www.w3.org/2000/svg";
    var svg = document.createElementNS(ns, "svg"), path = document.createElementNS(ns, "path");
    Array.prototype.forEach.call(el.attributes, function (a) {
      if (a.name !== "class") svg.setAttribute(a.name, a.value);
    });
    svg.setAttribute("class", ["svg-inline--fa", "fa-" + name].concat(classes.filter(
      function (c) { return c !== "fa-" + name && !PREFIX[c] && c !== "fas" &&
                            c !== "fa-solid"; })).join(" "));
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    svg.setAttribute("data-prefix", prefix);
    svg.setAttribute("data-icon", name);
    svg.setAttribute("role", "img");
    svg.setAttribute("viewBox", "0 0 " + icon[0] + " " + icon[1]);
    path.setAttribute("fill", "currentColor");
    path.setAttribute("d", icon[2]);
    svg.appendChild(path);
    el.replaceWith(svg);
  }
  var ICON = 'i[class*="fa-"], span[class*="fa-"]';  // the theme writes both
  function drawAll(root) {
    if (root.matches && root.matches(ICON)) draw(root);
    else if (root.querySelectorAll) root.querySelectorAll(ICON).forEach(draw);
  }
  function start() {
    drawAll(document);
    new MutationObserver(function (changes) {  // icons added later (course.js's book .pdf)
      changes.forEach(function (c) { c.addedNodes.forEach(drawAll); });
    }).observe(document.documentElement, {childList: true, subtree: true});
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
"""


def _theme_icon_script() -> Path:
    import pydata_sphinx_theme

    return (Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme"
            / "static" / "scripts" / "fontawesome.js")


def icon_packs(script: str) -> dict[str, dict[str, tuple[int, int, str]]]:
    """Font Awesome's script -> {"fab"|"far"|"fas": {name or alias: (width, height, path)}}
    (a duotone icon's two paths are joined into one)."""
    packs: dict[str, dict[str, tuple[int, int, str]]] = {}
    for pack, prefix in _ICON_PACK.findall(script):
        icons = packs.setdefault(prefix, {})
        for quoted, bare, width, height, aliases, path in _ICON.findall(pack):
            paths = json.loads(path)
            shape = (int(width), int(height), " ".join(paths) if isinstance(paths, list)
                     else paths)
            icons[quoted or bare] = shape
            for alias in re.findall(r'"([\w-]+)"', aliases):
                icons.setdefault(alias, shape)
    return packs


def _icon_subset(app: Sphinx, exception: Exception | None) -> None:
    """Replace the site's copy of the theme's icon script with one that holds only the icons
    its pages and scripts name (``fa-NAME``); a name no pack has is a warning (-W: an
    error), so an icon the theme or a page adds later is not silently left out."""
    out = Path(app.outdir)
    target = out / ICON_SCRIPT
    if exception is not None or not target.is_file():
        return
    packs = icon_packs(_theme_icon_script().read_text(encoding="utf-8"))
    if {"fab", "far", "fas"} - set(packs) or len(packs["fas"]) < 1000:
        logger.warning("course_site: the theme's icon script has changed (packs %s); its "
                       "icons are left as they are", sorted(packs))
        return
    named: set[str] = set()
    prefixes = {"fas"}  # the default
    for file in [*out.rglob("*.html"), *(out / "_static").glob("*.js"),
                 *(out / "_static" / "scripts").glob("*.js")]:
        if file.name != ICON_SCRIPT.name:
            text = file.read_text(encoding="utf-8", errors="replace")
            if file.suffix == ".html":  # class names only (prose says "so far")
                text = " ".join(re.findall(r'class="([^"]*)"', text))
            named.update(_ICON_CLASS.findall(text))
            prefixes.update(prefix for prefix, style in [("fab", "brands"), ("far", "regular")]
                            if re.search(rf"(?<![\w-]){prefix}(?![\w-])|fa-{style}\b", text))
    # style and size classes, and names of the icon packs themselves, are no icons
    modifiers = {"solid", "regular", "brands", "lg", "xs", "sm", "xl", "2x", "fw", "spin"}
    chosen = {prefix: {n: icons[n] for n in sorted(named) if n in icons}
              for prefix, icons in packs.items() if prefix in prefixes}
    unknown = sorted(n for n in named - modifiers if not any(n in c for c in chosen.values()))
    if unknown:
        logger.warning("course_site: icons named on the site that Font Awesome lacks: %s",
                       unknown)
    icons = {prefix: {n: [*shape] for n, shape in found.items()}
             for prefix, found in chosen.items() if found}
    target.write_text(ICON_JS % {"icons": json.dumps(icons, separators=(",", ":"))},
                      encoding="utf-8")
    (out / ICON_SCRIPT).with_suffix(".js.map").unlink(missing_ok=True)  # maps the old one
    logger.info("course_site: %s holds %d icons (%d bytes)", ICON_SCRIPT,
                sum(map(len, icons.values())), target.stat().st_size)


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _course_static)
    app.connect("config-inited", _search_scorer)
    app.connect("doctree-resolved", _teaching_entries)
    app.connect("html-page-context", _book_pdf_link)
    app.connect("build-finished", _copy_book_pdf)
    app.connect("build-finished", _icon_subset)
    app.connect("env-get-updated", _number_by_chapter, priority=900)
    app.add_css_file("course.css")
    app.add_js_file("course.js", loading_method="defer")
    app.add_post_transform(SolutionCells)
    app.connect("html-page-context", _search_page_script)
    # After myst-nb registered nb_ipywidgets_js, before it reads it at builder-inited.
    app.connect("config-inited", _no_widget_scripts)
    app.connect("html-page-context", _figure_links)
    app.connect("html-page-context", _widget_frame_files)
    app.connect("html-page-context", _drop_duplicate_inline_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
