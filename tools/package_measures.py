"""Measures of how the package reads (issue 23): run ``python tools/package_measures.py``.

Prints, for ``src/course_attn``:

* the functions one ``MiniGPT`` forward with a loss runs through (traced with
  ``sys.settrace``), their lines (each function whole, docstring included) and files;
* the share of *check lines* among the code lines (no blank lines, comments or
  docstrings): a statement that calls a ``check_*`` / ``_check*`` function, an
  ``if`` whose body raises (with its body), and the whole of a function whose name
  starts with ``check_``, ``_check`` or ``validate``; for every module and for the
  model modules (those that define an ``nn.Module`` or an attention path);
* import circles between the package's modules (lazy imports inside functions count);
* private names crossing modules: ``from .x import _name``, and ``obj._method(...)``
  on an object other than ``self`` / ``cls`` / ``super()``;
* the longest function and the longest class.

Nothing is imported from the package except for the trace, which builds one small
``MiniGPT``. The numbers are what the issue's "before" and "after" compare.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "course_attn"
CHECK_PREFIXES = ("check_", "_check", "validate")


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def code_lines(tree: ast.Module, source: str) -> set[int]:
    """Line numbers that hold code: not blank, not a comment, not a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = set()
    for number, text in enumerate(source.splitlines(), start=1):
        stripped = text.strip()
        if stripped and not stripped.startswith("#") and number not in docstrings:
            lines.add(number)
    return lines


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


def check_lines(tree: ast.Module) -> set[int]:
    """Lines of the statements that only validate arguments (see the module docstring)."""
    lines: set[int] = set()

    def span(node: ast.AST) -> range:
        return range(node.lineno, node.end_lineno + 1)  # type: ignore[attr-defined]

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith(CHECK_PREFIXES):
            lines.update(span(node))
        elif isinstance(node, ast.If) and node.body and isinstance(node.body[-1], ast.Raise) \
                and not node.orelse:
            lines.update(span(node))
        elif isinstance(node, ast.Expr | ast.Assign | ast.AnnAssign | ast.Return):
            value = node.value
            if value is not None and (_call_name(value) or "").startswith(CHECK_PREFIXES):
                lines.update(span(node))
    return lines


#: The modules a model runs through: its layers, its attention paths, its cache and its
#: decoding loop (the flat layout's names, then the subpackages'). Door modules are apart.
MODEL_MODULES = {"model", "encoder_decoder", "decoding", "layers", "attention", "tiled",
                 "models.gpt", "models.encoder_decoder", "models.decoding", "core.layers",
                 "core.attention", "core.tiled", "core.kv_cache"}


def is_model_module(name: str) -> bool:
    return name.removeprefix("course_attn.") in MODEL_MODULES


def resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Edges module -> imported module (package-internal), and the private names imported."""
    edges: dict[str, set[str]] = defaultdict(set)
    private: list[str] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = resolve(name, is_package, node.level, node.module)
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    edges[name].add(full if full in mods else target)
                    if alias.name.startswith("_") and full not in mods and \
                            not alias.name.startswith("__"):
                        private.append(f"{name}: from {target} import {alias.name}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_attn"):
                edges[name].add(node.module or "")
    return {k: {v for v in vs if v in mods and v != k} for k, vs in edges.items()}, private


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


def private_calls(mods: dict[str, Path]) -> list[str]:
    """``obj._name(...)`` where ``obj`` is not ``self``, ``cls`` or ``super()``."""
    found = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                attr, owner = node.func.attr, node.func.value
                if not attr.startswith("_") or attr.startswith("__"):
                    continue
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and _call_name(owner) == "super":
                    continue
                text = ast.unparse(node.func)
                if text.startswith(("torch.", "np.", "sys.", "os.")):
                    continue
                found.append(f"{name}:{node.lineno}: {text}")
    return found


def longest(mods: dict[str, Path], kind: type) -> tuple[int, str]:
    best = (0, "")
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kind):
                size = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
                best = max(best, (size, f"{name}.{node.name}"))  # type: ignore[attr-defined]
    return best


def _is_check(code) -> bool:  # noqa: ANN001
    return code.co_name.startswith(CHECK_PREFIXES) or code.co_filename.endswith("_validation.py")


def traced(run) -> tuple[set, int]:  # noqa: ANN001
    """The package's functions ``run()`` enters, and how many check calls it makes."""
    seen: set = set()
    checks = 0

    def tracer(frame, event, arg):  # noqa: ANN001, ANN202
        nonlocal checks
        if event == "call" and frame.f_code.co_filename.startswith(str(ROOT)):
            seen.add(frame.f_code)
            checks += _is_check(frame.f_code)
        return None

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return seen, checks


