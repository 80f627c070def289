"""``python -m course_attn.check FILE.py [NAME ...] [--timeout S]``: check what a learner wrote.

The learner's file is imported and every check whose function (or class) it defines is run,
in the order of the chapters. A check looks for its own name (``softmax``, ``causal_mask``,
the classes ``SelfAttention`` and ``MultiHeadAttention``) and for the notebooks' name
(``my_softmax``, ``MySelfAttention``; ``course_attn.check.LEARNER_NAMES`` lists them all). A
name the file imports rather than defines (``from course_attn import causal_mask``) is
reported as imported and not checked; the names the file does not have are listed in one
line. ``NAME`` arguments run only those checks. Each check's calls of the learner's code
get ``--timeout`` seconds in all (default 5; 0 for none), after which the case that was
running is reported as the one that hung. The last line sums up: "7 of 9 pass, 1 fails,
1 not written".

Exit codes:

* 0: every check run passed;
* 1: a check failed, is not written yet (``NotImplementedError``) or hung;
* 2: a usage error: no such file, an unknown check name, a bad ``--timeout``, or a file
  that defines none of the names;
* 3: the file cannot be imported: it raises an exception, calls ``sys.exit()`` or runs
  past 12 times the time limit (a minute by default) while it is imported (work belongs
  under ``if __name__ == "__main__":``);
* 130: interrupted (Ctrl-C, or ``KeyboardInterrupt`` raised) while importing or checking;
  the checks done so far are summed up first.

Chapters 1-11.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import textwrap
import uuid
from pathlib import Path
from types import ModuleType

from . import CHECKS, LEARNER_NAMES, NAMES
from .runner import CheckInterrupted, CheckTimeout, alarm, time_limit

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_IMPORT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_TIMEOUT = 5.0
#: Importing the file may take this many times the time limit (a minute by default): a
#: file may import slow libraries, but top-level work that never ends must still stop.
IMPORT_FACTOR = 12


class ImportFailed(Exception):
    """The learner's file could not be imported; the message says why."""


def load(path: Path, seconds: float) -> ModuleType:
    """Import the learner's file as a module of its own (its folder on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location(f"learner_{uuid.uuid4().hex}", path)
    if spec is None or spec.loader is None:
        raise ImportFailed(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does (dataclasses and pickle look there)
    sys.path.insert(0, str(path.parent.resolve()))  # so the file's own imports work
    try:
        with alarm(seconds):
            spec.loader.exec_module(module)
    except SystemExit as exit_:
        raise ImportFailed(f"{path.name} called sys.exit({exit_.code!r}) while being imported, "
                           f"so no check could run: put that call under "
                           f"if __name__ == \"__main__\":") from None
    except CheckTimeout:
        raise ImportFailed(f"importing {path.name} took more than {seconds:g} s: put long work "
                           f"under if __name__ == \"__main__\":") from None
    except (KeyboardInterrupt, ImportFailed):
        raise
    except Exception as error:  # the learner's file, whatever it raises
        raise ImportFailed(f"cannot import {path.name}: {type(error).__name__}: {error}") \
            from None
    finally:
        sys.path.remove(str(path.parent.resolve()))
    return module


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_attn.check",
        description="Check the attention functions you wrote, found by name in FILE: "
                    "softmax or my_softmax, MultiHeadAttention or MyMultiHeadAttention, ...",
        epilog="Exit codes: 0 every check run passed; 1 one failed, is not written yet or "
               "hung; 2 usage error (no such file, unknown name, none of the names in FILE); "
               "3 FILE cannot be imported (an error, sys.exit() or 12 times the time limit while "
               "importing); 130 interrupted.")
    parser.add_argument("file", type=Path, help="your Python file, e.g. my_attention.py")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="run only these checks (a check's name or a function's)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds each check's calls of your code may take in all "
                             f"(default {DEFAULT_TIMEOUT:g}; 0 for no limit)")
    return parser


def _found(module: ModuleType, wanted: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """The learner's (check, name) pairs to run, in the chapters' order; the checks absent."""
    found, absent = [], []
    for check_name in wanted:
        names = [n for n in LEARNER_NAMES[check_name] if hasattr(module, n)]
        found += [(check_name, n) for n in names]
        if not names:
            absent.append(check_name)
    return found, absent


def _origin(obj: object, mine: str) -> str:
    """The module ``obj`` was defined in: a function's or a class's, a callable instance's
    class's, a partial's function's; ``mine`` for a plain value (it can only be the file's)."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    return str(getattr(obj, "__module__", None) or mine)


