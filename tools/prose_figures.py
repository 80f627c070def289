"""The figures in the chapters' sentences come from their cells (issue 39).

A measured figure is never typed into prose. The cell that measures it glues it
(``course_attn.lab.glue.glue(name, value, fmt)``: a hidden output in myst-nb's glue format)
and the markdown quotes it between two HTML comments that every reader ignores:

    at 64 tokens, <!--glue:decode_ms_64-->0.45<!--/glue--> ms with the cache

Commands (``make notebooks`` runs ``fill`` after executing a chapter):

    python tools/prose_figures.py fill NOTEBOOK... [--run-seconds S]   write the quoted figures
    python tools/prose_figures.py check [PATH...]                      list what is wrong, exit 1

``fill`` writes every quote from the notebook's glued outputs and from the figures of the
notebook itself (``nb_words``, ``nb_code_lines``, ``nb_read_minutes``, ``nb_code_minutes``,
``nb_run_seconds``, ``nb_total_minutes``: the reading time of a chapter's introduction;
``--run-seconds`` stores how long ``make notebooks`` took to execute it).

``check`` reports (the test ``tests/test_prose_figures.py`` runs it on every chapter and
prose page):

* a quote whose text differs from its figure, or that names no figure of the notebook;
* a marker at the start of a line (Markdown would read the line as a block of raw HTML);
* a **typed figure**: a number with a unit (ms, µs, s, %, ×, times, MB, GB, TFLOP/s, nats,
  tokens/s, words, ...) or a decimal, outside a quote, that is none of
  - a constant of the code: a number written in a code cell, a code block or inline code;
  - a number that a *compared* output of the same notebook prints (a cell nbval checks, so
    that a re-execution that changes it fails; a cell tagged ``nbval-ignore-output`` does
    not count: its figures change with every run, so they are glued);
  - a number marked as a constant of the text, with the reason, as code marks ``# stable:``:
    ``<!--stable: 7 x 10^9 parameters x 16 bytes-->112 GB<!--/stable-->``;
  - a reference: a section, an exercise, an equation "(4.2)", a version ("PyTorch 2.5").
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

GLUE_PREFIX = "application/papermill.record/"
QUOTE = re.compile(r"<!--glue:(?P<name>[A-Za-z][A-Za-z0-9_]*)-->(?P<text>[^<\n]*)<!--/glue-->")
STABLE = re.compile(r"<!--stable:(?P<reason>[^>]*?)-->(?P<text>[^<\n]*)<!--/stable-->")
MARKER_AT_LINE_START = re.compile(r"^[ \t]*<!--(glue:|stable:)", re.MULTILINE)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
HEADING_NUMBER = re.compile(r"^(#{1,6}[ \t]+)(?:Exercise[ \t]+)?\d+(?:\.\d+)*", re.MULTILINE)

# A number: 1,024 or 1024 or 0.45 or 1{,}024 (math). Not part of a word, a version
# (2.11.0), a subscript or a power (d_k, 10^{-6}).
NUMBER = re.compile(r"(?<![\w.^_{/\\-])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
                    r"(?![\w.]*\d)")
UNITS = (r"ms|µs|μs|us|ns|s|sec|seconds?|minutes?|min|hours?|h|%|×|x|times|[KMGT]i?B|"
         r"[TGM]?FLOP/s|nats?|tokens/s|it/s|words|lines")
UNIT_AFTER = re.compile(rf"[ \t\u00a0\u2009~]*(?:\\,)?[ \t]*(?:{UNITS})(?![\w/])")
REFERENCE_BEFORE = re.compile(
    r"(?:(?:\b(?:[Ss]ections?|[Ee]xercises?|[Cc]hapters?|[Ff]igures?|[Tt]ables?)|§)\s*"
    r"(?:\d+(?:\.\d+)?[,;]?\s*(?:and\s+|or\s+|to\s+)?)*"
    r"|\b(?:PyTorch|torch|Triton|triton|Python|CUDA|cuDNN|NumPy|version|capability|v)\s+)$")
SECTION_IN_PARENS = re.compile(r"\((?:\d{1,2}\.\d{1,2}(?:,\s*)?)+\)")
NB_FIGURES = ("nb_words", "nb_code_lines", "nb_read_minutes", "nb_code_minutes",
              "nb_run_seconds", "nb_total_minutes")


@dataclass(frozen=True)
class Problem:
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _norm(number: str) -> str:
    return number.replace(",", "")


def _numbers(text: str) -> set[str]:
    """Every number written in ``text`` (commas dropped), as written and as a float."""
    found = set()
    for match in re.finditer(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?", text):
        token = _norm(match.group(0)).rstrip(",")
        found.add(token)
        try:
            value = float(token)
        except ValueError:
            continue
        found.add(repr(value))
        if value.is_integer():
            found.add(str(int(value)))
    return found


def glued(nb: dict) -> dict[str, str]:
    """The figures the notebook's cells glued: name -> the text the prose quotes."""
    figures: dict[str, str] = {}
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            text = out.get("data", {}).get(GLUE_PREFIX + "text/plain")
            if name is not None and text is not None:
                figures[name] = "".join(text) if isinstance(text, list) else text
    return figures


