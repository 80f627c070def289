"""Diagrams of chapters 1 to 3: attention pooling, self-attention, queries, keys and values.

``attention_pooling`` (chapter 1), ``self_attention_shapes`` and ``dot_vs_cosine``
(chapter 2), ``qkv_data_flow`` (chapter 3).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from matplotlib.patches import Arc, Circle

from ..._validation import check_nonnegative_int
from ._draw import (
    FONT,
    HEADING,
    INK,
    NOTE,
    ROLE_COLORS,
    WIDTH,
    Box,
    Color,
    Sketch,
    Vec,
    bounds,
    canvas,
    check_int,
    check_vector,
    diagram,
    grid,
    matrix,
    point,
    shade,
    shape_text,
    subscript,
    text_size,
    tint,
    vector,
    wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["attention_pooling", "dot_vs_cosine", "qkv_data_flow", "self_attention_shapes"]


# ---------------------------------------------------------- chapter 1: attention pooling

def _pooling_weights(t: int) -> list[float]:
    """Example weights for ``t`` tokens: the softmax of fixed scores, distinct at a glance."""
    scores = [1.6 * math.cos(1.3 * n + 0.4) for n in range(t)]
    top = max(scores)
    exps = [math.exp(x - top) for x in scores]
    return [e / sum(exps) for e in exps]


def _token_shade(n: int, scale: float, r: int) -> float:
    """The tint of entry ``r`` of example token ``n``, times ``scale`` (its weight)."""
    return scale * (0.25 + 0.6 * ((3 * n + 5 * r) % 7) / 6)


def _vector_cells(s: Sketch, name: str, cx: float, top: float, label: str, role: str,
                  strength: Callable[[int], float]) -> Box:
    """A vector of 4 cells, one above the other, with its label below (a named part)."""
    cell = 0.16
    color = ROLE_COLORS[role]
    box = grid(s, cx - cell / 2, top, 4, 1, cell, lambda r, c: tint(color, strength(r)),
                role=role)
    s.text(cx, box["bottom"] - 0.04, label, va="top")
    label_h = text_size(label)[1]
    s.node(name, bounds(cx - 0.25, box["bottom"] - 0.04 - label_h, cx + 0.25, top))
    return {**box, "label_bottom": box["bottom"] - 0.04 - label_h}


def _pooling_scores(s: Sketch, xs: Sequence[float], top: float) -> float:
    """Tokens x_n, the task query q and the scores s_n; returns the scores' bottom."""
    for n, x in enumerate(xs):
        _vector_cells(s, f"x{n + 1}", x, top, f"x{subscript(n + 1)}", "input",
                      functools.partial(_token_shade, n, 1.0))
    y = s.record.nodes["x1"][1] - 0.55
    q = s.box("q", 0.85, y, 1.4, 0.62, "task query q\n(learned)", "query")
    for n, x in enumerate(xs):  # one score per token: x_n · q / √D
        s.ax.add_patch(Circle((x, y), 0.21, facecolor=tint(ROLE_COLORS["weights"], 0.35),
                              edgecolor=shade(ROLE_COLORS["weights"]), lw=1.3, zorder=3))
        s.text(x, y, f"s{subscript(n + 1)}", zorder=4)
        s.node(f"s{n + 1}", bounds(x - 0.21, y - 0.21, x + 0.21, y + 0.21))
        s.arrow((x, s.record.nodes[f"x{n + 1}"][1] - 0.03), (x, y + 0.21), f"x{n + 1}",
                f"s{n + 1}")
        s.wire([(q["right"], y), (x - 0.21, y)], "q", f"s{n + 1}")
    return y - 0.21


