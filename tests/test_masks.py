"""Chapter 5: causal and padding masks, converters to PyTorch's conventions, causality,
left/right padding and fully masked rows.

Tolerances: float64 comparisons use atol=1e-12, rtol=1e-10 (the two sides do the same
arithmetic in a different order); comparisons that must be bit-exact use torch.equal.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right
from torch.testing import assert_close

from course_attn.core.attention import ATTENTION_IMPLS, attention
from course_attn.core.layers import MultiHeadAttention
from course_attn.core.masks import (
    causal_mask,
    combine_masks,
    padding_mask,
    to_additive_mask,
    to_torch_mha_mask,
)

F64 = {"atol": 1e-12, "rtol": 1e-10}
sizes = st.integers(min_value=1, max_value=9)


# ---------------------------------------------------------------- causal_mask


@settings(max_examples=60, deadline=None)
@given(t_q=sizes, t_k=sizes)
def test_causal_mask_is_bottom_right_aligned(t_q, t_k):
    mask = causal_mask(t_q, t_k)
    assert mask.dtype == torch.bool and mask.shape == (t_q, t_k)
    # query i may attend key j exactly when j <= t_k - t_q + i
    i = torch.arange(t_q).unsqueeze(1)
    j = torch.arange(t_k).unsqueeze(0)
    assert torch.equal(mask, j <= t_k - t_q + i)
    assert torch.equal(mask, torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q))
    # the last query always sees every key: it is the newest token
    assert mask[-1].all()
    # with t_q <= t_k the queries are the last t_q rows of the full square mask
    if t_q <= t_k:
        assert torch.equal(mask, causal_mask(t_k)[t_k - t_q:])


@settings(max_examples=40, deadline=None)
@given(t=sizes)
def test_square_causal_mask_is_lower_triangular(t):
    mask = causal_mask(t)
    assert torch.equal(mask, torch.ones(t, t, dtype=torch.bool).tril())
    assert torch.equal(mask, causal_mask(t, t))
    assert mask.sum() == t * (t + 1) // 2


@pytest.mark.parametrize(("t_q", "t_k"), [(1, 1), (2, 5), (3, 3), (4, 7), (1, 6)])
def test_causal_mask_matches_torch_causal_lower_right(t_q, t_k):
    # PyTorch's own bottom-right causal bias, both as a mask and through attention.
    assert torch.equal(causal_mask(t_q, t_k), causal_lower_right(t_q, t_k)._materialize())
    g = torch.Generator().manual_seed(t_q * 10 + t_k)
    q = torch.randn(2, t_q, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, t_k, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, t_k, 3, generator=g, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(t_q, t_k))
    for impl in ATTENTION_IMPLS:
        out, _ = attention(q, k, v, is_causal=True, impl=impl)
        assert_close(out, expected, **F64)


@pytest.mark.parametrize(("t_q", "t_k"), [(2, 5), (3, 7), (4, 6)])
def test_torch_is_causal_is_top_left_when_lengths_differ(t_q, t_k):
    """The documented pitfall: F.sdpa(is_causal=True) is NOT the course's causal mask."""
    top_left = torch.ones(t_q, t_k, dtype=torch.bool).tril()
    assert not torch.equal(causal_mask(t_q, t_k), top_left)
    g = torch.Generator().manual_seed(t_q + t_k)
    q = torch.randn(1, t_q, 4, generator=g, dtype=torch.float64)
    k = torch.randn(1, t_k, 4, generator=g, dtype=torch.float64)
    v = torch.randn(1, t_k, 4, generator=g, dtype=torch.float64)
    torch_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(torch_causal, F.scaled_dot_product_attention(q, k, v, attn_mask=top_left), **F64)
    course, _ = attention(q, k, v, is_causal=True)
    assert not torch.allclose(course, torch_causal)


def test_causal_mask_device_argument():
    assert causal_mask(3, 4, device="cpu").device.type == "cpu"
    assert padding_mask([1, 2], device="cpu").device.type == "cpu"


