"""MLA: low-rank multi-head attention, absorbed == naive, the latent cache == the full pass."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from course_attn.core.attention import ATTENTION_IMPLS
from course_attn.core.layers import MultiHeadAttention
from course_attn.core.masks import padding_mask, positions_from_attention_mask
from course_attn.modern.latent import LatentKVCache, MultiHeadLatentAttention

TIGHT = {"rtol": 1e-10, "atol": 1e-10}
D, H, L = 16, 4, 6


def mla(d_rope=0, bias=True, impl="manual", seed=0, **kwargs):
    torch.manual_seed(seed)
    layer = MultiHeadLatentAttention(D, H, L, d_rope=d_rope, bias=bias, impl=impl, **kwargs)
    return layer.double().eval()


def inputs(batch=2, time=9, seed=1):
    return torch.randn(batch, time, D, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))


def test_without_rope_mla_is_multi_head_attention_with_low_rank_key_value_projections():
    """The independent reference: the course's MultiHeadAttention with k_proj = W_uk W_dkv."""
    layer = mla()
    mha = MultiHeadAttention(D, H).double()
    with torch.no_grad():
        mha.q_proj.load_state_dict(layer.q_proj.state_dict())
        mha.out_proj.load_state_dict(layer.out_proj.state_dict())
        for proj, up in ((mha.k_proj, layer.k_up), (mha.v_proj, layer.v_up)):
            proj.weight.copy_(up.weight @ layer.kv_down.weight)  # (D, L) @ (L, D)
            proj.bias.copy_(up.weight @ layer.kv_down.bias)
    x = inputs()
    keys = padding_mask([9, 6], 9, side="left")
    expected = mha(x, attention_mask=keys, is_causal=True)[0]
    for absorb in (False, True):
        assert_close(layer(x, attention_mask=keys, is_causal=True, absorb=absorb)[0], expected,
                     **TIGHT)


@pytest.mark.parametrize("d_rope", [0, 4])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_absorbed_equals_naive(d_rope, bias, impl):
    layer = mla(d_rope, bias, impl)
    x = inputs()
    keys = padding_mask([9, 5], 9, side="left")
    positions = positions_from_attention_mask(keys) if d_rope else None
    naive = layer(x, attention_mask=keys, is_causal=True, positions=positions)[0]
    absorbed = layer(x, attention_mask=keys, is_causal=True, positions=positions, absorb=True)[0]
    assert_close(absorbed, naive, **TIGHT)
    assert not torch.allclose(naive[0], naive[1])  # a real computation, not a constant


def test_absorbed_and_naive_give_the_same_parameter_gradients():
    layer = mla(d_rope=4)
    x = inputs()
    grads = []
    for absorb in (False, True):
        layer.zero_grad()
        (layer(x, is_causal=True, absorb=absorb)[0] ** 2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in layer.named_parameters()})
    for name in grads[0]:
        assert_close(grads[1][name], grads[0][name], **TIGHT)


@pytest.mark.parametrize("d_rope", [0, 4])
@pytest.mark.parametrize("absorb", [False, True])
def test_cached_decoding_equals_the_full_pass(d_rope, absorb):
    layer = mla(d_rope)
    x = inputs(time=10)
    full = layer(x, is_causal=True, absorb=absorb)[0]
    cache, outs = LatentKVCache(), []
    for start, end in ((0, 4), (4, 5), (5, 6), (6, 10)):  # a prefill, then steps, then a chunk
        outs.append(layer(x[:, start:end], is_causal=True, cache=cache, absorb=absorb)[0])
    assert_close(torch.cat(outs, dim=1), full, **TIGHT)
    assert cache.c.shape == (2, 10, L)  # the cache holds only the latents ...
    assert (cache.k_rope is None) == (d_rope == 0)  # ... and the shared rotated key part
    if d_rope:
        assert cache.k_rope.shape == (2, 10, d_rope)


def test_cached_decoding_of_a_left_padded_batch_with_rope_equals_the_full_pass():
    layer = mla(d_rope=4)
    x = inputs(time=8)
    keys = padding_mask([8, 5], 8, side="left")
    positions = positions_from_attention_mask(keys)
    full = layer(x, attention_mask=keys, is_causal=True, positions=positions)[0]
    cache, outs = LatentKVCache(), []
    for t in range(8):
        outs.append(layer(x[:, t:t + 1], attention_mask=keys[:, :t + 1], is_causal=True,
                          positions=positions[:, t:t + 1], cache=cache, absorb=True)[0])
    assert_close(torch.cat(outs, dim=1)[keys], full[keys], **TIGHT)


@pytest.mark.parametrize("d_rope", [0, 4])
def test_left_padded_rows_give_the_unpadded_outputs(d_rope):
    layer = mla(d_rope)
    x = inputs(batch=1, time=5)
    alone = layer(x, is_causal=True)[0]
    padded = torch.cat([torch.randn(1, 3, D, dtype=torch.float64), x], dim=1)
    keys = padding_mask([5], 8, side="left")
    positions = positions_from_attention_mask(keys) if d_rope else None
    for absorb in (False, True):
        out = layer(padded, attention_mask=keys, is_causal=True, positions=positions,
                    absorb=absorb)[0]
        assert_close(out[:, 3:], alone, **TIGHT)