class Tally:
    """What the checks found, for the summary line."""

    def __init__(self) -> None:
        self.passed = self.failed = self.unwritten = self.hung = self.imported = 0

    def summary(self) -> str:
        run = self.passed + self.failed + self.unwritten
        parts = [f"{self.passed} of {run} pass"]
        if self.failed:
            hung = f" ({self.hung} hung)" if self.hung else ""
            parts.append(f"{self.failed} fail{'s' if self.failed == 1 else ''}{hung}")
        if self.unwritten:
            parts.append(f"{self.unwritten} not written")
        if self.imported:
            parts.append(f"{self.imported} imported, not checked")
        return ", ".join(parts)


def _run_one(module: ModuleType, check_name: str, name: str, tally: Tally) -> None:
    obj = getattr(module, name)
    origin = _origin(obj, module.__name__)
    if origin != module.__name__:
        tally.imported += 1
        print(textwrap.fill(f"check.{check_name}: {name} is imported from {origin}, not "
                            f"yours: not checked (define it in the file to check it)", 80,
                            subsequent_indent="  "))
        return
    label = f"check.{check_name}" if name == NAMES[check_name] else \
        f"check.{check_name} ({name})"  # a notebook's name, my_softmax, is said
    try:
        result = CHECKS[check_name](obj)
    except (TypeError, ValueError) as error:  # the door: not a function, not a class
        tally.failed += 1
        what = str(error).split(", got ")[-1]
        kind = "a class" if "must be a class" in str(error) else "a function"
        print(textwrap.fill(f"{label}: {name} in {Path(module.__file__ or '').name} is "
                            f"{what}, not {kind}: {type(error).__name__}: {error}", 80,
                            subsequent_indent="  "))
        return
    text = str(result).replace(f"check.{check_name}:", f"{label}:", 1)
    print(text)
    if result.passed:
        tally.passed += 1
    elif not result.written:
        tally.unwritten += 1
    else:
        tally.failed += 1
        tally.hung += bool(result.failure and result.failure.hung)


def _absent_line(path: Path, absent: list[str]) -> str:
    names = ", ".join(LEARNER_NAMES[c][0] for c in absent)
    return textwrap.fill(f"not in {path.name}, so not checked: {names} (or the my_ names of "
                         f"the notebooks)", 80, subsequent_indent="  ")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse's own usage errors exit with 2 already
        return int(exit_.code or 0)
    known = set(CHECKS) | {n for names in LEARNER_NAMES.values() for n in names}
    unknown = [n for n in args.names if n not in known]
    if unknown or args.timeout < 0:
        why = f"unknown name(s): {', '.join(unknown)}" if unknown else "--timeout must be >= 0"
        print(f"{why}; checks: {', '.join(CHECKS)}", file=sys.stderr)
        return EXIT_USAGE
    if not args.file.is_file():
        print(f"no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    tally = Tally()
    try:
        module = load(args.file, IMPORT_FACTOR * args.timeout)
        wanted = [c for c in CHECKS if not args.names or c in args.names
                  or set(LEARNER_NAMES[c]) & set(args.names)]
        found, absent = _found(module, wanted)
        found = [(c, n) for c, n in found if not args.names or c in args.names
                 or n in args.names]
        if not found and args.names:
            print(f"{args.file.name} does not define {' or '.join(args.names)} (nor the "
                  f"other name of its check, see --help)", file=sys.stderr)
            return EXIT_USAGE
        if not found:
            print(f"{args.file.name} defines none of the names the checks look for "
                  f"(softmax or my_softmax, ...; see --help)", file=sys.stderr)
            return EXIT_USAGE
        with time_limit(args.timeout):
            for check_name, name in found:
                _run_one(module, check_name, name, tally)
    except ImportFailed as error:
        print(str(error), file=sys.stderr)
        return EXIT_IMPORT
    except KeyboardInterrupt as interrupt:
        where = f"check.{interrupt.check}, case: {interrupt.case}" \
            if isinstance(interrupt, CheckInterrupted) else f"importing {args.file.name}"
        print(f"interrupted during {where}\n{tally.summary()}")
        return EXIT_INTERRUPTED
    if absent and not args.names:
        print(_absent_line(args.file, absent))
    print(tally.summary())
    if tally.passed + tally.failed + tally.unwritten == 0:
        return EXIT_USAGE  # only imported names: nothing of the learner's was checked
    return EXIT_PASSED if tally.failed + tally.unwritten == 0 else EXIT_FAILED

if __name__ == "__main__":
    sys.exit(main())
