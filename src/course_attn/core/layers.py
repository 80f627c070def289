"""Chapters 6 and 7: multi-head attention, the feed-forward network, positions, the block.

Read top to bottom: the head split, multi-head attention (self or cross, with an
optional KV cache), the feed-forward network, sinusoidal positions, and the
Transformer block that assembles them (pre-norm or post-norm, encoder or decoder).

Each layer has one ``forward``, and a parent calls its children through
``__call__`` (``self.self_attn(h, ...)``), so forward hooks, ``torch.compile`` and
interpretability tools see every layer (a function inside one, such as the feed-forward
network's non-linearity, is seen through the layer it feeds: a forward pre-hook on
``ff.linear2`` receives the activations). A layer a reader builds checks its inputs
at its door (``course_attn.core.checks``); a layer built into a parent trusts the
parent (``check_inputs`` is then ``False``, see ``trust_children``), so a model's
inputs are checked once per forward, not once per layer and step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .._validation import (
    check_bool,
    check_choice,
    check_head_split,
    check_impl_head_dim,
    check_kv_heads,
    check_positive_int,
    check_positive_real,
    check_probability,
    check_tensor,
    trust_children,
)
from .attention import ATTENTION_FUNCTIONS, ATTENTION_IMPLS, AttentionFunction
from .checks import (
    check_attention_function,
    check_block_call,
    check_feed_forward_call,
    check_multi_head_call,
    check_positions_call,
)
from .kv_cache import CrossKVCache, KVCache
from .masks import scores_mask
from .triton_attention import MAX_TRITON_HEAD_SIZE

__all__ = [
    "ACTIVATIONS",
    "NORMS",
    "FeedForward",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TransformerBlock",
    "TransformerBlocks",
    "make_norm",
    "merge_heads",
    "sinusoidal_table",
    "split_heads",
]


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, D)`` -> ``(B, H, T, head_dim)``: each head gets a slice of the width (Chapter 6).

    ``view`` alone would be wrong: it must be followed by ``transpose`` so that
    the head axis comes before the time axis (Chapter 6 shows the pitfall).
    """
    check_tensor(x, "x", ndim=3)
    n_heads = check_positive_int(n_heads, "n_heads")
    if x.shape[-1] % n_heads:
        raise ValueError(f"the width D={x.shape[-1]} of x must be divisible by n_heads={n_heads}")
    batch, time, width = x.shape
    x = x.view(batch, time, n_heads, width // n_heads)  # (B, T, D) -> (B, T, H, head_dim)
    return x.transpose(1, 2)  # (B, T, H, head_dim) -> (B, H, T, head_dim)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, H, T, head_dim)`` -> ``(B, T, H * head_dim)``, undoing :func:`split_heads` (Chapter 6).
    """
    check_tensor(x, "x", ndim=4)
    batch, n_heads, time, head_dim = x.shape
    x = x.transpose(1, 2).contiguous()  # (B, H, T, head_dim) -> (B, T, H, head_dim)
    return x.view(batch, time, n_heads * head_dim)  # (B, T, H, head_dim) -> (B, T, D)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, self or cross (Chapter 6), with an optional KV cache (Chapter 8).

    ``H`` heads of width ``head_dim = d_model / H`` attend in parallel, each in its
    own subspace; their outputs are concatenated and mixed by ``out_proj``.
    Weights are laid out like ``nn.MultiheadAttention`` (``in_proj_weight`` is
    ``cat([q_proj.weight, k_proj.weight, v_proj.weight])``), so they can be copied.
    ``fused_qkv=True`` keeps exactly that concatenation as one layer, ``qkv_proj``
    (nanoGPT's ``c_attn``): one matrix multiply instead of three, for self-attention only
    (``key`` and ``value`` then come from the queries' own sequence). It computes what the
    three separate projections compute (Chapter 6), and loads their weights.

    ``n_kv_heads`` (default ``n_heads``) makes it grouped-query attention (Chapter 10):
    ``k_proj`` and ``v_proj`` produce only ``n_kv_heads`` heads, which the cache stores,
    and each serves ``n_heads / n_kv_heads`` query heads (``1``: multi-query).
    ``impl`` picks the attention path (``ATTENTION_IMPLS``); ``attention_fn`` replaces
    it with any function of that signature (``course_attn.core.attention``), the way
    Hugging Face models take an ``attn_implementation``: linear attention, say (Chapter 10).
    """

    check_inputs = True  # a layer a reader builds checks its inputs; a parent turns it off

    def __init__(self, d_model: int, n_heads: int, *, bias: bool = True, dropout: float = 0.0,
                 impl: str = "manual", n_kv_heads: int | None = None,
                 attention_fn: AttentionFunction | None = None, fused_qkv: bool = False) -> None:
        super().__init__()
        self.head_dim = check_head_split(d_model, n_heads)
        self.d_model, self.n_heads = d_model, n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else check_kv_heads(n_heads,
                                                                            n_kv_heads)[1]
        self.dropout = check_probability(dropout, "dropout")
        self.impl = check_choice(impl, "impl", ATTENTION_IMPLS)
        check_impl_head_dim(self.impl, self.head_dim, MAX_TRITON_HEAD_SIZE)
        self.attention_fn = check_attention_function(attention_fn)
        check_bool(bias, "bias")
        self.kv_width = kv_width = self.n_kv_heads * self.head_dim
        self.qkv_proj: nn.Linear | None = None
        self.q_proj: nn.Linear | None = None
        self.k_proj: nn.Linear | None = None
        self.v_proj: nn.Linear | None = None
        if check_bool(fused_qkv, "fused_qkv"):  # self-attention only: one matmul, nanoGPT's c_attn
            self.qkv_proj = nn.Linear(d_model, d_model + 2 * kv_width, bias=bias)
            self.register_load_state_dict_pre_hook(_fuse_qkv_state)
        else:
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
        cache: KVCache | CrossKVCache | None = None,
        rotate: Callable[[Tensor], Tensor] | None = None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query (B, T_q, D)`` to ``key``/``value (B, T_k, D)``.

        Omit ``key`` and ``value`` for self-attention. ``attention_mask (B, T_k)``
        is ``True`` on real keys (``False`` on padding); ``mask`` is bool
        ``(T_q, T_k)`` or ``(B, T_q, T_k)``, ``True`` = may attend (inside a model: any
        mask broadcastable to ``(B, H, T_q, T_k)``, already on ``query``'s device);
        ``is_causal`` adds ``causal_mask(T_q, T_k)``. With a :class:`KVCache`
        (self-attention) the new keys and values are appended to it and ``T_k`` counts
        every cached position, so ``attention_mask`` must cover them all. With a
        :class:`CrossKVCache` (cross-attention: ``key`` is the encoder output) the
        first call projects ``key`` and ``value`` into it and every later call reuses
        them without projecting (the static cross-attention cache). ``rotate`` turns the
        queries ``(B, H, T, head_dim)`` and keys ``(B, H_kv, T, head_dim)`` by their
        positions before the keys are cached (RoPE, Chapter 10); ``bias`` is added to every
        head's scores (ALiBi).

        Returns ``(out (B, T_q, D), attn_weights)``, like ``nn.MultiheadAttention``:
        ``attn_weights (B, H, T_q, T_k)`` when ``need_weights=True`` (which uses the
        manual path), else ``None``. Values are never scanned (no host-device sync).
        """
        if self.check_inputs:
            attention_mask, mask = check_multi_head_call(self, query, key, value, attention_mask,
                                                         mask, is_causal, need_weights, cache, bias)
        if attention_mask is not None or (mask is not None and mask.dim() == 3):
            mask = scores_mask(mask, attention_mask)  # one for every head: (B, 1, T_q, T_k)
        q, k, v = self._heads(query, key, value, cache, rotate)  # (B, H, T_q|T_k, hd) each
        attend = self.attention_fn or ATTENTION_FUNCTIONS["manual" if need_weights else self.impl]
        out, weights = attend(q, k, v, mask, is_causal=is_causal, bias=bias,
                              dropout_p=self.dropout if self.training else 0.0)  # (B, H, T_q, hd)
        batch, t_q, _ = query.shape
        out = out.transpose(1, 2).reshape(batch, t_q, self.d_model)  # (B, T_q, H * hd)
        return self.out_proj(out), weights if need_weights else None

    def _heads(self, query: Tensor, key: Tensor | None, value: Tensor | None,
               cache: KVCache | CrossKVCache | None, rotate: Callable[[Tensor], Tensor] | None
               ) -> tuple[Tensor, Tensor, Tensor]:
        """q ``(B, H, T_q, hd)``, k and v ``(B, H, T_k, hd)`` for :meth:`forward`: projected and
        split into heads, turned by ``rotate``, appended to ``cache``, and each key/value
        head repeated for its group of query heads (GQA).

        Fused, with as many key/value heads as query heads, one ``view``, one ``permute`` and
        one ``unbind`` split all three into heads: 3 operators where splitting first and
        then viewing and transposing each takes 7, and as many fewer in the backward pass
        (issue 42). A :class:`CrossKVCache` that holds the memory's keys and values gives
        them without projecting (the static cross-attention cache); a fused layer is
        self-attention only, and its door refuses a ``CrossKVCache``.
        """
        (batch, t_q, _), hd = query.shape, self.head_dim
        fused, cached = self.qkv_proj, False
        if fused is not None:  # self-attention: q, k and v from one matmul (nanoGPT's c_attn)
            qkv = fused(query)  # (B, T, D + 2 kv_width)
            if self.n_kv_heads == self.n_heads:  # rows: all of q's heads, then k's, then v's
                qkv = qkv.view(batch, t_q, 3, self.n_heads, hd)  # (B, T, 3, H, hd)
                q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (3, B, H, T, hd) -> 3 tensors
            else:  # GQA: the widths differ, so each is split on its own
                q, k, v = (part.view(batch, t_q, -1, hd).transpose(1, 2)  # (B, H or H_kv, T, hd)
                           for part in qkv.split((self.d_model, self.kv_width, self.kv_width), -1))
        else:  # three projections (chapters 3 and 6): key and value may be another sequence
            assert self.q_proj is not None and self.k_proj is not None and self.v_proj is not None
            q = self.q_proj(query).view(batch, t_q, self.n_heads, hd)  # (B, T_q, H, hd)
            q = q.transpose(1, 2)  # (B, H, T_q, hd)
            cached = isinstance(cache, CrossKVCache) and cache.k is not None and cache.v is not None
            if cached:  # the memory's keys and values are projected at step one only
                k, v = cache.k, cache.v  # type: ignore[union-attr]  # (B, H_kv, T_k, hd)
            else:
                key = query if key is None else key
                value = key if value is None else value
                t_k = key.shape[1]
                k = self.k_proj(key).view(batch, t_k, self.n_kv_heads, hd)  # (B, T_k, H_kv, hd)
                v = self.v_proj(value).view(batch, t_k, self.n_kv_heads, hd)  # (B, T_k, H_kv, hd)
                k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, H_kv, T_k, hd) each
        if rotate is not None:  # RoPE: a query is turned by its position, a new key by its own
            q = rotate(q)
            if not cached:  # turned once, before it is cached
                k = rotate(k)
        if cache is not None and not cached:  # a KVCache appends; a CrossKVCache keeps them
            k, v = cache.update(k, v)  # (B, H_kv, T_cache + T_k, hd)
        if self.n_kv_heads != self.n_heads:  # GQA: each key/value head serves a group of queries
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, H, T_k, hd)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, H, T_k, hd)
        return q, k, v


def _fuse_qkv_state(module: nn.Module, state_dict: dict, prefix: str, *_: object) -> None:
    """Load separate ``q_proj``, ``k_proj``, ``v_proj`` weights (older checkpoints) into a
    fused layer's ``qkv_proj``: their rows, concatenated in that order, are its rows."""
    for kind in ("weight", "bias"):
        names = [f"{prefix}{proj}.{kind}" for proj in ("q_proj", "k_proj", "v_proj")]
        if all(name in state_dict for name in names):
            state_dict[f"{prefix}qkv_proj.{kind}"] = torch.cat([state_dict.pop(n) for n in names])


# Each feed-forward network's non-linearity (SwiGLU's gate is SiLU): the exact GELU, as nn.GELU()
_NONLINEARITIES: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu, "relu": F.relu, "swiglu": F.silu}
#: The feed-forward networks of :class:`FeedForward`: GELU (GPT-2), ReLU (the 2017 paper),
#: and SwiGLU, the gated unit of Llama, Mistral and most models since (Shazeer 2020).
ACTIVATIONS = tuple(_NONLINEARITIES)
#: The norms a block can use: LayerNorm, or RMSNorm (Zhang and Sennrich 2019), which only
#: rescales (no mean subtracted, no bias), as Llama and most models since.
NORMS = ("layer", "rms")


class FeedForward(nn.Module):
    """Position-wise feed-forward network (Chapter 7): widen, non-linearity, project back.

    ``(..., D) -> (..., D)``: ``linear2(dropout(act(linear1(x))))``, with no ``dropout``
    module when ``dropout=0`` (``self.dropout is None``). ``act`` is a plain function
    (``self.activation``, named by ``activation_name``), not a module: a forward pre-hook on
    ``linear2`` receives its output (after the dropout, if any). Attention mixes
    information *across* positions; this mixes it *within* each position. With
    ``activation="swiglu"`` ``linear1`` makes two halves of width ``d_ff``, a gate and a
    value, and ``act`` is ``silu(gate) * value`` (SwiGLU; Llama keeps the parameter count
    of a GELU network by taking ``d_ff`` near ``8 D / 3``).
    """

    check_inputs = True  # see MultiHeadAttention

    def __init__(self, d_model: int, d_ff: int | None = None, *, dropout: float = 0.0,
                 bias: bool = True, activation: str = "gelu") -> None:
        super().__init__()
        check_positive_int(d_model, "d_model")
        d_ff = 4 * d_model if d_ff is None else check_positive_int(d_ff, "d_ff")
        self.gated = check_choice(activation, "activation", ACTIVATIONS) == "swiglu"
        check_bool(bias, "bias")
        self.linear1 = nn.Linear(d_model, 2 * d_ff if self.gated else d_ff, bias=bias)
        # A function, not a module: it holds nothing, and a module call costs host time in
        # every layer of every step (issue 42); Meta's Llama code calls F.silu the same way.
        self.activation_name = activation
        self.activation = _NONLINEARITIES[activation]
        # None without dropout (nanoGPT drops nothing between the two layers): no module call,
        # and forward finds None in the instance's own dict, not via nn.Module's __getattr__
        p = check_probability(dropout, "dropout")
        self.dropout = nn.Dropout(p) if p else None
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r}"

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., D)`` -> ``(..., D)``. Values are not scanned: NaN stays in its position."""
        if self.check_inputs:
            check_feed_forward_call(self, x)
        h = self.linear1(x)  # (..., d_ff), or (..., 2 d_ff) for SwiGLU
        if self.gated:  # SwiGLU: silu(x W_gate) * (x W_value)
            gate, value = h.chunk(2, dim=-1)  # each (..., d_ff)
            h = self.activation(gate) * value  # (..., d_ff)
        else:
            h = self.activation(h)  # (..., d_ff)
        if self.dropout is not None:
            h = self.dropout(h)
        return self.linear2(h)  # (..., D)


def make_norm(kind: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """A LayerNorm (``kind="layer"``) or an RMSNorm (``"rms"``) over ``d_model`` (Chapter 7)."""
    check_choice(kind, "norm", NORMS)
    if kind == "rms":  # x / rms(x) * gain: no centring and no bias
        return nn.RMSNorm(d_model, eps=eps)
    return nn.LayerNorm(d_model, eps=eps, bias=bias)


def sinusoidal_table(context_length: int, d_model: int) -> Tensor:
    """Sinusoidal positional encodings ``(context_length, d_model)`` of Vaswani et al. (Chapter 7).

    ``PE[p, 2i] = sin(p / 10000^(2i / d_model))`` and ``PE[p, 2i+1] = cos(...)``
    (same frequency for each sin/cos pair).
    """
    check_positive_int(context_length, "context_length")
    check_positive_int(d_model, "d_model")
    position = torch.arange(context_length, dtype=torch.float64).unsqueeze(1)  # (T_max, 1)
    even = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D / 2),)
    angle = position / (10000.0 ** (even / d_model))  # (T_max, ceil(D / 2))
    table = torch.zeros(context_length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds sinusoidal position information to token embeddings (Chapter 7).

    ``forward(x (B, T, D), positions=None (B, T) long) -> (B, T, D)``; positions
    default to ``0 .. T-1`` and may start later for left-padded rows.
    """

    check_inputs = True  # see MultiHeadAttention
    table: Tensor

    def __init__(self, d_model: int, context_length: int = 4096, *,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(context_length, d_model),
                             persistent=False)
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """``x (B, T, D)`` plus the encoding of each position."""
        if self.check_inputs:
            check_positions_call(self, x, positions)
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)  # (T,)
        return self.dropout(x + self.table[positions].to(x.dtype))  # (B, T, D) + ((B,) T, D)


