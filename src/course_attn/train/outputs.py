"""The files a training run writes (chapter 11), written so that no work is ever lost.

A run writes a checkpoint (``--out``, see :mod:`course_attn.train.checkpoint`) and
a metrics JSON (``--metrics-out``). Before any training, :func:`check_output_path`
makes sure each path may receive its file: never a folder, never a file of
another kind (above all the training text), never a folder where nothing can
be created. Every file is written next to its path and renamed into place
(:func:`write_atomically`), so a crash never leaves half a file behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The ``format`` key of the metrics JSON that ``--metrics-out`` writes: the CLI
#: overwrites an existing file only when it carries this key (a metrics file of its own).
METRICS_FORMAT = "course_attn.train.metrics/1"


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


def write_atomically(target: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` to ``target`` + ``".tmp"``, then rename that over ``target``.

    A crash never leaves a half-written file under ``target``; if the write
    fails, the ``.tmp`` file is removed and the old file is untouched.
    """
    tmp = target.with_name(target.name + ".tmp")
    try:
        write(tmp)
        tmp.replace(target)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # a folder turned read-only: the write's own error is the one to tell
            pass
        raise


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
    """Write the metrics JSON atomically (see :func:`write_atomically`)."""
    text = json.dumps(metrics, indent=2) + "\n"
    write_atomically(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))
