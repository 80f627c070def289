"""Diagrams of chapters 7 and 8: the block, the encoder-decoder, the KV cache.

``pre_norm_vs_post_norm`` (chapter 7), ``encoder_decoder_flow`` and ``kv_cache_steps``
(chapter 8). :data:`BLOCK_STAGES` and :data:`RESIDUAL_FROM` describe chapter 7's block
once; chapter 11's ``minigpt_architecture`` draws the same block from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from matplotlib.patches import FancyBboxPatch

from ._draw import (
    HEADING,
    INK,
    NOTE,
    ROLE_COLORS,
    WIDTH,
    Sketch,
    canvas,
    check_int,
    check_label,
    diagram,
    grid,
    legend,
    shape_text,
    text_size,
    tint,
    wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["encoder_decoder_flow", "kv_cache_steps", "pre_norm_vs_post_norm"]


# ----------------------------------------------------- chapter 7: pre-norm and post-norm

# The stages of a block, bottom to top, and where each residual connection leaves from:
# pre-norm x + f(norm(x)) keeps the stream unnormalised, so each residual leaves from the
# sum before it; post-norm norm(x + f(x)) feeds the *normalised* sum to the next sub-layer,
# so its second residual leaves from norm1 (x = norm1(x + attn(x)); x = norm2(x + ff(x))).
BLOCK_STAGES = {
    "pre": (("norm1", "norm"), ("attn", "weights"), ("add1", "add"), ("norm2", "norm"),
            ("ff", "layer"), ("add2", "add")),
    "post": (("attn", "weights"), ("add1", "add"), ("norm1", "norm"), ("ff", "layer"),
             ("add2", "add"), ("norm2", "norm")),
}
RESIDUAL_FROM = {"pre": {"add1": "x", "add2": "add1"}, "post": {"add1": "x", "add2": "norm1"}}


def _block_column(s: Sketch, prefix: str, cx: float, bottom: float, kind: str,
                  labels: dict[str, str], box_w: float) -> float:
    """One Transformer block drawn bottom to top, parts named ``prefix + stage``; returns the
    top of its output arrow."""
    step, box_h = 0.64, 0.38
    bypass_x = cx + box_w / 2 + 0.25
    s.label(prefix + "x", cx, bottom, "x " + shape_text(("B", "T", "D")), va="top")
    previous, y = prefix + "x", bottom + 0.04
    for i, (stage, role) in enumerate(BLOCK_STAGES[kind]):
        cy = bottom + (i + 1) * step
        name = prefix + stage
        if role == "add":
            box = s.adder(name, cx, cy)
            s.arrow((cx, y), (cx, box["bottom"]), previous, name)
            source = prefix + RESIDUAL_FROM[kind][stage]
            branch_y = s.record.nodes[source][3] + 0.1  # just above the part it leaves
            s.wire([(cx, branch_y), (bypass_x, branch_y), (bypass_x, cy),
                    (box["right"], cy)], source, name, dot=True)
        else:
            box = s.box(name, cx, cy, box_w, box_h, labels[role], role)
            s.arrow((cx, y), (cx, box["bottom"]), previous, name)
        previous, y = name, box["top"]
    top = y + 0.3
    s.label(prefix + "y", cx, top + 0.04, "y " + shape_text(("B", "T", "D")), va="bottom")
    s.arrow((cx, y), (cx, top), previous, prefix + "y")
    s.text(bypass_x + 0.08, bottom + 1.5 * step, "residual", rotation=90, ha="left", color=INK)
    return top


@diagram
def pre_norm_vs_post_norm(attention_label: str = "Multi-head attention",
                          ffn_label: str = "Feed-forward", norm_label: str = "LayerNorm") -> Figure:
    """Pre-norm and post-norm Transformer blocks side by side: pre-norm computes x + attn(norm(x)) and then x + ff(norm(x)) with the residual path untouched, post-norm normalises after each addition, norm(x + attn(x)), and the feed-forward layer and the second residual both read that normalised sum.

    Chapter 7 (residual connections and layer norm; why pre-norm is the common choice).
    The three labels name the boxes (one line of at most 22 characters each). The parts are
    named ``pre: norm1`` ... ``post: add2`` in :func:`diagram_graph`.
    """  # noqa: E501
    labels = {"weights": check_label(attention_label, "attention_label", 22),
              "layer": check_label(ffn_label, "ffn_label", 22),
              "norm": check_label(norm_label, "norm_label", 22)}

    box_w = max(1.9, max(text_size(text)[0] for text in labels.values()) + 0.2)
    panels = (
        (1.45, "pre", "pre-norm (GPT-2, this course)",
         "h = x + Attn(LN(x))\ny = h + FF(LN(h))",
         "the path x → y crosses no norm: a direct route for the gradient (one final norm "
         "ends the stack)"),
        (4.95, "post", "post-norm (the 2017 paper)",
         "h = LN(x + Attn(x))\ny = LN(h + FF(h))",
         "every residual sum is normalised: the gradient crosses a norm in every block "
         "(deep stacks need a learning-rate warm-up)"),
    )
    # bottom to top: each panel's note, its formulas, the block (x at its foot), its title
    notes = [wrap(note, 3.2) for *_, note in panels]
    titles = [wrap(title, 2.8, HEADING) for _, _, title, _, _ in panels]  # bold is wider
    note_h = max(text_size(note)[1] for note in notes)
    formulas_y = 0.1 + note_h + 0.15 + text_size(panels[0][3])[1] / 2
    bottom = formulas_y + text_size(panels[0][3])[1] / 2 + 0.2 + text_size("x")[1]
    title_h = max(text_size(title, HEADING)[1] for title in titles)
    height = bottom + 4.75 + title_h + 0.5
    s = canvas(height, "Pre-norm and post-norm Transformer blocks")
    for (cx, kind, _, formulas, _), title, note in zip(panels, titles, notes, strict=True):
        s.text(cx + 0.2, height - 0.5, title, HEADING, fontweight="bold", va="top")
        _block_column(s, f"{kind}: ", cx, bottom, kind, labels, box_w)
        s.text(cx + 0.2, formulas_y, formulas)
        s.text(cx + 0.2, 0.1, note, va="bottom", color=NOTE)
    s.ax.plot([3.3, 3.3], [0.1, height - 0.5], color="#CCCCCC", lw=1)
    return s.fig


# -------------------------------------------------------- chapter 8: encoder and decoder

_MASK_CELL = 0.09  # the cells of a mask icon
_ENC_X, _DEC_X, _BUS_X, _STACK_W = 1.75, 4.95, 3.25, 2.5


def _mask_icon(s: Sketch, left: float, cy: float, kind: str) -> None:
    """A tiny boolean mask, queries down, keys across: a filled cell may attend.

    The last key is padding; ``causal`` also blocks the keys after each query.
    """
    rows, cols, cell = (3 if kind == "cross" else 4), 4, _MASK_CELL
    color = ROLE_COLORS["mask"]

    def fill(r: int, c: int) -> object:
        allowed = c < cols - 1 and (kind != "causal" or c <= r)
        return color if allowed else "white"

    grid(s, left, cy + rows * cell / 2, rows, cols, cell, fill, role="mask", edge="#BBBBBB")


# A stage of a stack: (name, role, label, mask icon or None).
_Stage = tuple[str, str, str, "str | None"]
_ENCODER_STAGES: tuple[_Stage, ...] = (
    ("self-attention", "weights", "self-attention\nsource padding mask", "padding"),
    ("feed-forward", "layer", "feed-forward", None))
_DECODER_STAGES: tuple[_Stage, ...] = (
    ("self-attention", "weights", "causal self-attention\ncausal + target padding", "causal"),
    ("cross-attention", "weights", "cross-attention\nsource padding mask", "cross"),
    ("feed-forward", "layer", "feed-forward", None))


def _stack_layer(s: Sketch, prefix: str, cx: float, floor: float, stages: Sequence[_Stage],
                 previous: str, side: str) -> tuple[float, str]:
    """One framed layer of a stack above ``floor``, its parts named ``prefix + stage``;
    returns the top of its frame's label and its last part."""
    lo, y = floor + 0.15, floor + 0.23
    for stage, role, text, mask in stages:
        h = 0.16 + 0.2 * (text.count("\n") + 1)
        box = s.box(prefix + stage, cx, y + h / 2, _STACK_W, h, text, role)
        s.arrow((cx, s.record.nodes[previous][3]), (cx, box["bottom"]), previous, prefix + stage)
        if mask is not None:
            icon_x = box["left"] - 0.08 - 4 * _MASK_CELL if side == "left" else box["right"] + 0.1
            _mask_icon(s, icon_x, box["cy"], mask)
        previous, y = prefix + stage, box["top"] + 0.2
    hi = y - 0.2 + 0.08
    left = cx - _STACK_W / 2 - 0.08
    s.ax.add_patch(FancyBboxPatch((left, lo), _STACK_W + 0.16, hi - lo,
                                  boxstyle="round,pad=0,rounding_size=0.08", fill=False,
                                  edgecolor="#999999", lw=1, ls="--"))
    s.text(left if side == "left" else left + _STACK_W + 0.16, hi + 0.03,
           prefix.split(": ")[1], ha=side, va="bottom", color="#555555")
    return hi + text_size("layer")[1] + 0.04, previous


