"""The drawing helpers every diagram shares: colours, sizes, the sketch, the recorded graph.

A private module of :mod:`course_attn.lab.diagrams` (see its docstring for what the
diagrams promise). Its names carry no underscore so that the diagram modules may
import them; ``course_attn.lab.diagrams`` re-exports the public ones.
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
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.textpath import TextToPath

from ..._validation import check_nonnegative_int, check_positive_int

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Text


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
# bounding box adds; squeezed to 400 px on a phone, 14.3 pt is then 11.03 px, over the 11 px
# floor of viz.readable_font_size, which is what the site measures there (issue 44: no figure
# scrolls sideways on a phone; it was 11.7 pt, 9 px, while wide figures scrolled). One size
# for all text, titles and panel names too (bold): larger ones did not fit a 7-inch figure.
FONT = 14.3
HEADING = 14.3  # the name of a panel
TITLE = 14.3
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


# ------------------------------------------------------------------------------- helpers


Box = dict[str, float]  # left, right, top, bottom, cx, cy (inches)


def bounds(left: float, bottom: float, right: float, top: float) -> Box:
    return {"left": left, "right": right, "top": top, "bottom": bottom,
            "cx": (left + right) / 2, "cy": (top + bottom) / 2}


def tint(color: str | tuple[float, float, float], amount: float
          ) -> tuple[float, float, float]:
    """``color`` mixed with white: ``amount=1`` is the colour, ``0`` is white."""
    r, g, b = mcolors.to_rgb(color)
    return (1 - amount * (1 - r), 1 - amount * (1 - g), 1 - amount * (1 - b))


def shade(color: str | tuple[float, float, float], amount: float = 0.3
           ) -> tuple[float, float, float]:
    """``color`` mixed with black, for edges and text."""
    r, g, b = mcolors.to_rgb(color)
    return (r * (1 - amount), g * (1 - amount), b * (1 - amount))


def text_size(text: str, size: float = FONT, family: str = "sans-serif") -> tuple[float, float]:
    """Width and height in inches that ``text`` takes at ``size`` points (one or more lines)."""
    prop = FontProperties(size=size, family=family)
    widths = []
    for line in text.split("\n"):
        width, _, _ = _TEXT_TO_PATH.get_text_width_height_descent(line, prop, ismath=False)
        widths.append(width)
    lines = text.count("\n") + 1
    return max(widths) / 72, (lines * 1.2 * size) / 72


def wrap(text: str, width: float, size: float = FONT) -> str:
    """``text`` broken into lines at spaces so that each line fits ``width`` inches."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_size(lines[-1] + " " + word, size)[0] <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def shape_text(symbols: Sequence[str], values: Sequence[int] | None = None) -> str:
    """``(T, d_k)`` or, with values, ``(T, d_k) = (4, 4)``."""
    text = "(" + ", ".join(symbols) + ")"
    if values is not None:
        text += " = (" + ", ".join(str(v) for v in values) + ")"
    return text


def check_int(value: object, name: str, low: int = 1, high: int | None = None) -> int:
    """An int in ``[low, high]``; the upper bound keeps the drawing readable."""
    value = check_positive_int(value, name) if low >= 1 else check_nonnegative_int(value, name)
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high} to keep the drawing readable, "
                         f"got {value}")
    return value


