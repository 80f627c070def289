"""Chapter 4: the manual attention path against PyTorch's fused one, gradients, masks, errors."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from course_attn.core.attention import ATTENTION_IMPLS, attention, scaled_dot_product_attention
from course_attn.core.masks import causal_mask
from course_attn.core.triton_attention import TRITON_FOUND

#: The paths this run can execute: the Triton kernel needs triton, and on CPU tensors its
#: interpreter (tests/conftest.py switches it on where no GPU is).
RUNNABLE = tuple(impl for impl in ATTENTION_IMPLS if impl != "triton" or (
    TRITON_FOUND and os.environ.get("TRITON_INTERPRET") == "1"))


def _random_case(seed: int, dtype: torch.dtype):
    """Random shapes: 0-2 extra batch dims, T_q != T_k in general, d_k != d_v in general."""
    g = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    batch = tuple(randint(1, 3) for _ in range(seed % 3))
    t_q, t_k, d_k, d_v = randint(1, 6), randint(1, 7), randint(1, 8), randint(1, 9)
    q = torch.randn(*batch, t_q, d_k, generator=g, dtype=dtype)
    k = torch.randn(*batch, t_k, d_k, generator=g, dtype=dtype)
    v = torch.randn(*batch, t_k, d_v, generator=g, dtype=dtype)
    return g, q, k, v


def _random_mask(g: torch.Generator, shape: tuple[int, ...], *, keep_one: bool) -> torch.Tensor:
    mask = torch.rand(shape, generator=g) > 0.4
    if keep_one:  # every query keeps at least its first key
        mask[..., 0] = True
    return mask


SEEDS = range(12)
DTYPES = [torch.float32, torch.float64]


def _tol(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 1e-5}
    return {"atol": 1e-12, "rtol": 1e-10}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_torch_sdpa_without_mask(seed, dtype):
    _, q, k, v = _random_case(seed, dtype)
    out, weights = scaled_dot_product_attention(q, k, v)
    assert out.shape == (*q.shape[:-1], v.shape[-1])
    assert weights.shape == (*q.shape[:-1], k.shape[-2])
    assert_close(out, F.scaled_dot_product_attention(q, k, v), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_torch_sdpa_with_boolean_masks(seed, dtype):
    g, q, k, v = _random_case(seed, dtype)
    batch, t_q, t_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    # full shape, one shared (T_q, T_k) mask, and a key-padding-like (..., 1, T_k) mask
    for shape in [(*batch, t_q, t_k), (t_q, t_k), (*batch, 1, t_k)]:
        mask = _random_mask(g, shape, keep_one=True)
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **_tol(dtype))
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_is_causal_matches_torch_in_the_square_case(seed, dtype):
    _, q, k, v = _random_case(seed, dtype)
    k, v = k[..., : q.shape[-2], :], v[..., : q.shape[-2], :]  # T_k = T_q ...
    if k.shape[-2] < q.shape[-2]:  # ... or cut the queries when there were fewer keys
        q = q[..., : k.shape[-2], :]
    out, weights = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **_tol(dtype))
    assert (weights.triu(diagonal=1) == 0).all()


def test_is_causal_with_fewer_queries_is_bottom_right_aligned():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, t, 4, generator=g) for t in (3, 5, 5))
    out, weights = scaled_dot_product_attention(q, k, v, is_causal=True)
    # query i sits at position 2 + i of the 5 keys and may see keys 0 .. 2 + i
    reference_mask = torch.ones(3, 5, dtype=torch.bool).tril(diagonal=2)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=reference_mask))
    assert torch.equal(weights[0] > 0, reference_mask)


@pytest.mark.parametrize("seed", range(4))
def test_explicit_scale_matches_torch(seed):
    _, q, k, v = _random_case(seed, torch.float64)
    out, _ = scaled_dot_product_attention(q, k, v, scale=0.3)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), **_tol(torch.float64))


def test_scaling_uses_the_key_width_not_the_value_width():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(5, 4, generator=g), torch.randn(6, 4, generator=g)  # d_k = 4
    v = torch.randn(6, 16, generator=g)  # d_v = 16 (a "model width" of 16)
    _, weights = scaled_dot_product_attention(q, k, v)
    assert_close(weights, torch.softmax(q @ k.T / math.sqrt(4), dim=-1))
    assert not torch.allclose(weights, torch.softmax(q @ k.T / math.sqrt(16), dim=-1))


@pytest.mark.parametrize("seed", range(8))
def test_rows_are_distributions_over_allowed_keys(seed):
    g, q, k, v = _random_case(seed, torch.float64)
    mask = _random_mask(g, (*q.shape[:-1], k.shape[-2]), keep_one=True)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert (weights >= 0).all()
    assert_close(weights.sum(-1), torch.ones(weights.shape[:-1], dtype=torch.float64))
    assert (weights[~mask] == 0).all()
    assert (weights[mask] > 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(6))
def test_every_impl_of_the_switch_agrees_in_outputs_and_gradients(seed, dtype):
    g, q0, k0, v0 = _random_case(seed, dtype)
    mask = _random_mask(g, (*q0.shape[:-1], k0.shape[-2]), keep_one=False)  # may drop rows
    results = {}
    for impl in RUNNABLE:
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        out, weights = attention(q, k, v, mask, impl=impl)
        assert (weights is None) == (impl != "manual")  # only the manual path has weights
        out.pow(2).sum().backward()
        results[impl] = (out, q.grad, k.grad, v.grad)
    assert set(ATTENTION_IMPLS) == {"manual", "sdpa", "tiled", "triton", "flex"}
    assert {"manual", "sdpa", "tiled"} <= set(results)
    for impl in (impl for impl in RUNNABLE if impl != "manual"):
        for manual, other in zip(results["manual"], results[impl], strict=True):
            assert torch.isfinite(manual).all()
            assert_close(manual, other, **_tol(dtype))


@pytest.mark.parametrize("t_q,t_k", [(4, 4), (2, 5), (5, 3)])
def test_switch_agrees_with_is_causal_in_any_shape(t_q, t_k):
    g = torch.Generator().manual_seed(t_q * 10 + t_k)
    q, k, v = (torch.randn(2, t, 3, generator=g) for t in (t_q, t_k, t_k))
    manual, _ = attention(q, k, v, is_causal=True, impl="manual")
    fused, _ = attention(q, k, v, is_causal=True, impl="sdpa")
    tiled, _ = attention(q, k, v, is_causal=True, impl="tiled")
    assert_close(manual, fused)
    assert_close(manual, tiled)
    explicit, _ = scaled_dot_product_attention(q, k, v, causal_mask(t_q, t_k))
    assert_close(manual, explicit)


def test_gradcheck_float64_with_and_without_mask():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, t, d, generator=g, dtype=torch.float64, requires_grad=True)
               for t, d in ((3, 4), (5, 4), (5, 2)))
    mask = _random_mask(g, (2, 3, 5), keep_one=True)
    mask[0, 1] = False  # one query with no allowed key at all

    def manual(q, k, v):
        return scaled_dot_product_attention(q, k, v, mask)[0]

    def fused(q, k, v):
        return attention(q, k, v, mask, impl="sdpa")[0]

    assert torch.autograd.gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
                                    (q, k, v))
    assert torch.autograd.gradcheck(manual, (q, k, v))
    assert torch.autograd.gradcheck(fused, (q, k, v))


def test_masked_keys_get_zero_weight_and_zero_gradient():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, t, 3, generator=g, requires_grad=True) for t in (4, 6, 6))
    key_ok = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 0]], dtype=torch.bool)  # (B, T_k)
    out, weights = scaled_dot_product_attention(q, k, v, key_ok[:, None, :])  # (B, 1, T_k)
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    blocked = ~key_ok
    assert (weights.transpose(1, 2)[blocked] == 0).all()  # (B, T_k, T_q) rows of blocked keys
    assert (k.grad[blocked] == 0).all() and (v.grad[blocked] == 0).all()
    assert (k.grad[key_ok].abs().sum(-1) > 0).all() and (v.grad[key_ok].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_fully_masked_rows_give_zeros_and_finite_gradients(impl):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(3, t, 4, generator=g, requires_grad=True) for t in (3, 5, 5))
    mask = torch.ones(3, 3, 5, dtype=torch.bool)
    mask[1, 2] = False  # query 2 of batch 1 may attend to nothing
    mask[2] = False  # batch 2 may attend to nothing at all
    out, weights = attention(q, k, v, mask, impl=impl)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert (out[1, 2] == 0).all() and (out[2] == 0).all()
    assert (out[0].abs().sum(-1) > 0).all()
    if weights is not None:
        assert (weights[1, 2] == 0).all() and (weights[2] == 0).all()
        assert_close(weights[0].sum(-1), torch.ones(3))
    for grad in (q.grad, k.grad, v.grad):
        assert torch.isfinite(grad).all()
    assert (q.grad[1, 2] == 0).all() and (k.grad[2] == 0).all() and (v.grad[2] == 0).all()


def test_half_precision_input_keeps_its_dtype_and_matches_float32():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 4, 8, generator=g) for _ in range(3))
    out16, w16 = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    out32, _ = scaled_dot_product_attention(q, k, v)
    assert out16.dtype == torch.bfloat16 and w16.dtype == torch.bfloat16
    assert_close(out16.float(), out32, atol=5e-2, rtol=5e-2)


def test_dropout_only_when_asked_and_reproducible_under_a_seed():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 6, 4, generator=g) for _ in range(3))
    plain, w_plain = scaled_dot_product_attention(q, k, v)
    again, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(plain, again)
    torch.manual_seed(0)
    dropped, w_drop = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(0)
    dropped_again, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(dropped, dropped_again)
    kept = w_drop != 0
    assert (~kept).any() and kept.any()
    # inverted dropout: survivors are scaled by 1 / (1 - p)
    assert_close(w_drop[kept], 2 * w_plain[kept])


# ---------------------------------------------------------------- bad input


def _qkv():
    return torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_bad_inputs_raise_clear_errors(impl):
    q, k, v = _qkv()
    cases = [
        # (kwargs, error type, a phrase the message must contain)
        (dict(k=torch.randn(2, 5, 3)), ValueError, r"q and k must share.*d_k"),
        (dict(v=torch.randn(2, 4, 6)), ValueError, r"k and v must have the same .*T_k"),
        (dict(mask=torch.ones(3, 4, dtype=torch.bool)), ValueError, r"mask of shape \(3, 4\)"),
        (dict(mask=torch.ones(2, 3, 5)), TypeError, r"mask must have dtype torch.bool"),
        (dict(mask=torch.ones(2, 3, 5, dtype=torch.long)), TypeError, r"mask must have dtype"),
        (dict(q=torch.randn(4)), ValueError, r"q must have at least 2 dimensions"),
        (dict(k=torch.randn(4)), ValueError, r"k must have at least 2 dimensions"),
        (dict(v=[[1.0]]), TypeError, r"v must be a torch.Tensor"),
        (dict(q=torch.ones(2, 3, 4, dtype=torch.long)), TypeError, r"q must be a floating-point"),
        (dict(v=torch.randn(2, 5, 6, dtype=torch.float64)), TypeError,
         r"q, k and v must share a dtype"),
        (dict(k=torch.randn(3, 5, 4), v=torch.randn(3, 5, 6)), ValueError, r"batch dimensions"),
        (dict(is_causal=1), TypeError, r"is_causal must be a bool"),
        (dict(scale=0.0), ValueError, r"scale must be a positive"),
        (dict(dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    ]
    for kwargs, error, phrase in cases:
        args = {"q": q, "k": k, "v": v, "mask": None} | kwargs
        with pytest.raises(error, match=phrase):
            attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("mask"),
                      impl=impl, **args)


def test_unknown_impl_names_the_argument():
    q, k, v = _qkv()
    with pytest.raises(ValueError,
                       match=r"impl must be one of \('manual', 'sdpa', 'tiled', 'triton', "
                             r"'flex'\), got 'flash'"):
        attention(q, k, v, impl="flash")


# ------------------------------------------------ padding never leaks, on any kernel
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nan_and_inf_in_padded_keys_never_reach_real_outputs(impl, dtype):
    """0 x NaN = NaN: a padded slot's garbage must be removed, not just weighted by zero."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g).to(dtype) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[0, ..., 3:] = False  # batch 0: keys 3 and 4 are padding
    k[0, :, 3], v[0, :, 3], v[0, :, 4] = float("nan"), float("nan"), float("inf")
    clean_k, clean_v = k.clone(), v.clone()
    clean_k[0, :, 3:], clean_v[0, :, 3:] = 0.0, 0.0
    out, _ = attention(q, k, v, mask, impl=impl)
    expected, _ = attention(q, clean_k, clean_v, mask, impl=impl)
    assert torch.isfinite(out).all()
    assert torch.equal(out, expected)  # the pads' contents do not matter at all
    # with a causal mask as well (the decoder's case), on both paths
    out, _ = attention(q, k, v, mask, is_causal=True, impl=impl)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_path_zeroes_fully_masked_rows_whatever_the_kernel_returns(dtype, monkeypatch):
    """On an H100, PyTorch's fp16/bf16 kernels gave 1.69 and 2.45 for fully masked rows.

    The spy plays such a kernel (it writes garbage into the rows with no allowed key);
    ``attention`` must still return zeros there, as chapter 5 promises.
    """
    real = F.scaled_dot_product_attention

    def kernel_with_garbage_rows(q, k, v, attn_mask=None, **kwargs):
        out = real(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is not None:
            no_key = ~attn_mask.any(dim=-1, keepdim=True)
            out = out.masked_fill(no_key, 2.45)
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel_with_garbage_rows)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 4, 6, generator=g).to(dtype) for _ in range(3))
    mask = torch.ones(2, 4, 4, dtype=torch.bool)
    mask[0, 1] = False  # one query with no key
    mask[1] = False  # a whole batch element with no key
    out, _ = attention(q, k, v, mask, impl="sdpa")
    manual, _ = attention(q, k, v, mask, impl="manual")
    assert out.dtype == dtype
    assert (out[0, 1] == 0).all() and (out[1] == 0).all() and (manual[1] == 0).all()
    assert (out[0, 0].abs().sum() > 0) and torch.isfinite(out).all()
    # more queries than keys under the bottom-right causal mask: the first rows see nothing
    out, _ = attention(q, k[:, :2], v[:, :2], is_causal=True, impl="sdpa")
    assert (out[:, :2] == 0).all() and (out[:, 2:].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_path_gradients_stay_finite_whatever_the_kernel_does_with_empty_rows(
        dtype, monkeypatch):
    """On an H200, cuDNN's float16 and bfloat16 kernel with a boolean mask gave a row with no
    allowed key a nonzero output and NaN gradients (benchmarks/records/
    h200-2026-11-28-empty-rows.md); zeroing the output afterwards does not stop the NaN.

    The spy plays such a kernel (NaN in the rows with no allowed key, forward and backward);
    ``attention`` must keep every gradient finite, as chapter 5 promises.
    """
    real = F.scaled_dot_product_attention
    seen_empty_rows = []

    def kernel_with_nan_rows(q, k, v, attn_mask=None, **kwargs):
        out = real(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is not None:
            no_key = ~attn_mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
            seen_empty_rows.append(bool(no_key.any()))
            if no_key.any():  # (0 * NaN is NaN: the spy touches nothing else)
                out = torch.where(no_key, out * float("nan"), out)
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel_with_nan_rows)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 4, 6, generator=g).to(dtype).requires_grad_()
               for _ in range(3))
    mask = torch.ones(2, 4, 4, dtype=torch.bool).tril()
    mask[0, :2] = False  # two queries with no key
    out, _ = attention(q, k, v, mask, impl="sdpa")
    out.float().sum().backward()
    assert seen_empty_rows == [False]  # the kernel never saw an empty row
    assert (out[0, :2] == 0).all() and torch.isfinite(out).all()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert (q.grad[0, :2] == 0).all()  # an empty row's query gets no gradient
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    attention(q, k, v, mask, impl="manual")[0].float().sum().backward()
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {}
    for got, manual in zip(expected, (q.grad, k.grad, v.grad), strict=True):
        assert_close(got, manual, **tol)