@pytest.mark.parametrize(
    ("args", "error", "name"),
    [
        ((0,), ValueError, "t_q"),
        ((-2,), ValueError, "t_q"),
        ((3, 0), ValueError, "t_k"),
        ((2.0,), TypeError, "t_q"),
        ((3, 2.5), TypeError, "t_k"),
        ((True,), TypeError, "t_q"),
        (("4",), TypeError, "t_q"),
    ],
)
def test_causal_mask_bad_sizes(args, error, name):
    with pytest.raises(error, match=name):
        causal_mask(*args)


# --------------------------------------------------------------- padding_mask


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=5),
       extra=st.integers(min_value=0, max_value=3))
def test_padding_mask_right_and_left(lengths, extra):
    max_len = max(max(lengths), 1) + extra
    right = padding_mask(lengths, max_len)
    left = padding_mask(lengths, max_len, side="left")
    assert right.dtype == left.dtype == torch.bool
    assert right.shape == left.shape == (len(lengths), max_len)
    assert right.sum(1).tolist() == lengths == left.sum(1).tolist()
    for row, n in enumerate(lengths):
        assert right[row, :n].all() and not right[row, n:].any()  # real tokens first
        assert left[row, max_len - n:].all() and not left[row, : max_len - n].any()  # pads first
    assert torch.equal(left, right.flip(-1))
    # a tensor of lengths gives the same mask as a list
    assert torch.equal(padding_mask(torch.tensor(lengths), max_len, side="left"), left)


def test_padding_mask_default_max_len_is_longest():
    mask = padding_mask([3, 1, 2])
    assert mask.shape == (3, 3)
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert padding_mask(torch.tensor([3, 1, 2], dtype=torch.int32)).tolist() == mask.tolist()


@pytest.mark.parametrize(
    ("lengths", "kwargs", "error", "name"),
    [
        ([2, 5], {"max_len": 4}, ValueError, "max_len"),  # a length above max_len
        ([2, -1], {"max_len": 4}, ValueError, "length"),  # negative length
        (torch.tensor([3, -1]), {}, ValueError, "length"),
        ([2, 3], {"side": "middle"}, ValueError, "side"),
        ([2, 3], {"side": "LEFT"}, ValueError, "side"),
        ([2.0, 3.0], {}, TypeError, "lengths"),
        ([2, "3"], {}, TypeError, "lengths"),
        ([True, False], {}, TypeError, "lengths"),
        (torch.tensor([2.0, 3.0]), {}, TypeError, "lengths"),
        (torch.tensor([True, False]), {}, TypeError, "lengths"),
        (torch.tensor([[2, 3]]), {}, ValueError, "lengths"),
        ([], {}, ValueError, "lengths"),
        ([0, 0], {}, ValueError, "lengths must contain a positive length"),  # no max_len to infer
        ([2, 3], {"max_len": 0}, ValueError, "max_len"),
        ([2, 3], {"max_len": 4.0}, TypeError, "max_len"),
    ],
)
def test_padding_mask_bad_inputs(lengths, kwargs, error, name):
    with pytest.raises(error, match=name):
        padding_mask(lengths, **kwargs)


# ----------------------------------------------------------------- converters


def _random_bool_mask(shape, seed, *, keep_one=True):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) > 0.5
    if keep_one:  # keep one allowed key per query so PyTorch does not produce NaN rows
        mask[..., 0] = True
    return mask


def test_to_torch_mha_mask_inverts():
    mask = _random_bool_mask((3, 5), 0)
    inverted = to_torch_mha_mask(mask)
    assert inverted.dtype == torch.bool
    assert torch.equal(inverted, ~mask)
    assert torch.equal(to_torch_mha_mask(inverted), mask)  # an involution


