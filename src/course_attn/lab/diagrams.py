"""Explanatory diagrams: the course's drawings of data flow and shapes, by code.

Each function draws one diagram with matplotlib alone (boxes, arrows and small grids of
cells for matrices), so it renders the same in Jupyter, on Colab and, as a PNG output, on
the static site. Each returns the :class:`matplotlib.figure.Figure`, sized for the site's
700 px column (7 inches wide at 100 dpi, no text under 9 pt), with a title and, as the
figure's label (``fig.get_label()``), a one-sentence description to use as alt text: the
first line of the function's docstring.

Colours mean the same in every diagram (:data:`ROLE_COLORS`): queries blue, keys orange,
values green, scores and attention weights purple, masks vermillion. Shapes are written with
the course's symbols (``B, T, T_q, T_k, H, D, d_k, d_v, head_dim``; see ``book/notation.md``)
and, where the diagram has sizes, with their values: ``(T, d_k) = (4, 4)``.

In a notebook::

    from course_attn import diagrams
    diagrams.qkv_data_flow()
    plt.show()

:data:`DIAGRAMS` maps each name to its function.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any

from matplotlib import colors as mcolors
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Arc, Circle, FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.textpath import TextToPath

from .._validation import check_nonnegative_int, check_positive_int

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "DIAGRAMS",
    "HEAD_COLORS",
    "ROLE_COLORS",
    "dot_vs_cosine",
    "encoder_decoder_flow",
    "head_split_merge",
    "kv_cache_steps",
    "pre_norm_vs_post_norm",
    "qkv_data_flow",
    "self_attention_shapes",
]

#: One colour per role, the same in every diagram (Okabe-Ito, readable with colour blindness).
ROLE_COLORS: dict[str, str] = {
    "input": "#8C8C8C",  # token vectors X, hidden states, token ids
    "query": "#0072B2",
    "key": "#E69F00",
    "value": "#009E73",
    "weights": "#CC79A7",  # scores, attention weights, attention layers
    "mask": "#D55E00",
    "output": "#56B4E9",  # attention output Z = A V
    "norm": "#F0E442",  # LayerNorm
    "layer": "#C8C8C8",  # other layers: feed-forward, embedding, LM head
}

#: Colours of the heads in :func:`head_split_merge` (heads are not a role of their own).
HEAD_COLORS: tuple[str, ...] = ("#77AADD", "#EE8866", "#BBCC33", "#FFAABB")

FONT = 9.5  # points: the body text of every diagram; nothing is drawn under 9 pt
SMALL = 9.0
TITLE = 12.0
DPI = 100
WIDTH = 7.0  # inches: 700 px at 100 dpi, the width of the site's content column

_TEXT_TO_PATH = TextToPath()


# ----------------------------------------------------------------------------- helpers


def _tint(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` mixed with white: ``amount=1`` is the colour, ``0`` is white."""
    r, g, b = mcolors.to_rgb(color)
    return (1 - amount * (1 - r), 1 - amount * (1 - g), 1 - amount * (1 - b))


def _shade(color: str | tuple[float, float, float], amount: float = 0.3
           ) -> tuple[float, float, float]:
    """``color`` mixed with black, for edges and text."""
    r, g, b = mcolors.to_rgb(color)
    return (r * (1 - amount), g * (1 - amount), b * (1 - amount))


def _text_size(text: str, size: float = FONT, family: str = "sans-serif") -> tuple[float, float]:
    """Width and height in inches that ``text`` takes at ``size`` points (one or more lines)."""
    prop = FontProperties(size=size, family=family)
    widths = []
    for line in text.split("\n"):
        math_line = line.count("$") >= 2
        width, _, _ = _TEXT_TO_PATH.get_text_width_height_descent(line, prop, ismath=math_line)
        widths.append(width)
    lines = text.count("\n") + 1
    return max(widths) / 72, (lines * 1.2 * size) / 72


def _shape(symbols: Sequence[str], values: Sequence[int] | None = None) -> str:
    """``(T, d_k)`` or, with values, ``(T, d_k) = (4, 4)``."""
    text = "(" + ", ".join(symbols) + ")"
    if values is not None:
        text += " = (" + ", ".join(str(v) for v in values) + ")"
    return text


def _check_int(value: object, name: str, low: int = 1, high: int | None = None) -> int:
    """An int in ``[low, high]``; the upper bound keeps the drawing readable."""
    value = check_positive_int(value, name) if low >= 1 else check_nonnegative_int(value, name)
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high} to keep the drawing readable, "
                         f"got {value}")
    return value


def _check_label(value: object, name: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    if not value.strip() or "\n" in value or "$" in value:
        raise ValueError(f"{name} must be one non-empty line of plain text, got {value!r}")
    if len(value) > max_chars:
        raise ValueError(f"{name} must have at most {max_chars} characters to fit its box, "
                         f"got {len(value)}: {value!r}")
    return value


def _check_vector(value: object, name: str) -> tuple[float, float]:
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
        raise TypeError(f"{name} must be a pair of numbers (x, y), got "
                        f"{type(value).__name__} {value!r}")
    if any(isinstance(v, bool) or not isinstance(v, Real) for v in value):
        raise TypeError(f"{name} must be a pair of numbers (x, y), got {value!r}")
    x, y = float(value[0]), float(value[1])
    if not (math.isfinite(x) and math.isfinite(y)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if math.hypot(x, y) < 1e-9:
        raise ValueError(f"{name} must not be the zero vector, got {value!r}")
    return x, y


def _diagram(func: Callable[..., Figure]) -> Callable[..., Figure]:
    """Give the figure its description (the docstring's first line) as its label."""
    description = (func.__doc__ or "").strip().splitlines()[0]

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> Figure:
        fig = func(*args, **kwargs)
        fig.set_label(description)
        return fig

    return wrapper


def _canvas(height: float, title: str, width: float = WIDTH) -> tuple[Figure, Axes]:
    """A figure whose one axes spans it, in inches: x in [0, width], y in [0, height]."""
    import matplotlib.pyplot as plt  # here, so that importing the package picks no backend

    fig = plt.figure(figsize=(width, height), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    fig.suptitle(title, x=0.5, y=1 - 0.1 / height, ha="center", va="top",
                 fontsize=TITLE, fontweight="bold")
    return fig, ax


def _text(ax: Axes, x: float, y: float, text: str, size: float = FONT, **kwargs: Any):
    kwargs.setdefault("ha", "center")
    kwargs.setdefault("va", "center")
    return ax.text(x, y, text, fontsize=size, **kwargs)


def _box(ax: Axes, cx: float, cy: float, w: float, h: float, label: str, role: str,
         size: float = FONT, fill: float = 0.35, **kwargs: object) -> dict[str, float]:
    """A rounded box centred at ``(cx, cy)`` in the colour of ``role``, with a label."""
    color = ROLE_COLORS[role]
    patch = FancyBboxPatch((cx - w / 2, cy - h / 2), w, h,
                           boxstyle="round,pad=0,rounding_size=0.06",
                           facecolor=_tint(color, fill), edgecolor=_shade(color), lw=1.3)
    patch.set_gid(f"role:{role}")
    ax.add_patch(patch)
    _text(ax, cx, cy, label, size, **kwargs)
    return {"left": cx - w / 2, "right": cx + w / 2, "top": cy + h / 2, "bottom": cy - h / 2,
            "cx": cx, "cy": cy}


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float],
           color: object = "#333333", lw: float = 1.3, style: str = "-|>",
           connection: str | None = None, **kwargs: Any) -> FancyArrowPatch:
    arrow = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=11, lw=lw,
                            color=color, shrinkA=0, shrinkB=0,
                            connectionstyle=connection or "arc3", **kwargs)
    ax.add_patch(arrow)
    return arrow


