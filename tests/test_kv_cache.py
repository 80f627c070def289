"""Chapter 8: decoding with a KV cache gives the same outputs as recomputing everything.

Checked at three levels (multi-head attention, a stack of decoder-only blocks,
the encoder-decoder's decoder), in float64, batch > 1, with left padding where
the positions count from each row's first real token and the key padding mask
covers every cached key. Tolerance: ``atol=1e-10, rtol=1e-8`` in float64 (the
cached and the full path multiply the same numbers in differently shaped
matmuls, so they agree to ~1e-15, not bit for bit).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from course_attn import (
    Cache,
    CrossKVCache,
    EncoderDecoder,
    EncoderDecoderConfig,
    KVCache,
    MultiHeadAttention,
    PositionalEncoding,
    TransformerBlock,
    cross_cache_step_ms,
    decode_step_seconds,
    padding_mask,
    positions_from_attention_mask,
)
from course_attn.core.checks import check_cache, check_cross_cache

TOL = {"atol": 1e-10, "rtol": 1e-8}
D, H = 16, 4


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_multi_head_attention_with_cache_matches_full_causal_attention(impl):
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, impl=impl).double().eval()
    x = torch.randn(3, 7, D, dtype=torch.float64)
    full = mha(x, is_causal=True)[0]  # (B, T, D)
    cache = KVCache()
    for t in range(7):
        step = mha(x[:, t:t + 1], is_causal=True, cache=cache)[0]  # (B, 1, D)
        assert cache.length == t + 1
        assert_close(step[:, 0], full[:, t], **TOL)


def test_chunked_prefill_then_single_steps_match_the_full_pass():
    """A chunk of T_q > 1 new queries against T_k > T_q keys needs bottom-right causality."""
    torch.manual_seed(1)
    mha = MultiHeadAttention(D, H).double().eval()
    x = torch.randn(2, 8, D, dtype=torch.float64)
    full = mha(x, is_causal=True)[0]
    cache = KVCache()
    pieces = [mha(x[:, a:b], is_causal=True, cache=cache)[0] for a, b in ((0, 3), (3, 6), (6, 7),
                                                                       (7, 8))]
    assert_close(torch.cat(pieces, dim=1), full, **TOL)


def _left_padded_batch(lengths: list[int], total: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), total, D, generator=g, dtype=torch.float64)
    mask = padding_mask(lengths, total, side="left")  # (B, T): pads first
    return x, mask


@pytest.mark.parametrize(("norm_first", "impl"), [(True, "manual"), (False, "manual"),
                                                  (True, "sdpa")])
def test_decoder_only_stack_with_cache_matches_full_pass_with_left_padding(norm_first, impl):
    torch.manual_seed(2)
    blocks = [TransformerBlock(D, H, norm_first=norm_first, impl=impl).double().eval()
              for _ in range(2)]
    pe = PositionalEncoding(D, context_length=32)
    x, mask = _left_padded_batch([6, 3, 1], 6, seed=3)
    positions = positions_from_attention_mask(mask)  # (B, T): 0 at each row's first real token

    def run(h, kpm, pos, caches=None):
        h = pe(h, pos)
        for i, block in enumerate(blocks):
            h = block(h, attention_mask=kpm, is_causal=True,
                      cache=None if caches is None else caches[i])
        return h

    full = run(x, mask, positions)  # (B, T, D)
    caches = [KVCache(), KVCache()]
    for t in range(6):
        step = run(x[:, t:t + 1], mask[:, :t + 1], positions[:, t:t + 1], caches)
        assert caches[0].length == t + 1
        real = mask[:, t]
        assert_close(step[real, 0], full[real, t], **TOL)  # padded query rows are never used
    # each left-padded row equals the same sequence run alone, without padding
    for row, n in enumerate([6, 3, 1]):
        alone = run(x[row:row + 1, 6 - n:], None, None)
        assert_close(full[row, 6 - n:], alone[0], **TOL)


def _model(norm_first: bool = True) -> EncoderDecoder:
    torch.manual_seed(4)
    config = EncoderDecoderConfig(src_vocab_size=9, tgt_vocab_size=10, d_model=D, n_heads=H,
                                  n_layers=2, norm_first=norm_first, context_length=32)
    return EncoderDecoder(config).double().eval()


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_decoder_incremental_decoding_matches_full_pass_every_step(norm_first):
    model = _model(norm_first)
    g = torch.Generator().manual_seed(5)
    src, src_mask = torch.randint(9, (3, 5), generator=g), padding_mask([5, 2, 4])
    tgt, tgt_mask = torch.randint(10, (3, 7), generator=g), padding_mask([7, 4, 2], side="left")
    memory = model.encoder(src, src_mask)
    full = model.decoder(tgt, memory, tgt_attention_mask=tgt_mask,
                         memory_attention_mask=src_mask)  # (B, T_t, V)
    caches = model.new_caches()
    for t in range(7):
        logits = model.decoder(tgt[:, t:t + 1], memory, tgt_attention_mask=tgt_mask[:, :t + 1],
                               memory_attention_mask=src_mask, caches=caches)  # (B, 1, V)
        real = tgt_mask[:, t]
        assert_close(logits[real, 0], full[real, t], **TOL)
    assert all(cache.length == 7 for cache in caches)


def _count_calls(modules) -> dict[str, int]:
    """Count the forward calls of ``modules`` (a forward hook on each)."""
    calls = {"n": 0}
    for module in modules:
        module.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    return calls


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_cross_attention_with_the_static_cache_matches_recomputing_the_memory(impl):
    torch.manual_seed(10)
    mha = MultiHeadAttention(D, H, impl=impl).double().eval()
    queries = torch.randn(3, 5, D, dtype=torch.float64)
    memory = torch.randn(3, 6, D, dtype=torch.float64)
    real = padding_mask([6, 2, 4])  # (B, T_s): source padding
    full = mha(queries, memory, memory, attention_mask=real)[0]  # (B, T_q, D)
    projections = _count_calls([mha.k_proj, mha.v_proj])
    cache = CrossKVCache()
    assert isinstance(cache, Cache)  # length and reset(), as generation needs of every cache
    for t in range(5):  # one query per decoding step, the same memory
        step = mha(queries[:, t:t + 1], memory, memory, attention_mask=real, cache=cache)[0]
        assert cache.length == 6 and cache.k.shape == (3, H, 6, D // H)
        assert_close(step[:, 0], full[:, t], **TOL)
    assert projections["n"] == 2  # k_proj and v_proj ran at the first step only
    # a filled cache is read, not the memory: the memory's values no longer matter
    again = mha(queries[:, :1], memory + 1.0, memory + 1.0, attention_mask=real, cache=cache)[0]
    assert torch.equal(again, mha(queries[:, :1], memory, memory, attention_mask=real,
                                  cache=cache)[0])
    cache.reset()
    assert cache.length == 0 and cache.k is None and cache.v is None


@pytest.mark.parametrize("norm_first", [True, False])
def test_the_static_cross_cache_projects_the_memory_once_and_changes_no_logit(norm_first):
    """Cached decoding with and without the cross-attention cache: the same logits, exactly
    as the full pass, with source and target padding; the memory projected once per layer."""
    model = _model(norm_first)
    g = torch.Generator().manual_seed(11)
    src, src_mask = torch.randint(9, (3, 5), generator=g), padding_mask([5, 2, 4])
    tgt, tgt_mask = torch.randint(10, (3, 7), generator=g), padding_mask([7, 4, 2], side="left")
    memory = model.encoder(src, src_mask)
    full = model.decoder(tgt, memory, tgt_attention_mask=tgt_mask,
                         memory_attention_mask=src_mask)  # (B, T_t, V)
    cross_layers = [block.cross_attn for block in model.decoder.blocks]
    projections = _count_calls([layer.k_proj for layer in cross_layers])
    caches, cross_caches = model.new_caches(), model.new_cross_caches()
    plain_caches = model.new_caches()  # the same decoding without the cross cache
    for t in range(7):
        kwargs = {"tgt_attention_mask": tgt_mask[:, :t + 1], "memory_attention_mask": src_mask}
        logits = model.decoder(tgt[:, t:t + 1], memory, caches=caches,
                               cross_caches=cross_caches, **kwargs)  # (B, 1, V)
        real = tgt_mask[:, t]
        assert_close(logits[real, 0], full[real, t], **TOL)
        if t == 0:
            assert projections["n"] == 2  # one projection of the memory per layer
        plain = model.decoder(tgt[:, t:t + 1], memory, caches=plain_caches, **kwargs)
        assert torch.equal(logits, plain)  # the cached keys are the very same numbers
    assert projections["n"] == 2 + 7 * 2  # the plain run projected it at all 7 steps
    assert all(c.length == 5 and c.k.shape == (3, H, 5, D // H) for c in cross_caches)


def test_greedy_decoding_projects_the_memory_once_per_layer_with_the_cache():
    model = _model(norm_first=False)
    g = torch.Generator().manual_seed(12)
    src, src_mask = torch.randint(9, (2, 6), generator=g), padding_mask([6, 3])
    prompt = torch.randint(10, (2, 1), generator=g)
    cross_layers = [block.cross_attn for block in model.decoder.blocks]
    projections = _count_calls([layer.v_proj for layer in cross_layers])
    cached = model.greedy_decode(src, prompt, 8, src_attention_mask=src_mask)
    assert projections["n"] == 2  # 8 steps, 2 layers: projected at the first step only
    projections["n"] = 0
    uncached = model.greedy_decode(src, prompt, 8, src_attention_mask=src_mask, use_cache=False)
    assert projections["n"] == 8 * 2 and torch.equal(cached, uncached)


def test_a_cross_cache_that_does_not_fit_is_refused_before_any_work():
    model = _model()
    memory = model.encoder(torch.zeros(2, 4, dtype=torch.long))
    tgt = torch.zeros(2, 1, dtype=torch.long)
    cross_caches = model.new_cross_caches()
    model.decoder(tgt, memory, cross_caches=cross_caches)
    with pytest.raises(ValueError, match=r"^cross_caches\[0\] holds the keys of T_s=4 memory "
                                         r"positions but the memory has 3; reset\(\) it"):
        model.decoder(tgt, memory[:, :3], cross_caches=cross_caches)
    with pytest.raises(ValueError, match=r"^cross_caches\[0\] holds \(B, H, head_dim\)"):
        model.decoder(tgt[:1], memory[:1], cross_caches=cross_caches)
    with pytest.raises(TypeError, match=r"^cross_caches\[1\] must be a CrossKVCache \(the "
                                        r"static cross-attention cache\), got KVCache"):
        model.decoder(tgt, memory, cross_caches=[CrossKVCache(), KVCache()])
    with pytest.raises(ValueError, match=r"^cross_caches must be a list of 2 CrossKVCache"):
        model.decoder(tgt, memory, cross_caches=cross_caches[:1])
    cross_caches[1].reset()
    with pytest.raises(ValueError, match=r"^the cross_caches of the layers hold different "
                                         r"lengths \[0, 4\]; create them together with "
                                         r"new_cross_caches\(\)"):
        model.decoder(tgt, memory, cross_caches=cross_caches)
    assert cross_caches[0].length == 4 and cross_caches[1].length == 0  # nothing was filled
    block = TransformerBlock(D, H, cross_attention=True)
    x = torch.randn(2, 1, D)
    with pytest.raises(ValueError, match=r"^cross_cache was given without memory"):
        TransformerBlock(D, H)(x, cross_cache=CrossKVCache())
    with pytest.raises(TypeError, match=r"^cross_cache must be a CrossKVCache"):
        block(x, memory=torch.randn(2, 3, D), cross_cache=KVCache())
    with pytest.raises(ValueError, match=r"^cache is a CrossKVCache, the memory's keys for "
                                         r"cross-attention: pass the memory as key and value"):
        MultiHeadAttention(D, H)(x, cache=CrossKVCache())
    fits = {"batch": 2, "heads": H, "head_dim": D // H, "dtype": torch.float32,
            "device": torch.device("cpu"), "memory_length": 3}
    filled = CrossKVCache()
    filled.update(torch.zeros(2, H, 3, D // H), torch.zeros(2, H, 3, D // H))
    assert check_cross_cache(filled, "cache", **fits) is filled
    with pytest.raises(TypeError, match=r"^cache holds torch.float32 keys but the layer makes "
                                        r"torch.float64 keys"):
        check_cross_cache(filled, "cache", **{**fits, "dtype": torch.float64})


def test_greedy_decoding_is_identical_with_and_without_the_cache():
    model = _model()
    g = torch.Generator().manual_seed(6)
    src, src_mask = torch.randint(9, (3, 6), generator=g), padding_mask([6, 3, 5])
    prompt = torch.randint(10, (3, 3), generator=g)
    prompt_mask = padding_mask([3, 1, 2], side="left")
    kwargs = {"src_attention_mask": src_mask, "prompt_attention_mask": prompt_mask}
    cached = model.greedy_decode(src, prompt, 8, use_cache=True, **kwargs)
    uncached = model.greedy_decode(src, prompt, 8, use_cache=False, **kwargs)
    assert cached.shape == (3, 11)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached[:, :3], prompt)
    # a left-padded row continues exactly as the same prompt alone would
    alone = model.greedy_decode(src[1:2, :3], prompt[1:2, 2:], 8)
    assert torch.equal(alone[0], cached[1, 2:])


def _greedy_by_hand(model: EncoderDecoder, memory: torch.Tensor,
                    memory_mask: torch.Tensor, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy decoding through the Decoder alone, the whole target at every step."""
    tokens = prompt
    for _ in range(n):
        logits = model.decoder(tokens, memory, memory_attention_mask=memory_mask)  # (B, T, V)
        tokens = torch.cat([tokens, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return tokens


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_memory_mask_reaches_cross_attention_and_never_the_encoder(use_cache):
    """``memory_attention_mask`` is cross-attention's mask; the encoder keeps the source mask."""
    model = _model()
    g = torch.Generator().manual_seed(13)
    src, src_mask = torch.randint(9, (4, 6), generator=g), padding_mask([6, 3, 5, 2])
    wrong = padding_mask([6, 4, 6, 3])  # one padded key more, except in the full row 0
    prompt = torch.randint(10, (4, 1), generator=g)
    memory = model.encoder(src, src_mask)  # (B, T_s, D) the true encoder output

    def decode(**masks):
        return model.greedy_decode(src, prompt, 8, use_cache=use_cache, **masks)

    default = decode(src_attention_mask=src_mask)  # cross-attention reads the source mask
    assert torch.equal(default, _greedy_by_hand(model, memory, src_mask, prompt, 8))
    assert torch.equal(decode(src_attention_mask=src_mask, memory_attention_mask=src_mask),
                       default)
    crossed = decode(src_attention_mask=src_mask, memory_attention_mask=wrong)
    assert torch.equal(crossed, _greedy_by_hand(model, memory, wrong, prompt, 8))
    both = decode(src_attention_mask=wrong)  # the wrong mask in the encoder too
    assert torch.equal(both, _greedy_by_hand(model, model.encoder(src, wrong), wrong, prompt, 8))
    assert not torch.equal(crossed, default) and not torch.equal(crossed, both)
    assert torch.equal(crossed[0], default[0])  # row 0's masks are equal
    unmasked = decode(memory_attention_mask=src_mask)  # no mask in the encoder
    assert torch.equal(unmasked, _greedy_by_hand(model, model.encoder(src), src_mask,
                                                 prompt, 8))


def test_kv_cache_grows_resets_and_rejects_mismatches():
    cache = KVCache()
    assert cache.length == 0
    k = torch.randn(2, H, 3, 4)
    all_k, all_v = cache.update(k, k + 1)
    assert cache.length == 3 and torch.equal(all_k, k) and torch.equal(all_v, k + 1)
    all_k, _ = cache.update(torch.randn(2, H, 1, 4), torch.randn(2, H, 1, 4))
    assert all_k.shape == (2, H, 4, 4) and torch.equal(all_k[:, :, :3], k)
    # update() runs in every layer at every step and checks nothing; check_cache is its door.
    fits = {"batch": 2, "heads": H, "head_dim": 4, "dtype": torch.float32,
            "device": torch.device("cpu")}
    assert check_cache(cache, "cache", **fits) is cache
    with pytest.raises(ValueError, match=r"^cache holds \(B, H, head_dim\)=\(2, 4, 4\) but the "
                                         r"new keys have \(3, 4, 4\)"):
        check_cache(cache, "cache", **{**fits, "batch": 3})
    with pytest.raises(TypeError, match=r"^cache must be a KVCache, got list"):
        check_cache([], "cache", **fits)
    cache.reset()
    assert cache.length == 0 and cache.k is None


def test_a_cache_used_with_a_mismatched_batch_or_mask_is_rejected():
    block = TransformerBlock(D, H)
    cache = KVCache()
    block(torch.randn(2, 3, D), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"^cache holds \(B, H, head_dim\)"):
        block(torch.randn(3, 1, D), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, T_k\) with T_k=4"):
        block(torch.randn(2, 1, D), is_causal=True, cache=cache,
              attention_mask=torch.ones(2, 1, dtype=torch.bool))  # covers only the new key
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        block(torch.randn(2, 1, D), cache=[])
    with pytest.raises(ValueError, match=r"^cache is a KVCache, which grows with "
                                         r"self-attention: pass key=value=None with it "
                                         r"\(cross-attention takes a CrossKVCache\)"):
        MultiHeadAttention(D, H)(torch.randn(2, 1, D), torch.randn(2, 3, D), torch.randn(2, 3, D),
                                 cache=KVCache())[0]


def test_decoder_rejects_bad_caches():
    model = _model()
    memory = model.encoder(torch.zeros(2, 3, dtype=torch.long))
    tgt = torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="caches must be a list of 2 KVCache"):
        model.decoder(tgt, memory, caches=[KVCache()])
    with pytest.raises(TypeError, match=r"^caches\[1\] must be a KVCache, got str"):
        model.decoder(tgt, memory, caches=[KVCache(), "cache"])
    caches = model.new_caches()
    model.decoder(torch.zeros(2, 2, dtype=torch.long), memory, caches=caches)
    with pytest.raises(ValueError, match=r"tgt_attention_mask must have shape \(B, T\)=\(2, 3\)"):
        model.decoder(tgt, memory, caches=caches, tgt_attention_mask=torch.ones(2, 1).bool())
    with pytest.raises(ValueError, match=r"^caches\[0\] holds \(B, H, head_dim\)"):
        model.decoder(torch.zeros(1, 1, dtype=torch.long), memory[:1], caches=caches)
    caches[0].reset()
    with pytest.raises(ValueError, match="different lengths"):
        model.decoder(tgt, memory, caches=caches)
    with pytest.raises(ValueError, match="memory must have width"):
        model.decoder(tgt, memory[:, :, :8])


def test_decode_step_seconds_returns_a_time_and_validates():
    model = EncoderDecoder(EncoderDecoderConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=8,
                                                n_heads=2, n_layers=1, context_length=16))
    for use_cache in (True, False):
        seconds = decode_step_seconds(model, 4, use_cache=use_cache, src_len=3, repeats=2)
        assert isinstance(seconds, float) and math.isfinite(seconds) and seconds > 0
    with pytest.raises(ValueError, match="context_length=16"):
        decode_step_seconds(model, 16, use_cache=True)
    with pytest.raises(TypeError, match="use_cache must be a bool"):
        decode_step_seconds(model, 4, use_cache="yes")
    with pytest.raises(TypeError, match="model must be an EncoderDecoder"):
        decode_step_seconds(TransformerBlock(8, 2), 4, use_cache=True)
    with pytest.raises(TypeError, match="use_cache must be a bool"):
        model.greedy_decode(torch.zeros(1, 2, dtype=torch.long),
                            torch.zeros(1, 1, dtype=torch.long), 2, use_cache=1)


