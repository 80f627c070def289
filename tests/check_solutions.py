"""Correct solutions of every ``course_attn.check`` exercise, written the way a learner would
call the package (or, where the package has no such function, in a few lines of torch).

``tests/test_check.py`` and ``tests/test_check_catalogue.py`` hold each check to them: the
package's reference must pass every check it is the reference of.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import course_attn as ca
from course_attn.models.gpt import next_token_loss as package_loss


def softmax(x, temperature=1.0):
    return ca.softmax(x, temperature=temperature)


def attention_pool(x, query):
    return ca.attention_pool(x, query)


def self_attention(x, similarity="dot"):
    return ca.simple_self_attention(x, similarity=similarity)


def qkv_projection(x, w_q, w_k, w_v):
    return x @ w_q, x @ w_k, x @ w_v


SelfAttention = ca.SelfAttention


def attention_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def attention(q, k, v):
    return ca.scaled_dot_product_attention(q, k, v)


def causal_mask(t_q, t_k):
    return ca.causal_mask(t_q, t_k)


def padding_mask(lengths, max_len, side="right"):
    return ca.padding_mask(lengths, max_len, side=side)


def masked_attention(q, k, v, mask):
    return ca.scaled_dot_product_attention(q, k, v, mask)


def split_heads(x, n_heads):
    return ca.split_heads(x, n_heads)


def merge_heads(x):
    return ca.merge_heads(x)


MultiHeadAttention = ca.MultiHeadAttention


def pre_norm_block(x, attn, ff, norm1, norm2):
    x = x + attn(norm1(x))
    return x + ff(norm2(x))


def sinusoidal_table(context_length, d_model):
    return ca.sinusoidal_table(context_length, d_model)


def kv_cache_step(cache_k, cache_v, q, k, v):
    cache = ca.KVCache()
    cache.update(cache_k, cache_v)
    keys, values = cache.update(k, v)  # (B, H, T_cache + T_new, d)
    out, _ = ca.scaled_dot_product_attention(q, keys, values, is_causal=True)
    return out, keys, values


def positions(attention_mask):
    return ca.positions_from_attention_mask(attention_mask)


def online_merge(m_a, l_a, acc_a, m_b, l_b, acc_b):
    merged = ca.merge_softmax_states(ca.SoftmaxState(m_a, l_a, acc_a),
                                     ca.SoftmaxState(m_b, l_b, acc_b))
    return merged.m, merged.l, merged.acc


def tile_step(m, l, acc, q, k, v):  # noqa: E741
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    m_blk = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - m_blk)
    block = ca.SoftmaxState(m_blk, p.sum(dim=-1, keepdim=True), p @ v)
    return online_merge(m, l, acc, block.m, block.l, block.acc)


def rope(x, positions):
    return ca.apply_rope(x, positions)


def rope_attention(q, k, v, positions):
    q, k = ca.apply_rope(q, positions), ca.apply_rope(k, positions)
    return ca.scaled_dot_product_attention(q, k, v, is_causal=True)


def sliding_window_mask(t, window):
    return ca.sliding_window_mask(t, window=window)


def sliding_window_mask_mod(window):
    return ca.sliding_window_mask_mod(window)


def document_mask_mod(doc_ids):
    return ca.document_mask_mod(doc_ids)


def next_token_loss(logits, targets):
    return package_loss(logits, targets)


def training_step(model, optimizer, x, y):
    optimizer.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    return loss.item()


#: The solution of each check, by the check's name.
SOLUTIONS = {
    "softmax": softmax,
    "attention_pool": attention_pool,
    "self_attention": self_attention,
    "qkv_projection": qkv_projection,
    "self_attention_layer": SelfAttention,
    "attention_scores": attention_scores,
    "attention": attention,
    "causal_mask": causal_mask,
    "padding_mask": padding_mask,
    "masked_attention": masked_attention,
    "split_heads": split_heads,
    "merge_heads": merge_heads,
    "multi_head_attention": MultiHeadAttention,
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

_ = (F, nn)  # the learner's usual imports, kept for the files the CLI tests write
