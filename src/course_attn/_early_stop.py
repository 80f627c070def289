"""SIGINT and SIGTERM while ``python -m course_attn.train`` is still importing (issue 41).

``python -m course_attn.train`` imports the package, torch with it, before the first line
of its ``main`` (:mod:`course_attn.train.cli`) can own the signals: seconds, a minute on
a busy machine. In that window Python's own Ctrl-C is a ``KeyboardInterrupt`` raised
wherever the import is, with a traceback; and code inside the import that catches every
exception can swallow it, so that the run then trains to its end (seen: 2 signals of 16
sent 5 s after the start, beside two busy processes).

So the package's ``__init__`` calls :func:`own_until_main` first thing, and only when it
is being imported to run that command. A signal then stops the import at once with one
line and exit code 128 + the signal, and is recorded in :data:`RECEIVED` as well: if some
code swallows the exception, ``main``'s owner (:class:`~course_attn.train.stopping.SignalOwner`)
finds the record and stops before any work. A second signal takes its default course.
This module imports nothing but the standard library.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType, TracebackType

__all__ = ["RECEIVED", "command_is", "own_until_main"]

#: The signals received before ``main`` took the signals over.
RECEIVED: list[int] = []


class _StoppedEarly(BaseException):
    """Raised by the early handler where the import is; :func:`_one_line` reports it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def command_is(module: str) -> bool:
    """Whether this interpreter was started as ``python -m MODULE`` and is still importing it.

    While ``-m`` imports the module's packages, ``sys.argv[0]`` is ``"-m"``;
    ``sys.orig_argv`` holds the command line as typed (torchrun's ``python -u -m ...`` too).
    """
    words = list(getattr(sys, "orig_argv", ()))
    return sys.argv[:1] == ["-m"] and any(
        word == "-m" and words[i + 1:i + 2] == [module] for i, word in enumerate(words))


def own_until_main(program: str) -> None:
    """Stop at once, with one line starting with ``program``, on a signal before ``main``."""

    def stop(signum: int, frame: FrameType | None) -> None:
        RECEIVED.append(signum)
        for kind in (signal.SIGINT, signal.SIGTERM):  # a second one: the default, at once
            signal.signal(kind, signal.SIG_DFL)
        raise _StoppedEarly(signum)

    for kind in (signal.SIGINT, signal.SIGTERM):
        signal.signal(kind, stop)
    before = sys.excepthook

    def one_line(kind: type[BaseException], error: BaseException,
                 trace: TracebackType | None) -> None:
        if not isinstance(error, _StoppedEarly):
            before(kind, error, trace)
            return
        name = signal.Signals(error.signum).name
        print(f"{program}: stopped by {name} before training; nothing was written.",
              file=sys.stderr, flush=True)
        os._exit(128 + error.signum)  # nothing to save: skip the interpreter's slow teardown

    sys.excepthook = one_line


if command_is("course_attn.train"):  # this import is the first line of the package
    own_until_main("python -m course_attn.train")
