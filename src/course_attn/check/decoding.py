"""Checks for chapter 8: one decoding step with a KV cache, and the positions of left-padded rows.

The three details of section 8.3 that make a cache exact are what these checks probe: the
new keys and values are appended before the new queries attend, the causal mask of the new
queries sits bottom-right, and positions count the real tokens before each one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.attention import scaled_dot_product_attention as reference_attention
from ..core.masks import causal_mask as reference_causal
from ..core.masks import padding_mask as reference_padding
from ..core.masks import positions_from_attention_mask as reference_positions
from .basics import TIGHT, randn
from .report import CheckResult, Run, has_nan, like, matches, run_check, section, show

__all__ = ["kv_cache_step", "positions"]


# ------------------------------------------------------------------------- kv_cache_step

CACHE_PLAN = (
    "the first step on an empty cache (B, H, 0, d): the token attends to itself (8.3)",
    "a prompt of 3 tokens on an empty cache: causal among themselves (8.3)",
    "3 new tokens after 4 cached ones: the causal mask aligned bottom-right (5.3, 8.3)",
    "six steps of one token each, carrying your cache: every output equals the full causal "
    "attention, and the cache holds every key and value (8.3)",
)


def _step_variant(cache_k: Tensor, cache_v: Tensor, q: Tensor, k: Tensor, v: Tensor,
                  how: str) -> tuple[Tensor, Tensor, Tensor]:
    """One cached step with a known mistake ``how``, for recognising it."""
    all_k, all_v = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    t_q, t_k = q.shape[2], all_k.shape[2]
    ones = torch.ones(t_q, t_k, dtype=torch.bool)
    keys, values = all_k, all_v
    if how == "before":  # attend to the old cache only, then append
        keys, values = cache_k, cache_v
        mask = torch.ones(t_q, keys.shape[2], dtype=torch.bool)
    elif how == "none":
        mask = ones
    elif how == "top_left":
        mask = ones.tril()
    elif how == "minus_one":
        mask = ones.tril(t_k - t_q - 1)
    else:  # "plus_one"
        mask = ones.tril(t_k - t_q + 1)
    out, _ = reference_attention(q, keys, values, mask)
    return out, all_k, all_v


def _step_mistakes(cache_k: Tensor, cache_v: Tensor, q: Tensor, k: Tensor,
                   v: Tensor) -> list[tuple[Callable[[object], bool], str]]:
    def variant(how: str) -> Callable[[object], bool]:
        # the output alone tells the mistake (the cache may be right or wrong as well)
        return like(lambda: _step_variant(cache_k, cache_v, q, k, v, how)[0])

    def output(got: object) -> object:
        return got[0] if isinstance(got, tuple | list) and got else got

    return [
        (lambda g: not isinstance(g, tuple | list) or len(g) != 3,
         f"return three tensors: (out, cache_k, cache_v), the caches with the new keys and "
         f"values appended ({section('8.3')})"),
        (lambda g: variant("before")(output(g)) and variant("top_left")(output(g)),
         f"the new query must attend to every cached key and to itself: append before "
         f"attending, and align the causal mask bottom-right (PyTorch's is_causal=True aligns "
         f"it top-left when T_q != T_k) ({section('8.3')})"),
        (lambda g: variant("before")(output(g)) and variant("minus_one")(output(g)),
         f"the new token attends to no key: append the new keys and values to the cache "
         f"before attending, and mind cache positions off by one: query i sits at position "
         f"T_cache + i and may attend the keys up to it, itself included ({section('8.3')})"),
        (lambda g: has_nan(output(g)) or variant("before")(output(g)),
         f"append the new keys and values to the cache first, then attend: a new token "
         f"attends to itself too ({section('8.3')})"),
        (lambda g: variant("none")(output(g)),
         f"several new tokens at once must not see each other's future: mask them with "
         f"causal_mask(T_new, T_cache + T_new) ({section('8.3')})"),
        (lambda g: variant("top_left")(output(g)),
         f"the new queries are the last T_new positions: align the causal mask bottom-right, "
         f"query i may attend keys j <= i + T_cache; tril() without an offset, like "
         f"PyTorch's is_causal=True, aligns top-left ({section('5.3')})"),
        (lambda g: variant("minus_one")(output(g)) or variant("plus_one")(output(g)),
         f"cache positions off by one: new query i sits at position T_cache + i and may attend "
         f"the keys up to that position, itself included ({section('8.3')})"),
    ]


def _cache_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"cache_k = cat([cache_k, k], dim=2), likewise v, then attend from the new queries "
            f"to every cached key with causal_mask(T_new, T_cache + T_new) ({section('8.3')})")
    cache_hint = (f"return the caches with the new keys and values appended along the time "
                  f"axis, torch.cat([cache_k, k], dim=2) of (B, H, T, head_dim) "
                  f"({section('8.3')})")
    gen = torch.Generator().manual_seed(13)
    q_all, k_all, v_all = (randn(gen, 2, 2, 7, 4) for _ in range(3))  # (B, H, T, d)
    empty = q_all[:, :, :0]  # (B, H, 0, d)

    def step(case: str, cache_k: Tensor, cache_v: Tensor, start: int, stop: int,
             inputs: str) -> tuple[Tensor, Tensor]:
        q, k, v = (t[:, :, start:stop] for t in (q_all, k_all, v_all))
        got = run.call(case, inputs, lambda: fn(cache_k.clone(), cache_v.clone(), q.clone(),
                                                k.clone(), v.clone()), hint,
                       errors=[("Sizes of tensors must match", cache_hint)])
        full_mask = reference_causal(stop)[start:stop]  # (T_new, stop): rows of the full mask
        out = reference_attention(q, k_all[:, :, :stop], v_all[:, :, :stop], full_mask)[0]
        expected = (out, k_all[:, :, :stop], v_all[:, :, :stop])
        mistakes = _step_mistakes(cache_k, cache_v, q, k, v)
        run.compare(case, inputs, got, expected, hint, mistakes=[
            *mistakes[:1],
            (lambda g: describe_output_ok(g, out) and not matches_cache(g, expected),
             cache_hint),
            *mistakes[1:],
        ], **TIGHT)
        return got[1], got[2]

    case = CACHE_PLAN[0]
    step(case, empty, empty, 0, 1, "empty caches (2, 2, 0, 4); q, k, v of one token (2, 2, 1, "
         "4), float64, seed 13")
    run.passed(case)

    case = CACHE_PLAN[1]
    step(case, empty, empty, 0, 3, "empty caches; q, k, v of 3 tokens (2, 2, 3, 4), float64, "
         "seed 13")
    run.passed(case)

    case = CACHE_PLAN[2]
    step(case, k_all[:, :, :4], v_all[:, :, :4], 4, 7,
         "caches of 4 positions (2, 2, 4, 4); q, k, v of the 3 next tokens (2, 2, 3, 4), "
         "float64, seed 13")
    run.passed(case)

    case = CACHE_PLAN[3]
    cache_k, cache_v = empty, empty
    for t in range(6):
        cache_k, cache_v = step(case, cache_k, cache_v, t, t + 1,
                                f"step {t}: your caches from the steps before, and the token "
                                f"at position {t}, (2, 2, 1, 4), float64, seed 13")
    run.passed(case)


def describe_output_ok(got: object, out: Tensor) -> bool:
    """Whether the first of ``got`` is the right output (so the caches are what is wrong)."""
    return isinstance(got, tuple | list) and len(got) == 3 and matches(got[0], out)


def matches_cache(got: object, expected: tuple[Tensor, Tensor, Tensor]) -> bool:
    """Whether ``got``'s caches are the expected ones."""
    return isinstance(got, tuple | list) and len(got) == 3 and matches(tuple(got[1:]),
                                                                       expected[1:])


