"""GPU records: figures measured on a lent GPU, as data the chapters read (chapters 9, 11).

A chapter executed on a CPU cannot measure a GPU, so what it says about one comes from a
record: ``benchmarks/records/NAME.md`` is what ``benchmarks/gpu_check.sh`` printed on a named
card, with its date and versions, and ``lab/records/NAME.json`` (shipped with the package, so
that Colab has it too) holds the figures the chapters quote from it. A chapter's cell loads
the record with :func:`gpu_record`, prints what it quotes and glues it
(:func:`course_attn.lab.glue.glue`), so a changed record changes the sentence.
``tests/test_records.py`` holds every figure of the JSON to the text of its record.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["GPU_RECORDS", "gpu_record"]


def _folder():
    return resources.files("course_attn.lab").joinpath("records")


GPU_RECORDS: tuple[str, ...] = tuple(sorted(
    entry.name.removesuffix(".json") for entry in _folder().iterdir()
    if entry.name.endswith(".json")))


@cache
def _load(name: str) -> dict[str, Any]:
    return json.loads(_folder().joinpath(f"{name}.json").read_text(encoding="utf-8"))


def gpu_record(name: str) -> dict[str, Any]:
    """The figures of the GPU record ``name`` (one of :data:`GPU_RECORDS`), as a fresh dict.

    Chapters 9 and 11 quote the GPU from these records.

    Every record names its ``card``, ``date``, ``torch``, ``triton``, ``commit`` and the
    ``record`` file it was taken from; its other keys are the measurements (see the JSON).
    """
    if not isinstance(name, str):
        raise TypeError(f"gpu_record: name must be a str, got {type(name).__name__}")
    if name not in GPU_RECORDS:
        raise ValueError(f"gpu_record: no record named {name!r}; the records are "
                         f"{', '.join(GPU_RECORDS)}")
    return copy.deepcopy(_load(name))
