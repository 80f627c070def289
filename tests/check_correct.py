"""Correct but unusual solutions of every ``course_attn.check`` exercise: each must pass.

A check that fails a correct answer teaches the learner something false, so these are held
to it as firmly as the wrong ones (``tests/check_wrong.py``): einsum and tensordot in place
of ``@``, PyTorch's fused attention, float32 intermediates where the usual code has them
(RoPE's angles, the sinusoidal table), complex-number RoPE, lists where a tuple is asked
for, a dropout layer in a module checked in eval mode, loops, and the chapters' own
solution cells, copied here (tests never read the notebooks' code).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import course_attn as ca

# ------------------------------------------------------------------------- chapters 1-4


def softmax_pow(x, temperature=1.0):
    e = (x - x.amax(dim=-1, keepdim=True)).exp() ** (1.0 / temperature)  # exp(x)^(1/T)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_logsumexp(x, temperature=1.0):
    s = x - x.amax(dim=-1, keepdim=True)  # subtracted before the division, as section 1.6
    s = s / temperature
    return torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))


def softmax_chapter(x, temperature=1.0):  # chapter 1's solution cell
    shifted = x - x.amax(dim=-1, keepdim=True)
    scores = shifted / temperature
    e = scores.exp()
    return e / e.sum(dim=-1, keepdim=True)


def softmax_float64_inside(x, temperature=1.0):
    s = x.double() / temperature  # divided first, but in float64, where 1e5 is no overflow
    e = (s - s.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def pool_einsum(x, query):
    scores = torch.einsum("...td,...d->...t", x, query) / math.sqrt(x.shape[-1])
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("...t,...td->...d", weights, x), weights


def pool_list(x, query):
    weights = torch.softmax((x * query.unsqueeze(-2)).sum(-1) / x.shape[-1] ** 0.5, dim=-1)
    return [(weights.unsqueeze(-1) * x).sum(-2), weights]  # a list of the two


def pool_chapter(x, query):  # chapter 1's solution cell
    d = x.shape[-1]
    scores = (x @ query.unsqueeze(-1)).squeeze(-1) / math.sqrt(d)
    weights = softmax_chapter(scores)
    pooled = (weights.unsqueeze(-2) @ x).squeeze(-2)
    return pooled, weights


def self_attention_loop(x, similarity="dot"):  # chapter 2's loop solution
    keys = F.normalize(x, dim=-1) if similarity == "cosine" else x
    z_rows, a_rows = [], []
    for i in range(x.shape[-2]):
        query = keys[..., i, :].unsqueeze(-2)
        weights = torch.softmax((keys * query).sum(dim=-1), dim=-1)
        z_rows.append((weights.unsqueeze(-1) * x).sum(dim=-2))
        a_rows.append(weights)
    return torch.stack(z_rows, dim=-2), torch.stack(a_rows, dim=-2)


def self_attention_normalize(x, similarity="dot"):
    keys = F.normalize(x, dim=-1) if similarity == "cosine" else x
    weights = torch.softmax(torch.einsum("...id,...jd->...ij", keys, keys), dim=-1)
    return weights @ x, weights


def qkv_tensordot(x, w_q, w_k, w_v):
    return tuple(torch.tensordot(x, w, dims=([-1], [0])) for w in (w_q, w_k, w_v))


def qkv_fused_split(x, w_q, w_k, w_v):
    fused = x @ torch.cat([w_q, w_k, w_v], dim=-1)  # (..., T, 2 d_k + d_v)
    return list(fused.split([w_q.shape[1], w_k.shape[1], w_v.shape[1]], dim=-1))


class SelfAttentionWithDropout(nn.Module):
    """Chapter 3's layer with a dropout on the weights: off in eval mode, where it is checked."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_in, d_out, bias=False)
                                                 for _ in range(3))
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        w = self.dropout(torch.softmax(q @ k.mT / math.sqrt(k.shape[-1]), dim=-1))
        return w @ v, w


class SelfAttentionSDPA(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.q_proj = nn.Linear(d_in, d_out, bias=False)
        self.k_proj = nn.Linear(d_in, d_out, bias=False)
        self.v_proj = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x):
        return F.scaled_dot_product_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x))


def scores_einsum(q, k):
    return torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])


def scores_float32_scale(q, k):
    return q @ k.transpose(-1, -2) / torch.tensor(q.shape[-1]).sqrt()  # a float32 0-d scale


