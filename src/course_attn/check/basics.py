"""Checks for chapters 1 to 4: softmax, pooling, self-attention, projections, scaled attention.

Each check takes the learner's function (or class), runs the cases listed in its plan
and returns a :class:`~course_attn.check.report.CheckResult`. The expected values come
from the package's own reference implementations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ..core.attention import scaled_dot_product_attention as reference_attention
from ..core.self_attention import SelfAttention as ReferenceSelfAttention
from ..core.self_attention import simple_self_attention as reference_self_attention
from ..core.softmax import attention_pool as reference_pool
from ..core.softmax import softmax as reference_softmax
from .report import CheckResult, Run, Tolerance, has_nan, like, run_check, section, show

__all__ = [
    "attention",
    "attention_pool",
    "attention_scores",
    "qkv_projection",
    "self_attention",
    "self_attention_layer",
    "softmax",
]

F64 = torch.float64
#: Tolerances: float64 cases (the learner's order of operations differs from the
#: reference's by round-off only) and the chapters' float32 examples.
TIGHT: Tolerance = {"atol": 1e-9, "rtol": 1e-7}
LOOSE: Tolerance = {"atol": 1e-5, "rtol": 1e-4}


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    """Seeded float64 normal numbers: random inputs that are the same on every machine."""
    return scale * torch.randn(*shape, generator=gen, dtype=F64)


def rows_sum_to_one(got: object) -> bool:
    """Whether ``got`` is a tensor whose last-axis rows all sum to 1."""
    return isinstance(got, Tensor) and bool(
        torch.allclose(got.detach().double().sum(-1), torch.ones((), dtype=F64), atol=1e-6))


def first(got: object) -> object:
    """A layer's output: the tensor itself, or the first entry of ``(out, weights)``."""
    if isinstance(got, tuple | list) and got and isinstance(got[0], Tensor):
        return got[0]
    return got


# ------------------------------------------------------------------------------ softmax

SOFTMAX_PLAN = (
    "two rows of scores, [[2, 1, 0.1], [0, 0, 0]]: each row becomes exp / sum (1.3)",
    "temperatures 0.5 and 4: the scores are divided by the temperature (1.5)",
    "scores of 1000: no NaN, the row maximum is subtracted first (1.6)",
    "rows near 1000, near -1000 and near 0 at once: each row its own maximum (1.6)",
    "a score of -inf gets weight 0 (a masked score, chapter 5)",
    "random scores (2, 3, 7), float64, temperature 0.7, against course_attn.softmax",
)


