"""viz.plot_heads laid out in rows (Chapters 6, 8, 10 and 11): as many heads per row as stay
readable in the 700 px column, ``ncols`` to choose, and a clear error for no heads."""

from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_attn import viz  # noqa: E402

SENTENCE = ["the", "cat", "sat", "on", "the", "mat", "and", "slept"]


def _weights(n_heads: int, t: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n_heads)
    return torch.softmax(torch.randn(n_heads, t, t, generator=gen), dim=-1)  # (H, T, T)


def _grid_position(ax) -> tuple[int, int]:
    spec = ax.get_subplotspec().get_topmost_subplotspec()  # the colour bar nests it
    return spec.rowspan.start, spec.colspan.start


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_default_layout_fits_the_column_two_eight_token_heads_per_row():
    axes = viz.plot_heads(_weights(4, t=8), SENTENCE, SENTENCE)
    assert [_grid_position(ax) for ax in axes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(axes[0].figure.axes) == 4 + 4  # four heatmaps and their colour bars
    assert axes[0].figure.get_size_inches()[0] <= viz.COLUMN_WIDTH


def test_values_written_on_the_cells_take_one_head_per_row_and_fit_their_cells():
    axes = viz.plot_heads(_weights(4, t=8), SENTENCE, SENTENCE, annotate=True)
    assert [_grid_position(ax) for ax in axes] == [(h, 0) for h in range(4)]
    fig = axes[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        values = [t for t in ax.texts if t.get_text()]
        assert len(values) == 64
        cell = ax.get_window_extent(renderer).width / 8  # pixels per cell
        assert all(t.get_window_extent(renderer).width < cell for t in values)
        assert all(t.get_fontsize() >= viz.readable_font_size(fig.get_size_inches()[0])
                   for t in values)


def test_a_long_sequence_thins_its_tick_labels_instead_of_overlapping_them():
    chars = list("return self._qsize()")
    axes = viz.plot_heads(_weights(4, t=len(chars)), chars, chars)
    fig = axes[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            boxes = [t.get_window_extent(renderer) for t in labels if t.get_text()]
            assert len(boxes) >= len(chars) // 3  # thinned, not emptied
            assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


@pytest.mark.parametrize("n_heads, ncols, rows", [(4, 2, 2), (5, 2, 3), (3, 5, 1), (6, 3, 2)])
def test_ncols_wraps_heads_row_by_row(n_heads, ncols, rows):
    weights = _weights(n_heads)
    axes = viz.plot_heads(weights, ncols=ncols)
    cols = min(n_heads, ncols)
    assert [_grid_position(ax) for ax in axes] == [divmod(h, cols) for h in range(n_heads)]
    assert [ax.get_title() for ax in axes] == [f"head {h}" for h in range(n_heads)]
    for h, ax in enumerate(axes):  # head h shows its own weights
        np.testing.assert_allclose(ax.images[0].get_array().data, weights[h].double().numpy())
    fig = axes[0].figure
    assert len(fig.axes) == 2 * n_heads  # spare cells of the last row were removed
    assert fig.get_size_inches()[0] <= viz.COLUMN_WIDTH + 1e-9  # the column's width at most
    assert len({round(ax.get_position().width, 6) for ax in axes}) == 1  # equal panels


def test_max_width_caps_the_figure_and_defaults_to_the_column():
    weights = _weights(4, t=8)
    default = viz.plot_heads(weights, ncols=2)[0].figure.get_size_inches()
    capped = viz.plot_heads(weights, ncols=2, max_width=5)[0].figure.get_size_inches()
    roomy = viz.plot_heads(weights, ncols=2, max_width=50)[0].figure.get_size_inches()
    assert default[0] == pytest.approx(viz.COLUMN_WIDTH) and capped[0] == pytest.approx(5.0)
    assert roomy[0] > viz.COLUMN_WIDTH  # a wider cap lets the panels take their own width


def test_no_heads_is_a_value_error_naming_weights():
    with pytest.raises(ValueError, match=r"^weights must hold at least one head.*"
                                         r"got shape \(0, 3, 3\)"):
        viz.plot_heads(torch.zeros(0, 3, 3))


@pytest.mark.parametrize(
    "ncols, error, phrase",
    [
        (0, ValueError, "ncols must be a positive int"),
        (-1, ValueError, "ncols must be a positive int"),
        (2.0, TypeError, "ncols must be a positive int or None, got float"),
        (True, TypeError, "ncols must be a positive int or None, got bool"),
    ],
)
def test_bad_ncols(ncols, error, phrase):
    with pytest.raises(error, match=phrase):
        viz.plot_heads(_weights(2), ncols=ncols)


def test_ncols_and_axes_together_are_refused():
    fig, grid = plt.subplots(1, 2)
    with pytest.raises(ValueError, match="ncols or axes, not both"):
        viz.plot_heads(_weights(2), axes=list(grid), ncols=2)


@pytest.mark.parametrize(
    "max_width, error, phrase",
    [(0, ValueError, "max_width must be a positive"), (-3.0, ValueError, "positive"),
     ("7", TypeError, "got str"), (True, TypeError, "got bool")],
)
def test_bad_max_width(max_width, error, phrase):
    with pytest.raises(error, match=phrase):
        viz.plot_heads(_weights(2), max_width=max_width)


def test_max_width_and_axes_together_are_refused():
    fig, grid = plt.subplots(1, 2)
    with pytest.raises(ValueError, match="max_width or axes, not both"):
        viz.plot_heads(_weights(2), axes=list(grid), max_width=7)


def test_annotate_none_decides_before_the_layout_as_plot_attention_would():
    small = viz.plot_heads(_weights(2, t=8), annotate=None)  # 64 cells: values written
    assert [_grid_position(ax) for ax in small] == [(0, 0), (1, 0)]
    assert all(len(ax.texts) == 64 for ax in small)
    large = viz.plot_heads(_weights(2, t=9), annotate=None)  # 81 cells: none
    assert [_grid_position(ax) for ax in large] == [(0, 0), (0, 1)]
    assert all(not ax.texts for ax in large)