def attention_sdpa(q, k, v):
    out = F.scaled_dot_product_attention(q, k, v)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return out, weights


def attention_list(q, k, v):
    scale = q.shape[-1] ** -0.5
    weights = (torch.matmul(q * scale, k.transpose(-2, -1))).softmax(-1)
    return [torch.matmul(weights, v), weights]


# --------------------------------------------------------------------------- chapter 5


def causal_arange(t_q, t_k):  # chapter 5's solution cell
    i = torch.arange(t_q)[:, None]
    j = torch.arange(t_k)[None, :]
    return j <= i + t_k - t_q


def causal_triu(t_q, t_k):
    return ~torch.ones(t_q, t_k, dtype=torch.bool).triu(t_k - t_q + 1)


def padding_arange(lengths, max_len, side="right"):  # chapter 5's solution cell
    n = torch.tensor(lengths)[:, None]
    t = torch.arange(max_len)[None, :]
    if side == "left":
        return t >= max_len - n
    return t < n


def padding_loop(lengths, max_len, side="right"):
    rows = []
    for n in lengths:
        row = [True] * n + [False] * (max_len - n)
        rows.append(row[::-1] if side == "left" else row)
    return torch.tensor(rows, dtype=torch.bool).reshape(len(lengths), max_len)


def masked_chapter(q, k, v, mask):  # chapter 5's solution cell
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    empty = ~mask.any(dim=-1, keepdim=True)
    weights = weights.masked_fill(empty, 0.0)
    return weights @ v, weights


def masked_nan_to_num_weights(q, k, v, mask):
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))  # before @ v: clean backward
    return weights @ v, weights


def masked_where(q, k, v, mask):
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    safe = torch.where(mask, scores, torch.full_like(scores, -1e30))  # finite: no NaN
    weights = torch.softmax(safe, dim=-1) * mask  # rows with no key: all zero
    return weights @ v, weights


# ------------------------------------------------------------------------- chapters 6-7


def split_chapter(x, n_heads):  # chapter 6's solution cell
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)


def split_unflatten(x, n_heads):
    return x.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3)


def merge_chapter(x):  # chapter 6's solution cell
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)


def merge_cat(x):
    return torch.cat(x.unbind(1), dim=-1)


class MHAChapter(nn.Module):
    """Chapter 6's solution cell."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, mask=None):
        q, k, v = (split_chapter(proj(x), self.n_heads)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        heads = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(merge_chapter(heads))


class MHASDPADropout(nn.Module):
    """The fused path, a dropout (off in eval mode) and (out, weights) returned."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (p(x).reshape(b, t, self.h, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             dropout_p=0.1 if self.training else 0.0)
        return self.dropout(self.out_proj(out.transpose(1, 2).reshape(b, t, d))), None


def block_chapter(x, attn, ff, norm1, norm2):  # chapter 7's solution cell
    x = x + attn(norm1(x))
    return x + ff(norm2(x))


def block_new_names(x, attn, ff, norm1, norm2):
    h = x + attn(norm1(x))
    out = h.clone()
    out += ff(norm2(h))  # in place on a tensor of its own: the caller's x is untouched
    return out


