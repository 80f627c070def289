"""Explanatory diagrams (Chapters 1 to 11): the drawings of data flow and shapes, by code.

Each function draws one diagram with matplotlib alone (boxes, arrows and small grids of
cells for matrices), so it renders the same in Jupyter, on Colab and, as an SVG output (see
:func:`course_attn.lab.viz.use_sharp_figures`), on the static site. Each returns the
:class:`matplotlib.figure.Figure`, 7 inches wide for the site's 700 px column, with a title
and, as the figure's label (``fig.get_label()``), a one-sentence description to use as alt
text: the first line of the function's docstring.

Text is one size, :data:`FONT` points, chosen so that a diagram shown on a 400 px phone
screen still writes no letter under 9 px (:func:`course_attn.lab.viz.readable_font_size`).
Formulas are plain Unicode (``Q Kᵀ / √d_k``), not mathtext, whose sub- and superscripts
would be drawn at 70 % of that size.

Colours mean the same in every diagram (:data:`ROLE_COLORS`): queries blue, keys orange,
values green, scores and attention weights purple, masks vermillion. Shapes are written with
the course's symbols (``B, T, T_q, T_k, H, D, d_k, d_v, head_dim``; see ``book/notation.md``)
and, where the diagram has sizes, with their values: ``(T, d_k) = (4, 4)``.

Every arrow between two named parts is recorded: :func:`diagram_graph` returns the graph a
diagram drew (its named boxes and the arrows between them, with the points each arrow
passes through), so the tests check *what is connected to what*, not just that something
was drawn.

In a notebook::

    from course_attn import diagrams
    diagrams.qkv_data_flow()
    plt.show()

:data:`DIAGRAMS` maps each name to its function.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING, Any

from matplotlib import colors as mcolors
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Arc, Circle, FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.textpath import TextToPath

from .._validation import check_bool, check_nonnegative_int, check_positive_int

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Text

__all__ = [
    "DIAGRAMS",
    "HEAD_COLORS",
    "ROLE_COLORS",
    "DiagramGraph",
    "Edge",
    "attention_pooling",
    "diagram_graph",
    "dot_vs_cosine",
    "encoder_decoder_flow",
    "flash_attention_tiles",
    "gqa_sharing",
    "head_split_merge",
    "induction_circuit",
    "kv_cache_steps",
    "mla_latent_cache",
    "minigpt_architecture",
    "multi_head_block",
    "pre_norm_vs_post_norm",
    "qkv_data_flow",
    "rolling_kv_cache",
    "rope_rotation",
    "scaled_dot_product_graph",
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

# A 7-inch figure is 504 pt wide, 518 pt with the 0.1-inch margin a notebook's tight
# bounding box adds; shown 400 px wide on a phone, 11.7 pt is then 9.03 px, over the 9 px
# the site allows (viz.readable_font_size). One size for all text.
FONT = 11.7
HEADING = 12.7  # the name of a panel
TITLE = 14.0
DPI = 100
WIDTH = 7.0  # inches: 700 px at 100 dpi, the width of the site's content column
INK = "#333333"  # arrows and the edges of circles
NOTE = "#444444"  # explanatory notes

_TEXT_TO_PATH = TextToPath()


# ----------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Edge:
    """One arrow of a diagram: from the part named ``source`` to the part named ``target``.

    ``points`` are the points in inches the arrow passes through, first to last (two for a
    straight arrow; more for a path around something, such as a residual connection).
    """

    source: str
    target: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class DiagramGraph:
    """What a diagram drew: named parts and the arrows between them (all diagrams).

    ``nodes`` maps each part's name to its extent ``(left, bottom, right, top)`` in inches
    from the figure's lower-left corner; ``edges`` are the arrows, in drawing order.
    """

    nodes: dict[str, tuple[float, float, float, float]]
    edges: tuple[Edge, ...]

    def pairs(self) -> list[tuple[str, str]]:
        """Every arrow as ``(source, target)``, in drawing order."""
        return [(edge.source, edge.target) for edge in self.edges]

    def sources(self, target: str) -> list[str]:
        """The parts with an arrow into ``target``."""
        return [edge.source for edge in self.edges if edge.target == target]

    def targets(self, source: str) -> list[str]:
        """The parts that an arrow from ``source`` reaches."""
        return [edge.target for edge in self.edges if edge.source == source]


@dataclass
class _Record:
    """The parts and arrows of one figure, filled in while it is drawn."""

    nodes: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)


# Figure -> what was drawn on it; weak, so closing a figure frees its record too.
_RECORDS: weakref.WeakKeyDictionary[Figure, _Record] = weakref.WeakKeyDictionary()


def diagram_graph(fig: object) -> DiagramGraph:
    """The graph drawn by a diagram of this module: its named parts and arrows (every chapter).

    ``fig`` is a figure returned by one of the functions in :data:`DIAGRAMS`.
    """
    from matplotlib.figure import Figure  # here, as the module imports no figure at load

    record = _RECORDS.get(fig) if isinstance(fig, Figure) else None
    if record is None:
        raise TypeError(f"fig must be a figure drawn by course_attn.lab.diagrams, got "
                        f"{type(fig).__name__}")
    return DiagramGraph(dict(record.nodes), tuple(record.edges))


# ----------------------------------------------------------------------------- helpers


Box = dict[str, float]  # left, right, top, bottom, cx, cy (inches)


def _bounds(left: float, bottom: float, right: float, top: float) -> Box:
    return {"left": left, "right": right, "top": top, "bottom": bottom,
            "cx": (left + right) / 2, "cy": (top + bottom) / 2}


def _tint(color: str | tuple[float, float, float], amount: float
          ) -> tuple[float, float, float]:
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
        width, _, _ = _TEXT_TO_PATH.get_text_width_height_descent(line, prop, ismath=False)
        widths.append(width)
    lines = text.count("\n") + 1
    return max(widths) / 72, (lines * 1.2 * size) / 72


def _wrap(text: str, width: float, size: float = FONT) -> str:
    """``text`` broken into lines at spaces so that each line fits ``width`` inches."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and _text_size(lines[-1] + " " + word, size)[0] <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


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


