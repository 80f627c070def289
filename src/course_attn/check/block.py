"""Checks for chapter 7: the pre-norm block's forward and the sinusoidal positional table.

The block is held to the package's ``TransformerBlock(norm_first=True)``, its sublayers
handed to the learner's function as callables; the table, which the usual code builds in
float32, is compared at the float32 tolerance in float32 or float64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..core.layers import TransformerBlock
from ..core.layers import sinusoidal_table as reference_table
from .common import F64, gen, gradient_properties, randn
from .harness import gradients
from .report import CheckResult, section
from .runner import Case, Check, Harness, Inputs, Mistake, Property, args, call, run_check
from .values import FLOAT32

__all__ = ["pre_norm_block", "sinusoidal_table"]


# ------------------------------------------------------------------------ pre_norm_block


class CausalAttention(nn.Module):
    """The block's causal self-attention as a function ``(B, T, D) -> (B, T, D)``; it keeps
    the block, which the reference runs whole."""

    def __init__(self, block: TransformerBlock) -> None:
        super().__init__()
        self.block = block

    def forward(self, h: Tensor) -> Tensor:
        return self.block.self_attn(h, is_causal=True)[0]


def _block_inputs(shape: tuple[int, ...]) -> Inputs:
    block = TransformerBlock(8, 2, d_ff=16).double().eval()
    g = gen(12)
    with torch.no_grad():  # two different norms, so that swapping them shows
        for norm in (block.norm1, block.norm2):
            assert isinstance(norm, nn.LayerNorm)  # norm="layer", the default
            norm.weight.copy_(1.0 + randn(g, 8, scale=0.5))
            norm.bias.copy_(randn(g, 8, scale=0.5))
    return args(randn(g, *shape), CausalAttention(block), block.ff, block.norm1, block.norm2)


def _reference_block(x: Tensor, attn: CausalAttention, ff: object, norm1: object,
                     norm2: object) -> Tensor:
    return attn.block(x, is_causal=True)


def _block_variant(how: str) -> Callable[..., Tensor]:
    def wrong(x: Tensor, attn: Callable[[Tensor], Tensor], ff: Callable[[Tensor], Tensor],
              norm1: Callable[[Tensor], Tensor], norm2: Callable[[Tensor], Tensor]) -> Tensor:
        if how == "post":
            h = norm1(x + attn(x))
            return norm2(h + ff(h))
        if how == "residual_of_norm":
            h = norm1(x)
            h = h + attn(h)
            return norm2(h) + ff(norm2(h))
        if how == "swapped":
            h = x + attn(norm2(x))
            return h + ff(norm1(h))
        if how == "parallel":
            return x + attn(norm1(x)) + ff(norm2(x))
        if how == "detached":
            h = x + attn(norm1(x)).detach()
            return h + ff(norm2(h))
        if how == "one_norm":
            h = x + attn(norm1(x))
            return h + ff(norm1(h))
        return ff(norm2(attn(norm1(x))))  # "no_residual"
    return wrong


BLOCK_MISTAKES = (
    Mistake(_block_variant("post"),
            f"that is post-norm, norm(x + attn(x)): pre-norm normalises each sublayer's input "
            f"and leaves the residual stream itself un-normalised ({section('7.4')})"),
    Mistake(_block_variant("residual_of_norm"),
            f"the residual adds the un-normalised x: x + attn(norm1(x)), not norm1(x) + "
            f"attn(norm1(x)) ({section('7.4')})"),
    Mistake(_block_variant("swapped"),
            f"norm1 goes before the attention, norm2 before the feed-forward "
            f"({section('7.7')})"),
    Mistake(_block_variant("parallel"),
            f"the feed-forward reads the output of the attention step: first x = x + "
            f"attn(norm1(x)), then x = x + ff(norm2(x)) with the new x ({section('7.7')})"),
    Mistake(_block_variant("detached"),
            f"do not detach a sublayer's output: the gradient reaches the attention's weights "
            f"through attn(norm1(x)), and x through it too ({section('7.5')})"),
    Mistake(_block_variant("one_norm"),
            f"each sublayer has its own norm: norm1 before the attention, norm2 before the "
            f"feed-forward, not norm1 twice ({section('7.7')})"),
    Mistake(_block_variant("no_residual"),
            f"each sublayer's output is added to its input (the residual connection) "
            f"({section('7.4')})"),
)
BLOCK_HINT = ("pre-norm: x = x + attn(norm1(x)), then x = x + ff(norm2(x)), the second step "
              "reading the output of the first")
SUBLAYERS = ("attn is a causal multi-head self-attention, ff a feed-forward network, norm1 "
             "and norm2 LayerNorms with different weights")


def _block_case(plan: str, shape: tuple[int, ...], hint: str = BLOCK_HINT,
                number: str = "7.7", harness: Harness = call,
                properties: tuple[Property, ...] = ()) -> Case:
    return Case(plan, lambda: _block_inputs(shape), f"random x {shape}, float64, seed 12; "
                f"{SUBLAYERS}", hint, number, FLOAT32, harness, properties)


PRE_NORM_BLOCK = Check("pre_norm_block", _reference_block, (
    _block_case("x (2, 5, 8), float64: x + attn(norm1(x)), then + ff(norm2(.)), against "
                "TransformerBlock(norm_first=True)", (2, 5, 8)),
    *(_block_case("size-1 dimensions: a batch of one (1, 3, 8), and a single position "
                  "(1, 1, 8)", shape) for shape in ((1, 3, 8), (1, 1, 8))),
    _block_case("the float64 gradient of x through the block", (2, 5, 8),
                "keep the computation in torch, differentiable: no .detach() or .item()",
                "7.5", gradients((0,)), gradient_properties(("x",), "7.5")),
), params=("x", "attn", "ff", "norm1", "norm2"), mistakes=BLOCK_MISTAKES)


def pre_norm_block(fn: Callable[..., Tensor]) -> CheckResult:
    """Check a pre-norm block's forward, ``fn(x, attn, ff, norm1, norm2) -> (B, T, D)`` (Ch. 7).

    ``x (B, T, D)``; ``attn`` (a causal self-attention, ``(B, T, D) -> (B, T, D)``), ``ff`` (a
    feed-forward network) and ``norm1``, ``norm2`` (LayerNorms) are given as callables. The
    block computes ``x = x + attn(norm1(x))`` then ``x = x + ff(norm2(x))`` (section 7.7;
    no dropout), without changing the caller's ``x``. The check holds it to
    ``TransformerBlock(norm_first=True)``.
    """
    return run_check(PRE_NORM_BLOCK, fn)


# ---------------------------------------------------------------------- sinusoidal_table


def _table_variant(t: int, d: int, *, start: int = 0, swap: bool = False,
                   exponent: str = "2i", halves: bool = False, base: float = 10000.0
                   ) -> Tensor:
    """The table with one known mistake: ``exponent="i"`` (the pair's index where 2i
    belongs), ``"column"`` (each column its own frequency, column c at 1 / base^(c / D))."""
    position = torch.arange(start, start + t, dtype=F64)[:, None]  # (T, 1)
    even = torch.arange(0, d, 2, dtype=F64)  # (D / 2,): 2i
    angle = position / base ** ((even / 2 if exponent == "i" else even) / d)  # (T, D / 2)
    first, second = (angle.cos(), angle.sin()) if swap else (angle.sin(), angle.cos())
    if exponent == "column":  # the cosine column 2i + 1 turns at its own 1 / base^((2i+1)/D)
        second = (position / base ** ((even + 1) / d)).cos()
    if halves:
        return torch.cat([first, second], dim=-1).float()
    return torch.stack([first, second], dim=-1).flatten(-2).float()


HALF = (torch.float16, torch.bfloat16)


def _as_float32(fn: Callable[..., object], positional: tuple[object, ...],
                keyword: dict[str, object]) -> object:
    """The table in float32, whatever floating dtype it came in (any will do); a table in
    half precision is left as it is, and told that its dtype cannot hold the digits."""
    table = fn(*positional, **keyword)
    if isinstance(table, Tensor) and table.is_floating_point() and table.dtype not in HALF:
        return table.detach().float()
    return table


def _table_case(plan: str, t: int, d: int) -> Case:
    return Case(plan, lambda: args(t, d), f"context_length = {t}, d_model = {d}",
                "PE[p, 2i] = sin(p / 10000^(2i / d_model)) and PE[p, 2i + 1] = cos(same "
                "angle), positions from 0", "7.2", FLOAT32, _as_float32)


SINUSOIDAL_TABLE = Check("sinusoidal_table", reference_table, (
    _table_case("context_length 4, d_model 4: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] "
                "= cos", 4, 4),
    _table_case("context_length 50, d_model 16, against course_attn.sinusoidal_table", 50, 16),
    _table_case("size-1 dimensions: one position, context_length 1, d_model 6", 1, 6),
), params=("context_length", "d_model"), mistakes=(
    Mistake(lambda t, d: _table_variant(t, d, swap=True),
            f"even columns hold the sine, odd columns the cosine ({section('7.2')})"),
    Mistake(lambda t, d: _table_variant(t, d, halves=True),
            f"interleave: sin in column 2i and cos in column 2i + 1, not all sines and then "
            f"all cosines ({section('7.2')})"),
    Mistake(lambda t, d: _table_variant(t, d, exponent="i"),
            f"the exponent is 2i / d_model, with 2i the even column's index: you used i, the "
            f"pair's index, so the frequencies fall too slowly ({section('7.2')})"),
    Mistake(lambda t, d: _table_variant(t, d, exponent="column"),
            f"the pair (2i, 2i + 1) shares one frequency, 1 / 10000^(2i / d_model): the "
            f"cosine column 2i + 1 takes the angle of the sine column 2i, not one of its own "
            f"({section('7.2')})"),
    Mistake(lambda t, d: _table_variant(t, d, base=1000.0),
            f"the base is 10000: PE[p, 2i] = sin(p / 10000^(2i / d_model)) ({section('7.2')})"),
    Mistake(lambda t, d: _table_variant(t, d, start=1),
            f"positions start at 0: row 0 is sin(0) = 0, cos(0) = 1 ({section('7.2')})"),
), properties=(Property(lambda got, expected, inputs: isinstance(got, Tensor) and
                        got.dtype in HALF,
                        f"build the table in float32 or float64: half precision keeps about 3 "
                        f"significant digits, and sin and cos of angles up to 49 radians lose "
                        f"even those ({section('7.2')})"),))


def sinusoidal_table(fn: Callable[[int, int], Tensor]) -> CheckResult:
    """Check the sinusoidal positional encodings, ``fn(context_length, d_model) -> (T, D)``
    (Chapter 7): ``PE[p, 2i] = sin(p / 10000^(2i / D))``, ``PE[p, 2i + 1] = cos(...)`` for an
    even ``D``; float32 or float64, compared in float32 (section 7.2; half precision cannot
    hold the digits)."""
    return run_check(SINUSOIDAL_TABLE, fn)