def _softmax_body(run: Run, fn: Callable[..., Any]) -> None:
    keepdim_hint = (f"keep the maximum's and the sum's dimension (keepdim=True), so that they "
                    f"broadcast along each row ({section('1.6')})")

    def call(case: str, x: Tensor, temperature: float, hint: str) -> object:
        inputs = f"x = {show(x)}, temperature = {show(temperature)}"
        return run.call(case, inputs, lambda: fn(x.clone(), temperature=temperature), hint,
                        errors=[("must match the size", keepdim_hint)])

    # 1.3: exp, then divide by the row's sum, over the last axis
    case = SOFTMAX_PLAN[0]
    x = torch.tensor([[2.0, 1.0, 0.1], [0.0, 0.0, 0.0]], dtype=F64)
    hint = f"softmax(x)_i = exp(x_i) / sum_j exp(x_j), along the last dimension ({section('1.3')})"
    got = call(case, x, 1.0, hint)
    run.compare(case, f"x = {show(x)}, temperature = 1", got, reference_softmax(x), hint,
                **TIGHT, mistakes=[
        (lambda g: isinstance(g, Tensor) and g.dtype != x.dtype,
         f"keep the input's dtype (float64 in, float64 out): no .float() and no new "
         f"float32 tensors ({section('1.3')})"),
        (like(lambda: x / x.sum(-1, keepdim=True)),
         f"you normalised the raw scores; softmax exponentiates them first, which makes every "
         f"weight positive ({section('1.2')})"),
        (like(lambda: torch.softmax(x, dim=0)),
         f"each row (the last dimension, dim=-1) must sum to 1, not each column: take the max "
         f"and the sum over dim=-1 ({section('1.3')})"),
        (lambda g: isinstance(g, Tensor) and g.shape == x.shape and not rows_sum_to_one(g),
         f"your rows do not sum to 1: divide exp(x) by its sum over the last dimension, "
         f"keepdim=True ({section('1.3')})"),
    ])
    run.passed(case)

    # 1.5: softmax(x / T)
    case = SOFTMAX_PLAN[1]
    for temperature in (0.5, 4.0):
        got = call(case, x, temperature, f"softmax(x / temperature) ({section('1.5')})")
        run.compare(case, f"x = {show(x)}, temperature = {show(temperature)}", got,
                    reference_softmax(x, temperature=temperature),
                    f"softmax(x / temperature) ({section('1.5')})", **TIGHT, mistakes=[
            (like(partial(_times, x, temperature)),
             f"divide the scores by the temperature, do not multiply: a temperature below 1 "
             f"must sharpen the weights ({section('1.5')})"),
            (like(lambda: torch.softmax(x, dim=-1)),
             f"the temperature changes nothing in your softmax: divide the scores by it before "
             f"exp ({section('1.5')})"),
        ])
    run.passed(case)

    # 1.6: subtract the row maximum
    case = SOFTMAX_PLAN[2]
    big = torch.tensor([[1000.0, 999.0, 998.0]], dtype=F64)
    max_hint = (f"your softmax gives NaN for scores of 1000: exp(1000) is inf and inf / inf is "
                f"NaN; subtract each row's maximum first ({section('1.6')})")
    got = call(case, big, 1.0, max_hint)
    run.compare(case, f"x = {show(big)}, temperature = 1", got, reference_softmax(big),
                max_hint, **TIGHT, mistakes=[(has_nan, max_hint)])
    run.passed(case)

    case = SOFTMAX_PLAN[3]
    mixed = torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1002.0],
                          [0.0, 5.0, -3.0]], dtype=F64)
    hint = f"subtract each row's own maximum, x.amax(dim=-1, keepdim=True) ({section('1.6')})"
    got = call(case, mixed, 1.0, hint)
    run.compare(case, f"x = {show(mixed)}, temperature = 1", got, reference_softmax(mixed),
                hint, **TIGHT, mistakes=[
        (has_nan, f"the row near -1000 gives 0 / 0 = NaN: subtract each row's own maximum "
                  f"(dim=-1, keepdim=True), not the maximum of the whole tensor "
                  f"({section('1.6')})"),
        (like(lambda: _normalise((mixed - mixed.amax(dim=-1)).exp())), keepdim_hint),
    ])
    run.passed(case)

    case = SOFTMAX_PLAN[4]
    masked = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, 2.0, 2.0]], dtype=F64)
    hint = (f"a score of -inf (a blocked key) must get weight exp(-inf) = 0 and leave the "
            f"other weights summing to 1 ({section('5.2')})")
    got = call(case, masked, 1.0, hint)
    run.compare(case, f"x = {show(masked)}, temperature = 1", got, reference_softmax(masked),
                hint, **TIGHT)
    run.passed(case)

    case = SOFTMAX_PLAN[5]
    gen = torch.Generator().manual_seed(1)
    x = randn(gen, 2, 3, 7, scale=3.0)
    hint = (f"work along the last dimension of a batch of rows of any shape, and keep the "
            f"input's shape and dtype ({section('1.3')})")
    inputs = "random x of shape (2, 3, 7), float64, seed 1, temperature = 0.7"
    got = run.call(case, inputs, lambda: fn(x.clone(), temperature=0.7), hint)
    run.compare(case, inputs, got, reference_softmax(x, temperature=0.7), hint, **TIGHT)
    run.passed(case)


def _times(x: Tensor, temperature: float) -> Tensor:
    """The softmax of ``x * temperature``: the temperature multiplied, not divided."""
    return torch.softmax(x * temperature, dim=-1)


def _normalise(e: Tensor) -> Tensor:
    return e / e.sum(dim=-1, keepdim=True)


def softmax(fn: Callable[..., Tensor]) -> CheckResult:
    """Check a softmax with temperature, ``fn(x, temperature=1.0)`` (Chapter 1).

    ``fn`` takes scores ``x (..., N)`` and a positive ``temperature`` and returns the
    weights ``(..., N)``, same dtype: ``exp(x / T)`` normalised along the last
    dimension, with each row's maximum subtracted first (sections 1.3, 1.5 and 1.6).
    """
    return run_check("softmax", SOFTMAX_PLAN, fn, _softmax_body)


# ----------------------------------------------------------------------- attention_pool

POOL_PLAN = (
    "one query over four tokens: weights softmax(x . q / sqrt(D)), pooled = weights @ x (1.7)",
    "the zero query: uniform weights, pooled = the mean token (1.7)",
    "a batch: x (2, 5, 6) with one query per sequence (2, 6), float64",
    "broadcasting: x (1, 5, 6) against three queries (3, 6), float64",
    "large tokens and query (scores near 3000): no NaN (1.6)",
)


