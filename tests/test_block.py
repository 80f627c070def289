"""Chapter 7: the Transformer block against PyTorch's own layers, positions, masks, bad input.

Equivalence with ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``
holds with these choices, passed to both sides: ``batch_first=True``, the same
``activation`` ("relu" or "gelu", both exact, not the tanh approximation), the same
``dim_feedforward``, ``dropout=0.0`` and eval mode, and the weights copied (torch
keeps q/k/v in one ``in_proj_weight = cat([W_q, W_k, W_v])``). PyTorch's
``TransformerEncoderLayer`` fast path (eval + no_grad, float32) computes padded
rows normally (only ``nn.TransformerEncoder`` with nested tensors zeroes them),
so every position is compared, padded ones included.
Masks: the course's ``True`` = may attend; torch's ``True`` = blocked, hence ``~mask``.

Tolerances: float32 ``atol=rtol=1e-5`` (observed differences ~1e-6: the two
sides sum in different orders); float64 ``atol=1e-12, rtol=1e-10``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

from course_attn import (
    EncoderDecoder,
    EncoderDecoderConfig,
    FeedForward,
    PositionalEncoding,
    TransformerBlock,
    block_gradient_norms,
    causal_mask,
    padding_mask,
    positions_from_attention_mask,
    residual_stream_rms,
    sinusoidal_table,
    stream_gradient_norm,
    to_torch_mha_mask,
)

D, H, D_FF = 16, 4, 24


def _tol(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 1e-5}
    return {"atol": 1e-12, "rtol": 1e-10}


def _copy_attention(ours, theirs) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                           ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_common(block: TransformerBlock, ref: nn.Module) -> None:
    _copy_attention(block.self_attn, ref.self_attn)
    ref.linear1.load_state_dict(block.ff.linear1.state_dict())
    ref.linear2.load_state_dict(block.ff.linear2.state_dict())
    ref.norm1.load_state_dict(block.norm1.state_dict())


def _perturb_norms(block: TransformerBlock, g: torch.Generator) -> None:
    """LayerNorms start at weight 1, bias 0: randomise them so a swapped norm would show."""
    with torch.no_grad():
        for norm in (block.norm1, block.norm2, block.norm3):
            if norm is not None:
                norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=g))
                norm.bias.copy_(0.3 * torch.randn(norm.bias.shape, generator=g))


@pytest.mark.parametrize("grad_enabled", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_block_matches_torch_encoder_layer(norm_first, activation, dtype, grad_enabled):
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(0)
    block = TransformerBlock(D, H, d_ff=D_FF, norm_first=norm_first, activation=activation)
    _perturb_norms(block, g)
    ref = nn.TransformerEncoderLayer(D, H, dim_feedforward=D_FF, dropout=0.0,
                                     activation=activation, batch_first=True,
                                     norm_first=norm_first)
    with torch.no_grad():
        _copy_common(block, ref)
        ref.norm2.load_state_dict(block.norm2.state_dict())
    block, ref = block.to(dtype).eval(), ref.to(dtype).eval()
    x = torch.randn(3, 6, D, generator=g, dtype=dtype)
    mask = padding_mask([6, 4, 1])  # (B, T): a full row, a padded one, a single token
    with torch.set_grad_enabled(grad_enabled):
        ours = block(x, attention_mask=mask)
        theirs = ref(x, src_key_padding_mask=to_torch_mha_mask(mask))
    assert ours.shape == (3, 6, D)
    assert_close(ours, theirs, **_tol(dtype))


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_matches_torch_decoder_layer(norm_first):
    """layers.py names norm1=self-attn, norm2=feed-forward, norm3=cross-attention;
    nn.TransformerDecoderLayer names norm1=self, norm2=cross, norm3=feed-forward."""
    dtype = torch.float64
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(1)
    block = TransformerBlock(D, H, d_ff=D_FF, norm_first=norm_first, cross_attention=True,
                             activation="relu")
    _perturb_norms(block, g)
    ref = nn.TransformerDecoderLayer(D, H, dim_feedforward=D_FF, dropout=0.0,
                                     activation="relu", batch_first=True, norm_first=norm_first)
    with torch.no_grad():
        _copy_common(block, ref)
        _copy_attention(block.cross_attn, ref.multihead_attn)
        ref.norm2.load_state_dict(block.norm3.state_dict())  # cross-attention's norm
        ref.norm3.load_state_dict(block.norm2.state_dict())  # feed-forward's norm
    block, ref = block.to(dtype).eval(), ref.to(dtype).eval()
    x = torch.randn(2, 5, D, generator=g, dtype=dtype)  # target (B, T_t, D)
    memory = torch.randn(2, 7, D, generator=g, dtype=dtype)  # encoder output (B, T_s, D)
    tgt_mask, mem_mask = padding_mask([5, 3]), padding_mask([4, 7])
    ours = block(x, attention_mask=tgt_mask, is_causal=True, memory=memory,
                 memory_attention_mask=mem_mask)
    theirs = ref(x, memory, tgt_mask=to_torch_mha_mask(causal_mask(5)),
                 tgt_key_padding_mask=~tgt_mask, memory_key_padding_mask=~mem_mask)
    assert_close(ours, theirs, **_tol(dtype))


def test_block_is_the_pre_norm_formula_with_the_unnormalised_residual():
    """Pre-norm: x + attn(norm1(x)), then + ff(norm2(.)); the residual is the input before norm."""
    torch.manual_seed(2)
    block = TransformerBlock(D, H, norm_first=True).double().eval()
    x = torch.randn(2, 4, D, dtype=torch.float64)
    h = x + block.self_attn(block.norm1(x))[0]
    expected = h + block.ff(block.norm2(h))
    assert_close(block(x), expected, atol=1e-12, rtol=1e-10)
    wrong = block.norm1(x) + block.self_attn(block.norm1(x))[0]  # the residual after the norm
    assert (wrong + block.ff(block.norm2(wrong)) - expected).abs().max() > 1e-3


# --- positions ---------------------------------------------------------------------------


@pytest.mark.parametrize("d_model", [1, 2, 7, 16])
def test_sinusoidal_table_matches_the_closed_form(d_model):
    context_length = 40
    table = sinusoidal_table(context_length, d_model)
    expected = torch.empty(context_length, d_model, dtype=torch.float64)
    for pos in range(context_length):
        for i in range(d_model):
            angle = pos / 10000 ** ((i - i % 2) / d_model)  # pairs (2j, 2j+1) share a frequency
            expected[pos, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    assert table.shape == (context_length, d_model)
    assert_close(table.double(), expected, atol=1e-6, rtol=0)
    assert table.abs().max() <= 1.0
    assert torch.equal(table[0, 0::2], torch.zeros_like(table[0, 0::2]))
    assert torch.equal(table[0, 1::2], torch.ones_like(table[0, 1::2]))


def test_sinusoidal_dot_product_depends_only_on_the_distance():
    table = sinusoidal_table(64, 32).double()
    for distance in (1, 5, 17):
        dots = (table[:-distance] * table[distance:]).sum(dim=-1)  # (64 - distance,)
        assert_close(dots, dots[:1].expand_as(dots), atol=1e-5, rtol=0)


def test_positional_encoding_adds_the_table_rows_at_the_given_positions():
    pe = PositionalEncoding(8, context_length=20)
    x = torch.randn(2, 3, 8)
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]])
    assert_close(pe(x), x + sinusoidal_table(20, 8)[:3])
    assert_close(pe(x, positions), x + sinusoidal_table(20, 8)[positions])


def test_positions_from_padding_mask_count_from_the_first_real_token():
    mask = padding_mask([3, 5, 1], side="left")  # (3, 5)
    positions = positions_from_attention_mask(mask)
    assert positions.dtype == torch.long
    assert positions[mask].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0]
    right = padding_mask([3, 5, 1])
    assert positions_from_attention_mask(right)[right].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0]


def test_attention_block_is_permutation_equivariant_until_positions_are_added():
    torch.manual_seed(4)
    block = TransformerBlock(D, H).double().eval()
    pe = PositionalEncoding(D, context_length=16)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    assert_close(block(x[:, perm]), block(x)[:, perm], atol=1e-12, rtol=1e-10)
    with_positions = block(pe(x[:, perm]))
    permuted_after = block(pe(x))[:, perm]
    assert (with_positions - permuted_after).abs().max() > 1e-2


def test_feed_forward_acts_on_each_position_alone():
    torch.manual_seed(5)
    ff = FeedForward(D).double()
    block = TransformerBlock(D, H).double()
    x = torch.randn(1, 5, D, dtype=torch.float64)
    x2 = x.clone()
    x2[0, 2] += 1.0
    ff_changed = (ff(x2) - ff(x)).abs().amax(dim=-1)[0]  # (T,)
    attn_changed = (block.self_attn(x2)[0] - block.self_attn(x)[0]).abs().amax(dim=-1)[0]
    assert ff_changed[2] > 1e-3 and torch.equal(ff_changed[[0, 1, 3, 4]], torch.zeros(4).double())
    assert (attn_changed > 1e-6).all()  # attention spreads the change to every position
    assert ff.linear1.out_features == 4 * D


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu"])
def test_feed_forward_calls_no_module_but_its_two_linear_layers(activation):
    """Issue 42: each module call costs host time in every layer of every step. The
    non-linearity is a function (the exact GELU, as ``nn.GELU()``), and without dropout
    (GPT-2's and nanoGPT's feed-forward network, MiniGPT's) there is no dropout module."""
    torch.manual_seed(1)
    ff = FeedForward(D, activation=activation).double()
    assert [type(m) for m in ff.children()] == [nn.Linear, nn.Linear] and ff.dropout is None
    assert f"activation={activation!r}" in repr(ff)  # the printed layer still names it
    x = torch.randn(2, 3, D, dtype=torch.float64)
    h = ff.linear1(x)
    if activation == "swiglu":
        gate, value = h.chunk(2, dim=-1)
        h = nn.SiLU()(gate) * value
    else:
        h = {"gelu": nn.GELU(), "relu": nn.ReLU()}[activation](h)
    assert_close(ff(x), ff.linear2(h), atol=0, rtol=0)  # the modules' arithmetic, bit for bit


def test_feed_forward_has_a_dropout_module_only_where_it_drops():
    """Issue 42: with dropout the hidden layer is dropped in training only, by a module."""
    torch.manual_seed(3)
    ff = FeedForward(D, dropout=0.5).double()
    assert isinstance(ff.dropout, nn.Dropout) and ff.dropout.p == 0.5
    x = torch.randn(2, 5, D, dtype=torch.float64)
    assert not torch.equal(ff(x), ff(x))  # two draws in training
    ff.eval()
    plain = FeedForward(D).double()
    plain.load_state_dict(ff.state_dict())  # the same parameters, the same names
    assert_close(ff(x), plain(x), atol=0, rtol=0)
    block = TransformerBlock(D, H, dropout=0.1, ff_dropout=0.0)
    assert block.ff.dropout is None and isinstance(block.dropout, nn.Dropout)


@pytest.mark.parametrize("norm_first", [True, False])
def test_a_block_hands_its_self_attention_only_the_options_it_was_given(norm_first):
    """Issue 42: each keyword handed down costs host time in every layer; a plain causal call
    (a training step's) hands down is_causal alone, and every option given still arrives."""
    torch.manual_seed(2)
    block = TransformerBlock(D, H, norm_first=norm_first)
    seen = []
    block.self_attn.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs), with_kwargs=True)
    x = torch.randn(2, 5, D)
    block(x, is_causal=True)
    block(x)
    mask = causal_mask(5)
    block(x, mask=mask, need_weights=True)
    pads = padding_mask([5, 3])
    block(x, attention_mask=pads, need_weights=False)
    assert seen[0] == {"is_causal": True} and seen[1] == {"is_causal": False}
    assert seen[2].keys() == {"is_causal", "mask", "need_weights"} and seen[2]["need_weights"]
    assert torch.equal(seen[2]["mask"], mask)
    assert seen[3].keys() == {"is_causal", "attention_mask"}
    assert torch.equal(seen[3]["attention_mask"], pads)


