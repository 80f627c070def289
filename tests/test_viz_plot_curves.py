"""viz.plot_curves (Chapter 4's measured-vs-theory plots)."""

from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_attn import viz  # noqa: E402


def test_plot_curves_draws_one_line_per_curve_with_theory_dashed():
    x = np.array([1, 4, 16, 64])
    ax = viz.plot_curves(x, {"measured": x * 1.1, "theory: d_k": x}, logx=True, logy=True,
                         xlabel="d_k", ylabel="variance", title="t")
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["measured", "theory: d_k"]
    assert lines[0].get_linestyle() == "-" and lines[1].get_linestyle() == "--"
    np.testing.assert_allclose(lines[0].get_ydata(), x * 1.1)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "d_k" and ax.get_title() == "t"


def test_plot_curves_puts_plain_ticks_where_asked():
    x = np.array([256, 512, 1024, 2048])
    ax = viz.plot_curves(x, {"m": x**2}, logx=True, logy=True, xticks=x)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["256", "512", "1024", "2048"]
    assert all(t.get_text() == "" for t in ax.xaxis.get_minorticklabels())
    with pytest.raises(ValueError, match="xticks must be 1-D"):
        viz.plot_curves(x, {"m": x}, xticks=np.ones((2, 2)))


@pytest.mark.parametrize(
    "x, curves, error, phrase",
    [
        (np.ones((2, 2)), {"a": np.ones(2)}, ValueError, r"x must be 1-D"),
        (np.ones(3), {}, TypeError, r"curves must be a non-empty dict"),
        (np.ones(3), {"a": np.ones(4)}, ValueError, r"curves\['a'\] must have shape \(3,\)"),
        (np.ones(3), {"a": ["x", "y", "z"]}, TypeError, r"curves\['a'\] must be a tensor"),
    ],
)
def test_plot_curves_bad_inputs(x, curves, error, phrase):
    with pytest.raises(error, match=phrase):
        viz.plot_curves(x, curves)


def _tick_boxes(ax):
    """The drawn tick labels of both axes (major and minor), measured by the renderer."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = {}
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        labels = [t for t in axis.get_majorticklabels() + axis.get_minorticklabels()
                  if t.get_visible() and t.get_text()]
        lo, hi = sorted(ax.get_window_extent(renderer).intervalx if name == "x"
                        else ax.get_window_extent(renderer).intervaly)
        boxes = [t.get_window_extent(renderer) for t in labels]
        # only labels beside the axes are drawn (matplotlib skips ticks outside the limits)
        found[name] = [b for b in boxes
                       if lo - 1 <= ((b.x0 + b.x1) / 2 if name == "x" else (b.y0 + b.y1) / 2)
                       <= hi + 1]
    return found


def _overlaps(boxes):
    """Pairs of labels closer than 2 px: touching labels read as one ("3x10^04x10^0")."""
    return [(a, b) for a, b in itertools.combinations(boxes, 2)
            if a.padded(1).overlaps(b.padded(1))]


def test_log_axis_over_a_few_decades_is_labelled_at_the_data_without_collisions():
    """Chapter 7's depth plot: 3 ... 48 blocks on a log axis, in a 7 x 3.6 figure. Before
    issue 25 the minor ticks were labelled 3x10^0, 4x10^0 ..., on top of each other."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    depths = [3, 6, 12, 24, 48]
    viz.plot_curves(depths, {"pre-norm": [0.142, 0.133, 0.124, 0.105, 0.082],
                             "post-norm": [0.148, 0.150, 0.158, 0.177, 0.200]},
                    ax=ax, logx=True, xlabel="number of blocks")
    boxes = _tick_boxes(ax)
    assert not _overlaps(boxes["x"]) and not _overlaps(boxes["y"])
    shown = [t.get_text() for t in ax.get_xticklabels() + ax.xaxis.get_minorticklabels()
             if t.get_text()]
    assert shown == ["3", "6", "12", "24", "48"]  # plain numbers, no mathtext exponents
    plt.close(fig)


def test_chapter_2_rnn_plot_has_plain_readable_log_labels():
    lengths = np.array([2, 4, 8, 16, 32, 64])
    curves = {"RNN": 0.5 * np.exp(-0.98 * (lengths - 1)), "self-attention": 1 / lengths}
    ax = viz.plot_curves(lengths, curves, logx=True, logy=True, xlabel="sequence length T")
    boxes = _tick_boxes(ax)
    assert not _overlaps(boxes["x"]) and not _overlaps(boxes["y"])
    texts = [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
    assert "64" in texts and not any("$" in t for t in texts)  # no shrunken exponents
    smallest = viz.readable_font_size(ax.figure.get_size_inches()[0])
    assert all(t.get_fontsize() >= smallest for t in ax.get_xticklabels() + ax.get_legend()
               .get_texts())
    plt.close(ax.figure)


def test_crowded_ticks_are_thinned_until_they_do_not_collide():
    x = np.arange(1000, 41000, 1000)  # 40 wide labels asked for on a 5-inch axis
    ax = viz.plot_curves(x, {"m": x / 1000}, xticks=x)
    boxes = _tick_boxes(ax)
    assert not _overlaps(boxes["x"])
    kept = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert 3 <= len(kept) < 40 and kept[0] == "1000"  # every k-th, from the first
    step = (int(kept[1]) - int(kept[0])) // 1000
    assert kept == [f"{v:g}" for v in x[::step]][:len(kept)]
    plt.close(ax.figure)