def test_a_cpu_mask_follows_the_queries_device():
    q = torch.randn(1, 3, 4, device="meta")
    out, _ = attention(q, q, q, causal_mask(3), impl="sdpa")
    assert out.device.type == "meta"


# ------------------------------------------------ issue 18: zero head size, NaN policy


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_a_zero_head_size_is_a_value_error_not_a_zero_division(impl):
    q = k = torch.ones(2, 3, 0)
    with pytest.raises(ValueError, match=r"q and k must have a head size d_k >= 1"):
        attention(q, k, torch.ones(2, 3, 4), impl=impl)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_nan_policy_attention_never_scans_values_and_propagates_nan(impl):
    """attention() reads no values (the policy of course_attn._validation): a NaN query
    spoils its own row only; a NaN key every row that attends to it; a NaN in a key
    that no query may attend to (padding) is contained."""
    g = torch.Generator().manual_seed(18)
    q, k, v = (torch.randn(1, 4, 8, generator=g) for _ in range(3))
    q[0, 1, 0] = float("nan")  # query 1
    out, _ = attention(q, k, v, impl=impl)
    assert torch.isnan(out[0, 1]).all()
    assert torch.isfinite(out[0, [0, 2, 3]]).all()
    q[0, 1, 0] = 0.0
    k[0, 2, 0] = float("nan")  # key 2, attended by every query: every row is NaN
    out, _ = attention(q, k, v, impl=impl)
    assert torch.isnan(out).all()
    mask = torch.tensor([True, True, False, True])  # key 2 is padding: contained
    out, _ = attention(q, k, v, mask, impl=impl)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_a_one_dimensional_key_mask_broadcasts_like_its_full_form(impl):
    """A (T_k,) mask broadcasts to (T_q, T_k); it used to crash with an IndexError."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 4, generator=g) for _ in range(3))
    keys = torch.tensor([True, False, True])
    out, _ = attention(q, k, v, keys, impl=impl)
    full, _ = attention(q, k, v, keys.expand(2, 3, 3), impl=impl)
    assert_close(out, full)
