"""Chapter 6: multi-head attention, proven equal to torch.nn.MultiheadAttention.

Every equivalence copies the course layer's weights into
``nn.MultiheadAttention(batch_first=True)`` (``in_proj_weight`` = the three
projection weights stacked, ``in_proj_bias`` likewise, ``out_proj`` as is).
Tolerances, stated once: float64 atol=1e-10, rtol=1e-10 (the results differ only by
summation order, around 1e-15); float32 atol=1e-5, rtol=1e-6.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from course_attn.core.attention import ATTENTION_IMPLS
from course_attn.core.layers import KVCache, MultiHeadAttention, merge_heads, split_heads
from course_attn.core.masks import causal_mask, padding_mask, to_torch_mha_mask

F64 = {"atol": 1e-10, "rtol": 1e-10}
F32 = {"atol": 1e-5, "rtol": 1e-6}
D_MODEL, N_HEADS = 12, 3


def _pair(seed: int, *, bias: bool = True, dtype: torch.dtype = torch.float64,
          d_model: int = D_MODEL, n_heads: int = N_HEADS, impl: str = "manual"):
    """The course layer and nn.MultiheadAttention holding the same weights."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d_model, n_heads, bias=bias, impl=impl).to(dtype).eval()
    ref = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True).to(dtype).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight,
                                            mha.v_proj.weight]))  # (3 D, D)
        ref.out_proj.weight.copy_(mha.out_proj.weight)
        if bias:
            # random biases, so a bias that is ignored or misplaced would show
            for linear in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj):
                linear.bias.normal_()
            ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias,
                                              mha.v_proj.bias]))  # (3 D,)
            ref.out_proj.bias.copy_(mha.out_proj.bias)
    assert (ref.in_proj_bias is None) == (not bias)
    return mha, ref


