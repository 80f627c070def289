"""Diagrams of chapter 10: RoPE, grouped-query and latent attention, the rolling cache.

``rope_rotation``, ``gqa_sharing``, ``mla_latent_cache`` and ``rolling_kv_cache``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from matplotlib.patches import Arc, FancyBboxPatch, Rectangle

from ..._validation import check_bool, check_nonnegative_int
from ._draw import (
    HEADING,
    INK,
    NOTE,
    ROLE_COLORS,
    WIDTH,
    Sketch,
    bounds,
    canvas,
    check_int,
    check_real,
    diagram,
    fitting,
    point,
    shade,
    shape_text,
    text_size,
    tint,
    vector,
    wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["gqa_sharing", "mla_latent_cache", "rolling_kv_cache", "rope_rotation"]


# ---------------------------------------------------------------------- chapter 10: RoPE

_ROPE_VECTORS = {"query": (1.0, 0.18), "key": (0.72, 0.62)}  # one feature pair of each


def _rope_panel(s: Sketch, cx: float, role: str, position: int, omega: float,
                letter: str, symbol: str) -> None:
    """One pair of features as a 2-D vector, and the same pair rotated by position · ω."""
    radius, o = 1.35, (cx - 0.25, 2.6)
    color = ROLE_COLORS[role]
    vec = _ROPE_VECTORS[role]
    before = math.atan2(vec[1], vec[0])
    after = before + position * omega
    for dx, dy in ((-0.35, 0), (radius + 0.35, 0), (0, -0.5), (0, radius + 0.3)):
        s.ax.plot([o[0], o[0] + dx], [o[1], o[1] + dy], color="#BBBBBB", lw=0.8)
    point(s, f"{role}: origin", o)
    length = radius * math.hypot(*vec) / 1.02
    for name, angle, tone, lw in ((letter, before, tint(color, 0.45), 1.6),
                                   (f"{letter}′", after, color, 2.4)):
        tip = (o[0] + length * math.cos(angle), o[1] + length * math.sin(angle))
        vector(s, f"{role}: origin", f"{role}: {name}", tip, tone, lw=lw)
        if position == 0 and name == letter:
            continue  # not turned: one label for both, drawn with the second
        text = f"{letter} = {letter}′" if position == 0 else name
        s.text(tip[0] + 0.2 * math.cos(angle), tip[1] + 0.2 * math.sin(angle), text,
               color=shade(color, 0.2), fontweight="bold")
    if position:
        s.ax.add_patch(Arc(o, 1.1, 1.1, theta1=math.degrees(before), theta2=math.degrees(after),
                           color=INK, lw=1.2))
        mid = (before + after) / 2
        s.text(o[0] + 0.85 * math.cos(mid) + 0.12, o[1] + 0.85 * math.sin(mid),
               f"{symbol}·ω", color=INK)


@diagram
def rope_rotation(i: int = 3, j: int = 1, omega: float = 0.5) -> Figure:
    """Rotary position embedding on one pair of features: the query's pair at position i is turned by the angle i·ω and the key's pair at position j by j·ω, so the angle between them, and their dot product, changes by (i − j)·ω and depends on the positions only through their difference.

    Chapter 10 (RoPE, ``apply_rope``: the pair ``(x[2k], x[2k+1])`` of a query or key at
    position ``p`` turns by ``p·ω_k``, ``ω_k = 10000^(-2k/d)``; the chapter's "Why rotate?"
    names the positions i and j). ``i`` and ``j`` are the positions of the query and the
    key (0 to 6), ``omega`` the turn per position of this pair, in radians (0 to 1; the
    first pair turns by 1). Parts are named ``query: q``, ``query: q′`` (turned),
    ``key: k`` and ``key: k′``.
    """  # noqa: E501
    i = check_nonnegative_int(i, "i", upper=6)
    j = check_nonnegative_int(j, "j", upper=6)
    omega = check_real(omega, "omega", 0.0, 1.0)

    height = 5.45
    s = canvas(height, "RoPE: each pair of features turns by position × ω")
    for cx, role, position, letter, symbol in ((1.75, "query", i, "q", "i"),
                                               (5.25, "key", j, "k", "j")):
        s.text(cx, height - 0.7, f"{role} at position {symbol} = {position}", HEADING,
               fontweight="bold")
        _rope_panel(s, cx, role, position, omega, letter, symbol)
        s.text(cx, 1.6, f"turned by {symbol}·ω = {position} × {omega:g} = "
               f"{position * omega:.2f} rad")
    s.ax.plot([3.5, 3.5], [1.4, height - 0.5], color="#CCCCCC", lw=1)
    nb = "\u00a0"  # a space that _wrap does not break at
    s.text(0.15, 0.1, wrap(f"Each arrow is one pair of features of a query or a key. Both "
                            f"turn the same way, so the angle between q′ and k′ is the angle "
                            f"between q and k plus (i{nb}−{nb}j)·ω = {(i - j) * omega:.2f} rad: "
                            f"the score q′·k′ sees the positions only through i{nb}−{nb}j.",
                            WIDTH - 0.3), ha="left", va="bottom", color=NOTE)
    return s.fig


# --------------------------------------------------- chapter 10: grouped-query attention

@diagram
def gqa_sharing(n_heads: int = 8, n_kv_heads: int = 2) -> Figure:
    """Grouped-query attention: H query heads share fewer key/value heads; each group of H / H_kv consecutive query heads reads one key/value head, so only the H_kv key/value heads are cached (H_kv = H is multi-head attention, H_kv = 1 is multi-query attention).

    Chapter 10 (multi-query and grouped-query attention, ``repeat_kv``). ``n_heads`` is H
    (1 to 8) and ``n_kv_heads`` is H_kv, which must divide it. Query head h reads key/value
    head h // (H / H_kv). Parts are named ``q0`` ..., ``k0``, ``v0`` ... and ``kv0`` ...
    (a key head and its value head together)
    """  # noqa: E501
    n_heads = check_int(n_heads, "n_heads", high=8)
    n_kv_heads = check_int(n_kv_heads, "n_kv_heads", high=8)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads} "
                         f"(each key/value head serves n_heads / n_kv_heads query heads)")
    group = n_heads // n_kv_heads

    height = 4.35
    s = canvas(height, "Grouped-query attention: query heads share key/value heads")
    width = (WIDTH - 0.6 - (n_heads - 1) * 0.1) / n_heads
    q_y, kv_y = height - 1.05, height - 2.65
    for h in range(n_heads):
        s.box(f"q{h}", 0.3 + width / 2 + h * (width + 0.1), q_y, width, 0.42, f"q{h}", "query")
    for g in range(n_kv_heads):
        left = s.record.nodes[f"q{g * group}"][0]
        right = s.record.nodes[f"q{(g + 1) * group - 1}"][2]
        cx, w = (left + right) / 2, min(right - left, max(0.9, 0.6 * (right - left)))
        s.box(f"k{g}", cx - w / 4, kv_y, w / 2, 0.5, f"k{g}", "key")
        s.box(f"v{g}", cx + w / 4, kv_y, w / 2, 0.5, f"v{g}", "value")
        s.node(f"kv{g}", bounds(cx - w / 2, kv_y - 0.25, cx + w / 2, kv_y + 0.25))
        for h in range(g * group, (g + 1) * group):  # the query heads of this group
            q = s.record.nodes[f"q{h}"]
            x = cx + (h - g * group - (group - 1) / 2) * min(0.2, w / (group + 1))
            s.arrow((x, kv_y + 0.25), ((q[0] + q[2]) / 2, q[1]), f"kv{g}", f"q{h}")
    s.text(0.15, q_y + 0.45, f"H = {n_heads} query heads", ha="left", va="bottom", color=NOTE)
    s.text(0.15, kv_y - 0.45, f"H_kv = {n_kv_heads} key/value heads: query head h reads "
           f"head h // {group}", ha="left", va="top", color=NOTE)
    s.text(0.15, 0.12, wrap(f"Cached per token and layer: 2 × H_kv × head_dim numbers, "
                             f"{group} times fewer than multi-head attention's 2 × H × head_dim. "
                             "The shared heads are repeated just before attending.",
                             WIDTH - 0.3), ha="left", va="bottom", color=NOTE)
    return s.fig


# ----------------------------------------------- chapter 10: multi-head latent attention

def _mla_cache(s: Sketch, y: float, rope: bool) -> None:
    """The projections from x and what is cached: the latent c (and the shared k_rope)."""
    x = s.record.nodes["x"]
    parts = [("q_proj", 0.95, "q_proj" + ("\n+ q_rope_proj" if rope else ""), "query"),
             ("kv_down", 3.3, "kv_down\nLinear(D, d_latent)", "layer")]
    if rope:
        parts.append(("k_rope_proj", 5.75, "k_rope_proj\n+ RoPE", "key"))
    for name, cx, text, role in parts:
        s.box(name, cx, y, 1.95 if name == "kv_down" else 1.6, 0.6, text, role)
        s.arrow((WIDTH / 2 + (cx - 3.5) / 5, x[1] - 0.03), (cx, y + 0.3), "x", name)
    cached = [("c_kv", 3.3, "latent c\n(B, T, d_latent)", "input", "kv_down")]
    if rope:
        cached.append(("k_rope", 5.75, "k_rope\n(B, T, d_rope)", "key", "k_rope_proj"))
    for name, cx, text, role, source in cached:
        s.box(name, cx, y - 1.05, 1.7, 0.6, text, role, fill=0.6)
        s.arrow((cx, y - 0.3), (cx, y - 0.75), source, name)
    right = 6.75 if rope else 4.35
    s.ax.add_patch(FancyBboxPatch((2.3, y - 1.55), right - 2.3, 0.95,
                                  boxstyle="round,pad=0,rounding_size=0.08", fill=False,
                                  edgecolor=shade(ROLE_COLORS["mask"], 0.1), lw=1.4, ls="--"))
    s.node("cache", bounds(2.3, y - 1.55, right, y - 0.6))
    s.text(2.4, y - 0.57, "KV cache", ha="left", va="bottom",
           color=shade(ROLE_COLORS["mask"], 0.1), fontweight="bold")


def _mla_heads(s: Sketch, y: float, rope: bool) -> None:
    """Up-projections from the latent to every head's keys and values, then attention."""
    c = s.record.nodes["c_kv"]
    q = s.box("Q", 0.95, y, 1.6, 0.6, "Q: H heads" + ("\n+ q_rope" if rope else ""), "query")
    s.arrow((0.95, s.record.nodes["q_proj"][1]), (0.95, q["top"]), "q_proj", "Q")
    for name, cx, role, rebuilt in (("k_up", 2.55, "key", "K"), ("v_up", 4.15, "value", "V")):
        up = s.box(name, cx, y + 0.55, 1.25, 0.42, name, role)
        s.arrow(((c[0] + c[2]) / 2 + (cx - 3.35) / 4, c[1]), (cx, up["top"]), "c_kv", name)
        s.box(rebuilt, cx, y - 0.4, 1.4, 0.42, f"{rebuilt}: H heads", role)
        s.arrow((cx, up["bottom"]), (cx, y - 0.19), name, rebuilt)
    formula = "softmax((q_h·k_h" + (" + q_rope,h·k_rope" if rope else "") + ") / √width) v_h"
    one_line = text_size(f"attention, each head h: {formula}")[0] <= WIDTH - 0.7
    att = s.box("attention", WIDTH / 2, y - 1.35, WIDTH - 0.5, 0.62 if one_line else 0.86,
                "attention, each head h:" + (" " if one_line else "\n") + formula, "weights")
    sources = [("Q", 0.95), ("K", 2.55), ("V", 4.15)] + ([("k_rope", 5.75)] if rope else [])
    for name, cx in sources:
        s.arrow((cx, s.record.nodes[name][1]), (cx, att["top"]), name, "attention")
    out = s.box("out_proj", WIDTH / 2, att["bottom"] - 0.55, 1.6, 0.42, "out_proj", "layer")
    s.arrow((WIDTH / 2, att["bottom"]), (WIDTH / 2, out["top"]), "attention", "out_proj")


