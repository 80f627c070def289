"""Every public module on the ``meta`` device, and a forward without host syncs or graph breaks.

A tensor on ``meta`` has a shape and a dtype but no values. Mixing it with a tensor
made on the CPU fails ("Tensor on device cpu is not on the expected device meta"),
and so does reading a value (``.item()``, ``if tensor:``). Those are exactly the two
bugs that crash a model on a GPU, where they would be a device mismatch and a
host-device synchronisation. So these tests find GPU bugs on a CPU-only machine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_attn import attention_maps, cross_attention_maps
from course_attn.core.attention import ATTENTION_IMPLS, attention
from course_attn.core.layers import MultiHeadAttention, PositionalEncoding, TransformerBlock
from course_attn.core.masks import causal_mask, padding_mask
from course_attn.data.tasks import CopyTask
from course_attn.data.text import CharCorpus, to_device
from course_attn.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from course_attn.models.gpt import GPTConfig, MiniGPT

META = torch.device("meta")
V, T = 11, 6


def meta_gpt(impl: str, dropout: float = 0.1) -> MiniGPT:
    with META:
        return MiniGPT(GPTConfig(vocab_size=V, context_length=8, n_layers=2, n_heads=2, d_model=16,
                                 dropout=dropout, impl=impl))


def ids(batch: int = 2, time: int = T) -> torch.Tensor:
    return torch.zeros(batch, time, dtype=torch.long, device=META)


def left_padding() -> torch.Tensor:
    return padding_mask([T, 3], T, side="left", device=META)  # (2, T)


def all_on_meta(*tensors: torch.Tensor) -> bool:
    return all(t.device == META for t in tensors)


def test_meta_is_strict_about_devices_and_values():
    """The premise of this file: meta fails where CUDA would."""
    x = torch.zeros(2, 2, device=META)
    with pytest.raises(RuntimeError, match="device"):
        x.masked_fill(torch.ones(2, 2, dtype=torch.bool), 0.0)  # a mask left on the CPU
    with pytest.raises(RuntimeError, match="meta"):
        x.sum().item()  # a value read: a host sync on a GPU


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("padded", [False, True])
def test_minigpt_forward_and_backward_on_meta(impl, padded):
    model = meta_gpt(impl).train()
    mask = left_padding() if padded else None
    logits, loss = model(ids(), ids(), attention_mask=mask)
    loss.backward()
    assert logits.shape == (2, T, V) and all_on_meta(logits, loss)
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters())


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_minigpt_cached_decoding_and_attention_maps_on_meta(impl):
    model = meta_gpt(impl).eval()
    caches = model.new_caches()
    model(ids(), attention_mask=left_padding(), caches=caches)
    mask = torch.cat([left_padding(), torch.ones(2, 1, dtype=torch.bool, device=META)], dim=1)
    logits, _ = model(ids(time=1), attention_mask=mask, caches=caches)
    maps = attention_maps(model, ids(), attention_mask=left_padding())
    assert logits.shape == (2, 1, V) and maps.shape == (2, 2, 2, T, T)
    assert all_on_meta(logits, maps, caches[0].k, caches[1].v)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize(
    "options",
    [dict(temperature=0.0), dict(temperature=0.0, use_cache=False), dict(top_k=3),
     dict(temperature=0.7, attention_mask="left")],
    ids=["greedy", "greedy-no-cache", "top-k-sample", "sample-left-padded"],
)
def test_generate_on_meta(impl, options):
    """Greedy and sampled generation: every token made on the model's device (no value read)."""
    model = meta_gpt(impl)
    if options.get("attention_mask") == "left":
        options = {**options, "attention_mask": left_padding()}
    out = model.generate(ids(), 4, **options)  # crosses context_length=8: cropped context too
    assert out.shape == (2, T + 4) and out.device == META


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize(
    "masks",
    ["none", "causal", "attn_mask_2d", "attn_mask_3d", "key_padding", "all"],
)
def test_multi_head_attention_on_meta_with_every_mask(impl, masks):
    with META:
        mha = MultiHeadAttention(16, 2, impl=impl, dropout=0.1).train()
    x = torch.randn(2, T, 16, device=META, requires_grad=True)
    kwargs = {
        "none": {},
        "causal": dict(is_causal=True),
        "attn_mask_2d": dict(mask=torch.ones(T, T, dtype=torch.bool, device=META)),
        "attn_mask_3d": dict(mask=torch.ones(2, T, T, dtype=torch.bool, device=META)),
        "key_padding": dict(attention_mask=left_padding()),
        "all": dict(is_causal=True, attention_mask=left_padding(),
                    mask=torch.ones(T, T, dtype=torch.bool, device=META)),
    }[masks]
    out = mha(x, **kwargs)[0]
    out.sum().backward()
    out_w, weights = mha(x, need_weights=True, **kwargs)
    assert all_on_meta(out, out_w, weights, x.grad)