def _randn(*shape, seed: int, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------- equivalence


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_self_attention_matches_torch(seed, bias):
    mha, ref = _pair(seed, bias=bias)
    x = _randn(2, 5, D_MODEL, seed=seed)
    out, weights = mha(x, need_weights=True)
    ref_out, ref_weights = ref(x, x, x, need_weights=True, average_attn_weights=False)
    assert out.shape == (2, 5, D_MODEL) and weights.shape == (2, N_HEADS, 5, 5)
    assert_close(out, ref_out, **F64)
    assert_close(weights, ref_weights, **F64)  # per head: (B, H, T_q, T_k)
    _, averaged = ref(x, x, x, need_weights=True, average_attn_weights=True)
    assert_close(weights.mean(dim=1), averaged, **F64)
    assert_close(mha(x)[0], out, **F64)  # need_weights=False gives the same output


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("bias", [True, False])
def test_cross_attention_with_key_padding_matches_torch(bias, side, impl):
    mha, ref = _pair(10, bias=bias, impl=impl)
    query = _randn(3, 4, D_MODEL, seed=11)  # T_q = 4
    memory = _randn(3, 7, D_MODEL, seed=12)  # T_k = 7
    kpm = padding_mask([7, 3, 5], side=side)  # (B, T_k), True on real keys
    out = mha(query, memory, memory, attention_mask=kpm)[0]
    ref_out, ref_weights = ref(query, memory, memory, key_padding_mask=to_torch_mha_mask(kpm),
                               average_attn_weights=False)
    assert out.shape == (3, 4, D_MODEL)
    assert_close(out, ref_out, **F64)
    _, weights = mha(query, memory, memory, attention_mask=kpm, need_weights=True)
    assert_close(weights, ref_weights, **F64)
    assert (weights.masked_select(~kpm[:, None, None, :]) == 0).all()


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("bias", [True, False])
def test_causal_self_attention_matches_torch(bias, impl):
    mha, ref = _pair(20, bias=bias, impl=impl)
    x = _randn(2, 6, D_MODEL, seed=21)
    torch_mask = to_torch_mha_mask(causal_mask(6))  # nn.MultiheadAttention: True = blocked
    ref_out, ref_weights = ref(x, x, x, attn_mask=torch_mask, is_causal=True,
                               average_attn_weights=False)
    assert_close(mha(x, is_causal=True)[0], ref_out, **F64)
    assert_close(mha(x, mask=causal_mask(6))[0], ref_out, **F64)
    _, weights = mha(x, is_causal=True, need_weights=True)
    assert_close(weights, ref_weights, **F64)
    assert (weights.triu(diagonal=1) == 0).all()


def test_causal_with_padding_and_shorter_queries_matches_torch():
    """T_q < T_k with a bottom-right causal mask and left padding (batched decoding)."""
    mha, ref = _pair(25)
    query = _randn(2, 3, D_MODEL, seed=26)
    memory = _randn(2, 8, D_MODEL, seed=27)
    kpm = padding_mask([8, 5], side="left")
    out = mha(query, memory, memory, attention_mask=kpm, is_causal=True)[0]
    ref_out, _ = ref(query, memory, memory, key_padding_mask=to_torch_mha_mask(kpm),
                     attn_mask=to_torch_mha_mask(causal_mask(3, 8)))
    assert_close(out, ref_out, **F64)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("bias", [True, False])
def test_batched_attn_mask_matches_torch(bias, impl):
    """Course (B, T_q, T_k) masks vs torch's (B * H, T_q, T_k), batch-major."""
    mha, ref = _pair(30, bias=bias, impl=impl)
    query, memory = _randn(2, 4, D_MODEL, seed=31), _randn(2, 6, D_MODEL, seed=32)
    attn_mask = torch.rand(2, 4, 6, generator=torch.Generator().manual_seed(33)) > 0.5
    attn_mask[..., 2] = True  # every query keeps one key: nn.MultiheadAttention gives NaN else
    torch_mask = to_torch_mha_mask(attn_mask).repeat_interleave(N_HEADS, dim=0)  # (B*H, T_q, T_k)
    ref_out, ref_weights = ref(query, memory, memory, attn_mask=torch_mask,
                               average_attn_weights=False)
    assert_close(mha(query, memory, memory, mask=attn_mask)[0], ref_out, **F64)
    _, weights = mha(query, memory, memory, mask=attn_mask, need_weights=True)
    assert_close(weights, ref_weights, **F64)
    # and combined with a key padding mask
    kpm = padding_mask([6, 4])
    ref_out, _ = ref(query, memory, memory, attn_mask=torch_mask,
                     key_padding_mask=to_torch_mha_mask(kpm))
    assert_close(mha(query, memory, memory, mask=attn_mask, attention_mask=kpm)[0],
                 ref_out, **F64)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize(("d_model", "n_heads"), [(8, 1), (8, 8), (16, 4)])
def test_float32_matches_torch(d_model, n_heads, impl):
    mha, ref = _pair(40, dtype=torch.float32, d_model=d_model, n_heads=n_heads, impl=impl)
    x = _randn(3, 5, d_model, seed=41, dtype=torch.float32)
    kpm = padding_mask([5, 2, 4])
    ref_out, _ = ref(x, x, x, key_padding_mask=to_torch_mha_mask(kpm),
                     attn_mask=to_torch_mha_mask(causal_mask(5)))
    assert_close(mha(x, attention_mask=kpm, is_causal=True)[0], ref_out, **F32)


def test_gradients_match_torch():
    mha, ref = _pair(50)
    mha.train()
    ref.train()  # dropout is 0, so training mode changes nothing but the code path
    x = _randn(2, 5, D_MODEL, seed=51).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    kpm = padding_mask([5, 3])
    mha(x, attention_mask=kpm, is_causal=True)[0].square().sum().backward()
    ref(x_ref, x_ref, x_ref, key_padding_mask=to_torch_mha_mask(kpm),
        attn_mask=to_torch_mha_mask(causal_mask(5)))[0].square().sum().backward()
    assert_close(x.grad, x_ref.grad, **F64)
    q_grad, k_grad, v_grad = ref.in_proj_weight.grad.chunk(3)
    assert_close(mha.q_proj.weight.grad, q_grad, **F64)
    assert_close(mha.k_proj.weight.grad, k_grad, **F64)
    assert_close(mha.v_proj.weight.grad, v_grad, **F64)
    assert_close(mha.out_proj.weight.grad, ref.out_proj.weight.grad, **F64)


# ------------------------------------------------------ the two paths agree


MASK_CASES = ["none", "causal", "key_padding", "batched_attn_mask", "fully_masked_row"]


def _mask_kwargs(case: str) -> dict:
    if case == "causal":
        return {"is_causal": True}
    if case == "key_padding":
        return {"attention_mask": padding_mask([6, 2], side="left")}
    if case == "batched_attn_mask":
        mask = torch.rand(2, 4, 6, generator=torch.Generator().manual_seed(60)) > 0.5
        mask[..., -1] = True
        return {"mask": mask}
    if case == "fully_masked_row":
        mask = torch.ones(4, 6, dtype=torch.bool)
        mask[1] = False  # query 1 may attend nothing
        return {"mask": mask, "attention_mask": padding_mask([6, 0])}  # row 1: no keys
    return {}


@pytest.mark.parametrize("case", MASK_CASES)
def test_manual_and_sdpa_paths_agree(case):
    torch.manual_seed(61)
    manual = MultiHeadAttention(D_MODEL, N_HEADS).double()
    fused = MultiHeadAttention(D_MODEL, N_HEADS, impl="sdpa").double()
    fused.load_state_dict(manual.state_dict())
    query = _randn(2, 4, D_MODEL, seed=62)
    memory = _randn(2, 6, D_MODEL, seed=63)
    outs, grads = [], []
    for layer in (manual, fused):
        q = query.clone().requires_grad_(True)
        m = memory.clone().requires_grad_(True)
        out = layer(q, m, m, **_mask_kwargs(case))[0]
        out.square().sum().backward()
        outs.append(out)
        grads.append([q.grad, m.grad] + [p.grad for p in layer.parameters()])
    assert_close(outs[0], outs[1], **F64)
    for manual_grad, fused_grad in zip(*grads, strict=True):
        assert torch.isfinite(manual_grad).all()
        assert_close(manual_grad, fused_grad, **F64)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_fully_masked_rows_give_out_proj_bias_and_finite_grads(impl):
    """No key at all -> zero attention output -> out_proj(0) = its bias, never NaN."""
    torch.manual_seed(70)
    mha = MultiHeadAttention(D_MODEL, N_HEADS, impl=impl).double()
    x = _randn(2, 5, D_MODEL, seed=71).requires_grad_(True)
    kpm = padding_mask([5, 0])  # the second sequence is all padding
    out = mha(x, attention_mask=kpm, is_causal=True)[0]
    assert_close(out[1], mha.out_proj.bias.expand(5, D_MODEL), **F64)
    out.sum().backward()
    assert (x.grad[1] == 0).all() and torch.isfinite(x.grad).all()
    for name, param in mha.named_parameters():
        assert torch.isfinite(param.grad).all(), name


# ---------------------------------------------------- heads: split, merge, sum


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 3), time=st.integers(1, 6), n_heads=st.integers(1, 4),
       head_dim=st.integers(1, 5))
