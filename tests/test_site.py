"""The built site in a real headless Chromium, offline (``make site``, after ``make html``).

Every page of ``_toc.yml``, the general index and the search page are served from
``_build/html`` on 127.0.0.1 and loaded in Debian's Chromium, once in a 1280 px window that
draws scroll bars as Windows does (every check) and once in a 400 px one (a phone: the layout
checks); any request to another host is aborted and counted as a failure. A few searches look
for raw TeX in the results and for the chapter that teaches a term as the first result; a
touch screen opens chapter 4's contents drawer. Where ``make pdf`` has run, the PDF of the
whole book is read (``tests/pdf_text.py``) and checked. See ``tests/site_check.py`` for what
is checked on each page. Without Chromium (or without a
built site) the tests skip, except with ``CI=true``, where they fail; so does the check of
the Chinese glyphs without a CJK font (Debian: fonts-noto-cjk).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import struct
import unicodedata
from html import unescape
from pathlib import Path

import pdf_text
import pytest
import site_check as sc

pytestmark = pytest.mark.site
SEARCH_KEY = pytest.StashKey[dict]()
DRAWER_KEY = pytest.StashKey[list]()

DOCS = sc.toc_files()
CHAPTERS = [doc for doc in DOCS if sc.notebook_source(doc) is not None]
PAGES = DOCS + sc.GENERATED_PAGES  # every page of the built site
GLOSSARY = "book/glossary"
# Full-page screenshots at 1280 px, scroll bars shown: chapter 1, and chapter 4, whose inline
# formulas each showed a scroll bar of their own (issue 35).
CHAPTER_4 = next((doc for doc in CHAPTERS if doc.startswith("notebooks/04_")), None)
SCREENSHOTS = {doc: sc.SHOTS / name for doc, name in
               [(CHAPTERS[0] if CHAPTERS else None, "chapter01.png"),
                (CHAPTER_4, "chapter04_scrollbars.png")] if doc is not None}
# Queries whose results quote formulas (the search page shows page text around the match).
TEX_SEARCHES = ["sqrt", "softmax", "building the mask before softmax"]
# A term -> the chapter that teaches it, which must be the first result (issue 35, item 6:
# "KV cache" gave chapter 8 fifth, "FlashAttention" chapter 9 fourth).
TEACHING = {"KV cache": "notebooks/08_encoder_decoder",
            "FlashAttention": "notebooks/09_efficient_attention",
            "causal mask": "notebooks/05_masks",
            "multi-head attention": "notebooks/06_multi_head_attention",
            "softmax": "notebooks/01_softmax_weighting",
            # issue 44, item 8: its snippet was chapter 11's list of code names
            "induction": "notebooks/11_mini_transformer"}
SEARCHES = list(dict.fromkeys([*TEX_SEARCHES, *TEACHING]))


def _unavailable(reason: str) -> None:
    if sc.in_ci():
        pytest.fail(f"{reason}; CI=true, so the site test fails instead of skipping")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browsers():
    """Two Chromiums: a laptop's that draws scroll bars as Windows does (playwright hides
    them by default, which hid 854 inline formulas with scroll bars of their own), and a
    phone's, whose scroll bars take no room (as on a phone)."""
    path = sc.chromium_path()
    if path is None:
        _unavailable("Chromium not found (Debian/Ubuntu: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-proxy-server: the local server must never be reached through a proxy.
        laptop = playwright.chromium.launch(executable_path=path, args=["--no-proxy-server"],
                                            ignore_default_args=["--hide-scrollbars"])
        phone = playwright.chromium.launch(executable_path=path, args=["--no-proxy-server"])
        yield laptop, phone
        phone.close()
        laptop.close()


@pytest.fixture(scope="module")
def browser(browsers):
    return browsers[0]


@pytest.fixture(scope="module")
def site() -> Path:
    if not (sc.SITE / "index.html").is_file():
        _unavailable(f"no built site at {sc.SITE} (run `make html` first)")
    return sc.SITE


@pytest.fixture(scope="module")
def crawl(browsers, site, pytestconfig) -> dict[str, sc.PageReport]:
    """Every page (and index.html) checked once at 1280 px, again at 400 px for the layout
    (reports "<page>@400"), a few searches (reports "search?q=..."); a summary goes to the
    terminal."""
    reports: dict[str, sc.PageReport] = {}
    searches: dict[str, dict] = {}
    browser, phone_browser = browsers
    with sc.serve(site) as base:
        context = browser.new_context(service_workers="block",
                                      viewport={"width": sc.WIDE, "height": 800})
        cache: dict[str, tuple[int, str]] = {}
        for doc in PAGES:
            shot = SCREENSHOTS.get(doc)
            reports[doc] = sc.check_page(context, base, f"{doc}.html", cache=cache,
                                         chapter=doc in CHAPTERS, screenshot=shot)
        reports["index"] = sc.check_page(context, base, "index.html", cache=cache,
                                         redirect_to=f"{DOCS[0]}.html",
                                         screenshot=sc.SHOTS / "index.png")
        for query in SEARCHES:
            searches[query] = sc.check_search(context, base, query)
        context.close()
        phone = phone_browser.new_context(service_workers="block",
                                          viewport={"width": sc.NARROW, "height": 800})
        narrow_reports = sc.check_layout_pages(phone, base, [f"{doc}.html" for doc in PAGES],
                                               sc.NARROW)
        reports.update({f"{doc}@{sc.NARROW}": narrow_reports[f"{doc}.html"] for doc in PAGES})
        phone.close()
        if CHAPTER_4 is not None:
            touch = phone_browser.new_context(service_workers="block", has_touch=True,
                                              viewport={"width": sc.NARROW, "height": 800})
            pytestconfig.stash[DRAWER_KEY] = sc.check_drawer(touch, base, f"{CHAPTER_4}.html")
            touch.close()
    pytestconfig.stash[SEARCH_KEY] = searches
    pages = [reports[doc] for doc in PAGES]
    narrow = [reports[f"{doc}@{sc.NARROW}"] for doc in PAGES]
    svg = [r for r in pages + narrow if r.smallest_svg_text_px is not None]
    sizes = {name: sc.tree_size(site / "_static" / name) for name in ("mathjax",)}
    pdf = _pdf_counts()
    summary = {
        "pages": len(pages),
        "chapter_pages": len(CHAPTERS),
        "formulas": sum(r.formulas for r in pages),
        "widgets": sum(r.widgets for r in pages),
        "internal_links": sum(r.links_checked for r in pages),
        "images": sum(r.images_checked for r in pages),
        "failures": sum(len(r.failures()) for r in reports.values()),
        "local_asset_bytes": sizes,
        "site_bytes": sc.tree_size(site),
        "widest_page_px": {width: max(r.page_widths.get(width, 0) for r in pages + narrow)
                           for width in (sc.WIDE, sc.NARROW)},
        "scrolling_boxes": {width: {kind: sum(r.scrolling.get(width, {}).get(kind, 0)
                                              for r in pages + narrow)
                                    for kind in ("inline", "display", "code", "figure")}
                            for width in (sc.WIDE, sc.NARROW)},
        "display_formula_hidden_px": {width: max(r.display_hidden_px.get(width, 0)
                                                 for r in pages + narrow)
                                      for width in (sc.WIDE, sc.NARROW)},
        "figures": {width: {"measured": sum(r.figures_measured.get(width, 0)
                                            for r in pages + narrow),
                            "scrolling": sum(r.scrolling.get(width, {}).get("figure", 0)
                                             for r in pages + narrow),
                            "clipped": sum(r.figures_clipped.get(width, 0)
                                           for r in pages + narrow)}
                    for width in (sc.WIDE, sc.NARROW)},
        "tables": sum(r.tables_measured for r in narrow),
        "svg_texts": sum(r.svg_texts for r in pages + narrow),
        "smallest_svg_text_px": {
            width: min((r.smallest_svg_text_px for r in svg if width in r.page_widths),
                       default=None) for width in (sc.WIDE, sc.NARROW)},
        "chinese_characters_checked": reports[GLOSSARY].cjk_chars if GLOSSARY in reports
        else 0,
        "search_results": {q: s["results"] for q, s in searches.items()},
        "pdf": pdf,
    }
    (sc.ROOT / "_build" / "site_report.json").write_text(json.dumps(
        {"summary": summary, "pages": {doc: vars(r) for doc, r in reports.items()}}, indent=1))
    pytestconfig.stash[sc.SUMMARY_KEY] = [
        f"site test: {summary['pages']} pages ({summary['chapter_pages']} chapters), "
        f"{summary['formulas']} formulas, {summary['widgets']} widgets, "
        f"{summary['internal_links']} internal links, {summary['images']} images checked; "
        f"{summary['failures']} failures",
        f"layout: widest page {summary['widest_page_px'][sc.WIDE]} px in a {sc.WIDE} px "
        f"window, {summary['widest_page_px'][sc.NARROW]} px in a {sc.NARROW} px one; "
        f"{summary['svg_texts']} SVG texts measured, the smallest "
        + " and ".join(f"{px:.1f} px at {width} px (at least {sc.min_svg_text_px(width):g})"
                       for width, px in summary["smallest_svg_text_px"].items()
                       if px is not None)
        + f"; {summary['chinese_characters_checked']} Chinese characters of the glossary "
        f"checked for missing glyphs",
        "scrolling sideways (scroll bars shown at {w} px): {a}; at {n} px: {b}; the most a "
        "display formula hides at {n} px: {h} px; {t} tables measured at {n} px".format(
            w=sc.WIDE, n=sc.NARROW, h=summary["display_formula_hidden_px"][sc.NARROW],
            t=summary["tables"], **{k: ", ".join(f"{v} {kind}" for kind, v in
                                                 summary["scrolling_boxes"][width].items())
                                    for k, width in (("a", sc.WIDE), ("b", sc.NARROW))}),
        "figures and widget figures: " + "; ".join(
            f"at {width} px {f['measured']} measured, {f['scrolling']} boxes scrolling, "
            f"{f['clipped']} clipped" for width, f in summary["figures"].items()),
        f"local assets in _build/html/_static: MathJax {sizes['mathjax'] / 1e6:.1f} MB "
        f"(whole site {summary['site_bytes'] / 1e6:.1f} MB); details in _build/site_report.json",
        "PDF: not built (make pdf)" if pdf is None else
        f"PDF: {pdf['pages']} pages, {pdf['blank']} blank; {pdf['bookmarks']} bookmarks, "
        f"{pdf['doubled']} written twice, {pdf['bad']} not a heading's text",
    ]
    return reports


@pytest.mark.parametrize("doc", PAGES)
def test_page_renders_offline(crawl, doc):
    """HTTP 200, a title, links, images, math, widgets, outputs; no failed, foreign or
    erroring request; no console error; at 1280 px: no wider than the window, no formula
    cut, no SVG text under 12 px, no raw TeX in the text; exercise solutions behind one
    "Solution" toggle."""
    failures = crawl[doc].failures()
    assert not failures, f"{len(failures)} problem(s):\n" + "\n".join(failures)


@pytest.mark.parametrize("doc", PAGES)
def test_page_fits_a_phone(crawl, doc):
    """At 400 px: the page is no wider than the window, every formula is whole or scrolls in
    its own box, every figure (a widget's too) is whole, in no box that scrolls or cuts it,
    tables fit, SVG text is at least 11 px."""
    report = crawl[f"{doc}@{sc.NARROW}"]
    failures = report.failures()
    assert not failures, f"{len(failures)} problem(s):\n" + "\n".join(failures)
    assert report.page_widths.get(sc.NARROW) == sc.NARROW, report.page_widths


def test_chinese_glossary_terms_are_drawn_not_boxes(crawl):
    """The glossary's Chinese terms are drawn with real glyphs, not missing-glyph boxes."""
    report = crawl[GLOSSARY]
    assert report.cjk_chars >= 20, (
        f"{GLOSSARY}.html: only {report.cjk_chars} Chinese characters found on the page")
    if report.cjk_missing and not sc.cjk_font_installed():
        _unavailable("no CJK font, Chinese text is drawn as boxes "
                     "(Debian/Ubuntu: apt-get install fonts-noto-cjk)")
    assert not report.cjk_missing, (
        f"{GLOSSARY}.html: {len(report.cjk_missing)} of {report.cjk_chars} Chinese characters "
        f"are drawn as missing-glyph boxes: {''.join(report.cjk_missing[:20])}")


@pytest.mark.parametrize("query", TEX_SEARCHES)
def test_search_results_show_no_raw_tex(crawl, pytestconfig, query):
    """The search page's titles and snippets show formulas as text, not TeX source."""
    result = pytestconfig.stash[SEARCH_KEY][query]
    assert result["results"] > 0 and result["snippets"] > 0, (
        f"search for {query!r}: {result['results']} results, {result['snippets']} snippets")
    assert not result["raw"], (f"search for {query!r} shows raw TeX in "
                               f"{len(result['raw'])} result(s):\n" + "\n".join(result["raw"]))
    assert not result["raw_titles"], ("the search index lists titles with raw TeX: "
                                      + "; ".join(result["raw_titles"]))


@pytest.mark.parametrize("query", list(TEACHING))
def test_search_ranks_the_teaching_chapter_first(crawl, pytestconfig, query):
    """The chapter that teaches a term is the first result, its snippet is the chapter's
    text (not its table of contents), and the glossary's entry for the term is among the
    first three, with the definition as its snippet."""
    result = pytestconfig.stash[SEARCH_KEY][query]
    top = result["top"]
    shown = "\n".join(f"{i + 1}. {r['title']} ({r['page']}#{r['anchor']}): {r['snippet'][:90]}"
                      for i, r in enumerate(top))
    assert top and top[0]["page"] == TEACHING[query] and not top[0]["anchor"], (
        f"search for {query!r}: {TEACHING[query]} is not the first result:\n{shown}")
    assert top[0]["snippet"] and "Contents" not in top[0]["snippet"], (
        f"search for {query!r}: the first snippet is the table of contents:\n{shown}")
    glossary = [r for r in top[:3] if r["page"] == GLOSSARY and r["anchor"].startswith("term-")]
    assert glossary, f"search for {query!r}: no glossary entry in the first three:\n{shown}"
    term, _, definition = glossary[0]["snippet"].partition(": ")
    assert query.lower() in term.lower() and len(definition) > 20, (
        f"search for {query!r}: the glossary's snippet is not the definition: "
        f"{glossary[0]['snippet']!r}")


@pytest.mark.parametrize("query", SEARCHES)
def test_search_snippets_start_at_the_text(crawl, pytestconfig, query):
    """Issue 44, item 8: a snippet is the page's text: not cut mid-word as Sphinx cuts it
    ("...apter 9: Efficient"), not the page's title again, no equation number with its "#"
    link ("(4.1)# Attentio..."); for the chapter that teaches a term, the term in its prose,
    not in a code name ("induction" showed "induction_attention_score")."""
    top = pytestconfig.stash[SEARCH_KEY][query]["top"]
    assert top, f"search for {query!r}: no results"
    for r in top:
        snippet, where = r["snippet"], f"search for {query!r}, {r['page']}#{r['anchor']}"
        assert snippet, f"{where}: no snippet"
        assert not snippet.startswith("..."), f"{where}: cut mid-word: {snippet[:80]!r}"
        assert not re.search(r"\(\d+\.\d+\)\s*#", snippet), f"{where}: {snippet[:80]!r}"
        title = r["title"].split(" > ")[0]
        assert r["anchor"] or not snippet.lstrip("… ").startswith(title), (
            f"{where}: the snippet starts with the page's title: {snippet[:80]!r}")
    if query in TEACHING:
        word = query.lower().split()[0]
        snippet = top[0]["snippet"].lower()
        assert re.search(rf"(?<![\w.]){re.escape(word)}[a-z-]*(?![\w.])", snippet), (
            f"search for {query!r}: {word!r} is not in the prose of the first snippet: "
            f"{top[0]['snippet']!r}")


def test_index_redirects_to_the_first_page(crawl):
    failures = crawl["index"].failures()
    assert not failures, "\n".join(failures)


def test_screenshots_written(crawl):
    wanted = [sc.SHOTS / "index.png", *SCREENSHOTS.values()]
    for shot in wanted:
        assert shot.is_file(), f"missing screenshot {shot}"
        header = shot.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"
        width, height = struct.unpack(">II", header[16:24])
        assert width >= 800 and height >= 600, f"{shot} is only {width}x{height}"


def test_no_inline_formula_scrolls_with_scroll_bars_shown(crawl):
    """Issue 35, item 1: in a browser that draws scroll bars (Windows' default), no inline
    formula of chapter 4 (nor of any page: test_page_renders_offline) scrolls at 1280 px;
    the screenshot chapter04_scrollbars.png shows the page as measured."""
    if CHAPTER_4 is None:
        pytest.skip("no chapter 4 in _toc.yml")
    report = crawl[CHAPTER_4]
    assert report.scrollbar_px.get(sc.WIDE, 0) > 0, (
        "the laptop browser draws no scroll bars, so this check would see nothing: "
        f"{report.scrollbar_px}")
    assert report.formulas > 50, f"only {report.formulas} formulas typeset on {CHAPTER_4}"
    assert report.scrolling[sc.WIDE]["inline"] == 0, "\n".join(report.formula_scrollbars)
    assert not report.formula_scrollbars, "\n".join(report.formula_scrollbars)
    assert SCREENSHOTS[CHAPTER_4].is_file()


def test_phone_contents_drawer_closes_after_a_tap(crawl, pytestconfig):
    """Issue 35, item 7: on a 400 px touch screen the contents drawer of chapter 4 opens
    without a tooltip over the header and closes after a tap on a section."""
    if CHAPTER_4 is None:
        pytest.skip("no chapter 4 in _toc.yml")
    problems = pytestconfig.stash[DRAWER_KEY]
    assert not problems, f"{CHAPTER_4}.html at {sc.NARROW} px: " + "; ".join(problems)


@pytest.mark.parametrize("doc", CHAPTERS)
def test_every_saved_widget_is_on_the_page_and_moves(crawl, doc):
    """Each widget the notebook saves is on the page with its figures drawn ahead (the
    crawl moved each of its controls: failures name one that did not change the figure)."""
    expected = sc.saved_widget_views(sc.notebook_source(doc))
    assert expected >= 1, f"{doc}: the chapter saves no widget with its figures drawn ahead"
    assert crawl[doc].widgets == expected, (
        f"{doc}.html: the notebook saves {expected} widget(s), "
        f"the page shows {crawl[doc].widgets}")
    assert not crawl[doc].widget_errors, crawl[doc].widget_errors


def test_no_page_loads_a_widget_script(site):
    """The site's widgets need no ipywidgets script (tools/course_site.py, item 1)."""
    loaded = {doc: [u for u in sc.page_resources(site / f"{doc}.html")
                    if re.search(r"require\.js|embed-amd|html-manager", u)]
              for doc in DOCS if (site / f"{doc}.html").is_file()}
    assert not {doc: urls for doc, urls in loaded.items() if urls}, loaded


def test_icon_script_holds_the_icons_the_pages_use(site):
    """Issue 44, item 7: every page loads the icon script; it holds the icons the pages name
    (tools/course_site.py writes it), not Font Awesome's whole set (1.49 MB)."""
    script = site / "_static" / "scripts" / "fontawesome.js"
    assert script.is_file(), f"no {script.relative_to(site)}"
    text = script.read_text(encoding="utf-8")
    assert len(text) < 30_000, f"{script.name} is {len(text):,} bytes: the whole icon set?"
    found = re.search(r"var ICONS = (\{.*?\});\n", text)
    assert found, f"{script.name} is not the course's icon subset (no ICONS table)"
    held = {name for pack in json.loads(found.group(1)).values() for name in pack}
    modifiers = {"solid", "regular", "brands", "lg"}
    used = {name for doc in PAGES if (site / f"{doc}.html").is_file()
            for attr in re.findall(r'class="([^"]*)"', (site / f"{doc}.html").read_text(
                encoding="utf-8"))
            for name in re.findall(r"\bfa-([a-z0-9-]+)", attr)} - modifiers
    assert len(used) >= 10, f"only {len(used)} icons named on the pages: {sorted(used)}"
    assert used <= held, f"icons the pages name that the script lacks: {sorted(used - held)}"


def test_pages_load_nothing_from_other_hosts(site):
    """Static twin of the offline browser check, with a clearer message: which page
    references which remote script, style or image (e.g. a build without npm)."""
    remote = {doc: sc.remote_resources(site / f"{doc}.html") for doc in DOCS
              if (site / f"{doc}.html").is_file()}
    remote = {doc: urls for doc, urls in remote.items() if urls}
    assert not remote, f"pages load files from other hosts: {remote}"


# ------------------------------------------------------------- the checker itself fails

_MATH_SPAN = '<span class="math notranslate nohighlight">{}</span>'
# a 40 x 20 black rectangle, as a widget's figure drawn ahead (base64 of an SVG)
_DOT_SVG = ("PHN2ZyB4bWxucz0iaHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmciIHdpZHRo"
            "PSI0MCIgaGVpZ2h0PSIyMCI+PHJlY3Qgd2lkdGg9IjQwIiBoZWlnaHQ9IjIwIi8+PC9zdmc+")
_INJECTED = {
    # what is injected into the page -> what the report must name
    _MATH_SPAN.format(r"\(\frac{a}{b\)"): r"\frac{a}{b",  # unbalanced brace
    '<div class="math notranslate nohighlight">\\[x^{2}} + y\\]</div>': r"x^{2}} + y",
    _MATH_SPAN.format(r"\(\nosuchmacro{x}\)"): r"\nosuchmacro",  # undefined macro
    '<img alt="remote" src="https://example.com/pixel.png">': "https://example.com/pixel.png",
    '<a href="no_such_page.html">dangling</a>': "no_such_page.html",
    # a widget whose second value has no figure drawn: moving it shows nothing
    '<div class="cell_output"><div class="course-widget"><div class="course-widget-controls">'
    '<label>dead <select data-control="0"><option value="0" selected>a</option>'
    '<option value="1">b</option></select></label></div><img class="course-widget-frame" '
    'data-key="0" alt="a" src="data:image/svg+xml;base64,' + _DOT_SVG + '"></div></div>':
        "moving 'dead' did not change the figure",
}


@pytest.fixture(scope="module")
def broken(browsers, site, tmp_path_factory) -> tuple[str, sc.PageReport, sc.PageReport]:
    """A copy of the site with one page (the first with math) broken on purpose by
    ``_INJECTED`` and ``_LAYOUT_INJECTED`` (defined below), checked at 1280 px and, for the
    layout, at 400 px."""
    target = next((doc for doc in CHAPTERS + DOCS
                   if 'class="math notranslate nohighlight"' in
                   (site / f"{doc}.html").read_text(encoding="utf-8")), None)
    assert target is not None, "no page of the site has math to break"
    copy = tmp_path_factory.mktemp("broken") / "html"
    shutil.copytree(site, copy)
    (copy / target).parent.joinpath("tiny_text.svg").write_text(
        _TINY_SVG.format(size=6, label="tiny image label"), encoding="utf-8")
    page_file = copy / f"{target}.html"
    text = page_file.read_text(encoding="utf-8")
    marker = re.search(r"<section[^>]*>", text)
    assert marker is not None, f"{target}.html has no <section> to inject into"
    injected = "\n".join([*_INJECTED, *_LAYOUT_INJECTED, f"<p>注意力 {_NO_FONT_HAS}</p>"])
    page_file.write_text(text[:marker.end()] + injected + text[marker.end():], encoding="utf-8")

    laptop, phone_browser = browsers
    with sc.serve(copy) as base:
        context = laptop.new_context(service_workers="block",
                                     viewport={"width": sc.WIDE, "height": 800})
        wide = sc.check_page(context, base, f"{target}.html")
        context.close()
        phone = phone_browser.new_context(service_workers="block",
                                          viewport={"width": sc.NARROW, "height": 800})
        narrow = sc.check_layout_pages(phone, base, [f"{target}.html"], sc.NARROW)
        phone.close()
    return target, wide, narrow[f"{target}.html"]


def test_checker_reports_broken_math_with_page_and_formula(broken):
    """Break a copy of a built page on purpose: the checker must name page and formula."""
    target, report, _ = broken
    failures = report.failures()
    for needle in _INJECTED.values():
        assert any(needle in line and line.startswith(f"{target}.html:") for line in failures), (
            f"the checker did not report {needle!r} on {target}.html; it reported:\n"
            + "\n".join(failures))
    assert report.formulas > 0, "MathJax typeset nothing on the broken copy"
    assert any("request to another host" in line for line in failures)


@pytest.mark.parametrize("doc", CHAPTERS)
def test_exercise_solutions_hide_their_output_on_the_site(site, doc):
    """A solution's output is its answer: the page must fold it away with the code."""
    html = (site / f"{doc}.html").read_text(encoding="utf-8")
    classes = re.findall(r'<div class="cell ([^"]*)"', html)
    solutions = [c.split() for c in classes if "tag_hide-input" in c.split()]
    assert solutions, f"{doc}: no exercise solutions found on the page"
    shown = [c for c in solutions if "tag_hide-output" not in c and "tag_hide-cell" not in c]
    assert not shown, f"{doc}: {len(shown)} solution(s) show their output on the site"


# What is injected into a copy of a chapter page -> what the report must name. Each one
# undoes a fix of the site on purpose: a page wider than the window, an inline formula
# clipped by its box (the theme's span.math before course.css), SVG text of 6 px inline
# and in an <img>, raw TeX, a solution with myst-nb's own two toggles, Chinese characters
# no font has (CJK extension G: missing-glyph boxes even with a CJK font installed).
_TINY_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="200" height="40" '
             'viewBox="0 0 200 40"><text x="4" y="20" font-size="{size}">{label}</text></svg>')
