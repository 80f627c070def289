"""course_attn.lab.diagrams: the explanatory drawings (issues 15 and 25).

Each diagram must draw, fit the 700 px column, stay readable on a 400 px phone, carry a title
and alt text, show the shapes its arguments imply, keep its labels apart, inside the figure
and inside their boxes, use one colour per role, refuse bad arguments with an error that
names them, and connect the right parts: every arrow is recorded (``diagram_graph``), and
the tests check what each arrow joins.
"""

from __future__ import annotations

import itertools
import math
import re
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
from matplotlib.patches import Circle, Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

import course_attn  # noqa: E402
from course_attn import diagrams, split_heads  # noqa: E402
from course_attn.lab import viz  # noqa: E402
from course_attn.lab.diagrams import DIAGRAMS, ROLE_COLORS, diagram_graph  # noqa: E402
from course_attn.modern.gqa import repeat_kv  # noqa: E402


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


def flat(fig: Figure) -> str:
    """All the text of a figure, with line breaks as spaces (labels wrap where they must)."""
    return " ".join(" ".join(strings(fig)).split())


def assert_readable(fig: Figure) -> None:
    """Every text is readable on a phone, inside the figure, overlaps no other text, and a
    box's label stays inside its box."""
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig)]
    assert len(boxes) > 3
    width, height = fig.bbox.width, fig.bbox.height
    for text, box in boxes:
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, (
            f"{text!r} is cut off: {box} in a {width} x {height} figure")
    smallest = viz.readable_font_size(fig.get_size_inches()[0])
    for t in texts(fig):
        assert t.get_fontsize() >= smallest, f"{t.get_text()!r} is {t.get_fontsize()} pt"
    for (text_a, a), (text_b, b) in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), f"{text_a!r} overlaps {text_b!r}"
    graph, ax = diagram_graph(fig), fig.axes[0]
    for t in texts(fig):
        if (t.get_gid() or "").startswith("label:"):
            left, bottom, right, top = graph.nodes[t.get_gid().removeprefix("label:")]
            (x0, y0), (x1, y1) = ax.transData.transform([(left, bottom), (right, top)])
            box = t.get_window_extent(renderer)
            assert x0 - 1 <= box.x0 and box.x1 <= x1 + 1 and y0 - 1 <= box.y0 <= box.y1 <= y1 + 1, (
                f"the label {t.get_text()!r} sticks out of its box")


def role_cells(fig: Figure, role: str) -> list[Rectangle]:
    return [p for p in fig.axes[0].patches
            if isinstance(p, Rectangle) and p.get_gid() == f"role:{role}"]


def distance(point, extent) -> float:
    """Inches from a point to a part's extent (0 inside it)."""
    (x, y), (left, bottom, right, top) = point, extent
    return math.hypot(max(left - x, 0.0, x - right), max(bottom - y, 0.0, y - top))


# ----------------------------------------------------------------------------- every diagram


NAMES = ["attention_pooling", "self_attention_shapes", "dot_vs_cosine", "qkv_data_flow",
         "scaled_dot_product_graph", "head_split_merge", "multi_head_block",
         "pre_norm_vs_post_norm", "encoder_decoder_flow", "kv_cache_steps",
         "flash_attention_tiles", "rope_rotation", "gqa_sharing", "rolling_kv_cache",
         "mla_latent_cache", "minigpt_architecture", "induction_circuit"]


def test_registry_lists_every_diagram_and_the_package_exports_the_module():
    assert list(DIAGRAMS) == NAMES
    for name, func in DIAGRAMS.items():
        assert func is getattr(diagrams, name) and name in diagrams.__all__
    assert course_attn.lab.diagrams is diagrams and "diagrams" in course_attn.__all__


