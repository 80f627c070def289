"""viz.interactive_plot: the wrapper every chapter's widget goes through."""

import ipywidgets as widgets
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_attn import viz  # noqa: E402


def test_draw_runs_with_the_controls_values_and_on_every_change():
    seen = []

    def draw(temperature, query):
        seen.append((temperature, query))
        viz.plot_distribution([temperature, 1.0], ["a", "b"])

    slider = widgets.FloatSlider(value=0.5, min=0.1, max=2.0)
    choice = widgets.Dropdown(options=["name", "tech"], value="tech")
    widget = viz.interactive_plot(draw, temperature=slider, query=choice)
    assert isinstance(widget, widgets.interactive)
    assert seen == [(0.5, "tech")]  # drawn once when created, so the saved state has a figure
    slider.value = 1.5
    assert seen[-1] == (1.5, "tech")
    plt.close("all")


def test_labels_are_named_and_not_cut():
    slider = widgets.FloatSlider(value=1.0)
    viz.interactive_plot(lambda temperature: None, temperature=slider)
    assert slider.description == "temperature"
    assert slider.style.description_width == "initial"


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(TypeError, match="draw must be callable"):
        viz.interactive_plot("not a function", x=widgets.IntSlider())
    with pytest.raises(TypeError, match="control 'x' must be an ipywidgets value widget"):
        viz.interactive_plot(lambda x: None, x=3)
