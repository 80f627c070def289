"""The online softmax and the tiled (FlashAttention-style) attention against the manual path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from course_attn.core.attention import attention, scaled_dot_product_attention
from course_attn.core.masks import padding_mask
from course_attn.core.tiled import (
    SoftmaxState,
    _dropout_keep,
    _dropout_seed,
    merge_softmax_states,
    online_softmax,
    tiled_attention,
)
from course_attn.data.tasks import CopyTask
from course_attn.models.gpt import GPTConfig, MiniGPT

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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("t_q", "t_k", "block_q", "block_k"),
    [(8, 8, 4, 4), (7, 7, 3, 2), (3, 9, 2, 4), (9, 4, 4, 3), (1, 10, 1, 3)],
    ids=["divides", "does-not-divide", "fewer-queries", "more-queries", "decode"],
)
def test_equals_pytorch_sdpa_with_padding_causal_and_fully_masked_rows(t_q, t_k, block_q,
                                                                       block_k, dtype):
    """Against torch's own kernel, through attention(impl="sdpa") (bottom-right causal,
    zeros for empty rows) and directly where every query keeps a key."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in case(t_q, t_k, seed=9))
    keys = padding_mask([t_k, max(t_k - 3, 1)], t_k)[:, None, None, :]  # (B, 1, 1, T_k)
    mask = keys & (torch.rand(2, 3, t_q, t_k, generator=torch.Generator().manual_seed(3)) > .3)
    mask[0, 1, 0] = False  # a query with no key at all
    tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    for m, causal in ((mask, False), (mask, True), (keys, True), (None, True)):
        out = tiled_attention(q, k, v, m, is_causal=causal, block_q=block_q, block_k=block_k)
        ref, _ = attention(q, k, v, m, is_causal=causal, impl="sdpa")
        assert_close(out, ref, **tol)
        grad = torch.randn_like(out)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), grad),
                        torch.autograd.grad(ref, (q, k, v), grad), strict=True):
            assert_close(a, b, **tol)
    direct = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)  # no empty row here
    assert_close(tiled_attention(q, k, v, keys, block_q=block_q, block_k=block_k), direct, **tol)


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
    import course_attn.core.tiled as tiled

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


@settings(max_examples=25, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), t_q=st.integers(1, 12),
       t_k=st.integers(1, 12), block_q=st.integers(1, 13), block_k=st.integers(1, 13),
       causal=st.booleans(), mask_kind=st.sampled_from(["none", "padding", "random"]),
       seed=st.integers(0, 2**16))
def test_property_random_batches_and_masks_against_both_reference_paths(
        batch, t_q, t_k, block_q, block_k, causal, mask_kind, seed):
    """Any batch shape, mask kind and block size: tiled = manual = sdpa (float64)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*batch, t, d, generator=g, **F64).requires_grad_()
               for t, d in ((t_q, 3), (t_k, 3), (t_k, 2)))
    mask = None
    if mask_kind == "padding":  # (..., 1, T_k): real keys first, some rows may keep none
        lengths = torch.randint(0, t_k + 1, (*batch, 1, 1), generator=g)
        mask = torch.arange(t_k) < lengths
    elif mask_kind == "random":
        mask = torch.rand(*batch, t_q, t_k, generator=g) > 0.5
    assert_paths_agree(q, k, v, mask, is_causal=causal, block_q=block_q, block_k=block_k)
    out = tiled_attention(q, k, v, mask, is_causal=causal, block_q=block_q, block_k=block_k)
    fused, _ = attention(q, k, v, mask, is_causal=causal, impl="sdpa")
    assert_close(out, fused, atol=1e-12, rtol=1e-12)


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


# ----------------------------------------------------------------------------- dropout
def dropped_reference(q, k, v, mask, seed, p, *, is_causal):
    """The manual path with the tiled kernel's dropout mask, built whole (T_q x T_k)."""
    _, weights = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    t_q, t_k = q.shape[-2], k.shape[-2]
    keep = _dropout_keep(seed, weights.shape[:-2], t_q, t_k, slice(0, t_q), slice(0, t_k), p)
    return torch.where(keep, weights / (1 - p), 0.0) @ v