def traced_forward() -> tuple[dict[str, list[int]], int, int]:
    """Lines (whole functions) and files one MiniGPT forward with a loss runs through.

    Also the check calls of that forward, and of ``generate`` for 20 new tokens.
    """
    sys.path.insert(0, str(ROOT.parent))
    import torch

    from course_attn import GPTConfig, MiniGPT

    torch.manual_seed(0)
    fields = GPTConfig.__dataclass_fields__
    length = "context_length" if "context_length" in fields else "block_size"
    model = MiniGPT(GPTConfig(vocab_size=65, **{length: 32}))
    idx = torch.randint(0, 65, (2, 32))
    model(idx, idx)  # warm up: lazy imports are not part of a forward
    model.generate(idx[:, :4], 2)
    seen, forward_checks = traced(lambda: model(idx, idx))
    _, generate_checks = traced(lambda: model.generate(idx[:, :4], 20))
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # file -> [lines, code lines]
    for code in seen:
        lines, first = inspect.getsourcelines(code)
        path = Path(code.co_filename)
        source = path.read_text()
        mine = code_lines(ast.parse(source), source)
        entry = totals[str(path.relative_to(ROOT))]
        entry[0] += len(lines)
        entry[1] += len(mine & set(range(first, first + len(lines))))
    return dict(totals), forward_checks, generate_checks


def main() -> None:
    mods = modules()
    total_code = total_check = model_code = model_check = 0
    rows = []
    for name, path in mods.items():
        source = path.read_text()
        tree = ast.parse(source)
        code = code_lines(tree, source)
        checks = check_lines(tree) & code
        total_code += len(code)
        total_check += len(checks)
        if is_model_module(name):
            model_code += len(code)
            model_check += len(checks)
        rows.append((name, len(code), len(checks), is_model_module(name)))
    per_file, forward_checks, generate_checks = traced_forward()
    edges, private_imports = import_graph(mods)
    loops = circles(edges)
    calls = private_calls(mods)
    size = sum(len(path.read_text().splitlines()) for path in mods.values())
    print(f"modules: {len(mods)}, lines: {size}")
    doors = {f for f in per_file if f.endswith("checks.py") or f.startswith("_validation")}
    for label, files in (("with its door", set(per_file)), ("without", set(per_file) - doors)):
        lines = sum(per_file[f][0] for f in files)
        code = sum(per_file[f][1] for f in files)
        print(f"MiniGPT forward + loss, {label}: {lines} lines ({code} of code, no docstrings) "
              f"in {len(files)} files: {', '.join(sorted(files))}")
    print(f"check calls: {forward_checks} in that forward; {generate_checks} in generate() "
          f"of 20 new tokens (4-layer model)")
    print(f"check lines: {total_check} of {total_code} code lines "
          f"({100 * total_check / total_code:.1f}%); model modules: {model_check} of "
          f"{model_code} ({100 * model_check / model_code:.1f}%)")
    for name, code, checks, model in sorted(rows, key=lambda r: -r[2] / max(r[1], 1)):
        if checks:
            print(f"    {name:45s} {checks:4d} / {code:4d} = {100 * checks / code:5.1f}%"
                  f"{'  (model)' if model else ''}")
    print(f"import edges: {sum(len(v) for v in edges.values())}; circles: {len(loops)}")
    for loop in loops:
        print("    " + " <-> ".join(loop))
    print(f"private names imported across modules: {len(private_imports)}")
    for line in private_imports:
        print("    " + line)
    print(f"calls into another object's private method: {len(calls)}")
    for line in calls:
        print("    " + line)
    size, name = longest(mods, ast.FunctionDef)
    print(f"longest function: {name}, {size} lines")
    size, name = longest(mods, ast.ClassDef)
    print(f"longest class: {name}, {size} lines")


if __name__ == "__main__":
    main()
