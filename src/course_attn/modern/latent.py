"""Modern attention: multi-head latent attention (MLA, DeepSeek-V2, DeepSeek-AI 2024).

Multi-head attention caches ``2 * n_heads * head_dim`` numbers per token and
layer. MLA caches one small *latent* vector instead,
``c_kv = kv_down(x)`` of width ``d_latent``, and rebuilds every head's key and
value from it with per-head up-projections: ``k_h = W_uk,h c_kv``,
``v_h = W_uv,h c_kv``.

Rebuilding the keys at every step would cost what the cache saved, so the
up-projections are *absorbed*: a score is
``q_h . (W_uk,h c) = (W_uk,h^T q_h) . c``, so the query is mapped into the
latent space once and compared with the cached latents directly; likewise
``out_proj`` applied to ``sum_j w_j W_uv,h c_j`` is
``(W_o,h W_uv,h) (sum_j w_j c_j)``, so ``W_uv`` folds into the output
projection. Both forwards are here (``absorb=False`` / ``True``) and the tests
prove them equal.

**Decoupled RoPE** (``d_rope > 0``, as DeepSeek-V2): a rotated key cannot be
absorbed (the rotation between ``W_uk`` and the query depends on the position),
so RoPE goes into ``d_rope`` extra dimensions: each head gets a rotated query
part ``q_rope``, all heads share one rotated key part ``k_rope`` (cached beside
the latent), and the score is ``q_h . k_h + q_rope,h . k_rope``. With
``d_rope = 0`` the layer has no position information of its own.

Left out, to keep the layer readable: DeepSeek's low-rank query compression
and the RMSNorm on the latent (neither changes the cache or the absorption).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from .._validation import (
    check_bool,
    check_choice,
    check_nonnegative_int,
    check_on_device,
    check_positive_int,
    check_positive_real,
    check_sequence,
    check_tensor,
)
from ..core.attention import ATTENTION_IMPLS, attention
from ..core.layers import merge_heads, split_heads
from ..core.masks import combine_masks
from .rope import ROPE_BASE, apply_rope

__all__ = ["LatentKVCache", "MultiHeadLatentAttention"]


class LatentKVCache:
    """The cache of one MLA layer: only the latents ``c (B, T_cache, d_latent)`` (Chapter 10).

    With decoupled RoPE it also keeps the shared rotated keys
    ``k_rope (B, T_cache, d_rope)``; without, ``k_rope`` stays ``None``.
    Same use as ``layers.KVCache``: :meth:`update` appends and returns
    everything cached so far.
    """

    def __init__(self) -> None:
        self.c: Tensor | None = None
        self.k_rope: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached positions ``T_cache``."""
        return 0 if self.c is None else self.c.shape[1]

    def reset(self) -> None:
        """Forget every cached position."""
        self.c = self.k_rope = None

    def update(self, c: Tensor, k_rope: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Append ``c (B, T_new, d_latent)`` (and ``k_rope (B, T_new, d_rope)``); return all."""
        check_tensor(c, "c", ndim=3)
        if k_rope is not None:
            check_tensor(k_rope, "k_rope", ndim=3)
            if k_rope.shape[:2] != c.shape[:2] or k_rope.dtype != c.dtype:
                raise ValueError(f"k_rope must be (B, T_new, d_rope) with c's (B, T_new)="
                                 f"{tuple(c.shape[:2])} and dtype {c.dtype}, got "
                                 f"{tuple(k_rope.shape)} {k_rope.dtype}")
        if self.c is not None:
            if c.dtype != self.c.dtype:
                raise TypeError(f"the cache holds {self.c.dtype} latents but the new c is "
                                f"{c.dtype}; keep one dtype for a whole decoding run")
            if c.device != self.c.device:
                raise ValueError(f"the cache holds latents on {self.c.device} but the new c is "
                                 f"on {c.device}; keep one device for a whole decoding run")
            if (c.shape[0], c.shape[2]) != (self.c.shape[0], self.c.shape[2]):
                raise ValueError(f"the cache holds (B, d_latent)=({self.c.shape[0]}, "
                                 f"{self.c.shape[2]}) but the new c has ({c.shape[0]}, "
                                 f"{c.shape[2]}); use one cache per layer and per batch")
            if (k_rope is None) != (self.k_rope is None):
                raise ValueError("k_rope must be given at every step or at none")
            c = torch.cat([self.c, c], dim=1)  # (B, T_cache + T_new, d_latent)
            if k_rope is not None and self.k_rope is not None:
                k_rope = torch.cat([self.k_rope, k_rope], dim=1)  # (B, T_cache + T_new, d_rope)
        self.c, self.k_rope = c, k_rope
        return c, k_rope


class MultiHeadLatentAttention(nn.Module):
    """Causal self-attention whose cache holds a ``d_latent``-wide latent per token (Chapter 10).

    Args:
        d_model: model width ``D``.
        n_heads: number of heads ``H``.
        d_latent: width of the cached latent ``c_kv`` (DeepSeek-V2: 512 for
            ``H * head_dim = 16384``).
        head_dim: width of each head's query/key/value; default ``D / H``.
        d_rope: width of the decoupled RoPE part (even; 0 = none).
        rope_base: RoPE's base.
        bias: bias of ``q_proj``, ``kv_down`` and ``out_proj``. The up-projections
            never have one: it would not fold into the absorbed form.
        impl: ``"manual"`` or ``"sdpa"``, as in ``attention``.

    Modules: ``q_proj (D -> H*head_dim)``, ``kv_down (D -> d_latent)``,
    ``k_up``/``v_up (d_latent -> H*head_dim)``, ``out_proj (H*head_dim -> D)``,
    and with ``d_rope``: ``q_rope_proj (D -> H*d_rope)``, ``k_rope_proj (D -> d_rope)``.
    Scores are scaled by ``1 / sqrt(head_dim + d_rope)``, the width of a score's
    dot product.
    """

    def __init__(self, d_model: int, n_heads: int, d_latent: int, *,
                 head_dim: int | None = None, d_rope: int = 0, rope_base: float = ROPE_BASE,
                 bias: bool = False, impl: str = "manual") -> None:
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        n_heads = check_positive_int(n_heads, "n_heads")
        d_latent = check_positive_int(d_latent, "d_latent")
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} "
                                 "when head_dim is not given")
            head_dim = d_model // n_heads
        head_dim = check_positive_int(head_dim, "head_dim")
        d_rope = check_nonnegative_int(d_rope, "d_rope")
        if d_rope % 2:
            raise ValueError(f"d_rope must be even (RoPE rotates pairs of features), got {d_rope}")
        self.rope_base = check_positive_real(rope_base, "rope_base")
        check_bool(bias, "bias")
        self.impl = check_choice(impl, "impl", ATTENTION_IMPLS)
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.d_latent, self.d_rope = d_latent, d_rope
        width = n_heads * head_dim
        self.q_proj = nn.Linear(d_model, width, bias=bias)
        self.kv_down = nn.Linear(d_model, d_latent, bias=bias)
        self.k_up = nn.Linear(d_latent, width, bias=False)
        self.v_up = nn.Linear(d_latent, width, bias=False)
        self.out_proj = nn.Linear(width, d_model, bias=bias)
        self.q_rope_proj = nn.Linear(d_model, n_heads * d_rope, bias=False) if d_rope else None
        self.k_rope_proj = nn.Linear(d_model, d_rope, bias=False) if d_rope else None

    def absorbed_weights(self) -> tuple[Tensor, Tensor | None, Tensor]:
        """The projections with ``W_uk`` and ``W_uv`` folded in (computed, not stored).

        Returns ``(w_q (H, d_latent, D), b_q (H, d_latent) or None, w_out (D, H, d_latent))``:
        ``q_latent_h = w_q[h] x + b_q[h]`` is ``W_uk,h^T q_h``, and
        ``out = sum_h w_out[:, h] o_h + out_proj.bias`` for latent head outputs ``o_h``.
        A deployed model computes them once; they are recomputed here so that
        training the un-absorbed parameters keeps them in step.
        """
        H, hd, L, D = self.n_heads, self.head_dim, self.d_latent, self.d_model
        w_uk = self.k_up.weight.view(H, hd, L)  # (H*hd, L) -> (H, hd, L)
        w_uv = self.v_up.weight.view(H, hd, L)  # (H*hd, L) -> (H, hd, L)
        w_q = self.q_proj.weight.view(H, hd, D)  # (H*hd, D) -> (H, hd, D)
        w_q_latent = torch.einsum("hel,hed->hld", w_uk, w_q)  # W_uk,h^T W_q,h: (H, L, D)
        b_q_latent = None
        if self.q_proj.bias is not None:
            b_q = self.q_proj.bias.view(H, hd)  # (H*hd,) -> (H, hd)
            b_q_latent = torch.einsum("hel,he->hl", w_uk, b_q)  # (H, L)
        w_o = self.out_proj.weight.view(D, H, hd)  # (D, H*hd) -> (D, H, hd)
        w_out_latent = torch.einsum("dhe,hel->dhl", w_o, w_uv)  # W_o,h W_uv,h: (D, H, L)
        return w_q_latent, b_q_latent, w_out_latent

    def _door(self, x: object, attention_mask: object, mask: object, is_causal: object,
              cache: object, positions: object, absorb: object
              ) -> tuple[Tensor | None, Tensor | None]:
        """Check :meth:`forward`'s arguments; return its mask (combined) and positions."""
        x = self._check_input(x)
        if cache is not None and not isinstance(cache, LatentKVCache):
            raise TypeError(f"cache must be a LatentKVCache or None, got {type(cache).__name__}")
        check_bool(is_causal, "is_causal")
        check_bool(absorb, "absorb")
        past = 0 if cache is None else cache.length
        batch, time, _ = x.shape
        if isinstance(attention_mask, Tensor) and attention_mask.shape[:1] != (batch,):
            raise ValueError(f"attention_mask must have shape (B, T_k) with B={batch}, got "
                             f"{tuple(attention_mask.shape)}")
        if isinstance(mask, Tensor) and mask.dim() == 3 and mask.shape[0] not in (1, batch):
            raise ValueError(f"mask must have shape (T_q, T_k) or (B, T_q, T_k) with "
                             f"B={batch}, got {tuple(mask.shape)}")
        for name, value in (("attention_mask", attention_mask), ("mask", mask)):
            if isinstance(value, Tensor):
                check_on_device(value, name, x.device, "x")
        combined = combine_masks(time, past + time, mask=mask,  # type: ignore[arg-type]
                                 attention_mask=attention_mask,  # type: ignore[arg-type]
                                 device=x.device)
        return combined, self._positions(positions, x, past)

    def _check_input(self, x: object) -> Tensor:
        return check_sequence(x, "x", width=self.d_model, dtype=self.q_proj.weight.dtype)

    def _positions(self, positions: object, x: Tensor, past: int) -> Tensor | None:
        if not self.d_rope:
            if positions is not None:
                raise ValueError("positions are only used with decoupled RoPE (d_rope > 0); "
                                 "this layer has d_rope=0")
            return None
        if positions is None:
            return torch.arange(past, past + x.shape[1], device=x.device)  # (T,)
        if not isinstance(positions, Tensor) or positions.dtype != torch.long:
            raise TypeError(f"positions must be a torch.long tensor (T,) or (B, T), got "
                            f"{positions!r}")
        if positions.shape not in (x.shape[1:2], x.shape[:2]):
            raise ValueError(f"positions must have shape (T,)={tuple(x.shape[1:2])} or (B, T)="
                             f"{tuple(x.shape[:2])}, got {tuple(positions.shape)}")
        return check_on_device(positions, "positions", x.device, "x")

    def forward(
        self,
        x: Tensor,
        *,
        attention_mask: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        cache: LatentKVCache | None = None,
        positions: Tensor | None = None,
        absorb: bool = False,
    ) -> tuple[Tensor, None]:
        """Self-attention of ``x (B, T, D)``; returns ``(out (B, T, D), None)``.

        The pair matches every attention module of the package; the weights are
        never returned here (the absorbed path does not form the per-head keys).

        Masks as in ``MultiHeadAttention``: ``attention_mask (B, T_k)`` is
        ``True`` on real keys (with a ``cache`` it covers every cached and new
        position), ``mask`` bool ``(T_q, T_k)`` or ``(B, T_q, T_k)``,
        ``is_causal`` adds ``causal_mask(T_q, T_k)`` (bottom-right aligned).
        ``positions`` (``(T,)`` or ``(B, T)`` long, only with ``d_rope > 0``)
        default to ``T_cache .. T_cache + T - 1``; pass
        ``positions_from_attention_mask`` rows for left padding.
        ``absorb=True`` attends in the latent space with the folded projections.
        """
        # Every check before any work: a bad argument must not leave the cache half-updated.
        mask, positions = self._door(x, attention_mask, mask, is_causal, cache, positions,
                                     absorb)
        batch = x.shape[0]

        c = self.kv_down(x)  # (B, T, D) -> (B, T, d_latent)
        q_rope = k_rope = None
        if self.q_rope_proj is not None and self.k_rope_proj is not None:
            assert positions is not None  # _positions gives them whenever d_rope > 0
            q_positions = positions if positions.dim() == 1 else positions[:, None, :]
            q_rope = split_heads(self.q_rope_proj(x), self.n_heads)  # (B, H, T, d_rope)
            q_rope = apply_rope(q_rope, q_positions, base=self.rope_base)
            k_rope = apply_rope(self.k_rope_proj(x), positions,
                                base=self.rope_base)  # (B, T, d_rope), shared by the heads
        if cache is not None:
            c, k_rope = cache.update(c, k_rope)  # (B, T_k, d_latent), (B, T_k, d_rope)
        t_k = c.shape[1]
        scale = 1.0 / math.sqrt(self.head_dim + self.d_rope)
        if absorb:
            return self._absorbed(x, c, q_rope, k_rope, mask, is_causal, scale), None

        q = split_heads(self.q_proj(x), self.n_heads)  # (B, T, H*hd) -> (B, H, T, hd)
        k = split_heads(self.k_up(c), self.n_heads)  # (B, T_k, L) -> (B, H, T_k, hd)
        v = split_heads(self.v_up(c), self.n_heads)  # (B, T_k, L) -> (B, H, T_k, hd)
        if q_rope is not None and k_rope is not None:
            shared = k_rope[:, None].expand(batch, self.n_heads, t_k, self.d_rope)
            q = torch.cat([q, q_rope], dim=-1)  # (B, H, T, hd + d_rope)
            k = torch.cat([k, shared], dim=-1)  # (B, H, T_k, hd + d_rope)
        out, _ = attention(q, k, v, mask, is_causal=is_causal, scale=scale, impl=self.impl)
        return self.out_proj(merge_heads(out)), None  # (B, H, T, hd) -> (B, T, D)

    def _absorbed(self, x: Tensor, c: Tensor, q_rope: Tensor | None, k_rope: Tensor | None,
                  mask: Tensor | None, is_causal: bool, scale: float) -> Tensor:
        """Attention in the latent space: queries meet the cached latents directly."""
        batch, t_k = c.shape[0], c.shape[1]
        w_q, b_q, w_out = self.absorbed_weights()
        q = torch.einsum("btd,hld->bhtl", x, w_q)  # W_uk,h^T q_h: (B, H, T, d_latent)
        if b_q is not None:
            q = q + b_q[:, None, :]  # (H, 1, d_latent) broadcast over B and T
        latents = c[:, None].expand(batch, self.n_heads, t_k, self.d_latent)  # (B, H, T_k, L)
        keys = latents
        if q_rope is not None and k_rope is not None:
            shared = k_rope[:, None].expand(batch, self.n_heads, t_k, self.d_rope)
            q = torch.cat([q, q_rope], dim=-1)  # (B, H, T, d_latent + d_rope)
            keys = torch.cat([latents, shared], dim=-1)  # (B, H, T_k, d_latent + d_rope)
        # The values are the latents too: sum_j w_j c_j, mapped out by w_out below.
        out, _ = attention(q, keys, latents, mask, is_causal=is_causal, scale=scale,
                           impl=self.impl)  # (B, H, T, d_latent)
        out = torch.einsum("bhtl,dhl->btd", out, w_out)  # sum over heads: (B, T, D)
        if self.out_proj.bias is not None:
            out = out + self.out_proj.bias
        return out
