"""Chapter 1: softmax weighting and attention pooling.

``softmax`` turns raw scores into a probability distribution; ``attention_pool``
scores every token against one task query and returns the weighted average
of the tokens (the "original" attention of Bahdanau et al. reduced to a dot
product).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_bool, check_positive_real, check_tensor, values_checkable

__all__ = ["attention_pool", "softmax"]


def softmax(x: Tensor, dim: int = -1, *, temperature: float = 1.0) -> Tensor:
    """Numerically stable softmax of ``x / temperature`` along ``dim``.

    Args:
        x: floating-point scores of any shape ``(...)``.
        dim: the axis that becomes a distribution.
        temperature: positive finite number; below 1 sharpens, above 1 flattens.

    Returns:
        A tensor shaped like ``x`` whose slices along ``dim`` are non-negative
        and sum to 1. The row maximum is subtracted before ``exp`` (which
        leaves the result unchanged, see Chapter 1), so scores of 1e4 do not
        overflow. An all ``-inf`` slice is an error here; masked attention
        handles that case explicitly (Chapter 5).

    NaN in ``x``, a ``+inf``, or a slice that is all ``-inf`` is a ``ValueError``
    (this function takes a learner's raw numbers; see ``course_attn._validation``
    for the policy). The check reads values, so it runs on the CPU in eager mode
    only; elsewhere such inputs give NaN.
    """
    check_tensor(x, "x", min_ndim=1)
    temperature = check_positive_real(temperature, "temperature")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__} {dim!r}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be in [{-x.dim()}, {x.dim() - 1}] for x of shape "
                         f"{tuple(x.shape)}, got {dim}")
    checkable = values_checkable(x)
    if checkable and torch.isnan(x).any():
        raise ValueError("x contains NaN; softmax of NaN scores is undefined")
    if x.shape[dim] == 0:
        raise ValueError(f"x has size 0 along dim {dim}; there is nothing to normalise")
    # float16/bfloat16 sums of many small terms lose digits: work in float32.
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    # Subtracting the maximum is exact algebra (exp(a - m) / sum exp(b - m)) and
    # keeps every exponent <= 0, so exp never overflows. Shifting before dividing
    # by the temperature also keeps x / temperature finite for tiny temperatures.
    shifted = work - work.amax(dim=dim, keepdim=True).detach()
    if checkable and torch.isnan(shifted).any():  # only +inf - +inf or -inf - -inf produce NaN here
        raise ValueError("x has a slice that is all -inf or contains +inf; softmax is undefined")
    # A temperature outside the working dtype's range would round to 0 (0/0 = NaN) or inf
    # (-inf/inf = NaN); clamping changes the result only for score gaps below ~1e-30.
    info = torch.finfo(work.dtype)
    exp = (shifted / min(max(temperature, info.tiny), info.max)).exp()
    return (exp / exp.sum(dim=dim, keepdim=True)).to(x.dtype)


def attention_pool(x: Tensor, query: Tensor, *, scale: bool = True) -> tuple[Tensor, Tensor]:
    """Pool a sequence into one vector, weighting each token by its match with a query (Chapter 1).

    Args:
        x: token vectors ``(..., T, D)``.
        query: a task query ``(..., D)`` (broadcast over the leading dims).
        scale: divide the dot products by ``sqrt(D)`` (scaled dot-product scoring).

    Returns:
        ``(pooled, weights)``: ``pooled (..., D)`` is ``sum_t weights[t] * x[t]``,
        ``weights (..., T)`` is ``softmax(x . query / sqrt(D))``; half precision is
        computed in float32 (fp16 ends at 65504) and cast back. NaN or inf inputs, and
        scores that overflow, are a ``ValueError`` (read on the CPU, eagerly).
    """
    check_tensor(x, "x", min_ndim=2)
    check_tensor(query, "query", min_ndim=1)
    check_bool(scale, "scale")
    if query.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"query must have the tokens' width D={x.shape[-1]} as its last dimension, "
            f"got query of shape {tuple(query.shape)} for x of shape {tuple(x.shape)}"
        )
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        raise ValueError(f"x must have at least one token (T >= 1) of width D >= 1, "
                         f"got shape {tuple(x.shape)}")
    if query.device != x.device:
        raise ValueError(
            f"query is on {query.device} but x is on {x.device}; move both to one device"
        )
    checkable = values_checkable(x) and values_checkable(query)
    for name, value in (("x", x), ("query", query)):
        if checkable and not torch.isfinite(value).all():
            raise ValueError(f"{name} contains NaN or inf; tokens and queries must be finite")
    if query.dtype != x.dtype:
        raise TypeError(f"query dtype {query.dtype} differs from x dtype {x.dtype}")
    try:
        torch.broadcast_shapes(x.shape[:-2], query.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"query's leading dims {tuple(query.shape[:-1])} do not broadcast with x's "
            f"batch dims {tuple(x.shape[:-2])}"
        ) from None
    # Half precision: score and pool in float32, then cast back (fp16 overflows at 65504).
    low = x.dtype in (torch.float16, torch.bfloat16)
    work_x, work_q = (x.float(), query.float()) if low else (x, query)
    # (..., T, D) @ (..., D, 1) -> (..., T)
    scores = (work_x @ work_q.unsqueeze(-1)).squeeze(-1)
    if scale:
        scores = scores / math.sqrt(x.shape[-1])
    if checkable and not torch.isfinite(scores).all():
        raise ValueError(
            f"the scores x . query overflowed {scores.dtype} although x and query are finite "
            f"(largest |x| = {float(x.abs().max()):.3g}, |query| = "
            f"{float(query.abs().max()):.3g}); scale x and query down, or use float64"
        )
    weights = softmax(scores, dim=-1)  # (..., T)
    # (..., 1, T) @ (..., T, D) -> (..., D)
    pooled = (weights.unsqueeze(-2) @ work_x).squeeze(-2)
    return pooled.to(x.dtype), weights.to(x.dtype)
