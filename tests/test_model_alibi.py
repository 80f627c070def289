"""Issue 14: ALiBi wired into the attention core (``bias=``) and into MiniGPT.

The reference for the model is ``alibi.alibi_attention``, written separately
(its own score line, tested against PyTorch's SDPA in ``test_alibi``); the
variant sweep of ``test_model_variants`` covers causality, padding, the cache,
the three paths, ``meta`` and compilation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from course_attn import attention_maps
from course_attn.core.attention import ATTENTION_IMPLS, attention, scaled_dot_product_attention
from course_attn.core.layers import split_heads
from course_attn.core.masks import causal_mask
from course_attn.core.tiled import tiled_attention
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.modern.alibi import alibi_attention, alibi_bias, alibi_slopes

V = 13
TIGHT = {"rtol": 0, "atol": 1e-12}
IDX = torch.tensor([[3, 1, 4, 1, 5], [9, 9, 2, 6, 5], [7, 7, 7, 7, 3]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)
impls = pytest.mark.parametrize("impl", ATTENTION_IMPLS)


def tiny(impl: str = "manual", **overrides) -> MiniGPT:
    torch.manual_seed(0)
    options = dict(vocab_size=V, context_length=12, n_layers=2, n_heads=4, d_model=16, impl=impl,
                   init_std=0.2, pos_encoding="alibi")
    return MiniGPT(GPTConfig(**{**options, **overrides})).double().eval()


def qkv(*shape_q: int, t_k: int, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    *batch, t_q, d = shape_q
    return (torch.randn(*batch, t_q, d, generator=g, dtype=dtype),
            torch.randn(*batch, t_k, d, generator=g, dtype=dtype),
            torch.randn(*batch, t_k, d, generator=g, dtype=dtype))


# ------------------------------------------------------- the bias in attention()
@impls
@pytest.mark.parametrize("t_q", [6, 2, 1])
def test_attention_with_the_alibi_bias_equals_alibi_attention(impl, t_q):
    q, k, v = qkv(2, 3, t_q, 4, t_k=6)
    slopes = alibi_slopes(3, dtype=torch.float64)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., :2] = False  # left padding in the second row
    expected, weights = alibi_attention(q, k, v, slopes, mask, is_causal=True)
    out, _ = attention(q, k, v, mask, is_causal=True, bias=alibi_bias(t_q, 6, slopes), impl=impl)
    assert_close(out, expected, **TIGHT)
    _, manual_weights = scaled_dot_product_attention(q, k, v, mask, is_causal=True,
                                                     bias=alibi_bias(t_q, 6, slopes))
    assert_close(manual_weights, weights, **TIGHT)


@impls
def test_a_general_bias_matches_pytorchs_float_mask(impl):
    """Any float bias, broadcast over the batch, equals SDPA's additive attn_mask."""
    q, k, v = qkv(2, 2, 4, 8, t_k=5, seed=1)
    bias = torch.randn(2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert_close(attention(q, k, v, bias=bias, impl=impl)[0], expected, **TIGHT)
    mask = causal_mask(4, 5)
    expected = F.scaled_dot_product_attention(q, k, v,
                                              attn_mask=bias.masked_fill(~mask, float("-inf")))
    assert_close(attention(q, k, v, mask, bias=bias, impl=impl)[0], expected, **TIGHT)


@impls
def test_a_zero_bias_changes_nothing_and_none_is_the_old_call(impl):
    q, k, v = qkv(2, 2, 5, 4, t_k=5, seed=3)
    plain, _ = attention(q, k, v, is_causal=True, impl=impl)
    assert torch.equal(attention(q, k, v, is_causal=True, bias=None, impl=impl)[0], plain)
    zero = torch.zeros(5, 5, dtype=torch.float64)
    assert_close(attention(q, k, v, is_causal=True, bias=zero, impl=impl)[0], plain, **TIGHT)


@impls
def test_fully_masked_rows_give_zeros_and_finite_gradients_with_a_bias(impl):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 4, 4, t_k=4, seed=4))
    bias = alibi_bias(4, 4, alibi_slopes(2, dtype=torch.float64)).requires_grad_()
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    out, _ = attention(q, k, v, mask, bias=bias, impl=impl)
    assert torch.equal(out[..., 1, :], torch.zeros_like(out[..., 1, :]))
    out.sum().backward()
    for t in (q, k, v, bias):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(bias.grad[:, 1], torch.zeros_like(bias.grad[:, 1]))


@impls
def test_a_nan_in_a_padded_key_stays_contained_with_a_bias(impl):
    q, k, v = qkv(2, 2, 4, 4, t_k=4, seed=5)
    k[1, :, 0], v[1, :, 0] = float("nan"), float("inf")  # slot 0 of row 1 is padding
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    mask[1, ..., 0] = False
    bias = alibi_bias(4, 4, alibi_slopes(2, dtype=torch.float64))
    out, _ = attention(q, k, v, mask, is_causal=True, bias=bias, impl=impl)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("impl", ["sdpa", "tiled"])
def test_bias_gradients_equal_the_manual_paths(impl):
    q, k, v = qkv(2, 2, 5, 4, t_k=7, seed=6)
    bias = torch.randn(2, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., :3] = False
    grads = []
    for path in ("manual", impl):
        inputs = [t.clone().requires_grad_() for t in (q, k, v, bias)]
        out, _ = attention(*inputs[:3], mask, is_causal=True, bias=inputs[3], impl=path)
        out.pow(2).sum().backward()
        grads.append([t.grad for t in inputs])
    for a, b in zip(*grads, strict=True):
        assert_close(b, a, **TIGHT)


