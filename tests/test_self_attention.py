"""Chapters 2 and 3: weight-free self-attention and the SelfAttention layer."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from course_attn import SelfAttention, simple_self_attention
from course_attn.core.attention import scaled_dot_product_attention
from course_attn.core.masks import causal_mask


def _x(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------ simple_self_attention


def test_dot_similarity_matches_a_loop_over_queries():
    x = _x(5, 3)
    z, weights = simple_self_attention(x)
    for i in range(5):
        scores = torch.stack([x[i] @ x[j] for j in range(5)])
        w = scores.exp() / scores.exp().sum()
        assert_close(weights[i], w)
        assert_close(z[i], sum(w[j] * x[j] for j in range(5)))


def test_cosine_similarity_changes_only_the_weights():
    x = _x(2, 4, 3)
    z, weights = simple_self_attention(x, similarity="cosine")
    unit = x / x.norm(dim=-1, keepdim=True)
    assert_close(weights, torch.softmax(unit @ unit.mT, dim=-1))
    assert_close(z, weights @ x)  # the output still mixes the raw inputs
    z_dot, w_dot = simple_self_attention(x, similarity="dot")
    assert not torch.allclose(weights, w_dot)


def test_cosine_weights_ignore_the_length_of_each_token():
    x = _x(6, 4)
    lengths = torch.tensor([0.1, 1.0, 3.0, 7.0, 0.5, 20.0], dtype=torch.float64)[:, None]
    _, w = simple_self_attention(x, similarity="cosine")
    _, w_scaled = simple_self_attention(x * lengths, similarity="cosine")
    assert_close(w, w_scaled)
    _, d = simple_self_attention(x, similarity="dot")
    _, d_scaled = simple_self_attention(x * lengths, similarity="dot")
    assert not torch.allclose(d, d_scaled)


def test_cosine_with_a_zero_vector_stays_finite():
    x = _x(4, 3)
    x[2] = 0.0
    z, weights = simple_self_attention(x, similarity="cosine")
    assert torch.isfinite(z).all() and torch.isfinite(weights).all()
    assert_close(weights[2], torch.full((4,), 0.25, dtype=torch.float64))  # cosine 0 with all


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
@pytest.mark.parametrize("shape", [(1, 3), (4, 2), (3, 5, 4), (2, 2, 6, 3)])
def test_rows_sum_to_one_and_batch_dims_are_independent(shape, similarity):
    x = _x(*shape, seed=sum(shape))
    z, weights = simple_self_attention(x, similarity=similarity)
    assert z.shape == x.shape and weights.shape == (*shape[:-1], shape[-2])
    assert (weights > 0).all()
    assert_close(weights.sum(-1), torch.ones(shape[:-1], dtype=torch.float64))
    flat = x.reshape(-1, *shape[-2:])  # (N, T, D): each sequence on its own
    for n in range(flat.shape[0]):
        z_n, _ = simple_self_attention(flat[n], similarity=similarity)
        assert_close(z.reshape(-1, *shape[-2:])[n], z_n)


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
@pytest.mark.parametrize("seed", range(5))
def test_permutation_equivariance(seed, similarity):
    x = _x(7, 4, seed=seed)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(seed))
    z, weights = simple_self_attention(x, similarity=similarity)
    z_p, weights_p = simple_self_attention(x[perm], similarity=similarity)
    assert_close(z_p, z[perm])
    assert_close(weights_p, weights[perm][:, perm])


def test_low_precision_input_keeps_its_dtype():
    x = _x(5, 8, dtype=torch.float32)
    z16, w16 = simple_self_attention(x.bfloat16())
    z32, _ = simple_self_attention(x)
    assert z16.dtype == torch.bfloat16 and w16.dtype == torch.bfloat16
    assert_close(z16.float(), z32, atol=0.1, rtol=0.05)


@pytest.mark.parametrize(
    "x, kwargs, error, phrase",
    [
        (torch.ones(4), {}, ValueError, r"x must have at least 2 dimensions"),
        ([[1.0, 2.0]], {}, TypeError, r"x must be a torch.Tensor"),
        (torch.ones(3, 2, dtype=torch.long), {}, TypeError, r"x must be a floating-point"),
        (torch.ones(3, 2), {"similarity": "euclid"}, ValueError,
         r"similarity must be one of \('dot', 'cosine'\), got 'euclid'"),
        (torch.ones(0, 2), {}, ValueError, r"x must hold at least one token"),
        (torch.tensor([[1.0, float("nan")]]), {}, ValueError, r"x contains NaN"),
    ],
)
def test_simple_self_attention_bad_inputs(x, kwargs, error, phrase):
    with pytest.raises(error, match=phrase):
        simple_self_attention(x, **kwargs)


# ------------------------------------------------------------------ SelfAttention


def test_self_attention_is_softmax_of_projections_scaled_by_d_out():
    torch.manual_seed(0)
    layer = SelfAttention(5, 3).double()
    x = _x(2, 4, 5)
    out, weights = layer(x, need_weights=True)
    q, k, v = x @ layer.q_proj.weight.T, x @ layer.k_proj.weight.T, x @ layer.v_proj.weight.T
    expected_weights = torch.softmax(q @ k.mT / math.sqrt(3), dim=-1)
    assert out.shape == (2, 4, 3) and weights.shape == (2, 4, 4)
    assert_close(weights, expected_weights)
    assert_close(out, expected_weights @ v)
    assert_close(layer(x)[0], out)


def test_projections_are_linear_layers_and_bias_is_optional():
    plain, biased = SelfAttention(4, 2), SelfAttention(4, 2, qkv_bias=True)
    for layer, has_bias in ((plain, False), (biased, True)):
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj):
            assert isinstance(proj, nn.Linear) and proj.weight.shape == (2, 4)
            assert (proj.bias is not None) == has_bias
    assert sum(p.numel() for p in plain.parameters()) == 3 * 8
    assert sum(p.numel() for p in biased.parameters()) == 3 * (8 + 2)


def test_matches_single_head_nn_multihead_attention_after_copying_weights():
    torch.manual_seed(1)
    d = 6
    ours = SelfAttention(d, d, qkv_bias=True).double()
    ref = nn.MultiheadAttention(d, num_heads=1, bias=True, batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                            ours.v_proj.weight]))  # (3 d, d)
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(torch.eye(d))  # SelfAttention has no output projection
        ref.out_proj.bias.zero_()
    x = _x(3, 5, d)
    causal = causal_mask(5)
    expected, expected_w = ref(x, x, x, attn_mask=~causal, need_weights=True)  # True = blocked
    out, weights = ours(x, mask=causal, need_weights=True)
    assert_close(out, expected)
    assert_close(weights, expected_w)


def test_layer_uses_the_package_attention_function():
    torch.manual_seed(2)
    layer = SelfAttention(4, 8).double()
    x = _x(2, 3, 4)
    mask = torch.tensor([[True, True, False]]).expand(3, 3)  # last key hidden from everyone
    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    expected, _ = scaled_dot_product_attention(q, k, v, mask, scale=1 / math.sqrt(8))
    assert_close(layer(x, mask=mask)[0], expected)


def test_causal_mask_keeps_earlier_outputs_independent_of_later_tokens():
    torch.manual_seed(3)
    layer = SelfAttention(4, 4).double()
    x = _x(1, 6, 4)
    changed = x.clone()
    changed[:, 4:] = _x(1, 2, 4, seed=9)
    out = layer(x, mask=causal_mask(6))[0]
    out_changed = layer(changed, mask=causal_mask(6))[0]
    assert_close(out[:, :4], out_changed[:, :4])
    assert not torch.allclose(out[:, 4:], out_changed[:, 4:])


def test_self_attention_is_permutation_equivariant_without_a_mask():
    torch.manual_seed(4)
    layer = SelfAttention(3, 5).double()
    x = _x(2, 6, 3)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    assert_close(layer(x[:, perm])[0], layer(x)[0][:, perm])


def test_self_attention_gradcheck_float64():
    torch.manual_seed(5)
    layer = SelfAttention(3, 2, qkv_bias=True).double()
    x = _x(2, 4, 3).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: layer(t, mask=causal_mask(4))[0], (x,))


@pytest.mark.parametrize(
    "args, kwargs, error, phrase",
    [
        ((0, 2), {}, ValueError, r"d_in must be a positive int, got 0"),
        ((4, 2.0), {}, TypeError, r"d_out must be a positive int"),
        ((4, 2), {"qkv_bias": "yes"}, TypeError, r"qkv_bias must be a bool"),
    ],
)
def test_self_attention_bad_construction(args, kwargs, error, phrase):
    with pytest.raises(error, match=phrase):
        SelfAttention(*args, **kwargs)


@pytest.mark.parametrize(
    "x, kwargs, error, phrase",
    [
        (torch.ones(3, 4), {}, ValueError, r"x must have 3 dimensions"),
        (torch.ones(1, 3, 5), {}, ValueError, r"x must have last dimension d_in=4"),
        (torch.ones(1, 3, 4, dtype=torch.float64), {}, TypeError, r"x has dtype torch.float64"),
        (torch.ones(1, 3, 4), {"mask": torch.ones(3, 3)}, TypeError, r"mask must have dtype"),
        (torch.ones(1, 3, 4), {"mask": torch.ones(2, 3, dtype=torch.bool)}, ValueError,
         r"mask of shape \(2, 3\)"),
    ],
)
def test_self_attention_bad_forward_inputs(x, kwargs, error, phrase):
    with pytest.raises(error, match=phrase):
        SelfAttention(4, 2)(x, **kwargs)


# ------------------------------ issue 18: overflow is not NaN; the NaN policy; flags


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
def test_finite_inputs_whose_scores_overflow_are_reported_as_overflow_not_nan(similarity):
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)) * 1e30
    with pytest.raises(ValueError) as info:
        simple_self_attention(x, similarity=similarity)
    message = str(info.value)
    assert "overflowed torch.float32 although x is finite" in message
    assert "scale x down" in message and "NaN" not in message
    # scaled down, the same directions work (cosine does not care about the scale)
    z, w = simple_self_attention(x / x.abs().max(), similarity=similarity)
    assert torch.isfinite(z).all() and torch.isfinite(w).all()


def test_simple_self_attention_skips_value_checks_where_values_are_not_checkable():
    z, w = simple_self_attention(torch.ones(2, 3, 4, device="meta"))
    assert z.shape == (2, 3, 4) and w.shape == (2, 3, 3) and z.device.type == "meta"


def test_self_attention_module_passes_nan_through_to_the_rows_it_reaches():
    """Modules never scan values: a NaN query row stays NaN, no error is raised."""
    torch.manual_seed(0)
    layer = SelfAttention(4, 4)
    x = torch.randn(1, 3, 4)
    x[0, 0, 0] = float("nan")
    out = layer(x, mask=causal_mask(3))[0]
    assert torch.isnan(out).all()  # token 0 is seen by every query
    out = layer(x, mask=torch.tensor([False, True, True]).expand(3, 3))[0]  # token 0 as padding
    assert torch.isfinite(out[0, 1:]).all()


def test_self_attention_need_weights_must_be_a_bool():
    with pytest.raises(TypeError, match=r"^need_weights must be a bool"):
        SelfAttention(4, 4)(torch.randn(1, 2, 4), need_weights="no")
