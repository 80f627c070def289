"""Chapter 8: a small encoder-decoder Transformer, decoding with a KV cache.

Everything here is assembled from :class:`~course_attn.core.layers.TransformerBlock`:
an :class:`Encoder` (bidirectional self-attention over the real source tokens),
a :class:`Decoder` (causal self-attention, then cross-attention to the encoder
output) and :class:`EncoderDecoder`, which joins them. Positions count from each
row's first real token (as :func:`~course_attn.core.masks.positions_from_attention_mask`
counts them), so left-padded and right-padded batches give the same per-sequence
results, and the decoder can take one token at a time with a
:class:`~course_attn.core.kv_cache.KVCache` per layer for its self-attention and a
:class:`~course_attn.core.kv_cache.CrossKVCache` per layer for its cross-attention (the
encoder output's keys and values, projected once). Each model checks its arguments at
its door (``course_attn.models.checks``); the parts inside trust it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from .._validation import (
    check_bool,
    check_choice,
    check_head_split,
    check_left_padding,
    check_nonnegative_int,
    check_on_device,
    check_positive_int,
    check_probability,
    check_token_ids,
    check_token_mask,
    trust_children,
    trusting,
)
from ..core.kv_cache import CrossKVCache, KVCache, new_caches
from ..core.layers import PositionalEncoding, TransformerBlock, TransformerBlocks
from ..core.masks import causal_mask
from .checks import check_decoder_call, check_encoder_call, check_on_model_device
from .decoding import decode, pick_next

__all__ = ["Decoder", "Encoder", "EncoderDecoder", "EncoderDecoderConfig"]


@dataclass(frozen=True)
class EncoderDecoderConfig:
    """Sizes of an :class:`EncoderDecoder` (Chapter 8); validated on creation.

    ``context_length`` bounds the positions of either side; ``d_ff=None`` means
    ``4 * d_model``. ``norm_first=True`` is pre-norm (the stacks then end with a final
    LayerNorm, since the residual stream itself is never normalised), ``False`` post-norm.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int | None = None
    dropout: float = 0.0
    norm_first: bool = True
    activation: str = "gelu"
    context_length: int = 512

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "n_layers", "context_length"):
            check_positive_int(getattr(self, name), name)
        check_head_split(self.d_model, self.n_heads)
        if self.d_ff is not None:
            check_positive_int(self.d_ff, "d_ff")
        check_probability(self.dropout, "dropout")
        check_bool(self.norm_first, "norm_first")
        check_choice(self.activation, "activation", ("gelu", "relu"))


def _blocks(c: EncoderDecoderConfig, *, cross_attention: bool) -> TransformerBlocks:
    return TransformerBlocks(
        TransformerBlock(c.d_model, c.n_heads, d_ff=c.d_ff, dropout=c.dropout,
                         norm_first=c.norm_first, cross_attention=cross_attention,
                         activation=c.activation)
        for _ in range(c.n_layers))


def _positions(attention_mask: Tensor | None, past: int, time: int,
               device: torch.device) -> Tensor:
    """Positions of ``time`` new tokens after ``past``: ``(T,)``, or ``(B, T)`` with padding."""
    if attention_mask is None:
        return torch.arange(past, past + time, device=device)  # (T,)
    # Counted over real tokens only (positions_from_attention_mask, chapter 8).
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, T)


class Encoder(nn.Module):
    """Token embedding + sinusoidal positions, then ``n_layers`` encoder blocks (Chapter 8).

    ``forward(src (B, T_s) long, src_attention_mask (B, T_s) bool) -> memory (B, T_s, D)``.
    Self-attention is bidirectional; padded keys are masked in every layer.
    """

    check_inputs = True  # see MultiHeadAttention: a parent that checks turns it off

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = c = _check_config(config)
        self.embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.pos = PositionalEncoding(c.d_model, c.context_length, dropout=c.dropout)
        self.blocks = _blocks(c, cross_attention=False)
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        trust_children(self)

    def forward(self, src: Tensor, src_attention_mask: Tensor | None = None) -> Tensor:
        """``src (B, T_s)`` token ids -> ``memory (B, T_s, D)``."""
        if self.check_inputs:
            src_attention_mask = check_encoder_call(self, src, src_attention_mask)
        positions = _positions(src_attention_mask, 0, src.shape[1], src.device)
        mask = (None if src_attention_mask is None
                else src_attention_mask[:, None, None, :])  # (B, 1, 1, T_s): no pad key
        x = self.pos(self.embed(src), positions)  # (B, T_s, D)
        for block in self.blocks:
            x = block(x, mask=mask)  # (B, T_s, D)
        return self.norm(x)


