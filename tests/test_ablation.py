"""Chapter 11's ablation helpers, and the cached long runs (course_attn.lab.ablation.LONG_RUNS)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from course_attn.data.tasks import CopyTask, RecallTask
from course_attn.lab.ablation import freeze_positions, part_means, position_losses, task_parts
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import TrainConfig, train

COPY = CopyTask(vocab_size=6, half_length=4)
RECALL = RecallTask(n_keys=4, n_values=3, n_pairs=5, max_step=2)
SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "ablation_long_runs.py"


def model_for(task, **overrides) -> MiniGPT:
    torch.manual_seed(0)
    options = dict(n_layers=1, n_heads=2, d_model=16)
    return MiniGPT(GPTConfig(vocab_size=task.vocab_size, context_length=task.context_length,
                             **{**options, **overrides}))


def test_freeze_positions_zeroes_the_table_and_training_never_moves_it():
    model = freeze_positions(model_for(COPY))
    assert not model.pos.weight.requires_grad and (model.pos.weight == 0).all()
    before = model.embed.weight.detach().clone()
    train(model, COPY, TrainConfig(max_iters=3, batch_size=4, eval_iters=1, warmup_iters=0,
                                   device="cpu", progress=False))
    assert (model.pos.weight == 0).all()  # still zero after training (and weight decay)
    assert not torch.equal(model.embed.weight, before)  # while the rest did train


def test_without_positions_the_last_token_cannot_tell_the_order_before_it():
    """Chapter 2's symmetry: the last query sees a set of keys; only positions give it order."""
    x = torch.tensor([[3, 1, 4, 2, 5]])
    shuffled = torch.tensor([[2, 4, 1, 3, 5]])  # the same tokens before the last, reordered
    frozen = freeze_positions(model_for(COPY)).eval()
    torch.testing.assert_close(frozen(x)[0][0, -1], frozen(shuffled)[0][0, -1])
    plain = model_for(COPY).eval()
    assert not torch.allclose(plain(x)[0][0, -1], plain(shuffled)[0][0, -1])


def test_freeze_positions_needs_a_learned_table():
    with pytest.raises(ValueError, match="pos_encoding='learned'"):
        freeze_positions(model_for(COPY, pos_encoding="rope"))
    with pytest.raises(TypeError, match="model must be a MiniGPT"):
        freeze_positions(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(("task", "names"), [
    (COPY, ["noise half", "copied half"]),
    (RECALL, ["keys: value", "values: next key"]),
])
def test_task_parts_cover_every_position_once(task, names):
    parts = task_parts(task)
    assert list(parts) == names
    every = torch.cat(list(parts.values())).sort().values
    assert torch.equal(every, torch.arange(task.context_length))


def test_part_means_of_the_floor_are_the_task_s_exact_floors():
    copy = part_means(COPY.position_floor(), COPY)
    assert copy["all"] == pytest.approx(COPY.loss_floor())
    assert copy["noise half"] == pytest.approx(math.log(6)) and copy["copied half"] == 0
    recall = part_means(RECALL.position_floor(), RECALL)
    assert recall["all"] == pytest.approx(RECALL.loss_floor())
    assert recall["values: next key"] == pytest.approx(math.log(2))


def test_position_losses_are_the_cross_entropy_at_each_position_and_keep_the_mode():
    model = model_for(RECALL).train()
    losses = position_losses(model, RECALL, n_sequences=8, seed=3)
    assert model.training and losses.shape == (RECALL.context_length,)
    x, y = RECALL.get_batch("val", 8, generator=torch.Generator().manual_seed(3))
    model.eval()
    logits, mean_loss = model(x, y)
    expected = F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(dim=0)
    torch.testing.assert_close(losses, expected)
    assert losses.mean().item() == pytest.approx(mean_loss.item(), rel=1e-5)
    torch.testing.assert_close(position_losses(model, RECALL, n_sequences=8, seed=3), losses)


@pytest.mark.parametrize(("call", "error", "phrase"), [
    (lambda: position_losses("model", COPY), TypeError, "model must be a MiniGPT"),
    (lambda: position_losses(model_for(COPY), "copy"), TypeError, "task must be a CopyTask"),
    (lambda: position_losses(model_for(COPY), COPY, n_sequences=0), ValueError, "n_sequences"),
    (lambda: position_losses(model_for(COPY), RecallTask()), ValueError, "context_length=7"),
    (lambda: part_means([1.0], COPY), TypeError, "per_position must be a tensor"),
    (lambda: part_means(torch.ones(3), COPY), ValueError, r"per_position must have shape \(7,\)"),
    (lambda: task_parts(None), TypeError, "task must be a CopyTask or a RecallTask"),
])
def test_bad_arguments_are_named(call, error, phrase):
    with pytest.raises(error, match=phrase):
        call()


# ------------------------------------------------------------- the cached runs
def load_script():
    spec = importlib.util.spec_from_file_location("ablation_long_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the settings; trains nothing
    return module


def test_the_cache_holds_what_the_script_would_write_now():
    from course_attn.lab.ablation import LONG_RUNS

    script = load_script()
    assert list(LONG_RUNS) == [f"{name}, {change}" for name, change, _ in script.RUNS]
    for name, change, iterations in script.RUNS:
        entry = LONG_RUNS[f"{name}, {change}"]
        task = script.TASKS[name]
        assert entry["task"] == dataclasses.asdict(task)
        assert entry["model"] == dataclasses.asdict(script.model_for(name, change).config)
        assert entry["train"] == dataclasses.asdict(script.train_config(name, iterations))
        assert list(entry["losses"]) == ["all", *task_parts(task)]


def test_the_cached_losses_add_up_and_respect_the_floors():
    from course_attn.lab.ablation import LONG_RUNS

    for entry in LONG_RUNS.values():
        kind = CopyTask if "half_length" in entry["task"] else RecallTask
        task = kind(**entry["task"])
        losses, sizes = entry["losses"], {k: len(v) for k, v in task_parts(task).items()}
        weighted = sum(losses[k] * n for k, n in sizes.items()) / task.context_length
        assert losses["all"] == pytest.approx(weighted, rel=1e-9)  # "all" is their mean
        # a model that reads only the past never beats the floor (up to the 512-sequence
        # sample's luck)
        assert losses["all"] > task.loss_floor() - 0.02
        assert entry["train"]["max_iters"] > 200  # longer than the notebook's rows
