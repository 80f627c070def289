"""Issue 14: MiniGPT with RoPE / sinusoidal / ALiBi positions, grouped-query attention and
sliding windows.

Every switch of ``GPTConfig`` (``pos_encoding``, ``n_kv_heads``, ``window``) and
their combinations must keep what the default model guarantees: causality,
left-padding invariance, KV-cache exactness (logits and greedy generation),
both attention paths, any device (``meta``), no graph breaks; and each must do
what it claims (a GQA cache of ``n_kv_heads`` heads, RoPE's relative positions,
a window that hides older tokens). The defaults are pinned to the old model.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from course_attn import attention_maps
from course_attn.core.attention import ATTENTION_IMPLS
from course_attn.core.layers import MultiHeadAttention, sinusoidal_table
from course_attn.core.masks import padding_mask
from course_attn.models.gpt import POS_ENCODINGS, GPTConfig, MiniGPT
from course_attn.modern.gqa import repeat_kv
from course_attn.modern.rope import apply_rotary, rope_cos_sin
from course_attn.train.checkpoint import CHECKPOINT_FORMAT, model_from_checkpoint

V = 13
META = torch.device("meta")

#: Each switch alone and the combinations the course trains with.
VARIANTS = {
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "rope": dict(pos_encoding="rope"),
    "mqa": dict(n_kv_heads=1),
    "gqa": dict(n_heads=4, n_kv_heads=2),
    "window": dict(window=3),
    "rope+gqa": dict(pos_encoding="rope", n_heads=4, n_kv_heads=2),
    "rope+mqa": dict(pos_encoding="rope", n_kv_heads=1),
    "rope+window": dict(pos_encoding="rope", window=3),
    "sinusoidal+window": dict(pos_encoding="sinusoidal", window=2),
    "rope+gqa+window": dict(pos_encoding="rope", n_heads=4, n_kv_heads=2, window=4),
    "alibi": dict(pos_encoding="alibi"),
    "alibi+gqa": dict(pos_encoding="alibi", n_heads=4, n_kv_heads=2),
    "alibi+mqa+window": dict(pos_encoding="alibi", n_kv_heads=1, window=3),
    "alibi+gqa+window": dict(pos_encoding="alibi", n_heads=4, n_kv_heads=2, window=4),
}
variants = pytest.mark.parametrize("variant", list(VARIANTS))
impls = pytest.mark.parametrize("impl", ATTENTION_IMPLS)

# Left-padded prompts: row lengths 5, 3, 1 (pads hold arbitrary ids on purpose).
IDX = torch.tensor([[3, 1, 4, 1, 5], [9, 9, 2, 6, 5], [7, 7, 7, 7, 3]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)


def config(impl: str = "manual", **overrides) -> GPTConfig:
    sizes = dict(vocab_size=V, context_length=12, n_layers=2, n_heads=2, d_model=16, impl=impl)
    return GPTConfig(**{**sizes, **overrides})


def tiny(variant: str | None = None, impl: str = "manual", **overrides) -> MiniGPT:
    """A float64 model in eval mode; a larger init makes the variants' effects visible."""
    torch.manual_seed(0)
    options = {**(VARIANTS[variant] if variant else {}), "init_std": 0.2, **overrides}
    return MiniGPT(config(impl, **options)).double().eval()


