"""Numbered figures and equations, and the references to them (issue 35).

A chapter numbers the display equations and the figures its text builds on, d2l-style, and
its text cites them as {numref}`fig-...` ("Figure 4.2") and {eq}`eq-...` ("(4.3)") instead of
"the figure above" or "the formula below". These tests read the notebooks' JSON and the prose
pages (they never build the book): every reference names a label the book defines, each label
is defined once, every chapter numbers at least one figure and one equation, a numbered figure
sits on a cell that outputs exactly one image (myst-nb wraps every display output of the cell
in the figure, so two would give two figures of one name), and the text no longer points at
figures and formulas by place. The numbers themselves ("Figure 4.2", not Sphinx's book-wide
"Fig. 17") come from ``tools/course_site.py``, tested at the end.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PAGES = sorted((ROOT / "book").glob("*.md"))

REFERENCE = re.compile(r"\{(numref|eq)\}`([^`]+)`")
# A labelled display equation: $$ ... $$ (label), the label on the line that closes it.
EQUATION_LABEL = re.compile(r"\$\$[ \t]*\(([\w-]+)\)[ \t]*$", re.MULTILINE)
# A figure or other target a prose page may define: ```{figure} ... :name: label, (label)=
PAGE_TARGET = re.compile(r"^:name:\s*([\w-]+)\s*$|^\(([\w-]+)\)=\s*$", re.MULTILINE)
# Pointing at a figure or a formula by place instead of by number; what the chapters said
# before issue 35 ("the formula above", "the heatmap below", "the curve below shows", "the
# profile above") and its near relatives.
BY_PLACE = re.compile(
    r"\b(figure|formula|equation|heatmap|plot|curve|profile|diagram|picture)s? "
    r"(above|below)\b|\b(this|that|the) (equation|formula)\b(?! of\b)(?!\s*\{eq\})",
    re.IGNORECASE)


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _figure_name(cell: dict) -> str | None:
    return cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name")


def _display_outputs(cell: dict) -> list[dict]:
    return [out for out in cell.get("outputs", [])
            if out.get("output_type") in {"display_data", "execute_result"}]


def numbering(nb: dict) -> dict[str, list[str]]:
    """What a notebook numbers and cites: ``figures`` and ``equations`` (the labels it
    defines, in order), ``numref`` and ``eq`` (the labels its markdown cites), ``by_place``
    (sentences that point at a figure or formula by place), ``parenthesised`` (an {eq} in
    parentheses, which the site shows as "((4.3))") and ``misplaced`` (a figure name on a cell
    that does not output exactly one image, or on a widget cell)."""
    found: dict[str, list[str]] = {key: [] for key in (
        "figures", "equations", "numref", "eq", "by_place", "parenthesised", "misplaced")}
    for index, cell in enumerate(nb["cells"]):
        source = _source(cell)
        if cell["cell_type"] == "markdown":
            found["equations"] += EQUATION_LABEL.findall(source)
            for role, label in REFERENCE.findall(source):
                found[role].append(label)
            found["by_place"] += [f"cell {index}: ...{source[max(0, m.start() - 40):m.end()]}"
                                  for m in BY_PLACE.finditer(source)]
            found["parenthesised"] += [f"cell {index}: {m.group(0)}" for m in
                                       re.finditer(r"\(\{eq\}`[^`]+`\)", source)]
        name = _figure_name(cell)
        if cell["cell_type"] == "code" and name:
            found["figures"].append(name)
            outputs = _display_outputs(cell)
            images = [out for out in outputs
                      if any(mime.startswith("image/") for mime in out.get("data", {}))]
            if len(outputs) != 1 or len(images) != 1 or "interactive_plot" in source:
                found["misplaced"].append(f"cell {index} ({name}): {len(outputs)} display "
                                          f"outputs, {len(images)} images")
    return found


def _book_labels() -> tuple[list[str], list[str]]:
    """Every figure (and other numbered target) and every equation label of the book."""
    figures: list[str] = []
    equations: list[str] = []
    for path in NOTEBOOKS:
        found = numbering(_load(path))
        figures += found["figures"]
        equations += found["equations"]
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        equations += EQUATION_LABEL.findall(text)
        figures += [a or b for a, b in PAGE_TARGET.findall(text)]
    return figures, equations


notebook_params = pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])


def test_the_checker_finds_what_it_must():
    """The check itself, on a made-up notebook: what it must report and what it must not."""
    image = {"output_type": "display_data", "data": {"image/svg+xml": "<svg/>"}}
    text = {"output_type": "execute_result", "data": {"text/plain": "1"}}

    def code(name, outputs, source="plt.show()"):
        return {"cell_type": "code", "source": source, "outputs": outputs,
                "metadata": {"mystnb": {"figure": {"name": name, "caption": "c"}}}}

    def markdown(source):
        return {"cell_type": "markdown", "source": source, "metadata": {}}

    found = numbering({"cells": [
        markdown("$$a = b$$ (eq-a)\n\nAs the formula above says, see ({eq}`eq-a`) and "
                 "{numref}`fig-a`; the heatmap below."),
        code("fig-a", [image]),
        code("fig-b", [image, text]),
        code("fig-c", [image], source="viz.interactive_plot(draw)"),
        markdown("{eq}`eq-a` is the formula of the Transformer; the curve in "
                 "{numref}`fig-a` falls."),
    ]})
    assert found["equations"] == ["eq-a"]
    assert found["figures"] == ["fig-a", "fig-b", "fig-c"]
    assert found["eq"] == ["eq-a", "eq-a"] and found["numref"] == ["fig-a", "fig-a"]
    assert len(found["by_place"]) == 2  # "the formula above", "heatmap below"
    assert len(found["parenthesised"]) == 1
    assert [m.split(" (")[0] for m in found["misplaced"]] == ["cell 2", "cell 3"]


def test_every_reference_names_a_label_of_the_book():
    figures, equations = _book_labels()
    broken = []
    for path in [*NOTEBOOKS, *PAGES]:
        if path.suffix == ".ipynb":
            found = numbering(_load(path))
            cited = [("numref", label) for label in found["numref"]]
            cited += [("eq", label) for label in found["eq"]]
        else:
            cited = REFERENCE.findall(path.read_text(encoding="utf-8"))
        for role, label in cited:
            if label not in (figures if role == "numref" else equations):
                broken.append(f"{path.name}: {{{role}}}`{label}`")
    assert not broken, "references to labels the book does not define:\n" + "\n".join(broken)


def test_every_label_is_defined_once():
    figures, equations = _book_labels()
    labels = figures + equations
    twice = sorted({label for label in labels if labels.count(label) > 1})
    assert not twice, f"labels defined more than once (Sphinx labels are book-wide): {twice}"
    assert all(label.startswith("fig-") for label in figures), figures
    assert all(label.startswith("eq-") for label in equations), equations


@notebook_params
def test_every_chapter_numbers_a_figure_and_an_equation(path):
    found = numbering(_load(path))
    assert found["figures"], f"{path.name}: no numbered figure"
    assert found["equations"], f"{path.name}: no numbered equation"


@notebook_params
def test_a_numbered_figure_is_one_image(path):
    misplaced = numbering(_load(path))["misplaced"]
    assert not misplaced, f"{path.name}: figure names on the wrong cells:\n" + "\n".join(misplaced)


@notebook_params
def test_figures_and_formulas_are_cited_by_number(path):
    found = numbering(_load(path))
    assert not found["by_place"], (
        f"{path.name}: cite the figure or equation by its number ({{numref}}`fig-...`, "
        "{eq}`eq-...`):\n" + "\n".join(found["by_place"]))
    assert not found["parenthesised"], (
        f"{path.name}: {{eq}} already draws the parentheses, so ({{eq}}`...`) shows "
        "((4.3)):\n" + "\n".join(found["parenthesised"]))


# --- "Figure 4.2", not "Fig. 17": tools/course_site.py --------------------------------------


def _course_site():
    spec = importlib.util.spec_from_file_location("course_site", ROOT / "tools" / "course_site.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("course_site", module)
    spec.loader.exec_module(module)
    return module


def test_figures_and_equations_are_numbered_by_chapter():
    """Sphinx counts through the whole book when the toctree is not numbered; the extension
    turns its count into (chapter, k), k from 1 in each chapter, and leaves prose pages."""
    course_site = _course_site()
    env = SimpleNamespace(toc_fignumbers={
        "notebooks/04_scaled_dot_product": {
            "figure": {"fig-sdpa-graph": (6,), "fig-dot-variance": (7,)},
            "displaymath": {"equation-a": (9,), "equation-b": (10,), "equation-c": (11,)}},
        "notebooks/11_mini_transformer": {"figure": {"fig-minigpt": (40,)}},
        "book/notation": {"displaymath": {"equation-n": (3,)}},
    })
    assert course_site._number_by_chapter(None, env) == []
    numbers = env.toc_fignumbers
    assert numbers["notebooks/04_scaled_dot_product"] == {
        "figure": {"fig-sdpa-graph": (4, 1), "fig-dot-variance": (4, 2)},
        "displaymath": {"equation-a": (4, 1), "equation-b": (4, 2), "equation-c": (4, 3)}}
    assert numbers["notebooks/11_mini_transformer"] == {"figure": {"fig-minigpt": (11, 1)}}
    assert numbers["book/notation"] == {"displaymath": {"equation-n": (3,)}}


def test_the_site_says_figure_not_fig():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert config["sphinx"]["config"]["numfig_format"]["figure"] == "Figure %s"


def _images(cell: dict) -> bool:
    return any(key.startswith("image/") for out in cell.get("outputs", [])
               for key in out.get("data", {}))


@notebook_params
def test_every_figure_a_chapter_draws_is_numbered(path):
    """Issue 44's rule: every figure a chapter shows, a widget's static fallback and an
    exercise's solution included, is a numbered figure (a name, hence a caption and a
    number); a widget's own frames are drawn ahead into the site and carry no number."""
    cells = _load(path)["cells"]
    unnamed = [f"cell {i}: {_source(c)[:60]!r}" for i, c in enumerate(cells)
               if c["cell_type"] == "code" and _images(c) and not _figure_name(c)]
    assert not unnamed, f"{path.name}: figures without a number:\n" + "\n".join(unnamed)


@notebook_params
def test_exercises_have_one_format(path):
    """Issue 44: every exercise is a heading '### Exercise N.M' (chapters 1 to 6 used bold
    paragraphs), numbered 1, 2, ... within chapter N; no bold 'Exercise' paragraph is left."""
    chapter = int(path.stem.split("_", 1)[0])
    text = "\n".join(_source(c) for c in _load(path)["cells"] if c["cell_type"] == "markdown")
    assert "**Exercise" not in text, f"{path.name}: an exercise as a bold paragraph"
    numbers = [(int(n), int(m)) for n, m in
               re.findall(r"^### Exercise (\d+)\.(\d+)\b", text, flags=re.MULTILINE)]
    assert numbers, f"{path.name}: no '### Exercise' heading"
    assert numbers == [(chapter, k) for k in range(1, len(numbers) + 1)], numbers