_LAYOUT_INJECTED = {
    '<div style="width: 1500px">a line wider than any window</div>': "px wide: div",
    '<p><span class="math notranslate nohighlight" style="overflow: hidden">'
    r'\(a_1 + a_2 + a_3 + a_4 + a_5 + a_6 + a_7 + a_8 + a_9 + a_{10} + a_{11} + a_{12} + '
    r'a_{13} + a_{14} + a_{15} + a_{16} + a_{17} + a_{18} + a_{19} + a_{20} + a_{21} + '
    r'a_{22} + a_{23} + a_{24} + a_{25} + a_{26} + a_{27} + a_{28} + a_{29}\)</span></p>':
        "formula cut off",
    _TINY_SVG.format(size=6, label="tiny inline label"): "'tiny inline label' is 6.0 px",
    '<img alt="a tiny figure" src="tiny_text.svg" width="200" height="40">':
        "tiny_text.svg: 'tiny image label' is 6.0 px",
    '<p>Schr{\\"o}dinger \\&amp; $O(n^2)$ memory</p>': "raw TeX in the text",
    '<div class="cell tag_hide-input tag_hide-output docutils container">'
    '<details class="hide above-input"><summary><p>Show code cell source</p></summary>'
    '<div class="cell_input">answer = 42</div></details>'
    '<div class="cell_output"><pre>42</pre></div></div>':
        'reads "Show code cell source", not Solution',
    # issue 35: an inline formula that scrolls although it fits its line (what course.css
    # once did to every formula), a display formula and a code line that 1280 px cannot
    # show, a code block that scrolls on a phone without a fade, a table with a long word
    '<p><span class="math notranslate nohighlight" style="overflow-x: auto; max-width: 2em">'
    r'\(x + y + z\)</span></p>': "inline formula scrolls",
    '<div class="math notranslate nohighlight">\\['
    + " + ".join(f"b_{{{i}}}" for i in range(1, 81)) + '\\]</div>': "display formula hides",
    '<div class="highlight"><pre>cut = 1  # ' + "far " * 60 + '</pre></div>': "code block cut by",
    '<pre style="overflow-x: auto; white-space: pre">no_fade = 2  # ' + "far " * 60 + '</pre>':
        "without a fade",
    '<div class="pst-scrollable-table-container"><table class="table"><tr><td>'
    + "Pneumonoultramicroscopicsilicovolcanoconiosis" * 2 + '</td></tr></table></div>':
        "table wider than its column",
    # issue 44: a figure wider than its box, which scrolls; a widget's figure shifted 16 px
    # left in the box of its output, which scrolls what is wider and cuts the rest
    '<div class="cell_output"><div style="overflow-x: auto; width: 200px"><img alt="a wide '
    'figure" src="tiny_text.svg" width="600" height="40" style="max-width: none"></div></div>':
        "figure box scrolls",
    '<div class="cell_output"><div class="output" style="overflow-x: auto"><div '
    'class="course-widget-frames"><img alt="a shifted figure" src="tiny_text.svg" '
    'style="margin-left: -16px" width="200" height="40"></div></div></div>':
        "px cut by its box (div.output, which scrolls)",
}
_PHONE_ONLY = {"without a fade"}  # at 1280 px that code block is "cut by" (checked above)
_NO_FONT_HAS = "\U00030000\U00030001\U00030002"


