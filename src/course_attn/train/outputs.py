"""The files a training run writes (chapter 11), written so that no work is ever lost.

A run writes a checkpoint (``--out``, see :mod:`course_attn.train.checkpoint`) and
a metrics JSON (``--metrics-out``). Before any training, :func:`check_output_path`
makes sure each path may receive its file: never a folder, never a file of
another kind (above all the training text), never a folder where nothing can
be created. During the run every file goes through one writer,
:func:`write_atomically`: written next to its path, flushed to the disk and
renamed into place, so a crash, a full disk or a folder that turns read-only
never leaves half a file behind nor harms the last good one, and every way
the write can fail is one ``OSError`` that names the file and the cause.
When the metrics cannot go where they were asked for, :func:`save_metrics`
puts them next to it, or in the system's temporary folder, and says where.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

#: The ``format`` key of the metrics JSON that ``--metrics-out`` writes: the CLI
#: overwrites an existing file only when it carries this key (a metrics file of its own).
METRICS_FORMAT = "course_attn.train.metrics/1"

#: The exit code of ``python -m course_attn.train`` when a file of the run could not be
#: written (a full disk, a read-only folder, no permission): ``EX_IOERR`` of the BSD
#: ``sysexits.h``, unlike 1 (a bug), 2 (a wrong command line) and 130/143 (a signal).
EXIT_WRITE_FAILED = 74


def check_path(path: object, name: str) -> Path:
    """``path`` (a str or path, not empty) as a :class:`~pathlib.Path`."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{name} must be a str or a path, got {type(path).__name__}")
    if str(path) == "":
        raise ValueError(f"{name} must be a file path, got ''")
    return Path(path)


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (resolved links, or the same inode)."""
    first, second = Path(a), Path(b)
    if first.resolve() == second.resolve():
        return True
    try:
        return first.exists() and second.exists() and os.path.samefile(first, second)
    except OSError:
        return False


class _Sink:
    """A binary file that remembers the first ``OSError`` of its writes.

    ``torch.save`` turns the ``OSError`` of a full disk into a ``RuntimeError``
    ("unexpected pos 576 vs 534") that does not say why; this keeps the why.
    """

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as error:
            self.error = self.error or error
            raise


def _found_os_error(error: BaseException) -> OSError | None:
    """The first ``OSError`` with an errno in ``error`` and the exceptions that caused it."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError) and cause.errno is not None:
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _folder_problem(folder: Path) -> OSError | None:
    """Why nothing fits in ``folder`` now: no file can be created, or the disk is full."""
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".course_attn.", suffix=".probe")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        return error
    if shutil.disk_usage(folder).free < 2**20:  # a checkpoint takes more than a mebibyte
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


def write_error(error: BaseException, target: Path) -> OSError:
    """``error`` (an ``OSError``, or ``torch.save``'s ``RuntimeError``) as an ``OSError``
    with the errno and message of its cause and ``target`` as its file name.

    ``torch.save`` to a path writes from C++ and says only "file write failed";
    then the folder is asked what went wrong (:func:`_folder_problem`), and
    what it cannot tell is ``EIO`` with torch's first line.
    """
    cause = _found_os_error(error) or _folder_problem(target.parent)
    if cause is None or cause.errno is None:
        first_line = (str(error).strip().splitlines() or [""])[0]
        return OSError(errno.EIO, f"{type(error).__name__}: {first_line}", str(target))
    return OSError(cause.errno, cause.strerror or os.strerror(cause.errno), str(target))


def _sync_folder(folder: Path) -> None:
    """Flush ``folder``'s entry list to the disk, so the rename survives a power cut."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder cannot be opened (Windows): the rename stands as it is
        return
    try:
        os.fsync(handle)
    except OSError:  # some file systems refuse fsync on a folder; the file itself is synced
        pass
    finally:
        os.close(handle)


def write_atomically(target: Path, write: Callable[[IO[bytes]], object]) -> None:
    """The one writer of a run's files: ``write(handle)``, then the file replaces ``target``.

    ``write`` gets a binary file open on ``target + ".tmp"``; the file is
    flushed and ``fsync``-ed to the disk, then renamed over ``target``
    (atomic), and the folder is synced. So ``target`` always holds either the
    old file or the whole new one, never half of one. If anything fails, the
    ``.tmp`` file is removed, ``target`` is untouched, and the error is an
    ``OSError`` naming ``target`` with the errno of the cause (``ENOSPC``,
    ``EROFS``, ``EACCES``, ...): ``torch.save``'s ``RuntimeError`` included
    (see :func:`write_error`). Other exceptions (a bug in ``write``,
    Ctrl-C) pass unchanged, the ``.tmp`` file removed all the same.
    """
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:
            sink = _Sink(handle)
            try:
                write(sink)  # type: ignore[arg-type]  # the part of IO[bytes] writers use
                sink.flush()
                os.fsync(handle.fileno())
            except RuntimeError as error:  # torch.save's, with the OSError it hid
                raise write_error(sink.error or error, target) from None
        os.replace(tmp, target)
    except BaseException as error:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # a folder turned read-only: the write's own error is the one to tell
            pass
        if isinstance(error, OSError):
            raise write_error(error, target) from None
        raise
    _sync_folder(target.parent)


def check_output_path(path: object, name: str, *, is_ours: Callable[[Path], bool], what: str,
                      example: str) -> Path:
    """Check, before any work, that ``path`` may receive a file of one kind; return it.

    Refused with a ``ValueError`` naming ``name``: an existing folder (the
    message suggests ``example`` in it), an existing file for which
    ``is_ours`` is false (it is not ``what``: never the training text), and a
    folder where no file can be created. A missing folder gives
    ``FileNotFoundError``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    target = check_path(path, name)
    if target.is_dir():
        raise ValueError(f"{name} {str(target)!r} is a folder; give a file path in it, such as "
                         f"{str(target / example)!r}")
    folder = target.resolve().parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{name} {str(target)!r}: the folder {str(folder)!r} does not "
                                "exist")
    if target.exists():
        if not target.is_file():
            raise ValueError(f"{name} {str(target)!r} exists and is not a regular file")
        if not is_ours(target):
            raise ValueError(f"{name} {str(target)!r} exists and is not {what}; refusing to "
                             "overwrite it. Choose another path, or delete the file first")
    try:  # the one sure test of writability (as root, permission bits say little)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".probe")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise ValueError(f"{name} {str(target)!r}: cannot create a file in {str(folder)!r} "
                         f"({error.strerror or error})") from None
    return target


