"""Checks for chapters 6 and 7: the head split and merge, multi-head attention, the block.

Multi-head attention is held to PyTorch's own ``nn.MultiheadAttention`` with the learner's
weights copied into it; the pre-norm block to the package's ``TransformerBlock``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..core.layers import TransformerBlock
from ..core.layers import sinusoidal_table as reference_table
from ..core.layers import split_heads as reference_split
from ..core.masks import causal_mask as reference_causal
from .basics import LOOSE, TIGHT, first, randn
from .report import CheckResult, Run, has_nan, like, run_check, section

__all__ = [
    "merge_heads",
    "multi_head_attention",
    "pre_norm_block",
    "sinusoidal_table",
    "split_heads",
]

F64 = torch.float64


def labelled(batch: int, time: int, width: int) -> Tensor:
    """Section 6.3's tensor ``(B, T, D)`` whose entry is ``100 b + 10 p + c``: every number
    says where it came from, so a scrambled split shows at once."""
    b = torch.arange(batch)[:, None, None]
    p = torch.arange(time)[None, :, None]
    c = torch.arange(width)[None, None, :]
    return (100 * b + 10 * p + c).to(F64)


# --------------------------------------------------------------------- split and merge

SPLIT_PLAN = (
    "section 6.3's labelled tensor (1, 5, 8) into H = 2 heads: head h gets channels "
    "h * 4 .. h * 4 + 3 of every position",
    "a labelled batch (2, 7, 12) into H = 3, H = 1 and H = 12 heads",
)

VIEW_HINT = (f"x.view(B, H, T, head_dim) re-reads memory in order and mixes positions into "
             f"heads: view as (B, T, H, head_dim), then transpose(1, 2) ({section('6.3')})")


def _split_body(run: Run, fn: Callable[..., Any]) -> None:
    def check(case: str, x: Tensor, n_heads: int) -> None:
        inputs = f"x = the labelled tensor {tuple(x.shape)} (entry 100 b + 10 p + c), " \
                 f"n_heads = {n_heads}"
        hint = (f"(B, T, D) -> view (B, T, H, head_dim) -> transpose(1, 2) -> (B, H, T, "
                f"head_dim): head h takes channels h * head_dim to (h + 1) * head_dim - 1 "
                f"({section('6.2')})")
        time_hint = f"split the width D (the channels), not the time axis ({section('6.2')})"
        got = run.call(case, inputs, lambda: fn(x.clone(), n_heads), hint,
                       errors=[("stack expects", time_hint)])
        b, t, d = x.shape
        hd = d // n_heads
        run.compare(case, inputs, got, reference_split(x, n_heads), hint, mistakes=[
            (like(lambda: x.reshape(b, n_heads, t, hd)), VIEW_HINT),
            (like(lambda: x.view(b, t, hd, n_heads).permute(0, 3, 1, 2)),
             f"each head takes a contiguous slice of head_dim channels: view as (B, T, H, "
             f"head_dim), not (B, T, head_dim, H) ({section('6.2')})"),
            (like(lambda: x.view(b, t, n_heads, hd)),
             f"move the head axis before the time axis: transpose(1, 2) gives (B, H, T, "
             f"head_dim) ({section('6.2')})"),
            (like(lambda: x.view(b, t, n_heads, hd).transpose(1, 3)),
             f"transpose(1, 2) swaps time and heads; other axes scramble positions and "
             f"channels ({section('6.2')})"),
            (like(lambda: torch.stack(x.chunk(n_heads, dim=1), dim=1)), time_hint),
        ])
        run.passed(case)

    check(SPLIT_PLAN[0], labelled(1, 5, 8), 2)
    for n_heads in (3, 1, 12):
        check(SPLIT_PLAN[1], labelled(2, 7, 12), n_heads)
        if n_heads != 12:
            run.checked.pop()  # three head counts, one case of the plan


def split_heads(fn: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check the head split, ``fn(x, n_heads) -> (B, H, T, head_dim)`` (Chapter 6).

    ``x (B, T, D)`` with ``D = H * head_dim``; head ``h`` holds channels ``h * head_dim`` to
    ``(h + 1) * head_dim - 1`` of every position (sections 6.2 and 6.3).
    """
    return run_check("split_heads", SPLIT_PLAN, fn, _split_body)


MERGE_PLAN = (
    "section 6.3's labelled tensor (1, 5, 8), split into 2 heads, merged back exactly",
    "labelled batches (2, 7, 12) split into 3 heads and (1, 4, 6) into 6 heads, merged back",
)


