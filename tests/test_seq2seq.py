"""The seq2seq tasks' exact answers, their padding and masks, and training the encoder-decoder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from course_attn.data import seq2seq
from course_attn.data.seq2seq import (
    BOS,
    EOS,
    PAD,
    ReverseTask,
    Seq2SeqBatch,
    SortTask,
    exact_match,
    exact_match_accuracy,
    greedy_answers,
    seq2seq_loss,
)
from course_attn.data.tasks import CopyTask
from course_attn.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import TrainConfig, estimate_loss, train

TASK = ReverseTask(n_symbols=6, min_len=2, max_len=6)


def model_for(task: seq2seq.Seq2SeqTask, **overrides) -> EncoderDecoder:
    options = dict(d_model=32, n_heads=2, n_layers=1, context_length=16)
    return EncoderDecoder(EncoderDecoderConfig(task.vocab_size, task.vocab_size,
                                               **{**options, **overrides}))


def quick(**overrides) -> TrainConfig:
    options = dict(max_iters=2, batch_size=4, eval_interval=2, eval_iters=1, warmup_iters=0,
                   device="cpu", progress=False)
    return TrainConfig(**{**options, **overrides})


def draw(task: seq2seq.Seq2SeqTask, batch_size: int = 256, seed: int = 0) -> Seq2SeqBatch:
    return task.sample(batch_size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("task, rule", [
    (ReverseTask(n_symbols=5, min_len=1, max_len=7), lambda tokens: tokens[::-1]),
    (SortTask(n_symbols=5, min_len=1, max_len=7), sorted),
])
def test_answers_padding_and_masks_are_exact(task, rule: Callable[[list[int]], list[int]]):
    batch = draw(task)
    B, T_s, T_t = batch.src.shape[0], task.max_len, task.max_len + 1
    assert batch.src.shape == batch.src_attention_mask.shape == (B, T_s)
    assert batch.tgt_in.shape == batch.tgt_out.shape == batch.tgt_attention_mask.shape == (B, T_t)
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    lengths = set()
    for i in range(B):
        L = int(batch.src_attention_mask[i].sum())
        lengths.add(L)
        tokens = batch.src[i, :L].tolist()
        answer = list(rule(tokens))
        assert all(3 <= t < task.vocab_size for t in tokens)
        # Right padding: real tokens first, then PAD / -1, and the masks say so.
        assert batch.src_attention_mask[i].tolist() == [True] * L + [False] * (T_s - L)
        assert batch.src[i, L:].tolist() == [PAD] * (T_s - L)
        assert batch.tgt_attention_mask[i].tolist() == [True] * (L + 1) + [False] * (T_s - L)
        assert batch.tgt_in[i].tolist() == [BOS, *answer] + [PAD] * (T_s - L)
        assert batch.tgt_out[i].tolist() == [*answer, EOS] + [-1] * (T_s - L)
    assert lengths == set(range(task.min_len, task.max_len + 1))


def test_the_decoder_input_is_the_target_shifted_right():
    batch = draw(TASK)
    real = batch.tgt_attention_mask
    assert torch.equal(batch.tgt_in[:, 1:][real[:, 1:]], batch.tgt_out[:, :-1][real[:, 1:]])
    assert torch.equal(batch.tgt_out != -1, real)


def test_batches_repeat_with_a_seed_and_differ_between_seeds():
    one, again, other = draw(TASK, seed=3), draw(TASK, seed=3), draw(TASK, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(one, again, strict=True))
    assert not torch.equal(one.src, other.src)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a = TASK.get_batch("train", 8, generator=g1, device="cpu")
    b = TASK.get_batch("val", 8, generator=g2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_batches_go_to_the_requested_device():
    batch = TASK.get_batch("train", 4, generator=torch.Generator().manual_seed(0),
                           device="meta")
    assert all(t.device.type == "meta" for t in batch)


# name -> (wrong-type call, the argument it names, wrong-value call, the argument it names).
BATCH = draw(TASK, batch_size=4)
CASES: dict[str, tuple[Callable[[], object], str, Callable[[], object], str]] = {
    "ReverseTask": (lambda: ReverseTask(n_symbols=2.0), "n_symbols",
                    lambda: ReverseTask(n_symbols=1), "n_symbols"),
    "SortTask": (lambda: SortTask(min_len="2"), "min_len",
                 lambda: SortTask(min_len=5, max_len=4), "max_len"),
    "Seq2SeqTask.sample": (lambda: TASK.sample(2, generator=1), "generator",
                           lambda: TASK.sample(0), "batch_size"),
    "Seq2SeqTask.get_batch": (lambda: TASK.get_batch(None, 2), "split",
                              lambda: TASK.get_batch("test", 2), "split"),
    "Seq2SeqBatch.to": (lambda: BATCH.to(0), "device", lambda: BATCH.to("gpu"), "device"),
    "seq2seq_loss": (lambda: seq2seq_loss(model_for(TASK), tuple(BATCH)), "batch",
                     lambda: seq2seq_loss(model_for(SortTask(n_symbols=2)), BATCH), "src"),
    "greedy_answers": (
        lambda: greedy_answers(MiniGPT(GPTConfig(vocab_size=9, context_length=4, n_layers=1,
                                                 n_heads=1, d_model=8)), BATCH), "model",
        lambda: greedy_answers(model_for(TASK), BATCH,
                               src_attention_mask=BATCH.tgt_attention_mask),
        "src_attention_mask"),
    "exact_match": (lambda: exact_match(BATCH.tgt_out.tolist(), BATCH), "predicted",
                    lambda: exact_match(BATCH.tgt_out[:, 1:], BATCH), "predicted"),
    "exact_match_accuracy": (lambda: exact_match_accuracy(model_for(TASK), CopyTask()), "task",
                             lambda: exact_match_accuracy(model_for(TASK), TASK, n_batches=0),
                             "n_batches"),
}


def test_the_sweep_covers_every_public_callable():
    found = {name for name in seq2seq.__all__ if callable(getattr(seq2seq, name))}
    found -= {"Seq2SeqBatch", "Seq2SeqTask"}  # built by the tasks; their methods are below
    found |= {"Seq2SeqTask.sample", "Seq2SeqTask.get_batch", "Seq2SeqBatch.to"}
    assert found == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_arguments_name_the_argument(name):
    wrong_type, type_argument, wrong_value, value_argument = CASES[name]
    with pytest.raises(TypeError, match=type_argument):
        wrong_type()
    with pytest.raises(ValueError, match=value_argument) as info:
        wrong_value()
    assert not isinstance(info.value, TypeError)


def test_exact_match_ignores_padding_and_needs_the_eos():
    batch = draw(TASK, batch_size=8)
    right = batch.tgt_out.clamp(min=0)  # padding positions hold PAD instead of -1
    right[batch.tgt_out == -1] = 5  # anything at all after the EOS
    assert exact_match(right, batch).all()
    wrong = right.clone()
    wrong[0, 0] = BOS  # one wrong answer token
    lengths = batch.src_attention_mask.sum(dim=1)
    wrong[1, lengths[1]] = 3  # a symbol where the EOS belongs
    assert exact_match(wrong, batch).tolist() == [False, False] + [True] * 6


def test_train_refuses_mismatched_models_data_and_checkpoints(tmp_path):
    gpt = MiniGPT(GPTConfig(vocab_size=9, context_length=4, n_layers=1, n_heads=1, d_model=8))
    with pytest.raises(TypeError, match="data must be a Seq2SeqTask"):
        train(model_for(TASK), CopyTask(), quick())
    with pytest.raises(TypeError, match="data: a ReverseTask trains an EncoderDecoder"):
        train(gpt, TASK, quick())
    with pytest.raises(ValueError, match="vocab_size"):
        train(model_for(SortTask(n_symbols=2)), TASK, quick())
    with pytest.raises(ValueError, match="context_length=6"):
        train(model_for(TASK, context_length=6), TASK, quick())
    with pytest.raises(ValueError, match="checkpoint_path must be None for an EncoderDecoder"):
        train(model_for(TASK), TASK, quick(), checkpoint_path=tmp_path / "c.pt")
    with pytest.raises(ValueError, match="resume_from must be None for an EncoderDecoder"):
        train(model_for(TASK), TASK, quick(), resume_from=tmp_path / "c.pt")
    assert not (tmp_path / "c.pt").exists()


def test_estimate_loss_of_the_encoder_decoder_is_its_seq2seq_loss():
    torch.manual_seed(0)
    model = model_for(TASK)
    config = quick(eval_iters=1, batch_size=8)
    losses = estimate_loss(model, TASK, config)
    batch = TASK.get_batch("val", 8, generator=torch.Generator().manual_seed(config.seed + 2))
    model.eval()
    with torch.no_grad():
        expected = seq2seq_loss(model, batch).item()
    assert losses["val"] == pytest.approx(expected, rel=1e-6)


def test_greedy_answers_give_each_mask_where_it_belongs():
    """``memory_attention_mask`` to cross-attention only, ``src_attention_mask`` to both."""
    torch.manual_seed(3)
    model = model_for(TASK).double().eval()
    batch = draw(TASK, batch_size=16, seed=2)
    true = batch.src_attention_mask
    lengths = true.sum(dim=1)
    wrong = torch.arange(TASK.src_len) < (lengths + 1).clamp(max=TASK.src_len)[:, None]
    bos = torch.full((16, 1), BOS, dtype=torch.long)
    n = batch.tgt_out.shape[1]

    def decode(**masks):
        return model.greedy_decode(batch.src, bos, n, **masks)[:, 1:]

    default = greedy_answers(model, batch)
    assert torch.equal(default, decode(src_attention_mask=true))
    assert torch.equal(greedy_answers(model, batch, memory_attention_mask=true), default)
    crossed = greedy_answers(model, batch, memory_attention_mask=wrong)
    assert torch.equal(crossed, decode(src_attention_mask=true, memory_attention_mask=wrong))
    assert torch.equal(crossed, greedy_answers(model, batch, use_cache=False,
                                               memory_attention_mask=wrong))
    both = greedy_answers(model, batch, src_attention_mask=wrong)  # as before: in both
    assert torch.equal(both, decode(src_attention_mask=wrong, memory_attention_mask=wrong))
    assert not torch.equal(crossed, default) and not torch.equal(crossed, both)
    with pytest.raises(TypeError, match="memory_attention_mask must be a torch.bool"):
        greedy_answers(model, batch, memory_attention_mask=wrong.long())
    with pytest.raises(ValueError, match="memory_attention_mask must have shape"):
        greedy_answers(model, batch, memory_attention_mask=batch.tgt_attention_mask)


@dataclass(frozen=True)
class OneBatch(ReverseTask):
    """Always the same batch: the model can memorise it."""

    def sample(self, batch_size, *, generator=None):
        return super().sample(batch_size, generator=torch.Generator().manual_seed(0))


def test_a_tiny_encoder_decoder_overfits_one_batch_of_reversals():
    task = OneBatch(n_symbols=6, min_len=2, max_len=6)
    torch.manual_seed(0)
    model = model_for(task)
    result = train(model, task, quick(max_iters=150, batch_size=16, lr=1e-2, warmup_iters=10,
                                      eval_interval=150, weight_decay=0.0))
    assert len(result.train_losses) == 150 and result.train_losses[0] > 1.5
    assert result.final_val_loss < 0.01
    assert result.n_params == sum(p.numel() for p in model.parameters())
    assert result.tokens_per_s > 0
    batch = task.sample(16)
    model.eval()
    cached = greedy_answers(model, batch)
    assert exact_match(cached, batch).all()
    assert torch.equal(cached, greedy_answers(model, batch, use_cache=False))
    assert exact_match_accuracy(model, task, n_batches=2, batch_size=16) == 1.0
    assert not model.training  # left as it was


def test_exact_match_accuracy_repeats_and_restores_the_mode():
    torch.manual_seed(0)
    model = model_for(TASK).train()
    first = exact_match_accuracy(model, TASK, n_batches=2, batch_size=8, seed=5)
    assert model.training
    assert 0.0 <= first <= 1.0
    assert exact_match_accuracy(model, TASK, n_batches=2, batch_size=8, seed=5) == first
