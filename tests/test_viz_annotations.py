"""Numbers written on heatmap cells (viz.plot_attention, plot_heads, plot_mask; every chapter
with a heatmap): black or white by the luminance of the cell's colour, readable size."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib import colormaps  # noqa: E402

from course_attn import viz  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _luminance(rgb) -> float:
    """WCAG 2 relative luminance of an sRGB colour."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _cell_texts(ax) -> dict[tuple[int, int], object]:
    return {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}


def test_a_dark_cell_above_the_mean_gets_white_text():
    """viridis at 0.3 (of 0..1) is a dark blue; the old rule ("above the mean: black")
    wrote black on it because the other cells are smaller."""
    weights = torch.tensor([[0.05, 0.10], [0.10, 0.30]])
    ax = viz.plot_attention(weights, vmax=1.0, annotate=True)
    assert _luminance(colormaps["viridis"](0.3)) < 0.179  # dark: white contrasts more
    cells = _cell_texts(ax)
    assert cells[(1, 1)].get_text() == "0.30" and cells[(1, 1)].get_color() == "white"


def test_a_bright_cell_below_the_mean_gets_black_text():
    """viridis at 0.9 is a light yellow-green; the old rule wrote white on it."""
    weights = torch.tensor([[0.90, 0.95], [0.95, 1.00]])
    ax = viz.plot_attention(weights, vmax=1.0, annotate=True)
    assert _luminance(colormaps["viridis"](0.9)) > 0.179
    assert _cell_texts(ax)[(0, 0)].get_color() == "black"


@pytest.mark.parametrize("cmap", ["viridis", "magma", "RdBu_r", "Blues"])
def test_every_cell_gets_the_text_colour_with_the_larger_contrast(cmap):
    values = np.linspace(-1, 1, 16).reshape(4, 4)
    ax = viz.plot_attention(values, cmap=cmap, vmin=-1, vmax=1, annotate=True)
    image = ax.images[0]
    for (i, j), text in _cell_texts(ax).items():
        lum = _luminance(image.cmap(image.norm(values[i, j])))
        black, white = (lum + 0.05) / 0.05, 1.05 / (lum + 0.05)
        assert text.get_color() == ("black" if black >= white else "white"), (i, j, lum)
        assert max(black, white) >= 4.5  # WCAG AA for normal text, always reachable


def test_mask_cells_follow_the_same_rule():
    ax = viz.plot_mask(torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    cells = _cell_texts(ax)
    assert cells[(0, 0)].get_text() == "1" and cells[(0, 0)].get_color() == "white"  # dark
    assert cells[(0, 2)].get_text() == "0" and cells[(0, 2)].get_color() == "black"  # light


def test_a_mask_says_what_1_means_readably_on_a_phone():
    """Issue 35: chapter 5's mask panels showed 1s and 0s and never said which was which.
    The key axis says it (the course's convention: True = may attend), in text a 400 px
    phone shows at 9 px or more, inside the figure, also in chapter 5's two side-by-side
    panels of 3 queries by 6 keys; a mask too large to number says what dark means; a title
    that already says it is not repeated."""
    causal = torch.tril(torch.ones(3, 6, dtype=torch.bool), diagonal=3)
    fig, axes = plt.subplots(1, 2, figsize=(7, 2.6))  # chapter 5, section 5.3
    for ax, title in zip(axes, ("causal_mask(3, 6):\nbottom-right", "top-left"), strict=True):
        viz.plot_mask(causal, [f"k{j}" for j in range(6)],
                      [f"q{i} (pos {i + 3})" for i in range(3)], ax=ax, title=title)
        assert ax.get_xlabel() == "key (1 = may attend)"
        cells = _cell_texts(ax)
        assert cells[(0, 0)].get_text() == "1" and causal[0, 0]  # 1 is True: may attend
        assert cells[(0, 5)].get_text() == "0" and not causal[0, 5]
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    smallest = viz.readable_font_size(fig.get_size_inches()[0])
    boxes = [ax.xaxis.label.get_window_extent(renderer) for ax in axes]
    for ax, box in zip(axes, boxes, strict=True):
        assert ax.xaxis.label.get_fontsize() >= smallest
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0
    assert not boxes[0].overlaps(boxes[1])

    big = viz.plot_mask(torch.tril(torch.ones(20, 20, dtype=torch.bool)))  # 400 cells
    assert not big.texts and big.get_xlabel() == "key (dark = may attend)"
    image = big.images[0]
    dark, light = image.cmap(image.norm(1.0)), image.cmap(image.norm(0.0))
    assert _luminance(dark) < _luminance(light)  # True is the dark colour
    said = viz.plot_mask(causal, title="Sliding window, W = 3 (1 = may attend)")
    assert said.get_xlabel() == "key"  # chapter 10's title already says it


def test_heads_annotations_use_luminance_and_a_readable_size():
    weights = torch.tensor([[[0.05, 0.30], [0.10, 0.95]]])
    (ax,) = viz.plot_heads(weights, annotate=True)
    cells = _cell_texts(ax)
    assert cells[(0, 1)].get_color() == "white" and cells[(1, 1)].get_color() == "black"
    smallest = viz.readable_font_size(ax.figure.get_size_inches()[0])
    assert all(t.get_fontsize() >= smallest for t in cells.values())


def test_values_lose_their_leading_zero_only_where_cells_are_narrow():
    weights = torch.full((8, 8), 0.125)
    wide = viz.plot_attention(weights, annotate=True)  # its own figure: wide cells
    assert {t.get_text() for t in wide.texts} == {"0.12"}
    fig, narrow = plt.subplots(figsize=(2.4, 2.4))  # 8 columns in about 1.5 inches
    viz.plot_attention(weights, annotate=True, ax=narrow)
    assert {t.get_text() for t in narrow.texts} == {".12"}
