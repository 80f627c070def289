"""viz.plot_curves (Chapter 4's measured-vs-theory plots)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

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
