"""Chapter 11's training story: the learning rate of every step, and ``train(on_eval=...)``."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import course_attn.train.loop as trainer
from course_attn.data.seq2seq import ReverseTask
from course_attn.data.tasks import CopyTask
from course_attn.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import TrainConfig, TrainingDiverged, learning_rate, train

TASK = CopyTask(vocab_size=6, half_length=4)


def tiny_model(dropout: float = 0.0) -> MiniGPT:
    torch.manual_seed(0)
    return MiniGPT(GPTConfig(vocab_size=6, context_length=TASK.context_length, n_layers=1,
                             n_heads=2,
                             d_model=16, dropout=dropout))


def quick(**overrides) -> TrainConfig:
    options = dict(max_iters=9, batch_size=4, eval_interval=3, eval_iters=2, warmup_iters=2,
                   device="cpu", progress=False)
    return TrainConfig(**{**options, **overrides})


# ------------------------------------------------------- the learning rates
def test_every_step_records_the_learning_rate_the_optimizer_used(monkeypatch):
    used = []
    real_step = torch.optim.AdamW.step

    def spying_step(self, *args, **kwargs):
        used.append([group["lr"] for group in self.param_groups])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", spying_step)
    config = quick(max_iters=12, log_interval=5)
    result = train(tiny_model(), TASK, config)
    assert len(result.learning_rates) == len(result.train_losses) == 12
    assert [lrs[0] for lrs in used] == result.learning_rates  # what the steps used
    assert all(len(set(lrs)) == 1 for lrs in used)  # one rate for every group
    assert result.learning_rates == [learning_rate(it, config) for it in range(12)]
    assert result.learning_rates[2] == config.lr  # warmup over: the top of the schedule
    assert result.to_metrics()["learning_rate_history"] == result.learning_rates


def test_a_resumed_run_has_the_learning_rates_of_the_uninterrupted_run(tmp_path):
    options = dict(max_iters=9, lr_decay_iters=9)
    full = train(tiny_model(), TASK, quick(**options))
    path = tmp_path / "part.pt"
    train(tiny_model(), TASK, quick(**{**options, "max_iters": 6}), checkpoint_path=path)
    resumed = train(tiny_model(), TASK, quick(**options), resume_from=path)
    assert resumed.learning_rates == full.learning_rates
    assert resumed.train_losses == full.train_losses
    assert len(set(full.learning_rates)) > 3  # warmup and decay: the rates differ


def test_a_diverged_run_keeps_one_learning_rate_per_kept_loss():
    with pytest.raises(TrainingDiverged) as info:
        train(tiny_model(), TASK, quick(lr=1e6, grad_clip=0, eval_interval=9))
    result = info.value.result
    assert len(result.learning_rates) == len(result.train_losses) == info.value.iteration - 1


# ------------------------------------------------------------------ on_eval
def test_on_eval_is_called_after_every_evaluation_with_the_model_and_result():
    model, calls = tiny_model(), []

    def record(iteration, seen_model, result):
        calls.append((iteration, seen_model is model, result.eval_iters[-1],
                      len(result.train_losses), seen_model.training))

    result = train(model, TASK, quick(max_iters=8), on_eval=record)
    assert result.eval_iters == [3, 6, 8]
    # each call after its evaluation, with every loss up to it read back, in training mode
    assert calls == [(3, True, 3, 3, True), (6, True, 6, 6, True), (8, True, 8, 8, True)]


def nosy(iteration, model, result):
    """A callback that draws global random numbers and leaves the model in eval mode."""
    torch.rand(1000)
    prompt = torch.zeros(2, 1, dtype=torch.long)
    model.generate(prompt, 4, temperature=1.0)  # samples from the global generator
    model.eval()


def test_a_callback_that_draws_random_numbers_changes_nothing_about_the_run():
    # dropout > 0: the run itself draws from the global generator
    plain = train(tiny_model(0.2), TASK, quick())
    watched = train(tiny_model(0.2), TASK, quick(), on_eval=nosy)
    assert watched.train_losses == plain.train_losses  # exact
    assert watched.eval_val_losses == plain.eval_val_losses
    assert len(set(plain.train_losses)) > 1


def test_without_putting_the_random_state_back_the_callback_would_change_the_run(
        monkeypatch):
    """The test above can fail: the same callback, unguarded, changes dropout's masks."""
    plain = train(tiny_model(0.2), TASK, quick())
    monkeypatch.setattr(trainer, "_random_state_kept", lambda device: contextlib.nullcontext())
    watched = train(tiny_model(0.2), TASK, quick(), on_eval=nosy)
    assert watched.train_losses[:3] == plain.train_losses[:3]  # before the first call
    assert watched.train_losses[3:] != plain.train_losses[3:]


def test_a_resumed_run_calls_on_eval_only_for_its_own_evaluations(tmp_path):
    path = tmp_path / "part.pt"
    options = dict(max_iters=9, lr_decay_iters=9)
    train(tiny_model(), TASK, quick(**{**options, "max_iters": 3}), checkpoint_path=path)
    seen = []
    train(tiny_model(), TASK, quick(**options), resume_from=path,
          on_eval=lambda iteration, model, result: seen.append(iteration))
    assert seen == [6, 9]


def test_on_eval_sees_an_encoder_decoder_too():
    task = ReverseTask(n_symbols=6, min_len=2, max_len=6)
    torch.manual_seed(0)
    model = EncoderDecoder(EncoderDecoderConfig(task.vocab_size, task.vocab_size, d_model=16,
                                                n_heads=2, n_layers=1, context_length=16))
    seen = []
    result = train(model, task, quick(max_iters=4, eval_interval=2),
                   on_eval=lambda iteration, m, r: seen.append((iteration, m is model)))
    assert seen == [(2, True), (4, True)]
    assert len(result.learning_rates) == 4 and all(math.isfinite(x) for x in result.train_losses)


@pytest.mark.parametrize("on_eval", ["print", 3, [print]])
def test_on_eval_must_be_callable(on_eval):
    with pytest.raises(TypeError, match=r"on_eval must be a callable .* got"):
        train(tiny_model(), TASK, quick(), on_eval=on_eval)


def test_train_result_checks_its_learning_rates():
    with pytest.raises(TypeError, match="learning_rates must be a list of numbers"):
        trainer.TrainResult(learning_rates=[1e-3, "fast"])
