"""Check your own attention: the learner's code against the course's (Chapters 1-11).

Each check takes the function (or, for a layer, the class) a learner wrote for one idea
of the course, runs it on the chapter's examples and then on seeded random cases against
the package's reference, and returns a :class:`CheckResult`. Printed, it says in a few
lines that the code passed and what was checked, or shows the first failure: the input,
what was expected, what came, and a hint that names the idea and the chapter's section.
A function that still raises ``NotImplementedError`` is "not written yet", and the result
lists what the check will test::

    from course_attn import check

    def my_softmax(x, temperature=1.0):
        raise NotImplementedError

    print(check.softmax(my_softmax))

Every check runs on the CPU, in well under two seconds, leaves torch's random generator
as it found it, and prints nothing that depends on the machine when it passes or when the
function is not written yet. Each check is a table (``TABLES``): the package's reference,
its cases and the known mistakes, run by :func:`~course_attn.check.runner.run_check`. The
learner's code runs on private copies of the inputs and must leave them as they were;
layers are built, given seeded weights and run in ``eval()`` mode; numbers are compared at
a stated tolerance (``check/values.py``). ``python -m course_attn.check FILE.py`` runs every
check whose function the learner's file defines, under its own name or the notebooks'
(``LEARNER_NAMES``; ``book/setup.md`` says how to use it).

The checks, by chapter (what the learner writes, in brackets):

* 1 ``softmax`` (``fn(x, temperature=1.0)``), ``attention_pool`` (``fn(x, query)``)
* 2 ``self_attention`` (``fn(x, similarity="dot")``)
* 3 ``qkv_projection`` (``fn(x, w_q, w_k, w_v)``), ``self_attention_layer``
  (``cls(d_in, d_out)``)
* 4 ``attention_scores`` (``fn(q, k)``), ``attention`` (``fn(q, k, v)``)
* 5 ``causal_mask`` (``fn(t_q, t_k)``), ``padding_mask`` (``fn(lengths, max_len,
  side=)``), ``masked_attention`` (``fn(q, k, v, mask)``)
* 6 ``split_heads`` (``fn(x, n_heads)``), ``merge_heads`` (``fn(x)``),
  ``multi_head_attention`` (``cls(d_model, n_heads)``)
* 7 ``pre_norm_block`` (``fn(x, attn, ff, norm1, norm2)``), ``sinusoidal_table``
  (``fn(context_length, d_model)``)
* 8 ``kv_cache_step`` (``fn(cache_k, cache_v, q, k, v)``), ``positions``
  (``fn(attention_mask)``)
* 9 ``online_merge`` (``fn(m_a, l_a, acc_a, m_b, l_b, acc_b)``), ``tile_step``
  (``fn(m, l, acc, q, k, v)``)
* 10 ``rope`` (``fn(x, positions)``), ``rope_attention`` (``fn(q, k, v, positions)``),
  ``sliding_window_mask`` (``fn(t, window)``), ``sliding_window_mask_mod``
  (``fn(window)``, returning a mask_mod), ``document_mask_mod`` (``fn(doc_ids)``, the same)
* 11 ``next_token_loss`` (``fn(logits, targets)``), ``training_step`` (``fn(model,
  optimizer, x, y)``)
"""

from __future__ import annotations

from collections.abc import Callable

from . import basics, block, decoding, efficient, heads, masks, modern, projections, training
from .basics import attention_pool, self_attention, softmax
from .block import pre_norm_block, sinusoidal_table
from .decoding import kv_cache_step, positions
from .efficient import online_merge, tile_step
from .heads import merge_heads, multi_head_attention, split_heads
from .masks import causal_mask, masked_attention, padding_mask
from .modern import (
    document_mask_mod,
    rope,
    rope_attention,
    sliding_window_mask,
    sliding_window_mask_mod,
)
from .projections import attention, attention_scores, qkv_projection, self_attention_layer
from .report import CheckResult, Failure
from .runner import Check
from .training import next_token_loss, training_step

__all__ = [
    "CHECKS",
    "LEARNER_NAMES",
    "NAMES",
    "SIGNATURES",
    "TABLES",
    "CheckResult",
    "Failure",
    "attention",
    "attention_pool",
    "attention_scores",
    "causal_mask",
    "document_mask_mod",
    "kv_cache_step",
    "masked_attention",
    "merge_heads",
    "multi_head_attention",
    "next_token_loss",
    "online_merge",
    "padding_mask",
    "positions",
    "pre_norm_block",
    "qkv_projection",
    "rope",
    "rope_attention",
    "self_attention",
    "self_attention_layer",
    "sinusoidal_table",
    "sliding_window_mask",
    "sliding_window_mask_mod",
    "softmax",
    "split_heads",
    "tile_step",
    "training_step",
]

