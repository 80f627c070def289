"""Checks for chapters 1 and 2: softmax, attention pooling, simple self-attention.

Each check is a table (:class:`~course_attn.check.runner.Check`): the package's reference,
the cases (the chapter's examples first, then size-1 dimensions, seeded random ones and a
gradient where the chapter says gradients flow) and the known mistakes, each a wrong
implementation with its hint. :func:`~course_attn.check.runner.run_check` runs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..core.self_attention import simple_self_attention as reference_self_attention
from ..core.softmax import attention_pool as reference_pool
from ..core.softmax import softmax as reference_softmax
from .common import F64, gen, gradient_properties, not_normalised, randn
from .harness import gradients
from .report import CheckResult, section
from .runner import Case, Check, Harness, Inputs, Mistake, Property, args, call, run_check
from .values import FLOAT32, show

__all__ = ["attention_pool", "self_attention", "softmax"]


# ------------------------------------------------------------------------------ softmax


def _softmax_reference(x: Tensor, temperature: float = 1.0) -> Tensor:
    return reference_softmax(x, temperature=temperature)


def _exp_over_sum(shifted: Tensor, dim: int = -1) -> Tensor:
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def _shifted(x: Tensor, dim: int = -1) -> Tensor:
    return x - x.amax(dim=dim, keepdim=True)


SOFTMAX_MISTAKES = (
    Mistake(lambda x, temperature=1.0: x / x.sum(-1, keepdim=True),
            f"you normalised the raw scores; softmax exponentiates them first, which makes "
            f"every weight positive ({section('1.2')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum(_shifted(x / temperature, 0), 0),
            f"each row (the last dimension, dim=-1) must sum to 1, not each column: take the "
            f"max and the sum over dim=-1 ({section('1.3')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum(_shifted(x / temperature, 1), 1),
            f"take the softmax along the last dimension (dim=-1), where each row's scores "
            f"are, whatever the number of dimensions ({section('1.3')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum(_shifted(x * temperature)),
            f"divide the scores by the temperature, do not multiply: a temperature below 1 "
            f"must sharpen the weights ({section('1.5')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum(_shifted(x)),
            f"the temperature changes nothing in your softmax: divide the scores by it "
            f"before exp ({section('1.5')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum(x / temperature),
            f"your softmax gives NaN for scores of 1000: exp(1000) is inf and inf / inf is "
            f"NaN; subtract each row's maximum first ({section('1.6')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum(_shifted(x / temperature)),
            f"subtract the maximum first, then divide by the temperature: divided first, "
            f"100 / 0.001 overflows float16 to inf, and inf - inf is NaN ({section('1.6')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum(_shifted(x / temperature) / temperature),
            f"divide by the temperature once: dividing before and after subtracting the "
            f"maximum divides the scores by temperature^2 ({section('1.5')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum((x - x.max()) / temperature),
            f"the row near -1000 gives 0 / 0 = NaN: subtract each row's own maximum "
            f"(dim=-1, keepdim=True), not the maximum of the whole tensor ({section('1.6')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum((x - x.amax(-1)) / temperature),
            f"keep the maximum's and the sum's dimension (keepdim=True), so that they "
            f"broadcast along each row ({section('1.6')})"),
    Mistake(lambda x, temperature=1.0: _exp_over_sum((x - x.amin(-1, keepdim=True))
                                                     / temperature),
            f"subtract each row's maximum, not the minimum: exp(x - min) overflows to inf "
            f"for a row that spans more than about 709 ({section('1.6')})"),
)

SCORES = torch.tensor([[2.0, 1.0, 0.1], [0.0, 0.0, 0.0]], dtype=F64)
BIG = torch.tensor([[1000.0, 999.0, 998.0]], dtype=F64)
MIXED = torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1002.0], [0.0, 5.0, -3.0],
                      [0.0, -800.0, 5.0]], dtype=F64)
#: Section 1.6's float16 row: 100 / 0.001 is beyond float16's 65504.
TINY_T = torch.tensor([[100.0, 99.0, 98.0]], dtype=torch.float16)
MASKED = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, 2.0, 2.0]], dtype=F64)
EXP_HINT = "softmax(x)_i = exp(x_i) / sum_j exp(x_j), along the last dimension"
MAX_HINT = "subtract each row's own maximum, x.amax(dim=-1, keepdim=True), before exp"


def _softmax_case(plan: str, x: Tensor, temperature: float | None, hint: str, number: str,
                  describe: str = "") -> Case:
    """A softmax case; ``temperature=None`` leaves it to the function's default."""
    words = describe or f"x = {show(x)}, " + (
        "temperature left to its default" if temperature is None
        else f"temperature = {show(temperature)}")
    keyword = {} if temperature is None else {"temperature": temperature}
    return Case(plan, lambda: args(x, **keyword), words, hint, number, FLOAT32)


