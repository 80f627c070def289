"""Plotting helpers: every attention pattern in the course is drawn through here.

Each function draws on a given ``matplotlib`` Axes (or a new one) and returns
it, so notebooks stay short and tests can inspect what was drawn.

Figures are made for the site's 700 px column (at most :data:`COLUMN_WIDTH` inches wide)
and stay readable on a phone: every text a function draws is at least
:func:`readable_font_size` of its figure's width, so it is :data:`MIN_TEXT_PX` (11 px) tall
or more even where a phone 400 px wide squeezes the figure into the width of its screen
(``tools/static/course.css``). That floor is what the site needs there: a figure is never
wider than the screen (no figure scrolls sideways, issue 44), so its text must be readable
at the screen's width; ``tools/static/course.js`` shows a figure larger where there is room,
until its smallest text is 12 px on a 1280 px screen and 11 px on a 400 px phone, and
``tests/site_check.py`` measures both in a browser.
:func:`use_sharp_figures` makes a notebook show its figures as SVG, with heatmap images
inside at twice a screen's resolution. Numbers written on cells
are black or white, whichever contrasts more with the cell's colour (WCAG relative
luminance), and tick labels that would collide are thinned or turned.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text

if TYPE_CHECKING:
    from matplotlib.axis import XAxis, YAxis
    from matplotlib.image import AxesImage
    from matplotlib.transforms import Bbox

__all__ = [
    "interactive_plot",
    "plot_attention",
    "plot_blocks",
    "plot_curves",
    "plot_distribution",
    "plot_heatmap",
    "plot_heads",
    "plot_mask",
    "plot_training",
    "raise_small_text",
    "plot_training_and_scores",
    "readable_font_size",
    "use_sharp_figures",
    "keep_spaces",
]

#: The narrowest screen the site is read on, in CSS pixels (a phone held upright).
PHONE_WIDTH_PX = 400
#: The smallest text a figure may show on that screen, in CSS pixels, when the figure is
#: squeezed into the screen's width: what :func:`readable_font_size` guarantees, and what
#: the site measures on a phone (``tests/site_check.py``; 12 px at 1280 px, where a figure
#: has room to be shown larger: ``course.js``). It was 9 px while a figure too wide for a
#: phone scrolled sideways at 11 px; issue 44 made every figure whole on the screen.
MIN_TEXT_PX = 11.0
#: The margin, in inches, that a notebook's tight bounding box adds on each side of a figure.
TIGHT_MARGIN = 0.1
#: The width of the site's content column, in inches (700 px at 100 dpi).
COLUMN_WIDTH = 7.0
#: Heatmap images inside an SVG figure: twice a screen's 96 px per inch, sharp on any screen.
IMAGE_DPI = 192


def readable_font_size(width: float) -> float:
    """The smallest font size, in points, that stays readable on a phone (every chapter).

    A notebook saves a figure ``width`` inches wide with a :data:`TIGHT_MARGIN` on each
    side. It is shown at its own size (1 pt = 4/3 CSS px) where it fits, and scaled down to
    the :data:`PHONE_WIDTH_PX` of a phone where it does not (on a phone a figure takes the
    whole width of the screen, the column's margins included); text must then still be
    :data:`MIN_TEXT_PX` tall. Rounded up to a tenth of a point, so that the browser's own
    rounding cannot take it under. For a figure sized for the site's 700 px column (7 in,
    saved 7.2 in: 691 px) that is ``11 * 691.2 / 400 * 3 / 4 = 14.26``, so 14.3 pt.
    """
    if isinstance(width, bool) or not isinstance(width, int | float):
        raise TypeError(f"width must be a positive number of inches, got "
                        f"{type(width).__name__} {width!r}")
    if not width > 0 or width == float("inf"):
        raise ValueError(f"width must be a positive number of inches, got {width!r}")
    shown = min(1.0, PHONE_WIDTH_PX / ((width + 2 * TIGHT_MARGIN) * 96))  # 96 px per inch
    return math.ceil(round(10 * MIN_TEXT_PX / (4 / 3 * shown), 6)) / 10


def use_sharp_figures() -> None:
    """Show this notebook's figures as SVG: sharp lines and real text (every chapter's set-up).

    Lines and text are vectors, sharp at any zoom and on any screen; text stays text
    (``svg.fonttype = "none"``), so it can be selected, searched and measured. Images
    (the heatmaps of :func:`plot_attention`, :func:`plot_heatmap` ...) are embedded as PNG
    at :data:`IMAGE_DPI`, twice a screen's resolution, so a dense heatmap stays sharp
    while the SVG stays small. The SVG carries no date and fixed ids, so running a cell
    again writes the same bytes. Outside IPython only the settings change.
    """
    plt.rcParams.update({
        "svg.fonttype": "none", "svg.hashsalt": "course_attn", "savefig.dpi": IMAGE_DPI,
        # the SVG names these fonts on every text: DejaVu Sans (matplotlib's own, so the
        # layout is measured with it) and the closest common fallbacks, not a list of 10
        "font.sans-serif": ["DejaVu Sans", "Verdana", "Arial"]})
    from IPython.core.getipython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    # the inline backend passes the figure's own dpi unless told: images need IMAGE_DPI
    set_matplotlib_formats("svg", dpi=IMAGE_DPI, metadata={"Date": None})
    formatter = shell.display_formatter.formatters["image/svg+xml"]  # type: ignore[union-attr]
    draw = formatter.lookup_by_type(Figure)
    formatter.for_type(Figure, lambda figure: keep_spaces(draw(raise_small_text(figure))))


def raise_small_text(figure: Figure) -> Figure:
    """Raise every text of ``figure`` under :func:`readable_font_size` of the width the
    figure is saved at (its tight box) to that size; return the figure (every chapter).

    This module's functions draw no smaller text, but a notebook may add some after them (a
    ``suptitle``, an ``ax.text``), and a colour bar or legend outside the axes makes the
    saved figure wider than its ``figsize``, so a phone shrinks it more (issue 44: chapter
    8's heatmaps showed 10.5 px text at 400 px). A notebook's figures go through this when
    they are shown (:func:`use_sharp_figures`), and so do a widget's figures drawn ahead;
    text already large enough is left as it is.
    """
    if not isinstance(figure, Figure):
        raise TypeError(f"figure must be a matplotlib Figure, got {type(figure).__name__}")
    for _ in range(8):  # larger text may widen the tight box: measure again until it holds
        figure.draw_without_rendering()
        box = figure.get_tightbbox()
        if box is None or not box.width > 0:
            return figure
        # 2 % over the box measured here: the notebook saves the figure at IMAGE_DPI, where
        # text measures a little wider (chapter 8's 8.1-inch figure came out at 10.96 px)
        size = readable_font_size(1.02 * float(box.width))
        raised = False
        for ax in figure.axes:  # tick labels through the axis, which makes new ticks alike
            for labels, name in ((ax.get_xticklabels(which="both"), "x"),
                                 (ax.get_yticklabels(which="both"), "y")):
                if any(t.get_text() and float(t.get_fontsize()) < size for t in labels):
                    ax.tick_params(axis="x" if name == "x" else "y", which="both",
                                   labelsize=size)
                    raised = True
        for text in figure.findobj(Text):
            if text.get_visible() and text.get_text().strip() and \
                    float(text.get_fontsize()) < size:
                text.set_fontsize(size)
                raised = True
        if not raised:
            break
    return figure


def keep_spaces(svg: str | None) -> str | None:
    """``svg`` with its texts' spaces kept as drawn (``xml:space="preserve"`` on each text).

    Matplotlib lays a label out with every space it holds ("q / sqrt(D)    alpha =
    ..."), but an SVG viewer collapses a run of spaces into one unless the text says
    otherwise, so the parts of a formula would run together. (Browsers honour the
    attribute on the text itself, not on the root.) Used by :func:`use_sharp_figures`.
    """
    if svg is None:  # IPython's formatter draws nothing for a figure without axes
        return svg
    if not isinstance(svg, str):
        raise TypeError(f"svg must be a str holding an SVG document or None, "
                        f"got {type(svg).__name__}")
    if "<svg" not in svg:
        raise ValueError(f"svg must be an SVG document (with an <svg> element), "
                         f"got {svg[:40]!r}")
    return re.sub(r"<text (?!xml:space=)", '<text xml:space="preserve" ', svg)


# ----------------------------------------------------------------------------- checks


def _to_numpy(values: object, name: str) -> np.ndarray:
    if values is None or isinstance(values, str | bytes | dict):
        raise TypeError(f"{name} must be a tensor or array of numbers, got {type(values).__name__}")
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().double().numpy()
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a tensor or array of numbers, got {type(values).__name__}"
        ) from None


def _check_labels(labels: Sequence[str] | None, size: int, name: str) -> None:
    if labels is None:
        return
    if not hasattr(labels, "__len__") or isinstance(labels, torch.Tensor | dict):
        raise TypeError(f"{name} must be a sequence of {size} labels or None, "
                        f"got {type(labels).__name__}")
    if len(labels) != size:
        raise ValueError(f"{name} must have {size} entries, got {len(labels)}")


def _check_ax(ax: object, name: str = "ax") -> None:
    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(f"{name} must be a matplotlib Axes or None, got {type(ax).__name__}")


def _check_flag(value: object, name: str, *, none_ok: bool = False) -> None:
    if not (isinstance(value, bool) or (none_ok and value is None)):
        allowed = "True, False or None" if none_ok else "a bool (True or False)"
        raise TypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")


# ----------------------------------------------------------------------------- text


def _figure(ax: Axes) -> Figure:
    """The figure ``ax`` is drawn on (its root figure, not a subfigure)."""
    fig = ax.get_figure(root=True)
    if not isinstance(fig, Figure):
        raise TypeError(f"ax must be an Axes on a figure, got one on {type(fig).__name__}")
    return fig


def _width(ax: Axes) -> float:
    """The width in inches of the figure ``ax`` is drawn on."""
    return float(_figure(ax).get_size_inches()[0])


def _new_axes(width: float, height: float) -> Axes:
    """One axes on a new figure, at most the column's width."""
    _, ax = plt.subplots(figsize=(min(width, COLUMN_WIDTH), height))
    return ax


def _fit_text(*axes: Axes) -> None:
    """Raise every text of ``axes`` (title, labels, ticks, legend, cell values) to the size
    a phone can read at their figure's width; larger text is left as it is."""
    for ax in axes:
        smallest = readable_font_size(_width(ax))
        labels = {name: axis.get_majorticklabels() + axis.get_minorticklabels()
                  for name, axis in (("x", ax.xaxis), ("y", ax.yaxis))}
        current = {name: max([float(t.get_fontsize()) for t in found], default=smallest)
                   for name, found in labels.items()}
        ax.tick_params(axis="x", which="both", labelsize=max(current["x"], smallest))
        ax.tick_params(axis="y", which="both", labelsize=max(current["y"], smallest))
        found: list[Text] = [ax.title, ax.xaxis.label, ax.yaxis.label, ax.xaxis.offsetText,
                             ax.yaxis.offsetText, *ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            found += [*legend.get_texts(), legend.get_title()]
        for text in found:
            if float(text.get_fontsize()) < smallest:
                text.set_fontsize(smallest)


def _text_color_on(rgba: Sequence[float] | np.ndarray) -> str:
    """Black or white, whichever contrasts more with a cell of colour ``rgba`` (WCAG 2).

    The relative luminance ``L`` of the sRGB colour decides: black text has the contrast
    ratio ``(L + 0.05) / 0.05``, white ``1.05 / (L + 0.05)``; they are equal at L = 0.179.
    A transparent cell (a NaN) shows the white page behind it.
    """
    if len(rgba) > 3 and rgba[3] == 0:
        return "black"

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(float(c)) for c in rgba[:3])
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "white"


def _narrow_cells(ax: Axes, n_cols: int, size: float) -> bool:
    """Whether ``0.50`` at ``size`` points would fill more than 80 % of a cell's width."""
    width_pt = ax.get_position().width * _width(ax) * 72 / max(n_cols, 1)
    return size * (0.64 * 3 + 0.32) > 0.8 * width_pt  # DejaVu Sans: digit 0.64 em, point 0.32


def _value_text(narrow: bool) -> Callable[[float], str]:
    """A cell's value as ``0.50``, or as ``.50`` in narrow cells (``-.50``; ``1.00`` stays)."""
    def text(value: float) -> str:
        full = f"{value:.2f}"
        return full.replace("0.", ".", 1) if narrow and abs(value) < 1 else full

    return text


def _annotate_cells(ax: Axes, image: AxesImage, data: np.ndarray,
                    texts: Callable[[float], str]) -> None:
    """Write each cell's value on it, readable on a phone, in black or white by the
    luminance of the cell's colour."""
    size = readable_font_size(_width(ax))
    for (i, j), value in np.ndenumerate(data):
        rgba = image.cmap(image.norm(value))
        ax.text(j, i, texts(value), ha="center", va="center", fontsize=size,
                color=_text_color_on(rgba))


def _rasterize_colorbar(colorbar: object) -> None:
    """The colour bar's gradient as one image, not hundreds of SVG rectangles."""
    solids = getattr(colorbar, "solids", None)
    if solids is not None:
        solids.set_rasterized(True)


# ----------------------------------------------------------------------------- heatmaps


def plot_attention(
    weights: object,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    cmap: str = "viridis",
    vmin: float | None = 0.0,
    vmax: float | None = None,
) -> Axes:
    """Heatmap of a ``(T_q, T_k)`` matrix: row ``i`` is query ``i`` over every key (Chapter 1 on).

    ``x_labels`` name the keys (columns), ``y_labels`` the queries (rows).
    Cells are annotated with their values when the matrix is small (or when
    ``annotate=True``), in black or white by the cell's luminance. Set ``vmin=None`` for
    signed scores. A new figure is at most the column's 7 inches wide.
    """
    data = _to_numpy(weights, "weights")
    if data.ndim != 2:
        raise ValueError(f"weights must be 2-D (T_q, T_k), got shape {data.shape}")
    _check_labels(x_labels, data.shape[1], "x_labels")
    _check_labels(y_labels, data.shape[0], "y_labels")
    _check_ax(ax)
    _check_flag(annotate, "annotate", none_ok=True)
    if ax is None:
        ax = _new_axes(max(3.0, 1.2 + 0.55 * data.shape[1]),
                       min(COLUMN_WIDTH, max(2.5, 1.0 + 0.5 * data.shape[0])))
    _draw_attention(ax, data, x_labels, y_labels, title, annotate, (cmap, vmin, vmax))
    _untangle_ticks(ax)
    return ax


def _draw_attention(ax: Axes, data: np.ndarray, x_labels: Sequence[str] | None,
                    y_labels: Sequence[str] | None, title: str | None, annotate: bool | None,
                    scale: tuple[str, float | None, float | None]) -> None:
    """The heatmap of :func:`plot_attention` (or of one head of :func:`plot_heads`) on
    ``ax``, with arguments already checked; ``scale`` is ``(cmap, vmin, vmax)``."""
    cmap, vmin, vmax = scale
    image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                      interpolation="nearest")
    _rasterize_colorbar(_figure(ax).colorbar(image, ax=ax, fraction=0.046, pad=0.04))
    ax.set_xticks(range(data.shape[1]), labels=x_labels or _numbers(data.shape[1]))
    ax.set_yticks(range(data.shape[0]), labels=y_labels or _numbers(data.shape[0]))
    if x_labels is not None and max((len(str(s)) for s in x_labels), default=0) > 3:
        ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    if annotate if annotate is not None else data.size <= 64:
        size = readable_font_size(_width(ax))
        _annotate_cells(ax, image, data, _value_text(_narrow_cells(ax, data.shape[1], size)))
    _fit_text(ax, *_colorbar_axes(ax))


def plot_mask(
    mask: object,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """A boolean ``(T_q, T_k)`` mask as a grid (Chapter 5): dark = may attend, light = blocked.

    Cells read "1" (``True``, may attend) or "0" (blocked), as in the course's
    convention; rows are queries, columns keys. The figure says so itself: the key axis is
    labelled "key (1 = may attend)" ("key (dark = may attend)" for a mask too large to
    number its cells), unless ``title`` already says what may attend.
    """
    data = _to_numpy(mask, "mask")
    if data.ndim != 2:
        raise ValueError(f"mask must be 2-D (T_q, T_k), got shape {data.shape}")
    if not np.isin(data, (0.0, 1.0)).all():
        raise ValueError("mask must hold only True/False (or 1/0) values")
    _check_labels(x_labels, data.shape[1], "x_labels")
    _check_labels(y_labels, data.shape[0], "y_labels")
    _check_ax(ax)
    if ax is None:
        ax = _new_axes(max(2.5, 0.9 + 0.45 * data.shape[1]),
                       min(COLUMN_WIDTH, max(2.2, 0.9 + 0.4 * data.shape[0])))
    image = ax.imshow(data, cmap="Blues", vmin=-0.25, vmax=1.0, aspect="auto",
                      interpolation="nearest")
    ax.set_xticks(range(data.shape[1]), labels=x_labels or _numbers(data.shape[1]))
    ax.set_yticks(range(data.shape[0]), labels=y_labels or _numbers(data.shape[0]))
    if x_labels is not None and max((len(str(s)) for s in x_labels), default=0) > 3:
        ax.tick_params(axis="x", labelrotation=45)
    numbered = data.size <= 256
    if numbered:
        _annotate_cells(ax, image, data, lambda value: str(int(value)))
    said = title is not None and "may attend" in title
    ax.set_xlabel("key" if said else f"key ({'1' if numbered else 'dark'} = may attend)")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    _fit_text(ax)
    return ax


def _colorbar_axes(ax: Axes) -> list[Axes]:
    """The colour bars drawn for the images of ``ax``."""
    found = []
    for image in ax.images:
        colorbar = getattr(image, "colorbar", None)
        if colorbar is not None:
            found.append(colorbar.ax)
    return found


def plot_heatmap(
    matrix: object,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "",
    ylabel: str = "",
    cmap: str = "RdBu_r",
    vmin: float | None = None,
    vmax: float | None = None,
) -> Axes:
    """Heatmap of any 2-D matrix that is not an attention pattern (Chapter 7: the table of
    positional encodings, rows = positions, columns = dimensions), with a colour bar.

    Unlike :func:`plot_attention` it names no query/key axes and labels ticks sparsely,
    so large matrices stay readable. The matrix is one image, whatever its size.
    """
    data = _to_numpy(matrix, "matrix")
    if data.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {data.shape}")
    _check_ax(ax)
    if ax is None:
        ax = _new_axes(6.0, 4.0)
    image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                      interpolation="nearest")
    _rasterize_colorbar(_figure(ax).colorbar(image, ax=ax, fraction=0.046, pad=0.04))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    _fit_text(ax, *_colorbar_axes(ax))
    return ax


# ----------------------------------------------------------------------------- heads

_MARGIN = 1.6  # inches of a head's panel outside its cells: query labels and the colour bar


def _check_heads_layout(n_heads: int, axes: object, ncols: object, max_width: object) -> None:
    """``ncols`` and ``max_width`` lay out new axes; ``axes`` are the caller's own."""
    if ncols is not None:
        if isinstance(ncols, bool) or not isinstance(ncols, int | np.integer):
            raise TypeError(f"ncols must be a positive int or None, "
                            f"got {type(ncols).__name__} {ncols!r}")
        if ncols < 1:
            raise ValueError(f"ncols must be a positive int or None, got {ncols}")
        if axes is not None:
            raise ValueError("ncols lays out new axes: give ncols or axes, not both")
    if max_width is not None:
        if isinstance(max_width, bool) or not isinstance(max_width, int | float):
            raise TypeError(f"max_width must be a positive number of inches or None, "
                            f"got {type(max_width).__name__} {max_width!r}")
        if not max_width > 0:
            raise ValueError(f"max_width must be a positive number of inches or None, "
                             f"got {max_width}")
        if axes is not None:
            raise ValueError("max_width sizes new axes: give max_width or axes, not both")
    if axes is not None:
        if not hasattr(axes, "__len__") or isinstance(axes, Axes):
            raise TypeError(f"axes must be a sequence of {n_heads} matplotlib Axes or None, "
                            f"got {type(axes).__name__}")
        for ax in cast(Sequence[object], axes):
            _check_ax(ax, "axes")


def _heads_grid(shape: tuple[int, int, int], annotate: bool, ncols: int | None,
                max_width: float | None) -> list[Axes]:
    """New axes for ``H`` heads of ``(T_q, T_k)``, at most as many per row as stay readable.

    A head's panel is at least 3 in wide and its cells at least 0.08 in (0.4 in with
    values written on them, which fits ``0.50`` at the 11.3 pt a 7-inch figure needs);
    without ``ncols``, a row holds as many heads as the width allows, and at least one.
    Crowded tick labels are thinned (:func:`plot_attention`).
    """
    n_heads, t_q, t_k = shape
    width_cap = COLUMN_WIDTH if max_width is None else float(max_width)
    needed = max(3.0, _MARGIN + (0.4 if annotate else 0.08) * t_k)  # the narrowest panel
    cols = min(n_heads, ncols or max(1, int(width_cap // needed)))
    rows = -(-n_heads // cols)  # ceil(H / cols)
    natural = max(3.0, _MARGIN + 0.45 * t_k)
    width = min(natural, width_cap / cols)
    panel_cell = (width - _MARGIN) / t_k  # square cells: the height follows the width
    height = min(COLUMN_WIDTH, max(2.5, 1.4 + panel_cell * t_q))
    fig, grid = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    cells = list(grid.flat)  # row by row
    for spare in cells[n_heads:]:
        fig.delaxes(spare)
    return cells[:n_heads]


def plot_heads(
    weights: object,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    *,
    head_names: Sequence[str] | None = None,
    axes: Sequence[Axes] | None = None,
    annotate: bool | None = False,
    ncols: int | None = None,
    max_width: float | None = None,
) -> list[Axes]:
    """One labelled heatmap per head of ``weights (H, T_q, T_k)`` (Chapter 6).

    All heads share the colour scale 0..1 so they can be compared. Without ``axes`` the
    heads are laid out row by row, ``ncols`` per row; by default as many as stay readable
    in the site's 700 px column (cells at least 0.2 in wide, 0.4 in with values), so
    eight-token heads go two to a row, or one with ``annotate=True``. ``max_width``
    (inches, default the column's 7) caps the figure's width. With ``axes`` given,
    ``ncols`` and ``max_width`` must be None. Returns the H axes.
    """
    data = _to_numpy(weights, "weights")
    if data.ndim != 3:
        raise ValueError(f"weights must be 3-D (H, T_q, T_k), got shape {data.shape}")
    n_heads = data.shape[0]
    if n_heads == 0:
        raise ValueError(f"weights must hold at least one head: shape (H, T_q, T_k) with "
                         f"H >= 1, got shape {data.shape}")
    _check_labels(head_names, n_heads, "head_names")
    _check_labels(x_labels, data.shape[2], "x_labels")
    _check_labels(y_labels, data.shape[1], "y_labels")
    _check_flag(annotate, "annotate", none_ok=True)
    _check_heads_layout(n_heads, axes, ncols, max_width)
    if annotate is None:  # as plot_attention decides: values on small maps
        annotate = data[0].size <= 64
    if axes is None:
        axes = _heads_grid(data.shape, annotate, ncols, max_width)
    if len(axes) != n_heads:
        raise ValueError(f"axes must have {n_heads} entries (one per head), got {len(axes)}")
    for h, ax in enumerate(axes):
        name = head_names[h] if head_names is not None else f"head {h}"
        _draw_attention(ax, data[h], x_labels, y_labels, name, annotate, ("viridis", 0.0, 1.0))
    _untangle_ticks(*axes)  # one draw for all the heads
    return list(axes)


# ----------------------------------------------------------------------------- bars, blocks


def plot_distribution(
    values: object,
    labels: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    ylabel: str = "weight",
) -> Axes:
    """Bar chart of a 1-D vector (e.g. one row of attention weights, Chapter 1)."""
    data = _to_numpy(values, "values")
    if data.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {data.shape}")
    _check_labels(labels, data.shape[0], "labels")
    _check_ax(ax)
    if ax is None:
        ax = _new_axes(max(4.0, 0.45 * data.shape[0] + 1.5), 2.8)
    ax.bar(range(data.shape[0]), data, color="tab:blue")
    ax.set_xticks(range(data.shape[0]), labels=labels or _numbers(data.shape[0]))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    _fit_text(ax)
    _untangle_ticks(ax)
    return ax


def interactive_plot(draw: Callable[..., object], *,
                     site_values: Mapping[str, Sequence[object]] | None = None,
                     **controls: object):
    """Wrap ``draw(**values)`` in ipywidgets controls; return the widget (every chapter).

    ``controls`` are ipywidgets (sliders, dropdowns, checkboxes). ``draw`` must draw one
    figure through this module's functions; it is re-run on every change. Displayed, the
    widget also gives its figure drawn ahead for a grid of its controls' values
    (:mod:`~course_attn.lab.site_frames`), so that it moves on the static site too;
    ``site_values`` picks the values of some controls for that grid (for instance
    ``site_values={"t_q": [1, 256, 1024]}``), which may hold at most
    :data:`~course_attn.lab.site_frames.MAX_FRAMES` figures.
    """
    import ipywidgets as widgets

    from .site_frames import controls_grid

    if not callable(draw):
        raise TypeError(f"draw must be callable, got {type(draw).__name__}")
    if not controls:
        raise ValueError("interactive_plot needs at least one control (a keyword argument "
                         "such as temperature=FloatSlider(...)), got none")
    for name, control in controls.items():
        if not isinstance(control, widgets.ValueWidget):
            raise TypeError(f"control {name!r} must be an ipywidgets value widget, "
                            f"got {type(control).__name__}")
        if not control.description:
            control.description = name
        # The default label column is narrow and cuts names such as "temperature".
        if hasattr(control, "style") and hasattr(control.style, "description_width"):
            control.style.description_width = "initial"
    grid = controls_grid(controls, site_values)  # refuses a grid too large before drawing

    def _draw(**values: object) -> None:
        draw(**values)
        plt.show()

    widget = _site_interactive()(_draw, **controls)
    widget.site_grid = grid
    widget.site_draw = draw
    return widget


def _figure_svg(figure: Figure) -> str:
    """``figure`` as the SVG a notebook shows (:func:`use_sharp_figures`): images at
    :data:`IMAGE_DPI`, no date, a fixed salt for ids, so the same figure gives the same bytes."""
    buffer = io.StringIO()
    raise_small_text(figure)
    with plt.rc_context({"svg.hashsalt": "course_attn", "svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight", dpi=IMAGE_DPI,
                       metadata={"Date": None})
    return keep_spaces(buffer.getvalue()) or ""


@functools.cache
def _site_interactive() -> type:
    """``ipywidgets.interactive`` whose display also holds the site's figures (HTML)."""
    import ipywidgets as widgets

    from .site_frames import site_html

    class SiteInteractive(widgets.interactive):
        def _repr_mimebundle_(self, **kwargs: object) -> dict:
            bundle = super()._repr_mimebundle_(**kwargs)
            bundle["text/html"] = site_html(self.site_draw, self.site_grid, _figure_svg)
            return bundle

    return SiteInteractive


_BLOCK_COLOURS = ("#f2f2f2", "#9ecae1", "#2171b5")  # skipped, partly masked, full
_BLOCK_NAMES = ("skipped", "computed, partly masked", "computed in full")


def _check_block_sizes(block_q: object, block_k: object) -> None:
    for value, name in ((block_q, "block_q"), (block_k, "block_k")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be a positive int or None, got {value!r}")
        if value is not None and value < 1:
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    if (block_q is None) != (block_k is None):
        raise ValueError("give both block_q and block_k (axes in positions) or neither "
                         "(axes in blocks)")


def plot_blocks(
    grid: object,
    *,
    block_q: int | None = None,
    block_k: int | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    legend: bool = True,
) -> Axes:
    """The block grid of the tiled kernel (Chapter 9), from
    :func:`course_attn.tiled.block_grid`: one cell per (query block, key block),
    light grey = skipped, light blue = computed and partly masked, dark blue =
    computed in full. With ``block_q`` and ``block_k`` the axes count positions
    (cells are ``block_q`` tall and ``block_k`` wide, to scale); without, blocks.
    ``legend=False`` leaves out the legend (e.g. for all but one of several panels).
    """
    data = _to_numpy(grid, "grid")
    if data.ndim != 2:
        raise ValueError(f"grid must be 2-D (query blocks, key blocks), got shape {data.shape}")
    if not np.isin(data, (0.0, 1.0, 2.0)).all():
        raise ValueError("grid must hold only 0 (skipped), 1 (partly masked) or 2 (full)")
    _check_block_sizes(block_q, block_k)
    _check_flag(legend, "legend")
    _check_ax(ax)
    if ax is None:
        ax = _new_axes(4.2, 4.0)
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    n_q, n_k = data.shape
    size_q, size_k = block_q or 1, block_k or 1
    ax.imshow(data, cmap=ListedColormap(_BLOCK_COLOURS), vmin=-0.5, vmax=2.5,
              extent=(0, n_k * size_k, n_q * size_q, 0), interpolation="nearest")
    thin = max(n_q, n_k) > 32
    for row in range(1, n_q):  # white lines between the blocks
        ax.axhline(row * size_q, color="white", linewidth=0.3 if thin else 1.0)
    for col in range(1, n_k):
        ax.axvline(col * size_k, color="white", linewidth=0.3 if thin else 1.0)
    unit = "position" if block_q else "block"
    ax.set_xlabel(f"key {unit}")
    ax.set_ylabel(f"query {unit}")
    if title:
        ax.set_title(title)
    if legend:
        handles = [Patch(facecolor=c, edgecolor="#999999", label=n)
                   for c, n in zip(_BLOCK_COLOURS, _BLOCK_NAMES, strict=True)]
        figure = _figure(ax)
        for ncol in (3, 1):  # in one row where it fits the figure's width, else one column
            key = ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                            ncol=ncol, fontsize=7, borderaxespad=4.5,
                            frameon=False)  # below the axis label, in points
            _fit_text(ax)
            figure.draw_without_rendering()  # sizes the legend's texts
            if key.get_window_extent().width <= figure.bbox.width:
                break
    _fit_text(ax)
    return ax


# ----------------------------------------------------------------------------- curves


def _log_ticks(axis: object, values: np.ndarray, at_values: bool) -> None:
    """Plain labels on a log axis (``0.001``, ``1e-28``: no mathtext, whose exponents are
    drawn small): at the data's own ``values`` when they span too few decades for decade
    ticks, else at the decades; no labels on the minor ticks."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    positive = np.unique(values[np.isfinite(values) & (values > 0)])
    if positive.size == 0:
        return
    lo, hi = math.log10(positive.min()), math.log10(positive.max())
    decades = math.floor(hi + 1e-9) - math.ceil(lo - 1e-9) + 1  # powers of 10 inside
    if at_values and decades < 3 and positive.size <= 12:
        axis.set_major_locator(FixedLocator(positive.tolist()))  # type: ignore[attr-defined]
    elif decades < 2:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # type: ignore[attr-defined]
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # type: ignore[attr-defined]
    axis.set_minor_formatter(NullFormatter())  # type: ignore[attr-defined]


def _untangle_ticks(*axes: Axes) -> None:
    """Turn, then thin, tick labels of ``axes`` that would overlap at the figure's size.

    Measured with the figure's renderer: names (tokens) are turned first, by 45 and
    then 90 degrees on the x-axis, so every token keeps its label; numbers (positions,
    sizes) are thinned first, since the reader can count between them. Thinning keeps
    every 2nd, 3rd ... label (the first always) until no two kept labels come within
    3 px of each other; a crowd that neither fixes is turned by 45 degrees.
    """
    if not axes:
        return
    figure = _figure(axes[0])
    figure.draw_without_rendering()  # places the ticks and sizes their labels
    for ax in axes:
        for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if not _any_overlap(_label_boxes(_shown_ticks(axis))):
                continue
            names = not all(_is_number(label.get_text()) for _, label in _shown_ticks(axis))
            if names and name == "x" and _turned_apart(ax, figure):
                continue
            if not _thinned_apart(axis) and not (names and name == "x"):
                ax.tick_params(axis=name, labelrotation=45)  # type: ignore[arg-type]


def _turned_apart(ax: Axes, figure: Figure) -> bool:
    """Turn ``ax``'s x tick labels by 45, then 90 degrees; whether they then stand apart."""
    for angle in (45, 90):
        if abs(ax.xaxis.get_majorticklabels()[0].get_rotation() % 180) > angle - 1:
            continue  # already turned at least this far
        ax.tick_params(axis="x", labelrotation=angle)
        figure.draw_without_rendering()
        if not _any_overlap(_label_boxes(_shown_ticks(ax.xaxis))):
            return True
    return False


def _thinned_apart(axis: XAxis | YAxis) -> bool:
    """Keep every 2nd, 3rd ... label of ``axis`` until none overlap; whether that worked."""
    from matplotlib.ticker import FixedLocator

    shown = _shown_ticks(axis)
    boxes = _label_boxes(shown)
    for step in range(2, len(shown)):
        if not _any_overlap(boxes[::step]):
            axis.set_major_locator(FixedLocator([loc for loc, _ in shown[::step]]))
            axis.set_ticklabels([label.get_text() for _, label in shown[::step]])
            return True
    return False


def _label_boxes(shown: list[tuple[float, Text]]) -> list[Bbox]:
    return [label.get_window_extent().padded(1.5) for _, label in shown]


def _is_number(text: str) -> bool:
    try:
        float(text.replace("\u2212", "-"))  # matplotlib writes minus as U+2212
    except ValueError:
        return False
    return True


def _shown_ticks(axis: XAxis | YAxis) -> list[tuple[float, Text]]:
    """The major ticks inside the view, with their (non-empty) labels."""
    lo, hi = sorted(axis.get_view_interval())
    slack = 1e-9 * abs(hi - lo)  # a tick on the limit itself is shown
    return [(loc, label) for loc, label in zip(axis.get_majorticklocs(),
                                               axis.get_majorticklabels(), strict=False)
            if label.get_text() and lo - slack <= loc <= hi + slack]


def _any_overlap(boxes: Sequence[Bbox]) -> bool:
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _check_curves(xs: np.ndarray, curves: object) -> dict[str, np.ndarray]:
    if xs.ndim != 1:
        raise ValueError(f"x must be 1-D, got shape {xs.shape}")
    if not isinstance(curves, dict) or not curves:
        raise TypeError(f"curves must be a non-empty dict of label -> values, got {curves!r}")
    series = {}
    for label, values in curves.items():
        ys = _to_numpy(values, f"curves[{label!r}]")
        if ys.shape != xs.shape:
            raise ValueError(f"curves[{label!r}] must have shape {xs.shape}, got {ys.shape}")
        series[str(label)] = ys
    return series


def plot_curves(
    x: object,
    curves: dict[str, object],
    *,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "",
    ylabel: str = "",
    logx: bool = False,
    logy: bool = False,
    xticks: Sequence[float] | None = None,
) -> Axes:
    """Line plot of several named curves over one shared 1-D ``x`` (e.g. a measurement vs d_k).

    ``curves`` maps a legend label to a 1-D series of ``len(x)`` values; a label
    starting with ``"theory"`` is drawn dashed, so measured and predicted curves
    are told apart at a glance (Chapter 4). ``xticks`` puts the x-axis ticks at
    these values, labelled as plain numbers (useful on a log axis spanning less
    than a few decades, e.g. T = 256 ... 2048 in the chapter on efficient attention).
    Log axes are labelled with plain numbers, at the values of ``x`` when it spans
    fewer than three decades (Chapters 2 and 7); tick labels that would overlap are
    thinned, or turned.
    """
    xs = _to_numpy(x, "x")
    series = _check_curves(xs, curves)
    _check_ax(ax)
    _check_flag(logx, "logx")
    _check_flag(logy, "logy")
    ticks = None if xticks is None else _to_numpy(xticks, "xticks")
    if ticks is not None and ticks.ndim != 1:
        raise ValueError(f"xticks must be 1-D, got shape {ticks.shape}")
    if ax is None:
        ax = _new_axes(5.0, 3.2)
    for label, ys in series.items():
        ax.plot(xs, ys, "--" if label.startswith("theory") else "-o", label=label, markersize=3)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    if logx:
        _log_ticks(ax.xaxis, xs, at_values=True)
    if logy:
        _log_ticks(ax.yaxis, np.concatenate(list(series.values())), at_values=False)
    if ticks is not None:
        from matplotlib.ticker import NullFormatter

        ax.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    if title:
        ax.set_title(title)
    _fit_text(ax)
    _untangle_ticks(ax)
    return ax


# ----------------------------------------------------------------------------- training

_RESULT_FIELDS = ("train_losses", "learning_rates", "eval_iters", "eval_train_losses",
                  "eval_val_losses")


def _training_series(result: object) -> dict[str, np.ndarray]:
    """The lists of a TrainResult as arrays, checked against each other."""
    missing = [name for name in _RESULT_FIELDS if not hasattr(result, name)]
    if missing:
        raise TypeError(f"result must be a TrainResult (with {', '.join(_RESULT_FIELDS)}), got "
                        f"{type(result).__name__} without {', '.join(missing)}")
    series = {name: _to_numpy(getattr(result, name), f"result.{name}") for name in _RESULT_FIELDS}
    losses, at = series["train_losses"], series["eval_iters"]
    if losses.ndim != 1 or losses.size == 0:
        raise ValueError(f"result.train_losses must be a non-empty list, one loss per "
                         f"iteration, got shape {losses.shape}")
    if series["learning_rates"].shape != losses.shape:
        raise ValueError(f"result.learning_rates must have one entry per iteration "
                         f"({losses.size}), got shape {series['learning_rates'].shape}")
    for split in ("train", "val"):
        if series[f"eval_{split}_losses"].shape != at.shape:
            raise ValueError(f"result.eval_{split}_losses must have one entry per evaluation "
                             f"({at.size}), got shape {series[f'eval_{split}_losses'].shape}")
    return series


def _training_axes(axes: object, smooth: object, floor: object) -> list[Axes]:
    """The two axes to draw on (new ones, 7 x 5.6 inches, when ``axes`` is None)."""
    if isinstance(smooth, bool) or not isinstance(smooth, int | np.integer) or smooth < 1:
        raise ValueError(f"smooth must be a positive int (iterations), got {smooth!r}")
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int | float)
                              or not np.isfinite(floor)):
        raise TypeError(f"floor must be a finite number or None, got {floor!r}")
    if axes is None:
        _, grid = plt.subplots(2, 1, figsize=(COLUMN_WIDTH, 5.6), sharex=True,
                               gridspec_kw={"height_ratios": [5, 2]})
        return list(grid)
    if not hasattr(axes, "__len__") or isinstance(axes, Axes) or len(axes) != 2:
        raise TypeError("axes must be a sequence of 2 matplotlib Axes (loss, learning rate) "
                        "or None")
    for ax in cast(Sequence[object], axes):
        _check_ax(ax, "axes")
    return list(cast(Sequence[Axes], axes))


def plot_training(
    result: object,
    *,
    axes: Sequence[Axes] | None = None,
    smooth: int = 50,
    floor: float | None = None,
    title: str | None = None,
) -> list[Axes]:
    """A training run, iteration by iteration (chapter 11): the loss above, the learning rate below.

    ``result`` is a :class:`~course_attn.train.TrainResult` (or anything with its
    lists ``train_losses`` and ``learning_rates``, one entry per iteration, and
    ``eval_iters``, ``eval_train_losses``, ``eval_val_losses``). The upper panel
    draws every iteration's batch loss (faint), its mean over the last ``smooth``
    iterations, and the evaluations of both splits (markers); ``floor``, if
    given, is drawn dashed as the best possible loss. The lower panel draws the
    learning rate of every iteration. Iterations count from 1, as
    ``eval_iters`` do. Without ``axes`` a new 7 x 5.6 inch figure is made.
    Returns ``[loss_axes, lr_axes]``.
    """
    series = _training_series(result)
    loss_ax, lr_ax = _training_axes(axes, smooth, floor)
    losses, at = series["train_losses"], series["eval_iters"]
    its = np.arange(1, losses.size + 1)
    window = min(int(smooth), losses.size)
    loss_ax.plot(its, losses, color="tab:blue", alpha=0.25, linewidth=0.7,
                 label="batch loss, every iteration")
    mean = np.convolve(losses, np.ones(window) / window, mode="valid")  # trailing means
    loss_ax.plot(its[window - 1:], mean, color="tab:blue",
                 label=f"mean of the last {window} iterations")
    loss_ax.plot(at, series["eval_train_losses"], "o-", color="tab:orange", markersize=4,
                 label="evaluation: training split")
    loss_ax.plot(at, series["eval_val_losses"], "s-", color="tab:green", markersize=4,
                 label="evaluation: validation split")
    if floor is not None:
        loss_ax.axhline(floor, color="black", linestyle="--", linewidth=1,
                        label="theory: floor")
    loss_ax.set_ylabel("loss (nats)")
    loss_ax.legend()
    if title:
        loss_ax.set_title(title)
    lr_ax.plot(its, series["learning_rates"], color="tab:red")
    lr_ax.set_xlabel("iteration")
    lr_ax.set_ylabel("learning rate")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    _fit_text(loss_ax, lr_ax)
    return [loss_ax, lr_ax]


def _named_curves(xs: np.ndarray, curves: object, name: str) -> dict[str, np.ndarray]:
    """``curves`` checked as :func:`_check_curves` does, its errors naming the argument."""
    if not isinstance(curves, dict) or not curves:
        raise TypeError(f"{name} must be a non-empty dict of label -> values, got {curves!r}")
    series = {}
    for label, values in curves.items():
        ys = _to_numpy(values, f"{name}[{label!r}]")
        if ys.shape != xs.shape:
            raise ValueError(f"{name}[{label!r}] must have one value per iteration, shape "
                             f"{xs.shape}, got {ys.shape}")
        series[str(label)] = ys
    return series


def plot_training_and_scores(
    iterations: object,
    losses: dict[str, object],
    scores: dict[str, object],
    *,
    floor: float | None = None,
    axes: Sequence[Axes] | None = None,
    title: str | None = None,
    score_label: str = "head score",
) -> list[Axes]:
    """Losses above, head scores below, on one shared axis of iterations (chapter 11).

    ``losses`` and ``scores`` map a legend label to a 1-D series with one value per entry of
    ``iterations`` (the evaluations of a run, e.g. a
    :class:`~course_attn.lab.analysis.HeadScoreTracker`'s), so that the moment a head forms
    lines up with what the loss does then. ``floor``, if given, is drawn dashed in the upper
    panel as the best possible loss; the lower panel runs from 0 to 1 (a score is a share of
    attention weight). Without ``axes`` a new 7 x 5.6 inch figure is made.
    Returns ``[loss_axes, score_axes]``.
    """
    xs = _to_numpy(iterations, "iterations")
    if xs.ndim != 1 or xs.size == 0:
        raise ValueError(f"iterations must be a non-empty 1-D series, got shape {xs.shape}")
    upper, lower = (_named_curves(xs, curves, name)
                    for curves, name in ((losses, "losses"), (scores, "scores")))
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int | float)
                              or not np.isfinite(floor)):
        raise TypeError(f"floor must be a finite number or None, got {floor!r}")
    if axes is None:
        _, grid = plt.subplots(2, 1, figsize=(COLUMN_WIDTH, 5.6), sharex=True,
                               gridspec_kw={"height_ratios": [3, 2]})
        axes = list(grid)
    if not hasattr(axes, "__len__") or isinstance(axes, Axes) or len(axes) != 2:
        raise TypeError("axes must be a sequence of 2 matplotlib Axes (losses, scores) or None")
    for ax in axes:
        _check_ax(ax, "axes")
    loss_ax, score_ax = axes
    for label, ys in upper.items():
        loss_ax.plot(xs, ys, "-o", markersize=3, label=label)
    if floor is not None:
        loss_ax.axhline(floor, color="black", linestyle="--", linewidth=1,
                        label="theory: floor")
    loss_ax.set_ylabel("loss (nats)")
    loss_ax.legend()
    if title:
        loss_ax.set_title(title)
    for label, ys in lower.items():
        score_ax.plot(xs, ys, "-o", markersize=3, label=label)
    score_ax.set_ylim(0, 1.05)
    score_ax.set_xlabel("iteration")
    score_ax.set_ylabel(score_label)
    score_ax.legend()
    _fit_text(loss_ax, score_ax)
    return [loss_ax, score_ax]


def _numbers(n: int) -> list[str]:
    """Tick labels ``"0" .. "n-1"``, for axes whose caller gave no names."""
    return [str(i) for i in range(n)]