def test_checker_reports_layout_text_and_solution_problems(broken):
    """The same broken copy: the checker must name each layout, text and solution problem
    at 1280 px, the layout ones at 400 px too, and the Chinese characters without a glyph."""
    _, wide, narrow = broken
    failures = wide.failures()
    for needle in _LAYOUT_INJECTED.values():
        if needle in _PHONE_ONLY:
            continue
        assert any(needle in line for line in failures), (
            f"the checker did not report {needle!r} at {sc.WIDE} px; it reported:\n"
            + "\n".join(failures))
    narrow_failures = narrow.failures()
    for needle in ["px wide: div", "formula cut off", "is 6.0 px", "inline formula scrolls",
                   "without a fade", "table wider than its column", "figure box scrolls",
                   "px cut by its box (div.output, which scrolls)"]:
        assert any(needle in line and f"at {sc.NARROW} px" in line
                   for line in narrow_failures), (
            f"the checker did not report {needle!r} at {sc.NARROW} px; it reported:\n"
            + "\n".join(narrow_failures))
    assert set(_NO_FONT_HAS) <= set(wide.cjk_missing), (
        f"characters no font has were not reported as boxes: {wide.cjk_missing}")
    assert wide.smallest_svg_text_px == pytest.approx(6.0, abs=0.05)