# --- encoder-decoder: no leaks -----------------------------------------------------------


def _toy_model(norm_first: bool = True) -> EncoderDecoder:
    torch.manual_seed(6)
    config = EncoderDecoderConfig(src_vocab_size=11, tgt_vocab_size=13, d_model=16, n_heads=4,
                                  n_layers=2, norm_first=norm_first, context_length=32)
    return EncoderDecoder(config).double().eval()


def _toy_batch():
    g = torch.Generator().manual_seed(8)
    src = torch.randint(11, (3, 6), generator=g)
    tgt = torch.randint(13, (3, 5), generator=g)
    return src, padding_mask([6, 4, 2]), tgt, padding_mask([5, 3, 4])


@pytest.mark.parametrize("norm_first", [True, False])
def test_padded_source_tokens_never_change_the_output(norm_first):
    model = _toy_model(norm_first)
    src, src_mask, tgt, tgt_mask = _toy_batch()
    out = model(src, tgt, src_attention_mask=src_mask, tgt_attention_mask=tgt_mask)
    src2 = src.clone()
    src2[~src_mask] = (src2[~src_mask] + 3) % 11  # change every padded source token
    out2 = model(src2, tgt, src_attention_mask=src_mask, tgt_attention_mask=tgt_mask)
    assert_close(out2[tgt_mask], out[tgt_mask], atol=1e-12, rtol=0)
    src3 = src.clone()
    src3[1, 0] = (src3[1, 0] + 1) % 11  # a real source token does matter
    out3 = model(src3, tgt, src_attention_mask=src_mask, tgt_attention_mask=tgt_mask)
    assert (out3[1] - out[1]).abs().max() > 1e-6