def check_label(value: object, name: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    if not value.strip() or "\n" in value or "$" in value:
        raise ValueError(f"{name} must be one non-empty line of plain text, got {value!r}")
    if len(value) > max_chars:
        raise ValueError(f"{name} must have at most {max_chars} characters to fit its box, "
                         f"got {len(value)}: {value!r}")
    return value


def check_real(value: object, name: str, low: float, high: float) -> float:
    """A finite number in ``(low, high]``."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not (math.isfinite(number) and low < number <= high):
        raise ValueError(f"{name} must be a number in ({low:g}, {high:g}], got {value!r}")
    return number


def check_vector(value: object, name: str) -> tuple[float, float]:
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


def diagram(func: Callable[..., Figure]) -> Callable[..., Figure]:
    """Give the figure its description (the docstring's first line) as its label."""
    description = (func.__doc__ or "").strip().splitlines()[0]

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> Figure:
        fig = func(*args, **kwargs)
        fig.set_label(description)
        return fig

    return wrapper


# ---------------------------------------------------------------------------- the sketch


class Sketch:
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
        width, height = text_size(text, kwargs.get("size", FONT))
        self.text(x, y, text, **kwargs)
        left = {"center": x - width / 2, "left": x, "right": x - width}[kwargs.get("ha", "center")]
        bottom = {"center": y - height / 2, "bottom": y, "top": y - height}[
            kwargs.get("va", "center")]
        return self.node(name, bounds(left, bottom, left + width, bottom + height))

    def box(self, name: str, cx: float, cy: float, w: float, h: float, label: str, role: str,
            fill: float = 0.35, **kwargs: Any) -> Box:
        """A rounded box centred at ``(cx, cy)`` in the colour of ``role``, with a label."""
        color = ROLE_COLORS[role]
        patch = FancyBboxPatch((cx - w / 2, cy - h / 2), w, h,
                               boxstyle="round,pad=0,rounding_size=0.06",
                               facecolor=tint(color, fill), edgecolor=shade(color), lw=1.3)
        patch.set_gid(f"role:{role}")
        self.ax.add_patch(patch)
        self.text(cx, cy, label, gid=f"label:{name}", **kwargs)
        return self.node(name, bounds(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))

    def adder(self, name: str, cx: float, cy: float, radius: float = 0.14) -> Box:
        """The "+" of a residual connection."""
        self.ax.add_patch(Circle((cx, cy), radius, facecolor="white", edgecolor=INK, lw=1.3))
        self.text(cx, cy, "+", FONT)
        return self.node(name, bounds(cx - radius, cy - radius, cx + radius, cy + radius))

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


def canvas(height: float, title: str, width: float = WIDTH) -> Sketch:
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
    return Sketch(fig, ax, record)


def grid(s: Sketch, left: float, top: float, rows: int, cols: int, cell: float,
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
    frame = shade(ROLE_COLORS[corner]) if corner is not None else "#555555"
    s.ax.add_patch(Rectangle((left, top - rows * cell), cols * cell, rows * cell,
                             fill=False, edgecolor=frame, lw=1.0))
    return bounds(left, top - rows * cell, left + cols * cell, top)


def matrix(s: Sketch, name: str, cx: float, top: float, rows: int, cols: int, cell: float,
            role: str, label: str, *, strength: float = 0.55,
            strong: Callable[[int, int], bool] | None = None) -> Box:
    """A matrix as a named grid of cells in its role's colour, centred at ``cx``, label below.

    The part named ``name`` covers the grid and its label (``label_bottom`` is the label's).
    """
    color = ROLE_COLORS[role]

    def fill(r: int, c: int) -> object:
        if strong is not None and strong(r, c):
            return color
        return tint(color, strength if strong is None else 0.25)

    box = grid(s, cx - cols * cell / 2, top, rows, cols, cell, fill, role=role)
    label_w, label_h = text_size(label) if label else (0.0, 0.0)
    if label:
        s.text(cx, box["bottom"] - 0.06, label, va="top")
    half = max(cols * cell, label_w) / 2
    s.node(name, bounds(cx - half, box["bottom"] - 0.06 - label_h, cx + half, top))
    return {**box, "label_bottom": box["bottom"] - 0.06 - label_h}


def legend(s: Sketch, items: Sequence[tuple[object, str]], left: float, top: float,
            right: float = WIDTH - 0.1) -> float:
    """Colour swatches with their meaning, wrapped into lines; returns the bottom."""
    x, y = left, top - 0.14
    for color, text in items:
        width = text_size(text)[0]
        if x > left and x + 0.26 + width > right:
            x, y = left, y - 0.3
        s.ax.add_patch(Rectangle((x, y - 0.08), 0.17, 0.17, facecolor=color,
                                 edgecolor="#555555", lw=0.6))
        s.text(x + 0.25, y, text, ha="left")
        x += 0.25 + width + 0.3
    return y - 0.16


# ----------------------------------- vectors and short texts, shared by several chapters

Vec = tuple[float, float]
Color = str | tuple[float, float, float]


def vector(s: Sketch, origin: str, name: str, tip: Vec, color: object,
            lw: float = 2.2) -> None:
    """An arrow from the point named ``origin`` to a new point ``name`` at ``tip``."""
    s.node(name, bounds(tip[0], tip[1], tip[0], tip[1]))
    left, bottom = s.record.nodes[origin][:2]
    s.arrow((left, bottom), tip, origin, name, color=color, lw=lw)


def point(s: Sketch, name: str, at: Vec) -> None:
    s.node(name, bounds(at[0], at[1], at[0], at[1]))
    s.ax.add_patch(Circle(at, 0.035, color="black"))


def fitting(candidates: Sequence[str], width: float) -> str:
    """The first candidate text that fits in ``width`` inches (the last one otherwise)."""
    for text in candidates:
        if text_size(text)[0] <= width - 0.04:
            return text
    return candidates[-1]


def subscript(n: int) -> str:
    """``n`` in subscript digits: 12 -> ₁₂."""
    return "".join("₀₁₂₃₄₅₆₇₈₉"[int(d)] for d in str(n))
