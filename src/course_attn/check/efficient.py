"""Checks for chapter 9: the online-softmax merge and one tile of the tiled forward pass.

A partial softmax over part of a row is ``(m, l, acc)``: the largest score seen, the sum
of ``exp(score - m)`` and the sum of ``exp(score - m) * value``. A part that has seen no
allowed score is ``(-inf, 0, 0)``. The package's :class:`~course_attn.SoftmaxState` and
:func:`~course_attn.merge_softmax_states` are the reference. The values are narrower than
the keys (``d_v != d``), so a scale taken from the wrong width shows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.tiled import SoftmaxState, merge_softmax_states
from .common import F64, gen, randn
from .report import CheckResult, section
from .runner import Case, Check, Inputs, Mistake, Property, args, run_check
from .values import FLOAT32

__all__ = ["online_merge", "tile_step"]

State = tuple[Tensor, Tensor, Tensor]


def partial(scores: Tensor, values: Tensor) -> State:
    """``(m, l, acc)`` of scores ``(..., n)`` and their values ``(..., n, d)``."""
    m = scores.amax(dim=-1, keepdim=True)  # (..., 1)
    p = torch.exp(scores - m)  # (..., n)
    return m, p.sum(dim=-1, keepdim=True), (p.unsqueeze(-2) @ values).squeeze(-2)


def empty_state(rows: tuple[int, ...], d: int) -> State:
    """The state of rows that have seen no allowed score: ``(-inf, 0, 0)``."""
    m = torch.full((*rows, 1), -math.inf, dtype=F64)
    return m, torch.zeros(*rows, 1, dtype=F64), torch.zeros(*rows, d, dtype=F64)


# -------------------------------------------------------------------------- online_merge


def _reference_merge(m_a: Tensor, l_a: Tensor, acc_a: Tensor, m_b: Tensor, l_b: Tensor,
                     acc_b: Tensor) -> State:
    merged = merge_softmax_states(SoftmaxState(m_a, l_a, acc_a), SoftmaxState(m_b, l_b, acc_b))
    assert merged.acc is not None  # both parts carry acc
    return merged.m, merged.l, merged.acc


def _merge_variant(how: str) -> Callable[..., State]:
    def wrong(m_a: Tensor, l_a: Tensor, acc_a: Tensor, m_b: Tensor, l_b: Tensor,
              acc_b: Tensor) -> State:
        m = torch.minimum(m_a, m_b) if how == "min" else torch.maximum(m_a, m_b)
        if how == "no_rescale":
            return m, l_a + l_b, acc_a + acc_b
        f_a, f_b = torch.exp(m_a - m), torch.exp(m_b - m)  # NaN where both are -inf
        if how == "inverted":
            f_a, f_b = 1 / f_a, 1 / f_b
        if how == "l_only":
            return m, f_a * l_a + f_b * l_b, acc_a + acc_b
        if how == "normalised":  # guarded, and acc divided by l
            safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            f_a, f_b = torch.exp(m_a - safe), torch.exp(m_b - safe)
            l_new = f_a * l_a + f_b * l_b
            acc = f_a * acc_a + f_b * acc_b
            return m, l_new, torch.where(l_new > 0, acc / l_new.clamp_min(1e-300), acc)
        return m, f_a * l_a + f_b * l_b, f_a * acc_a + f_b * acc_b  # "min", "unguarded"
    return wrong


EMPTY_HINT = (f"a part that has seen no allowed score is (-inf, 0, 0): its factor exp(m_a - "
              f"m) must be 0, but -inf - (-inf) is NaN; where m is -inf, subtract 0 instead "
              f"(torch.where(torch.isinf(m), 0, m)) ({section('9.3')})")
MERGE_MISTAKES = (
    Mistake(_merge_variant("no_rescale"),
            f"rescale each part by exp(m_part - m) before adding: the parts' exponentials are "
            f"relative to different maxima ({section('9.2')})"),
    Mistake(_merge_variant("l_only"),
            f"rescale acc as well as l, by the same factors exp(m_a - m) and exp(m_b - m) "
            f"({section('9.2')})"),
    Mistake(_merge_variant("inverted"),
            f"the factors are exp(m_a - m) <= 1, not exp(m - m_a): a part is scaled down to "
            f"the larger maximum ({section('9.2')})"),
    Mistake(_merge_variant("min"),
            f"m is the larger of the two maxima, max(m_a, m_b) ({section('9.2')})"),
    Mistake(_merge_variant("unguarded"), EMPTY_HINT),
    Mistake(_merge_variant("normalised"),
            f"keep acc unnormalised, the sum of exp(score - m) * value: divide by l only once, "
            f"after the last merge ({section('9.2')})"),
)
MERGE_HINT = "m = max(m_a, m_b); l = l_a exp(m_a - m) + l_b exp(m_b - m); acc the same way"
EMPTY_TEXT = "a part with no allowed score, (-inf, 0, 0), must contribute nothing, never NaN"


def _row_of_section_9_2() -> Inputs:
    x = torch.tensor([3.0, 1.0, 1000.0, 2.0, 1001.0, -5.0], dtype=F64)
    values = randn(gen(0), 6, 3)
    return args(*partial(x[:4], values[:4]), *partial(x[4:], values[4:]))


def _with_empty(order: str) -> Inputs:
    g = gen(14)
    real, empty = partial(randn(g, 4, 5), randn(g, 4, 5, 3)), empty_state((4,), 3)
    parts = {"empty first": (empty, real), "empty last": (real, empty),
             "both empty": (empty, empty)}[order]
    return args(*parts[0], *parts[1])


def _three_parts() -> Inputs:
    g = gen(14)
    scores, values = randn(g, 2, 3, 9, scale=4.0), randn(g, 2, 3, 9, 5)
    cuts = (slice(0, 2), slice(2, 7), slice(7, 9))
    return args(*(t for s in cuts for t in partial(scores[..., s], values[..., s, :])))


def _two_orders(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
    """Three parts merged as (a + b) + c and as a + (c + b): the same whole row."""
    a, b, c = positional[:3], positional[3:6], positional[6:]
    return tuple(fn(*fn(*a, *b), *c)), tuple(fn(*a, *fn(*c, *b)))


ONLINE_MERGE = Check("online_merge", _reference_merge, (
    Case("section 9.2's row [3, 1, 1000, 2, 1001, -5] in two parts, with values (6, 3)",
         _row_of_section_9_2, "the partial results of x[:4] and x[4:] of section 9.2 (m and "
         "l of shape (1,), acc (3,)), float64", MERGE_HINT, "9.2", FLOAT32),
    *(Case("an empty part (-inf, 0, 0) merged with a real one, on either side",
           functools.partial(_with_empty, order), f"{order}: (-inf, 0, 0) for 4 rows and the "
           f"state of random scores (4, 5) with values (4, 5, 3), float64, seed 14",
           EMPTY_TEXT, "9.3", FLOAT32) for order in ("empty first", "empty last")),
    Case("two empty parts, as for a fully padded row: (-inf, 0, 0), no NaN",
         lambda: _with_empty("both empty"), "a = b = (-inf, 0, 0) for 4 rows, acc of width 3",
         EMPTY_TEXT, "9.3", FLOAT32),
    Case("random rows (2, 3) split in three parts, merged in two orders, float64",
         _three_parts, "the states of random scores (2, 3, 9) in columns 0-1, 2-6 and 7-8, "
         "values (2, 3, 9, 5), float64, seed 14; merged as (a + b) + c and a + (c + b)",
         MERGE_HINT, "9.2", FLOAT32, _two_orders),
), params=("m_a", "l_a", "acc_a", "m_b", "l_b", "acc_b"), mistakes=MERGE_MISTAKES,
    errors=(("is ambiguous", f"take the larger maximum of every row with torch.maximum(m_a, "
                             f"m_b), elementwise: Python's max() compares whole tensors "
                             f"({section('9.2')})"),))


def online_merge(fn: Callable[..., State]) -> CheckResult:
    """Check the online-softmax merge, ``fn(m_a, l_a, acc_a, m_b, l_b, acc_b) -> (m, l, acc)``
    (Chapter 9).

    Each part is a partial softmax over disjoint columns of the same rows: ``m (..., 1)`` the
    largest score, ``l (..., 1)`` the sum of ``exp(score - m)``, ``acc (..., d_v)`` the sum
    of ``exp(score - m) * value``; a part with no allowed score is ``(-inf, 0, 0)``. The
    merge is exact: ``m = max(m_a, m_b)``, each part rescaled by ``exp(m_part - m)``
    (section 9.2); neither part may be changed in place.
    """
    return run_check(ONLINE_MERGE, fn)


# ----------------------------------------------------------------------------- tile_step


def _tile(m: Tensor, l: Tensor, acc: Tensor, q: Tensor, k: Tensor,  # noqa: E741
          v: Tensor, how: str = "") -> State:
    """One tile, right or with the known mistake ``how``."""
    d = {"unscaled": 1, "by_d_v": v.shape[-1]}.get(how, q.shape[-1])
    s = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., b_q, b_k)
    block = s.amax(dim=-1, keepdim=True)  # (..., b_q, 1)
    m_new = block if how == "block_max" else torch.maximum(m, block)
    reference = {"old_max": m, "block_ref": block,
                 "old_max_after_first": torch.where(torch.isinf(m), m_new, m)}.get(how, m_new)
    p = torch.exp(s - reference)  # (..., b_q, b_k)
    factor = torch.exp(m - m_new)  # (..., b_q, 1): 0 at the first block
    l_new = (l if how == "l_stale" else l * factor) + p.sum(dim=-1, keepdim=True)
    acc_new = (acc if how == "acc_stale" else acc * factor) + p @ v  # (..., b_q, d_v)
    return m_new, l_new, acc_new / l_new if how == "normalised" else acc_new


def _reference_tile(m: Tensor, l: Tensor, acc: Tensor, q: Tensor, k: Tensor,  # noqa: E741
                    v: Tensor) -> State:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., b_q, b_k)
    block = partial(scores, v.unsqueeze(-3).expand(*scores.shape, v.shape[-1]))
    return _reference_merge(m, l, acc, *block)


def _wrong_tile(how: str) -> Callable[..., State]:
    def wrong(m: Tensor, l: Tensor, acc: Tensor, q: Tensor, k: Tensor,  # noqa: E741
              v: Tensor) -> State:
        return _tile(m, l, acc, q, k, v, how)
    return wrong


def _overflow(got: object, expected: object, inputs: Inputs) -> bool:
    return isinstance(got, tuple | list) and len(got) == 3 and any(
        isinstance(t, Tensor) and not bool(torch.isfinite(t.detach()).all()) for t in got[1:])


TILE_MISTAKES = tuple(Mistake(_wrong_tile(how), hint) for how, hint in (
    ("acc_stale", f"when the maximum grows, rescale the old acc by exp(m - m_new) before "
                  f"adding the block's p v ({section('9.3')})"),
    ("l_stale", f"when the maximum grows, rescale the old l by exp(m - m_new) before adding "
                f"the block's sum ({section('9.3')})"),
    ("unscaled", f"scale the block's scores by 1 / sqrt(d), as the manual path does "
                 f"({section('9.3')})"),
    ("by_d_v", f"scale by 1 / sqrt(d), the width of q and k, not of v ({section('4.2')})"),
    ("block_max", f"m_new is the larger of the old m and the block's row maxima, not the "
                  f"block's maxima alone ({section('9.3')})"),
    ("normalised", f"keep acc unnormalised (a sum of exp(s - m) v): divide by l only once, "
                   f"after the last key block ({section('9.3')})"),
    ("block_ref", f"exponentiate the block against the new running maximum, p = exp(s - "
                  f"m_new) with m_new = max(m, block max): l and acc must all be relative to "
                  f"one maximum ({section('9.3')})"),
    ("old_max_after_first", f"exponentiate the block against the new maximum m_new, not the "
                            f"old m: against the old m a larger score gives exp(> 0), and l and "
                            f"acc mix two references ({section('9.3')})"),
))
OVERFLOW_HINT = (f"your l or acc overflowed to inf or NaN: the exponentials use the new "
                 f"maximum, exp(s - m_new) and exp(m - m_new), so that none exceeds 1 (the "
                 f"old m is -inf at the first block) ({section('9.3')})")
TILE_HINT = ("s = q k^T / sqrt(d); m_new = max(m, row max of s); p = exp(s - m_new); l = l "
             "exp(m - m_new) + sum p; acc = acc exp(m - m_new) + p v")


def _tile_inputs(rows: int, keys: int, batch: tuple[int, ...] = (), scale: float = 1.0,
                 prior: bool = False) -> Inputs:
    g = gen(15)
    q, k = randn(g, *batch, rows, 4, scale=scale), randn(g, *batch, keys, 4, scale=scale)
    v = randn(g, *batch, keys, 3)
    state = partial(randn(g, *batch, rows, 2), randn(g, *batch, rows, 2, 3)) if prior else \
        empty_state((*batch, rows), 3)
    return args(*state, q, k, v)


def _loop(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
    """Section 9.3's loop over blocks of 4 queries and 3 keys, on the function's own state;
    the final states of the query blocks, stacked."""
    q, k, v = positional
    states = []
    for i in range(0, q.shape[0], 4):
        state = empty_state((min(i + 4, q.shape[0]) - i,), v.shape[-1])
        for j in range(0, k.shape[0], 3):
            state = tuple(fn(*state, q[i:i + 4], k[j:j + 3], v[j:j + 3]))
        states.append(state)
    return tuple(torch.cat([s[n] for s in states]) for n in range(3))


TILE_STEP = Check("tile_step", _reference_tile, (
    Case("one tile from the empty state (-inf, 0, 0): 4 queries, 3 keys of width 4, values "
         "of width 3", lambda: _tile_inputs(4, 3), "(m, l, acc) = (-inf, 0, 0) for 4 queries; "
         "random q (4, 4), k (3, 4), v (3, 3), float64, seed 15", TILE_HINT, "9.3", FLOAT32),
    Case("section 9.3's loop, T = 10, blocks of 4 queries and 3 keys, each tile on your own "
         "state", lambda: args(*(randn(gen(15), 10, w) for w in (4, 4, 3))),
         "q, k (10, 4) and v (10, 3), float64, seed 15; compared: the final (m, l, acc) of "
         "every query row", TILE_HINT, "9.3", FLOAT32, _loop),
    Case("a batch of heads (2, 3): blocks (2, 3, 5, 4) of queries and (2, 3, 6, 4) of keys",
         lambda: _tile_inputs(5, 6, (2, 3), prior=True), "the state of 2 earlier random "
         "scores per row; random q (2, 3, 5, 4), k (2, 3, 6, 4), v (2, 3, 6, 3), float64, "
         "seed 15", TILE_HINT, "9.3", FLOAT32),
    Case("size-1 dimensions: one query row against one key", lambda: _tile_inputs(1, 1),
         "(-inf, 0, 0) for 1 query; random q (1, 4), k (1, 4), v (1, 3), float64, seed 15",
         TILE_HINT, "9.3", FLOAT32),
    Case("large scores (q and k times 20): no overflow",
         lambda: _tile_inputs(5, 6, (2, 3), scale=20.0, prior=True), "as the batch of heads, "
         "with 20 * q and 20 * k", TILE_HINT, "9.3", FLOAT32),
), params=("m", "l", "acc", "q", "k", "v"), mistakes=TILE_MISTAKES,
    properties=(Property(_overflow, OVERFLOW_HINT),))


def tile_step(fn: Callable[..., State]) -> CheckResult:
    """Check one tile of the tiled forward, ``fn(m, l, acc, q, k, v) -> (m, l, acc)`` (Ch. 9).

    ``q (..., b_q, d)`` is a block of queries, ``k (..., b_k, d)`` and ``v (..., b_k, d_v)`` a
    block of keys and values; ``m, l (..., b_q, 1)`` and ``acc (..., b_q, d_v)`` the running
    state of the query rows (``(-inf, 0, 0)`` before the first block), which the step must
    not change in place. The step scores the block, ``s = q k^T / sqrt(d)``, and folds it
    into the state with the online-softmax rescaling (section 9.3); after the last block
    the output is ``acc / l``.
    """
    return run_check(TILE_STEP, fn)
