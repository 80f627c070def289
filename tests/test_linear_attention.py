"""Linear attention: the recurrent (RNN) form equals the parallel form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from course_attn.core.masks import causal_mask, padding_mask
from course_attn.modern.linear_attention import (
    LinearAttentionState,
    elu_feature_map,
    linear_attention,
    linear_attention_recurrent,
)

TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def qkv(batch=2, heads=3, time=12, d_k=4, d_v=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, time, d_k, generator=gen, dtype=torch.float64),
            torch.randn(batch, heads, time, d_k, generator=gen, dtype=torch.float64),
            torch.randn(batch, heads, time, d_v, generator=gen, dtype=torch.float64))


def reference(q, k, v, mask):
    """Entry by entry from the definition: sum_j sim(i, j) v_j / sum_j sim(i, j)."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(q.shape[-2]):
        sims = [(phi_q[..., i, :] * phi_k[..., j, :]).sum(-1) * mask[..., i, j]
                for j in range(k.shape[-2])]
        total = sum(sims)
        out[..., i, :] = sum(s[..., None] * v[..., j, :] for j, s in enumerate(sims)) / total[
            ..., None]
    return out


def test_feature_map_is_elu_plus_one_and_positive():
    x = torch.linspace(-20, 5, 101, dtype=torch.float64)
    assert torch.equal(elu_feature_map(x), F.elu(x) + 1)
    assert bool((elu_feature_map(x) > 0).all())
    assert torch.equal(elu_feature_map(torch.tensor([0.0, 2.0])), torch.tensor([1.0, 3.0]))


def test_parallel_form_equals_the_definition():
    q, k, v = qkv(time=6)
    out, weights = linear_attention(q, k, v, is_causal=True)
    assert_close(out, reference(q, k, v, causal_mask(6)), **TIGHT)
    assert_close(weights.sum(-1), torch.ones(2, 3, 6, dtype=torch.float64), **TIGHT)
    assert torch.equal(weights.masked_select(~causal_mask(6)),
                       torch.zeros(2 * 3 * 15, dtype=torch.float64))


def test_non_causal_form_is_the_matrix_product_without_a_mask():
    q, k, v = qkv(time=5)
    out, _ = linear_attention(q, k, v)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    # associativity: phi(q) (phi(k)^T v) / phi(q) (phi(k)^T 1): linear in T
    expected = (phi_q @ (phi_k.transpose(-2, -1) @ v)) / (phi_q @ phi_k.sum(-2)[..., None])
    assert_close(out, expected, **TIGHT)


def test_recurrent_form_equals_the_parallel_form():
    q, k, v = qkv(time=30)
    parallel, _ = linear_attention(q, k, v, is_causal=True)
    state = LinearAttentionState()
    recurrent = linear_attention_recurrent(q, k, v, state)
    assert_close(recurrent, parallel, **TIGHT)
    assert state.S.shape == (2, 3, 4, 5) and state.z.shape == (2, 3, 4) and state.length == 30


@pytest.mark.parametrize("chunks", [(1,) * 12, (5, 1, 6), (12,)])
def test_carrying_the_state_across_calls_equals_the_whole_sequence(chunks):
    """The state is the cache: token-by-token decoding equals the full pass."""
    q, k, v = qkv()
    parallel, _ = linear_attention(q, k, v, is_causal=True)
    state, outs, start = LinearAttentionState(), [], 0
    for size in chunks:
        end = start + size
        outs.append(linear_attention_recurrent(q[:, :, start:end], k[:, :, start:end],
                                               v[:, :, start:end], state))
        start = end
    assert_close(torch.cat(outs, dim=2), parallel, **TIGHT)
    assert state.S.shape == (2, 3, 4, 5)  # the same size after 1 token or 12


def test_the_state_is_the_sum_of_outer_products():
    q, k, v = qkv(time=7)
    state = LinearAttentionState()
    linear_attention_recurrent(q, k, v, state)
    phi_k = F.elu(k) + 1
    assert_close(state.S, phi_k.transpose(-2, -1) @ v, **TIGHT)
    assert_close(state.z, phi_k.sum(-2), **TIGHT)


def test_changing_future_tokens_leaves_earlier_outputs_unchanged():
    q, k, v = qkv()
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 8:] += 3.0
    v2[:, :, 8:] *= -2.0
    for form in ("parallel", "recurrent"):
        if form == "parallel":
            out, out2 = (linear_attention(q, a, b, is_causal=True)[0] for a, b in
                         ((k, v), (k2, v2)))
        else:
            out, out2 = (linear_attention_recurrent(q, a, b) for a, b in ((k, v), (k2, v2)))
        assert torch.equal(out[:, :, :8], out2[:, :, :8])
        assert not torch.allclose(out[:, :, 8:], out2[:, :, 8:])


