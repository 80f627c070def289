"""Checks for chapter 5: the causal mask, the padding mask (left padding too), masked attention.

One convention throughout, the package's: a boolean mask whose ``True`` means *may attend*.
Masks are compared exactly; masked attention at the float64 tolerance, with an arbitrary
mask (neither causal nor padding), a query that may attend nothing and its gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..core.attention import scaled_dot_product_attention as reference_attention
from ..core.masks import causal_mask as reference_causal
from ..core.masks import padding_mask as reference_padding
from .common import gen, gradient_properties, randn, weight_where_blocked
from .harness import gradients
from .report import CheckResult, section
from .runner import Case, Check, Harness, Inputs, Mistake, Property, args, call, run_check
from .values import EXACT, FLOAT32, show

__all__ = ["causal_mask", "masked_attention", "padding_mask"]


# --------------------------------------------------------------------------- causal_mask


def _ones(t_q: int, t_k: int) -> Tensor:
    return torch.ones(t_q, t_k, dtype=torch.bool)


CAUSAL_MISTAKES = (
    Mistake(lambda t_q, t_k: ~reference_causal(t_q, t_k),
            f"True means may attend in this course (as in PyTorch's scaled_dot_product_"
            f"attention); yours is True where attention is blocked, nn.MultiheadAttention's "
            f"convention ({section('5.7')})"),
    Mistake(lambda t_q, t_k: _ones(t_q, t_k).tril(t_k - t_q - 1),
            f"causal mask off by one: query i may attend key i itself, so the diagonal is "
            f"True ({section('5.3')})"),
    Mistake(lambda t_q, t_k: _ones(t_q, t_k).tril(t_k - t_q + 1),
            f"causal mask off by one: query i may not see key i + 1, the next token "
            f"({section('5.3')})"),
    Mistake(lambda t_q, t_k: _ones(t_q, t_k).triu(t_k - t_q),
            f"True belongs on and below the diagonal (keys j <= i, the past): you allowed the "
            f"future ({section('5.3')})"),
    Mistake(lambda t_q, t_k: _ones(t_q, t_k).tril(),
            f"when T_q != T_k the queries are the last T_q positions: query i may attend keys "
            f"j <= i + T_k - T_q (bottom-right alignment); tril() without an offset, like "
            f"PyTorch's is_causal=True, aligns top-left ({section('5.3')})"),
    Mistake(lambda t_q, t_k: _ones(t_q, t_k).tril(t_q - t_k),
            f"the offset is T_k - T_q, keys minus queries (the earlier keys every new query "
            f"may see), not T_q - T_k ({section('5.3')})"),
    Mistake(lambda t_q, t_k: _ones(t_q, t_k).tril(max(t_k - t_q, 0)),
            f"when T_q > T_k the offset T_k - T_q is negative and must stay so: the first "
            f"T_q - T_k queries come before every key and may attend none (do not clamp the "
            f"offset at 0) ({section('5.3')})"),
)
SHIFTED = ("mask[i, j] = j <= i + T_k - T_q: the new queries come after T_k - T_q earlier "
           "keys (bottom-right alignment)")


def _causal_case(plan: str, t_q: int, t_k: int, hint: str = SHIFTED) -> Case:
    return Case(plan, lambda: args(t_q, t_k), f"t_q = {t_q}, t_k = {t_k}", hint, "5.3", EXACT)


CAUSAL_MASK = Check("causal_mask", reference_causal, (
    _causal_case("a square mask (4, 4): query i may attend keys j <= i, itself included", 4, 4,
                 "mask[i, j] = j <= i"),
    _causal_case("T_q = 2 new queries against T_k = 5 keys: aligned bottom-right", 2, 5),
    _causal_case("T_q = 5 against T_k = 3: the first two rows allow no key", 5, 3),
    *(_causal_case("one query against one key, and one query against six keys (a decoding "
                   "step)", 1, t_k) for t_k in (1, 6)),
), params=("t_q", "t_k"), mistakes=CAUSAL_MISTAKES)


def causal_mask(fn: Callable[[int, int], Tensor]) -> CheckResult:
    """Check a causal mask, ``fn(t_q, t_k) -> (t_q, t_k)`` bool (Chapter 5).

    ``True`` = may attend: query ``i`` may attend key ``j`` when ``j <= i + t_k - t_q`` (the
    queries are the last ``t_q`` positions, bottom-right alignment; section 5.3).
    """
    return run_check(CAUSAL_MASK, fn)


# -------------------------------------------------------------------------- padding_mask


def _pad(lengths: list[int], max_len: int, side: str, extra: int = 0) -> Tensor:
    """A padding mask whose rows hold ``n + extra`` True entries (``extra``: a mistake)."""
    t = torch.arange(max_len)[None, :]  # (1, max_len)
    n = torch.tensor(lengths)[:, None] + extra  # (B, 1)
    return t >= max_len - n if side == "left" else t < n


OFF_BY_ONE = (f"padding mask off by one: a row of length n has exactly n True entries "
              f"({section('5.4')})")

def _left_only(wrong: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A mistake made on the left side only: right padding is right."""
    def mistake(lengths: list[int], max_len: int, side: str = "right") -> Tensor:
        if side == "right":
            return reference_padding(lengths, max_len, side="right")
        return wrong(lengths, max_len, side)
    return mistake


