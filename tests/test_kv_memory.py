"""kv_cache_bytes: each formula against the bytes the package's real caches hold."""

from __future__ import annotations

import pytest
import torch

from course_attn.core.layers import KVCache
from course_attn.modern.kv_memory import KV_CACHE_KINDS, kv_cache_bytes
from course_attn.modern.latent import LatentKVCache, MultiHeadLatentAttention
from course_attn.modern.linear_attention import LinearAttentionState, linear_attention_recurrent
from course_attn.modern.sliding_window import RollingKVCache

B, T, H, HD, N_LAYERS = 2, 11, 4, 8, 3


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def filled_kv_cache(n_kv_heads, dtype=torch.float32, cache=None, steps=T):
    cache = KVCache() if cache is None else cache
    for _ in range(steps):
        step = torch.zeros(B, n_kv_heads, 1, HD, dtype=dtype)
        cache.update(step, step)
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind, n_kv_heads", [("mha", H), ("gqa", 2), ("mqa", 1)])
def test_kv_formulas_equal_the_bytes_of_real_caches(kind, n_kv_heads, dtype):
    layers = [filled_kv_cache(n_kv_heads, dtype) for _ in range(N_LAYERS)]
    measured = sum(nbytes(c.k, c.v) for c in layers)
    extra = {"n_kv_heads": n_kv_heads} if kind == "gqa" else {}
    assert kv_cache_bytes(kind, n_layers=N_LAYERS, context_length=T, n_heads=H, head_dim=HD,
                          batch_size=B, dtype=dtype, **extra) == measured


def test_encoder_decoder_formula_adds_the_memory_of_the_cross_attention_cache():
    """Chapter 8's 2 L B (T + T_s) D: the self-attention caches and the static cross caches."""
    from course_attn import EncoderDecoder, EncoderDecoderConfig

    t_s, d_model = 7, H * HD
    model = EncoderDecoder(EncoderDecoderConfig(src_vocab_size=5, tgt_vocab_size=5,
                                                d_model=d_model, n_heads=H,
                                                n_layers=N_LAYERS)).eval()
    memory = model.encoder(torch.zeros(B, t_s, dtype=torch.long))
    caches, cross_caches = model.new_caches(), model.new_cross_caches()
    with torch.no_grad():
        for _ in range(T):  # T decoding steps of one token each
            model.decoder(torch.zeros(B, 1, dtype=torch.long), memory, caches=caches,
                          cross_caches=cross_caches)
    self_bytes = sum(nbytes(c.k, c.v) for c in caches)
    cross_bytes = sum(nbytes(c.k, c.v) for c in cross_caches)
    sizes = {"n_layers": N_LAYERS, "context_length": T, "n_heads": H, "head_dim": HD,
             "batch_size": B}
    assert kv_cache_bytes("mha", **sizes) == self_bytes
    assert kv_cache_bytes("mha", memory_length=t_s, **sizes) == self_bytes + cross_bytes
    assert self_bytes + cross_bytes == 2 * N_LAYERS * B * (T + t_s) * d_model * 4  # float32
    with pytest.raises(ValueError, match=r"^memory_length is the source length.*must be 0 "
                                         r"for kind='linear', got 3"):
        kv_cache_bytes("linear", memory_length=3, **sizes)
    with pytest.raises(TypeError, match=r"^memory_length must be"):
        kv_cache_bytes("mha", memory_length=3.0, **sizes)


@pytest.mark.parametrize("window", [1, 4, 11, 50])
def test_window_formula_equals_the_bytes_of_a_rolling_cache(window):
    cache = filled_kv_cache(2, cache=RollingKVCache(window))
    assert kv_cache_bytes("gqa", n_layers=1, context_length=T, n_heads=H, head_dim=HD, n_kv_heads=2,
                          batch_size=B, window=window) == nbytes(cache.k, cache.v)