def _grid(ax: Axes, left: float, top: float, rows: int, cols: int, cell: float,
          fill: Callable[[int, int], object], role: str | Callable[[int, int], str] | None = None,
          texts: Callable[[int, int], str] | None = None, text_size: float = SMALL,
          edge: object = "white") -> dict[str, float]:
    """A ``rows x cols`` grid of square cells with its top-left corner at ``(left, top)``.

    ``fill(r, c)`` gives each cell's colour, ``texts(r, c)`` an optional label. With
    ``role`` (a name, or ``role(r, c)`` per cell), the cells are tagged for the tests and
    framed in the colour of the role of the first cell.
    """
    role_of = role if callable(role) else (lambda r, c: role)
    for r in range(rows):
        for c in range(cols):
            patch = Rectangle((left + c * cell, top - (r + 1) * cell), cell, cell,
                              facecolor=fill(r, c), edgecolor=edge, lw=0.8)
            if role_of(r, c) is not None:
                patch.set_gid(f"role:{role_of(r, c)}")
            ax.add_patch(patch)
            if texts is not None:
                _text(ax, left + (c + 0.5) * cell, top - (r + 0.5) * cell, texts(r, c),
                      text_size)
    corner = role_of(0, 0)
    frame = _shade(ROLE_COLORS[corner]) if corner is not None else "#555555"
    ax.add_patch(Rectangle((left, top - rows * cell), cols * cell, rows * cell,
                           fill=False, edgecolor=frame, lw=1.0))
    return {"left": left, "right": left + cols * cell, "top": top, "bottom": top - rows * cell,
            "cx": left + cols * cell / 2, "cy": top - rows * cell / 2}


def _matrix(ax: Axes, cx: float, top: float, rows: int, cols: int, cell: float, role: str,
            label: str, *, strength: float = 0.55,
            strong: Callable[[int, int], bool] | None = None) -> dict[str, float]:
    """A matrix as a grid of cells in its role's colour, centred at ``cx``, label below."""
    color = ROLE_COLORS[role]

    def fill(r: int, c: int) -> object:
        if strong is not None and strong(r, c):
            return color
        return _tint(color, strength if strong is None else 0.25)

    box = _grid(ax, cx - cols * cell / 2, top, rows, cols, cell, fill, role=role)
    _, label_h = _text_size(label)
    _text(ax, cx, box["bottom"] - 0.06, label, FONT, va="top")
    box["label_bottom"] = box["bottom"] - 0.06 - label_h
    return box


# ----------------------------------------------------------------------------- 1. Q, K, V


@_diagram
def qkv_data_flow(t: int = 4, d_model: int = 8, d_k: int = 4, d_v: int = 4) -> Figure:
    """Data flow of single-head attention: X is projected by W_q, W_k and W_v into Q, K and V; the scores Q K^T / sqrt(d_k) go through a softmax of each row to the weights A, and A V is the output; every matrix is drawn with its shape.

    Chapter 3 (queries, keys and values) and Chapter 4 (scaled dot-product attention).
    ``t`` is the sequence length T (1 to 8), ``d_model`` the width D, ``d_k`` the width of
    queries and keys and ``d_v`` that of values (each 1 to 12).
    """  # noqa: E501
    t = _check_int(t, "t", high=8)
    d_model = _check_int(d_model, "d_model", high=12)
    d_k = _check_int(d_k, "d_k", high=12)
    d_v = _check_int(d_v, "d_v", high=12)

    cell = min(0.13, 0.8 / max(t, d_model, d_k, d_v))
    cols_x = (1.25, 3.5, 5.75)
    label_h = _text_size("A\nB")[1]
    gap = 0.34  # room for the arrows between a label and the next grid
    grids = t * cell + d_model * cell + t * cell + t * cell + t * cell
    height = 0.55 + grids + 5 * (0.06 + label_h) + 4 * gap + 0.12
    fig, ax = _canvas(height, "Single-head attention: data flow and shapes")
    top = height - 0.55

    x_box = _matrix(ax, cols_x[1], top, t, d_model, cell, "input",
                    "X: T token vectors\n" + _shape(("T", "D"), (t, d_model)))
    top = x_box["label_bottom"] - gap
    specs = (("query", "q", "Q", d_k, "d_k"), ("key", "k", "K", d_k, "d_k"),
             ("value", "v", "V", d_v, "d_v"))
    weights = []
    for cx, (role, sub, _, width, symbol) in zip(cols_x, specs, strict=True):
        box = _matrix(ax, cx, top, d_model, width, cell, role,
                      f"$W_{sub}$ (learned)\n" + _shape(("D", symbol), (d_model, width)),
                      strength=0.25)
        weights.append(box)
        _arrow(ax, (x_box["cx"], x_box["label_bottom"] - 0.03), (cx, box["top"] + 0.04))
    top = weights[0]["label_bottom"] - gap
    projected = []
    for cx, (role, sub, name, width, symbol), w_box in zip(cols_x, specs, weights, strict=True):
        box = _matrix(ax, cx, top, t, width, cell, role,
                      f"${name} = XW_{sub}$\n" + _shape(("T", symbol), (t, width)))
        projected.append(box)
        _arrow(ax, (cx, w_box["label_bottom"] - 0.03), (cx, box["top"] + 0.04))
    q_box, k_box, v_box = projected

    top = q_box["label_bottom"] - gap
    s_cx, a_cx = 2.2, 4.3
    s_box = _matrix(ax, s_cx, top, t, t, cell, "weights",
                    "scores $QK^\\top / \\sqrt{d_k}$\n" + _shape(("T", "T"), (t, t)),
                    strength=0.3)
    for source in (q_box, k_box):
        _arrow(ax, (source["cx"], source["label_bottom"] - 0.03), (s_cx, s_box["top"] + 0.04))
    a_box = _matrix(ax, a_cx, top, t, t, cell, "weights",
                    "weights A\n" + _shape(("T", "T"), (t, t)), strength=0.75)
    mid_y = s_box["bottom"] + min(s_box["cy"] - s_box["bottom"], 0.05)
    _arrow(ax, (s_box["right"] + 0.15, mid_y), (a_box["left"] - 0.15, mid_y))
    _text(ax, (s_box["right"] + a_box["left"]) / 2, mid_y - 0.06, "softmax\nof each row",
          SMALL, va="top")

    top = a_box["label_bottom"] - gap
    z_cx = 5.05
    z_box = _matrix(ax, z_cx, top, t, d_v, cell, "output",
                    "output $Z = AV$\n" + _shape(("T", "d_v"), (t, d_v)), strength=0.75)
    _arrow(ax, (a_cx, a_box["label_bottom"] - 0.03), (z_cx - 0.1, z_box["top"] + 0.04))
    _arrow(ax, (v_box["cx"], v_box["label_bottom"] - 0.03), (z_cx + 0.1, z_box["top"] + 0.04))
    _text(ax, 0.15, z_box["bottom"], "row i of Z: the rows of V\naveraged with the weights\n"
          "in row i of A (query i)", SMALL, ha="left", va="center")
    return fig


