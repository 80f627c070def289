"""ALiBi: the paper's slopes, a bias linear in distance, and attention against SDPA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from course_attn.core.masks import causal_mask, padding_mask
from course_attn.modern.alibi import alibi_attention, alibi_bias, alibi_slopes

TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def reference_slopes(n):
    """Transcribed from the paper's code (ofirpress/attention_with_linear_biases)."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (get_slopes_power_of_2(closest_power_of_2)
            + reference_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2])


def test_slopes_for_eight_heads_are_one_half_to_one_over_256():
    expected = torch.tensor([2.0 ** -i for i in range(1, 9)], dtype=torch.float64)
    assert torch.equal(alibi_slopes(8, dtype=torch.float64), expected)


def test_slopes_for_twelve_heads_interleave_those_of_sixteen():
    expected = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
    assert_close(alibi_slopes(12, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                 **TIGHT)


@pytest.mark.parametrize("n_heads", range(1, 33))
def test_slopes_equal_the_reference_implementation(n_heads):
    slopes = alibi_slopes(n_heads, dtype=torch.float64)
    assert slopes.tolist() == reference_slopes(n_heads)
    assert len(set(slopes.tolist())) == n_heads and bool(((slopes > 0) & (slopes < 1)).all())


def test_bias_is_minus_slope_times_distance_and_linear():
    slopes = alibi_slopes(4, dtype=torch.float64)
    bias = alibi_bias(6, 6, slopes)  # (H, 6, 6)
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.equal(bias, -slopes[:, None, None] * (i - j).double())
    steps = bias[:, :, 1:] - bias[:, :, :-1]  # one key further right: + slope
    assert_close(steps, slopes[:, None, None].expand_as(steps), **TIGHT)
    assert not bool(torch.diagonal(bias, dim1=-2, dim2=-1).any())  # distance 0: no bias


@pytest.mark.parametrize("t_q, t_k", [(1, 7), (3, 7), (7, 7)])
def test_bias_is_aligned_bottom_right_like_the_causal_mask(t_q, t_k):
    slopes = alibi_slopes(2)
    square = alibi_bias(t_k, t_k, slopes)
    assert torch.equal(alibi_bias(t_q, t_k, slopes), square[:, -t_q:])
    bias = alibi_bias(t_q, t_k, slopes)[0]
    assert torch.equal(bias <= 0, causal_mask(t_q, t_k))  # no penalty up to the query itself
    own_key = torch.zeros(t_q, t_k, dtype=torch.bool)
    own_key[torch.arange(t_q), torch.arange(t_q) + t_k - t_q] = True  # the bottom-right diagonal
    assert torch.equal(bias == 0, own_key)


def sdpa_reference(q, k, v, slopes, mask):
    """PyTorch's fused attention with the bias and the mask as one additive float mask."""
    bias = -slopes[:, None, None] * (torch.arange(q.shape[-2])[:, None] + k.shape[-2]
                                     - q.shape[-2] - torch.arange(k.shape[-2])).to(q.dtype)
    additive = bias.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=additive)


@pytest.mark.parametrize("t_q", [5, 2, 1])
def test_alibi_attention_equals_sdpa_with_the_bias_as_a_float_mask(t_q):
    torch.manual_seed(0)
    B, H, T_k, d = 2, 4, 5, 8
    q = torch.randn(B, H, t_q, d, dtype=torch.float64)
    k, v = torch.randn(2, B, H, T_k, d, dtype=torch.float64)
    slopes = alibi_slopes(H, dtype=torch.float64)
    keys = padding_mask([5, 4], 5, side="left")[:, None, None, :]  # (B, 1, 1, T_k)
    out, weights = alibi_attention(q, k, v, slopes, keys, is_causal=True)
    assert_close(out, sdpa_reference(q, k, v, slopes, keys & causal_mask(t_q, T_k)), **TIGHT)
    has_key = (keys & causal_mask(t_q, T_k)).any(-1).expand(B, H, t_q)  # (B, H, T_q)
    assert_close(weights.sum(-1), has_key.double(), **TIGHT)  # 1, or 0 for a row of pads


