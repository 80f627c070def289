"""Chapter 7: a small encoder-decoder Transformer, decoding with a KV cache, and two measurements.

Everything here is assembled from :class:`~course_attn.layers.TransformerBlock`:
an :class:`Encoder` (bidirectional self-attention with a key padding mask), a
:class:`Decoder` (causal self-attention, then cross-attention to the encoder
output) and :class:`EncoderDecoder`, which joins them. Positions count from each
row's first real token (:func:`positions_from_attention_mask`), so left-padded and
right-padded batches give the same per-sequence results, and the decoder can
take one token at a time with a :class:`~course_attn.layers.KVCache` per layer.

:func:`block_gradient_norms` and :func:`decode_step_seconds` are the two
measurements of the chapter (pre-norm vs post-norm gradients; cost per
generated token with and without the cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from ._validation import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_left_padding,
    check_nonnegative_int,
    check_positive_int,
    check_probability,
    check_tensor,
    values_checkable,
)
from .layers import KVCache, PositionalEncoding, TransformerBlock, check_caches

__all__ = [
    "Decoder",
    "Encoder",
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "block_gradient_norms",
    "decode_step_seconds",
    "positions_from_attention_mask",
]


@dataclass(frozen=True)
class EncoderDecoderConfig:
    """Sizes of an :class:`EncoderDecoder` (Chapter 7); validated on creation.

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
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_layers",
                     "max_len"):
            check_positive_int(getattr(self, name), name)
        if self.d_ff is not None:
            check_positive_int(self.d_ff, "d_ff")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by "
                             f"n_heads={self.n_heads}")
        check_probability(self.dropout, "dropout")
        check_bool(self.norm_first, "norm_first")
        check_choice(self.activation, "activation", ("gelu", "relu"))


def positions_from_attention_mask(attention_mask: Tensor) -> Tensor:
    """Position of every token counted over the real tokens of its row (Chapter 7).

    ``attention_mask (B, T)`` bool, ``True`` on real tokens -> ``(B, T)`` long:
    the first real token of each row is at position 0, the next real one at 1,
    and so on, wherever the padding sits. Padding slots get the position of the
    last real token before them (0 before the first one); they are masked anyway.
    With left padding this is what makes a padded row see the same positional
    encodings as the unpadded sequence would.
    """
    check_bool_mask(attention_mask, "attention_mask",
                    attention_mask.shape if isinstance(attention_mask, Tensor) else ())
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (B, T), got "
                         f"{tuple(attention_mask.shape)}")
    positions = attention_mask.long().cumsum(dim=-1) - 1  # (B, T): index among real tokens
    return positions.clamp(min=0)  # (B, T)


def _check_tokens(tokens: object, name: str, vocab_size: int) -> Tensor:
    """Token ids ``(B, T)`` of an integer dtype, each in ``[0, vocab_size)``."""
    check_tensor(tokens, name, ndim=2, floating=False)
    if tokens.dtype != torch.long:
        raise TypeError(f"{name} must hold token ids as torch.long, got dtype {tokens.dtype}")
    if tokens.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one token, got shape {tuple(tokens.shape)}")
    if values_checkable(tokens) and tokens.numel() and (
            int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"{name} must hold ids in [0, {vocab_size}), got values in "
                         f"[{int(tokens.min())}, {int(tokens.max())}]")
    return tokens


def _check_padding(mask: object, name: str, shape: tuple[int, int]) -> Tensor | None:
    """A ``(B, T)`` boolean padding mask of exactly ``shape`` (or None)."""
    if mask is None:
        return None
    check_bool_mask(mask, name, mask.shape if isinstance(mask, Tensor) else ())  # type, dtype
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape (B, T)={tuple(shape)}, got {tuple(mask.shape)}")
    return mask