class Decoder(nn.Module):
    """Embedding + positions, ``n_layers`` decoder blocks, final norm and LM head (Chapter 8).

    Each block runs causal self-attention over the target, cross-attention to
    ``memory`` (the encoder output) and the feed-forward network. With
    ``caches`` (one :class:`KVCache` per layer, from :meth:`new_caches`) ``tgt``
    holds only the *new* tokens, and their positions continue after the cached ones.
    With ``cross_caches`` (one :class:`CrossKVCache` per layer, from
    :meth:`new_cross_caches`) the memory's keys and values are projected at the first
    step only; without them every call projects the whole memory again in every layer.
    """

    check_inputs = True  # see MultiHeadAttention: a parent that checks turns it off
    allowed: Tensor  # (T_max, T_max) causal mask, built once

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = c = _check_config(config)
        self.embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.pos = PositionalEncoding(c.d_model, c.context_length, dropout=c.dropout)
        self.register_buffer("allowed", causal_mask(c.context_length), persistent=False)
        self.blocks = _blocks(c, cross_attention=True)
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size)
        trust_children(self)

    def new_caches(self) -> list[KVCache]:
        """One empty self-attention cache per layer (Chapter 8)."""
        return new_caches(len(self.blocks))

    def new_cross_caches(self) -> list[CrossKVCache]:
        """One empty static cross-attention cache per layer, filled by the first step (Ch. 8)."""
        return [CrossKVCache() for _ in self.blocks]

    def forward(self, tgt: Tensor, memory: Tensor, *, tgt_attention_mask: Tensor | None = None,
                memory_attention_mask: Tensor | None = None,
                caches: list[KVCache] | None = None,
                cross_caches: list[CrossKVCache] | None = None,
                need_weights: bool = False) -> Tensor:
        """Logits ``(B, T_new, N_vocab_tgt)`` for the target tokens ``tgt (B, T_new)``.

        Args:
            tgt: target token ids; without caches the whole target ``(B, T_t)``.
            memory: encoder output ``(B, T_s, D)``.
            tgt_attention_mask: ``(B, T_cache + T_new)`` bool, ``True`` on real
                target tokens, covering the cached positions too.
            memory_attention_mask: ``(B, T_s)`` bool, ``True`` on real source tokens.
            caches: one KVCache per layer; the new keys and values are appended.
            cross_caches: one CrossKVCache per layer; empty, the memory's keys and
                values are projected into them; filled, they are read instead.
            need_weights: every attention layer computes its weights, for a forward
                hook to read (``course_attn.lab.analysis.cross_attention_maps``).
        """
        if self.check_inputs:
            tgt_attention_mask, memory_attention_mask = check_decoder_call(
                self, tgt, memory, tgt_attention_mask, memory_attention_mask, caches,
                cross_caches, need_weights)
        past, time = (0 if caches is None else caches[0].length), tgt.shape[1]
        positions = _positions(tgt_attention_mask, past, time, tgt.device)
        mask = None  # plain causal self-attention: is_causal=True, no mask tensor
        if tgt_attention_mask is not None or past:
            mask = self.allowed[past:past + time, :past + time]  # (T_new, T_cache + T_new)
            if tgt_attention_mask is not None:  # no pad key
                mask = mask & tgt_attention_mask[:, None, None, :]  # (B, 1, T_new, T_k)
        x = self.pos(self.embed(tgt), positions)  # (B, T_new, D)
        for i, block in enumerate(self.blocks):
            x = block(x, mask=mask, is_causal=mask is None, memory=memory,
                      memory_attention_mask=memory_attention_mask,
                      cache=None if caches is None else caches[i],
                      cross_cache=None if cross_caches is None else cross_caches[i],
                      need_weights=need_weights)  # (B, T_new, D)
        return self.lm_head(self.norm(x))  # (B, T_new, D) -> (B, T_new, N_vocab_tgt)


