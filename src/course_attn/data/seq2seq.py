"""Sequence-to-sequence tasks with exact answers, for training the encoder-decoder (chapter 8).

A task draws random token sequences of random lengths and asks for a
transformation whose right answer is known exactly: :class:`ReverseTask`
(the tokens in reverse order) or :class:`SortTask` (the tokens in ascending
order). A batch (:class:`Seq2SeqBatch`) is padded to the task's fixed widths,
with the masks the :class:`~course_attn.models.encoder_decoder.EncoderDecoder` takes.

Token ids, shared by the source and the target vocabularies
(``vocab_size = n_symbols + 3``):

* ``PAD = 0`` fills the positions after a sequence's end (right padding);
* ``BOS = 1`` starts every decoder input;
* ``EOS = 2`` ends every answer, so the model learns where to stop;
* ``3 .. n_symbols + 2`` are the symbols of the sequences.

For a source ``a_1 .. a_L`` (``min_len <= L <= max_len``) with answer
``y_1 .. y_L``, a batch row holds

* ``src``: ``a_1 .. a_L`` then ``PAD`` to width ``T_s = max_len``;
  ``src_attention_mask`` is ``True`` on the first ``L`` positions;
* ``tgt_in``: ``BOS y_1 .. y_L`` then ``PAD`` to width ``T_t = max_len + 1``;
  ``tgt_attention_mask`` is ``True`` on the first ``L + 1`` positions;
* ``tgt_out``: ``y_1 .. y_L EOS`` then ``-1`` (left out of the loss) to ``T_t``.

:func:`seq2seq_loss` is the training loss (the trainer,
:func:`~course_attn.train.train`, uses it for an ``EncoderDecoder``);
:func:`exact_match_accuracy` greedy-decodes held-out batches with the KV
cache and counts the answers that are entirely right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .._validation import (
    check_bool,
    check_cpu_generator,
    check_device,
    check_nonnegative_int,
    check_positive_int,
    check_split,
    check_token_mask,
)
from ..models.encoder_decoder import EncoderDecoder
from ..models.gpt import next_token_loss
from .text import to_device

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "ReverseTask",
    "Seq2SeqBatch",
    "Seq2SeqTask",
    "SortTask",
    "exact_match",
    "exact_match_accuracy",
    "greedy_answers",
    "seq2seq_loss",
]

#: Padding, after a sequence's last token (``src`` and ``tgt_in``).
PAD = 0
#: Beginning of sequence: the first token of every decoder input.
BOS = 1
#: End of sequence: the last token of every answer.
EOS = 2
_N_SPECIAL = 3


class Seq2SeqBatch(NamedTuple):
    """One padded batch of a :class:`Seq2SeqTask` (Chapter 8; layout in the module docstring).

    ``src (B, T_s)`` long, ``src_attention_mask (B, T_s)`` bool, ``tgt_in (B, T_t)``
    long, ``tgt_out (B, T_t)`` long with ``-1`` on padding, ``tgt_attention_mask
    (B, T_t)`` bool; ``True`` marks real tokens.
    """

    src: Tensor
    src_attention_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_attention_mask: Tensor

    def to(self, device: torch.device | str) -> Seq2SeqBatch:
        """The same batch on ``device`` (non-blocking copies from pinned memory on CUDA)."""
        device = check_device(device, "device", allow_none=False, exists=True)
        return Seq2SeqBatch(*(to_device(t, device) for t in self))


@dataclass(frozen=True)
class Seq2SeqTask:
    """Sequences of ``min_len .. max_len`` of ``n_symbols`` symbols, and answers (Chapter 8).

    A subclass says what the answer is (:meth:`answer`). Both splits are fresh
    random draws from their own generators: ``"val"`` batches are held out in
    the sense that they are other draws than the training batches (short
    sequences can repeat: there are only ``n_symbols ** min_len`` of the shortest).
    """

    n_symbols: int = 10
    min_len: int = 3
    max_len: int = 10

    def __post_init__(self) -> None:
        for name in ("n_symbols", "min_len", "max_len"):
            check_positive_int(getattr(self, name), name)
        if self.n_symbols < 2:
            raise ValueError(f"n_symbols must be at least 2, got {self.n_symbols}")
        if self.max_len < self.min_len:
            raise ValueError(f"max_len must be >= min_len={self.min_len}, got {self.max_len}")

    @property
    def vocab_size(self) -> int:
        """Source and target vocabulary: the symbols and ``PAD``, ``BOS``, ``EOS``."""
        return self.n_symbols + _N_SPECIAL

    @property
    def src_len(self) -> int:
        """``T_s``, the width of ``src``: ``max_len``."""
        return self.max_len

    @property
    def tgt_len(self) -> int:
        """``T_t``, the width of ``tgt_in`` and ``tgt_out``: ``max_len + 1`` (BOS or EOS)."""
        return self.max_len + 1

    def answer(self, src: Tensor, src_attention_mask: Tensor) -> Tensor:
        """The answers ``(B, T_s)``: row ``i``'s first ``L_i`` entries, then ``PAD``."""
        raise NotImplementedError

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None
               ) -> Seq2SeqBatch:
        """A batch of ``batch_size`` random examples on the CPU (layout in the module doc)."""
        check_positive_int(batch_size, "batch_size")
        check_cpu_generator(generator)
        lengths = torch.randint(self.min_len, self.max_len + 1, (batch_size,),
                                generator=generator)  # (B,)
        symbols = torch.randint(self.n_symbols, (batch_size, self.max_len),
                                generator=generator) + _N_SPECIAL  # (B, T_s)
        src_attention_mask = torch.arange(self.max_len) < lengths[:, None]  # (B, T_s)
        src = symbols.masked_fill(~src_attention_mask, PAD)  # (B, T_s)
        answer = self.answer(src, src_attention_mask)  # (B, T_s), PAD after L
        pad = torch.full((batch_size, 1), PAD, dtype=torch.long)
        tgt_in = torch.cat([torch.full((batch_size, 1), BOS, dtype=torch.long), answer],
                           dim=1)  # (B, T_t)
        tgt_attention_mask = torch.arange(self.tgt_len) <= lengths[:, None]  # (B, T_t)
        tgt_out = torch.cat([answer, pad], dim=1)  # (B, T_t)
        tgt_out[torch.arange(batch_size), lengths] = EOS  # right after the answer
        tgt_out = tgt_out.masked_fill(~tgt_attention_mask, -1)
        return Seq2SeqBatch(src, src_attention_mask, tgt_in, tgt_out, tgt_attention_mask)

    def get_batch(self, split: str, batch_size: int, *,
                  generator: torch.Generator | None = None,
                  device: torch.device | str | None = None) -> Seq2SeqBatch:
        """A batch of ``split`` (``"train"`` or ``"val"``, both random draws) on ``device``."""
        check_split(split)
        if device is not None:
            check_device(device, "device", exists=True)
        batch = self.sample(batch_size, generator=generator)
        return batch if device is None else batch.to(device)


