"""The package reads like the chapters (issue 23): its layout, imports and names.

* every module sits in the folder of its part of the course, and imports only from its
  own part or from the parts below it (core <- modern <- models <- data <- train <- lab
  <- check, the learner's checks, which hold a learner's code to any part), so there is no
  import circle;
* no module imports another module's private name, and no notebook calls, defines or
  overrides a name that starts with ``_`` on a package object;
* every public name says in its docstring which chapter explains it;
* ``import course_attn`` does not load matplotlib (a training job never plots).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import course_attn

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "course_attn"
#: The parts of the course, lowest first: a module may import from its own part or below.
PARTS = ("", "core", "modern", "models", "data", "train", "lab", "check")
#: Top-level modules that only give a command of a part its short name (python -m ...).
ENTRY_POINTS = {"sample": "train"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _part(module: str) -> int:
    module = ENTRY_POINTS.get(module, module)
    head = module.split(".")[0] if "." in module or module in PARTS else ""
    return PARTS.index(head) if head in PARTS else 0


def _imports(module: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names) for every package-internal ``from . import``."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.append((target, [alias.name for alias in node.names]))
    return found


def test_the_layout_has_a_folder_per_part_of_the_course():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(PARTS[1:])
    top = {p.stem for p in PACKAGE.glob("*.py")}
    # _early_stop: the signals of python -m course_attn.train before torch is imported; it
    # cannot live in train/, whose package imports torch (issue 41)
    assert top == {"__init__", "_version", "_validation", "_early_stop", "env", *ENTRY_POINTS}


def test_imports_go_down_the_parts_never_up_and_never_in_a_circle():
    modules = _modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    upward = []
    for name, path in modules.items():
        if name == "":  # the package's face re-exports every part
            continue
        for target, names in _imports(name, path):
            full = [f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names]
            for module in full:
                if module in modules and module != name:
                    edges[name].add(module)
                    if _part(module) > _part(name):
                        upward.append(f"{name} -> {module}")
    assert not upward, upward
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in edges[node]:
            assert seen.get(nxt) != 1, "import circle: " + " -> ".join([*path, node, nxt])
            if nxt not in seen:
                visit(nxt, [*path, node])
        seen[node] = 2

    for node in edges:
        if node not in seen:
            visit(node, [])


def test_no_module_imports_another_modules_private_name():
    crossing = [f"{name}: {target}.{n}" for name, path in _modules().items()
                for target, names in _imports(name, path) for n in names
                if n.startswith("_") and not n.startswith("__")]
    assert not crossing, crossing


def _notebook_code() -> list[tuple[str, str]]:
    cells = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                cells.append((path.name, "".join(cell["source"])))
    return cells


def test_no_notebook_calls_or_overrides_a_private_name():
    # namedtuple's own methods start with "_" to leave room for field names: public API
    private_use = re.compile(r"\b(?!torch|np|F|nn|plt|self|cls)\w+"
                             r"\._(?!asdict\b|replace\b|fields\b)[a-z]\w*")
    found = []
    for name, source in _notebook_code():
        found += [f"{name}: {m.group(0)}" for m in private_use.finditer(source)]
        magics_out = re.sub(r"^(\s*)[%!].*$", r"\1pass", source, flags=re.M)  # IPython lines
        for node in ast.walk(ast.parse(magics_out)):
            if isinstance(node, ast.ClassDef):
                found += [f"{name}: {node.name}.{item.name}" for item in node.body
                          if isinstance(item, ast.FunctionDef) and item.name.startswith("_")
                          and not item.name.startswith("__")]
    assert not found, found


def _public_objects() -> list[tuple[str, object]]:
    return [(name, getattr(course_attn, name)) for name in course_attn.__all__
            if inspect.isclass(getattr(course_attn, name))
            or inspect.isfunction(getattr(course_attn, name))
            or inspect.ismodule(getattr(course_attn, name))]


@pytest.mark.parametrize(("name", "obj"), _public_objects(),
                         ids=[name for name, _ in _public_objects()])  # the same ids every run
def test_every_public_name_says_which_chapter_explains_it(name, obj):
    doc = inspect.getdoc(obj) or ""
    assert re.search(r"\b(Chapters?|Ch\.) \d+", doc, flags=re.I), f"{name}: {doc[:80]!r}"


def test_importing_the_package_loads_no_plotting_library():
    code = ("import sys, course_attn; print('matplotlib' in sys.modules); "
            "course_attn.viz; print('matplotlib' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.split() == ["False", "True"]  # loaded when a chapter asks to plot
