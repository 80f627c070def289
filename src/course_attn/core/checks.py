"""The doors of the layers in ``layers.py`` (Chapters 6-8): what a layer a reader calls checks.

A layer built by a reader checks its inputs here before any work, so a wrong shape
or dtype is a ``TypeError`` / ``ValueError`` that names the argument, not an error
from deep inside torch; and no argument can leave a cache half-updated. A layer
built into a parent skips its door (``check_inputs = False``): the parent checked.
Each door returns the masks it checked; a mask, bias, position or cache on another
device than the inputs is refused, as the inputs are (``check_on_device``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import (
    check_bool,
    check_on_device,
    check_sequence,
    check_tensor,
    check_token_mask,
    values_checkable,
)
from .kv_cache import CrossKVCache, KVCache
from .masks import combine_masks

__all__ = [
    "check_attention_function",
    "check_cache",
    "check_caches",
    "check_block_call",
    "check_cross_cache",
    "check_cross_caches",
    "check_feed_forward_call",
    "check_multi_head_call",
    "check_on_device",
    "check_positions_call",
]


def check_attention_function(fn: object) -> Any:
    """``None``, or a function ``(q, k, v, mask, *, is_causal, dropout_p, bias) -> (out, w)``."""
    if fn is not None and not callable(fn):
        raise TypeError(f"attention_fn must be a function (q, k, v, mask, *, is_causal, "
                        f"dropout_p, bias) -> (out, weights or None), or None, got "
                        f"{type(fn).__name__} {fn!r}")
    return fn


def check_multi_head_call(layer: Any, query: object, key: object, value: object,
                          attention_mask: object, mask: object, is_causal: object,
                          need_weights: object, cache: object, bias: object, *,
                          inputs: str = "query") -> tuple[Tensor | None, Tensor | None]:
    """Check a standalone ``MultiHeadAttention`` call; return ``(attention_mask, mask)``.

    The masks and the bias must be on the queries' device (``inputs`` names them in the
    messages: ``"x"`` for a block's call)."""
    dtype = layer.out_proj.weight.dtype
    query = check_sequence(query, inputs, width=layer.d_model, dtype=dtype)
    check_on_device(query, inputs, layer.out_proj.weight.device, "the layer")
    if layer.qkv_proj is not None and (key is not None or value is not None):
        raise ValueError("this layer projects q, k and v in one matmul (fused_qkv=True), from "
                         "the queries' own sequence: pass key=value=None, or build it with "
                         "fused_qkv=False for cross-attention")
    if (key is None) != (value is None):
        raise ValueError("pass both key and value (cross-attention) or neither "
                         "(self-attention)")
    if key is None and isinstance(cache, CrossKVCache):
        raise ValueError("cache is a CrossKVCache, the memory's keys for cross-attention: pass "
                         "the memory as key and value with it (self-attention takes a KVCache)")
    if key is not None and isinstance(cache, KVCache):
        raise ValueError("cache is a KVCache, which grows with self-attention: pass "
                         "key=value=None with it (cross-attention takes a CrossKVCache)")
    batch, t_q = query.shape[0], query.shape[1]
    # the keys this call brings: the queries' own, or the memory's
    t_new = t_q if key is None else _check_key_value(layer, query, key, value, dtype)
    check_bool(need_weights, "need_weights")
    check_bool(is_causal, "is_causal")
    past = 0
    fits = {"batch": batch, "heads": layer.n_kv_heads, "head_dim": layer.head_dim,
            "dtype": dtype, "device": query.device}
    if cache is not None and key is None:
        past = check_cache(cache, "cache", **fits).length
    elif cache is not None:
        check_cross_cache(cache, "cache", memory_length=t_new, **fits)
    t_k = t_new + past
    for name, value in (("mask", mask), ("attention_mask", attention_mask)):
        if value is not None and not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a boolean torch.Tensor or None, got "
                            f"{type(value).__name__}")
        if value is not None:
            check_on_device(value, name, query.device, inputs)
    if isinstance(attention_mask, Tensor) and attention_mask.shape[:1] != (batch,):
        raise ValueError(f"attention_mask must have shape (B, T_k) with B={batch}, "
                         f"got {tuple(attention_mask.shape)}")
    if isinstance(mask, Tensor) and mask.dim() == 3 and mask.shape[0] not in (1, batch):
        raise ValueError(f"mask must have shape (T_q, T_k) or (B, T_q, T_k) with "
                         f"B={batch}, got {tuple(mask.shape)}")
    if bias is not None:
        check_on_device(check_tensor(bias, "bias"), "bias", query.device, inputs)
    combine_masks(t_q, t_k, mask=mask, attention_mask=attention_mask,  # type: ignore[arg-type]
                  device=query.device)  # for its checks of the two masks' shapes
    return attention_mask, mask  # type: ignore[return-value]  # checked above


