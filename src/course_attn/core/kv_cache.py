"""Chapter 8: the KV cache, and what every cache of the course has in common.

Decoding one token at a time, an attention layer projects only the new token
and appends its key and value to a :class:`KVCache`; the new query then attends
to every cached key. A decoder's cross-attention reads the encoder output, which
does not change while the decoder writes: its keys and values are projected once,
at the first step, into a :class:`CrossKVCache` (the static cross-attention cache)
and reused as they are at every later step. Chapter 10 has three more kinds of
decoding memory (``RollingKVCache``, ``LatentKVCache``, ``LinearAttentionState``);
all five follow the :class:`Cache` protocol, which is what generation needs of them.

``update`` runs inside a model at every step, so it checks nothing: the model's
door and a standalone layer's door check that a cache fits, once, before any work
is done (``check_caches``, ``check_cache`` and their cross-attention twins in
``course_attn.core.checks``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from .._validation import check_positive_int

__all__ = ["Cache", "CrossKVCache", "KVCache", "new_caches"]


@runtime_checkable
class Cache(Protocol):
    """What generation needs of a layer's decoding memory (Chapters 8 and 10).

    ``length`` is the number of positions it has seen, which is where the next
    token's position starts (a :class:`CrossKVCache` sees the encoder output's
    ``T_s`` positions, all at the first step); ``reset()`` forgets them all. Each
    kind adds its own ``update``: keys and values for :class:`KVCache`,
    :class:`CrossKVCache` and ``RollingKVCache``, latents for ``LatentKVCache``;
    ``LinearAttentionState`` is updated by the recurrence.
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

        Checks nothing (it runs in every layer at every step): ``check_cache`` is the
        check, made once by the layer or model that owns the cache. Keys that cannot join
        the cached ones (another batch size, another device) are a ``ValueError`` that
        names both, found by ``torch.cat`` itself: the cache is left as it was.
        """
        if self.k is not None and self.v is not None:
            try:
                k_all = torch.cat([self.k, k], dim=2)  # (B, H, T_cache + T_new, head_dim)
                v_all = torch.cat([self.v, v], dim=2)  # (B, H, T_cache + T_new, head_dim)
            except RuntimeError:  # the happy path pays nothing for this message
                raise ValueError(self._misfit(k, v)) from None
            k, v = k_all, v_all
        self.k, self.v = k, v
        return k, v

    def _misfit(self, k: Tensor, v: Tensor) -> str:
        """Why new ``k, v`` do not join the cached keys and values, and what to do."""
        assert self.k is not None and self.v is not None
        held = f"({', '.join(str(n) for n in self.k.shape)}) on {self.k.device}"
        new = f"({', '.join(str(n) for n in k.shape)}) on {k.device}"
        if v.shape[:3] != k.shape[:3] or v.device != k.device:
            new += f" with values ({', '.join(str(n) for n in v.shape)}) on {v.device}"
        return (f"the cache holds keys (B, H, T_cache, head_dim)={held} but the new keys are "
                f"{new}; keep one batch, layer and device per cache (reset() it between "
                "batches, after moving the model)")


class CrossKVCache:
    """The static cross-attention cache: the encoder output's keys and values (Chapter 8).

    One per cross-attention layer of a decoder. The memory (the encoder output
    ``(B, T_s, D)``) is the same at every decoding step, and so are its keys and values;
    the first step projects them (``k_proj``, ``v_proj``) and :meth:`update` keeps them,
    every later step reuses them without projecting anything, as production
    encoder-decoders do. ``k`` and ``v`` are ``(B, H, T_s, head_dim)``, ``None`` while
    empty. A cache belongs to one source batch: ``reset()`` it before another.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of memory positions held, ``T_s`` (0 before the first step)."""
        return 0 if self.k is None else self.k.shape[2]

    def reset(self) -> None:
        """Forget the memory's keys and values (a new source batch)."""
        self.k = self.v = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keep the memory's ``k, v (B, H, T_s, head_dim)``, projected at the first step.

        Called only while the cache is empty (the layer reads ``k`` and ``v`` after
        that, without projecting); checks nothing, like :meth:`KVCache.update`.
        """
        self.k, self.v = k, v
        return k, v


def new_caches(n_layers: int) -> list[KVCache]:
    """One empty :class:`KVCache` per layer of a stack, for incremental decoding (Chapter 8)."""
    check_positive_int(n_layers, "n_layers")
    return [KVCache() for _ in range(n_layers)]
