"""Chapter 10: the course's masks and biases written as FlexAttention mods, and their tiles.

Each mask of chapters 5, 10 and 11 as a ``mask_mod(b, h, q_idx, kv_idx) -> bool``
(``True`` = may attend) and ALiBi as a ``score_mod(score, b, h, q_idx, kv_idx)``: the rule
itself, evaluated by the kernel where it needs it, instead of a ``(T_q, T_k)`` tensor read
from memory. Combine them with PyTorch's ``and_masks`` / ``or_masks``; give them to
``course_attn.core.flex_attention.flex_attend`` or to ``create_block_mask``.
:func:`block_mask_grid` lays out the tiles a ``BlockMask`` skips as chapter 9's
``block_grid`` does (its kernel skips the key blocks in a query block's future), and
:func:`block_mask_tiles` counts them.

The mods that read a tensor (padding, documents) clamp their indices to it: a kernel may
evaluate a mod on the padded end of a last, partial tile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from .._validation import (
    check_doc_ids,
    check_nonnegative_int,
    check_positive_int,
    check_tensor,
)
from ..core.flex_attention import MaskMod, ScoreMod

__all__ = [
    "BlockTiles",
    "alibi_score_mod",
    "block_mask_grid",
    "block_mask_tiles",
    "document_mask_mod",
    "padding_mask_mod",
    "sliding_window_mask_mod",
]


def sliding_window_mask_mod(window: int, *, offset: int = 0) -> MaskMod:
    """Chapter 10's sliding window as code: query ``i`` may attend the last ``window`` keys
    up to ``i + offset`` (itself included), as ``sliding_window_mask`` (Chapter 10).

    ``offset = T_k - T_q`` aligns it bottom-right (queries after a KV cache).
    """
    window = check_positive_int(window, "window")
    offset = check_nonnegative_int(offset, "offset")

    def in_window(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        newest = q_idx + offset
        return (kv_idx <= newest) & (kv_idx > newest - window)

    return in_window


def padding_mask_mod(attention_mask: Tensor) -> MaskMod:
    """Chapter 5's key padding as code: no query attends a pad (Chapter 10).

    ``attention_mask (B, T_k)`` is ``True`` on real tokens (left or right padding alike);
    the mod reads one entry per (row, key).
    """
    check_tensor(attention_mask, "attention_mask", ndim=2, floating=False)
    if attention_mask.dtype != torch.bool:
        raise TypeError(f"attention_mask must have dtype torch.bool (True on real tokens), got "
                        f"{attention_mask.dtype}")
    last_row, last_key = attention_mask.shape[0] - 1, attention_mask.shape[1] - 1

    def real_key(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return attention_mask[b.clamp(max=last_row), kv_idx.clamp(max=last_key)]

    return real_key


def document_mask_mod(doc_ids: Tensor) -> MaskMod:
    """Chapter 11's packed documents as code: a query attends its own document only.

    ``doc_ids (B, T)`` numbers the document of each token (``document_mask`` is the tensor
    form). Not causal by itself: ``and_masks(causal_mask_mod(), document_mask_mod(ids))``
    is a decoder's mask on packed rows.
    """
    doc_ids = check_doc_ids(doc_ids)
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must have shape (B, T), got {tuple(doc_ids.shape)}")
    last_row, last = doc_ids.shape[0] - 1, doc_ids.shape[1] - 1

    def same_document(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        row = b.clamp(max=last_row)
        return doc_ids[row, q_idx.clamp(max=last)] == doc_ids[row, kv_idx.clamp(max=last)]

    return same_document


def alibi_score_mod(slopes: Tensor, *, offset: int = 0) -> ScoreMod:
    """ALiBi as code: ``score - slope[h] * (query position - key position)`` (Chapter 10).

    ``slopes (H,)`` from ``alibi_slopes``; ``offset = T_k - T_q`` places the queries last,
    as ``alibi_bias`` does. The bias is computed per score, never stored.
    """
    check_tensor(slopes, "slopes", ndim=1)
    offset = check_nonnegative_int(offset, "offset")

    def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        distance = (q_idx + offset - kv_idx).to(score.dtype)
        return score - slopes[h].to(score.dtype) * distance

    return alibi


class BlockTiles(NamedTuple):
    """How a ``BlockMask`` sorts the tiles of one (batch, head) (Chapter 10)."""

    skipped: int  #: no (query, key) pair allowed: never computed
    partial: int  #: some pairs allowed: computed, the mask_mod evaluated per score
    full: int  #: every pair allowed: computed, no mask_mod evaluated
    block_size: tuple[int, int]  #: (query rows, key columns) of a tile

    @property
    def total(self) -> int:
        return self.skipped + self.partial + self.full


def block_mask_grid(block_mask: BlockMask, *, batch: int = 0, head: int = 0) -> Tensor:
    """The tiles of ``block_mask`` for one (batch, head), as chapter 9's ``block_grid``
    draws them (Chapter 10): ``(query tiles, key tiles)`` long, 0 = skipped, 1 = partial
    (computed, the mask_mod evaluated per score), 2 = full (computed, no mask_mod). Draw it
    with ``viz.plot_blocks(grid, block_q=..., block_k=...)``.
    """
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a BlockMask (create_block_mask), got "
                        f"{type(block_mask).__name__}")
    n_b, n_h, rows = block_mask.kv_num_blocks.shape
    check_nonnegative_int(batch, "batch", upper=n_b - 1)
    check_nonnegative_int(head, "head", upper=n_h - 1)
    columns = -(-block_mask.seq_lengths[1] // block_mask.BLOCK_SIZE[1])  # key tiles
    grid = torch.zeros(rows, columns, dtype=torch.long)  # (query tiles, key tiles)
    kinds = [(1, block_mask.kv_num_blocks, block_mask.kv_indices),
             (2, block_mask.full_kv_num_blocks, block_mask.full_kv_indices)]
    for kind, counts, indices in kinds:
        if counts is None or indices is None:
            continue  # a BlockMask made without separate full tiles
        for row in range(rows):  # the first counts[row] indices are this row's tiles
            grid[row, indices[batch, head, row, :int(counts[batch, head, row])].cpu()] = kind
    return grid


def block_mask_tiles(block_mask: BlockMask, *, batch: int = 0, head: int = 0) -> BlockTiles:
    """The skipped, partial and full tiles of ``block_mask`` for one (batch, head) (Ch. 10).

    At ``T = 1024`` with 128 x 128 tiles (64 in all), a causal mask skips the 28 tiles
    above the diagonal, computes the 8 on it with the mask_mod and the 28 below it without.
    """
    grid = block_mask_grid(block_mask, batch=batch, head=head)  # checks the arguments
    block_q, block_k = block_mask.BLOCK_SIZE
    skipped, partial, full = (int((grid == kind).sum()) for kind in (0, 1, 2))
    return BlockTiles(skipped, partial, full, (block_q, block_k))