class Encoder(nn.Module):
    """Token embedding + sinusoidal positions, then ``n_layers`` encoder blocks (Chapter 7).

    ``forward(src (B, T_s) long, src_attention_mask (B, T_s) bool) -> memory (B, T_s, D)``.
    Self-attention is bidirectional; padded keys are masked in every layer.
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderDecoderConfig):
            raise TypeError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
        self.config = c = config
        self.embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.pos = PositionalEncoding(c.d_model, c.max_len, dropout=c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, d_ff=c.d_ff, dropout=c.dropout,
                             norm_first=c.norm_first, activation=c.activation)
            for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()

    def forward(self, src: Tensor, src_attention_mask: Tensor | None = None) -> Tensor:
        """``src (B, T_s)`` token ids -> ``memory (B, T_s, D)``."""
        _check_tokens(src, "src", self.config.src_vocab_size)
        mask = _check_padding(src_attention_mask, "src_attention_mask", tuple(src.shape))
        positions = None if mask is None else positions_from_attention_mask(mask)  # (B, T_s)
        x = self.pos(self.embed(src), positions)  # (B, T_s, D)
        for block in self.blocks:
            x = block(x, attention_mask=mask)  # (B, T_s, D)
        return self.norm(x)


class Decoder(nn.Module):
    """Embedding + positions, ``n_layers`` decoder blocks, final norm and LM head (Chapter 7).

    Each block runs causal self-attention over the target, cross-attention to
    ``memory`` (the encoder output) and the feed-forward network. With
    ``caches`` (one :class:`KVCache` per layer, from :meth:`new_caches`) ``tgt``
    holds only the *new* tokens, and their positions continue after the cached ones.
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderDecoderConfig):
            raise TypeError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
        self.config = c = config
        self.embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.pos = PositionalEncoding(c.d_model, c.max_len, dropout=c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, d_ff=c.d_ff, dropout=c.dropout,
                             norm_first=c.norm_first, cross_attention=True,
                             activation=c.activation)
            for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size)

    def new_caches(self) -> list[KVCache]:
        """One empty self-attention cache per layer."""
        return [KVCache() for _ in self.blocks]

    def _check_caches(self, caches: object) -> int:
        """Validate ``caches``; return the number of cached positions ``T_cache``."""
        return check_caches(caches, len(self.blocks))

    def forward(self, tgt: Tensor, memory: Tensor, *, tgt_attention_mask: Tensor | None = None,
                memory_attention_mask: Tensor | None = None,
                caches: list[KVCache] | None = None) -> Tensor:
        """Logits ``(B, T_new, V_tgt)`` for the target tokens ``tgt (B, T_new)``.

        Args:
            tgt: target token ids; without caches the whole target ``(B, T_t)``.
            memory: encoder output ``(B, T_s, D)``.
            tgt_attention_mask: ``(B, T_cache + T_new)`` bool, ``True`` on real
                target tokens, covering the cached positions too.
            memory_attention_mask: ``(B, T_s)`` bool, the encoder's padding mask.
            caches: one KVCache per layer; the new keys and values are appended.
        """
        _check_tokens(tgt, "tgt", self.config.tgt_vocab_size)
        check_tensor(memory, "memory", ndim=3)
        if memory.shape[0] != tgt.shape[0] or memory.shape[2] != self.config.d_model:
            raise ValueError(f"memory must have shape (B, T_s, D) with B={tgt.shape[0]} and "
                             f"D={self.config.d_model}, got {tuple(memory.shape)}")
        _check_padding(memory_attention_mask, "memory_attention_mask", tuple(memory.shape[:2]))
        t_cache = 0 if caches is None else self._check_caches(caches)
        batch, t_new = tgt.shape
        mask = _check_padding(tgt_attention_mask, "tgt_attention_mask",
                              (batch, t_cache + t_new))
        if t_cache + t_new > self.config.max_len:
            raise ValueError(f"the target would reach {t_cache + t_new} positions, more than "
                             f"max_len={self.config.max_len}")
        if mask is None:
            positions = torch.arange(t_cache, t_cache + t_new, device=tgt.device)  # (T_new,)
        else:
            positions = positions_from_attention_mask(mask)[:, t_cache:]  # (B, T_new)
        x = self.pos(self.embed(tgt), positions)  # (B, T_new, D)
        for i, block in enumerate(self.blocks):
            x = block(x, attention_mask=mask, is_causal=True, memory=memory,
                      memory_attention_mask=memory_attention_mask,
                      cache=None if caches is None else caches[i])  # (B, T_new, D)
        return self.lm_head(self.norm(x))  # (B, T_new, D) -> (B, T_new, V_tgt)


