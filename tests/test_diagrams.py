"""course_attn.lab.diagrams: the seven explanatory drawings (issue 15).

Each diagram must draw, fit the 700 px column, carry a title and alt text, show the shapes
its arguments imply, keep its labels apart and inside the figure, use one colour per role,
and refuse bad arguments with an error that names them.
"""

from __future__ import annotations

import itertools
import warnings
from collections import Counter

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib import colors as mcolors  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch, Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

import course_attn  # noqa: E402
from course_attn import diagrams, split_heads  # noqa: E402
from course_attn.lab.diagrams import DIAGRAMS, ROLE_COLORS  # noqa: E402


@pytest.fixture
def draw():
    """Call a diagram with warnings as errors and close it after; ``render`` draws it too
    (where a missing glyph would warn), as the readability checks need."""
    figures = []

    def make(name, render=False, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fig = DIAGRAMS[name](**kwargs)
            if render:
                fig.canvas.draw()
        figures.append(fig)
        return fig

    yield make
    for fig in figures:
        plt.close(fig)


def texts(fig: Figure) -> list[Text]:
    """The visible, non-empty texts: the title and every label drawn on the axes."""
    found = [t for t in fig.findobj(Text) if t.axes is None and t.get_text().strip()]
    for ax in fig.axes:
        found += [t for t in ax.texts if t.get_visible() and t.get_text().strip()]
    return found


def strings(fig: Figure) -> list[str]:
    return [t.get_text() for t in texts(fig)]


def assert_readable(fig: Figure) -> None:
    """Every text is at least 9 pt, inside the figure, and overlaps no other text."""
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig)]
    assert len(boxes) > 3
    width, height = fig.bbox.width, fig.bbox.height
    for text, box in boxes:
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, (
            f"{text!r} is cut off: {box} in a {width} x {height} figure")
    for t in texts(fig):
        assert t.get_fontsize() >= 9, f"{t.get_text()!r} is {t.get_fontsize()} pt"
    for (text_a, a), (text_b, b) in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), f"{text_a!r} overlaps {text_b!r}"


def role_cells(fig: Figure, role: str) -> list[Rectangle]:
    return [p for p in fig.axes[0].patches
            if isinstance(p, Rectangle) and p.get_gid() == f"role:{role}"]


# ----------------------------------------------------------------------------- every diagram


def test_registry_lists_the_seven_diagrams_and_the_package_exports_the_module():
    assert list(DIAGRAMS) == ["qkv_data_flow", "self_attention_shapes", "dot_vs_cosine",
                              "head_split_merge", "pre_norm_vs_post_norm",
                              "encoder_decoder_flow", "kv_cache_steps"]
    for name, func in DIAGRAMS.items():
        assert func is getattr(diagrams, name) and name in diagrams.__all__
    assert course_attn.lab.diagrams is diagrams and "diagrams" in course_attn.__all__


@pytest.mark.parametrize("name", list(DIAGRAMS))
def test_defaults_draw_a_titled_figure_for_the_column_with_alt_text(draw, name):
    fig = draw(name, render=True)
    assert isinstance(fig, Figure)
    width, height = fig.get_size_inches()
    assert width <= 7.0 and fig.dpi == 100 and fig.bbox.width <= 700
    assert 3.0 <= height <= 8.0
    assert len(fig.get_suptitle()) > 10
    description = DIAGRAMS[name].__doc__.strip().splitlines()[0]
    assert fig.get_label() == description and len(description) > 60
    assert description.endswith(".") and "\n" not in description
    assert_readable(fig)


@pytest.mark.parametrize("name, kwargs", [
    ("qkv_data_flow", {"t": 1, "d_model": 1, "d_k": 1, "d_v": 1}),
    ("qkv_data_flow", {"t": 8, "d_model": 12, "d_k": 12, "d_v": 1}),
    ("self_attention_shapes", {"t": 1, "d": 8, "row": 0}),
    ("self_attention_shapes", {"t": 8, "d": 8, "row": 7}),
    ("dot_vs_cosine", {"query": (1, 0), "key_near": (1, 0.1), "key_long": (3, 2)}),
    ("dot_vs_cosine", {"query": (-1, 2), "key_near": (-0.5, 1.2), "key_long": (1.5, 3)}),
    ("head_split_merge", {"t": 1, "d_model": 1, "n_heads": 1}),
    ("head_split_merge", {"t": 4, "d_model": 10, "n_heads": 2}),
    ("head_split_merge", {"t": 5, "d_model": 8, "n_heads": 4}),
    ("pre_norm_vs_post_norm", {"attention_label": "Masked self-attention", "ffn_label": "MLP",
                               "norm_label": "RMSNorm"}),
    ("encoder_decoder_flow", {"n_layers": 1}),
    ("encoder_decoder_flow", {"n_layers": 3}),
    ("kv_cache_steps", {"steps": 1}),
    ("kv_cache_steps", {"steps": 5}),
])
def test_other_valid_sizes_stay_readable(draw, name, kwargs):
    fig = draw(name, render=True, **kwargs)
    assert fig.get_size_inches()[0] <= 7.0
    assert_readable(fig)