@pytest.mark.parametrize("norm_first", [True, False])
def test_future_and_padded_target_tokens_never_change_earlier_outputs(norm_first):
    model = _toy_model(norm_first)
    src, src_mask, tgt, tgt_mask = _toy_batch()
    out = model(src, tgt, src_attention_mask=src_mask, tgt_attention_mask=tgt_mask)
    for t in range(1, 5):
        tgt2 = tgt.clone()
        tgt2[:, t] = (tgt2[:, t] + 5) % 13  # change the token at position t in every row
        out2 = model(src, tgt2, src_attention_mask=src_mask, tgt_attention_mask=tgt_mask)
        assert_close(out2[:, :t], out[:, :t], atol=1e-12, rtol=0)
        assert (out2[0, t] - out[0, t]).abs().max() > 1e-6  # row 0 is all real
    tgt3 = tgt.clone()
    tgt3[~tgt_mask] = 0  # change every padded target token
    out3 = model(src, tgt3, src_attention_mask=src_mask, tgt_attention_mask=tgt_mask)
    assert_close(out3[tgt_mask], out[tgt_mask], atol=1e-12, rtol=0)


def test_left_and_right_padding_give_the_same_per_sequence_results():
    model = _toy_model()
    src, src_mask, tgt, tgt_mask = _toy_batch()
    out = model(src, tgt, src_attention_mask=src_mask, tgt_attention_mask=tgt_mask)
    for row in range(3):
        n_src, n_tgt = int(src_mask[row].sum()), int(tgt_mask[row].sum())
        alone = model(src[row:row + 1, :n_src], tgt[row:row + 1, :n_tgt])  # no padding at all
        assert_close(out[row, :n_tgt], alone[0], atol=1e-12, rtol=1e-10)
    # left padding: move each row's real tokens to the end
    src_left, tgt_left = torch.zeros_like(src), torch.zeros_like(tgt)
    src_lmask = padding_mask([6, 4, 2], side="left")
    tgt_lmask = padding_mask([5, 3, 4], side="left")
    src_left[src_lmask], tgt_left[tgt_lmask] = src[src_mask], tgt[tgt_mask]
    out_left = model(src_left, tgt_left, src_attention_mask=src_lmask,
                     tgt_attention_mask=tgt_lmask)
    assert_close(out_left[tgt_lmask], out[tgt_mask], atol=1e-12, rtol=1e-10)


