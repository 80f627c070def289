"""course_attn.lab.step_cost: the operators and host time of one training step (chapter 11)."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from course_attn.lab import step_cost
from course_attn.train import PRESETS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def total(counts) -> int:
    return sum(counts.values())


def test_a_step_is_counted_the_same_way_twice_and_both_models_run_it():
    first = step_cost.step_operator_counts("course", bias=False)
    assert first == step_cost.step_operator_counts("course", bias=False)  # code, not data
    nano = step_cost.step_operator_counts("nanoGPT", bias=False)
    for counts in (first, nano):  # a forward's matmuls, a backward, AdamW's foreach update
        assert counts["mm"] > 0 and any(op.startswith("_foreach_") for op in counts)


def test_the_timed_step_is_counted_on_the_cpu_where_the_loss_reads_its_value():
    """The step host_ms_rounds times (tiny sizes, CPU): the course's loss reads its value once
    and does not count its targets; on meta it reads nothing and counts (clamp)."""
    cpu = step_cost.step_operator_counts("course", bias=False, sizes=step_cost.TINY_SIZES,
                                         device="cpu")
    meta = step_cost.step_operator_counts("course", bias=False, sizes=step_cost.TINY_SIZES)
    assert cpu["clamp"] == 0 and meta["clamp"] == 1
    assert cpu["_local_scalar_dense"] == meta["_local_scalar_dense"] + 1  # AdamW's, the loss's
    nano = step_cost.step_operator_counts("nanoGPT", bias=False, sizes=step_cost.TINY_SIZES,
                                          device="cpu")
    assert nano["clamp"] == 0 and total(cpu) < total(nano)


def test_each_undone_simplification_costs_operators():
    plain = total(step_cost.step_operator_counts("course", bias=False))
    assert total(step_cost.step_operator_counts("course", bias=True)) > plain
    assert total(step_cost.step_operator_counts("course", bias=False, padded=True)) > plain
    looped = step_cost.step_operator_counts("course", bias=False, foreach=False)
    assert total(looped) > plain and not any(op.startswith("_foreach_") for op in looped)
    fused = total(step_cost.layer_step_operator_counts(fused_qkv=True))
    assert total(step_cost.layer_step_operator_counts(fused_qkv=False)) > fused


def test_host_time_is_a_positive_median_per_kind():
    ms = step_cost.step_host_ms(bias=False, steps=2, rounds=1, warmup=1)
    assert set(ms) == {"course", "nanoGPT"} and all(t > 0 for t in ms.values())


def test_host_time_alternates_the_order_of_building_and_of_steps(monkeypatch):
    """Each round builds the models from a different kind, and the steps go A B, B A, ...;
    a kind named twice (the A/A control of chapter 11) gets a second label."""
    built, stepped = [], []
    real_model = step_cost.step_model

    def model(kind, *args, **kwargs):
        built.append(kind)
        made = real_model(kind, *args, **kwargs)
        made[0].kind = f"{kind}{built.count(kind)}"
        return made

    monkeypatch.setattr(step_cost, "step_model", model)
    monkeypatch.setattr(step_cost, "training_step", lambda m, *_: stepped.append(m.kind))
    ms = step_cost.step_host_ms(bias=False, steps=3, rounds=2, warmup=0)
    assert built == ["course", "nanoGPT", "nanoGPT", "course"]
    assert stepped == ["course1", "nanoGPT1", "nanoGPT1", "course1", "course1", "nanoGPT1",
                       "nanoGPT2", "course2", "course2", "nanoGPT2", "nanoGPT2", "course2"]
    assert set(ms) == {"course", "nanoGPT"}
    built.clear()
    control = step_cost.step_host_ms(("nanoGPT", "nanoGPT"), bias=False, steps=1, rounds=1,
                                     warmup=0)
    assert set(control) == {"nanoGPT", "nanoGPT #2"} and built == ["nanoGPT", "nanoGPT"]
    rounds = step_cost.host_ms_rounds(bias=False, steps=2, rounds=3, warmup=0)
    assert {kind: len(each) for kind, each in rounds.items()} == {"course": 3, "nanoGPT": 3}


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="kind must be one of"):
        step_cost.step_model("gpt2", step_cost.TINY_SIZES, bias=False)


def test_the_models_are_built_alike():
    course, _ = step_cost.step_model("course", step_cost.TINY_SIZES, bias=False)
    nano, optimizer = step_cost.step_model("nanoGPT", step_cost.TINY_SIZES, bias=False)
    assert course.training and nano.training
    assert not any(name.endswith(".bias") for name, _ in course.named_parameters())
    assert optimizer.defaults["foreach"] is True
    x, y = step_cost.step_batch(step_cost.TINY_SIZES)
    assert x.shape == y.shape == (1, 8) and bool((x[:, 1:] == y[:, :-1]).all())


def test_update_forms_are_timed_each():
    ms = step_cost.update_ms(step_cost.TINY_SIZES, steps=3, warmup=1)
    assert set(ms) == {"AdamW loop", "AdamW foreach", "AdamW fused"}
    assert all(t > 0 for t in ms.values())


def test_the_cpu_recipe_record_holds_together():
    record = step_cost.CPU_RECIPE_RECORD
    rounds = record["rounds"]
    assert len(rounds) >= 2 and record["iters"] == PRESETS["cpu"]["max_iters"]
    assert record["iters"] % record["eval_interval"] == 0  # whole turns
    assert record["eval_interval"] <= PRESETS["cpu"]["eval_interval"]
    assert record["data"] == "tinyshakespeare.txt" and "+changes" not in record["commit"]
    for kind in ("course", "nanoGPT"):
        assert record["median_ms_per_iter"][kind] == pytest.approx(
            statistics.median(r[kind]["ms_per_iter"] for r in rounds), abs=1e-3)
        assert all(0 < r[kind][loss] < math.log(65) for r in rounds
                   for loss in ("val_loss", "val_loss_every_window"))
    median = record["median_ms_per_iter"]
    assert record["ratio"] == pytest.approx(median["course"] / median["nanoGPT"], abs=1e-4)
    assert [r["first"] for r in rounds[:2]] == ["course", "nanoGPT"]  # turns alternate


def test_the_cpu_recipe_benchmark_writes_such_a_record(tmp_path):
    """A tiny run of benchmarks/cpu_recipe.py: both trainers in their processes, taking
    turns every two iterations, and a record with the committed one's fields."""
    text = tmp_path / "tiny.txt"
    text.write_text("to be or not to be, that is the question.\n" * 40, encoding="utf-8")
    record = tmp_path / "record.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "cpu_recipe.py"), "--data", str(text), "--iters",
         "6", "--rounds", "1", "--eval-interval", "2", "--record", str(record)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert "taking turns every 2 iterations" in done.stdout
    written = json.loads(record.read_text(encoding="utf-8"))
    assert set(written) == set(step_cost.CPU_RECIPE_RECORD)
    assert written["iters"] == 6 and written["eval_interval"] == 2
    (only,) = written["rounds"]
    assert all(only[kind]["ms_per_iter"] > 0 and only[kind]["val_loss_every_window"] > 0
               for kind in ("course", "nanoGPT"))
