"""The GPU records' figures, as the chapters read them, are the records' own (issue 39).

``course_attn.lab.records`` ships the figures the chapters quote from ``benchmarks/records/``
as JSON. Every number of a JSON file must be written in its record, so that the chapters
cannot quote a figure the record does not hold.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from course_attn.lab.records import GPU_RECORDS, gpu_record

ROOT = Path(__file__).resolve().parents[1]


def numbers(node) -> list[float]:
    if isinstance(node, bool) or node is None or isinstance(node, str):
        return []
    if isinstance(node, (int, float)):
        return [node]
    values = node.values() if isinstance(node, dict) else node
    return [n for value in values for n in numbers(value)]


def written(value: float) -> list[str]:
    if float(value).is_integer():
        return [f"{int(value):,d}", str(int(value))]
    return [repr(value), f"{value:.3f}", f"{value:.2e}"]


def test_there_are_records():
    assert {"h100-2026-11-26", "h100-2026-11-27", "h100-2026-11-28-reruns"} <= set(GPU_RECORDS)


@pytest.mark.parametrize("name", GPU_RECORDS)
def test_every_figure_of_a_record_is_in_its_text(name):
    record = gpu_record(name)
    text = (ROOT / record["record"]).read_text(encoding="utf-8")
    assert record["date"] in text and record["card"] in text
    assert record["torch"] in text and record["triton"] in text and record["commit"] in text
    missing = [v for v in numbers(record)
               if not any(re.search(rf"(?<![\d.]){re.escape(w)}(?![\d])", text)
                          for w in written(v))]
    assert not missing, f"{name}: not in {record['record']}: {missing}"


def verdict_tables(node):
    """Every table of verdicts in a record: a dict of rows, each a dict of text cells."""
    if isinstance(node, dict):
        if node and all(isinstance(row, dict) and row and all(isinstance(cell, str)
                                                              for cell in row.values())
                        for row in node.values()):
            yield node
        else:
            for value in node.values():
                yield from verdict_tables(value)


@pytest.mark.parametrize("name", GPU_RECORDS)
def test_every_verdict_of_a_record_is_in_its_text(name):
    """Text verdicts ("zeros", "NaN") too: each row's label words are cells of one line of
    the record's tables, and that line holds every verdict of the row."""
    record = gpu_record(name)
    lines = [line for line in (ROOT / record["record"]).read_text(encoding="utf-8").splitlines()
             if line.strip().startswith("|")]
    def cells(line: str) -> set[str]:  # a | escaped as \| belongs to its cell
        return {cell.strip().replace("\0", "|") for cell in line.replace("\\|", "\0").split("|")}

    wrong = []
    for table in verdict_tables(record):
        for label, row in table.items():
            words = set(label.split())
            if not any(words <= cells(line)
                       and all(verdict in line.replace("\\|", "|") for verdict in row.values())
                       for line in lines):
                wrong.append((label, row))
    assert not wrong, f"{name}: rows not in {record['record']}: {wrong}"


def test_a_record_is_a_fresh_copy():
    first = gpu_record("h100-2026-11-27")
    first["trainer"]["ms_per_iter"].clear()
    assert gpu_record("h100-2026-11-27")["trainer"]["ms_per_iter"]


def test_unknown_record():
    with pytest.raises(ValueError, match="h100-2026-11-26"):
        gpu_record("a100-1999")
    with pytest.raises(TypeError, match="name"):
        gpu_record(3)  # type: ignore[arg-type]
