"""``python -m course_attn.check FILE.py [NAME ...]``: check the functions a learner wrote.

The learner's file is imported and every check whose name (``course_attn.check.NAMES``:
``softmax``, ``causal_mask``, ... and the classes ``SelfAttention`` and
``MultiHeadAttention``) it defines is run, in the order of the chapters; a name it does not
define gets one line saying what to write. ``NAME`` arguments run only those checks.

Exit codes: 0 when every check found passed, 1 when one did not (a failure, or a function
not written yet), 2 for a usage error (no such file, a file that cannot be imported, an
unknown check name, or a file that defines none of the names). Chapters 1-11.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

from . import CHECKS, NAMES, SIGNATURES

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def load(path: Path) -> ModuleType:
    """Import the learner's file as a module of its own (its folder on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location(f"learner_{uuid.uuid4().hex}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))  # so the file's own imports work
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent.resolve()))
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_attn.check",
        description="Check the attention functions you wrote, found by name in FILE.",
        epilog="names looked for: " + ", ".join(NAMES.values())
               + ". Exit codes: 0 every check found passed, 1 one did not, 2 usage error.")
    parser.add_argument("file", type=Path, help="your Python file, e.g. my_attention.py")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="run only these checks (default: every name FILE defines)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's own usage errors exit with 2 already
        return int(exit_.code or 0)
    unknown = [n for n in args.names if n not in CHECKS and n not in NAMES.values()]
    if unknown:
        print(f"unknown check name(s): {', '.join(unknown)}; known: {', '.join(CHECKS)}",
              file=sys.stderr)
        return EXIT_USAGE
    if not args.file.is_file():
        print(f"no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    try:
        module = load(args.file)
    except Exception as error:  # the learner's file, whatever it raises
        print(f"cannot import {args.file}: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_USAGE
    wanted = [c for c in CHECKS
              if not args.names or c in args.names or NAMES[c] in args.names]
    found, passed = 0, True
    for check_name in wanted:
        learner_name = NAMES[check_name]
        fn = getattr(module, learner_name, None)
        if fn is None:
            print(f"check.{check_name}: {learner_name} not found in {args.file.name} "
                  f"(write {SIGNATURES[check_name]})")
            continue
        found += 1
        try:
            result = CHECKS[check_name](fn)
        except (TypeError, ValueError) as error:  # the door: not a function, not a class
            print(f"check.{check_name}: {type(error).__name__}: {error}")
            passed = False
            continue
        print(result)
        passed = passed and result.passed
    if not found:
        print(f"{args.file.name} defines none of the names the checks look for", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_PASSED if passed else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