@pytest.mark.parametrize("name", NAMES)
def test_defaults_draw_a_titled_figure_for_the_column_with_alt_text(draw, name):
    fig = draw(name, render=True)
    assert isinstance(fig, Figure)
    width, height = fig.get_size_inches()
    assert width <= 7.0 and fig.dpi == 100 and fig.bbox.width <= 700
    assert 3.0 <= height <= 10.5
    assert len(fig.get_suptitle()) > 10
    description = DIAGRAMS[name].__doc__.strip().splitlines()[0]
    assert fig.get_label() == description and len(description) > 60
    assert description.endswith(".") and "\n" not in description
    assert "Chapter" in DIAGRAMS[name].__doc__
    assert_readable(fig)


@pytest.mark.parametrize("name, kwargs", [
    ("attention_pooling", {"t": 2}),
    ("attention_pooling", {"t": 8}),
    ("qkv_data_flow", {"t": 1, "d_model": 1, "d_k": 1, "d_v": 1}),
    ("qkv_data_flow", {"t": 8, "d_model": 12, "d_k": 12, "d_v": 1}),
    ("self_attention_shapes", {"t": 1, "d": 8, "row": 0}),
    ("self_attention_shapes", {"t": 8, "d": 8, "row": 7}),
    ("dot_vs_cosine", {"query": (1, 0), "key_near": (1, 0.1), "key_long": (3, 2)}),
    ("dot_vs_cosine", {"query": (-1, 2), "key_near": (-0.5, 1.2), "key_long": (1.5, 3)}),
    ("scaled_dot_product_graph", {"masked": False}),
    ("head_split_merge", {"t": 1, "d_model": 1, "n_heads": 1}),
    ("head_split_merge", {"t": 4, "d_model": 10, "n_heads": 2}),
    ("head_split_merge", {"t": 5, "d_model": 8, "n_heads": 4}),
    ("multi_head_block", {"n_heads": 1}),
    ("multi_head_block", {"n_heads": 6}),
    ("pre_norm_vs_post_norm", {"attention_label": "Masked self-attention", "ffn_label": "MLP",
                               "norm_label": "RMSNorm"}),
    ("encoder_decoder_flow", {"n_layers": 1}),
    ("encoder_decoder_flow", {"n_layers": 3}),
    ("kv_cache_steps", {"steps": 1}),
    ("kv_cache_steps", {"steps": 5}),
    ("flash_attention_tiles", {"n_blocks": 2, "query_block": 0, "kv_block": 1}),
    ("rope_rotation", {"i": 0, "j": 6, "omega": 1.0}),
    ("gqa_sharing", {"n_heads": 8, "n_kv_heads": 8}),
    ("gqa_sharing", {"n_heads": 6, "n_kv_heads": 1}),
    ("rolling_kv_cache", {"window": 2, "steps": 1}),
    ("rolling_kv_cache", {"window": 6, "steps": 12}),
    ("mla_latent_cache", {"decoupled_rope": False}),
    ("minigpt_architecture", {"n_layers": 1}),
    ("minigpt_architecture", {"n_layers": 4}),
    ("induction_circuit", {"n_between": 0}),
    ("induction_circuit", {"n_between": 4}),
])
def test_other_valid_sizes_stay_readable(draw, name, kwargs):
    fig = draw(name, render=True, **kwargs)
    # at the one font size a phone needs (issue 44), the tallest stacks (five layouts of
    # T = 5 tokens, three encoder-decoder layers) are up to 12.8 inches tall
    assert fig.get_size_inches()[0] <= 7.0 and fig.get_size_inches()[1] <= 13.0
    assert_readable(fig)


def _is_tint(rgb: tuple[float, ...], color: str) -> bool:
    """``rgb`` lies between white and ``color`` (a tint of it, or the colour itself)."""
    target = np.array(mcolors.to_rgb(color))
    rgb = np.array(rgb[:3])
    channel = int(np.argmax(1 - target))
    amount = (1 - rgb[channel]) / (1 - target[channel])
    return bool(0 <= amount <= 1 + 1e-9 and np.allclose(1 - rgb, amount * (1 - target),
                                                         atol=1e-6))


@pytest.mark.parametrize("name", [n for n in NAMES if n not in ("dot_vs_cosine",
                                                                "head_split_merge",
                                                                "rope_rotation")])
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