def test_tiled_bias_gradcheck_across_block_boundaries():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 5, 3, t_k=7, seed=8))
    bias = torch.randn(5, 7, dtype=torch.float64).requires_grad_()  # broadcast over batch
    assert torch.autograd.gradcheck(
        lambda q, k, v, b: tiled_attention(q, k, v, is_causal=True, bias=b, block_q=2,
                                           block_k=3), (q, k, v, bias))


def test_a_cpu_bias_follows_q_to_its_device_and_half_q_its_dtype():
    q = torch.zeros(2, 2, 3, 4, device="meta")
    out, _ = attention(q, q, q, bias=torch.zeros(3, 3), impl="sdpa")
    assert out.device.type == "meta"
    qh, kh, vh = (t.to(torch.bfloat16) for t in qkv(1, 2, 4, 8, t_k=4, seed=9))
    bias = alibi_bias(4, 4, alibi_slopes(2))  # float32
    outs = [attention(qh, kh, vh, is_causal=True, bias=bias, impl=i)[0] for i in ATTENTION_IMPLS]
    assert all(o.dtype == torch.bfloat16 for o in outs)
    for o in outs[1:]:
        assert_close(o.float(), outs[0].float(), rtol=0, atol=2e-2)


# --------------------------------------------------------------------- MiniGPT
def test_alibi_has_no_position_parameters_and_unsaved_slopes():
    alibi, rope, learned = tiny(), tiny(pos_encoding="rope"), tiny(pos_encoding="learned")
    assert alibi.pos is None and alibi.pos_table is None
    assert alibi.state_dict().keys() == rope.state_dict().keys()
    assert alibi.num_parameters() == rope.num_parameters()
    assert learned.num_parameters() - alibi.num_parameters() == 12 * 16
    assert "alibi" not in alibi.state_dict()  # a buffer made from n_heads, not a weight
    assert learned.alibi is None and rope.alibi is None
    # no weight depends on context_length: a model made for longer contexts loads these weights
    longer = tiny(context_length=24)
    longer.load_state_dict(alibi.state_dict())
    assert torch.equal(longer(IDX)[0], alibi(IDX)[0])


def test_the_bias_is_made_once_and_a_cached_step_takes_its_bottom_right_rows():
    model = tiny()
    slopes = alibi_slopes(4, dtype=torch.float64)
    length = model.config.context_length
    assert torch.equal(model.alibi, alibi_bias(length, length, slopes))  # (H, T_max, T_max)
    seen = []  # the bias each block's attention is handed, read with a forward hook
    model.blocks[0].self_attn.register_forward_hook(
        lambda module, args, kwargs, out: seen.append(kwargs["bias"]), with_kwargs=True)
    caches = model.new_caches()
    model(IDX[:, :3], caches=caches)
    model(IDX[:, 3:5], caches=caches)  # two new tokens after three cached ones
    assert torch.equal(seen[0], alibi_bias(3, 3, slopes))
    assert torch.equal(seen[1], alibi_bias(2, 5, slopes))  # rows 3, 4 of the full bias


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_the_first_layers_weights_equal_alibi_attention_by_hand(n_kv_heads):
    """attention_maps of layer 0 against the separate reference, padding included."""
    model = tiny(n_kv_heads=n_kv_heads)
    maps = attention_maps(model, IDX, attention_mask=MASK)  # (L, B, H, T, T)
    attn = model.blocks[0].self_attn
    h = model.blocks[0].norm1(model.embed(IDX))  # no position is added to the tokens
    group = 4 // attn.n_kv_heads
    q, k, v = attn.qkv_proj(h).split((attn.d_model, attn.kv_width, attn.kv_width), dim=-1)
    q = split_heads(q, 4)  # (B, H, T, hd)
    k = split_heads(k, attn.n_kv_heads).repeat_interleave(group, dim=1)
    v = split_heads(v, attn.n_kv_heads).repeat_interleave(group, dim=1)
    _, expected = alibi_attention(q, k, v, alibi_slopes(4, dtype=torch.float64),
                                  MASK[:, None, None, :], is_causal=True)
    assert_close(maps[0], expected, **TIGHT)
    # and ALiBi really is in there: without the bias the weights differ
    _, plain = scaled_dot_product_attention(q, k, v, MASK[:, None, None, :], is_causal=True)
    assert not torch.allclose(maps[0], plain)


@pytest.mark.parametrize("shift", [1, 4])
def test_an_alibi_model_sees_only_relative_positions(shift):
    """Pads in front of a row (masked) shift every position and change no logit."""
    model = tiny()
    row = IDX[:1]
    padded = torch.cat([torch.full((1, shift), 8), row], dim=1)
    mask = torch.cat([torch.zeros(1, shift, dtype=torch.bool), torch.ones_like(row).bool()], 1)
    assert_close(model(padded, attention_mask=mask)[0][:, shift:], model(row)[0], **TIGHT)


def test_alibi_gradients_agree_on_every_path():
    grads = []
    for impl in ATTENTION_IMPLS:
        model = tiny(impl).train()
        _, loss = model(IDX, IDX, attention_mask=MASK)
        loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            assert_close(b, a, **TIGHT)


def test_alibi_under_bf16_autocast_runs_and_is_finite():
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=V, context_length=12, n_layers=1, n_heads=2, d_model=16,
                              pos_encoding="alibi", impl="sdpa"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(IDX, IDX, attention_mask=MASK)
    assert torch.isfinite(logits.float()).all() and torch.isfinite(loss)


def test_alibi_overfits_one_batch():
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=V, context_length=8, n_layers=1, n_heads=2, d_model=32,
                              pos_encoding="alibi", impl="sdpa"))
    idx = torch.randint(V, (4, 9), generator=torch.Generator().manual_seed(4))
    x, y = idx[:, :-1], idx[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        _, loss = model(x, y)
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert first > 2.0 and loss.item() < 0.1