def table_chapter(context_length, d_model):  # chapter 7's solution cell
    p = torch.arange(context_length, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = p / 10000 ** (two_i / d_model)
    pairs = torch.stack([angle.sin(), angle.cos()], dim=-1)
    return pairs.reshape(context_length, d_model)


def table_float32_exp(context_length, d_model):  # the Annotated Transformer's form, float32
    pe = torch.zeros(context_length, d_model)
    position = torch.arange(0, context_length).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


# ------------------------------------------------------------------------- chapters 8-9


def cache_chapter(cache_k, cache_v, q, k, v):  # chapter 8's solution cell
    cache_k = torch.cat([cache_k, k], dim=2)
    cache_v = torch.cat([cache_v, v], dim=2)
    t_new, t_all = q.shape[2], cache_k.shape[2]
    scores = q @ cache_k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~causal_arange(t_new, t_all), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ cache_v
    return out, cache_k, cache_v


def cache_sdpa_list(cache_k, cache_v, q, k, v):
    keys, values = torch.cat((cache_k, k), -2), torch.cat((cache_v, v), -2)
    mask = causal_triu(q.shape[-2], keys.shape[-2])
    return [F.scaled_dot_product_attention(q, keys, values, attn_mask=mask), keys, values]


def positions_chapter(attention_mask):  # chapter 8's solution cell
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def positions_argmax(attention_mask):  # 0, 1, 2, ... from each row's first real token
    first = attention_mask.long().argmax(dim=-1, keepdim=True)  # (B, 1)
    return (torch.arange(attention_mask.shape[-1]) - first).clamp(min=0)


def merge_chapter_state(m_a, l_a, acc_a, m_b, l_b, acc_b):  # chapter 9's solution cell
    m = torch.maximum(m_a, m_b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    scale_a, scale_b = torch.exp(m_a - m_safe), torch.exp(m_b - m_safe)
    return m, scale_a * l_a + scale_b * l_b, scale_a * acc_a + scale_b * acc_b


def merge_nan_to_num(m_a, l_a, acc_a, m_b, l_b, acc_b):
    m = torch.max(m_a, m_b)
    f_a = torch.nan_to_num(torch.exp(m_a - m))  # both empty: exp(NaN) -> 0
    f_b = torch.nan_to_num(torch.exp(m_b - m))
    return [m, f_a * l_a + f_b * l_b, f_a * acc_a + f_b * acc_b]


def tile_chapter(m, l, acc, q, k, v):  # noqa: E741  chapter 9's solution cell
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    p = torch.exp(s - m_new)
    scale = torch.exp(m - m_new)
    return m_new, l * scale + p.sum(dim=-1, keepdim=True), acc * scale + p @ v


def tile_einsum(m, l, acc, q, k, v):  # noqa: E741
    s = torch.einsum("...id,...jd->...ij", q, k) * q.shape[-1] ** -0.5
    m_new = torch.max(torch.cat([m, s.max(dim=-1, keepdim=True).values], dim=-1), dim=-1,
                      keepdim=True).values
    p = (s - m_new).exp()
    alpha = (m - m_new).exp()
    return m_new, alpha * l + p.sum(-1, keepdim=True), alpha * acc + torch.einsum(
        "...ij,...jd->...id", p, v)


# ------------------------------------------------------------------------ chapters 10-11


def rope_chapter(x, positions):  # chapter 10's solution cell
    d = x.shape[-1]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    theta = positions.double()[:, None] * omega
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    turned = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return turned.flatten(-2)


def rope_llama_float32(x, positions):
    """The usual Llama code: float32 inverse frequencies and angles, complex rotation."""
    d = x.shape[-1]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))  # float32
    freqs = torch.outer(positions.float(), inv_freq)  # (T, d / 2), float32 angles
    rotation = torch.polar(torch.ones_like(freqs), freqs)  # complex64
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


def rope_complex128(x, positions):
    d = x.shape[-1]
    theta = positions[:, None].double() / 10000.0 ** (torch.arange(0, d, 2).double() / d)
    pairs = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(pairs * torch.exp(1j * theta)).flatten(-2).to(x.dtype)


def rope_attention_float32(q, k, v, positions):
    q, k = rope_llama_float32(q, positions), rope_llama_float32(k, positions)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rope_attention_pair(q, k, v, positions):
    q, k = ca.apply_rope(q, positions), ca.apply_rope(k, positions)
    return ca.scaled_dot_product_attention(q, k, v, mask=ca.causal_mask(q.shape[-2]))  # pair


def window_chapter(t, window):  # chapter 10's solution cell
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    return (j <= i) & (j > i - window)


def window_tril(t, window):
    ones = torch.ones(t, t, dtype=torch.bool)
    return ones.tril() & ~ones.tril(-window)


def window_mod_chapter(window):  # chapter 10's solution cell
    def in_window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return in_window


def window_mod_and_masks(window):  # two mods combined by PyTorch's and_masks
    from torch.nn.attention.flex_attention import and_masks

    return and_masks(ca.causal_mask_mod(), lambda b, h, q, kv: kv + window > q)


def window_mod_where(window):  # torch.where, a distance as a tensor
    return lambda b, h, q, kv: torch.where(q >= kv, (q - kv) < window, torch.tensor(False))


def document_mod_chapter(doc_ids):  # chapter 10's solution cell
    def same_document(b, h, q_idx, kv_idx):
        return doc_ids[b, q_idx] == doc_ids[b, kv_idx]

    return same_document