def _stack(s: Sketch, name: str, cx: float, base: float, n_layers: int,
           stages: Sequence[_Stage], tokens: str, side: str) -> str:
    """Tokens, embedding and ``n_layers`` framed layers from ``base`` up; returns the last
    part (parts are named ``"decoder: layer 2: cross-attention"``)."""
    s.label(f"{name}: tokens", cx, base + 0.3, tokens, va="top")
    s.box(f"{name}: embedding", cx, base + 0.8, _STACK_W, 0.4, "embedding + positions", "layer")
    s.arrow((cx, base + 0.34), (cx, base + 0.6), f"{name}: tokens", f"{name}: embedding")
    floor, previous = base + 1.0, f"{name}: embedding"
    for layer in range(n_layers):
        floor, previous = _stack_layer(s, f"{name}: layer {layer + 1}: ", cx, floor, stages,
                                       previous, side)
    return previous


def _decoder_top(s: Sketch, n_layers: int, enc_last: str, dec_last: str) -> None:
    """The memory above the encoder, its bus into every cross-attention, and the LM head."""
    enc_top, dec_top = s.record.nodes[enc_last][3], s.record.nodes[dec_last][3]
    mem = s.box("memory", _ENC_X, enc_top + 0.5, _STACK_W, 0.4,
                "memory " + shape_text(("B", "T_s", "D")), "input", fill=0.25)
    s.arrow((_ENC_X, enc_top), (_ENC_X, mem["bottom"]), enc_last, "memory")
    head = s.box("LM head", _DEC_X, dec_top + 0.5, _STACK_W, 0.4, "LM head: Linear(D, V)",
                 "layer")
    s.arrow((_DEC_X, dec_top), (_DEC_X, head["bottom"]), dec_last, "LM head")
    s.label("logits", _DEC_X, head["top"] + 0.32, "logits " + shape_text(("B", "T_t", "V")),
            va="bottom")
    s.arrow((_DEC_X, head["top"]), (_DEC_X, head["top"] + 0.28), "LM head", "logits")
    for layer in range(1, n_layers + 1):  # the memory is the keys and values of every layer
        cross = f"decoder: layer {layer}: cross-attention"
        cy = (s.record.nodes[cross][1] + s.record.nodes[cross][3]) / 2
        s.wire([(mem["right"], mem["cy"]), (_BUS_X, mem["cy"]), (_BUS_X, cy),
                (s.record.nodes[cross][0], cy)], "memory", cross)
        s.text((_BUS_X + s.record.nodes[cross][0]) / 2, cy + 0.04, "K, V", va="bottom")