@pytest.mark.parametrize("seed", range(4))
def test_to_torch_mha_mask_into_nn_multihead_attention(seed):
    """Course mask + converter into nn.MultiheadAttention == the same mask in F.sdpa."""
    torch.manual_seed(seed)
    d_model, n_heads, t_q, t_k = 8, 2, 4, 6
    ref = nn.MultiheadAttention(d_model, n_heads, batch_first=True, bias=False).double()
    q_w, k_w, v_w = ref.in_proj_weight.detach().chunk(3)
    query = torch.randn(2, t_q, d_model, dtype=torch.float64)
    memory = torch.randn(2, t_k, d_model, dtype=torch.float64)
    attn_mask = _random_bool_mask((t_q, t_k), seed)
    kpm = padding_mask([t_k, t_k - 2])
    out, _ = ref(query, memory, memory, attn_mask=to_torch_mha_mask(attn_mask),
                 key_padding_mask=to_torch_mha_mask(kpm), need_weights=False)
    # the same computation written with F.sdpa and the course's own mask convention
    def heads(x):  # (B, T, D) -> (B, H, T, head_dim)
        return x.view(x.shape[0], x.shape[1], n_heads, -1).transpose(1, 2)
    mask = attn_mask & kpm[:, None, None, :]  # (B, 1, T_q, T_k)
    o = F.scaled_dot_product_attention(heads(query @ q_w.T), heads(memory @ k_w.T),
                                       heads(memory @ v_w.T), attn_mask=mask)
    expected = o.transpose(1, 2).reshape(2, t_q, d_model) @ ref.out_proj.weight.detach().T
    assert_close(out, expected, **F64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_to_additive_mask_values(dtype):
    mask = _random_bool_mask((2, 3, 4), 1, keep_one=False)
    additive = to_additive_mask(mask, dtype=dtype)
    assert additive.dtype == dtype and additive.shape == mask.shape
    assert (additive[mask] == 0).all()
    assert torch.isneginf(additive[~mask]).all()


@pytest.mark.parametrize("seed", range(4))
def test_to_additive_mask_into_torch_sdpa(seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 6, 5, generator=g, dtype=torch.float64)
    mask = _random_bool_mask((2, 1, 4, 6), seed)
    with_additive = F.scaled_dot_product_attention(
        q, k, v, attn_mask=to_additive_mask(mask, dtype=torch.float64))
    assert_close(with_additive, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **F64)
    course, _ = attention(q, k, v, mask)
    assert_close(with_additive, course, **F64)


@pytest.mark.parametrize("converter", [to_torch_mha_mask, to_additive_mask])
@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (torch.zeros(2, 3), TypeError),  # an additive float mask
        (torch.ones(2, 3, dtype=torch.int64), TypeError),  # 0/1 integers
        ([[True, False]], TypeError),  # not a tensor
    ],
)
def test_converters_refuse_non_bool_masks(converter, bad, error):
    with pytest.raises(error, match="mask"):
        converter(bad)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32", None])
def test_to_additive_mask_bad_dtype(dtype):
    with pytest.raises(TypeError, match="dtype"):
        to_additive_mask(torch.ones(2, 2, dtype=torch.bool), dtype=dtype)


# -------------------------------------------------------------- combine_masks


def test_combine_masks_shapes_and_logic():
    assert combine_masks(3, 4) is None
    assert torch.equal(combine_masks(3, 4, is_causal=True), causal_mask(3, 4))
    attn = _random_bool_mask((3, 4), 2)
    kpm = padding_mask([4, 2], side="left")
    combined = combine_masks(3, 4, mask=attn, attention_mask=kpm, is_causal=True)
    assert combined.shape == (2, 1, 3, 4)
    expected = attn & causal_mask(3, 4) & kpm[:, None, None, :]
    assert torch.equal(combined, expected)
    only_kpm = combine_masks(3, 4, attention_mask=kpm)
    assert only_kpm.shape == (2, 1, 1, 4)
    batched = _random_bool_mask((2, 3, 4), 3)
    assert torch.equal(combine_masks(3, 4, mask=batched), batched.unsqueeze(1))


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"mask": torch.ones(4, 3, dtype=torch.bool)}, ValueError, "mask"),
        ({"mask": torch.ones(3, dtype=torch.bool)}, ValueError, "mask"),
        ({"mask": torch.ones(1, 2, 3, 4, dtype=torch.bool)}, ValueError, "mask"),
        ({"mask": torch.zeros(3, 4)}, TypeError, "mask"),
        ({"mask": [[True] * 4] * 3}, TypeError, "mask"),
        ({"attention_mask": torch.ones(2, 3, dtype=torch.bool)}, ValueError,
         "attention_mask"),
        ({"attention_mask": torch.ones(4, dtype=torch.bool)}, ValueError, "attention_mask"),
        ({"attention_mask": torch.ones(2, 4, dtype=torch.long)}, TypeError,
         "attention_mask"),
        ({"attention_mask": [[True] * 4]}, TypeError, "attention_mask"),
        ({"is_causal": 1}, TypeError, "is_causal"),
        ({"is_causal": "yes"}, TypeError, "is_causal"),
    ],
)
def test_combine_masks_bad_inputs(kwargs, error, name):
    with pytest.raises(error, match=name):
        combine_masks(3, 4, **kwargs)