def test_cross_attention_gives_zero_weight_to_padded_source_keys():
    block = TransformerBlock(D, H, cross_attention=True)
    memory, mem_mask = torch.randn(2, 6, D), padding_mask([6, 3])
    _, weights = block.cross_attn(torch.randn(2, 4, D), memory, memory,
                                  attention_mask=mem_mask, need_weights=True)
    assert weights.shape == (2, H, 4, 6)  # (B, H, T_q, T_k): T_q target rows, T_k source keys
    assert torch.equal(weights[1, :, :, 3:], torch.zeros(H, 4, 3))
    assert_close(weights.sum(-1), torch.ones(2, H, 4))


# --- gradient norms (pre-norm vs post-norm) -----------------------------------------------


def test_block_gradient_norms_are_per_layer_finite_and_reproducible():
    state = torch.random.get_rng_state()
    pre = block_gradient_norms(4, norm_first=True, d_model=16, seq_len=4)
    post = block_gradient_norms(4, norm_first=False, d_model=16, seq_len=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    assert pre.shape == post.shape == (4,)
    assert torch.isfinite(pre).all() and (pre > 0).all() and (post > 0).all()
    assert torch.equal(pre, block_gradient_norms(4, norm_first=True, d_model=16, seq_len=4))
    assert not torch.allclose(pre, post)


def test_block_gradient_norms_match_autograd_on_one_block():
    norms = block_gradient_norms(1, norm_first=False, d_model=8, n_heads=2, batch_size=2,
                                 seq_len=3, seed=5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        block = TransformerBlock(8, 2, norm_first=False)
    g = torch.Generator().manual_seed(5)
    x, target = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    (block(x) - target).pow(2).mean().backward()
    expected = torch.cat([p.grad.flatten() for name, p in block.named_parameters()
                          if name.startswith(("self_attn.", "ff."))]).norm()  # no LayerNorms
    assert_close(norms[0], expected)


def test_block_gradient_norms_final_norm_by_default_after_pre_norm_only():
    kw = {"d_model": 16, "seq_len": 4, "seed": 3}
    for first in (True, False):
        assert torch.equal(block_gradient_norms(3, norm_first=first, **kw),
                           block_gradient_norms(3, norm_first=first, final_norm=first, **kw))
    without = block_gradient_norms(3, norm_first=True, final_norm=False, **kw)
    assert not torch.allclose(without, block_gradient_norms(3, norm_first=True, **kw))


def test_block_gradient_norms_without_final_norm_match_autograd():
    """Chapter 7's ablation: a pre-norm stack whose output goes to the loss unnormalised."""
    norms = block_gradient_norms(2, norm_first=True, final_norm=False, d_model=8, n_heads=2,
                                 batch_size=2, seq_len=3, seed=4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        blocks = [TransformerBlock(8, 2, norm_first=True) for _ in range(2)]
    g = torch.Generator().manual_seed(4)
    x, target = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    (blocks[1](blocks[0](x)) - target).pow(2).mean().backward()
    for got, block in zip(norms, blocks, strict=True):
        expected = torch.cat([p.grad.flatten() for name, p in block.named_parameters()
                              if name.startswith(("self_attn.", "ff."))]).norm()
        assert_close(got, expected)


def test_residual_stream_rms_follows_the_stack_of_block_gradient_norms():
    state = torch.random.get_rng_state()
    sizes = residual_stream_rms(3, d_model=8, n_heads=2, batch_size=2, seq_len=3, seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    assert sizes.shape == (4,) and not sizes.requires_grad
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        blocks = [TransformerBlock(8, 2, norm_first=True) for _ in range(3)]
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(4))
    expected = [x.pow(2).mean().sqrt()]
    for block in blocks:
        x = block(x)
        expected.append(x.pow(2).mean().sqrt())
    assert_close(sizes, torch.stack(expected).detach())
    post = residual_stream_rms(3, norm_first=False, d_model=8, n_heads=2, seed=4)
    assert_close(post[1:], torch.ones(3), atol=1e-3, rtol=0)  # each block ends in a norm


@pytest.mark.parametrize("final_norm", [True, False])
def test_stream_gradient_norm_is_the_gradient_at_the_top_of_the_stack(final_norm):
    """Chapter 7: dL/dx for the stream after the last block, with and without the final norm."""
    state = torch.random.get_rng_state()
    got = stream_gradient_norm(2, final_norm=final_norm, d_model=8, n_heads=2, batch_size=2,
                               seq_len=3, seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    assert got.shape == () and not got.requires_grad
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        blocks = [TransformerBlock(8, 2, norm_first=True) for _ in range(2)]
    g = torch.Generator().manual_seed(4)
    x, target = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    top = blocks[1](blocks[0](x))
    out = nn.LayerNorm(8)(top) if final_norm else top
    (grad,) = torch.autograd.grad((out - target).pow(2).mean(), top)
    assert_close(got, grad.norm())
    if final_norm:  # the norm divides by each position's size: a bigger stream, less gradient
        bigger = 3 * top.detach().requires_grad_(True)
        (grad3,) = torch.autograd.grad((nn.LayerNorm(8)(bigger) - target).pow(2).mean(), bigger)
        assert_close(grad3.norm(), grad.norm() / 3)


# --- bad input -----------------------------------------------------------------------------


@pytest.fixture
def blocks():
    return TransformerBlock(8, 2), TransformerBlock(8, 2, cross_attention=True)


def test_block_rejects_wrong_widths_and_dtypes(blocks):
    encoder, decoder = blocks
    for block in (encoder, TransformerBlock(8, 2, norm_first=False)):
        with pytest.raises(ValueError, match=r"x must have width d_model=8"):
            block(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        encoder(torch.randn(3, 8))
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        encoder(torch.randn(2, 3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"memory must have width d_model=8"):
        decoder(torch.randn(2, 3, 8), memory=torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match=r"memory must have batch size B=2"):
        decoder(torch.randn(2, 3, 8), memory=torch.randn(3, 4, 8))


def test_block_rejects_memory_where_it_does_not_belong(blocks):
    encoder, decoder = blocks
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match="memory must be given.*cross_attention=False"):
        encoder(x, memory=memory)
    with pytest.raises(ValueError, match="memory must be given.*cross_attention=True"):
        decoder(x)
    with pytest.raises(ValueError, match="memory_attention_mask was given without memory"):
        encoder(x, memory_attention_mask=torch.ones(2, 4, dtype=torch.bool))


def test_block_rejects_masks_of_the_wrong_shape_or_dtype(blocks):
    encoder, decoder = blocks
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match="attention_mask"):
        encoder(x, attention_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask must have shape.*B=2"):
        encoder(x, attention_mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask of shape"):
        encoder(x, mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="memory_attention_mask"):
        decoder(x, memory=memory, memory_attention_mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="memory_attention_mask"):
        decoder(x, memory=memory, memory_attention_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="memory_attention_mask must be a torch.bool tensor"):
        decoder(x, memory=memory, memory_attention_mask=torch.ones(2, 4))


def test_block_constructor_rejects_bad_options():
    with pytest.raises(TypeError, match="norm_first must be a bool"):
        TransformerBlock(8, 2, norm_first="pre")
    with pytest.raises(TypeError, match="cross_attention must be a bool"):
        TransformerBlock(8, 2, cross_attention=1)
    with pytest.raises(ValueError, match="layer_norm_eps"):
        TransformerBlock(8, 2, layer_norm_eps=0.0)
    with pytest.raises(ValueError, match="d_model=8 must be divisible by n_heads=3"):
        TransformerBlock(8, 3)
    with pytest.raises(ValueError, match="activation"):
        TransformerBlock(8, 2, activation="tanh")


def test_positions_out_of_range_or_of_the_wrong_kind_are_rejected():
    pe = PositionalEncoding(8, context_length=10)
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, context_length=10\)"):
        pe(x, torch.tensor([[0, 5, 10]]))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, context_length=10\)"):
        pe(x, torch.tensor([[-1, 0, 1]]))
    with pytest.raises(TypeError, match="positions must be a torch.long tensor"):
        pe(x, torch.tensor([[0.0, 1.0, 2.0]]))
    with pytest.raises(ValueError, match="positions must have shape"):
        pe(x, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="x must have width d_model=8"):
        pe(torch.randn(1, 3, 6))
    model = _toy_model()
    with pytest.raises(ValueError, match="context_length=32"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(TypeError, match="attention_mask must have dtype torch.bool"):
        positions_from_attention_mask(torch.ones(2, 3))


def test_encoder_decoder_rejects_bad_tokens_masks_and_configs():
    model = _toy_model()
    src, src_mask, tgt, tgt_mask = _toy_batch()
    with pytest.raises(ValueError, match=r"src must hold token ids in \[0, vocab_size=11\)"):
        model(src + 11, tgt)
    with pytest.raises(TypeError, match="tgt must have dtype torch.long"):
        model(src, tgt.int())
    with pytest.raises(ValueError, match=r"src_attention_mask must have shape \(B, T\)=\(3, 6\)"):
        model(src, tgt, src_attention_mask=src_mask[:, :5])
    with pytest.raises(ValueError, match="tgt_attention_mask"):
        model(src, tgt, tgt_attention_mask=tgt_mask[:2])
    with pytest.raises(ValueError, match="d_model=10 must be divisible by n_heads=4"):
        EncoderDecoderConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=10)
    with pytest.raises(TypeError, match="norm_first must be a bool"):
        EncoderDecoderConfig(src_vocab_size=5, tgt_vocab_size=5, norm_first=None)
    with pytest.raises(ValueError, match="dropout"):
        EncoderDecoderConfig(src_vocab_size=5, tgt_vocab_size=5, dropout=1.5)
    with pytest.raises(TypeError, match="src_vocab_size must be a positive int"):
        EncoderDecoderConfig(src_vocab_size=5.0, tgt_vocab_size=5)
    with pytest.raises(ValueError, match="n_layers"):
        block_gradient_norms(0, norm_first=True)
    with pytest.raises(TypeError, match="norm_first must be a bool"):
        block_gradient_norms(2, norm_first="post")


def test_plot_heatmap_draws_the_matrix_and_rejects_other_ranks():
    import matplotlib

    matplotlib.use("Agg")
    from course_attn import viz

    table = sinusoidal_table(12, 6)
    ax = viz.plot_heatmap(table, xlabel="dimension", ylabel="position", title="PE")
    image = ax.get_images()[0]
    assert image.get_array().shape == (12, 6)
    assert_close(torch.as_tensor(image.get_array().data), table.double())
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("dimension", "position", "PE")
    with pytest.raises(ValueError, match="matrix must be 2-D"):
        viz.plot_heatmap(torch.zeros(3))
    matplotlib.pyplot.close("all")


# ----------------------------------------------- issue 18: dtypes and bool flags


def test_feed_forward_names_a_dtype_mismatch_except_under_autocast():
    ff = FeedForward(D)
    with pytest.raises(TypeError, match=r"^x has dtype torch.float64 but the layer's weights "
                                        r"are torch.float32"):
        ff(torch.randn(2, D, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts mixed dtypes itself
        out = ff(torch.randn(2, D, dtype=torch.bfloat16))
    assert out.shape == (2, D) and torch.isfinite(out.float()).all()


@pytest.mark.parametrize(
    "build",
    [
        lambda flag: FeedForward(D, bias=flag),
        lambda flag: TransformerBlock(D, H, bias=flag),
        lambda flag: block_gradient_norms(1, norm_first=flag),
        lambda flag: block_gradient_norms(1, norm_first=True, final_norm=flag),
        lambda flag: residual_stream_rms(1, norm_first=flag),
        lambda flag: stream_gradient_norm(1, final_norm=flag),
    ],
    ids=["FeedForward", "TransformerBlock", "block_gradient_norms", "final_norm",
         "residual_stream_rms", "stream_gradient_norm"],
)
def test_bool_flags_refuse_truthy_strings(build):
    """bias="no" used to build layers *with* a bias; every flag now wants a real bool."""
    with pytest.raises(TypeError, match=r"must be a bool \(True or False\), got str 'no'"):
        build("no")


def test_feed_forward_and_blocks_pass_nan_through_without_scanning_values():
    """The NaN policy for modules: no value checks, a NaN stays in its position's row
    (the feed-forward network acts on each position alone)."""
    ff = FeedForward(D)
    x = torch.randn(3, D)
    x[1, 0] = float("nan")
    out = ff(x)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()
    block = TransformerBlock(D, H).eval()
    x = torch.randn(1, 4, D)
    x[0, 2, 0] = float("nan")
    assert torch.isnan(block(x)).all()  # every token attends to token 2: no error, NaN
    # a padded token is contained: its garbage never reaches a real token
    out = block(x, attention_mask=torch.tensor([[True, True, False, True]]))
    assert torch.isfinite(out[0, [0, 1, 3]]).all() and torch.isnan(out[0, 2]).all()