def ids(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(V, shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ the defaults
def test_the_new_fields_default_to_the_old_model():
    c = GPTConfig(vocab_size=V, context_length=8)
    assert (c.pos_encoding, c.n_kv_heads, c.window) == ("learned", None, None)
    assert POS_ENCODINGS == ("learned", "sinusoidal", "rope", "alibi")


@impls
def test_explicit_neutral_settings_give_the_default_model_bit_for_bit(impl):
    """n_kv_heads=n_heads and a window covering context_length change nothing, not even the RNG."""
    base = tiny(impl=impl)
    same = tiny(impl=impl, n_kv_heads=2, window=12, pos_encoding="learned")
    assert base.state_dict().keys() == same.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(base.state_dict().values(),
                                                 same.state_dict().values(), strict=True))
    assert torch.equal(base(IDX, attention_mask=MASK)[0], same(IDX, attention_mask=MASK)[0])
    assert torch.equal(base(IDX)[0], same(IDX)[0])


# -------------------------------------------------------- what every variant keeps
@variants
@impls
def test_future_tokens_never_change_earlier_logits(variant, impl):
    model = tiny(variant, impl)
    idx = ids((2, 10), 2)
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % V
    before, _ = model(idx)
    after, _ = model(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6], rtol=0, atol=1e-12)
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@variants
@impls
def test_left_padded_rows_equal_the_rows_alone(variant, impl):
    model = tiny(variant, impl)
    logits, _ = model(IDX, attention_mask=MASK)
    for row in range(3):
        alone, _ = model(IDX[row:row + 1, MASK[row]])
        torch.testing.assert_close(logits[row:row + 1, MASK[row]], alone, rtol=0, atol=1e-12)
    assert torch.isfinite(logits).all()


@variants
def test_manual_and_fused_paths_agree(variant):
    models = [tiny(variant, impl) for impl in ATTENTION_IMPLS]
    reference = models[0](IDX, attention_mask=MASK)[0]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
        torch.testing.assert_close(model(IDX, attention_mask=MASK)[0], reference,
                                   rtol=0, atol=1e-12)


@variants
@impls
def test_kv_cache_logits_equal_full_forward_at_every_step(variant, impl):
    model = tiny(variant, impl)
    extra = ids((3, 6), 5)
    seq = torch.cat([IDX, extra], dim=1)  # (3, 11), left-padded
    mask = torch.cat([MASK, torch.ones_like(extra, dtype=torch.bool)], dim=1)
    full, _ = model(seq, attention_mask=mask)
    caches = model.new_caches()
    step, _ = model(seq[:, :5], attention_mask=mask[:, :5], caches=caches)  # prefill
    torch.testing.assert_close(step[mask[:, :5]], full[:, :5][mask[:, :5]], rtol=0, atol=1e-12)
    step, _ = model(seq[:, 5:7], attention_mask=mask[:, :7], caches=caches)  # two at once
    torch.testing.assert_close(step, full[:, 5:7], rtol=0, atol=1e-12)
    for t in range(7, seq.shape[1]):
        step, _ = model(seq[:, t:t + 1], attention_mask=mask[:, :t + 1], caches=caches)
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=1e-12)


@variants
@impls
def test_unpadded_kv_cache_logits_equal_full_forward(variant, impl):
    """Without an attention_mask the positions continue from the cache's length."""
    model = tiny(variant, impl)
    seq = ids((2, 9), 6)
    full, _ = model(seq)
    caches = model.new_caches()
    model(seq[:, :4], caches=caches)
    for t in range(4, 9):
        step, _ = model(seq[:, t:t + 1], caches=caches)
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=1e-12)


@variants
@impls
def test_greedy_identical_with_and_without_cache_past_block_size(variant, impl):
    model = tiny(variant, impl)
    with_cache = model.generate(IDX, 14, temperature=0, attention_mask=MASK)  # 5 + 14 > 12
    without = model.generate(IDX, 14, temperature=0, attention_mask=MASK, use_cache=False)
    assert with_cache.shape == (3, 19)
    assert torch.equal(with_cache, without)
    for row in range(3):  # and each padded row continues as the prompt alone does
        alone = model.generate(IDX[row:row + 1, MASK[row]], 6, temperature=0)
        assert torch.equal(with_cache[row, 5:11], alone[0, -6:])


