"""Chapter 11's ablation helpers, and the cached long runs (course_attn.lab.ablation.LONG_RUNS)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from course_attn.core.attention import ATTENTION_FUNCTIONS
from course_attn.data.tasks import CopyTask, RecallTask
from course_attn.lab.ablation import (
    ABLATIONS,
    LONG_RUNS,
    SHORT_RUNS,
    VARIANT_RUNS,
    ablated_model,
    freeze_positions,
    heads_removed,
    no_causal_mask_attention,
    part_means,
    position_losses,
    task_parts,
)
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
    script = load_script()
    assert list(LONG_RUNS) == [f"{name}, {change}" for name, change, _ in script.RUNS]
    assert list(SHORT_RUNS) == [f"{name}, {change}" for name in script.TASKS
                                for change in script.CHANGES]
    assert list(VARIANT_RUNS) == list(script.VARIANTS)
    rows = [(LONG_RUNS[f"{name}, {change}"], name, change, iterations, {})
            for name, change, iterations in script.RUNS]
    rows += [(SHORT_RUNS[f"{name}, {change}"], name, change, script.SHORT_ITERS, {})
             for name in script.TASKS for change in script.CHANGES]
    rows += [(VARIANT_RUNS[key], "recall", "full model", script.VARIANT_ITERS, overrides)
             for key, overrides in script.VARIANTS.items()]
    for entry, name, change, iterations, overrides in rows:
        task = script.TASKS[name]
        assert entry["task"] == dataclasses.asdict(task) and entry["change"] == change
        assert entry["model"] == dataclasses.asdict(
            script.model_config(name, change, **overrides))
        assert entry["train"] == dataclasses.asdict(script.train_config(name, iterations))
        assert entry["seeds"] == list(script.SEEDS) == [0, 1, 2]
        assert entry["seed_losses"][0] == entry["losses"]  # seed 0 is the chapter's run
        for losses in entry["seed_losses"]:
            assert list(losses) == ["all", *task_parts(task)]


def entry_objects(entry: dict) -> tuple[CopyTask | RecallTask, GPTConfig, TrainConfig]:
    kind = CopyTask if "half_length" in entry["task"] else RecallTask
    return kind(**entry["task"]), GPTConfig(**entry["model"]), TrainConfig(**entry["train"])


@pytest.mark.parametrize("key", list(LONG_RUNS))
def test_the_code_still_reproduces_the_cache(key):
    """The record's probe (seed 0, a few iterations) repeated: a change to the model, its
    initialisation, the trainer or the measurement that would make the cached rows stale
    (as a hand-edited row once was) fails here, and the script must be run again."""
    entry = LONG_RUNS[key]
    task, config, settings = entry_objects(entry)
    probe = entry["probe"]
    model = ablated_model(config, entry["change"], seed=0)
    train(model, task, dataclasses.replace(settings, max_iters=probe["max_iters"],
                                           eval_interval=probe["max_iters"]))
    now = part_means(position_losses(model, task), task)
    assert now == pytest.approx(probe["losses"], abs=1e-4), (
        f"{key}: the code no longer gives the cached probe; run tools/ablation_long_runs.py")


def test_the_cached_losses_add_up_and_respect_the_floors():
    for key, entry in [*LONG_RUNS.items(), *SHORT_RUNS.items(), *VARIANT_RUNS.items()]:
        task = entry_objects(entry)[0]
        sizes = {k: len(v) for k, v in task_parts(task).items()}
        for losses in entry["seed_losses"]:
            weighted = sum(losses[k] * n for k, n in sizes.items()) / task.context_length
            assert losses["all"] == pytest.approx(weighted, rel=1e-9)  # "all" is their mean
            if entry["change"] != "no causal mask":  # it reads the answer: below the floor
                # a model that reads only the past never beats the floor (up to the
                # 512-sequence sample's luck)
                assert losses["all"] > task.loss_floor() - 0.02, key
    assert all(entry["train"]["max_iters"] > 200 for entry in LONG_RUNS.values())
    assert all(entry["train"]["max_iters"] == 200 for entry in SHORT_RUNS.values())
    assert all(entry["train"]["max_iters"] == 500 for entry in VARIANT_RUNS.values())


# ------------------------------------------------------- ablated models, removed heads
def test_ablated_model_takes_one_part_away_and_is_seeded():
    config = GPTConfig(vocab_size=6, context_length=7, n_layers=2, n_heads=2, d_model=16)
    full = ablated_model(config, "full model", seed=3)
    torch.manual_seed(3)
    torch.testing.assert_close(full.state_dict(), MiniGPT(config).state_dict())
    assert not torch.equal(ablated_model(config, "full model", seed=4).embed.weight,
                           full.embed.weight)
    assert ablated_model(config, "one layer").config.n_layers == 1
    frozen = ablated_model(config, "no positions").pos.weight
    assert (frozen == 0).all() and not frozen.requires_grad
    x = torch.randint(0, 6, (1, 7))
    changed = x.clone()
    changed[0, -1] = (x[0, -1] + 1) % 6
    for change in ABLATIONS:
        model = ablated_model(config, change).eval()
        moved = not torch.equal(model(x)[0][0, :-1], model(changed)[0][0, :-1])
        assert moved == (change == "no causal mask"), change  # only it sees the future


def test_no_causal_mask_attention_is_the_manual_path_without_any_mask():
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    out, weights = no_causal_mask_attention(q, k, v, causal, is_causal=True, dropout_p=0.0)
    expected, expected_weights = ATTENTION_FUNCTIONS["manual"](q, k, v, None, is_causal=False,
                                                               dropout_p=0.0)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)
    assert (weights[..., 0, 1:] > 0).all()  # the first query sees the later keys


def test_removing_a_head_zeroes_its_columns_of_out_proj_and_nothing_else():
    model = model_for(COPY, n_layers=2).eval()
    x = torch.randint(0, 6, (3, COPY.context_length))
    before = model(x)[0]
    with heads_removed(model, [(1, 0), (0, 1)]) as same:
        assert same is model
        removed = model(x)[0]
    torch.testing.assert_close(model(x)[0], before)  # the hooks are gone
    zeroed = model_for(COPY, n_layers=2).eval()
    with torch.no_grad():
        zeroed.blocks[1].self_attn.out_proj.weight[:, 0:8] = 0  # head 0 writes columns 0..7
        zeroed.blocks[0].self_attn.out_proj.weight[:, 8:16] = 0  # head 1: 8..15
    torch.testing.assert_close(removed, zeroed(x)[0])
    assert not torch.allclose(removed, before)
    with heads_removed(model, []):
        torch.testing.assert_close(model(x)[0], before)


def test_removed_heads_come_back_after_an_error():
    model = model_for(COPY).eval()
    x = torch.randint(0, 6, (1, COPY.context_length))
    before = model(x)[0]
    with pytest.raises(RuntimeError, match="inside"), heads_removed(model, [(0, 0)]):
        raise RuntimeError("inside")
    torch.testing.assert_close(model(x)[0], before)


@pytest.mark.parametrize(("call", "error", "phrase"), [
    (lambda: ablated_model("config", "one layer"), TypeError, "config must be a GPTConfig"),
    (lambda: ablated_model(GPTConfig(vocab_size=6, context_length=7), "no heads"), ValueError,
     "change must be"),
    (lambda: ablated_model(GPTConfig(vocab_size=6, context_length=7), "one layer",
                                   seed=-1), ValueError, "seed"),
    (lambda: heads_removed(torch.nn.Linear(2, 2), []).__enter__(), TypeError,
     "model must be a MiniGPT"),
    (lambda: heads_removed(model_for(COPY), [0]).__enter__(), TypeError, "heads must be"),
    (lambda: heads_removed(model_for(COPY), [(1, 0)]).__enter__(), ValueError,
     r"\(1, 0\) is not a head of this model \(1 layers of 2 heads\)"),
])
def test_bad_ablation_arguments_are_named(call, error, phrase):
    with pytest.raises(error, match=phrase):
        call()
