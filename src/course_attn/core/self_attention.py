"""Chapters 2 and 3: self-attention, first without weights, then with learned Q/K/V.

``simple_self_attention`` (Chapter 2) lets every token of a sequence score every
token of the same sequence with a plain similarity of the raw vectors, turns
each row of scores into weights with a softmax and returns the weighted sums.
It has no parameters at all.

``SelfAttention`` (Chapter 3) adds the three learned projections ``q_proj``,
``k_proj`` and ``v_proj`` and delegates the arithmetic to
:func:`course_attn.core.attention.scaled_dot_product_attention` (Chapter 4).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import (
    check_bool,
    check_choice,
    check_positive_int,
    check_tensor,
    values_checkable,
)
from .attention import scaled_dot_product_attention
from .softmax import softmax

__all__ = ["SIMILARITIES", "SelfAttention", "simple_self_attention"]

SIMILARITIES = ("dot", "cosine")


def simple_self_attention(x: Tensor, *, similarity: str = "dot") -> tuple[Tensor, Tensor]:
    """Self-attention without any learned weights (Chapter 2).

    Every token is compared with every token of the same sequence (itself
    included), each row of scores becomes a distribution with a softmax, and
    each output is the weighted average of the *input* vectors.

    Args:
        x: token vectors ``(..., T, D)``, floating point; any leading batch dims.
        similarity: ``"dot"`` scores ``x_i . x_j``; ``"cosine"`` scores
            ``x_i . x_j / (|x_i| |x_j|)`` (a zero vector has cosine 0 with everything).
            The choice changes the weights only: the output is always
            ``weights @ x``.

    Returns:
        ``(z, attn_weights)``: ``z (..., T, D)`` and ``attn_weights (..., T, T)``,
        whose row ``i`` is query ``i`` over every key and sums to 1.

    NaN or inf in ``x`` is a ``ValueError``; so is a finite ``x`` so large that
    the scores overflow (``x_i . x_j``, or for cosine ``|x_i|^2``, beyond the
    dtype's range), and the message then says so and suggests scaling ``x``
    down. These checks read values, so they run on the CPU in eager mode only
    (see ``course_attn._validation``).
    """
    check_tensor(x, "x", min_ndim=2)
    check_choice(similarity, "similarity", SIMILARITIES)
    if x.shape[-2] == 0:
        raise ValueError(f"x must hold at least one token (T >= 1), got shape {tuple(x.shape)}")
    checkable = values_checkable(x)
    if checkable and not torch.isfinite(x).all():
        raise ValueError("x contains NaN or inf; similarity scores would be undefined")
    # Low-precision inputs: scores and softmax in float32, result cast back.
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if similarity == "cosine":
        if checkable and not torch.isfinite(work.square().sum(dim=-1)).all():
            raise ValueError(_overflow_message(x, work.dtype, "the squared norms |x_i|^2"))
        # F.normalize divides by max(|x|, eps): a zero vector stays zero (cosine 0), no NaN.
        unit = F.normalize(work, dim=-1)
        attn_scores = unit @ unit.mT  # (..., T, D) @ (..., D, T) -> (..., T, T)
    else:
        attn_scores = work @ work.mT  # (..., T, D) @ (..., D, T) -> (..., T, T)
        if checkable and not torch.isfinite(attn_scores).all():
            raise ValueError(_overflow_message(x, work.dtype, "the scores x_i . x_j"))
    attn_weights = softmax(attn_scores, dim=-1)  # (..., T, T), rows sum to 1
    z = attn_weights @ work  # (..., T, T) @ (..., T, D) -> (..., T, D)
    return z.to(x.dtype), attn_weights.to(x.dtype)


def _overflow_message(x: Tensor, dtype: torch.dtype, what: str) -> str:
    return (f"{what} overflowed {dtype} although x is finite (largest |x| = "
            f"{float(x.abs().max()):.3g}, {dtype} ends at {torch.finfo(dtype).max:.3g}); "
            "scale x down, e.g. x / x.abs().max(), or use float64")


class SelfAttention(nn.Module):
    """Single-head self-attention with learned query, key and value projections (Chapter 3).

    ``q_proj``, ``k_proj`` and ``v_proj`` are ``nn.Linear(d_in, d_out, bias=qkv_bias)``;
    remember that ``nn.Linear`` computes ``x @ W.T + b``, so a textbook matrix
    ``W_q`` of shape ``(d_in, d_out)`` goes into ``q_proj.weight`` transposed.
    Scores are scaled by ``1 / sqrt(d_out)``: ``d_out`` is the key width here.

    Args:
        d_in: width of the input tokens.
        d_out: width of queries, keys, values and of the output.
        qkv_bias: give the three projections a bias term.
    """

    def __init__(self, d_in: int, d_out: int, *, qkv_bias: bool = False) -> None:
        super().__init__()
        self.d_in = check_positive_int(d_in, "d_in")
        self.d_out = check_positive_int(d_out, "d_out")
        check_bool(qkv_bias, "qkv_bias")
        self.q_proj = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.k_proj = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.v_proj = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(
        self, x: Tensor, *, mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from every token of ``x`` to every token of ``x``.

        Args:
            x: ``(B, T, d_in)``.
            mask: optional boolean mask broadcastable to ``(B, T, T)``, ``True`` = may
                attend (Chapter 5). A query with no allowed key gets a zero output.
            need_weights: also return the attention weights.

        Returns:
            ``(out (B, T, d_out), attn_weights)``, like every attention module
            here: ``attn_weights (B, T, T)`` when ``need_weights`` is true, else
            ``None``. Values are never scanned: a NaN in ``x`` reaches the outputs
            that attend to it (see ``course_attn._validation``).
        """
        check_tensor(x, "x", ndim=3)
        check_bool(need_weights, "need_weights")
        if x.shape[-1] != self.d_in:
            raise ValueError(f"x must have last dimension d_in={self.d_in}, "
                             f"got shape {tuple(x.shape)}")
        if x.dtype != self.q_proj.weight.dtype:
            raise TypeError(f"x has dtype {x.dtype} but the layer's weights are "
                            f"{self.q_proj.weight.dtype}; convert one of them")
        q = self.q_proj(x)  # (B, T, d_in) @ (d_in, d_out) -> (B, T, d_out)
        k = self.k_proj(x)  # (B, T, d_out)
        v = self.v_proj(x)  # (B, T, d_out)
        # scale=None: 1/sqrt(d_k) with d_k = q.shape[-1] = d_out.
        out, attn_weights = scaled_dot_product_attention(q, k, v, mask)  # (B, T, d_out)
        return out, attn_weights if need_weights else None

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, qkv_bias={self.q_proj.bias is not None}"