# ----------------------------------------------------------------------------- 2. X X^T


@_diagram
def self_attention_shapes(t: int = 4, d: int = 3, row: int = 1) -> Figure:
    """Matrix shapes of simplified self-attention: the scores S = X X^T of shape (T, T), their softmax of each row A, and the output Z = A X of shape (T, D); row i of A makes row i of Z.

    Chapter 2 (simplified self-attention, no learned weights). ``t`` is T and ``d`` is D
    (each 1 to 8); ``row`` is the query row highlighted (0 to T - 1).
    """  # noqa: E501
    t = _check_int(t, "t", high=8)
    d = _check_int(d, "d", high=8)
    row = check_nonnegative_int(row, "row")
    if row >= t:
        raise ValueError(f"row must be a row of A, from 0 to t - 1 = {t - 1}, got {row}")

    x_label = "X\n" + _shape(("T", "D"), (t, d))
    a_label = "weights A\n" + _shape(("T", "T"), (t, t))
    line1 = (("X", x_label, t, d), ("×", None), ("XT", "Xᵀ\n" + _shape(("D", "T"), (d, t)), d, t),
             ("=", None), ("S", "scores S\n" + _shape(("T", "T"), (t, t)), t, t),
             ("softmax", None), ("A", a_label, t, t))
    line2 = (("A", a_label, t, t), ("×", None), ("Xall", x_label, t, d), ("=", None),
             ("Z", "output Z\n" + _shape(("T", "D"), (t, d)), t, d))
    op_w, arrow_w = 0.4, 1.05
    cells = d + 3 * t
    cell = min(0.3, (WIDTH - 0.5 - 2 * op_w - arrow_w) / (cells + 1.0), 1.1 / t)

    def widths(line: Sequence[tuple]) -> list[float]:
        out = []
        for item in line:
            if item[1] is None:
                out.append(arrow_w if item[0] == "softmax" else op_w)
            else:
                out.append(max(item[3] * cell, _text_size(item[1])[0]) + 0.12)
        return out

    while sum(widths(line1)) > WIDTH - 0.2 and cell > 0.1:  # labels wider than grids
        cell *= 0.95
    label_h = _text_size("A\nB")[1]
    grid_h1, grid_h2 = max(t, d) * cell, t * cell  # X^T has D rows, line 2 only T
    note_h = 0.45
    height = 0.55 + grid_h1 + grid_h2 + 2 * (0.06 + label_h + 0.08 + note_h) + 0.1
    fig, ax = _canvas(height, "Simplified self-attention: the matrix shapes")
    styles = {  # role, which cells are strong, tint of the others
        "X": ("input", lambda r, c: r == row, 0.3),
        "Xall": ("input", None, 0.75),
        "XT": ("input", None, 0.45),
        "S": ("weights", lambda r, c: r == row, 0.3),
        "A": ("weights", lambda r, c: r == row, 0.3),
        "Z": ("output", lambda r, c: r == row, 0.3),
    }

    def draw(line: Sequence[tuple], top: float, grid_h: float) -> None:
        ws = widths(line)
        x = (WIDTH - sum(ws)) / 2
        mid = top - grid_h / 2
        for w, item in zip(ws, line, strict=True):
            if item[1] is None and item[0] == "softmax":
                _arrow(ax, (x + 0.08, mid), (x + w - 0.08, mid))
                _text(ax, x + w / 2, mid + 0.06, "softmax\nof each row", SMALL, va="bottom")
            elif item[1] is None:
                _text(ax, x + w / 2, mid, item[0], 15)
            else:
                kind, label, rows, cols = item
                role, strong, strength = styles[kind]
                _matrix(ax, x + w / 2, mid + rows * cell / 2, rows, cols, cell, role, "",
                        strength=strength, strong=strong)
                _text(ax, x + w / 2, top - grid_h - 0.06, label, FONT, va="top")
            x += w

    top = height - 0.55
    draw(line1, top, grid_h1)
    note_y = top - grid_h1 - 0.06 - label_h - 0.08
    _text(ax, WIDTH / 2, note_y, f"$S_{{ij}} = x_i \\cdot x_j$:  row {row} of S compares token "
          f"{row} with every token", FONT, va="top")
    top = note_y - note_h
    draw(line2, top, grid_h2)
    note_y = top - grid_h2 - 0.06 - label_h - 0.08
    _text(ax, WIDTH / 2, note_y, f"$z_i = \\sum_j A_{{ij}}\\, x_j$:  row {row} of Z mixes all T "
          f"rows of X with the weights in row {row} of A", FONT, va="top")
    return fig