SOFTMAX = Check("softmax", _softmax_reference, (
    _softmax_case("two rows of scores, [[2, 1, 0.1], [0, 0, 0]], temperature left to its "
                  "default, 1: each row becomes exp / sum", SCORES, None,
                  f"{EXP_HINT}; a call without a temperature uses the default, 1.0", "1.3"),
    *(_softmax_case("temperatures 0.5 and 4: the scores are divided by the temperature",
                    SCORES, t, "softmax(x / temperature)", "1.5") for t in (0.5, 4.0)),
    _softmax_case("scores of 1000: no NaN, the row maximum is subtracted first", BIG, 1.0,
                  MAX_HINT, "1.6"),
    _softmax_case("rows near 1000, near -1000 and near 0, and one spanning 805, at once: "
                  "each row its own maximum", MIXED, 1.0, MAX_HINT, "1.6"),
    _softmax_case("a score of -inf, as chapter 5's masks set, gets weight 0", MASKED, 1.0,
                  "a score of -inf (a blocked key) must get weight exp(-inf) = 0 and leave the "
                  "other weights summing to 1", "1.6"),
    *(_softmax_case("size-1 dimensions: x (1, 1, 4), and rows of a single score (3, 1)",
                    x, 1.0, EXP_HINT, "1.3", f"x = {show(x)}, temperature = 1")
      for x in (randn(gen(1), 1, 1, 4), randn(gen(1), 3, 1))),
    Case("random scores (2, 3, 7), float64, temperature 0.7, against course_attn.softmax",
         lambda: args(randn(gen(1), 2, 3, 7, scale=3.0), temperature=0.7),
         "random x of shape (2, 3, 7), float64, seed 1, temperature = 0.7",
         "work along the last dimension of a batch of rows of any shape, and keep the "
         "input's shape and dtype", "1.3", FLOAT32),
    _softmax_case("float16 scores [100, 99, 98] at temperature 0.001: the maximum "
                  "subtracted before dividing by the temperature gives [1, 0, 0], no NaN",
                  TINY_T, 0.001, "subtract each row's maximum, then divide by the temperature: "
                  "(x - max) / temperature is at most 0 for any temperature", "1.6",
                  f"x = {show(TINY_T)}, float16, temperature = 0.001"),
    Case("the float64 gradient of your weights with respect to x",
         lambda: args(randn(gen(1), 2, 3, 7, scale=3.0), temperature=0.7),
         "the random x above with requires_grad=True, temperature = 0.7; the gradient of "
         "(weights * w).sum() for fixed w",
         "keep the computation in torch, differentiable: no .detach(), .item() or new "
         "tensors built from values", "4.4", FLOAT32, gradients((0,)),
         properties=gradient_properties(("x",), "4.4")),
), params=("x", "temperature"), mistakes=SOFTMAX_MISTAKES,
    properties=(not_normalised(None, f"your rows do not sum to 1: divide exp(x) by its sum "
                                     f"over the last dimension, keepdim=True "
                                     f"({section('1.3')})"),),
    errors=(("must match the size", f"keep the maximum's and the sum's dimension "
                                    f"(keepdim=True), so that they broadcast along each row "
                                    f"({section('1.6')})"),))


def softmax(fn: Callable[..., Tensor]) -> CheckResult:
    """Check a softmax with temperature, ``fn(x, temperature=1.0)`` (Chapter 1).

    ``fn`` takes scores ``x (..., N)`` and a positive ``temperature`` and returns the
    weights ``(..., N)``, same dtype: ``exp(x / T)`` normalised along the last
    dimension, with each row's maximum subtracted first (sections 1.3, 1.5 and 1.6).
    It must not change ``x``, and gradients must flow back into it.
    """
    return run_check(SOFTMAX, fn)


# ----------------------------------------------------------------------- attention_pool