def _check_real(value: object, name: str, low: float, high: float) -> float:
    """A finite number in ``(low, high]``."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not (math.isfinite(number) and low < number <= high):
        raise ValueError(f"{name} must be a number in ({low:g}, {high:g}], got {value!r}")
    return number


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


# ----------------------------------------------------------------------------- the sketch


class _Sketch:
    """The axes a diagram draws on (in inches) and the record of its named parts and arrows."""

    def __init__(self, fig: Figure, ax: Axes, record: _Record) -> None:
        self.fig, self.ax, self.record = fig, ax, record

    def node(self, name: str, box: Box) -> Box:
        """Name a part of the drawing, so that arrows can be recorded from and to it."""
        if name in self.record.nodes:
            raise AssertionError(f"two parts of one diagram are named {name!r}")
        self.record.nodes[name] = (box["left"], box["bottom"], box["right"], box["top"])
        return box

    def text(self, x: float, y: float, text: str, size: float = FONT, **kwargs: Any) -> Text:
        kwargs.setdefault("ha", "center")
        kwargs.setdefault("va", "center")
        return self.ax.text(x, y, text, fontsize=size, **kwargs)

    def label(self, name: str, x: float, y: float, text: str, **kwargs: Any) -> Box:
        """A text that is itself a part (``x (B, T, D)``), named so arrows can meet it."""
        width, height = _text_size(text, kwargs.get("size", FONT))
        self.text(x, y, text, **kwargs)
        left = {"center": x - width / 2, "left": x, "right": x - width}[kwargs.get("ha", "center")]
        bottom = {"center": y - height / 2, "bottom": y, "top": y - height}[
            kwargs.get("va", "center")]
        return self.node(name, _bounds(left, bottom, left + width, bottom + height))

    def box(self, name: str, cx: float, cy: float, w: float, h: float, label: str, role: str,
            fill: float = 0.35, **kwargs: Any) -> Box:
        """A rounded box centred at ``(cx, cy)`` in the colour of ``role``, with a label."""
        color = ROLE_COLORS[role]
        patch = FancyBboxPatch((cx - w / 2, cy - h / 2), w, h,
                               boxstyle="round,pad=0,rounding_size=0.06",
                               facecolor=_tint(color, fill), edgecolor=_shade(color), lw=1.3)
        patch.set_gid(f"role:{role}")
        self.ax.add_patch(patch)
        self.text(cx, cy, label, gid=f"label:{name}", **kwargs)
        return self.node(name, _bounds(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))

    def adder(self, name: str, cx: float, cy: float, radius: float = 0.14) -> Box:
        """The "+" of a residual connection."""
        self.ax.add_patch(Circle((cx, cy), radius, facecolor="white", edgecolor=INK, lw=1.3))
        self.text(cx, cy, "+", 13)
        return self.node(name, _bounds(cx - radius, cy - radius, cx + radius, cy + radius))

    def arrow(self, start: tuple[float, float], end: tuple[float, float],
              source: str | None = None, target: str | None = None, *,
              color: object = INK, lw: float = 1.3, style: str = "-|>",
              connection: str | None = None, **kwargs: Any) -> FancyArrowPatch:
        """A straight (or ``connection``-styled) arrow; recorded when it joins two parts."""
        arrow = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, lw=lw,
                                color=color, shrinkA=0, shrinkB=0,
                                connectionstyle=connection or "arc3", **kwargs)
        self.ax.add_patch(arrow)
        self._record(source, target, (start, end))
        return arrow

    def wire(self, points: Sequence[tuple[float, float]], source: str, target: str, *,
             color: object = INK, dot: bool = False) -> None:
        """A path of straight segments ending in an arrow head (a residual, a bus)."""
        xs, ys = [p[0] for p in points[:-1]], [p[1] for p in points[:-1]]
        self.ax.plot(xs, ys, color=color, lw=1.3, solid_capstyle="butt")
        if dot:  # where the path leaves another line
            self.ax.add_patch(Circle(points[0], 0.04, color=color))
        self.arrow(points[-2], points[-1], color=color)
        self._record(source, target, tuple(points))

    def _record(self, source: str | None, target: str | None,
                points: Sequence[tuple[float, float]]) -> None:
        if source is None and target is None:
            return
        if source is None or target is None:
            raise AssertionError("an arrow between parts needs both a source and a target")
        for name in (source, target):
            if name not in self.record.nodes:
                raise AssertionError(f"an arrow meets {name!r}, which is not drawn yet")
        self.record.edges.append(Edge(source, target, tuple(points)))


def _canvas(height: float, title: str, width: float = WIDTH) -> _Sketch:
    """A figure whose one axes spans it, in inches: x in [0, width], y in [0, height]."""
    import matplotlib.pyplot as plt  # here, so that importing the package picks no backend

    fig = plt.figure(figsize=(width, height), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    fig.suptitle(title, x=0.5, y=1 - 0.1 / height, ha="center", va="top",
                 fontsize=TITLE, fontweight="bold")
    record = _Record()
    _RECORDS[fig] = record
    return _Sketch(fig, ax, record)


def _grid(s: _Sketch, left: float, top: float, rows: int, cols: int, cell: float,
          fill: Callable[[int, int], object], role: str | Callable[[int, int], str] | None = None,
          texts: Callable[[int, int], str] | None = None, edge: object = "white") -> Box:
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
            s.ax.add_patch(patch)
            if texts is not None:
                s.text(left + (c + 0.5) * cell, top - (r + 0.5) * cell, texts(r, c))
    corner = role_of(0, 0)
    frame = _shade(ROLE_COLORS[corner]) if corner is not None else "#555555"
    s.ax.add_patch(Rectangle((left, top - rows * cell), cols * cell, rows * cell,
                             fill=False, edgecolor=frame, lw=1.0))
    return _bounds(left, top - rows * cell, left + cols * cell, top)


def _matrix(s: _Sketch, name: str, cx: float, top: float, rows: int, cols: int, cell: float,
            role: str, label: str, *, strength: float = 0.55,
            strong: Callable[[int, int], bool] | None = None) -> Box:
    """A matrix as a named grid of cells in its role's colour, centred at ``cx``, label below.

    The part named ``name`` covers the grid and its label (``label_bottom`` is the label's).
    """
    color = ROLE_COLORS[role]

    def fill(r: int, c: int) -> object:
        if strong is not None and strong(r, c):
            return color
        return _tint(color, strength if strong is None else 0.25)

    box = _grid(s, cx - cols * cell / 2, top, rows, cols, cell, fill, role=role)
    label_w, label_h = _text_size(label) if label else (0.0, 0.0)
    if label:
        s.text(cx, box["bottom"] - 0.06, label, va="top")
    half = max(cols * cell, label_w) / 2
    s.node(name, _bounds(cx - half, box["bottom"] - 0.06 - label_h, cx + half, top))
    return {**box, "label_bottom": box["bottom"] - 0.06 - label_h}


def _legend(s: _Sketch, items: Sequence[tuple[object, str]], left: float, top: float,
            right: float = WIDTH - 0.1) -> float:
    """Colour swatches with their meaning, wrapped into lines; returns the bottom."""
    x, y = left, top - 0.14
    for color, text in items:
        width = _text_size(text)[0]
        if x > left and x + 0.26 + width > right:
            x, y = left, y - 0.3
        s.ax.add_patch(Rectangle((x, y - 0.08), 0.17, 0.17, facecolor=color,
                                 edgecolor="#555555", lw=0.6))
        s.text(x + 0.25, y, text, ha="left")
        x += 0.25 + width + 0.3
    return y - 0.16


# ----------------------------------------------------------------------------- 1. Q, K, V

_QKV_SPECS = (("query", "q", "Q", "d_k"), ("key", "k", "K", "d_k"), ("value", "v", "V", "d_v"))
_QKV_COLUMNS = (1.25, 3.5, 5.75)


def _qkv_projections(s: _Sketch, top: float, t: int, d_model: int, widths: Sequence[int],
                     cell: float, gap: float) -> float:
    """X, then W_q, W_k, W_v, then Q, K, V in three columns; returns the bottom of Q's label."""
    x_box = _matrix(s, "X", _QKV_COLUMNS[1], top, t, d_model, cell, "input",
                    "X: T token vectors\n" + _shape(("T", "D"), (t, d_model)))
    top = x_box["label_bottom"] - gap
    bottom = top
    for cx, (role, sub, name, symbol), width in zip(_QKV_COLUMNS, _QKV_SPECS, widths,
                                                    strict=True):
        w_box = _matrix(s, f"W_{sub}", cx, top, d_model, width, cell, role,
                        f"W_{sub} (learned)\n" + _shape(("D", symbol), (d_model, width)),
                        strength=0.25)
        s.arrow((x_box["cx"], x_box["label_bottom"] - 0.03), (cx, w_box["top"] + 0.04),
                "X", f"W_{sub}")
        p_box = _matrix(s, name, cx, w_box["label_bottom"] - gap, t, width, cell, role,
                        f"{name} = X W_{sub}\n" + _shape(("T", symbol), (t, width)))
        s.arrow((cx, w_box["label_bottom"] - 0.03), (cx, p_box["top"] + 0.04), f"W_{sub}", name)
        bottom = min(bottom, p_box["label_bottom"])
    return bottom


def _qkv_attention(s: _Sketch, top: float, t: int, d_v: int, cell: float, gap: float) -> None:
    """The scores, the weights A and the output Z = A V below Q, K and V."""
    s_cx, a_cx, z_cx = 1.75, 5.0, 5.0
    s_box = _matrix(s, "scores", s_cx, top, t, t, cell, "weights",
                    "scores Q Kᵀ / √d_k\n" + _shape(("T", "T"), (t, t)), strength=0.3)
    for source, x in (("Q", _QKV_COLUMNS[0]), ("K", _QKV_COLUMNS[1])):
        s.arrow((x, s.record.nodes[source][1] - 0.03), (s_cx, s_box["top"] + 0.04),
                source, "scores")
    a_box = _matrix(s, "A", a_cx, top, t, t, cell, "weights",
                    "weights A\n" + _shape(("T", "T"), (t, t)), strength=0.75)
    mid_y = s_box["top"] - min(t * cell / 2, 0.1)
    left, right = s.record.nodes["scores"][2] + 0.1, s.record.nodes["A"][0] - 0.1
    s.arrow((left, mid_y), (right, mid_y), "scores", "A")
    s.text((left + right) / 2, mid_y - 0.06, "softmax of\neach row", va="top")
    z_box = _matrix(s, "Z", z_cx, a_box["label_bottom"] - gap, t, d_v, cell, "output",
                    "output Z = A V\n" + _shape(("T", "d_v"), (t, d_v)), strength=0.75)
    s.arrow((a_cx - 0.15, a_box["label_bottom"] - 0.03), (z_cx - 0.15, z_box["top"] + 0.04),
            "A", "Z")
    v_top, v_right = s.record.nodes["V"][3], _QKV_COLUMNS[2] + d_v * cell / 2
    v_y = v_top - t * cell / 2  # the middle of V's grid
    s.wire([(v_right + 0.05, v_y), (6.7, v_y), (6.7, z_box["cy"]),
            (z_box["right"] + 0.05, z_box["cy"])], "V", "Z")
    s.text(0.15, z_box["bottom"], "row i of Z: the rows of V\naveraged with the weights\n"
           "in row i of A (query i)", ha="left", va="center", color=NOTE)


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
    label_h = _text_size("A\nB")[1]
    gap = 0.36  # room for the arrows between a label and the next grid
    grids = (t + d_model + t + t + t) * cell
    height = 0.6 + grids + 5 * (0.06 + label_h) + 4 * gap + 0.15
    s = _canvas(height, "Single-head attention: data flow and shapes")
    bottom = _qkv_projections(s, height - 0.6, t, d_model, (d_k, d_k, d_v), cell, gap)
    _qkv_attention(s, bottom - gap, t, d_v, cell, gap)
    return s.fig


# ----------------------------------------------------------------------------- 2. X X^T

# One item of a line of the equation: (key, label, rows, cols), or (operator, None).
_Item = tuple[Any, ...]
_OPERATOR_W, _SOFTMAX_W = 0.36, 1.1


def _matrix_label(name: str, symbols: tuple[str, str], values: tuple[int, int]) -> str:
    """Three short lines: ``X``, ``(T, D)``, ``= (4, 3)``; short lines keep the row narrow."""
    return f"{name}\n{_shape(symbols)}\n= ({values[0]}, {values[1]})"


def _item_widths(line: Sequence[_Item], cell: float) -> list[float]:
    return [(_SOFTMAX_W if item[0] == "softmax" else _OPERATOR_W) if item[1] is None
            else max(item[3] * cell, _text_size(item[1])[0]) + 0.14 for item in line]


def _draw_equation(s: _Sketch, line: Sequence[_Item], top: float, cell: float, row: int,
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
            _matrix(s, prefix + key, x + w / 2, mid + rows * cell / 2, rows, cols, cell,
                    role, "", strength=strength, strong=strong)
            s.text(x + w / 2, top - grid_h - 0.06, label, va="top")
            bottom = min(bottom, top - grid_h - 0.06 - _text_size(label)[1])
        x += w
    if prefix + "A" in s.record.nodes and prefix + "S" in s.record.nodes:
        s.arrow((softmax[0], mid), (softmax[1], mid), f"{prefix}S", f"{prefix}A")
    return bottom


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
             _wrap(f"z_i = Σ_j A_ij x_j:  row {row} of Z mixes all T rows of X with the weights "
                   f"in row {row} of A", WIDTH - 0.4))
    label_h = _text_size("A\nB\nC")[1]
    height = (0.65 + (max(t, d) + t) * cell + 2 * (0.1 + label_h + 0.12)
              + sum(_text_size(n)[1] for n in notes) + 0.45)
    s = _canvas(height, "Simplified self-attention: the matrix shapes")
    y = _draw_equation(s, line1, height - 0.65, cell, row, "1.") - 0.12
    s.text(WIDTH / 2, y, notes[0], va="top")
    y -= _text_size(notes[0])[1] + 0.3
    y = _draw_equation(s, line2, y, cell, row, "2.") - 0.12
    s.text(WIDTH / 2, y, notes[1], va="top")
    return s.fig


# ----------------------------------------------------------------------------- 3. dot, cosine

Vec = tuple[float, float]
Color = str | tuple[float, float, float]


def _dot(a: Vec, b: Vec) -> float:
    return a[0] * b[0] + a[1] * b[1]


def _unit(a: Vec) -> Vec:
    norm = math.hypot(*a)
    return a[0] / norm, a[1] / norm


def _label_at_tip(s: _Sketch, tip: Vec, direction: Vec, text: str, color: Color,
                  taken: list[tuple[float, float, float, float]]) -> None:
    """Put ``text`` just beyond an arrow's tip, shifted sideways if it would cover a label."""
    width, height = _text_size(text)
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


def _vector(s: _Sketch, origin: str, name: str, tip: Vec, color: object,
            lw: float = 2.2) -> None:
    """An arrow from the point named ``origin`` to a new point ``name`` at ``tip``."""
    s.node(name, _bounds(tip[0], tip[1], tip[0], tip[1]))
    left, bottom = s.record.nodes[origin][:2]
    s.arrow((left, bottom), tip, origin, name, color=color, lw=lw)


def _point(s: _Sketch, name: str, at: Vec) -> None:
    s.node(name, _bounds(at[0], at[1], at[0], at[1]))
    s.ax.add_patch(Circle(at, 0.035, color="black"))


def _dot_panel(s: _Sketch, vectors: Sequence[tuple[Vec, Color, str]],
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
    s.ax.plot([p[0] for p in line], [p[1] for p in line], color=_tint(vectors[0][1], 0.5),
              lw=1, ls=":")
    for k, foot in zip((k1, k2), feet, strict=True):
        s.ax.plot([at(k)[0], at(foot)[0]], [at(k)[1], at(foot)[1]], color=vectors[2][1], lw=1,
                  ls="--")
        s.ax.add_patch(Circle(at(foot), 0.04, color=vectors[2][1]))
    _point(s, "dot: origin", o)
    for vec, color, name in vectors:
        _vector(s, "dot: origin", f"dot: {name}", at(vec), color)
        _label_at_tip(s, at(vec), vec, name, _shade(color, 0.2), taken)


def _cosine_panel(s: _Sketch, vectors: Sequence[tuple[Vec, Color, str]],
                  taken: list[tuple[float, float, float, float]]) -> None:
    """Right half: every vector scaled to length 1, with the angles to the query."""
    radius, angles = 1.55, [math.atan2(v[1], v[0]) for v, _, _ in vectors]
    corners = [(math.cos(a), math.sin(a)) for a in angles] + [(0.0, 0.0)]
    o = (5.3 - radius * (min(p[0] for p in corners) + max(p[0] for p in corners)) / 2 - 0.2,
         2.55 - radius * (min(p[1] for p in corners) + max(p[1] for p in corners)) / 2)
    lo, hi = math.degrees(min(angles)), math.degrees(max(angles))
    s.ax.add_patch(Arc(o, 2 * radius, 2 * radius, theta1=lo - 12, theta2=hi + 12,
                       color="#999999", lw=1, ls=":"))
    _point(s, "cosine: origin", o)
    for vec, color, name in vectors:
        unit = _unit(vec)
        tip = (o[0] + radius * unit[0], o[1] + radius * unit[1])
        _vector(s, "cosine: origin", f"cosine: {name}", tip, color)
        _label_at_tip(s, tip, unit, f"{name} / |{name}|", _shade(color, 0.2), taken)
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
    dots, coss = _check_dot_vs_cosine(q, k1, k2)

    height = 4.9
    s = _canvas(height, "Dot product or cosine: a long key wins only the dot product")
    k_color = ROLE_COLORS["key"]
    vectors: tuple[tuple[Vec, Color, str], ...] = (
        (q, ROLE_COLORS["query"], "q"), (k1, k_color, "k₁"), (k2, _shade(k_color, 0.35), "k₂"))
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


# ----------------------------------------------------------------------------- 4. heads

# (p, c) of the cell at row r, column c of block b: x's entry 10 p + c sits there.
_Entry = Callable[[int, int, int], tuple[int, int]]


def _fitting(candidates: Sequence[str], width: float) -> str:
    """The first candidate text that fits in ``width`` inches (the last one otherwise)."""
    for text in candidates:
        if _text_size(text)[0] <= width - 0.04:
            return text
    return candidates[-1]


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


def _blocks(s: _Sketch, lay: _Layout, top: float, n: int, shape: tuple[int, int],
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
            s.text(left + cols * lay.cell / 2, top, _fitting(
                [f"{names[0]} {b}", f"{names[1]}{b}", f"{b}"], cols * lay.cell + gap), va="top")
        _grid(s, left, grid_top, rows, cols, lay.cell,
              functools.partial(_head_color, entry, b, lay.head_dim),
              texts=functools.partial(_entry_text, entry, b))
        s.ax.add_patch(Rectangle((left, grid_top - rows * lay.cell), cols * lay.cell,
                                 rows * lay.cell, fill=False, edgecolor=frame, lw=1.6))
    return _bounds((WIDTH - width) / 2, grid_top - rows * lay.cell, (WIDTH + width) / 2, top)


def _section(s: _Sketch, lay: _Layout, name: str, top: float, step: _Step,
             ink: object = "black") -> float:
    """One step: its code on the left and the shape it gives on the right, then its grids
    (the part ``name`` covers both); returns the bottom."""
    code, shape, n, grid_shape, entry, names = step
    s.text(0.1, top, code, ha="left", va="top", family="monospace", color=ink)
    s.text(WIDTH - 0.1, top, shape, ha="right", va="top", color=ink)
    grids = _blocks(s, lay, top - _text_size(shape)[1] - 0.08, n, grid_shape, entry, names,
                    frame=INK if ink == "black" else ink)
    s.node(name, _bounds(0.1, grids["bottom"], WIDTH - 0.1, top))
    return grids["bottom"]


def _split_sections(s: _Sketch, lay: _Layout, top: float) -> float:
    """x, its view, the transpose (split_heads) and merge_heads; returns the last bottom."""
    t, d, h, hd = lay.t, lay.d_model, lay.n_heads, lay.head_dim
    steps: dict[str, _Step] = {
        "x": ("x", _shape(("B", "T", "D"), (1, t, d)), 1, (t, d), lambda b, r, c: (r, c), None),
        "view": ("x.view(B, T, H, head_dim)",
                 _shape(("B", "T", "H", "head_dim"), (1, t, h, hd)), t, (h, hd),
                 lambda b, r, c: (b, r * hd + c), ("token", "t")),
        "transpose": ("  .transpose(1, 2)", _shape(("B", "H", "T", "head_dim"), (1, h, t, hd)),
                      h, (t, hd), lambda b, r, c: (r, b * hd + c), ("head", "h")),
        "merge": ("merge_heads: .transpose(1, 2).reshape(B, T, D)", "x again  ✓", 1, (t, d),
                  lambda b, r, c: (r, c), None),
    }
    previous = None
    for name, step in steps.items():
        bottom = _section(s, lay, name, top, step)
        if previous is not None:  # the arrow crosses the gap between two sections
            s.arrow((0.3, top + lay.gap - 0.04), (0.3, top + 0.02), previous, name)
        previous, top = name, bottom - lay.gap
    return top + lay.gap


def _wrong_view(s: _Sketch, lay: _Layout, top: float) -> None:
    """The pitfall: a view straight to (B, H, T, head_dim) re-reads memory in order."""
    t, d, hd = lay.t, lay.d_model, lay.head_dim
    bad = _shade(ROLE_COLORS["mask"], 0.1)

    def wrong(b: int, r: int, c: int) -> tuple[int, int]:
        flat = (b * t + r) * hd + c  # the order in which view() reads the memory
        return flat // d, flat % d

    step: _Step = ("WRONG: x.view(B, H, T, head_dim)",
                   _shape(("B", "H", "T", "head_dim"), (1, lay.n_heads, t, hd)) + "  ✗",
                   lay.n_heads, (t, hd), wrong, ("head", "h"))
    bottom = _section(s, lay, "wrong", top, step, ink=bad)
    note = _wrap("Without the transpose, view reads the memory in order: head 0 gets token 0's "
                 "whole vector, then token 1's, ... so heads and positions are mixed (colour: "
                 "the true head).", WIDTH - 0.2)
    s.text(0.1, bottom - 0.15, note, ha="left", va="top", color=bad)


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
    if t * head_dim > 20:
        raise ValueError(f"t * head_dim = {t} * {head_dim} must be at most 20 to fit the "
                         f"tokens side by side: use a smaller t or more heads (n_heads)")

    area = WIDTH - 0.2
    cell = min(0.32, (area - (n_heads - 1) * 0.22) / d_model,
               (area - (t - 1) * 0.14) / (t * head_dim),
               6.0 / (4 * t + n_heads))  # a tall stack gets smaller cells
    lay = _Layout(t, d_model, n_heads, head_dim, cell)
    line = _text_size("x")[1] + 0.08
    grids = (t + n_heads + t + t + t) * cell + 3 * lay.head_h
    note_h = _text_size("a\nb\nc")[1]
    height = 0.6 + 5 * line + grids + 4 * lay.gap + 0.3 + note_h + 0.1
    s = _canvas(height, "Splitting and merging heads: the memory layout")
    bottom = _split_sections(s, lay, height - 0.6)
    rule_y = bottom - lay.gap / 2 - 0.1
    s.ax.plot([0.1, WIDTH - 0.1], [rule_y, rule_y], color="#BBBBBB", lw=1)
    _wrong_view(s, lay, rule_y - lay.gap / 2 - 0.05)
    return s.fig


# ----------------------------------------------------------------------------- 5. norms

# The stages of a block, bottom to top, and where each residual connection leaves from:
# pre-norm x + f(norm(x)) keeps the stream unnormalised, so each residual leaves from the
# sum before it; post-norm norm(x + f(x)) feeds the *normalised* sum to the next sub-layer,
# so its second residual leaves from norm1 (x = norm1(x + attn(x)); x = norm2(x + ff(x))).
_BLOCK_STAGES = {
    "pre": (("norm1", "norm"), ("attn", "weights"), ("add1", "add"), ("norm2", "norm"),
            ("ff", "layer"), ("add2", "add")),
    "post": (("attn", "weights"), ("add1", "add"), ("norm1", "norm"), ("ff", "layer"),
             ("add2", "add"), ("norm2", "norm")),
}
_RESIDUAL_FROM = {"pre": {"add1": "x", "add2": "add1"}, "post": {"add1": "x", "add2": "norm1"}}


def _block_column(s: _Sketch, prefix: str, cx: float, bottom: float, kind: str,
                  labels: dict[str, str], box_w: float) -> float:
    """One Transformer block drawn bottom to top, parts named ``prefix + stage``; returns the
    top of its output arrow."""
    step, box_h = 0.64, 0.38
    bypass_x = cx + box_w / 2 + 0.25
    s.label(prefix + "x", cx, bottom, "x " + _shape(("B", "T", "D")), va="top")
    previous, y = prefix + "x", bottom + 0.04
    for i, (stage, role) in enumerate(_BLOCK_STAGES[kind]):
        cy = bottom + (i + 1) * step
        name = prefix + stage
        if role == "add":
            box = s.adder(name, cx, cy)
            s.arrow((cx, y), (cx, box["bottom"]), previous, name)
            source = prefix + _RESIDUAL_FROM[kind][stage]
            branch_y = s.record.nodes[source][3] + 0.1  # just above the part it leaves
            s.wire([(cx, branch_y), (bypass_x, branch_y), (bypass_x, cy),
                    (box["right"], cy)], source, name, dot=True)
        else:
            box = s.box(name, cx, cy, box_w, box_h, labels[role], role)
            s.arrow((cx, y), (cx, box["bottom"]), previous, name)
        previous, y = name, box["top"]
    top = y + 0.3
    s.label(prefix + "y", cx, top + 0.04, "y " + _shape(("B", "T", "D")), va="bottom")
    s.arrow((cx, y), (cx, top), previous, prefix + "y")
    s.text(bypass_x + 0.08, bottom + 1.5 * step, "residual", rotation=90, ha="left", color=INK)
    return top


@_diagram
def pre_norm_vs_post_norm(attention_label: str = "Multi-head attention",
                          ffn_label: str = "Feed-forward", norm_label: str = "LayerNorm") -> Figure:
    """Pre-norm and post-norm Transformer blocks side by side: pre-norm computes x + attn(norm(x)) and then x + ff(norm(x)) with the residual path untouched, post-norm normalises after each addition, norm(x + attn(x)), and the feed-forward layer and the second residual both read that normalised sum.

    Chapter 7 (residual connections and layer norm; why pre-norm is the common choice).
    The three labels name the boxes (one line of at most 22 characters each). The parts are
    named ``pre: norm1`` ... ``post: add2`` in :func:`diagram_graph`.
    """  # noqa: E501
    labels = {"weights": _check_label(attention_label, "attention_label", 22),
              "layer": _check_label(ffn_label, "ffn_label", 22),
              "norm": _check_label(norm_label, "norm_label", 22)}

    box_w = max(1.9, max(_text_size(text)[0] for text in labels.values()) + 0.2)
    height, bottom = 7.3, 1.85
    s = _canvas(height, "Pre-norm and post-norm Transformer blocks")
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
    for cx, kind, title, formulas, note in panels:
        s.text(cx + 0.2, height - 0.68, title, HEADING, fontweight="bold")
        _block_column(s, f"{kind}: ", cx, bottom, kind, labels, box_w)
        s.text(cx + 0.2, 1.27, formulas)
        s.text(cx + 0.2, 0.1, _wrap(note, 3.2), va="bottom", color=NOTE)
    s.ax.plot([3.3, 3.3], [0.1, height - 0.5], color="#CCCCCC", lw=1)
    return s.fig


# ----------------------------------------------------------------------------- 6. enc-dec

_MASK_CELL = 0.09  # the cells of a mask icon
_ENC_X, _DEC_X, _BUS_X, _STACK_W = 1.62, 4.8, 3.15, 2.2


def _mask_icon(s: _Sketch, left: float, cy: float, kind: str) -> None:
    """A tiny boolean mask, queries down, keys across: a filled cell may attend.

    The last key is padding; ``causal`` also blocks the keys after each query.
    """
    rows, cols, cell = (3 if kind == "cross" else 4), 4, _MASK_CELL
    color = ROLE_COLORS["mask"]

    def fill(r: int, c: int) -> object:
        allowed = c < cols - 1 and (kind != "causal" or c <= r)
        return color if allowed else "white"

    _grid(s, left, cy + rows * cell / 2, rows, cols, cell, fill, role="mask", edge="#BBBBBB")


# A stage of a stack: (name, role, label, mask icon or None).
_Stage = tuple[str, str, str, "str | None"]
_ENCODER_STAGES: tuple[_Stage, ...] = (
    ("self-attention", "weights", "self-attention\nsource padding mask", "padding"),
    ("feed-forward", "layer", "feed-forward", None))
_DECODER_STAGES: tuple[_Stage, ...] = (
    ("self-attention", "weights", "causal self-attention\ncausal + target padding", "causal"),
    ("cross-attention", "weights", "cross-attention\nsource padding mask", "cross"),
    ("feed-forward", "layer", "feed-forward", None))


def _stack_layer(s: _Sketch, prefix: str, cx: float, floor: float, stages: Sequence[_Stage],
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
    return hi + _text_size("layer")[1] + 0.04, previous


def _stack(s: _Sketch, name: str, cx: float, base: float, n_layers: int,
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


def _decoder_top(s: _Sketch, n_layers: int, enc_last: str, dec_last: str) -> None:
    """The memory above the encoder, its bus into every cross-attention, and the LM head."""
    enc_top, dec_top = s.record.nodes[enc_last][3], s.record.nodes[dec_last][3]
    mem = s.box("memory", _ENC_X, enc_top + 0.5, _STACK_W, 0.4,
                "memory " + _shape(("B", "T_s", "D")), "input", fill=0.25)
    s.arrow((_ENC_X, enc_top), (_ENC_X, mem["bottom"]), enc_last, "memory")
    head = s.box("LM head", _DEC_X, dec_top + 0.5, _STACK_W, 0.4, "LM head: Linear(D, V)",
                 "layer")
    s.arrow((_DEC_X, dec_top), (_DEC_X, head["bottom"]), dec_last, "LM head")
    s.label("logits", _DEC_X, head["top"] + 0.32, "logits " + _shape(("B", "T_t", "V")),
            va="bottom")
    s.arrow((_DEC_X, head["top"]), (_DEC_X, head["top"] + 0.28), "LM head", "logits")
    for layer in range(1, n_layers + 1):  # the memory is the keys and values of every layer
        cross = f"decoder: layer {layer}: cross-attention"
        cy = (s.record.nodes[cross][1] + s.record.nodes[cross][3]) / 2
        s.wire([(mem["right"], mem["cy"]), (_BUS_X, mem["cy"]), (_BUS_X, cy),
                (s.record.nodes[cross][0], cy)], "memory", cross)
        s.text((_BUS_X + s.record.nodes[cross][0]) / 2, cy + 0.04, "K, V", va="bottom")


@_diagram
def encoder_decoder_flow(n_layers: int = 2) -> Figure:
    """Encoder-decoder data flow with its three masks: the encoder's bidirectional self-attention uses the source padding mask, the decoder's self-attention the causal and target padding masks, and the cross-attention of every decoder layer reads the encoder's memory under the source padding mask.

    Chapter 8 (encoder block and decoder block). ``n_layers`` (1 to 3) layers are drawn in
    each stack; ``T_s`` and ``T_t`` are the source and target lengths.
    """  # noqa: E501
    n_layers = _check_int(n_layers, "n_layers", high=3)

    layer_h = 0.15 + 0.08 + (0.56 + 0.56 + 0.36) + 2 * 0.2 + 0.08 + _text_size("l")[1] + 0.04
    key = _wrap("Masks: source padding (B, T_s), causal (T_t, T_t), target padding (B, T_t). "
                "Icons: queries down, keys across; a filled cell may attend (True); the last "
                "key is padding.", WIDTH - 0.3)
    base = _text_size(key)[1] + 0.25
    height = base + 1.0 + n_layers * layer_h + 0.7 + 0.35 + 0.4 + 0.5
    s = _canvas(height, "Encoder-decoder: data flow and its three masks")
    enc_last = _stack(s, "encoder", _ENC_X, base, n_layers, _ENCODER_STAGES,
                      "source tokens " + _shape(("B", "T_s")), "left")
    dec_last = _stack(s, "decoder", _DEC_X, base, n_layers, _DECODER_STAGES,
                      "target tokens " + _shape(("B", "T_t")), "right")
    _decoder_top(s, n_layers, enc_last, dec_last)
    s.text(_ENC_X, height - 0.65, "Encoder", HEADING, fontweight="bold")
    s.text(_DEC_X, height - 0.65, "Decoder", HEADING, fontweight="bold")
    s.text(0.15, 0.1, key, ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 7. KV cache

_KV_CELL = 0.2
# The colours of the cells: computed now, or read back from the cache (lighter).
_KV_COLORS = {"q": ROLE_COLORS["query"], "k": ROLE_COLORS["key"], "v": ROLE_COLORS["value"],
              "old k": _tint(ROLE_COLORS["key"], 0.3), "old v": _tint(ROLE_COLORS["value"], 0.3),
              "score": ROLE_COLORS["weights"], "masked": _tint(ROLE_COLORS["mask"], 0.3)}


def _kv_panel(s: _Sketch, x0: float, top: float, t: int, cache: bool) -> None:
    """Step ``t``: queries on the left, keys on top, scores between, values on the right."""
    cell, c = _KV_CELL, _KV_COLORS
    left = x0 + 0.1
    grid_left, grid_top = left + cell + 0.05, top - cell - 0.05
    v_left, last = grid_left + t * cell + 0.05, grid_top - (t - 1) * cell

    def letter(name: str) -> Callable[[int, int], str]:
        return lambda r, col: name

    _grid(s, grid_left, top, 1, t, cell, lambda r, col: c["old k"] if cache and col < t - 1
          else c["k"], role="key", texts=letter("k"))
    if cache:  # one new query, its scores against every cached key
        _grid(s, left, last, 1, 1, cell, lambda r, col: c["q"], role="query", texts=letter("q"))
        _grid(s, grid_left, last, 1, t, cell, lambda r, col: c["score"], role="weights")
        _grid(s, v_left, grid_top, t, 1, cell, lambda r, col: c["old v"] if r < t - 1
              else c["v"], role="value", texts=letter("v"))
        lines = f"step {t}\nT_cache = {t}\nq, k, v: 1 each\nscores: {t}"
    else:  # every query again, and the whole causal triangle of scores
        _grid(s, left, grid_top, t, 1, cell, lambda r, col: c["q"], role="query",
              texts=letter("q"))
        _grid(s, grid_left, grid_top, t, t, cell,
              lambda r, col: c["score"] if col <= r else c["masked"],
              role=lambda r, col: "weights" if col <= r else "mask")
        _grid(s, v_left, grid_top, t, 1, cell, lambda r, col: c["v"], role="value",
              texts=letter("v"))
        lines = f"step {t}\nT = {t}\nq, k, v: {t} each\nscores: {t * (t + 1) // 2}"
    s.text(v_left + cell + 0.2, top, lines, ha="left", va="top")


@_diagram
def kv_cache_steps(steps: int = 4) -> Figure:
    """Decoding with a KV cache, step by step: at step t only the new token's q, k and v are computed, k and v are appended to the cache (T_cache = t) and the one query attends to every cached key, while decoding without the cache recomputes all t queries, keys and values and the whole causal score triangle.

    Chapter 8 (the KV cache) and Chapter 11 (generation). ``steps`` (1 to 5) is the number
    of steps drawn, one row each. In each panel the queries are on the left, the keys on
    top, the values on the right and the scores (queries x keys) in the middle.
    """  # noqa: E501
    steps = _check_int(steps, "steps", high=5)

    text_h = _text_size("a\nb\nc\nd")[1]
    rows = [max((t + 1) * _KV_CELL + 0.05, text_h) + 0.28 for t in range(1, steps + 1)]
    items = [(_KV_COLORS["q"], "q computed"), (_KV_COLORS["k"], "k computed"),
             (_KV_COLORS["v"], "v computed"), (_KV_COLORS["old k"], "k read from the cache"),
             (_KV_COLORS["old v"], "v read from the cache"),
             (_KV_COLORS["score"], "score computed"), (_KV_COLORS["masked"], "masked (causal)")]
    legend_h = 0.95
    height = 0.6 + 0.45 + sum(rows) + legend_h
    s = _canvas(height, "The KV cache: decoding one token at a time")
    for cx, name in ((1.75, "with the KV cache"), (5.25, "without: recompute everything")):
        s.text(cx, height - 0.65, name, HEADING, fontweight="bold")
    top = height - 1.05
    for t, row_h in zip(range(1, steps + 1), rows, strict=True):
        _kv_panel(s, 0.15, top, t, cache=True)
        _kv_panel(s, 3.65, top, t, cache=False)
        top -= row_h
    s.ax.plot([3.5, 3.5], [legend_h, height - 0.5], color="#CCCCCC", lw=1)
    _legend(s, items, 0.2, legend_h - 0.1)
    return s.fig


# ----------------------------------------------------------------------------- 8. pooling


def _pooling_weights(t: int) -> list[float]:
    """Example weights for ``t`` tokens: the softmax of fixed scores, distinct at a glance."""
    scores = [1.6 * math.cos(1.3 * n + 0.4) for n in range(t)]
    top = max(scores)
    exps = [math.exp(x - top) for x in scores]
    return [e / sum(exps) for e in exps]


def _token_shade(n: int, scale: float, r: int) -> float:
    """The tint of entry ``r`` of example token ``n``, times ``scale`` (its weight)."""
    return scale * (0.25 + 0.6 * ((3 * n + 5 * r) % 7) / 6)


def _vector_cells(s: _Sketch, name: str, cx: float, top: float, label: str, role: str,
                  strength: Callable[[int], float]) -> Box:
    """A vector of 4 cells, one above the other, with its label below (a named part)."""
    cell = 0.16
    color = ROLE_COLORS[role]
    box = _grid(s, cx - cell / 2, top, 4, 1, cell, lambda r, c: _tint(color, strength(r)),
                role=role)
    s.text(cx, box["bottom"] - 0.04, label, va="top")
    label_h = _text_size(label)[1]
    s.node(name, _bounds(cx - 0.25, box["bottom"] - 0.04 - label_h, cx + 0.25, top))
    return {**box, "label_bottom": box["bottom"] - 0.04 - label_h}


def _pooling_scores(s: _Sketch, xs: Sequence[float], top: float) -> float:
    """Tokens x_n, the task query q and the scores s_n; returns the scores' bottom."""
    for n, x in enumerate(xs):
        _vector_cells(s, f"x{n + 1}", x, top, f"x{_sub(n + 1)}", "input",
                      functools.partial(_token_shade, n, 1.0))
    y = s.record.nodes["x1"][1] - 0.55
    q = s.box("q", 0.85, y, 1.4, 0.62, "task query q\n(learned)", "query")
    for n, x in enumerate(xs):  # one score per token: x_n · q / √D
        s.ax.add_patch(Circle((x, y), 0.21, facecolor=_tint(ROLE_COLORS["weights"], 0.35),
                              edgecolor=_shade(ROLE_COLORS["weights"]), lw=1.3, zorder=3))
        s.text(x, y, f"s{_sub(n + 1)}", zorder=4)
        s.node(f"s{n + 1}", _bounds(x - 0.21, y - 0.21, x + 0.21, y + 0.21))
        s.arrow((x, s.record.nodes[f"x{n + 1}"][1] - 0.03), (x, y + 0.21), f"x{n + 1}",
                f"s{n + 1}")
        s.wire([(q["right"], y), (x - 0.21, y)], "q", f"s{n + 1}")
    return y - 0.21


def _pooling_sum(s: _Sketch, xs: Sequence[float], top: float, weights: Sequence[float]) -> None:
    """softmax, the weights α_n, the weighted vectors α_n x_n and their sum."""
    soft = s.box("softmax", (xs[0] + xs[-1]) / 2, top - 0.55, xs[-1] - xs[0] + 0.7, 0.4,
                 "softmax over the T scores", "weights")
    y_alpha, biggest = soft["bottom"] - 0.55, max(weights)
    for n, (x, a) in enumerate(zip(xs, weights, strict=True)):
        s.arrow((x, top - 0.04), (x, soft["top"]), f"s{n + 1}", "softmax")
        s.box(f"alpha{n + 1}", x, y_alpha, 0.62, 0.34, f"{a:.2f}", "weights", fill=0.2 + 0.6 * a)
        s.arrow((x, soft["bottom"]), (x, y_alpha + 0.17), "softmax", f"alpha{n + 1}")
        term = _vector_cells(s, f"alpha{n + 1} x{n + 1}", x, y_alpha - 0.5,
                             f"α{_sub(n + 1)}x{_sub(n + 1)}", "input",
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
    row = _grid(s, total["cx"] - 2 * cell, total_y - 0.5, 1, 4, cell,
                lambda r, c: _tint(color, 0.45 + 0.1 * c), role="output")
    s.text(row["right"] + 0.12, row["cy"], "pooled (D,)", ha="left")
    s.node("pooled", _bounds(row["left"], row["bottom"], row["right"] + 1.2, row["top"]))
    s.arrow((total["cx"], total["bottom"]), (total["cx"], row["top"] + 0.03), "sum", "pooled")


def _sum_node(s: _Sketch, cx: float, cy: float) -> Box:
    """The "Σ" that adds up the weighted vectors (a named part, ``sum``)."""
    s.ax.add_patch(Circle((cx, cy), 0.2, facecolor="white", edgecolor=INK, lw=1.3))
    s.text(cx, cy, "Σ", 13)
    return s.node("sum", _bounds(cx - 0.2, cy - 0.2, cx + 0.2, cy + 0.2))


def _sub(n: int) -> str:
    """``n`` in subscript digits: 12 -> ₁₂."""
    return "".join("₀₁₂₃₄₅₆₇₈₉"[int(d)] for d in str(n))


@_diagram
def attention_pooling(t: int = 5) -> Figure:
    """Attention pooling with a task query: one learned query q, the same for every input, scores each token vector x_n by x_n · q / sqrt(D); a softmax over the T scores gives the weights, and the pooled vector is the sum of the token vectors weighted by them.

    Chapter 1 (attention pooling with a task query, ``attention_pool``). ``t`` is the number
    of tokens T drawn (2 to 8); the weights shown are an example.
    """  # noqa: E501
    t = _check_int(t, "t", low=2, high=8)

    height = 7.5
    s = _canvas(height, "Attention pooling: one task query reads the whole sequence")
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
    s.text(0.15, 0.15, _wrap("The query is a parameter, the same for every sequence: it asks "
                             "one question of all T tokens (with q = 0 every weight is 1/T).",
                             WIDTH - 0.3), ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 9. SDPA graph

_SDPA_X, _SDPA_W, _SDPA_STEP = 3.0, 2.5, 0.74


def _sdpa_inputs(s: _Sketch, top: float) -> None:
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


@_diagram
def scaled_dot_product_graph(masked: bool = True) -> Figure:
    """The computation graph of scaled dot-product attention: Q and K transposed go into a matrix product, the scores are scaled by 1 / sqrt(d_k), masked (False becomes minus infinity), turned into weights by a softmax of each row, and the weights multiply V.

    Chapter 4 (scaled dot-product attention) and Chapter 5 (masks). With ``masked=False``
    the mask step is left out. The parts are named ``Q``, ``K``, ``V``, ``matmul QK``,
    ``scale``, ``mask``, ``mask input``, ``softmax``, ``matmul AV`` and ``output``.
    """  # noqa: E501
    masked = check_bool(masked, "masked")

    stages = _sdpa_stages(masked)
    height = 0.6 + 0.5 + (len(stages) + 1) * _SDPA_STEP + 0.95
    s = _canvas(height, "Scaled dot-product attention: the computation graph")
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
            s.box("mask input", 0.85, y, 1.5, 0.62, "mask (T_q, T_k)\nTrue: may attend", "mask",
                  fill=0.2)
            s.arrow((1.6, y), (box["left"], y), "mask input", "mask")
    matmul = s.record.nodes["matmul AV"]
    s.wire([(6.45, s.record.nodes["V"][1]), (6.45, y), (matmul[2], y)], "V", "matmul AV")
    s.box("output", _SDPA_X, y - _SDPA_STEP, 2.0, 0.42, "output (T_q, d_v)", "output")
    s.arrow((_SDPA_X, matmul[1]), (_SDPA_X, y - _SDPA_STEP + 0.21), "matmul AV", "output")
    s.text(4.35, top - 0.37, "Kᵀ (d_k, T_k)", ha="left", color=NOTE)
    s.text(0.15, 0.12, _wrap("The manual path builds attn_scores and attn_weights, (T_q, T_k) "
                             "each; the fused path (impl=\"sdpa\") gives the same output without "
                             "returning the weights.", WIDTH - 0.3),
           ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 10. MHA block


def _mha_heads(s: _Sketch, n_heads: int, top: float) -> float:
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
                    color=_shade(ROLE_COLORS[role], 0.1))
    return cy - 0.31


@_diagram
def multi_head_block(n_heads: int = 4) -> Figure:
    """A multi-head attention layer: x goes through q_proj, k_proj and v_proj, split_heads cuts each result into H heads of head_dim = D / H channels, every head attends on its own, merge_heads concatenates the heads back to width D, and out_proj mixes them.

    Chapter 6 (multi-head attention; ``MultiHeadAttention``). ``n_heads`` is H (1 to 6).
    The parts are named ``x``, ``q_proj``, ``k_proj``, ``v_proj``, ``split_heads``,
    ``head 0`` ... ``head H-1``, ``merge_heads``, ``out_proj`` and ``output``; each head
    receives three arrows, its queries, keys and values.
    """  # noqa: E501
    n_heads = _check_int(n_heads, "n_heads", high=6)

    height = 7.0
    s = _canvas(height, "Multi-head attention: split, attend per head, merge")
    y = height - 0.85
    s.label("x", WIDTH / 2, y, "x " + _shape(("B", "T", "D")), va="top")
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
    s.label("output", WIDTH / 2, out["bottom"] - 0.35, "output " + _shape(("B", "T", "D")),
            va="top")
    s.arrow((WIDTH / 2, out["bottom"]), (WIDTH / 2, out["bottom"] - 0.31), "out_proj", "output")
    s.text(0.15, 0.12, _wrap(f"H = {n_heads} heads of head_dim = D / H channels each. Head h "
                             "computes softmax(q_h k_hᵀ / √head_dim) v_h on its own channels; "
                             "all heads run as one batched product.", WIDTH - 0.3),
           ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 11. tiles

_HBM_ROWS = (("Q", "query"), ("K", "key"), ("V", "value"), ("O", "output"))
_TILE_W, _TILE_H, _ROW_GAP = 0.46, 0.34, 0.42


def _hbm(s: _Sketch, top: float, n_blocks: int, current: dict[str, int]) -> dict[str, float]:
    """HBM: Q, K, V and O as rows of blocks; returns the y of the wire above each row."""
    wires = {}
    for r, (matrix, role) in enumerate(_HBM_ROWS):
        y = top - r * (_TILE_H + _ROW_GAP)  # the top of this row's blocks
        s.text(0.42, y - _TILE_H / 2, matrix, HEADING, fontweight="bold")
        for b in range(n_blocks):
            strong = b == current[matrix]
            left = 0.65 + b * (_TILE_W + 0.06)
            s.box(f"HBM: {matrix}{b}", left + _TILE_W / 2, y - _TILE_H / 2, _TILE_W, _TILE_H,
                  f"{matrix}{_sub(b)}", role, fill=0.8 if strong else 0.15)
        wires[matrix] = y + 0.14
    return wires


def _sram(s: _Sketch, wires: dict[str, float], current: dict[str, int]) -> None:
    """SRAM: the tiles of one step, the scores between them and the running state."""
    i, j = current["Q"], current["K"]
    for matrix, role in _HBM_ROWS:
        name = "SRAM: acc" if matrix == "O" else f"SRAM: {matrix}"
        text = "m, ℓ, acc" if matrix == "O" else f"{matrix}{_sub(i if matrix == 'Q' else j)}"
        box = s.box(name, 4.65, wires[matrix], 0.95, _TILE_H, text, role, fill=0.6)
        src = f"HBM: {matrix}{current[matrix]}"
        block = s.record.nodes[src]
        x = (block[0] + block[2]) / 2
        if matrix == "O":  # the output is written back once, after the inner loop
            s.wire([(box["left"], box["cy"]), (x, box["cy"]), (x, block[3])], name, src)
            s.text(3.52, box["cy"] + 0.04, f"write O{_sub(i)}", va="bottom")
        else:
            s.wire([(x, block[3]), (x, box["cy"]), (box["left"], box["cy"])], src, name)
            s.text(3.52, box["cy"] + 0.04, f"load {matrix}{_sub(current[matrix])}", va="bottom")
    scores = s.box("SRAM: S", 6.2, (wires["Q"] + wires["K"]) / 2, 1.15, 0.95,
                   f"S = Q{_sub(i)}K{_sub(j)}ᵀ\n/ √d", "weights", fill=0.5)
    for source in ("SRAM: Q", "SRAM: K"):
        y = (s.record.nodes[source][1] + s.record.nodes[source][3]) / 2
        s.arrow((s.record.nodes[source][2], y), (scores["left"], y), source, "SRAM: S")
    acc = s.record.nodes["SRAM: acc"]
    s.wire([(6.2, scores["bottom"]), (6.2, (acc[1] + acc[3]) / 2), (acc[2], (acc[1] + acc[3]) / 2)],
           "SRAM: S", "SRAM: acc")
    v = s.record.nodes["SRAM: V"]
    s.arrow((4.65, v[1]), (4.65, acc[3]), "SRAM: V", "SRAM: acc")


_FLASH_CODE = """for i in query blocks:          # outer loop: the SMs share it out
    load Q_i; m, l, acc = -inf, 0, 0
    for j in key/value blocks:  # inner loop
        load K_j, V_j; S = Q_i K_jᵀ / √d
        update m, l, acc        # online softmax
    write O_i = acc / l"""


@_diagram
def flash_attention_tiles(n_blocks: int = 4, query_block: int = 1, kv_block: int = 2) -> Figure:
    """FlashAttention-2's tiles in the memory hierarchy: Q, K, V and O stay in the GPU's large, slow HBM; the outer loop brings one block of queries into the small, fast on-chip SRAM, the inner loop brings the key and value blocks in one after the other, and the output block is written back once; the scores never leave the SRAM.

    Chapter 9 (efficient attention; the tiled forward pass). ``n_blocks`` (2 to 4) blocks of
    each matrix are drawn; ``query_block`` (i) and ``kv_block`` (j) are the blocks in SRAM.
    Sizes are the A100's, as given in the FlashAttention paper. Parts are named
    ``HBM: Q1``, ``SRAM: Q``, ``SRAM: S``, ``SRAM: acc`` ...
    """  # noqa: E501
    n_blocks = _check_int(n_blocks, "n_blocks", low=2, high=4)
    query_block = check_nonnegative_int(query_block, "query_block", upper=n_blocks - 1)
    kv_block = check_nonnegative_int(kv_block, "kv_block", upper=n_blocks - 1)

    current = {"Q": query_block, "K": kv_block, "V": kv_block, "O": query_block}
    code_h = _text_size(_FLASH_CODE, family="monospace")[1]
    height = 0.6 + 1.05 + 4 * (_TILE_H + _ROW_GAP) + 0.3 + code_h + 1.0
    s = _canvas(height, "FlashAttention-2: tiles between HBM and SRAM")
    top = height - 1.65
    wires = _hbm(s, top, n_blocks, current)
    for left, right, title, size in ((0.2, 3.0, "HBM (GPU memory)", "40 GB, 1.5 TB/s"),
                                     (4.05, 6.9, "on-chip SRAM", "20 MB, 19 TB/s")):
        frame_top = top + 0.65
        s.ax.add_patch(FancyBboxPatch((left, frame_top - 4 * (_TILE_H + _ROW_GAP) - 0.65),
                                      right - left, 4 * (_TILE_H + _ROW_GAP) + 0.65,
                                      boxstyle="round,pad=0,rounding_size=0.08", fill=False,
                                      edgecolor="#777777", lw=1.2))
        s.text((left + right) / 2, frame_top + 0.08, title, HEADING, fontweight="bold",
               va="bottom")
        s.text((left + right) / 2, frame_top - 0.05, size, va="top", color=NOTE)
    _sram(s, wires, current)
    code_top = top - 4 * (_TILE_H + _ROW_GAP) - 0.3
    s.text(0.2, code_top, _FLASH_CODE,
           ha="left", va="top", family="monospace")
    s.text(0.2, 0.1, _wrap("A100 sizes (FlashAttention paper): 192 KB of SRAM on each of 108 "
                           "SMs. Only Q, K and V are read and O (with each row's log-sum-exp) "
                           "is written; the T × T scores never reach HBM.", WIDTH - 0.4),
           ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 12. RoPE

_ROPE_VECTORS = {"query": (1.0, 0.18), "key": (0.72, 0.62)}  # one feature pair of each


def _rope_panel(s: _Sketch, cx: float, role: str, position: int, omega: float,
                letter: str, symbol: str) -> None:
    """One pair of features as a 2-D vector, and the same pair rotated by position · ω."""
    radius, o = 1.35, (cx - 0.25, 2.6)
    color = ROLE_COLORS[role]
    vec = _ROPE_VECTORS[role]
    before = math.atan2(vec[1], vec[0])
    after = before + position * omega
    for dx, dy in ((-0.35, 0), (radius + 0.35, 0), (0, -0.5), (0, radius + 0.3)):
        s.ax.plot([o[0], o[0] + dx], [o[1], o[1] + dy], color="#BBBBBB", lw=0.8)
    _point(s, f"{role}: origin", o)
    length = radius * math.hypot(*vec) / 1.02
    for name, angle, shade, lw in ((letter, before, _tint(color, 0.45), 1.6),
                                   (f"{letter}′", after, color, 2.4)):
        tip = (o[0] + length * math.cos(angle), o[1] + length * math.sin(angle))
        _vector(s, f"{role}: origin", f"{role}: {name}", tip, shade, lw=lw)
        if position == 0 and name == letter:
            continue  # not turned: one label for both, drawn with the second
        text = f"{letter} = {letter}′" if position == 0 else name
        s.text(tip[0] + 0.2 * math.cos(angle), tip[1] + 0.2 * math.sin(angle), text,
               color=_shade(color, 0.2), fontweight="bold")
    if position:
        s.ax.add_patch(Arc(o, 1.1, 1.1, theta1=math.degrees(before), theta2=math.degrees(after),
                           color=INK, lw=1.2))
        mid = (before + after) / 2
        s.text(o[0] + 0.85 * math.cos(mid) + 0.12, o[1] + 0.85 * math.sin(mid),
               f"{symbol}·ω", color=INK)


@_diagram
def rope_rotation(i: int = 3, j: int = 1, omega: float = 0.5) -> Figure:
    """Rotary position embedding on one pair of features: the query's pair at position i is turned by the angle i·ω and the key's pair at position j by j·ω, so the angle between them, and their dot product, changes by (i − j)·ω and depends on the positions only through their difference.

    Chapter 10 (RoPE, ``apply_rope``: the pair ``(x[2k], x[2k+1])`` of a query or key at
    position ``p`` turns by ``p·ω_k``, ``ω_k = 10000^(-2k/d)``; the chapter's "Why rotate?"
    names the positions i and j). ``i`` and ``j`` are the positions of the query and the
    key (0 to 6), ``omega`` the turn per position of this pair, in radians (0 to 1; the
    first pair turns by 1). Parts are named ``query: q``, ``query: q′`` (turned),
    ``key: k`` and ``key: k′``.
    """  # noqa: E501
    i = check_nonnegative_int(i, "i", upper=6)
    j = check_nonnegative_int(j, "j", upper=6)
    omega = _check_real(omega, "omega", 0.0, 1.0)

    height = 5.45
    s = _canvas(height, "RoPE: each pair of features turns by position × ω")
    for cx, role, position, letter, symbol in ((1.75, "query", i, "q", "i"),
                                               (5.25, "key", j, "k", "j")):
        s.text(cx, height - 0.7, f"{role} at position {symbol} = {position}", HEADING,
               fontweight="bold")
        _rope_panel(s, cx, role, position, omega, letter, symbol)
        s.text(cx, 1.6, f"turned by {symbol}·ω = {position} × {omega:g} = "
               f"{position * omega:.2f} rad")
    s.ax.plot([3.5, 3.5], [1.4, height - 0.5], color="#CCCCCC", lw=1)
    nb = "\u00a0"  # a space that _wrap does not break at
    s.text(0.15, 0.1, _wrap(f"Each arrow is one pair of features of a query or a key. Both "
                            f"turn the same way, so the angle between q′ and k′ is the angle "
                            f"between q and k plus (i{nb}−{nb}j)·ω = {(i - j) * omega:.2f} rad: "
                            f"the score q′·k′ sees the positions only through i{nb}−{nb}j.",
                            WIDTH - 0.3), ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 13. GQA


@_diagram
def gqa_sharing(n_heads: int = 8, n_kv_heads: int = 2) -> Figure:
    """Grouped-query attention: H query heads share fewer key/value heads; each group of H / H_kv consecutive query heads reads one key/value head, so only the H_kv key/value heads are cached (H_kv = H is multi-head attention, H_kv = 1 is multi-query attention).

    Chapter 10 (multi-query and grouped-query attention, ``repeat_kv``). ``n_heads`` is H
    (1 to 8) and ``n_kv_heads`` is H_kv, which must divide it. Query head h reads key/value
    head h // (H / H_kv). Parts are named ``q0`` ..., ``k0``, ``v0`` ... and ``kv0`` ...
    (a key head and its value head together)
    """  # noqa: E501
    n_heads = _check_int(n_heads, "n_heads", high=8)
    n_kv_heads = _check_int(n_kv_heads, "n_kv_heads", high=8)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads} "
                         f"(each key/value head serves n_heads / n_kv_heads query heads)")
    group = n_heads // n_kv_heads

    height = 4.35
    s = _canvas(height, "Grouped-query attention: query heads share key/value heads")
    width = (WIDTH - 0.6 - (n_heads - 1) * 0.1) / n_heads
    q_y, kv_y = height - 1.05, height - 2.65
    for h in range(n_heads):
        s.box(f"q{h}", 0.3 + width / 2 + h * (width + 0.1), q_y, width, 0.42, f"q{h}", "query")
    for g in range(n_kv_heads):
        left = s.record.nodes[f"q{g * group}"][0]
        right = s.record.nodes[f"q{(g + 1) * group - 1}"][2]
        cx, w = (left + right) / 2, min(right - left, max(0.9, 0.6 * (right - left)))
        s.box(f"k{g}", cx - w / 4, kv_y, w / 2, 0.5, f"k{g}", "key")
        s.box(f"v{g}", cx + w / 4, kv_y, w / 2, 0.5, f"v{g}", "value")
        s.node(f"kv{g}", _bounds(cx - w / 2, kv_y - 0.25, cx + w / 2, kv_y + 0.25))
        for h in range(g * group, (g + 1) * group):  # the query heads of this group
            q = s.record.nodes[f"q{h}"]
            x = cx + (h - g * group - (group - 1) / 2) * min(0.2, w / (group + 1))
            s.arrow((x, kv_y + 0.25), ((q[0] + q[2]) / 2, q[1]), f"kv{g}", f"q{h}")
    s.text(0.15, q_y + 0.45, f"H = {n_heads} query heads", ha="left", va="bottom", color=NOTE)
    s.text(0.15, kv_y - 0.45, f"H_kv = {n_kv_heads} key/value heads: query head h reads "
           f"head h // {group}", ha="left", va="top", color=NOTE)
    s.text(0.15, 0.12, _wrap(f"Cached per token and layer: 2 × H_kv × head_dim numbers, "
                             f"{group} times fewer than multi-head attention's 2 × H × head_dim. "
                             "The shared heads are repeated just before attending.",
                             WIDTH - 0.3), ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 14. MLA


def _mla_cache(s: _Sketch, y: float, rope: bool) -> None:
    """The projections from x and what is cached: the latent c (and the shared k_rope)."""
    x = s.record.nodes["x"]
    parts = [("q_proj", 0.95, "q_proj" + ("\n+ q_rope_proj" if rope else ""), "query"),
             ("kv_down", 3.3, "kv_down\nLinear(D, d_latent)", "layer")]
    if rope:
        parts.append(("k_rope_proj", 5.75, "k_rope_proj\n+ RoPE", "key"))
    for name, cx, text, role in parts:
        s.box(name, cx, y, 1.8 if name == "kv_down" else 1.6, 0.6, text, role)
        s.arrow((WIDTH / 2 + (cx - 3.5) / 5, x[1] - 0.03), (cx, y + 0.3), "x", name)
    cached = [("c_kv", 3.3, "latent c\n(B, T, d_latent)", "input", "kv_down")]
    if rope:
        cached.append(("k_rope", 5.75, "k_rope\n(B, T, d_rope)", "key", "k_rope_proj"))
    for name, cx, text, role, source in cached:
        s.box(name, cx, y - 1.05, 1.7, 0.6, text, role, fill=0.6)
        s.arrow((cx, y - 0.3), (cx, y - 0.75), source, name)
    right = 6.75 if rope else 4.35
    s.ax.add_patch(FancyBboxPatch((2.3, y - 1.55), right - 2.3, 0.95,
                                  boxstyle="round,pad=0,rounding_size=0.08", fill=False,
                                  edgecolor=_shade(ROLE_COLORS["mask"], 0.1), lw=1.4, ls="--"))
    s.node("cache", _bounds(2.3, y - 1.55, right, y - 0.6))
    s.text(2.4, y - 0.57, "KV cache", ha="left", va="bottom",
           color=_shade(ROLE_COLORS["mask"], 0.1), fontweight="bold")


def _mla_heads(s: _Sketch, y: float, rope: bool) -> None:
    """Up-projections from the latent to every head's keys and values, then attention."""
    c = s.record.nodes["c_kv"]
    q = s.box("Q", 0.95, y, 1.6, 0.6, "Q: H heads" + ("\n+ q_rope" if rope else ""), "query")
    s.arrow((0.95, s.record.nodes["q_proj"][1]), (0.95, q["top"]), "q_proj", "Q")
    for name, cx, role, rebuilt in (("k_up", 2.55, "key", "K"), ("v_up", 4.15, "value", "V")):
        up = s.box(name, cx, y + 0.55, 1.25, 0.42, name, role)
        s.arrow(((c[0] + c[2]) / 2 + (cx - 3.35) / 4, c[1]), (cx, up["top"]), "c_kv", name)
        s.box(rebuilt, cx, y - 0.4, 1.4, 0.42, f"{rebuilt}: H heads", role)
        s.arrow((cx, up["bottom"]), (cx, y - 0.19), name, rebuilt)
    att = s.box("attention", WIDTH / 2, y - 1.35, WIDTH - 0.5, 0.62,
                "attention, each head h: softmax((q_h·k_h" + (" + q_rope,h·k_rope" if rope
                                                               else "") + ") / √width) v_h",
                "weights")
    sources = [("Q", 0.95), ("K", 2.55), ("V", 4.15)] + ([("k_rope", 5.75)] if rope else [])
    for name, cx in sources:
        s.arrow((cx, s.record.nodes[name][1]), (cx, att["top"]), name, "attention")
    out = s.box("out_proj", WIDTH / 2, att["bottom"] - 0.55, 1.6, 0.42, "out_proj", "layer")
    s.arrow((WIDTH / 2, att["bottom"]), (WIDTH / 2, out["top"]), "attention", "out_proj")


@_diagram
def mla_latent_cache(decoupled_rope: bool = True) -> Figure:
    """Multi-head latent attention: x is compressed by a down-projection into a small latent vector c, the only thing cached per token (with one shared rotated key part when RoPE is decoupled); up-projections rebuild every head's keys and values from c.

    Chapter 10 (multi-head latent attention, ``MultiHeadLatentAttention``; its layers are
    named ``q_proj``, ``kv_down``, ``k_up``, ``v_up``, ``k_rope_proj`` and ``out_proj``, as
    are the parts of the drawing, with ``x``, ``c_kv``, ``k_rope``, ``Q``, ``K``, ``V``,
    ``attention`` and ``cache``). ``decoupled_rope=False`` leaves out the rotated key part.
    """  # noqa: E501
    rope = check_bool(decoupled_rope, "decoupled_rope")

    height = 7.8
    s = _canvas(height, "Multi-head latent attention: cache a small latent")
    s.label("x", WIDTH / 2, height - 0.8, "x " + _shape(("B", "T", "D")), va="top")
    _mla_cache(s, height - 1.75, rope)
    _mla_heads(s, height - 4.3, rope)
    width = "head_dim + d_rope" if rope else "head_dim"
    s.text(0.15, 0.12, _wrap(f"Cached per token and layer: d_latent{' + d_rope' if rope else ''} "
                             f"numbers instead of 2 × H × head_dim; √width = √({width}). "
                             "Decoding with absorb=True folds k_up into the query and v_up "
                             "into out_proj, so K and V are never rebuilt.", WIDTH - 0.3),
           ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 15. rolling


def _rolling_row(s: _Sketch, p: int, window: int, y: float, cell: float) -> None:
    """The buffer after position ``p`` is written into slot ``p % window``."""
    slot = p % window
    s.text(0.55, y, f"p = {p}", ha="center")
    for j in range(window):
        # the position held by slot j: the last q <= p with q % window == j
        held = p - ((p - j) % window)
        new = j == slot
        role = "key" if held >= 0 else "input"
        color = ROLE_COLORS["key"] if new else (_tint(ROLE_COLORS["key"], 0.25) if held >= 0
                                                 else "white")
        left = 1.1 + j * cell
        patch = Rectangle((left, y - 0.14), cell, 0.28, facecolor=color, edgecolor="#999999",
                          lw=0.8)
        patch.set_gid(f"role:{role}" if held >= 0 else None)
        s.ax.add_patch(patch)
        s.text(left + cell / 2, y, str(held) if held >= 0 else "–",
               fontweight="bold" if new else "normal", gid=f"cell:{p}:{j}")
        s.node(f"step {p}: slot {j}", _bounds(left, y - 0.14, left + cell, y + 0.14))
    note = f"→ slot {slot} ({p} mod {window})" + (f", replaces {p - window}" if p >= window
                                                   else "")
    s.text(1.25 + window * cell, y, note, ha="left", color=NOTE)


@_diagram
def rolling_kv_cache(window: int = 4, steps: int = 7) -> Figure:
    """The rolling buffer of a sliding-window KV cache: W slots, and the key and value of position p are written into slot p mod W, over position p − W, which has just left the window; the buffer always holds the last W positions.

    Chapter 10 (sliding-window attention, ``RollingKVCache``). ``window`` is W (2 to 6) and
    ``steps`` the number of positions written, one row each (1 to 12). Each row shows the
    positions the slots hold after that step; the slot just written is drawn in bold.
    """  # noqa: E501
    window = _check_int(window, "window", low=2, high=6)
    steps = _check_int(steps, "steps", high=12)

    cell = min(0.62, 3.0 / window)
    height = 0.6 + 0.5 + steps * 0.34 + 0.2 + 0.65
    s = _canvas(height, f"The rolling KV cache: {window} slots, position p in slot p mod W")
    top = height - 0.95
    for j in range(window):
        s.text(1.1 + (j + 0.5) * cell, top + 0.05, _fitting([f"slot {j}", str(j)], cell),
               va="bottom")
    s.text(0.55, top + 0.05, "written", va="bottom")
    for p in range(steps):
        _rolling_row(s, p, window, top - 0.17 - p * 0.34, cell)
    s.text(0.15, 0.12, _wrap("The buffer holds exactly the keys that query p may see, "
                             "p − W < j ≤ p; read oldest first, it starts at slot (p + 1) "
                             "mod W once full.", WIDTH - 0.3), ha="left", va="bottom",
           color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 16. MiniGPT

_GPT_X, _GPT_W, _GPT_STEP = 2.2, 2.5, 0.78


def _gpt_inputs(s: _Sketch, y: float) -> float:
    """Token ids and positions, their two embeddings and the sum; returns the sum's top."""
    for name, cx, label, text in (("embed", 1.15, "idx (B, T)", "embed\nEmbedding(V, D)"),
                                  ("pos", 3.25, "positions 0 … T−1",
                                   "pos\nEmbedding(T_max, D)")):
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


def _gpt_stack(s: _Sketch, y: float, n_layers: int) -> None:
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
    s.label("logits", _GPT_X, y + 0.32, "logits " + _shape(("B", "T", "V")), va="bottom")
    s.arrow((_GPT_X, y), (_GPT_X, y + 0.28), "lm_head", "logits")


def _gpt_block(s: _Sketch, top: float) -> None:
    """Inside every block: chapter 7's pre-norm block below ``top``, framed, its parts named
    ``block: norm1`` ... (the module names of ``TransformerBlock``)."""
    labels = {"norm1": "norm1", "attn": "self_attn (causal)", "norm2": "norm2",
              "ff": "ff (feed-forward)"}
    cx, box_w, step = 5.3, 1.9, 0.56
    bottom = top - 0.75 - 6 * step - 0.65
    s.text(cx + 0.2, top - 0.1, "inside each block", HEADING, fontweight="bold", va="top")
    s.label("block: x", cx, bottom, "x (B, T, D)", va="top")
    previous, y = "block: x", bottom + 0.04
    for i, (stage, role) in enumerate(_BLOCK_STAGES["pre"]):
        cy, name = bottom + (i + 1) * step, "block: " + stage
        if role == "add":
            box = s.adder(name, cx, cy)
            source = "block: " + _RESIDUAL_FROM["pre"][stage]
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


@_diagram
def minigpt_architecture(n_layers: int = 2) -> Figure:
    """The MiniGPT model: token ids go through the token embedding embed, positions through the position embedding pos, the two are added, then N pre-norm Transformer blocks (blocks), a final LayerNorm (norm) and a linear head (lm_head) that gives the logits of the next token.

    Chapter 11 (the mini-Transformer; ``MiniGPT``'s modules ``embed``, ``pos``,
    ``blocks``, ``norm`` and ``lm_head``, the names of the parts of the drawing). Each block
    is Chapter 7's pre-norm block, drawn on the right (parts ``block: norm1`` ...).
    ``n_layers`` (1 to 4) is the number of blocks N.
    """  # noqa: E501
    n_layers = _check_int(n_layers, "n_layers", high=4)

    stack_top = 2.6 + (n_layers + 2) * 0.98 + 0.55  # the logits' label
    height = max(stack_top, 5.6) + 0.7 + 0.1
    s = _canvas(height, "MiniGPT: embeddings, N pre-norm blocks, norm, LM head")
    y = _gpt_inputs(s, 0.9)
    _gpt_stack(s, y, n_layers)
    _gpt_block(s, height - 0.65)
    s.text(0.15, 0.12, "lm_head shares its weight matrix with embed (weight tying, as in "
           "GPT-2).", ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------------------------------------- 17. induction

_LETTERS = "ABCDEFGH"


def _induction_tokens(s: _Sketch, tokens: Sequence[str], y: float) -> list[float]:
    """The tokens in a row, their positions above; returns their x."""
    step = min(0.95, 4.0 / (len(tokens) - 1))
    xs = [0.75 + step * i for i in range(len(tokens))]
    for i, (x, token) in enumerate(zip(xs, tokens, strict=True)):
        s.box(f"token {i}", x, y, min(0.62, step - 0.2), 0.5, token, "input", fill=0.3)
        s.text(x, y + 0.27, str(i), va="bottom", color=NOTE)
    return xs


def _induction_arrows(s: _Sketch, xs: Sequence[float], y: float) -> None:
    """blocks[0]: each position reads the one before; blocks[1]: the last reads B."""
    prev_color, ind_color = _shade(ROLE_COLORS["weights"], 0.1), ROLE_COLORS["query"]
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


@_diagram
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
    top_note = _wrap("blocks[1], induction head: the later A looks for a position whose "
                     "previous token was A (B's key carries it, from blocks[0]), attends to B "
                     "and copies B into the prediction.", WIDTH - 0.3)
    bottom_note = _wrap("blocks[0], previous-token head: each position reads the one before "
                        "it, so B's position also says \"the token before me was A\".",
                        WIDTH - 0.3)
    arc = 0.3 * 4.0 / 2 + 0.55 + 0.45  # the induction arrow's height, at most
    y = 0.2 + _text_size(bottom_note)[1] + 1.0
    height = y + arc + 0.3 + _text_size(top_note)[1] + 0.75
    s = _canvas(height, "An induction circuit: A B … A → B")
    xs = _induction_tokens(s, tokens, y)
    _induction_arrows(s, xs, y)
    s.text(0.15, height - 0.7, top_note, ha="left", va="top",
           color=_shade(ROLE_COLORS["query"], 0.2))
    s.text(0.15, 0.15, bottom_note, ha="left", va="bottom",
           color=_shade(ROLE_COLORS["weights"], 0.1))
    return s.fig


#: Every diagram by name, for notebooks and tests (in the order of the chapters).
DIAGRAMS: dict[str, Callable[..., Figure]] = {
    "attention_pooling": attention_pooling,
    "self_attention_shapes": self_attention_shapes,
    "dot_vs_cosine": dot_vs_cosine,
    "qkv_data_flow": qkv_data_flow,
    "scaled_dot_product_graph": scaled_dot_product_graph,
    "head_split_merge": head_split_merge,
    "multi_head_block": multi_head_block,
    "pre_norm_vs_post_norm": pre_norm_vs_post_norm,
    "encoder_decoder_flow": encoder_decoder_flow,
    "kv_cache_steps": kv_cache_steps,
    "flash_attention_tiles": flash_attention_tiles,
    "rope_rotation": rope_rotation,
    "gqa_sharing": gqa_sharing,
    "rolling_kv_cache": rolling_kv_cache,
    "mla_latent_cache": mla_latent_cache,
    "minigpt_architecture": minigpt_architecture,
    "induction_circuit": induction_circuit,
}