def test_cross_cache_step_ms_returns_both_curves_for_the_chapter():
    model = EncoderDecoder(EncoderDecoderConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=8,
                                                n_heads=2, n_layers=1, context_length=16))
    for cross_cache in (True, False):
        seconds = decode_step_seconds(model, 4, use_cache=True, src_len=6, repeats=2,
                                      cross_cache=cross_cache)
        assert isinstance(seconds, float) and math.isfinite(seconds) and seconds > 0
    curves = cross_cache_step_ms(model, [2, 16], prefix_len=3, repeats=2)
    assert list(curves) == ["static cross-attention cache", "memory projected at every step"]
    for ms in curves.values():
        assert len(ms) == 2 and all(isinstance(t, float) and math.isfinite(t) and t > 0
                                    for t in ms)
    with pytest.raises(ValueError, match=r"^src_lengths must not exceed context_length=16, "
                                         r"got 17"):
        cross_cache_step_ms(model, [4, 17])
    with pytest.raises(TypeError, match=r"^src_lengths must be a non-empty sequence"):
        cross_cache_step_ms(model, [])
    with pytest.raises(TypeError, match=r"^cross_cache must be a bool"):
        decode_step_seconds(model, 4, use_cache=True, cross_cache="no")


# --------------------------- issue 18: dtype and device of a cache, right-padded prompts


