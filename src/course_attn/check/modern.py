"""Checks for chapter 10: rotary position embeddings and the sliding-window mask.

RoPE here is the chapter's convention: *interleaved* pairs ``(x[2i], x[2i+1])`` turned by
``position / 10000^(2i / d)`` radians, as in the RoFormer paper (section 10.1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.attention import scaled_dot_product_attention as reference_attention
from ..modern.rope import apply_rope as reference_rope
from ..modern.rope import sinusoid_angles
from ..modern.sliding_window import sliding_window_mask as reference_window
from .basics import TIGHT, randn
from .report import CheckResult, Run, like, run_check, section, show

__all__ = ["rope", "rope_attention", "sliding_window_mask"]

F64 = torch.float64


def _rope_variant(x: Tensor, positions: Tensor, how: str) -> Tensor:
    """RoPE with one known mistake ``how``, for recognising it."""
    d = x.shape[-1]
    if how == "arange":
        positions = torch.arange(x.shape[-2])
    if how == "shifted":
        positions = positions + 1
    if how == "per_feature":  # pair i turns at 10000^(-i / d) instead of 10000^(-2i / d)
        theta = positions.to(F64)[:, None] / 10000.0 ** (torch.arange(d // 2, dtype=F64) / d)
    else:
        theta = sinusoid_angles(positions, d)  # (T, d / 2)
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    if how == "halves":  # Hugging Face's rotate_half layout
        first, second = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]
    if how == "backwards":
        sin = -sin
    if how == "swapped":
        cos, sin = sin, cos
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


# ---------------------------------------------------------------------------------- rope

ROPE_PLAN = (
    "one pair (d = 2) at positions 0, 1, 2: [1, 0] turns by 0, 1 and 2 radians (10.1)",
    "d = 8 at positions 0..4, float64: interleaved pairs, pair i at 1 / 10000^(2i / 8) (10.1)",
    "positions 3..6, as for tokens after a cache of 3 (10.1)",
    "a batch (2, 3, 5, 8) with positions (5,): one rotation for every head and sequence",
)


def _rope_mistakes(x: Tensor, positions: Tensor) -> list[tuple[Callable[[object], bool], str]]:
    return [
        (like(lambda: _rope_variant(x, positions, "backwards")),
         f"turn by +angle: x'[2i] = x[2i] cos - x[2i+1] sin, x'[2i+1] = x[2i] sin + x[2i+1] "
         f"cos ({section('10.1')})"),
        (like(lambda: _rope_variant(x, positions, "swapped")),
         f"cos and sin are swapped: position 0 must leave x unchanged (cos 0 = 1, sin 0 = 0) "
         f"({section('10.1')})"),
        (like(lambda: _rope_variant(x, positions, "halves")),
         f"this chapter pairs interleaved features (x[2i], x[2i+1]); you paired x[i] with "
         f"x[i + d/2], Hugging Face's rotate_half layout ({section('10.1')})"),
        (like(lambda: _rope_variant(x, positions, "per_feature")),
         f"pair i turns at 1 / 10000^(2i / d) radians per position: the exponent uses 2i "
         f"({section('10.1')})"),
        (like(lambda: _rope_variant(x, positions, "arange")),
         f"rotate by the positions given, not by 0..T-1: with a cache the new tokens' "
         f"positions continue after the cached ones ({section('10.1')})"),
        (like(lambda: _rope_variant(x, positions, "shifted")),
         f"positions start at 0: position 0 leaves a vector unchanged ({section('10.1')})"),
        (like(lambda: x), f"your function leaves x unchanged: turn each pair by its angle "
                          f"({section('10.1')})"),
    ]


def _rope_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"turn each pair (x[2i], x[2i+1]) by positions[t] / 10000^(2i / d) radians "
            f"({section('10.1')})")

    def check(case: str, x: Tensor, positions: Tensor, inputs: str) -> None:
        got = run.call(case, inputs, lambda: fn(x.clone(), positions.clone()), hint)
        run.compare(case, inputs, got, reference_rope(x, positions), hint, **TIGHT,
                    mistakes=_rope_mistakes(x, positions))
        run.passed(case)

    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=F64)
    pos = torch.arange(3)
    check(ROPE_PLAN[0], x, pos, f"x = {show(x)}, positions = {pos.tolist()}")
    gen = torch.Generator().manual_seed(16)
    x = randn(gen, 5, 8)
    check(ROPE_PLAN[1], x, torch.arange(5), "random x (5, 8), float64, seed 16, positions = "
          "[0, 1, 2, 3, 4]")
    check(ROPE_PLAN[2], x[:4], torch.arange(3, 7), "random x (4, 8), float64, seed 16, "
          "positions = [3, 4, 5, 6]")
    check(ROPE_PLAN[3], randn(gen, 2, 3, 5, 8), torch.arange(5),
          "random x (2, 3, 5, 8), float64, seed 16, positions = [0, 1, 2, 3, 4]")


def rope(fn: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """Check rotary position embeddings, ``fn(x, positions) -> (..., T, d)`` (Chapter 10).

    ``x (..., T, d)`` are queries or keys (``d`` even), ``positions (T,)`` integers. Each
    interleaved pair ``(x[2i], x[2i+1])`` of position ``t`` turns by ``positions[t] /
    10000^(2i / d)`` radians: ``x'[2i] = x[2i] cos - x[2i+1] sin``, ``x'[2i+1] = x[2i] sin +
    x[2i+1] cos`` (section 10.1).
    """
    return run_check("rope", ROPE_PLAN, fn, _rope_body)


# ------------------------------------------------------------------------ rope_attention

ROPE_ATTENTION_PLAN = (
    "q, k, v (2, 6, 8) at positions 0..5, float64: causal attention of the rotated q and k "
    "(10.1)",
    "the same tokens at positions 10..15: the same output, scores see only i - j (10.1)",
)


def _rope_attention_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"rotate the queries and the keys by their positions, leave the values alone, then "
            f"causal attention softmax(q' k'^T / sqrt(d)) v ({section('10.1')})")
    gen = torch.Generator().manual_seed(17)
    q, k, v = randn(gen, 2, 6, 8), randn(gen, 2, 6, 8), randn(gen, 2, 6, 8)

    def attend(qq: Tensor, kk: Tensor, vv: Tensor) -> Tensor:
        return reference_attention(qq, kk, vv, is_causal=True)[0]

    def check(case: str, positions: Tensor, inputs: str) -> None:
        got = run.call(case, inputs, lambda: fn(q.clone(), k.clone(), v.clone(),
                                                positions.clone()), hint)
        if isinstance(got, tuple | list) and got and isinstance(got[0], Tensor):
            got = got[0]  # (out, weights) will do
        rq, rk, rv = (reference_rope(t, positions) for t in (q, k, v))
        run.compare(case, inputs, got, attend(rq, rk, v), hint, **TIGHT, mistakes=[
            (like(lambda: attend(rq, rk, rv)),
             f"RoPE turns the queries and the keys only: the values carry content, not "
             f"position, and must not be rotated ({section('10.1')})"),
            (like(lambda: attend(rq, k, v)),
             f"rotate the keys as well as the queries: the score sees i - j only when both "
             f"are turned ({section('10.1')})"),
            (like(lambda: attend(q, rk, v)),
             f"rotate the queries as well as the keys ({section('10.1')})"),
            (like(lambda: reference_attention(rq, rk, v)[0]),
             f"a language model's attention is causal: mask the future keys "
             f"({section('5.3')})"),
            (like(lambda: attend(q, k, v)),
             f"your output ignores the positions: rotate q and k before the scores "
             f"({section('10.1')})"),
        ])
        run.passed(case)

    check(ROPE_ATTENTION_PLAN[0], torch.arange(6), "random q, k, v (2, 6, 8), float64, seed "
          "17, positions = [0, 1, 2, 3, 4, 5]")
    check(ROPE_ATTENTION_PLAN[1], torch.arange(10, 16), "the same q, k, v, positions = [10, "
          "11, 12, 13, 14, 15]")


def rope_attention(fn: Callable[..., Tensor]) -> CheckResult:
    """Check causal attention with RoPE, ``fn(q, k, v, positions) -> (B, T, d)`` (Chapter 10).

    ``q``, ``k``, ``v (B, T, d)``, ``positions (T,)``: the queries and keys are rotated by
    their positions (the chapter's interleaved pairs), the values are not, then causal
    scaled dot-product attention; returning ``(out, weights)`` will do too (section 10.1).
    """
    return run_check("rope_attention", ROPE_ATTENTION_PLAN, fn, _rope_attention_body)


# ------------------------------------------------------------------- sliding_window_mask

WINDOW_PLAN = (
    "T = 6, window 3: query i may attend keys i - 2, i - 1 and i (10.4)",
    "window 1 (itself only) and window = T (the causal mask) (10.4)",
)


def _window_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = f"mask[i, j] = i - window < j <= i: the last `window` positions, itself included " \
           f"({section('10.4')})"

    def check(case: str, t: int, window: int) -> None:
        inputs = f"t = {t}, window = {window}"
        got = run.call(case, inputs, lambda: fn(t, window), hint)
        i = torch.arange(t)[:, None]
        j = torch.arange(t)[None, :]
        run.compare(case, inputs, got, reference_window(t, window=window), hint, mistakes=[
            (lambda g: isinstance(g, Tensor) and g.dtype != torch.bool,
             f"return a boolean mask (dtype torch.bool, True = may attend) "
             f"({section('10.4')})"),
            (like(lambda: ~reference_window(t, window=window)),
             f"True means may attend: yours is True where attention is blocked "
             f"({section('5.7')})"),
            (like(lambda: (j <= i) & (j >= i - window)),
             f"window off by one: a window of W holds W positions, keys i - W + 1 to i "
             f"({section('10.4')})"),
            (like(lambda: (j <= i) & (j > i - window + 1)),
             f"window off by one: a window of W holds W positions, itself included "
             f"({section('10.4')})"),
            (like(lambda: (i - j).abs() < window),
             f"the window is causal: keys after the query stay blocked ({section('10.4')})"),
            (like(lambda: (j < i) & (j >= i - window)),
             f"the query may attend itself: the diagonal is True ({section('10.4')})"),
        ])
        run.passed(case)

    check(WINDOW_PLAN[0], 6, 3)
    for window in (1, 6):
        check(WINDOW_PLAN[1], 6, window)
    run.checked.pop()  # two windows, one case of the plan


def sliding_window_mask(fn: Callable[[int, int], Tensor]) -> CheckResult:
    """Check a sliding-window mask, ``fn(t, window) -> (t, t)`` bool (Chapter 10).

    ``True`` = may attend: query ``i`` may attend key ``j`` when ``i - window < j <= i``, the
    last ``window`` positions, itself included (section 10.4).
    """
    return run_check("sliding_window_mask", WINDOW_PLAN, fn, _window_body)