def _pool_variant(x: Tensor, query: Tensor, divide: float) -> tuple[Tensor, Tensor]:
    """Attention pooling with the scores divided by ``divide`` (a mistake when not sqrt(D))."""
    scores = (x @ query.unsqueeze(-1)).squeeze(-1) / divide  # (..., T)
    weights = torch.softmax(scores, dim=-1)  # (..., T)
    return (weights.unsqueeze(-2) @ x).squeeze(-2), weights  # (..., D), (..., T)


def _attention_pool_body(run: Run, fn: Callable[..., Any]) -> None:
    scale_hint = (f"pooled = softmax(x . query / sqrt(D)) @ x: score each token by its dot "
                  f"product with the query, scaled by 1 / sqrt(D) ({section('1.7')})")
    batch_hint = (f"score every token of every sequence at once: (..., T, D) @ (..., D, 1) -> "
                  f"(..., T, 1), i.e. x @ query.unsqueeze(-1), so leading dimensions "
                  f"broadcast ({section('1.7')})")

    def check(case: str, x: Tensor, query: Tensor, inputs: str, hint: str) -> None:
        got = run.call(case, inputs, lambda: fn(x.clone(), query.clone()), hint)
        d = x.shape[-1]
        run.compare(case, inputs, got, reference_pool(x, query), hint, **TIGHT, mistakes=[
            (lambda g: isinstance(g, Tensor),
             f"return a pair (pooled, weights), not only the pooled vector ({section('1.7')})"),
            (like(lambda: tuple(reversed(reference_pool(x, query)))),
             f"return (pooled, weights) in this order ({section('1.7')})"),
            (like(lambda: _pool_variant(x, query, 1.0)),
             f"scale the dot products by 1 / sqrt(D) before the softmax ({section('1.7')})"),
            (like(lambda: _pool_variant(x, query, float(d))),
             f"divide the scores by sqrt(D), not by D ({section('1.7')})"),
            (has_nan, f"your weights hold NaN: use a softmax that subtracts the row maximum "
                      f"({section('1.6')})"),
        ])
        run.passed(case)

    x = torch.tensor([[1.0, 0, 0, 0], [0, 2, 0, 0], [0, 0, 1, 0], [1, 1, 1, 1]], dtype=F64)
    query = torch.tensor([2.0, 0, 0, 1], dtype=F64)
    check(POOL_PLAN[0], x, query, f"x = {show(x, limit=16)}, query = {show(query)}",
          scale_hint)
    zero = torch.zeros(4, dtype=F64)
    check(POOL_PLAN[1], x, zero, f"x = {show(x, limit=16)}, query = {show(zero)}",
          f"a query of zeros scores every token 0: uniform weights, and the pooled vector is "
          f"the mean of the tokens ({section('1.7')})")
    gen = torch.Generator().manual_seed(2)
    xb, qb = randn(gen, 2, 5, 6), randn(gen, 2, 6)
    check(POOL_PLAN[2], xb, qb, "random x (2, 5, 6) and query (2, 6), float64, seed 2",
          batch_hint)
    x1, q3 = randn(gen, 1, 5, 6), randn(gen, 3, 6)
    check(POOL_PLAN[3], x1, q3, "random x (1, 5, 6) and query (3, 6), float64, seed 2",
          batch_hint)
    big_x, big_q = 40.0 * x, torch.tensor([40.0, 40.0, 0, 40.0], dtype=F64)
    check(POOL_PLAN[4], big_x, big_q, f"x = 40 * the first x, query = {show(big_q)}",
          f"large scores must not overflow: use a softmax that subtracts the row maximum "
          f"({section('1.6')})")