def test_left_padded_rows_give_the_unpadded_outputs_even_with_nan_in_the_pads():
    q, k, v = qkv(batch=1, time=6)
    alone, _ = linear_attention(q, k, v, is_causal=True)
    padded = [torch.cat([torch.full_like(t[:, :, :3], float("nan")), t], dim=2)
              for t in (q, k, v)]
    mask = padding_mask([6], 9, side="left")  # (1, 9)
    parallel, _ = linear_attention(*padded, mask[:, None, None, :], is_causal=True)
    recurrent = linear_attention_recurrent(*padded, attention_mask=mask)
    assert_close(parallel[:, :, 3:], alone, **TIGHT)
    assert_close(recurrent[:, :, 3:], alone, **TIGHT)


def test_padded_batch_recurrent_equals_parallel_and_pads_before_any_token_give_zeros():
    q, k, v = qkv(time=8)
    mask = padding_mask([8, 5], 8, side="left")
    parallel, _ = linear_attention(q, k, v, mask[:, None, None, :], is_causal=True)
    recurrent = linear_attention_recurrent(q, k, v, attention_mask=mask)
    assert_close(recurrent, parallel, **TIGHT)
    assert torch.equal(parallel[1, :, :3], torch.zeros(3, 3, 5, dtype=torch.float64))
    assert torch.equal(recurrent[1, :, :3], torch.zeros(3, 3, 5, dtype=torch.float64))


def test_a_custom_feature_map_is_used_by_both_forms():
    q, k, v = qkv(time=5)
    relu_plus = lambda x: F.relu(x) + 0.5  # noqa: E731
    parallel, _ = linear_attention(q, k, v, is_causal=True, feature_map=relu_plus)
    assert_close(linear_attention_recurrent(q, k, v, feature_map=relu_plus), parallel, **TIGHT)
    assert not torch.allclose(parallel, linear_attention(q, k, v, is_causal=True)[0])


def test_gradients_match_between_the_forms_and_gradcheck():
    q, k, v = (t.requires_grad_(True) for t in qkv(batch=1, heads=1, time=4, d_k=2, d_v=2))
    assert torch.autograd.gradcheck(
        lambda q, k, v: linear_attention(q, k, v, is_causal=True)[0], (q, k, v))
    assert torch.autograd.gradcheck(linear_attention_recurrent, (q, k, v))


def test_forward_and_backward_on_meta():
    q = torch.randn(2, 3, 6, 4, device="meta", requires_grad=True)
    mask = padding_mask([6, 4], 6, side="left")  # made on the CPU
    out, _ = linear_attention(q, q, q, mask[:, None, None, :], is_causal=True)
    state = LinearAttentionState()
    step = linear_attention_recurrent(q, q, q, state, attention_mask=mask)
    (out.sum() + step.sum()).backward()
    assert out.device.type == step.device.type == state.S.device.type == "meta"
    assert q.grad.device.type == "meta"


def test_bad_inputs_are_refused_naming_the_argument():
    q, k, v = qkv(time=3)
    with pytest.raises(TypeError, match="feature_map must be a function"):
        linear_attention(q, k, v, feature_map="elu")
    with pytest.raises(ValueError, match="eps must be a positive"):
        linear_attention(q, k, v, eps=0.0)
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        linear_attention(q, k, v, torch.ones(3, 3))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        linear_attention(q, k, v, is_causal=1)
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        linear_attention_recurrent(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="q, k and v must share"):
        linear_attention_recurrent(q, k[:, :, :2], v[:, :, :2])
    with pytest.raises(TypeError, match="state must be a LinearAttentionState"):
        linear_attention_recurrent(q, k, v, {})
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        linear_attention_recurrent(q, k, v, attention_mask=torch.ones(1, 3, dtype=torch.bool))
    state = LinearAttentionState()
    linear_attention_recurrent(q, k, v, state)
    with pytest.raises(ValueError, match="state holds S of shape"):
        linear_attention_recurrent(q[:1], k[:1], v[:1], state)
    with pytest.raises(TypeError, match="x must be a floating-point"):
        elu_feature_map(torch.ones(2, dtype=torch.long))
