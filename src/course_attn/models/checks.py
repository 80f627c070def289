"""The doors of the models (Chapters 8 and 11): their arguments, checked once per call.

``MiniGPT.forward``, ``MiniGPT.generate`` and the forwards of ``Encoder``,
``Decoder`` and ``EncoderDecoder`` call these first; the blocks inside then run
unchecked. Each door returns the real-token masks it checked, which must be on the device of
the token ids (as the caches must), so that the model body never moves or re-checks them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._validation import (
    check_bool,
    check_doc_ids,
    check_left_padding,
    check_nonnegative_int,
    check_nonnegative_real,
    check_positive_int,
    check_positive_real,
    check_sequence,
    check_token_id_tensor,
    check_token_ids,
    check_token_mask,
)
from ..core.checks import check_caches, check_cross_caches, check_on_device

__all__ = [
    "check_decoder_call",
    "check_encoder_call",
    "check_generate_call",
    "check_gpt_call",
    "check_on_model_device",
    "check_packed_call",
    "embed_token_ids",
]


def check_on_model_device(model: nn.Module, ids: Tensor, name: str) -> None:
    """Token ids must be where the model's weights are (an embedding would fail inside)."""
    check_on_device(ids, name, next(model.parameters()).device, "the model")


def _key_dtype(model: nn.Module, device: torch.device) -> torch.dtype:
    """The dtype of the keys the model's layers make: autocast's, else the weights'."""
    if device.type in ("cpu", "cuda", "mps", "xpu") and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


def _check_mask(mask: object, name: str, shape: tuple[int, ...], ids: Tensor, ids_name: str, *,
                rows_nonempty: bool = False) -> Tensor | None:
    """A real-token mask of ``shape``, on the device of the token ids ``ids``."""
    if mask is None:
        return None
    checked = check_token_mask(mask, name, shape, rows_nonempty=rows_nonempty)
    return check_on_device(checked, name, ids.device, ids_name)


def check_gpt_call(model: Any, idx: object, targets: object, attention_mask: object,
                   caches: object, need_weights: object) -> tuple[Tensor | None, bool]:
    """Check ``MiniGPT.forward``'s arguments; return ``attention_mask`` on ``idx``'s device,
    and whether the loss may read its own value and checks the targets' range itself (a
    training call with neither a cache nor padding: ``MiniGPT`` passes it to
    ``next_token_loss(may_read=...)``, which reads only where ``values_checkable``)."""
    c = model.config
    idx = check_token_id_tensor(idx, "idx")  # its range: embed_token_ids, by the lookup
    # the token table's device, not next(model.parameters()): no generator walked per call
    check_on_device(idx, "idx", model.embed.weight.device, "the model")
    check_bool(need_weights, "need_weights")
    (batch, time), past = idx.shape, 0
    if caches is not None:
        past = check_caches(caches, len(model.blocks), batch=batch,
                            heads=c.n_kv_heads or c.n_heads, head_dim=c.d_model // c.n_heads,
                            dtype=_key_dtype(model, idx.device), device=idx.device)
    if past + time > c.context_length:
        raise ValueError(f"the sequence has {past + time} tokens (T={time}"
                         + (f" after {past} cached" if past else "")
                         + f"), more than context_length={c.context_length}")
    may_read = False
    if targets is not None:
        if caches is None and attention_mask is None:  # the loss checks their range
            targets = check_token_id_tensor(targets, "targets", shape=idx.shape)
            may_read = True  # where values are checkable (the loss asks)
        else:  # a cache grows, or padding hides targets, before the loss: check them here
            targets = check_token_ids(targets, "targets", c.vocab_size, shape=idx.shape,
                                      ignore_index=-1)
        if targets.device != idx.device:
            raise ValueError(f"targets are on {targets.device} but idx is on {idx.device}")
    mask = _check_mask(attention_mask, "attention_mask", (batch, past + time), idx, "idx",
                       rows_nonempty=True)
    return mask, may_read


def embed_token_ids(embed: nn.Embedding, idx: Tensor) -> Tensor:
    """``embed(idx) (B, T, D)``, the lookup doing the door's range check of ``idx``.

    On the CPU the lookup checks every id anyway and raises ``IndexError`` for one outside
    the table; that becomes the door's ``ValueError``, which names the range and the values.
    So a call reads no value of ``idx`` (a reduction and two reads in every training step,
    issue 42). On a GPU nothing changes: the door never read values there
    (``values_checkable``), and a bad id fails inside the lookup.
    """
    try:
        return embed(idx)  # (B, T, D)
    except IndexError as error:
        lookup = error
    check_token_ids(idx, "idx", embed.num_embeddings)  # the door's ValueError, not chained
    raise lookup


