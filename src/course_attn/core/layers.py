"""Chapters 6 and 7: multi-head attention and the Transformer block.

Read top to bottom: head split/merge, multi-head attention (self or cross),
the feed-forward network, positional encodings, and the block that assembles
them (pre-norm or post-norm, encoder or decoder). The KV cache lives in
:mod:`course_attn.decoding`.

Every layer checks its arguments once, in ``forward``, and then calls its
unchecked ``_forward``. Layers built from other layers call the inner ones'
``_forward``: a model's inputs are checked at its own boundary, not again in
every layer of every step.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn as nn
from torch import Tensor

from .._validation import (
    check_bool,
    check_choice,
    check_head_split,
    check_positive_int,
    check_positive_real,
    check_probability,
    check_sequence,
    check_tensor,
    check_token_mask,
    values_checkable,
)
from ..models.decoding import KVCache, check_caches
from ..modern.gqa import _repeat_kv, check_kv_heads
from ..modern.rope import _rotate
from .attention import ATTENTION_IMPLS, _attention
from .masks import combine_masks

__all__ = [
    "FeedForward",
    "KVCache",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TransformerBlock",
    "TransformerBlocks",
    "check_caches",
    "merge_heads",
    "sinusoidal_table",
    "split_heads",
]


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, D)`` -> ``(B, H, T, head_dim)``: each head gets its own slice of the width.

    ``view`` alone would be wrong: it must be followed by ``transpose`` so that
    the head axis comes before the time axis (Chapter 6 shows the pitfall).
    """
    check_tensor(x, "x", ndim=3)
    n_heads = check_positive_int(n_heads, "n_heads")
    if x.shape[-1] % n_heads:
        raise ValueError(f"the width D={x.shape[-1]} of x must be divisible by n_heads={n_heads}")
    return _split_heads(x, n_heads)


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    batch, time, width = x.shape
    x = x.view(batch, time, n_heads, width // n_heads)  # (B, T, D) -> (B, T, H, head_dim)
    return x.transpose(1, 2)  # (B, T, H, head_dim) -> (B, H, T, head_dim)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, H, T, head_dim)`` -> ``(B, T, H * head_dim)``, the inverse of :func:`split_heads`."""
    check_tensor(x, "x", ndim=4)
    return _merge_heads(x)


def _merge_heads(x: Tensor) -> Tensor:
    batch, n_heads, time, head_dim = x.shape
    x = x.transpose(1, 2).contiguous()  # (B, H, T, head_dim) -> (B, T, H, head_dim)
    return x.view(batch, time, n_heads * head_dim)  # (B, T, H, head_dim) -> (B, T, D)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, self or cross (Chapter 6), with an optional KV cache (Chapter 8).

    ``H`` heads of width ``head_dim = d_model / H`` attend in parallel, each in its
    own subspace; their outputs are concatenated and mixed by ``out_proj``.
    Weights are laid out like ``nn.MultiheadAttention`` (``in_proj_weight`` is
    ``cat([q_proj.weight, k_proj.weight, v_proj.weight])``), so they can be copied.

    ``n_kv_heads`` (default ``n_heads``) makes it grouped-query attention: ``k_proj``
    and ``v_proj`` produce only ``n_kv_heads`` heads, which the cache stores, and
    each is shared by ``n_heads / n_kv_heads`` query heads (``1``: multi-query).
    """

    def __init__(self, d_model: int, n_heads: int, *, bias: bool = True, dropout: float = 0.0,
                 impl: str = "manual", n_kv_heads: int | None = None) -> None:
        super().__init__()
        self.head_dim = check_head_split(d_model, n_heads)
        self.d_model, self.n_heads = d_model, n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else check_kv_heads(n_heads,
                                                                            n_kv_heads)[1]
        kv_width = self.n_kv_heads * self.head_dim
        self.dropout = check_probability(dropout, "dropout")
        self.impl = check_choice(impl, "impl", ATTENTION_IMPLS)
        check_bool(bias, "bias")
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query (B, T_q, D)`` to ``key``/``value (B, T_k, D)``.

        Omit ``key`` and ``value`` for self-attention. ``attention_mask (B, T_k)``
        is ``True`` on real keys (``False`` on padding); ``mask`` is bool
        ``(T_q, T_k)`` or ``(B, T_q, T_k)``, ``True`` = may attend; ``is_causal``
        adds ``causal_mask(T_q, T_k)``. With a ``cache`` (self-attention only) the
        new keys and values are appended to it and ``T_k`` counts every cached
        position, so ``attention_mask`` must cover them all.

        Returns ``(out (B, T_q, D), attn_weights)``, like ``nn.MultiheadAttention``:
        ``attn_weights (B, H, T_q, T_k)`` when ``need_weights=True`` (which uses the
        manual path), else ``None``. Values are never scanned (no host-device sync):
        NaN or inf inputs propagate, except in padded keys, which are contained
        (see ``course_attn._validation``).
        """
        key, value = self._check_call(query, key, value, attention_mask, mask, is_causal,
                                      need_weights, cache)
        t_k = key.shape[1] + (0 if cache is None else cache.length)  # cached keys count too
        # The causal part stays a flag: attention() turns it into the fused kernel's
        # is_causal=True when nothing else is masked (FlashAttention-eligible).
        combined = combine_masks(query.shape[1], t_k, mask=mask, attention_mask=attention_mask,
                                 device=query.device)
        return self._forward(query, key, value, combined, is_causal=is_causal,
                             need_weights=need_weights, cache=cache)

    def _forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, *,
                 is_causal: bool = False, need_weights: bool = False,
                 cache: KVCache | None = None,
                 rope: tuple[Tensor, Tensor] | None = None,
                 bias: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """:meth:`forward` without checks; ``mask`` is combined and on ``query``'s device.

        ``rope`` is ``(cos, sin)`` from ``rope.rope_cos_sin`` at the new tokens'
        positions, ``(T_q, head_dim / 2)`` or ``(B, 1, T_q, head_dim / 2)``
        (self-attention): queries and keys are rotated, keys before they are cached.
        ``bias`` is added to every head's scaled scores, broadcastable to
        ``(B, H, T_q, T_k)`` with ``T_k`` counting cached keys (ALiBi's
        ``alibi_bias(T_q, T_k, slopes)``, ``(H, T_q, T_k)``), on ``query``'s device.
        """
        n_kv = self.n_kv_heads
        q = _split_heads(self.q_proj(query), self.n_heads)  # (B, T_q, D) -> (B, H, T_q, hd)
        k = _split_heads(self.k_proj(key), n_kv)  # (B, T_k, H_kv * hd) -> (B, H_kv, T_k, hd)
        v = _split_heads(self.v_proj(value), n_kv)  # (B, T_k, H_kv * hd) -> (B, H_kv, T_k, hd)
        if rope is not None:
            q, k = _rotate(q, *rope), _rotate(k, *rope)  # a cached key keeps its rotation
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H_kv, T_cache + T_q, head_dim)
        # Each key/value head serves n_heads / n_kv_heads query heads (GQA).
        k = _repeat_kv(k, self.n_heads // n_kv)  # (B, H_kv, T_k, hd) -> (B, H, T_k, hd)
        v = _repeat_kv(v, self.n_heads // n_kv)  # (B, H_kv, T_k, hd) -> (B, H, T_k, hd)
        dropout_p = self.dropout if self.training else 0.0
        impl = "manual" if need_weights else self.impl
        out, attn_weights = _attention(q, k, v, mask, is_causal=is_causal, scale=None,
                                       dropout_p=dropout_p, impl=impl, bias=bias)
        out = self.out_proj(_merge_heads(out))  # (B, H, T_q, head_dim) -> (B, T_q, D)
        return out, attn_weights if need_weights else None

    def _check_call(self, query: object, key: object, value: object, attention_mask: object,
                    mask: object, is_causal: object, need_weights: object,
                    cache: object) -> tuple[Tensor, Tensor]:
        """Every check before any work: a bad flag must not leave the cache half-updated."""
        dtype = self.q_proj.weight.dtype
        query = check_sequence(query, "query", width=self.d_model, dtype=dtype)
        if (key is None) != (value is None):
            raise ValueError("pass both key and value (cross-attention) or neither "
                             "(self-attention)")
        if key is not None and cache is not None:
            raise ValueError("cache is for self-attention; pass key=value=None with it")
        batch = query.shape[0]
        if key is not None:
            key = check_sequence(key, "key", width=self.d_model, batch=batch, dtype=dtype)
            value = check_sequence(value, "value", width=self.d_model, batch=batch, dtype=dtype)
            if key.shape[1] != value.shape[1]:
                raise ValueError(f"key and value must have the same length T_k, got "
                                 f"{tuple(key.shape)} and {tuple(value.shape)}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        check_bool(need_weights, "need_weights")
        check_bool(is_causal, "is_causal")
        if isinstance(attention_mask, Tensor) and attention_mask.shape[:1] != (batch,):
            raise ValueError(f"attention_mask must have shape (B, T_k) with B={batch}, "
                             f"got {tuple(attention_mask.shape)}")
        if isinstance(mask, Tensor) and mask.dim() == 3 and mask.shape[0] not in (1, batch):
            raise ValueError(f"mask must have shape (T_q, T_k) or (B, T_q, T_k) with "
                             f"B={batch}, got {tuple(mask.shape)}")
        return (query, query) if key is None else (key, value)  # type: ignore[return-value]


class FeedForward(nn.Module):
    """Position-wise feed-forward network (Chapter 7): widen, non-linearity, project back.

    ``(..., D) -> (..., D)``: ``linear2(dropout(act(linear1(x))))``. Attention mixes
    information *across* positions; this mixes it *within* each position.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, *, dropout: float = 0.0,
                 bias: bool = True, activation: str = "gelu") -> None:
        super().__init__()
        check_positive_int(d_model, "d_model")
        d_ff = 4 * d_model if d_ff is None else check_positive_int(d_ff, "d_ff")
        check_choice(activation, "activation", ("gelu", "relu"))
        check_bool(bias, "bias")
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.activation = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., D)`` -> ``(..., D)``. Values are not scanned: NaN stays in its position."""
        check_tensor(x, "x", min_ndim=1)
        weight = self.linear1.weight
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(f"x must have width d_model={weight.shape[1]}, "
                             f"got shape {tuple(x.shape)}")
        if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            # nn.Linear would fail inside with "mat1 and mat2 must have the same dtype"
            # (under autocast mixed dtypes are fine: autocast casts them itself).
            raise TypeError(f"x has dtype {x.dtype} but the layer's weights are "
                            f"{weight.dtype}; convert one with .to(dtype)")
        return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (..., D)


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """Sinusoidal positional encodings ``(max_len, d_model)`` of Vaswani et al. (Chapter 7).

    ``PE[p, 2i] = sin(p / 10000^(2i / d_model))`` and ``PE[p, 2i+1] = cos(...)``
    (same frequency for each sin/cos pair).
    """
    check_positive_int(max_len, "max_len")
    check_positive_int(d_model, "d_model")
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    even = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D / 2),)
    angle = position / (10000.0 ** (even / d_model))  # (max_len, ceil(D / 2))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds sinusoidal position information to token embeddings (Chapter 7).

    ``forward(x (B, T, D), positions=None (B, T) long) -> (B, T, D)``; positions
    default to ``0 .. T-1`` and may start later for left-padded rows.
    """

    table: Tensor

    def __init__(self, d_model: int, max_len: int = 4096, *, dropout: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """``x (B, T, D)`` plus the encoding of each position."""
        check_tensor(x, "x", ndim=3)
        max_len, d_model = self.table.shape
        if x.shape[-1] != d_model:
            raise ValueError(f"x must have width d_model={d_model}, got shape {tuple(x.shape)}")
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)  # (T,)
        elif not isinstance(positions, Tensor) or positions.dtype != torch.long:
            raise TypeError(f"positions must be a torch.long tensor (B, T), got {positions!r}")
        elif positions.shape not in (x.shape[:2], x.shape[1:2]):
            raise ValueError(f"positions must have shape (B, T)={tuple(x.shape[:2])} or (T,), "
                             f"got {tuple(positions.shape)}")
        if values_checkable(positions) and positions.numel() and (
                positions.min() < 0 or positions.max() >= max_len):
            raise ValueError(f"positions must lie in [0, max_len={max_len}), got "
                             f"[{int(positions.min())}, {int(positions.max())}]")
        return self._forward(x, positions)

    def _forward(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.dropout(x + self.table[positions].to(x.dtype))  # (B, T, D)


class TransformerBlock(nn.Module):
    """One Transformer layer (Chapter 7): attention and feed-forward, each with a residual.

    ``norm_first=True`` (pre-norm, as GPT-2 and most modern models):
    ``x = x + attn(norm1(x))``; ``x = x + ff(norm2(x))``, so the residual path
    carries the un-normalised input. ``norm_first=False`` (post-norm, the 2017
    paper): ``x = norm1(x + attn(x))``; ``x = norm2(x + ff(x))``.
    With ``cross_attention=True`` (an encoder-decoder's decoder layer) a
    cross-attention sublayer with ``norm3`` sits between the two.
    Dropout is applied to each sublayer's output before the residual addition.
    ``n_kv_heads`` makes its attention grouped-query (see :class:`MultiHeadAttention`).
    """

    def __init__(self, d_model: int, n_heads: int, *, d_ff: int | None = None,
                 dropout: float = 0.0, norm_first: bool = True, cross_attention: bool = False,
                 activation: str = "gelu", bias: bool = True, layer_norm_eps: float = 1e-5,
                 impl: str = "manual", n_kv_heads: int | None = None) -> None:
        super().__init__()
        for name, flag in (("norm_first", norm_first), ("cross_attention", cross_attention),
                           ("bias", bias)):
            check_bool(flag, name)
        check_positive_real(layer_norm_eps, "layer_norm_eps")
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout,
                                            impl=impl, n_kv_heads=n_kv_heads)
        self.cross_attn = (MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout,
                                              impl=impl, n_kv_heads=n_kv_heads)
                           if cross_attention else None)
        self.ff = FeedForward(d_model, d_ff, dropout=dropout, bias=bias, activation=activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = (nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
                      if cross_attention else None)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, attention_mask: Tensor | None = None,
                mask: Tensor | None = None, is_causal: bool = False,
                memory: Tensor | None = None, memory_attention_mask: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        """``x (B, T, D)`` -> ``(B, T, D)``; ``memory (B, T_m, D)`` is the encoder output.

        ``attention_mask (B, T_cache + T)`` is ``True`` on real tokens and ``mask``
        ``(T, T_k)`` or ``(B, T, T_k)`` is ``True`` where a query may attend, as in
        :class:`MultiHeadAttention`; ``memory_attention_mask (B, T_m)`` is ``True``
        on real memory positions.
        """
        self._check_call(x, attention_mask, mask, is_causal, memory, memory_attention_mask, cache)
        t_k = x.shape[1] + (0 if cache is None else cache.length)
        self_mask = combine_masks(x.shape[1], t_k, mask=mask, attention_mask=attention_mask,
                                  device=x.device)
        memory_mask = None
        if memory is not None and memory_attention_mask is not None:
            memory_mask = memory_attention_mask[:, None, None, :].to(x.device)  # (B, 1, 1, T_m)
        x, _ = self._forward(x, self_mask, is_causal=is_causal, memory=memory,
                             memory_mask=memory_mask, cache=cache)
        return x

    def _forward(self, x: Tensor, mask: Tensor | None, *, is_causal: bool = False,
                 memory: Tensor | None = None, memory_mask: Tensor | None = None,
                 cache: KVCache | None = None, need_weights: bool = False,
                 rope: tuple[Tensor, Tensor] | None = None,
                 bias: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """:meth:`forward` without checks; returns ``(x, self-attention weights or None)``.

        ``mask`` and ``memory_mask`` are prepared (combined, on ``x``'s device);
        ``rope`` is the self-attention's ``(cos, sin)`` and ``bias`` its additive score
        bias (ALiBi; see ``MultiHeadAttention._forward``); cross-attention gets neither.
        """
        def self_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            out, weights = self.self_attn._forward(h, h, h, mask, is_causal=is_causal,
                                                   need_weights=need_weights, cache=cache,
                                                   rope=rope, bias=bias)
            return self.dropout(out), weights

        def cross_attention(h: Tensor) -> Tensor:
            assert self.cross_attn is not None and memory is not None
            return self.dropout(self.cross_attn._forward(h, memory, memory, memory_mask)[0])

        if self.norm_first:
            attended, weights = self_attention(self.norm1(x))
            x = x + attended
            if self.norm3 is not None:
                x = x + cross_attention(self.norm3(x))
            return x + self.dropout(self.ff._forward(self.norm2(x))), weights
        attended, weights = self_attention(x)
        x = self.norm1(x + attended)
        if self.norm3 is not None:
            x = self.norm3(x + cross_attention(x))
        return self.norm2(x + self.dropout(self.ff._forward(x))), weights

    def _check_call(self, x: object, attention_mask: object, mask: object, is_causal: object,
                    memory: object, memory_attention_mask: object, cache: object) -> None:
        # Check here, not deep inside: a wrong width would otherwise surface as a
        # LayerNorm shape error, and memory's errors would be reported as "key".
        d_model, dtype = self.self_attn.d_model, self.norm1.weight.dtype
        x = check_sequence(x, "x", width=d_model, dtype=dtype)
        self.self_attn._check_call(x, None, None, attention_mask, mask, is_causal, False, cache)
        if (memory is None) != (self.cross_attn is None):
            raise ValueError("memory must be given exactly when the block was built with "
                             f"cross_attention=True (this block has cross_attention="
                             f"{self.cross_attn is not None})")
        if memory is None and memory_attention_mask is not None:
            raise ValueError("memory_attention_mask was given without memory")
        if memory is not None:
            memory = check_sequence(memory, "memory", width=d_model, batch=x.shape[0])
            if memory.dtype != x.dtype:
                raise TypeError(f"memory has dtype {memory.dtype} but x has {x.dtype}")
            if memory_attention_mask is not None:
                check_token_mask(memory_attention_mask, "memory_attention_mask",
                                 memory.shape[:2])


class TransformerBlocks(nn.ModuleList):
    """A stack of :class:`TransformerBlock` s: an ``nn.ModuleList`` that says what it holds.

    Behaves exactly like ``nn.ModuleList`` (same ``state_dict`` keys); iterating it
    yields ``TransformerBlock`` s for the type checker too.
    """

    def __iter__(self) -> Iterator[TransformerBlock]:
        return super().__iter__()  # type: ignore[return-value]