def attention_pool(fn: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check attention pooling with a task query, ``fn(x, query) -> (pooled, weights)`` (Ch. 1).

    ``x (..., T, D)`` are token vectors, ``query (..., D)`` one query per sequence
    (leading dimensions broadcast); ``weights (..., T) = softmax(x . query / sqrt(D))``
    and ``pooled (..., D) = weights @ x`` (section 1.7).
    """
    return run_check("attention_pool", POOL_PLAN, fn, _attention_pool_body)


# ---------------------------------------------------------------- simple self-attention

TOY = torch.tensor([[0.1, 0.1, 0.9], [0.9, 0.2, 0.1], [0.6, 0.3, 0.2], [0.1, 0.4, 0.8],
                    [0.1, 0.1, 0.9], [0.2, 0.9, 0.1]])  # chapter 2's "the cat sat on the mat"

SELF_PLAN = (
    "the toy sentence (6, 3), dot product: z = softmax(x x^T) x (2.4)",
    "the toy sentence, cosine: the scores of unit vectors, the original vectors mixed (2.6)",
    "a batch (2, 5, 4), float64, dot and cosine, against course_attn.simple_self_attention",
)


def _self_variant(x: Tensor, *, scale: float = 1.0, dim: int = -1, cosine: str = "",
                  mix: str = "x") -> tuple[Tensor, Tensor]:
    """Simple self-attention with one thing changed (a mistake), for recognising it."""
    unit = x / x.norm(dim=-1, keepdim=True)
    if cosine == "both":
        scores = unit @ unit.mT
    elif cosine == "queries":
        scores = unit @ x.mT
    elif cosine == "columns":
        u = x / x.norm(dim=-2, keepdim=True)
        scores = u @ u.mT
    else:
        scores = x @ x.mT
    weights = torch.softmax(scores / scale, dim=dim)
    mixed = {"x": x, "unit": unit}[mix]
    return weights @ mixed, weights


def _self_attention_body(run: Run, fn: Callable[..., Any]) -> None:
    def check(case: str, x: Tensor, similarity: str, inputs: str, hint: str) -> None:
        got = run.call(case, inputs, lambda: fn(x.clone(), similarity=similarity), hint)
        tol = LOOSE if x.dtype == torch.float32 else TIGHT
        mistakes = [
            (lambda g: isinstance(g, Tensor),
             f"return a pair (z, weights), not only z ({section('2.4')})"),
            (like(lambda: _self_variant(x, scale=math.sqrt(x.shape[-1]),
                                        cosine="both" if similarity == "cosine" else ""),
                  **tol),
             f"chapter 2's scores are the plain similarities, not scaled by sqrt(D): the "
             f"scaling comes with the projections of chapter 4 ({section('2.4')})"),
            (like(lambda: _self_variant(x, dim=-2,
                                        cosine="both" if similarity == "cosine" else ""),
                  **tol),
             f"each row of the weights belongs to one query and must sum to 1: softmax over "
             f"the last dimension, not over the queries ({section('2.4')})"),
        ]
        if similarity == "cosine":
            mistakes += [
                (like(lambda: _self_variant(x), **tol),
                 f"your cosine scores are plain dot products: divide each vector by its length "
                 f"first, unit = x / |x| (dim=-1), then unit @ unit^T ({section('2.6')})"),
                (like(lambda: _self_variant(x, cosine="queries"), **tol),
                 f"normalise both sides of the dot product, the keys as well as the queries "
                 f"({section('2.6')})"),
                (like(lambda: _self_variant(x, cosine="columns"), **tol),
                 f"normalise each token's vector (a row, dim=-1), not each feature across the "
                 f"tokens ({section('2.6')})"),
                (like(lambda: _self_variant(x, cosine="both", mix="unit"), **tol),
                 f"the cosine changes the weights only: z still mixes the original vectors x, "
                 f"not the unit vectors ({section('2.6')})"),
            ]
        reference = reference_self_attention(x, similarity=similarity)
        run.compare(case, inputs, got, reference, hint, mistakes=mistakes, **tol)

    toy = TOY.clone()
    dot_hint = (f"scores = x @ x^T, weights = softmax over each row, z = weights @ x "
                f"({section('2.4')})")
    check(SELF_PLAN[0], toy, "dot", "x = the toy sentence (6, 3) of section 2.1, "
          "similarity = 'dot'", dot_hint)
    run.passed(SELF_PLAN[0])
    check(SELF_PLAN[1], toy, "cosine", "x = the toy sentence (6, 3) of section 2.1, "
          "similarity = 'cosine'",
          f"cosine scores are the dot products of unit vectors, x / |x|; the output still "
          f"mixes x ({section('2.6')})")
    run.passed(SELF_PLAN[1])
    gen = torch.Generator().manual_seed(3)
    xb = randn(gen, 2, 5, 4)
    batch_hint = (f"a batch of sequences (B, T, D): transpose the last two axes, "
                  f"x.transpose(-2, -1) (or x.mT), not x.T ({section('2.4')})")
    for similarity in ("dot", "cosine"):
        check(SELF_PLAN[2], xb, similarity,
              f"random x (2, 5, 4), float64, seed 3, similarity = {similarity!r}", batch_hint)
    run.passed(SELF_PLAN[2])


def self_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check simple self-attention, ``fn(x, similarity="dot") -> (z, weights)`` (Chapter 2).

    ``x (..., T, D)``; ``similarity`` is ``"dot"`` (scores ``x_i . x_j``) or ``"cosine"``
    (the dot products of ``x_i / |x_i|``). ``weights (..., T, T)`` is the row-wise softmax
    of the scores and ``z (..., T, D) = weights @ x`` (sections 2.4 and 2.6).
    """
    return run_check("self_attention", SELF_PLAN, fn, _self_attention_body)


# ----------------------------------------------------------------------- qkv_projection

#: Section 3.3's worked example: two tokens, W_Q and W_K (4, 3), W_V (4, 2).
WORKED_X = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
WORKED_W = (torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]]),
            torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 2.0], [2.0, 1.0, 0.0], [0.0, 2.0, 1.0]]),
            torch.tensor([[1.0, 0.0], [0.0, 2.0], [2.0, 1.0], [1.0, 1.0]]))