# ----------------------------------------------------------------------------- 3. dot, cosine


def _label_at_tip(ax: Axes, tip: tuple[float, float], direction: tuple[float, float],
                  text: str, size: float, color: object,
                  taken: list[tuple[float, float, float, float]]) -> None:
    """Put ``text`` just beyond an arrow's tip, shifted sideways if it would cover a label."""
    width, height = _text_size(text, size)
    ux, uy = direction
    norm = math.hypot(ux, uy)
    ux, uy = ux / norm, uy / norm
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
    _text(ax, x, y, text, size, color=color)



@_diagram
def dot_vs_cosine(query: Sequence[float] = (2.0, 0.5), key_near: Sequence[float] = (1.2, 0.6),
                  key_long: Sequence[float] = (2.0, 2.6)) -> Figure:
    """Dot product against cosine similarity in 2-D: q·k = |q| |k| cos(theta) grows with the key's length, so a long key wins the dot product, while the cosine keeps only the angle and prefers the key that points the way the query does.

    Chapter 2 (cosine similarity) and Chapter 4 (why the size of a dot product matters).
    ``query``, ``key_near`` and ``key_long`` are 2-D vectors; ``key_long`` must have the
    larger dot product with ``query`` but the smaller cosine.
    """  # noqa: E501
    q = _check_vector(query, "query")
    k1 = _check_vector(key_near, "key_near")
    k2 = _check_vector(key_long, "key_long")

    def dot(a: tuple[float, float], b: tuple[float, float]) -> float:
        return a[0] * b[0] + a[1] * b[1]

    def norm(a: tuple[float, float]) -> float:
        return math.hypot(*a)

    dots = dot(q, k1), dot(q, k2)
    coss = dots[0] / (norm(q) * norm(k1)), dots[1] / (norm(q) * norm(k2))
    if not (dots[1] > dots[0] and coss[1] < coss[0]):
        raise ValueError(
            f"key_long must have a larger dot product with query than key_near but a smaller "
            f"cosine, to show the point; got dot products {dots[1]:.2f} (key_long) and "
            f"{dots[0]:.2f} (key_near), cosines {coss[1]:.2f} and {coss[0]:.2f}")

    height = 4.4
    fig, ax = _canvas(height, "Dot product or cosine: a long key wins only the dot product")
    q_color, k_color = ROLE_COLORS["query"], ROLE_COLORS["key"]
    k_dark = _shade(k_color, 0.35)
    vectors = ((q, q_color, "q"), (k1, k_color, "$k_1$"), (k2, k_dark, "$k_2$"))
    left_cx, right_cx, panel_bottom, panel_h = 1.75, 5.3, 1.1, 2.45

    def at(p: tuple[float, float], origin: tuple[float, float], s: float) -> tuple[float, float]:
        return origin[0] + s * p[0], origin[1] + s * p[1]

    # left: the vectors, and each key's projection on the query's direction
    q_hat = (q[0] / norm(q), q[1] / norm(q))
    feet = [(dot(k, q_hat) * q_hat[0], dot(k, q_hat) * q_hat[1]) for k in (k1, k2)]
    points = [(0.0, 0.0), q, k1, k2, *feet]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    span_x, span_y = max(max(xs) - min(xs), 1e-9), max(max(ys) - min(ys), 1e-9)
    scale = min(2.6 / span_x, (panel_h - 0.4) / span_y)
    o1 = (left_cx - scale * (min(xs) + max(xs)) / 2,
          panel_bottom + panel_h / 2 - scale * (min(ys) + max(ys)) / 2)
    _text(ax, left_cx, height - 0.55, "dot product: length counts", 10.5, fontweight="bold")
    reach = max(dot(k, q_hat) for k in (k1, k2, q))
    start, end = at((0, 0), o1, scale), at((reach * q_hat[0], reach * q_hat[1]), o1, scale)
    ax.plot([start[0], end[0]], [start[1], end[1]], color=_tint(q_color, 0.5), lw=1, ls=":")
    for k, foot in zip((k1, k2), feet, strict=True):
        tip, base = at(k, o1, scale), at(foot, o1, scale)
        ax.plot([tip[0], base[0]], [tip[1], base[1]], color=k_dark, lw=1, ls="--")
        ax.add_patch(Circle(base, 0.04, color=k_dark))
    taken: list[tuple[float, float, float, float]] = []
    for vec, color, name in vectors:
        tip = at(vec, o1, scale)
        _arrow(ax, o1, tip, color=color, lw=2.2)
        _label_at_tip(ax, tip, vec, name, 11, _shade(color, 0.2), taken)
    ax.add_patch(Circle(o1, 0.035, color="black"))
    _text(ax, left_cx, 0.75, f"$q\\cdot k_1 = |q|\\,|k_1|\\cos\\theta_1 = {dots[0]:.2f}$", FONT)
    _text(ax, left_cx, 0.45, f"$q\\cdot k_2 = |q|\\,|k_2|\\cos\\theta_2 = {dots[1]:.2f}$"
          "  (larger)", FONT, fontweight="bold")
    _text(ax, left_cx, 0.15, "dashed: each key projected on q", SMALL, color="#444444")

    # right: every vector scaled to length 1, only the angles are left
    radius = 1.7
    angles = [math.atan2(v[1], v[0]) for v in (q, k1, k2)]
    corners = [(math.cos(a), math.sin(a)) for a in angles] + [(0.0, 0.0)]
    cx_lo, cx_hi = min(p[0] for p in corners), max(p[0] for p in corners)
    cy_lo, cy_hi = min(p[1] for p in corners), max(p[1] for p in corners)
    o2 = (right_cx - radius * (cx_lo + cx_hi) / 2 - 0.2,
          panel_bottom + panel_h / 2 - radius * (cy_lo + cy_hi) / 2)
    _text(ax, right_cx, height - 0.55, "cosine: only the angle counts", 10.5, fontweight="bold")
    lo, hi = math.degrees(min(angles)), math.degrees(max(angles))
    ax.add_patch(Arc(o2, 2 * radius, 2 * radius, theta1=lo - 12, theta2=hi + 12,
                     color="#999999", lw=1, ls=":"))
    unit_names = {"q": "q / |q|", "$k_1$": "$k_1 / |k_1|$", "$k_2$": "$k_2 / |k_2|$"}
    for vec, color, name in vectors:
        unit = (vec[0] / norm(vec), vec[1] / norm(vec))
        tip = at(unit, o2, radius)
        _arrow(ax, o2, tip, color=color, lw=2.2)
        _label_at_tip(ax, tip, unit, unit_names[name], FONT, _shade(color, 0.2), taken)
    a_q = math.degrees(angles[0])
    for k, r, name in ((k1, 0.6, "$\\theta_1$"), (k2, 1.05, "$\\theta_2$")):
        a_k = math.degrees(math.atan2(k[1], k[0]))
        ax.add_patch(Arc(o2, 2 * r, 2 * r, theta1=min(a_q, a_k), theta2=max(a_q, a_k),
                         color="#444444", lw=1))
        mid = math.radians((a_q + a_k) / 2)
        _text(ax, o2[0] + (r + 0.15) * math.cos(mid), o2[1] + (r + 0.15) * math.sin(mid), name,
              SMALL)
    ax.add_patch(Circle(o2, 0.035, color="black"))
    _text(ax, right_cx, 0.75, f"$\\cos\\theta_1 = {coss[0]:.2f}$  (larger)", FONT,
          fontweight="bold")
    _text(ax, right_cx, 0.45, f"$\\cos\\theta_2 = {coss[1]:.2f}$", FONT)
    _text(ax, right_cx, 0.15, "$\\cos\\theta = q\\cdot k\\, /\\, (|q|\\,|k|)$", SMALL,
          color="#444444")
    ax.plot([3.55, 3.55], [0.1, height - 0.45], color="#CCCCCC", lw=1)
    return fig