@pytest.mark.parametrize(("block_q", "block_k"), [(3, 2), (4, 4), (16, 16)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_dropout_equals_the_manual_path_with_the_same_mask(block_q, block_k, is_causal):
    """The mask depends on the seed and the position only: not on the blocks."""
    q, k, v = case(7, 9, seed=11)
    mask = torch.rand(2, 1, 7, 9, generator=torch.Generator().manual_seed(4)) > 0.3
    torch.manual_seed(5)
    out = tiled_attention(q, k, v, mask, is_causal=is_causal, block_q=block_q,
                          block_k=block_k, dropout_p=0.3)
    torch.manual_seed(5)
    ref = dropped_reference(q, k, v, mask, _dropout_seed(q.device), 0.3, is_causal=is_causal)
    assert_close(out, ref, atol=1e-12, rtol=1e-12)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad),
                    torch.autograd.grad(ref, (q, k, v), grad), strict=True):
        assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_dropout_keeps_one_minus_p_of_the_weights_and_follows_the_seed():
    seed = torch.tensor([12345, 678], dtype=torch.int64)
    keep = _dropout_keep(seed, (4, 5), 100, 100, slice(0, 100), slice(0, 100), 0.25)
    assert keep.shape == (4, 5, 100, 100) and keep.dtype == torch.bool
    assert abs(keep.double().mean().item() - 0.75) < 0.01  # 200,000 draws: 6 sigma
    assert abs(keep[..., 0::2].double().mean().item() - 0.75) < 0.01  # no stripes
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])
    block = _dropout_keep(seed, (4, 5), 100, 100, slice(30, 47), slice(60, 61), 0.25)
    assert torch.equal(block, keep[..., 30:47, 60:61])  # any block asks the same question
    other = _dropout_keep(seed + 1, (4, 5), 100, 100, slice(0, 100), slice(0, 100), 0.25)
    assert (other != keep).double().mean().item() > 0.3
    q, k, v = case(6, 6, seed=12)
    torch.manual_seed(0)
    first = tiled_attention(q, k, v, dropout_p=0.5, block_q=4, block_k=4)
    second = tiled_attention(q, k, v, dropout_p=0.5, block_q=4, block_k=4)
    torch.manual_seed(0)
    again = tiled_attention(q, k, v, dropout_p=0.5, block_q=2, block_k=5)  # other blocks
    assert_close(first, again, atol=1e-12, rtol=1e-12)  # the same mask, other round-off
    assert (first - second).abs().max() > 0.1  # a new seed: a new mask
    plain = tiled_attention(q, k, v, dropout_p=0.0, block_q=4, block_k=4)
    assert_close(plain, scaled_dot_product_attention(q, k, v)[0], atol=1e-12, rtol=1e-12)


def test_gradcheck_float64_with_dropout():
    q, k, v = case(5, 6, seed=13, batch=(1,), d_v=2)
    mask = torch.rand(1, 5, 6, generator=torch.Generator().manual_seed(2)) > 0.3

    def dropped(a, b, c):
        torch.manual_seed(3)  # the same dropout mask on every call gradcheck makes
        return tiled_attention(a, b, c, mask, is_causal=True, block_q=2, block_k=4,
                               dropout_p=0.4)

    assert torch.autograd.gradcheck(dropped, (q, k, v))


def test_dropout_is_checked_like_on_the_other_paths():
    q, k, v = case(4, 4)
    for bad, error in ((1.0, ValueError), (-0.1, ValueError), ("0.1", TypeError)):
        with pytest.raises(error, match="dropout_p"):
            tiled_attention(q, k, v, dropout_p=bad)


