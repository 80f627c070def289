"""Forward hooks see every layer of every model (issue 23).

A parent calls its children through ``__call__``, never through a private method,
so a hook on any block, attention, feed-forward or norm module fires once per layer
and per forward, and the attention hook receives the weights the model reports.
The same holds for the public extension point: a block's attention function.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from course_attn import (
    ATTENTION_FUNCTIONS,
    EncoderDecoder,
    EncoderDecoderConfig,
    GPTConfig,
    MiniGPT,
    TransformerBlock,
    attention_maps,
    cross_attention_maps,
    linear_attention,
    padding_mask,
)

V = 11


def _gpt(attention_fn=None, **overrides: object) -> MiniGPT:
    torch.manual_seed(0)
    options = dict(vocab_size=V, context_length=12, n_layers=3, n_heads=2, d_model=16)
    config = GPTConfig(**{**options, **overrides})  # type: ignore[arg-type]
    return MiniGPT(config, attention_fn=attention_fn).eval()


def _seq2seq() -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder(EncoderDecoderConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=16,
                                               n_heads=2, n_layers=2)).eval()


def _watch(blocks: nn.ModuleList, prefix: str, calls: Counter) -> list:
    """A hook on every block and on each of its attention, feed-forward and norm modules."""
    handles = []
    for i, block in enumerate(blocks):
        for name, module in [("block", block), *block.named_children()]:
            if name == "dropout" or module is None:
                continue
            key = f"{prefix}{i}.{name}"
            handles.append(module.register_forward_hook(
                lambda m, args, out, key=key: calls.update([key])))
    return handles


def _parts(block: TransformerBlock) -> list[str]:
    names = ["block", "self_attn", "ff", "norm1", "norm2"]
    return names + (["cross_attn", "norm3"] if block.cross_attn is not None else [])


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_every_layer_of_minigpt_fires_its_hooks_once_per_forward(impl):
    model, calls = _gpt(impl=impl), Counter()
    _watch(model.blocks, "", calls)
    idx = torch.randint(V, (2, 7))
    model(idx, idx)
    expected = {f"{i}.{part}": 1 for i, block in enumerate(model.blocks)
                for part in _parts(block)}
    assert dict(calls) == expected


def test_hooks_fire_at_every_step_of_generation():
    model, calls = _gpt(), Counter()
    _watch(model.blocks, "", calls)
    model.generate(torch.randint(V, (2, 3)), 4, temperature=0.0)
    assert set(calls.values()) == {4}  # one prefill and three cached steps, every layer


def test_the_attention_hook_receives_the_weights_the_model_reports():
    model = _gpt()
    idx, mask = torch.randint(V, (2, 6)), padding_mask([6, 4], 6, side="left")
    seen = []
    for block in model.blocks:
        block.self_attn.register_forward_hook(lambda m, args, out: seen.append(out[1]))
    maps = attention_maps(model, idx, attention_mask=mask)  # (L, B, H, T, T)
    assert maps.shape == (3, 2, 2, 6, 6) and len(seen) == 3
    for layer, weights in enumerate(seen):
        assert torch.equal(weights, maps[layer])
    assert torch.equal(maps[:, 1, :, :, :2], torch.zeros(3, 2, 6, 2))  # pads get no weight
    model(idx)  # without need_weights the layers report none, and the hook sees None
    assert seen[-1] is None


def test_every_layer_of_the_encoder_and_decoder_fires_its_hooks():
    model, calls = _seq2seq(), Counter()
    _watch(model.encoder.blocks, "enc", calls)
    _watch(model.decoder.blocks, "dec", calls)
    src, tgt = torch.randint(V, (2, 5)), torch.randint(V, (2, 4))
    model(src, tgt, src_attention_mask=padding_mask([5, 3], 5))
    expected = {f"{side}{i}.{part}": 1
                for side, stack in (("enc", model.encoder.blocks), ("dec", model.decoder.blocks))
                for i, block in enumerate(stack) for part in _parts(block)}
    assert dict(calls) == expected
    calls.clear()
    model.greedy_decode(src, torch.zeros(2, 1, dtype=torch.long), 3)
    assert set(calls) == set(expected)
    assert {calls[key] for key in expected if key.startswith("enc")} == {1}  # the source once
    assert {calls[key] for key in expected if key.startswith("dec")} == {3}  # at every step


def test_a_cross_attention_hook_sees_the_padded_source_masked():
    model = _seq2seq()
    src, tgt = torch.randint(V, (2, 5)), torch.randint(V, (2, 4))
    seen = []
    model.decoder.blocks[0].cross_attn.register_forward_hook(
        lambda m, args, kwargs, out: seen.append(kwargs["mask"]), with_kwargs=True)
    model(src, tgt, src_attention_mask=padding_mask([5, 3], 5))
    assert seen[0].shape == (2, 1, 1, 5)  # (B, 1, 1, T_s): the same for every head and query
    assert seen[0][1, 0, 0].tolist() == [True, True, True, False, False]


@pytest.mark.parametrize("norm_first", [True, False])
def test_cross_attention_maps_are_what_cross_attention_computes_pre_and_post_norm(norm_first):
    """Issue 36, item 11: the weights are caught at cross_attn itself, so a post-norm block
    (whose norm3 comes *after* cross-attention) is read right too."""
    torch.manual_seed(1)
    model = EncoderDecoder(EncoderDecoderConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=16,
                                                n_heads=2, n_layers=2, norm_first=norm_first))
    model = model.double().train()
    src, tgt = torch.randint(V, (2, 5)), torch.randint(V, (2, 4))
    src_mask, tgt_mask = padding_mask([5, 3], 5), padding_mask([4, 2], 4)
    inputs, norm3_out = [], []  # each block's input and call, norm3's output
    for block in model.decoder.blocks:
        block.register_forward_pre_hook(lambda m, args, kwargs: inputs.append((args, kwargs)),
                                        with_kwargs=True)
        block.norm3.register_forward_hook(lambda m, args, out: norm3_out.append(out))
    maps = cross_attention_maps(model, src, tgt, src_attention_mask=src_mask,
                                tgt_attention_mask=tgt_mask)  # (L, B, H, T_t, T_s)
    assert maps.shape == (2, 2, 2, 4, 5) and model.training  # the mode is restored
    assert torch.equal(maps[:, 1, :, :, 3:], torch.zeros(2, 2, 4, 2))  # padded source keys
    for layer, (block, ((x,), kw)) in enumerate(zip(model.decoder.blocks, inputs, strict=True)):
        self_attention = {"mask": kw["mask"], "is_causal": kw["is_causal"]}
        with torch.no_grad():  # what the block hands its cross-attention, written out
            if norm_first:  # x + self_attn(norm1(x)), then norm3
                query = block.norm3(x + block.self_attn(block.norm1(x), **self_attention)[0])
            else:  # norm1(x + self_attn(x)), and nothing between it and cross-attention
                query = block.norm1(x + block.self_attn(x, **self_attention)[0])
            memory = kw["memory"]  # (B, T_s, D)
            expected = block.cross_attn(query, memory, memory, attention_mask=src_mask,
                                        need_weights=True)[1]  # (B, H, T_t, T_s)
            from_norm3 = block.cross_attn(norm3_out[layer], memory, memory,
                                          attention_mask=src_mask, need_weights=True)[1]
        torch.testing.assert_close(maps[layer], expected, atol=1e-12, rtol=0)
        # the old recipe, queries read at norm3, is right only before the norm moves
        assert torch.allclose(from_norm3, expected) == norm_first
    opened = cross_attention_maps(model, src, tgt, src_attention_mask=src_mask,
                                  memory_attention_mask=torch.ones(2, 5, dtype=torch.bool))
    assert (opened[:, 1, :, :, 3:] > 0).all()  # another mask for cross-attention alone


def test_an_attention_function_swaps_the_path_of_every_block():
    """The public extension point of chapters 10 and 11: no method is overridden."""
    calls = Counter()

    def linear(q, k, v, mask, *, is_causal, dropout_p, bias):
        calls.update(["linear"])
        return linear_attention(q, k, v, mask, is_causal=is_causal)

    def everywhere(q, k, v, mask, **options):  # attention without its causal mask
        return ATTENTION_FUNCTIONS["manual"](q, k, v, None, **{**options, "is_causal": False})

    idx = torch.randint(V, (2, 6))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % V
    plain, swapped = _gpt(), _gpt(attention_fn=linear)
    swapped.load_state_dict(plain.state_dict())  # the same weights: only the path differs
    out = swapped(idx)[0]
    assert calls["linear"] == 3 and not torch.allclose(out, plain(idx)[0])
    earlier = slice(0, -1)  # causal linear attention: the last token moves no earlier output
    assert torch.equal(swapped(changed)[0][:, earlier], out[:, earlier])
    future = _gpt(attention_fn=everywhere)
    assert not torch.allclose(future(changed)[0][:, earlier], future(idx)[0][:, earlier])


def test_a_bad_attention_function_is_refused_at_construction():
    with pytest.raises(TypeError, match=r"^attention_fn must be a function"):
        _gpt(attention_fn="linear")