QKV_PLAN = (
    "the worked example of 3.3: X (2, 4), W_Q and W_K (4, 3), W_V (4, 2)",
    "square matrices (4, 4), where x @ W^T runs but is wrong (3.4), float64",
    "a batch x (2, 5, 4) with matrices (4, 3), (4, 3), (4, 2), float64",
)


def _qkv_body(run: Run, fn: Callable[..., Any]) -> None:
    transpose_hint = (f"a textbook matrix W (d_in, d_out) multiplies from the right, "
                      f"q = x @ W; only nn.Linear's weight is stored transposed "
                      f"({section('3.4')})")
    batch_hint = (f"use @ (torch.matmul), which broadcasts over the batch dimensions, not "
                  f"torch.mm or a 2-D einsum ({section('3.5')})")

    def check(case: str, x: Tensor, ws: tuple[Tensor, Tensor, Tensor], inputs: str,
              hint: str, tol: Tolerance) -> None:
        got = run.call(case, inputs, lambda: fn(x.clone(), *(w.clone() for w in ws)), hint,
                       errors=[("size mismatch", transpose_hint),
                               ("cannot be multiplied", transpose_hint),
                               ("must be a matrix", batch_hint),
                               ("2D", batch_hint)])
        q, k, v = (x @ w for w in ws)
        run.compare(case, inputs, got, (q, k, v), hint, **tol, mistakes=[
            (like(lambda: tuple(x @ w.T for w in ws), **tol), transpose_hint),
            (like(lambda: (k, q, v), **tol),
             f"return (q, k, v) in this order: q from W_Q, k from W_K, v from W_V "
             f"({section('3.3')})"),
            (like(lambda: (q / math.sqrt(q.shape[-1]), k, v), **tol),
             f"the projection is only x @ W; the 1 / sqrt(d_k) scaling belongs to the scores "
             f"({section('4.2')})"),
        ])
        run.passed(case)

    check(QKV_PLAN[0], WORKED_X.clone(), WORKED_W,
          "X, W_Q, W_K, W_V of section 3.3 (float32)",
          f"q = x @ W_Q, k = x @ W_K, v = x @ W_V ({section('3.3')})", LOOSE)
    gen = torch.Generator().manual_seed(4)
    x = randn(gen, 5, 4)
    square = (randn(gen, 4, 4), randn(gen, 4, 4), randn(gen, 4, 4))
    check(QKV_PLAN[1], x, square, "random x (5, 4) and W_Q, W_K, W_V (4, 4), float64, seed 4",
          transpose_hint, TIGHT)
    xb = randn(gen, 2, 5, 4)
    ws = (randn(gen, 4, 3), randn(gen, 4, 3), randn(gen, 4, 2))
    check(QKV_PLAN[2], xb, ws, "random x (2, 5, 4), W_Q and W_K (4, 3), W_V (4, 2), float64, "
          "seed 4", batch_hint, TIGHT)