def _inverted(lengths: list[int], max_len: int, side: str = "right") -> Tensor:
    return ~reference_padding(lengths, max_len, side=side)


def _other_side(lengths: list[int], max_len: int, side: str = "right") -> Tensor:
    return reference_padding(lengths, max_len, side="left" if side == "right" else "right")


def _more(lengths: list[int], max_len: int, side: str = "right") -> Tensor:
    return _pad(lengths, max_len, side, 1)


def _fewer(lengths: list[int], max_len: int, side: str = "right") -> Tensor:
    return _pad(lengths, max_len, side, -1)


REAL_TOKENS = (f"True marks the real tokens, False the pads (True = may attend) "
               f"({section('5.4')})")
SIDES = (f"side=\"left\" puts the pads first and the real tokens last, side=\"right\" the "
         f"other way round: check which side you pad ({section('5.5')})")

PADDING_MISTAKES = (
    # each mistake made on both sides, then on the left only (where a learner's code has a
    # branch of its own for left padding)
    *(Mistake(wrong, hint) for wrong, hint in (
        (_inverted, REAL_TOKENS), (_other_side, SIDES), (_more, OFF_BY_ONE),
        (_fewer, OFF_BY_ONE))),
    *(Mistake(_left_only(wrong), hint) for wrong, hint in (
        (_inverted, REAL_TOKENS), (_other_side, SIDES), (_more, OFF_BY_ONE),
        (_fewer, OFF_BY_ONE))),
    Mistake(lambda lengths, max_len, side="left": reference_padding(lengths, max_len,
                                                                    side=side),
            f"side=\"right\" is the default: a call without side pads on the right "
            f"({section('5.4')})"),
    Mistake(lambda lengths, max_len, side="right": (lambda right: right.flip(0) if side ==
                                                    "left" else right)(
        reference_padding(lengths, max_len)),
            f"left padding reverses each row along time, so that the pads come first: mask[b, "
            f"t] = t >= max_len - lengths[b]; flip(0) reverses the order of the batch instead "
            f"({section('5.5')})"),
    Mistake(lambda lengths, max_len, side="right": _pad(lengths, max(lengths), side),
            f"the mask is (B, max_len), even when every sequence is shorter than max_len "
            f"({section('5.4')})"),
)


def _padding_case(plan: str, lengths: list[int], max_len: int, side: str | None,
                  hint: str, number: str) -> Case:
    keyword = {} if side is None else {"side": side}
    words = f"lengths = {lengths}, max_len = {max_len}" + (
        ", side left to its default" if side is None else f", side = {side!r}")
    return Case(plan, lambda: args(list(lengths), max_len, **keyword), words, hint, number,
                EXACT)


