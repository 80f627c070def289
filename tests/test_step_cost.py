"""course_attn.lab.step_cost: the operators and host time of one training step (chapter 11)."""

from __future__ import annotations

import pytest

from course_attn.lab import step_cost


def total(counts) -> int:
    return sum(counts.values())


def test_a_step_is_counted_the_same_way_twice_and_both_models_run_it():
    first = step_cost.step_operator_counts("course", bias=False)
    assert first == step_cost.step_operator_counts("course", bias=False)  # code, not data
    nano = step_cost.step_operator_counts("nanoGPT", bias=False)
    for counts in (first, nano):  # a forward's matmuls, a backward, AdamW's foreach update
        assert counts["mm"] > 0 and any(op.startswith("_foreach_") for op in counts)


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
