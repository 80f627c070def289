"""The bibliography parses, and every citation of the book names one of its entries.

A merge that drops a brace leaves ``book/references.bib`` unreadable, and the site and the
PDF stop building; this test says so in a second, with the line, instead of the book build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pybtex.database

ROOT = Path(__file__).resolve().parents[1]
CITE = re.compile(r"\{cite(?::\w+)?\}`([^`]+)`")


def cited_keys() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    paths = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md"))
    for path in paths:
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        else:
            text = path.read_text(encoding="utf-8")
        for group in CITE.findall(text):
            for key in group.split(","):
                found.setdefault(key.strip(), set()).add(path.name)
    return found


def test_the_bibliography_parses_and_has_every_cited_key():
    entries = pybtex.database.parse_file(ROOT / "book" / "references.bib").entries
    missing = {key: sorted(where) for key, where in cited_keys().items() if key not in entries}
    assert not missing, f"cited but not in references.bib: {missing}"


def test_every_entry_has_a_title_authors_a_year_and_an_address():
    entries = pybtex.database.parse_file(ROOT / "book" / "references.bib").entries
    incomplete = [key for key, entry in entries.items()
                  if not {"title", "year"} <= set(entry.fields) or not entry.persons.get("author")
                  or not ({"url", "doi"} & set(entry.fields))]
    assert not incomplete, f"entries without a title, author, year or url: {incomplete}"