@pytest.mark.parametrize("name", NAMES)
def test_every_arrow_starts_at_its_source_and_ends_at_its_target(draw, name):
    """The recorded graph is the drawn one: an arrow's first point is nearer its source than
    any other part, and its last point nearer its target (so a label cannot lie)."""
    graph = diagram_graph(draw(name))
    assert graph.edges or name in ("kv_cache_steps", "rolling_kv_cache")
    for edge in graph.edges:
        for point, end in ((edge.points[0], edge.source), (edge.points[-1], edge.target)):
            own = distance(point, graph.nodes[end])
            others = {n: distance(point, e) for n, e in graph.nodes.items() if n != end}
            nearest = min(others, key=others.get)
            assert own <= 0.35, f"{edge.source} -> {edge.target}: {own:.2f} in from {end}"
            assert own <= others[nearest] + 1e-9, (
                f"{edge.source} -> {edge.target} is drawn at {nearest}, not at {end}")


def test_diagram_graph_refuses_a_figure_it_did_not_draw():
    fig = plt.figure()
    with pytest.raises(TypeError, match="^fig must be a figure drawn by course_attn"):
        diagram_graph(fig)
    with pytest.raises(TypeError, match="got str"):
        diagram_graph("qkv_data_flow")
    plt.close(fig)


# ----------------------------------------------------------------------------- post-norm


def test_post_norm_feeds_the_normalised_sum_to_the_second_sublayer_and_its_residual(draw):
    """x = norm1(x + attn(x)); x = norm2(x + ff(x)): ff and the second residual both read
    norm1's output. (The drawing before issue 25 sent that residual from below norm1.)"""
    graph = diagram_graph(draw("pre_norm_vs_post_norm"))
    post = {(a.removeprefix("post: "), b.removeprefix("post: "))
            for a, b in graph.pairs() if a.startswith("post: ")}
    assert post == {("x", "attn"), ("attn", "add1"), ("x", "add1"), ("add1", "norm1"),
                    ("norm1", "ff"), ("ff", "add2"), ("norm1", "add2"), ("add2", "norm2"),
                    ("norm2", "y")}
    assert sorted(graph.sources("post: add2")) == ["post: ff", "post: norm1"]
    residual = next(e for e in graph.edges if (e.source, e.target) == ("post: norm1",
                                                                      "post: add2"))
    norm1, ff = graph.nodes["post: norm1"], graph.nodes["post: ff"]
    x, y = residual.points[0]  # the branch point: on the wire from norm1 up to ff
    assert norm1[3] < y < ff[1] and norm1[0] < x < norm1[2]


def test_pre_norm_keeps_the_residual_stream_unnormalised(draw):
    graph = diagram_graph(draw("pre_norm_vs_post_norm"))
    pre = {(a.removeprefix("pre: "), b.removeprefix("pre: "))
           for a, b in graph.pairs() if a.startswith("pre: ")}
    assert pre == {("x", "norm1"), ("norm1", "attn"), ("attn", "add1"), ("x", "add1"),
                   ("add1", "norm2"), ("norm2", "ff"), ("ff", "add2"), ("add1", "add2"),
                   ("add2", "y")}


def test_pre_norm_vs_post_norm_draws_both_blocks_with_their_labels(draw):
    fig = draw("pre_norm_vs_post_norm", attention_label="Self-attention", ffn_label="MLP",
               norm_label="RMSNorm")
    found = Counter(strings(fig))
    assert found["Self-attention"] == 2 and found["MLP"] == 2 and found["RMSNorm"] == 4
    assert found["x (B, T, D)"] == 2 and found["y (B, T, D)"] == 2
    text = "\n".join(found)
    assert "h = x + Attn(LN(x))" in text and "h = LN(x + Attn(x))" in text
    assert "y = LN(h + FF(h))" in text and "y = h + FF(LN(h))" in text
    additions = [p for p in fig.axes[0].patches if isinstance(p, Circle) and p.get_radius() > 0.1]
    assert len(additions) == 4  # two residual "+" per block