@diagram
def mla_latent_cache(decoupled_rope: bool = True) -> Figure:
    """Multi-head latent attention: x is compressed by a down-projection into a small latent vector c, the only thing cached per token (with one shared rotated key part when RoPE is decoupled); up-projections rebuild every head's keys and values from c.

    Chapter 10 (multi-head latent attention, ``MultiHeadLatentAttention``; its layers are
    named ``q_proj``, ``kv_down``, ``k_up``, ``v_up``, ``k_rope_proj`` and ``out_proj``, as
    are the parts of the drawing, with ``x``, ``c_kv``, ``k_rope``, ``Q``, ``K``, ``V``,
    ``attention`` and ``cache``). ``decoupled_rope=False`` leaves out the rotated key part.
    """  # noqa: E501
    rope = check_bool(decoupled_rope, "decoupled_rope")

    width = "head_dim + d_rope" if rope else "head_dim"
    note = wrap(f"Cached per token and layer: d_latent{' + d_rope' if rope else ''} numbers "
                f"instead of 2 × H × head_dim; √width = √({width}). Decoding with absorb=True "
                "folds k_up into the query and v_up into out_proj, so K and V are never "
                "rebuilt.", WIDTH - 0.3)
    height = 6.9 + text_size(note)[1]  # the drawing, then the note under it
    s = canvas(height, "Multi-head latent attention: cache a small latent")
    s.label("x", WIDTH / 2, height - 0.8, "x " + shape_text(("B", "T", "D")), va="top")
    _mla_cache(s, height - 1.75, rope)
    _mla_heads(s, height - 4.3, rope)
    s.text(0.15, 0.12, note, ha="left", va="bottom", color=NOTE)
    return s.fig