@diagram
def encoder_decoder_flow(n_layers: int = 2) -> Figure:
    """Encoder-decoder data flow with its three masks: the encoder's bidirectional self-attention uses the source padding mask, the decoder's self-attention the causal and target padding masks, and the cross-attention of every decoder layer reads the encoder's memory under the source padding mask.

    Chapter 8 (encoder block and decoder block). ``n_layers`` (1 to 3) layers are drawn in
    each stack; ``T_s`` and ``T_t`` are the source and target lengths.
    """  # noqa: E501
    n_layers = check_int(n_layers, "n_layers", high=3)

    layer_h = 0.15 + 0.08 + (0.56 + 0.56 + 0.36) + 2 * 0.2 + 0.08 + text_size("l")[1] + 0.04
    key = wrap("Masks: source padding (B, T_s), causal (T_t, T_t), target padding (B, T_t). "
                "Icons: queries down, keys across; a filled cell may attend (True); the last "
                "key is padding.", WIDTH - 0.3)
    base = text_size(key)[1] + 0.25
    height = base + 1.0 + n_layers * layer_h + 0.7 + 0.35 + 0.4 + 0.5
    s = canvas(height, "Encoder-decoder: data flow and its three masks")
    enc_last = _stack(s, "encoder", _ENC_X, base, n_layers, _ENCODER_STAGES,
                      "source tokens " + shape_text(("B", "T_s")), "left")
    dec_last = _stack(s, "decoder", _DEC_X, base, n_layers, _DECODER_STAGES,
                      "target tokens " + shape_text(("B", "T_t")), "right")
    _decoder_top(s, n_layers, enc_last, dec_last)
    s.text(_ENC_X, height - 0.65, "Encoder", HEADING, fontweight="bold")
    s.text(_DEC_X, height - 0.65, "Decoder", HEADING, fontweight="bold")
    s.text(0.15, 0.1, key, ha="left", va="bottom", color=NOTE)
    return s.fig


