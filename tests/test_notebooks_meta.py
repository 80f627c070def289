"""Every chapter notebook follows the conventions of CONTRIBUTING.md.

These tests read the notebooks' JSON only (they never run or import notebook code):
the set-up cell, execution order, kernelspec, hidden solutions that check themselves,
and the table of contents. They cover every ``notebooks/*.ipynb``, present and future.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ASSERTS = re.compile(r"\bassert\b|\bassert_\w+\(")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _repository_url() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return config["repository"]["url"]


def _setup_cell_from_contributing() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    after = text.split("The first code cell is always", 1)[1]
    block = re.search(r"```python\n(.*?)```", after, re.DOTALL)
    assert block, "CONTRIBUTING.md lost the python block of the set-up cell"
    return textwrap.dedent(block.group(1)).strip()


def _toc_files() -> set[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key in ("file", "root"):
                if isinstance(node.get(key), str):
                    found.add(node[key].removesuffix(".ipynb").removesuffix(".md"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return found


notebook_params = pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/*.ipynb found"
    assert (ROOT / "notebooks" / "01_softmax_weighting.ipynb") in NOTEBOOKS


@notebook_params
def test_first_code_cell_installs_from_the_configured_repository(path):
    first = _source(_code_cells(_load(path))[0])
    urls = re.findall(r"git\+(https?://[^\s\"'@]+)", first)
    assert urls, f"{path.name}: the first code cell installs nothing from git"
    assert urls == [_repository_url()], (
        f"{path.name}: installs from {urls}, but _config.yml says {_repository_url()}"
    )
    # Only where the package is missing (Colab, Binder): a local run must not reinstall.
    guard = first.index('importlib.util.find_spec("course_attn") is None')
    assert guard < first.index("%pip install")
    assert "print(course_attn.environment_report())" in first


@notebook_params
def test_first_code_cell_is_the_one_in_contributing(path):
    first = _source(_code_cells(_load(path))[0]).strip()
    assert first == _setup_cell_from_contributing()


@notebook_params
def test_first_cell_is_the_chapter_title(path):
    cells = _load(path)["cells"]
    number = int(path.stem.split("_", 1)[0])
    assert cells[0]["cell_type"] == "markdown"
    assert re.match(rf"# Chapter {number}: \S", _source(cells[0])), _source(cells[0])[:80]


@notebook_params
def test_kernelspec_and_execution_order(path):
    nb = _load(path)
    kernelspec = nb["metadata"].get("kernelspec", {})
    assert kernelspec.get("name") and kernelspec.get("language") == "python"
    counts = [c.get("execution_count") for c in _code_cells(nb)]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts}; re-run with make notebooks NB={path.name}"
    )


@notebook_params
def test_no_error_outputs_except_where_tagged(path):
    for index, cell in enumerate(_code_cells(_load(path)), start=1):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors or "raises-exception" in _tags(cell), (
            f"{path.name}, code cell {index}: stored error {errors[0].get('ename')}"
        )


@notebook_params
def test_hidden_solutions_check_themselves(path):
    solutions = [c for c in _code_cells(_load(path)) if "hide-input" in _tags(c)]
    assert solutions, f"{path.name}: no exercise solutions tagged hide-input"
    for cell in solutions:
        assert ASSERTS.search(_source(cell)), (
            f"{path.name}: a hide-input solution has no assert:\n{_source(cell)[:200]}"
        )


@notebook_params
def test_exercise_solutions_hide_their_output_too(path):
    """Folding the code alone would print the answer right under the question."""
    for cell in _code_cells(_load(path)):
        if "hide-input" in _tags(cell):
            assert "hide-output" in _tags(cell), (
                f"{path.name}: a solution shows its output:\n{_source(cell)[:200]}"
            )


@notebook_params
def test_ignored_outputs_still_assert(path):
    for cell in _code_cells(_load(path)):
        if "nbval-ignore-output" in _tags(cell):
            assert ASSERTS.search(_source(cell)), (
                f"{path.name}: an nbval-ignore-output cell checks nothing:\n{_source(cell)[:200]}"
            )


@notebook_params
def test_notebook_is_in_the_toc(path):
    assert path.relative_to(ROOT).with_suffix("").as_posix() in _toc_files()


CODE_COLUMN = 84  # characters the site's code column shows without scrolling
FIGURE_COLUMN_PX = 720  # the content column is about 700 px wide


def _png_width(data: str) -> int:
    import base64
    import struct

    return struct.unpack(">I", base64.b64decode(data[:44])[16:20])[0]


@notebook_params
def test_code_and_printed_lines_fit_the_site_column(path):
    too_long = []
    for index, cell in enumerate(_code_cells(_load(path)), start=1):
        lines = _source(cell).splitlines()
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                lines += "".join(out.get("text", "")).splitlines()
        too_long += [f"code cell {index}: {line[:60]}..." for line in lines
                     if len(line) > CODE_COLUMN]
    assert not too_long, f"{path.name}: lines over {CODE_COLUMN} characters:\n" + "\n".join(
        too_long[:10])


def _svg_width(svg: str) -> float:
    """The CSS pixels an SVG figure asks for: its ``width`` in points, at 96 px per 72 pt."""
    match = re.search(r'<svg[^>]*\swidth="([\d.]+)pt"', svg)
    assert match, "an SVG figure without a width in points"
    return float(match.group(1)) * 96 / 72


@notebook_params
def test_figures_fit_the_column_and_have_alt_text(path):
    for index, cell in enumerate(_code_cells(_load(path)), start=1):
        images = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/svg+xml" in data:  # sharp figures (viz.use_sharp_figures)
                svg = data["image/svg+xml"]
                images.append(_svg_width(svg if isinstance(svg, str) else "".join(svg)))
            elif "image/png" in data:
                png = data["image/png"]
                images.append(_png_width(png if isinstance(png, str) else "".join(png)))
        if not images:
            continue
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt", "")
        assert len(alt.strip()) >= 12, f"{path.name}, code cell {index}: no alt text"
        for width in images:
            assert width <= FIGURE_COLUMN_PX, (
                f"{path.name}, code cell {index}: a figure {width} px wide is squeezed into "
                f"the {FIGURE_COLUMN_PX} px column"
            )


# --- Printed figures that round-off can change ---------------------------------------------
# A float printed from a training run, a trained model, a measured time or a long reduction
# has digits another CPU can change (DESIGN: print a bound, or print the value in a cell
# nbval does not compare and assert what matters). The rule is checked twice: here, by
# reading the source, and by make nbval-perturbed, which runs every notebook with its
# random draws and gradients nudged (tools/perturbed/). A line whose printed float is exact
# or closed-form (a loss floor from a formula, a count, a constant) says so with a comment
# "# stable: why" on the line that formats it.

FLOAT_FORMAT = re.compile(r"[eEfFgG%]$")  # format specs that print a float's digits
# Names of what training and timing produce: a loss, an accuracy, a gap to a floor, a score
# read off a trained model, a time.
VOLATILE_NAME = re.compile(
    r"loss(?!_floor)|acc(uracy)?\b|acc_|gap|score|perplexity|ppl|time|seconds|elapsed|"
    r"minutes|(^|_)ms($|_)|perf_counter", re.IGNORECASE)
# A cell that trains: after it, a float read off a tensor (.item()) comes from trained weights.
TRAINS = re.compile(r"\btrain\w*\(|\.fit\(|\.step\(\)|\btrained\(")
STABLE = re.compile(r"#\s*stable:\s*\S")


def _parsed(source: str):
    import ast

    # IPython's magics and shell escapes are not Python: each becomes a pass.
    return ast.parse(re.sub(r"^(\s*)[%!].*$", r"\1pass", source, flags=re.MULTILINE))


def volatile_prints(nb: dict) -> list[str]:
    """``"code cell N, line L: {expr:spec}"`` for each float a compared cell prints whose
    digits depend on round-off: named after a loss, accuracy, gap, score or time, a share
    (``%``), or read off a tensor after the notebook has trained."""
    import ast

    found, trained = [], False
    for index, cell in enumerate(_code_cells(nb), start=1):
        source = _source(cell)
        trained = trained or bool(TRAINS.search(source))
        if "nbval-ignore-output" in _tags(cell):
            continue
        lines = source.splitlines()
        for node in ast.walk(_parsed(source)):
            if not (isinstance(node, ast.FormattedValue) and node.format_spec is not None):
                continue
            spec = "".join(v.value for v in node.format_spec.values  # type: ignore[attr-defined]
                           if isinstance(v, ast.Constant))
            if not FLOAT_FORMAT.search(spec) or STABLE.search(lines[node.lineno - 1]):
                continue
            expr = ast.unparse(node.value)
            names = [n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)]
            names += [n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)]
            if any(VOLATILE_NAME.search(name) for name in names) or spec.endswith("%") or (
                    trained and ".item()" in expr):
                found.append(f"code cell {index}, line {node.lineno}: {{{expr}:{spec}}}")
    return found


def test_volatile_prints_are_found():
    """The check itself: what it must report and what it must let through."""
    def notebook(*cells):
        return {"cells": [{"cell_type": "code", "source": src, "metadata": {"tags": tags}}
                          for src, tags in cells]}

    assert len(volatile_prints(notebook(
        ('print(f"loss {loss:.3f}, {acc:.0%}, {time.perf_counter() - t:.1f} s")', []),
        ('print(f"the visible symbols reversed: {same:.0%} (bound: 80%)")', []),
        ('result = train(model, task)\nprint(f"{maps.mean().item():.2f}")', []),
    ))) == 5
    assert volatile_prints(notebook(
        ('print(f"loss {loss:.3f}")', ["nbval-ignore-output"]),  # not compared
        ('print(f"floor {task.loss_floor():.4f}")', []),  # a formula
        ('print(f"{w.max().item():.4f}, {n:,} tokens, {gap_ok}")', []),  # no training yet
        ('print(f"{loss:.3f}")  # stable: a loss of fixed inputs, float64', []),
    )) == []


@notebook_params
def test_no_printed_figure_that_round_off_can_change(path):
    found = volatile_prints(_load(path))
    assert not found, (
        f"{path.name}: these printed floats can change with the CPU; print a bound, or print "
        "them in an nbval-ignore-output cell that asserts, or mark an exact one "
        "'# stable: why':\n" + "\n".join(found))
