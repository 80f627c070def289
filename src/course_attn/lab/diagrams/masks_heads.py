"""Diagrams of chapters 4 to 6: scaled dot-product attention, its mask, the heads.

``scaled_dot_product_graph`` (chapters 4 and 5), ``head_split_merge`` and
``multi_head_block`` (chapter 6).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from matplotlib.patches import Rectangle

from ..._validation import check_bool
from ._draw import (
    HEAD_COLORS,
    INK,
    NOTE,
    ROLE_COLORS,
    WIDTH,
    Box,
    Sketch,
    bounds,
    canvas,
    check_int,
    diagram,
    fitting,
    grid,
    shade,
    shape_text,
    text_size,
    wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["head_split_merge", "multi_head_block", "scaled_dot_product_graph"]


# --------------------------- chapters 4 and 5: the graph of scaled dot-product attention

_SDPA_X, _SDPA_W, _SDPA_STEP = 3.2, 2.5, 0.74


def _sdpa_inputs(s: Sketch, top: float) -> None:
    """Q, K and V at the top; K enters the first product transposed."""
    s.box("Q", 1.75, top, 1.5, 0.42, "Q (T_q, d_k)", "query")
    s.box("K", 4.0, top, 1.5, 0.42, "K (T_k, d_k)", "key")
    s.box("V", 6.05, top, 1.4, 0.42, "V (T_k, d_v)", "value")


def _sdpa_stages(masked: bool) -> list[tuple[str, str, str, str]]:
    """(name, role, box text, what leaves it) from the first product to the output."""
    stages = [("matmul QK", "layer", "MatMul: Q Kᵀ", "(T_q, T_k)"),
              ("scale", "weights", "Scale: ÷ √d_k", "attn_scores (T_q, T_k)")]
    if masked:
        stages.append(("mask", "mask", "Mask: False → −∞", "(T_q, T_k)"))
    stages += [("softmax", "weights", "Softmax of each row", "attn_weights (T_q, T_k)"),
               ("matmul AV", "layer", "MatMul: A V", "(T_q, d_v)")]
    return stages


@diagram
def scaled_dot_product_graph(masked: bool = True) -> Figure:
    """The computation graph of scaled dot-product attention: Q and K transposed go into a matrix product, the scores are scaled by 1 / sqrt(d_k), masked (False becomes minus infinity), turned into weights by a softmax of each row, and the weights multiply V.

    Chapter 4 (scaled dot-product attention) and Chapter 5 (masks). With ``masked=False``
    the mask step is left out. The parts are named ``Q``, ``K``, ``V``, ``matmul QK``,
    ``scale``, ``mask``, ``mask input``, ``softmax``, ``matmul AV`` and ``output``.
    """  # noqa: E501
    masked = check_bool(masked, "masked")

    stages = _sdpa_stages(masked)
    height = 0.6 + 0.5 + (len(stages) + 1) * _SDPA_STEP + 0.95
    s = canvas(height, "Scaled dot-product attention: the computation graph")
    top = height - 0.95
    _sdpa_inputs(s, top)
    previous: list[str] = ["Q", "K"]
    y = top
    for name, role, text, leaves in stages:
        y -= _SDPA_STEP
        box = s.box(name, _SDPA_X, y, _SDPA_W, 0.42, text, role)
        for source in previous:
            src = s.record.nodes[source]
            x = min(max((src[0] + src[2]) / 2, box["left"] + 0.3), box["right"] - 0.3)
            s.arrow((x if source != "Q" else x, src[1]), (x, box["top"]), source, name)
        s.text(_SDPA_X + 0.12, box["bottom"] - 0.16, leaves, ha="left", color=NOTE)
        previous = [name]
        if name == "mask":
            mask = s.box("mask input", 0.88, y, 1.62, 0.86, "mask (T_q, T_k)\nTrue: may\nattend",
                         "mask", fill=0.2)
            s.arrow((mask["right"], y), (box["left"], y), "mask input", "mask")
    matmul = s.record.nodes["matmul AV"]
    s.wire([(6.45, s.record.nodes["V"][1]), (6.45, y), (matmul[2], y)], "V", "matmul AV")
    s.box("output", _SDPA_X, y - _SDPA_STEP, 2.0, 0.42, "output (T_q, d_v)", "output")
    s.arrow((_SDPA_X, matmul[1]), (_SDPA_X, y - _SDPA_STEP + 0.21), "matmul AV", "output")
    s.text(4.35, top - 0.37, "Kᵀ (d_k, T_k)", ha="left", color=NOTE)
    s.text(0.15, 0.12, wrap("The manual path builds attn_scores and attn_weights, (T_q, T_k) "
                             "each; the fused path (impl=\"sdpa\") gives the same output without "
                             "returning the weights.", WIDTH - 0.3),
           ha="left", va="bottom", color=NOTE)
    return s.fig


# ------------------------------------------------ chapter 6: splitting and merging heads

# (p, c) of the cell at row r, column c of block b: x's entry 10 p + c sits there.
_Entry = Callable[[int, int, int], tuple[int, int]]


@dataclass(frozen=True)
class _Layout:
    """The sizes of :func:`head_split_merge`: T, D, H, head_dim and the cell size."""

    t: int
    d_model: int
    n_heads: int
    head_dim: int
    cell: float
    head_h: float = 0.28  # the "head 0" line above a block
    gap: float = 0.26  # between a section's grids and the next section's code line


# A step of head_split_merge: code, the shape it gives, number of grids, (rows, cols) of each,
# the entry of each cell and the names of the grids ("token", "t"), or None for one grid.
_Step = tuple[str, str, int, tuple[int, int], _Entry, "tuple[str, str] | None"]


def _head_color(entry: _Entry, b: int, head_dim: int, r: int, c: int) -> str:
    """The colour of the head that channel of the cell belongs to."""
    return HEAD_COLORS[entry(b, r, c)[1] // head_dim]


def _entry_text(entry: _Entry, b: int, r: int, c: int) -> str:
    """``10 p + c``: the position and channel of the cell, readable at a glance."""
    p, channel = entry(b, r, c)
    return str(10 * p + channel)


def _blocks(s: Sketch, lay: _Layout, top: float, n: int, shape: tuple[int, int],
            entry: _Entry, names: Sequence[str] | None, frame: object = INK) -> Box:
    """``n`` grids of ``rows x cols`` side by side; cell ``(r, c)`` of grid ``b`` shows
    ``10 p + c'`` where ``(p, c') = entry(b, r, c)``."""
    rows, cols = shape
    gap = 0.14 if names is None or names[0] == "token" else 0.22
    width = n * cols * lay.cell + (n - 1) * gap
    grid_top = top - (lay.head_h if names is not None else 0.0)
    for b in range(n):
        left = (WIDTH - width) / 2 + b * (cols * lay.cell + gap)
        if names is not None:
            s.text(left + cols * lay.cell / 2, top, fitting(
                [f"{names[0]} {b}", f"{names[1]}{b}", f"{b}"], cols * lay.cell + gap), va="top")
        grid(s, left, grid_top, rows, cols, lay.cell,
              functools.partial(_head_color, entry, b, lay.head_dim),
              texts=functools.partial(_entry_text, entry, b))
        s.ax.add_patch(Rectangle((left, grid_top - rows * lay.cell), cols * lay.cell,
                                 rows * lay.cell, fill=False, edgecolor=frame, lw=1.6))
    return bounds((WIDTH - width) / 2, grid_top - rows * lay.cell, (WIDTH + width) / 2, top)


def _header_lines(code: str, shape: str) -> int:
    """1 where a step's code and the shape it gives share a line, 2 where they do not."""
    room = WIDTH - 0.2 - text_size(code, family="monospace")[0] - 0.25
    return 1 if text_size(shape)[0] <= room else 2