# ------------------------------------------------------ chapter 10: the rolling KV cache

def _rolling_row(s: Sketch, p: int, window: int, y: float, cell: float) -> None:
    """The buffer after position ``p`` is written into slot ``p % window``."""
    slot = p % window
    s.text(0.55, y, f"p = {p}", ha="center")
    for j in range(window):
        # the position held by slot j: the last q <= p with q % window == j
        held = p - ((p - j) % window)
        new = j == slot
        role = "key" if held >= 0 else "input"
        color = ROLE_COLORS["key"] if new else (tint(ROLE_COLORS["key"], 0.25) if held >= 0
                                                 else "white")
        left = 1.1 + j * cell
        patch = Rectangle((left, y - 0.14), cell, 0.28, facecolor=color, edgecolor="#999999",
                          lw=0.8)
        patch.set_gid(f"role:{role}" if held >= 0 else None)
        s.ax.add_patch(patch)
        s.text(left + cell / 2, y, str(held) if held >= 0 else "–",
               fontweight="bold" if new else "normal", gid=f"cell:{p}:{j}")
        s.node(f"step {p}: slot {j}", bounds(left, y - 0.14, left + cell, y + 0.14))
    note = f"→ slot {slot} ({p} mod {window})" + (f", replaces {p - window}" if p >= window
                                                   else "")
    s.text(1.25 + window * cell, y, note, ha="left", color=NOTE)


