"""Chapter 8: a small encoder-decoder Transformer, decoding with a KV cache.

Everything here is assembled from :class:`~course_attn.layers.TransformerBlock`:
an :class:`Encoder` (bidirectional self-attention over the real source tokens),
a :class:`Decoder` (causal self-attention, then cross-attention to the encoder
output) and :class:`EncoderDecoder`, which joins them. Positions count from each
row's first real token (:func:`~course_attn.masks.positions_from_attention_mask`),
so left-padded and right-padded batches give the same per-sequence results, and
the decoder can take one token at a time with a
:class:`~course_attn.decoding.KVCache` per layer. Each public ``forward`` checks
its arguments once; the blocks inside run unchecked.
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
    check_positive_int,
    check_probability,
    check_sequence,
    check_token_ids,
    check_token_mask,
)
from ..core.layers import PositionalEncoding, TransformerBlock, TransformerBlocks
from ..core.masks import causal_mask, positions_from_attention_mask
from .decoding import KVCache, check_caches, decode, new_caches, pick_next

__all__ = ["Decoder", "Encoder", "EncoderDecoder", "EncoderDecoderConfig"]


@dataclass(frozen=True)
class EncoderDecoderConfig:
    """Sizes of an :class:`EncoderDecoder` (Chapter 8); validated on creation.

    ``max_len`` bounds the positions of either side; ``d_ff=None`` means ``4 * d_model``.
    ``norm_first=True`` is pre-norm (the stacks then end with a final LayerNorm,
    since the residual stream itself is never normalised), ``False`` post-norm.
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
    max_len: int = 512

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "n_layers", "max_len"):
            check_positive_int(getattr(self, name), name)
        check_head_split(self.d_model, self.n_heads)
        if self.d_ff is not None:
            check_positive_int(self.d_ff, "d_ff")
        check_probability(self.dropout, "dropout")
        check_bool(self.norm_first, "norm_first")
        check_choice(self.activation, "activation", ("gelu", "relu"))


def _check_config(config: object) -> EncoderDecoderConfig:
    if not isinstance(config, EncoderDecoderConfig):
        raise TypeError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
    return config


def _key_mask(attention_mask: Tensor | None, device: torch.device) -> Tensor | None:
    """``(B, T_k)`` real-token mask -> ``(B, 1, 1, T_k)``, the same for every head and query."""
    return None if attention_mask is None else attention_mask[:, None, None, :].to(device)


