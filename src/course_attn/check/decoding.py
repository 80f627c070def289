"""Checks for chapter 8: one decoding step with a KV cache, and the positions of padded rows.

The three details of section 8.3 that make a cache exact are what these checks probe: the
new keys and values are appended before the new queries attend, the causal mask of the new
queries sits bottom-right, and positions count the real tokens before each one. The values
are narrower than the keys (``d_v != d``), so a scale taken from the wrong width shows.
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
from ..core.masks import positions_from_attention_mask as reference_positions
from .common import gen, randn
from .report import CheckResult, section
from .runner import Case, Check, Inputs, Mistake, Property, args, call, run_check
from .values import EXACT, FLOAT32, show

__all__ = ["kv_cache_step", "positions"]

Step = tuple[Tensor, Tensor, Tensor]


# ------------------------------------------------------------------------- kv_cache_step


def _step(cache_k: Tensor, cache_v: Tensor, q: Tensor, k: Tensor, v: Tensor, *,
          how: str = "", scale: str = "k") -> Step:
    """One cached step, right or with the known mistake ``how``, for recognising it."""
    keys, values = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    if how == "before":  # attend to the cache as it was, then append
        keys, values = cache_k, cache_v
    if how == "prepended":  # the new keys before the cached ones, in attention too
        keys, values = torch.cat([k, cache_k], dim=2), torch.cat([v, cache_v], dim=2)
    if how == "last_query":  # only the newest query attends
        q = q[:, :, -1:]
    t_q, t_k = q.shape[2], keys.shape[2]
    offset = {"top_left": 0, "minus_one": t_k - t_q - 1, "plus_one": t_k - t_q + 1,
              "none": t_k, "minus_one_after_cache": max(t_k - t_q - 1, 0),
              "only_empty": t_k if cache_k.shape[2] else 0}.get(how, t_k - t_q)
    mask = torch.ones(t_q, t_k, dtype=torch.bool).tril(offset)  # (T_new, T_keys)
    d = {"k": q.shape[-1], "v": v.shape[-1], "none": 1, "t_all": t_k}[scale]
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(d)).masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num()  # (B, H, T_new, T_keys)
    out = weights @ values  # (B, H, T_new, d_v)
    if how == "not_returned":
        return out, cache_k, cache_v
    if how == "head_axis":
        return out, torch.cat([cache_k, k], dim=1), torch.cat([cache_v, v], dim=1)
    if how == "new_first":
        return out, torch.cat([k, cache_k], dim=2), torch.cat([v, cache_v], dim=2)
    if how == "prepended":
        return out, keys, values
    if how == "swapped":
        return out, torch.cat([cache_v, v], dim=2), torch.cat([cache_k, k], dim=2)
    return out, torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)


def _reference_step(cache_k: Tensor, cache_v: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Step:
    keys, values = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    mask = reference_causal(q.shape[2], keys.shape[2])  # (T_new, T_cache + T_new)
    return reference_attention(q, keys, values, mask)[0], keys, values


def _wrong_step(how: str = "", scale: str = "k") -> Callable[..., Step]:
    return lambda *given: _step(*given, how=how, scale=scale)


CACHE_HINT = (f"return the caches with the new keys and values appended along the time axis, "
              f"torch.cat([cache_k, k], dim=2) of (B, H, T, head_dim) ({section('8.3')})")

NEW_LAST_HINT = (f"append the new keys and values after the cached ones, torch.cat([cache_k, "
                 f"k], dim=2): the cache keeps the order of the positions ({section('8.3')})")

CACHE_MISTAKES = (
    Mistake(lambda *given: _step(*given)[0],
            f"return three tensors: (out, cache_k, cache_v), the caches with the new keys and "
            f"values appended ({section('8.3')})"),
    Mistake(_wrong_step("before"),
            f"append the new keys and values to the cache first, then attend: a new token "
            f"attends to itself too ({section('8.3')})"),
    Mistake(_wrong_step("none"),
            f"several new tokens at once must not see each other's future: mask them with "
            f"causal_mask(T_new, T_cache + T_new) ({section('8.3')})"),
    Mistake(_wrong_step("top_left"),
            f"the new queries are the last T_new positions: align the causal mask "
            f"bottom-right, query i may attend keys j <= i + T_cache; tril() without an "
            f"offset, like PyTorch's is_causal=True, aligns top-left ({section('5.3')})"),
    Mistake(_wrong_step("minus_one"),
            f"cache positions off by one: new query i sits at position T_cache + i and may "
            f"attend the keys up to that position, itself included ({section('8.3')})"),
    Mistake(_wrong_step("plus_one"),
            f"cache positions off by one: new query i sits at position T_cache + i and may not "
            f"attend the key after it ({section('8.3')})"),
    Mistake(_wrong_step("not_returned"), CACHE_HINT),
    Mistake(_wrong_step("head_axis"), CACHE_HINT),
    Mistake(_wrong_step("new_first"), NEW_LAST_HINT),
    Mistake(_wrong_step(scale="none"),
            f"scale the scores by 1 / sqrt(d), as attention without a cache does "
            f"({section('4.2')})"),
    Mistake(_wrong_step(scale="v"),
            f"scale by 1 / sqrt(d), the width of q and k, not of v ({section('4.2')})"),
    Mistake(_wrong_step(scale="t_all"),
            f"scale by 1 / sqrt(d), the width of q and k, not by the number of keys "
            f"T_cache + T_new ({section('4.2')})"),
    Mistake(_wrong_step("prepended"), NEW_LAST_HINT),
    Mistake(_wrong_step("minus_one_after_cache"),
            f"cache positions off by one: new query i sits at position T_cache + i and may "
            f"attend the keys up to that position, itself included: j <= i + T_cache "
            f"({section('8.3')})"),
    Mistake(_wrong_step("only_empty"),
            f"new tokens must not see each other's future after a cache either: apply "
            f"causal_mask(T_new, T_cache + T_new) at every step, not only on an empty cache "
            f"({section('8.3')})"),
    Mistake(_wrong_step("last_query"),
            f"every new query attends: out has one row per new token, (B, H, T_new, d_v), not "
            f"only the newest token's ({section('8.3')})"),
    Mistake(_wrong_step("swapped"),
            f"return (out, cache_k, cache_v) in this order: the keys' cache first "
            f"({section('8.3')})"),
)
STEP_HINT = ("cache_k = cat([cache_k, k], dim=2), likewise v, then attend from the new queries "
             "to every cached key with causal_mask(T_new, T_cache + T_new)")


def _tokens(batch: int = 2, heads: int = 2, time: int = 7) -> tuple[Tensor, Tensor, Tensor]:
    g = gen(13)  # q and k of width 4, v of width 5
    return randn(g, batch, heads, time, 4), randn(g, batch, heads, time, 4), \
        randn(g, batch, heads, time, 5)


def _step_case(plan: str, cached: int, new: int, number: str = "8.3",
               batch: int = 2, heads: int = 2) -> Case:
    def inputs() -> Inputs:
        q, k, v = _tokens(batch, heads)
        now = slice(cached, cached + new)
        return args(k[:, :, :cached], v[:, :, :cached], q[:, :, now], k[:, :, now],
                    v[:, :, now])

    return Case(plan, inputs, f"caches of {cached} positions ({batch}, {heads}, {cached}, 4) "
                f"and ({batch}, {heads}, {cached}, 5); q, k of {new} new token(s) ({batch}, "
                f"{heads}, {new}, 4), v ({batch}, {heads}, {new}, 5); float64, seed 13",
                STEP_HINT, number, FLOAT32)


def _steps(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
    """Six steps of one token, each on the caches the step before returned."""
    q, k, v = positional
    cache_k, cache_v = k[:, :, :0], v[:, :, :0]
    outs = []
    for t in range(q.shape[2]):
        now = slice(t, t + 1)
        out, cache_k, cache_v = fn(cache_k, cache_v, q[:, :, now].clone(),
                                   k[:, :, now].clone(), v[:, :, now].clone())
        outs.append(out)
    return torch.cat(outs, dim=2), cache_k, cache_v


KV_CACHE_STEP = Check("kv_cache_step", _reference_step, (
    _step_case("the first step on an empty cache (B, H, 0, d): the token attends to itself",
               0, 1),
    _step_case("a prompt of 3 tokens on an empty cache: causal among themselves", 0, 3),
    _step_case("3 new tokens after 4 cached ones: the causal mask aligned bottom-right", 4, 3,
               "5.3"),
    _step_case("size-1 dimensions: one sequence, one head, one new token after 2 cached", 2, 1,
               batch=1, heads=1),
    Case("six steps of one token each, carrying your cache: every output equals the full "
         "causal attention, and the cache holds every key and value",
         lambda: args(*(t[:, :, :6] for t in _tokens())),
         "six steps: your caches from the steps before, and the token at each position, "
         "q, k (2, 2, 1, 4) and v (2, 2, 1, 5), float64, seed 13; compared: the six outputs "
         "side by side, then the caches", STEP_HINT, "8.3", FLOAT32, _steps),
), params=("cache_k", "cache_v", "q", "k", "v"), mistakes=CACHE_MISTAKES,
    errors=(("Sizes of tensors must match", CACHE_HINT),))


def kv_cache_step(fn: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> CheckResult:
    """Check one decoding step with a KV cache, ``fn(cache_k, cache_v, q, k, v)`` (Chapter 8).

    ``cache_k (B, H, T_cache, d)`` and ``cache_v (B, H, T_cache, d_v)`` hold the keys and
    values seen so far (``T_cache`` may be 0); ``q``, ``k (B, H, T_new, d)`` and ``v (B, H,
    T_new, d_v)`` are the new tokens'. Returns ``(out (B, H, T_new, d_v), cache_k,
    cache_v)``: the caches with the new keys and values appended (``T_cache + T_new``), and
    the attention of the new queries over every cached key, scaled by ``1 / sqrt(d)``,
    under ``causal_mask(T_new, T_cache + T_new)`` (bottom-right; sections 5.3 and 8.3).
    """
    return run_check(KV_CACHE_STEP, fn)


# ----------------------------------------------------------------------------- positions


def _real_only(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
    """The positions of the real tokens, in the dtype they came in; the pads' are 0."""
    got = call(fn, positional, keyword)
    mask = positional[0]
    if isinstance(got, Tensor) and got.shape == mask.shape and not got.is_floating_point():
        return torch.where(mask, got, torch.zeros_like(got))
    return got