@diagram
def rolling_kv_cache(window: int = 4, steps: int = 7) -> Figure:
    """The rolling buffer of a sliding-window KV cache: W slots, and the key and value of position p are written into slot p mod W, over position p − W, which has just left the window; the buffer always holds the last W positions.

    Chapter 10 (sliding-window attention, ``RollingKVCache``). ``window`` is W (2 to 6) and
    ``steps`` the number of positions written, one row each (1 to 12). Each row shows the
    positions the slots hold after that step; the slot just written is drawn in bold.
    """  # noqa: E501
    window = check_int(window, "window", low=2, high=6)
    steps = check_int(steps, "steps", high=12)

    cell = min(0.62, 2.5 / window)  # the note after the slots fits the width
    height = 0.6 + 0.5 + steps * 0.34 + 0.2 + 0.65
    s = canvas(height, f"The rolling KV cache: {window} slots, position p in slot p mod W")
    top = height - 0.95
    for j in range(window):
        s.text(1.1 + (j + 0.5) * cell, top + 0.05, fitting([f"slot {j}", str(j)], cell),
               va="bottom")
    s.text(0.55, top + 0.05, "written", va="bottom")
    for p in range(steps):
        _rolling_row(s, p, window, top - 0.17 - p * 0.34, cell)
    s.text(0.15, 0.12, wrap("The buffer holds exactly the keys that query p may see, "
                             "p − W < j ≤ p; read oldest first, it starts at slot (p + 1) "
                             "mod W once full.", WIDTH - 0.3), ha="left", va="bottom",
           color=NOTE)
    return s.fig
