"""Checks for chapter 10: rotary position embeddings, the sliding-window mask, and the
sliding-window and document masks written as FlexAttention mask_mods.

RoPE here is the chapter's convention: *interleaved* pairs ``(x[2i], x[2i+1])`` turned by
``position / 10000^(2i / d)`` radians, as in the RoFormer paper (section 10.1). The usual
code (Llama's) computes the angles in float32, so rotations are compared at the float32
tolerance, with positions small enough (at most 15) for that rounding to stay below it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import and_masks, create_mask

from ..core.attention import scaled_dot_product_attention as reference_attention
from ..core.flex_attention import causal_mask_mod
from ..modern.mask_mods import document_mask_mod as reference_document_mod
from ..modern.mask_mods import sliding_window_mask_mod as reference_window_mod
from ..modern.rope import apply_rope as reference_rope
from ..modern.rope import sinusoid_angles
from ..modern.sliding_window import sliding_window_mask as reference_window
from .common import F64, gen, gradient_properties, randn
from .harness import first, gradients
from .report import CheckResult, section
from .runner import Case, Check, Harness, Inputs, Mistake, Property, args, call, run_check
from .values import EXACT, FLOAT32, show

__all__ = ["document_mask_mod", "rope", "rope_attention", "sliding_window_mask",
           "sliding_window_mask_mod"]


def _rope_variant(how: str) -> Callable[[Tensor, Tensor], Tensor]:
    """RoPE with one known mistake ``how``, for recognising it."""
    def wrong(x: Tensor, positions: Tensor) -> Tensor:
        d = x.shape[-1]
        if how == "arange":
            positions = torch.arange(x.shape[-2])
        if how == "shifted":
            positions = positions + 1
        if how == "per_feature":  # pair i turns at 10000^(-i / d), not 10000^(-2i / d)
            theta = positions.to(F64)[:, None] / 10000.0 ** (torch.arange(d // 2,
                                                                          dtype=F64) / d)
        else:
            theta = sinusoid_angles(positions, d)  # (T, d / 2)
        cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
        if how == "tiled":  # cos and sin widened with repeat, not repeat_interleave
            turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
            return x * torch.cat([cos, cos], -1) + turned * torch.cat([sin, sin], -1)
        if how == "halves":  # Hugging Face's rotate_half layout
            first_half, second = x[..., : d // 2], x[..., d // 2:]
            return torch.cat([first_half * cos - second * sin, first_half * sin + second * cos],
                             dim=-1)
        sin = -sin if how == "backwards" else sin
        cos, sin = (sin, cos) if how == "swapped" else (cos, sin)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return wrong


# ---------------------------------------------------------------------------------- rope

ROPE_MISTAKES = (
    Mistake(_rope_variant("backwards"),
            f"turn by +angle: x'[2i] = x[2i] cos - x[2i+1] sin, x'[2i+1] = x[2i] sin + x[2i+1] "
            f"cos ({section('10.1')})"),
    Mistake(_rope_variant("swapped"),
            f"cos and sin are swapped: position 0 must leave x unchanged (cos 0 = 1, sin 0 = "
            f"0) ({section('10.1')})"),
    Mistake(_rope_variant("halves"),
            f"this chapter pairs interleaved features (x[2i], x[2i+1]); you paired x[i] with "
            f"x[i + d/2], Hugging Face's rotate_half layout ({section('10.1')})"),
    Mistake(_rope_variant("per_feature"),
            f"pair i turns at 1 / 10000^(2i / d) radians per position: the exponent uses 2i "
            f"({section('10.1')})"),
    Mistake(_rope_variant("arange"),
            f"rotate by the positions given, not by 0..T-1: with a cache the new tokens' "
            f"positions continue after the cached ones ({section('10.1')})"),
    Mistake(_rope_variant("shifted"),
            f"positions start at 0: position 0 leaves a vector unchanged ({section('10.1')})"),
    Mistake(lambda x, positions: x, f"your function leaves x unchanged: turn each pair by its "
                                    f"angle ({section('10.1')})"),
    Mistake(_rope_variant("tiled"),
            f"each pair (x[2i], x[2i+1]) shares one angle: widen cos and sin to d with "
            f"repeat_interleave(2) (c0, c0, c1, c1, ...), not repeat (c0, c1, ..., c0, c1, ...) "
            f"({section('10.1')})"),
)
ROPE_HINT = "turn each pair (x[2i], x[2i+1]) by positions[t] / 10000^(2i / d) radians"
PAIR = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=F64)


def _rope_case(plan: str, shape: tuple[int, ...], positions: list[int],
               harness: Harness = call, properties: tuple[Property, ...] = (),
               hint: str = ROPE_HINT) -> Case:
    return Case(plan, lambda: args(randn(gen(16), *shape), torch.tensor(positions)),
                f"random x {shape}, float64, seed 16, positions = {positions}", hint, "10.1",
                FLOAT32, harness, properties)


ROPE = Check("rope", reference_rope, (
    Case("one pair (d = 2) at positions 0, 1, 2: [1, 0] turns by 0, 1 and 2 radians",
         lambda: args(PAIR, torch.arange(3)), f"x = {show(PAIR)}, positions = [0, 1, 2]",
         ROPE_HINT, "10.1", FLOAT32),
    _rope_case("d = 8 at positions 0..4, float64: interleaved pairs, pair i at 1 / 10000^(2i "
               "/ 8)", (5, 8), [0, 1, 2, 3, 4]),
    _rope_case("positions 3..6, as for tokens after a cache of 3", (4, 8), [3, 4, 5, 6]),
    _rope_case("a batch (2, 3, 5, 8) with positions (5,): one rotation for every head and "
               "sequence", (2, 3, 5, 8), [0, 1, 2, 3, 4]),
    _rope_case("size-1 dimensions: one token of one head in a batch of one, at position 9",
               (1, 1, 1, 8), [9]),
    _rope_case("the float64 gradient of x", (2, 5, 8), [2, 3, 4, 5, 6], gradients((0,)),
               gradient_properties(("x",), "10.1"),
               "keep the rotation in torch, differentiable: no .detach() or .numpy()"),
), params=("x", "positions"), mistakes=ROPE_MISTAKES)


def rope(fn: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """Check rotary position embeddings, ``fn(x, positions) -> (..., T, d)`` (Chapter 10).

    ``x (..., T, d)`` are queries or keys (``d`` even), ``positions (T,)`` integers. Each
    interleaved pair ``(x[2i], x[2i+1])`` of position ``t`` turns by ``positions[t] /
    10000^(2i / d)`` radians: ``x'[2i] = x[2i] cos - x[2i+1] sin``, ``x'[2i+1] = x[2i] sin +
    x[2i+1] cos`` (section 10.1). Angles may be computed in float32, as Llama's code does;
    ``x`` must not be changed.
    """
    return run_check(ROPE, fn)


# ------------------------------------------------------------------------ rope_attention


def _attend(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, rotate: str = "qk",
            causal: bool = True, scale: float | None = None,
            turn: Callable[[Tensor, Tensor], Tensor] = reference_rope,
            diagonal: bool = True) -> Tensor:
    """Causal attention of the rotated q and k, right or with one known mistake: another
    rotation ``turn``, or a causal mask whose diagonal is blocked (``diagonal=False``)."""
    turned = {name: turn(t, positions) if name in rotate else t
              for name, t in (("q", q), ("k", k), ("v", v))}
    if diagonal:
        return reference_attention(turned["q"], turned["k"], turned["v"], is_causal=causal,
                                   scale=scale)[0]
    t = q.shape[-2]
    scores = turned["q"] @ turned["k"].transpose(-2, -1) / q.shape[-1] ** 0.5  # (.., T, T)
    strict = torch.ones(t, t, dtype=torch.bool).tril(-1)  # keys before the query only
    weights = torch.softmax(scores.masked_fill(~strict, float("-inf")), dim=-1)
    return weights.nan_to_num() @ turned["v"]


ROPE_ATTENTION_MISTAKES = (
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, "qkv"),
            f"RoPE turns the queries and the keys only: the values carry content, not "
            f"position, and must not be rotated ({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, "q"),
            f"rotate the keys as well as the queries: the score sees i - j only when both are "
            f"turned ({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, "k"),
            f"rotate the queries as well as the keys ({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, causal=False),
            f"a language model's attention is causal: mask the future keys "
            f"({section('5.3')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, ""),
            f"your output ignores the positions: rotate q and k before the scores "
            f"({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, scale=1.0),
            f"scale the scores by 1 / sqrt(d) after rotating q and k, as attention does "
            f"({section('4.2')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, scale=v.shape[-1] ** -0.5),
            f"scale by 1 / sqrt(d), the width of q and k, not of v ({section('4.2')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, torch.arange(q.shape[-2])),
            f"rotate by the positions given, not by 0..T-1: positions need not be 0, 1, 2, "
            f"... (a cache, a gap), and the scores see their differences ({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, turn=_rope_variant("backwards")),
            f"turn by +angle, x'[2i] = x[2i] cos - x[2i+1] sin, x'[2i+1] = x[2i] sin + x[2i+1] "
            f"cos: turned the other way, the scores see j - i instead of i - j "
            f"({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, turn=_rope_variant("per_feature")),
            f"pair i turns at 1 / 10000^(2i / d) radians per position: the exponent uses 2i, "
            f"not i ({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, turn=_rope_variant("halves")),
            f"this chapter pairs interleaved features (x[2i], x[2i+1]); you paired x[i] with "
            f"x[i + d/2], Hugging Face's rotate_half layout ({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, turn=_rope_variant("tiled")),
            f"each pair (x[2i], x[2i+1]) shares one angle: widen cos and sin with "
            f"repeat_interleave(2), not repeat ({section('10.1')})"),
    Mistake(lambda q, k, v, p: _attend(q, k, v, p, diagonal=False),
            f"block only the future keys, j > i: a token attends to itself, so the causal "
            f"mask keeps its diagonal, tril() ({section('5.3')})"),
)
ROPE_ATTENTION_HINT = ("rotate the queries and the keys by their positions, leave the values "
                       "alone, then causal attention softmax(q' k'^T / sqrt(d)) v")


FIRST = first()  # "(out, weights) will do"


def _qkv(shape: tuple[int, ...], d_v: int) -> tuple[Tensor, Tensor, Tensor]:
    g = gen(17)
    return randn(g, *shape), randn(g, *shape), randn(g, *shape[:-1], d_v)


def _rope_attention_case(plan: str, shape: tuple[int, ...], d_v: int, positions: list[int],
                         harness: Harness = FIRST, properties: tuple[Property, ...] = (),
                         hint: str = ROPE_ATTENTION_HINT) -> Case:
    def inputs() -> Inputs:
        return args(*_qkv(shape, d_v), torch.tensor(positions))

    v_shape = (*shape[:-1], d_v)
    return Case(plan, inputs, f"random q, k {shape} and v {v_shape}, float64, seed 17, "
                f"positions = {positions}", hint, "10.1", FLOAT32, harness, properties)


ROPE_ATTENTION = Check("rope_attention", lambda q, k, v, p: _attend(q, k, v, p), (
    _rope_attention_case("q, k, v (2, 6, 8) at positions 0..5, float64: causal attention of "
                         "the rotated q and k", (2, 6, 8), 8, list(range(6))),
    _rope_attention_case("the same tokens at positions 10..15: the same output, scores see "
                         "only i - j", (2, 6, 8), 8, list(range(10, 16))),
    _rope_attention_case("values narrower than the queries: v (2, 6, 6)", (2, 6, 8), 6,
                         list(range(3, 9))),
    _rope_attention_case("positions with a gap, [0, 1, 2, 5, 6, 7]: the scores across the gap "
                         "see a distance 2 larger than the tokens' indices", (2, 6, 8), 8,
                         [0, 1, 2, 5, 6, 7]),
    _rope_attention_case("size-1 dimensions: one token in a batch of one, at position 4",
                         (1, 1, 8), 8, [4]),
    _rope_attention_case("float64 gradients of q, k and v", (2, 6, 8), 6, list(range(6)),
                         gradients((0, 1, 2)), gradient_properties(("q", "k", "v"), "10.1"),
                         "keep the computation in torch, differentiable: no .detach()"),
), params=("q", "k", "v", "positions"), mistakes=ROPE_ATTENTION_MISTAKES)


def rope_attention(fn: Callable[..., Tensor]) -> CheckResult:
    """Check causal attention with RoPE, ``fn(q, k, v, positions) -> (B, T, d_v)`` (Ch. 10).

    ``q``, ``k (B, T, d)``, ``v (B, T, d_v)``, ``positions (T,)``: the queries and keys are
    rotated by their positions (the chapter's interleaved pairs; any integers, not only 0..T-1),
    the values are not, then causal scaled dot-product attention; returning ``(out,
    weights)`` will do too (section 10.1). No argument may be changed.
    """
    return run_check(ROPE_ATTENTION, fn)


# ------------------------------------------------------------------- sliding_window_mask


def _window(t: int, window: int, how: str) -> Tensor:
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    return {"wide": (j <= i) & (j >= i - window), "narrow": (j <= i) & (j > i - window + 1),
            "both_sides": (i - j).abs() < window, "no_diagonal": (j < i) & (j >= i - window),
            "future": i - j < window}[how]


WINDOW_MISTAKES = (
    Mistake(lambda t, window: ~reference_window(t, window=window),
            f"True means may attend: yours is True where attention is blocked "
            f"({section('5.7')})"),
    Mistake(lambda t, window: _window(t, window, "wide"),
            f"window off by one: a window of W holds W positions, keys i - W + 1 to i "
            f"({section('10.4')})"),
    Mistake(lambda t, window: _window(t, window, "narrow"),
            f"window off by one: a window of W holds W positions, itself included "
            f"({section('10.4')})"),
    *(Mistake(lambda t, window, how=how: _window(t, window, how),
              f"the window is causal: keys after the query stay blocked ({section('10.4')})")
      for how in ("both_sides", "future")),
    Mistake(lambda t, window: _window(t, window, "no_diagonal"),
            f"the query may attend itself: the diagonal is True ({section('10.4')})"),
)


def _window_case(plan: str, t: int, window: int) -> Case:
    return Case(plan, lambda: args(t, window), f"t = {t}, window = {window}",
                "mask[i, j] = i - window < j <= i: the last `window` positions, itself "
                "included", "10.4", EXACT)


SLIDING_WINDOW_MASK = Check("sliding_window_mask", lambda t, window: reference_window(
    t, window=window), (
    _window_case("T = 6, window 3: query i may attend keys i - 2, i - 1 and i", 6, 3),
    *(_window_case("window 1 (itself only), window = T (the causal mask) and a window longer "
                   "than T", 6, w) for w in (1, 6, 9)),
    _window_case("size-1 dimensions: a single position, t = 1", 1, 2),
), params=("t", "window"), mistakes=WINDOW_MISTAKES)


def sliding_window_mask(fn: Callable[[int, int], Tensor]) -> CheckResult:
    """Check a sliding-window mask, ``fn(t, window) -> (t, t)`` bool (Chapter 10).

    ``True`` = may attend: query ``i`` may attend key ``j`` when ``i - window < j <= i``, the
    last ``window`` positions, itself included (section 10.4).
    """
    return run_check(SLIDING_WINDOW_MASK, fn)


# ------------------------------------------- sliding_window_mask_mod, document_mask_mod

MASK_MOD_ERRORS = (
    ("data-dependent control flow",
     f"FlexAttention calls a mask_mod on tensors (through torch.vmap), so it cannot take a "
     f"Python if, and or or on them: combine the comparisons with & and | "
     f"({section('10.8')})"),
    ("must only return Tensors",
     f"a mask_mod returns a bool tensor built from q_idx and kv_idx (a comparison), not a "
     f"Python True or False ({section('10.8')})"),
    ("must return a mask_mod",
     f"write a factory: your function takes the mask's parameter and returns a mask_mod, "
     f"a function (b, h, q_idx, kv_idx) -> bool tensor ({section('10.8')})"),
)


def _mask_of(n_b: int, n_h: int, t: int) -> Harness:
    """The ``(n_b, n_h, t, t)`` mask a factory's mask_mod gives, evaluated as FlexAttention
    evaluates it (``create_mask``, through ``torch.vmap``); ``and_with`` ANDs another mod."""
    def harness(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
        mod = fn(*positional, **keyword)
        if not callable(mod):
            raise TypeError(f"your function must return a mask_mod (a function of b, h, "
                            f"q_idx, kv_idx), got {type(mod).__name__}")
        return create_mask(mod, n_b, n_h, t, t, device="cpu")
    return harness


def _causal_and(inner: Harness) -> Harness:
    """``inner`` with the factory's mod ANDed with the causal mask_mod (``and_masks``)."""
    def harness(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
        def combined(*a: Any, **k: Any) -> Any:
            mod = fn(*a, **k)
            return and_masks(causal_mask_mod(), mod) if callable(mod) else mod
        return inner(combined, positional, keyword)
    return harness


def _window_mod(window: int, how: str) -> Callable[..., Tensor]:
    """A sliding-window mask_mod with one known mistake ``how``."""
    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        i, j = q_idx, kv_idx
        return {"wide": (j <= i) & (j >= i - window), "narrow": (j <= i) & (j > i - window + 1),
                "both_sides": (i - j).abs() < window, "future": i - j < window,
                "no_diagonal": (j < i) & (j >= i - window), "inverted": (j > i) | (j <= i - window),
                "swapped": (i <= j) & (i > j - window), "fixed": (j <= i) & (j < window)}[how]
    return mod


WINDOW_MOD_MISTAKES = (
    Mistake(lambda window: _window_mod(window, "inverted"),
            f"True means may attend: your mask_mod is True where attention is blocked "
            f"({section('5.7')})"),
    Mistake(lambda window: _window_mod(window, "wide"),
            f"window off by one: a window of W holds W keys, kv_idx from q_idx - W + 1 to "
            f"q_idx, so kv_idx > q_idx - W ({section('10.4')})"),
    Mistake(lambda window: _window_mod(window, "narrow"),
            f"window off by one: a window of W holds W keys, the query's own included "
            f"({section('10.4')})"),
    Mistake(lambda window: _window_mod(window, "both_sides"),
            f"the window is causal: keys after the query stay blocked, kv_idx <= q_idx "
            f"({section('10.4')})"),
    Mistake(lambda window: _window_mod(window, "future"),
            f"the window is causal: keys after the query stay blocked, kv_idx <= q_idx "
            f"({section('10.4')})"),
    Mistake(lambda window: _window_mod(window, "no_diagonal"),
            f"the query may attend itself: kv_idx == q_idx is allowed ({section('10.4')})"),
    Mistake(lambda window: _window_mod(window, "swapped"),
            f"q_idx and kv_idx are swapped: your window looks ahead of the query; q_idx is "
            f"the query's position, kv_idx the key's ({section('10.8')})"),
    Mistake(lambda window: _window_mod(window, "fixed"),
            f"the window moves with the query: compare kv_idx with q_idx - window, not with "
            f"window alone ({section('10.4')})"),
)
WINDOW_MOD_HINT = ("the mod returns (kv_idx <= q_idx) & (kv_idx > q_idx - window): the last "
                   "`window` keys, the query's own included")


def _window_mod_case(plan: str, n_b: int, n_h: int, t: int, window: int) -> Case:
    return Case(plan, lambda: args(window), f"window = {window}; the mask_mod evaluated by "
                f"create_mask for (B, H, T_q, T_k) = ({n_b}, {n_h}, {t}, {t})",
                WINDOW_MOD_HINT, "10.8", EXACT, _mask_of(n_b, n_h, t))


SLIDING_WINDOW_MASK_MOD = Check("sliding_window_mask_mod", reference_window_mod, (
    _window_mod_case("T = 8, window 3: query q_idx may attend keys q_idx - 2 to q_idx",
                     1, 1, 8, 3),
    *(_window_mod_case("window 1 (itself only), window = T (the causal mask) and a window "
                       "longer than T", 1, 1, 8, w) for w in (1, 8, 12)),
    _window_mod_case("2 rows and 3 heads: the same window for every b and h", 2, 3, 8, 3),
    _window_mod_case("a single position, T = 1", 1, 1, 1, 2),
), params=("window",), mistakes=WINDOW_MOD_MISTAKES, errors=MASK_MOD_ERRORS)


def sliding_window_mask_mod(fn: Callable[[int], Callable[..., Tensor]]) -> CheckResult:
    """Check a sliding-window mask_mod factory, ``fn(window) -> mask_mod`` (Chapter 10).

    The mask_mod ``(b, h, q_idx, kv_idx) -> bool tensor`` is ``True`` (may attend) when
    ``q_idx - window < kv_idx <= q_idx``, as ``sliding_window_mask`` (section 10.4), for
    every row ``b`` and head ``h``. It is evaluated as FlexAttention evaluates it, by
    ``create_mask`` through ``torch.vmap`` (section 10.8): elementwise torch code, no
    Python ``if`` on its arguments.
    """
    return run_check(SLIDING_WINDOW_MASK_MOD, fn)


def _document_mod(doc_ids: Tensor, how: str) -> Callable[..., Tensor]:
    """A document mask_mod with one known mistake ``how``."""
    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        doc_q, doc_kv = doc_ids[b, q_idx], doc_ids[b, kv_idx]
        if how == "itself":  # the query's document read twice
            return doc_q == doc_ids[b, q_idx]
        if how == "row_0":  # every row read as the first
            return doc_ids[0, q_idx] == doc_ids[0, kv_idx]
        if how == "earlier":  # its own document and every earlier one
            return doc_kv <= doc_q
        if how == "causal":
            return (doc_q == doc_kv) & (kv_idx <= q_idx)
        if how == "inverted":
            return doc_q != doc_kv
        return doc_q == doc_ids[b, (kv_idx - 1).clamp(min=0)]  # "shifted": key read one back
    return mod


DOCUMENT_MOD_MISTAKES = (
    Mistake(lambda doc_ids: _document_mod(doc_ids, "inverted"),
            f"True means may attend: your mask_mod is True between different documents "
            f"({section('5.7')})"),
    Mistake(lambda doc_ids: _document_mod(doc_ids, "itself"),
            f"you compared the query's document with itself, so every key is allowed: "
            f"compare doc_ids[b, q_idx] with the key's, doc_ids[b, kv_idx] "
            f"({section('10.8')})"),
    Mistake(lambda doc_ids: _document_mod(doc_ids, "shifted"),
            f"read each token's document at its own index: doc_ids[b, q_idx] for the query "
            f"and doc_ids[b, kv_idx] for the key, with no shift ({section('10.8')})"),
    Mistake(lambda doc_ids: _document_mod(doc_ids, "row_0"),
            f"read row b of doc_ids: each row of a batch is packed with its own documents "
            f"({section('10.8')})"),
    Mistake(lambda doc_ids: _document_mod(doc_ids, "earlier"),
            f"a token attends its own document only, doc_ids equal: with <= it also attends "
            f"every earlier document, whose tokens belong to another text "
            f"({section('10.8')})"),
    Mistake(lambda doc_ids: _document_mod(doc_ids, "causal"),
            f"the document mask alone is not causal: a decoder ANDs it with the causal "
            f"mask, and_masks(causal_mask_mod(), mod) ({section('10.8')})"),
)
DOCUMENT_MOD_HINT = ("the mod returns doc_ids[b, q_idx] == doc_ids[b, kv_idx]: a query may "
                     "attend the keys of its own document, none of another")


def _document_mod_case(plan: str, doc_ids: list[list[int]], n_h: int = 1,
                       causal: bool = False) -> Case:
    n_b, t = len(doc_ids), len(doc_ids[0])
    harness = _mask_of(n_b, n_h, t)
    how = ", ANDed with causal_mask_mod() by and_masks" if causal else ""
    return Case(plan, lambda: args(torch.tensor(doc_ids)),
                f"doc_ids = {doc_ids}; the mask_mod{how} evaluated by create_mask for (B, H, "
                f"T_q, T_k) = ({n_b}, {n_h}, {t}, {t})", DOCUMENT_MOD_HINT, "10.8", EXACT,
                _causal_and(harness) if causal else harness)


DOCUMENT_MASK_MOD = Check("document_mask_mod", reference_document_mod, (
    _document_mod_case("one row of three documents, lengths 3, 2 and 3: three blocks on the "
                       "diagonal", [[0, 0, 0, 1, 1, 2, 2, 2]]),
    _document_mod_case("two rows packed differently: the mod reads row b",
                       [[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, 2, 2]]),
    _document_mod_case("2 rows and 3 heads: the same mask for every head",
                       [[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]], n_h=3),
    _document_mod_case("one document (every key allowed) and ids that do not start at 0",
                       [[0, 0, 0, 0, 0], [4, 4, 7, 7, 9]]),
    _document_mod_case("a decoder's mask on packed rows: ANDed with the causal mask_mod",
                       [[0, 0, 0, 1, 1, 2, 2, 2]], causal=True),
    _document_mod_case("a single token, T = 1", [[3]]),
), params=("doc_ids",), mistakes=DOCUMENT_MOD_MISTAKES, errors=MASK_MOD_ERRORS)


def document_mask_mod(fn: Callable[[Tensor], Callable[..., Tensor]]) -> CheckResult:
    """Check a document mask_mod factory, ``fn(doc_ids) -> mask_mod`` (Chapter 10).

    ``doc_ids (B, T)`` numbers the document of each token of packed rows (never decreasing
    along a row). The mask_mod ``(b, h, q_idx, kv_idx) -> bool tensor`` is ``True`` (may
    attend) when the query and the key lie in the same document of row ``b``, for every
    head, and is not causal by itself (section 10.8). It is evaluated by ``create_mask``
    through ``torch.vmap``; ``doc_ids`` must not be changed.
    """
    return run_check(DOCUMENT_MASK_MOD, fn)