# ------------------------------------------------------------------ the whole book as a PDF

BOOK_PDF = sc.ROOT / "_build" / "pdf" / "course_attn.pdf"  # make pdf (tools/print_pdf.py)
SINGLEHTML = sc.ROOT / "_build" / "singlehtml"
# raw TeX in the text of a PDF: a control word, \( \[ or $$ (code, in a monospace font, is
# not read: Python has its own backslashes)
_PDF_RAW_TEX = re.compile(r"\\[A-Za-z]{2,}|\\[()\[\]]|\$\$")


def _squeeze(text: str) -> str:
    """Text to compare: no spaces (the PDF has some where glyphs were kerned apart) and
    ligatures spelt out (NFKC: the "fi" of "Simplified" is one glyph, U+FB01)."""
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text))


def _chapter_titles() -> list[str]:
    """Each chapter's title: its notebook's first line ("# Chapter 4: Scaled ...")."""
    titles = []
    for doc in CHAPTERS:
        cells = json.loads(sc.notebook_source(doc).read_text())["cells"]
        first = "".join(cells[0]["source"]).splitlines()[0]
        titles.append(first.lstrip("#").strip())
    return titles


@functools.cache
def _read_book_pdf() -> pdf_text.Pdf | None:
    return pdf_text.read(BOOK_PDF) if BOOK_PDF.is_file() else None


