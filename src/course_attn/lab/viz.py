"""Plotting helpers: every attention pattern in the course is drawn through here.

Each function draws on a given ``matplotlib`` Axes (or a new one) and returns
it, so notebooks stay short and tests can inspect what was drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes

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
]

#: The narrowest screen the site is read on, in CSS pixels (a phone held upright).
PHONE_WIDTH_PX = 400
#: The smallest text a figure may show on that screen, in CSS pixels.
MIN_TEXT_PX = 9.0


def readable_font_size(width: float) -> float:
    """The smallest font size, in points, that stays readable on a phone (every chapter).

    A figure ``width`` inches wide is shown at its own size (1 pt = 4/3 CSS px) where it
    fits, and scaled down to the :data:`PHONE_WIDTH_PX` of a phone where it does not; text
    must then still be :data:`MIN_TEXT_PX` tall. For a figure sized for the site's 700 px
    column (7 in, 504 pt) that is ``9 * 504 / 400 = 11.34`` pt.
    """
    if isinstance(width, bool) or not isinstance(width, int | float):
        raise TypeError(f"width must be a positive number of inches, got "
                        f"{type(width).__name__} {width!r}")
    if not width > 0 or width == float("inf"):
        raise ValueError(f"width must be a positive number of inches, got {width!r}")
    shown = min(1.0, PHONE_WIDTH_PX / (width * 96))  # 96 CSS px per inch
    return MIN_TEXT_PX / (4 / 3 * shown)


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
    """Heatmap of a ``(T_q, T_k)`` matrix: row ``i`` is query ``i`` over every key.

    ``x_labels`` name the keys (columns), ``y_labels`` the queries (rows).
    Cells are annotated with their values when the matrix is small (or when
    ``annotate=True``). Set ``vmin=None`` for signed scores.
    """
    data = _to_numpy(weights, "weights")
    if data.ndim != 2:
        raise ValueError(f"weights must be 2-D (T_q, T_k), got shape {data.shape}")
    _check_labels(x_labels, data.shape[1], "x_labels")
    _check_labels(y_labels, data.shape[0], "y_labels")
    _check_ax(ax)
    _check_flag(annotate, "annotate", none_ok=True)
    if ax is None:
        size = (1.2 + 0.55 * data.shape[1], 1.0 + 0.5 * data.shape[0])
        _, ax = plt.subplots(figsize=(max(3.0, size[0]), max(2.5, size[1])))
    image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(data.shape[1]), labels=x_labels or _numbers(data.shape[1]))
    ax.set_yticks(range(data.shape[0]), labels=y_labels or _numbers(data.shape[0]))
    if x_labels is not None and max((len(str(s)) for s in x_labels), default=0) > 3:
        ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    if annotate if annotate is not None else data.size <= 64:
        middle = np.nanmean(data) if data.size else 0.0
        for (i, j), value in np.ndenumerate(data):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if value > middle else "white")
    return ax


def plot_distribution(
    values: object,
    labels: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    ylabel: str = "weight",
) -> Axes:
    """Bar chart of a 1-D vector (e.g. one row of attention weights)."""
    data = _to_numpy(values, "values")
    if data.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {data.shape}")
    _check_labels(labels, data.shape[0], "labels")
    _check_ax(ax)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 0.45 * data.shape[0] + 1.5), 2.8))
    ax.bar(range(data.shape[0]), data, color="tab:blue")
    ax.set_xticks(range(data.shape[0]), labels=labels or _numbers(data.shape[0]))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


def interactive_plot(draw: Callable[..., object], **controls: object):
    """Wrap ``draw(**values)`` in ipywidgets controls; return the widget.

    ``controls`` are ipywidgets (sliders, dropdowns). ``draw`` must draw one
    figure through this module's functions; it is re-run on every change.
    The returned ``ipywidgets.interactive`` keeps its last figure in its saved
    state, so the static site shows it too.
    """
    import ipywidgets as widgets

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

    def _draw(**values: object) -> None:
        draw(**values)
        plt.show()

    return widgets.interactive(_draw, **controls)


_BLOCK_COLOURS = ("#f2f2f2", "#9ecae1", "#2171b5")  # skipped, partly masked, full
_BLOCK_NAMES = ("skipped", "computed, partly masked", "computed in full")


def plot_blocks(
    grid: object,
    *,
    block_q: int | None = None,
    block_k: int | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    legend: bool = True,
) -> Axes:
    """The block grid of the tiled kernel (efficient attention), from
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
    for value, name in ((block_q, "block_q"), (block_k, "block_k")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be a positive int or None, got {value!r}")
        if value is not None and value < 1:
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    if (block_q is None) != (block_k is None):
        raise ValueError("give both block_q and block_k (axes in positions) or neither "
                         "(axes in blocks)")
    _check_flag(legend, "legend")
    _check_ax(ax)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 4.0))
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
    if legend:
        ax.legend(handles=[Patch(facecolor=c, edgecolor="#999999", label=n)
                           for c, n in zip(_BLOCK_COLOURS, _BLOCK_NAMES, strict=True)],
                  loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=7,
                  borderaxespad=4.5, frameon=False)  # below the axis label, in points
    if title:
        ax.set_title(title)
    return ax


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
    """
    xs = _to_numpy(x, "x")
    if xs.ndim != 1:
        raise ValueError(f"x must be 1-D, got shape {xs.shape}")
    if not isinstance(curves, dict) or not curves:
        raise TypeError(f"curves must be a non-empty dict of label -> values, got {curves!r}")
    _check_ax(ax)
    _check_flag(logx, "logx")
    _check_flag(logy, "logy")
    if ax is None:
        _, ax = plt.subplots(figsize=(5.0, 3.2))
    for label, values in curves.items():
        ys = _to_numpy(values, f"curves[{label!r}]")
        if ys.shape != xs.shape:
            raise ValueError(f"curves[{label!r}] must have shape {xs.shape}, got {ys.shape}")
        style = "--" if str(label).startswith("theory") else "-o"
        ax.plot(xs, ys, style, label=str(label), markersize=3)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    if xticks is not None:
        ticks = _to_numpy(xticks, "xticks")
        if ticks.ndim != 1:
            raise ValueError(f"xticks must be 1-D, got shape {ticks.shape}")
        from matplotlib.ticker import NullFormatter

        ax.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax


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
    ``eval_iters`` do. Without ``axes`` a new 7 x 5 inch figure is made.
    Returns ``[loss_axes, lr_axes]``.
    """
    names = ("train_losses", "learning_rates", "eval_iters", "eval_train_losses",
             "eval_val_losses")
    missing = [name for name in names if not hasattr(result, name)]
    if missing:
        raise TypeError(f"result must be a TrainResult (with {', '.join(names)}), got "
                        f"{type(result).__name__} without {', '.join(missing)}")
    series = {name: _to_numpy(getattr(result, name), f"result.{name}") for name in names}
    losses, rates, at = series["train_losses"], series["learning_rates"], series["eval_iters"]
    evals = {split: series[f"eval_{split}_losses"] for split in ("train", "val")}
    if losses.ndim != 1 or losses.size == 0:
        raise ValueError(f"result.train_losses must be a non-empty list, one loss per "
                         f"iteration, got shape {losses.shape}")
    if rates.shape != losses.shape:
        raise ValueError(f"result.learning_rates must have one entry per iteration "
                         f"({losses.size}), got shape {rates.shape}")
    for split, values in evals.items():
        if values.shape != at.shape:
            raise ValueError(f"result.eval_{split}_losses must have one entry per evaluation "
                             f"({at.size}), got shape {values.shape}")
    if isinstance(smooth, bool) or not isinstance(smooth, int | np.integer) or smooth < 1:
        raise ValueError(f"smooth must be a positive int (iterations), got {smooth!r}")
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int | float)
                              or not np.isfinite(floor)):
        raise TypeError(f"floor must be a finite number or None, got {floor!r}")
    if axes is None:
        fig, grid = plt.subplots(2, 1, figsize=(7.0, 5.0), sharex=True,
                                 gridspec_kw={"height_ratios": [2, 1]})
        axes = list(grid)
    elif not hasattr(axes, "__len__") or isinstance(axes, Axes) or len(axes) != 2:
        raise TypeError("axes must be a sequence of 2 matplotlib Axes (loss, learning rate) "
                        "or None")
    for ax in axes:
        _check_ax(ax, "axes")
    loss_ax, lr_ax = axes
    its = np.arange(1, losses.size + 1)
    window = min(smooth, losses.size)
    loss_ax.plot(its, losses, color="tab:blue", alpha=0.25, linewidth=0.7,
                 label="batch loss, every iteration")
    mean = np.convolve(losses, np.ones(window) / window, mode="valid")  # trailing means
    loss_ax.plot(its[window - 1:], mean, color="tab:blue",
                 label=f"mean of the last {window} iterations")
    loss_ax.plot(at, evals["train"], "o-", color="tab:orange", markersize=4,
                 label="evaluation: training split")
    loss_ax.plot(at, evals["val"], "s-", color="tab:green", markersize=4,
                 label="evaluation: validation split")
    if floor is not None:
        loss_ax.axhline(floor, color="black", linestyle="--", linewidth=1,
                        label="theory: floor")
    loss_ax.set_ylabel("loss (nats)")
    loss_ax.legend(fontsize=8)
    if title:
        loss_ax.set_title(title)
    lr_ax.plot(its, rates, color="tab:red")
    lr_ax.set_xlabel("iteration")
    lr_ax.set_ylabel("learning rate")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    return [loss_ax, lr_ax]


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
    convention; rows are queries, columns keys.
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
        _, ax = plt.subplots(figsize=(max(2.5, 0.9 + 0.45 * data.shape[1]),
                                      max(2.2, 0.9 + 0.4 * data.shape[0])))
    ax.imshow(data, cmap="Blues", vmin=-0.25, vmax=1.0, aspect="auto")
    ax.set_xticks(range(data.shape[1]), labels=x_labels or _numbers(data.shape[1]))
    ax.set_yticks(range(data.shape[0]), labels=y_labels or _numbers(data.shape[0]))
    if x_labels is not None and max((len(str(s)) for s in x_labels), default=0) > 3:
        ax.tick_params(axis="x", labelrotation=45)
    if data.size <= 256:
        for (i, j), value in np.ndenumerate(data):
            ax.text(j, i, str(int(value)), ha="center", va="center", fontsize=8,
                    color="white" if value else "black")
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    return ax


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

    All heads share the colour scale 0..1 so they can be compared. Without
    ``axes`` the heads are laid out ``ncols`` per row (default: all in one
    row), wrapping into as many rows as needed; unused cells of the last row
    are hidden. ``ncols=2`` keeps each heatmap readable in a 700 px column.
    ``max_width`` (inches) caps the figure's width, narrowing every column
    (e.g. ``max_width=7`` for the course's 700 px column); the height stays.
    With ``axes`` given, ``ncols`` and ``max_width`` must be None.
    """
    data = _to_numpy(weights, "weights")
    if data.ndim != 3:
        raise ValueError(f"weights must be 3-D (H, T_q, T_k), got shape {data.shape}")
    n_heads = data.shape[0]
    _check_labels(head_names, n_heads, "head_names")
    _check_labels(x_labels, data.shape[2], "x_labels")
    _check_labels(y_labels, data.shape[1], "y_labels")
    _check_flag(annotate, "annotate", none_ok=True)
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
        for ax in axes:
            _check_ax(ax, "axes")
    if axes is None:
        cols = min(n_heads, ncols or n_heads)
        rows = -(-n_heads // cols)  # ceil(H / ncols)
        width = max(3.0, 1.2 + 0.45 * data.shape[2])
        if max_width is not None:
            width = min(width, max_width / cols)
        height = max(2.5, 1.0 + 0.45 * data.shape[1])
        fig, grid = plt.subplots(rows, cols, figsize=(width * cols, height * rows),
                                 squeeze=False)
        cells = list(grid.flat)  # row by row
        for spare in cells[n_heads:]:
            fig.delaxes(spare)
        axes = cells[:n_heads]
    if len(axes) != n_heads:
        raise ValueError(f"axes must have {n_heads} entries (one per head), got {len(axes)}")
    for h, ax in enumerate(axes):
        name = head_names[h] if head_names is not None else f"head {h}"
        plot_attention(data[h], x_labels, y_labels, ax=ax, title=name, annotate=annotate,
                       vmax=1.0)
    return list(axes)


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
    so large matrices stay readable.
    """
    data = _to_numpy(matrix, "matrix")
    if data.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {data.shape}")
    _check_ax(ax)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 4.0))
    image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                      interpolation="nearest")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


def _numbers(n: int) -> list[str]:
    """Tick labels ``"0" .. "n-1"``, for axes whose caller gave no names."""
    return [str(i) for i in range(n)]