PADDING_MASK = Check("padding_mask", reference_padding, (
    _padding_case("right padding: lengths [3, 1, 4], max_len 4, True on the real tokens",
                  [3, 1, 4], 4, "right", "mask[b, t] = t < lengths[b]", "5.4"),
    _padding_case("left padding: lengths [3, 1, 4], max_len 4, the pads first", [3, 1, 4], 4,
                  "left", "left padding: mask[b, t] = t >= max_len - lengths[b]", "5.5"),
    _padding_case("side left to its default: right padding", [3, 1, 4], 4, None,
                  "a call without side pads on the right: side=\"right\" is the default",
                  "5.4"),
    *(_padding_case("lengths [0, 2] padded to max_len 5, on both sides: an empty row, a "
                    "longer mask", [0, 2], 5, side, "a row of length 0 is all False, and the "
                    "mask has max_len columns", "5.4") for side in ("right", "left")),
    *(_padding_case("size-1 dimensions: a batch of one sequence, lengths [2], max_len 3, on "
                    "both sides", [2], 3, side, "the mask is (B, max_len), B = 1 included",
                    "5.4") for side in ("right", "left")),
), params=("lengths", "max_len", "side"), mistakes=PADDING_MISTAKES)


def padding_mask(fn: Callable[..., Tensor]) -> CheckResult:
    """Check a padding mask, ``fn(lengths, max_len, side="right") -> (B, max_len)`` bool (Ch. 5).

    ``lengths`` is a list of ``B`` ints (left as it is); ``True`` on real tokens.
    ``side="right"`` (the default) puts the real tokens first, ``side="left"`` the pads
    first (sections 5.4 and 5.5).
    """
    return run_check(PADDING_MASK, fn)


# ---------------------------------------------------------------------- masked_attention


def _masked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, how: str = "",
            scale: str = "k") -> tuple[Tensor, Tensor]:
    """Masked attention with a known mistake ``how``, for recognising it."""
    d = {"k": q.shape[-1], "v": v.shape[-1], "none": 1}[scale]
    if how == "scaled_after":
        d = 1
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., T_q, T_k)
    fills = {"inverted": (mask, -math.inf), "inverted_raw": (mask, -math.inf),
             "zero": (~mask, 0.0), "big": (~mask, -1e9)}
    if how == "bool_added":
        weights = torch.softmax(scores + mask.to(scores.dtype), dim=-1)
    elif how == "inf_added":  # an additive 0 / -inf mask: NaN flows back from an empty row
        blocked = torch.zeros(mask.shape, dtype=scores.dtype).masked_fill(~mask, -math.inf)
        weights = torch.softmax(scores + blocked, dim=-1)
        weights = weights.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    elif how == "after":
        weights = torch.softmax(scores, dim=-1) * mask
    elif how == "added":
        weights = torch.softmax(scores - 1e9 * ~mask, dim=-1)
    else:
        where, value = fills.get(how, (~mask, -math.inf))
        weights = torch.softmax(scores.masked_fill(where, value), dim=-1)
    if how == "cleaned":  # NaN of the empty rows cleaned after the softmax: the backward
        return torch.nan_to_num(weights @ v), torch.nan_to_num(weights)  # still has NaN
    if how in ("inverted", "columns", "scaled_after"):  # their NaN cleaned: what they show
        weights = torch.nan_to_num(weights)  # is the mistake itself
    if how == "columns":  # "empty" rows found over the queries (a column of the mask)
        empty = ~mask.any(-2, keepdim=True).transpose(-2, -1)  # (..., T_k, 1)
        if empty.shape[-2] == weights.shape[-2]:
            weights = weights.masked_fill(empty, 0.0)
    if how == "scaled_after":
        weights = weights / math.sqrt(q.shape[-1])
    if scale != "k":  # only the scale is wrong: the empty rows are right
        weights = weights.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return weights @ v, weights


EMPTY_TEXT = ("a query with no allowed key gets softmax(all -inf) = 0 / 0 = NaN: give such "
              "rows zero weights and a zero output")
EMPTY_HINT = f"{EMPTY_TEXT} ({section('5.6')})"
INVERTED_HINT = (f"True means may attend: block the scores where the mask is False, "
                 f"masked_fill(~mask, -inf), not where it is True ({section('5.7')})")