@pytest.mark.parametrize("absorb", [False, True])
def test_changing_future_tokens_leaves_earlier_outputs_unchanged(absorb):
    layer = mla(d_rope=4)
    x = inputs()
    out = layer(x, is_causal=True, absorb=absorb)[0]
    x2 = x.clone()
    x2[:, 6:] = torch.randn(2, 3, D, dtype=torch.float64)
    out2 = layer(x2, is_causal=True, absorb=absorb)[0]
    assert torch.equal(out[:, :6], out2[:, :6])
    assert not torch.allclose(out[:, 6:], out2[:, 6:])


def test_decoupled_rope_makes_scores_depend_on_relative_positions_only():
    """Shifting every position by the same amount leaves the output unchanged."""
    layer = mla(d_rope=4)
    x = inputs()
    out = layer(x, is_causal=True, positions=torch.arange(9))[0]
    shifted = layer(x, is_causal=True, positions=torch.arange(100, 109), absorb=True)[0]
    assert_close(shifted, out, **TIGHT)
    swapped = layer(x, is_causal=True, positions=torch.arange(9).flip(0))[0]
    assert not torch.allclose(swapped, out)  # but the positions do matter


def test_head_dim_may_differ_from_d_model_over_n_heads():
    layer = mla(head_dim=3)
    x = inputs()
    assert_close(layer(x, is_causal=True, absorb=True)[0], layer(x, is_causal=True)[0], **TIGHT)
    assert layer.k_up.weight.shape == (H * 3, L)


@pytest.mark.parametrize("absorb", [False, True])
def test_forward_backward_and_cache_on_meta(absorb):
    with torch.device("meta"):
        layer = MultiHeadLatentAttention(D, H, L, d_rope=4, bias=True)
    x = torch.randn(2, 5, D, device="meta")
    keys = padding_mask([5, 3], 5, side="left", device="meta")  # on x's device (issue 41)
    out = layer(x, attention_mask=keys, is_causal=True, absorb=absorb,
                positions=positions_from_attention_mask(keys))[0]
    out.sum().backward()
    cache = LatentKVCache()
    layer(x, is_causal=True, cache=cache, absorb=absorb)[0]
    step = layer(x[:, :1], is_causal=True, cache=cache, absorb=absorb)[0]
    assert out.device.type == step.device.type == cache.c.device.type == "meta"
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in layer.parameters())


def test_bad_inputs_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="d_latent must be a positive int"):
        MultiHeadLatentAttention(D, H, 0)
    with pytest.raises(TypeError, match="d_latent must be a positive int"):
        MultiHeadLatentAttention(D, H, 2.0)
    with pytest.raises(ValueError, match="d_model=16 must be divisible by n_heads=3"):
        MultiHeadLatentAttention(D, 3, L)
    with pytest.raises(ValueError, match="d_rope must be even"):
        MultiHeadLatentAttention(D, H, L, d_rope=3)
    with pytest.raises(ValueError, match="impl must be one of"):
        MultiHeadLatentAttention(D, H, L, impl="flash")
    layer = mla()
    x = inputs()
    with pytest.raises(ValueError, match="x must have width d_model=16"):
        layer(torch.randn(2, 3, 8, dtype=torch.float64))[0]
    with pytest.raises(TypeError, match="x has dtype torch.float32"):
        layer(x.float())[0]
    with pytest.raises(TypeError, match="cache must be a LatentKVCache"):
        layer(x, cache=object())[0]
    with pytest.raises(TypeError, match="absorb must be a bool"):
        layer(x, absorb="yes")[0]
    with pytest.raises(ValueError, match="positions are only used with decoupled RoPE"):
        layer(x, positions=torch.arange(9))[0]
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\)"):
        mla(d_rope=4)(x, positions=torch.arange(4))
    with pytest.raises(TypeError, match="positions must be a torch.long"):
        mla(d_rope=4)(x, positions=torch.arange(9.0))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        layer(x, attention_mask=torch.ones(3, 9, dtype=torch.bool))[0]
    with pytest.raises(ValueError, match="mask must have shape"):
        layer(x, mask=torch.ones(3, 9, 9, dtype=torch.bool))[0]
    cache = LatentKVCache()
    with pytest.raises(ValueError, match="mask must have shape"):
        layer(x, mask=torch.ones(3, 9, 9, dtype=torch.bool), cache=cache)[0]
    assert cache.length == 0  # refused before the cache was touched
    cache.update(torch.randn(2, 3, L))
    with pytest.raises(ValueError, match="d_latent"):
        cache.update(torch.randn(2, 1, L + 1))
    with pytest.raises(TypeError, match="new c is torch.float64"):
        cache.update(torch.randn(2, 1, L, dtype=torch.float64))
    with pytest.raises(ValueError, match="k_rope must be given at every step"):
        cache.update(torch.randn(2, 1, L), torch.randn(2, 1, 4))