def _merge_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"(B, H, T, head_dim) -> transpose(1, 2) -> (B, T, H, head_dim) -> reshape "
            f"(B, T, H * head_dim): the exact inverse of the split ({section('6.2')})")
    contiguous_hint = (f"after transpose the tensor is not contiguous, so view fails: use "
                       f".reshape(...) or .contiguous().view(...) ({section('6.2')})")

    def check(case: str, x: Tensor, n_heads: int) -> None:
        heads = reference_split(x, n_heads).contiguous()
        inputs = f"split_heads(the labelled tensor {tuple(x.shape)}, {n_heads}), shape " \
                 f"{tuple(heads.shape)}"
        got = run.call(case, inputs, lambda: fn(heads.clone()), hint,
                       errors=[("view size is not compatible", contiguous_hint)])
        b, h, t, hd = heads.shape
        run.compare(case, inputs, got, x, hint, mistakes=[
            (like(lambda: heads.reshape(b, t, h * hd)),
             f"a reshape straight to (B, T, D) reads the heads in memory order: transpose(1, "
             f"2) first, back to (B, T, H, head_dim) ({section('6.3')})"),
            (like(lambda: heads.permute(0, 2, 3, 1).reshape(b, t, h * hd)),
             f"put the heads before head_dim: (B, T, H, head_dim), so each head's channels "
             f"stay together ({section('6.2')})"),
            (like(lambda: torch.cat(heads.unbind(1), dim=1)),
             f"concatenate the heads along the width (channels), not along time "
             f"({section('6.4')})"),
            (lambda g: isinstance(g, Tensor) and g.dim() == 4,
             f"merge the heads: return (B, T, H * head_dim), three dimensions "
             f"({section('6.2')})"),
        ])
        run.passed(case)

    check(MERGE_PLAN[0], labelled(1, 5, 8), 2)
    check(MERGE_PLAN[1], labelled(2, 7, 12), 3)
    run.checked.pop()  # two shapes, one case of the plan
    check(MERGE_PLAN[1], labelled(1, 4, 6), 6)


def merge_heads(fn: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check the head merge, ``fn(x) -> (B, T, H * head_dim)`` for ``x (B, H, T, head_dim)``
    (Chapter 6): the exact inverse of :func:`split_heads` (section 6.2)."""
    return run_check("merge_heads", MERGE_PLAN, fn, _merge_body)


# ------------------------------------------------------------------ multi_head_attention

MHA_PLAN = (
    "the class builds q_proj, k_proj, v_proj, out_proj: nn.Linear(8, 8) each (6.10)",
    "x (2, 5, 8), H = 2, float64, against nn.MultiheadAttention with the same weights (6.10)",
    "the same with a causal mask (5, 5), True = may attend (6.10)",
    "H = 4 (head_dim 2) and H = 1, x (1, 6, 8), float64",
)

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def _mha_reference(weights: dict[str, nn.Linear], n_heads: int, x: Tensor,
                   mask: Tensor | None) -> Tensor:
    """PyTorch's ``nn.MultiheadAttention`` with the given projections copied into it."""
    d = x.shape[-1]
    ref = nn.MultiheadAttention(d, n_heads, batch_first=True, dtype=F64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([weights[n].weight for n in PROJECTIONS[:3]]))
        ref.in_proj_bias.copy_(torch.cat([weights[n].bias for n in PROJECTIONS[:3]]))
        ref.out_proj.weight.copy_(weights["out_proj"].weight)
        ref.out_proj.bias.copy_(weights["out_proj"].bias)
        # nn.MultiheadAttention's attn_mask is True where attention is *blocked*
        out, _ = ref(x, x, x, attn_mask=None if mask is None else ~mask, need_weights=False)
    return out


def _mha_variant(weights: dict[str, nn.Linear], n_heads: int, x: Tensor, mask: Tensor | None,
                 *, split: str = "right", merge: str = "right", scale: str = "head",
                 out_proj: bool = True, invert: bool = False) -> Tensor:
    """Multi-head attention with one known mistake, for recognising it."""
    b, t, d = x.shape
    hd = d // n_heads

    def heads(y: Tensor) -> Tensor:
        if split == "view":
            return y.reshape(b, n_heads, t, hd)  # the pitfall of 6.3
        return y.view(b, t, n_heads, hd).transpose(1, 2)  # (B, H, T, hd)

    with torch.no_grad():
        q, k, v = (heads(weights[n](x)) for n in PROJECTIONS[:3])
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd if scale == "head" else d)
        if mask is not None:
            scores = scores.masked_fill(mask if invert else ~mask, -math.inf)
        out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, hd)
        if merge == "view":
            out = out.reshape(b, t, d)
        else:
            out = out.transpose(1, 2).reshape(b, t, d)
        return weights["out_proj"](out) if out_proj else out