def notebook_figures(nb: dict) -> dict[str, str]:
    """The reading time of a chapter, from the notebook itself (its introduction quotes it).

    Words of prose read at 200 a minute (markers, code spans and formulas count as written),
    lines of code at 10 a minute, the run time measured by ``make notebooks``; the total is
    rounded up to a multiple of 5 minutes, never below the sum of the parts it quotes.
    """
    prose = " ".join(COMMENT.sub(" ", _source(c)) for c in nb["cells"]
                     if c["cell_type"] == "markdown")
    words = len(prose.split())
    code_lines = sum(1 for c in nb["cells"][1:] if c["cell_type"] == "code"
                     for line in _source(c).splitlines() if line.strip())
    read, code = round(words / 200), round(code_lines / 10)
    figures = {"nb_words": f"{words:,d}", "nb_code_lines": f"{code_lines:,d}",
               "nb_read_minutes": str(read), "nb_code_minutes": str(code)}
    seconds = nb.get("metadata", {}).get("course_attn", {}).get("run_seconds")
    if seconds is not None:
        figures["nb_run_seconds"] = str(round(seconds))
        # Rounded up to 5 minutes, so that the total is never below its parts as quoted.
        figures["nb_total_minutes"] = str(5 * math.ceil((read + code + seconds / 60) / 5))
    return figures


def figures_of(nb: dict) -> dict[str, str]:
    return {**notebook_figures(nb), **glued(nb)}


def fill(nb: dict, _passes: int = 0) -> int:
    """Write every quote of ``nb`` from its figure (in place); return how many changed."""
    figures, changed = figures_of(nb), 0

    def put(match: re.Match) -> str:
        nonlocal changed
        text = figures.get(match["name"], match["text"])
        changed += text != match["text"]
        return f"<!--glue:{match['name']}-->{text}<!--/glue-->"

    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            new = QUOTE.sub(put, _source(cell))
            cell["source"] = new.splitlines(keepends=True)
    # the word count depends on the quotes just written; another pass settles it
    if changed and _passes < 3:
        return changed + fill(nb, _passes + 1)
    return changed


UNIT_CLASSES = {"ms": "ms", "µs": "µs|μs|us", "ns": "ns", "s": "s|sec|seconds?",
                "min": "min|minutes?", "h": "h|hours?", "%": "%", "times": "×|x|times",
                "nats": "nats?", "words": "words", "lines": "lines", "tokens/s": "tokens/s",
                "it/s": "it/s"}


def _unit_pattern(unit: str) -> str:
    for alternatives in UNIT_CLASSES.values():
        if re.fullmatch(alternatives, unit):
            return alternatives
    return re.escape(unit)  # MB, GiB, TFLOP/s, ... as written


@dataclass
class Backing:
    """What backs a typed figure: the numbers of the code and of the compared outputs, and
    their text, where a figure with a unit must be found with that unit."""

    numbers: set[str]
    text: str

    def __or__(self, other: Backing) -> Backing:
        return Backing(self.numbers | other.numbers, self.text + "\n" + other.text)

    def backs(self, number: str, unit: str | None) -> bool:
        token = _norm(number)
        if unit is None:
            return token in self.numbers or repr(float(token)) in self.numbers
        pattern = rf"(?<![\d.]){re.escape(token)}[ \t\u00a0]*(?:{_unit_pattern(unit)})(?![\w/])"
        return re.search(pattern, self.text) is not None


def _plain(text: str) -> str:
    return re.sub(r"(?<=\d),(?=\d{3})", "", text)


def code_backing(nb: dict) -> Backing:
    code = "\n".join(_source(c) for c in nb["cells"] if c["cell_type"] == "code")
    return Backing(_numbers(code), _plain(code))


def _visible_text(out: dict) -> str:
    if "text" in out:
        return "".join(out["text"]) if isinstance(out["text"], list) else out["text"]
    data = out.get("data", {})
    parts = [data.get(k, "") for k in ("text/plain", "text/html", "text/markdown")]
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def output_backing(nb: dict) -> Backing:
    """What the cells nbval compares print (not tagged nbval-ignore-output; no glued text)."""
    texts = [_visible_text(out) for cell in nb["cells"]
             if cell["cell_type"] == "code" and "nbval-ignore-output" not in _tags(cell)
             for out in cell.get("outputs", []) if "scrapbook" not in out.get("metadata", {})]
    text = "\n".join(texts)
    return Backing(_numbers(text), _plain(text))