@variants
def test_attention_maps_rows_sum_to_one_within_the_window(variant):
    model = tiny(variant)
    maps = attention_maps(model, IDX, attention_mask=MASK)  # (L, B, H, T, T)
    sums = maps.sum(-1).transpose(1, 2)  # (L, H, B, T)
    torch.testing.assert_close(sums[:, :, MASK], torch.ones_like(sums[:, :, MASK]))
    assert (sums[:, :, ~MASK] == 0).all()
    window = model.config.window or IDX.shape[1]
    assert (maps.triu(1) == 0).all() and (maps.tril(-window) == 0).all()


# ------------------------------------------------------------------ any device
def meta_gpt(variant: str, impl: str) -> MiniGPT:
    with META:
        return MiniGPT(config(impl, dropout=0.1, **VARIANTS[variant]))


@variants
@impls
def test_forward_backward_and_cached_decoding_on_meta(variant, impl):
    model = meta_gpt(variant, impl).train()
    idx = torch.zeros(2, 6, dtype=torch.long, device=META)
    mask = padding_mask([6, 3], 6, side="left", device=META)
    logits, loss = model(idx, idx, attention_mask=mask)
    loss.backward()
    assert logits.device == META and loss.device == META
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters())
    model.eval()
    caches = model.new_caches()
    model(idx, attention_mask=mask, caches=caches)
    longer = torch.cat([mask, torch.ones(2, 1, dtype=torch.bool, device=META)], dim=1)
    step, _ = model(idx[:, :1], attention_mask=longer, caches=caches)
    assert step.shape == (2, 1, V) and step.device == META and caches[1].k.device == META
    out = model.generate(idx, 4, temperature=0.0, attention_mask=mask)  # crosses context_length
    assert out.shape == (2, 10) and out.device == META


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("variant", ["rope+gqa+window", "alibi+gqa+window"])
def test_variants_compile_without_graph_breaks(variant, impl):
    torch.manual_seed(0)
    model = MiniGPT(config(impl, dropout=0.1, **VARIANTS[variant]))
    idx = ids((2, 8), 7)
    mask = padding_mask([8, 5], 8, side="left")
    torch._dynamo.reset()
    try:
        explanation = torch._dynamo.explain(model)(idx, idx, attention_mask=mask)
    finally:
        torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


# --------------------------------------------------------------- GQA and MQA
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_the_cache_holds_only_n_kv_heads_heads(n_kv_heads):
    model = tiny(n_heads=4, n_kv_heads=n_kv_heads)
    caches = model.new_caches()
    model(IDX, attention_mask=MASK, caches=caches)
    head_dim = 16 // 4
    assert all(cache.k.shape == cache.v.shape == (3, n_kv_heads, 5, head_dim)
               for cache in caches)
    attn = model.blocks[0].self_attn
    # one projection: the queries' 16 rows, then n_kv_heads heads of keys and of values
    assert attn.qkv_proj.weight.shape == (16 + 2 * n_kv_heads * head_dim, 16)
    full = tiny(n_heads=4)
    saved = 2 * 2 * (4 - n_kv_heads) * head_dim * (16 + 1)  # 2 layers, k and v, weight + bias
    assert full.num_parameters() - model.num_parameters() == saved