def _mha_body(run: Run, cls: type) -> None:
    names_hint = (f"name the four projections q_proj, k_proj, v_proj and out_proj, each "
                  f"nn.Linear(d_model, d_model) with a bias, so that their weights can be copied "
                  f"({section('6.10')})")

    def build(case: str, d_model: int, n_heads: int) -> nn.Module:
        inputs = f"{cls.__name__}(d_model={d_model}, n_heads={n_heads})"
        layer = run.call(case, inputs, lambda: cls(d_model, n_heads), names_hint)
        if not isinstance(layer, nn.Module):
            run.fail(case, inputs, "an nn.Module", f"a {type(layer).__name__}", names_hint)
        for name in PROJECTIONS:
            linear = getattr(layer, name, None)
            if not isinstance(linear, nn.Linear):
                run.fail(case, inputs, f"an attribute {name}, an nn.Linear",
                         "no such attribute" if linear is None else f"a {type(linear).__name__}",
                         names_hint)
            assert isinstance(linear, nn.Linear)  # for the type checker; fail() raised
            if (linear.in_features, linear.out_features) != (d_model, d_model) \
                    or linear.bias is None:
                run.fail(case, inputs, f"{name} = nn.Linear({d_model}, {d_model}, bias=True)",
                         f"nn.Linear({linear.in_features}, {linear.out_features}, "
                         f"bias={linear.bias is not None})", names_hint)
        return layer.double()

    def check(case: str, n_heads: int, x: Tensor, mask: Tensor | None, inputs: str,
              hint: str) -> None:
        d = x.shape[-1]
        layer = build(case, d, n_heads)
        weights = {name: getattr(layer, name) for name in PROJECTIONS}
        with torch.no_grad():  # distinct, seeded weights: a mistake cannot hide in symmetry
            gen = torch.Generator().manual_seed(11 + n_heads)
            for linear in weights.values():
                linear.weight.copy_(randn(gen, d, d, scale=d ** -0.5))
                linear.bias.copy_(randn(gen, d, scale=0.1))
        call = (lambda: layer(x.clone())) if mask is None else \
            (lambda: layer(x.clone(), mask=mask.clone()))
        got = first(run.call(case, inputs, call, hint))
        expected = _mha_reference(weights, n_heads, x, mask)
        if isinstance(got, Tensor):
            got = got.detach()
        run.compare(case, inputs, got, expected, hint, **TIGHT, mistakes=[
            (like(lambda: _mha_variant(weights, n_heads, x, mask, split="view")), VIEW_HINT),
            (like(lambda: _mha_variant(weights, n_heads, x, mask, merge="view")),
             f"merging the heads with a reshape straight to (B, T, D) mixes heads and "
             f"positions: transpose(1, 2) first ({section('6.3')})"),
            (like(lambda: _mha_variant(weights, n_heads, x, mask, scale="model")),
             f"scale each head's scores by sqrt(head_dim) = sqrt(d_model / H), not "
             f"sqrt(d_model) ({section('6.5')})"),
            (like(lambda: _mha_variant(weights, n_heads, x, mask, out_proj=False)),
             f"the concatenated heads go through out_proj, which mixes them "
             f"({section('6.4')})"),
            (like(lambda: _mha_variant(weights, n_heads, x, mask, invert=True)),
             f"True means may attend: block the scores where the mask is False "
             f"(nn.MultiheadAttention's attn_mask means the opposite) ({section('5.7')})"),
            (has_nan, f"your output holds NaN: mask with -inf before a softmax that "
                      f"subtracts the row maximum ({section('5.2')})"),
        ])
        run.passed(case)

    case = MHA_PLAN[0]
    build(case, 8, 2)
    run.passed(case)
    gen = torch.Generator().manual_seed(10)
    x = randn(gen, 2, 5, 8)
    hint = (f"project, split into heads (view + transpose), attend per head with "
            f"1 / sqrt(head_dim), merge (transpose + reshape), then out_proj "
            f"({section('6.2')})")
    check(MHA_PLAN[1], 2, x, None, "random x (2, 5, 8), float64, seed 10, no mask", hint)
    check(MHA_PLAN[2], 2, x, reference_causal(5),
          "the same x, mask = the causal mask (5, 5), passed as forward(x, mask=mask)",
          f"forward(x, mask=None): mask is bool (T, T), True = may attend; fill the scores "
          f"where it is False with -inf before the softmax ({section('5.2')})")
    x1 = randn(gen, 1, 6, 8)
    check(MHA_PLAN[3], 4, x1, None, "random x (1, 6, 8), float64, seed 10, n_heads = 4", hint)
    run.checked.pop()  # two head counts, one case of the plan
    check(MHA_PLAN[3], 1, x1, None, "random x (1, 6, 8), float64, seed 10, n_heads = 1", hint)


