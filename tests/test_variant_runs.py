"""Chapter 10: recall look-ups, the oracle, and the cached seed runs (lab.variant_runs)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from course_attn.data.tasks import CopyTask, RecallTask
from course_attn.lab.variant_runs import (
    RECALL_POSITION_KINDS,
    VARIANT_RECORD,
    VARIANT_RUNS,
    previous_token_head,
    recall_gap_by_kind,
    recall_lookup_distances,
    recall_oracle_losses,
)

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "variant_seed_runs.py"
SMALL = RecallTask(n_keys=4, n_values=8, n_pairs=5, max_step=2)
# keys 1, 3, 1, 2, 1 with their values (ids 4..11): the third key repeats the first, the
# fifth repeats the third
HAND = torch.tensor([[1, 9, 3, 8, 1, 9, 2, 6, 1]])


def by_hand(x: torch.Tensor) -> list[list[int]]:
    """The look-up distances of a recall batch, one sequence and one key at a time."""
    rows = []
    for seq in x.tolist():
        row = [-1] * len(seq)
        for i in range(0, len(seq), 2):
            earlier = [j for j in range(0, i, 2) if seq[j] == seq[i]]
            if earlier:
                row[i] = i - (earlier[-1] + 1)  # the value after the latest copy
        rows.append(row)
    return rows


def test_lookup_distances_of_a_hand_made_sequence():
    assert recall_lookup_distances(HAND).tolist() == [[-1, -1, -1, -1, 3, -1, -1, -1, 3]]


def test_lookup_distances_agree_with_a_loop_on_random_batches():
    task = RecallTask(n_keys=5, n_values=3, n_pairs=9, max_step=3)
    x, _ = task.get_batch("val", 64, generator=torch.Generator().manual_seed(1))
    assert recall_lookup_distances(x).tolist() == by_hand(x)


def test_oracle_losses_of_a_hand_made_sequence():
    ln2, ln8 = math.log(2), math.log(8)
    expected = torch.tensor([[ln8, ln2, ln8, ln2, 0.0, ln2, ln8, ln2, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(recall_oracle_losses(SMALL, HAND), expected)


def test_the_oracle_averages_to_the_floor():
    task = RecallTask(n_keys=4, n_values=8, n_pairs=8, max_step=2)
    x, _ = task.get_batch("val", 40_000, generator=torch.Generator().manual_seed(2))
    per_position = recall_oracle_losses(task, x).mean(dim=0)  # (T,)
    torch.testing.assert_close(per_position, task.position_floor(), atol=0.02, rtol=0)
    assert per_position.mean().item() == pytest.approx(task.loss_floor(), abs=0.005)


def test_the_oracle_is_the_loss_of_its_own_predictions():
    # a model that predicts what the oracle knows: uniform over the next R keys after a
    # value, the earlier value of a repeated key, uniform over the values for a new key
    task = SMALL
    x, y = task.get_batch("val", 32, generator=torch.Generator().manual_seed(3))
    dist = recall_lookup_distances(x)
    probs = torch.zeros(*x.shape, task.vocab_size, dtype=torch.float64)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            if t % 2:  # a value: the next key is 1..R steps round from the key before it
                for step in range(1, task.max_step + 1):
                    probs[b, t, (x[b, t - 1] + step) % task.n_keys] = 1 / task.max_step
            elif dist[b, t] >= 0:  # a repeated key: its value is known
                probs[b, t, x[b, t - dist[b, t]]] = 1.0
            else:
                probs[b, t, task.n_keys:] = 1 / task.n_values
    paid = -probs.gather(2, y[..., None]).squeeze(2).log()  # (B, T)
    torch.testing.assert_close(paid, recall_oracle_losses(task, x))


def test_gap_by_kind_of_a_hand_made_sequence():
    gap = torch.arange(9, dtype=torch.float64)[None]  # (1, 9): position t pays t
    # value positions 1, 3, 5, 7; new keys at 0, 2, 6; look-ups 3 back at 4 and 8
    assert recall_gap_by_kind(gap, HAND, seen=3) == pytest.approx(
        {"next_key": 16 / 9, "new_value": 8 / 9, "seen_lookup": 12 / 9, "unseen_lookup": 0.0})
    assert recall_gap_by_kind(gap, HAND, seen=2) == pytest.approx(
        {"next_key": 16 / 9, "new_value": 8 / 9, "seen_lookup": 0.0, "unseen_lookup": 12 / 9})


def test_gap_by_kind_adds_up_to_the_mean_gap():
    task = RecallTask(n_keys=4, n_values=8, n_pairs=16, max_step=2)
    x, _ = task.get_batch("val", 64, generator=torch.Generator().manual_seed(4))
    gap = torch.rand(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    parts = recall_gap_by_kind(gap, x, seen=13)
    assert tuple(parts) == RECALL_POSITION_KINDS
    assert sum(parts.values()) == pytest.approx(gap.mean().item(), abs=1e-12)
    assert parts["unseen_lookup"] > 0  # 31 tokens hold look-ups further back than 13


def test_previous_token_head_of_hand_made_maps():
    # T = 7, trained length 3: value position 1 is inside, 3 and 5 beyond it
    T = 7
    causal = torch.tril(torch.ones(T, T, dtype=torch.float64))
    maps = (causal / causal.sum(-1, keepdim=True)).expand(2, 1, 2, T, T).clone()
    sharp = torch.zeros(T, T, dtype=torch.float64)
    sharp[1, 0] = 1.0  # inside: all its weight 1 back
    sharp[3, 2], sharp[3, 0] = 0.5, 0.5  # beyond: half 1 back, half 3 back (never seen)
    sharp[5, 4], sharp[5, 1] = 0.25, 0.75  # a quarter 1 back, the rest 4 back
    for t in (0, 2, 4, 6):
        sharp[t, t] = 1.0
    maps[1, 0, 1] = sharp
    found = previous_token_head(maps, trained_length=3)
    assert found == pytest.approx({"layer": 1, "head": 1, "back_1_within": 1.0,
                                   "back_1_beyond": 0.375, "unseen_beyond": 0.625})


@pytest.mark.parametrize(("call", "error", "phrase"), [
    (lambda: recall_gap_by_kind(torch.zeros(1, 8, dtype=torch.float64), HAND, 3), ValueError,
     "shape of x"),
    (lambda: recall_gap_by_kind(torch.zeros(1, 9), HAND, -1), ValueError, "seen"),
    (lambda: previous_token_head(torch.zeros(1, 1, 1, 5, 5), 4), ValueError,
     "trained_length"),
    (lambda: previous_token_head(torch.zeros(1, 5, 5), 2), ValueError, "maps"),
])
def test_bad_arguments_of_the_splits_are_named(call, error, phrase):
    with pytest.raises(error, match=phrase):
        call()


@pytest.mark.parametrize(("call", "error", "phrase"), [
    (lambda: recall_lookup_distances(HAND.float()), TypeError, "token ids"),
    (lambda: recall_lookup_distances(HAND[0]), ValueError, "x"),
    (lambda: recall_oracle_losses(CopyTask(vocab_size=6, half_length=4), HAND), TypeError,
     "RecallTask"),
    (lambda: recall_oracle_losses(SMALL, HAND[:, :7]), ValueError, "T = 9"),
])
def test_bad_arguments_are_named(call, error, phrase):
    with pytest.raises(error, match=phrase):
        call()


# ------------------------------------------------------------- the cached runs
def load_script():
    spec = importlib.util.spec_from_file_location("variant_seed_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the settings; trains nothing
    return module


def test_the_record_holds_what_the_script_would_write_now():
    script = load_script()
    assert list(VARIANT_RUNS) == list(script.VARIANTS)
    assert VARIANT_RECORD["seeds"] == list(script.SEEDS)
    for name, entry in VARIANT_RUNS.items():
        assert entry["task"] == dataclasses.asdict(script.RECALL)
        assert entry["model"] == dataclasses.asdict(script.model_for(name, 0).config)
        assert entry["train"] == dataclasses.asdict(script.train_config(name, 0))
        assert entry["linear_attention"] == script.VARIANTS[name][1]
        assert list(entry["seeds"]) == [str(seed) for seed in script.SEEDS]


def test_the_recorded_losses_agree_with_the_oracle_and_the_floor():
    script = load_script()
    x, _ = script.RECALL.get_batch("val", script.VAL_N,
                                   generator=torch.Generator().manual_seed(script.VAL_SEED))
    oracle = recall_oracle_losses(script.RECALL, x).mean().item()
    for name, entry in VARIANT_RUNS.items():
        for run in entry["seeds"].values():
            assert run["loss"] - run["above_oracle"] == pytest.approx(oracle, abs=1e-9)
            assert run["loss"] - run["above_floor"] == pytest.approx(
                script.RECALL.loss_floor(), abs=1e-9)
            # no model beats the oracle on its own sequences by more than luck allows
            assert run["above_oracle"] > -0.02
            if name in script.LENGTH_TESTED:
                assert run["lookup_loss_seen_2T"] >= 0 and run["lookup_loss_unseen_2T"] >= 0
                parts = run["above_oracle_2T_by_kind"]
                assert tuple(parts) == RECALL_POSITION_KINDS
                assert sum(parts.values()) == pytest.approx(run["above_oracle_2T"], abs=1e-12)
                assert tuple(run["above_oracle_2T_by_kind_window"]) == RECALL_POSITION_KINDS
                head = run["previous_token_head_2T"]
                assert 0 <= head["layer"] < entry["model"]["n_layers"]
                assert 0 <= head["head"] < entry["model"]["n_heads"]
                assert all(0 <= head[key] <= 1 for key in
                           ("back_1_within", "back_1_beyond", "unseen_beyond"))