# ------------------------------------------------- causality through the layer


def _mha(seed: int, d_model: int = 8, n_heads: int = 2, impl: str = "manual"):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, impl=impl).double().eval()


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_future_tokens_never_change_earlier_outputs(impl):
    mha = _mha(0, impl=impl)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 8, generator=g, dtype=torch.float64)
    base = mha(x, is_causal=True)[0]
    for pos in range(x.shape[1]):
        perturbed = x.clone()
        perturbed[:, pos] += 10 * torch.randn(2, 8, generator=g, dtype=torch.float64)
        out = mha(perturbed, is_causal=True)[0]
        assert torch.equal(out[:, :pos], base[:, :pos]), f"leak into positions < {pos}"
        assert not torch.allclose(out[:, pos], base[:, pos])  # the token itself does change
        if pos > 0:  # and without the mask the change reaches earlier positions (a leak)
            assert not torch.allclose(mha(perturbed)[0][:, :pos], mha(x)[0][:, :pos])


def test_causal_with_cache_alignment_matches_full_pass():
    """t_q < t_k (the last queries over all keys) reproduces the tail of a full causal pass."""
    mha = _mha(2)
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    full = mha(x, is_causal=True)[0]
    # the last two queries attend all six keys through a bottom-right (2, 6) causal mask
    tail = mha(x[:, 4:], x, x, mask=causal_mask(2, 6))[0]
    assert_close(tail, full[:, 4:], **F64)
    top_left = torch.ones(2, 6, dtype=torch.bool).tril()
    assert not torch.allclose(mha(x[:, 4:], x, x, mask=top_left)[0], full[:, 4:])


# ----------------------------------------------------- left and right padding


LENGTHS = [5, 2, 4, 1]


def _padded_batch(seqs, side, pad_value):
    max_len = max(s.shape[0] for s in seqs)
    batch = torch.full((len(seqs), max_len, seqs[0].shape[1]), pad_value, dtype=torch.float64)
    for row, seq in enumerate(seqs):
        if side == "right":
            batch[row, : seq.shape[0]] = seq
        else:
            batch[row, max_len - seq.shape[0]:] = seq
    return batch


def _real_positions(seq_len, max_len, side):
    return slice(0, seq_len) if side == "right" else slice(max_len - seq_len, max_len)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_equals_each_sequence_alone(side, is_causal, impl):
    mha = _mha(3, impl=impl)
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randn(n, 8, generator=g, dtype=torch.float64) for n in LENGTHS]
    max_len = max(LENGTHS)
    kpm = padding_mask(LENGTHS, side=side)
    batch = _padded_batch(seqs, side, 0.0)
    # with left pads and is_causal, a real query's causal window starts on pads: only
    # the key padding mask removes them (test_left_padding_without_key_padding_mask_leaks)
    out = mha(batch, attention_mask=kpm, is_causal=is_causal)[0]
    assert torch.isfinite(out).all()  # pad query rows too (some attend to nothing)
    for row, seq in enumerate(seqs):
        alone = mha(seq.unsqueeze(0), is_causal=is_causal)[0][0]
        real = _real_positions(seq.shape[0], max_len, side)
        assert_close(out[row, real], alone, **F64)


@pytest.mark.parametrize("is_causal", [False, True])
def test_left_and_right_padding_agree(is_causal):
    mha = _mha(5)
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randn(n, 8, generator=g, dtype=torch.float64) for n in LENGTHS]
    outs = {}
    for side in ("right", "left"):
        out = mha(_padded_batch(seqs, side, 0.0), attention_mask=padding_mask(LENGTHS, side=side),
                  is_causal=is_causal)[0]
        outs[side] = [out[row, _real_positions(n, max(LENGTHS), side)]
                      for row, n in enumerate(LENGTHS)]
    for right, left in zip(outs["right"], outs["left"], strict=True):
        assert_close(left, right, **F64)