@impls
@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_gqa_equals_multi_head_attention_with_repeated_key_value_heads(impl, n_kv_heads):
    """Reference: every query head gets its own copy of its group's k/v projection."""
    torch.manual_seed(1)
    gqa = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, impl=impl).double()
    mha = MultiHeadAttention(16, 4, impl=impl).double()
    group = 4 // n_kv_heads
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            weight = getattr(gqa, name).weight.unflatten(0, (n_kv_heads, 4))  # (H_kv, hd, D)
            bias = getattr(gqa, name).bias.unflatten(0, (n_kv_heads, 4))  # (H_kv, hd)
            getattr(mha, name).weight.copy_(weight.repeat_interleave(group, 0).flatten(0, 1))
            getattr(mha, name).bias.copy_(bias.repeat_interleave(group, 0).flatten(0, 1))
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    out, _ = gqa(x, attention_mask=mask, is_causal=True)
    expected, _ = mha(x, attention_mask=mask, is_causal=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    _, weights = gqa(x, need_weights=True)  # weights per query head
    assert weights.shape == (2, 4, 5, 5)
    # and the layout is repeat_kv's: query head h reads key/value head h // group
    k = gqa.k_proj(x).unflatten(-1, (n_kv_heads, 4)).transpose(1, 2)  # (B, H_kv, T, hd)
    assert torch.equal(repeat_kv(k, group), k.repeat_interleave(group, dim=1))


# ----------------------------------------------------------------------- RoPE
def test_rope_has_no_position_table_and_sinusoidal_a_fixed_unsaved_one():
    rope, sinusoidal, learned = tiny("rope"), tiny("sinusoidal"), tiny()
    assert rope.pos is None and rope.pos_table is None
    assert sinusoidal.pos is None and "pos_table" not in sinusoidal.state_dict()
    torch.testing.assert_close(sinusoidal.pos_table, sinusoidal_table(12, 16).double())
    assert {k for k in learned.state_dict() if k.startswith("pos")} == {"pos.weight"}
    for model in (rope, sinusoidal):
        assert not any(k.startswith("pos") for k in model.state_dict())
        assert model.num_parameters(non_embedding=True) == model.num_parameters()
    assert learned.num_parameters() - rope.num_parameters() == 12 * 16
    idx = ids((2, 6), 8)
    entering = []  # what the first block receives: the embeddings plus the table's rows
    sinusoidal.blocks[0].register_forward_pre_hook(lambda block, args: entering.append(args[0]))
    sinusoidal(idx)
    torch.testing.assert_close(entering[0],
                               sinusoidal.embed(idx) + sinusoidal_table(12, 16)[:6].double())


@pytest.mark.parametrize("shift", [1, 5, 40])
def test_a_rope_block_sees_only_relative_positions(shift):
    """Shifting every position by the same amount changes no output of a RoPE block."""
    model = tiny("rope+gqa")
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    positions = torch.arange(6)
    block = model.blocks[0]
    head_dim = model.config.d_model // model.config.n_heads

    def rotation(at: torch.Tensor):  # what MiniGPT hands its blocks: RoPE at these positions
        cos, sin = rope_cos_sin(at, head_dim, dtype=torch.float64)
        return functools.partial(apply_rotary, cos=cos, sin=sin)

    at_zero = block(x, is_causal=True, rotate=rotation(positions))
    shifted = block(x, is_causal=True, rotate=rotation(positions + shift))
    torch.testing.assert_close(shifted, at_zero, rtol=0, atol=1e-12)
    # a table of absolute positions is not shift-invariant: the learned model's rows differ
    learned = tiny()
    assert not torch.allclose(learned.pos(positions), learned.pos(positions + 1))


def test_rope_positions_count_from_the_first_real_token():
    model = tiny("rope")
    rotations = []  # the rotation each forward hands the first block's attention
    model.blocks[0].self_attn.register_forward_hook(
        lambda layer, args, kwargs, out: rotations.append(kwargs["rotate"]), with_kwargs=True)
    model(IDX, attention_mask=MASK)
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2], [0, 0, 0, 0, 0]])
    cos, sin = rope_cos_sin(positions, 8, dtype=torch.float64)  # (B, T, head_dim / 2)
    assert rotations[0].keywords["cos"].shape == (3, 1, 5, 4)  # (B, 1, T, hd / 2): all heads
    assert torch.equal(rotations[0].keywords["cos"], cos[:, None])
    assert torch.equal(rotations[0].keywords["sin"], sin[:, None])


