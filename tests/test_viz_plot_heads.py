"""viz.plot_heads laid out in rows (Chapters 6 and 8): ncols wraps the heads."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_attn import viz  # noqa: E402


def _weights(n_heads: int, t: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n_heads)
    return torch.softmax(torch.randn(n_heads, t, t, generator=gen), dim=-1)  # (H, T, T)


def _grid_position(ax) -> tuple[int, int]:
    spec = ax.get_subplotspec().get_topmost_subplotspec()  # the colour bar nests it
    return spec.rowspan.start, spec.colspan.start


def test_default_layout_is_one_row():
    axes = viz.plot_heads(_weights(4))
    assert [_grid_position(ax) for ax in axes] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert len(axes[0].figure.axes) == 4 + 4  # four heatmaps and their colour bars
    plt.close(axes[0].figure)


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
    width, height = fig.get_size_inches()
    one_width, one_height = viz.plot_heads(weights[:1])[0].figure.get_size_inches()
    assert width == pytest.approx(cols * one_width)
    assert height == pytest.approx(rows * one_height)
    plt.close("all")


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
    plt.close(fig)


def test_max_width_caps_the_figure_and_keeps_the_height():
    weights = _weights(4, t=8)
    wide = viz.plot_heads(weights, ncols=2)[0].figure.get_size_inches()
    capped = viz.plot_heads(weights, ncols=2, max_width=7)[0].figure.get_size_inches()
    assert wide[0] > 7 and capped[0] == pytest.approx(7.0)
    assert capped[1] == pytest.approx(wide[1])
    roomy = viz.plot_heads(weights, ncols=2, max_width=50)[0].figure.get_size_inches()
    assert roomy[0] == pytest.approx(wide[0])  # a cap above the natural width changes nothing
    plt.close("all")


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
    plt.close(fig)
