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


# ------------------------------------------------------------- the site's figures, drawn ahead


def _bar(**values):
    viz.plot_distribution([1.0, 2.0], ["a", "b"], title=", ".join(f"{k} {v}" for k, v in
                                                                   sorted(values.items())))


def test_the_grid_takes_every_option_both_states_and_a_few_slider_values():
    from course_attn.lab.site_frames import SLIDER_STOPS, controls_grid

    q, on, n = controls_grid({
        "q": widgets.Dropdown(options=[("first", 1), ("second", 2)], value=2),
        "on": widgets.Checkbox(value=True),
        "n": widgets.IntSlider(value=3, min=1, max=4),
    })
    (t,) = controls_grid(
        {"t": widgets.FloatLogSlider(value=1.0, base=10, min=-1, max=1, step=0.05)})
    assert (q.values, q.labels, q.start, q.kind) == ((1, 2), ("first", "second"), 1, "choice")
    assert (on.values, on.start, on.kind) == ((False, True), 1, "switch")
    assert len(t.values) == SLIDER_STOPS and t.values[0] == 0.1 and t.values[-1] == 10.0
    assert t.values[t.start] == 1.0 and list(t.values) == sorted(t.values)
    assert (n.values, n.start, n.labels) == ((1, 2, 3, 4), 2, ("1", "2", "3", "4"))


def test_site_values_pick_the_grid_and_keep_the_start_value():
    from course_attn.lab.site_frames import controls_grid

    (t,) = controls_grid({"t": widgets.IntSlider(value=7, min=1, max=100)},
                         {"t": [1, 50, 100]})
    assert t.values == (1, 7, 50, 100) and t.start == 1


def test_a_grid_too_large_or_naming_a_missing_control_is_refused():
    from course_attn.lab.site_frames import MAX_FRAMES

    big = {f"c{i}": widgets.Dropdown(options=list(range(5)), value=0) for i in range(3)}
    assert 5 ** 3 > MAX_FRAMES
    with pytest.raises(ValueError, match="pass site_values with fewer values"):
        viz.interactive_plot(_bar, **big)
    with pytest.raises(ValueError, match="does not have: \\['nope'\\]"):
        viz.interactive_plot(_bar, site_values={"nope": [1]}, x=widgets.IntSlider())
    with pytest.raises(ValueError, match="non-empty list"):
        viz.interactive_plot(_bar, site_values={"x": []}, x=widgets.IntSlider())
    with pytest.raises(TypeError, match="dropdown, a checkbox or a slider"):
        viz.interactive_plot(_bar, x=widgets.Text(value="a"))
    plt.close("all")


def test_the_display_holds_one_figure_per_combination_the_start_one_shown():
    import re
    import urllib.parse
    from xml.etree import ElementTree

    seen = []

    def draw(query, on):
        seen.append((query, on))
        _bar(query=query, on=on)

    widget = viz.interactive_plot(draw, query=widgets.Dropdown(options=["x", "y", "z"],
                                                                value="y"),
                                  on=widgets.Checkbox(value=False))
    seen.clear()
    open_before = plt.get_fignums()
    bundle = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # Jupyter: the live widget
    page = bundle["text/html"]
    assert sorted(seen) == sorted((q, o) for q in "xyz" for o in (False, True))
    frames = re.findall(r'<img class="course-widget-frame" data-key="([\d,]+)"( hidden)?'
                        r' alt="([^"]*)" src="data:image/svg\+xml,([^"]+)"', page)
    assert sorted(key for key, *_ in frames) == [f"{q},{o}" for q in range(3) for o in (0, 1)]
    shown = [(key, alt) for key, hidden, alt, _ in frames if not hidden]
    assert shown == [("1,0", "on False, query y (query y, on off)")]
    svg = urllib.parse.unquote(frames[0][3])
    assert svg.startswith("<svg") and "on False, query x" in svg
    ElementTree.fromstring(svg)  # a whole SVG document
    assert page.count('data-control="') == 2 and '<select data-control="0">' in page
    assert widget._repr_mimebundle_()["text/html"] == page  # the same bytes when run again
    assert plt.get_fignums() == open_before  # every figure drawn ahead is closed
    plt.close("all")


def test_a_compact_svg_keeps_every_element_and_text_style_but_the_repeats():
    import io
    from xml.etree import ElementTree

    from course_attn.lab.site_frames import compact_svg

    viz.use_sharp_figures()
    _, ax = plt.subplots(figsize=(3, 2))
    ax.set_title("title")
    ax.text(0.5, 0.5, "mono", family="monospace")
    buffer = io.StringIO()
    ax.figure.savefig(buffer, format="svg")
    plt.close("all")
    svg = buffer.getvalue()
    small = compact_svg(svg)
    assert len(small) < 0.8 * len(svg)
    def texts(document):
        return [(el.text, el.get("x"), el.get("y")) for el in ElementTree.fromstring(
            document).iter("{http://www.w3.org/2000/svg}text")]

    assert texts(small) == texts(svg) and len(texts(svg)) >= 3
    assert "text{font-family:'DejaVu Sans','Verdana','Arial',sans-serif}" in small
    assert "font-family: 'DejaVu Sans Mono'" in small or "monospace" in small
    assert "rotate(-0 " not in small and "<metadata>" not in small