# --------------------------------------------------------------- sliding window
@impls
@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_a_one_layer_window_never_sees_tokens_older_than_the_window(impl, pos_encoding):
    model = tiny(impl=impl, n_layers=1, window=3, pos_encoding=pos_encoding)
    idx = ids((2, 10), 10)
    changed = idx.clone()
    changed[:, 2] = (changed[:, 2] + 1) % V
    before, after = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(before[:, 5:], after[:, 5:], rtol=0, atol=1e-12)  # 5 - 2 >= 3
    assert not torch.allclose(before[:, 2:5], after[:, 2:5])  # inside the window: it matters
    # two layers see two windows back: 2 * (3 - 1) = 4 positions
    deep = tiny(impl=impl, n_layers=2, window=3, pos_encoding=pos_encoding)
    before, after = deep(idx)[0], deep(changed)[0]
    torch.testing.assert_close(before[:, 7:], after[:, 7:], rtol=0, atol=1e-12)
    assert not torch.allclose(before[:, 6], after[:, 6])


def test_a_window_of_one_attends_only_to_itself():
    maps = attention_maps(tiny(window=1), IDX, attention_mask=MASK)  # (L, B, H, T, T)
    eye = torch.eye(5, dtype=maps.dtype).expand_as(maps)
    real = MASK[None, :, None, :, None].expand_as(maps)  # rows of real queries
    torch.testing.assert_close(maps[real], eye[real])


# ------------------------------------------------------------ training, saving
def test_rope_mqa_window_overfits_one_batch():
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=V, context_length=8, n_layers=1, n_heads=2, d_model=32,
                              pos_encoding="rope", n_kv_heads=1, window=4))
    idx = ids((4, 9), 4)
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


@pytest.mark.parametrize("variant", ["rope+gqa+window", "sinusoidal", "alibi+gqa"])
def test_a_checkpoint_rebuilds_the_variant(variant):
    model = tiny(variant).float()  # a checkpoint rebuilds a float32 model
    # what training_state stores of the model: its config as a dict, and its weights
    checkpoint = {"format": CHECKPOINT_FORMAT, "model_config": dataclasses.asdict(model.config),
                  "model": model.state_dict()}
    again, _ = model_from_checkpoint(checkpoint)
    again.eval()
    assert again.config == model.config
    assert torch.equal(again(IDX, attention_mask=MASK)[0], model(IDX, attention_mask=MASK)[0])


# ------------------------------------------------------------------ bad config
@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        (dict(pos_encoding="xpos"), ValueError, r"pos_encoding must be one of \('learned'"),
        (dict(pos_encoding="ALiBi"), ValueError, "pos_encoding must be one of"),
        (dict(pos_encoding="RoPE"), ValueError, "pos_encoding must be one of"),
        (dict(pos_encoding=None), TypeError, "pos_encoding must be one of"),
        (dict(pos_encoding="rope", d_model=18, n_heads=6), ValueError,
         r"pos_encoding='rope' needs an even head_dim .* d_model=18 / n_heads=6 = 3"),
        (dict(n_heads=4, n_kv_heads=3), ValueError, "n_kv_heads=3 must divide n_heads=4"),
        (dict(n_heads=2, n_kv_heads=4), ValueError, "n_kv_heads=4 must divide n_heads=2"),
        (dict(n_kv_heads=0), ValueError, "n_kv_heads must be a positive int, got 0"),
        (dict(n_kv_heads=1.0), TypeError, "n_kv_heads must be a positive int"),
        (dict(n_kv_heads=True), TypeError, "n_kv_heads must be a positive int"),
        (dict(window=0), ValueError, "window must be a positive int, got 0"),
        (dict(window=-2), ValueError, "window must be a positive int, got -2"),
        (dict(window=2.5), TypeError, "window must be a positive int"),
        (dict(window=True), TypeError, "window must be a positive int"),
    ],
)
def test_bad_variant_settings_are_refused_clearly(overrides, error, match):
    with pytest.raises(error, match=match):
        config(**overrides)


def test_multi_head_attention_checks_n_kv_heads():
    with pytest.raises(ValueError, match="n_kv_heads=3 must divide n_heads=4"):
        MultiHeadAttention(16, 4, n_kv_heads=3)
    with pytest.raises(TypeError, match="n_kv_heads must be a positive int"):
        MultiHeadAttention(16, 4, n_kv_heads="2")
