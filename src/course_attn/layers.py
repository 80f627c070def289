"""Chapters 6 and 7: multi-head attention, the KV cache and the Transformer block.

Read top to bottom: head split/merge, the cache, multi-head attention (self or
cross), the feed-forward network, positional encodings, and the block that
assembles them (pre-norm or post-norm, encoder or decoder).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from ._validation import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_positive_int,
    check_positive_real,
    check_probability,
    check_tensor,
    values_checkable,
)
from .attention import ATTENTION_IMPLS, attention
from .masks import combine_masks

__all__ = [
    "FeedForward",
    "KVCache",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TransformerBlock",
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
    batch, time, width = x.shape
    if width % n_heads:
        raise ValueError(f"the width D={width} of x must be divisible by n_heads={n_heads}")
    x = x.view(batch, time, n_heads, width // n_heads)  # (B, T, D) -> (B, T, H, head_dim)
    return x.transpose(1, 2)  # (B, T, H, head_dim) -> (B, H, T, head_dim)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, H, T, head_dim)`` -> ``(B, T, H * head_dim)``, the inverse of :func:`split_heads`."""
    check_tensor(x, "x", ndim=4)
    batch, n_heads, time, head_dim = x.shape
    x = x.transpose(1, 2).contiguous()  # (B, H, T, head_dim) -> (B, T, H, head_dim)
    return x.view(batch, time, n_heads * head_dim)  # (B, T, H, head_dim) -> (B, T, D)


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer (Chapter 7).

    Decoding one token at a time, a layer projects only the new token and
    appends its key and value here; the new query then attends to every
    cached key. ``k`` and ``v`` are ``(B, H, T_cache, head_dim)``.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached positions ``T_cache``."""
        return 0 if self.k is None else self.k.shape[2]

    def reset(self) -> None:
        """Forget every cached position."""
        self.k = self.v = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k, v (B, H, T_new, head_dim)``; return all keys and values so far.

        The new keys must match the cached ones in dtype and device: a float64
        step would otherwise silently promote the whole cache (and the model's
        outputs) to float64, and a step on another device would fail inside ``cat``.
        """
        check_tensor(k, "k", ndim=4)
        check_tensor(v, "v", ndim=4)
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape (B, H, T_new, head_dim), "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.dtype != v.dtype:
            raise TypeError(f"k and v must share a dtype, got {k.dtype} and {v.dtype}")
        if k.device != v.device:
            raise ValueError(f"k and v must be on one device, got {k.device} and {v.device}")
        if self.k is not None:
            if k.dtype != self.k.dtype:
                raise TypeError(f"the cache holds {self.k.dtype} keys but the new k is {k.dtype}; "
                                "keep one dtype for a whole decoding run (reset() the cache "
                                "after converting the model)")
            if k.device != self.k.device:
                raise ValueError(f"the cache holds keys on {self.k.device} but the new k is on "
                                 f"{k.device}; keep one device for a whole decoding run "
                                 "(reset() the cache after moving the model)")
            cached = self.k.shape
            if (k.shape[0], k.shape[1], k.shape[3]) != (cached[0], cached[1], cached[3]):
                raise ValueError(
                    f"the cache holds (B, H, head_dim)=({cached[0]}, {cached[1]}, {cached[3]}) "
                    f"but the new keys have ({k.shape[0]}, {k.shape[1]}, {k.shape[3]}); "
                    "use one cache per layer and per batch (reset() it between batches)"
                )
            k = torch.cat([self.k, k], dim=2)  # (B, H, T_cache + T_new, head_dim)
            v = torch.cat([self.v, v], dim=2)  # (B, H, T_cache + T_new, head_dim)
        self.k, self.v = k, v
        return k, v


def check_caches(caches: object, n_layers: int) -> int:
    """Check one :class:`KVCache` per layer (from ``new_caches()``); return ``T_cache``.

    Shared by every stack that decodes with a cache (``MiniGPT``, the decoder of
    ``EncoderDecoder``): a list of ``n_layers`` caches that all hold the same length.
    """
    if not isinstance(caches, list | tuple):
        raise TypeError(f"caches must be a list of {n_layers} KVCache (one per layer, see "
                        f"new_caches()), got {type(caches).__name__}")
    if len(caches) != n_layers:
        raise ValueError(f"caches must be a list of {n_layers} KVCache (one per layer, see "
                         f"new_caches()), got {len(caches)}")
    if not all(isinstance(cache, KVCache) for cache in caches):
        raise TypeError(f"caches must hold KVCache objects, got "
                        f"{[type(cache).__name__ for cache in caches]}")
    lengths = {cache.length for cache in caches}
    if len(lengths) != 1:
        raise ValueError(f"the caches of the layers hold different lengths {sorted(lengths)}; "
                         "create them together with new_caches()")
    return lengths.pop()