@pytest.fixture(scope="module")
def book_pdf() -> pdf_text.Pdf:
    pdf = _read_book_pdf()
    if pdf is None:
        pytest.skip(f"no {BOOK_PDF.relative_to(sc.ROOT)}: run `make pdf` to build and check it")
    return pdf


# Headings tools/print_pdf.py adds to the printed page (each chapter's solutions).
_PRINTED_HEADINGS = [r"Solutions to the exercises of chapter \d+", "Solutions"]
_HEADING = re.compile(r"<(h[1-6])\b[^>]*>(.*?)</\1>|<p\b[^>]*role=\"heading\"[^>]*>(.*?)</p>",
                      re.S)
_MATH = "\x00"  # where a heading has a formula


def heading_patterns(html: str) -> list[re.Pattern]:
    """What a bookmark may read, one pattern per heading of the single-page HTML (and each
    caption the theme marks role="heading"): its text without the "#" link, runs of spaces
    as one, a formula as any text of its own (its plain text, "T_q < T_k")."""
    patterns = [re.compile(p) for p in _PRINTED_HEADINGS]
    for found in _HEADING.finditer(html):
        inner = found.group(2) if found.group(2) is not None else found.group(3)
        inner = re.sub(r'<a class="headerlink".*?</a>', "", inner, flags=re.S)
        inner = re.sub(r'<span class="math[^"]*">.*?</span>', _MATH, inner, flags=re.S)
        text = " ".join(unescape(re.sub(r"<[^>]+>", "", inner)).split())
        if text:
            patterns.append(re.compile(r"\s*".join(
                r"\S.*?" if part == _MATH else re.escape(part).replace(r"\ ", r"\s")
                for part in re.split(f"({_MATH})", text) if part)))
    return patterns