# ------------------------------------------------------------------ the model on it
def test_one_training_step_on_the_tiled_path_equals_the_manual_path():
    """MiniGPT(impl="tiled"): the same loss, gradients and updated weights (float64),
    at a length that spans several of the default 32-position blocks, with padding."""
    options = dict(vocab_size=11, context_length=80, n_layers=2, n_heads=2, d_model=16)
    torch.manual_seed(0)
    manual = MiniGPT(GPTConfig(**options, impl="manual")).double()
    tiled = MiniGPT(GPTConfig(**options, impl="tiled")).double()
    tiled.load_state_dict(manual.state_dict())
    idx = torch.randint(11, (3, 80), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(idx, -1, dims=1)
    attention_mask = padding_mask([80, 50, 7], 80, side="left")
    losses = []
    for model in (manual, tiled):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _, loss = model(idx, targets, attention_mask=attention_mask)
        loss.backward()
        optimizer.step()
        losses.append(loss)
    assert_close(losses[0], losses[1], atol=1e-12, rtol=1e-12)
    for (name, a), (_, b) in zip(manual.named_parameters(), tiled.named_parameters(),
                                 strict=True):
        assert a.grad.abs().sum() > 0 or "k_proj.bias" in name  # every weight is trained
        assert_close(a.grad, b.grad, atol=1e-10, rtol=1e-9)
        assert_close(a, b, atol=1e-10, rtol=1e-9)


def test_the_trainer_runs_on_the_tiled_path():
    """train() on impl="tiled" gives the manual path's losses (float32, same seeds)."""
    from course_attn.train import TrainConfig, train

    task = CopyTask(vocab_size=6, half_length=4)
    config = TrainConfig(max_iters=4, batch_size=4, eval_interval=2, eval_iters=2,
                         warmup_iters=1, device="cpu", progress=False)
    results = []
    for impl in ("manual", "tiled"):
        torch.manual_seed(0)
        model = MiniGPT(GPTConfig(vocab_size=6, context_length=task.context_length, n_layers=1,
                                  n_heads=2, d_model=16, impl=impl))
        results.append(train(model, task, config))
    assert_close(torch.tensor(results[1].train_losses), torch.tensor(results[0].train_losses),
                 atol=1e-5, rtol=1e-5)
    assert results[1].eval_iters == [2, 4]


# ------------------------------------------------------------------- the block grid
def test_block_grid_marks_skipped_partial_and_full_blocks():
    from course_attn.core.tiled import block_grid

    grid = block_grid(10, 10, 4, 4, is_causal=True)
    assert grid.tolist() == [[1, 0, 0], [2, 1, 0], [2, 2, 1]]
    assert block_grid(10, 10, 4, 4).tolist() == [[2] * 3] * 3
    assert block_grid(3, 9, 2, 4, is_causal=True).tolist() == [[2, 1, 0], [2, 2, 2]]
    # it is the schedule the kernel runs: the computed blocks are the visited ones
    for t_q, t_k, bq, bk in ((16, 16, 4, 4), (7, 12, 3, 5), (12, 5, 5, 2)):
        computed = (block_grid(t_q, t_k, bq, bk, is_causal=True) > 0).sum().item()
        assert computed == sum(1 for _ in _blocks_visited(t_q, t_k, bq, bk))
    with pytest.raises(ValueError, match="block_k"):
        block_grid(4, 4, 2, 0)
    with pytest.raises(TypeError, match="is_causal"):
        block_grid(4, 4, 2, 2, is_causal=1)


def _blocks_visited(t_q, t_k, block_q, block_k):
    import course_attn.core.tiled as tiled

    return tiled._blocks(t_q, t_k, block_q, block_k, t_k - t_q)


def test_plot_blocks_draws_the_grid_with_a_legend():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_attn import viz
    from course_attn.core.tiled import block_grid

    grid = block_grid(96, 96, 32, 16, is_causal=True)
    ax = viz.plot_blocks(grid, block_q=32, block_k=16, title="t")
    image = ax.get_images()[0].get_array()
    assert image.shape == (3, 6) and (image == grid.numpy()).all()
    assert [text.get_text() for text in ax.get_legend().get_texts()] == [
        "skipped", "computed, partly masked", "computed in full"]
    assert ax.get_xlabel() == "key position" and ax.get_title() == "t"
    assert ax.get_images()[0].get_extent() == [0, 96, 96, 0]  # to scale, in positions
    in_blocks = viz.plot_blocks(grid, legend=False)
    assert in_blocks.get_xlabel() == "key block" and in_blocks.get_legend() is None
    plt.close("all")
    with pytest.raises(ValueError, match="both block_q and block_k"):
        viz.plot_blocks(grid, block_q=32)
    with pytest.raises(ValueError, match="grid must hold only"):
        viz.plot_blocks(torch.full((2, 2), 3))
    with pytest.raises(ValueError, match="grid must be 2-D"):
        viz.plot_blocks(torch.zeros(2))
    with pytest.raises(ValueError, match="block_q"):
        viz.plot_blocks(grid, block_q=0)