POSITIONS_MISTAKES = (
    Mistake(lambda mask: torch.arange(mask.shape[1]).expand_as(mask),
            f"with left padding, positions count from each row's first real token, so the "
            f"padded row sees the positions of the same prompt alone ({section('8.3')})"),
    Mistake(lambda mask: mask.long().cumsum(-1),
            f"positions start at 0: the first real token is at position 0, so subtract 1 from "
            f"the running count ({section('8.3')})"),
    Mistake(lambda mask: mask.long().cumsum(0) - 1,
            f"count along each row (dim=-1, the time axis), not down the batch "
            f"({section('8.3')})"),
    Mistake(lambda mask: torch.arange(mask.shape[1]) - (~mask).long().sum(-1, keepdim=True),
            f"subtract only the pads before a token, not every pad of its row: a right-padded "
            f"row's pads come after its real tokens ({section('8.3')})"),
)
LEFT = reference_padding([2, 4, 3], 4, side="left")


def _floating(got: object, expected: object, inputs: Inputs) -> bool:
    return isinstance(got, Tensor) and got.is_floating_point()


def _not_long(got: object, expected: object, inputs: Inputs) -> bool:
    return isinstance(got, Tensor) and not got.is_floating_point() and got.dtype != torch.long


def _positions_case(plan: str, mask: Tensor, describe: str) -> Case:
    return Case(plan, lambda: args(mask), describe,
                "a token's position is the number of real tokens before it in its row: "
                "attention_mask.long().cumsum(-1) - 1", "8.3", EXACT, _real_only)