def qkv_projection(fn: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> CheckResult:
    """Check the Q/K/V projection step, ``fn(x, w_q, w_k, w_v) -> (q, k, v)`` (Chapter 3).

    ``x (..., T, d_in)``; the matrices are in the textbook orientation, ``w_q`` and ``w_k``
    ``(d_in, d_k)``, ``w_v (d_in, d_v)``; ``q = x @ w_q (..., T, d_k)``, likewise ``k``,
    and ``v (..., T, d_v)`` (sections 3.3 and 3.4).
    """
    return run_check("qkv_projection", QKV_PLAN, fn, _qkv_body)


# ---------------------------------------------------------------- self_attention_layer

LAYER_PLAN = (
    "the class builds q_proj, k_proj, v_proj: nn.Linear(d_in=6, d_out=4, bias=False) (3.5)",
    "x (2, 5, 6), float64, against course_attn.SelfAttention with the same weights",
    "d_in = d_out = 8, x (1, 3, 8), float64",
)


def _layer_variant(ref: ReferenceSelfAttention, x: Tensor, *, scale: float | None = None,
                   dim: int = -1, query: str = "q", values: str = "v") -> Tensor:
    q = ref.q_proj(x) if query == "q" else ref.k_proj(x)  # (B, T, d_out)
    k, v = ref.k_proj(x), ref.v_proj(x)  # (B, T, d_out)
    scores = q @ k.mT / (math.sqrt(k.shape[-1]) if scale is None else scale)  # (B, T, T)
    weights = torch.softmax(scores, dim=dim)
    return weights @ (v if values == "v" else x)


def _layer_body(run: Run, cls: type) -> None:
    names_hint = (f"name the three projections q_proj, k_proj and v_proj, each "
                  f"nn.Linear(d_in, d_out, bias=False), so that the check can copy weights into "
                  f"them ({section('3.5')})")

    def build(case: str, d_in: int, d_out: int) -> nn.Module:
        inputs = f"{cls.__name__}(d_in={d_in}, d_out={d_out})"
        layer = run.call(case, inputs, lambda: cls(d_in, d_out), names_hint)
        for name in ("q_proj", "k_proj", "v_proj"):
            linear = getattr(layer, name, None)
            if not isinstance(linear, nn.Linear):
                run.fail(case, inputs, f"an attribute {name}, an nn.Linear",
                         "no such attribute" if linear is None else f"a {type(linear).__name__}",
                         names_hint)
            assert isinstance(linear, nn.Linear)  # for the type checker; fail() raised
            if (linear.in_features, linear.out_features) != (d_in, d_out):
                run.fail(case, inputs, f"{name} = nn.Linear({d_in}, {d_out})",
                         f"nn.Linear({linear.in_features}, {linear.out_features})", names_hint)
        if not isinstance(layer, nn.Module):
            run.fail(case, inputs, "an nn.Module", f"a {type(layer).__name__}", names_hint)
        return layer

    def compare(case: str, d_in: int, d_out: int, x: Tensor, inputs: str) -> None:
        ref = ReferenceSelfAttention(d_in, d_out).double()
        layer = build(case, d_in, d_out).double()
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(layer, name).weight.copy_(getattr(ref, name).weight)
                if getattr(layer, name).bias is not None:
                    getattr(layer, name).bias.zero_()
        hint = (f"out = softmax(q k^T / sqrt(d_out)) v with q = self.q_proj(x), "
                f"k = self.k_proj(x), v = self.v_proj(x) ({section('3.5')})")
        got = first(run.call(case, inputs, lambda: layer(x.clone()), hint,
                             errors=[(phrase, f"call the layer, self.q_proj(x), which "
                                      f"computes x @ weight^T ({section('3.4')})")
                                     for phrase in ("size mismatch", "cannot be multiplied")]))
        expected, _ = ref(x)
        with torch.no_grad():
            run.compare(case, inputs, got, expected.detach(), hint, **TIGHT, mistakes=[
                (like(lambda: _layer_variant(ref, x, scale=math.sqrt(d_in))),
                 f"scale by sqrt(d_out), the width of the keys, not sqrt(d_in) "
                 f"({section('3.5')})"),
                (like(lambda: _layer_variant(ref, x, scale=1.0)),
                 f"divide the scores by sqrt(d_k) = sqrt(d_out) before the softmax "
                 f"({section('4.2')})"),
                (like(lambda: _layer_variant(ref, x, dim=-2)),
                 f"softmax over the keys (the last dimension), so each query's weights sum to 1 "
                 f"({section('3.5')})"),
                (like(lambda: _layer_variant(ref, x, query="k")),
                 f"queries come from q_proj, keys from k_proj ({section('3.5')})"),
            ])
        run.passed(case)

    case = LAYER_PLAN[0]
    build(case, 6, 4)
    run.passed(case)
    gen = torch.Generator().manual_seed(5)
    compare(LAYER_PLAN[1], 6, 4, randn(gen, 2, 5, 6), "random x (2, 5, 6), float64, seed 5")
    compare(LAYER_PLAN[2], 8, 8, randn(gen, 1, 3, 8), "random x (1, 3, 8), float64, seed 5")


def self_attention_layer(cls: type[nn.Module]) -> CheckResult:
    """Check a single-head self-attention class, ``cls(d_in, d_out)`` (Chapter 3).

    The class builds ``q_proj``, ``k_proj`` and ``v_proj`` (each ``nn.Linear(d_in, d_out,
    bias=False)``; the check copies the reference's weights into them); its forward takes
    ``x (B, T, d_in)`` and returns ``out (B, T, d_out)`` or ``(out, weights)``, with
    ``out = softmax(q k^T / sqrt(d_out)) v`` (section 3.5).
    """
    return run_check("self_attention_layer", LAYER_PLAN, cls, _layer_body, arg="cls",
                     want_class=True)


# ---------------------------------------------------------------------- attention_scores

#: Section 4.5's worked example: X (4, 3) and W (3, 2), with Q = K = V = X @ W.
WORKED_4X3 = (torch.tensor([[1.0, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], dtype=F64)
              @ torch.tensor([[1.0, 0], [0, 1], [1, 1]], dtype=F64))

SCORES_PLAN = (
    "the worked example of 3.3: Q and K (2, 3), scores Q K^T / sqrt(3)",
    "T_q = 5 queries against T_k = 7 keys of width d_k = 16, float64",
    "batch dimensions (2, 3, 4, 8) and (2, 3, 6, 8), float64",
)


def _scores_body(run: Run, fn: Callable[..., Any]) -> None:
    def check(case: str, q: Tensor, k: Tensor, inputs: str) -> None:
        hint = (f"scores = q k^T / sqrt(d_k), with d_k the width of q and k "
                f"({section('4.2')})")
        got = run.call(case, inputs, lambda: fn(q.clone(), k.clone()), hint)
        raw = q @ k.transpose(-2, -1)
        d_k = q.shape[-1]
        run.compare(case, inputs, got, raw / math.sqrt(d_k), hint, **TIGHT, mistakes=[
            (like(lambda: raw),
             f"divide the dot products by sqrt(d_k): their variance grows with d_k "
             f"({section('4.2')})"),
            (like(lambda: raw / d_k),
             f"divide by sqrt(d_k), not by d_k: the dot product's standard deviation grows as "
             f"sqrt(d_k) ({section('4.2')})"),
            (like(lambda: raw / math.sqrt(k.shape[-2])),
             f"the scale is sqrt(d_k), the width of the keys, not their number T_k "
             f"({section('4.2')})"),
            (like(lambda: raw.transpose(-2, -1) / math.sqrt(d_k)),
             f"row i is query i: scores = q @ k^T has shape (T_q, T_k) ({section('4.1')})"),
        ])
        run.passed(case)

    check(SCORES_PLAN[0], WORKED_X @ WORKED_W[0], WORKED_X @ WORKED_W[1],
          "q = X @ W_Q and k = X @ W_K of section 3.3 (2, 3)")
    gen = torch.Generator().manual_seed(6)
    check(SCORES_PLAN[1], randn(gen, 5, 16), randn(gen, 7, 16),
          "random q (5, 16) and k (7, 16), float64, seed 6")
    check(SCORES_PLAN[2], randn(gen, 2, 3, 4, 8), randn(gen, 2, 3, 6, 8),
          "random q (2, 3, 4, 8) and k (2, 3, 6, 8), float64, seed 6")


def attention_scores(fn: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """Check scaled attention scores, ``fn(q, k) -> q k^T / sqrt(d_k)`` (Chapter 4).

    ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``; returns ``(..., T_q, T_k)``: row ``i``
    holds query ``i``'s scores against every key (sections 4.1 and 4.2).
    """
    return run_check("attention_scores", SCORES_PLAN, fn, _scores_body)


# ----------------------------------------------------------------------------- attention

ATTENTION_PLAN = (
    "the worked example of 4.5: q = k = v (4, 2), out and weights (4.5)",
    "T_q = 5, T_k = 7, d_k = 16, d_v = 8, batch (2, 3), float64, against the reference",
    "large scores (q and k times 30): finite weights (1.6, 4.3)",
    "float64 gradients of q, k and v through your function (4.4)",
)


def _attention_variant(q: Tensor, k: Tensor, v: Tensor, *, divide: float,
                       dim: int = -1) -> tuple[Tensor, Tensor]:
    weights = torch.softmax(q @ k.transpose(-2, -1) / divide, dim=dim)  # (..., T_q, T_k)
    return weights @ v, weights  # (..., T_q, d_v)


def _attention_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"out = softmax(q k^T / sqrt(d_k)) v, softmax over the keys (the last dimension); "
            f"return (out, weights) ({section('4.1')})")

    def mistakes(q: Tensor, k: Tensor, v: Tensor) -> list[tuple[Callable[[object], bool], str]]:
        d_k = q.shape[-1]
        return [
            (lambda g: isinstance(g, Tensor),
             f"return a pair (out, weights), not only out ({section('4.1')})"),
            (like(lambda: _attention_variant(q, k, v, divide=1.0)),
             f"scale the scores by 1 / sqrt(d_k), so that their spread does not grow with "
             f"d_k ({section('4.2')})"),
            (like(lambda: _attention_variant(q, k, v, divide=float(d_k))),
             f"divide by sqrt(d_k), not by d_k: the dot product's standard deviation grows as "
             f"sqrt(d_k) ({section('4.2')})"),
            (like(lambda: _attention_variant(q, k, v, divide=math.sqrt(v.shape[-1]))),
             f"scale by sqrt(d_k), the width of q and k, not sqrt(d_v) ({section('4.2')})"),
            (like(lambda: _attention_variant(q, k, v, divide=math.sqrt(d_k), dim=-2)),
             f"softmax over the keys (dim=-1), so each query's weights sum to 1 "
             f"({section('4.1')})"),
            (has_nan, f"your attention gives NaN: use a softmax that subtracts the row maximum "
                      f"({section('1.6')})"),
        ]

    def check(case: str, q: Tensor, k: Tensor, v: Tensor, inputs: str) -> tuple[Tensor, ...]:
        got = run.call(case, inputs, lambda: fn(q, k, v), hint,
                       errors=[("must match the size", f"use k.transpose(-2, -1), not k.T, so "
                                f"batch dimensions stay in place ({section('4.1')})")])
        with torch.no_grad():
            expected = reference_attention(q, k, v)
        run.compare(case, inputs, got, expected, hint, mistakes=mistakes(q, k, v), **TIGHT)
        run.passed(case)
        return got

    check(ATTENTION_PLAN[0], WORKED_4X3.clone(), WORKED_4X3.clone(), WORKED_4X3.clone(),
          "q = k = v = X @ W of section 4.5 (4, 2), float64")
    gen = torch.Generator().manual_seed(7)
    q, k, v = randn(gen, 2, 3, 5, 16), randn(gen, 2, 3, 7, 16), randn(gen, 2, 3, 7, 8)
    check(ATTENTION_PLAN[1], q, k, v,
          "random q (2, 3, 5, 16), k (2, 3, 7, 16), v (2, 3, 7, 8), float64, seed 7")
    check(ATTENTION_PLAN[2], 30 * q, 30 * k, v, "30 * the q and k above, the same v")

    case = ATTENTION_PLAN[3]
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    grad_out = randn(gen, 2, 3, 5, 8)
    inputs = "the q, k, v above with requires_grad=True; the gradient of (out * g).sum()"
    grad_hint = (f"keep the whole computation in torch, differentiable: no .detach(), "
                 f".item(), .numpy() or new tensors built from values ({section('4.4')})")
    got = first(run.call(case, inputs, lambda: fn(*leaves), grad_hint))
    if not isinstance(got, Tensor) or not got.requires_grad:
        run.fail(case, inputs, "an output that carries a gradient",
                 "an output detached from q, k and v", grad_hint)
    assert isinstance(got, Tensor)  # for the type checker; fail() raised otherwise
    grads = run.call(case, inputs, lambda: torch.autograd.grad(
        got, leaves, grad_out, allow_unused=True), grad_hint)
    grads = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves,
                                                                           strict=True))
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out_ref, _ = reference_attention(*ref_leaves)
    expected = torch.autograd.grad(out_ref, ref_leaves, grad_out)
    run.compare(case, inputs, grads, expected, grad_hint, **TIGHT)
    run.passed(case)


def attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check scaled dot-product attention, ``fn(q, k, v) -> (out, weights)`` (Chapter 4).

    ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``, ``v (..., T_k, d_v)``; ``weights (..., T_q,
    T_k) = softmax(q k^T / sqrt(d_k))`` over the keys and ``out (..., T_q, d_v) = weights @
    v``; no mask, no dropout. The check also compares float64 gradients (sections 4.1-4.5).
    """
    return run_check("attention", ATTENTION_PLAN, fn, _attention_body)