def multi_head_attention(cls: type[nn.Module]) -> CheckResult:
    """Check a multi-head self-attention class, ``cls(d_model, n_heads)`` (Chapter 6).

    The class builds ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``, each
    ``nn.Linear(d_model, d_model)`` with a bias (the check writes seeded weights into them).
    Its forward takes ``x (B, T, d_model)`` and an optional ``mask=`` (bool ``(T, T)``,
    ``True`` = may attend) and returns ``out (B, T, d_model)`` or ``(out, weights)``. The
    check holds it to ``nn.MultiheadAttention`` with the same weights (section 6.10).
    """
    return run_check("multi_head_attention", MHA_PLAN, cls, _mha_body, arg="cls",
                     want_class=True)


# ------------------------------------------------------------------------ pre_norm_block

BLOCK_PLAN = (
    "x (2, 5, 8), float64: x + attn(norm1(x)), then + ff(norm2(.)), against "
    "TransformerBlock(norm_first=True) (7.7)",
    "another x (1, 3, 8), float64, and a single position (1, 1, 8)",
)


def _block_body(run: Run, fn: Callable[..., Any]) -> None:
    block = TransformerBlock(8, 2, d_ff=16).double().eval()
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():  # two different norms, so swapping them shows
        for norm in (block.norm1, block.norm2):
            assert isinstance(norm, nn.LayerNorm)  # norm="layer", the default
            norm.weight.copy_(1.0 + randn(gen, 8, scale=0.5))
            norm.bias.copy_(randn(gen, 8, scale=0.5))

    def attn(h: Tensor) -> Tensor:
        return block.self_attn(h, is_causal=True)[0]

    ff: nn.Module = block.ff
    norm1: nn.Module = block.norm1
    norm2: nn.Module = block.norm2
    hint = (f"pre-norm: x = x + attn(norm1(x)), then x = x + ff(norm2(x)), the second step "
            f"reading the output of the first ({section('7.7')})")

    def check(case: str, x: Tensor, inputs: str) -> None:
        got = run.call(case, inputs, lambda: fn(x.clone(), attn, ff, norm1, norm2), hint)
        with torch.no_grad():
            expected = block(x, is_causal=True)
            if isinstance(got, Tensor):
                got = got.detach()

            def post_norm() -> Tensor:
                h = norm1(x + attn(x))
                return norm2(h + ff(h))

            def residual_of_norm() -> Tensor:
                h = norm1(x)
                h = h + attn(h)
                g = norm2(h)
                return g + ff(g)

            def swapped() -> Tensor:
                h = x + attn(norm2(x))
                return h + ff(norm1(h))

            def parallel() -> Tensor:
                return x + attn(norm1(x)) + ff(norm2(x))

            def no_residual() -> Tensor:
                h = attn(norm1(x))
                return ff(norm2(h))

            run.compare(case, inputs, got, expected, hint, **TIGHT, mistakes=[
                (like(post_norm),
                 f"that is post-norm, norm(x + attn(x)): pre-norm normalises each sublayer's "
                 f"input and leaves the residual stream itself un-normalised "
                 f"({section('7.5')})"),
                (like(residual_of_norm),
                 f"the residual adds the un-normalised x: x + attn(norm1(x)), not "
                 f"norm1(x) + attn(norm1(x)) ({section('7.5')})"),
                (like(swapped),
                 f"norm1 goes before the attention, norm2 before the feed-forward "
                 f"({section('7.7')})"),
                (like(parallel),
                 f"the feed-forward reads the output of the attention step: first x = x + "
                 f"attn(norm1(x)), then x = x + ff(norm2(x)) with the new x "
                 f"({section('7.7')})"),
                (like(no_residual),
                 f"each sublayer's output is added to its input (the residual connection) "
                 f"({section('7.4')})"),
            ])
        run.passed(case)

    check(BLOCK_PLAN[0], randn(gen, 2, 5, 8), "random x (2, 5, 8), float64, seed 12; attn is a "
          "causal multi-head self-attention, ff a feed-forward network, norm1 and norm2 "
          "LayerNorms with different weights")
    check(BLOCK_PLAN[1], randn(gen, 1, 3, 8), "random x (1, 3, 8), float64, seed 12")
    run.checked.pop()  # two shapes, one case of the plan
    check(BLOCK_PLAN[1], randn(gen, 1, 1, 8), "random x (1, 1, 8), float64, seed 12")


