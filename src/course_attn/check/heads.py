"""Checks for chapter 6: the head split and merge, and multi-head attention.

Multi-head attention is held to PyTorch's own ``nn.MultiheadAttention`` with the same
seeded weights and biases (the exercise's projections have a bias), in ``eval()`` mode,
without a mask and with masks that are causal, arbitrary and padding-like.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..core.layers import merge_heads as reference_merge
from ..core.layers import split_heads as reference_split
from ..core.masks import causal_mask as reference_causal
from .common import F64, gen, gradient_properties, randn, shared_projections
from .harness import gradients, layer_forward, layer_structure, seeded_linears
from .report import CheckResult, section
from .runner import Case, Check, Harness, Inputs, Mistake, Property, args, run_check
from .values import EXACT, FLOAT32, show

__all__ = ["merge_heads", "multi_head_attention", "split_heads"]


def labelled(batch: int, time: int, width: int) -> Tensor:
    """Section 6.3's tensor ``(B, T, D)`` whose entry is ``100 b + 10 p + c``: every number
    says where it came from, so a scrambled split shows at once."""
    b = torch.arange(batch)[:, None, None]
    p = torch.arange(time)[None, :, None]
    c = torch.arange(width)[None, None, :]
    return (100 * b + 10 * p + c).to(F64)


# --------------------------------------------------------------------- split and merge

VIEW_HINT = (f"x.view(B, H, T, head_dim) re-reads memory in order and mixes positions into "
             f"heads: view as (B, T, H, head_dim), then transpose(1, 2) ({section('6.3')})")
TIME_HINT = f"split the width D (the channels), not the time axis ({section('6.2')})"


def _split_case(plan: str, shape: tuple[int, int, int], n_heads: int) -> Case:
    return Case(plan, lambda: args(labelled(*shape), n_heads),
                f"x = the labelled tensor {shape} (entry 100 b + 10 p + c), n_heads = {n_heads}",
                "(B, T, D) -> view (B, T, H, head_dim) -> transpose(1, 2) -> (B, H, T, "
                "head_dim): head h takes channels h * head_dim to (h + 1) * head_dim - 1",
                "6.2", EXACT)


def _by(x: Tensor, n_heads: int) -> tuple[int, int, int, int]:
    b, t, d = x.shape
    return b, t, n_heads, d // n_heads


SPLIT_HEADS = Check("split_heads", reference_split, (
    _split_case("section 6.3's labelled tensor (1, 5, 8) into H = 2 heads: head h gets "
                "channels h * 4 .. h * 4 + 3 of every position", (1, 5, 8), 2),
    *(_split_case("a labelled batch (2, 7, 12) into H = 3, H = 1 (a head axis of size 1) and "
                  "H = 12 heads", (2, 7, 12), n_heads) for n_heads in (3, 1, 12)),
), params=("x", "n_heads"), mistakes=(
    Mistake(lambda x, n_heads: x.reshape(_by(x, n_heads)[0], n_heads, x.shape[1], -1),
            VIEW_HINT),
    Mistake(lambda x, n_heads: x.reshape(*x.shape[:2], -1, n_heads).permute(0, 3, 1, 2),
            f"each head takes a contiguous slice of head_dim channels: view as (B, T, H, "
            f"head_dim), not (B, T, head_dim, H) ({section('6.2')})"),
    Mistake(lambda x, n_heads: x.reshape(*x.shape[:2], n_heads, -1),
            f"move the head axis before the time axis: transpose(1, 2) gives (B, H, T, "
            f"head_dim) ({section('6.2')})"),
    Mistake(lambda x, n_heads: x.reshape(*x.shape[:2], n_heads, -1).transpose(1, 3),
            f"transpose(1, 2) swaps time and heads; other axes scramble positions and "
            f"channels ({section('6.2')})"),
    Mistake(lambda x, n_heads: torch.stack(x.chunk(n_heads, dim=1), dim=1), TIME_HINT),
    Mistake(lambda x, n_heads: x.reshape(*x.shape[:2], n_heads, -1).transpose(2, 3).reshape(
        _by(x, n_heads)[0], n_heads, x.shape[1], -1),
            f"swap the time and head axes, transpose(1, 2): transpose(2, 3) swaps heads and "
            f"channels, and the reshape after it then mixes positions ({section('6.2')})"),
), errors=(("stack expects", TIME_HINT),))


def split_heads(fn: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check the head split, ``fn(x, n_heads) -> (B, H, T, head_dim)`` (Chapter 6).

    ``x (B, T, D)`` with ``D = H * head_dim``; head ``h`` holds channels ``h * head_dim`` to
    ``(h + 1) * head_dim - 1`` of every position (sections 6.2 and 6.3).
    """
    return run_check(SPLIT_HEADS, fn)


