"""Chapters 8 and 11: decoding one token at a time, with a KV cache.

One home for what every autoregressive model here shares: the cache of keys
and values (:class:`KVCache`, one per attention layer), the loop that appends
tokens (:func:`decode`) and the choice of the next token (:func:`pick_next`).
``MiniGPT.generate`` and ``EncoderDecoder.greedy_decode`` are both this loop
around their own forward pass. :func:`decode` and :func:`pick_next` are such
building blocks: they check nothing, because their callers have checked
every argument at their own boundary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .._validation import check_positive_int, check_tensor, values_checkable

__all__ = ["KVCache", "check_caches", "decode", "new_caches", "pick_next"]


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer (Chapter 8).

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
        if self.k is not None and self.v is not None:
            self._check_matches(k)
            k = torch.cat([self.k, k], dim=2)  # (B, H, T_cache + T_new, head_dim)
            v = torch.cat([self.v, v], dim=2)  # (B, H, T_cache + T_new, head_dim)
        self.k, self.v = k, v
        return k, v

    def _check_matches(self, k: Tensor) -> None:
        cached = self.k
        assert cached is not None
        if k.dtype != cached.dtype:
            raise TypeError(f"the cache holds {cached.dtype} keys but the new k is {k.dtype}; "
                            "keep one dtype for a whole decoding run (reset() the cache "
                            "after converting the model)")
        if k.device != cached.device:
            raise ValueError(f"the cache holds keys on {cached.device} but the new k is on "
                             f"{k.device}; keep one device for a whole decoding run "
                             "(reset() the cache after moving the model)")
        old, new = cached.shape, k.shape
        if (new[0], new[1], new[3]) != (old[0], old[1], old[3]):
            raise ValueError(
                f"the cache holds (B, H, head_dim)=({old[0]}, {old[1]}, {old[3]}) "
                f"but the new keys have ({new[0]}, {new[1]}, {new[3]}); "
                "use one cache per layer and per batch (reset() it between batches)"
            )


def new_caches(n_layers: int) -> list[KVCache]:
    """One empty :class:`KVCache` per layer of a stack, for incremental decoding."""
    check_positive_int(n_layers, "n_layers")
    return [KVCache() for _ in range(n_layers)]


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


#: ``step(tokens (B, T_in), attention_mask (B, T_cache + T_in), caches or None)``
#: returns the logits ``(B, T_in, V)`` of the newest tokens.
Step = Callable[[Tensor, Tensor, "list[KVCache] | None"], Tensor]


def decode(step: Step, tokens: Tensor, attention_mask: Tensor, max_new_tokens: int,
           pick: Callable[[Tensor], Tensor], *, n_layers: int | None,
           context: int | None = None) -> Tensor:
    """Append ``max_new_tokens`` tokens to ``tokens (B, T)``, one model step per token.

    With a cache (``n_layers`` given) the first step runs the whole prompt and
    fills one cache per layer (prefill); every later step feeds only the newest
    token, whose keys and values join the cache. Without one, each step runs
    the whole sequence again. ``context`` (a model's ``block_size``) crops the
    input to the last ``context`` tokens once the sequence outgrows it; cached
    keys would then carry stale positions, so from there on no cache is used.
    ``attention_mask (B, T)`` marks real tokens (left padding); ``pick`` turns
    the last position's logits ``(B, V)`` into the next ids ``(B, 1)``.

    Callers validate their arguments first: this loop checks nothing.
    """
    caches: list[KVCache] | None = None
    for _ in range(max_new_tokens):
        fits = context is None or tokens.shape[1] <= context
        if n_layers is not None and fits and caches is not None:
            logits = step(tokens[:, -1:], attention_mask, caches)  # (B, 1, V)
        elif n_layers is not None and fits:
            caches = new_caches(n_layers)  # prefill: the whole prompt, once
            logits = step(tokens, attention_mask, caches)  # (B, T, V)
        else:
            caches = None  # cropped context: positions shift, recompute it all
            crop = slice(None) if context is None else slice(-context, None)
            logits = step(tokens[:, crop], attention_mask[:, crop], None)  # (B, T, V)
        next_id = pick(logits[:, -1, :])  # (B, V) -> (B, 1)
        tokens = torch.cat([tokens, next_id], dim=1)  # (B, T + 1)
        attention_mask = torch.cat([attention_mask, torch.ones_like(next_id, dtype=torch.bool)],
                                   dim=1)  # (B, T + 1)
    return tokens


def pick_next(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
              generator: torch.Generator | None = None) -> Tensor:
    """Choose the next token from ``logits (B, V)``: argmax, or a tempered top-k sample.

    ``temperature=0`` is greedy decoding. Callers validate the arguments.
    """
    if values_checkable(logits) and (logits.isnan() | logits.isposinf()).any():
        raise ValueError("the model produced NaN or +inf logits, so there is nothing to "
                         "sample from: its weights or inputs are not finite (a diverged "
                         "training run?)")
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    logits = logits.float()  # (B, V)
    scaled = logits / temperature  # (B, V)
    # A tiny temperature overflows the division (1.0 / 1e-45 = inf, and softmax
    # of inf is NaN). Such rows take softmax()'s route: shift by the row maximum
    # first (every entry <= 0, the best ones 0), then divide by a temperature
    # clamped to float32's smallest normal number. Other rows keep the plain
    # division, bit for bit. torch.where decides per row without a host sync.
    info = torch.finfo(torch.float32)
    shifted = (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, info.tiny)
    overflowed = ~scaled.amax(dim=-1, keepdim=True).isfinite()  # (B, 1)
    logits = torch.where(overflowed, shifted, scaled)  # (B, V)
    if top_k is not None:
        kth_best = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    device = logits.device if generator is None else generator.device
    next_id = torch.multinomial(probs.to(device), 1, generator=generator)  # (B, 1)
    return next_id.to(logits.device)
