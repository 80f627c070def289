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