@pytest.mark.parametrize("d_rope", [0, 4])
def test_mla_formula_equals_the_bytes_of_its_latent_cache(d_rope):
    layer = MultiHeadLatentAttention(32, H, 6, d_rope=d_rope).eval()
    cache = LatentKVCache()
    layer(torch.randn(B, T, 32), is_causal=True, cache=cache)
    assert kv_cache_bytes("mla", n_layers=1, context_length=T, n_heads=H, head_dim=8, d_latent=6,
                          d_rope=d_rope, batch_size=B) == nbytes(cache.c, cache.k_rope)


@pytest.mark.parametrize("context_length", [1, 50])
def test_linear_formula_equals_the_bytes_of_the_state_whatever_the_length(context_length):
    state = LinearAttentionState()
    x = torch.randn(B, H, context_length, HD)
    linear_attention_recurrent(x, x, x, state)
    assert kv_cache_bytes("linear", n_layers=1, context_length=context_length, n_heads=H,
                          head_dim=HD,
                          batch_size=B) == nbytes(state.S, state.z)


def test_published_sizes_per_token():
    """Llama 2 7B (MHA) 0.5 MiB, Llama 2 70B (GQA, 8 KV heads) 320 KiB, DeepSeek-V2 (MLA)."""
    fp16 = {"context_length": 1, "dtype": torch.float16}
    assert kv_cache_bytes("mha", n_layers=32, n_heads=32, head_dim=128, **fp16) == 512 * 1024
    assert kv_cache_bytes("gqa", n_layers=80, n_heads=64, head_dim=128, n_kv_heads=8,
                          **fp16) == 320 * 1024
    # DeepSeek-V2: d_c = 4 d_h = 512 and d_R = d_h / 2 = 64, so 4.5 d_h elements per layer
    mla = kv_cache_bytes("mla", n_layers=60, n_heads=128, head_dim=128, d_latent=512, d_rope=64,
                         **fp16)
    assert mla == 60 * int(4.5 * 128) * 2
    mha = kv_cache_bytes("mha", n_layers=60, n_heads=128, head_dim=128, **fp16)
    assert mha / mla == pytest.approx(56.9, abs=0.05)  # the paper's "93.3% smaller" is vs V1


def test_kinds_order_mha_gqa_mqa():
    sizes = [kv_cache_bytes(kind, n_layers=2, context_length=100, n_heads=8, head_dim=16,
                            **({"n_kv_heads": 2} if kind == "gqa" else {}))
             for kind in ("mha", "gqa", "mqa")]
    assert sizes[0] == 4 * sizes[1] == 8 * sizes[2]
    assert set(KV_CACHE_KINDS) == {"mha", "gqa", "mqa", "mla", "linear"}


def test_bad_inputs_are_refused_naming_the_argument():
    base = {"n_layers": 1, "context_length": 4, "n_heads": 8, "head_dim": 4}
    with pytest.raises(ValueError, match="kind must be one of"):
        kv_cache_bytes("flash", **base)
    with pytest.raises(TypeError, match="kind must be one of"):
        kv_cache_bytes(None, **base)
    with pytest.raises(ValueError, match="n_kv_heads=3 must divide n_heads=8"):
        kv_cache_bytes("gqa", n_kv_heads=3, **base)
    with pytest.raises(ValueError, match="n_kv_heads must be given for kind='gqa'"):
        kv_cache_bytes("gqa", **base)
    with pytest.raises(ValueError, match="n_kv_heads must be given for kind='gqa' and only"):
        kv_cache_bytes("mha", n_kv_heads=2, **base)
    with pytest.raises(ValueError, match="d_latent must be given for kind='mla'"):
        kv_cache_bytes("mla", **base)
    with pytest.raises(ValueError, match="d_rope"):
        kv_cache_bytes("mha", d_rope=4, **base)
    with pytest.raises(ValueError, match="window must be a positive int"):
        kv_cache_bytes("mha", window=0, **base)
    with pytest.raises(ValueError, match="window must be None for kind='linear'"):
        kv_cache_bytes("linear", window=4, **base)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        kv_cache_bytes("mha", dtype="float32", **base)
    with pytest.raises(ValueError, match="context_length must be an int >= 0"):
        kv_cache_bytes("mha", **{**base, "context_length": -1})
