"""Sliding-window attention: the mask, and rolling-cache decoding equal to the full pass."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from course_attn.core.attention import ATTENTION_IMPLS, attention
from course_attn.core.masks import causal_mask, padding_mask
from course_attn.modern.gqa import grouped_query_attention
from course_attn.modern.rope import apply_rope
from course_attn.modern.sliding_window import (
    RollingKVCache,
    sliding_window_attention,
    sliding_window_mask,
)

TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def reference_mask(t_q, t_k, window):
    """Entry by entry: query i sits at position i + t_k - t_q and sees p - window < j <= p."""
    return torch.tensor([[i + t_k - t_q - window < j <= i + t_k - t_q for j in range(t_k)]
                         for i in range(t_q)])


@pytest.mark.parametrize("t_q, t_k", [(6, 6), (1, 6), (3, 8), (8, 3)])
@pytest.mark.parametrize("window", [1, 2, 3, 10])
def test_mask_matches_the_definition(t_q, t_k, window):
    mask = sliding_window_mask(t_q, t_k, window=window)
    assert torch.equal(mask, reference_mask(t_q, t_k, window))
    assert torch.equal(mask & causal_mask(t_q, t_k), mask)  # never more than causal
    if t_q <= t_k:
        assert torch.equal(mask.sum(-1), torch.arange(t_k - t_q + 1, t_k + 1).clamp(max=window))


def test_a_window_as_long_as_the_sequence_is_the_causal_mask():
    assert torch.equal(sliding_window_mask(7, window=7), causal_mask(7))
    assert torch.equal(sliding_window_mask(2, 7, window=100), causal_mask(2, 7))
    assert torch.equal(sliding_window_mask(5, window=1), torch.eye(5, dtype=torch.bool))


def qkv(t=20, heads=2, kv_heads=2, head_dim=4, batch=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, t, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, kv_heads, t, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, kv_heads, t, head_dim + 1, generator=gen, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_sliding_window_attention_is_attention_with_the_window_mask(impl):
    q, k, v = qkv()
    keys = padding_mask([20, 15], 20, side="left")[:, None, None, :]
    out, _ = sliding_window_attention(q, k, v, keys, window=4, impl=impl)
    expected, _ = attention(q, k, v, keys & reference_mask(20, 20, 4))
    assert_close(out, expected, **TIGHT)


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_rolling_cache_token_by_token_equals_the_full_pass(window):
    """T = 20 is several windows: the buffer wraps around many times."""
    q, k, v = qkv(t=20, seed=window)
    full, _ = sliding_window_attention(q, k, v, window=window)
    cache = RollingKVCache(window)
    steps = []
    for t in range(20):
        keys, values = cache.update(k[:, :, t:t + 1], v[:, :, t:t + 1])
        assert keys.shape[2] == min(t + 1, window)  # the query sees at most W keys
        mask = sliding_window_mask(1, keys.shape[2], window=window)
        steps.append(attention(q[:, :, t:t + 1], keys, values, mask)[0])
        assert cache.length == min(t + 1, window) and cache.seen == t + 1
    assert_close(torch.cat(steps, dim=2), full, **TIGHT)


@pytest.mark.parametrize("chunks", [(7, 1, 1, 5, 6), (3, 3, 3, 3, 3, 3, 2), (1, 12, 7), (20,)])
def test_rolling_cache_with_prefill_chunks_equals_the_full_pass(chunks):
    """Chunks shorter and longer than the window, starting with the buffer empty or full."""
    window = 4
    q, k, v = qkv(t=20, seed=len(chunks))
    full, _ = sliding_window_attention(q, k, v, window=window)
    cache, outs, start = RollingKVCache(window), [], 0
    for size in chunks:
        end = start + size
        keys, values = cache.update(k[:, :, start:end], v[:, :, start:end])
        outs.append(sliding_window_attention(q[:, :, start:end], keys, values,
                                             window=window)[0])
        start = end
    assert_close(torch.cat(outs, dim=2), full, **TIGHT)


def test_the_buffer_holds_position_p_in_slot_p_mod_window():
    cache = RollingKVCache(3)
    for p in range(8):
        cache.update(torch.full((1, 1, 1, 2), float(p)), torch.full((1, 1, 1, 2), -float(p)))
    # positions 5, 6, 7 in slots 5 % 3 = 2, 6 % 3 = 0, 7 % 3 = 1
    assert cache.k[0, 0, :, 0].tolist() == [6.0, 7.0, 5.0]
    assert cache.v[0, 0, :, 0].tolist() == [-6.0, -7.0, -5.0]
    assert cache.k.shape == (1, 1, 3, 2)  # the memory stopped growing at W slots


def test_rolling_cache_with_rope_gqa_and_left_padding_equals_the_full_pass():
    """The whole recipe: keys rotated at their positions before caching, n_kv_heads heads."""
    window, T = 3, 14
    q, k, v = qkv(t=T, heads=4, kv_heads=2, seed=9)
    attention_mask = padding_mask([T, 9], T, side="left")  # (B, T): 5 pads in row 1
    positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)[:, None, :]  # (B, 1, T)
    q, k = apply_rope(q, positions), apply_rope(k, positions)
    full_mask = attention_mask[:, None, None, :] & sliding_window_mask(T, window=window)
    full, _ = grouped_query_attention(q, k, v, full_mask)
    cache, steps = RollingKVCache(window), []
    for t in range(T):
        keys, values = cache.update(k[:, :, t:t + 1], v[:, :, t:t + 1])
        t_k = keys.shape[2]
        pad = attention_mask[:, t + 1 - t_k: t + 1][:, None, None, :]  # the last T_k columns
        steps.append(grouped_query_attention(q[:, :, t:t + 1], keys, values,
                                             pad & sliding_window_mask(1, t_k, window=window))[0])
    assert_close(torch.cat(steps, dim=2), full, **TIGHT)
    assert cache.k.shape == (2, 2, window, 4)
    # and the padded row equals its sequence alone
    alone, _ = grouped_query_attention(q[1:, :, 5:], k[1:, :, 5:], v[1:, :, 5:],
                                       sliding_window_mask(9, window=window))
    assert_close(full[1:, :, 5:], alone, **TIGHT)


def test_changing_tokens_outside_the_window_or_in_the_future_changes_nothing():
    q, k, v = qkv(t=10, seed=3)
    out, _ = sliding_window_attention(q, k, v, window=3)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 0] += 4.0  # position 0 is outside the window of queries 3..9
    v2[:, :, 0] -= 4.0
    k2[:, :, 9] += 4.0  # position 9 is in the future of queries 0..8
    out2, _ = sliding_window_attention(q, k2, v2, window=3)
    assert torch.equal(out[:, :, 3:9], out2[:, :, 3:9])
    assert not torch.allclose(out[:, :, :3], out2[:, :, :3])


def test_gradients_flow_through_the_cache():
    k = torch.randn(1, 1, 6, 2, dtype=torch.float64, requires_grad=True)
    cache = RollingKVCache(2)
    total = sum(cache.update(k[:, :, t:t + 1], k[:, :, t:t + 1])[0].sum() for t in range(6))
    total.backward()
    # every position is returned as a key at its own step and (W - 1 = 1) step after it
    expected = torch.full_like(k, 2.0)
    expected[:, :, -1] = 1.0
    assert torch.equal(k.grad, expected)


def test_reset_forgets_the_positions():
    cache = RollingKVCache(2)
    cache.update(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    cache.reset()
    assert cache.length == 0 and cache.seen == 0 and cache.k is None


def test_on_meta_the_mask_the_attention_and_the_cache():
    q = torch.randn(2, 2, 6, 4, device="meta", requires_grad=True)
    mask = padding_mask([6, 4], 6, side="left")[:, None, None, :]  # made on the CPU
    out, _ = sliding_window_attention(q, q, q, mask, window=3)
    out.sum().backward()
    cache = RollingKVCache(3)
    for t in range(5):
        keys, _ = cache.update(q[:, :, t:t + 1].detach(), q[:, :, t:t + 1].detach())
    assert out.device.type == q.grad.device.type == keys.device.type == "meta"
    assert cache.k.shape == (2, 2, 3, 4)
    assert sliding_window_mask(2, 5, window=2, device="meta").device.type == "meta"


def test_bad_inputs_are_refused_naming_the_argument():
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="window must be a positive int, got 0"):
        sliding_window_mask(4, window=0)
    with pytest.raises(TypeError, match="window must be a positive int"):
        sliding_window_mask(4, window=2.5)
    with pytest.raises(ValueError, match="window must be a positive int"):
        RollingKVCache(0)
    with pytest.raises(ValueError, match="window must be a positive int"):
        sliding_window_attention(q, q, q, window=-1)
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        sliding_window_attention(q, q, q, torch.ones(4, 4), window=2)
    with pytest.raises(ValueError, match="t_q must be a positive int"):
        sliding_window_mask(0, window=2)
    cache = RollingKVCache(2)
    with pytest.raises(ValueError, match="k must have 4 dimensions"):
        cache.update(q[0], q[0])
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        cache.update(None, q)
    cache.update(q, q)
    with pytest.raises(TypeError, match="new k is torch.float64"):
        cache.update(q.double(), q.double())
    with pytest.raises(ValueError, match=r"\(B, H, d_k, d_v\)"):
        cache.update(torch.randn(2, 1, 1, 2), torch.randn(2, 1, 1, 2))
    with pytest.raises(ValueError, match="at least one new position"):
        cache.update(q[:, :, :0], q[:, :, :0])
