"""Modern attention: ALiBi, attention with linear biases (Press et al. 2022).

No position is added to the tokens and nothing is rotated: each head ``h``
subtracts ``slope[h] * distance`` from the score of a query and a key
``distance`` positions back, so far keys are penalised linearly, by a
different amount per head. The slopes are a geometric sequence
(``1/2, 1/4, ..., 1/256`` for 8 heads), fixed, not learned.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import (
    check_attention_args,
    check_device,
    check_positive_int,
    check_qkv,
    check_tensor,
    moved_to,
)
from ..core.attention import attention_manual

__all__ = ["alibi_attention", "alibi_bias", "alibi_slopes"]


def _slopes_power_of_two(n_heads: int) -> list[float]:
    # start = 2^(-8 / n_heads), and each slope is start times the one before
    start = 2.0 ** (-(2.0 ** -(math.log2(n_heads) - 3)))
    return [start * start**i for i in range(n_heads)]


def _slopes(n_heads: int) -> list[float]:
    if math.log2(n_heads).is_integer():
        return _slopes_power_of_two(n_heads)
    # Not a power of two (the paper's reference code): the slopes of the closest
    # smaller power of two, then every other slope of the next larger one, which
    # fall between them.
    closest = 2 ** math.floor(math.log2(n_heads))
    return _slopes_power_of_two(closest) + _slopes(2 * closest)[0::2][: n_heads - closest]


def alibi_slopes(n_heads: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """The per-head slopes ``(n_heads,)`` of ALiBi (Chapter 10).

    For a power of two ``n`` they are ``2^(-8/n), 2^(-16/n), ..., 2^(-8)``:
    ``1/2, 1/4, ..., 1/256`` for 8 heads. Other head counts follow the paper's
    reference implementation (see the comment in the code).
    """
    n_heads = check_positive_int(n_heads, "n_heads")
    device = check_device(device, "device", exists=True)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return torch.tensor(_slopes(n_heads), dtype=dtype, device=device)  # (n_heads,)


def alibi_bias(t_q: int, t_k: int, slopes: Tensor) -> Tensor:
    """ALiBi's bias ``(n_heads, t_q, t_k)``: ``-slope[h] * (query pos - key pos)`` (Chapter 10).

    Query ``i`` sits at position ``i + t_k - t_q`` (bottom-right alignment, like
    ``causal_mask``): with a KV cache the new queries are the last positions.
    Keys in the future get a *positive* bias; ALiBi is meant for causal
    attention, where the causal mask blocks them. Left padding shifts a query
    and its keys alike, so the distances between real tokens do not change.
    Made on ``slopes``' device, in its dtype.
    """
    t_q = check_positive_int(t_q, "t_q")
    t_k = check_positive_int(t_k, "t_k")
    check_tensor(slopes, "slopes", ndim=1)
    return _alibi_bias(t_q, t_k, slopes)


def _alibi_bias(t_q: int, t_k: int, slopes: Tensor) -> Tensor:
    """:func:`alibi_bias` without its checks."""
    query_pos = torch.arange(t_q, device=slopes.device).unsqueeze(1) + (t_k - t_q)  # (t_q, 1)
    key_pos = torch.arange(t_k, device=slopes.device).unsqueeze(0)  # (1, t_k)
    distance = (query_pos - key_pos).to(slopes.dtype)  # (t_q, t_k)
    return -slopes[:, None, None] * distance  # (n_heads, 1, 1) * (t_q, t_k) -> (H, t_q, t_k)


def alibi_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention with the ALiBi bias added to the scores (Chapter 10).

    Nothing but chapter 4's manual path given ``bias=alibi_bias(T_q, T_k, slopes)``.

    Args:
        q: ``(..., H, T_q, d_k)``; k: ``(..., H, T_k, d_k)``; v: ``(..., H, T_k, d_v)``.
        slopes: ``(H,)`` from :func:`alibi_slopes`.
        mask: boolean, broadcastable to ``(..., H, T_q, T_k)``, ``True`` = may attend.
        is_causal: also apply ``causal_mask(T_q, T_k)`` (bottom-right aligned).
        scale: multiplies ``q k^T``; ``None`` means ``1 / sqrt(d_k)``.

    Returns:
        ``(out (..., H, T_q, d_v), attn_weights (..., H, T_q, T_k))``. Same
        conventions as ``attention``: a query with no allowed key gets zero
        weights and a zero output; softmax in float32 for half precision.
    """
    q, k, v = check_qkv(q, k, v)
    if q.dim() < 3:
        raise ValueError(f"q must be (..., H, T_q, d_k) with a head axis for the slopes, got "
                         f"shape {tuple(q.shape)}")
    check_tensor(slopes, "slopes", ndim=1)
    if slopes.shape[0] != q.shape[-3]:
        raise ValueError(f"slopes must have one slope per head, (H,)=({q.shape[-3]},), got "
                         f"shape {tuple(slopes.shape)}")
    slopes = moved_to(slopes, "slopes", q.device, "q").to(q.dtype)
    q, k, v, mask, scale, _ = check_attention_args(q, k, v, mask, is_causal=is_causal, scale=scale)
    bias = alibi_bias(q.shape[-2], k.shape[-2], slopes)  # (H, T_q, T_k)
    return attention_manual(q, k, v, mask, is_causal=is_causal, scale=scale, bias=bias)
