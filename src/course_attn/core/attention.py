"""Chapter 4: scaled dot-product attention, the manual path and the fused one.

``scaled_dot_product_attention`` is the readable reference: every step is a
line you can print. ``attention`` is the one switch between it, PyTorch's
fused ``torch.nn.functional.scaled_dot_product_attention`` and the course's own
tiled kernel (``course_attn.tiled``, the chapter on efficient attention); the
tests prove that they agree (outputs, gradients, masks).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_positive_real,
    check_probability,
    check_tensor,
)
from .masks import causal_mask

__all__ = ["ATTENTION_IMPLS", "attention", "scaled_dot_product_attention"]

ATTENTION_IMPLS = ("manual", "sdpa", "tiled")


def _check_qkv(q: object, k: object, v: object) -> tuple[Tensor, Tensor, Tensor]:
    q = check_tensor(q, "q", min_ndim=2)
    k = check_tensor(k, "k", min_ndim=2)
    v = check_tensor(v, "v", min_ndim=2)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share their last dimension d_k (queries are compared "
                         f"with keys), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if q.shape[-1] == 0:
        raise ValueError(f"q and k must have a head size d_k >= 1 (the scores are scaled by "
                         f"1/sqrt(d_k)), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions T_k (one value per "
                         f"key), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the batch dimensions of q {tuple(q.shape)}, k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)} do not broadcast") from None
    return q, k, v


def _check_options(mask: object, q: Tensor, k: Tensor, is_causal: object, scale: object,
                   dropout_p: object) -> tuple[Tensor | None, float]:
    """Validate the options shared by both paths; return the mask on q's device and the scale."""
    if mask is not None:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        mask = check_bool_mask(mask, "mask", (*batch, q.shape[-2], k.shape[-2]))
        mask = mask.to(q.device)  # a mask built on the CPU follows q to the GPU (no-op if there)
        if mask.dim() < 2:  # (T_k,) or a scalar: give it its (T_q, T_k) axes, as 1s
            mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
    check_bool(is_causal, "is_causal")
    check_probability(dropout_p, "dropout_p")
    if scale is None:
        return mask, 1.0 / math.sqrt(q.shape[-1])
    return mask, check_positive_real(scale, "scale")


def _check_bias(bias: object, q: Tensor, k: Tensor) -> Tensor | None:
    """Validate an additive score bias; return it on q's device, in q's dtype."""
    if bias is None:
        return None
    if not isinstance(bias, Tensor) or not bias.is_floating_point():
        got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
        raise TypeError(f"bias must be a floating-point torch.Tensor added to the scores "
                        f"(a boolean mask goes in mask=), got {got}")
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    target = torch.Size((*batch, q.shape[-2], k.shape[-2]))
    try:
        shape = torch.broadcast_shapes(bias.shape, target)
    except RuntimeError:
        shape = None
    if shape != target:
        raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to the "
                         f"attention scores' shape {tuple(target)}")
    return bias.to(q.device, q.dtype)  # a no-op when it is already there