class Encoder(nn.Module):
    """Token embedding + sinusoidal positions, then ``n_layers`` encoder blocks (Chapter 8).

    ``forward(src (B, T_s) long, src_attention_mask (B, T_s) bool) -> memory (B, T_s, D)``.
    Self-attention is bidirectional; padded keys are masked in every layer.
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = c = _check_config(config)
        self.embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.pos = PositionalEncoding(c.d_model, c.max_len, dropout=c.dropout)
        self.blocks = TransformerBlocks(
            TransformerBlock(c.d_model, c.n_heads, d_ff=c.d_ff, dropout=c.dropout,
                             norm_first=c.norm_first, activation=c.activation)
            for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()

    def forward(self, src: Tensor, src_attention_mask: Tensor | None = None) -> Tensor:
        """``src (B, T_s)`` token ids -> ``memory (B, T_s, D)``."""
        self._check_call(src, src_attention_mask)
        return self._forward(src, src_attention_mask)

    def _check_call(self, src: object, src_attention_mask: object) -> None:
        src = check_token_ids(src, "src", self.config.src_vocab_size)
        if src.shape[1] > self.config.max_len:
            raise ValueError(f"src has {src.shape[1]} positions, more than "
                             f"max_len={self.config.max_len}")
        if src_attention_mask is not None:
            check_token_mask(src_attention_mask, "src_attention_mask", src.shape)

    def _forward(self, src: Tensor, src_attention_mask: Tensor | None) -> Tensor:
        if src_attention_mask is None:
            positions = torch.arange(src.shape[1], device=src.device)  # (T_s,)
        else:
            positions = positions_from_attention_mask(src_attention_mask.to(src.device))
        mask = _key_mask(src_attention_mask, src.device)  # (B, 1, 1, T_s) or None
        x = self.pos._forward(self.embed(src), positions)  # (B, T_s, D)
        for block in self.blocks:
            x, _ = block._forward(x, mask)  # (B, T_s, D)
        return self.norm(x)


class Decoder(nn.Module):
    """Embedding + positions, ``n_layers`` decoder blocks, final norm and LM head (Chapter 8).

    Each block runs causal self-attention over the target, cross-attention to
    ``memory`` (the encoder output) and the feed-forward network. With
    ``caches`` (one :class:`KVCache` per layer, from :meth:`new_caches`) ``tgt``
    holds only the *new* tokens, and their positions continue after the cached ones.
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = c = _check_config(config)
        self.embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.pos = PositionalEncoding(c.d_model, c.max_len, dropout=c.dropout)
        self.blocks = TransformerBlocks(
            TransformerBlock(c.d_model, c.n_heads, d_ff=c.d_ff, dropout=c.dropout,
                             norm_first=c.norm_first, cross_attention=True,
                             activation=c.activation)
            for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size)

    def new_caches(self) -> list[KVCache]:
        """One empty self-attention cache per layer."""
        return new_caches(len(self.blocks))

    def forward(self, tgt: Tensor, memory: Tensor, *, tgt_attention_mask: Tensor | None = None,
                memory_attention_mask: Tensor | None = None,
                caches: list[KVCache] | None = None) -> Tensor:
        """Logits ``(B, T_new, V_tgt)`` for the target tokens ``tgt (B, T_new)``.

        Args:
            tgt: target token ids; without caches the whole target ``(B, T_t)``.
            memory: encoder output ``(B, T_s, D)``.
            tgt_attention_mask: ``(B, T_cache + T_new)`` bool, ``True`` on real
                target tokens, covering the cached positions too.
            memory_attention_mask: ``(B, T_s)`` bool, ``True`` on real source tokens.
            caches: one KVCache per layer; the new keys and values are appended.
        """
        self._check_call(tgt, memory, tgt_attention_mask, memory_attention_mask, caches)
        return self._forward(tgt, memory, tgt_attention_mask, memory_attention_mask, caches)

    def _forward(self, tgt: Tensor, memory: Tensor, tgt_attention_mask: Tensor | None,
                 memory_attention_mask: Tensor | None,
                 caches: list[KVCache] | None) -> Tensor:
        past, time = (0 if caches is None else caches[0].length), tgt.shape[1]
        positions = torch.arange(past, past + time, device=tgt.device)  # (T_new,)
        mask: Tensor | None = None  # plain causal self-attention: is_causal=True, no mask
        if tgt_attention_mask is not None:
            tgt_attention_mask = tgt_attention_mask.to(tgt.device)
            positions = positions_from_attention_mask(tgt_attention_mask)[:, past:]  # (B, T_new)
            causal = causal_mask(time, past + time, device=tgt.device)  # (T_new, past+T_new)
            mask = causal & tgt_attention_mask[:, None, None, :]  # (B, 1, T_new, past+T_new)
        elif past:
            mask = causal_mask(time, past + time, device=tgt.device)  # (T_new, past+T_new)
        memory_mask = _key_mask(memory_attention_mask, tgt.device)  # (B, 1, 1, T_s) or None
        x = self.pos._forward(self.embed(tgt), positions)  # (B, T_new, D)
        for i, block in enumerate(self.blocks):
            x, _ = block._forward(x, mask, is_causal=mask is None, memory=memory,
                                  memory_mask=memory_mask,
                                  cache=None if caches is None else caches[i])  # (B, T_new, D)
        return self.lm_head(self.norm(x))  # (B, T_new, D) -> (B, T_new, V_tgt)

    def _check_call(self, tgt: object, memory: object, tgt_attention_mask: object,
                    memory_attention_mask: object, caches: object) -> None:
        c = self.config
        tgt = check_token_ids(tgt, "tgt", c.tgt_vocab_size)
        memory = check_sequence(memory, "memory", width=c.d_model, batch=tgt.shape[0],
                                dtype=self.lm_head.weight.dtype)
        if memory_attention_mask is not None:
            check_token_mask(memory_attention_mask, "memory_attention_mask", memory.shape[:2])
        past = 0 if caches is None else check_caches(caches, len(self.blocks))
        if tgt_attention_mask is not None:
            check_token_mask(tgt_attention_mask, "tgt_attention_mask",
                             (tgt.shape[0], past + tgt.shape[1]))
        if past + tgt.shape[1] > c.max_len:
            raise ValueError(f"the target would reach {past + tgt.shape[1]} positions, more "
                             f"than max_len={c.max_len}")