def _merge_case(plan: str, shape: tuple[int, int, int], n_heads: int, number: str) -> Case:
    heads = tuple(reference_split(labelled(*shape), n_heads).shape)
    return Case(plan, lambda: args(reference_split(labelled(*shape), n_heads).contiguous()),
                f"split_heads(the labelled tensor {shape}, {n_heads}), shape {heads}",
                "(B, H, T, head_dim) -> transpose(1, 2) -> (B, T, H, head_dim) -> reshape "
                "(B, T, H * head_dim): the exact inverse of the split", number, EXACT)


def _flat(x: Tensor) -> tuple[int, int, int]:
    b, h, t, hd = x.shape
    return b, t, h * hd


MERGE_HEADS = Check("merge_heads", reference_merge, (
    _merge_case("section 6.3's labelled tensor (1, 5, 8), split into 2 heads, merged back "
                "exactly", (1, 5, 8), 2, "6.3"),
    *(_merge_case("labelled batches (2, 7, 12) split into 3 heads and (1, 4, 6) into 6 heads, "
                  "merged back", shape, h, "6.2") for shape, h in (((2, 7, 12), 3),
                                                                   ((1, 4, 6), 6))),
    *(_merge_case("size-1 dimensions: one head (2, 1, 7, 12) and one position (1, 2, 1, 4)",
                  shape, h, "6.2") for shape, h in (((2, 7, 12), 1), ((1, 1, 8), 2))),
), params=("x",), mistakes=(
    Mistake(lambda x: x.reshape(_flat(x)),
            f"a reshape straight to (B, T, D) (or the heads concatenated along time) reads the "
            f"heads in memory order: each position's H heads must sit side by side in its "
            f"channels, so transpose(1, 2) first, back to (B, T, H, head_dim) "
            f"({section('6.3')})"),
    Mistake(lambda x: x.permute(0, 2, 3, 1).reshape(_flat(x)),
            f"put the heads before head_dim: (B, T, H, head_dim), so each head's channels "
            f"stay together ({section('6.2')})"),
    Mistake(lambda x: torch.cat(x.unbind(1), dim=1),
            f"concatenate the heads along the width (channels), not along time "
            f"({section('6.4')})"),
    Mistake(lambda x: x.transpose(1, 2),
            f"merge the heads: return (B, T, H * head_dim), three dimensions "
            f"({section('6.2')})"),
), errors=(("view size is not compatible",
            f"after transpose the tensor is not contiguous, so view fails: use .reshape(...) "
            f"or .contiguous().view(...) ({section('6.2')})"),))


def merge_heads(fn: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check the head merge, ``fn(x) -> (B, T, H * head_dim)`` for ``x (B, H, T, head_dim)``
    (Chapter 6): the exact inverse of :func:`split_heads` (section 6.2)."""
    return run_check(MERGE_HEADS, fn)


# ------------------------------------------------------------------ multi_head_attention

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


class TorchMultiHeadAttention(nn.Module):
    """The reference: ``nn.MultiheadAttention`` run with the weights of four named
    projections, as section 6.10 copies them (its ``attn_mask`` is ``True`` where blocked)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in PROJECTIONS)
        self.torch_mha = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        mha, ins = self.torch_mha, (self.q_proj, self.k_proj, self.v_proj)
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.cat([p.weight for p in ins]))
            mha.in_proj_bias.copy_(torch.cat([p.bias for p in ins]))
            mha.out_proj.weight.copy_(self.out_proj.weight)
            mha.out_proj.bias.copy_(self.out_proj.bias)
        return mha(x, x, x, attn_mask=None if mask is None else ~mask, need_weights=False)[0]


