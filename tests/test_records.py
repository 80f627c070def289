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


def test_a_record_is_a_fresh_copy():
    first = gpu_record("h100-2026-11-27")
    first["trainer"]["ms_per_iter"].clear()
    assert gpu_record("h100-2026-11-27")["trainer"]["ms_per_iter"]


def test_unknown_record():
    with pytest.raises(ValueError, match="h100-2026-11-26"):
        gpu_record("a100-1999")
    with pytest.raises(TypeError, match="name"):
        gpu_record(3)  # type: ignore[arg-type]
