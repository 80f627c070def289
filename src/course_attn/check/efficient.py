"""Checks for chapter 9: the online-softmax merge and one tile of the tiled forward pass.

A partial softmax over part of a row is ``(m, l, acc)``: the largest score seen, the sum
of ``exp(score - m)`` and the sum of ``exp(score - m) * value``. A part that has seen no
allowed score is ``(-inf, 0, 0)``. The package's :class:`~course_attn.SoftmaxState` and
:func:`~course_attn.merge_softmax_states` are the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.attention import scaled_dot_product_attention as reference_attention
from ..core.tiled import SoftmaxState, merge_softmax_states
from .basics import TIGHT, randn
from .report import CheckResult, Run, has_nan, like, run_check, section

__all__ = ["online_merge", "tile_step"]

F64 = torch.float64
State = tuple[Tensor, Tensor, Tensor]


def partial(scores: Tensor, values: Tensor) -> State:
    """``(m, l, acc)`` of scores ``(..., n)`` and their values ``(..., n, d)``."""
    m = scores.amax(dim=-1, keepdim=True)  # (..., 1)
    p = torch.exp(scores - m)  # (..., n)
    return m, p.sum(dim=-1, keepdim=True), (p.unsqueeze(-2) @ values).squeeze(-2)


def reference_merge(a: State, b: State) -> State:
    merged = merge_softmax_states(SoftmaxState(*a), SoftmaxState(*b))
    assert merged.acc is not None  # both parts carry acc
    return merged.m, merged.l, merged.acc


def empty_state(rows: tuple[int, ...], d: int) -> State:
    """The state of rows that have seen no allowed score: ``(-inf, 0, 0)``."""
    m = torch.full((*rows, 1), -math.inf, dtype=F64)
    return m, torch.zeros(*rows, 1, dtype=F64), torch.zeros(*rows, d, dtype=F64)


# -------------------------------------------------------------------------- online_merge

MERGE_PLAN = (
    "section 9.2's row [3, 1, 1000, 2, 1001, -5] in two parts, with values (6, 3) (9.2)",
    "an empty part (-inf, 0, 0) merged with a real one, on either side (9.3)",
    "two empty parts, as for a fully padded row: (-inf, 0, 0), no NaN (9.3)",
    "random rows (2, 3, 1) split in three parts, merged in two orders, float64",
)


def _merge_variant(a: State, b: State, how: str) -> State:
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    if how == "no_rescale":
        return m, l_a + l_b, acc_a + acc_b
    if how == "rescale_l_only":
        return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m), acc_a + acc_b
    if how == "inverted":
        return m, l_a * torch.exp(m - m_a) + l_b * torch.exp(m - m_b), \
            acc_a * torch.exp(m - m_a) + acc_b * torch.exp(m - m_b)
    # "min": the smaller maximum kept
    m_low = torch.minimum(m_a, m_b)
    return m_low, l_a * torch.exp(m_a - m_low) + l_b * torch.exp(m_b - m_low), \
        acc_a * torch.exp(m_a - m_low) + acc_b * torch.exp(m_b - m_low)


def _merge_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"m = max(m_a, m_b); l = l_a exp(m_a - m) + l_b exp(m_b - m); acc the same way "
            f"({section('9.2')})")
    empty_hint = (f"a part that has seen no allowed score is (-inf, 0, 0): its factor exp(m_a - "
                  f"m) must be 0, but -inf - (-inf) is NaN; where m is -inf, subtract 0 instead "
                  f"(torch.where(torch.isinf(m), 0, m)) ({section('9.3')})")

    def check(case: str, a: State, b: State, inputs: str, case_hint: str) -> None:
        got = run.call(case, inputs, lambda: fn(*(t.clone() for t in (*a, *b))), case_hint)
        # with an empty part, NaN comes from -inf - (-inf) whatever else may be wrong
        empty_part = bool(torch.isinf(a[0]).any() or torch.isinf(b[0]).any())
        nan_first = [(has_nan, empty_hint)] if empty_part else []
        run.compare(case, inputs, got, reference_merge(a, b), case_hint, **TIGHT, mistakes=[
            *nan_first,
            (like(lambda: _merge_variant(a, b, "no_rescale")),
             f"rescale each part by exp(m_part - m) before adding: the parts' exponentials are "
             f"relative to different maxima ({section('9.2')})"),
            (like(lambda: _merge_variant(a, b, "rescale_l_only")),
             f"rescale acc as well as l, by the same factors exp(m_a - m) and exp(m_b - m) "
             f"({section('9.2')})"),
            (like(lambda: _merge_variant(a, b, "inverted")),
             f"the factors are exp(m_a - m) <= 1, not exp(m - m_a): a part is scaled down to "
             f"the larger maximum ({section('9.2')})"),
            (like(lambda: _merge_variant(a, b, "min")),
             f"m is the larger of the two maxima, max(m_a, m_b) ({section('9.2')})"),
            (has_nan, empty_hint),
        ])
        run.passed(case)

    x = torch.tensor([3.0, 1.0, 1000.0, 2.0, 1001.0, -5.0], dtype=F64)
    values = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    a, b = partial(x[:4], values[:4]), partial(x[4:], values[4:])
    check(MERGE_PLAN[0], a, b, "the partial results of x[:4] and x[4:] of section 9.2 "
          "(m and l of shape (1,), acc (3,)), float64", hint)

    gen = torch.Generator().manual_seed(14)
    scores, vals = randn(gen, 4, 5), randn(gen, 4, 5, 3)
    real, empty = partial(scores, vals), empty_state((4,), 3)
    check(MERGE_PLAN[1], empty, real, "a = (-inf, 0, 0) for 4 rows, b = the state of random "
          "scores (4, 5) and values (4, 5, 3), float64, seed 14", empty_hint)
    run.checked.pop()  # both orders are one case of the plan
    check(MERGE_PLAN[1], real, empty, "the same two parts, a and b swapped", empty_hint)
    check(MERGE_PLAN[2], empty, empty, "a = b = (-inf, 0, 0) for 4 rows, acc of width 3",
          empty_hint)

    case = MERGE_PLAN[3]
    scores, vals = randn(gen, 2, 3, 9, scale=4.0), randn(gen, 2, 3, 9, 4)
    parts = [partial(scores[..., s], vals[..., s, :]) for s in
             (slice(0, 2), slice(2, 7), slice(7, 9))]
    inputs = ("the states of random scores (2, 3, 9) in columns 0-1, 2-6 and 7-8, values (2, 3, "
              "9, 4), float64, seed 14")
    merge = lambda p, q: run.call(case, inputs, lambda: fn(*p, *q), hint)  # noqa: E731
    left = merge(merge(parts[0], parts[1]), parts[2])
    right = merge(parts[0], merge(parts[2], parts[1]))
    expected = partial(scores, vals)
    for got in (left, right):
        run.compare(case, inputs + ", merged as (a + b) + c and a + (c + b)", got, expected,
                    hint, **TIGHT)
    run.passed(case)


def online_merge(fn: Callable[..., State]) -> CheckResult:
    """Check the online-softmax merge, ``fn(m_a, l_a, acc_a, m_b, l_b, acc_b) -> (m, l, acc)``
    (Chapter 9).

    Each part is a partial softmax over disjoint columns of the same rows: ``m (..., 1)`` the
    largest score, ``l (..., 1)`` the sum of ``exp(score - m)``, ``acc (..., d)`` the sum of
    ``exp(score - m) * value``; a part with no allowed score is ``(-inf, 0, 0)``. The merge is
    exact: ``m = max(m_a, m_b)``, each part rescaled by ``exp(m_part - m)`` (section 9.2).
    """
    return run_check("online_merge", MERGE_PLAN, fn, _merge_body)


# ----------------------------------------------------------------------------- tile_step

TILE_PLAN = (
    "one tile from the empty state (-inf, 0, 0): 4 queries, 3 keys of width 4 (9.3)",
    "section 9.3's loop, T = 10, blocks of 4 queries and 3 keys: every tile from the "
    "reference's state, then acc / l against the manual attention",
    "a batch of heads (2, 3): blocks (2, 3, 5, 8) of queries and (2, 3, 6, 8) of keys",
    "large scores (q and k times 20): no overflow (9.3)",
)


def reference_tile(state: State, q: Tensor, k: Tensor, v: Tensor) -> State:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., bq, bk)
    m = scores.amax(dim=-1, keepdim=True)  # (..., bq, 1)
    p = torch.exp(scores - m)  # (..., bq, bk)
    return reference_merge(state, (m, p.sum(dim=-1, keepdim=True), p @ v))


def _tile_variant(state: State, q: Tensor, k: Tensor, v: Tensor, how: str) -> State:
    m, l, acc = state
    scores = q @ k.transpose(-2, -1) / (1.0 if how == "unscaled" else math.sqrt(q.shape[-1]))
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    if how == "block_max":
        m_new = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - (m if how == "old_max" else m_new))
    factor = torch.exp(m - m_new)
    l_new = (l if how == "l_not_rescaled" else l * factor) + p.sum(dim=-1, keepdim=True)
    acc_new = (acc if how == "acc_not_rescaled" else acc * factor) + p @ v
    if how == "normalised":
        acc_new = acc_new / l_new
    return m_new, l_new, acc_new


def _tile_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"s = q k^T / sqrt(d); m_new = max(m, row max of s); p = exp(s - m_new); "
            f"l = l exp(m - m_new) + sum p; acc = acc exp(m - m_new) + p v ({section('9.3')})")

    def check(case: str, state: State, q: Tensor, k: Tensor, v: Tensor, inputs: str) -> State:
        got = run.call(case, inputs, lambda: fn(*(t.clone() for t in (*state, q, k, v))), hint)
        run.compare(case, inputs, got, reference_tile(state, q, k, v), hint, **TIGHT, mistakes=[
            (like(lambda: _tile_variant(state, q, k, v, "acc_not_rescaled")),
             f"when the maximum grows, rescale the old acc by exp(m - m_new) before adding the "
             f"block's p v ({section('9.3')})"),
            (like(lambda: _tile_variant(state, q, k, v, "l_not_rescaled")),
             f"when the maximum grows, rescale the old l by exp(m - m_new) before adding the "
             f"block's sum ({section('9.3')})"),
            (like(lambda: _tile_variant(state, q, k, v, "unscaled")),
             f"scale the block's scores by 1 / sqrt(d), as the manual path does "
             f"({section('9.3')})"),
            (like(lambda: _tile_variant(state, q, k, v, "block_max")),
             f"m_new is the larger of the old m and the block's row maxima, not the block's "
             f"maxima alone ({section('9.3')})"),
            (like(lambda: _tile_variant(state, q, k, v, "normalised")),
             f"keep acc unnormalised (a sum of exp(s - m) v): divide by l only once, after "
             f"the last key block ({section('9.3')})"),
            (lambda g: has_nan(g) or _is_inf(g),
             f"the exponentials use the new maximum, exp(s - m_new) and exp(m - m_new), so "
             f"that none exceeds 1 (the old m is -inf at the first block) ({section('9.3')})"),
        ])
        return reference_tile(state, q, k, v)

    gen = torch.Generator().manual_seed(15)
    q, k, v = randn(gen, 4, 4), randn(gen, 3, 4), randn(gen, 3, 4)
    check(TILE_PLAN[0], empty_state((4,), 4), q, k, v,
          "(m, l, acc) = (-inf, 0, 0) for 4 queries; random q (4, 4), k and v (3, 4), "
          "float64, seed 15")
    run.passed(TILE_PLAN[0])

    case = TILE_PLAN[1]
    t, d, bq, bk = 10, 4, 4, 3
    q1, k1, v1 = (torch.randn(t, d, dtype=F64, generator=torch.Generator().manual_seed(1 + i))
                  for i in range(3))
    out = torch.empty(t, d, dtype=F64)
    for i in range(0, t, bq):
        rows = slice(i, min(i + bq, t))
        state = empty_state((rows.stop - i,), d)
        for j in range(0, t, bk):
            cols = slice(j, min(j + bk, t))
            state = check(case, state, q1[rows], k1[cols], v1[cols],
                          f"query block {i // bq} (rows {rows.start}-{rows.stop - 1}), key "
                          f"block {j // bk} (keys {cols.start}-{cols.stop - 1}), the state "
                          f"after the blocks before; q, k, v (10, 4), float64")
        out[rows] = state[2] / state[1]
    expected, _ = reference_attention(q1, k1, v1)
    run.compare(case, "q, k, v (10, 4), float64", out, expected, hint, **TIGHT)
    run.passed(case)

    state = partial(randn(gen, 2, 3, 5, 2), randn(gen, 2, 3, 5, 2, 8))
    qb, kb, vb = randn(gen, 2, 3, 5, 8), randn(gen, 2, 3, 6, 8), randn(gen, 2, 3, 6, 8)
    check(TILE_PLAN[2], state, qb, kb, vb, "the state of 2 earlier random scores per row; "
          "random q (2, 3, 5, 8), k and v (2, 3, 6, 8), float64, seed 15")
    run.passed(TILE_PLAN[2])
    check(TILE_PLAN[3], state, 20 * qb, 20 * kb, vb, "the same state and v; 20 * q, 20 * k")
    run.passed(TILE_PLAN[3])


def _is_inf(got: object) -> bool:
    """Whether ``l`` or ``acc`` of a returned state overflowed to inf."""
    return isinstance(got, tuple | list) and len(got) == 3 and any(
        isinstance(t, Tensor) and bool(torch.isinf(t.detach()).any()) for t in got[1:])


def tile_step(fn: Callable[..., State]) -> CheckResult:
    """Check one tile of the tiled forward, ``fn(m, l, acc, q, k, v) -> (m, l, acc)`` (Ch. 9).

    ``q (..., b_q, d)`` is a block of queries, ``k (..., b_k, d)`` and ``v (..., b_k, d_v)`` a
    block of keys and values; ``m, l (..., b_q, 1)`` and ``acc (..., b_q, d_v)`` the running
    state of the query rows (``(-inf, 0, 0)`` before the first block). The step scores the
    block, ``s = q k^T / sqrt(d)``, and folds it into the state with the online-softmax
    rescaling (section 9.3); after the last block the output is ``acc / l``.
    """
    return run_check("tile_step", TILE_PLAN, fn, _tile_body)