def test_left_padding_without_key_padding_mask_leaks():
    """Why the mask is needed: with left pads and only a causal mask, real tokens see pads."""
    mha = _mha(7)
    seq = torch.randn(3, 8, dtype=torch.float64)
    batch = _padded_batch([seq, torch.randn(5, 8, dtype=torch.float64)], "left", 1.0)
    alone = mha(seq.unsqueeze(0), is_causal=True)[0][0]
    wrong = mha(batch, is_causal=True)[0][0, 2:]
    assert not torch.allclose(wrong, alone)
    right = mha(batch, is_causal=True, attention_mask=padding_mask([3, 5], side="left"))[0][0, 2:]
    assert_close(right, alone, **F64)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_values_do_not_matter(side, impl):
    mha = _mha(8, impl=impl)
    g = torch.Generator().manual_seed(9)
    seqs = [torch.randn(n, 8, generator=g, dtype=torch.float64) for n in LENGTHS]
    kpm = padding_mask(LENGTHS, side=side)
    base = mha(_padded_batch(seqs, side, 0.0), attention_mask=kpm, is_causal=True)[0]
    for pad_value in (1e6, -3.0, 42.0):
        batch = _padded_batch(seqs, side, 0.0)
        batch[~kpm] = pad_value * torch.rand(int((~kpm).sum()), 8, generator=g,
                                             dtype=torch.float64)
        out = mha(batch, attention_mask=kpm, is_causal=True)[0]
        assert torch.isfinite(out).all()
        assert_close(out[kpm], base[kpm], **F64)


def test_cross_attention_padding_mask_has_query_by_key_shape():
    """Decoder queries over padded encoder keys: the mask is (B, 1, T_q, T_k), not (T_k, T_k)."""
    mha = _mha(10)
    memory_lengths = [6, 3]
    memory = torch.randn(2, 6, 8, dtype=torch.float64)
    query = torch.randn(2, 4, 8, dtype=torch.float64)
    kpm = padding_mask(memory_lengths)
    combined = combine_masks(4, 6, attention_mask=kpm)
    assert torch.broadcast_shapes(combined.shape, (2, 2, 4, 6)) == (2, 2, 4, 6)
    out, weights = mha(query, memory, memory, attention_mask=kpm, need_weights=True)
    assert weights.shape == (2, 2, 4, 6)
    assert (weights[1, :, :, 3:] == 0).all()
    assert_close(weights.sum(-1), torch.ones(2, 2, 4, dtype=torch.float64), **F64)
    alone = mha(query[1:], memory[1:, :3], memory[1:, :3])[0]
    assert_close(out[1:], alone, **F64)


# ------------------------------------------------------------ fully masked rows


def _naive_and_big_negative(scores: torch.Tensor, mask: torch.Tensor):
    """Weights from the naive -inf fill and from the -1e9 trick, for the same scores."""
    naive = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    big_negative = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    return naive, big_negative


def test_fully_masked_rows_three_ways():
    g = torch.Generator().manual_seed(11)
    q = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    scores = q @ k.T / 2.0
    naive, big_negative = _naive_and_big_negative(scores, mask)
    assert torch.isnan(naive[1]).all() and torch.isfinite(naive[[0, 2]]).all()
    # -1e9 on every key of row 1 is a uniform average over the masked (pad) keys
    assert_close(big_negative[1], torch.full((5,), 0.2, dtype=torch.float64), **F64)
    out, weights = attention(q, k, v, mask)
    assert (weights[1] == 0).all() and (out[1] == 0).all()
    assert_close(weights[[0, 2]], big_negative[[0, 2]], **F64)  # elsewhere all three agree
    out.sum().backward()
    for grad in (q.grad, k.grad, v.grad):
        assert torch.isfinite(grad).all()
    assert (q.grad[1] == 0).all()  # the empty row's query gets no gradient
    # the naive version: a NaN output row, and NaN in the gradient of every value vector
    v2 = v.detach().clone().requires_grad_(True)
    naive_out = naive.detach() @ v2
    assert torch.isnan(naive_out[1]).all()
    naive_out.sum().backward()
    assert torch.isnan(v2.grad).all()


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_fully_masked_rows_match_torch_fused_attention(impl):
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, 2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    mask = _random_bool_mask((2, 1, 3, 5), 13)
    mask[0, 0, 1] = False  # one fully masked row
    mask[1, 0, :, 2:] = False
    out, _ = attention(q, k, v, mask, impl=impl)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    assert (out[0, :, 1] == 0).all()
    assert_close(out, ref, **F64)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert torch.isfinite(grad).all()
        assert_close(grad, ref_grad, **F64)


