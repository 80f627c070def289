"""A widget's figures drawn ahead of time, so that it moves on the static site (every chapter).

A widget needs a kernel: on the site, where no kernel runs, its sliders would move and its
figure would not. So :func:`viz.interactive_plot <course_attn.lab.viz.interactive_plot>`
also draws its figure for a small grid of its controls' values while the notebook runs,
and writes them, with HTML controls of their own, as the widget's ``text/html`` output.
The site shows that output (``nb_mime_priority_overrides`` in ``_config.yml``), and
``tools/static/course.js`` shows the figure of the values picked. Jupyter, which has a
kernel, shows the live widget instead: it prefers the widget view to HTML.

The grid: every option of a dropdown, both states of a checkbox, and up to
:data:`SLIDER_STOPS` values of a slider (its start value among them), or the values an
author gives; at most :data:`MAX_FRAMES` figures in all.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["MAX_FRAMES", "SLIDER_STOPS", "Control", "compact_svg", "controls_grid", "site_html"]

#: At most this many values of one slider are drawn ahead (its start value among them).
SLIDER_STOPS = 7
#: At most this many figures per widget: each is an SVG in the notebook and on the page.
MAX_FRAMES = 72


@dataclass(frozen=True)
class Control:
    """One control of a widget as the site shows it: its name, label and values.

    ``labels[i]`` is how ``values[i]`` is written; ``start`` is the index of the value the
    widget starts with; ``kind`` is ``"slider"``, ``"choice"`` or ``"switch"``.
    """

    name: str
    description: str
    kind: str
    values: tuple[object, ...]
    labels: tuple[str, ...]
    start: int


def _options(control: object) -> list[tuple[str, object]]:
    options = control.options  # type: ignore[attr-defined]
    if isinstance(options, Mapping):
        return [(str(label), value) for label, value in options.items()]
    return [(str(o[0]), o[1]) if isinstance(o, tuple) and len(o) == 2 else (str(o), o)
            for o in options]


def _stops(count: int, start: int) -> list[int]:
    """Up to SLIDER_STOPS indices in range(count), evenly spread, ends and start among them."""
    if count <= SLIDER_STOPS:
        return list(range(count))
    spread = {round(k * (count - 1) / (SLIDER_STOPS - 2)) for k in range(SLIDER_STOPS - 1)}
    return sorted(spread | {start})


def _slider(name: str, control: object, wanted: Sequence[object] | None) -> Control:
    import ipywidgets as widgets

    c = control
    log = isinstance(c, widgets.FloatLogSlider)
    low, high, step = c.min, c.max, c.step  # type: ignore[attr-defined]
    count = int(math.floor((high - low) / step + 1e-9)) + 1
    at = [low + k * step for k in range(count)]
    if isinstance(c, widgets.IntSlider):
        at = [int(v) for v in at]
    if log:
        at = [c.base ** v for v in at]  # type: ignore[attr-defined]
    value = c.value  # type: ignore[attr-defined]
    start = min(range(count), key=lambda k: abs(at[k] - value))
    if wanted is None:
        picked = _stops(count, start)
        values = [at[k] for k in picked]
        values[picked.index(start)] = value
    else:
        values = sorted({*wanted, value})
    fmt = getattr(c, "readout_format", "d")
    labels = [format(v, fmt) for v in values]
    description = c.description  # type: ignore[attr-defined]
    return Control(name, description, "slider", tuple(values), tuple(labels),
                   values.index(value))


def _control(name: str, control: object, wanted: Sequence[object] | None) -> Control:
    import ipywidgets as widgets

    description = control.description  # type: ignore[attr-defined]
    value = control.value  # type: ignore[attr-defined]
    if isinstance(control, widgets.Checkbox | widgets.ToggleButton):
        return Control(name, description, "switch", (False, True), ("off", "on"), int(value))
    if isinstance(control, widgets.SelectionSlider):
        pairs = _options(control)
        start = [v for _, v in pairs].index(value)
        keep = _stops(len(pairs), start) if wanted is None else [
            k for k, (_, v) in enumerate(pairs) if v in wanted or v == value]
        pairs = [pairs[k] for k in keep]
        kind = "slider"
    elif hasattr(control, "options"):
        pairs = [(label, v) for label, v in _options(control)
                 if wanted is None or v in wanted or v == value]
        kind = "choice"
    elif isinstance(control, widgets.IntSlider | widgets.FloatSlider | widgets.FloatLogSlider):
        return _slider(name, control, wanted)
    else:
        raise TypeError(f"control {name!r}: the site can draw a dropdown, a checkbox or a "
                        f"slider ahead of time, got {type(control).__name__}")
    values = [v for _, v in pairs]
    return Control(name, description, kind, tuple(values), tuple(label for label, _ in pairs),
                   values.index(value))


def controls_grid(controls: Mapping[str, object],
                  site_values: Mapping[str, Sequence[object]] | None = None) -> list[Control]:
    """The controls as the site shows them, each with the values drawn ahead.

    ``site_values`` names, for some controls, the values to draw instead of the default
    grid (the start value is always added). Raises ``ValueError`` when the grid would hold
    more than :data:`MAX_FRAMES` figures, or names a control that is not there.
    """
    site_values = dict(site_values or {})
    unknown = sorted(set(site_values) - set(controls))
    if unknown:
        raise ValueError(f"site_values names controls the widget does not have: {unknown}; "
                         f"its controls are {sorted(controls)}")
    for name, wanted in site_values.items():
        if isinstance(wanted, str) or not isinstance(wanted, Sequence) or not wanted:
            raise ValueError(f"site_values[{name!r}] must be a non-empty list of values, "
                             f"got {wanted!r}")
    grid = [_control(name, c, site_values.get(name)) for name, c in controls.items()]
    frames = math.prod(len(c.values) for c in grid)
    if frames > MAX_FRAMES:
        sizes = ", ".join(f"{c.name} {len(c.values)}" for c in grid)
        raise ValueError(f"the site would draw {frames} figures ({sizes} values), more than "
                         f"{MAX_FRAMES}: pass site_values with fewer values for some controls")
    return grid


_FAMILY = re.compile(r"font-family: ('DejaVu Sans', 'Verdana', 'Arial', sans-serif); ")


def compact_svg(svg: str) -> str:
    """``svg`` drawn the same, in fewer bytes: a widget saves dozens of figures.

    Drops the XML prolog and the metadata, the indentation between tags, the identity
    ``rotate(-0 x y)`` of each text, and the font family every text repeats (one style rule
    instead; a text with another family keeps its own, which wins over the rule).
    """
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r">\n\s*<", "><", svg)
    svg = re.sub(r' transform="rotate\(-0 [-\d.e]+ [-\d.e]+\)"', "", svg)
    family = _FAMILY.search(svg)
    if family is not None:
        svg = _FAMILY.sub("", svg)
        rule = "text{font-family:" + family.group(1).replace(", ", ",") + "}"
        svg = svg.replace("<defs><style type=\"text/css\">", "<defs><style type=\"text/css\">"
                          + rule, 1) if "<defs><style" in svg else svg.replace(
            ">", f"><defs><style>{rule}</style></defs>", 1)
    return svg


def _data_url(svg: str) -> str:
    """A data URL of ``svg`` for an HTML attribute in double quotes: percent-encoded where
    a URL or the attribute needs it (``%``, ``#``, quotes, ``&``, line ends, non-ASCII),
    smaller than base64 by about a quarter."""
    return "data:image/svg+xml," + urllib.parse.quote(svg, safe=" !$'()*+,-./:;=?@[]^_`{|}~<>")


def _titles(figure: object) -> str:
    suptitle = getattr(figure, "_suptitle", None)
    titles = [suptitle.get_text()] if suptitle is not None and suptitle.get_text() else []
    titles += [ax.get_title() for ax in figure.axes if ax.get_title()]  # type: ignore[attr-defined]
    return "; ".join(titles)


def _draw_frame(draw: Callable[..., object], values: dict[str, object],
                to_svg: Callable[[Figure], str]) -> list[tuple[str, str]]:
    """(SVG, titles) of each figure ``draw(**values)`` opens; the figures are closed."""
    before = set(plt.get_fignums())
    try:
        draw(**values)
        opened = [n for n in plt.get_fignums() if n not in before]
        return [(to_svg(plt.figure(n)), _titles(plt.figure(n))) for n in opened]
    finally:
        for n in set(plt.get_fignums()) - before:
            plt.close(n)


def site_html(draw: Callable[..., object], grid: Sequence[Control],
              to_svg: Callable[[Figure], str]) -> str:
    """The widget as the site shows it: its controls and a figure for every combination.

    ``to_svg`` writes one figure as an SVG document (``viz`` passes its own, the way a
    notebook shows figures).

    Each figure is an ``<img>`` of an SVG (its own ids stay its own), with the figure's
    titles and the values as its alt text; only the start combination is shown.
    """
    parts = ['<div class="course-widget" data-course-widget="1">',
             '<div class="course-widget-controls">']
    for i, c in enumerate(grid):
        label = html.escape(c.description or c.name)
        if c.kind == "slider":
            labels = html.escape(json.dumps(list(c.labels)), quote=True)
            parts.append(f'<label>{label} <input type="range" min="0" max="{len(c.values) - 1}"'
                         f' step="1" value="{c.start}" data-control="{i}"'
                         f' data-labels="{labels}" aria-label="{label}">'
                         f' <output>{html.escape(c.labels[c.start])}</output></label>')
        elif c.kind == "switch":
            checked = " checked" if c.start else ""
            parts.append(f'<label><input type="checkbox" data-control="{i}"{checked}>'
                         f' {label}</label>')
        else:
            options = "".join(
                f'<option value="{k}"{" selected" if k == c.start else ""}>'
                f'{html.escape(text)}</option>' for k, text in enumerate(c.labels))
            parts.append(f'<label>{label} <select data-control="{i}">{options}</select>'
                         f'</label>')
    parts.append('</div><div class="course-widget-frames">')
    start = tuple(c.start for c in grid)
    for combo in itertools.product(*(range(len(c.values)) for c in grid)):
        values = {c.name: c.values[k] for c, k in zip(grid, combo, strict=True)}
        said = ", ".join(f"{c.description or c.name} {c.labels[k]}"
                         for c, k in zip(grid, combo, strict=True))
        key = ",".join(map(str, combo))
        hidden = "" if combo == start else " hidden"
        for svg, titles in _draw_frame(draw, values, to_svg):
            alt = html.escape(f"{titles} ({said})" if titles else said, quote=True)
            parts.append(f'<img class="course-widget-frame" data-key="{key}"{hidden}'
                         f' alt="{alt}" src="{_data_url(compact_svg(svg))}">')
    frames = math.prod(len(c.values) for c in grid)
    parts.append(f'</div><p class="course-widget-note">Drawn ahead for {frames} '
                 f'combinations of these values; run the notebook to try any value.</p></div>')
    return "".join(parts)
