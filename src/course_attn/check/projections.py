"""Checks for chapters 3 and 4: the Q/K/V projections, the single-head layer, scaled attention.

Tables run by :func:`~course_attn.check.runner.run_check`, as in ``basics.py``. The layer is
built from the learner's class, given seeded weights, put in ``eval()`` mode and compared
with the package's ``SelfAttention``; the exercise builds its projections without a bias,
so a layer that has one is refused with a message that says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..core.attention import scaled_dot_product_attention as reference_attention
from ..core.self_attention import SelfAttention as ReferenceSelfAttention
from .common import F64, gen, gradient_properties, not_normalised, randn, shared_projections
from .harness import gradients, layer_forward, layer_structure, seeded_linears
from .report import CheckResult, section
from .runner import Case, Check, Harness, Inputs, Mistake, Property, args, call, run_check
from .values import FLOAT32, TIGHT, Tol

__all__ = ["attention", "attention_scores", "qkv_projection", "self_attention_layer"]

DIFFERENTIABLE = ("keep the whole computation in torch, differentiable: no .detach(), "
                  ".item(), .numpy() or new tensors built from values")


# ----------------------------------------------------------------------- qkv_projection

#: Section 3.3's worked example: two tokens, W_Q and W_K (4, 3), W_V (4, 2).
WORKED_X = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
WORKED_W = (torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]]),
            torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 2.0], [2.0, 1.0, 0.0], [0.0, 2.0, 1.0]]),
            torch.tensor([[1.0, 0.0], [0.0, 2.0], [2.0, 1.0], [1.0, 1.0]]))


def _project(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> tuple[Tensor, ...]:
    return x @ w_q, x @ w_k, x @ w_v


TRANSPOSE_HINT = (f"a textbook matrix W (d_in, d_out) multiplies from the right, q = x @ W; "
                  f"only nn.Linear's weight is stored transposed ({section('3.4')})")
MATMUL_HINT = (f"use @ (torch.matmul), which broadcasts over the batch dimensions, not "
               f"torch.mm or a 2-D einsum ({section('3.5')})")

QKV_MISTAKES = (
    Mistake(lambda x, *ws: tuple(x @ w.T for w in ws), TRANSPOSE_HINT),
    Mistake(lambda x, *ws: tuple(x @ (w.T if w.shape[0] == w.shape[1] else w) for w in ws),
            TRANSPOSE_HINT),
    Mistake(lambda x, w_q, w_k, w_v: (x @ w_k, x @ w_q, x @ w_v),
            f"return (q, k, v) in this order: q from W_Q, k from W_K, v from W_V "
            f"({section('3.3')})"),
    Mistake(lambda x, w_q, w_k, w_v: (x @ w_q / math.sqrt(w_q.shape[-1]), x @ w_k, x @ w_v),
            f"the projection is only x @ W; the 1 / sqrt(d_k) scaling belongs to the scores "
            f"({section('4.2')})"),
    Mistake(lambda x, w_q, w_k, w_v: (x @ w_q, x @ w_k, x @ (w_k if w_k.shape == w_v.shape
                                                            else w_v)),
            f"v comes from W_V, v = x @ W_V, not from W_K ({section('3.3')})"),
    Mistake(lambda x, *ws: tuple((x @ torch.cat(ws, dim=-1)).chunk(3, dim=-1)),
            f"q and k are d_k wide and v is d_v wide: split a fused product at those widths, "
            f"torch.split(..., [d_k, d_k, d_v], dim=-1), not in three equal chunks "
            f"({section('3.3')})"),
)


def _qkv_case(plan: str, shapes: tuple[tuple[int, ...], ...], hint: str) -> Case:
    def inputs() -> Inputs:
        g = gen(4)
        return args(*(randn(g, *shape) for shape in shapes))

    words = ", ".join(f"{name} {shape}" for name, shape in zip(("x", "W_Q", "W_K", "W_V"),
                                                                shapes, strict=True))
    return Case(plan, inputs, f"random {words}, float64, seed 4", hint, "3.3")


QKV_PROJECTION = Check("qkv_projection", _project, (
    Case("the worked example: X (2, 4), W_Q and W_K (4, 3), W_V (4, 2)",
         lambda: args(WORKED_X, *WORKED_W), "X, W_Q, W_K, W_V of section 3.3 (float32)",
         "q = x @ W_Q, k = x @ W_K, v = x @ W_V", "3.3", FLOAT32),
    _qkv_case("square matrices (4, 4), where x @ W^T runs but is wrong, float64",
              ((5, 4), (4, 4), (4, 4), (4, 4)), "q = x @ W_Q: W multiplies from the right"),
    _qkv_case("a batch x (2, 5, 4) with d_k = 2 and d_v = 5: W_Q, W_K (4, 2), W_V (4, 5)",
              ((2, 5, 4), (4, 2), (4, 2), (4, 5)),
              "q and k are d_k wide, v is d_v wide; @ broadcasts over the batch"),
    _qkv_case("size-1 dimensions: one token in a batch of one, x (1, 1, 4)",
              ((1, 1, 4), (4, 2), (4, 2), (4, 3)), "q = x @ W_Q, k = x @ W_K, v = x @ W_V"),
), params=("x", "w_q", "w_k", "w_v"), mistakes=QKV_MISTAKES,
    errors=(("size mismatch", TRANSPOSE_HINT), ("cannot be multiplied", TRANSPOSE_HINT),
            ("must be a matrix", MATMUL_HINT), ("2D", MATMUL_HINT), ("einsum()", MATMUL_HINT)))


def qkv_projection(fn: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> CheckResult:
    """Check the Q/K/V projection step, ``fn(x, w_q, w_k, w_v) -> (q, k, v)`` (Chapter 3).

    ``x (..., T, d_in)``; the matrices are in the textbook orientation, ``w_q`` and ``w_k``
    ``(d_in, d_k)``, ``w_v (d_in, d_v)``; ``q = x @ w_q (..., T, d_k)``, likewise ``k``,
    and ``v (..., T, d_v)`` (sections 3.3 and 3.4).
    """
    return run_check(QKV_PROJECTION, fn)


# ---------------------------------------------------------------- self_attention_layer

LAYER_NAMES = ("q_proj", "k_proj", "v_proj")


class _WrongLayer(nn.Module):
    """A single-head layer with one knob per known mistake."""

    scale_by, softmax_dim, query_from, key_from, mix = "out", -1, "q", "k", "v"
    raw, detach = False, False

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(d_in, d_out, bias=False)
        self.k_proj = nn.Linear(d_in, d_out, bias=False)
        self.v_proj = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        q = (self.q_proj if self.query_from == "q" else self.k_proj)(x)  # (B, T, d_out)
        k = (self.k_proj if self.key_from == "k" else self.q_proj)(x)  # (B, T, d_out)
        v = self.v_proj(x)  # (B, T, d_out)
        if self.raw and x.shape[-1] == q.shape[-1]:  # x @ weight, as if not transposed
            q, k = x @ self.q_proj.weight, x @ self.k_proj.weight
        scale = {"out": k.shape[-1], "in": x.shape[-1], "none": 1}[self.scale_by]
        weights = torch.softmax(q @ k.mT / math.sqrt(scale), dim=self.softmax_dim)
        if self.detach:
            weights = weights.detach()
        return weights @ {"v": v, "k": k, "x": x}[self.mix]  # (B, T, T) @ (B, T, d_out)


def _wrong_layer(**knobs: object) -> type:
    return type("SelfAttention", (_WrongLayer,), knobs)


def _has_bias(got: object, expected: object, inputs: Inputs) -> bool:
    return isinstance(got, tuple) and any("bias=True" in str(s) for s in got)


NAMES_HINT = ("name the three projections q_proj, k_proj and v_proj, each nn.Linear(d_in, "
              "d_out, bias=False), so that the check can copy weights into them")
LAYER_HINT = ("out = softmax(q k^T / sqrt(d_out)) v with q = self.q_proj(x), k = "
              "self.k_proj(x), v = self.v_proj(x)")


def _layer_case(plan: str, d_in: int, d_out: int, shape: tuple[int, ...], seed: int,
                harness: Harness | None = None, properties: tuple[Property, ...] = (),
                hint: str = LAYER_HINT) -> Case:
    def inputs() -> Inputs:
        return args((d_in, d_out), seeded_linears(LAYER_NAMES, d_in, d_out, seed, bias=False),
                    randn(gen(seed), *shape))

    return Case(plan, inputs, f"SelfAttention({d_in}, {d_out}) with seeded weights, random x "
                f"{shape}, float64, seed {seed}", hint, "3.5", FLOAT32,
                harness or layer_forward(), properties)


SELF_ATTENTION_LAYER = Check("self_attention_layer", ReferenceSelfAttention, (
    Case("the class builds q_proj, k_proj, v_proj: nn.Linear(d_in=6, d_out=4, bias=False)",
         lambda: args((6, 4)), "SelfAttention(d_in=6, d_out=4)", NAMES_HINT, "3.5",
         harness=layer_structure(LAYER_NAMES),
         properties=(shared_projections("3.5"),
                     Property(_has_bias, f"your projections have a bias: the exercise builds "
                                         f"nn.Linear(d_in, d_out, bias=False), and the check "
                                         f"does not zero a bias for you ({section('3.5')})"),)),
    _layer_case("x (2, 5, 6), float64, against course_attn.SelfAttention with the same weights, "
                "in eval mode", 6, 4, (2, 5, 6), 5),
    *(_layer_case("size-1 dimensions: a batch of one, x (1, 3, 8) with d_in = d_out = 8, and "
                  "one token, x (2, 1, 6)", d_in, d_out, shape, 5)
      for d_in, d_out, shape in ((8, 8, (1, 3, 8)), (6, 4, (2, 1, 6)))),
    _layer_case("the float64 gradient of x through the layer: it flows through the weights "
                "into q and k, and through v", 6, 4, (2, 5, 6), 5,
                harness=gradients((2,), inner=layer_forward()),
                properties=gradient_properties(("x",), "3.5"), hint=DIFFERENTIABLE),
), params=("(d_in, d_out)", "weights", "x"), want_class=True, mistakes=(
    Mistake(_wrong_layer(detach=True), f"do not detach the attention weights: the gradient "
                                       f"reaches q_proj and k_proj only through them "
                                       f"({section('3.5')})"),
    Mistake(_wrong_layer(key_from="q"), f"keys come from k_proj, queries from q_proj: k = "
                                        f"self.k_proj(x) ({section('3.5')})"),
    Mistake(_wrong_layer(raw=True), f"nn.Linear stores its weight as (d_out, d_in) and "
                                    f"computes x @ weight^T: call the layer, self.q_proj(x), "
                                    f"not x @ self.q_proj.weight ({section('3.4')})"),
    Mistake(_wrong_layer(scale_by="in"), f"scale by sqrt(d_out), the width of the keys, not "
                                         f"sqrt(d_in) ({section('3.5')})"),
    Mistake(_wrong_layer(scale_by="none"), f"divide the scores by sqrt(d_k) = sqrt(d_out) "
                                           f"before the softmax ({section('4.2')})"),
    Mistake(_wrong_layer(softmax_dim=-2), f"softmax over the keys (the last dimension), so "
                                          f"each query's weights sum to 1 ({section('3.5')})"),
    Mistake(_wrong_layer(query_from="k"), f"queries come from q_proj, keys from k_proj "
                                          f"({section('3.5')})"),
    Mistake(_wrong_layer(mix="k"), f"the weights mix the values, v = self.v_proj(x), not the "
                                   f"keys ({section('3.5')})"),
    Mistake(_wrong_layer(mix="x"), f"the weights mix the values, v = self.v_proj(x), not the "
                                   f"input x itself ({section('3.5')})"),
), errors=tuple((phrase, f"call the layer, self.q_proj(x), which computes x @ weight^T "
                         f"({section('3.4')})") for phrase in ("size mismatch",
                                                              "cannot be multiplied")))


def self_attention_layer(cls: type[nn.Module]) -> CheckResult:
    """Check a single-head self-attention class, ``cls(d_in, d_out)`` (Chapter 3).

    The class builds ``q_proj``, ``k_proj`` and ``v_proj`` (each ``nn.Linear(d_in, d_out,
    bias=False)``; a bias is refused, and the check copies seeded weights into them); its
    forward takes ``x (B, T, d_in)`` and returns ``out (B, T, d_out)`` or ``(out,
    weights)``, with ``out = softmax(q k^T / sqrt(d_out)) v``, in ``eval()`` mode
    (section 3.5).
    """
    return run_check(SELF_ATTENTION_LAYER, cls)


# ---------------------------------------------------------------------- attention_scores


def _scores(q: Tensor, k: Tensor, divide: float | None = None) -> Tensor:
    scale = math.sqrt(q.shape[-1]) if divide is None else divide
    return q @ k.transpose(-2, -1) / scale  # (..., T_q, T_k)


K_T_HINT = (f"use k.transpose(-2, -1) (or k.mT), not k.T, so that batch dimensions stay in "
            f"place: scores = q k^T / sqrt(d_k) ({section('4.1')})")
SCORES_HINT = "scores = q k^T / sqrt(d_k), with d_k the width of q and k"


def _random(shapes: tuple[tuple[int, ...], ...], seed: int) -> tuple[Tensor, ...]:
    g = gen(seed)
    return tuple(randn(g, *shape) for shape in shapes)


def _pair(plan: str, shapes: tuple[tuple[int, ...], ...], seed: int, hint: str, number: str,
          harness: Harness = call, properties: tuple[Property, ...] = (),
          tol: Tol = TIGHT) -> Case:
    """A case of random float64 tensors of ``shapes`` (q, k and v)."""
    words = ", ".join(f"{name} {shape}" for name, shape in zip("qkv", shapes, strict=False))
    return Case(plan, lambda: args(*_random(shapes, seed)), f"random {words}, float64, seed "
                f"{seed}", hint, number, tol, harness, properties)


ATTENTION_SCORES = Check("attention_scores", _scores, (
    Case("the worked example of section 3.3: Q and K (2, 3), scores Q K^T / sqrt(3)",
         lambda: args(WORKED_X @ WORKED_W[0], WORKED_X @ WORKED_W[1]),
         "q = X @ W_Q and k = X @ W_K of section 3.3 (2, 3), float32", SCORES_HINT, "4.1",
         FLOAT32),
    _pair("T_q = 5 queries against T_k = 7 keys of width d_k = 16, float64",
          ((5, 16), (7, 16)), 6, SCORES_HINT, "4.2"),
    _pair("batch dimensions (2, 3, 4, 8) and (2, 3, 6, 8), float64",
          ((2, 3, 4, 8), (2, 3, 6, 8)), 6, SCORES_HINT, "4.1"),
    *(_pair("size-1 dimensions: one query (1, 1, 4) against three keys, three queries "
            "against one key", shapes, 6, SCORES_HINT, "4.1")
      for shapes in (((1, 1, 4), (1, 3, 4)), ((2, 3, 4), (2, 1, 4)))),
    _pair("float64 gradients of q and k", ((2, 4, 8), (2, 6, 8)), 6, DIFFERENTIABLE, "4.4",
          harness=gradients((0, 1)), properties=gradient_properties(("q", "k"), "4.4")),
), params=("q", "k"), mistakes=(
    Mistake(lambda q, k: _scores(q, k, 1.0),
            f"divide the dot products by sqrt(d_k): their variance grows with d_k "
            f"({section('4.2')})"),
    Mistake(lambda q, k: _scores(q, k, q.shape[-1]),
            f"divide by sqrt(d_k), not by d_k: the dot product's standard deviation grows as "
            f"sqrt(d_k) ({section('4.2')})"),
    Mistake(lambda q, k: _scores(q, k, math.sqrt(k.shape[-2])),
            f"the scale is sqrt(d_k), the width of the queries and keys, not their number "
            f"(T_q or T_k) ({section('4.2')})"),
    Mistake(lambda q, k: _scores(k, q),
            f"row i is query i: scores = q @ k^T has shape (T_q, T_k) ({section('4.1')})"),
    Mistake(lambda q, k: _scores(q, k, q.shape[-1] / 2),
            f"d_k ** 1/2 is (d_k ** 1) / 2 = d_k / 2: ** binds before /, so write d_k ** 0.5 "
            f"or math.sqrt(d_k) ({section('4.2')})"),
    Mistake(lambda q, k: _scores(q, k, math.sqrt(q.shape[1])),
            f"d_k is the last dimension, q.shape[-1]: q.shape[1] (q.size(1)) is a batch or "
            f"head axis once q has more than two dimensions ({section('4.1')})"),
), errors=(("must match the size", K_T_HINT), ("cannot be multiplied", K_T_HINT)))


def attention_scores(fn: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """Check scaled attention scores, ``fn(q, k) -> q k^T / sqrt(d_k)`` (Chapter 4).

    ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``; returns ``(..., T_q, T_k)``: row ``i``
    holds query ``i``'s scores against every key (sections 4.1 and 4.2). Neither input may
    be changed, and gradients must reach both.
    """
    return run_check(ATTENTION_SCORES, fn)


# ----------------------------------------------------------------------------- attention

#: Section 4.5's worked example: X (4, 3) and W (3, 2), with Q = K = V = X @ W.
WORKED_4X3 = (torch.tensor([[1.0, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], dtype=F64)
              @ torch.tensor([[1.0, 0], [0, 1], [1, 1]], dtype=F64))


def _attention(q: Tensor, k: Tensor, v: Tensor, *, divide: float | None = None, dim: int = -1,
               naive: bool = False, mix: str = "v", clamp: float | None = None
               ) -> tuple[Tensor, Tensor]:
    scores = _scores(q, k, divide)  # (..., T_q, T_k)
    if clamp is not None:  # "to avoid overflow": it changes every large score
        scores = scores.clamp(-clamp, clamp)
    if naive:
        weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
    else:
        weights = torch.softmax(scores, dim=dim)
    return weights @ (k if mix == "k" else v), weights  # (..., T_q, d_v)


ATTENTION_MISTAKES = (
    Mistake(lambda q, k, v: reference_attention(q, k, v)[0],
            f"return a pair (out, weights), not only out ({section('4.1')})"),
    Mistake(lambda q, k, v: _attention(q, k, v, divide=1.0),
            f"scale the scores by 1 / sqrt(d_k), so that their spread does not grow with d_k "
            f"({section('4.2')})"),
    Mistake(lambda q, k, v: _attention(q, k, v, divide=q.shape[-1]),
            f"divide by sqrt(d_k), not by d_k (scaling q and then the scores again divides "
            f"by d_k too): the dot product's standard deviation grows as sqrt(d_k) "
            f"({section('4.2')})"),
    Mistake(lambda q, k, v: tuple(reversed(_attention(q, k, v))),
            f"return (out, weights) in this order ({section('4.1')})"),
    Mistake(lambda q, k, v: _attention(q, k, v, mix="k"),
            f"the weights mix the values: out = weights @ v, not weights @ k "
            f"({section('4.1')})"),
    Mistake(lambda q, k, v: _attention(q, k, v, divide=math.sqrt(k.shape[-2])),
            f"the scale is sqrt(d_k), the width of the queries and keys, not their number "
            f"(T_q or T_k) ({section('4.2')})"),
    Mistake(lambda q, k, v: _attention(q, k, v, divide=math.sqrt(v.shape[-1])),
            f"scale by sqrt(d_k), the width of q and k, not sqrt(d_v) ({section('4.2')})"),
    Mistake(lambda q, k, v: _attention(q, k, v, dim=-2),
            f"softmax over the keys (dim=-1), so each query's weights sum to 1 "
            f"({section('4.1')})"),
    Mistake(lambda q, k, v: _attention(q, k, v, naive=True),
            f"your attention gives NaN: use a softmax that subtracts the row maximum "
            f"({section('1.6')})"),
    # the round numbers a learner caps the scores at
    *(Mistake(lambda q, k, v, c=c: _attention(q, k, v, clamp=c),
              f"do not clamp the scores: capped, every large score counts the same; "
              f"subtracting each row's maximum is all the softmax needs to stay finite "
              f"({section('1.6')})") for c in (10.0, 20.0, 30.0, 50.0, 100.0)),
)
ATTENTION_HINT = ("out = softmax(q k^T / sqrt(d_k)) v, softmax over the keys (the last "
                  "dimension); return (out, weights)")


def _large() -> Inputs:
    q, k, v = _random(((2, 3, 5, 16), (2, 3, 7, 16), (2, 3, 7, 3)), 7)
    return args(30 * q, 30 * k, v)


ATTENTION = Check("attention", lambda q, k, v: reference_attention(q, k, v), (
    Case("the worked example: q = k = v (4, 2), out and weights",
         lambda: args(WORKED_4X3, WORKED_4X3, WORKED_4X3),
         "q = k = v = X @ W of section 4.5 (4, 2), float64", ATTENTION_HINT, "4.5", FLOAT32),
    _pair("T_q = 5, T_k = 7, d_k = 16, d_v = 3, batch (2, 3), float64, against the reference",
          ((2, 3, 5, 16), (2, 3, 7, 16), (2, 3, 7, 3)), 7, ATTENTION_HINT, "4.1",
          tol=FLOAT32),
    *(_pair("size-1 dimensions: one query of one head against three keys, and one key",
            shapes, 7, ATTENTION_HINT, "4.1", tol=FLOAT32)
      for shapes in (((1, 1, 1, 4), (1, 1, 3, 4), (1, 1, 3, 2)),
                     ((2, 3, 4), (2, 1, 4), (2, 1, 5)))),
    Case("large scores (q and k times 30): finite weights", _large,
         "30 * the random q and k above, the same v",
         "large scores must not overflow: use a softmax that subtracts the row maximum", "1.6",
         FLOAT32),
    _pair("float64 gradients of q, k and v through out",
          ((2, 3, 5, 16), (2, 3, 7, 16), (2, 3, 7, 3)), 7, DIFFERENTIABLE, "4.4",
          gradients((0, 1, 2)), gradient_properties(("q", "k", "v"), "4.4"), FLOAT32),
), params=("q", "k", "v"), mistakes=ATTENTION_MISTAKES,
    properties=(not_normalised(1, f"your weights' rows do not sum to 1: softmax over the keys, "
                                  f"the last dimension, and no dropout (this exercise has "
                                  f"none) ({section('4.1')})"),),
    errors=(("must match the size", K_T_HINT),))


def attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check scaled dot-product attention, ``fn(q, k, v) -> (out, weights)`` (Chapter 4).

    ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``, ``v (..., T_k, d_v)``; ``weights (..., T_q,
    T_k) = softmax(q k^T / sqrt(d_k))`` over the keys and ``out (..., T_q, d_v) = weights @
    v``; no mask, no dropout. The check also compares float64 gradients, and the inputs
    must come back unchanged (sections 4.1-4.5).
    """
    return run_check(ATTENTION, fn)
