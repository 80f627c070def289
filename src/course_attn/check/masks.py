"""Checks for chapter 5: the causal mask, the padding mask (left padding too), masked attention.

One convention throughout, the package's: a boolean mask whose ``True`` means *may attend*.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.attention import scaled_dot_product_attention as reference_attention
from ..core.masks import causal_mask as reference_causal
from ..core.masks import padding_mask as reference_padding
from .basics import TIGHT, randn
from .report import CheckResult, Run, has_nan, like, run_check, section, show

__all__ = ["causal_mask", "masked_attention", "padding_mask"]


def not_bool(got: object) -> bool:
    """Whether ``got`` is a tensor of another dtype than ``torch.bool``."""
    return isinstance(got, Tensor) and got.dtype != torch.bool


def bool_hint(number: str) -> str:
    return (f"return a boolean mask (dtype torch.bool, True = may attend), not 0/1 numbers "
            f"({section(number)})")


# --------------------------------------------------------------------------- causal_mask

CAUSAL_PLAN = (
    "a square mask (4, 4): query i may attend keys j <= i, itself included (5.3)",
    "T_q = 2 new queries against T_k = 5 keys: aligned bottom-right (5.3)",
    "T_q = 5 against T_k = 3: the first two rows allow no key (5.3)",
    "one query against one key, and one query against six keys (a decoding step)",
)


def _causal_body(run: Run, fn: Callable[..., Any]) -> None:
    def check(case: str, t_q: int, t_k: int, hint: str) -> None:
        inputs = f"t_q = {t_q}, t_k = {t_k}"
        got = run.call(case, inputs, lambda: fn(t_q, t_k), hint)
        ones = torch.ones(t_q, t_k, dtype=torch.bool)
        run.compare(case, inputs, got, reference_causal(t_q, t_k), hint, mistakes=[
            (not_bool, bool_hint("5.3")),
            (like(lambda: ~reference_causal(t_q, t_k)),
             f"True means may attend in this course (as in PyTorch's scaled_dot_product_"
             f"attention); yours is True where attention is blocked, nn.MultiheadAttention's "
             f"convention ({section('5.7')})"),
            (like(lambda: ones.tril(t_k - t_q - 1)),
             f"causal mask off by one: query i may attend key i itself, so the diagonal is "
             f"True ({section('5.3')})"),
            (like(lambda: ones.tril(t_k - t_q + 1)),
             f"causal mask off by one: query i may not see key i + 1, the next token "
             f"({section('5.3')})"),
            (like(lambda: ones.triu(t_k - t_q)),
             f"True belongs on and below the diagonal (keys j <= i, the past): you allowed the "
             f"future ({section('5.3')})"),
            (like(lambda: ones.tril()),
             f"when T_q != T_k the queries are the last T_q positions: query i may attend keys "
             f"j <= i + T_k - T_q (bottom-right alignment); tril() without an offset, like "
             f"PyTorch's is_causal=True, aligns top-left ({section('5.3')})"),
        ])
        run.passed(case)

    check(CAUSAL_PLAN[0], 4, 4, f"mask[i, j] = j <= i ({section('5.3')})")
    shifted = (f"mask[i, j] = j <= i + T_k - T_q: the new queries come after T_k - T_q "
               f"earlier keys (bottom-right alignment) ({section('5.3')})")
    check(CAUSAL_PLAN[1], 2, 5, shifted)
    check(CAUSAL_PLAN[2], 5, 3, shifted)
    check(CAUSAL_PLAN[3], 1, 1, shifted)
    run.checked.pop()  # the two decoding shapes are one case of the plan
    check(CAUSAL_PLAN[3], 1, 6, shifted)


def causal_mask(fn: Callable[[int, int], Tensor]) -> CheckResult:
    """Check a causal mask, ``fn(t_q, t_k) -> (t_q, t_k)`` bool (Chapter 5).

    ``True`` = may attend: query ``i`` may attend key ``j`` when ``j <= i + t_k - t_q`` (the
    queries are the last ``t_q`` positions, bottom-right alignment; section 5.3).
    """
    return run_check("causal_mask", CAUSAL_PLAN, fn, _causal_body)


# -------------------------------------------------------------------------- padding_mask

PADDING_PLAN = (
    "right padding: lengths [3, 1, 4], max_len 4, True on the real tokens (5.4)",
    "left padding: lengths [3, 1, 4], max_len 4, the pads first (5.5)",
    "lengths [0, 2] padded to max_len 5, on both sides: an empty row, a longer mask (5.4)",
)


def _padding_body(run: Run, fn: Callable[..., Any]) -> None:
    def check(case: str, lengths: list[int], max_len: int, side: str, hint: str) -> None:
        inputs = f"lengths = {lengths}, max_len = {max_len}, side = {side!r}"
        got = run.call(case, inputs, lambda: fn(list(lengths), max_len, side=side), hint)
        expected = reference_padding(lengths, max_len, side=side)
        other = "left" if side == "right" else "right"
        positions = torch.arange(max_len)[None, :]  # (1, max_len)
        n = torch.tensor(lengths)[:, None]  # (B, 1)
        run.compare(case, inputs, got, expected, hint, mistakes=[
            (not_bool, bool_hint("5.4")),
            (like(lambda: ~expected),
             f"True marks the real tokens, False the pads (True = may attend) "
             f"({section('5.4')})"),
            (like(lambda: reference_padding(lengths, max_len, side=other)),
             f"side={side!r} puts the pads {'first' if side == 'left' else 'last'}: with left "
             f"padding the real tokens are the last ones of the row ({section('5.5')})"),
            (like(lambda: positions <= n if side == "right" else positions >= max_len - n - 1),
             f"padding mask off by one: a row of length n has exactly n True entries "
             f"({section('5.4')})"),
            (lambda g: isinstance(g, Tensor) and g.dim() == 2 and g.shape[1] == max(lengths),
             f"the mask is (B, max_len), even when every sequence is shorter than max_len "
             f"({section('5.4')})"),
        ])
        run.passed(case)

    check(PADDING_PLAN[0], [3, 1, 4], 4, "right",
          f"mask[b, t] = t < lengths[b] ({section('5.4')})")
    check(PADDING_PLAN[1], [3, 1, 4], 4, "left",
          f"left padding: mask[b, t] = t >= max_len - lengths[b] ({section('5.5')})")
    for side in ("right", "left"):
        check(PADDING_PLAN[2], [0, 2], 5, side,
              f"a row of length 0 is all False, and the mask has max_len columns "
              f"({section('5.4')})")
    run.checked.pop()  # both sides are one case of the plan


def padding_mask(fn: Callable[..., Tensor]) -> CheckResult:
    """Check a padding mask, ``fn(lengths, max_len, side="right") -> (B, max_len)`` bool (Ch. 5).

    ``lengths`` is a list of ``B`` ints; ``True`` on real tokens. ``side="right"`` puts the
    real tokens first, ``side="left"`` the pads first (sections 5.4 and 5.5).
    """
    return run_check("padding_mask", PADDING_PLAN, fn, _padding_body)


# ---------------------------------------------------------------------- masked_attention

MASKED_PLAN = (
    "a causal mask (4, 4) on q = k = v (4, 2): masked scores get weight 0 (5.2)",
    "a query whose row of the mask is all False: zero weights, zero output, no NaN (5.6)",
    "gradients with that empty row: finite, and what the reference gives (5.6)",
    "a batch (2, 2, 5, 8) with left-padded keys and a causal mask broadcast (B, 1, T_q, T_k)",
    "T_q = 3 against T_k = 6 with a bottom-right causal mask, float64",
)


def _masked_variant(q: Tensor, k: Tensor, v: Tensor, mask: Tensor,
                    how: str) -> tuple[Tensor, Tensor]:
    """Masked attention with a known mistake ``how``, for recognising it."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T_q, T_k)
    if how == "inverted":
        weights = torch.softmax(scores.masked_fill(mask, -math.inf), dim=-1)
    elif how == "after":
        weights = torch.softmax(scores, dim=-1) * mask
    elif how == "zero":
        weights = torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)
    elif how == "big":
        weights = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    else:  # "nan": -inf everywhere blocked, rows with no key left as softmax gives them
        weights = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)
    return weights @ v, weights


