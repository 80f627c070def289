"""Chapter 10: the course's masks as FlexAttention mods equal their tensors; BlockMask tiles."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import and_masks, create_block_mask, create_mask
from torch.testing import assert_close

from course_attn.core import flex_attention as flex
from course_attn.core.attention import attention
from course_attn.core.flex_attention import causal_mask_mod
from course_attn.core.masks import causal_mask, document_mask, padding_mask
from course_attn.core.tiled import block_grid
from course_attn.modern.alibi import alibi_bias, alibi_slopes
from course_attn.modern.mask_mods import (
    BlockTiles,
    alibi_score_mod,
    block_mask_grid,
    block_mask_tiles,
    document_mask_mod,
    padding_mask_mod,
    sliding_window_mask_mod,
)
from course_attn.modern.sliding_window import sliding_window_mask


def dense(mod, t_q: int, t_k: int, batch: int = 1) -> torch.Tensor:
    """What a mask_mod allows, ``(batch, T_q, T_k)``, evaluated by PyTorch (vmap)."""
    return create_mask(mod, batch, 1, t_q, t_k, "cpu")[:, 0]


@pytest.mark.parametrize("t_q,t_k", [(6, 6), (2, 6), (6, 3)])
def test_causal_and_sliding_window_mods_are_the_course_masks(t_q, t_k):
    offset = t_k - t_q
    assert torch.equal(dense(causal_mask_mod(offset), t_q, t_k)[0], causal_mask(t_q, t_k))
    if offset >= 0:
        mod = sliding_window_mask_mod(3, offset=offset)
        assert torch.equal(dense(mod, t_q, t_k)[0], sliding_window_mask(t_q, t_k, window=3))


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_padding_mod_is_chapter_5s_key_mask(side):
    real = padding_mask([5, 2, 0], 5, side=side)  # (3, 5): a row without any real token too
    allowed = dense(padding_mask_mod(real), 4, 5, batch=3)
    assert torch.equal(allowed, real[:, None, :].expand(3, 4, 5))


def test_the_document_mod_is_the_document_mask_and_with_causal_a_decoders():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 2], [4, 4, 4, 4, 5, 5]])
    same = dense(document_mask_mod(doc_ids), 6, 6, batch=2)
    assert torch.equal(same, document_mask(doc_ids))
    decoder = dense(and_masks(causal_mask_mod(), document_mask_mod(doc_ids)), 6, 6, batch=2)
    assert torch.equal(decoder, document_mask(doc_ids) & causal_mask(6))
    assert decoder[0, 3].tolist() == [False, False, False, True, False, False]


def test_alibi_as_a_score_mod_equals_chapter_10s_bias(monkeypatch):
    monkeypatch.setattr(flex, "FLEX_COMPILE", False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, t, 8, generator=g) for t in (3, 7, 7))
    slopes = alibi_slopes(4)
    out = flex.flex_attend(q, k, v, mask_mod=causal_mask_mod(4),
                           score_mod=alibi_score_mod(slopes, offset=4))
    expected, _ = attention(q, k, v, is_causal=True, bias=alibi_bias(3, 7, slopes))
    assert_close(out, expected)


def _tiles_by_hand(allowed: torch.Tensor, block: int) -> tuple[int, int, int]:
    """Skipped, partial and full tiles of a dense ``(T, T)`` mask, counted directly."""
    t = allowed.shape[0] // block
    tiles = allowed.reshape(t, block, t, block).transpose(1, 2).reshape(t, t, -1)
    any_, all_ = tiles.any(-1), tiles.all(-1)
    return int((~any_).sum()), int((any_ & ~all_).sum()), int(all_.sum())


@pytest.mark.parametrize("name", ["causal", "sliding window", "documents"])
def test_block_mask_tiles_count_what_a_dense_mask_shows_at_t_1024(name):
    t = 1024
    doc_ids = torch.tensor([[0] * 300 + [1] * 500 + [2] * 224])
    mod = {"causal": causal_mask_mod(),
           "sliding window": sliding_window_mask_mod(256),
           "documents": and_masks(causal_mask_mod(), document_mask_mod(doc_ids))}[name]
    tiles = block_mask_tiles(create_block_mask(mod, 1, 1, t, t, device="cpu"))
    assert isinstance(tiles, BlockTiles) and tiles.total == 64 and tiles.block_size == (128, 128)
    assert (tiles.skipped, tiles.partial, tiles.full) == _tiles_by_hand(dense(mod, t, t)[0], 128)
    if name == "causal":
        assert (tiles.skipped, tiles.partial, tiles.full) == (28, 8, 28)


def test_the_grid_of_a_causal_block_mask_is_chapter_9s_block_grid():
    causal = create_block_mask(causal_mask_mod(), 1, 1, 1024, 1024, device="cpu")
    assert torch.equal(block_mask_grid(causal), block_grid(1024, 1024, 128, 128, is_causal=True))
    # T = 1000: FlexAttention pads the last tile row to 128 queries and masks the padding, so
    # that row's tiles are partial, where chapter 9's kernel (ragged tiles) computes them full
    ragged = block_mask_grid(create_block_mask(causal_mask_mod(), 1, 1, 1000, 1000, "cpu"))
    expected = block_grid(1000, 1000, 128, 128, is_causal=True)
    assert torch.equal(ragged[:-1], expected[:-1])
    assert ragged[-1].tolist() == [1] * 8 and expected[-1].tolist() == [2] * 7 + [1]


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"window must be a positive int, got 0"):
        sliding_window_mask_mod(0)
    with pytest.raises(TypeError, match=r"attention_mask must have dtype torch.bool"):
        padding_mask_mod(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"doc_ids must never decrease"):
        document_mask_mod(torch.tensor([[0, 1, 0]]))
    with pytest.raises(ValueError, match=r"doc_ids must have shape \(B, T\), got \(3,\)"):
        document_mask_mod(torch.tensor([0, 0, 1]))
    with pytest.raises(TypeError, match=r"block_mask must be a BlockMask"):
        block_mask_tiles(causal_mask(4))
    block_mask = create_block_mask(causal_mask_mod(), 1, 1, 128, 128, device="cpu")
    with pytest.raises(ValueError, match=r"head"):
        block_mask_tiles(block_mask, head=1)
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"q must have 4 dimensions"):
        flex.flex_attend(q[0], q[0], q[0])
    with pytest.raises(ValueError, match=r"q, k and v must share \(B, H\)"):
        flex.flex_attend(q, q[:, :1], q[:, :1])
    with pytest.raises(TypeError, match=r"mask_mod must be a function or None, got Tensor"):
        flex.flex_attend(q, q, q, mask_mod=causal_mask(4))
    with pytest.raises(ValueError, match=r"give mask_mod or block_mask"):
        flex.flex_attend(q, q, q, mask_mod=causal_mask_mod(),
                         block_mask=create_block_mask(causal_mask_mod(), 1, 1, 4, 4, "cpu"))