def _pool(x: Tensor, query: Tensor, divide: Callable[[Tensor], float],
          naive: bool = False, dim: int = -1, mean: bool = False) -> tuple[Tensor, Tensor]:
    """Attention pooling with the scores divided by ``divide(x)`` (a mistake when not
    sqrt(D)), their softmax over ``dim`` (a mistake when not the last), or the weighted
    tokens averaged (``mean``, a mistake)."""
    scores = (x @ query.unsqueeze(-1)).squeeze(-1) / divide(x)  # (..., T)
    weights = _exp_over_sum(scores) if naive else torch.softmax(scores, dim=dim)  # (..., T)
    pooled = (weights.unsqueeze(-2) @ x).squeeze(-2)  # (..., D)
    return (pooled / x.shape[-2] if mean else pooled), weights


def _sqrt_d(x: Tensor) -> float:
    return math.sqrt(x.shape[-1])


POOL_MISTAKES = (
    Mistake(lambda x, query: reference_pool(x, query)[0],
            f"return a pair (pooled, weights), not only the pooled vector ({section('1.7')})"),
    Mistake(lambda x, query: tuple(reversed(reference_pool(x, query))),
            f"return (pooled, weights) in this order ({section('1.7')})"),
    Mistake(lambda x, query: _pool(x, query, lambda x: 1.0),
            f"scale the dot products by 1 / sqrt(D) before the softmax ({section('1.7')})"),
    Mistake(lambda x, query: _pool(x, query, lambda x: x.shape[-1]),
            f"divide the scores by sqrt(D), not by D ({section('1.7')})"),
    Mistake(lambda x, query: _pool(x, query, lambda x: math.sqrt(x.shape[-2])),
            f"divide by sqrt(D), the width of the tokens, not sqrt(T), their number "
            f"({section('1.7')})"),
    Mistake(lambda x, query: _pool(x, query, _sqrt_d, mean=True),
            f"the pooled vector is the weighted sum of the tokens, weights @ x: the weights "
            f"already sum to 1, so do not average (no mean over T) ({section('1.7')})"),
    Mistake(lambda x, query: _pool(x, query, _sqrt_d, dim=0),
            f"softmax over the tokens, the last dimension of the scores (dim=-1), so that "
            f"each sequence's weights sum to 1 ({section('1.7')})"),
    Mistake(lambda x, query: _pool(x, query, _sqrt_d, naive=True),
            f"your weights hold NaN: use a softmax that subtracts the row maximum "
            f"({section('1.6')})"),
)

TOKENS = torch.tensor([[1.0, 0, 0, 0], [0, 2, 0, 0], [0, 0, 1, 0], [1, 1, 1, 1]], dtype=F64)
QUERY = torch.tensor([2.0, 0, 0, 1], dtype=F64)
POOL_HINT = ("pooled = softmax(x . query / sqrt(D)) @ x: score each token by its dot product "
             "with the query, scaled by 1 / sqrt(D)")
BATCH_HINT = ("score every token of every sequence at once: (..., T, D) @ (..., D, 1) -> "
              "(..., T, 1), i.e. x @ query.unsqueeze(-1), so leading dimensions broadcast")


def _pool_case(plan: str, shapes: tuple[tuple[int, ...], tuple[int, ...]], hint: str,
               harness: Harness = call, properties: tuple[Property, ...] = ()) -> Case:
    def inputs() -> Inputs:
        g = gen(2)
        return args(randn(g, *shapes[0]), randn(g, *shapes[1]))

    return Case(plan, inputs, f"random x {shapes[0]} and query {shapes[1]}, float64, seed 2",
                hint, "1.7", FLOAT32, harness, properties)