def test_multi_head_attention_cache_and_cross_attention_on_meta():
    with META:
        mha = MultiHeadAttention(16, 2, impl="sdpa").eval()
    from course_attn.core.layers import KVCache

    cache = KVCache()
    x = torch.randn(2, T, 16, device=META)
    mha(x[:, :4], is_causal=True, cache=cache)[0]
    step = mha(x[:, 4:5], is_causal=True, cache=cache)[0]  # T_q=1 < T_k=5: bottom-right mask
    memory = torch.randn(2, 3, 16, device=META)
    cross = mha(x, memory, memory, attention_mask=padding_mask([3, 2], device=META))[0]
    from course_attn.core.kv_cache import CrossKVCache

    cross_cache = CrossKVCache()  # the static cross-attention cache: filled, then read
    cross_steps = [mha(x[:, t:t + 1], memory, memory, cache=cross_cache)[0] for t in range(2)]
    assert all_on_meta(step, cross, cache.k, cross_cache.k, cross_cache.v, *cross_steps)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_attention_function_on_meta_with_a_mask_built_on_the_cpu(impl):
    """A mask from causal_mask() on the default device follows the queries to their device."""
    q = torch.randn(2, 2, T, 8, device=META, requires_grad=True)
    for mask, causal in ((causal_mask(T), False), (None, True), (causal_mask(T), True),
                         (padding_mask([T, 2], T)[:, None, None, :], True)):
        out, weights = attention(q, q, q, mask, is_causal=causal, impl=impl, dropout_p=0.1)
        out.sum().backward()
        assert all_on_meta(out, q.grad)
        assert weights is None or weights.device == META
    short_q = torch.randn(2, 2, 2, 8, device=META)  # T_q < T_k: the cache's case
    assert attention(short_q, q, q, is_causal=True, impl=impl)[0].device == META


def test_transformer_blocks_and_positional_encoding_on_meta():
    with META:
        encoder_block = TransformerBlock(16, 2, dropout=0.1)
        decoder_block = TransformerBlock(16, 2, cross_attention=True, norm_first=False)
        positional = PositionalEncoding(16, context_length=32)
    x = torch.randn(2, T, 16, device=META)
    memory = encoder_block(x, attention_mask=left_padding())
    out = decoder_block(x, is_causal=True, memory=memory,
                        memory_attention_mask=left_padding())
    positions = torch.arange(T, device=META).expand(2, T)
    assert all_on_meta(memory, out, positional(x), positional(x, positions))


def test_encoder_decoder_forward_backward_and_greedy_decode_on_meta():
    with META:
        model = EncoderDecoder(EncoderDecoderConfig(src_vocab_size=V, tgt_vocab_size=V,
                                                    d_model=16, n_heads=2, n_layers=2,
                                                    dropout=0.1))
    src, tgt = ids(), ids(time=4)
    src_mask = left_padding()
    logits = model(src, tgt, src_attention_mask=src_mask,
                   tgt_attention_mask=padding_mask([4, 2], 4, device=META))
    logits.sum().backward()
    model.eval()
    for use_cache in (True, False):
        out = model.greedy_decode(src, tgt[:, :1], 3, src_attention_mask=src_mask,
                                  use_cache=use_cache)
        assert out.shape == (2, 4) and out.device == META
    maps = cross_attention_maps(model, src, tgt, src_attention_mask=src_mask)
    assert logits.device == META and maps.shape == (2, 2, 2, 4, T) and maps.device == META


def test_batches_are_made_on_the_asked_device():
    corpus = CharCorpus.from_text("abcdefgh" * 20)
    x, y = corpus.get_batch("train", 3, 5, generator=torch.Generator().manual_seed(0),
                            device=META)
    assert x.shape == y.shape == (3, 5) and all_on_meta(x, y)
    corpus.get_batch("train", 3, 5, device=META)
    assert list(corpus._on_device) == [("train", "meta")]  # the split was copied once
    x, y = CopyTask().get_batch("val", 2, device=META)
    assert all_on_meta(x, y) and to_device(torch.zeros(2), "meta").device == META