def _lengths(src_attention_mask: Tensor) -> Tensor:
    """Lengths ``(B,)`` of right-padded rows."""
    return src_attention_mask.sum(dim=1)


@dataclass(frozen=True)
class ReverseTask(Seq2SeqTask):
    """Reverse the real tokens, ``a_1 .. a_L`` -> ``a_L .. a_1``; pads stay right (Chapter 8).

    Output position ``j`` copies source position ``L - 1 - j``: the learned
    cross-attention of a good model is the anti-diagonal of each row's real block.
    """

    def answer(self, src: Tensor, src_attention_mask: Tensor) -> Tensor:
        lengths = _lengths(src_attention_mask)  # (B,)
        index = (lengths[:, None] - 1 - torch.arange(src.shape[1])).clamp(min=0)  # (B, T_s)
        return src.gather(1, index).masked_fill(~src_attention_mask, PAD)


@dataclass(frozen=True)
class SortTask(Seq2SeqTask):
    """Sort the real tokens in ascending order (padding stays on the right) (Chapter 8)."""

    def answer(self, src: Tensor, src_attention_mask: Tensor) -> Tensor:
        big = src.masked_fill(~src_attention_mask, torch.iinfo(torch.long).max)
        return big.sort(dim=1).values.masked_fill(~src_attention_mask, PAD)


def _check_model(model: object) -> EncoderDecoder:
    if not isinstance(model, EncoderDecoder):
        raise TypeError(f"model must be an EncoderDecoder, got {type(model).__name__}")
    return model


def _check_batch(batch: object) -> Seq2SeqBatch:
    if not isinstance(batch, Seq2SeqBatch):
        raise TypeError(f"batch must be a Seq2SeqBatch, got {type(batch).__name__}")
    return batch


