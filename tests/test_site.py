"""The built site in a real headless Chromium, offline (``make site``, after ``make html``).

Every page of ``_toc.yml`` is served from ``_build/html`` on 127.0.0.1 and loaded in
Debian's Chromium; any request to another host is aborted and counted as a failure. See
``tests/site_check.py`` for what is checked on each page. Without Chromium (or without a
built site) the tests skip, except with ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest
import site_check as sc

pytestmark = pytest.mark.site

DOCS = sc.toc_files()
CHAPTERS = [doc for doc in DOCS if sc.notebook_source(doc) is not None]


def _unavailable(reason: str) -> None:
    if sc.in_ci():
        pytest.fail(f"{reason}; CI=true, so the site test fails instead of skipping")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    path = sc.chromium_path()
    if path is None:
        _unavailable("Chromium not found (Debian/Ubuntu: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-proxy-server: the local server must never be reached through a proxy.
        browser = playwright.chromium.launch(executable_path=path,
                                             args=["--no-proxy-server"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def site() -> Path:
    if not (sc.SITE / "index.html").is_file():
        _unavailable(f"no built site at {sc.SITE} (run `make html` first)")
    return sc.SITE


@pytest.fixture(scope="module")
def crawl(browser, site, pytestconfig) -> dict[str, sc.PageReport]:
    """Every toc page (and index.html) checked once; a summary goes to the terminal."""
    reports: dict[str, sc.PageReport] = {}
    with sc.serve(site) as base:
        context = browser.new_context(service_workers="block")
        cache: dict[str, tuple[int, str]] = {}
        for doc in DOCS:
            shot = sc.SHOTS / "chapter01.png" if CHAPTERS and doc == CHAPTERS[0] else None
            reports[doc] = sc.check_page(context, base, f"{doc}.html", cache=cache,
                                         chapter=doc in CHAPTERS, screenshot=shot)
        reports["index"] = sc.check_page(context, base, "index.html", cache=cache,
                                         redirect_to=f"{DOCS[0]}.html",
                                         screenshot=sc.SHOTS / "index.png")
        context.close()
    pages = [reports[doc] for doc in DOCS]
    sizes = {name: sc.tree_size(site / "_static" / name) for name in ("mathjax", "widgets")}
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
    }
    (sc.ROOT / "_build" / "site_report.json").write_text(json.dumps(
        {"summary": summary, "pages": {doc: vars(r) for doc, r in reports.items()}}, indent=1))
    pytestconfig.stash[sc.SUMMARY_KEY] = [
        f"site test: {summary['pages']} pages ({summary['chapter_pages']} chapters), "
        f"{summary['formulas']} formulas, {summary['widgets']} widgets, "
        f"{summary['internal_links']} internal links, {summary['images']} images checked; "
        f"{summary['failures']} failures",
        f"local assets in _build/html/_static: MathJax {sizes['mathjax'] / 1e6:.1f} MB, "
        f"widget scripts {sizes['widgets'] / 1e6:.1f} MB "
        f"(whole site {summary['site_bytes'] / 1e6:.1f} MB); details in _build/site_report.json",
    ]
    return reports


@pytest.mark.parametrize("doc", DOCS)
def test_page_renders_offline(crawl, doc):
    """HTTP 200, a title, links, images, math, widgets, outputs; no failed, foreign or
    erroring request; no console error."""
    failures = crawl[doc].failures()
    assert not failures, f"{len(failures)} problem(s):\n" + "\n".join(failures)


def test_index_redirects_to_the_first_page(crawl):
    failures = crawl["index"].failures()
    assert not failures, "\n".join(failures)


def test_screenshots_written(crawl):
    wanted = [sc.SHOTS / "index.png"] + ([sc.SHOTS / "chapter01.png"] if CHAPTERS else [])
    for shot in wanted:
        assert shot.is_file(), f"missing screenshot {shot}"
        header = shot.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"
        width, height = struct.unpack(">II", header[16:24])
        assert width >= 800 and height >= 600, f"{shot} is only {width}x{height}"


@pytest.mark.parametrize("doc", CHAPTERS)
def test_every_saved_widget_view_is_on_the_page(crawl, doc):
    expected = sc.saved_widget_views(sc.notebook_source(doc))
    assert crawl[doc].widgets == expected, (
        f"{doc}.html: the notebook saves {expected} widget view(s), "
        f"the page shows {crawl[doc].widgets}")


def test_pages_load_nothing_from_other_hosts(site):
    """Static twin of the offline browser check, with a clearer message: which page
    references which remote script, style or image (e.g. a build without npm)."""
    remote = {doc: sc.remote_resources(site / f"{doc}.html") for doc in DOCS
              if (site / f"{doc}.html").is_file()}
    remote = {doc: urls for doc, urls in remote.items() if urls}
    assert not remote, ("pages load files from other hosts (was the site built without "
                        f"`make assets`, i.e. without npm?): {remote}")


# ------------------------------------------------------------- the checker itself fails

_MATH_SPAN = '<span class="math notranslate nohighlight">{}</span>'
_INJECTED = {
    # what is injected into the page -> what the report must name
    _MATH_SPAN.format(r"\(\frac{a}{b\)"): r"\frac{a}{b",  # unbalanced brace
    '<div class="math notranslate nohighlight">\\[x^{2}} + y\\]</div>': r"x^{2}} + y",
    _MATH_SPAN.format(r"\(\nosuchmacro{x}\)"): r"\nosuchmacro",  # undefined macro
    '<img alt="remote" src="https://example.com/pixel.png">': "https://example.com/pixel.png",
    '<a href="no_such_page.html">dangling</a>': "no_such_page.html",
}


def test_checker_reports_broken_math_with_page_and_formula(browser, site, tmp_path):
    """Break a copy of a built page on purpose: the checker must name page and formula."""
    target = next((doc for doc in CHAPTERS + DOCS
                   if 'class="math notranslate nohighlight"' in
                   (site / f"{doc}.html").read_text(encoding="utf-8")), None)
    assert target is not None, "no page of the site has math to break"
    copy = tmp_path / "html"
    shutil.copytree(site, copy)
    page_file = copy / f"{target}.html"
    text = page_file.read_text(encoding="utf-8")
    marker = re.search(r"<section[^>]*>", text)
    assert marker is not None, f"{target}.html has no <section> to inject into"
    text = text[:marker.end()] + "\n".join(_INJECTED) + text[marker.end():]
    page_file.write_text(text, encoding="utf-8")

    with sc.serve(copy) as base:
        context = browser.new_context(service_workers="block")
        report = sc.check_page(context, base, f"{target}.html")
        context.close()
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