class EncoderDecoder(nn.Module):
    """The 2017 Transformer layout in miniature (Chapter 8): encoder, decoder, LM head.

    ``forward(src (B, T_s), tgt (B, T_t), *, src_attention_mask, tgt_attention_mask)
    -> logits (B, T_t, V_tgt)``. The decoder's cross-attention masks exactly the
    encoder's padded positions: its mask is the source's real-token mask ``(B, T_s)``,
    broadcast over the ``T_t`` queries to ``(B, T_t, T_s)`` inside attention.
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = _check_config(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    def new_caches(self) -> list[KVCache]:
        """One empty decoder self-attention cache per layer."""
        return self.decoder.new_caches()

    def forward(self, src: Tensor, tgt: Tensor, *, src_attention_mask: Tensor | None = None,
                tgt_attention_mask: Tensor | None = None) -> Tensor:
        """``src (B, T_s)``, ``tgt (B, T_t)`` token ids -> logits ``(B, T_t, V_tgt)``."""
        self.encoder._check_call(src, src_attention_mask)
        memory = self.encoder._forward(src, src_attention_mask)  # (B, T_s, D)
        self.decoder._check_call(tgt, memory, tgt_attention_mask, src_attention_mask, None)
        return self.decoder._forward(tgt, memory, tgt_attention_mask, src_attention_mask, None)

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, prompt: Tensor, max_new_tokens: int, *,
                      src_attention_mask: Tensor | None = None,
                      prompt_attention_mask: Tensor | None = None,
                      use_cache: bool = True) -> Tensor:
        """Extend ``prompt (B, T_p)`` by ``max_new_tokens`` greedy tokens -> ``(B, T_p + n)``.

        ``prompt_attention_mask (B, T_p)`` marks real prompt tokens. It must be
        left padding (``False ... True ...`` in every row, at least one ``True``),
        as in :meth:`MiniGPT.generate <course_attn.model.MiniGPT.generate>`: the new
        tokens are appended on the right, so a right pad would sit between a
        prompt and its continuation. With ``use_cache`` each step feeds only the
        newest token and reuses the cached keys and values; without it every step
        recomputes the whole target. Both give the same tokens (the loop is
        :func:`~course_attn.decoding.decode`, shared with ``MiniGPT.generate``).
        ``max_new_tokens=0`` returns the prompt.
        """
        n_new = check_nonnegative_int(max_new_tokens, "max_new_tokens")
        check_bool(use_cache, "use_cache")
        self.encoder._check_call(src, src_attention_mask)
        memory = self.encoder._forward(src, src_attention_mask)  # (B, T_s, D)
        mask = self._check_prompt(prompt, memory, prompt_attention_mask, src_attention_mask,
                                  n_new)

        def step(tokens: Tensor, mask: Tensor, caches: list[KVCache] | None) -> Tensor:
            return self.decoder._forward(tokens, memory, mask, src_attention_mask, caches)

        return decode(step, prompt, mask, n_new, pick_next,
                      n_layers=len(self.decoder.blocks) if use_cache else None)

    def _check_prompt(self, prompt: object, memory: Tensor, prompt_attention_mask: object,
                      src_attention_mask: Tensor | None, n_new: int) -> Tensor:
        """Check the prompt and its mask; return the mask of real tokens ``(B, T_p)``."""
        prompt = check_token_ids(prompt, "prompt", self.config.tgt_vocab_size)
        if prompt_attention_mask is not None:
            check_token_mask(prompt_attention_mask, "prompt_attention_mask", prompt.shape)
        self.decoder._check_call(prompt, memory, None, src_attention_mask, None)
        if prompt.shape[1] + n_new - 1 > self.config.max_len:
            raise ValueError(f"the target would reach {prompt.shape[1] + n_new - 1} positions, "
                             f"more than max_len={self.config.max_len}")
        if prompt_attention_mask is None:
            return torch.ones(prompt.shape, dtype=torch.bool, device=prompt.device)
        assert isinstance(prompt_attention_mask, Tensor)
        return check_left_padding(prompt_attention_mask.to(prompt.device),
                                  "prompt_attention_mask")
