"""How much each chapter page of the built site weighs (issue 44): ``python tools/page_weight.py``.

Serves ``_build/html`` (or the folder given) on 127.0.0.1, opens each chapter page of
``_toc.yml`` in the headless Chromium the site test uses, 1280 x 800 px, and adds up every
response the page gets: its HTML, then everything it loads (scripts, styles, fonts, figures).
Each body is counted as served (uncompressed; ``http.server`` compresses nothing) and as gzip
would send it (level 6, what web servers use by default; GitHub Pages compresses with gzip).

Two numbers per page: on load (the page opened, MathJax done, the network quiet, nothing
scrolled) and after reading it through (scrolled to the end in steps of one screen, so that
lazy figures load, then each widget's controls reached for, which loads its figures drawn
ahead). Prints a Markdown table; ``--json FILE`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import json
import re
import shutil
import sys
import threading
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def chapter_pages(root: Path = ROOT) -> list[str]:
    """The chapter pages of ``_toc.yml`` (notebooks), as paths of the built site."""
    found = re.findall(r"file:\s*(notebooks/\S+)", (root / "_toc.yml").read_text())
    yaml.safe_load((root / "_toc.yml").read_text())  # fails loudly on a broken toc
    return [f"{name.removesuffix('.ipynb')}.html" for name in found]


_QUIET_JS = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
_READ_THROUGH = """async () => {
  const step = Math.max(200, window.innerHeight - 100);
  for (let y = 0; y < document.documentElement.scrollHeight; y += step) {
    window.scrollTo(0, y);
    await new Promise(r => setTimeout(r, 60));
  }
  document.querySelectorAll('div.course-widget').forEach(box => {
    box.dispatchEvent(new Event('pointerenter'));
  });
}"""


def _settle(page, responses: list) -> None:
    page.wait_for_load_state("load")
    page.evaluate("""async () => {
      const mj = window.MathJax;
      if (mj && mj.startup && mj.startup.promise) await mj.startup.promise;
      if (document.fonts) await document.fonts.ready;
    }""")
    page.evaluate(_QUIET_JS)
    seen = -1
    while seen != len(responses):  # until no response came in for 400 ms
        seen = len(responses)
        page.wait_for_timeout(400)


def _weigh(bodies: list[bytes]) -> tuple[int, int]:
    return sum(len(b) for b in bodies), sum(len(gzip.compress(b, 6)) for b in bodies)


def measure(site: Path, pages: list[str]) -> dict[str, dict[str, int]]:
    from playwright.sync_api import sync_playwright

    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        sys.exit("page_weight: Chromium not found (Debian/Ubuntu: apt-get install chromium)")
    out: dict[str, dict[str, int]] = {}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=path,
                                                 args=["--no-proxy-server"])
            for name in pages:
                context = browser.new_context(viewport={"width": 1280, "height": 800},
                                              service_workers="block")
                page = context.new_page()
                page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base)
                           else r.abort())
                responses: list = []
                page.on("response", lambda response, seen=responses: seen.append(response))
                page.goto(base + name, wait_until="load")
                _settle(page, responses)
                loaded = len(responses)
                page.evaluate(_READ_THROUGH)
                _settle(page, responses)
                bodies = []
                for response in responses:
                    try:
                        bodies.append(response.body())
                    except Exception:  # a redirect or an aborted request has no body
                        bodies.append(b"")
                html = bodies[0]
                out[name] = dict(zip(
                    ["html", "html_gz", "load", "load_gz", "read", "read_gz"],
                    [*_weigh([html]), *_weigh(bodies[:loaded]), *_weigh(bodies)],
                    strict=True))
                out[name]["requests_load"], out[name]["requests_read"] = loaded, len(bodies)
                context.close()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return out


def table(weights: dict[str, dict[str, int]]) -> str:
    def mb(n: int) -> str:
        return f"{n / 1e6:.2f}"

    lines = ["| page | HTML MB (gzip) | on load MB (gzip), requests | read through MB (gzip), "
             "requests |", "|---|---|---|---|"]
    for name, w in weights.items():
        short = name.split("/")[-1].removesuffix(".html")
        lines.append(f"| {short} | {mb(w['html'])} ({mb(w['html_gz'])}) | {mb(w['load'])} "
                     f"({mb(w['load_gz'])}), {w['requests_load']} | {mb(w['read'])} "
                     f"({mb(w['read_gz'])}), {w['requests_read']} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site", nargs="?", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv[1:])
    weights = measure(args.site, chapter_pages())
    print(table(weights))
    if args.json:
        args.json.write_text(json.dumps(weights, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