# ----------------------------------------------------------------------------- 4. heads


def _fitting(candidates: Sequence[str], width: float, size: float = SMALL) -> str:
    """The first candidate text that fits in ``width`` inches (the last one otherwise)."""
    for text in candidates:
        if _text_size(text, size)[0] <= width - 0.04:
            return text
    return candidates[-1]


@_diagram
def head_split_merge(t: int = 3, d_model: int = 8, n_heads: int = 2) -> Figure:
    """Memory layout of split_heads: (B, T, D) is viewed as (B, T, H, head_dim) and transposed to (B, H, T, head_dim), so that each head holds its slice of every token; merge_heads undoes it; a view straight to (B, H, T, head_dim) instead mixes tokens and heads.

    Chapter 6 (multi-head attention; the pitfall of ``view`` without ``transpose``). Each
    cell holds ``10 * position + channel``, as in the chapter, and is coloured by the head
    its channel belongs to. ``t`` is T (1 to 5), ``d_model`` is D (1 to 10), ``n_heads`` is
    H (1 to 4) and must divide D; ``t * head_dim`` is at most 20.
    """  # noqa: E501
    t = _check_int(t, "t", high=5)
    d_model = _check_int(d_model, "d_model", high=10)
    n_heads = _check_int(n_heads, "n_heads", high=4)
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} "
                         f"(head_dim = d_model / n_heads)")
    head_dim = d_model // n_heads

    label_w = 2.6
    area = WIDTH - label_w - 0.1
    head_gap, token_gap = 0.22, 0.14
    if t * head_dim > 20:
        raise ValueError(f"t * head_dim = {t} * {head_dim} must be at most 20 to fit the "
                         f"tokens side by side: use a smaller t or more heads (n_heads)")
    cell = min(0.28, (area - (n_heads - 1) * head_gap) / d_model,
               (area - (t - 1) * token_gap) / (t * head_dim))
    head_h = _text_size("head 0", SMALL)[1] + 0.02
    row_gap = 0.3
    grid_rows = [t * cell, head_h + n_heads * cell, head_h + t * cell, t * cell,
                 head_h + t * cell]
    height = 0.55 + sum(grid_rows) + 4 * row_gap + 0.3 + 0.55

    fig, ax = _canvas(height, "Splitting and merging heads: the memory layout")
    bad = _shade(ROLE_COLORS["mask"], 0.1)

    def texts(entry: Callable[[int, int], tuple[int, int]]) -> Callable[[int, int], str]:
        return lambda r, c: str(10 * entry(r, c)[0] + entry(r, c)[1])

    def color(entry: Callable[[int, int], tuple[int, int]]) -> Callable[[int, int], str]:
        return lambda r, c: HEAD_COLORS[entry(r, c)[1] // head_dim]

    def label(top: float, h: float, code: str, shape: str, ink: object = "black") -> None:
        mid = top - h / 2
        _text(ax, 0.1, mid + 0.02, code, SMALL, ha="left", va="bottom", family="monospace",
              color=ink)
        _text(ax, 0.1, mid - 0.02, shape, FONT, ha="left", va="top", color=ink)

    def blocks(top: float, n: int, rows: int, cols: int, gap: float,
               entry: Callable[[int, int, int], tuple[int, int]], names: Sequence[str] | None,
               frame: object = "#333333") -> dict[str, float]:
        """``n`` grids of ``rows x cols`` side by side; ``entry(block, r, c)`` -> (p, c)."""
        width = n * cols * cell + (n - 1) * gap
        left0 = label_w + (area - width) / 2
        grid_top = top - (head_h if names is not None else 0.0)
        for b in range(n):
            left = left0 + b * (cols * cell + gap)
            if names is not None:
                _text(ax, left + cols * cell / 2, top, _fitting(
                    [f"{names[0]} {b}", f"{names[1]}{b}", f"{b}"], cols * cell + gap),
                    SMALL, va="top")

            def at(r: int, c: int, b: int = b) -> tuple[int, int]:
                return entry(b, r, c)

            _grid(ax, left, grid_top, rows, cols, cell, color(at), texts=texts(at))
            ax.add_patch(Rectangle((left, grid_top - rows * cell), cols * cell, rows * cell,
                                   fill=False, edgecolor=frame, lw=1.6))
        return {"top": top, "bottom": grid_top - rows * cell, "left": left0}

    y = height - 0.55
    sections = []
    label(y, grid_rows[0], "x", _shape(("B", "T", "D"), (1, t, d_model)))
    sections.append(blocks(y, 1, t, d_model, 0.0, lambda b, r, c: (r, c), None))
    y = sections[-1]["bottom"] - row_gap
    label(y, grid_rows[1], "x.view(B, T, H, head_dim)",
          _shape(("B", "T", "H", "head_dim"), (1, t, n_heads, head_dim)))
    sections.append(blocks(y, t, n_heads, head_dim, token_gap,
                           lambda b, r, c: (b, r * head_dim + c), ("token", "t")))
    y = sections[-1]["bottom"] - row_gap
    label(y, grid_rows[2], "  .transpose(1, 2)",
          _shape(("B", "H", "T", "head_dim"), (1, n_heads, t, head_dim)))
    sections.append(blocks(y, n_heads, t, head_dim, head_gap,
                           lambda b, r, c: (r, b * head_dim + c), ("head", "h")))
    y = sections[-1]["bottom"] - row_gap
    label(y, grid_rows[3], "merge_heads: .transpose(1, 2)",
          ".reshape(B, T, D): x again  ✓")
    sections.append(blocks(y, 1, t, d_model, 0.0, lambda b, r, c: (r, c), None))
    arrow_x = min(label_w - 0.05, min(section["left"] for section in sections) - 0.15)
    for upper, lower in zip(sections[:-1], sections[1:], strict=True):
        _arrow(ax, (arrow_x, upper["bottom"] + 0.05), (arrow_x, lower["top"] - 0.05))

    # the pitfall: a view straight to (B, H, T, head_dim) re-reads memory in order
    rule_y = sections[-1]["bottom"] - row_gap / 2
    ax.plot([0.1, WIDTH - 0.1], [rule_y, rule_y], color="#BBBBBB", lw=1)
    y = rule_y - row_gap / 2

    def wrong(b: int, r: int, c: int) -> tuple[int, int]:
        flat = (b * t + r) * head_dim + c  # the order in which view() reads the memory
        return flat // d_model, flat % d_model

    label(y, grid_rows[4], "WRONG: x.view(B, H, T, head_dim)",
          _shape(("B", "H", "T", "head_dim"), (1, n_heads, t, head_dim)) + "  ✗", ink=bad)
    blocks(y, n_heads, t, head_dim, head_gap, wrong, ("head", "h"), frame=bad)
    _text(ax, 0.1, 0.1, "Without the transpose, view reads the memory in order: head 0 gets "
          "token 0's whole\nvector, then token 1's, ... so heads and positions are mixed "
          "(colour: the true head).", SMALL, ha="left", va="bottom", color=bad)
    return fig


# ----------------------------------------------------------------------------- 5. norms


def _block_column(ax: Axes, cx: float, bottom: float, step: float, kind: str,
                  labels: dict[str, str]) -> float:
    """One Transformer block drawn bottom to top; returns the top of its output arrow."""
    box_w, box_h, radius = 1.75, 0.36, 0.13
    bypass_x = cx + box_w / 2 + 0.25
    ink = "#333333"
    _text(ax, cx, bottom, "x " + _shape(("B", "T", "D")), FONT, va="top")
    if kind == "pre":
        stages = ("norm", "weights", "add", "norm", "layer", "add")
    else:
        stages = ("weights", "add", "norm", "layer", "add", "norm")
    y = bottom + 0.04
    branch_y = y + 0.12
    for i, role in enumerate(stages):
        cy = bottom + (i + 1) * step
        if role == "add":
            _arrow(ax, (cx, y), (cx, cy - radius))
            ax.add_patch(Circle((cx, cy), radius, facecolor="white", edgecolor=ink, lw=1.3))
            _text(ax, cx, cy, "+", 12)
            # the residual path: from the branch point around the sublayer into the "+"
            ax.plot([cx, bypass_x, bypass_x], [branch_y, branch_y, cy], color=ink, lw=1.3)
            ax.add_patch(Circle((cx, branch_y), 0.035, color=ink))
            _arrow(ax, (bypass_x, cy), (cx + radius, cy))
            y = cy + radius
            branch_y = y + 0.12
        else:
            box = _box(ax, cx, cy, box_w, box_h, labels[role], role)
            _arrow(ax, (cx, y), (cx, box["bottom"]))
            y = box["top"]
    top = y + 0.3
    _arrow(ax, (cx, y), (cx, top))
    _text(ax, bypass_x + 0.07, bottom + 1.6 * step, "residual", SMALL, rotation=90, ha="left",
          color=ink)
    return top


@_diagram
def pre_norm_vs_post_norm(attention_label: str = "Multi-head attention",
                          ffn_label: str = "Feed-forward", norm_label: str = "LayerNorm") -> Figure:
    """Pre-norm and post-norm Transformer blocks side by side: pre-norm computes x + attn(norm(x)) and then x + ff(norm(x)) with the residual path untouched, post-norm normalises after each addition, norm(x + attn(x)) and then norm(x + ff(x)).

    Chapter 7 (residual connections and layer norm; why pre-norm is the common choice).
    The three labels name the boxes (one line of at most 22 characters each).
    """  # noqa: E501
    labels = {"weights": _check_label(attention_label, "attention_label", 22),
              "layer": _check_label(ffn_label, "ffn_label", 22),
              "norm": _check_label(norm_label, "norm_label", 22)}

    step = 0.56
    height = 6.3
    fig, ax = _canvas(height, "Pre-norm and post-norm Transformer blocks")
    bottom = 1.5
    panels = (
        (1.55, "pre", "pre-norm (GPT-2, this course)",
         "$h = x + \\mathrm{Attn}(\\mathrm{LN}(x))$\n$y = h + \\mathrm{FF}(\\mathrm{LN}(h))$",
         "the path x → y crosses no norm: a direct\n"
         "route for the gradient (one final norm\nends the stack)"),
        (5.2, "post", "post-norm (the 2017 paper)",
         "$h = \\mathrm{LN}(x + \\mathrm{Attn}(x))$\n$y = \\mathrm{LN}(h + \\mathrm{FF}(h))$",
         "every residual sum is normalised: the\n"
         "gradient crosses a norm in every block\n(deep stacks need a learning-rate warm-up)"),
    )
    for cx, kind, title, formulas, note in panels:
        _text(ax, cx + 0.2, height - 0.55, title, 10.5, fontweight="bold")
        top = _block_column(ax, cx, bottom, step, kind, labels)
        _text(ax, cx, top + 0.04, "y " + _shape(("B", "T", "D")), FONT, va="bottom")
        _text(ax, cx + 0.2, 1.02, formulas, FONT, va="center")
        _text(ax, cx + 0.2, 0.1, note, SMALL, va="bottom", color="#444444")
    ax.plot([3.45, 3.45], [0.1, height - 0.45], color="#CCCCCC", lw=1)
    return fig


# ----------------------------------------------------------------------------- 6. enc-dec


def _mask_icon(ax: Axes, left: float, cy: float, kind: str, cell: float = 0.085) -> None:
    """A tiny boolean mask, queries down, keys across: a filled cell may attend.

    The last key is padding; ``causal`` also blocks the keys after each query.
    """
    rows = 3 if kind == "cross" else 4
    cols = 4
    color = ROLE_COLORS["mask"]

    def fill(r: int, c: int) -> object:
        allowed = c < cols - 1 and (kind != "causal" or c <= r)
        return color if allowed else "white"

    _grid(ax, left, cy + rows * cell / 2, rows, cols, cell, fill, role="mask", edge="#BBBBBB")


@_diagram
def encoder_decoder_flow(n_layers: int = 2) -> Figure:
    """Encoder-decoder data flow with its three masks: the encoder's bidirectional self-attention uses the source padding mask, the decoder's self-attention the causal and target padding masks, and the cross-attention of every decoder layer reads the encoder's memory under the source padding mask.

    Chapter 8 (encoder block and decoder block). ``n_layers`` (1 to 3) layers are drawn in
    each stack; ``T_s`` and ``T_t`` are the source and target lengths.
    """  # noqa: E501
    n_layers = _check_int(n_layers, "n_layers", high=3)

    box_w, box_h = 1.6, 0.34
    enc_x, dec_x, bus_x = 2.32, 4.5, 3.41
    enc_step, dec_step = 0.46, 0.5
    frame_label_h = _text_size("layer 1", SMALL)[1] + 0.04
    base = 0.62

    def layer_height(n_boxes: int, step: float) -> float:
        return 0.15 + 0.08 + box_h + (n_boxes - 1) * step + 0.08 + frame_label_h

    dec_top = base + 0.45 + box_h / 2 + n_layers * layer_height(3, dec_step) + 0.15 + box_h
    height = dec_top + 0.3 + 0.2 + 0.3 + 0.55
    fig, ax = _canvas(height, "Encoder-decoder: data flow and its three masks")
    mask_ink = _shade(ROLE_COLORS["mask"], 0.15)

    def tag(anchor: float, cy: float, kind: str, text: str, side: str) -> None:
        icon_w = 4 * 0.085
        if side == "left":
            _mask_icon(ax, anchor - 0.05 - icon_w, cy, kind)
            _text(ax, anchor - 0.1 - icon_w, cy, text, SMALL, ha="right", color=mask_ink)
        else:
            _mask_icon(ax, anchor + 0.05, cy, kind)
            _text(ax, anchor + 0.1 + icon_w, cy, text, SMALL, ha="left", color=mask_ink)

    def stack(cx: float, step: float, stages: Sequence[tuple[str, str, tuple | None]],
              tokens: str, side: str) -> tuple[float, list[dict]]:
        """Tokens, embedding and ``n_layers`` framed layers, bottom to top."""
        _text(ax, cx, base, tokens, FONT, va="top")
        emb = _box(ax, cx, base + 0.45, box_w, box_h, "embedding + positions", "layer",
                   size=SMALL)
        _arrow(ax, (cx, base + 0.04), (cx, emb["bottom"]))
        y_prev, floor, boxes = emb["top"], emb["top"], []
        for layer in range(n_layers):
            lo = floor + 0.15
            for j, (role, text, mask) in enumerate(stages):
                cy = lo + 0.08 + box_h / 2 + j * step
                box = _box(ax, cx, cy, box_w, box_h, text, role, size=SMALL)
                box["stage"] = j
                boxes.append(box)
                _arrow(ax, (cx, y_prev), (cx, box["bottom"]))
                if mask is not None:
                    edge = box["left"] if side == "left" else box["right"]
                    kind, label = mask
                    tag(edge - 0.08 if side == "left" else edge + 0.08, cy, kind, label, side)
                y_prev = box["top"]
            hi = y_prev + 0.08
            left = cx - box_w / 2 - 0.08
            ax.add_patch(FancyBboxPatch((left, lo), box_w + 0.16, hi - lo,
                                        boxstyle="round,pad=0,rounding_size=0.08", fill=False,
                                        edgecolor="#999999", lw=1, ls="--"))
            _text(ax, left if side == "left" else left + box_w + 0.16, hi + 0.03,
                  f"layer {layer + 1}", SMALL, ha=side, va="bottom", color="#555555")
            floor = hi + frame_label_h
        return y_prev, boxes

    source_mask = ("padding", "source padding\nmask " + _shape(("B", "T_s")))
    enc_top, _ = stack(enc_x, enc_step,
                       (("weights", "self-attention", source_mask),
                        ("layer", "feed-forward", None)),
                       "source tokens " + _shape(("B", "T_s")), "left")
    dec_out, dec_boxes = stack(dec_x, dec_step,
                               (("weights", "causal self-attention",
                                 ("causal", "causal " + _shape(("T_t", "T_t")) +
                                  "\n+ target padding\nmask " + _shape(("B", "T_t")))),
                                ("weights", "cross-attention",
                                 ("cross", "source padding\nmask " + _shape(("B", "T_s")))),
                                ("layer", "feed-forward", None)),
                               "target tokens " + _shape(("B", "T_t")), "right")
    mem = _box(ax, enc_x, enc_top + 0.25 + box_h / 2, box_w, box_h,
               "memory " + _shape(("B", "T_s", "D")), "input", size=SMALL, fill=0.25)
    _arrow(ax, (enc_x, enc_top), (enc_x, mem["bottom"]))
    head = _box(ax, dec_x, dec_out + 0.25 + box_h / 2, box_w, box_h, "LM head: Linear(D, V)",
                "layer", size=SMALL)
    _arrow(ax, (dec_x, dec_out), (dec_x, head["bottom"]))
    _arrow(ax, (dec_x, head["top"]), (dec_x, head["top"] + 0.25))
    _text(ax, dec_x, head["top"] + 0.28, "logits " + _shape(("B", "T_t", "V")), FONT,
          va="bottom")

    # the memory feeds the keys and values of every decoder layer's cross-attention
    crosses = [b for b in dec_boxes if b["stage"] == 1]
    ys = [b["cy"] for b in crosses] + [mem["cy"]]
    ax.plot([mem["right"], bus_x], [mem["cy"], mem["cy"]], color="#333333", lw=1.3)
    ax.plot([bus_x, bus_x], [min(ys), max(ys)], color="#333333", lw=1.3)
    for box in crosses:
        _arrow(ax, (bus_x, box["cy"]), (box["left"], box["cy"]), gid="memory")
    _text(ax, bus_x, max(ys) + 0.05, "K, V", SMALL, va="bottom")
    _text(ax, enc_x, height - 0.62, "Encoder", 10.5, fontweight="bold")
    _text(ax, dec_x, height - 0.62, "Decoder", 10.5, fontweight="bold")
    _text(ax, WIDTH / 2, 0.08, "mask icons: queries down, keys across; a filled cell may attend "
          "(True); the last key is padding", SMALL, va="bottom", color="#444444")
    return fig


# ----------------------------------------------------------------------------- 7. KV cache


@_diagram
def kv_cache_steps(steps: int = 4) -> Figure:
    """Decoding with a KV cache, step by step: at step t only the new token's q, k and v are computed, k and v are appended to the cache (T_cache = t) and the one query attends to every cached key, while decoding without the cache recomputes all t queries, keys and values and the whole causal score triangle.

    Chapter 8 (the KV cache) and Chapter 11 (generation). ``steps`` (1 to 5) is the number
    of steps drawn. In each panel the queries are on the left, the keys on top, the values
    on the right and the scores (queries x keys) in the middle.
    """  # noqa: E501
    steps = _check_int(steps, "steps", high=5)

    left_margin = 0.45
    panel_w = (WIDTH - left_margin - 0.1) / steps
    cell = min(0.2, (panel_w - 0.25) / (steps + 2.5))
    letters = cell >= 0.14  # room for the letters q, k, v in the cells
    grid_h = (steps + 1) * cell + 0.05
    text_h = _text_size("A\nB\nC", SMALL)[1]
    row_names = ("with the KV cache", "without: recompute")
    row_h = max(grid_h + 0.1 + text_h + 0.3,
                max(_text_size(name, FONT)[0] for name in row_names) + 0.25)
    legend_h = 0.8
    height = 0.55 + 0.3 + 2 * row_h + legend_h
    fig, ax = _canvas(height, "The KV cache: decoding one token at a time")
    q_c, k_c, v_c = ROLE_COLORS["query"], ROLE_COLORS["key"], ROLE_COLORS["value"]
    w_c, masked = ROLE_COLORS["weights"], _tint(ROLE_COLORS["mask"], 0.3)
    old_k, old_v = _tint(k_c, 0.3), _tint(v_c, 0.3)  # read back from the cache

    def panel(x0: float, top: float, t: int, cache: bool) -> None:
        left = x0 + (panel_w - ((t + 2) * cell + 0.1)) / 2
        grid_left, grid_top = left + cell + 0.05, top - cell - 0.05
        v_left = grid_left + t * cell + 0.05
        last = grid_top - (t - 1) * cell  # the top of the newest token's row

        def letter(name: str) -> Callable[[int, int], str] | None:
            return (lambda r, c: name) if letters else None

        _grid(ax, grid_left, top, 1, t, cell,
              lambda r, c: old_k if cache and c < t - 1 else k_c, role="key",
              texts=letter("k"))
        if cache:
            _grid(ax, left, last, 1, 1, cell, lambda r, c: q_c, role="query",
                  texts=letter("q"))
            _grid(ax, grid_left, last, 1, t, cell, lambda r, c: w_c, role="weights")
            _grid(ax, v_left, grid_top, t, 1, cell,
                  lambda r, c: old_v if r < t - 1 else v_c, role="value", texts=letter("v"))
            lines = f"T_cache = {t}\nq, k, v: 1 each\nscores: {t}"
        else:
            _grid(ax, left, grid_top, t, 1, cell, lambda r, c: q_c, role="query",
                  texts=letter("q"))
            _grid(ax, grid_left, grid_top, t, t, cell,
                  lambda r, c: w_c if c <= r else masked,
                  role=lambda r, c: "weights" if c <= r else "mask")
            _grid(ax, v_left, grid_top, t, 1, cell, lambda r, c: v_c, role="value",
                  texts=letter("v"))
            lines = f"T = {t}\nq, k, v: {t} each\nscores: {t * (t + 1) // 2}"
        _text(ax, x0 + panel_w / 2, top - grid_h - 0.1, lines, SMALL, va="top")

    first_top = height - 0.55
    for s in range(steps):
        x0 = left_margin + s * panel_w
        _text(ax, x0 + panel_w / 2, first_top, f"step {s + 1}", FONT, va="top", fontweight="bold")
        for j, cache in enumerate((True, False)):
            panel(x0, first_top - 0.3 - j * row_h, s + 1, cache)
    for j, name in enumerate(row_names):
        _text(ax, 0.2, first_top - 0.3 - j * row_h - (row_h - 0.3) / 2, name, FONT, rotation=90,
              fontweight="bold")

    items = ((q_c, "q computed"), (k_c, "k computed"), (v_c, "v computed"),
             (old_k, "k read from the cache"), (old_v, "v read from the cache"),
             (w_c, "score computed"), (masked, "masked (causal)"))
    x, y = 0.2, legend_h - 0.3
    for color, text in items:
        width = _text_size(text, SMALL)[0]
        if x + 0.22 + width > WIDTH - 0.1:
            x, y = 0.2, y - 0.27
        ax.add_patch(Rectangle((x, y - 0.08), 0.16, 0.16, facecolor=color, edgecolor="#555555",
                               lw=0.6))
        _text(ax, x + 0.22, y, text, SMALL, ha="left")
        x += 0.22 + width + 0.25
    return fig


#: Every diagram by name, for notebooks and tests.
DIAGRAMS: dict[str, Callable[..., Figure]] = {
    "qkv_data_flow": qkv_data_flow,
    "self_attention_shapes": self_attention_shapes,
    "dot_vs_cosine": dot_vs_cosine,
    "head_split_merge": head_split_merge,
    "pre_norm_vs_post_norm": pre_norm_vs_post_norm,
    "encoder_decoder_flow": encoder_decoder_flow,
    "kv_cache_steps": kv_cache_steps,
}
