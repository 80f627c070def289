"""Diagrams of chapter 11: ``minigpt_architecture`` and ``induction_circuit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from matplotlib.patches import FancyBboxPatch

from ..._validation import check_nonnegative_int
from ._draw import (
    HEADING,
    INK,
    NOTE,
    ROLE_COLORS,
    WIDTH,
    Sketch,
    canvas,
    check_int,
    diagram,
    shade,
    shape_text,
    text_size,
    wrap,
)
from .blocks import BLOCK_STAGES, RESIDUAL_FROM

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["induction_circuit", "minigpt_architecture"]


# ------------------------------------------------------------------- chapter 11: MiniGPT

_GPT_X, _GPT_W, _GPT_STEP = 2.2, 2.5, 0.78


def _gpt_inputs(s: Sketch, y: float) -> float:
    """Token ids and positions, their two embeddings and the sum; returns the sum's top."""
    for name, cx, label, text in (("embed", 1.15, "idx (B, T)", "embed\nEmbedding(V, D)"),
                                  ("pos", 3.25, "positions 0 … T−1",
                                   "pos: Embedding\n(T_max, D)")):
        s.label(f"{name} input", cx, y, label, va="bottom")
        box = s.box(name, cx, y + 0.8, 1.95, 0.6, text, "layer")
        s.arrow((cx, y + 0.23), (cx, box["bottom"]), f"{name} input", name)
    add = s.adder("add", _GPT_X, y + 1.55)
    for name in ("embed", "pos"):
        extent = s.record.nodes[name]
        cx = (extent[0] + extent[2]) / 2
        s.wire([(cx, extent[3]), (cx, y + 1.55), (add["left"] if cx < _GPT_X else add["right"],
                                                  y + 1.55)], name, "add")
    return add["top"]


def _gpt_stack(s: Sketch, y: float, n_layers: int) -> None:
    """blocks[0] ... blocks[N-1], the final norm, the LM head and the logits."""
    stages = [(f"blocks[{i}]", "weights", f"blocks[{i}]\nTransformerBlock") for i in
              range(n_layers)]
    stages += [("norm", "norm", "norm\nLayerNorm(D)"),
               ("lm_head", "layer", "lm_head\nLinear(D, V)")]
    previous = "add"
    for name, role, text in stages:
        box = s.box(name, _GPT_X, y + _GPT_STEP - 0.1, _GPT_W, 0.6, text, role)
        s.arrow((_GPT_X, y), (_GPT_X, box["bottom"]), previous, name)
        previous, y = name, box["top"]
    s.label("logits", _GPT_X, y + 0.32, "logits " + shape_text(("B", "T", "V")), va="bottom")
    s.arrow((_GPT_X, y), (_GPT_X, y + 0.28), "lm_head", "logits")
    _repeat_bracket(s, n_layers)


def _repeat_bracket(s: Sketch, n_layers: int) -> None:
    """A bracket left of ``blocks[0]`` ... ``blocks[N-1]``, "× N": the blocks are one block
    repeated N times (with N = ``n_layers`` written under it), not N different things."""
    bottom = s.record.nodes["blocks[0]"][1]
    top = s.record.nodes[f"blocks[{n_layers - 1}]"][3]
    x, tick = _GPT_X - _GPT_W / 2 - 0.16, 0.09
    s.ax.plot([x + tick, x, x, x + tick], [bottom, bottom, top, top], color=INK, lw=1.3,
              solid_joinstyle="miter")
    middle = (bottom + top) / 2
    s.text(x - 0.08, middle + 0.03, "× N", HEADING, ha="right", va="bottom",
           fontweight="bold")
    s.text(x - 0.08, middle - 0.03, f"N = {n_layers}", ha="right", va="top", color=NOTE)