MASKED_MISTAKES = (
    Mistake(lambda q, k, v, mask: reference_attention(q, k, v, mask)[0],
            f"return a pair (out, weights), not only out ({section('4.1')})"),
    *(Mistake(lambda q, k, v, mask, how=how: _masked(q, k, v, mask, how), INVERTED_HINT)
      for how in ("inverted", "inverted_raw")),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "columns"),
            f"a query with no allowed key is a row of the mask that is all False, "
            f"~mask.any(dim=-1) over the keys; mask.any(dim=-2) looks down a column, at a key "
            f"no query may attend ({section('5.6')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "inf_added"),
            f"adding a 0 / -inf mask to the scores sends NaN back through a row with no "
            f"allowed key (the gradient of the softmax of all -inf); fill the blocked scores "
            f"with masked_fill or torch.where, which pass them no gradient ({section('5.6')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "bool_added"),
            f"a boolean mask is not an additive mask: scores + mask adds 1 to the allowed "
            f"scores and blocks nothing; fill the blocked scores with -inf, masked_fill(~mask, "
            f"-inf) ({section('5.2')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "scaled_after"),
            f"scale the scores by 1 / sqrt(d_k) before the softmax, not the weights after it: "
            f"the weights must sum to 1 ({section('4.2')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "after"),
            f"mask the scores before the softmax (with -inf), not the weights after it: the "
            f"weights left must still sum to 1 ({section('5.2')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "zero"),
            f"a blocked score must become -inf, not 0: exp(0) = 1 still gives it weight "
            f"({section('5.2')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "big"),
            f"with a large negative number (-1e9, -1e4) instead of -inf, a query with no "
            f"allowed key gets uniform weights over keys it may not read; its weights and "
            f"output must be zero ({section('5.6')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "added"),
            f"adding -1e9 to the blocked scores leaves a query with no allowed key its softmax "
            f"over keys it may not read (the shift cancels); fill with -inf and give such rows "
            f"zero weights and a zero output ({section('5.6')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask), EMPTY_HINT),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, "cleaned"),
            f"your output is right but the backward pass is not: NaN from the empty row "
            f"(cleaning the output with nan_to_num after a NaN softmax is too late); give that "
            f"row finite scores (0) before the softmax and zero its weights after "
            f"({section('5.6')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, scale="none"),
            f"scale the scores by 1 / sqrt(d_k) before masking them, as attention without a "
            f"mask does ({section('4.2')})"),
    Mistake(lambda q, k, v, mask: reference_attention(q, k, v)[0:2],
            f"your attention ignores the mask: fill the scores where it is False with -inf "
            f"before the softmax ({section('5.2')})"),
    Mistake(lambda q, k, v, mask: _masked(q, k, v, mask, scale="v"),
            f"scale by 1 / sqrt(d_k), the width of q and k, not of v ({section('4.2')})"),
)

#: Section 5.6's example: row 1 of the mask blocks everything.
EMPTY_ROW = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
#: Neither causal nor padding: a query may see keys after it and skip keys before it.
ARBITRARY = torch.tensor([[0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 1], [0, 0, 1, 1, 0, 0],
                          [1, 1, 0, 0, 0, 1]], dtype=torch.bool)
BASE_HINT = "fill the scores where the mask is False with -inf before the softmax, " \
            "masked_fill(~mask, -inf)"


def _key_padding() -> Tensor:
    return reference_padding([4, 2], 5)[:, None, :]  # (B, 1, T_k): every query, pads blocked


def _left_and_causal() -> Tensor:
    keys = reference_padding([5, 3], 5, side="left")  # (B, T_k), True on real keys
    return keys[:, None, None, :] & reference_causal(5)  # (B, 1, T_q, T_k)


def _masked_case(plan: str, shapes: tuple[tuple[int, ...], ...], mask: Callable[[], Tensor],
                 mask_words: str, hint: str, number: str, harness: Harness = call,
                 properties: tuple[Property, ...] = ()) -> Case:
    def inputs() -> Inputs:
        g = gen(8)
        return args(*(randn(g, *shape) for shape in shapes), mask())

    words = ", ".join(f"{n} {s}" for n, s in zip("qkv", shapes, strict=True))
    return Case(plan, inputs, f"random {words}, float64, seed 8, mask = {mask_words}", hint,
                number, FLOAT32, harness, properties)