# ------------------------------------------------------- compile and fast paths
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
@pytest.mark.parametrize("padded", [False, True])
def test_minigpt_forward_and_loss_compile_without_graph_breaks(impl, padded):
    """No value reads: torch.compile sees one graph (a break would also be a GPU sync)."""
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=V, context_length=8, n_layers=2, n_heads=2, d_model=16,
                              dropout=0.1, impl=impl))
    idx = torch.randint(V, (2, 8))
    mask = padding_mask([8, 5], 8, side="left") if padded else None
    torch._dynamo.reset()
    try:
        explanation = torch._dynamo.explain(model)(idx, idx, attention_mask=mask)
    finally:
        torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_plain_causal_sdpa_uses_is_causal_and_no_mask_tensor(monkeypatch):
    """The flash kernel needs is_causal=True with attn_mask=None; padding or a cache keep a mask."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("attn_mask") is None, kwargs.get("is_causal", False)))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=V, context_length=8, n_layers=2, n_heads=2, d_model=16,
                              impl="sdpa")).eval()
    idx = torch.randint(V, (2, 6))
    model(idx)
    assert calls == [(True, True)] * 2  # one call per layer, flash-eligible
    calls.clear()
    model(idx, attention_mask=padding_mask([6, 4], 6, side="left"))
    assert calls == [(False, False)] * 2  # an explicit mask: padding is not causal
    calls.clear()
    caches = model.new_caches()
    model(idx[:, :5], caches=caches)  # prefill: plain causal, flash-eligible
    model(idx[:, 5:], caches=caches)  # T_q=1 < T_k=6: bottom-right, explicit
    assert calls == [(True, True)] * 2 + [(False, False)] * 2


def test_tiny_temperature_sampling_and_empty_targets_on_meta():
    """The overflow guard of the sampler and the loss's count decide without a value read."""
    model = meta_gpt("sdpa")
    out = model.generate(ids(), 2, temperature=1e-45, attention_mask=left_padding())
    _, loss = model(ids(), torch.full((2, T), -1, dtype=torch.long, device=META))
    assert out.device == META and loss.device == META and loss.shape == ()


# ------------------------------------------------------------ choosing a device
def _fake_gpus(monkeypatch, count: int) -> None:
    from course_attn import env

    monkeypatch.setattr(env.torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(env.torch.cuda, "device_count", lambda: count)


def test_pick_device_names_a_gpu_index_the_machine_does_not_have(monkeypatch):
    from course_attn.env import pick_device

    _fake_gpus(monkeypatch, 1)
    with pytest.raises(ValueError, match=r"^preferred='cuda:7' asks for CUDA device index 7, "
                                         r"but this machine has 1 CUDA device \(indices 0 to 0\)"):
        pick_device("cuda:7")
    assert pick_device("cuda:0") == torch.device("cuda:0")
    assert pick_device(torch.device("cuda")) == torch.device("cuda")
    _fake_gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match=r"^preferred='cuda' but no CUDA device is available"):
        pick_device("cuda")


@pytest.mark.parametrize(
    ("preferred", "error", "pattern"),
    [
        ("meta", ValueError, r"^preferred='meta' is not a device to run on \('meta' tensors"),
        ("xla", ValueError, r"^preferred='xla' is not a device to run on"),
        ("cpu:1", ValueError, r"^preferred='cpu:1': there is one CPU device"),
        ("gpu", ValueError, r"^preferred must name a torch device"),
        (0, TypeError, r"^preferred must be a torch.device, a string"),
    ],
)
def test_pick_device_refuses_what_cannot_run_the_course(preferred, error, pattern):
    from course_attn.env import pick_device

    with pytest.raises(error, match=pattern):
        pick_device(preferred)


def test_seed_everything_checks_the_range_torch_accepts():
    from course_attn.env import seed_everything

    assert isinstance(seed_everything(2**64 - 1), torch.Generator)
    with pytest.raises(ValueError, match=r"^seed must be an int in \[0, 2\*\*64 - 1\]"):
        seed_everything(2**64)
    with pytest.raises(ValueError, match=r"^seed must be an int in"):
        seed_everything(-1)
    with pytest.raises(TypeError, match=r"^seed must be an int"):
        seed_everything(1.5)
    seed_everything(0)  # leave the global RNGs in a known state