def is_metrics(path: Path) -> bool:
    """Whether ``path`` holds a metrics JSON this CLI wrote (its ``format`` key)."""
    if path.stat().st_size > 256 * 2**20:  # a metrics file is kilobytes; don't read a corpus
        return False
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(metrics, dict) and metrics.get("format") == METRICS_FORMAT


def check_metrics_path(path: object, name: str) -> Path:
    """:func:`check_output_path` for a metrics JSON: only this CLI's metrics are overwritten."""
    return check_output_path(path, name, is_ours=is_metrics,
                             what="a metrics file written by python -m course_attn.train",
                             example="metrics.json")


def write_metrics(path: str | os.PathLike[str], metrics: dict[str, Any]) -> None:
    """Write the metrics JSON with :func:`write_atomically` (an ``OSError`` if it cannot)."""
    data = (json.dumps(metrics, indent=2) + "\n").encode("utf-8")
    write_atomically(Path(path), lambda handle: handle.write(data))


def _fresh_path(folder: Path, stem: str) -> Path:
    """A new, empty file in ``folder`` whose name starts with ``stem``: never an old file."""
    handle, name = tempfile.mkstemp(dir=folder, prefix=f"{stem}-", suffix=".json")
    os.close(handle)
    return Path(name)


def save_metrics(metrics: dict[str, Any], *, path: str | os.PathLike[str] | None,
                 near: str | os.PathLike[str] | None = None) -> tuple[Path | None, list[str]]:
    """Write ``metrics`` where it can, in this order, and say where it went.

    1. ``path``, the path asked for (``--metrics-out``), if any;
    2. next to it: a new file beside ``path`` (or, without one, beside ``near``, the
       checkpoint), for a path that cannot be replaced in a folder that still takes files;
    3. a new file in the system's temporary folder (:func:`tempfile.gettempdir`).

    Returns the path written (``None`` if none could be) and, for each place
    that failed, ``"'PLACE' (why)"``. A new file never replaces an existing one.
    """
    failures: list[str] = []
    places: list[tuple[Path, str | None]] = []  # (the file, or the folder of a new file; stem)
    if path is not None:
        places.append((Path(path), None))
    beside = Path(path) if path is not None else Path(near) if near is not None else None
    if beside is not None:
        places.append((beside.resolve().parent, beside.stem + ".metrics"))
    places.append((Path(tempfile.gettempdir()), "course_attn-metrics"))
    for place, stem in places:
        target = None
        try:
            target = place if stem is None else _fresh_path(place, stem)
            write_metrics(target, metrics)
            return target, failures
        except OSError as error:
            failures.append(f"{str(place)!r} ({error.strerror or error})")
            if stem is not None and target is not None:
                try:  # the new file _fresh_path made, still empty
                    target.unlink(missing_ok=True)
                except OSError:
                    pass
    return None, failures


def printed(show: Callable[[], object], program: str, when: str) -> bool:
    """Run ``show`` (it prints to the standard output); on a failed write, say so on the
    standard error (a redirected output on a full disk, a closed pipe) and return False.

    ``program`` starts the message (``"python -m course_attn.train"``), ``when`` says
    what was being written (``"before training"``). The caller then exits with
    :data:`EXIT_WRITE_FAILED`, without a traceback.
    """
    try:
        show()
        sys.stdout.flush()
    except OSError as error:
        print(f"{program}: error: could not write to the standard output {when}: "
              f"{error.strerror or error}", file=sys.stderr)
        _drop_standard_output()
        return False
    return True


def _drop_standard_output() -> None:
    """Send what is left of the standard output to ``os.devnull``: Python's own flush at
    exit would fail on it again, print a second error and exit with 120."""
    try:
        handle = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a notebook, a test's capture)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, handle)
    os.close(null)