# ------------------------------------------------------------------ plotting


def test_plot_mask_draws_the_mask():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_attn.lab.viz import plot_mask

    mask = causal_mask(2, 4)
    ax = plot_mask(mask, x_labels=list("abcd"), title="bottom-right")
    drawn = ax.images[0].get_array()
    assert drawn.shape == (2, 4) and (drawn == mask.numpy()).all()
    assert [t.get_text() for t in ax.texts] == [str(int(m)) for m in mask.flatten().tolist()]
    assert ax.get_title() == "bottom-right" and ax.get_xlabel() == "key (1 = may attend)"
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="mask"):
        plot_mask(torch.ones(2, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        plot_mask(torch.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="x_labels"):
        plot_mask(mask, x_labels=["a"])


# ------------------------------------------- issue 18: lengths, batch sizes, devices


@pytest.mark.parametrize(("t_q", "t_k", "name"), [(0, 4, "t_q"), (4, 0, "t_k"), (-1, 2, "t_q")])
def test_combine_masks_refuses_non_positive_lengths_instead_of_returning_none(t_q, t_k, name):
    with pytest.raises(ValueError, match=rf"^{name} must be a positive int, got"):
        combine_masks(t_q, t_k)


def test_combine_masks_refuses_masks_whose_batch_sizes_disagree():
    attn_mask = torch.ones(2, 3, 3, dtype=torch.bool)  # B = 2
    with pytest.raises(ValueError, match=r"mask and attention_mask disagree on the "
                                         r"batch size B: .*B=2.*B=3"):
        combine_masks(3, 3, mask=attn_mask, attention_mask=torch.ones(3, 3, dtype=bool))
    # B = 1 on either side broadcasts, as before
    out = combine_masks(3, 3, mask=attn_mask[:1], attention_mask=torch.ones(3, 3,
                                                                                   dtype=bool))
    assert out.shape == (3, 1, 3, 3)


@pytest.mark.parametrize("call", [
    lambda device: causal_mask(3, device=device),
    lambda device: padding_mask([2, 1], device=device),
    lambda device: combine_masks(2, 2, is_causal=True, device=device),
], ids=["causal_mask", "padding_mask", "combine_masks"])
def test_mask_builders_name_a_misspelled_or_mistyped_device(call):
    with pytest.raises(ValueError, match=r"^device must name a torch device .* got 'gpu'"):
        call("gpu")
    with pytest.raises(TypeError, match=r"^device must be a torch.device, a string"):
        call(1.5)
    assert call(torch.device("meta")).device.type == "meta"


@pytest.mark.parametrize("lengths", [None, 3, 2.5, "32"])
def test_padding_mask_refuses_lengths_that_are_not_a_sequence_of_ints(lengths):
    with pytest.raises(TypeError, match=r"^lengths must be"):
        padding_mask(lengths)


def test_padding_mask_names_lengths_when_one_is_out_of_range():
    with pytest.raises(ValueError, match=r"^lengths must each be in \[0, max_len=3\]"):
        padding_mask([2, 4], 3)


def test_mask_converters_refuse_ranks_their_targets_do_not_take():
    with pytest.raises(ValueError, match=r"^mask must have 1 to 3 dimensions"):
        to_torch_mha_mask(torch.ones(1, 1, 2, 2, dtype=torch.bool))  # nn.MHA takes <= 3-D
    with pytest.raises(ValueError, match=r"^mask must have at least one dimension"):
        to_additive_mask(torch.tensor(True))