# ------------------------------- masks, positions and caches on another device (issue 41)
# A layer's or model's door refuses a mask, bias, position or cache on another device than
# its inputs, as it refuses the inputs themselves: a ValueError that names both devices and
# the fix. (Before, masks were copied over at every call, and one on meta, like one on a GPU
# for a CPU model, failed inside torch: "Cannot copy out of meta tensor".)
CPU = torch.device("cpu")


def _filled(cache, batch: int, device: torch.device, heads: int = 2, head_dim: int = 8):
    cache.update(torch.zeros(batch, heads, 3, head_dim, device=device),
                 torch.zeros(batch, heads, 3, head_dim, device=device))
    return cache


def _layer_calls(inputs: torch.device, other: torch.device) -> dict:
    """Each call of a layer or model whose named argument is on ``other``, the rest on
    ``inputs``: name -> (the call, the argument's name)."""
    from course_attn.core.kv_cache import CrossKVCache, KVCache
    from course_attn.modern.latent import MultiHeadLatentAttention

    with inputs:
        mha = MultiHeadAttention(16, 2)
        block = TransformerBlock(16, 2, cross_attention=True)
        gpt = MiniGPT(GPTConfig(vocab_size=V, context_length=8, n_layers=1, n_heads=2,
                                d_model=16))
        seq2seq = EncoderDecoder(EncoderDecoderConfig(src_vocab_size=V, tgt_vocab_size=V,
                                                      d_model=16, n_heads=2, n_layers=1))
        latent = MultiHeadLatentAttention(16, 2, 4, d_rope=2)
        positional = PositionalEncoding(16, context_length=8)
    x = torch.zeros(2, T, 16, device=inputs)
    idx = torch.zeros(2, T, dtype=torch.long, device=inputs)
    real = torch.ones(2, T, dtype=torch.bool, device=other)  # (B, T)
    pairs = torch.ones(T, T, dtype=torch.bool, device=other)  # (T, T)
    return {
        "MultiHeadAttention attention_mask": (lambda: mha(x, attention_mask=real),
                                              "attention_mask"),
        "MultiHeadAttention mask": (lambda: mha(x, mask=pairs), "mask"),
        "MultiHeadAttention bias": (lambda: mha(x, bias=torch.zeros(T, T, device=other)),
                                    "bias"),
        "MultiHeadAttention KVCache": (lambda: mha(x[:, :1], cache=_filled(KVCache(), 2, other)),
                                       "cache"),
        "MultiHeadAttention CrossKVCache": (
            lambda: mha(x, x, x, cache=_filled(CrossKVCache(), 2, other)), "cache"),
        "TransformerBlock attention_mask": (lambda: block(x, attention_mask=real, memory=x),
                                            "attention_mask"),
        "TransformerBlock memory_attention_mask": (
            lambda: block(x, memory=x, memory_attention_mask=real), "memory_attention_mask"),
        "TransformerBlock memory": (
            lambda: block(x, memory=torch.zeros(2, T, 16, device=other)), "memory"),
        "MiniGPT attention_mask": (lambda: gpt(idx, attention_mask=real), "attention_mask"),
        "MiniGPT caches": (lambda: gpt(idx[:, :1], caches=[_filled(KVCache(), 2, other)]),
                           "caches[0]"),
        "MiniGPT.generate attention_mask": (lambda: gpt.generate(idx, 1, attention_mask=real),
                                            "attention_mask"),
        "attention_maps attention_mask": (lambda: attention_maps(gpt, idx, attention_mask=real),
                                          "attention_mask"),
        "EncoderDecoder src_attention_mask": (
            lambda: seq2seq(idx, idx, src_attention_mask=real), "src_attention_mask"),
        "EncoderDecoder tgt_attention_mask": (
            lambda: seq2seq(idx, idx, tgt_attention_mask=real), "tgt_attention_mask"),
        "greedy_decode memory_attention_mask": (
            lambda: seq2seq.greedy_decode(idx, idx[:, :1], 1, memory_attention_mask=real),
            "memory_attention_mask"),
        "greedy_decode prompt_attention_mask": (
            lambda: seq2seq.greedy_decode(idx, idx[:, :1], 1,
                                          prompt_attention_mask=real[:, :1]),
            "prompt_attention_mask"),
        "MultiHeadLatentAttention attention_mask": (lambda: latent(x, attention_mask=real),
                                                    "attention_mask"),
        "MultiHeadLatentAttention positions": (
            lambda: latent(x, positions=torch.arange(T, device=other)), "positions"),
        "PositionalEncoding positions": (
            lambda: positional(x, torch.arange(T, device=other)), "positions"),
    }