class TransformerBlock(nn.Module):
    """One Transformer layer (Chapter 7): attention and feed-forward, each with a residual.

    ``norm_first=True`` (pre-norm, as GPT-2 and most modern models):
    ``x = x + attn(norm1(x))``; ``x = x + ff(norm2(x))``, so the residual path
    carries the un-normalised input. ``norm_first=False`` (post-norm, the 2017
    paper): ``x = norm1(x + attn(x))``; ``x = norm2(x + ff(x))``.
    With ``cross_attention=True`` (an encoder-decoder's decoder layer, Chapter 8) a
    cross-attention sublayer with ``norm3`` sits between the two.
    Dropout is applied to each sublayer's output before the residual addition.
    ``n_kv_heads``, ``impl`` and ``attention_fn`` go to the attention layers
    (see :class:`MultiHeadAttention`), ``fused_qkv`` to the self-attention only; ``norm`` is
    one of ``NORMS`` and ``activation`` one of ``ACTIVATIONS`` (RMSNorm and SwiGLU make the
    block of a 2026 decoder). ``ff_dropout`` is the dropout inside the feed-forward network
    (``None``: ``dropout``, as PyTorch's ``nn.TransformerEncoderLayer``; ``0.0``: none, as
    GPT-2).
    """

    check_inputs = True  # see MultiHeadAttention

    def __init__(self, d_model: int, n_heads: int, *, d_ff: int | None = None,
                 dropout: float = 0.0, norm_first: bool = True, cross_attention: bool = False,
                 activation: str = "gelu", bias: bool = True, layer_norm_eps: float = 1e-5,
                 impl: str = "manual", n_kv_heads: int | None = None,
                 attention_fn: AttentionFunction | None = None, norm: str = "layer",
                 fused_qkv: bool = False, ff_dropout: float | None = None) -> None:
        super().__init__()
        for name, flag in (("norm_first", norm_first), ("cross_attention", cross_attention),
                           ("bias", bias), ("fused_qkv", fused_qkv)):
            check_bool(flag, name)
        check_positive_real(layer_norm_eps, "layer_norm_eps")
        self.norm_first = norm_first

        def attention(fused: bool) -> MultiHeadAttention:
            return MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout, impl=impl,
                                      n_kv_heads=n_kv_heads, attention_fn=attention_fn,
                                      fused_qkv=fused)

        self.self_attn = attention(fused_qkv)  # q, k, v of one sequence: one matmul if fused
        self.cross_attn = attention(False) if cross_attention else None
        # PyTorch's encoder layer also drops inside the feed-forward network; GPT-2 and nanoGPT
        # do not (ff_dropout=0.0): only each sublayer's output is dropped.
        self.ff = FeedForward(d_model, d_ff, dropout=dropout if ff_dropout is None
                              else ff_dropout, bias=bias, activation=activation)
        self.norm1 = make_norm(norm, d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = make_norm(norm, d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = (make_norm(norm, d_model, eps=layer_norm_eps, bias=bias)
                      if cross_attention else None)
        self.dropout = nn.Dropout(dropout)
        trust_children(self)

    def forward(self, x: Tensor, *, attention_mask: Tensor | None = None,
                mask: Tensor | None = None, is_causal: bool = False,
                memory: Tensor | None = None, memory_attention_mask: Tensor | None = None,
                cache: KVCache | None = None, cross_cache: CrossKVCache | None = None,
                need_weights: bool = False, rotate: Callable[[Tensor], Tensor] | None = None,
                bias: Tensor | None = None) -> Tensor:
        """``x (B, T, D)`` -> ``(B, T, D)``; ``memory (B, T_m, D)`` is the encoder output.

        ``attention_mask (B, T_cache + T)`` is ``True`` on real tokens and ``mask``
        ``(T, T_k)`` or ``(B, T, T_k)`` is ``True`` where a query may attend, as in
        :class:`MultiHeadAttention`; ``memory_attention_mask (B, T_m)`` is ``True``
        on real memory positions. ``cache`` is the self-attention's :class:`KVCache`,
        ``cross_cache`` the cross-attention's :class:`CrossKVCache` (the memory's keys
        and values, projected at the first decoding step only). ``need_weights`` goes to
        both attention layers (a forward hook on ``self_attn`` or ``cross_attn`` sees
        their weights); ``rotate`` and ``bias`` go to the self-attention.
        """
        if self.check_inputs:
            attention_mask, mask, memory_attention_mask = check_block_call(
                self, x, attention_mask, mask, is_causal, memory, memory_attention_mask, cache,
                cross_cache, need_weights)
        # Only the arguments this call has: each keyword handed down costs host time at every
        # level of every layer of every step. A plain causal call (a training step's) hands
        # down just is_causal, and skips the sorting out too (issue 42).
        given: dict[str, Any] = {}
        if (attention_mask is not None or mask is not None or cache is not None
                or rotate is not None or bias is not None or need_weights):
            given = {name: value for name, value in (
                ("attention_mask", attention_mask), ("mask", mask), ("cache", cache),
                ("rotate", rotate), ("bias", bias),
                ("need_weights", True if need_weights else None)) if value is not None}
        if self.norm_first:  # pre-norm: the residual stream itself is never normalised
            h = self.self_attn(self.norm1(x), is_causal=is_causal, **given)[0]  # (B, T, D)
            x = x + self.dropout(h)
            if self.cross_attn is not None and self.norm3 is not None:
                h = self._cross_attention(self.norm3(x), memory, memory_attention_mask,
                                          cross_cache, need_weights)  # (B, T, D)
                x = x + self.dropout(h)
            return x + self.dropout(self.ff(self.norm2(x)))
        # post-norm: each sublayer's sum is normalised, and the next sublayer reads it
        x = self.norm1(x + self.dropout(self.self_attn(x, is_causal=is_causal, **given)[0]))
        if self.cross_attn is not None and self.norm3 is not None:
            h = self._cross_attention(x, memory, memory_attention_mask, cross_cache, need_weights)
            x = self.norm3(x + self.dropout(h))
        return self.norm2(x + self.dropout(self.ff(x)))

    def _cross_attention(self, h: Tensor, memory: Tensor | None,
                         memory_attention_mask: Tensor | None, cache: CrossKVCache | None,
                         need_weights: bool) -> Tensor:
        """The decoder's cross-attention from ``h (B, T, D)`` to ``memory (B, T_m, D)``."""
        assert self.cross_attn is not None
        memory_mask = (None if memory_attention_mask is None  # (B, T_m) -> (B, 1, 1, T_m)
                       else memory_attention_mask[:, None, None, :])
        return self.cross_attn(h, memory, memory, mask=memory_mask, cache=cache,
                               need_weights=need_weights)[0]  # (B, T, D)


class TransformerBlocks(nn.ModuleList):
    """A stack of :class:`TransformerBlock` s, an ``nn.ModuleList`` that says so (Chapter 7).

    Behaves exactly like ``nn.ModuleList`` (same ``state_dict`` keys); iterating it
    yields ``TransformerBlock`` s for the type checker too.
    """

    def __iter__(self) -> Iterator[TransformerBlock]:
        return super().__iter__()  # type: ignore[return-value]