# ----------------------------------------------------------------------------- the shapes


def test_qkv_data_flow_labels_and_draws_every_shape(draw):
    t, d_model, d_k, d_v = 5, 6, 3, 2
    fig = draw("qkv_data_flow", t=t, d_model=d_model, d_k=d_k, d_v=d_v)
    text = "\n".join(strings(fig))
    for shape in ("(T, D) = (5, 6)", "(D, d_k) = (6, 3)", "(D, d_v) = (6, 2)",
                  "(T, d_k) = (5, 3)", "(T, d_v) = (5, 2)", "(T, T) = (5, 5)"):
        assert shape in text
    assert text.count("(T, d_k) = (5, 3)") == 2 and text.count("(T, T) = (5, 5)") == 2
    assert "(T, d_v) = (5, 3)" not in text and "√d_k" in text
    cells = {role: len(role_cells(fig, role)) for role in ROLE_COLORS}
    assert cells["input"] == t * d_model  # X
    assert cells["query"] == cells["key"] == d_model * d_k + t * d_k  # W_q and Q, W_k and K
    assert cells["value"] == d_model * d_v + t * d_v  # W_v and V
    assert cells["weights"] == 2 * t * t  # scores and weights
    assert cells["output"] == t * d_v  # Z = A V
    graph = diagram_graph(fig)
    assert sorted(graph.sources("scores")) == ["K", "Q"] and graph.sources("A") == ["scores"]
    assert sorted(graph.sources("Z")) == ["A", "V"] and graph.sources("V") == ["W_v"]


def test_self_attention_shapes_highlights_the_chosen_row(draw):
    t, d, row = 5, 2, 3
    fig = draw("self_attention_shapes", t=t, d=d, row=row)
    text = flat(fig)
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
    assert diagram_graph(fig).pairs() == [("1.S", "1.A")]  # the softmax, S to A


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
    graph = diagram_graph(fig)
    for panel in ("dot", "cosine"):  # each vector points where it should, from one origin
        origin = graph.nodes[f"{panel}: origin"][:2]
        for name, vec in (("q", q), ("k₁", near), ("k₂", long)):
            tip = graph.nodes[f"{panel}: {name}"][:2]
            angle = math.atan2(tip[1] - origin[1], tip[0] - origin[0])
            assert angle == pytest.approx(math.atan2(vec[1], vec[0]), abs=1e-9)


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
    assert diagram_graph(fig).pairs() == [("x", "view"), ("view", "transpose"),
                                          ("transpose", "merge")]


@pytest.mark.parametrize("n_layers", [1, 3])
def test_encoder_decoder_flow_names_the_three_masks_in_every_layer(draw, n_layers):
    fig = draw("encoder_decoder_flow", n_layers=n_layers)
    found = Counter(strings(fig))
    assert found["self-attention\nsource padding mask"] == n_layers  # the encoder's
    assert found["cross-attention\nsource padding mask"] == n_layers
    assert found["causal self-attention\ncausal + target padding"] == n_layers
    assert found[f"layer {n_layers}"] == 2
    for shape in ("source tokens (B, T_s)", "target tokens (B, T_t)", "memory (B, T_s, D)",
                  "logits (B, T_t, V)"):
        assert found[shape] == 1
    mask_icons = len(role_cells(fig, "mask")) // 1
    assert mask_icons == n_layers * (16 + 16 + 12)  # 4x4 icons, and 3x4 for cross-attention
    graph = diagram_graph(fig)
    crosses = [f"decoder: layer {i}: cross-attention" for i in range(1, n_layers + 1)]
    assert sorted(graph.targets("memory")) == sorted(crosses)  # the memory reaches them all
    assert graph.sources("memory") == [f"encoder: layer {n_layers}: feed-forward"]
    for cross in crosses:
        layer = cross.removesuffix("cross-attention")
        assert sorted(graph.sources(cross)) == sorted([layer + "self-attention", "memory"])