def document_mod_starts(doc_ids):  # the document's first index: equal starts, one document
    starts = ca.document_positions(doc_ids)  # (B, T): position within its document
    first = torch.arange(doc_ids.shape[-1]) - starts  # (B, T): where its document began

    return lambda b, h, q, kv: first[b, q] == first[b, kv]


def document_mod_rows(doc_ids):  # one row at a time, ids compared by subtraction
    rows = [row.clone() for row in doc_ids]
    table = torch.stack(rows)
    return lambda b, h, q, kv: (table[b][q] - table[b][kv]) == 0


def loss_gather_masked(logits, targets):  # log_softmax and gather, the -1 targets left out
    counted = targets != -1
    log_probs = torch.log_softmax(logits.float() if logits.dtype in (torch.float16,
                                                                     torch.bfloat16)
                                  else logits, dim=-1)
    picked = log_probs.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    return -(picked * counted).sum() / counted.sum().clamp(min=1)


def loss_classes_second(logits, targets):  # (B, N_vocab, T) against (B, T), float32 at least
    wide = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return F.cross_entropy(wide.transpose(1, 2), targets, ignore_index=-1)


def loss_nll(logits, targets):
    log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    return F.nll_loss(log_probs.flatten(0, 1), targets.flatten(), ignore_index=-1)


def step_chapter(model, optimizer, x, y):  # chapter 11's solution cell
    optimizer.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    return loss.item()


def step_zero_grad_last(model, optimizer, x, y):
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()  # at the end, ready for the next step: the same
    return loss.item()


def step_tensor_set_to_none(model, optimizer, x, y):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    logits, _ = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.detach()  # a scalar tensor will do


# ------------------------------------------------------- a fresh batch, written blind


def pool_matmul_index(x, query):
    weights = torch.softmax(torch.matmul(x, query[..., :, None])[..., 0] * x.shape[-1] ** -0.5,
                            dim=-1)
    return (weights[..., None, :] @ x)[..., 0, :], weights


def self_attention_cosine_similarity(x, similarity="dot"):
    if similarity == "cosine":
        scores = F.cosine_similarity(x.unsqueeze(-2), x.unsqueeze(-3), dim=-1)
    else:
        scores = x @ x.mT
    weights = scores.softmax(-1)
    return weights @ x, weights


def qkv_linear(x, w_q, w_k, w_v):
    return tuple(F.linear(x, w.T) for w in (w_q, w_k, w_v))


def scores_flattened_batch(q, k):
    flat_q, flat_k = q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:])
    return (torch.bmm(flat_q, flat_k.mT) / math.sqrt(q.shape[-1])).reshape(
        *q.shape[:-1], k.shape[-2])


def attention_scaled_in_place_on_its_own(q, k, v):
    scores = q @ k.mT
    scores /= math.sqrt(q.shape[-1])  # in place, on a tensor of its own
    weights = scores.softmax(-1)
    return weights @ v, weights


def padding_flipped(lengths, max_len, side="right"):
    mask = torch.arange(max_len)[None] < torch.tensor(lengths)[:, None]
    return mask.flip(-1) if side == "left" else mask