def test_split_merge_round_trip(batch, time, n_heads, head_dim):
    x = torch.randn(batch, time, n_heads * head_dim, dtype=torch.float64)
    heads = split_heads(x, n_heads)
    assert heads.shape == (batch, n_heads, time, head_dim)
    for h in range(n_heads):  # head h is the h-th slice of the width, at every position
        assert torch.equal(heads[:, h], x[..., h * head_dim:(h + 1) * head_dim])
    assert torch.equal(merge_heads(heads), x)
    assert torch.equal(split_heads(merge_heads(heads), n_heads), heads)


def test_view_without_transpose_is_wrong():
    x = torch.arange(3 * 4, dtype=torch.float64).view(1, 3, 4)  # B=1, T=3, D=4
    wrong = x.view(1, 2, 3, 2)  # (B, H, T, head_dim) by view alone: mixes time and heads
    assert wrong.shape == split_heads(x, 2).shape
    assert not torch.equal(wrong, split_heads(x, 2))


def test_output_is_sum_over_heads_of_head_times_its_out_proj_block():
    torch.manual_seed(80)
    mha = MultiHeadAttention(D_MODEL, N_HEADS).double()
    x = _randn(2, 5, D_MODEL, seed=81)
    head_dim = D_MODEL // N_HEADS
    q, k, v = (split_heads(p(x), N_HEADS) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    weights = torch.softmax(q @ k.transpose(-2, -1) / head_dim**0.5, dim=-1)  # (B, H, T, T)
    heads = weights @ v  # (B, H, T, head_dim)
    w_o = mha.out_proj.weight  # (D, D): input column block h belongs to head h
    total = sum(heads[:, h] @ w_o[:, h * head_dim:(h + 1) * head_dim].T for h in range(N_HEADS))
    assert_close(total + mha.out_proj.bias, mha(x)[0], **F64)


# ------------------------------------------------------------ sizes and counts


def test_parameter_count_does_not_depend_on_heads():
    counts = {h: sum(p.numel() for p in MultiHeadAttention(24, h).parameters())
              for h in (1, 2, 3, 4, 6, 8, 12, 24)}
    assert set(counts.values()) == {4 * (24 * 24 + 24)}
    assert MultiHeadAttention(24, 4).head_dim == 6


def test_kv_cache_rejects_cross_attention():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 2, 8)
    with pytest.raises(ValueError, match="cache"):
        mha(x, x, x, cache=KVCache())[0]