# --------------------------------------------------------------- chapter 8: the KV cache

_KV_CELL = 0.2
# The colours of the cells: computed now, or read back from the cache (lighter).
_KV_COLORS = {"q": ROLE_COLORS["query"], "k": ROLE_COLORS["key"], "v": ROLE_COLORS["value"],
              "old k": tint(ROLE_COLORS["key"], 0.3), "old v": tint(ROLE_COLORS["value"], 0.3),
              "score": ROLE_COLORS["weights"], "masked": tint(ROLE_COLORS["mask"], 0.3)}


def _kv_panel(s: Sketch, x0: float, top: float, t: int, cache: bool) -> None:
    """Step ``t``: queries on the left, keys on top, scores between, values on the right."""
    cell, c = _KV_CELL, _KV_COLORS
    left = x0 + 0.1
    grid_left, grid_top = left + cell + 0.05, top - cell - 0.05
    v_left, last = grid_left + t * cell + 0.05, grid_top - (t - 1) * cell

    def letter(name: str) -> Callable[[int, int], str]:
        return lambda r, col: name

    grid(s, grid_left, top, 1, t, cell, lambda r, col: c["old k"] if cache and col < t - 1
          else c["k"], role="key", texts=letter("k"))
    if cache:  # one new query, its scores against every cached key
        grid(s, left, last, 1, 1, cell, lambda r, col: c["q"], role="query", texts=letter("q"))
        grid(s, grid_left, last, 1, t, cell, lambda r, col: c["score"], role="weights")
        grid(s, v_left, grid_top, t, 1, cell, lambda r, col: c["old v"] if r < t - 1
              else c["v"], role="value", texts=letter("v"))
        lines = f"step {t}\nT_cache = {t}\nq, k, v: 1 each\nscores: {t}"
    else:  # every query again, and the whole causal triangle of scores
        grid(s, left, grid_top, t, 1, cell, lambda r, col: c["q"], role="query",
              texts=letter("q"))
        grid(s, grid_left, grid_top, t, t, cell,
              lambda r, col: c["score"] if col <= r else c["masked"],
              role=lambda r, col: "weights" if col <= r else "mask")
        grid(s, v_left, grid_top, t, 1, cell, lambda r, col: c["v"], role="value",
              texts=letter("v"))
        lines = f"step {t}\nT = {t}\nq, k, v: {t} each\nscores: {t * (t + 1) // 2}"
    s.text(v_left + cell + 0.2, top, lines, ha="left", va="top")


@diagram
def kv_cache_steps(steps: int = 4) -> Figure:
    """Decoding with a KV cache, step by step: at step t only the new token's q, k and v are computed, k and v are appended to the cache (T_cache = t) and the one query attends to every cached key, while decoding without the cache recomputes all t queries, keys and values and the whole causal score triangle.

    Chapter 8 (the KV cache) and Chapter 11 (generation). ``steps`` (1 to 5) is the number
    of steps drawn, one row each. In each panel the queries are on the left, the keys on
    top, the values on the right and the scores (queries x keys) in the middle.
    """  # noqa: E501
    steps = check_int(steps, "steps", high=5)

    text_h = text_size("a\nb\nc\nd")[1]
    rows = [max((t + 1) * _KV_CELL + 0.05, text_h) + 0.28 for t in range(1, steps + 1)]
    items = [(_KV_COLORS["q"], "q computed"), (_KV_COLORS["k"], "k computed"),
             (_KV_COLORS["v"], "v computed"), (_KV_COLORS["old k"], "k read from the cache"),
             (_KV_COLORS["old v"], "v read from the cache"),
             (_KV_COLORS["score"], "score computed"), (_KV_COLORS["masked"], "masked (causal)")]
    legend_h = 0.95
    height = 0.6 + 0.45 + sum(rows) + legend_h
    s = canvas(height, "The KV cache: decoding one token at a time")
    for cx, name in ((1.75, "with the KV cache"), (5.25, "without: recompute all")):
        s.text(cx, height - 0.65, name, HEADING, fontweight="bold")
    top = height - 1.05
    for t, row_h in zip(range(1, steps + 1), rows, strict=True):
        _kv_panel(s, 0.15, top, t, cache=True)
        _kv_panel(s, 3.65, top, t, cache=False)
        top -= row_h
    s.ax.plot([3.5, 3.5], [legend_h, height - 0.5], color="#CCCCCC", lw=1)
    legend(s, items, 0.2, legend_h - 0.1)
    return s.fig
