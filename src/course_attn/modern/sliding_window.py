"""Modern attention: sliding-window attention and its rolling-buffer KV cache.

Each query sees only the last ``window`` positions, itself included (Longformer,
Mistral 7B, Gemma's local layers): query ``i`` may attend key ``j`` when
``i - window < j <= i``. A stack of ``L`` such layers still carries
information ``L * (window - 1)`` positions back, one window per layer.

The payoff is the cache: decoding never needs a key older than ``window``
positions, so :class:`RollingKVCache` keeps ``window`` slots and writes the key
of position ``p`` into slot ``p % window``, over the one that just left the
window. Its memory stops growing at ``window`` tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import (
    check_bool_mask,
    check_device,
    check_positive_int,
    check_tensor,
    explain_out_of_memory,
    moved_to,
)
from ..core.attention import attention

__all__ = ["RollingKVCache", "sliding_window_attention", "sliding_window_mask"]


def sliding_window_mask(t_q: int, t_k: int | None = None, *, window: int,
                        device: torch.device | str | None = None) -> Tensor:
    """Bool mask ``(t_q, t_k)``: query ``i`` may attend ``j`` if ``i - window < j <= i`` (Ch. 10).

    Causal and bottom-right aligned like ``causal_mask``: when ``t_q < t_k`` the
    queries are the last ``t_q`` positions (decoding with a cache), query ``i``
    sitting at position ``i + t_k - t_q``. ``window=1`` lets each query see only
    itself; ``window >= t_k`` gives back ``causal_mask(t_q, t_k)``.
    """
    t_q = check_positive_int(t_q, "t_q")
    t_k = t_q if t_k is None else check_positive_int(t_k, "t_k")
    window = check_positive_int(window, "window")
    device = check_device(device, "device", exists=True)
    query_pos = torch.arange(t_q, device=device).unsqueeze(1) + (t_k - t_q)  # (t_q, 1)
    key_pos = torch.arange(t_k, device=device).unsqueeze(0)  # (1, t_k)
    with explain_out_of_memory(f"sliding_window_mask(t_q={t_q}, t_k={t_k})", t_q * t_k):
        return (key_pos <= query_pos) & (key_pos > query_pos - window)  # (t_q, t_k)


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    window: int,
    scale: float | None = None,
    dropout_p: float = 0.0,
    impl: str = "manual",
) -> tuple[Tensor, Tensor | None]:
    """``attention`` with ``sliding_window_mask(T_q, T_k, window)`` ANDed into ``mask`` (Ch. 10).

    Shapes and the other arguments as in ``attention``: ``q (..., T_q, d_k)``,
    ``k (..., T_k, d_k)``, ``v (..., T_k, d_v)``; ``mask`` boolean broadcastable
    to ``(..., T_q, T_k)`` (e.g. key padding ``(B, 1, 1, T_k)``). The window is
    causal, so no separate ``is_causal`` is needed. Returns ``(out, attn_weights
    or None)``.
    """
    check_tensor(q, "q", min_ndim=2)
    check_tensor(k, "k", min_ndim=2)
    window_mask = sliding_window_mask(q.shape[-2], k.shape[-2], window=window,
                                      device=q.device)  # (T_q, T_k)
    if mask is not None:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        check_bool_mask(mask, "mask", (*batch, q.shape[-2], k.shape[-2]))
        window_mask = moved_to(mask, "mask", q.device, "q") & window_mask  # (..., T_q, T_k)
    return attention(q, k, v, window_mask, scale=scale, dropout_p=dropout_p, impl=impl)


class RollingKVCache:
    """A KV cache of ``window`` slots: Mistral's rolling buffer (Chapter 10).

    Same use as ``layers.KVCache``: a layer projects only the new tokens, calls
    :meth:`update` with their keys and values ``(B, H, T_new, head_dim)`` and
    attends to what it returns. The difference is what it keeps: the key of
    position ``p`` lives in slot ``p % window``, so once ``window`` tokens have
    been seen every new one overwrites the oldest, and the memory stays at
    ``window`` tokens however long the decoding runs.

    :meth:`update` returns the keys the new queries may need in *chronological*
    order: the last ``min(length, window - 1)`` cached positions followed by the
    new ones. They are the last ``T_k = k.shape[2]`` positions of the sequence,
    so the mask is ``sliding_window_mask(T_new, T_k, window=window)`` and a
    padding mask ``(B, seen)`` over every position so far is sliced to its last
    ``T_k`` columns. With RoPE, rotate the keys (at positions ``seen, seen+1,
    ...``) *before* caching them: a cached key keeps its rotation.

    ``k`` and ``v`` are the buffers ``(B, H, length, head_dim)`` in slot order.
    """

    def __init__(self, window: int) -> None:
        self.window = check_positive_int(window, "window")
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.seen = 0  # positions seen so far: the position of the next token

    @property
    def length(self) -> int:
        """Number of cached positions, ``min(seen, window)``."""
        return 0 if self.k is None else self.k.shape[2]

    def reset(self) -> None:
        """Forget every cached position (and start counting positions at 0 again)."""
        self.k = self.v = None
        self.seen = 0

    def _check(self, k: object, v: object) -> None:
        k = check_tensor(k, "k", ndim=4)
        v = check_tensor(v, "v", ndim=4)
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k and v must have the same (B, H, T_new), got {tuple(k.shape)} "
                             f"and {tuple(v.shape)}")
        if k.shape[2] == 0:
            raise ValueError(f"k must hold at least one new position, got shape "
                             f"{tuple(k.shape)}")
        if k.dtype != v.dtype:
            raise TypeError(f"k and v must share a dtype, got {k.dtype} and {v.dtype}")
        if k.device != v.device:
            raise ValueError(f"k and v must be on one device, got {k.device} and {v.device}")
        if self.k is None or self.v is None:
            return
        if k.dtype != self.k.dtype:
            raise TypeError(f"the cache holds {self.k.dtype} keys but the new k is {k.dtype}; "
                            "keep one dtype for a whole decoding run (reset() the cache after "
                            "converting the model)")
        if k.device != self.k.device:
            raise ValueError(f"the cache holds keys on {self.k.device} but the new k is on "
                             f"{k.device}; keep one device for a whole decoding run (reset() "
                             "the cache after moving the model)")
        expected = (self.k.shape[0], self.k.shape[1], self.k.shape[3], self.v.shape[3])
        got = (k.shape[0], k.shape[1], k.shape[3], v.shape[3])
        if got != expected:
            raise ValueError(f"the cache holds (B, H, d_k, d_v)={expected} but the new k and v "
                             f"have {got}; use one cache per layer and per batch (reset() it "
                             "between batches)")

    def _chronological(self, buffer: Tensor) -> Tensor:
        """The buffer oldest-first: once full, the oldest position sits in slot ``seen % W``."""
        if self.length < self.window:
            return buffer  # still filling: slot p holds position p
        return buffer.roll(-(self.seen % self.window), dims=2)  # (B, H, W, head_dim)

    def _store(self, buffer: Tensor | None, new: Tensor) -> Tensor:
        """Write the new positions ``seen ..`` into their slots ``p % window``."""
        total = self.seen + new.shape[2]
        held = 0 if buffer is None else buffer.shape[2]
        if held < self.window:  # fill the free slots in order (slot p = position p)
            fill = min(self.window - held, new.shape[2])
            head = new[:, :, :fill]
            buffer = head.clone() if buffer is None else torch.cat([buffer, head], dim=2)
            new = new[:, :, fill:]
            if new.shape[2] == 0:
                return buffer  # (B, H, min(total, W), head_dim)
        new = new[:, :, -self.window:]  # only the last W positions can still be needed
        slots = torch.arange(total - new.shape[2], total, device=new.device) % self.window
        # In place: the slots of the positions that left the window are overwritten.
        assert buffer is not None  # filled above: held == window here
        return buffer.index_copy_(2, slots, new)  # (B, H, W, head_dim)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k (B, H, T_new, d_k)``, ``v (B, H, T_new, d_v)``; return what the queries need.

        Returns ``(keys, values)``, each ``(B, H, keep + T_new, d)`` oldest-first,
        ``keep = min(length, window - 1)`` cached positions before the new ones.
        Reads no tensor values: the slots follow from the Python count ``seen``.
        """
        self._check(k, v)
        keep = min(self.length, self.window - 1)
        if keep:
            assert self.k is not None and self.v is not None  # keep > 0: something is cached
            old_k = self._chronological(self.k)[:, :, self.length - keep:]  # (B, H, keep, d_k)
            old_v = self._chronological(self.v)[:, :, self.length - keep:]  # (B, H, keep, d_v)
            keys = torch.cat([old_k, k], dim=2)  # (B, H, keep + T_new, d_k)
            values = torch.cat([old_v, v], dim=2)  # (B, H, keep + T_new, d_v)
        else:
            keys, values = k, v
        self.k = self._store(self.k, k)
        self.v = self._store(self.v, v)
        self.seen += k.shape[2]
        return keys, values