# --------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "name"),
    [
        ((12, 5), {}, ValueError, "n_heads"),  # not divisible
        ((0, 1), {}, ValueError, "d_model"),
        ((-8, 2), {}, ValueError, "d_model"),
        ((8, 0), {}, ValueError, "n_heads"),
        ((8.0, 2), {}, TypeError, "d_model"),
        ((8, 2.0), {}, TypeError, "n_heads"),
        ((8, 2), {"dropout": 1.0}, ValueError, "dropout"),
        ((8, 2), {"dropout": -0.1}, ValueError, "dropout"),
        ((8, 2), {"impl": "flash"}, ValueError, "impl"),
    ],
)
def test_constructor_bad_inputs(args, kwargs, error, name):
    with pytest.raises(error, match=name):
        MultiHeadAttention(*args, **kwargs)


def _bad_forward_cases():
    x = torch.randn(2, 4, 8)
    mem = torch.randn(2, 6, 8)
    bool_ = torch.bool
    return [
        ((torch.randn(4, 8),), {}, ValueError, "query"),  # no batch dimension
        ((torch.randn(2, 4, 6),), {}, ValueError, "query"),  # wrong width
        ((x.long(),), {}, TypeError, "query"),
        ((x.double(),), {}, TypeError, "query"),  # layer is float32
        (([[0.0] * 8],), {}, TypeError, "query"),
        ((x, mem), {}, ValueError, "key and value"),  # key without value
        ((x, None, mem), {}, ValueError, "key and value"),  # value without key
        ((x, torch.randn(2, 6, 5), mem), {}, ValueError, "key"),
        ((x, mem, torch.randn(2, 6, 7)), {}, ValueError, "value"),
        ((x, torch.randn(3, 6, 8), torch.randn(3, 6, 8)), {}, ValueError, "key"),
        ((x, mem, torch.randn(2, 5, 8)), {}, ValueError, "key and value"),
        ((x, mem, mem), {"attention_mask": torch.ones(2, 4, dtype=bool_)}, ValueError,
         "attention_mask"),  # (B, T_q) instead of (B, T_k)
        ((x, mem, mem), {"attention_mask": torch.ones(3, 6, dtype=bool_)}, ValueError,
         "attention_mask"),
        ((x, mem, mem), {"attention_mask": torch.ones(2, 6)}, TypeError, "attention_mask"),
        ((x, mem, mem), {"attention_mask": torch.ones(6, dtype=bool_)}, ValueError,
         "attention_mask"),
        ((x,), {"attention_mask": [[True] * 4] * 2}, TypeError, "attention_mask"),
        ((x, mem, mem), {"mask": torch.ones(6, 4, dtype=bool_)}, ValueError, "mask"),
        ((x, mem, mem), {"mask": torch.zeros(4, 6)}, TypeError, "mask"),
        ((x, mem, mem), {"mask": torch.ones(3, 4, 6, dtype=bool_)}, ValueError,
         "mask"),  # batch 3, query batch 2
        ((x, mem, mem), {"mask": torch.ones(2, 2, 4, 6, dtype=bool_)}, ValueError,
         "mask"),
        ((x,), {"is_causal": 1}, TypeError, "is_causal"),
        ((x,), {"need_weights": "yes"}, TypeError, "need_weights"),
        ((x,), {"cache": {}}, TypeError, "cache"),
    ]


@pytest.mark.parametrize(("args", "kwargs", "error", "name"), _bad_forward_cases())
def test_forward_bad_inputs(args, kwargs, error, name):
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(error, match=name):
        mha(*args, **kwargs)[0]


@pytest.mark.parametrize(
    ("fn", "args", "error", "name"),
    [
        (split_heads, (torch.randn(2, 3, 10), 4), ValueError, "n_heads"),
        (split_heads, (torch.randn(3, 8), 2), ValueError, "x"),
        (split_heads, (torch.randn(2, 3, 8), 0), ValueError, "n_heads"),
        (split_heads, (torch.randn(2, 3, 8), 2.0), TypeError, "n_heads"),
        (split_heads, ([[1.0]], 1), TypeError, "x"),
        (merge_heads, (torch.randn(2, 3, 8),), ValueError, "x"),
    ],
)
def test_split_merge_bad_inputs(fn, args, error, name):
    with pytest.raises(error, match=name):
        fn(*args)