ATTENTION_POOL = Check("attention_pool", reference_pool, (
    Case("one query over four tokens: weights softmax(x . q / sqrt(D)), pooled = weights @ x",
         lambda: args(TOKENS, QUERY), f"x = {show(TOKENS, limit=16)}, query = {show(QUERY)}",
         POOL_HINT, "1.7", FLOAT32),
    Case("the zero query: uniform weights, pooled = the mean token",
         lambda: args(TOKENS, torch.zeros(4, dtype=F64)),
         f"x = {show(TOKENS, limit=16)}, query = [0, 0, 0, 0]",
         "a query of zeros scores every token 0: uniform weights, and the pooled vector is "
         "the mean of the tokens", "1.7", FLOAT32),
    _pool_case("a batch: x (2, 5, 6) with one query per sequence (2, 6), float64",
               ((2, 5, 6), (2, 6)), BATCH_HINT),
    _pool_case("broadcasting: x (1, 5, 6) against three queries (3, 6), float64",
               ((1, 5, 6), (3, 6)), BATCH_HINT),
    *(_pool_case("size-1 dimensions: one sequence (1, 5, 6) with one query (1, 6), and "
                 "sequences of one token (2, 1, 6)", shapes, BATCH_HINT)
      for shapes in (((1, 5, 6), (1, 6)), ((2, 1, 6), (2, 6)))),
    Case("large tokens and query (scores near 3000): no NaN",
         lambda: args(40.0 * TOKENS, torch.tensor([40.0, 40.0, 0, 40.0], dtype=F64)),
         "x = 40 * the first x, query = [40, 40, 0, 40]",
         "large scores must not overflow: use a softmax that subtracts the row maximum",
         "1.6", FLOAT32),
    _pool_case("float64 gradients of x and query through pooled", ((2, 5, 6), (2, 6)),
               "keep the computation in torch, differentiable: no .detach(), .item() or new "
               "tensors built from values", harness=gradients((0, 1)),
               properties=gradient_properties(("x", "query"), "1.7")),
), params=("x", "query"), mistakes=POOL_MISTAKES,
    errors=(("einsum()", f"{BATCH_HINT} ({section('1.7')})"),))