def doubled_titles(outline: list[str]) -> list[str]:
    """Bookmarks whose title starts with a run of text written twice ("GPUsGPUs")."""
    return [t for t in outline if re.match(r"\s*(.{3,}?)\1", t)]


def bad_bookmarks(outline: list[str], patterns: list[re.Pattern]) -> list[str]:
    """Bookmarks that are no heading's text: a title written twice, words run together where
    it wrapped ("Scaled dot-productattention"), a formula missing ("train at , test at ")."""
    return [t for t in outline
            if not any(p.fullmatch(" ".join(t.split())) for p in patterns)]


def _pdf_counts() -> dict[str, int] | None:
    """For the summary line: pages, blank pages, bookmarks, doubled and bad titles."""
    pdf = _read_book_pdf()
    if pdf is None:
        return None
    html = SINGLEHTML / "book" / "intro.html"
    patterns = heading_patterns(html.read_text(encoding="utf-8")) if html.is_file() else []
    return {"pages": len(pdf.pages), "blank": sum(page.blank for page in pdf.pages),
            "bookmarks": len(pdf.outline), "doubled": len(doubled_titles(pdf.outline)),
            "bad": len(bad_bookmarks(pdf.outline, patterns)) if patterns else -1}


def test_pdf_has_no_blank_pages(book_pdf):
    """Issue 44: no page is blank but for its footer (there were 4 of 428: after chapter 7's
    last solution, and before each of three figures taller than a page)."""
    blank = [page.number for page in book_pdf.pages if page.blank]
    assert not blank, (f"{len(blank)} of {len(book_pdf.pages)} pages of {BOOK_PDF.name} are "
                       f"blank but for the footer: pages {blank}")


