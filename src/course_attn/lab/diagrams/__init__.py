"""Explanatory diagrams (Chapters 1 to 11): the drawings of data flow and shapes, by code.

Each function draws one diagram with matplotlib alone (boxes, arrows and small grids of
cells for matrices), so it renders the same in Jupyter, on Colab and, as an SVG output (see
:func:`course_attn.lab.viz.use_sharp_figures`), on the static site. Each returns the
:class:`matplotlib.figure.Figure`, 7 inches wide for the site's 700 px column, with a title
and, as the figure's label (``fig.get_label()``), a one-sentence description to use as alt
text: the first line of the function's docstring.

Text is one size, :data:`FONT` points, chosen so that a diagram squeezed into the width of a
400 px phone screen still writes no letter under 11 px
(:func:`course_attn.lab.viz.readable_font_size`), the size the site measures there; on a
laptop the site shows it with text of 12 px or more (``tools/static/course.js``).
Formulas are plain Unicode (``Q Kᵀ / √d_k``), not mathtext, whose sub- and superscripts
would be drawn at 70 % of that size.

Colours mean the same in every diagram (:data:`ROLE_COLORS`): queries blue, keys orange,
values green, scores and attention weights purple, masks vermillion. Shapes are written with
the course's symbols (``B, T, T_q, T_k, H, D, d_k, d_v, head_dim``; see ``book/notation.md``)
and, where the diagram has sizes, with their values: ``(T, d_k) = (4, 4)``.

Every arrow between two named parts is recorded: :func:`diagram_graph` returns the graph a
diagram drew (its named boxes and the arrows between them, with the points each arrow
passes through), so the tests check *what is connected to what*, not just that something
was drawn.

In a notebook::

    from course_attn import diagrams
    diagrams.qkv_data_flow()
    plt.show()

:data:`DIAGRAMS` maps each name to its function. The diagrams live in one module per part
of the course: ``basics`` (chapters 1 to 3), ``masks_heads`` (4 to 6), ``blocks`` (7 and 8),
``efficient`` (9), ``modern`` (10) and ``mini_transformer`` (11); the drawing helpers they
share (colours, sizes, the sketch and its recorded graph) are in ``_draw``. Every public
name is importable from ``course_attn.lab.diagrams`` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ._draw import HEAD_COLORS, ROLE_COLORS, DiagramGraph, Edge, diagram_graph
from .basics import attention_pooling, dot_vs_cosine, qkv_data_flow, self_attention_shapes
from .blocks import encoder_decoder_flow, kv_cache_steps, pre_norm_vs_post_norm
from .efficient import flash_attention_tiles
from .masks_heads import head_split_merge, multi_head_block, scaled_dot_product_graph
from .mini_transformer import induction_circuit, minigpt_architecture
from .modern import gqa_sharing, mla_latent_cache, rolling_kv_cache, rope_rotation

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DIAGRAMS",
    "HEAD_COLORS",
    "ROLE_COLORS",
    "DiagramGraph",
    "Edge",
    "attention_pooling",
    "diagram_graph",
    "dot_vs_cosine",
    "encoder_decoder_flow",
    "flash_attention_tiles",
    "gqa_sharing",
    "head_split_merge",
    "induction_circuit",
    "kv_cache_steps",
    "mla_latent_cache",
    "minigpt_architecture",
    "multi_head_block",
    "pre_norm_vs_post_norm",
    "qkv_data_flow",
    "rolling_kv_cache",
    "rope_rotation",
    "scaled_dot_product_graph",
    "self_attention_shapes",
]

#: Every diagram by name, for notebooks and tests (in the order of the chapters).
DIAGRAMS: dict[str, Callable[..., Figure]] = {
    "attention_pooling": attention_pooling,
    "self_attention_shapes": self_attention_shapes,
    "dot_vs_cosine": dot_vs_cosine,
    "qkv_data_flow": qkv_data_flow,
    "scaled_dot_product_graph": scaled_dot_product_graph,
    "head_split_merge": head_split_merge,
    "multi_head_block": multi_head_block,
    "pre_norm_vs_post_norm": pre_norm_vs_post_norm,
    "encoder_decoder_flow": encoder_decoder_flow,
    "kv_cache_steps": kv_cache_steps,
    "flash_attention_tiles": flash_attention_tiles,
    "rope_rotation": rope_rotation,
    "gqa_sharing": gqa_sharing,
    "rolling_kv_cache": rolling_kv_cache,
    "mla_latent_cache": mla_latent_cache,
    "minigpt_architecture": minigpt_architecture,
    "induction_circuit": induction_circuit,
}
