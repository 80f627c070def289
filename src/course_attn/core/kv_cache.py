"""Chapter 8: the KV cache, and what every cache of the course has in common.

Decoding one token at a time, an attention layer projects only the new token
and appends its key and value to a :class:`KVCache`; the new query then attends
to every cached key. Chapter 10 has three more kinds of decoding memory
(``RollingKVCache``, ``LatentKVCache``, ``LinearAttentionState``); all four follow
the :class:`Cache` protocol, which is what generation needs of them.

``KVCache.update`` runs inside a model at every step, so it checks nothing: the
model's door (:func:`check_caches`, once per forward) and a standalone layer's
door (:func:`check_cache`) check that a cache fits before any work is done.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from .._validation import check_positive_int

__all__ = ["Cache", "KVCache", "check_cache", "check_caches", "new_caches"]


@runtime_checkable
class Cache(Protocol):
    """What generation needs of a layer's decoding memory (Chapters 8 and 10).

    ``length`` is the number of positions it has seen, which is where the next
    token's position starts; ``reset()`` forgets them all. Each kind adds its own
    ``update``: keys and values for :class:`KVCache` and ``RollingKVCache``, latents
    for ``LatentKVCache``; ``LinearAttentionState`` is updated by the recurrence.
    """

    @property
    def length(self) -> int: ...

    def reset(self) -> None: ...


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer (Chapter 8).

    ``k`` and ``v`` are ``(B, H, T_cache, head_dim)``, ``None`` while empty.
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

    def fork(self) -> KVCache:
        """A new cache that starts from this one's keys and values.

        No copy is made: :meth:`update` never edits a tensor in place, so
        appending to either cache leaves the other as it was. Timing one decoding
        step again and again from the same prefix needs exactly this.
        """
        other = KVCache()
        other.k, other.v = self.k, self.v
        return other

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k, v (B, H, T_new, head_dim)``; return all keys and values so far.

        Checks nothing (it runs in every layer at every step): :func:`check_cache`
        is the check, made once by the layer or model that owns the cache.
        """
        if self.k is not None and self.v is not None:
            k = torch.cat([self.k, k], dim=2)  # (B, H, T_cache + T_new, head_dim)
            v = torch.cat([self.v, v], dim=2)  # (B, H, T_cache + T_new, head_dim)
        self.k, self.v = k, v
        return k, v


def new_caches(n_layers: int) -> list[KVCache]:
    """One empty :class:`KVCache` per layer of a stack, for incremental decoding (Chapter 8)."""
    check_positive_int(n_layers, "n_layers")
    return [KVCache() for _ in range(n_layers)]


def check_cache(cache: object, name: str, *, batch: int, heads: int, head_dim: int,
                dtype: torch.dtype, device: torch.device) -> KVCache:
    """Check that ``cache`` is a :class:`KVCache` new keys ``(B, H, T, head_dim)`` fit (Chapter 8).

    A cached dtype or device other than the new keys' would otherwise promote the
    whole cache (float64) or fail inside ``torch.cat``; another ``B``, ``H`` or
    ``head_dim`` means the cache belongs to another layer or batch.
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"{name} must be a KVCache, got {type(cache).__name__}")
    if cache.k is None:
        return cache
    held = cache.k
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
    return cache


def check_caches(caches: object, n_layers: int, **fits: object) -> int:
    """Check one :class:`KVCache` per layer (from ``new_caches()``); return ``T_cache`` (Chapter 8).

    A model's door calls it once per forward: a list of ``n_layers`` caches that all
    hold the same length, each fitting the new keys (``fits``: the keyword arguments
    of :func:`check_cache`, without ``name``).
    """
    if not isinstance(caches, list | tuple):
        raise TypeError(f"caches must be a list of {n_layers} KVCache (one per layer, see "
                        f"new_caches()), got {type(caches).__name__}")
    if len(caches) != n_layers:
        raise ValueError(f"caches must be a list of {n_layers} KVCache (one per layer, see "
                         f"new_caches()), got {len(caches)}")
    for i, cache in enumerate(caches):
        check_cache(cache, f"caches[{i}]", **fits)  # type: ignore[arg-type]
    lengths = {cache.length for cache in caches}
    if len(lengths) != 1:
        raise ValueError(f"the caches of the layers hold different lengths {sorted(lengths)}; "
                         "create them together with new_caches()")
    return lengths.pop()
