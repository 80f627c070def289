"""The README agrees with the book: its chapter list is the table of contents' chapters, in
order, under each notebook's own title; it names the address the site is published at.

These tests read README.md, _toc.yml, _config.yml, the notebooks' JSON and the workflow
files only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TITLE = re.compile(r"#\s+Chapter\s+(\d+):\s+(.+?)\s*$")
ITEM = re.compile(r"^(\d+)\.\s+\*\*(.+?)\*\*", re.MULTILINE)


def _toc_chapters() -> list[Path]:
    """The notebooks of _toc.yml, in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("file"), str):
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    paths = [ROOT / f"{f.removesuffix('.ipynb')}.ipynb" for f in files]
    return [p for p in paths if p.is_file()]


def _chapter_title(notebook: Path) -> tuple[int, str]:
    """Number and title of the first markdown heading, "# Chapter N: Title"."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    first = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    source = "".join(first["source"]) if isinstance(first["source"], list) else first["source"]
    match = TITLE.match(source.strip().splitlines()[0])
    assert match, f"{notebook.name}: the first markdown cell is not '# Chapter N: ...'"
    return int(match.group(1)), match.group(2)


def _readme_section(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## )", text, re.DOTALL | re.MULTILINE)
    assert match, f"README.md has no '## {heading}' section"
    return match.group(1)


def test_readme_lists_the_chapters_of_the_toc_under_their_titles():
    chapters = [_chapter_title(nb) for nb in _toc_chapters()]
    assert len(chapters) >= 11, f"_toc.yml lists only {len(chapters)} chapter notebooks"
    assert [n for n, _ in chapters] == list(range(1, len(chapters) + 1)), (
        f"the toc's chapters are not numbered 1, 2, 3, ... in order: {chapters}")
    listed = [(int(n), title) for n, title in ITEM.findall(_readme_section("Chapters"))]
    assert listed == chapters, (
        "README.md's chapter list differs from _toc.yml's chapters "
        "(number, title of the notebook's '# Chapter N: ...' heading):\n"
        f"README: {listed}\ntoc:    {chapters}")


def _pages_url() -> str:
    """GitHub Pages' address for repository.url: https://OWNER.github.io/REPO/."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    url = config["repository"]["url"].rstrip("/").removesuffix(".git")
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+)", url)
    assert match, f"repository.url is not a GitHub repository: {url}"
    owner, repo = match.groups()
    return f"https://{owner.lower()}.github.io/{repo}/"


def test_readme_names_the_published_site():
    url = _pages_url()
    assert url in _readme_section("The published site"), (
        f"README.md's 'The published site' does not give the address {url}")


def test_workflows_test_and_publish_what_the_readme_says():
    test = yaml.safe_load((ROOT / ".github/workflows/test.yml").read_text(encoding="utf-8"))
    pages = yaml.safe_load((ROOT / ".github/workflows/pages.yml").read_text(encoding="utf-8"))
    runs = [step.get("run", "") for job in test["jobs"].values() for step in job["steps"]]
    assert any(".ci/run" in run for run in runs), "test.yml does not run .ci/run"
    assert all("timeout-minutes" in job for job in [*test["jobs"].values(),
                                                    *pages["jobs"].values()])
    # PyYAML reads the key `on:` as True
    assert pages[True]["push"]["branches"] == ["main"], pages[True]
    steps = [step for job in pages["jobs"].values() for step in job["steps"]]
    uses = [step.get("uses", "") for step in steps]
    # `make pdf book` or `make book`: the site is built by the same target the README names
    makes = [step.get("run", "").split() for step in steps]
    assert any(run[:1] == ["make"] and "book" in run[1:] for run in makes), (
        "pages.yml: no `make ... book`")
    upload = next(s for s in steps if s.get("uses", "").startswith(
        "actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    assert any(u.startswith("actions/deploy-pages@") for u in uses)
    for use in uses:
        if use:
            assert re.search(r"@v\d+\.\d+\.\d+$|@[0-9a-f]{40}$", use), (
                f"action not pinned to a release or a commit: {use}")