def _is_tint(rgb: tuple[float, ...], color: str) -> bool:
    """``rgb`` lies between white and ``color`` (a tint of it, or the colour itself)."""
    target = np.array(mcolors.to_rgb(color))
    rgb = np.array(rgb[:3])
    channel = int(np.argmax(1 - target))
    amount = (1 - rgb[channel]) / (1 - target[channel])
    return bool(0 <= amount <= 1 + 1e-9 and np.allclose(1 - rgb, amount * (1 - target),
                                                         atol=1e-6))


@pytest.mark.parametrize("name", [n for n in DIAGRAMS if n not in ("dot_vs_cosine",
                                                                   "head_split_merge")])
def test_one_colour_per_role_in_every_diagram(draw, name):
    fig = draw(name)
    tagged = [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith("role:")]
    assert tagged
    for patch in tagged:
        role = patch.get_gid().removeprefix("role:")
        face = patch.get_facecolor()
        white = np.allclose(face[:3], 1.0)
        assert white or _is_tint(face, ROLE_COLORS[role]), (role, face)
    assert len(set(ROLE_COLORS.values())) == len(ROLE_COLORS)


# ----------------------------------------------------------------------------- the shapes


def test_qkv_data_flow_labels_and_draws_every_shape(draw):
    t, d_model, d_k, d_v = 5, 6, 3, 2
    fig = draw("qkv_data_flow", t=t, d_model=d_model, d_k=d_k, d_v=d_v)
    text = "\n".join(strings(fig))
    for shape in ("(T, D) = (5, 6)", "(D, d_k) = (6, 3)", "(D, d_v) = (6, 2)",
                  "(T, d_k) = (5, 3)", "(T, d_v) = (5, 2)", "(T, T) = (5, 5)"):
        assert shape in text
    assert text.count("(T, d_k) = (5, 3)") == 2 and text.count("(T, T) = (5, 5)") == 2
    assert "(T, d_v) = (5, 3)" not in text and "\\sqrt{d_k}" in text
    cells = {role: len(role_cells(fig, role)) for role in ROLE_COLORS}
    assert cells["input"] == t * d_model  # X
    assert cells["query"] == cells["key"] == d_model * d_k + t * d_k  # W_q and Q, W_k and K
    assert cells["value"] == d_model * d_v + t * d_v  # W_v and V
    assert cells["weights"] == 2 * t * t  # scores and weights
    assert cells["output"] == t * d_v  # Z = A V


def test_self_attention_shapes_highlights_the_chosen_row(draw):
    t, d, row = 5, 2, 3
    fig = draw("self_attention_shapes", t=t, d=d, row=row)
    text = "\n".join(strings(fig))
    for shape in ("(T, D) = (5, 2)", "(D, T) = (2, 5)", "(T, T) = (5, 5)"):
        assert shape in text
    assert text.count("(T, D) = (5, 2)") == 3  # X twice and the output Z
    assert f"row {row} of S" in text and f"row {row} of Z" in text
    strong = {role: [p for p in role_cells(fig, role)
                     if np.allclose(p.get_facecolor()[:3], mcolors.to_rgb(ROLE_COLORS[role]))]
              for role in ("weights", "output")}
    assert len(strong["weights"]) == 3 * t  # the row of S, and of A twice
    assert len(strong["output"]) == d  # the matching row of Z
    z_cells = role_cells(fig, "output")
    tops = sorted({round(p.get_y(), 6) for p in z_cells}, reverse=True)
    assert {round(p.get_y(), 6) for p in strong["output"]} == {tops[row]}