EMPTY_SHAPES = ((3, 2), (4, 2), (4, 3))

MASKED_ATTENTION = Check("masked_attention", reference_attention, (
    _masked_case("a causal mask (4, 4) on q = k (4, 2), v (4, 3): masked scores get weight 0",
                 ((4, 2), (4, 2), (4, 3)), lambda: reference_causal(4), "causal_mask(4)",
                 BASE_HINT, "5.2"),
    _masked_case("an arbitrary mask (4, 6), neither causal nor padding, d_k = 4, d_v = 5",
                 ((4, 4), (6, 4), (6, 5)), lambda: ARBITRARY, show(ARBITRARY, limit=24),
                 "use the mask you are given, whatever its pattern", "5.2"),
    _masked_case("a query whose row of the mask is all False: zero weights, zero output, no "
                 "NaN", EMPTY_SHAPES, lambda: EMPTY_ROW, show(EMPTY_ROW), EMPTY_TEXT,
                 "5.6"),
    _masked_case("float64 gradients with that empty row: finite, and what the reference "
                 "gives", EMPTY_SHAPES, lambda: EMPTY_ROW, show(EMPTY_ROW),
                 "the gradients must be finite and match: no NaN may flow back from the empty "
                 "row", "5.6", gradients((0, 1, 2)),
                 gradient_properties(("q", "k", "v"), "5.6")),
    _masked_case("a key padding mask (2, 1, 5) alone, lengths [4, 2]: a pad key's column is "
                 "all False, but every query still has keys to attend, so no row is zero",
                 ((2, 5, 4), (2, 5, 4), (2, 5, 3)), _key_padding,
                 "padding_mask([4, 2], 5)[:, None, :], True on real keys", "a row is empty "
                 "only when the query has no allowed key (mask.any(dim=-1) is False); blocked "
                 "keys get weight 0, the other keys share the rest", "5.4"),
    _masked_case("a batch (2, 2, 5, 8) with left-padded keys and a causal mask broadcast "
                 "(B, 1, T_q, T_k)", ((2, 2, 5, 8), (2, 2, 5, 8), (2, 2, 5, 6)),
                 _left_and_causal, "left padding of lengths [5, 3] AND causal, (2, 1, 5, 5)",
                 "the mask broadcasts against the scores (B, H, T_q, T_k): use masked_fill, "
                 "which broadcasts, and keep rows with no allowed key at zero", "5.5"),
    _masked_case("T_q = 3 against T_k = 6 with a bottom-right causal mask, float64",
                 ((3, 4), (6, 4), (6, 5)), lambda: reference_causal(3, 6), "causal_mask(3, 6)",
                 BASE_HINT, "5.3"),
    *(_masked_case("size-1 dimensions: one query of one head in a batch of one, and one key",
                   shapes, mask, words, BASE_HINT, "5.2")
      for shapes, mask, words in (
          (((1, 1, 1, 4), (1, 1, 3, 4), (1, 1, 3, 2)), lambda: reference_causal(1, 3),
           "causal_mask(1, 3)"),
          (((3, 4), (1, 4), (1, 2)), lambda: reference_causal(3, 1), "causal_mask(3, 1)"))),
), params=("q", "k", "v", "mask"), mistakes=MASKED_MISTAKES,
    properties=(weight_where_blocked(3, 1, "5.2"),))


def masked_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check attention with a boolean mask, ``fn(q, k, v, mask) -> (out, weights)`` (Chapter 5).

    ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``, ``v (..., T_k, d_v)``; ``mask`` is boolean,
    broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend (any pattern). Blocked
    scores become ``-inf`` before the softmax; a query with no allowed key gets zero
    weights and a zero output, and finite gradients (sections 5.2 and 5.6). No dropout;
    no argument may be changed.
    """
    return run_check(MASKED_ATTENTION, fn)