@pytest.mark.parametrize(("inputs", "other"), [(CPU, META), (META, CPU)])
@pytest.mark.parametrize("case", list(_layer_calls(CPU, META)))
def test_a_layer_refuses_a_mask_position_or_cache_on_another_device(case, inputs, other):
    call, name = _layer_calls(inputs, other)[case]
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{name} ") and f"on {other}" in message, message
    assert f"on {inputs}" in message and (".to(" in message or "reset()" in message), message


@pytest.mark.parametrize("batch", [3, 1])
def test_a_cache_of_another_batch_names_both_sizes(batch):
    """At the door (a model's cache list) and in KVCache.update itself, which checks
    nothing but turns torch.cat's own failure into the message, the cache left as it was."""
    from course_attn.core.kv_cache import KVCache

    with pytest.raises(ValueError, match=rf"caches\[0\] holds \(B, H, head_dim\)=\({batch}, 2, "
                                         r"8\) but the new keys have \(2, 2, 8\)"):
        meta_gpt("sdpa")(ids(time=1), caches=[_filled(KVCache(), batch, META) for _ in "ab"])
    cache = _filled(KVCache(), batch, CPU)
    held = cache.k
    with pytest.raises(ValueError) as info:
        cache.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8))
    assert f"=({batch}, 2, 3, 8) on cpu but the new keys are (2, 2, 1, 8) on cpu" in str(
        info.value) and "reset()" in str(info.value)
    assert cache.k is held  # unchanged
    with pytest.raises(ValueError, match="on cpu but the new keys are .* on meta"):
        cache.update(torch.zeros(batch, 2, 1, 8, device=META),
                     torch.zeros(batch, 2, 1, 8, device=META))


def test_a_generator_elsewhere_than_the_model_or_the_cpu_is_refused():
    with pytest.raises(ValueError, match="generator is on cpu but idx is on meta; pass "
                                         "generator=None"):
        meta_gpt("sdpa").generate(ids(), 1, temperature=1.0, generator=torch.Generator())


def _function_calls() -> dict:
    """Each chapter function given a mask, bias, slopes or positions on meta and its inputs
    on the CPU: name -> (the call, the argument's name). From the CPU they follow the
    inputs (test_attention_function_on_meta_with_a_mask_built_on_the_cpu); from meta,
    which holds no values, they cannot."""
    from course_attn import (
        alibi_attention,
        alibi_slopes,
        apply_rope,
        combine_masks,
        linear_attention,
        linear_attention_recurrent,
        sliding_window_attention,
    )

    q = torch.zeros(2, 2, T, 8)
    on_meta = torch.ones(T, T, dtype=torch.bool, device=META)
    real = torch.ones(2, T, dtype=torch.bool, device=META)
    return {
        "attention mask": (lambda: attention(q, q, q, on_meta), "mask"),
        "attention bias": (lambda: attention(q, q, q, bias=torch.zeros(T, T, device=META)),
                           "bias"),
        "alibi_attention slopes": (lambda: alibi_attention(q, q, q, alibi_slopes(2, device=META)),
                                   "slopes"),
        "sliding_window_attention mask": (
            lambda: sliding_window_attention(q, q, q, on_meta, window=2), "mask"),
        "linear_attention mask": (lambda: linear_attention(q, q, q, on_meta), "mask"),
        "linear_attention_recurrent attention_mask": (
            lambda: linear_attention_recurrent(q, q, q, attention_mask=real), "attention_mask"),
        "apply_rope positions": (lambda: apply_rope(q, torch.arange(T, device=META)),
                                 "positions"),
        "combine_masks mask": (lambda: combine_masks(T, T, mask=on_meta, device="cpu"), "mask"),
        "padding_mask lengths": (
            lambda: padding_mask(torch.tensor([3, 5], device=META), T, device="cpu"),
            "lengths"),
    }


@pytest.mark.parametrize("case", list(_function_calls()))
def test_a_function_cannot_copy_a_mask_or_positions_out_of_meta(case):
    call, name = _function_calls()[case]
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(f"{name} is on meta (shapes only, no values to copy) "
                                      "but ") and "on cpu; make" in str(info.value)


def test_padding_mask_of_lengths_on_meta_needs_max_len():
    with pytest.raises(ValueError, match="lengths are on meta.*give max_len"):
        padding_mask(torch.tensor([3, 5], device=META))
    assert padding_mask(torch.tensor([3, 5], device=META), T).shape == (2, T)