def test_pdf_bookmarks_are_the_headings(book_pdf):
    """Issue 44: each bookmark reads as its heading does: not twice ("GPUsGPUs": 41 of 222
    titles), with the space where the heading wrapped ("Scaled dot-productattention") and
    the text of its formulas."""
    html = SINGLEHTML / "book" / "intro.html"
    if not html.is_file():
        pytest.skip(f"no {html.relative_to(sc.ROOT)} (make pdf writes it)")
    patterns = heading_patterns(html.read_text(encoding="utf-8"))
    assert len(book_pdf.outline) >= 10 * len(CHAPTERS), (
        f"only {len(book_pdf.outline)} bookmarks in {BOOK_PDF.name}")
    doubled = doubled_titles(book_pdf.outline)
    assert not doubled, f"{len(doubled)} bookmarks written twice: {doubled[:10]}"
    bad = bad_bookmarks(book_pdf.outline, patterns)
    assert not bad, (f"{len(bad)} of {len(book_pdf.outline)} bookmarks are no heading's text: "
                     f"{bad[:10]}")


def test_bookmark_checks_catch_what_the_pdf_had():
    """The two checks above fail on the faults issue 44 found in the PDF."""
    html = ('<h2>GPUs<a class="headerlink" href="#gpus">#</a></h2>'
            "<h1>Chapter 4: Scaled dot-product attention</h1>"
            '<h2>10.7 Length extrapolation: train at <span class="math notranslate '
            'nohighlight">\\(T\\)</span>, test at <span class="math notranslate nohighlight">'
            "\\(2T\\)</span></h2>")
    patterns = heading_patterns(html)
    good = ["GPUs", "Chapter 4: Scaled dot-product attention",
            "10.7 Length extrapolation: train at T, test at 2T", "Solutions"]
    faulty = ["GPUsGPUs", "Chapter 4: Scaled dot-productattention",
              "10.7 Length extrapolation: train at , test at "]
    assert bad_bookmarks(good, patterns) == []
    assert bad_bookmarks(faulty, patterns) == faulty
    assert doubled_titles([*good, *faulty]) == ["GPUsGPUs"]
    footer_only = pdf_text.Page(206, {"DejaVuSans": "206 / 428"})
    assert footer_only.blank
    assert not pdf_text.Page(207, {"DejaVuSans": "206 / 428", "F": "Chapter 8"}).blank
    assert not pdf_text.Page(208, {"DejaVuSans": "208 / 428"}, xobjects=1).blank