#: Every check by its name, in the order of the chapters.
CHECKS: dict[str, Callable[..., CheckResult]] = {
    "softmax": softmax,
    "attention_pool": attention_pool,
    "self_attention": self_attention,
    "qkv_projection": qkv_projection,
    "self_attention_layer": self_attention_layer,
    "attention_scores": attention_scores,
    "attention": attention,
    "causal_mask": causal_mask,
    "padding_mask": padding_mask,
    "masked_attention": masked_attention,
    "split_heads": split_heads,
    "merge_heads": merge_heads,
    "multi_head_attention": multi_head_attention,
    "pre_norm_block": pre_norm_block,
    "sinusoidal_table": sinusoidal_table,
    "kv_cache_step": kv_cache_step,
    "positions": positions,
    "online_merge": online_merge,
    "tile_step": tile_step,
    "rope": rope,
    "rope_attention": rope_attention,
    "sliding_window_mask": sliding_window_mask,
    "sliding_window_mask_mod": sliding_window_mask_mod,
    "document_mask_mod": document_mask_mod,
    "next_token_loss": next_token_loss,
    "training_step": training_step,
}

#: Every check's table (its reference, cases and known mistakes), by the check's name.
TABLES: dict[str, Check] = {
    name: getattr(module, name.upper())
    for module in (basics, projections, masks, heads, block, decoding, efficient, modern,
                   training)
    for name in module.__all__
}

#: The name each check looks for in a learner's file (``python -m course_attn.check``):
#: the check's own name for a function, the class's name for a layer.
NAMES: dict[str, str] = {name: name for name in CHECKS} | {
    "self_attention_layer": "SelfAttention",
    "multi_head_attention": "MultiHeadAttention",
}

#: Every name the command line looks for, per check: the check's own (``NAMES``) and the
#: notebooks' (``my_softmax``, ``MyMultiHeadAttention``; chapter 2 has a loop version too).
LEARNER_NAMES: dict[str, tuple[str, ...]] = {
    check: (name, f"My{name}" if name[0].isupper() else f"my_{name}")
    for check, name in NAMES.items()
}
LEARNER_NAMES["self_attention"] += ("my_self_attention_loop",)

#: What the learner writes for each check, as a one-line signature.
SIGNATURES: dict[str, str] = {
    "softmax": "softmax(x, temperature=1.0) -> weights",
    "attention_pool": "attention_pool(x, query) -> (pooled, weights)",
    "self_attention": 'self_attention(x, similarity="dot") -> (z, weights)',
    "qkv_projection": "qkv_projection(x, w_q, w_k, w_v) -> (q, k, v)",
    "self_attention_layer": "class SelfAttention(nn.Module): __init__(d_in, d_out), "
                            "forward(x) -> out",
    "attention_scores": "attention_scores(q, k) -> scores",
    "attention": "attention(q, k, v) -> (out, weights)",
    "causal_mask": "causal_mask(t_q, t_k) -> mask",
    "padding_mask": 'padding_mask(lengths, max_len, side="right") -> mask',
    "masked_attention": "masked_attention(q, k, v, mask) -> (out, weights)",
    "split_heads": "split_heads(x, n_heads) -> heads",
    "merge_heads": "merge_heads(x) -> merged",
    "multi_head_attention": "class MultiHeadAttention(nn.Module): __init__(d_model, n_heads), "
                            "forward(x, mask=None) -> out",
    "pre_norm_block": "pre_norm_block(x, attn, ff, norm1, norm2) -> x",
    "sinusoidal_table": "sinusoidal_table(context_length, d_model) -> table",
    "kv_cache_step": "kv_cache_step(cache_k, cache_v, q, k, v) -> (out, cache_k, cache_v)",
    "positions": "positions(attention_mask) -> positions",
    "online_merge": "online_merge(m_a, l_a, acc_a, m_b, l_b, acc_b) -> (m, l, acc)",
    "tile_step": "tile_step(m, l, acc, q, k, v) -> (m, l, acc)",
    "rope": "rope(x, positions) -> rotated",
    "rope_attention": "rope_attention(q, k, v, positions) -> out",
    "sliding_window_mask": "sliding_window_mask(t, window) -> mask",
    "sliding_window_mask_mod": "sliding_window_mask_mod(window) -> mask_mod(b, h, q_idx, "
                               "kv_idx)",
    "document_mask_mod": "document_mask_mod(doc_ids) -> mask_mod(b, h, q_idx, kv_idx)",
    "next_token_loss": "next_token_loss(logits, targets) -> loss",
    "training_step": "training_step(model, optimizer, x, y) -> loss",
}