class EncoderDecoder(nn.Module):
    """The 2017 Transformer layout in miniature (Chapter 7): encoder, decoder, LM head.

    ``forward(src (B, T_s), tgt (B, T_t), *, src_attention_mask, tgt_attention_mask)
    -> logits (B, T_t, V_tgt)``. The decoder's cross-attention masks exactly the
    encoder's padded positions: its mask is the source padding mask ``(B, T_s)``,
    broadcast over the ``T_t`` queries to ``(B, T_t, T_s)`` inside attention.
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderDecoderConfig):
            raise TypeError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    def new_caches(self) -> list[KVCache]:
        """One empty decoder self-attention cache per layer."""
        return self.decoder.new_caches()

    def forward(self, src: Tensor, tgt: Tensor, *, src_attention_mask: Tensor | None = None,
                tgt_attention_mask: Tensor | None = None) -> Tensor:
        """``src (B, T_s)``, ``tgt (B, T_t)`` token ids -> logits ``(B, T_t, V_tgt)``."""
        memory = self.encoder(src, src_attention_mask)  # (B, T_s, D)
        return self.decoder(tgt, memory, tgt_attention_mask=tgt_attention_mask,
                            memory_attention_mask=src_attention_mask)

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
        recomputes the whole target. Both give the same tokens.
        ``max_new_tokens=0`` returns the prompt.
        """
        n_new = check_nonnegative_int(max_new_tokens, "max_new_tokens")
        check_bool(use_cache, "use_cache")
        _check_tokens(prompt, "prompt", self.config.tgt_vocab_size)
        mask = _check_padding(prompt_attention_mask, "prompt_attention_mask",
                              tuple(prompt.shape))
        if mask is not None:
            check_left_padding(mask, "prompt_attention_mask")
        if mask is None:
            mask = torch.ones(prompt.shape, dtype=torch.bool, device=prompt.device)
        memory = self.encoder(src, src_attention_mask)  # (B, T_s, D)
        caches = self.new_caches() if use_cache else None
        tokens, step_input = prompt, prompt  # (B, T_p)
        for _ in range(n_new):
            logits = self.decoder(step_input, memory, tgt_attention_mask=mask,
                                  memory_attention_mask=src_attention_mask,
                                  caches=caches)  # (B, T_in, V_tgt)
            next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + 1)
            mask = torch.cat([mask, torch.ones_like(next_token, dtype=torch.bool)], dim=1)
            step_input = next_token if use_cache else tokens
        return tokens