def _masked_body(run: Run, fn: Callable[..., Any]) -> None:
    base_hint = (f"fill the scores where the mask is False with -inf before the softmax, "
                 f"masked_fill(~mask, -inf) ({section('5.2')})")
    empty_hint = (f"a query with no allowed key gets softmax(all -inf) = 0 / 0 = NaN: give such "
                  f"rows zero weights and a zero output ({section('5.6')})")

    def mistakes(q: Tensor, k: Tensor, v: Tensor,
                 mask: Tensor) -> list[tuple[Callable[[object], bool], str]]:
        return [
            (lambda g: isinstance(g, Tensor),
             f"return a pair (out, weights), not only out ({section('4.1')})"),
            (like(lambda: _masked_variant(q, k, v, mask, "inverted")),
             f"True means may attend: block the scores where the mask is False, "
             f"masked_fill(~mask, -inf), not where it is True ({section('5.7')})"),
            (like(lambda: _masked_variant(q, k, v, mask, "after")),
             f"mask the scores before the softmax (with -inf), not the weights after it: the "
             f"weights left must still sum to 1 ({section('5.2')})"),
            (like(lambda: _masked_variant(q, k, v, mask, "zero")),
             f"a blocked score must become -inf, not 0: exp(0) = 1 still gives it weight "
             f"({section('5.2')})"),
            (like(lambda: _masked_variant(q, k, v, mask, "big")),
             f"with -1e9 a query with no allowed key gets uniform weights over keys it may not "
             f"read; its weights and output must be zero ({section('5.6')})"),
            (has_nan, empty_hint),
        ]

    def check(case: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, inputs: str,
              hint: str) -> None:
        got = run.call(case, inputs, lambda: fn(q.clone(), k.clone(), v.clone(), mask.clone()),
                       hint)
        with torch.no_grad():
            expected = reference_attention(q, k, v, mask)
        run.compare(case, inputs, got, expected, hint, mistakes=mistakes(q, k, v, mask),
                    **TIGHT)
        run.passed(case)

    gen = torch.Generator().manual_seed(8)
    x = randn(gen, 4, 2)
    check(MASKED_PLAN[0], x, x, x, reference_causal(4), "q = k = v random (4, 2), float64, "
          "seed 8, mask = the causal mask (4, 4)", base_hint)
    # section 5.6's example: row 1 of the mask blocks everything
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    q3, k4, v4 = randn(gen, 3, 2), randn(gen, 4, 2), randn(gen, 4, 2)
    inputs = f"random q (3, 2), k and v (4, 2), float64, seed 8, mask = {show(mask)}"
    check(MASKED_PLAN[1], q3, k4, v4, mask, inputs, empty_hint)

    case = MASKED_PLAN[2]
    leaves = [t.clone().requires_grad_(True) for t in (q3, k4, v4)]
    grad_hint = (f"your output is right but the backward pass is not: NaN from the empty row "
                 f"(cleaning the output with nan_to_num after a NaN softmax is too late); give "
                 f"that row finite scores (0) before the softmax and zero its weights after "
                 f"({section('5.6')})")
    got = run.call(case, inputs, lambda: fn(*leaves, mask.clone()), grad_hint)
    out = got[0] if isinstance(got, tuple | list) else got
    if not isinstance(out, Tensor) or not out.requires_grad:
        run.fail(case, inputs, "an output that carries a gradient",
                 "an output detached from q, k and v",
                 f"keep the computation in torch, differentiable ({section('5.6')})")
    assert isinstance(out, Tensor)  # for the type checker; fail() raised otherwise
    grads = run.call(case, inputs, lambda: torch.autograd.grad(
        out.sum(), leaves, allow_unused=True), grad_hint)
    grads = tuple(torch.zeros_like(t) if g is None else g
                  for g, t in zip(grads, leaves, strict=True))
    ref_leaves = [t.clone().requires_grad_(True) for t in (q3, k4, v4)]
    ref_out, _ = reference_attention(ref_leaves[0], ref_leaves[1], ref_leaves[2], mask)
    expected = torch.autograd.grad(ref_out.sum(), ref_leaves)
    run.compare(case, inputs + "; the gradient of out.sum()", grads, expected, grad_hint,
                **TIGHT, mistakes=[(has_nan, grad_hint)])
    run.passed(case)

    q, k, v = randn(gen, 2, 2, 5, 8), randn(gen, 2, 2, 5, 8), randn(gen, 2, 2, 5, 8)
    keys = reference_padding([5, 3], 5, side="left")  # (B, T_k), True on real keys
    batch_mask = keys[:, None, None, :] & reference_causal(5)  # (B, 1, T_q, T_k)
    check(MASKED_PLAN[3], q, k, v, batch_mask,
          "random q, k, v (2, 2, 5, 8), float64, seed 8, mask = left padding of lengths "
          "[5, 3] AND causal, shape (2, 1, 5, 5)",
          f"the mask broadcasts against the scores (B, H, T_q, T_k): use masked_fill, which "
          f"broadcasts, and keep rows with no allowed key at zero ({section('5.6')})")
    q, k, v = randn(gen, 3, 4), randn(gen, 6, 4), randn(gen, 6, 4)
    check(MASKED_PLAN[4], q, k, v, reference_causal(3, 6),
          "random q (3, 4), k and v (6, 4), float64, seed 8, mask = causal_mask(3, 6)",
          base_hint)


def masked_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check attention with a boolean mask, ``fn(q, k, v, mask) -> (out, weights)`` (Chapter 5).

    ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``, ``v (..., T_k, d_v)``; ``mask`` is boolean,
    broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend. Blocked scores become
    ``-inf`` before the softmax; a query with no allowed key gets zero weights and a zero
    output, and finite gradients (sections 5.2 and 5.6). No dropout.
    """
    return run_check("masked_attention", MASKED_PLAN, fn, _masked_body)