def check_packed_call(idx: Tensor, doc_ids: object, attention_mask: Tensor | None,
                      caches: object) -> Tensor:
    """Check ``MiniGPT.forward``'s ``doc_ids`` (packed documents, Chapter 11), after
    :func:`check_gpt_call` checked ``idx``: one id per token, on ``idx``'s device, never
    decreasing along a row; not with padding or a cache (a packed row has neither)."""
    doc_ids = check_doc_ids(doc_ids)
    if doc_ids.shape != idx.shape:
        raise ValueError(f"doc_ids must have the shape of idx {tuple(idx.shape)} (one document "
                         f"id per token), got {tuple(doc_ids.shape)}")
    if doc_ids.device != idx.device:
        raise ValueError(f"doc_ids are on {doc_ids.device} but idx is on {idx.device}")
    for name, value in (("attention_mask", attention_mask), ("caches", caches)):
        if value is not None:
            raise ValueError(f"doc_ids (packed documents) cannot be combined with {name}: a "
                             f"packed row has no padding and is not decoded token by token")
    return doc_ids


def check_generate_call(model: Any, idx: object, max_new_tokens: object, temperature: object,
                        top_k: object, top_p: object, use_cache: object,
                        attention_mask: object, generator: object) -> Tensor | None:
    """Check ``MiniGPT.generate``'s arguments once; return the left-padding mask (or ``None``)."""
    vocab_size = model.config.vocab_size
    idx = check_token_ids(idx, "idx", vocab_size)
    check_on_model_device(model, idx, "idx")
    check_nonnegative_int(max_new_tokens, "max_new_tokens")
    check_nonnegative_real(temperature, "temperature")
    if top_k is not None and check_positive_int(top_k, "top_k") > vocab_size:
        raise ValueError(f"top_k must be at most vocab_size={vocab_size}, got {top_k}")
    if top_p is not None and not 0.0 < check_positive_real(top_p, "top_p") <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    check_bool(use_cache, "use_cache")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator is not None:
        _check_generator_device(generator, idx)
    mask = _check_mask(attention_mask, "attention_mask", tuple(idx.shape), idx, "idx",
                       rows_nonempty=True)
    return None if mask is None else check_left_padding(mask, "attention_mask")


def _check_generator_device(generator: torch.Generator, idx: Tensor) -> None:
    """Sampling draws on the generator's device (the CPU, or the model's), never on ``meta``,
    which has no random numbers: torch would fail with "META device type not an accelerator"
    or "Cannot copy out of meta tensor"."""
    where = generator.device
    if where.type == "meta" or idx.device.type == "meta" or where not in (
            idx.device, torch.device("cpu")):
        fix = ("pass generator=None (meta has no random numbers)" if idx.device.type == "meta"
               else f"pass a torch.Generator(device={str(idx.device)!r}) or one on the CPU")
        raise ValueError(f"generator is on {where} but idx is on {idx.device}; {fix}")


def check_encoder_call(encoder: Any, src: object, src_attention_mask: object) -> Tensor | None:
    """Check ``Encoder.forward``'s arguments; return the source mask on ``src``'s device."""
    c = encoder.config
    src = check_token_ids(src, "src", c.src_vocab_size)
    check_on_model_device(encoder, src, "src")
    if src.shape[1] > c.context_length:
        raise ValueError(f"src has {src.shape[1]} positions, more than "
                         f"context_length={c.context_length}")
    return _check_mask(src_attention_mask, "src_attention_mask", tuple(src.shape), src, "src")


def check_decoder_call(decoder: Any, tgt: object, memory: object, tgt_attention_mask: object,
                       memory_attention_mask: object, caches: object, cross_caches: object,
                       need_weights: object) -> tuple[Tensor | None, Tensor | None]:
    """Check ``Decoder.forward``'s arguments; return both masks on ``tgt``'s device."""
    c = decoder.config
    tgt = check_token_ids(tgt, "tgt", c.tgt_vocab_size)
    check_on_model_device(decoder, tgt, "tgt")
    memory = check_sequence(memory, "memory", width=c.d_model, batch=tgt.shape[0],
                            dtype=decoder.lm_head.weight.dtype)
    check_on_device(memory, "memory", tgt.device, "tgt")
    memory_mask = _check_mask(memory_attention_mask, "memory_attention_mask",
                              tuple(memory.shape[:2]), tgt, "tgt")
    check_bool(need_weights, "need_weights")
    past = 0
    fits = {"batch": tgt.shape[0], "heads": c.n_heads, "head_dim": c.d_model // c.n_heads,
            "dtype": _key_dtype(decoder, tgt.device), "device": tgt.device}
    if caches is not None:
        past = check_caches(caches, len(decoder.blocks), **fits)
    if cross_caches is not None:
        check_cross_caches(cross_caches, len(decoder.blocks), memory_length=memory.shape[1],
                           **fits)
    if past + tgt.shape[1] > c.context_length:
        raise ValueError(f"the target would reach {past + tgt.shape[1]} positions, more than "
                         f"context_length={c.context_length}")
    tgt_mask = _check_mask(tgt_attention_mask, "tgt_attention_mask",
                           (tgt.shape[0], past + tgt.shape[1]), tgt, "tgt")
    return tgt_mask, memory_mask
