"""RoPE against an independent complex-number implementation, and its properties."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from course_attn.core.layers import sinusoidal_table
from course_attn.core.masks import padding_mask, positions_from_attention_mask
from course_attn.modern.rope import apply_rope, apply_rotary, rope_cos_sin, sinusoid_angles

TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def complex_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The reference: pairs (x0, x1) as complex numbers x0 + i x1, times e^(i p theta)."""
    head_dim = x.shape[-1]
    theta = base ** (-torch.arange(head_dim // 2, dtype=torch.float64) * 2 / head_dim)
    angle = positions.to(torch.float64)[..., None] * theta  # (..., T, head_dim / 2)
    rotation = torch.polar(torch.ones_like(angle), angle)
    as_complex = torch.view_as_complex(x.reshape(*x.shape[:-1], head_dim // 2, 2).contiguous())
    return torch.view_as_real(as_complex * rotation).flatten(-2)


@pytest.mark.parametrize("d_model", [1, 2, 7, 8, 64])
def test_sinusoidal_table_is_built_from_the_same_angles(d_model):
    """One formula: Chapter 7's table is sin/cos of sinusoid_angles, bit for bit."""
    angles = sinusoid_angles(torch.arange(50), d_model)  # (50, ceil(d / 2)), float64
    table = torch.zeros(50, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    assert torch.equal(table.float(), sinusoidal_table(50, d_model))


def test_rope_cos_sin_are_the_odd_and_even_columns_of_the_sinusoidal_table():
    cos, sin = rope_cos_sin(torch.arange(20), 16, dtype=torch.float64)
    table = sinusoidal_table(20, 16)
    assert_close(cos.float(), table[:, 1::2], rtol=0, atol=1e-7)
    assert_close(sin.float(), table[:, 0::2], rtol=0, atol=1e-7)


@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_apply_rope_equals_complex_multiplication(base):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    positions = torch.arange(5, 12)
    assert_close(apply_rope(x, positions, base=base), complex_rope(x, positions, base), **TIGHT)


def test_apply_rope_per_row_positions_equal_complex_multiplication():
    torch.manual_seed(1)
    x = torch.randn(3, 2, 5, 6, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11], [0, 0, 0, 1, 2]])
    out = apply_rope(x, positions[:, None, :])  # (B, 1, T): one row of positions per sequence
    assert_close(out, complex_rope(x, positions[:, None, :]), **TIGHT)
    for b in range(3):
        assert_close(out[b], apply_rope(x[b], positions[b]), **TIGHT)


def test_position_zero_is_the_identity_and_norms_are_kept():
    torch.manual_seed(2)
    x = torch.randn(4, 9, 16, dtype=torch.float64)
    assert torch.equal(apply_rope(x, torch.zeros(9, dtype=torch.long)), x)
    rotated = apply_rope(x, torch.arange(100, 109))
    assert_close(rotated.norm(dim=-1), x.norm(dim=-1), **TIGHT)
    pair_norms = rotated.unflatten(-1, (8, 2)).norm(dim=-1)  # each pair is rotated on its own
    assert_close(pair_norms, x.unflatten(-1, (8, 2)).norm(dim=-1), **TIGHT)
    assert not torch.allclose(rotated, x)


@pytest.mark.parametrize("shift", [1, 5, 37, 1000])
def test_scores_depend_only_on_the_relative_position(shift):
    """rope(q, i) . rope(k, j) is unchanged when both positions move by the same shift."""
    torch.manual_seed(3)
    q, k = torch.randn(2, 10, 32, dtype=torch.float64)
    positions = torch.arange(10)
    scores = apply_rope(q, positions) @ apply_rope(k, positions).T  # (T, T)
    shifted = apply_rope(q, positions + shift) @ apply_rope(k, positions + shift).T
    assert_close(shifted, scores, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(scores, q @ k.T)  # the rotation did change the scores


def test_one_query_and_key_repeated_give_a_toeplitz_score_matrix():
    """The same q and k at every position: score[i, j] is a function of i - j alone."""
    torch.manual_seed(4)
    q, k = torch.randn(2, 1, 8, dtype=torch.float64)
    T = 12
    scores = apply_rope(q.expand(T, 8), torch.arange(T)) @ apply_rope(k.expand(T, 8),
                                                                    torch.arange(T)).T
    for offset in range(-T + 1, T):
        diagonal = torch.diagonal(scores, offset)
        assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(torch.diagonal(scores, 1)[0], torch.diagonal(scores, 2)[0])


def test_left_padding_with_positions_from_the_mask_matches_the_unpadded_sequence():
    torch.manual_seed(5)
    real = torch.randn(1, 2, 4, 8, dtype=torch.float64)  # (1, H, T_real, head_dim)
    padded = torch.cat([torch.randn(1, 2, 3, 8, dtype=torch.float64), real], dim=2)  # 3 pads
    batch = torch.cat([padded, torch.randn(1, 2, 7, 8, dtype=torch.float64)])  # (2, H, 7, hd)
    mask = padding_mask([4, 7], 7, side="left")  # (2, 7)
    positions = positions_from_attention_mask(mask)[:, None, :]  # (2, 1, 7)
    out = apply_rope(batch, positions)
    assert_close(out[0, :, 3:], apply_rope(real[0], torch.arange(4)), **TIGHT)


def test_cached_keys_continue_the_positions():
    """Rotating a chunk at positions past..past+T equals slicing the full rotation."""
    torch.manual_seed(6)
    x = torch.randn(2, 2, 11, 8, dtype=torch.float64)
    full = apply_rope(x, torch.arange(11))
    pieces = [apply_rope(x[:, :, a:b], torch.arange(a, b)) for a, b in ((0, 6), (6, 7), (7, 11))]
    assert_close(torch.cat(pieces, dim=2), full, **TIGHT)


def test_apply_rotary_with_a_precomputed_table_equals_apply_rope():
    torch.manual_seed(7)
    x = torch.randn(2, 3, 5, 8)
    cos, sin = rope_cos_sin(torch.arange(5), 8)
    assert_close(apply_rotary(x, cos, sin), apply_rope(x, torch.arange(5)), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_rotated_in_float32_and_keeps_its_dtype(dtype):
    torch.manual_seed(8)
    x = torch.randn(2, 5, 8).to(dtype)
    out = apply_rope(x, torch.arange(3000, 3005))
    assert out.dtype == dtype
    expected = complex_rope(x.double(), torch.arange(3000, 3005)).to(dtype)
    assert_close(out, expected, rtol=0, atol=torch.finfo(dtype).eps * 8)


def test_gradients_flow_and_match_gradcheck():
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, torch.arange(4)), (x,))


def test_forward_and_backward_on_meta_with_positions_from_the_cpu():
    x = torch.randn(2, 3, 5, 8, device="meta", requires_grad=True)
    out = apply_rope(x, torch.arange(5))  # positions made on the CPU follow x
    out.sum().backward()
    assert out.device.type == "meta" and out.shape == x.shape and x.grad.device.type == "meta"
    cos, sin = rope_cos_sin(torch.arange(5, device="meta"), 8)
    assert cos.device.type == "meta" and apply_rotary(x, cos, sin).device.type == "meta"


def test_bad_inputs_are_refused_naming_the_argument():
    x = torch.randn(2, 3, 5, 8)
    with pytest.raises(ValueError, match="x must have an even head_dim"):
        apply_rope(torch.randn(2, 5, 7), torch.arange(5))
    with pytest.raises(TypeError, match="positions must hold integers"):
        apply_rope(x, torch.arange(5.0))
    with pytest.raises(TypeError, match="positions must be an integer"):
        apply_rope(x, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"positions must be \(T,\)"):
        apply_rope(x, torch.zeros(2, 5, dtype=torch.long))  # (B, T) would line up with heads
    with pytest.raises(ValueError, match="positions of shape"):
        apply_rope(x, torch.arange(4))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        apply_rope("x", torch.arange(5))
    with pytest.raises(ValueError, match="base must be a positive"):
        apply_rope(x, torch.arange(5), base=0.0)