class EncoderDecoder(nn.Module):
    """The 2017 Transformer layout in miniature (Chapter 8): encoder, decoder, LM head.

    ``forward(src (B, T_s), tgt (B, T_t), *, src_attention_mask, tgt_attention_mask)
    -> logits (B, T_t, N_vocab_tgt)``. The decoder's cross-attention masks exactly the
    encoder's padded positions: its mask is the source's real-token mask ``(B, T_s)``,
    broadcast over the ``T_t`` queries to ``(B, T_t, T_s)`` inside attention.
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = _check_config(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    def new_caches(self) -> list[KVCache]:
        """One empty decoder self-attention cache per layer (Chapter 8)."""
        return self.decoder.new_caches()

    def new_cross_caches(self) -> list[CrossKVCache]:
        """One empty decoder cross-attention cache per layer (Chapter 8)."""
        return self.decoder.new_cross_caches()

    def forward(self, src: Tensor, tgt: Tensor, *, src_attention_mask: Tensor | None = None,
                tgt_attention_mask: Tensor | None = None) -> Tensor:
        """``src (B, T_s)``, ``tgt (B, T_t)`` token ids -> logits ``(B, T_t, N_vocab_tgt)``."""
        memory = self.encoder(src, src_attention_mask)  # (B, T_s, D); the encoder's door
        return self.decoder(tgt, memory, tgt_attention_mask=tgt_attention_mask,
                            memory_attention_mask=src_attention_mask)  # and the decoder's

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, prompt: Tensor, max_new_tokens: int, *,
                      src_attention_mask: Tensor | None = None,
                      memory_attention_mask: Tensor | None = None,
                      prompt_attention_mask: Tensor | None = None,
                      use_cache: bool = True) -> Tensor:
        """Extend ``prompt (B, T_p)`` by ``max_new_tokens`` greedy tokens -> ``(B, T_p + n)``.

        ``prompt_attention_mask (B, T_p)`` marks real prompt tokens. It must be
        left padding (``False ... True ...`` in every row, at least one ``True``),
        as in :meth:`MiniGPT.generate <course_attn.models.gpt.MiniGPT.generate>`: the new
        tokens are appended on the right, so a right pad would sit between a
        prompt and its continuation. With ``use_cache`` each step feeds only the
        newest token and reuses the cached keys and values: the target's (a
        :class:`KVCache` per layer) and the memory's, projected at the first step (a
        :class:`CrossKVCache` per layer); without it every step recomputes the whole
        target and projects the memory again. Both give the same tokens (the loop is
        :func:`~course_attn.models.decoding.decode`, shared with ``MiniGPT.generate``).
        ``max_new_tokens=0`` returns the prompt. The arguments are checked once,
        before the loop; each step runs the decoder, which trusts its parent.

        Two source masks, ``(B, T_s)`` bool, ``True`` on real source tokens:
        ``src_attention_mask`` goes to the encoder's self-attention, and
        ``memory_attention_mask`` to every decoder layer's cross-attention over the
        encoder output. ``memory_attention_mask=None`` (the default) means
        ``src_attention_mask``, the right mask for both; a different one changes only
        what cross-attention may read, never the encoder output (chapter 8 measures the
        source article's wrong cross-attention mask this way).
        """
        n_new = check_nonnegative_int(max_new_tokens, "max_new_tokens")
        check_bool(use_cache, "use_cache")
        memory = self.encoder(src, src_attention_mask)  # (B, T_s, D); the encoder's door
        if memory_attention_mask is None:  # cross-attention reads what the encoder read
            memory_attention_mask = src_attention_mask
        else:
            memory_attention_mask = check_on_device(check_token_mask(
                memory_attention_mask, "memory_attention_mask", memory.shape[:2]),
                "memory_attention_mask", memory.device, "src")
        mask = self._check_prompt(prompt, memory, prompt_attention_mask, n_new)

        # the memory's keys and values: projected at the first step, read at every later one
        cross_caches = self.decoder.new_cross_caches() if use_cache else None

        def step(tokens: Tensor, mask: Tensor | None, caches: list[KVCache] | None) -> Tensor:
            return self.decoder(tokens, memory, tgt_attention_mask=mask,
                                memory_attention_mask=memory_attention_mask, caches=caches,
                                cross_caches=cross_caches)

        with trusting(self.decoder):
            return decode(step, prompt, mask, n_new, pick_next,
                          n_layers=len(self.decoder.blocks) if use_cache else None)

    def _check_prompt(self, prompt: object, memory: Tensor, prompt_attention_mask: object,
                      n_new: int) -> Tensor | None:
        """Check the prompt and its mask; return the mask of real tokens ``(B, T_p)`` or None."""
        prompt = check_token_ids(prompt, "prompt", self.config.tgt_vocab_size)
        check_on_model_device(self, prompt, "prompt")
        if prompt.shape[0] != memory.shape[0]:
            raise ValueError(f"prompt must have the batch size B={memory.shape[0]} of src, got "
                             f"shape {tuple(prompt.shape)}")
        if prompt.shape[1] + n_new - 1 > self.config.context_length:
            raise ValueError(f"the target would reach {prompt.shape[1] + n_new - 1} positions, "
                             f"more than context_length={self.config.context_length}")
        if prompt_attention_mask is None:
            return None
        mask = check_token_mask(prompt_attention_mask, "prompt_attention_mask", prompt.shape)
        check_on_device(mask, "prompt_attention_mask", prompt.device, "prompt")
        return check_left_padding(mask, "prompt_attention_mask")


def _check_config(config: object) -> EncoderDecoderConfig:
    if not isinstance(config, EncoderDecoderConfig):
        raise TypeError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
    return config
