"""Every public name of the modern-attention modules, given a wrong type and a wrong value.

Issue 14's modules (``rope``, ``alibi``, ``gqa``, ``kv_memory``, ``sliding_window``,
``latent``, ``linear_attention``) and issue 43's ``mask_mods`` follow the course's
promise: a ``TypeError`` for a wrong type, a ``ValueError`` for a wrong value, each naming
the argument.
A public callable without an entry here fails ``test_the_sweep_covers_every_public_callable``.
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from course_attn.modern import alibi, gqa, kv_memory, latent, mask_mods, rope, sliding_window

# course_attn.linear_attention is the function (as course_attn.attention is): get the module.
linear_attention = importlib.import_module("course_attn.modern.linear_attention")

MODULES = (rope, alibi, gqa, kv_memory, sliding_window, latent, linear_attention, mask_mods)
NOT_CALLED = {"KV_CACHE_KINDS", "BlockTiles"}
# Building blocks a model calls once per forward, after its own door checked everything:
# they check nothing (``apply_rope`` is the checked way to rotate, swept above).
BUILDING_BLOCKS = {"rope_cos_sin", "apply_rotary", "rope_rotation"}
Q = torch.randn(2, 4, 5, 8)  # (B, H, T, head_dim)
KV = torch.randn(2, 2, 5, 8)  # (B, n_kv_heads, T, head_dim)
POS = torch.arange(5)
SLOPES = alibi.alibi_slopes(4)
MLA = latent.MultiHeadLatentAttention(16, 4, 6)
X16 = torch.randn(2, 5, 16)
MEM = {"n_layers": 1, "context_length": 4, "n_heads": 8, "head_dim": 4}
BLOCK_MASK = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 8, 8, device="cpu")


def _rolling() -> sliding_window.RollingKVCache:
    cache = sliding_window.RollingKVCache(3)
    cache.update(KV, KV)
    return cache


def _latent_cache() -> latent.LatentKVCache:
    cache = latent.LatentKVCache()
    cache.update(torch.randn(2, 3, 6))
    return cache


# name: (wrong-type call, argument it names, wrong-value call or None, argument it names)
CASES = {
    "sinusoid_angles": (lambda: rope.sinusoid_angles(POS, 8, dtype=torch.long), "dtype",
                        lambda: rope.sinusoid_angles(POS, 0), "dim"),
    "apply_rope": (lambda: rope.apply_rope(Q, POS.double()), "positions",
                   lambda: rope.apply_rope(Q[..., :7], POS), "head_dim"),
    "alibi_slopes": (lambda: alibi.alibi_slopes("8"), "n_heads",
                     lambda: alibi.alibi_slopes(-2), "n_heads"),
    "alibi_bias": (lambda: alibi.alibi_bias(2, 3, [0.5]), "slopes",
                   lambda: alibi.alibi_bias(0, 3, SLOPES), "t_q"),
    "alibi_attention": (lambda: alibi.alibi_attention(Q, Q, Q, SLOPES, is_causal="yes"),
                        "is_causal",
                        lambda: alibi.alibi_attention(Q, Q, Q, SLOPES[:3]), "slopes"),
    "check_kv_heads": (lambda: gqa.check_kv_heads(8, "2"), "n_kv_heads",
                       lambda: gqa.check_kv_heads(8, 3), "n_kv_heads"),
    "repeat_kv": (lambda: gqa.repeat_kv(KV, None), "n_rep",
                  lambda: gqa.repeat_kv(KV, 0), "n_rep"),
    "grouped_query_attention": (lambda: gqa.grouped_query_attention(Q, KV.long(), KV), "k",
                                lambda: gqa.grouped_query_attention(Q, Q[:, :3], Q[:, :3]),
                                "n_kv_heads"),
    "kv_cache_bytes": (lambda: kv_memory.kv_cache_bytes("mha", **{**MEM, "n_layers": 1.0}),
                       "n_layers",
                       lambda: kv_memory.kv_cache_bytes("gqa", n_kv_heads=3, **MEM),
                       "n_kv_heads"),
    "sliding_window_mask": (lambda: sliding_window.sliding_window_mask(4, window="2"), "window",
                            lambda: sliding_window.sliding_window_mask(4, window=0), "window"),
    "sliding_window_attention": (
        lambda: sliding_window.sliding_window_attention(Q, Q, Q, torch.ones(5, 5), window=2),
        "mask",
        lambda: sliding_window.sliding_window_attention(Q, Q, Q, window=0), "window"),
    "RollingKVCache": (lambda: sliding_window.RollingKVCache(2.0), "window",
                       lambda: sliding_window.RollingKVCache(0), "window"),
    "RollingKVCache.update": (lambda: _rolling().update(KV.double(), KV.double()), "k",
                              lambda: _rolling().update(KV[:1], KV[:1]), "(B, H, d_k, d_v)"),
    "LatentKVCache.update": (lambda: _latent_cache().update(None), "c",
                             lambda: _latent_cache().update(torch.randn(2, 3)), "c"),
    "MultiHeadLatentAttention": (
        lambda: latent.MultiHeadLatentAttention(16, 4, 6, bias="no"), "bias",
        lambda: latent.MultiHeadLatentAttention(16, 4, 6, d_rope=5), "d_rope"),
    "MultiHeadLatentAttention.forward": (lambda: MLA(X16, cache=[]), "cache",
                                         lambda: MLA(X16[..., :8]), "d_model"),
    "elu_feature_map": (lambda: linear_attention.elu_feature_map([1.0]), "x", None, ""),
    "linear_attention": (lambda: linear_attention.linear_attention(Q, Q, Q, feature_map=1),
                         "feature_map",
                         lambda: linear_attention.linear_attention(Q, Q, Q, eps=-1.0), "eps"),
    "sliding_window_mask_mod": (lambda: mask_mods.sliding_window_mask_mod(2.5), "window",
                                lambda: mask_mods.sliding_window_mask_mod(4, offset=-1),
                                "offset"),
    "padding_mask_mod": (lambda: mask_mods.padding_mask_mod(torch.ones(2, 3)), "attention_mask",
                         lambda: mask_mods.padding_mask_mod(torch.ones(3, dtype=torch.bool)),
                         "attention_mask"),
    "document_mask_mod": (lambda: mask_mods.document_mask_mod([[0, 1]]), "doc_ids",
                          lambda: mask_mods.document_mask_mod(torch.tensor([[1, 0]])),
                          "doc_ids"),
    "alibi_score_mod": (lambda: mask_mods.alibi_score_mod([0.5]), "slopes",
                        lambda: mask_mods.alibi_score_mod(SLOPES, offset=-2), "offset"),
    "block_mask_grid": (lambda: mask_mods.block_mask_grid(SLOPES), "block_mask",
                        lambda: mask_mods.block_mask_grid(BLOCK_MASK, head=1), "head"),
    "block_mask_tiles": (lambda: mask_mods.block_mask_tiles(SLOPES), "block_mask",
                         lambda: mask_mods.block_mask_tiles(BLOCK_MASK, batch=2), "batch"),
    "linear_attention_recurrent": (
        lambda: linear_attention.linear_attention_recurrent(Q, Q, Q, state=[]), "state",
        lambda: linear_attention.linear_attention_recurrent(
            Q, Q, Q, attention_mask=torch.ones(2, 4, dtype=torch.bool)), "attention_mask"),
}

#: Callables with no wrong *value* to give, and why.
NO_WRONG_VALUE = {"elu_feature_map": "any floating tensor of any shape is a valid input"}


def public_callables() -> set[str]:
    """Every callable in the modules' ``__all__`` that takes arguments, and such methods."""
    names = set()
    for module in MODULES:
        for name in module.__all__:
            value = getattr(module, name)
            if name in NOT_CALLED:  # a constant, or a record (a NamedTuple, no checks)
                assert not callable(value) or issubclass(value, tuple), name
                continue
            if name in BUILDING_BLOCKS:
                assert "without checks" in value.__doc__, name
                continue
            if not inspect.isclass(value):
                names.add(name)
                continue
            if len(inspect.signature(value.__init__).parameters) > 1:
                names.add(name)
            for attr, member in vars(value).items():
                if (attr.startswith("_") and attr != "forward") or not inspect.isfunction(member):
                    continue
                if len(inspect.signature(member).parameters) > 1:
                    names.add(f"{name}.{attr}")
    return names


def test_the_sweep_covers_every_public_callable():
    found = public_callables()
    assert {"apply_rope", "RollingKVCache.update", "MultiHeadLatentAttention.forward"} <= found
    assert found == set(CASES), (f"missing: {sorted(found - set(CASES))}, "
                                 f"stale: {sorted(set(CASES) - found)}")
    assert {name for name, case in CASES.items() if case[2] is None} == set(NO_WRONG_VALUE)


def _names(argument: str, message: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(argument)}(?!\w)", message) is not None


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_wrong_type_is_a_type_error_that_names_the_argument(name):
    call, argument, _, _ = CASES[name]
    with pytest.raises(TypeError) as info:
        call()
    assert _names(argument, str(info.value)), str(info.value)


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case[2]))
def test_a_wrong_value_is_a_value_error_that_names_the_argument(name):
    _, _, call, argument = CASES[name]
    with pytest.raises(ValueError) as info:
        call()
    assert not isinstance(info.value, TypeError)
    assert _names(argument, str(info.value)) or argument in str(info.value), str(info.value)