def _check_key_value(layer: Any, query: Tensor, key: object, value: object,
                     dtype: torch.dtype) -> int:
    """Check cross-attention's ``key`` and ``value (B, T_k, D)`` against ``query``; return
    ``T_k``."""
    batch = query.shape[0]
    key = check_sequence(key, "key", width=layer.d_model, batch=batch, dtype=dtype)
    value = check_sequence(value, "value", width=layer.d_model, batch=batch, dtype=dtype)
    if key.shape[1] != value.shape[1]:
        raise ValueError(f"key and value must have the same length T_k, got "
                         f"{tuple(key.shape)} and {tuple(value.shape)}")
    if not query.device == key.device == value.device:
        raise ValueError(f"query, key and value must be on one device, got {query.device}, "
                         f"{key.device} and {value.device}")
    return key.shape[1]


def check_feed_forward_call(layer: Any, x: object) -> None:
    """Check a standalone ``FeedForward`` call: a tensor ``(..., D)`` in the layer's dtype."""
    x = check_tensor(x, "x", min_ndim=1)
    weight = layer.linear1.weight
    check_on_device(x, "x", weight.device, "the layer")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x must have width d_model={weight.shape[1]}, "
                         f"got shape {tuple(x.shape)}")
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        # nn.Linear would fail inside with "mat1 and mat2 must have the same dtype"
        # (under autocast mixed dtypes are fine: autocast casts them itself).
        raise TypeError(f"x has dtype {x.dtype} but the layer's weights are "
                        f"{weight.dtype}; convert one with .to(dtype)")


def check_positions_call(layer: Any, x: object, positions: object) -> None:
    """Check a standalone ``PositionalEncoding`` call: ``x (B, T, D)``, positions in the table."""
    x = check_tensor(x, "x", ndim=3)
    check_on_device(x, "x", layer.table.device, "the layer")
    context_length, d_model = layer.table.shape
    if x.shape[-1] != d_model:
        raise ValueError(f"x must have width d_model={d_model}, got shape {tuple(x.shape)}")
    if positions is None:
        if x.shape[1] > context_length:
            raise ValueError(f"x has T={x.shape[1]} positions, more than "
                             f"context_length={context_length}")
        return
    if not isinstance(positions, Tensor) or positions.dtype != torch.long:
        raise TypeError(f"positions must be a torch.long tensor (B, T), got {positions!r}")
    check_on_device(positions, "positions", x.device, "x")
    if positions.shape not in (x.shape[:2], x.shape[1:2]):
        raise ValueError(f"positions must have shape (B, T)={tuple(x.shape[:2])} or (T,), "
                         f"got {tuple(positions.shape)}")
    if values_checkable(positions) and positions.numel() and (
            positions.min() < 0 or positions.max() >= context_length):
        raise ValueError(f"positions must lie in [0, context_length={context_length}), got "
                         f"[{int(positions.min())}, {int(positions.max())}]")