def pre_norm_block(fn: Callable[..., Tensor]) -> CheckResult:
    """Check a pre-norm block's forward, ``fn(x, attn, ff, norm1, norm2) -> (B, T, D)`` (Ch. 7).

    ``x (B, T, D)``; ``attn`` (a causal self-attention, ``(B, T, D) -> (B, T, D)``), ``ff`` (a
    feed-forward network) and ``norm1``, ``norm2`` (LayerNorms) are given as callables. The
    block computes ``x = x + attn(norm1(x))`` then ``x = x + ff(norm2(x))`` (section 7.7;
    no dropout). The check holds it to ``TransformerBlock(norm_first=True)``.
    """
    return run_check("pre_norm_block", BLOCK_PLAN, fn, _block_body)


# ---------------------------------------------------------------------- sinusoidal_table

TABLE_PLAN = (
    "context_length 4, d_model 4: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos (7.2)",
    "context_length 50, d_model 16, against course_attn.sinusoidal_table",
)


def _table_variant(t: int, d: int, *, start: int = 0, swap: bool = False,
                   per_column: bool = False, halves: bool = False,
                   base: float = 10000.0) -> Tensor:
    position = torch.arange(start, start + t, dtype=F64)[:, None]  # (T, 1)
    even = torch.arange(0, d, 2, dtype=F64)  # (D / 2,)
    exponent = even / 2 / d if per_column else even / d
    angle = position / base ** exponent  # (T, D / 2)
    first, second = (angle.cos(), angle.sin()) if swap else (angle.sin(), angle.cos())
    if halves:
        return torch.cat([first, second], dim=-1).float()
    return torch.stack([first, second], dim=-1).flatten(-2).float()


def _table_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"PE[p, 2i] = sin(p / 10000^(2i / d_model)) and PE[p, 2i + 1] = cos(same angle), "
            f"positions from 0 ({section('7.2')})")

    def check(case: str, t: int, d: int) -> None:
        inputs = f"context_length = {t}, d_model = {d}"
        got = run.call(case, inputs, lambda: fn(t, d), hint)
        if isinstance(got, Tensor) and got.is_floating_point():
            got = got.detach().float()  # any floating dtype will do
        run.compare(case, inputs, got, reference_table(t, d), hint, **LOOSE, mistakes=[
            (like(lambda: _table_variant(t, d, swap=True), **LOOSE),
             f"even columns hold the sine, odd columns the cosine ({section('7.2')})"),
            (like(lambda: _table_variant(t, d, halves=True), **LOOSE),
             f"interleave: sin in column 2i and cos in column 2i + 1, not all sines and then "
             f"all cosines ({section('7.2')})"),
            (like(lambda: _table_variant(t, d, per_column=True), **LOOSE),
             f"the pair (2i, 2i + 1) shares one frequency, 1 / 10000^(2i / d_model): the "
             f"exponent uses 2i, the even column's index ({section('7.2')})"),
            (like(lambda: _table_variant(t, d, start=1), **LOOSE),
             f"positions start at 0: row 0 is sin(0) = 0, cos(0) = 1 ({section('7.2')})"),
        ])
        run.passed(case)

    check(TABLE_PLAN[0], 4, 4)
    check(TABLE_PLAN[1], 50, 16)


def sinusoidal_table(fn: Callable[[int, int], Tensor]) -> CheckResult:
    """Check the sinusoidal positional encodings, ``fn(context_length, d_model) -> (T, D)``
    (Chapter 7): ``PE[p, 2i] = sin(p / 10000^(2i / D))``, ``PE[p, 2i + 1] = cos(...)`` for an
    even ``D``; any floating dtype (section 7.2)."""
    return run_check("sinusoidal_table", TABLE_PLAN, fn, _table_body)