class MultiHeadAttention(nn.Module):
    """Multi-head attention, self or cross (Chapter 6), with an optional KV cache (Chapter 7).

    ``H`` heads of width ``head_dim = d_model / H`` attend in parallel, each in its
    own subspace; their outputs are concatenated and mixed by ``out_proj``.
    Weights are laid out like ``nn.MultiheadAttention`` (``in_proj_weight`` is
    ``cat([q_proj.weight, k_proj.weight, v_proj.weight])``), so they can be copied.
    """

    def __init__(self, d_model: int, n_heads: int, *, bias: bool = True, dropout: float = 0.0,
                 impl: str = "manual") -> None:
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_positive_int(n_heads, "n_heads")
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} "
                             "(each head gets d_model / n_heads dimensions)")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = check_probability(dropout, "dropout")
        self.impl = check_choice(impl, "impl", ATTENTION_IMPLS)
        check_bool(bias, "bias")
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _check_input(self, x: object, name: str, batch: int | None = None) -> Tensor:
        check_tensor(x, name, ndim=3)
        if x.shape[1] == 0:
            raise ValueError(f"{name} must hold at least one position (B, T, D) with T >= 1, "
                             f"got shape {tuple(x.shape)}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"{name} must have width d_model={self.d_model}, got shape "
                             f"{tuple(x.shape)}")
        if batch is not None and x.shape[0] != batch:
            raise ValueError(f"{name} has batch size {x.shape[0]}, but query has {batch}")
        if x.dtype != self.q_proj.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            # nn.Linear would fail deep inside with "mat1 and mat2 must have the same dtype"
            # (under autocast mixed dtypes are fine: autocast casts them itself).
            raise TypeError(f"{name} has dtype {x.dtype} but the layer's weights are "
                            f"{self.q_proj.weight.dtype}; convert one with .to(dtype)")
        return x

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query (B, T_q, D)`` to ``key``/``value (B, T_k, D)``.

        Omit ``key`` and ``value`` for self-attention. ``attention_mask (B, T_k)``
        is ``True`` on real keys; ``attn_mask`` is bool ``(T_q, T_k)`` or
        ``(B, T_q, T_k)``, ``True`` = may attend; ``is_causal`` adds
        ``causal_mask(T_q, T_k)``. With a ``cache`` (self-attention only) the new
        keys and values are appended to it and ``T_k`` counts every cached
        position, so ``attention_mask`` must cover them all.

        Returns ``out (B, T_q, D)``, or ``(out, attn_weights (B, H, T_q, T_k))``
        when ``need_weights=True`` (which uses the manual path). Values are never
        scanned (no host-device sync): NaN or inf inputs propagate, except in
        padded keys, which are contained (see ``course_attn._validation``).
        """
        self._check_input(query, "query")
        if (key is None) != (value is None):
            raise ValueError("pass both key and value (cross-attention) or neither "
                             "(self-attention)")
        if key is None:
            key = value = query
        else:
            self._check_input(key, "key", query.shape[0])
            self._check_input(value, "value", query.shape[0])
            if key.shape[1] != value.shape[1]:
                raise ValueError(f"key and value must have the same length T_k, got "
                                 f"{tuple(key.shape)} and {tuple(value.shape)}")
            if cache is not None:
                raise ValueError("cache is for self-attention; pass key=value=None with it")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        # Every check before any work: a bad flag must not leave the cache half-updated.
        check_bool(need_weights, "need_weights")
        check_bool(is_causal, "is_causal")
        if isinstance(attention_mask, Tensor) and attention_mask.shape[:1] != query.shape[:1]:
            raise ValueError(f"attention_mask must have shape (B, T_k) with B={query.shape[0]}, "
                             f"got {tuple(attention_mask.shape)}")
        if (isinstance(attn_mask, Tensor) and attn_mask.dim() == 3
                and attn_mask.shape[0] not in (1, query.shape[0])):
            raise ValueError(f"attn_mask must have shape (T_q, T_k) or (B, T_q, T_k) with "
                             f"B={query.shape[0]}, got {tuple(attn_mask.shape)}")
        # The causal part stays a flag: attention() turns it into the fused kernel's
        # is_causal=True when nothing else is masked (FlashAttention-eligible).
        t_k = key.shape[1] + (0 if cache is None else cache.length)  # cached keys count too
        mask = combine_masks(query.shape[1], t_k, attn_mask=attn_mask,
                             attention_mask=attention_mask, device=query.device)

        q = split_heads(self.q_proj(query), self.n_heads)  # (B, T_q, D) -> (B, H, T_q, head_dim)
        k = split_heads(self.k_proj(key), self.n_heads)  # (B, T_k, D) -> (B, H, T_k, head_dim)
        v = split_heads(self.v_proj(value), self.n_heads)  # (B, T_k, D) -> (B, H, T_k, head_dim)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H, T_cache + T_q, head_dim)
        dropout_p = self.dropout if self.training else 0.0
        impl = "manual" if need_weights else self.impl
        out, attn_weights = attention(q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p,
                                      impl=impl)
        out = self.out_proj(merge_heads(out))  # (B, H, T_q, head_dim) -> (B, T_q, D)
        return (out, attn_weights) if need_weights else out


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
        if x.shape[-1] != self.linear1.in_features:
            raise ValueError(f"x must have width d_model={self.linear1.in_features}, "
                             f"got shape {tuple(x.shape)}")
        weight = self.linear1.weight
        if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            # nn.Linear would fail inside with "mat1 and mat2 must have the same dtype"
            # (under autocast mixed dtypes are fine: autocast casts them itself).
            raise TypeError(f"x has dtype {x.dtype} but the layer's weights are "
                            f"{weight.dtype}; convert one with .to(dtype)")
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
    """

    def __init__(self, d_model: int, n_heads: int, *, d_ff: int | None = None,
                 dropout: float = 0.0, norm_first: bool = True, cross_attention: bool = False,
                 activation: str = "gelu", bias: bool = True, layer_norm_eps: float = 1e-5,
                 impl: str = "manual") -> None:
        super().__init__()
        for name, flag in (("norm_first", norm_first), ("cross_attention", cross_attention),
                           ("bias", bias)):
            check_bool(flag, name)
        check_positive_real(layer_norm_eps, "layer_norm_eps")
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout,
                                            impl=impl)
        self.cross_attn = (MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout,
                                              impl=impl) if cross_attention else None)
        self.ff = FeedForward(d_model, d_ff, dropout=dropout, bias=bias, activation=activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = (nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
                      if cross_attention else None)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, attention_mask: Tensor | None = None,
                attn_mask: Tensor | None = None, is_causal: bool = False,
                memory: Tensor | None = None, memory_attention_mask: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        """``x (B, T, D)`` -> ``(B, T, D)``; ``memory (B, T_m, D)`` is the encoder output."""
        # Check here, not deep inside: a wrong width would otherwise surface as a
        # LayerNorm shape error, and memory's errors would be reported as "key".
        d_model = self.self_attn.d_model
        check_tensor(x, "x", ndim=3)
        if x.shape[-1] != d_model:
            raise ValueError(f"x must be (B, T, D) with D=d_model={d_model}, got shape "
                             f"{tuple(x.shape)}")
        if x.dtype != self.norm1.weight.dtype:
            raise TypeError(f"x has dtype {x.dtype} but the block's weights are "
                            f"{self.norm1.weight.dtype}; convert one with .to(dtype)")
        if (memory is None) != (self.cross_attn is None):
            raise ValueError("memory must be given exactly when the block was built with "
                             f"cross_attention=True (this block has cross_attention="
                             f"{self.cross_attn is not None})")
        if memory is None and memory_attention_mask is not None:
            raise ValueError("memory_attention_mask was given without memory")
        if memory is not None:
            check_tensor(memory, "memory", ndim=3)
            if (memory.shape[0], memory.shape[2]) != (x.shape[0], d_model):
                raise ValueError(f"memory must be (B, T_m, D) with B={x.shape[0]} and "
                                 f"D={d_model}, got shape {tuple(memory.shape)}")
            if memory.dtype != x.dtype:
                raise TypeError(f"memory has dtype {memory.dtype} but x has {x.dtype}")
            if memory_attention_mask is not None:
                expected = (memory.shape[0], memory.shape[1])
                check_bool_mask(memory_attention_mask, "memory_attention_mask", expected)
                if tuple(memory_attention_mask.shape) != expected:
                    raise ValueError(f"memory_attention_mask must have shape (B, T_m)="
                                     f"{expected}, got {tuple(memory_attention_mask.shape)}")

        def self_attention(h: Tensor) -> Tensor:
            return self.dropout(self.self_attn(h, attention_mask=attention_mask,
                                               attn_mask=attn_mask, is_causal=is_causal,
                                               cache=cache))

        def cross_attention(h: Tensor) -> Tensor:
            return self.dropout(self.cross_attn(h, memory, memory,
                                                attention_mask=memory_attention_mask))

        if self.norm_first:
            x = x + self_attention(self.norm1(x))
            if self.cross_attn is not None:
                x = x + cross_attention(self.norm3(x))
            return x + self.dropout(self.ff(self.norm2(x)))
        x = self.norm1(x + self_attention(x))
        if self.cross_attn is not None:
            x = self.norm3(x + cross_attention(x))
        return self.norm2(x + self.dropout(self.ff(x)))