def check_block_call(block: Any, x: object, attention_mask: object, mask: object,
                     is_causal: object, memory: object, memory_attention_mask: object,
                     cache: object, cross_cache: object, need_weights: object,
                     ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Check a standalone ``TransformerBlock`` call; return ``(attention_mask, mask,
    memory_attention_mask)``, each on ``x``'s device."""
    # Check here, not deep inside: a wrong width would otherwise surface as a
    # LayerNorm shape error, and memory's errors would be reported as "key".
    d_model, dtype = block.self_attn.d_model, block.norm1.weight.dtype
    x = check_sequence(x, "x", width=d_model, dtype=dtype)
    check_on_device(x, "x", block.norm1.weight.device, "the layer")
    if (memory is None) != (block.cross_attn is None):
        raise ValueError("memory must be given exactly when the block was built with "
                         f"cross_attention=True (this block has cross_attention="
                         f"{block.cross_attn is not None})")
    if memory is None and memory_attention_mask is not None:
        raise ValueError("memory_attention_mask was given without memory")
    if memory is None and cross_cache is not None:
        raise ValueError("cross_cache was given without memory (it caches the memory's keys)")
    if memory is not None:
        memory = check_sequence(memory, "memory", width=d_model, batch=x.shape[0])
        if memory.dtype != x.dtype:
            raise TypeError(f"memory has dtype {memory.dtype} but x has {x.dtype}")
        check_on_device(memory, "memory", x.device, "x")
        if memory_attention_mask is not None:
            memory_attention_mask = check_on_device(check_token_mask(
                memory_attention_mask, "memory_attention_mask", memory.shape[:2]),
                "memory_attention_mask", x.device, "x")
        if cross_cache is not None:
            attn = block.cross_attn
            check_cross_cache(cross_cache, "cross_cache", batch=x.shape[0],
                              heads=attn.n_kv_heads, head_dim=attn.head_dim,
                              memory_length=memory.shape[1], dtype=dtype, device=x.device)
    attention_mask, mask = check_multi_head_call(block.self_attn, x, None, None, attention_mask,
                                                 mask, is_causal, need_weights, cache, None,
                                                 inputs="x")
    return attention_mask, mask, memory_attention_mask  # type: ignore[return-value]


def check_cache(cache: object, name: str, *, batch: int, heads: int, head_dim: int,
                dtype: torch.dtype, device: torch.device) -> KVCache:
    """Check that ``cache`` is a :class:`KVCache` new keys ``(B, H, T, head_dim)`` fit (Chapter 8).

    A cached dtype or device other than the new keys' would otherwise promote the
    whole cache (float64) or fail inside ``torch.cat``; another ``B``, ``H`` or
    ``head_dim`` means the cache belongs to another layer or batch.
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"{name} must be a KVCache, got {type(cache).__name__}")
    if cache.k is not None:
        _check_held_keys(cache.k, name, batch=batch, heads=heads, head_dim=head_dim,
                         dtype=dtype, device=device)
    return cache


def check_cross_cache(cache: object, name: str, *, batch: int, heads: int, head_dim: int,
                      memory_length: int, dtype: torch.dtype, device: torch.device,
                      ) -> CrossKVCache:
    """Check that ``cache`` is a :class:`CrossKVCache` for this memory ``(B, T_s, D)`` (Chapter 8).

    Empty, or holding keys ``(B, H, T_s, head_dim)`` of the layer's dtype and device:
    once filled, the layer reads them instead of projecting the memory, so keys of
    another source length would attend over the wrong positions. (That they are the
    keys of *this* memory cannot be checked without reading values: ``reset()`` the
    cache for a new source batch.)
    """
    if not isinstance(cache, CrossKVCache):
        raise TypeError(f"{name} must be a CrossKVCache (the static cross-attention cache), got "
                        f"{type(cache).__name__}")
    if cache.k is None:
        return cache
    _check_held_keys(cache.k, name, batch=batch, heads=heads, head_dim=head_dim, dtype=dtype,
                     device=device)
    if cache.length != memory_length:
        raise ValueError(f"{name} holds the keys of T_s={cache.length} memory positions but the "
                         f"memory has {memory_length}; reset() it for a new source batch")
    return cache


def _check_held_keys(held: Tensor, name: str, *, batch: int, heads: int, head_dim: int,
                     dtype: torch.dtype, device: torch.device) -> None:
    """The keys ``(B, H, T, head_dim)`` a cache holds fit the layer's new ones."""
    if held.dtype != dtype:
        raise TypeError(f"{name} holds {held.dtype} keys but the layer makes {dtype} keys; keep "
                        "one dtype for a whole decoding run (reset() the cache after converting "
                        "the model)")
    if held.device != device:
        raise ValueError(f"{name} holds keys on {held.device} but the layer runs on {device}; "
                         "keep one device for a whole decoding run (reset() the cache after "
                         "moving the model)")
    if (held.shape[0], held.shape[1], held.shape[3]) != (batch, heads, head_dim):
        raise ValueError(f"{name} holds (B, H, head_dim)=({held.shape[0]}, {held.shape[1]}, "
                         f"{held.shape[3]}) but the new keys have ({batch}, {heads}, "
                         f"{head_dim}); use one cache per layer and per batch (reset() it "
                         "between batches)")


def check_caches(caches: object, n_layers: int, **fits: object) -> int:
    """Check one :class:`KVCache` per layer (from ``new_caches()``); return ``T_cache`` (Chapter 8).

    A model's door calls it once per forward: a list of ``n_layers`` caches that all
    hold the same length, each fitting the new keys (``fits``: the keyword arguments
    of :func:`check_cache`, without ``name``).
    """
    return _check_per_layer(caches, "caches", n_layers, check_cache, "KVCache", "new_caches()",
                            fits)


def check_cross_caches(cross_caches: object, n_layers: int, **fits: object) -> int:
    """Check one :class:`CrossKVCache` per layer; return the ``T_s`` they hold (Chapter 8).

    A decoder's door calls it once per forward: ``n_layers`` caches (from
    ``new_cross_caches()``), all empty (the first step fills them) or all holding the
    memory's keys (``fits``: the keyword arguments of :func:`check_cross_cache`).
    """
    return _check_per_layer(cross_caches, "cross_caches", n_layers, check_cross_cache,
                            "CrossKVCache", "new_cross_caches()", fits)


def _check_per_layer(caches: object, name: str, n_layers: int, check_one: Any, kind: str,
                     maker: str, fits: dict[str, object]) -> int:
    """A list of ``n_layers`` caches of one kind, each checked, all of one length."""
    if not isinstance(caches, list | tuple):
        raise TypeError(f"{name} must be a list of {n_layers} {kind} (one per layer, see "
                        f"{maker}), got {type(caches).__name__}")
    if len(caches) != n_layers:
        raise ValueError(f"{name} must be a list of {n_layers} {kind} (one per layer, see "
                         f"{maker}), got {len(caches)}")
    for i, cache in enumerate(caches):
        check_one(cache, f"{name}[{i}]", **fits)
    lengths = {cache.length for cache in caches}
    if len(lengths) != 1:
        raise ValueError(f"the {name} of the layers hold different lengths {sorted(lengths)}; "
                         f"create them together with {maker}")
    return lengths.pop()