def _with_causal(mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor:
    """``mask`` AND the bottom-right causal mask ``(T_q, T_k)``, made on q's device."""
    causal = causal_mask(q.shape[-2], k.shape[-2], device=q.device)  # (T_q, T_k)
    return causal if mask is None else mask & causal


def _zero_unreachable_keys(k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Zero the keys and values that no query may attend to (padding).

    A padded slot may hold anything, NaN or inf included. Its weight is 0, but
    0 * NaN = NaN, so without this a NaN in a pad's value would reach every real
    token's output through the weights @ values product (on both paths).
    """
    reachable = mask.any(dim=-2).unsqueeze(-1)  # (..., T_q, T_k) -> (..., T_k, 1)
    return k.masked_fill(~reachable, 0.0), v.masked_fill(~reachable, 0.0)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale + bias, masked) v, written out step by step.

    Args:
        q: queries ``(..., T_q, d_k)``.
        k: keys ``(..., T_k, d_k)``.
        v: values ``(..., T_k, d_v)``.
        mask: boolean, broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend.
        is_causal: also apply ``causal_mask(T_q, T_k)`` (bottom-right aligned).
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.
        dropout_p: dropout on the attention weights (0 = none; only when asked).
        bias: optional float tensor broadcastable to ``(..., T_q, T_k)``, added to
            the scaled scores before the mask (ALiBi's ``-slope * distance``, say).
            It is converted to ``q``'s dtype and device.

    Returns:
        ``(out, attn_weights)``: ``out (..., T_q, d_v)``; ``attn_weights (..., T_q, T_k)``
        (after dropout, i.e. the weights that multiplied ``v``). A query with no
        allowed key gets zero weights and a zero output (finite gradients), as in
        PyTorch's fused attention. Softmax runs in float32 for half-precision inputs.

    Values are never scanned (see ``course_attn._validation``): a NaN or inf in
    ``q`` spoils its own row, one in ``k`` or ``v`` every row that attends to it
    (and possibly rows that mask it: ``0 * NaN = NaN``), except in keys no
    query may attend to (padding), which are zeroed first.
    """
    q, k, v = _check_qkv(q, k, v)
    mask, scale = _check_options(mask, q, k, is_causal, scale, dropout_p)
    bias = _check_bias(bias, q, k)
    return _manual(q, k, v, mask, is_causal, scale, dropout_p, bias)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
    impl: str = "manual",
) -> tuple[Tensor, Tensor | None]:
    """The one place that chooses between the manual, the fused and the tiled attention path.

    Same arguments and semantics as :func:`scaled_dot_product_attention`; ``impl``
    is ``"manual"`` (returns the weights), ``"sdpa"`` (PyTorch's fused kernel,
    faster and lighter on memory, returns ``None`` for the weights, which it
    never materialises) or ``"tiled"`` (:func:`course_attn.tiled.tiled_attention`
    with its default blocks: the FlashAttention algorithm written in torch, exact
    and ``O(T)`` in memory but slow, a model of the kernel; also ``None`` for the
    weights; dropout by a position hash, so its random mask differs from the
    other paths' for the same seed).

    On the fused path, plain causal self-attention (``is_causal=True``, no other
    mask, ``T_q == T_k``) is passed to PyTorch as ``is_causal=True`` with no mask
    tensor: that is what lets it pick the FlashAttention kernel. Every other
    masked call gets one explicit boolean mask (the causal part bottom-right
    aligned, as the cache needs), and rows without any allowed key are set to
    zero afterwards, because PyTorch's GPU kernels do not promise zeros there in
    float16 and bfloat16. With a ``bias`` the fused path gets one float mask instead
    (the bias, ``-inf`` where the boolean mask blocks), never ``is_causal=True``.

    Like the manual path it never reads tensor values (no host-device sync):
    NaN or inf inputs propagate (padded keys excepted, which are contained).
    """
    check_choice(impl, "impl", ATTENTION_IMPLS)
    q, k, v = _check_qkv(q, k, v)
    mask, scale = _check_options(mask, q, k, is_causal, scale, dropout_p)
    bias = _check_bias(bias, q, k)
    return _attention(q, k, v, mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p,
                      impl=impl, bias=bias)


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, is_causal: bool,
               scale: float | None, dropout_p: float, impl: str,
               bias: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """:func:`attention` without its checks, for layers that checked at their boundary.

    ``mask`` must already be on ``q``'s device (``combine_masks`` puts it there);
    ``bias`` (float, broadcastable to ``(..., T_q, T_k)``) on ``q``'s device too. It is
    cast to ``q``'s dtype here, once, so that every path adds the same numbers.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if bias is not None:
        bias = bias.to(q.dtype)  # no-op unless autocast made q half precision
    if impl == "manual":
        return _manual(q, k, v, mask, is_causal, scale, dropout_p, bias)
    if impl == "tiled":
        from .tiled import _tiled  # tiled builds on this module's checks

        return _tiled(q, k, v, mask, is_causal, scale, dropout_p, bias=bias), None
    return _fused(q, k, v, mask, is_causal, scale, dropout_p, bias)


def _manual(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
            scale: float, dropout_p: float,
            bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The manual path, step by step (see :func:`scaled_dot_product_attention`)."""
    if is_causal:
        mask = _with_causal(mask, q, k)  # (..., T_q, T_k)
    if mask is not None:
        k, v = _zero_unreachable_keys(k, v, mask)

    # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)
    attn_scores = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        attn_scores = attn_scores + bias  # (..., T_q, T_k) + (broadcast to it)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, float("-inf"))
        # A row with no allowed key would be softmax(all -inf) = NaN. Give it finite
        # scores here and zero its weights below, so forward and backward stay finite.
        has_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
        attn_scores = attn_scores.masked_fill(~has_key, 0.0)
    # Half-precision scores are upcast: softmax's exp and sum lose too much in 16 bits.
    softmax_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    attn_weights = torch.softmax(attn_scores, dim=-1, dtype=softmax_dtype)  # (..., T_q, T_k)
    attn_weights = attn_weights.to(q.dtype)
    if mask is not None:
        attn_weights = attn_weights.masked_fill(~mask, 0.0)
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, p=dropout_p, training=True)
    out = attn_weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
    return out, attn_weights


def _fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
           scale: float, dropout_p: float, bias: Tensor | None = None) -> tuple[Tensor, None]:
    """PyTorch's fused kernel with the course's mask conventions (see :func:`attention`)."""
    if bias is not None:
        return _fused_with_bias(q, k, v, mask, is_causal, scale, dropout_p, bias)
    if is_causal and mask is None and q.shape[-2] == k.shape[-2]:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                             scale=scale)  # (..., T_q, d_v)
        return out, None
    if is_causal:
        # PyTorch's is_causal aligns top-left when T_q != T_k; the course aligns
        # bottom-right (cache decoding), so the causal part goes into the mask.
        mask = _with_causal(mask, q, k)  # (..., T_q, T_k)
    if mask is None:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
        return out, None  # (..., T_q, d_v)
    k, v = _zero_unreachable_keys(k, v, mask)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                         scale=scale)  # (..., T_q, d_v)
    has_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
    return out.masked_fill(~has_key, 0.0), None


def _fused_with_bias(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                     scale: float, dropout_p: float, bias: Tensor) -> tuple[Tensor, None]:
    """The fused path with an additive bias: one float ``attn_mask`` carries bias and mask.

    PyTorch adds a float ``attn_mask`` to the scaled scores, so the bias goes there,
    with ``-inf`` wherever the boolean mask blocks. PyTorch refuses ``is_causal=True``
    together with an ``attn_mask``, so the causal part always goes into the mask
    here: a biased call is never FlashAttention-eligible (the memory-efficient
    kernel, which takes float masks, still is on a GPU).
    """
    if is_causal:
        mask = _with_causal(mask, q, k)  # (..., T_q, T_k), bottom-right aligned
    if mask is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p,
                                             scale=scale)  # (..., T_q, d_v)
        return out, None
    k, v = _zero_unreachable_keys(k, v, mask)  # padded keys: contained, as without a bias
    additive = bias.masked_fill(~mask, float("-inf"))  # (..., T_q, T_k), broadcast together
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, dropout_p=dropout_p,
                                         scale=scale)  # (..., T_q, d_v)
    has_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1): rows with no key give zeros
    return out.masked_fill(~has_key, 0.0), None