POSITIONS = Check("positions", reference_positions, (
    _positions_case("a batch of one right-padded row [True, True, True, False]: positions 0, "
                    "1, 2", torch.tensor([[True, True, True, False]]),
                    "attention_mask = [[True, True, True, False]]"),
    _positions_case("left-padded rows: each row counts from its first real token", LEFT,
                    f"attention_mask = {show(LEFT)}"),
    _positions_case("a cache and two generated tokens after a left-padded prompt: positions "
                    "continue", torch.cat([LEFT, torch.ones(3, 2, dtype=torch.bool)], dim=1),
                    "attention_mask = the left-padded mask above with two columns of True "
                    "appended, shape (3, 6)"),
), params=("attention_mask",), mistakes=POSITIONS_MISTAKES,
    properties=(Property(_floating, f"positions are integers (torch.long): they index a table "
                                    f"of positions ({section('8.3')})"),
                Property(_not_long, f"return torch.long (int64) positions, as the exercise "
                                    f"says: the index dtype of PyTorch (torch.gather takes no "
                                    f"other), so no .int(); cumsum of a bool mask is long "
                                    f"already ({section('8.3')})")))


def positions(fn: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check positions over the real tokens, ``fn(attention_mask) -> (B, T)`` long (Chapter 8).

    ``attention_mask (B, T)`` is bool, ``True`` on real tokens; the result, ``torch.long``,
    holds each real token's position counted from its row's first real token (the pads'
    entries are not compared). With a cache the mask covers the cached tokens, so the new
    tokens' positions continue after them (section 8.3).
    """
    return run_check(POSITIONS, fn)