def seq2seq_loss(model: Callable[..., Tensor], batch: Seq2SeqBatch) -> Tensor:
    """Mean cross-entropy of the next target token over the real positions (Chapter 8).

    ``model`` is an :class:`EncoderDecoder` (or its ``torch.compile`` wrapper);
    it reads ``src`` and ``tgt_in`` with their masks and predicts ``tgt_out``,
    whose ``-1`` entries are left out (float32 loss, as :class:`MiniGPT`'s).
    """
    if not callable(model):
        raise TypeError(f"model must be an EncoderDecoder, got {type(model).__name__}")
    batch = _check_batch(batch)
    logits = model(batch.src, batch.tgt_in, src_attention_mask=batch.src_attention_mask,
                   tgt_attention_mask=batch.tgt_attention_mask)  # (B, T_t, N_vocab)
    return next_token_loss(logits, batch.tgt_out)


def greedy_answers(model: EncoderDecoder, batch: Seq2SeqBatch, *,
                   src_attention_mask: Tensor | None = None,
                   memory_attention_mask: Tensor | None = None,
                   use_cache: bool = True) -> Tensor:
    """Greedy-decode the answers of ``batch`` -> ``(B, T_t)``, the tokens after ``BOS``.

    The decoder starts from ``BOS`` alone and runs ``T_t`` steps (the longest
    answer and its ``EOS``). Both masks are ``(B, T_s)`` bool, of the shape of
    ``batch.src``, and replace the batch's own ``batch.src_attention_mask`` where
    given: ``src_attention_mask`` in the encoder (and in cross-attention, unless
    ``memory_attention_mask`` is given), ``memory_attention_mask`` in the decoder's
    cross-attention only. So ``memory_attention_mask=wrong`` measures what a wrong
    cross-attention mask costs while the encoder keeps the right one (the source
    article's bug, chapter 8), and ``src_attention_mask=wrong`` what it costs when the
    encoder gets it too (see :meth:`EncoderDecoder.greedy_decode`).
    """
    model = _check_model(model)
    batch = _check_batch(batch)
    check_bool(use_cache, "use_cache")
    mask = batch.src_attention_mask
    if src_attention_mask is not None:
        mask = check_token_mask(src_attention_mask, "src_attention_mask", batch.src.shape)
    bos = torch.full((batch.src.shape[0], 1), BOS, dtype=torch.long, device=batch.src.device)
    out = model.greedy_decode(batch.src, bos, batch.tgt_out.shape[1], src_attention_mask=mask,
                              memory_attention_mask=memory_attention_mask,  # its door checks it
                              use_cache=use_cache)  # (B, 1 + T_t)
    return out[:, 1:]


def exact_match(predicted: Tensor, batch: Seq2SeqBatch) -> Tensor:
    """Per example ``(B,)`` bool: all real target tokens (answer and ``EOS``) are right (Chapter 8).

    Positions where ``batch.tgt_out`` is ``-1`` (after the ``EOS``) are ignored.
    """
    batch = _check_batch(batch)
    if not isinstance(predicted, Tensor):
        raise TypeError(f"predicted must be a torch.Tensor (B, T_t), got "
                        f"{type(predicted).__name__}")
    if predicted.shape != batch.tgt_out.shape:
        raise ValueError(f"predicted must have the shape of batch.tgt_out "
                         f"{tuple(batch.tgt_out.shape)}, got {tuple(predicted.shape)}")
    real = batch.tgt_out != -1  # (B, T_t)
    return ((predicted == batch.tgt_out) | ~real).all(dim=1)


@torch.no_grad()
def exact_match_accuracy(model: EncoderDecoder, task: Seq2SeqTask, *, n_batches: int = 8,
                         batch_size: int = 128, seed: int = 0,
                         device: torch.device | str | None = None,
                         use_cache: bool = True) -> float:
    """Share of ``n_batches * batch_size`` held-out examples decoded all right (Chapter 8).

    The ``"val"`` batches come from a generator seeded with ``seed``, so every
    call with one seed scores the same examples; each is greedy-decoded
    (:func:`greedy_answers`, with the KV cache unless ``use_cache=False``) and
    counts when its answer and ``EOS`` are exactly right (:func:`exact_match`).
    The model is put in eval mode for the call and restored after.
    """
    model = _check_model(model)
    if not isinstance(task, Seq2SeqTask):
        raise TypeError(f"task must be a Seq2SeqTask, got {type(task).__name__}")
    n_batches = check_positive_int(n_batches, "n_batches")
    batch_size = check_positive_int(batch_size, "batch_size")
    seed = check_nonnegative_int(seed, "seed")
    device = (check_device(device, "device", allow_none=False, exists=True) if device is not None
              else next(model.parameters()).device)
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        hits = []
        for _ in range(n_batches):
            batch = task.get_batch("val", batch_size, generator=generator, device=device)
            hits.append(exact_match(greedy_answers(model, batch, use_cache=use_cache), batch))
        return torch.cat(hits).float().mean().item()
    finally:
        model.train(was_training)