def test_kv_cache_refuses_new_keys_of_another_dtype_or_device_instead_of_promoting():
    mha = MultiHeadAttention(D, H)
    cache = KVCache()
    mha(torch.randn(1, 2, D), is_causal=True, cache=cache)
    with pytest.raises(TypeError, match=r"^cache holds torch.float32 keys but the layer makes "
                                        r"torch.float64 keys"):
        mha.double()(torch.randn(1, 1, D, dtype=torch.float64), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"^cache holds keys on cpu but the layer runs on meta"):
        mha.float().to("meta")(torch.randn(1, 1, D, device="meta"), is_causal=True, cache=cache)
    assert cache.length == 2 and cache.k.dtype == torch.float32  # nothing was appended


def test_a_layer_converted_mid_decoding_is_told_to_reset_its_cache():
    mha = MultiHeadAttention(D, H)
    cache = KVCache()
    mha(torch.randn(2, 3, D), is_causal=True, cache=cache)[0]
    mha.double()
    with pytest.raises(TypeError, match=r"^cache holds torch.float32 keys.*reset\(\)"):
        mha(torch.randn(2, 1, D, dtype=torch.float64), is_causal=True, cache=cache)[0]
    with pytest.raises(TypeError, match=r"^need_weights must be a bool"):
        mha(torch.randn(2, 1, D, dtype=torch.float64), cache=cache, need_weights="yes")[0]
    assert cache.length == 3  # a refused call leaves the cache as it was


def test_greedy_decode_refuses_a_right_padded_prompt_as_generate_does():
    model = _model()
    src = torch.zeros(2, 3, dtype=torch.long)
    prompt = torch.ones(2, 3, dtype=torch.long)
    right = padding_mask([3, 2], 3)  # row 1: real, real, pad
    with pytest.raises(ValueError, match=r"^prompt_attention_mask must describe left padding"):
        model.greedy_decode(src, prompt, 2, prompt_attention_mask=right)
    with pytest.raises(ValueError, match=r"^prompt_attention_mask has a row without any real"):
        model.greedy_decode(src, prompt, 2, prompt_attention_mask=padding_mask([3, 0], 3))
    left = padding_mask([3, 2], 3, side="left")
    assert model.greedy_decode(src, prompt, 2, prompt_attention_mask=left).shape == (2, 5)
    assert torch.equal(model.greedy_decode(src, prompt, 0), prompt)  # 0 new tokens, as generate