class _WrongMultiHead(nn.Module):
    """Multi-head attention with one knob per known mistake."""

    split, merge, scale, out, mask_as, dim = "right", "right", "head", True, "given", -1
    clean, scale_after, values_from, seq_first, dropout = False, False, "v", False, 0.0

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in PROJECTIONS)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.seq_first:  # x read as (T, B, D), nn.MultiheadAttention's default layout
            x = x.transpose(0, 1)
            mask = mask if mask is not None and mask.shape[-1] == x.shape[1] else None
        b, t, d = x.shape
        hd = d // self.h
        split = {"view": lambda y: y.reshape(b, self.h, t, hd),
                 "strided": lambda y: y.reshape(b, t, hd, self.h).permute(0, 3, 1, 2),
                 "right": lambda y: y.view(b, t, self.h, hd).transpose(1, 2)}[self.split]
        value_proj = self.k_proj if self.values_from == "k" else self.v_proj
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(value_proj(x))
        divide = 1.0 if self.scale_after else math.sqrt(hd if self.scale == "head" else d)
        scores = q @ k.transpose(-2, -1) / divide  # (B, H, T, T)
        if mask is not None and self.mask_as != "ignored":
            blocked = {"given": ~mask, "inverted": mask, "causal": ~reference_causal(t)}
            scores = scores.masked_fill(blocked[self.mask_as], -math.inf)
        weights = torch.softmax(scores, dim=self.dim)  # (B, H, T, T)
        if self.clean:
            weights = weights.nan_to_num()
        if self.scale_after:
            weights = weights / math.sqrt(hd)
        if self.dropout:  # F.dropout's training=True: on whatever the mode
            weights = nn.functional.dropout(weights, self.dropout)
        heads = weights @ v  # (B, H, T, hd)
        merged = {"view": lambda: heads.reshape(b, t, d),
                  "strided": lambda: heads.permute(0, 2, 3, 1).reshape(b, t, d),
                  "right": lambda: heads.transpose(1, 2).reshape(b, t, d)}[self.merge]()
        out = self.out_proj(merged) if self.out else merged
        return out.transpose(0, 1) if self.seq_first else out


def _wrong(**knobs: object) -> type:
    return type("MultiHeadAttention", (_WrongMultiHead,), knobs)


MHA_MISTAKES = (
    Mistake(_wrong(split="view"), VIEW_HINT),
    Mistake(_wrong(merge="view"), f"merging the heads with a reshape straight to (B, T, D) "
                                  f"mixes heads and positions: transpose(1, 2) first "
                                  f"({section('6.3')})"),
    Mistake(_wrong(scale="model"), f"scale each head's scores by sqrt(head_dim) = sqrt(d_model "
                                   f"/ H), not sqrt(d_model) ({section('6.5')})"),
    Mistake(_wrong(out=False), f"the concatenated heads go through out_proj, which mixes them "
                               f"({section('6.4')})"),
    *(Mistake(_wrong(mask_as="inverted", clean=clean),
              f"True means may attend: block the scores where the mask is False "
              f"(nn.MultiheadAttention's attn_mask means the opposite) ({section('5.7')})")
      for clean in (False, True)),
    Mistake(_wrong(split="view", merge="view"), VIEW_HINT),
    Mistake(_wrong(split="strided", merge="strided"),
            f"head h takes a contiguous block of head_dim channels, h * head_dim to (h + 1) * "
            f"head_dim - 1: view as (B, T, H, head_dim), not (B, T, head_dim, H), which "
            f"deals the channels out to the heads in turn ({section('6.2')})"),
    Mistake(_wrong(scale_after=True),
            f"scale the scores by 1 / sqrt(head_dim) before the softmax, not the weights after "
            f"it: each query's weights must sum to 1 ({section('6.5')})"),
    Mistake(_wrong(values_from="k"),
            f"the values come from v_proj: v = self.v_proj(x), not self.k_proj(x) "
            f"({section('6.2')})"),
    Mistake(_wrong(seq_first=True),
            f"x is (B, T, d_model), batch first (nn.MultiheadAttention(batch_first=True)): do "
            f"not transpose it as if it were (T, B, d_model) ({section('6.10')})"),
    Mistake(_wrong(dropout=0.1),
            f"the check runs your layer in eval() mode, where dropout is off: F.dropout(w, p) "
            f"drops in every mode (its training=True is the default); use an nn.Dropout "
            f"module, or pass training=self.training ({section('6.10')})"),
    Mistake(_wrong(mask_as="causal"), f"apply the mask you are given, whatever its pattern: "
                                      f"yours blocks the future keys instead, as if every "
                                      f"mask were causal ({section('5.2')})"),
    Mistake(_wrong(mask_as="ignored"), f"your layer ignores the mask: forward(x, mask) must "
                                       f"fill the scores where it is False with -inf before "
                                       f"the softmax ({section('5.2')})"),
    Mistake(_wrong(dim=-2), f"softmax over the keys (the last dimension), so that each "
                            f"query's weights sum to 1 in every head ({section('6.2')})"),
)

MHA_HINT = ("project, split into heads (view + transpose), attend per head with 1 / "
            "sqrt(head_dim), merge (transpose + reshape), then out_proj")
MASK_HINT = ("forward(x, mask=None): mask is bool (T, T), True = may attend; fill the scores "
             "where it is False with -inf before the softmax")
#: Neither causal nor padding; every query may attend at least one key.
ARBITRARY = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 0, 1], [1, 1, 0, 0, 0], [0, 0, 0, 1, 1],
                          [0, 1, 1, 0, 1]], dtype=torch.bool)