def test_dot_vs_cosine_prints_the_dot_products_and_cosines_of_its_vectors(draw):
    q, near, long = (2.0, 1.0), (1.0, 0.8), (1.0, 3.0)
    fig = draw("dot_vs_cosine", query=q, key_near=near, key_long=long)
    text = "\n".join(strings(fig))
    dots = [float(np.dot(q, k)) for k in (near, long)]
    coss = [d / (np.linalg.norm(q) * np.linalg.norm(k)) for d, k in zip(dots, (near, long),
                                                                         strict=True)]
    assert dots[1] > dots[0] and coss[1] < coss[0]
    for value in (*dots, *coss):
        assert f"{value:.2f}" in text
    assert "length counts" in text and "only the angle" in text


def _cells_in(fig: Figure, frame: Rectangle) -> list[int]:
    """The numbers drawn inside ``frame``, row by row."""
    x0, y0 = frame.get_xy()
    x1, y1 = x0 + frame.get_width(), y0 + frame.get_height()
    inside = [t for t in fig.axes[0].texts if t.get_text().isdigit()
              and x0 < t.get_position()[0] < x1 and y0 < t.get_position()[1] < y1]
    inside.sort(key=lambda t: (-round(t.get_position()[1], 6), t.get_position()[0]))
    return [int(t.get_text()) for t in inside]


def test_head_split_merge_matches_split_heads_and_the_wrong_view(draw):
    t, d_model, n_heads = 2, 6, 3
    head_dim = d_model // n_heads
    fig = draw("head_split_merge", t=t, d_model=d_model, n_heads=n_heads)
    text = "\n".join(strings(fig))
    for shape in ("(B, T, D) = (1, 2, 6)", "(B, T, H, head_dim) = (1, 2, 3, 2)",
                  "(B, H, T, head_dim) = (1, 3, 2, 2)"):
        assert shape in text
    labelled = (10 * torch.arange(t)[:, None] + torch.arange(d_model)[None, :]).view(1, t, -1)
    labelled = labelled.double()  # split_heads takes floating-point tensors
    numbers = Counter(int(s) for s in strings(fig) if s.isdigit())
    assert numbers == Counter({int(v): 5 for v in labelled.flatten()})  # five drawings of x
    frames = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and not p.get_fill()
              and p.get_linewidth() == 1.6]
    wrong = sorted((p for p in frames if mcolors.to_hex(p.get_edgecolor()) != "#333333"),
                   key=lambda p: p.get_x())
    right = sorted((p for p in frames if mcolors.to_hex(p.get_edgecolor()) == "#333333"
                    and len(_cells_in(fig, p)) == t * head_dim), key=lambda p: p.get_x())
    assert len(wrong) == len(right) == n_heads
    for h in range(n_heads):
        good = split_heads(labelled, n_heads)[0, h].flatten().long().tolist()
        assert _cells_in(fig, right[h]) == good
        bad = labelled.view(1, n_heads, t, head_dim)[0, h].flatten().long().tolist()
        assert _cells_in(fig, wrong[h]) == bad
    assert _cells_in(fig, wrong[0]) != _cells_in(fig, right[0])  # the pitfall shows


def test_pre_norm_vs_post_norm_draws_both_blocks_with_their_labels(draw):
    fig = draw("pre_norm_vs_post_norm", attention_label="Self-attention", ffn_label="MLP",
               norm_label="RMSNorm")
    found = Counter(strings(fig))
    assert found["Self-attention"] == 2 and found["MLP"] == 2 and found["RMSNorm"] == 4
    assert found["x (B, T, D)"] == 2 and found["y (B, T, D)"] == 2
    text = "\n".join(found)
    assert "x + \\mathrm{Attn}(\\mathrm{LN}(x))" in text  # pre-norm
    assert "\\mathrm{LN}(x + \\mathrm{Attn}(x))" in text  # post-norm
    additions = [p for p in fig.axes[0].patches if isinstance(p, Circle) and p.get_radius() > 0.1]
    assert len(additions) == 4  # two residual "+" per block


@pytest.mark.parametrize("n_layers", [1, 3])
def test_encoder_decoder_flow_names_the_three_masks_in_every_layer(draw, n_layers):
    fig = draw("encoder_decoder_flow", n_layers=n_layers)
    found = Counter(strings(fig))
    assert found["source padding\nmask (B, T_s)"] == 2 * n_layers  # encoder and cross
    assert found["causal (T_t, T_t)\n+ target padding\nmask (B, T_t)"] == n_layers
    assert found["cross-attention"] == n_layers and found["self-attention"] == n_layers
    assert found[f"layer {n_layers}"] == 2
    for shape in ("source tokens (B, T_s)", "target tokens (B, T_t)", "memory (B, T_s, D)",
                  "logits (B, T_t, V)"):
        assert found[shape] == 1
    arrows_from_memory = [p for p in fig.axes[0].patches
                          if isinstance(p, FancyArrowPatch) and p.get_gid() == "memory"]
    assert len(arrows_from_memory) == n_layers  # the memory reaches every decoder layer