def _gpt_block(s: Sketch, top: float) -> None:
    """Inside every block: chapter 7's pre-norm block below ``top``, framed, its parts named
    ``block: norm1`` ... (the module names of ``TransformerBlock``)."""
    labels = {"norm1": "norm1", "attn": "self_attn (causal)", "norm2": "norm2",
              "ff": "ff (feed-forward)"}
    cx, box_w, step = 5.3, 1.9, 0.56
    bottom = top - 0.75 - 6 * step - 0.65
    s.text(cx + 0.2, top - 0.1, "inside each block", HEADING, fontweight="bold", va="top")
    s.label("block: x", cx, bottom, "x (B, T, D)", va="top")
    previous, y = "block: x", bottom + 0.04
    for i, (stage, role) in enumerate(BLOCK_STAGES["pre"]):
        cy, name = bottom + (i + 1) * step, "block: " + stage
        if role == "add":
            box = s.adder(name, cx, cy)
            source = "block: " + RESIDUAL_FROM["pre"][stage]
            branch_y = s.record.nodes[source][3] + 0.08
            s.wire([(cx, branch_y), (cx + box_w / 2 + 0.2, branch_y),
                    (cx + box_w / 2 + 0.2, cy), (box["right"], cy)], source, name, dot=True)
        else:
            box = s.box(name, cx, cy, box_w, 0.38, labels[stage], role)
        s.arrow((cx, y), (cx, box["bottom"]), previous, name)
        previous, y = name, box["top"]
    s.label("block: y", cx, y + 0.3, "(B, T, D)", va="bottom")
    s.arrow((cx, y), (cx, y + 0.26), previous, "block: y")
    frame = (cx - box_w / 2 - 0.2, bottom - 0.3, cx + box_w / 2 + 0.45, y + 0.6)
    s.ax.add_patch(FancyBboxPatch(frame[:2], frame[2] - frame[0], frame[3] - frame[1],
                                  boxstyle="round,pad=0,rounding_size=0.08", fill=False,
                                  edgecolor="#999999", lw=1, ls="--"))
    first = s.record.nodes["blocks[0]"]
    for y_from, y_to in ((first[3], frame[3]), (first[1], frame[1])):  # a zoom of blocks[0]
        s.ax.plot([first[2], frame[0]], [y_from, y_to], color="#AAAAAA", lw=1, ls=":")


@diagram
def minigpt_architecture(n_layers: int = 2) -> Figure:
    """The MiniGPT model: token ids go through the token embedding embed, positions through the position embedding pos, the two are added, then N pre-norm Transformer blocks (blocks), a final LayerNorm (norm) and a linear head (lm_head) that gives the logits of the next token.

    Chapter 11 (the mini-Transformer; ``MiniGPT``'s modules ``embed``, ``pos``,
    ``blocks``, ``norm`` and ``lm_head``, the names of the parts of the drawing). Each block
    is Chapter 7's pre-norm block, drawn on the right (parts ``block: norm1`` ...).
    ``n_layers`` (1 to 4) is the number of blocks N.
    """  # noqa: E501
    n_layers = check_int(n_layers, "n_layers", high=4)

    stack_top = 2.6 + (n_layers + 2) * 0.98 + 0.55  # the logits' label
    height = max(stack_top, 5.6) + 0.7 + 0.1
    s = canvas(height, "MiniGPT: embeddings, N pre-norm blocks, norm, LM head")
    y = _gpt_inputs(s, 0.9)
    _gpt_stack(s, y, n_layers)
    _gpt_block(s, height - 0.65)
    s.text(0.15, 0.12, wrap("lm_head shares its weight matrix with embed (weight tying, as "
                            "in GPT-2).", WIDTH - 0.3), ha="left", va="bottom", color=NOTE)
    return s.fig


# ------------------------------------------------------ chapter 11: an induction circuit

_LETTERS = "ABCDEFGH"