def test_pdf_has_every_chapter(book_pdf):
    """make pdf: one PDF of the whole book: a page count that fits it, and every chapter's
    title both in the outline (bookmarks) and on a page, in the toc's order."""
    pages = len(book_pdf.pages)
    assert 20 * len(CHAPTERS) <= pages <= 2000, f"{BOOK_PDF.name} has {pages} pages"
    outline = [_squeeze(t) for t in book_pdf.outline]
    texts = [_squeeze(page.text) for page in book_pdf.pages]
    last_page = 0
    for title in _chapter_titles():
        wanted = _squeeze(title)
        assert wanted in outline, f"{title!r} is not in the PDF's outline"
        found = [page for page, text in enumerate(texts, 1) if wanted in text
                 and page > last_page]
        assert found, f"{title!r} is on no page after page {last_page}"
        last_page = found[0]


def test_pdf_shows_no_raw_tex(book_pdf):
    """Every formula was typeset by MathJax before printing: no page's text (outside code)
    holds TeX source such as \\frac, \\( or $$."""
    raw = []
    for page in book_pdf.pages:
        for font, text in page.text_by_font.items():
            if "Mono" in font:
                continue
            for found in _PDF_RAW_TEX.finditer(_squeeze(text)):
                raw.append(f"page {page.number} ({font}): "
                           f"...{_squeeze(text)[max(0, found.start() - 30):found.end() + 30]}...")
    assert not raw, f"{len(raw)} place(s) with raw TeX:\n" + "\n".join(raw[:10])


def test_pdf_figures_are_vectors_with_real_text(book_pdf):
    """The figures are the site's SVG files printed as vectors: their labels are text in the
    PDF (a figure printed as a picture would have none)."""
    images = sorted((SINGLEHTML / "_images").glob("*.svg"))
    if not images:
        pytest.skip(f"no {SINGLEHTML.relative_to(sc.ROOT)}/_images (make pdf writes it)")
    text = _squeeze(book_pdf.text)
    labels = {}
    for image in images:
        found = re.findall(r"<text\b[^>]*>([^<]{4,})</text>", image.read_text(encoding="utf-8"))
        if found:
            labels[image.name[:12]] = max(found, key=len).strip()
    missing = {name: label for name, label in labels.items() if _squeeze(label) not in text}
    assert len(labels) >= len(CHAPTERS), f"only {len(labels)} figures with labels"
    assert len(missing) <= len(labels) // 20, (
        f"{len(missing)} of {len(labels)} figures' labels are not text in the PDF: {missing}")


def test_site_links_the_pdf(crawl, site):
    """A site built after make pdf holds the PDF and links it from every page's download
    menu (and the crawl checked that the link loads)."""
    if not BOOK_PDF.is_file():
        pytest.skip("no PDF built (make pdf), so the site has none to link")
    if not (site / BOOK_PDF.name).is_file():
        pytest.skip(f"the site was built before {BOOK_PDF.relative_to(sc.ROOT)} existed "
                    "(make pdf html links it)")
    unlinked = [doc for doc in DOCS if not (crawl[doc].book_pdf_link or "").endswith(
        "/" + BOOK_PDF.name)]
    assert not unlinked, f"pages without the whole-book PDF in their download menu: {unlinked}"