def masked_sdpa(q, k, v, mask):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # zeros where nothing
    scores = (q @ k.mT / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    return out.nan_to_num(), scores.softmax(-1).nan_to_num()


class MHAMinus1e9(MHAChapter):
    """-1e9 for blocked scores: the same wherever a query may attend at least one key."""

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (proj(x).view(b, t, self.n_heads, -1).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.mT / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(mask.logical_not(), -1e9)
        return self.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


def table_negative_power(context_length, d_model):
    p = torch.arange(context_length)[:, None].float()
    rate = 10000 ** (-torch.arange(0, d_model, 2).float() / d_model)
    pe = torch.zeros(context_length, d_model)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(p * rate), torch.cos(p * rate)
    return pe


def merge_where_equal(m_a, l_a, acc_a, m_b, l_b, acc_b):
    m = torch.maximum(m_a, m_b)
    f_a = torch.where(m_a == m, 1.0, torch.exp(m_a - m))  # -inf == -inf: factor 1, times 0
    f_b = torch.where(m_b == m, 1.0, torch.exp(m_b - m))
    return m, l_a * f_a + l_b * f_b, acc_a * f_a + acc_b * f_b


def rope_repeat_interleave(x, positions):
    d = x.shape[-1]
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    angles = torch.outer(positions.float(), inv)
    cos = angles.cos().repeat_interleave(2, -1).to(x.dtype)
    sin = angles.sin().repeat_interleave(2, -1).to(x.dtype)
    turned = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    return x * cos + turned * sin


def loss_one_hot(logits, targets):
    counted = targets >= 0  # a target of -1 counts for nothing
    wide = logits.double() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    one_hot = F.one_hot(targets.clamp(min=0), logits.shape[-1]) * counted[..., None]
    return -(wide.log_softmax(-1) * one_hot).sum() / counted.sum()


FRESH = {
    "attention_pool": [("matmul_index", pool_matmul_index)],
    "self_attention": [("cosine_similarity", self_attention_cosine_similarity)],
    "qkv_projection": [("linear", qkv_linear)],
    "attention_scores": [("flattened_batch", scores_flattened_batch)],
    "attention": [("in_place_on_its_own", attention_scaled_in_place_on_its_own)],
    "padding_mask": [("flipped", padding_flipped)],
    "masked_attention": [("sdpa", masked_sdpa)],
    "multi_head_attention": [("minus_1e9", MHAMinus1e9)],
    "sinusoidal_table": [("negative_power", table_negative_power)],
    "online_merge": [("where_equal", merge_where_equal)],
    "rope": [("repeat_interleave", rope_repeat_interleave)],
    "next_token_loss": [("one_hot", loss_one_hot)],
}

CORRECT = {
    "softmax": [("pow", softmax_pow), ("logsumexp", softmax_logsumexp),
                ("chapter", softmax_chapter), ("float64_inside", softmax_float64_inside)],
    "attention_pool": [("einsum", pool_einsum), ("list", pool_list), ("chapter", pool_chapter)],
    "self_attention": [("loop", self_attention_loop), ("normalize", self_attention_normalize)],
    "qkv_projection": [("tensordot", qkv_tensordot), ("fused_split", qkv_fused_split)],
    "self_attention_layer": [("dropout", SelfAttentionWithDropout),
                             ("sdpa", SelfAttentionSDPA)],
    "attention_scores": [("einsum", scores_einsum), ("float32_scale", scores_float32_scale)],
    "attention": [("sdpa", attention_sdpa), ("list", attention_list)],
    "causal_mask": [("chapter", causal_arange), ("triu", causal_triu)],
    "padding_mask": [("chapter", padding_arange), ("loop", padding_loop)],
    "masked_attention": [("chapter", masked_chapter), ("where", masked_where),
                         ("nan_to_num_weights", masked_nan_to_num_weights)],
    "split_heads": [("chapter", split_chapter), ("unflatten", split_unflatten)],
    "merge_heads": [("chapter", merge_chapter), ("cat", merge_cat)],
    "multi_head_attention": [("chapter", MHAChapter), ("sdpa_dropout", MHASDPADropout)],
    "pre_norm_block": [("chapter", block_chapter), ("own_in_place", block_new_names)],
    "sinusoidal_table": [("chapter", table_chapter), ("float32_exp", table_float32_exp)],
    "kv_cache_step": [("chapter", cache_chapter), ("sdpa_list", cache_sdpa_list)],
    "positions": [("chapter", positions_chapter), ("argmax", positions_argmax)],
    "online_merge": [("chapter", merge_chapter_state), ("nan_to_num", merge_nan_to_num)],
    "tile_step": [("chapter", tile_chapter), ("einsum", tile_einsum)],
    "rope": [("chapter", rope_chapter), ("llama_float32", rope_llama_float32),
             ("complex128", rope_complex128)],
    "rope_attention": [("float32", rope_attention_float32), ("pair", rope_attention_pair)],
    "sliding_window_mask": [("chapter", window_chapter), ("tril", window_tril)],
    "sliding_window_mask_mod": [("chapter", window_mod_chapter),
                                ("and_masks", window_mod_and_masks), ("where", window_mod_where)],
    "document_mask_mod": [("chapter", document_mod_chapter), ("starts", document_mod_starts),
                          ("rows", document_mod_rows)],
    "next_token_loss": [("gather_masked", loss_gather_masked), ("nll", loss_nll),
                        ("classes_second", loss_classes_second)],
    "training_step": [("chapter", step_chapter), ("tensor", step_tensor_set_to_none),
                      ("zero_grad_last", step_zero_grad_last)],
}
for _name, _entries in FRESH.items():
    CORRECT[_name] = CORRECT[_name] + _entries