def block_gradient_norms(n_layers: int, *, norm_first: bool, d_model: int = 64, n_heads: int = 4,
                         batch_size: int = 8, seq_len: int = 16, seed: int = 0) -> Tensor:
    """Gradient norm of each block's weights in a fresh stack, at initialisation (Chapter 7).

    Builds ``n_layers`` encoder :class:`TransformerBlock` s (PyTorch's default
    initialisation; a final LayerNorm after a pre-norm stack), feeds random
    inputs ``(batch_size, seq_len, d_model)``, takes the mean squared error to a
    random target, back-propagates once and returns ``(n_layers,)``: the L2 norm of
    the gradients of block ``l``'s attention and feed-forward parameters (block 0
    is the one next to the input). LayerNorm gains and biases are left out: in a
    post-norm stack the last block's norm is the output norm, whose gradient
    comes straight from the loss and would make that one block look special.
    The same ``seed`` gives the same weights and data for both norm placements.
    """
    n_layers = check_positive_int(n_layers, "n_layers")
    check_bool(norm_first, "norm_first")
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("batch_size", batch_size),
                        ("seq_len", seq_len)):
        check_positive_int(value, name)
    check_nonnegative_int(seed, "seed", upper=2**64 - 1)
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # do not disturb the caller's global RNG
        torch.manual_seed(seed)
        blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, norm_first=norm_first)
                               for _ in range(n_layers))
    final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
    x = torch.randn(batch_size, seq_len, d_model, generator=generator)  # (B, T, D)
    target = torch.randn(batch_size, seq_len, d_model, generator=generator)  # (B, T, D)
    for block in blocks:
        x = block(x)  # (B, T, D)
    loss = (final_norm(x) - target).pow(2).mean()
    loss.backward()
    norms = [torch.sqrt(sum(p.grad.pow(2).sum() for name, p in block.named_parameters()
                            if not name.startswith("norm")))
             for block in blocks]
    return torch.stack(norms).detach()  # (n_layers,)


def decode_step_seconds(model: EncoderDecoder, prefix_len: int, *, use_cache: bool,
                        batch_size: int = 1, src_len: int = 16, repeats: int = 5,
                        seed: int = 0) -> float:
    """Wall-clock seconds to get the next token's logits after ``prefix_len`` tokens.

    With ``use_cache`` the prefix is run once (not timed) to fill the caches,
    and each timed step feeds one token ``(B, 1)`` against ``prefix_len`` cached
    keys. Without it each timed step re-runs the decoder on all
    ``prefix_len + 1`` tokens, which is what decoding costs without a cache.
    The encoder output is computed once, outside the timing, in both cases.
    Returns the fastest of ``repeats`` timed runs (after one warm-up run): the
    minimum is the run least disturbed by other work on the machine.
    """
    if not isinstance(model, EncoderDecoder):
        raise TypeError(f"model must be an EncoderDecoder, got {type(model).__name__}")
    prefix_len = check_positive_int(prefix_len, "prefix_len")
    check_bool(use_cache, "use_cache")
    for name, value in (("batch_size", batch_size), ("src_len", src_len), ("repeats", repeats)):
        check_positive_int(value, name)
    check_nonnegative_int(seed, "seed", upper=2**64 - 1)
    c = model.config
    if prefix_len + 1 > c.max_len or src_len > c.max_len:
        raise ValueError(f"prefix_len + 1={prefix_len + 1} and src_len={src_len} must not "
                         f"exceed max_len={c.max_len}")
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(c.src_vocab_size, (batch_size, src_len), generator=g).to(device)
    tgt = torch.randint(c.tgt_vocab_size, (batch_size, prefix_len + 1), generator=g).to(device)
    timings = []
    with torch.no_grad():
        memory = model.encoder(src)  # (B, T_s, D)
        if use_cache:
            filled = model.new_caches()
            model.decoder(tgt[:, :-1], memory, caches=filled)  # fill: (B, prefix_len)
        for _ in range(repeats + 1):  # the first run warms up and is dropped
            if use_cache:
                caches = []
                for full in filled:  # a fresh view per step: update() never edits in place
                    cache = KVCache()
                    cache.k, cache.v = full.k, full.v
                    caches.append(cache)
                _sync(device)
                start = time.perf_counter()
                model.decoder(tgt[:, -1:], memory, caches=caches)  # (B, 1, V_tgt)
            else:
                _sync(device)
                start = time.perf_counter()
                model.decoder(tgt, memory)[:, -1]  # (B, V_tgt)
            _sync(device)
            timings.append(time.perf_counter() - start)
    return min(timings[1:])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
