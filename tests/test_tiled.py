"""The online softmax and the tiled (FlashAttention-style) attention against the manual path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from course_attn.attention import scaled_dot_product_attention
from course_attn.tiled import (
    SoftmaxState,
    merge_softmax_states,
    online_softmax,
    tiled_attention,
)

F64 = dict(dtype=torch.float64)


def case(t_q: int, t_k: int, seed: int = 0, batch: tuple[int, ...] = (2, 3), d_v: int = 5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, t_q, 4, generator=g, **F64).requires_grad_()
    k = torch.randn(*batch, t_k, 4, generator=g, **F64).requires_grad_()
    v = torch.randn(*batch, t_k, d_v, generator=g, **F64).requires_grad_()
    return q, k, v


def assert_paths_agree(q, k, v, mask, *, is_causal, block_q, block_k):
    """Tiled and manual attention: the same outputs and gradients, to float64 round-off."""
    out = tiled_attention(q, k, v, mask, is_causal=is_causal, block_q=block_q, block_k=block_k)
    ref, _ = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    assert_close(out, ref, atol=1e-12, rtol=1e-12)
    grad = torch.randn_like(out)
    tiled_grads = torch.autograd.grad(out, (q, k, v), grad)
    manual_grads = torch.autograd.grad(ref, (q, k, v), grad)
    for tiled_grad, manual_grad in zip(tiled_grads, manual_grads, strict=True):
        assert_close(tiled_grad, manual_grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    ("t_q", "t_k", "block_q", "block_k"),
    [(8, 8, 4, 4), (7, 7, 3, 2), (3, 9, 2, 4), (9, 4, 4, 3), (5, 6, 8, 8), (1, 10, 1, 3)],
    ids=["divides", "does-not-divide", "fewer-queries", "more-queries", "one-block", "decode"],
)
def test_equals_the_manual_path_in_outputs_and_gradients(t_q, t_k, block_q, block_k, is_causal):
    q, k, v = case(t_q, t_k)
    mask = torch.rand(2, 1, t_q, t_k, generator=torch.Generator().manual_seed(1)) > 0.3
    assert_paths_agree(q, k, v, mask, is_causal=is_causal, block_q=block_q, block_k=block_k)


def test_equals_pytorch_sdpa_without_a_mask_and_with_is_causal():
    q, k, v = case(12, 12, seed=3)
    for causal in (False, True):
        out = tiled_attention(q, k, v, is_causal=causal, block_q=5, block_k=4)
        assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                     atol=1e-12, rtol=1e-12)


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    q, k, v = case(4, 6, seed=4)
    mask = torch.ones(2, 3, 4, 6, dtype=torch.bool)
    mask[0, :, 1] = False  # one query sees nothing
    mask[1] = False  # a whole batch element sees nothing
    out = tiled_attention(q, k, v, mask, block_q=3, block_k=4)
    out.sum().backward()
    assert (out[0, :, 1] == 0).all() and (out[1] == 0).all()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert (q.grad[0, :, 1] == 0).all() and (k.grad[1] == 0).all()
    # more queries than keys under the bottom-right causal mask: the first rows see no key
    out = tiled_attention(q, k[..., :2, :], v[..., :2, :], is_causal=True, block_q=3, block_k=1)
    assert (out[..., :2, :] == 0).all() and (out[..., 2:, :].abs().sum(-1) > 0).all()


def test_causal_blocks_in_the_future_are_skipped_not_computed(monkeypatch):
    """Under the causal mask about half the key blocks are never multiplied at all."""
    import course_attn.tiled as tiled

    visited = []
    real = tiled._key_blocks

    def counting(rows, t_k, block_k, causal_offset):
        for cols in real(rows, t_k, block_k, causal_offset):
            visited.append((rows.start, cols.start))
            yield cols

    monkeypatch.setattr(tiled, "_key_blocks", counting)
    q, k, v = case(16, 16, batch=(1,))
    tiled_attention(q, k, v, is_causal=True, block_q=4, block_k=4)
    assert len(visited) == 4 + 3 + 2 + 1  # the lower triangle of a 4 x 4 block grid
    visited.clear()
    tiled_attention(q, k, v, block_q=4, block_k=4)
    assert len(visited) == 16


def test_gradcheck_float64():
    q, k, v = case(5, 6, seed=5, batch=(1,), d_v=2)
    mask = torch.rand(1, 5, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    assert torch.autograd.gradcheck(
        lambda a, b, c: tiled_attention(a, b, c, mask, is_causal=True, block_q=2, block_k=4),
        (q, k, v))


def test_batch_dimensions_broadcast_and_half_precision_keeps_its_dtype():
    q, k, v = case(6, 6, seed=6)
    out = tiled_attention(q, k[:1], v[:1], block_q=4, block_k=4)  # k, v broadcast over batch
    ref, _ = scaled_dot_product_attention(q, k[:1], v[:1])
    assert_close(out, ref, atol=1e-12, rtol=1e-12)
    q16, k16, v16 = (t.detach().bfloat16() for t in (q, k, v))
    half = tiled_attention(q16, k16, v16, block_q=4, block_k=4)
    exact, _ = scaled_dot_product_attention(q16.double(), k16.double(), v16.double())
    assert half.dtype == torch.bfloat16
    assert_close(half.double(), exact, atol=2e-2, rtol=2e-2)  # bf16's output rounding


@settings(max_examples=25, deadline=None)
@given(t_q=st.integers(1, 9), t_k=st.integers(1, 9), block_q=st.integers(1, 10),
       block_k=st.integers(1, 10), causal=st.booleans(), seed=st.integers(0, 1000))
def test_property_random_shapes_blocks_and_masks(t_q, t_k, block_q, block_k, causal, seed):
    q, k, v = case(t_q, t_k, seed=seed, batch=(2,))
    mask = torch.rand(2, t_q, t_k, generator=torch.Generator().manual_seed(seed)) > 0.4
    assert_paths_agree(q, k, v, mask, is_causal=causal, block_q=block_q, block_k=block_k)


def test_online_softmax_equals_softmax_with_masked_and_empty_rows():
    scores = torch.randn(5, 11, generator=torch.Generator().manual_seed(7), **F64)
    scores[1, 4:] = float("-inf")
    scores[2] = float("-inf")  # an empty row: zeros, as in chapter 5
    for block in (1, 3, 4, 11, 20):
        expected = torch.nan_to_num(torch.softmax(scores, dim=-1))
        assert_close(online_softmax(scores, block), expected, atol=1e-15, rtol=1e-15)


def test_merging_two_partial_softmaxes_equals_the_whole():
    g = torch.Generator().manual_seed(8)
    scores, values = torch.randn(3, 10, generator=g, **F64), torch.randn(10, 4, generator=g, **F64)

    def partial(cols: slice) -> SoftmaxState:
        s = scores[:, cols]
        m = s.amax(dim=-1, keepdim=True)
        p = torch.exp(s - m)
        return SoftmaxState(m, p.sum(dim=-1, keepdim=True), p @ values[cols])

    merged = merge_softmax_states(partial(slice(0, 6)), partial(slice(6, 10)))
    assert_close(merged.result(), torch.softmax(scores, -1) @ values, atol=1e-14, rtol=1e-14)
    assert_close(merged.logsumexp(), torch.logsumexp(scores, -1, keepdim=True))
    with pytest.raises(ValueError, match="acc"):
        SoftmaxState(merged.m, merged.l).result()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(block_q=0), ValueError, "block_q"),
        (dict(block_k=-2), ValueError, "block_k"),
        (dict(block_q=2.0), TypeError, "block_q"),
        (dict(block_k=True), TypeError, "block_k"),
        (dict(is_causal="yes"), TypeError, "is_causal"),
        (dict(scale=-1.0), ValueError, "scale"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    q, k, v = case(4, 4)
    with pytest.raises(error, match=match):
        tiled_attention(q, k, v, **kwargs)
    with pytest.raises(TypeError, match="block"):
        online_softmax(torch.zeros(2, 3), 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scores"):
        online_softmax([1.0, 2.0], 1)  # type: ignore[arg-type]


def test_runs_on_the_meta_device_forward_and_backward():
    """No value is read and every tensor is made on the inputs' device (as on a GPU)."""
    q = torch.randn(2, 3, 7, 4, device="meta", requires_grad=True)
    mask = torch.ones(7, 7, dtype=torch.bool)  # made on the CPU: follows q to its device
    out = tiled_attention(q, q, q, mask, is_causal=True, block_q=3, block_k=2)
    out.sum().backward()
    assert out.device.type == "meta" and q.grad.device.type == "meta"