def _section(s: Sketch, lay: _Layout, name: str, top: float, step: _Step,
             ink: object = "black") -> float:
    """One step: its code on the left and the shape it gives on the right, then its grids
    (the part ``name`` covers both); returns the bottom."""
    code, shape, n, grid_shape, entry, names = step
    s.text(0.1, top, code, ha="left", va="top", family="monospace", color=ink)
    line = text_size(shape)[1]
    # the shape on the code's line where both fit, else on a line of its own below
    shape_top = top - (_header_lines(code, shape) - 1) * line
    s.text(WIDTH - 0.1, shape_top, shape, ha="right", va="top", color=ink)
    grids = _blocks(s, lay, shape_top - line - 0.08, n, grid_shape, entry, names,
                    frame=INK if ink == "black" else ink)
    s.node(name, bounds(0.1, grids["bottom"], WIDTH - 0.1, top))
    return grids["bottom"]


def _split_steps(lay: _Layout) -> dict[str, _Step]:
    """x, its view, the transpose (split_heads) and merge_heads."""
    t, d, h, hd = lay.t, lay.d_model, lay.n_heads, lay.head_dim
    return {
        "x": ("x", shape_text(("B", "T", "D"), (1, t, d)), 1, (t, d), lambda b, r, c: (r, c), None),
        "view": ("x.view(B, T, H, head_dim)",
                 shape_text(("B", "T", "H", "head_dim"), (1, t, h, hd)), t, (h, hd),
                 lambda b, r, c: (b, r * hd + c), ("token", "t")),
        "transpose": ("  .transpose(1, 2)", shape_text(("B", "H", "T", "head_dim"), (1, h, t, hd)),
                      h, (t, hd), lambda b, r, c: (r, b * hd + c), ("head", "h")),
        "merge": ("merge_heads: .transpose(1, 2).reshape(B, T, D)", "x again  ✓", 1, (t, d),
                  lambda b, r, c: (r, c), None),
    }