PADDED = torch.tensor([[1, 1, 1, 0, 0]] * 5, dtype=torch.bool)  # the last two keys are pads


def _mha_case(plan: str, n_heads: int, shape: tuple[int, ...], mask: Tensor | None,
              hint: str, number: str, harness: Harness | None = None,
              properties: tuple[Property, ...] = ()) -> Case:
    def inputs() -> Inputs:
        weights = seeded_linears(PROJECTIONS, shape[-1], shape[-1], 11 + n_heads, bias=True)
        keyword = {} if mask is None else {"mask": mask}
        return args((shape[-1], n_heads), weights, randn(gen(10), *shape), **keyword)

    words = "no mask" if mask is None else f"forward(x, mask=mask), mask = {show(mask, limit=25)}"
    return Case(plan, inputs, f"MultiHeadAttention({shape[-1]}, {n_heads}) with seeded weights "
                f"and biases, eval(); random x {shape}, float64, seed 10; {words}", hint,
                number, FLOAT32, harness or layer_forward(), properties)


def _no_bias(got: object, expected: object, inputs: Inputs) -> bool:
    return isinstance(got, tuple) and any("bias=False" in str(s) for s in got)


MULTI_HEAD_ATTENTION = Check("multi_head_attention", TorchMultiHeadAttention, (
    Case("the class builds q_proj, k_proj, v_proj, out_proj: nn.Linear(8, 8) each, with a "
         "bias", lambda: args((8, 2)), "MultiHeadAttention(d_model=8, n_heads=2)",
         "name the four projections q_proj, k_proj, v_proj and out_proj, each "
         "nn.Linear(d_model, d_model) with a bias, so that their weights can be copied",
         "6.10", harness=layer_structure(PROJECTIONS),
         properties=(shared_projections("6.10"),
                     Property(_no_bias, f"each projection keeps its bias, nn.Linear(d_model, "
                                        f"d_model) (bias=True), as nn.MultiheadAttention's do: "
                                        f"name the four projections and keep their biases "
                                        f"({section('6.10')})"),)),
    _mha_case("x (2, 5, 8), H = 2, float64, against nn.MultiheadAttention with the same "
              "weights, in eval mode", 2, (2, 5, 8), None, MHA_HINT, "6.10"),
    _mha_case("the same with a causal mask (5, 5), True = may attend", 2, (2, 5, 8),
              reference_causal(5), MASK_HINT, "5.2"),
    _mha_case("an arbitrary mask (5, 5), neither causal nor padding", 2, (2, 5, 8), ARBITRARY,
              MASK_HINT, "5.2"),
    _mha_case("a padding mask as (5, 5): the last two keys blocked for every query", 2,
              (2, 5, 8), PADDED, MASK_HINT, "5.4"),
    *(_mha_case("size-1 dimensions: x (1, 6, 8) with H = 4 (head_dim 2) and H = 1, and one "
                "token x (2, 1, 8)", h, shape, None, MHA_HINT, "6.5")
      for h, shape in ((4, (1, 6, 8)), (1, (1, 6, 8)), (2, (2, 1, 8)))),
    _mha_case("the float64 gradient of x through the layer", 2, (2, 5, 8), ARBITRARY,
              "keep the computation in torch, differentiable: no .detach() or .item()", "6.4",
              harness=gradients((2,), inner=layer_forward()),
              properties=gradient_properties(("x",), "6.4")),
), params=("(d_model, n_heads)", "weights", "x"), want_class=True, mistakes=MHA_MISTAKES,
    errors=(("view size is not compatible", f"after transpose the heads are not contiguous, "
                                            f"so view fails: merge with .reshape(...) or "
                                            f".contiguous().view(...) ({section('6.2')})"),
            ("is ambiguous", f"test `if mask is not None:`; `if mask:` asks a tensor of many "
                             f"values for one truth value ({section('5.2')})")))


def multi_head_attention(cls: type[nn.Module]) -> CheckResult:
    """Check a multi-head self-attention class, ``cls(d_model, n_heads)`` (Chapter 6).

    The class builds ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``, each
    ``nn.Linear(d_model, d_model)`` with a bias (the check writes seeded weights and biases
    into them). Its forward takes ``x (B, T, d_model)`` and an optional ``mask=`` (bool
    ``(T, T)``, ``True`` = may attend, any pattern) and returns ``out (B, T, d_model)`` or
    ``(out, weights)``. The check runs it in ``eval()`` mode (a dropout is off) against
    ``nn.MultiheadAttention`` with the same weights (section 6.10).
    """
    return run_check(MULTI_HEAD_ATTENTION, cls)
