"""Diagram of chapter 9: the tiles of FlashAttention's forward pass, ``flash_attention_tiles``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.patches import FancyBboxPatch

from ..._validation import check_nonnegative_int
from ._draw import (
    HEADING,
    NOTE,
    WIDTH,
    Sketch,
    canvas,
    check_int,
    diagram,
    subscript,
    text_size,
    wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["flash_attention_tiles"]


# ------------------------------------------------ chapter 9: the tiles of FlashAttention

_HBM_ROWS = (("Q", "query"), ("K", "key"), ("V", "value"), ("O", "output"))
_TILE_W, _TILE_H, _ROW_GAP = 0.46, 0.34, 0.42


def _hbm(s: Sketch, top: float, n_blocks: int, current: dict[str, int]) -> dict[str, float]:
    """HBM: Q, K, V and O as rows of blocks; returns the y of the wire above each row."""
    wires = {}
    for r, (matrix, role) in enumerate(_HBM_ROWS):
        y = top - r * (_TILE_H + _ROW_GAP)  # the top of this row's blocks
        s.text(0.42, y - _TILE_H / 2, matrix, HEADING, fontweight="bold")
        for b in range(n_blocks):
            strong = b == current[matrix]
            left = 0.65 + b * (_TILE_W + 0.06)
            s.box(f"HBM: {matrix}{b}", left + _TILE_W / 2, y - _TILE_H / 2, _TILE_W, _TILE_H,
                  f"{matrix}{subscript(b)}", role, fill=0.8 if strong else 0.15)
        wires[matrix] = y + 0.14
    return wires


def _sram(s: Sketch, wires: dict[str, float], current: dict[str, int]) -> None:
    """SRAM: the tiles of one step, the scores between them and the running state."""
    i, j = current["Q"], current["K"]
    for matrix, role in _HBM_ROWS:
        name = "SRAM: acc" if matrix == "O" else f"SRAM: {matrix}"
        text = "m, l, acc" if matrix == "O" else f"{matrix}{subscript(i if matrix == 'Q' else j)}"
        box = s.box(name, 4.65, wires[matrix], 0.95, _TILE_H, text, role, fill=0.6)
        src = f"HBM: {matrix}{current[matrix]}"
        block = s.record.nodes[src]
        x = (block[0] + block[2]) / 2
        if matrix == "O":  # the output is written back once, after the inner loop
            s.wire([(box["left"], box["cy"]), (x, box["cy"]), (x, block[3])], name, src)
            s.text(3.52, box["cy"] + 0.04, f"write O{subscript(i)}", va="bottom")
        else:
            s.wire([(x, block[3]), (x, box["cy"]), (box["left"], box["cy"])], src, name)
            s.text(3.52, box["cy"] + 0.04, f"load {matrix}{subscript(current[matrix])}",
                   va="bottom")
    scores = s.box("SRAM: S", 6.2, (wires["Q"] + wires["K"]) / 2, 1.15, 0.95,
                   f"S = Q{subscript(i)}K{subscript(j)}ᵀ\n/ √d", "weights", fill=0.5)
    for source in ("SRAM: Q", "SRAM: K"):
        y = (s.record.nodes[source][1] + s.record.nodes[source][3]) / 2
        s.arrow((s.record.nodes[source][2], y), (scores["left"], y), source, "SRAM: S")
    acc = s.record.nodes["SRAM: acc"]
    s.wire([(6.2, scores["bottom"]), (6.2, (acc[1] + acc[3]) / 2), (acc[2], (acc[1] + acc[3]) / 2)],
           "SRAM: S", "SRAM: acc")
    v = s.record.nodes["SRAM: V"]
    s.arrow((4.65, v[1]), (4.65, acc[3]), "SRAM: V", "SRAM: acc")


_FLASH_CODE = """for i in query blocks:          # outer loop, over SMs
    load Q_i; m, l, acc = -inf, 0, 0
    for j in key/value blocks:  # inner loop
        load K_j, V_j; S = Q_i K_jᵀ / √d
        update m, l, acc        # online softmax
    write O_i = acc / l"""


@diagram
def flash_attention_tiles(n_blocks: int = 4, query_block: int = 1, kv_block: int = 2) -> Figure:
    """FlashAttention-2's tiles in the memory hierarchy: Q, K, V and O stay in the GPU's large, slow HBM; the outer loop brings one block of queries into the small, fast on-chip SRAM, the inner loop brings the key and value blocks in one after the other, and the output block is written back once; the scores never leave the SRAM.

    Chapter 9 (efficient attention; the tiled forward pass). ``n_blocks`` (2 to 4) blocks of
    each matrix are drawn; ``query_block`` (i) and ``kv_block`` (j) are the blocks in SRAM.
    Sizes are the A100's, as given in the FlashAttention paper. Parts are named
    ``HBM: Q1``, ``SRAM: Q``, ``SRAM: S``, ``SRAM: acc`` ...
    """  # noqa: E501
    n_blocks = check_int(n_blocks, "n_blocks", low=2, high=4)
    query_block = check_nonnegative_int(query_block, "query_block", upper=n_blocks - 1)
    kv_block = check_nonnegative_int(kv_block, "kv_block", upper=n_blocks - 1)

    current = {"Q": query_block, "K": kv_block, "V": kv_block, "O": query_block}
    code_h = text_size(_FLASH_CODE, family="monospace")[1]
    height = 0.6 + 1.05 + 4 * (_TILE_H + _ROW_GAP) + 0.3 + code_h + 1.0
    s = canvas(height, "FlashAttention-2: tiles between HBM and SRAM")
    top = height - 1.65
    wires = _hbm(s, top, n_blocks, current)
    for left, right, title, size in ((0.2, 3.0, "HBM (GPU memory)", "40 GB, 1.5 TB/s"),
                                     (4.05, 6.9, "on-chip SRAM", "20 MB, 19 TB/s")):
        frame_top = top + 0.65
        s.ax.add_patch(FancyBboxPatch((left, frame_top - 4 * (_TILE_H + _ROW_GAP) - 0.65),
                                      right - left, 4 * (_TILE_H + _ROW_GAP) + 0.65,
                                      boxstyle="round,pad=0,rounding_size=0.08", fill=False,
                                      edgecolor="#777777", lw=1.2))
        s.text((left + right) / 2, frame_top + 0.08, title, HEADING, fontweight="bold",
               va="bottom")
        s.text((left + right) / 2, frame_top - 0.05, size, va="top", color=NOTE)
    _sram(s, wires, current)
    code_top = top - 4 * (_TILE_H + _ROW_GAP) - 0.3
    s.text(0.2, code_top, _FLASH_CODE,
           ha="left", va="top", family="monospace")
    s.text(0.2, 0.1, wrap("A100 sizes (FlashAttention paper): 192 KB of SRAM on each of 108 "
                           "SMs. Only Q, K and V are read and O (with each row's log-sum-exp) "
                           "is written; the T × T scores never reach HBM.", WIDTH - 0.4),
           ha="left", va="bottom", color=NOTE)
    return s.fig