def _split_sections(s: Sketch, lay: _Layout, top: float) -> float:
    """The steps of :func:`_split_steps`, one under the other; returns the last bottom."""
    previous = None
    for name, step in _split_steps(lay).items():
        bottom = _section(s, lay, name, top, step)
        if previous is not None:  # the arrow crosses the gap between two sections
            s.arrow((0.3, top + lay.gap - 0.04), (0.3, top + 0.02), previous, name)
        previous, top = name, bottom - lay.gap
    return top + lay.gap


def _wrong_step(lay: _Layout) -> _Step:
    """The pitfall: a view straight to (B, H, T, head_dim) re-reads memory in order."""
    t, d, hd = lay.t, lay.d_model, lay.head_dim

    def wrong(b: int, r: int, c: int) -> tuple[int, int]:
        flat = (b * t + r) * hd + c  # the order in which view() reads the memory
        return flat // d, flat % d

    return ("WRONG: x.view(B, H, T, head_dim)",
            shape_text(("B", "H", "T", "head_dim"), (1, lay.n_heads, t, hd)) + "  ✗",
            lay.n_heads, (t, hd), wrong, ("head", "h"))


_WRONG_NOTE = ("Without the transpose, view reads the memory in order: head 0 gets token 0's "
               "whole vector, then token 1's, ... so heads and positions are mixed (colour: "
               "the true head).")


def _wrong_view(s: Sketch, lay: _Layout, top: float) -> None:
    bad = shade(ROLE_COLORS["mask"], 0.1)
    bottom = _section(s, lay, "wrong", top, _wrong_step(lay), ink=bad)
    s.text(0.1, bottom - 0.15, wrap(_WRONG_NOTE, WIDTH - 0.2), ha="left", va="top", color=bad)


@diagram
def head_split_merge(t: int = 3, d_model: int = 8, n_heads: int = 2) -> Figure:
    """Memory layout of split_heads: (B, T, D) is viewed as (B, T, H, head_dim) and transposed to (B, H, T, head_dim), so that each head holds its slice of every token; merge_heads undoes it; a view straight to (B, H, T, head_dim) instead mixes tokens and heads.

    Chapter 6 (multi-head attention; the pitfall of ``view`` without ``transpose``). Each
    cell holds ``10 * position + channel``, as in the chapter, and is coloured by the head
    its channel belongs to. ``t`` is T (1 to 5), ``d_model`` is D (1 to 10), ``n_heads`` is
    H (1 to 4) and must divide D; ``t * head_dim`` is at most 20.
    """  # noqa: E501
    t = check_int(t, "t", high=5)
    d_model = check_int(d_model, "d_model", high=10)
    n_heads = check_int(n_heads, "n_heads", high=4)
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} "
                         f"(head_dim = d_model / n_heads)")
    head_dim = d_model // n_heads
    if t * head_dim > 20:
        raise ValueError(f"t * head_dim = {t} * {head_dim} must be at most 20 to fit the "
                         f"tokens side by side: use a smaller t or more heads (n_heads)")

    area = WIDTH - 0.2
    # a tall stack gets smaller cells, but each holds its number ("47") at the one font size
    cell = max(min(0.32, (area - (n_heads - 1) * 0.22) / d_model,
                   (area - (t - 1) * 0.14) / (t * head_dim),
                   6.0 / (4 * t + n_heads)), text_size("88")[0] + 0.05)
    lay = _Layout(t, d_model, n_heads, head_dim, cell)
    line = text_size("x")[1] + 0.08
    grids = (t + n_heads + t + t + t) * cell + 3 * lay.head_h
    note_h = text_size(wrap(_WRONG_NOTE, WIDTH - 0.2))[1]
    headers = sum(_header_lines(step[0], step[1])
                  for step in [*_split_steps(lay).values(), _wrong_step(lay)])
    height = 0.6 + headers * line + grids + 4 * lay.gap + 0.3 + note_h + 0.1
    s = canvas(height, "Splitting and merging heads: the memory layout")
    bottom = _split_sections(s, lay, height - 0.6)
    rule_y = bottom - lay.gap / 2 - 0.1
    s.ax.plot([0.1, WIDTH - 0.1], [rule_y, rule_y], color="#BBBBBB", lw=1)
    _wrong_view(s, lay, rule_y - lay.gap / 2 - 0.05)
    return s.fig