def test_kv_cache_steps_counts_what_each_step_computes(draw):
    steps = 3
    fig = draw("kv_cache_steps", steps=steps)
    found = Counter(strings(fig))
    for t in range(1, steps + 1):
        assert found[f"T_cache = {t}\nq, k, v: 1 each\nscores: {t}"] == 1
        assert found[f"T = {t}\nq, k, v: {t} each\nscores: {t * (t + 1) // 2}"] == 1
    triangle = sum(range(1, steps + 1))
    assert len(role_cells(fig, "query")) == steps + triangle  # 1 per step vs t per step
    assert len(role_cells(fig, "key")) == 2 * triangle  # T_cache = t keys either way
    new_keys = [p for p in role_cells(fig, "key")
                if np.allclose(p.get_facecolor()[:3], mcolors.to_rgb(ROLE_COLORS["key"]))]
    assert len(new_keys) == steps + triangle  # with the cache only the newest is computed
    computed = [p for p in role_cells(fig, "weights")
                if np.allclose(p.get_facecolor()[:3], mcolors.to_rgb(ROLE_COLORS["weights"]))]
    assert len(computed) == triangle + sum(t * (t + 1) // 2 for t in range(1, steps + 1))


# ----------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("name, kwargs, error, match", [
    ("qkv_data_flow", {"t": 0}, ValueError, r"^t must be"),
    ("qkv_data_flow", {"d_k": 2.0}, TypeError, r"^d_k must be a positive int"),
    ("qkv_data_flow", {"d_v": True}, TypeError, r"^d_v must be a positive int"),
    ("qkv_data_flow", {"d_model": 13}, ValueError, r"^d_model must be at most 12"),
    ("self_attention_shapes", {"t": 3, "row": 3}, ValueError, r"^row must be a row of A.*2"),
    ("self_attention_shapes", {"row": -1}, ValueError, r"^row must be an int >= 0"),
    ("self_attention_shapes", {"d": "3"}, TypeError, r"^d must be a positive int"),
    ("dot_vs_cosine", {"query": (0, 0)}, ValueError, r"^query must not be the zero vector"),
    ("dot_vs_cosine", {"key_near": (1, 2, 3)}, TypeError, r"^key_near must be a pair"),
    ("dot_vs_cosine", {"query": "ab"}, TypeError, r"^query must be a pair"),
    ("dot_vs_cosine", {"key_long": (float("nan"), 1)}, ValueError, r"^key_long must be finite"),
    ("dot_vs_cosine", {"key_long": (0.5, 0.1)}, ValueError, r"^key_long must have a larger"),
    ("head_split_merge", {"d_model": 7, "n_heads": 2}, ValueError,
     r"^d_model=7 must be divisible by n_heads=2"),
    ("head_split_merge", {"n_heads": 5}, ValueError, r"^n_heads must be at most 4"),
    ("head_split_merge", {"t": 5, "d_model": 8, "n_heads": 1}, ValueError,
     r"^t \* head_dim = 5 \* 8 must be at most 20"),
    ("head_split_merge", {"t": 1.5}, TypeError, r"^t must be a positive int"),
    ("pre_norm_vs_post_norm", {"attention_label": ""}, ValueError, r"^attention_label must be"),
    ("pre_norm_vs_post_norm", {"ffn_label": 3}, TypeError, r"^ffn_label must be a str"),
    ("pre_norm_vs_post_norm", {"norm_label": "x" * 23}, ValueError,
     r"^norm_label must have at most 22 characters"),
    ("encoder_decoder_flow", {"n_layers": 4}, ValueError, r"^n_layers must be at most 3"),
    ("encoder_decoder_flow", {"n_layers": "2"}, TypeError, r"^n_layers must be a positive int"),
    ("kv_cache_steps", {"steps": 0}, ValueError, r"^steps must be a positive int"),
    ("kv_cache_steps", {"steps": 6}, ValueError, r"^steps must be at most 5"),
])
def test_bad_arguments_are_refused_by_name_before_any_figure_is_made(name, kwargs, error, match):
    before = plt.get_fignums()
    with pytest.raises(error, match=match):
        DIAGRAMS[name](**kwargs)
    assert plt.get_fignums() == before
