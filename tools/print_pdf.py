"""Print the whole course as one PDF, without LaTeX: ``make pdf``.

``jupyter-book build . --builder singlehtml`` writes every page of ``_toc.yml`` into one HTML
page (``_build/singlehtml/book/intro.html``). This script serves that folder on 127.0.0.1,
opens the page in the headless Chromium the site test uses (playwright, offline: every other
host is refused), waits for MathJax to typeset every formula and for every figure, prepares
the page for paper and prints it with Chromium's own PDF writer:

- each part of the book (intro, set-up, each chapter, glossary ...) starts on a new page; the
  PDF has an outline (bookmarks) built from the headings, and page numbers in the footer;
- figures are the site's SVG files, printed as vectors (sharp at any zoom); formulas are
  MathJax's, typeset before printing; course.js sizes formulas and figures for the paper's
  column as it does for a screen (figure text at least 12 px), and a display formula still
  wider than the column is drawn smaller until it fits;
- code wraps instead of scrolling; widgets (which need a kernel) are left out: each has its
  static figure beside it;
- exercise solutions are printed at the end of their chapter, under "Solutions", each exercise
  pointing there; they are not folded (paper has no toggles);
- no blank pages and clean bookmarks (issue 44): ``PRINT_CSS`` says what in Chromium's
  printing made four blank pages and 32 doubled bookmark titles, and how it is avoided.

Usage: ``python tools/print_pdf.py [SINGLEHTML_DIR] [OUT_PDF]`` (defaults
``_build/singlehtml`` and ``_build/pdf/course_attn.pdf``). Needs Chromium (``chromium`` on
PATH, as for the site test). ``make html`` copies the PDF into the site when it exists
(tools/course_site.py), and every page's download menu then links it.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = "book/intro.html"  # the root document of _toc.yml, with every other one inside
# Sphinx writes that page's links for the folder's root (_static/..., _images/...), not for
# book/: it is printed from a copy at the root.
PRINTED = "course_attn_print.html"
TIMEOUT_MS = 120_000
# A4 at 96 px per inch is 794 px wide; 14 mm margins leave a 688 px column, the site's.
MARGIN_MM = 14
COLUMN_PX = 688

PRINT_CSS = """
@page { size: A4; }
html, body { background: #fff !important; }
.course-print-part { break-before: page; }
.course-print-part:first-of-type { break-before: auto; }
div.highlight pre, div.cell_output pre, pre {
  white-space: pre-wrap !important; overflow: visible !important; overflow-wrap: anywhere;
}
.course-more-right, .course-more-left { -webkit-mask-image: none !important;
  mask-image: none !important; }
div.cell_output .widget-subarea, .jupyter-widgets, .course-print-widget {
  display: none !important; }
div.cell.course-solution > details > summary { display: none !important; }
/* A solution's fold keeps the theme's admonition margin (1.5625em) above it, not below: at
   the end of a chapter that bottom margin made Chromium print a page of its own, blank but
   for the footer (chapters 3 and 7); the next exercise's label has a margin of its own. */
div.cell.course-solution > details.admonition { margin-bottom: 0 !important; }
div.cell_output img, figure img { break-inside: avoid; }
/* A figure taller than the page (chapter 11's stacked heatmaps) was pushed to a new page,
   leaving a blank one before it, and still cut at its foot: every figure fits one page's
   height (A4 less the margins is 265 mm; 235 mm leaves room for its caption), drawn smaller
   and centred in its box where it must be (object-fit; course.js set its width). */
div.cell_output img, figure img { max-height: 235mm; object-fit: contain; }
h1, h2, h3, h4 { break-after: avoid; }
/* The PDF's bookmarks are the headings, titled by Skia (Chromium's PDF writer) with the text
   it draws inside each heading, run after run. Two things spoilt them:
   - a heading at the top of a page was also drawn, clipped away, on the page before: its
     glyphs reached above its line box (the theme's line-height of 1.15 is less than the
     font's ascent plus descent), so they crossed the page's edge, and its title came out
     twice ("GPUsGPUs"; 32 such titles). With 1.3 the glyphs stay inside the line box;
   - the space where a title wraps is not drawn, so its words ran together ("Scaled
     dot-productattention"); with pre-wrap the space stays at the line's end and is drawn. */
h1, h2, h3, h4, h5, h6 { line-height: 1.3 !important; white-space: pre-wrap; }
.course-print-mathtext { font-size: 1px; color: transparent; }
.course-print-solutions h3 { break-before: auto; }
.course-print-see { font-style: italic; }
.course-print-label { break-after: avoid; margin: 1.2em 0 0.3em; }
button.copybtn, .headerlink, .toggle-details__summary { display: none !important; }
"""

# Parts and solutions, then formulas that do not fit the paper's column.
PREPARE_JS = r"""async () => {
  const parts = Array.from(document.querySelectorAll('span[id^="document-"]'));
  let moved = 0, chapters = 0;
  for (const span of parts) {
    let part = span.nextElementSibling;
    while (part && part.tagName !== 'SECTION') part = part.nextElementSibling;
    if (!part) continue;
    part.classList.add('course-print-part');
    const solutions = Array.from(part.querySelectorAll('div.cell.course-solution'));
    if (!solutions.length) continue;
    chapters += 1;
    const heading = part.querySelector('h1, h2');
    const title = heading ? heading.textContent.replace(/#$/, '').trim() : '';
    const number = (title.match(/^Chapter (\d+)/) || [])[1];
    const box = document.createElement('section');
    box.className = 'course-print-solutions';
    const h = document.createElement('h3');
    h.textContent = number ? `Solutions to the exercises of chapter ${number}` : 'Solutions';
    box.appendChild(h);
    for (const cell of solutions) {
      // its exercise: "Exercise 4.1" in the text before it, or in the code's first comment
      let label = '';
      for (let el = cell.previousElementSibling, i = 0; el && i < 8 && !label;
           el = el.previousElementSibling, i += 1) {
        label = (el.textContent.match(/Exercise (\d+\.\d+)/) || [])[0] || '';
      }
      if (!label) label = (cell.textContent.match(/Exercise (\d+\.\d+)/) || [])[0] || '';
      if (label) {
        const name = document.createElement('p');
        name.className = 'course-print-label';
        name.innerHTML = `<strong>${label}</strong>`;
        box.appendChild(name);
      }
      const note = document.createElement('p');
      note.className = 'course-print-see';
      note.textContent = number ? `Solution: at the end of chapter ${number}.`
                                : 'Solution: at the end of this part.';
      cell.before(note);
      cell.querySelectorAll('details').forEach(d => { d.open = true; });
      box.appendChild(cell);
      moved += 1;
    }
    part.appendChild(box);
  }
  // A widget's output is empty without a kernel; its static figure follows it.
  document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')
    .forEach(s => {
      const out = s.closest('.cell_output');
      if (out) out.classList.add('course-print-widget');
    });
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  // Bookmarks (see PRINT_CSS): a heading's title is the text drawn inside it. Its spaces at
  // either end would be kept by pre-wrap (" Contents "), so they go; and a formula, which
  // MathJax draws as CSS-generated glyphs, gave no text at all ("10.7 Length extrapolation:
  // train at , test at "), so each formula of a heading also gets its plain text, from
  // MathJax's MathML ("T_q < T_k"), drawn in a transparent 1 px font beside it: it is in the
  // title and the PDF's text, and changes nothing a reader sees.
  const plain = node => {
    const kids = Array.from(node.children);
    const name = node.localName;
    if (name === 'msub' || name === 'msup') {
      return plain(kids[0]) + (name === 'msub' ? '_' : '^') + plain(kids[1]);
    }
    const text = kids.length ? kids.map(plain).join('') : node.textContent.trim();
    return name === 'mo' && /^[<>=≤≥≠]$/.test(text) ? ` ${text} ` : text;
  };
  let bookmarks = 0;
  for (const heading of document.querySelectorAll('h1, h2, h3, h4, h5, h6')) {
    for (const math of heading.querySelectorAll('mjx-container')) {
      const mml = math.querySelector('mjx-assistive-mml math');
      if (!mml || (math.nextSibling && math.nextSibling.className === 'course-print-mathtext'))
        continue;
      const text = document.createElement('span');
      text.className = 'course-print-mathtext';
      text.textContent = plain(mml);
      math.after(text);
      bookmarks += 1;
    }
    const walker = document.createTreeWalker(heading, NodeFilter.SHOW_TEXT);
    const texts = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (!n.parentElement.closest('.headerlink, mjx-container')) texts.push(n);
    }
    texts.forEach(n => { n.nodeValue = n.nodeValue.replace(/\s+/g, ' '); });
    if (texts.length) {
      texts[0].nodeValue = texts[0].nodeValue.trimStart();
      const last = texts[texts.length - 1];
      last.nodeValue = last.nodeValue.trimEnd();
    }
  }
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  if (window.courseSite) await window.courseSite.fit();
  let shrunk = 0;
  for (const box of document.querySelectorAll('mjx-container[display="true"]')) {
    const math = box.querySelector('mjx-math');
    if (!math || box.clientWidth === 0) continue;
    const width = math.getBoundingClientRect().width, room = box.clientWidth;
    if (width > room + 0.5) {
      const now = parseFloat(math.style.fontSize || '100') / 100;
      math.style.fontSize = (100 * now * room / width * 0.99).toFixed(1) + '%';
      shrunk += 1;
    }
  }
  return {parts: parts.length, chapters_with_solutions: chapters, solutions: moved, shrunk,
          bookmarks};
}"""

FOOTER = ('<div style="font-size: 8px; width: 100%; text-align: center; color: #555;">'
          '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        sys.exit("print_pdf: Chromium not found (Debian/Ubuntu: apt-get install chromium)")
    return path


def print_pdf(folder: Path, out: Path) -> dict:
    from playwright.sync_api import sync_playwright

    if not (folder / PAGE).is_file():
        sys.exit(f"print_pdf: no {folder / PAGE}; run "
                 "`jupyter-book build . --builder singlehtml` first (make pdf does)")
    shutil.copyfile(folder / PAGE, folder / PRINTED)
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    errors: list[str] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium(),
                                                 args=["--no-proxy-server"])
            page = browser.new_page(viewport={"width": COLUMN_PX, "height": 1000})
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base)
                       else r.abort())
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.emulate_media(media="print")
            page.goto(base + PRINTED, wait_until="load", timeout=TIMEOUT_MS)
            page.wait_for_function("() => window.MathJax && MathJax.startup && "
                                   "MathJax.startup.document", timeout=TIMEOUT_MS)
            typeset = page.evaluate("""async () => {
              await MathJax.startup.promise;
              if (document.fonts) await document.fonts.ready;
              document.querySelectorAll('img[loading="lazy"]')
                .forEach(i => { i.loading = 'eager'; });
              const out = {formulas: 0, errors: 0, untypeset: 0};
              for (const item of MathJax.startup.document.math) out.formulas += 1;
              out.errors = document.querySelectorAll('mjx-merror').length;
              out.untypeset = Array.from(document.querySelectorAll('.math'))
                  .filter(el => !el.querySelector('mjx-container')).length;
              return out;
            }""")
            page.wait_for_function("() => Array.from(document.images).every(i => i.complete)",
                                   timeout=TIMEOUT_MS)
            prepared = page.evaluate(PREPARE_JS)
            page.add_style_tag(content=PRINT_CSS)
            out.parent.mkdir(parents=True, exist_ok=True)
            margin = f"{MARGIN_MM}mm"
            page.pdf(path=str(out), format="A4", print_background=True, outline=True,
                     tagged=True, display_header_footer=True, header_template="<div></div>",
                     footer_template=FOOTER,
                     margin={"top": margin, "bottom": "18mm", "left": margin, "right": margin})
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    if typeset["errors"] or typeset["untypeset"]:
        sys.exit(f"print_pdf: MathJax left {typeset['errors']} error(s) and "
                 f"{typeset['untypeset']} untypeset formula(s); no PDF is trusted")
    return {**typeset, **prepared, "page_errors": errors}


def main(argv: list[str]) -> int:
    folder = Path(argv[1]) if len(argv) > 1 else ROOT / "_build" / "singlehtml"
    out = Path(argv[2]) if len(argv) > 2 else ROOT / "_build" / "pdf" / "course_attn.pdf"
    start = time.perf_counter()
    report = print_pdf(folder, out)
    print(f"print_pdf: {out} ({out.stat().st_size / 1e6:.1f} MB, "
          f"{time.perf_counter() - start:.0f} s): {report['parts']} parts, "
          f"{report['formulas']} formulas typeset, {report['solutions']} solutions moved to the "
          f"end of {report['chapters_with_solutions']} chapters, {report['shrunk']} display "
          f"formulas drawn smaller to fit the paper, {report['bookmarks']} formulas of headings "
          f"given text for the bookmarks"
          + (f"; page errors: {report['page_errors']}" if report["page_errors"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
