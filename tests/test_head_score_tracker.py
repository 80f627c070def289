"""HeadScoreTracker: every head's previous-token and induction scores during training (ch. 11)."""

from __future__ import annotations

import pytest
import torch

from course_attn.data.tasks import RecallTask
from course_attn.lab.analysis import (
    HeadScoreTracker,
    attention_maps,
    induction_attention_score,
    offset_attention_score,
)
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import TrainConfig, train

RECALL = RecallTask(n_keys=4, n_values=4, n_pairs=6, max_step=2)
TOKENS = RECALL.get_batch("val", 8, generator=torch.Generator().manual_seed(0))[0]


def a_model() -> MiniGPT:
    torch.manual_seed(0)
    return MiniGPT(GPTConfig(vocab_size=RECALL.vocab_size,
                             context_length=RECALL.context_length, n_layers=2, n_heads=2,
                             d_model=16))


def a_config() -> TrainConfig:
    return TrainConfig(max_iters=6, batch_size=4, eval_interval=2, eval_iters=1,
                       warmup_iters=0, device="cpu", progress=False)


def test_the_tracker_records_the_scores_the_score_functions_give():
    model = a_model()
    tracker = HeadScoreTracker(TOKENS, previous_queries=RECALL.value_positions,
                               induction_queries=RECALL.key_positions)
    tracker(0, model)
    maps = attention_maps(model, TOKENS)  # (L, B, H, T, T)
    q = RECALL.value_positions
    by_hand = maps[..., q, q - 1].mean(dim=(1, 3))  # (L, H)
    iterations, previous, induction = tracker.history()
    assert iterations == [0] and previous.shape == induction.shape == (1, 2, 2)
    torch.testing.assert_close(previous[0], by_hand)
    torch.testing.assert_close(induction[0], induction_attention_score(
        maps, TOKENS, queries=RECALL.key_positions))


def test_without_queries_the_previous_token_score_is_offset_attention_score():
    model = a_model()
    tracker = HeadScoreTracker(TOKENS)
    tracker(3, model)
    maps = attention_maps(model, TOKENS)
    torch.testing.assert_close(tracker.previous_token[0],
                               offset_attention_score(maps.mean(dim=1), 1))
    torch.testing.assert_close(tracker.induction[0], induction_attention_score(maps, TOKENS))


def test_tracking_a_run_changes_nothing_about_it_and_records_every_evaluation():
    plain = train(a_model(), RECALL, a_config())
    model = a_model()
    tracker = HeadScoreTracker(TOKENS, induction_queries=RECALL.key_positions)
    tracked = train(model, RECALL, a_config(), on_eval=tracker)
    assert tracked.train_losses == plain.train_losses  # to the last bit
    assert tracked.eval_val_losses == plain.eval_val_losses
    iterations, previous, induction = tracker.history()
    assert iterations == tracked.eval_iters == [2, 4, 6]
    assert previous.shape == induction.shape == (3, 2, 2)
    assert ((previous >= 0) & (previous <= 1)).all() and ((induction >= 0) & (induction <= 1)).all()
    assert model.training  # the trainer put the mode back after each call
    assert not torch.equal(previous[0], previous[-1])  # the heads changed as it trained


def test_a_perfect_previous_token_head_scores_one():
    model, tokens = a_model(), TOKENS[:2]
    time = tokens.shape[1]
    back = torch.zeros(time, time)  # every query on the key just before it (the first: itself)
    back[torch.arange(1, time), torch.arange(time - 1)] = 1.0
    back[0, 0] = 1.0
    # each layer reports these weights (hooks run in order: this one before the tracker's)
    hooks = [block.self_attn.register_forward_hook(
        lambda mod, args, out: (out[0], back.expand(*out[1].shape)))
        for block in model.blocks]
    tracker = HeadScoreTracker(tokens)
    tracker(0, model)
    for hook in hooks:
        hook.remove()
    assert (tracker.previous_token[0] == 1).all()


@pytest.mark.parametrize(("make", "error", "phrase"), [
    (lambda: HeadScoreTracker(TOKENS.float()), TypeError, "tokens must be a tensor"),
    (lambda: HeadScoreTracker(TOKENS[0]), TypeError, "tokens must be a tensor"),
    (lambda: HeadScoreTracker(TOKENS, previous_queries=[1, 2]), TypeError, "previous_queries"),
    (lambda: HeadScoreTracker(TOKENS, previous_queries=torch.tensor([0, 3])), ValueError,
     r"previous_queries must hold positions in \[1, T=11\)"),
    (lambda: HeadScoreTracker(torch.arange(6)[None]), ValueError, "no scored query"),
    (lambda: HeadScoreTracker(TOKENS).history(), ValueError, "recorded nothing yet"),
    (lambda: HeadScoreTracker(TOKENS)(1.5, a_model()), TypeError, "iteration must be"),
    (lambda: HeadScoreTracker(TOKENS)(-1, a_model()), ValueError, "iteration must be"),
])
def test_bad_arguments_are_named(make, error, phrase):
    with pytest.raises(error, match=phrase):
        make()
