"""Every public function, constructor and forward of the model side, given bad arguments.

Issue 18's sweep: each public callable of ``attention``, ``masks``, ``layers``,
``model``, ``encoder_decoder``, ``env``, ``softmax``, ``self_attention`` and
``viz`` gets at least one argument of the wrong *type* and one of the wrong
*value*, and must answer with a ``TypeError`` / ``ValueError`` whose message
names that argument (never a raw torch error, an ``AttributeError`` or a NaN).
``test_every_public_callable_is_swept`` keeps the table complete: a new public
function or method without both kinds of case fails it. (The trainer, data and
task functions are swept in their own test files.)
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import NamedTuple

import matplotlib
import pytest
import torch

import course_attn
from course_attn import (
    CrossKVCache,
    Decoder,
    Encoder,
    EncoderDecoder,
    EncoderDecoderConfig,
    FeedForward,
    GPTConfig,
    KVCache,
    MiniGPT,
    MultiHeadAttention,
    PositionalEncoding,
    SelfAttention,
    SoftmaxState,
    TransformerBlock,
    attention,
    attention_pool,
    block_gradient_norms,
    block_grid,
    causal_mask,
    causal_mask_mod,
    combine_masks,
    cross_cache_step_ms,
    decode_step_seconds,
    document_mask,
    document_positions,
    flex_attend,
    masked_attention_seconds,
    merge_heads,
    merge_softmax_states,
    new_caches,
    online_softmax,
    padding_mask,
    pick_device,
    positions_from_attention_mask,
    residual_stream_rms,
    scaled_dot_product_attention,
    seed_everything,
    simple_self_attention,
    sinusoidal_table,
    softmax,
    split_heads,
    stream_gradient_norm,
    tensor_mask_mod,
    tensor_score_mod,
    tiled_attention,
    to_additive_mask,
    to_torch_mha_mask,
    viz,
)

matplotlib.use("Agg")

SWEPT_MODULES = {f"course_attn.{m}" for m in (
    "core.attention", "core.masks", "core.layers", "core.kv_cache", "core.softmax",
    "core.self_attention", "core.tiled", "models.gpt", "models.encoder_decoder",
    "models.decoding", "env", "lab.viz", "lab.experiments", "core.flex_attention")}
# analysis: swept in test_train_api_errors; measure: in test_measure

# Targets that cannot take one of the two kinds of bad argument, and why.
EXEMPT = {
    ("MiniGPT", ValueError): "its one argument is a GPTConfig, whose values GPTConfig checks",
    ("Encoder", ValueError): "its one argument is an EncoderDecoderConfig (checked there)",
    ("Decoder", ValueError): "its one argument is an EncoderDecoderConfig (checked there)",
    ("EncoderDecoder", ValueError): "its one argument is an EncoderDecoderConfig (checked there)",
    ("MiniGPT.num_parameters", ValueError): "its one argument is a flag: no wrong value",
    # A building block that runs in every attention layer at every decoding step: the
    # layer's or the model's door checks the cache once (check_cache), before any work.
    ("KVCache.update", TypeError): "checked by its owner's door (tests/test_kv_cache.py)",
    ("KVCache.update", ValueError): "checked by its owner's door (tests/test_kv_cache.py)",
    ("CrossKVCache.update", TypeError): "checked by its owner's door (tests/test_kv_cache.py)",
    ("CrossKVCache.update", ValueError): "checked by its owner's door (tests/test_kv_cache.py)",
    ("causal_mask_mod", ValueError): "every int is an offset (negative: T_q > T_k)",
    ("FlexFallbackWarning", TypeError): "a warning class: raised by the package, not called",
    ("FlexFallbackWarning", ValueError): "a warning class: raised by the package, not called",
    ("Cache", TypeError): "a typing.Protocol: never instantiated",
    ("viz.raise_small_text", ValueError): "its one argument is a figure: any figure is valid",
    ("Cache", ValueError): "a typing.Protocol: never instantiated",
}


class Case(NamedTuple):
    target: str  # "function", "Class" (constructor) or "Class.method"
    arg: str  # the argument the message must name
    error: type[Exception]
    call: Callable[[], object]


def _long(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.long)


def _bool(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, dtype=torch.bool)


torch.manual_seed(0)
V = 7
GPT = MiniGPT(GPTConfig(vocab_size=V, context_length=8, n_layers=1, n_heads=2, d_model=8)).eval()
ED_CONFIG = EncoderDecoderConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=8, n_heads=2,
                                 n_layers=1)
ED = EncoderDecoder(ED_CONFIG).eval()
MHA = MultiHeadAttention(8, 2)
FF = FeedForward(8)
PE = PositionalEncoding(8, context_length=16)
BLOCK = TransformerBlock(8, 2)
CROSS_BLOCK = TransformerBlock(8, 2, cross_attention=True)
SA = SelfAttention(4, 4)
Q = torch.randn(2, 3, 4)
X8 = torch.randn(2, 3, 8)
MEMORY = torch.randn(2, 5, 8)
IDX = _long(2, 3)
W2 = torch.rand(3, 3)  # a (T_q, T_k) matrix of weights
RIGHT_PADDED = torch.tensor([[True, True, True], [True, True, False]])


CASES: list[Case] = []


def case(target: str, arg: str, error: type[Exception], call: Callable[[], object]) -> None:
    CASES.append(Case(target, arg, error, call))


# ------------------------------------------------------------------ attention
for fn in ("attention", "scaled_dot_product_attention"):
    f = attention if fn == "attention" else scaled_dot_product_attention
    case(fn, "q", TypeError, lambda f=f: f([[1.0]], Q, Q))
    case(fn, "k", TypeError, lambda f=f: f(Q, Q.long(), Q))
    case(fn, "v", TypeError, lambda f=f: f(Q, Q, None))
    case(fn, "q", ValueError, lambda f=f: f(torch.ones(2, 3, 0), torch.ones(2, 3, 0), Q))
    case(fn, "k", ValueError, lambda f=f: f(Q, torch.ones(2, 3, 5), Q))
    case(fn, "mask", TypeError, lambda f=f: f(Q, Q, Q, torch.ones(3, 3)))
    case(fn, "mask", ValueError, lambda f=f: f(Q, Q, Q, _bool(4, 4)))
    case(fn, "is_causal", TypeError, lambda f=f: f(Q, Q, Q, is_causal="yes"))
    case(fn, "scale", TypeError, lambda f=f: f(Q, Q, Q, scale="1"))
    case(fn, "scale", ValueError, lambda f=f: f(Q, Q, Q, scale=-1.0))
    case(fn, "dropout_p", TypeError, lambda f=f: f(Q, Q, Q, dropout_p="0.1"))
    case(fn, "dropout_p", ValueError, lambda f=f: f(Q, Q, Q, dropout_p=1.5))
    case(fn, "bias", TypeError, lambda f=f: f(Q, Q, Q, bias=_bool(3, 3)))
    case(fn, "bias", TypeError, lambda f=f: f(Q, Q, Q, bias=[[0.0]]))
    case(fn, "bias", ValueError, lambda f=f: f(Q, Q, Q, bias=torch.zeros(3, 4)))
    case(fn, "bias", ValueError, lambda f=f: f(Q, Q, Q, bias=torch.zeros(5, 2, 3, 3)))
case("attention", "impl", ValueError, lambda: attention(Q, Q, Q, impl="flash"))
case("attention", "impl", TypeError, lambda: attention(Q, Q, Q, impl=None))

# ---------------------------------------------------------------------- masks
case("causal_mask", "t_q", TypeError, lambda: causal_mask("3"))
case("causal_mask", "t_q", ValueError, lambda: causal_mask(0))
case("causal_mask", "t_k", ValueError, lambda: causal_mask(3, -1))
case("causal_mask", "device", ValueError, lambda: causal_mask(3, device="gpu"))
case("causal_mask", "device", TypeError, lambda: causal_mask(3, device=2.0))
case("padding_mask", "lengths", TypeError, lambda: padding_mask(None))
case("padding_mask", "lengths", TypeError, lambda: padding_mask(torch.tensor([1.5])))
case("padding_mask", "lengths", ValueError, lambda: padding_mask([3, -1]))
case("padding_mask", "lengths", ValueError, lambda: padding_mask([]))
case("padding_mask", "max_len", TypeError, lambda: padding_mask([2], "4"))
case("padding_mask", "max_len", ValueError, lambda: padding_mask([2], 0))
case("padding_mask", "side", TypeError, lambda: padding_mask([2], side=1))
case("padding_mask", "side", ValueError, lambda: padding_mask([2], side="up"))
case("padding_mask", "device", ValueError, lambda: padding_mask([2], device="gpu"))
case("to_torch_mha_mask", "mask", TypeError, lambda: to_torch_mha_mask(torch.ones(2, 2)))
case("to_torch_mha_mask", "mask", ValueError, lambda: to_torch_mha_mask(_bool(1, 1, 2, 2)))
case("to_additive_mask", "mask", TypeError, lambda: to_additive_mask([[True]]))
case("to_additive_mask", "mask", ValueError, lambda: to_additive_mask(torch.tensor(True)))
case("to_additive_mask", "dtype", TypeError, lambda: to_additive_mask(_bool(2), "float32"))
FLEX_Q = torch.randn(1, 2, 4, 8)
case("flex_attend", "q", TypeError, lambda: flex_attend(FLEX_Q.long(), FLEX_Q, FLEX_Q))
case("flex_attend", "q", ValueError, lambda: flex_attend(FLEX_Q[0], FLEX_Q[0], FLEX_Q[0]))
case("causal_mask_mod", "offset", TypeError, lambda: causal_mask_mod(1.5))
case("tensor_mask_mod", "mask", TypeError, lambda: tensor_mask_mod(torch.ones(1, 1, 2, 2)))
case("tensor_mask_mod", "mask", ValueError, lambda: tensor_mask_mod(_bool(2, 2)))
case("tensor_score_mod", "bias", TypeError, lambda: tensor_score_mod(_bool(1, 1, 2, 2)))
case("tensor_score_mod", "bias", ValueError, lambda: tensor_score_mod(torch.zeros(2, 2)))
case("document_mask", "doc_ids", TypeError, lambda: document_mask(torch.zeros(2, 3)))
case("document_mask", "doc_ids", ValueError, lambda: document_mask(torch.tensor([[1, 0]])))
case("document_positions", "doc_ids", TypeError, lambda: document_positions([0, 0, 1]))
case("document_positions", "doc_ids", ValueError, lambda: document_positions(_long(1, 2, 3)))
case("combine_masks", "t_q", TypeError, lambda: combine_masks(3.0, 3))
case("combine_masks", "t_q", ValueError, lambda: combine_masks(0, 4))
case("combine_masks", "t_k", ValueError, lambda: combine_masks(4, 0))
case("combine_masks", "mask", TypeError, lambda: combine_masks(3, 3, mask=[[True]]))
case("combine_masks", "mask", ValueError,
     lambda: combine_masks(3, 3, mask=_bool(2, 3, 3), attention_mask=_bool(3, 3)))
case("combine_masks", "attention_mask", ValueError,
     lambda: combine_masks(3, 3, attention_mask=_bool(2, 4)))
case("combine_masks", "attention_mask", TypeError,
     lambda: combine_masks(3, 3, attention_mask=torch.ones(2, 3)))
case("combine_masks", "is_causal", TypeError, lambda: combine_masks(3, 3, is_causal=1))
case("combine_masks", "device", ValueError, lambda: combine_masks(3, 3, device="gpu"))

# --------------------------------------------------------------------- layers
case("split_heads", "x", TypeError, lambda: split_heads([[1.0]], 2))
case("split_heads", "x", ValueError, lambda: split_heads(torch.ones(2, 4), 2))
case("split_heads", "n_heads", TypeError, lambda: split_heads(X8, "2"))
case("split_heads", "n_heads", ValueError, lambda: split_heads(X8, 3))
case("merge_heads", "x", TypeError, lambda: merge_heads(None))
case("merge_heads", "x", ValueError, lambda: merge_heads(X8))
case("sinusoidal_table", "context_length", TypeError, lambda: sinusoidal_table(4.0, 8))
case("sinusoidal_table", "d_model", ValueError, lambda: sinusoidal_table(4, 0))
K4 = torch.randn(2, 2, 3, 4)
case("new_caches", "n_layers", TypeError, lambda: new_caches(2.0))
case("new_caches", "n_layers", ValueError, lambda: new_caches(0))
case("MultiHeadAttention", "d_model", TypeError, lambda: MultiHeadAttention("8", 2))
case("MultiHeadAttention", "n_heads", ValueError, lambda: MultiHeadAttention(8, 3))
case("MultiHeadAttention", "bias", TypeError, lambda: MultiHeadAttention(8, 2, bias="no"))
case("MultiHeadAttention", "dropout", ValueError, lambda: MultiHeadAttention(8, 2, dropout=1.0))
case("MultiHeadAttention", "impl", ValueError, lambda: MultiHeadAttention(8, 2, impl="fast"))
case("MultiHeadAttention", "impl", TypeError, lambda: MultiHeadAttention(8, 2, impl=1))
case("MultiHeadAttention", "n_kv_heads", ValueError,
     lambda: MultiHeadAttention(8, 4, n_kv_heads=3))
case("MultiHeadAttention", "n_kv_heads", TypeError,
     lambda: MultiHeadAttention(8, 2, n_kv_heads=1.0))
case("MultiHeadAttention.forward", "query", TypeError, lambda: MHA(X8.tolist()))
case("MultiHeadAttention.forward", "query", TypeError, lambda: MHA(X8.double()))
case("MultiHeadAttention.forward", "query", ValueError, lambda: MHA(Q))
case("MultiHeadAttention.forward", "query", ValueError, lambda: MHA(torch.ones(2, 0, 8)))
case("MultiHeadAttention.forward", "key", ValueError, lambda: MHA(X8, MEMORY[:1], MEMORY[:1]))
case("MultiHeadAttention.forward", "value", TypeError, lambda: MHA(X8, MEMORY, "v"))
case("MultiHeadAttention.forward", "attention_mask", TypeError,
     lambda: MHA(X8, attention_mask=torch.ones(2, 3)))
case("MultiHeadAttention.forward", "attention_mask", ValueError,
     lambda: MHA(X8, attention_mask=_bool(2, 4)))
case("MultiHeadAttention.forward", "mask", TypeError, lambda: MHA(X8, mask=torch.zeros(3, 3)))
case("MultiHeadAttention.forward", "mask", ValueError, lambda: MHA(X8, mask=_bool(3, 4)))
case("MultiHeadAttention.forward", "is_causal", TypeError, lambda: MHA(X8, is_causal="no"))
case("MultiHeadAttention.forward", "need_weights", TypeError, lambda: MHA(X8, need_weights=1))
case("MultiHeadAttention.forward", "cache", TypeError, lambda: MHA(X8, cache={}))
case("MultiHeadAttention.forward", "cache", ValueError,
     lambda: MHA(X8, MEMORY, MEMORY, cache=KVCache()))
case("FeedForward", "d_model", ValueError, lambda: FeedForward(0))
case("FeedForward", "d_ff", TypeError, lambda: FeedForward(8, "32"))
case("FeedForward", "bias", TypeError, lambda: FeedForward(8, bias="no"))
case("FeedForward", "activation", ValueError, lambda: FeedForward(8, activation="tanh"))
case("FeedForward", "activation", TypeError, lambda: FeedForward(8, activation=torch.tanh))
case("FeedForward", "dropout", ValueError, lambda: FeedForward(8, dropout=-0.1))
case("FeedForward.forward", "x", TypeError, lambda: FF([1.0] * 8))
case("FeedForward.forward", "x", TypeError, lambda: FF(X8.double()))
case("FeedForward.forward", "x", ValueError, lambda: FF(Q))
case("PositionalEncoding", "d_model", TypeError, lambda: PositionalEncoding("8"))
case("PositionalEncoding", "context_length", ValueError, lambda: PositionalEncoding(8, 0))
case("PositionalEncoding", "dropout", TypeError, lambda: PositionalEncoding(8, dropout="0"))
case("PositionalEncoding.forward", "x", TypeError, lambda: PE(None))
case("PositionalEncoding.forward", "x", ValueError, lambda: PE(Q))
case("PositionalEncoding.forward", "positions", TypeError, lambda: PE(X8, torch.ones(2, 3)))
case("PositionalEncoding.forward", "positions", ValueError, lambda: PE(X8, _long(2, 3) + 16))
case("TransformerBlock", "d_model", TypeError, lambda: TransformerBlock(8.0, 2))
case("TransformerBlock", "n_heads", ValueError, lambda: TransformerBlock(8, 3))
case("TransformerBlock", "norm_first", TypeError, lambda: TransformerBlock(8, 2, norm_first=1))
case("TransformerBlock", "cross_attention", TypeError,
     lambda: TransformerBlock(8, 2, cross_attention="yes"))
case("TransformerBlock", "bias", TypeError, lambda: TransformerBlock(8, 2, bias="no"))
case("TransformerBlock", "layer_norm_eps", ValueError,
     lambda: TransformerBlock(8, 2, layer_norm_eps=0.0))
case("TransformerBlock", "impl", ValueError, lambda: TransformerBlock(8, 2, impl="flash"))
case("TransformerBlock.forward", "x", TypeError, lambda: BLOCK("x"))
case("TransformerBlock.forward", "x", ValueError, lambda: BLOCK(Q))
case("TransformerBlock.forward", "x", TypeError, lambda: BLOCK(X8.double()))
case("TransformerBlock.forward", "memory", ValueError, lambda: BLOCK(X8, memory=MEMORY))
case("TransformerBlock.forward", "memory", TypeError, lambda: CROSS_BLOCK(X8, memory=[1.0]))
case("TransformerBlock.forward", "memory", ValueError, lambda: CROSS_BLOCK(X8, memory=MEMORY[:1]))
case("TransformerBlock.forward", "memory_attention_mask", TypeError,
     lambda: CROSS_BLOCK(X8, memory=MEMORY, memory_attention_mask=torch.ones(2, 5)))
case("TransformerBlock.forward", "attention_mask", ValueError,
     lambda: BLOCK(X8, attention_mask=_bool(2, 2)))
case("TransformerBlock.forward", "is_causal", TypeError, lambda: BLOCK(X8, is_causal="no"))
case("TransformerBlock.forward", "cache", TypeError, lambda: BLOCK(X8, cache=[]))
case("TransformerBlock.forward", "cross_cache", TypeError,
     lambda: CROSS_BLOCK(X8, memory=MEMORY, cross_cache=KVCache()))
case("TransformerBlock.forward", "cross_cache", ValueError,
     lambda: BLOCK(X8, cross_cache=CrossKVCache()))
case("TransformerBlock.forward", "need_weights", TypeError, lambda: BLOCK(X8, need_weights=1))

# ---------------------------------------------------------------------- model
case("GPTConfig", "vocab_size", TypeError, lambda: GPTConfig(vocab_size="7", context_length=8))
case("GPTConfig", "context_length", ValueError, lambda: GPTConfig(vocab_size=7, context_length=0))
case("GPTConfig", "n_heads", ValueError, lambda: GPTConfig(vocab_size=7, context_length=8,
                                                           n_heads=3))
case("GPTConfig", "bias", TypeError, lambda: GPTConfig(vocab_size=7, context_length=8, bias="no"))
case("GPTConfig", "tie_weights", TypeError,
     lambda: GPTConfig(vocab_size=7, context_length=8, tie_weights=None))
case("GPTConfig", "dropout", ValueError, lambda: GPTConfig(vocab_size=7, context_length=8,
                                                           dropout=1))
case("GPTConfig", "impl", TypeError, lambda: GPTConfig(vocab_size=7, context_length=8, impl=0))
case("GPTConfig", "init_std", ValueError,
     lambda: GPTConfig(vocab_size=7, context_length=8, init_std=float("nan")))
case("GPTConfig", "pos_encoding", ValueError,
     lambda: GPTConfig(vocab_size=7, context_length=8, pos_encoding="xpos"))
case("GPTConfig", "pos_encoding", TypeError,
     lambda: GPTConfig(vocab_size=7, context_length=8, pos_encoding=None))
case("GPTConfig", "n_kv_heads", ValueError,
     lambda: GPTConfig(vocab_size=7, context_length=8, n_heads=4, n_kv_heads=3))
case("GPTConfig", "n_kv_heads", TypeError,
     lambda: GPTConfig(vocab_size=7, context_length=8, n_kv_heads="2"))
case("GPTConfig", "window", ValueError, lambda: GPTConfig(vocab_size=7, context_length=8, window=0))
case("GPTConfig", "window", TypeError, lambda: GPTConfig(vocab_size=7, context_length=8,
                                                         window=2.0))
case("MiniGPT", "config", TypeError, lambda: MiniGPT({"vocab_size": 7, "context_length": 8}))
case("MiniGPT.forward", "idx", TypeError, lambda: GPT(IDX.float()))
case("MiniGPT.forward", "idx", ValueError, lambda: GPT(_long(0, 3)))
case("MiniGPT.forward", "idx", ValueError, lambda: GPT(IDX + V))
case("MiniGPT.forward", "targets", TypeError, lambda: GPT(IDX, IDX.float()))
case("MiniGPT.forward", "targets", ValueError, lambda: GPT(IDX, IDX[:, :2]))
case("MiniGPT.forward", "attention_mask", TypeError, lambda: GPT(IDX, attention_mask=IDX))
case("MiniGPT.forward", "attention_mask", ValueError,
     lambda: GPT(IDX, attention_mask=torch.zeros(2, 3, dtype=torch.bool)))
case("MiniGPT.forward", "caches", TypeError, lambda: GPT(IDX, caches="caches"))
case("MiniGPT.forward", "caches", ValueError, lambda: GPT(IDX, caches=[KVCache(), KVCache()]))
case("MiniGPT.generate", "idx", TypeError, lambda: GPT.generate([[1, 2]], 2))
case("MiniGPT.generate", "max_new_tokens", TypeError, lambda: GPT.generate(IDX, 2.0))
case("MiniGPT.generate", "max_new_tokens", ValueError, lambda: GPT.generate(IDX, -1))
case("MiniGPT.generate", "temperature", TypeError, lambda: GPT.generate(IDX, 2, temperature="1"))
case("MiniGPT.generate", "temperature", ValueError, lambda: GPT.generate(IDX, 2, temperature=-1))
case("MiniGPT.generate", "top_k", TypeError, lambda: GPT.generate(IDX, 2, top_k=2.5))
case("MiniGPT.generate", "top_k", ValueError, lambda: GPT.generate(IDX, 2, top_k=V + 1))
case("MiniGPT.generate", "top_p", TypeError, lambda: GPT.generate(IDX, 2, top_p="0.9"))
case("MiniGPT.generate", "top_p", ValueError, lambda: GPT.generate(IDX, 2, top_p=1.5))
case("MiniGPT.generate", "use_cache", TypeError, lambda: GPT.generate(IDX, 2, use_cache="no"))
case("MiniGPT.generate", "attention_mask", ValueError,
     lambda: GPT.generate(IDX, 2, attention_mask=RIGHT_PADDED))
case("MiniGPT.generate", "generator", TypeError, lambda: GPT.generate(IDX, 2, generator=7))
case("MiniGPT.num_parameters", "non_embedding", TypeError,
     lambda: GPT.num_parameters(non_embedding="yes"))

# ------------------------------------------------------------ encoder_decoder
EDC = dict(src_vocab_size=V, tgt_vocab_size=V)
case("EncoderDecoderConfig", "src_vocab_size", TypeError,
     lambda: EncoderDecoderConfig(src_vocab_size=7.0, tgt_vocab_size=V))
case("EncoderDecoderConfig", "tgt_vocab_size", ValueError,
     lambda: EncoderDecoderConfig(src_vocab_size=V, tgt_vocab_size=0))
case("EncoderDecoderConfig", "d_model", ValueError, lambda: EncoderDecoderConfig(**EDC, d_model=6))
case("EncoderDecoderConfig", "norm_first", TypeError,
     lambda: EncoderDecoderConfig(**EDC, norm_first="post"))
case("EncoderDecoderConfig", "activation", ValueError,
     lambda: EncoderDecoderConfig(**EDC, activation="tanh"))
case("EncoderDecoderConfig", "d_ff", TypeError, lambda: EncoderDecoderConfig(**EDC, d_ff="64"))
for cls in (Encoder, Decoder, EncoderDecoder):
    case(cls.__name__, "config", TypeError, lambda cls=cls: cls(GPTConfig(vocab_size=7,
                                                                           context_length=8)))
case("Encoder.forward", "src", TypeError, lambda: ED.encoder(IDX.float()))
case("Encoder.forward", "src", ValueError, lambda: ED.encoder(IDX - 1))
case("Encoder.forward", "src_attention_mask", TypeError, lambda: ED.encoder(IDX, IDX))
case("Encoder.forward", "src_attention_mask", ValueError, lambda: ED.encoder(IDX, _bool(2, 4)))
case("Decoder.forward", "tgt", TypeError, lambda: ED.decoder([[1]], MEMORY))
case("Decoder.forward", "tgt", ValueError, lambda: ED.decoder(_long(2, 0), MEMORY))
case("Decoder.forward", "memory", TypeError, lambda: ED.decoder(IDX, MEMORY.tolist()))
case("Decoder.forward", "memory", ValueError, lambda: ED.decoder(IDX, MEMORY[:1]))
case("Decoder.forward", "tgt_attention_mask", ValueError,
     lambda: ED.decoder(IDX, MEMORY, tgt_attention_mask=_bool(2, 4)))
case("Decoder.forward", "memory_attention_mask", TypeError,
     lambda: ED.decoder(IDX, MEMORY, memory_attention_mask=torch.ones(2, 5)))
case("Decoder.forward", "caches", TypeError, lambda: ED.decoder(IDX, MEMORY, caches=KVCache()))
case("Decoder.forward", "caches", ValueError, lambda: ED.decoder(IDX, MEMORY, caches=[]))
case("Decoder.forward", "cross_caches", TypeError,
     lambda: ED.decoder(IDX, MEMORY, cross_caches=[KVCache()]))
case("Decoder.forward", "cross_caches", ValueError,
     lambda: ED.decoder(IDX, MEMORY, cross_caches=[]))
case("Decoder.forward", "need_weights", TypeError,
     lambda: ED.decoder(IDX, MEMORY, need_weights="yes"))
case("EncoderDecoder.forward", "src", TypeError, lambda: ED("src", IDX))
case("EncoderDecoder.forward", "tgt", ValueError, lambda: ED(IDX, IDX + V))
case("EncoderDecoder.forward", "tgt_attention_mask", TypeError,
     lambda: ED(IDX, IDX, tgt_attention_mask=IDX))
case("EncoderDecoder.greedy_decode", "max_new_tokens", TypeError,
     lambda: ED.greedy_decode(IDX, IDX, "2"))
case("EncoderDecoder.greedy_decode", "max_new_tokens", ValueError,
     lambda: ED.greedy_decode(IDX, IDX, -1))
case("EncoderDecoder.greedy_decode", "use_cache", TypeError,
     lambda: ED.greedy_decode(IDX, IDX, 2, use_cache="no"))
case("EncoderDecoder.greedy_decode", "prompt", TypeError,
     lambda: ED.greedy_decode(IDX, IDX.float(), 2))
case("EncoderDecoder.greedy_decode", "prompt_attention_mask", ValueError,
     lambda: ED.greedy_decode(IDX, IDX, 2, prompt_attention_mask=RIGHT_PADDED))
case("EncoderDecoder.greedy_decode", "src_attention_mask", ValueError,
     lambda: ED.greedy_decode(IDX, IDX, 2, src_attention_mask=_bool(2, 5)))
case("EncoderDecoder.greedy_decode", "memory_attention_mask", TypeError,
     lambda: ED.greedy_decode(IDX, IDX, 2, memory_attention_mask=IDX))
case("EncoderDecoder.greedy_decode", "memory_attention_mask", ValueError,
     lambda: ED.greedy_decode(IDX, IDX, 2, memory_attention_mask=_bool(2, 5)))
case("positions_from_attention_mask", "attention_mask", TypeError,
     lambda: positions_from_attention_mask([[True]]))
case("positions_from_attention_mask", "attention_mask", ValueError,
     lambda: positions_from_attention_mask(_bool(3)))
case("block_gradient_norms", "n_layers", TypeError, lambda: block_gradient_norms("2", norm_first=1))
case("block_gradient_norms", "n_layers", ValueError, lambda: block_gradient_norms(0,
                                                                                   norm_first=True))
case("block_gradient_norms", "norm_first", TypeError,
     lambda: block_gradient_norms(1, norm_first="pre"))
case("block_gradient_norms", "seed", TypeError,
     lambda: block_gradient_norms(1, norm_first=True, seed=1.5))
case("block_gradient_norms", "seed", ValueError,
     lambda: block_gradient_norms(1, norm_first=True, seed=2**64))
case("block_gradient_norms", "d_model", ValueError,
     lambda: block_gradient_norms(1, norm_first=True, d_model=6))
case("block_gradient_norms", "final_norm", TypeError,
     lambda: block_gradient_norms(1, norm_first=True, final_norm="no"))
case("residual_stream_rms", "norm_first", TypeError,
     lambda: residual_stream_rms(1, norm_first="pre"))
case("residual_stream_rms", "n_layers", ValueError, lambda: residual_stream_rms(0))
case("stream_gradient_norm", "n_layers", ValueError, lambda: stream_gradient_norm(0))
case("stream_gradient_norm", "final_norm", TypeError,
     lambda: stream_gradient_norm(1, final_norm="no"))
case("decode_step_seconds", "model", TypeError, lambda: decode_step_seconds(GPT, 2,
                                                                             use_cache=True))
case("decode_step_seconds", "prefix_len", ValueError,
     lambda: decode_step_seconds(ED, 0, use_cache=True))
case("decode_step_seconds", "use_cache", TypeError,
     lambda: decode_step_seconds(ED, 2, use_cache="yes"))
case("decode_step_seconds", "repeats", ValueError,
     lambda: decode_step_seconds(ED, 2, use_cache=True, repeats=0))
case("decode_step_seconds", "seed", TypeError,
     lambda: decode_step_seconds(ED, 2, use_cache=True, seed="0"))
case("decode_step_seconds", "seed", ValueError,
     lambda: decode_step_seconds(ED, 2, use_cache=True, seed=-1))
case("decode_step_seconds", "cross_cache", TypeError,
     lambda: decode_step_seconds(ED, 2, use_cache=True, cross_cache=None))
case("masked_attention_seconds", "t", TypeError, lambda: masked_attention_seconds(64.0))
case("masked_attention_seconds", "mask", ValueError,
     lambda: masked_attention_seconds(64, "prefix"))
case("cross_cache_step_ms", "model", TypeError, lambda: cross_cache_step_ms(GPT, [4]))
case("cross_cache_step_ms", "src_lengths", TypeError, lambda: cross_cache_step_ms(ED, 16))
case("cross_cache_step_ms", "src_lengths", ValueError, lambda: cross_cache_step_ms(ED, [0]))

# ------------------------------------------------------------------------ env
case("pick_device", "preferred", TypeError, lambda: pick_device(0))
case("pick_device", "preferred", ValueError, lambda: pick_device("gpu"))
case("pick_device", "preferred", ValueError, lambda: pick_device("meta"))
case("seed_everything", "seed", TypeError, lambda: seed_everything("0"))
case("seed_everything", "seed", ValueError, lambda: seed_everything(2**64))

# ------------------------------------------------------- softmax, self-attention
case("softmax", "x", TypeError, lambda: softmax([1.0, 2.0]))
case("softmax", "x", ValueError, lambda: softmax(torch.tensor([1.0, float("nan")])))
case("softmax", "dim", TypeError, lambda: softmax(Q, dim="rows"))
case("softmax", "dim", ValueError, lambda: softmax(Q, dim=3))
case("softmax", "temperature", TypeError, lambda: softmax(Q, temperature="hot"))
case("softmax", "temperature", ValueError, lambda: softmax(Q, temperature=0.0))
case("attention_pool", "x", TypeError, lambda: attention_pool(Q.tolist(), Q[0, 0]))
case("attention_pool", "query", TypeError, lambda: attention_pool(Q, None))
case("attention_pool", "query", ValueError, lambda: attention_pool(Q, torch.ones(5)))
case("attention_pool", "x", ValueError, lambda: attention_pool(torch.full((3, 4), 1e20),
                                                               torch.full((4,), 1e20)))
case("attention_pool", "scale", TypeError, lambda: attention_pool(Q, Q[0, 0], scale="yes"))
case("simple_self_attention", "x", TypeError, lambda: simple_self_attention(Q.numpy()))
case("simple_self_attention", "x", ValueError, lambda: simple_self_attention(Q * 1e30))
case("simple_self_attention", "similarity", TypeError,
     lambda: simple_self_attention(Q, similarity=None))
case("simple_self_attention", "similarity", ValueError,
     lambda: simple_self_attention(Q, similarity="l2"))
case("SelfAttention", "d_in", TypeError, lambda: SelfAttention("4", 4))
case("SelfAttention", "d_out", ValueError, lambda: SelfAttention(4, 0))
case("SelfAttention", "qkv_bias", TypeError, lambda: SelfAttention(4, 4, qkv_bias="no"))
case("SelfAttention.forward", "x", TypeError, lambda: SA(Q.long()))
case("SelfAttention.forward", "x", TypeError, lambda: SA(Q.double()))
case("SelfAttention.forward", "x", ValueError, lambda: SA(Q[0]))
case("SelfAttention.forward", "mask", TypeError, lambda: SA(Q, mask=torch.ones(3, 3)))
case("SelfAttention.forward", "mask", ValueError, lambda: SA(Q, mask=_bool(2, 2)))
case("SelfAttention.forward", "need_weights", TypeError, lambda: SA(Q, need_weights="no"))

# ------------------------------------------------------------------------ viz
case("viz.plot_attention", "weights", TypeError, lambda: viz.plot_attention("abc"))
case("viz.raise_small_text", "figure", TypeError, lambda: viz.raise_small_text("fig"))
case("viz.plot_attention", "weights", ValueError, lambda: viz.plot_attention(torch.ones(3)))
case("viz.plot_attention", "x_labels", TypeError, lambda: viz.plot_attention(W2, x_labels=3))
case("viz.plot_attention", "y_labels", ValueError, lambda: viz.plot_attention(W2, y_labels="ab"))
case("viz.plot_attention", "ax", TypeError, lambda: viz.plot_attention(W2, ax="left"))
case("viz.plot_attention", "annotate", TypeError, lambda: viz.plot_attention(W2, annotate="no"))
case("viz.plot_distribution", "values", TypeError, lambda: viz.plot_distribution(None))
case("viz.plot_distribution", "values", ValueError, lambda: viz.plot_distribution(W2))
case("viz.plot_distribution", "labels", ValueError,
     lambda: viz.plot_distribution(W2[0], labels=["a"]))
case("viz.plot_distribution", "ax", TypeError, lambda: viz.plot_distribution(W2[0], ax=1))
case("viz.keep_spaces", "svg", TypeError, lambda: viz.keep_spaces(b"<svg></svg>"))
case("viz.keep_spaces", "svg", ValueError, lambda: viz.keep_spaces("<html></html>"))
case("viz.plot_curves", "x", TypeError, lambda: viz.plot_curves({"a": 1}, {"a": [1]}))
case("viz.plot_curves", "x", ValueError, lambda: viz.plot_curves(W2, {"a": W2}))
case("viz.plot_curves", "curves", TypeError, lambda: viz.plot_curves([1, 2], [[1, 2]]))
case("viz.plot_curves", "curves['a']", ValueError, lambda: viz.plot_curves([1, 2], {"a": [1]}))
case("viz.plot_curves", "logx", TypeError, lambda: viz.plot_curves([1, 2], {"a": [1, 2]},
                                                                    logx="yes"))
case("viz.plot_mask", "mask", TypeError, lambda: viz.plot_mask(object()))
case("viz.plot_mask", "mask", ValueError, lambda: viz.plot_mask(W2 + 2))
case("viz.plot_mask", "x_labels", ValueError,
     lambda: viz.plot_mask(torch.eye(2, dtype=torch.bool), x_labels=["a"]))
case("viz.readable_font_size", "width", TypeError, lambda: viz.readable_font_size("7"))
case("viz.readable_font_size", "width", ValueError, lambda: viz.readable_font_size(0))
case("viz.plot_heads", "weights", TypeError, lambda: viz.plot_heads("heads"))
case("viz.plot_heads", "weights", ValueError, lambda: viz.plot_heads(W2))
case("viz.plot_heads", "head_names", ValueError,
     lambda: viz.plot_heads(W2[None], head_names=["a", "b"]))
case("viz.plot_heads", "axes", TypeError, lambda: viz.plot_heads(W2[None], axes=[1]))
case("viz.plot_heads", "axes", ValueError, lambda: viz.plot_heads(W2[None], axes=[]))
case("viz.plot_heatmap", "matrix", TypeError, lambda: viz.plot_heatmap(None))
case("viz.plot_heatmap", "matrix", ValueError, lambda: viz.plot_heatmap(torch.ones(2, 2, 2)))
case("viz.plot_heatmap", "ax", TypeError, lambda: viz.plot_heatmap(W2, ax="ax"))
case("block_grid", "t_q", TypeError, lambda: block_grid(4.0, 4, 2, 2))
case("block_grid", "block_q", ValueError, lambda: block_grid(4, 4, 0, 2))
case("viz.plot_blocks", "grid", TypeError, lambda: viz.plot_blocks("grid"))
case("viz.plot_blocks", "block_k", ValueError,
     lambda: viz.plot_blocks(torch.zeros(2, 2), block_k=-1))
case("tiled_attention", "block_q", TypeError, lambda: tiled_attention(Q, Q, Q, block_q=2.0))
case("tiled_attention", "block_k", ValueError, lambda: tiled_attention(Q, Q, Q, block_k=0))
case("tiled_attention", "dropout_p", ValueError, lambda: tiled_attention(Q, Q, Q, dropout_p=1))
case("tiled_attention", "bias", TypeError, lambda: tiled_attention(Q, Q, Q, bias=_long(3, 3)))
case("tiled_attention", "bias", ValueError, lambda: tiled_attention(Q, Q, Q, bias=Q))
case("online_softmax", "scores", TypeError, lambda: online_softmax([1.0, 2.0], 1))
case("online_softmax", "block", ValueError, lambda: online_softmax(W2, 0))
case("SoftmaxState", "m", TypeError, lambda: SoftmaxState([0.0], torch.ones(1)))
case("SoftmaxState", "acc", ValueError,
     lambda: SoftmaxState(torch.zeros(2, 1), torch.ones(2, 1), torch.ones(3, 4)))
case("merge_softmax_states", "b", TypeError,
     lambda: merge_softmax_states(SoftmaxState(torch.zeros(2, 1), torch.ones(2, 1)), None))
case("merge_softmax_states", "a", ValueError,
     lambda: merge_softmax_states(SoftmaxState(torch.zeros(2, 1), torch.ones(2, 1)),
                                  SoftmaxState(torch.zeros(3, 1), torch.ones(3, 1))))
case("viz.plot_training", "result", TypeError, lambda: viz.plot_training([1.0, 2.0]))
case("viz.plot_training", "smooth", ValueError,
     lambda: viz.plot_training(course_attn.TrainResult(
         train_losses=[1.0], learning_rates=[0.1]), smooth=0))
case("viz.plot_training_and_scores", "losses", TypeError,
     lambda: viz.plot_training_and_scores([1, 2], [1.0, 2.0], {"s": [0.1, 0.2]}))
case("viz.plot_training_and_scores", "scores", ValueError,
     lambda: viz.plot_training_and_scores([1, 2], {"loss": [1.0, 2.0]}, {"s": [0.1]}))
case("viz.interactive_plot", "draw", TypeError, lambda: viz.interactive_plot("draw"))
case("viz.interactive_plot", "control 'x'", TypeError,
     lambda: viz.interactive_plot(lambda x: None, x=3))
case("viz.interactive_plot", "control", ValueError, lambda: viz.interactive_plot(lambda: None))


@pytest.mark.parametrize("bad", CASES, ids=[f"{c.target}-{c.arg}-{c.error.__name__}"
                                             for c in CASES])
def test_bad_argument_gets_a_clear_error_naming_it(bad):
    with pytest.raises((TypeError, ValueError)) as info:
        bad.call()
    assert info.type is bad.error, f"{info.type.__name__}: {info.value}"
    assert re.search(rf"(?<![\w.]){re.escape(bad.arg)}(?!\w)", str(info.value)), str(info.value)
    assert "Traceback" not in str(info.value)


def _public_callables() -> dict[str, object]:
    """Every public function and class of the swept modules, by the name the table uses."""
    found: dict[str, object] = {}
    for name in course_attn.__all__:
        if name in ("TrainConfig", "TrainResult"):  # the trainer's: swept elsewhere
            continue
        obj = getattr(course_attn, name)
        if callable(obj) and getattr(obj, "__module__", "") in SWEPT_MODULES:
            found[name] = obj
    for name in viz.__all__:
        found[f"viz.{name}"] = getattr(viz, name)
    return found


def _takes_arguments(fn: object) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    return any(p.name != "self" for p in params)


def _required_targets() -> set[str]:
    targets = set()
    for name, obj in _public_callables().items():
        if not inspect.isclass(obj):
            if _takes_arguments(obj):
                targets.add(name)
            continue
        if _takes_arguments(obj.__init__):
            targets.add(name)
        for attr, member in vars(obj).items():
            if (attr.startswith("_") and attr != "forward") or not inspect.isfunction(member):
                continue
            if attr in ("extra_repr",) or not _takes_arguments(member):
                continue
            targets.add(f"{name}.{attr}")
    return targets


def test_every_public_callable_is_swept():
    required = _required_targets()
    assert {"attention", "MiniGPT.generate", "KVCache.update", "viz.plot_heads",
            "EncoderDecoder.greedy_decode", "pick_device"} <= required  # the walk works
    covered = {(c.target, c.error) for c in CASES}
    missing = [f"{target} ({error.__name__})" for target in sorted(required)
               for error in (TypeError, ValueError)
               if (target, error) not in covered and (target, error) not in EXEMPT]
    assert not missing, f"public callables without a bad-argument case: {missing}"
    unknown = {c.target for c in CASES} - required
    assert not unknown, f"cases for names that are not public callables: {unknown}"
