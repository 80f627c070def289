"""GQA / MQA against SDPA's enable_gqa and a repeat_interleave reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from course_attn.core.attention import ATTENTION_IMPLS, attention
from course_attn.core.layers import KVCache
from course_attn.core.masks import causal_mask, padding_mask
from course_attn.modern.gqa import check_kv_heads, grouped_query_attention, repeat_kv

TIGHT = {"rtol": 1e-12, "atol": 1e-12}
GROUPINGS = [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3)]  # (n_heads, n_kv_heads): MHA .. MQA


def qkv(n_heads, n_kv_heads, t_q=5, t_k=5, seed=0, batch=2, head_dim=4, d_v=5):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_heads, t_q, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, n_kv_heads, t_k, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, n_kv_heads, t_k, d_v, generator=gen, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("n_rep", [1, 2, 3])
def test_repeat_kv_equals_repeat_interleave(n_rep):
    x = torch.randn(2, 3, 4, 5)
    assert torch.equal(repeat_kv(x, n_rep), torch.repeat_interleave(x, n_rep, dim=1))


@pytest.mark.parametrize("n_heads, n_kv_heads", GROUPINGS)
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_gqa_equals_sdpa_with_enable_gqa(n_heads, n_kv_heads, impl):
    q, k, v = qkv(n_heads, n_kv_heads)
    out, _ = grouped_query_attention(q, k, v, is_causal=True, impl=impl)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert_close(out, expected, **TIGHT)


@pytest.mark.parametrize("n_heads, n_kv_heads", GROUPINGS)
def test_gqa_with_padding_and_a_cache_shape_equals_the_repeat_interleave_reference(
        n_heads, n_kv_heads):
    q, k, v = qkv(n_heads, n_kv_heads, t_q=2, t_k=6, seed=1)
    keys = padding_mask([6, 4], 6, side="left")[:, None, None, :]  # (B, 1, 1, T_k)
    out, weights = grouped_query_attention(q, k, v, keys, is_causal=True)
    n_rep = n_heads // n_kv_heads
    expected, _ = attention(q, k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1),
                            keys & causal_mask(2, 6))
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=keys & causal_mask(2, 6),
                                          enable_gqa=True)
    assert_close(out, expected, **TIGHT)
    assert_close(out, sdpa, **TIGHT)
    assert weights.shape == (2, n_heads, 2, 6)


def test_query_heads_of_one_group_share_their_key_value_head():
    """With identical queries, the heads of one group give identical outputs."""
    q, k, v = qkv(6, 2, seed=2)
    q = q[:, :1].expand_as(q)  # every query head the same
    out, _ = grouped_query_attention(q, k, v, is_causal=True)
    assert torch.equal(out[:, 0], out[:, 2]) and torch.equal(out[:, 3], out[:, 5])
    assert not torch.allclose(out[:, 0], out[:, 3])  # another group, another key/value head


def test_changing_future_tokens_leaves_earlier_outputs_unchanged():
    q, k, v = qkv(4, 2, t_q=7, t_k=7, seed=3)
    out, _ = grouped_query_attention(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4:] = 5.0
    v2[:, :, 4:] = -5.0
    out2, _ = grouped_query_attention(q, k2, v2, is_causal=True)
    assert torch.equal(out[:, :, :4], out2[:, :, :4])
    assert not torch.allclose(out[:, :, 4:], out2[:, :, 4:])


def test_left_padded_rows_give_the_unpadded_outputs():
    q, k, v = qkv(4, 2, t_q=4, t_k=4, seed=4, batch=1)
    alone, _ = grouped_query_attention(q, k, v, is_causal=True)
    padded = [torch.cat([torch.full_like(t[:, :, :2], float("nan")), t], dim=2)
              for t in (q, k, v)]
    mask = padding_mask([4], 6, side="left")[:, None, None, :]
    out, _ = grouped_query_attention(*padded, mask, is_causal=True)
    assert_close(out[:, :, 2:], alone, **TIGHT)


def test_cached_decoding_with_n_kv_heads_in_the_cache_equals_the_full_pass():
    q, k, v = qkv(8, 2, t_q=9, t_k=9, seed=5, d_v=4)  # KVCache keeps k and v alike
    full, _ = grouped_query_attention(q, k, v, is_causal=True)
    cache = KVCache()
    steps = []
    for t in range(9):
        k_all, v_all = cache.update(k[:, :, t:t + 1], v[:, :, t:t + 1])
        steps.append(grouped_query_attention(q[:, :, t:t + 1], k_all, v_all, is_causal=True)[0])
    assert_close(torch.cat(steps, dim=2), full, **TIGHT)
    assert cache.k.shape == (2, 2, 9, 4)  # the cache holds n_kv_heads=2 heads, not 8


def test_gradients_reach_the_shared_heads_and_match_gradcheck():
    q, k, v = (t.requires_grad_(True) for t in qkv(4, 2, t_q=3, t_k=3, seed=6, batch=1))
    assert torch.autograd.gradcheck(
        lambda q, k, v: grouped_query_attention(q, k, v, is_causal=True)[0], (q, k, v))


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_forward_and_backward_on_meta(impl):
    q = torch.randn(2, 8, 5, 4, device="meta", requires_grad=True)
    k = torch.randn(2, 2, 5, 4, device="meta", requires_grad=True)
    mask = padding_mask([5, 3], 5, side="left")[:, None, None, :]  # made on the CPU
    out, _ = grouped_query_attention(q, k, k, mask, is_causal=True, impl=impl)
    out.sum().backward()
    assert out.shape == (2, 8, 5, 4)
    assert out.device.type == q.grad.device.type == k.grad.device.type == "meta"


def test_bad_inputs_are_refused_naming_the_argument():
    q, k, v = qkv(6, 3)
    with pytest.raises(ValueError, match="n_kv_heads=4 heads of k .* must divide the n_heads=6"):
        grouped_query_attention(q, torch.randn(2, 4, 5, 4), torch.randn(2, 4, 5, 4))
    with pytest.raises(ValueError, match="k and v must have the same number of heads"):
        grouped_query_attention(q, k, v[:, :1])
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        grouped_query_attention(q[0], k, v)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        grouped_query_attention(q, None, v)
    with pytest.raises(ValueError, match="impl must be one of"):
        grouped_query_attention(q, k, v, impl="flash")
    with pytest.raises(ValueError, match="n_rep must be a positive int"):
        repeat_kv(k, 0)
    with pytest.raises(TypeError, match="n_rep must be a positive int"):
        repeat_kv(k, 2.0)
    with pytest.raises(ValueError, match="x must have 4 dimensions"):
        repeat_kv(k[0], 2)
    with pytest.raises(ValueError, match="n_kv_heads=3 must divide n_heads=8"):
        check_kv_heads(8, 3)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive int"):
        check_kv_heads(8, 0)