def test_changing_future_tokens_leaves_earlier_outputs_unchanged():
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 1, 2, 8, 4, dtype=torch.float64)
    slopes = alibi_slopes(2, dtype=torch.float64)
    out, _ = alibi_attention(q, k, v, slopes, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 5:] += 10.0
    v2[:, :, 5:] -= 3.0
    out2, _ = alibi_attention(q, k2, v2, slopes, is_causal=True)
    assert torch.equal(out[:, :, :5], out2[:, :, :5])
    assert not torch.allclose(out[:, :, 5:], out2[:, :, 5:])


def test_left_padded_rows_give_the_unpadded_outputs_even_with_nan_in_the_pads():
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 1, 2, 4, 8, dtype=torch.float64)
    slopes = alibi_slopes(2, dtype=torch.float64)
    alone, _ = alibi_attention(q, k, v, slopes, is_causal=True)
    pad = torch.full((1, 2, 3, 8), float("nan"), dtype=torch.float64)
    padded = [torch.cat([pad, t], dim=2) for t in (q, k, v)]  # 3 pads on the left
    mask = padding_mask([4], 7, side="left")[:, None, None, :]  # (1, 1, 1, 7)
    out, _ = alibi_attention(*padded, slopes, mask, is_causal=True)
    assert_close(out[:, :, 3:], alone, **TIGHT)


def test_cached_queries_see_the_same_biases_as_the_full_pass():
    torch.manual_seed(3)
    q, k, v = torch.randn(3, 2, 4, 9, 8, dtype=torch.float64)
    slopes = alibi_slopes(4, dtype=torch.float64)
    full, _ = alibi_attention(q, k, v, slopes, is_causal=True)
    steps = [alibi_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], slopes,
                             is_causal=True)[0] for t in range(9)]
    assert_close(torch.cat(steps, dim=2), full, **TIGHT)


def test_a_query_with_no_allowed_key_gets_zeros_and_finite_gradients():
    q, k, v = torch.randn(3, 1, 2, 3, 4, dtype=torch.float64).unbind(0)
    q.requires_grad_(True)
    mask = torch.tensor([[False, False, False], [True, True, False], [True, True, True]])
    out, weights = alibi_attention(q, k, v, alibi_slopes(2, dtype=torch.float64), mask)
    out.sum().backward()
    assert torch.equal(out[:, :, 0], torch.zeros(1, 2, 4, dtype=torch.float64))
    assert torch.equal(weights[:, :, 0], torch.zeros(1, 2, 3, dtype=torch.float64))
    assert bool(torch.isfinite(q.grad).all())


def test_gradcheck_in_float64():
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    slopes = alibi_slopes(2, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda q, k, v: alibi_attention(q, k, v, slopes, is_causal=True)[0], (q, k, v))


def test_forward_and_backward_on_meta_with_slopes_from_the_cpu():
    q = torch.randn(2, 4, 5, 8, device="meta", requires_grad=True)
    mask = padding_mask([5, 3], 5, side="left")[:, None, None, :]  # made on the CPU
    out, weights = alibi_attention(q, q, q, alibi_slopes(4), mask, is_causal=True)
    out.sum().backward()
    assert out.device.type == weights.device.type == q.grad.device.type == "meta"
    assert alibi_bias(2, 5, alibi_slopes(4, device="meta")).device.type == "meta"


def test_bad_inputs_are_refused_naming_the_argument():
    q = torch.randn(2, 4, 5, 8)
    with pytest.raises(TypeError, match="n_heads must be a positive int"):
        alibi_slopes(4.0)
    with pytest.raises(ValueError, match="n_heads must be a positive int"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="dtype"):
        alibi_slopes(4, dtype=torch.long)
    with pytest.raises(ValueError, match="t_k must be a positive int"):
        alibi_bias(3, 0, alibi_slopes(4))
    with pytest.raises(ValueError, match="slopes must have 1 dimensions"):
        alibi_bias(3, 3, torch.ones(4, 1))
    with pytest.raises(ValueError, match=r"slopes must have one slope per head, \(H,\)=\(4,\)"):
        alibi_attention(q, q, q, alibi_slopes(2))
    with pytest.raises(TypeError, match="slopes must be a torch.Tensor"):
        alibi_attention(q, q, q, [0.5] * 4)
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        alibi_attention(q, q, q, alibi_slopes(4), torch.ones(5, 5))
    with pytest.raises(ValueError, match="q must be"):
        alibi_attention(q[0, 0], q[0, 0], q[0, 0], alibi_slopes(4))