# --------------------------------------------- chapter 6: the multi-head attention layer

def _mha_heads(s: Sketch, n_heads: int, top: float) -> float:
    """The H heads side by side under split_heads, each fed its q, k and v; returns the
    bottom of the heads."""
    width = (WIDTH - 0.6 - (n_heads - 1) * 0.2) / n_heads
    split = s.record.nodes["split_heads"]
    cy = top - 0.85
    for h in range(n_heads):
        cx = 0.3 + width / 2 + h * (width + 0.2)
        head = s.box(f"head {h}", cx, cy, width, 0.62, f"head {h}\nattention", "weights")
        for offset, role in ((-0.25, "query"), (0.0, "key"), (0.25, "value")):
            x = cx + offset * min(1.0, width / 1.2)
            s.arrow((x, split[1]), (x, head["top"]), "split_heads", f"head {h}",
                    color=shade(ROLE_COLORS[role], 0.1))
    return cy - 0.31


@diagram
def multi_head_block(n_heads: int = 4) -> Figure:
    """A multi-head attention layer: x goes through q_proj, k_proj and v_proj, split_heads cuts each result into H heads of head_dim = D / H channels, every head attends on its own, merge_heads concatenates the heads back to width D, and out_proj mixes them.

    Chapter 6 (multi-head attention; ``MultiHeadAttention``). ``n_heads`` is H (1 to 6).
    The parts are named ``x``, ``q_proj``, ``k_proj``, ``v_proj``, ``split_heads``,
    ``head 0`` ... ``head H-1``, ``merge_heads``, ``out_proj`` and ``output``; each head
    receives three arrows, its queries, keys and values.
    """  # noqa: E501
    n_heads = check_int(n_heads, "n_heads", high=6)

    note = wrap(f"H = {n_heads} heads of head_dim = D / H channels each. Head h computes "
                "softmax(q_h k_hᵀ / √head_dim) v_h on its own channels; all heads run as one "
                "batched product.", WIDTH - 0.3)
    height = 6.7 + text_size(note)[1]  # the layers, then the note under them
    s = canvas(height, "Multi-head attention: split, attend per head, merge")
    y = height - 0.85
    s.label("x", WIDTH / 2, y, "x " + shape_text(("B", "T", "D")), va="top")
    y -= 0.95
    for cx, name, role in ((1.45, "q_proj", "query"), (3.5, "k_proj", "key"),
                           (5.55, "v_proj", "value")):
        s.box(name, cx, y, 1.75, 0.6, f"{name}\nLinear(D, D)", role)
        s.arrow((WIDTH / 2 + (cx - 3.5) / 6, s.record.nodes["x"][1] - 0.03), (cx, y + 0.3), "x",
                name)
    split = s.box("split_heads", WIDTH / 2, y - 0.85, WIDTH - 0.6, 0.42,
                  "split_heads: (B, T, D) → (B, H, T, head_dim)", "layer")
    for name in ("q_proj", "k_proj", "v_proj"):
        cx = (s.record.nodes[name][0] + s.record.nodes[name][2]) / 2
        s.arrow((cx, y - 0.3), (cx, split["top"]), name, "split_heads")
    bottom = _mha_heads(s, n_heads, split["bottom"])
    merge = s.box("merge_heads", WIDTH / 2, bottom - 0.6, WIDTH - 0.6, 0.42,
                  "merge_heads (concat): (B, H, T, head_dim) → (B, T, D)", "layer")
    for h in range(n_heads):
        cx = (s.record.nodes[f"head {h}"][0] + s.record.nodes[f"head {h}"][2]) / 2
        s.arrow((cx, bottom), (cx, merge["top"]), f"head {h}", "merge_heads")
    out = s.box("out_proj", WIDTH / 2, merge["bottom"] - 0.65, 1.9, 0.6, "out_proj\nLinear(D, D)",
                "layer")
    s.arrow((WIDTH / 2, merge["bottom"]), (WIDTH / 2, out["top"]), "merge_heads", "out_proj")
    s.label("output", WIDTH / 2, out["bottom"] - 0.35, "output " + shape_text(("B", "T", "D")),
            va="top")
    s.arrow((WIDTH / 2, out["bottom"]), (WIDTH / 2, out["bottom"] - 0.31), "out_proj", "output")
    s.text(0.15, 0.12, note, ha="left", va="bottom", color=NOTE)
    return s.fig