def attention_pool(fn: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check attention pooling with a task query, ``fn(x, query) -> (pooled, weights)`` (Ch. 1).

    ``x (..., T, D)`` are token vectors, ``query (..., D)`` one query per sequence
    (leading dimensions broadcast); ``weights (..., T) = softmax(x . query / sqrt(D))``
    and ``pooled (..., D) = weights @ x`` (section 1.7). Gradients must reach ``x`` and
    ``query``, and neither may be changed.
    """
    return run_check(ATTENTION_POOL, fn)


# ---------------------------------------------------------------- simple self-attention

TOY = torch.tensor([[0.1, 0.1, 0.9], [0.9, 0.2, 0.1], [0.6, 0.3, 0.2], [0.1, 0.4, 0.8],
                    [0.1, 0.1, 0.9], [0.2, 0.9, 0.1]])  # chapter 2's "the cat sat on the mat"


def _self_variant(x: Tensor, similarity: str = "dot", *, scale: float = 1.0, dim: int = -1,
                  cosine: str = "both", mix: str = "x") -> tuple[Tensor, Tensor]:
    """Simple self-attention with one thing changed (a mistake), for recognising it."""
    unit = x / x.norm(dim=-1, keepdim=True)
    columns = x / x.norm(dim=-2, keepdim=True)
    scores = {"both": unit @ unit.mT, "queries": unit @ x.mT, "columns": columns @ columns.mT,
              "none": x @ x.mT}[cosine if similarity == "cosine" else "none"]
    weights = torch.softmax(scores / scale, dim=dim)
    return weights @ (unit if mix == "unit" and similarity == "cosine" else x), weights


ZERO_HINT = (f"a zero vector has no direction, and x / |x| gives it 0 / 0 = NaN: give it "
             f"cosine 0 with every token, as F.normalize(x, dim=-1) does (it divides by "
             f"max(|x|, eps)), so that its row of weights is uniform ({section('2.6')})")

SELF_MISTAKES = (
    Mistake(lambda x, similarity="dot": reference_self_attention(x, similarity=similarity)[0],
            f"return a pair (z, weights), not only z ({section('2.4')})"),
    Mistake(lambda x, similarity="dot": _self_variant(x, similarity,
                                                      scale=math.sqrt(x.shape[-1])),
            f"chapter 2's scores are the plain similarities, not scaled by sqrt(D): the "
            f"scaling comes with the projections of chapter 4 ({section('2.4')})"),
    Mistake(lambda x, similarity="dot": _self_variant(x, similarity, dim=-2),
            f"each row of the weights belongs to one query and must sum to 1: softmax over "
            f"the last dimension, not over the queries ({section('2.4')})"),
    Mistake(lambda x, similarity="dot": _self_variant(x, similarity, cosine="none"),
            f"your cosine scores are plain dot products: divide each vector by its length "
            f"first, unit = F.normalize(x, dim=-1) (a zero vector stays zero), then "
            f"unit @ unit^T ({section('2.6')})"),
    Mistake(lambda x, similarity="dot": _self_variant(x, similarity, cosine="queries"),
            f"normalise both sides of the dot product, the keys as well as the queries "
            f"({section('2.6')})"),
    Mistake(lambda x, similarity="dot": _self_variant(x, similarity, cosine="columns"),
            f"normalise each token's vector (a row, dim=-1), not each feature across the "
            f"tokens ({section('2.6')})"),
    Mistake(lambda x, similarity="dot": _self_variant(x, similarity, mix="unit"),
            f"the cosine changes the weights only: z still mixes the original vectors x, "
            f"not the unit vectors ({section('2.6')})"),
    Mistake(lambda x, similarity="dot": _self_variant(x, similarity), ZERO_HINT),
)

DOT_HINT = "scores = x @ x^T, weights = softmax over each row, z = weights @ x"
SELF_BATCH_HINT = ("a batch of sequences (B, T, D): transpose the last two axes, "
                   "x.transpose(-2, -1) (or x.mT), not x.T")


def _with_zero_token() -> Tensor:
    x = randn(gen(3), 2, 4, 3)
    x[1, 2] = 0.0  # a token with no direction
    return x


def _self_case(plan: str, x: Tensor, similarity: str | None, describe: str, hint: str,
               number: str) -> Case:
    """A case of self-attention; ``similarity=None`` leaves it to the function's default."""
    keyword = {} if similarity is None else {"similarity": similarity}
    words = "similarity left to its default" if similarity is None else \
        f"similarity = {similarity!r}"
    return Case(plan, lambda: args(x, **keyword), f"{describe}, {words}", hint, number,
                FLOAT32)


SELF_ATTENTION = Check("self_attention", lambda x, similarity="dot": reference_self_attention(
    x, similarity=similarity), (
    _self_case("the toy sentence (6, 3), similarity left to its default, the dot product: z "
               "= softmax(x x^T) x", TOY, None, "x = the toy sentence (6, 3) of section 2.1, "
               "float32", f"{DOT_HINT}; similarity=\"dot\" is the default", "2.4"),
    _self_case("the toy sentence, cosine: the scores of unit vectors, the original vectors "
               "mixed", TOY, "cosine", "x = the toy sentence (6, 3) of section 2.1, float32",
               "cosine scores are the dot products of unit vectors, x / |x|; the output still "
               "mixes x", "2.6"),
    *(_self_case("a batch (2, 5, 4), float64, dot and cosine, against "
                 "course_attn.simple_self_attention", randn(gen(3), 2, 5, 4), similarity,
                 "random x (2, 5, 4), float64, seed 3", SELF_BATCH_HINT, "2.4")
      for similarity in ("dot", "cosine")),
    *(_self_case("size-1 dimensions: a batch of one sequence (1, 4, 3), and one token "
                 "(2, 1, 3)", randn(gen(3), *shape), "cosine",
                 f"random x {shape}, float64, seed 3", DOT_HINT, "2.4")
      for shape in ((1, 4, 3), (2, 1, 3))),
    _self_case("a zero token, cosine: it has cosine 0 with every token, so its weights are "
               "uniform and its output is the mean token, no NaN", _with_zero_token(),
               "cosine", "random x (2, 4, 3), float64, seed 3, with token 2 of sequence 1 all "
               "zeros", "a zero vector has cosine 0 with every token (F.normalize divides by "
               "max(|x|, eps)): uniform weights in its row, and z its row's mean token",
               "2.6"),
), params=("x", "similarity"), mistakes=SELF_MISTAKES,
    errors=(("must match the size", f"{SELF_BATCH_HINT} ({section('2.4')})"),))


def self_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check simple self-attention, ``fn(x, similarity="dot") -> (z, weights)`` (Chapter 2).

    ``x (..., T, D)``; ``similarity`` is ``"dot"`` (scores ``x_i . x_j``) or ``"cosine"``
    (the dot products of ``x_i / |x_i|``). ``weights (..., T, T)`` is the row-wise softmax
    of the scores and ``z (..., T, D) = weights @ x`` (sections 2.4 and 2.6).
    """
    return run_check(SELF_ATTENTION, fn)