def _pooling_sum(s: Sketch, xs: Sequence[float], top: float, weights: Sequence[float]) -> None:
    """softmax, the weights α_n, the weighted vectors α_n x_n and their sum."""
    soft = s.box("softmax", (xs[0] + xs[-1]) / 2, top - 0.55, xs[-1] - xs[0] + 0.7, 0.4,
                 "softmax over the T scores", "weights")
    y_alpha, biggest = soft["bottom"] - 0.55, max(weights)
    for n, (x, a) in enumerate(zip(xs, weights, strict=True)):
        s.arrow((x, top - 0.04), (x, soft["top"]), f"s{n + 1}", "softmax")
        s.box(f"alpha{n + 1}", x, y_alpha, 0.62, 0.34, f"{a:.2f}", "weights", fill=0.2 + 0.6 * a)
        s.arrow((x, soft["bottom"]), (x, y_alpha + 0.17), "softmax", f"alpha{n + 1}")
        term = _vector_cells(s, f"alpha{n + 1} x{n + 1}", x, y_alpha - 0.5,
                             f"α{subscript(n + 1)}x{subscript(n + 1)}", "input",
                             functools.partial(_token_shade, n, a / biggest))
        s.arrow((x, y_alpha - 0.17), (x, term["top"] + 0.03), f"alpha{n + 1}",
                f"alpha{n + 1} x{n + 1}")
    total_y = s.record.nodes["alpha1 x1"][1] - 0.5
    total = _sum_node(s, xs[len(xs) // 2], total_y)
    for n, x in enumerate(xs):
        start = (x, s.record.nodes[f"alpha{n + 1} x{n + 1}"][1] - 0.03)
        dx, dy = start[0] - total["cx"], start[1] - total_y
        norm = math.hypot(dx, dy)
        end = (total["cx"] + 0.2 * dx / norm, total_y + 0.2 * dy / norm)
        s.arrow(start, end, f"alpha{n + 1} x{n + 1}", "sum")
    cell, color = 0.16, ROLE_COLORS["output"]
    row = grid(s, total["cx"] - 2 * cell, total_y - 0.5, 1, 4, cell,
                lambda r, c: tint(color, 0.45 + 0.1 * c), role="output")
    s.text(row["right"] + 0.12, row["cy"], "pooled (D,)", ha="left")
    s.node("pooled", bounds(row["left"], row["bottom"], row["right"] + 1.2, row["top"]))
    s.arrow((total["cx"], total["bottom"]), (total["cx"], row["top"] + 0.03), "sum", "pooled")


def _sum_node(s: Sketch, cx: float, cy: float) -> Box:
    """The "Σ" that adds up the weighted vectors (a named part, ``sum``)."""
    s.ax.add_patch(Circle((cx, cy), 0.2, facecolor="white", edgecolor=INK, lw=1.3))
    s.text(cx, cy, "Σ", FONT)
    return s.node("sum", bounds(cx - 0.2, cy - 0.2, cx + 0.2, cy + 0.2))


@diagram
def attention_pooling(t: int = 5) -> Figure:
    """Attention pooling with a task query: one learned query q, the same for every input, scores each token vector x_n by x_n · q / sqrt(D); a softmax over the T scores gives the weights, and the pooled vector is the sum of the token vectors weighted by them.

    Chapter 1 (attention pooling with a task query, ``attention_pool``). ``t`` is the number
    of tokens T drawn (2 to 8); the weights shown are an example.
    """  # noqa: E501
    t = check_int(t, "t", low=2, high=8)

    height = 7.5
    s = canvas(height, "Attention pooling: one task query reads the whole sequence")
    s.text(WIDTH / 2, height - 0.75, "sₙ = xₙ · q / √D      α = softmax(s)      "
           "pooled = Σₙ αₙ xₙ")
    span = (2.0, WIDTH - 0.4)
    xs = [span[0] + (n + 0.5) * (span[1] - span[0]) / t for n in range(t)]
    s.text(0.15, height - 1.35, "token vectors\nxₙ (D,)", ha="left", va="top", color=NOTE)
    bottom = _pooling_scores(s, xs, height - 1.2)
    _pooling_sum(s, xs, bottom, _pooling_weights(t))
    y_alpha = s.record.nodes["alpha1"][1]
    s.text(0.15, y_alpha + 0.17, "weights αₙ", ha="left", va="center", color=NOTE)
    s.text(0.15, s.record.nodes["alpha1 x1"][3] - 0.3, "weighted\nαₙ xₙ", ha="left",
           va="center", color=NOTE)
    s.text(0.15, 0.15, wrap("The query is a parameter, the same for every sequence: it asks "
                             "one question of all T tokens (with q = 0 every weight is 1/T).",
                             WIDTH - 0.3), ha="left", va="bottom", color=NOTE)
    return s.fig


# ------------------------------------------------------- chapter 2: X Xᵀ, shape by shape

# One item of a line of the equation: (key, label, rows, cols), or (operator, None).
_Item = tuple[Any, ...]
_OPERATOR_W, _SOFTMAX_W = 0.36, 1.1


def _matrix_label(name: str, symbols: tuple[str, str], values: tuple[int, int]) -> str:
    """Three short lines: ``X``, ``(T, D)``, ``= (4, 3)``; short lines keep the row narrow."""
    return f"{name}\n{shape_text(symbols)}\n= ({values[0]}, {values[1]})"


def _item_widths(line: Sequence[_Item], cell: float) -> list[float]:
    return [(_SOFTMAX_W if item[0] == "softmax" else _OPERATOR_W) if item[1] is None
            else max(item[3] * cell, text_size(item[1])[0]) + 0.14 for item in line]


def _draw_equation(s: Sketch, line: Sequence[_Item], top: float, cell: float, row: int,
                   prefix: str) -> float:
    """One line of matrices and operators, centred; returns the bottom of its labels."""
    styles = {  # role, which cells are strong, tint of the others
        "X": ("input", lambda r, c: r == row, 0.3), "Xall": ("input", None, 0.75),
        "XT": ("input", None, 0.45), "S": ("weights", lambda r, c: r == row, 0.3),
        "A": ("weights", lambda r, c: r == row, 0.3), "Z": ("output", lambda r, c: r == row, 0.3),
    }
    widths = _item_widths(line, cell)
    softmax = (0.0, 0.0)
    grid_h = max(item[2] for item in line if item[1] is not None) * cell
    x, mid, bottom = (WIDTH - sum(widths)) / 2, top - grid_h / 2, top
    for w, item in zip(widths, line, strict=True):
        if item[0] == "softmax":  # its arrow is drawn once A exists
            softmax = (x + 0.08, x + w - 0.08)
            s.text(x + w / 2, mid + 0.06, "softmax of\neach row", va="bottom")
        elif item[1] is None:
            s.text(x + w / 2, mid, item[0], 16)
        else:
            key, label, rows, cols = item
            role, strong, strength = styles[key]
            matrix(s, prefix + key, x + w / 2, mid + rows * cell / 2, rows, cols, cell,
                    role, "", strength=strength, strong=strong)
            s.text(x + w / 2, top - grid_h - 0.06, label, va="top")
            bottom = min(bottom, top - grid_h - 0.06 - text_size(label)[1])
        x += w
    if prefix + "A" in s.record.nodes and prefix + "S" in s.record.nodes:
        s.arrow((softmax[0], mid), (softmax[1], mid), f"{prefix}S", f"{prefix}A")
    return bottom


@diagram
def self_attention_shapes(t: int = 4, d: int = 3, row: int = 1) -> Figure:
    """Matrix shapes of simplified self-attention: the scores S = X X^T of shape (T, T), their softmax of each row A, and the output Z = A X of shape (T, D); row i of A makes row i of Z.

    Chapter 2 (simplified self-attention, no learned weights). ``t`` is T and ``d`` is D
    (each 1 to 8); ``row`` is the query row highlighted (0 to T - 1).
    """  # noqa: E501
    t = check_int(t, "t", high=8)
    d = check_int(d, "d", high=8)
    row = check_nonnegative_int(row, "row")
    if row >= t:
        raise ValueError(f"row must be a row of A, from 0 to t - 1 = {t - 1}, got {row}")

    x_label, a_label = _matrix_label("X", ("T", "D"), (t, d)), _matrix_label(
        "weights A", ("T", "T"), (t, t))
    line1 = [("X", x_label, t, d), ("×", None), ("XT", _matrix_label("Xᵀ", ("D", "T"), (d, t)),
                                                 d, t), ("=", None),
             ("S", _matrix_label("scores S", ("T", "T"), (t, t)), t, t), ("softmax", None),
             ("A", a_label, t, t)]
    line2 = [("A", a_label, t, t), ("×", None), ("Xall", x_label, t, d), ("=", None),
             ("Z", _matrix_label("output Z", ("T", "D"), (t, d)), t, d)]
    cell = min(0.3, 1.1 / t)
    while sum(_item_widths(line1, cell)) > WIDTH - 0.2 and cell > 0.1:  # labels wider
        cell *= 0.95
    notes = (f"S_ij = x_i · x_j:  row {row} of S compares token {row} with every token",
             wrap(f"z_i = Σ_j A_ij x_j:  row {row} of Z mixes all T rows of X with the weights "
                   f"in row {row} of A", WIDTH - 0.4))
    label_h = text_size("A\nB\nC")[1]
    height = (0.65 + (max(t, d) + t) * cell + 2 * (0.1 + label_h + 0.12)
              + sum(text_size(n)[1] for n in notes) + 0.45)
    s = canvas(height, "Simplified self-attention: the matrix shapes")
    y = _draw_equation(s, line1, height - 0.65, cell, row, "1.") - 0.12
    s.text(WIDTH / 2, y, notes[0], va="top")
    y -= text_size(notes[0])[1] + 0.3
    y = _draw_equation(s, line2, y, cell, row, "2.") - 0.12
    s.text(WIDTH / 2, y, notes[1], va="top")
    return s.fig


# ----------------------------------------------------- chapter 2: dot product and cosine

def _dot(a: Vec, b: Vec) -> float:
    return a[0] * b[0] + a[1] * b[1]


def _unit(a: Vec) -> Vec:
    norm = math.hypot(*a)
    return a[0] / norm, a[1] / norm


def _label_at_tip(s: Sketch, tip: Vec, direction: Vec, text: str, color: Color,
                  taken: list[tuple[float, float, float, float]]) -> None:
    """Put ``text`` just beyond an arrow's tip, shifted sideways if it would cover a label."""
    width, height = text_size(text)
    ux, uy = _unit(direction)
    reach = 0.08 + abs(ux) * width / 2 + abs(uy) * height / 2
    for extra, side in ((0, 0), (0, 0.2), (0, -0.2), (0.15, 0.35), (0.15, -0.35), (0.3, 0.5),
                        (0.3, -0.5)):
        x = tip[0] + (reach + extra) * ux - side * uy
        y = tip[1] + (reach + extra) * uy + side * ux
        box = (x - width / 2 - 0.03, y - height / 2 - 0.03, x + width / 2 + 0.03,
               y + height / 2 + 0.03)
        if all(box[2] <= o[0] or o[2] <= box[0] or box[3] <= o[1] or o[3] <= box[1]
               for o in taken):
            break
    taken.append(box)
    s.text(x, y, text, color=color)


def _dot_panel(s: Sketch, vectors: Sequence[tuple[Vec, Color, str]],
               taken: list[tuple[float, float, float, float]]) -> None:
    """Left half: the vectors as they are, and each key projected on the query's direction."""
    q, k1, k2 = (v for v, _, _ in vectors)
    q_hat = _unit(q)
    feet = [(_dot(k, q_hat) * q_hat[0], _dot(k, q_hat) * q_hat[1]) for k in (k1, k2)]
    points = [(0.0, 0.0), q, k1, k2, *feet]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    scale = min(2.5 / max(max(xs) - min(xs), 1e-9), 2.0 / max(max(ys) - min(ys), 1e-9))
    o = (1.75 - scale * (min(xs) + max(xs)) / 2, 2.55 - scale * (min(ys) + max(ys)) / 2)

    def at(p: Vec) -> Vec:
        return o[0] + scale * p[0], o[1] + scale * p[1]

    reach = max(_dot(k, q_hat) for k in (k1, k2, q))
    line = [at((0, 0)), at((reach * q_hat[0], reach * q_hat[1]))]
    s.ax.plot([p[0] for p in line], [p[1] for p in line], color=tint(vectors[0][1], 0.5),
              lw=1, ls=":")
    for k, foot in zip((k1, k2), feet, strict=True):
        s.ax.plot([at(k)[0], at(foot)[0]], [at(k)[1], at(foot)[1]], color=vectors[2][1], lw=1,
                  ls="--")
        s.ax.add_patch(Circle(at(foot), 0.04, color=vectors[2][1]))
    point(s, "dot: origin", o)
    for vec, color, name in vectors:
        vector(s, "dot: origin", f"dot: {name}", at(vec), color)
        _label_at_tip(s, at(vec), vec, name, shade(color, 0.2), taken)


def _cosine_panel(s: Sketch, vectors: Sequence[tuple[Vec, Color, str]],
                  taken: list[tuple[float, float, float, float]]) -> None:
    """Right half: every vector scaled to length 1, with the angles to the query."""
    radius, angles = 1.55, [math.atan2(v[1], v[0]) for v, _, _ in vectors]
    corners = [(math.cos(a), math.sin(a)) for a in angles] + [(0.0, 0.0)]
    o = (5.3 - radius * (min(p[0] for p in corners) + max(p[0] for p in corners)) / 2 - 0.2,
         2.55 - radius * (min(p[1] for p in corners) + max(p[1] for p in corners)) / 2)
    lo, hi = math.degrees(min(angles)), math.degrees(max(angles))
    s.ax.add_patch(Arc(o, 2 * radius, 2 * radius, theta1=lo - 12, theta2=hi + 12,
                       color="#999999", lw=1, ls=":"))
    point(s, "cosine: origin", o)
    for vec, color, name in vectors:
        unit = _unit(vec)
        tip = (o[0] + radius * unit[0], o[1] + radius * unit[1])
        vector(s, "cosine: origin", f"cosine: {name}", tip, color)
        _label_at_tip(s, tip, unit, f"{name} / |{name}|", shade(color, 0.2), taken)
    a_q = math.degrees(angles[0])
    for a_k, r, name in ((angles[1], 0.55, "θ₁"), (angles[2], 1.0, "θ₂")):
        a_k = math.degrees(a_k)
        s.ax.add_patch(Arc(o, 2 * r, 2 * r, theta1=min(a_q, a_k), theta2=max(a_q, a_k),
                           color=NOTE, lw=1))
        mid = math.radians((a_q + a_k) / 2)
        s.text(o[0] + (r + 0.17) * math.cos(mid), o[1] + (r + 0.17) * math.sin(mid), name)


def _check_dot_vs_cosine(q: Vec, k1: Vec, k2: Vec) -> tuple[tuple[float, float],
                                                              tuple[float, float]]:
    """The dot products and cosines; ``key_long`` must win the first and lose the second."""
    dots = _dot(q, k1), _dot(q, k2)
    coss = (dots[0] / (math.hypot(*q) * math.hypot(*k1)),
            dots[1] / (math.hypot(*q) * math.hypot(*k2)))
    if not (dots[1] > dots[0] and coss[1] < coss[0]):
        raise ValueError(
            f"key_long must have a larger dot product with query than key_near but a smaller "
            f"cosine, to show the point; got dot products {dots[1]:.2f} (key_long) and "
            f"{dots[0]:.2f} (key_near), cosines {coss[1]:.2f} and {coss[0]:.2f}")
    return dots, coss


@diagram
def dot_vs_cosine(query: Sequence[float] = (2.0, 0.5), key_near: Sequence[float] = (1.2, 0.6),
                  key_long: Sequence[float] = (2.0, 2.6)) -> Figure:
    """Dot product against cosine similarity in 2-D: q·k = |q| |k| cos(theta) grows with the key's length, so a long key wins the dot product, while the cosine keeps only the angle and prefers the key that points the way the query does.

    Chapter 2 (cosine similarity) and Chapter 4 (why the size of a dot product matters).
    ``query``, ``key_near`` and ``key_long`` are 2-D vectors; ``key_long`` must have the
    larger dot product with ``query`` but the smaller cosine.
    """  # noqa: E501
    q = check_vector(query, "query")
    k1 = check_vector(key_near, "key_near")
    k2 = check_vector(key_long, "key_long")
    dots, coss = _check_dot_vs_cosine(q, k1, k2)

    height = 4.9
    s = canvas(height, "Dot product or cosine: a long key wins only the dot product")
    k_color = ROLE_COLORS["key"]
    vectors: tuple[tuple[Vec, Color, str], ...] = (
        (q, ROLE_COLORS["query"], "q"), (k1, k_color, "k₁"), (k2, shade(k_color, 0.35), "k₂"))
    taken: list[tuple[float, float, float, float]] = []
    s.text(1.75, height - 0.6, "dot product: length counts", HEADING, fontweight="bold")
    _dot_panel(s, vectors, taken)
    s.text(5.3, height - 0.6, "cosine: only the angle counts", HEADING, fontweight="bold")
    _cosine_panel(s, vectors, taken)
    s.text(1.75, 0.9, f"q·k₁ = |q| |k₁| cos θ₁ = {dots[0]:.2f}")
    s.text(1.75, 0.58, f"q·k₂ = |q| |k₂| cos θ₂ = {dots[1]:.2f}", fontweight="bold")
    s.text(1.75, 0.22, "dashed: each key projected on q", color=NOTE)
    s.text(5.3, 0.9, f"cos θ₁ = {coss[0]:.2f}  (larger)", fontweight="bold")
    s.text(5.3, 0.58, f"cos θ₂ = {coss[1]:.2f}")
    s.text(5.3, 0.22, "cos θ = q·k / (|q| |k|)", color=NOTE)
    s.ax.plot([3.5, 3.5], [0.1, height - 0.5], color="#CCCCCC", lw=1)
    return s.fig


# --------------------------------------------------- chapter 3: queries, keys and values

_QKV_SPECS = (("query", "q", "Q", "d_k"), ("key", "k", "K", "d_k"), ("value", "v", "V", "d_v"))
_QKV_COLUMNS = (1.25, 3.5, 5.75)


def _qkv_projections(s: Sketch, top: float, t: int, d_model: int, widths: Sequence[int],
                     cell: float, gap: float) -> float:
    """X, then W_q, W_k, W_v, then Q, K, V in three columns; returns the bottom of Q's label."""
    x_box = matrix(s, "X", _QKV_COLUMNS[1], top, t, d_model, cell, "input",
                    "X: T token vectors\n" + shape_text(("T", "D"), (t, d_model)))
    top = x_box["label_bottom"] - gap
    bottom = top
    for cx, (role, sub, name, symbol), width in zip(_QKV_COLUMNS, _QKV_SPECS, widths,
                                                    strict=True):
        w_box = matrix(s, f"W_{sub}", cx, top, d_model, width, cell, role,
                        f"W_{sub} (learned)\n" + shape_text(("D", symbol), (d_model, width)),
                        strength=0.25)
        s.arrow((x_box["cx"], x_box["label_bottom"] - 0.03), (cx, w_box["top"] + 0.04),
                "X", f"W_{sub}")
        p_box = matrix(s, name, cx, w_box["label_bottom"] - gap, t, width, cell, role,
                        f"{name} = X W_{sub}\n" + shape_text(("T", symbol), (t, width)))
        s.arrow((cx, w_box["label_bottom"] - 0.03), (cx, p_box["top"] + 0.04), f"W_{sub}", name)
        bottom = min(bottom, p_box["label_bottom"])
    return bottom


def _qkv_attention(s: Sketch, top: float, t: int, d_v: int, cell: float, gap: float) -> None:
    """The scores, the weights A and the output Z = A V below Q, K and V."""
    s_cx, a_cx, z_cx = 1.75, 5.0, 5.0
    s_box = matrix(s, "scores", s_cx, top, t, t, cell, "weights",
                    "scores Q Kᵀ / √d_k\n" + shape_text(("T", "T"), (t, t)), strength=0.3)
    for source, x in (("Q", _QKV_COLUMNS[0]), ("K", _QKV_COLUMNS[1])):
        s.arrow((x, s.record.nodes[source][1] - 0.03), (s_cx, s_box["top"] + 0.04),
                source, "scores")
    a_box = matrix(s, "A", a_cx, top, t, t, cell, "weights",
                    "weights A\n" + shape_text(("T", "T"), (t, t)), strength=0.75)
    mid_y = s_box["top"] - min(t * cell / 2, 0.1)
    left, right = s.record.nodes["scores"][2] + 0.1, s.record.nodes["A"][0] - 0.1
    s.arrow((left, mid_y), (right, mid_y), "scores", "A")
    s.text((left + right) / 2, mid_y - 0.06, "softmax of\neach row", va="top")
    z_box = matrix(s, "Z", z_cx, a_box["label_bottom"] - gap, t, d_v, cell, "output",
                    "output Z = A V\n" + shape_text(("T", "d_v"), (t, d_v)), strength=0.75)
    s.arrow((a_cx - 0.15, a_box["label_bottom"] - 0.03), (z_cx - 0.15, z_box["top"] + 0.04),
            "A", "Z")
    v_top, v_right = s.record.nodes["V"][3], _QKV_COLUMNS[2] + d_v * cell / 2
    v_y = v_top - t * cell / 2  # the middle of V's grid
    s.wire([(v_right + 0.05, v_y), (6.7, v_y), (6.7, z_box["cy"]),
            (z_box["right"] + 0.05, z_box["cy"])], "V", "Z")
    s.text(0.15, z_box["bottom"], "row i of Z: the rows of V\naveraged with the weights\n"
           "in row i of A (query i)", ha="left", va="center", color=NOTE)


@diagram
def qkv_data_flow(t: int = 4, d_model: int = 8, d_k: int = 4, d_v: int = 4) -> Figure:
    """Data flow of single-head attention: X is projected by W_q, W_k and W_v into Q, K and V; the scores Q K^T / sqrt(d_k) go through a softmax of each row to the weights A, and A V is the output; every matrix is drawn with its shape.

    Chapter 3 (queries, keys and values) and Chapter 4 (scaled dot-product attention).
    ``t`` is the sequence length T (1 to 8), ``d_model`` the width D, ``d_k`` the width of
    queries and keys and ``d_v`` that of values (each 1 to 12).
    """  # noqa: E501
    t = check_int(t, "t", high=8)
    d_model = check_int(d_model, "d_model", high=12)
    d_k = check_int(d_k, "d_k", high=12)
    d_v = check_int(d_v, "d_v", high=12)

    cell = min(0.13, 0.8 / max(t, d_model, d_k, d_v))
    label_h = text_size("A\nB")[1]
    gap = 0.36  # room for the arrows between a label and the next grid
    grids = (t + d_model + t + t + t) * cell
    height = 0.6 + grids + 5 * (0.06 + label_h) + 4 * gap + 0.15
    s = canvas(height, "Single-head attention: data flow and shapes")
    bottom = _qkv_projections(s, height - 0.6, t, d_model, (d_k, d_k, d_v), cell, gap)
    _qkv_attention(s, bottom - gap, t, d_v, cell, gap)
    return s.fig