def test_kv_cache_steps_counts_what_each_step_computes(draw):
    steps = 3
    fig = draw("kv_cache_steps", steps=steps)
    found = Counter(strings(fig))
    for t in range(1, steps + 1):
        assert found[f"step {t}\nT_cache = {t}\nq, k, v: 1 each\nscores: {t}"] == 1
        assert found[f"step {t}\nT = {t}\nq, k, v: {t} each\nscores: {t * (t + 1) // 2}"] == 1
    triangle = sum(range(1, steps + 1))
    assert len(role_cells(fig, "query")) == steps + triangle  # 1 per step vs t per step
    assert len(role_cells(fig, "key")) == 2 * triangle  # T_cache = t keys either way
    new_keys = [p for p in role_cells(fig, "key")
                if np.allclose(p.get_facecolor()[:3], mcolors.to_rgb(ROLE_COLORS["key"]))]
    assert len(new_keys) == steps + triangle  # with the cache only the newest is computed
    computed = [p for p in role_cells(fig, "weights")
                if np.allclose(p.get_facecolor()[:3], mcolors.to_rgb(ROLE_COLORS["weights"]))]
    assert len(computed) == triangle + sum(t * (t + 1) // 2 for t in range(1, steps + 1))


# ----------------------------------------------------------------------------- new diagrams


@pytest.mark.parametrize("t", [2, 5, 8])
def test_attention_pooling_scores_every_token_against_the_one_query(draw, t):
    fig = draw("attention_pooling", t=t)
    graph = diagram_graph(fig)
    for n in range(1, t + 1):
        assert sorted(graph.sources(f"s{n}")) == sorted([f"x{n}", "q"])
        assert graph.targets(f"s{n}") == ["softmax"]
        assert graph.sources(f"alpha{n}") == ["softmax"]
        assert graph.targets(f"alpha{n}") == [f"alpha{n} x{n}"]
        assert graph.targets(f"alpha{n} x{n}") == ["sum"]
    assert sorted(graph.targets("q")) == sorted(f"s{n}" for n in range(1, t + 1))
    assert graph.targets("sum") == ["pooled"] and len(graph.sources("softmax")) == t
    shown = [float(s) for s in strings(fig) if re.fullmatch(r"0\.\d\d", s)]
    assert len(shown) == t and abs(sum(shown) - 1) <= 0.005 * t  # a distribution, rounded


@pytest.mark.parametrize("masked", [True, False])
def test_scaled_dot_product_graph_follows_the_formula(draw, masked):
    graph = diagram_graph(draw("scaled_dot_product_graph", masked=masked))
    chain = ["matmul QK", "scale", *(["mask"] if masked else []), "softmax", "matmul AV",
             "output"]
    assert sorted(graph.sources("matmul QK")) == ["K", "Q"]
    for a, b in itertools.pairwise(chain):
        assert graph.targets(a) == [b], a
    assert graph.targets("V") == ["matmul AV"]  # V enters after the softmax, not before
    assert sorted(graph.sources("matmul AV")) == ["V", "softmax"]
    assert ("mask input" in graph.nodes) == masked
    if masked:
        assert sorted(graph.sources("mask")) == ["mask input", "scale"]


@pytest.mark.parametrize("n_heads", [1, 3, 4])
def test_multi_head_block_splits_attends_per_head_and_merges(draw, n_heads):
    fig = draw("multi_head_block", n_heads=n_heads)
    graph = diagram_graph(fig)
    assert sorted(graph.targets("x")) == ["k_proj", "q_proj", "v_proj"]
    assert sorted(graph.sources("split_heads")) == ["k_proj", "q_proj", "v_proj"]
    heads = [f"head {h}" for h in range(n_heads)]
    assert Counter(graph.targets("split_heads")) == Counter({h: 3 for h in heads})  # q, k, v
    assert sorted(graph.sources("merge_heads")) == heads
    assert graph.targets("merge_heads") == ["out_proj"] and graph.targets("out_proj") == [
        "output"]
    assert f"H = {n_heads} heads" in flat(fig)


def test_flash_attention_tiles_reads_blocks_in_and_writes_only_the_output(draw):
    graph = diagram_graph(draw("flash_attention_tiles", n_blocks=4, query_block=1, kv_block=3))
    assert set(graph.pairs()) == {
        ("HBM: Q1", "SRAM: Q"), ("HBM: K3", "SRAM: K"), ("HBM: V3", "SRAM: V"),
        ("SRAM: Q", "SRAM: S"), ("SRAM: K", "SRAM: S"), ("SRAM: S", "SRAM: acc"),
        ("SRAM: V", "SRAM: acc"), ("SRAM: acc", "HBM: O1")}
    into_hbm = [e for e in graph.edges if e.target.startswith("HBM")]
    assert [e.source for e in into_hbm] == ["SRAM: acc"]  # the scores never leave SRAM
    assert sum(n.startswith("HBM: ") for n in graph.nodes) == 4 * 4


def test_flash_attention_tiles_names_the_running_sum_as_the_pseudocode_does(draw):
    """Issue 35: the SRAM box wrote "m, ℓ, acc" above pseudocode, and chapter 9's code cells,
    that write l. One name for the running sum: l, the name in the code."""
    text = flat(draw("flash_attention_tiles"))
    assert "ℓ" not in text
    assert "m, l, acc" in text and "update m, l, acc" in text and "O_i = acc / l" in text


@pytest.mark.parametrize("i, j, omega", [(3, 1, 0.5), (0, 4, 1.0), (6, 6, 0.25)])
def test_rope_rotation_turns_each_pair_by_its_position_times_omega(draw, i, j, omega):
    graph = diagram_graph(draw("rope_rotation", i=i, j=j, omega=omega))

    def angle(role, name):
        (ox, oy), (x, y) = graph.nodes[f"{role}: origin"][:2], graph.nodes[f"{role}: {name}"][:2]
        return math.atan2(y - oy, x - ox)

    for role, letter, position in (("query", "q", i), ("key", "k", j)):
        turn = angle(role, letter + "′") - angle(role, letter)
        assert math.remainder(turn - position * omega, 2 * math.pi) == pytest.approx(0, abs=1e-9)
        assert graph.sources(f"{role}: {letter}′") == [f"{role}: origin"]
    between = (angle("query", "q′") - angle("key", "k′")) - (angle("query", "q")
                                                              - angle("key", "k"))
    assert math.remainder(between - (i - j) * omega, 2 * math.pi) == pytest.approx(0, abs=1e-9)


@pytest.mark.parametrize("n_heads, n_kv_heads", [(8, 2), (8, 8), (8, 1), (6, 3), (4, 2)])
def test_gqa_sharing_groups_query_heads_as_repeat_kv_does(draw, n_heads, n_kv_heads):
    graph = diagram_graph(draw("gqa_sharing", n_heads=n_heads, n_kv_heads=n_kv_heads))
    # the package's own mapping: repeat_kv puts key/value head h // n_rep at query head h
    kv_of = repeat_kv(torch.arange(n_kv_heads, dtype=torch.float)[None, :, None, None],
                      n_heads // n_kv_heads)[0, :, 0, 0].long().tolist()
    for h in range(n_heads):
        assert graph.sources(f"q{h}") == [f"kv{kv_of[h]}"]
    assert sum(n.startswith("kv") for n in graph.nodes) == n_kv_heads


@pytest.mark.parametrize("window, steps", [(4, 7), (3, 10), (2, 1)])
def test_rolling_kv_cache_writes_position_p_into_slot_p_mod_w(draw, window, steps):
    fig = draw("rolling_kv_cache", window=window, steps=steps)
    cells = {t.get_gid(): t for t in fig.axes[0].texts if (t.get_gid() or "").startswith("cell:")}
    assert len(cells) == window * steps
    buffer: list[int | None] = [None] * window  # what RollingKVCache holds, slot by slot
    for p in range(steps):
        buffer[p % window] = p
        for j in range(window):
            text = cells[f"cell:{p}:{j}"]
            assert text.get_text() == ("–" if buffer[j] is None else str(buffer[j]))
            assert (text.get_fontweight() == "bold") == (j == p % window)


@pytest.mark.parametrize("rope", [True, False])
def test_mla_caches_only_the_latent_and_rebuilds_keys_and_values(draw, rope):
    graph = diagram_graph(draw("mla_latent_cache", decoupled_rope=rope))
    cache = graph.nodes["cache"]
    inside = {n for n, (l, b, r, t) in graph.nodes.items()
              if n != "cache" and cache[0] <= l and r <= cache[2] and cache[1] <= b
              and t <= cache[3]}
    assert inside == ({"c_kv", "k_rope"} if rope else {"c_kv"})
    assert graph.sources("c_kv") == ["kv_down"] and graph.sources("kv_down") == ["x"]
    assert sorted(graph.targets("c_kv")) == ["k_up", "v_up"]
    assert graph.sources("K") == ["k_up"] and graph.sources("V") == ["v_up"]
    expected = ["K", "Q", "V"] + (["k_rope"] if rope else [])
    assert sorted(graph.sources("attention")) == sorted(expected)


@pytest.mark.parametrize("n_layers", [1, 2, 4])
def test_minigpt_architecture_follows_the_model_modules(draw, n_layers):
    graph = diagram_graph(draw("minigpt_architecture", n_layers=n_layers))
    assert sorted(graph.sources("add")) == ["embed", "pos"]
    chain = ["add", *(f"blocks[{i}]" for i in range(n_layers)), "norm", "lm_head", "logits"]
    for a, b in itertools.pairwise(chain):
        assert graph.targets(a) == [b], a
    model = course_attn.MiniGPT(course_attn.GPTConfig(vocab_size=5, context_length=4,
                                                      n_layers=n_layers))
    for name in ("embed", "pos", "norm", "lm_head"):  # the drawing uses the module names
        assert hasattr(model, name) and name in graph.nodes
    block = model.blocks[0]
    assert block.norm_first and all(hasattr(block, m) for m in ("norm1", "norm2", "ff"))
    fig = draw("minigpt_architecture", n_layers=n_layers, render=True)
    assert f"× N N = {n_layers}" in flat(fig)  # the blocks are one block repeated N times
    renderer, ax = fig.canvas.get_renderer(), fig.axes[0]
    times_n = next(t for t in ax.texts if t.get_text() == "× N").get_window_extent(renderer)
    (_, first), (left, last) = ax.transData.transform(
        [graph.nodes["blocks[0]"][:2], graph.nodes[f"blocks[{n_layers - 1}]"][::3]])
    assert times_n.x1 < left and first <= times_n.y0 <= last  # beside the stack of blocks
    inner = {(a.removeprefix("block: "), b.removeprefix("block: "))
             for a, b in graph.pairs() if a.startswith("block: ")}
    assert inner == {("x", "norm1"), ("norm1", "attn"), ("attn", "add1"), ("x", "add1"),
                     ("add1", "norm2"), ("norm2", "ff"), ("ff", "add2"), ("add1", "add2"),
                     ("add2", "y")}


@pytest.mark.parametrize("n_between", [0, 2, 4])
def test_induction_circuit_reads_the_token_after_the_earlier_copy(draw, n_between):
    fig = draw("induction_circuit", n_between=n_between)
    graph = diagram_graph(fig)
    labels = {t.get_gid().removeprefix("label:"): t.get_text() for t in fig.axes[0].texts
              if (t.get_gid() or "").startswith("label:")}
    last = n_between + 2
    tokens = [labels[f"token {i}"] for i in range(last + 1)]
    assert tokens[0] == tokens[last] == "A" and len(set(tokens[:last])) == last
    for i in range(1, last + 1):  # blocks[0]: every position reads the one before it
        assert f"token {i - 1}" in graph.sources(f"token {i}")
    # blocks[1]: the later A reads the position right after the earlier A ...
    earlier = tokens.index(tokens[last])
    assert sorted(graph.sources(f"token {last}")) == sorted([f"token {last - 1}",
                                                             f"token {earlier + 1}"])
    # ... and that token is the prediction
    assert graph.sources("prediction") == [f"token {last}"]
    assert labels["prediction"].endswith(tokens[earlier + 1])


# ----------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("name, kwargs, error, match", [
    ("attention_pooling", {"t": 1}, ValueError, r"^t must be at least 2"),
    ("attention_pooling", {"t": 9}, ValueError, r"^t must be at most 8"),
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
    ("scaled_dot_product_graph", {"masked": "yes"}, TypeError, r"^masked must be a bool"),
    ("head_split_merge", {"d_model": 7, "n_heads": 2}, ValueError,
     r"^d_model=7 must be divisible by n_heads=2"),
    ("head_split_merge", {"n_heads": 5}, ValueError, r"^n_heads must be at most 4"),
    ("head_split_merge", {"t": 5, "d_model": 8, "n_heads": 1}, ValueError,
     r"^t \* head_dim = 5 \* 8 must be at most 20"),
    ("head_split_merge", {"t": 1.5}, TypeError, r"^t must be a positive int"),
    ("multi_head_block", {"n_heads": 7}, ValueError, r"^n_heads must be at most 6"),
    ("pre_norm_vs_post_norm", {"attention_label": ""}, ValueError, r"^attention_label must be"),
    ("pre_norm_vs_post_norm", {"ffn_label": 3}, TypeError, r"^ffn_label must be a str"),
    ("pre_norm_vs_post_norm", {"norm_label": "x" * 23}, ValueError,
     r"^norm_label must have at most 22 characters"),
    ("encoder_decoder_flow", {"n_layers": 4}, ValueError, r"^n_layers must be at most 3"),
    ("encoder_decoder_flow", {"n_layers": "2"}, TypeError, r"^n_layers must be a positive int"),
    ("kv_cache_steps", {"steps": 0}, ValueError, r"^steps must be a positive int"),
    ("kv_cache_steps", {"steps": 6}, ValueError, r"^steps must be at most 5"),
    ("flash_attention_tiles", {"n_blocks": 5}, ValueError, r"^n_blocks must be at most 4"),
    ("flash_attention_tiles", {"query_block": 4}, ValueError, r"^query_block must be an int in"),
    ("flash_attention_tiles", {"kv_block": -1}, ValueError, r"^kv_block must be an int in"),
    ("rope_rotation", {"i": 7}, ValueError, r"^i must be an int in \[0, 6\]"),
    ("rope_rotation", {"j": 1.0}, TypeError, r"^j must be an int"),
    ("rope_rotation", {"omega": 0}, ValueError, r"^omega must be a number in \(0, 1\]"),
    ("rope_rotation", {"omega": "1"}, TypeError, r"^omega must be a number"),
    ("gqa_sharing", {"n_heads": 8, "n_kv_heads": 3}, ValueError,
     r"^n_heads=8 must be divisible by n_kv_heads=3"),
    ("gqa_sharing", {"n_heads": 9}, ValueError, r"^n_heads must be at most 8"),
    ("rolling_kv_cache", {"window": 1}, ValueError, r"^window must be at least 2"),
    ("rolling_kv_cache", {"steps": 13}, ValueError, r"^steps must be at most 12"),
    ("mla_latent_cache", {"decoupled_rope": 1}, TypeError, r"^decoupled_rope must be a bool"),
    ("minigpt_architecture", {"n_layers": 5}, ValueError, r"^n_layers must be at most 4"),
    ("induction_circuit", {"n_between": 5}, ValueError, r"^n_between must be an int in"),
])
def test_bad_arguments_are_refused_by_name_before_any_figure_is_made(name, kwargs, error, match):
    before = plt.get_fignums()
    with pytest.raises(error, match=match):
        DIAGRAMS[name](**kwargs)
    assert plt.get_fignums() == before