def _induction_tokens(s: Sketch, tokens: Sequence[str], y: float) -> list[float]:
    """The tokens in a row, their positions above; returns their x."""
    step = min(0.95, 4.0 / (len(tokens) - 1))
    xs = [0.75 + step * i for i in range(len(tokens))]
    for i, (x, token) in enumerate(zip(xs, tokens, strict=True)):
        s.box(f"token {i}", x, y, min(0.62, step - 0.2), 0.5, token, "input", fill=0.3)
        s.text(x, y + 0.27, str(i), va="bottom", color=NOTE)
    return xs


def _induction_arrows(s: Sketch, xs: Sequence[float], y: float) -> None:
    """blocks[0]: each position reads the one before; blocks[1]: the last reads B."""
    prev_color, ind_color = shade(ROLE_COLORS["weights"], 0.1), ROLE_COLORS["query"]
    for i in range(1, len(xs)):  # from the key read (i - 1) to the query that reads it (i)
        s.arrow((xs[i - 1] + 0.12, y - 0.25), (xs[i] - 0.12, y - 0.25), f"token {i - 1}",
                f"token {i}", connection="arc3,rad=0.6", color=prev_color,
                lw=2.4 if i == 1 else 1.0)
    s.text((xs[0] + xs[1]) / 2, y - 0.62, "blocks[0]", va="top", color=prev_color,
           fontweight="bold")
    last = len(xs) - 1
    s.arrow((xs[1], y + 0.55), (xs[last], y + 0.55), "token 1", f"token {last}",
            connection="arc3,rad=-0.3", color=ind_color, lw=2.4)
    apex = y + 0.55 + 0.3 * (xs[last] - xs[1]) / 2
    s.text((xs[1] + xs[last]) / 2, apex + 0.05, "blocks[1]", va="bottom", color=ind_color,
           fontweight="bold")
    token = s.record.nodes[f"token {last}"]
    s.box("prediction", token[2] + 1.15, y, 1.3, 0.5, "next: B", "output")
    s.arrow((token[2], y), (token[2] + 0.5, y), f"token {last}", "prediction")


@diagram
def induction_circuit(n_between: int = 2) -> Figure:
    """An induction circuit in two layers: in the first block a previous-token head lets each position read the token before it, so the position of B records that A came before it; in the second block an induction head at the later A looks for a position whose previous token was A, finds B, attends to it and copies B as the prediction.

    Chapter 11 (induction heads; the chapter numbers the layers 0 and 1, so the
    previous-token head is in ``blocks[0]`` and the induction head in ``blocks[1]``).
    ``n_between`` (0 to 4) tokens sit between B and the second A. Parts are named
    ``token 0`` ... and ``prediction``; an arrow runs from the position a head reads to the
    position that reads it: in the first block from each token to the next, in the second
    from B to the last token.
    """  # noqa: E501
    n_between = check_nonnegative_int(n_between, "n_between", upper=4)

    tokens = ["A", "B", *_LETTERS[2:2 + n_between], "A"]
    top_note = wrap("blocks[1], induction head: the later A looks for a position whose "
                     "previous token was A (B's key carries it, from blocks[0]), attends to B "
                     "and copies B into the prediction.", WIDTH - 0.3)
    bottom_note = wrap("blocks[0], previous-token head: each position reads the one before "
                        "it, so B's position also says \"the token before me was A\".",
                        WIDTH - 0.3)
    arc = 0.3 * 4.0 / 2 + 0.55 + 0.45  # the induction arrow's height, at most
    y = 0.2 + text_size(bottom_note)[1] + 1.0
    height = y + arc + 0.3 + text_size(top_note)[1] + 0.75
    s = canvas(height, "An induction circuit: A B … A → B")
    xs = _induction_tokens(s, tokens, y)
    _induction_arrows(s, xs, y)
    s.text(0.15, height - 0.7, top_note, ha="left", va="top",
           color=shade(ROLE_COLORS["query"], 0.2))
    s.text(0.15, 0.15, bottom_note, ha="left", va="bottom",
           color=shade(ROLE_COLORS["weights"], 0.1))
    return s.fig