def test_plot_heads_one_heatmap_per_head():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_attn.lab.viz import plot_heads

    torch.manual_seed(90)
    _, weights = MultiHeadAttention(8, 4)(torch.randn(1, 3, 8), need_weights=True)
    axes = plot_heads(weights[0], list("abc"), list("abc"), head_names=list("wxyz"))
    assert [ax.get_title() for ax in axes] == list("wxyz")
    for h, ax in enumerate(axes):
        assert_close(torch.from_numpy(ax.images[0].get_array().data).float(),
                     weights[0, h].detach())
    plt.close(axes[0].figure)
    with pytest.raises(ValueError, match="weights"):
        plot_heads(weights[0, 0])
    with pytest.raises(ValueError, match="head_names"):
        plot_heads(weights[0], head_names=["only one"])


# ------------------------------------------------------------ one projection for q, k and v
def _fused_pair(seed: int, *, bias: bool = True, n_kv_heads: int | None = None):
    """A fused layer and a separate one holding the same weights (float64)."""
    torch.manual_seed(seed)
    separate = MultiHeadAttention(D_MODEL, N_HEADS, bias=bias, n_kv_heads=n_kv_heads).double()
    fused = MultiHeadAttention(D_MODEL, N_HEADS, bias=bias, n_kv_heads=n_kv_heads,
                               fused_qkv=True).double()
    if bias:  # random biases, so that a misplaced one would show
        for linear in (separate.q_proj, separate.k_proj, separate.v_proj, separate.out_proj):
            nn.init.normal_(linear.bias)
    fused.load_state_dict(separate.state_dict())  # q, k, v rows concatenated into qkv_proj
    return separate.eval(), fused.eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_fused_projection_is_the_three_projections_concatenated(bias, n_kv_heads):
    separate, fused = _fused_pair(0, bias=bias, n_kv_heads=n_kv_heads)
    assert fused.qkv_proj is not None and fused.q_proj is None
    assert torch.equal(fused.qkv_proj.weight, torch.cat(
        [separate.q_proj.weight, separate.k_proj.weight, separate.v_proj.weight]))
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    mask = padding_mask(torch.tensor([5, 3]), 5)
    for kwargs in ({}, {"is_causal": True}, {"attention_mask": mask, "is_causal": True}):
        (a, wa), (b, wb) = (layer(x, need_weights=True, **kwargs) for layer in (separate, fused))
        assert_close(b, a, atol=1e-13, rtol=0)
        assert_close(wb, wa, atol=1e-13, rtol=0)


def test_fused_projection_with_a_kv_cache_equals_the_full_pass():
    _, fused = _fused_pair(1)
    x = torch.randn(2, 6, D_MODEL, dtype=torch.float64)
    full, _ = fused(x, is_causal=True)
    cache = KVCache()
    steps = [fused(x[:, :4], is_causal=True, cache=cache)[0]]
    steps += [fused(x[:, t:t + 1], is_causal=True, cache=cache)[0] for t in (4, 5)]
    assert_close(torch.cat(steps, dim=1), full, atol=1e-13, rtol=0)


def test_fused_projection_gradients_equal_the_separate_ones():
    separate, fused = _fused_pair(2)
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    separate(x, is_causal=True)[0].square().sum().backward()
    fused(x, is_causal=True)[0].square().sum().backward()
    assert fused.qkv_proj is not None and fused.qkv_proj.weight.grad is not None
    expected = torch.cat([p.weight.grad for p in (separate.q_proj, separate.k_proj,
                                                  separate.v_proj)])  # type: ignore[misc]
    assert_close(fused.qkv_proj.weight.grad, expected, atol=1e-12, rtol=0)


def test_a_fused_layer_refuses_another_sequence():
    layer = MultiHeadAttention(D_MODEL, N_HEADS, fused_qkv=True)
    x = torch.randn(1, 3, D_MODEL)
    with pytest.raises(ValueError, match="fused_qkv"):
        layer(x, x, x)
    with pytest.raises(TypeError, match="fused_qkv"):
        MultiHeadAttention(D_MODEL, N_HEADS, fused_qkv="yes")  # type: ignore[arg-type]


def test_fused_projection_equals_the_three_to_the_bit_on_integers():
    """Integer weights and inputs: the projections are exact, so both layers get the same q, k
    and v, and run the same code after them: nothing may differ."""
    torch.manual_seed(3)
    separate = MultiHeadAttention(D_MODEL, N_HEADS).double()
    with torch.no_grad():
        for p in separate.parameters():
            p.copy_(torch.randint(-2, 3, p.shape))
    fused = MultiHeadAttention(D_MODEL, N_HEADS, fused_qkv=True).double()
    fused.load_state_dict(separate.state_dict())
    x = torch.randint(-3, 4, (2, 5, D_MODEL)).double()
    (a, wa), (b, wb) = (layer(x, is_causal=True, need_weights=True)
                        for layer in (separate, fused))
    assert torch.equal(a, b) and torch.equal(wa, wb)