def _prose(markdown: str) -> tuple[str, Backing]:
    """The text a reader reads as prose, and the constants written as code inside it."""
    code = [m.group(0) for m in FENCE.finditer(markdown)]
    text = FENCE.sub(" ", markdown)
    text = re.sub(r"\n[ \t]*>[ \t]?", "\n", text)  # a quote block's line marks
    text = QUOTE.sub(" ", STABLE.sub(" ", text))
    text = COMMENT.sub(" ", text)
    text = ROLE.sub(" ", text)
    code += [m.group(2) for m in INLINE_CODE.finditer(text)]
    text = INLINE_CODE.sub(" ", text)
    text = LINK_TARGET.sub("]", text)
    text = HEADING_NUMBER.sub(r"\1", text)
    text = SECTION_IN_PARENS.sub(" ", text)
    text = text.replace("{,}", ",").replace(r"\%", "%").replace(r"\times", "×")
    joined = "\n".join(code)
    return text, Backing(_numbers(joined), _plain(joined))


def typed_figures(markdown: str, backing: Backing) -> list[str]:
    """The figures typed in ``markdown`` that nothing backs, each with its context."""
    text, inline_code = _prose(markdown)
    backing = backing | inline_code
    found = []
    for match in NUMBER.finditer(text):
        number = match.group(1)
        unit_match = UNIT_AFTER.match(text, match.end())
        unit = unit_match.group(0).strip(" \t\u00a0\u2009~\\,") if unit_match else None
        if unit is None and "." not in number:
            continue
        if REFERENCE_BEFORE.search(text[max(0, match.start() - 60):match.start()]):
            continue
        if unit == "×" and re.match(r"\s*[\d\\$({]", text[unit_match.end():]):
            continue  # a shape or a product, 4 × 3, 2 × \text{layers}
        if backing.backs(number, unit):
            continue
        start = max(0, match.start() - 40)
        end = (unit_match.end() if unit_match else match.end()) + 15
        found.append(" ".join(text[start:end].split()))
    return found


def check_notebook(nb: dict, where: str) -> list[Problem]:
    problems: list[Problem] = []
    figures = figures_of(nb)
    backing = code_backing(nb) | output_backing(nb)
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        problems += check_markdown(_source(cell), f"{where} cell {i}", figures, backing)
    return problems


def check_markdown(markdown: str, where: str, figures: dict[str, str],
                   backing: Backing) -> list[Problem]:
    problems = []
    for _ in MARKER_AT_LINE_START.finditer(markdown):
        problems.append(Problem(where, "a quote or stable mark starts a line (Markdown reads "
                                       "the line as raw HTML): put a word before it"))
    for match in QUOTE.finditer(markdown):
        name, text = match["name"], match["text"]
        if name not in figures:
            problems.append(Problem(where, f"<!--glue:{name}--> names no figure that a cell "
                                           f"of this notebook glued"))
        elif figures[name] != text:
            problems.append(Problem(where, f"<!--glue:{name}--> says {text!r} but its cell "
                                           f"glued {figures[name]!r} (run tools/prose_figures.py"
                                           f" fill)"))
    for match in STABLE.finditer(markdown):
        if not match["reason"].strip():
            problems.append(Problem(where, f"the stable mark on {match['text']!r} gives no reason"))
    for context in typed_figures(markdown, backing):
        problems.append(Problem(where, f"typed figure: ...{context}... (glue it from its cell, "
                                       f"mark it <!--stable: why-->, or, for a section, write "
                                       f"'section N.M')"))
    return problems


def book_backing(root: Path) -> Backing:
    """What a prose page (book/*.md) may quote: any chapter's constants and compared outputs."""
    found = Backing(set(), "")
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        found = found | code_backing(nb) | output_backing(nb)
    return found


def check_path(path: Path) -> list[Problem]:
    if path.suffix == ".ipynb":
        return check_notebook(json.loads(path.read_text(encoding="utf-8")), str(path))
    root = path.resolve().parents[1]
    return check_markdown(path.read_text(encoding="utf-8"), str(path), {}, book_backing(root))


def default_paths(root: Path) -> list[Path]:
    return sorted((root / "notebooks").glob("*.ipynb")) + sorted((root / "book").glob("*.md"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fill_cmd = sub.add_parser("fill", help="write every quoted figure from its glued output")
    fill_cmd.add_argument("notebooks", nargs="+", type=Path)
    fill_cmd.add_argument("--run-seconds", type=float, default=None,
                          help="how long make notebooks took to execute the notebook")
    check_cmd = sub.add_parser("check", help="list stale quotes and typed figures")
    check_cmd.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.command == "fill":
        for path in args.notebooks:
            nb = json.loads(path.read_text(encoding="utf-8"))
            if args.run_seconds is not None:
                nb.setdefault("metadata", {}).setdefault("course_attn", {})[
                    "run_seconds"] = round(args.run_seconds, 1)
            changed = fill(nb)
            nbformat.write(nbformat.from_dict(nb), str(path))
            print(f"{path}: {changed} quoted figure(s) rewritten")
        return 0
    problems = [p for path in (args.paths or default_paths(Path.cwd())) for p in check_path(path)]
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