def kv_cache_step(fn: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> CheckResult:
    """Check one decoding step with a KV cache, ``fn(cache_k, cache_v, q, k, v)`` (Chapter 8).

    ``cache_k``, ``cache_v (B, H, T_cache, d)`` hold the keys and values seen so far
    (``T_cache`` may be 0); ``q``, ``k``, ``v (B, H, T_new, d)`` are the new tokens'.
    Returns ``(out (B, H, T_new, d), cache_k, cache_v)``: the caches with the new keys and
    values appended (``T_cache + T_new``), and the attention of the new queries over every
    cached key, scaled by ``1 / sqrt(d)``, under ``causal_mask(T_new, T_cache + T_new)``
    (bottom-right; sections 5.3 and 8.3).
    """
    return run_check("kv_cache_step", CACHE_PLAN, fn, _cache_body)


# ----------------------------------------------------------------------------- positions

POSITIONS_PLAN = (
    "a right-padded row [True, True, True, False]: positions 0, 1, 2 (8.3)",
    "left-padded rows: each row counts from its first real token (8.3)",
    "a cache and two generated tokens after a left-padded prompt: positions continue (8.3)",
)


def _positions_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"a token's position is the number of real tokens before it in its row: "
            f"attention_mask.long().cumsum(-1) - 1 ({section('8.3')})")

    def check(case: str, mask: Tensor, inputs: str) -> None:
        got = run.call(case, inputs, lambda: fn(mask.clone()), hint)
        expected = reference_positions(mask)
        # Pads are masked anyway: only the real tokens' positions are compared.
        if isinstance(got, Tensor) and got.shape == mask.shape and not got.is_floating_point():
            got = torch.where(mask, got.long(), expected)
        arange = torch.arange(mask.shape[1]).expand_as(mask)
        run.compare(case, inputs, got, expected, hint, mistakes=[
            (lambda g: isinstance(g, Tensor) and g.is_floating_point(),
             f"positions are integers (torch.long): they index a table of positions "
             f"({section('8.3')})"),
            (like(lambda: torch.where(mask, arange, expected)),
             f"with left padding, positions count from each row's first real token, so the "
             f"padded row sees the positions of the same prompt alone ({section('8.3')})"),
            (like(lambda: torch.where(mask, mask.long().cumsum(-1), expected)),
             f"positions start at 0: the first real token is at position 0, so subtract 1 from "
             f"the running count ({section('8.3')})"),
            (like(lambda: torch.where(mask, mask.long().cumsum(0) - 1, expected)),
             f"count along each row (dim=-1, the time axis), not down the batch "
             f"({section('8.3')})"),
        ])
        run.passed(case)

    right = torch.tensor([[True, True, True, False]])
    check(POSITIONS_PLAN[0], right, f"attention_mask = {show(right)}")
    left = reference_padding([2, 4, 3], 4, side="left")
    check(POSITIONS_PLAN[1], left, f"attention_mask = {show(left)}")
    grown = torch.cat([left, torch.ones(3, 2, dtype=torch.bool)], dim=1)  # two steps later
    check(POSITIONS_PLAN[2], grown, "attention_mask = the left-padded mask above with two "
          "columns of True appended, shape (3, 6)")


def positions(fn: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check positions over the real tokens, ``fn(attention_mask) -> (B, T)`` long (Chapter 8).

    ``attention_mask (B, T)`` is bool, ``True`` on real tokens; the result holds each real
    token's position counted from its row's first real token (the pads' entries are not
    compared). With a cache the mask covers the cached tokens, so the new tokens' positions
    continue after them (section 8.3).
    """
    return run_check("positions", POSITIONS_PLAN, fn, _positions_body)

