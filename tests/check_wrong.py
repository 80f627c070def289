"""Wrong implementations of every ``course_attn.check`` exercise, the mistakes learners make.

Each entry is ``(label, implementation, phrase)``: the implementation must fail its check and
the hint it gets must contain ``phrase``, the words of the hint written for that mistake
(``tests/test_check_catalogue.py``). The first entries of each list are the mistakes of
issue 34; those after ``# issue 40`` are the kinds that slipped through then: functions that
change their arguments in place, a ``.squeeze()`` that only a size-1 dimension shows, widths
mixed up where ``d_v`` differs from ``d_k``, biases, detached gradients, masks that are not
causal, and training steps a little off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import course_attn as ca

# ------------------------------------------------------------------ the wrong versions


def _sm(x, dim=-1):
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


SOFTMAX = [
    ("no_max_subtraction", lambda x, temperature=1.0: (x / temperature).exp()
     / (x / temperature).exp().sum(-1, keepdim=True), "subtract each row's maximum first"),
    ("temperature_multiplied", lambda x, temperature=1.0: _sm(x * temperature),
     "do not multiply"),
    ("temperature_ignored", lambda x, temperature=1.0: _sm(x), "changes nothing"),
    ("over_columns", lambda x, temperature=1.0: _sm(x / temperature, dim=0), "not each column"),
    ("raw_normalised", lambda x, temperature=1.0: x / x.sum(-1, keepdim=True),
     "exponentiates them first"),
    ("global_max", lambda x, temperature=1.0: (lambda e: e / e.sum(-1, keepdim=True))(
        ((x - x.max()) / temperature).exp()), "not the maximum of the whole tensor"),
    ("max_without_keepdim", lambda x, temperature=1.0: (lambda e: e / e.sum(-1, keepdim=True))(
        ((x - x.amax(-1)) / temperature).exp()), "keepdim=True"),
    ("float32_out", lambda x, temperature=1.0: _sm(x.float() / temperature), "dtype"),
    ("not_normalised", lambda x, temperature=1.0: (x / temperature
                                                   - x.amax(-1, keepdim=True)).exp(),
     "do not sum to 1"),
]


def _pool(x, query, divide=None, swap=False, only=False):
    scores = (x @ query.unsqueeze(-1)).squeeze(-1)
    scores = scores / (math.sqrt(x.shape[-1]) if divide is None else divide(x))
    weights = torch.softmax(scores, dim=-1)
    pooled = (weights.unsqueeze(-2) @ x).squeeze(-2)
    if only:
        return pooled
    return (weights, pooled) if swap else (pooled, weights)


def _pool_naive_softmax(x, query):
    s = (x @ query.unsqueeze(-1)).squeeze(-1) / math.sqrt(x.shape[-1])
    w = s.exp() / s.exp().sum(-1, keepdim=True)
    return (w.unsqueeze(-2) @ x).squeeze(-2), w


def _pool_no_batch(x, query):
    w = torch.softmax(torch.einsum("td,d->t", x, query) / math.sqrt(x.shape[-1]), dim=-1)
    return w @ x, w


ATTENTION_POOL = [
    ("unscaled", lambda x, q: _pool(x, q, divide=lambda x: 1.0), "1 / sqrt(D)"),
    ("divided_by_D", lambda x, q: _pool(x, q, divide=lambda x: x.shape[-1]), "not by D"),
    ("swapped_outputs", lambda x, q: _pool(x, q, swap=True), "in this order"),
    ("pooled_only", lambda x, q: _pool(x, q, only=True), "not only the pooled"),
    ("naive_softmax", _pool_naive_softmax, "subtracts the row maximum"),
    ("no_batch", _pool_no_batch, "broadcast"),
]


def _self(x, similarity="dot", scale=1.0, dim=-1, cos="both", mix="x"):
    unit = x / x.norm(dim=-1, keepdim=True)
    if similarity == "cosine":
        scores = {"both": unit @ unit.mT, "none": x @ x.mT, "queries": unit @ x.mT,
                  "columns": (x / x.norm(dim=-2, keepdim=True)) @ (
                      x / x.norm(dim=-2, keepdim=True)).mT}[cos]
    else:
        scores = x @ x.mT
    w = torch.softmax(scores / scale, dim=dim)
    return w @ (unit if mix == "unit" and similarity == "cosine" else x), w


SELF_ATTENTION = [
    ("scaled", lambda x, similarity="dot": _self(x, similarity, scale=math.sqrt(x.shape[-1])),
     "not scaled by sqrt(D)"),
    ("softmax_over_queries", lambda x, similarity="dot": _self(x, similarity, dim=-2),
     "not over the queries"),
    ("cosine_not_normalised", lambda x, similarity="dot": _self(x, similarity, cos="none"),
     "divide each vector by its length"),
    ("cosine_queries_only", lambda x, similarity="dot": _self(x, similarity, cos="queries"),
     "the keys as well as the queries"),
    ("cosine_over_columns", lambda x, similarity="dot": _self(x, similarity, cos="columns"),
     "not each feature"),
    ("cosine_mixes_unit_vectors", lambda x, similarity="dot": _self(x, similarity, mix="unit"),
     "the original vectors x"),
    ("x_T_on_a_batch", lambda x, similarity="dot": (lambda u: (
        lambda w: (w @ x, w))(torch.softmax(u @ u.T, dim=-1)))(
        x / x.norm(dim=-1, keepdim=True) if similarity == "cosine" else x), "not x.T"),
    ("z_only", lambda x, similarity="dot": _self(x, similarity)[0], "not only z"),
]

QKV_PROJECTION = [
    ("transposed_W", lambda x, a, b, c: (x @ a.T, x @ b.T, x @ c.T), "multiplies from the right"),
    ("q_and_k_swapped", lambda x, a, b, c: (x @ b, x @ a, x @ c), "in this order"),
    ("q_scaled", lambda x, a, b, c: (x @ a / math.sqrt(a.shape[-1]), x @ b, x @ c),
     "belongs to the scores"),
    ("torch_mm", lambda x, a, b, c: (torch.mm(x, a), torch.mm(x, b), torch.mm(x, c)),
     "broadcasts over the batch"),
    ("einsum_2d", lambda x, a, b, c: tuple(torch.einsum("td,de->te", x, w) for w in (a, b, c)),
     "broadcasts over the batch"),
]


class _Layer(nn.Module):
    """A single-head layer with one knob per mistake."""

    scale_by, softmax_dim, query_from, mix = "out", -1, "q", "v"

    def __init__(self, d_in, d_out):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_in, d_out, bias=False)
                                                 for _ in range(3))

    def forward(self, x):
        q = (self.q_proj if self.query_from == "q" else self.k_proj)(x)
        k, v = self.k_proj(x), self.v_proj(x)
        scale = {"out": k.shape[-1], "in": x.shape[-1], "none": 1}[self.scale_by]
        w = torch.softmax(q @ k.mT / math.sqrt(scale), dim=self.softmax_dim)
        return w @ {"v": v, "k": k, "x": x}[self.mix]


def _layer(**knobs):
    return type("SelfAttention", (_Layer,), knobs)


class _NoProjections(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_q = nn.Parameter(torch.randn(d_in, d_out))

    def forward(self, x):
        return x @ self.W_q


class _RawWeight(_Layer):
    def forward(self, x):  # x @ weight, forgetting that nn.Linear stores the transpose
        q, k, v = (x @ p.weight for p in (self.q_proj, self.k_proj, self.v_proj))
        return torch.softmax(q @ k.mT / math.sqrt(k.shape[-1]), dim=-1) @ v


SELF_ATTENTION_LAYER = [
    ("scaled_by_d_in", _layer(scale_by="in"), "not sqrt(d_in)"),
    ("unscaled", _layer(scale_by="none"), "sqrt(d_k) = sqrt(d_out)"),
    ("softmax_over_queries", _layer(softmax_dim=-2), "softmax over the keys"),
    ("queries_from_k_proj", _layer(query_from="k"), "queries come from q_proj"),
    ("no_projections", _NoProjections, "name the three projections"),
    ("x_at_weight", _RawWeight, "x @ weight^T"),
]


def _scores(q, k, divide):
    return q @ k.transpose(-2, -1) / divide(q, k)


ATTENTION_SCORES = [
    ("unscaled", lambda q, k: _scores(q, k, lambda q, k: 1.0), "variance grows"),
    ("divided_by_d_k", lambda q, k: _scores(q, k, lambda q, k: q.shape[-1]), "not by d_k"),
    ("divided_by_sqrt_T_k", lambda q, k: _scores(q, k, lambda q, k: math.sqrt(k.shape[-2])),
     "not their number"),
    ("transposed", lambda q, k: (k @ q.transpose(-2, -1)) / math.sqrt(q.shape[-1]),
     "row i is query i"),
    ("k_T_on_a_batch", lambda q, k: q @ k.T / math.sqrt(q.shape[-1]), "scores = q k^T"),
]


def _attn(q, k, v, divide=None, dim=-1, naive=False, detach=False):
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if divide is None
                                        else divide(q, k, v))
    if naive:
        w = scores.exp() / scores.exp().sum(-1, keepdim=True)
    else:
        w = torch.softmax(scores, dim=dim)
    out = w @ v
    return (out.detach(), w.detach()) if detach else (out, w)


ATTENTION = [
    ("unscaled", lambda q, k, v: _attn(q, k, v, divide=lambda q, k, v: 1.0),
     "spread does not grow"),
    ("divided_by_d_k", lambda q, k, v: _attn(q, k, v, divide=lambda q, k, v: q.shape[-1]),
     "not by d_k"),
    ("scaled_by_d_v", lambda q, k, v: _attn(q, k, v,
                                            divide=lambda q, k, v: math.sqrt(v.shape[-1])),
     "not sqrt(d_v)"),
    ("softmax_over_queries", lambda q, k, v: _attn(q, k, v, dim=-2), "softmax over the keys"),
    ("naive_softmax", lambda q, k, v: _attn(q, k, v, naive=True), "subtracts the row maximum"),
    ("detached", lambda q, k, v: _attn(q, k, v, detach=True), "no gradient reaches q"),
    ("out_only", lambda q, k, v: _attn(q, k, v)[0], "not only out"),
    ("k_T_on_a_batch", lambda q, k, v: (lambda w: (w @ v, w))(
        torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)), "not k.T"),
]


def _ones(t_q, t_k):
    return torch.ones(t_q, t_k, dtype=torch.bool)


CAUSAL_MASK = [
    ("diagonal_blocked", lambda t_q, t_k: _ones(t_q, t_k).tril(t_k - t_q - 1),
     "the diagonal is True"),
    ("one_too_many", lambda t_q, t_k: _ones(t_q, t_k).tril(t_k - t_q + 1), "the next token"),
    ("future_allowed", lambda t_q, t_k: _ones(t_q, t_k).triu(t_k - t_q), "allowed the future"),
    ("true_means_blocked", lambda t_q, t_k: ~_ones(t_q, t_k).tril(t_k - t_q),
     "nn.MultiheadAttention's convention"),
    ("top_left", lambda t_q, t_k: _ones(t_q, t_k).tril(), "bottom-right alignment"),
    ("float_mask", lambda t_q, t_k: _ones(t_q, t_k).tril(t_k - t_q).float(), "boolean mask"),
    ("square_only", lambda t_q, t_k: _ones(t_q, t_q).tril(), "bottom-right"),
]


def _pad(lengths, max_len, side, how):
    pos = torch.arange(max_len)[None, :]
    n = torch.tensor(lengths)[:, None]
    if how == "right_always":
        return pos < n
    if how == "off_by_one":
        return pos <= n if side == "right" else pos >= max_len - n - 1
    if how == "left_inverted":
        return pos < n if side == "right" else pos < max_len - n
    if how == "inverted":
        return ~(pos < n) if side == "right" else ~(pos >= max_len - n)
    if how == "longs":
        return (pos < n).long() if side == "right" else (pos >= max_len - n).long()
    # "max_of_lengths": the mask as wide as the longest sequence, not max_len
    width = max(lengths)
    pos = torch.arange(width)[None, :]
    return pos < n if side == "right" else pos >= width - n


PADDING_MASK = [
    ("side_ignored", lambda l, m, side="right": _pad(l, m, side, "right_always"),
     "puts the pads first"),
    ("off_by_one", lambda l, m, side="right": _pad(l, m, side, "off_by_one"), "off by one"),
    ("left_inverted", lambda l, m, side="right": _pad(l, m, side, "left_inverted"),
     "True marks the real tokens"),
    ("true_on_pads", lambda l, m, side="right": _pad(l, m, side, "inverted"),
     "True marks the real tokens"),
    ("integers", lambda l, m, side="right": _pad(l, m, side, "longs"), "boolean mask"),
    ("width_of_longest", lambda l, m, side="right": _pad(l, m, side, "max_of_lengths"),
     "(B, max_len)"),
]


def _masked(q, k, v, mask, how):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if how == "inverted":
        w = torch.softmax(scores.masked_fill(mask, -math.inf), dim=-1)
    elif how == "after":
        w = torch.softmax(scores, dim=-1) * mask
    elif how == "zero":
        w = torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)
    elif how == "big":
        w = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    elif how == "nan_to_num_out":  # the forward cleaned, the backward still NaN
        w = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)
        return torch.nan_to_num(w @ v), torch.nan_to_num(w)
    else:  # "nan"
        w = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)
    return w @ v, w


MASKED_ATTENTION = [
    ("true_read_backwards", lambda q, k, v, m: _masked(q, k, v, m, "inverted"),
     "not where it is True"),
    ("mask_after_softmax", lambda q, k, v, m: _masked(q, k, v, m, "after"),
     "not the weights after it"),
    ("zero_instead_of_minus_inf", lambda q, k, v, m: _masked(q, k, v, m, "zero"),
     "not 0: exp(0) = 1"),
    ("minus_1e9_rows_uniform", lambda q, k, v, m: _masked(q, k, v, m, "big"),
     "uniform weights"),
    ("minus_inf_rows_nan", lambda q, k, v, m: _masked(q, k, v, m, "nan"), "0 / 0 = NaN"),
    ("nan_cleaned_after_output", lambda q, k, v, m: _masked(q, k, v, m, "nan_to_num_out"),
     "the backward pass"),
]


def _split(x, h, how):
    b, t, d = x.shape
    if how == "view":
        return x.view(b, h, t, d // h)
    if how == "head_last":
        return x.view(b, t, d // h, h).permute(0, 3, 1, 2)
    if how == "no_transpose":
        return x.view(b, t, h, d // h)
    if how == "transpose_1_3":
        return x.view(b, t, h, d // h).transpose(1, 3)
    return torch.stack(x.chunk(h, dim=1), dim=1)  # "time": the sequence split, not the width


SPLIT_HEADS = [
    ("view_without_transpose", lambda x, h: _split(x, h, "view"), "view as (B, T, H, head_dim)"),
    ("head_axis_last", lambda x, h: _split(x, h, "head_last"), "not (B, T, head_dim, H)"),
    ("transpose_forgotten", lambda x, h: _split(x, h, "no_transpose"),
     "before the time axis"),
    ("wrong_axes_swapped", lambda x, h: _split(x, h, "transpose_1_3"), "scramble"),
    ("time_split", lambda x, h: _split(x, h, "time"), "not the time axis"),
]


def _merge(x, how):
    b, h, t, hd = x.shape
    if how == "reshape":
        return x.reshape(b, t, h * hd)
    if how == "view_after_transpose":
        return x.transpose(1, 2).view(b, t, h * hd)
    if how == "permuted":
        return x.permute(0, 2, 3, 1).reshape(b, t, h * hd)
    if how == "time_concat":
        return torch.cat(x.unbind(1), dim=1)
    return x.transpose(1, 2)  # "not_merged": (B, T, H, head_dim)


MERGE_HEADS = [
    ("reshape_without_transpose", lambda x: _merge(x, "reshape"), "transpose(1, 2) first"),
    ("view_of_transposed", lambda x: _merge(x, "view_after_transpose"), "not contiguous"),
    ("head_dim_before_heads", lambda x: _merge(x, "permuted"), "before head_dim"),
    ("concatenated_along_time", lambda x: _merge(x, "time_concat"), "not along time"),
    ("left_4_d", lambda x: _merge(x, "not_merged"), "three dimensions"),
]


class _MHA(nn.Module):
    """Multi-head attention with one knob per mistake."""

    split, merge, scale, use_out, invert = "right", "right", "head", True, False

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h = n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, mask=None):
        b, t, d = x.shape
        hd = d // self.h

        def heads(y):
            if self.split == "view":
                return y.view(b, self.h, t, hd)
            return y.view(b, t, self.h, hd).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        s = q @ k.transpose(-2, -1) / math.sqrt(hd if self.scale == "head" else d)
        if mask is not None:
            s = s.masked_fill(mask if self.invert else ~mask, -math.inf)
        out = torch.softmax(s, dim=-1) @ v
        out = out.reshape(b, t, d) if self.merge == "view" else \
            out.transpose(1, 2).reshape(b, t, d)
        return self.out_proj(out) if self.use_out else out


def _mha(**knobs):
    return type("MultiHeadAttention", (_MHA,), knobs)


class _MHAWithoutBias(_MHA):
    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)


MULTI_HEAD_ATTENTION = [
    ("view_without_transpose", _mha(split="view"), "view as (B, T, H, head_dim)"),
    ("merge_without_transpose", _mha(merge="view"), "merging the heads"),
    ("scaled_by_d_model", _mha(scale="model"), "not sqrt(d_model)"),
    ("no_out_proj", _mha(use_out=False), "go through out_proj"),
    ("mask_read_backwards", _mha(invert=True), "True means may attend"),
    ("no_bias", _MHAWithoutBias, "name the four projections"),
]


def _block(x, attn, ff, n1, n2, how):
    if how == "post":
        h = n1(x + attn(x))
        return n2(h + ff(h))
    if how == "residual_of_norm":
        h = n1(x)
        h = h + attn(h)
        g = n2(h)
        return g + ff(g)
    if how == "swapped":
        h = x + attn(n2(x))
        return h + ff(n1(h))
    if how == "parallel":
        return x + attn(n1(x)) + ff(n2(x))
    return ff(n2(attn(n1(x))))  # "no_residual"


PRE_NORM_BLOCK = [
    ("post_norm", lambda *a: _block(*a, "post"), "that is post-norm"),
    ("residual_from_normalised", lambda *a: _block(*a, "residual_of_norm"),
     "the residual adds the un-normalised x"),
    ("norms_swapped", lambda *a: _block(*a, "swapped"), "norm1 goes before the attention"),
    ("parallel_sublayers", lambda *a: _block(*a, "parallel"), "reads the output of the attention"),
    ("no_residual", lambda *a: _block(*a, "no_residual"), "the residual connection"),
]


def _table(t, d, swap=False, halves=False, per_column=False, start=0, base=10000.0):
    position = torch.arange(start, start + t, dtype=torch.float64)[:, None]
    even = torch.arange(0, d, 2, dtype=torch.float64)
    angle = position / base ** ((even / 2 if per_column else even) / d)
    a, b = (angle.cos(), angle.sin()) if swap else (angle.sin(), angle.cos())
    if halves:
        return torch.cat([a, b], dim=-1).float()
    return torch.stack([a, b], dim=-1).flatten(-2).float()


SINUSOIDAL_TABLE = [
    ("sin_cos_swapped", lambda t, d: _table(t, d, swap=True), "even columns hold the sine"),
    ("halves_not_interleaved", lambda t, d: _table(t, d, halves=True), "interleave"),
    ("exponent_i_for_2i", lambda t, d: _table(t, d, per_column=True), "you used i"),
    ("positions_from_1", lambda t, d: _table(t, d, start=1), "positions start at 0"),
    ("base_1000", lambda t, d: _table(t, d, base=1000.0), "the base is 10000"),
]


def _step(ck, cv, q, k, v, how):
    keys, values = torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)
    t_q, t_k = q.shape[2], keys.shape[2]
    ones = torch.ones(t_q, t_k, dtype=torch.bool)
    mask = {"top_left": ones.tril(), "none": ones, "minus_one": ones.tril(t_k - t_q - 1),
            "plus_one": ones.tril(t_k - t_q + 1)}.get(how, ones.tril(t_k - t_q))
    if how == "before":  # attend to the old cache only (nothing at first), then append
        w = torch.softmax(q @ ck.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return w @ cv, keys, values
    out, _ = ca.scaled_dot_product_attention(q, keys, values, mask)
    if how == "not_returned":
        return out, ck, cv
    if how == "wrong_axis":
        return out, torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)
    return out, keys, values


def _sdpa_causal_step(ck, cv, q, k, v):
    keys, values = torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)
    return F.scaled_dot_product_attention(q, keys, values, is_causal=True), keys, values


KV_CACHE_STEP = [
    ("attend_before_append", lambda *a: _step(*a, "before"), "append the new keys"),
    ("top_left_mask", lambda *a: _step(*a, "top_left"), "align the causal mask bottom-right"),
    ("torch_is_causal", _sdpa_causal_step, "is_causal=True"),
    ("no_mask_for_a_prompt", lambda *a: _step(*a, "none"), "must not see each other's future"),
    ("positions_minus_one", lambda *a: _step(*a, "minus_one"), "cache positions off by one"),
    ("positions_plus_one", lambda *a: _step(*a, "plus_one"), "cache positions off by one"),
    ("cache_not_returned", lambda *a: _step(*a, "not_returned"), "torch.cat([cache_k, k], dim=2)"),
    ("cache_on_head_axis", lambda *a: _step(*a, "wrong_axis"), "torch.cat([cache_k, k], dim=2)"),
]

POSITIONS = [
    ("arange", lambda m: torch.arange(m.shape[1]).expand_as(m), "first real token"),
    ("counting_from_1", lambda m: m.long().cumsum(-1), "positions start at 0"),
    ("down_the_batch", lambda m: m.long().cumsum(0) - 1, "not down the batch"),
    ("floats", lambda m: m.double().cumsum(-1) - 1, "integers (torch.long)"),
    ("pads_counted", lambda m: torch.arange(m.shape[1]).expand_as(m)
     - (~m).long().sum(-1, keepdim=True).clamp(max=0), "first real token"),
]


def _merge_state(a, b, how):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    if how == "no_rescale":
        return m, l_a + l_b, acc_a + acc_b
    if how == "l_only":
        return m, l_a * torch.exp(m_a - safe) + l_b * torch.exp(m_b - safe), acc_a + acc_b
    if how == "inverted":
        fa, fb = torch.exp(m - m_a), torch.exp(m - m_b)
        return m, fa * l_a + fb * l_b, fa * acc_a + fb * acc_b
    if how == "min":
        low = torch.minimum(m_a, m_b)
        fa, fb = torch.exp(m_a - low), torch.exp(m_b - low)
        return low, fa * l_a + fb * l_b, fa * acc_a + fb * acc_b
    fa, fb = torch.exp(m_a - m), torch.exp(m_b - m)  # "nan": -inf - (-inf) left alone
    return m, fa * l_a + fb * l_b, fa * acc_a + fb * acc_b


ONLINE_MERGE = [
    ("no_rescaling", lambda *s: _merge_state(s[:3], s[3:], "no_rescale"), "rescale each part"),
    ("acc_not_rescaled", lambda *s: _merge_state(s[:3], s[3:], "l_only"), "rescale acc as well"),
    ("factor_inverted", lambda *s: _merge_state(s[:3], s[3:], "inverted"), "not exp(m - m_a)"),
    ("smaller_maximum", lambda *s: _merge_state(s[:3], s[3:], "min"), "the larger of the two"),
    ("empty_parts_nan", lambda *s: _merge_state(s[:3], s[3:], "nan"), "-inf - (-inf) is NaN"),
]


def _tile(m, l, acc, q, k, v, how):  # noqa: E741
    s = q @ k.transpose(-2, -1) / (1.0 if how == "unscaled" else math.sqrt(q.shape[-1]))
    m_new = s.amax(-1, keepdim=True) if how == "block_max" else \
        torch.maximum(m, s.amax(-1, keepdim=True))
    p = torch.exp(s - (m if how == "old_max" else m_new))
    f = torch.exp(m - m_new)
    l_new = (l if how == "l_stale" else l * f) + p.sum(-1, keepdim=True)
    acc_new = (acc if how == "acc_stale" else acc * f) + p @ v
    if how == "normalised":
        acc_new = acc_new / l_new
    return m_new, l_new, acc_new


TILE_STEP = [
    ("acc_not_rescaled", lambda *a: _tile(*a, "acc_stale"), "rescale the old acc"),
    ("l_not_rescaled", lambda *a: _tile(*a, "l_stale"), "rescale the old l"),
    ("scores_unscaled", lambda *a: _tile(*a, "unscaled"), "1 / sqrt(d)"),
    ("block_maximum_only", lambda *a: _tile(*a, "block_max"), "not the block's maxima alone"),
    ("acc_normalised_each_tile", lambda *a: _tile(*a, "normalised"), "keep acc unnormalised"),
    ("exp_of_the_old_maximum", lambda *a: _tile(*a, "old_max"), "use the new maximum"),
]


def _rope(x, positions, how):
    d = x.shape[-1]
    pos = {"arange": torch.arange(x.shape[-2]), "shifted": positions + 1}.get(how, positions)
    exponent = torch.arange(d // 2, dtype=torch.float64) * (1 if how == "per_feature" else 2) / d
    theta = pos.to(torch.float64)[:, None] / 10000.0 ** exponent
    cos, sin = theta.cos(), theta.sin()
    if how == "halves":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    if how == "backwards":
        sin = -sin
    if how == "swapped":
        cos, sin = sin, cos
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


ROPE = [
    ("turned_backwards", lambda x, p: _rope(x, p, "backwards"), "turn by +angle"),
    ("cos_sin_swapped", lambda x, p: _rope(x, p, "swapped"), "cos and sin are swapped"),
    ("rotate_half_layout", lambda x, p: _rope(x, p, "halves"), "rotate_half layout"),
    ("frequency_per_feature", lambda x, p: _rope(x, p, "per_feature"), "the exponent uses 2i"),
    ("positions_ignored", lambda x, p: _rope(x, p, "arange"), "not by 0..T-1"),
    ("positions_from_1", lambda x, p: _rope(x, p, "shifted"), "positions start at 0"),
    ("identity", lambda x, p: x.clone(), "leaves x unchanged"),
]


def _rope_attn(q, k, v, positions, rotate="qk", causal=True):
    rq = ca.apply_rope(q, positions) if "q" in rotate else q
    rk = ca.apply_rope(k, positions) if "k" in rotate else k
    rv = ca.apply_rope(v, positions) if "v" in rotate else v
    return ca.scaled_dot_product_attention(rq, rk, rv, is_causal=causal)[0]


ROPE_ATTENTION = [
    ("values_rotated", lambda q, k, v, p: _rope_attn(q, k, v, p, "qkv"), "must not be rotated"),
    ("keys_not_rotated", lambda q, k, v, p: _rope_attn(q, k, v, p, "q"),
     "rotate the keys as well"),
    ("queries_not_rotated", lambda q, k, v, p: _rope_attn(q, k, v, p, "k"),
     "rotate the queries as well"),
    ("not_causal", lambda q, k, v, p: _rope_attn(q, k, v, p, causal=False),
     "mask the future keys"),
    ("positions_ignored", lambda q, k, v, p: _rope_attn(q, k, v, p, ""),
     "ignores the positions"),
]


def _window(t, w, how):
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    return {"wide": (j <= i) & (j >= i - w), "narrow": (j <= i) & (j > i - w + 1),
            "both_sides": (i - j).abs() < w, "no_diagonal": (j < i) & (j >= i - w),
            "inverted": ~((j <= i) & (j > i - w)),
            "floats": ((j <= i) & (j > i - w)).float()}[how]


SLIDING_WINDOW_MASK = [
    ("one_too_wide", lambda t, w: _window(t, w, "wide"), "keys i - W + 1 to i"),
    ("one_too_narrow", lambda t, w: _window(t, w, "narrow"), "itself included"),
    ("not_causal", lambda t, w: _window(t, w, "both_sides"), "the window is causal"),
    ("diagonal_blocked", lambda t, w: _window(t, w, "no_diagonal"), "the diagonal is True"),
    ("true_means_blocked", lambda t, w: _window(t, w, "inverted"), "True means may attend"),
    ("float_mask", lambda t, w: _window(t, w, "floats"), "boolean mask"),
]


def _window_mod(w, how):
    def mod(b, h, q_idx, kv_idx):
        i, j = q_idx, kv_idx
        if how == "wide":
            return (j <= i) & (j >= i - w)
        if how == "narrow":
            return (j <= i) & (j > i - w + 1)
        if how == "both_sides":
            return (i - j).abs() < w
        if how == "swapped":
            return (i <= j) & (i > j - w)
        if how == "fixed":
            return (j <= i) & (j < w)
        if how == "no_diagonal":
            return (j < i) & (i - j <= w)
        if how == "python_and":
            return (j <= i) and (j > i - w)
        if how == "int":
            return ((j <= i) & (j > i - w)).int()
        return ~((j <= i) & (j > i - w))  # "inverted"
    return mod


def _returns_tensor(w):  # the tensor mask of Exercise 10.7, not a mask_mod
    return ca.sliding_window_mask(8, window=w)


SLIDING_WINDOW_MASK_MOD = [
    ("one_too_wide", lambda w: _window_mod(w, "wide"), "kv_idx > q_idx - W"),
    ("one_too_narrow", lambda w: _window_mod(w, "narrow"), "the query's own included"),
    ("not_causal", lambda w: _window_mod(w, "both_sides"), "the window is causal"),
    ("q_and_kv_swapped", lambda w: _window_mod(w, "swapped"), "q_idx and kv_idx are swapped"),
    ("window_from_the_start", lambda w: _window_mod(w, "fixed"), "moves with the query"),
    ("diagonal_blocked", lambda w: _window_mod(w, "no_diagonal"), "may attend itself"),
    ("true_means_blocked", lambda w: _window_mod(w, "inverted"), "True means may attend"),
    ("python_and", lambda w: _window_mod(w, "python_and"), "combine the comparisons with &"),
    ("int_mask", lambda w: _window_mod(w, "int"), "boolean mask"),
    ("returns_the_tensor", _returns_tensor, "write a factory"),
]


def _document_mod(doc_ids, how):
    def mod(b, h, q_idx, kv_idx):
        if how == "itself":
            return doc_ids[b, kv_idx] == doc_ids[b, kv_idx]
        if how == "row_0":
            return doc_ids[0][q_idx] == doc_ids[0][kv_idx]
        if how == "earlier":
            return doc_ids[b, kv_idx] <= doc_ids[b, q_idx]
        if how == "causal":
            return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (kv_idx <= q_idx)
        if how == "shifted":
            return doc_ids[b, q_idx] == doc_ids[b, (kv_idx - 1).clamp(min=0)]
        if how == "python_bool":
            return True
        return doc_ids[b, q_idx] != doc_ids[b, kv_idx]  # "inverted"
    return mod


def _document_in_place(doc_ids):
    doc_ids -= doc_ids[:, :1].clone()  # ids from 0 in each row: the caller's ids changed
    return lambda b, h, q_idx, kv_idx: doc_ids[b, q_idx] == doc_ids[b, kv_idx]


DOCUMENT_MASK_MOD = [
    ("key_document_read_twice", lambda d: _document_mod(d, "itself"),
     "compared the query's document with itself"),
    ("row_0_for_every_row", lambda d: _document_mod(d, "row_0"), "read row b"),
    ("earlier_documents_allowed", lambda d: _document_mod(d, "earlier"),
     "its own document only"),
    ("causal_inside", lambda d: _document_mod(d, "causal"), "not causal"),
    ("key_read_one_back", lambda d: _document_mod(d, "shifted"), "no shift"),
    ("true_means_blocked", lambda d: _document_mod(d, "inverted"), "True means may attend"),
    ("python_true", lambda d: _document_mod(d, "python_bool"), "not a Python True"),
    ("ids_changed_in_place", _document_in_place, "in place"),
]


def _loss(logits, targets, how):
    flat, t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    if how == "sum":
        return F.cross_entropy(flat, t, reduction="sum")
    if how == "bits":
        return F.cross_entropy(flat, t) / math.log(2)
    if how == "double_softmax":
        return F.cross_entropy(flat.softmax(-1), t)
    if how == "shifted_again":
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               targets[:, 1:].reshape(-1))
    if how == "log_of_softmax":
        return -torch.log(torch.softmax(flat, -1)).gather(-1, t[:, None]).mean()
    if how == "per_position":
        return F.cross_entropy(flat, t, reduction="none")
    if how == "no_reshape":
        return F.cross_entropy(logits, targets)
    return torch.tensor(F.cross_entropy(flat, t).item())  # "item": no gradient


NEXT_TOKEN_LOSS = [
    ("summed", lambda lg, t: _loss(lg, t, "sum"), "do not sum"),
    ("in_bits", lambda lg, t: _loss(lg, t, "bits"), "natural log"),
    ("softmax_first", lambda lg, t: _loss(lg, t, "double_softmax"), "do not softmax them first"),
    ("targets_shifted_again", lambda lg, t: _loss(lg, t, "shifted_again"), "do not shift"),
    ("log_of_softmax", lambda lg, t: _loss(lg, t, "log_of_softmax"), "F.log_softmax"),
    ("per_position", lambda lg, t: _loss(lg, t, "per_position"), "return one number"),
    ("no_reshape", lambda lg, t: _loss(lg, t, "no_reshape"), "reshape to (B * T, N_vocab)"),
    ("detached", lambda lg, t: _loss(lg, t, "item"), "no gradient reaches logits"),
]


def _train(model, opt, x, y, how):
    if how != "no_zero_grad":
        opt.zero_grad()
    _, loss = model(x, y)
    if how == "step_before_backward":
        opt.step()
        loss.backward()
        return loss.item()
    if how == "summed":
        loss = loss * x.numel()
    loss.backward()
    if how == "zero_grad_before_step":
        opt.zero_grad()
    if how != "no_step":
        opt.step()
    if how == "loss_after_step":
        with torch.no_grad():
            return model(x, y)[1].item()
    return loss.item() / (x.numel() if how == "summed" else 1)


TRAINING_STEP = [
    ("no_step", lambda *a: _train(*a, "no_step"), "did not change"),
    ("no_zero_grad", lambda *a: _train(*a, "no_zero_grad"), "optimizer.zero_grad() before"),
    ("step_before_backward", lambda *a: _train(*a, "step_before_backward"), "in this order"),
    ("zero_grad_after_backward", lambda *a: _train(*a, "zero_grad_before_step"),
     "did not change"),
    ("loss_after_the_step", lambda *a: _train(*a, "loss_after_step"), "computed before"),
    ("sum_backpropagated", lambda *a: _train(*a, "summed"), "not the sum"),
]

# ------------------------------------------------------------------ issue 40: what slipped


def _softmax_in_place(x, temperature=1.0):
    x /= temperature  # the caller's scores, changed
    x -= x.amax(dim=-1, keepdim=True)
    x.exp_()
    x /= x.sum(dim=-1, keepdim=True)
    return x


SOFTMAX += [
    ("default_temperature_0.5", lambda x, temperature=0.5: _sm(x / temperature), "the default"),
    ("in_place", _softmax_in_place, "in place"),
    ("squeezed", lambda x, temperature=1.0: _sm(x / temperature).squeeze(), "size 1"),
    ("minimum_subtracted", lambda x, temperature=1.0: (lambda e: e / e.sum(-1, keepdim=True))(
        ((x - x.amin(-1, keepdim=True)) / temperature).exp()), "not the minimum"),
    ("over_dim_1", lambda x, temperature=1.0: _sm(x / temperature, dim=1), "last dimension"),
]


def _pool_detached(x, query):
    pooled, weights = _pool(x, query)
    weights = weights.detach()  # the weights cut from the graph
    return (weights.unsqueeze(-2) @ x).squeeze(-2), weights


def _pool_in_place(x, query):
    query /= math.sqrt(x.shape[-1])  # the caller's query, changed
    weights = torch.softmax((x @ query.unsqueeze(-1)).squeeze(-1), dim=-1)
    return (weights.unsqueeze(-2) @ x).squeeze(-2), weights


ATTENTION_POOL += [
    ("weights_detached", _pool_detached, "no gradient reaches query"),
    ("query_scaled_in_place", _pool_in_place, "in place"),
    ("squeezed", lambda x, q: tuple(t.squeeze() for t in _pool(x, q)), "size 1"),
    ("divided_by_sqrt_T", lambda x, q: _pool(x, q, divide=lambda x: math.sqrt(x.shape[-2])),
     "not sqrt(T)"),
]

SELF_ATTENTION += [
    ("cosine_by_default", lambda x, similarity="cosine": _self(x, similarity), "the default"),
    ("squeezed", lambda x, similarity="dot": tuple(t.squeeze(0) for t in _self(x, similarity)),
     "size 1"),
]


def _qkv_chunked(x, w_q, w_k, w_v):
    fused = x @ torch.cat([w_q, w_k, w_v], dim=-1)  # (..., T, 2 d_k + d_v)
    return fused.chunk(3, dim=-1)  # three equal parts: wrong when d_v != d_k


QKV_PROJECTION += [
    ("fused_chunk", _qkv_chunked, "equal chunks"),
]


class _BiasedLayer(_Layer):
    def __init__(self, d_in, d_out):
        super().__init__(d_in, d_out)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_in, d_out) for _ in range(3))


class _SqueezedLayer(_Layer):
    def forward(self, x):
        return super().forward(x).squeeze(0)


SELF_ATTENTION_LAYER += [
    ("mixes_the_keys", _layer(mix="k"), "not the keys"),
    ("with_biases", type("SelfAttention", (_BiasedLayer,), {}), "bias"),
    ("squeezed", type("SelfAttention", (_SqueezedLayer,), {}), "size 1"),
]


def _scores_in_place(q, k):
    q /= math.sqrt(q.shape[-1])  # the caller's queries, changed
    return q @ k.transpose(-2, -1)


ATTENTION_SCORES += [
    ("q_scaled_in_place", _scores_in_place, "in place"),
    ("squeezed", lambda q, k: _scores(q, k, lambda q, k: math.sqrt(q.shape[-1])).squeeze(),
     "size 1"),
]


def _attn_in_place(q, k, v):
    q /= math.sqrt(q.shape[-1])  # the caller's queries, changed
    w = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return w @ v, w


def _attn_double_scaled(q, k, v):
    q = q / math.sqrt(q.shape[-1])
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v, w


ATTENTION += [
    ("q_scaled_in_place", _attn_in_place, "in place"),
    ("double_scaled", _attn_double_scaled, "not by d_k"),
    ("squeezed", lambda q, k, v: tuple(t.squeeze() for t in _attn(q, k, v)), "size 1"),
]

CAUSAL_MASK += [
    ("squeezed", lambda t_q, t_k: _ones(t_q, t_k).tril(t_k - t_q).squeeze(), "size 1"),
    # transposed, a square causal mask is the future's: that is the hint it gets
    ("transposed", lambda t_q, t_k: _ones(t_k, t_q).triu(t_q - t_k), "allowed the future"),
]


def _pad_left_default(lengths, max_len, side="left"):
    pos, n = torch.arange(max_len)[None, :], torch.tensor(lengths)[:, None]
    return pos < n if side == "right" else pos >= max_len - n


def _pad_left_short(lengths, max_len, side="right"):
    pos, n = torch.arange(max_len)[None, :], torch.tensor(lengths)[:, None]
    return pos < n if side == "right" else pos > max_len - n  # one real token too few


PADDING_MASK += [
    ("left_by_default", _pad_left_default, "the default"),
    ("left_one_too_few", _pad_left_short, "off by one"),
]


def _masked_mask_in_place(q, k, v, mask):
    blocked = mask.logical_not_()  # the caller's mask, inverted in place
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(blocked, -math.inf)
    w = torch.nan_to_num(torch.softmax(scores, dim=-1))
    return w @ v, w


def _masked_fill_value(q, k, v, mask, value):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    w = torch.softmax(scores.masked_fill(~mask, value), dim=-1)
    return w @ v, w


def _masked_by_d_v(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])
    w = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)
    w = w.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return w @ v, w


MASKED_ATTENTION += [
    ("minus_1e4_rows_uniform", lambda q, k, v, m: _masked_fill_value(q, k, v, m, -1e4),
     "uniform weights"),
    ("mask_inverted_in_place", _masked_mask_in_place, "in place"),
    ("scaled_by_d_v", _masked_by_d_v, "sqrt(d_k)"),
    ("squeezed", lambda q, k, v, m: tuple(t.squeeze() for t in ca.scaled_dot_product_attention(
        q, k, v, m)), "size 1"),
]

SPLIT_HEADS += [
    ("squeezed", lambda x, h: ca.split_heads(x, h).squeeze(), "size 1"),
]

MERGE_HEADS += [
    ("squeezed", lambda x: ca.merge_heads(x).squeeze(), "size 1"),
]


class _MHACausalForAnyMask(_MHA):
    def forward(self, x, mask=None):
        return super().forward(x, None if mask is None else ca.causal_mask(x.shape[1]))


class _MHASqueezed(_MHA):
    def forward(self, x, mask=None):
        return super().forward(x, mask).squeeze()


MULTI_HEAD_ATTENTION += [
    ("causal_whenever_masked", type("MultiHeadAttention", (_MHACausalForAnyMask,), {}),
     "the mask you are given"),
    ("squeezed", type("MultiHeadAttention", (_MHASqueezed,), {}), "size 1"),
]


def _block_in_place(x, attn, ff, norm1, norm2):
    x += attn(norm1(x))  # the caller's x, changed
    x += ff(norm2(x))
    return x


PRE_NORM_BLOCK += [
    ("residual_added_in_place", _block_in_place, "in place"),
]

SINUSOIDAL_TABLE += [
    ("squeezed", lambda t, d: _table(t, d).squeeze(), "size 1"),
]


def _step_scaled_by_d_v(ck, cv, q, k, v):
    keys, values = torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)
    mask = ca.causal_mask(q.shape[2], keys.shape[2])
    scores = q @ keys.transpose(-2, -1) / math.sqrt(v.shape[-1])
    out = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1) @ values
    return out, keys, values


KV_CACHE_STEP += [
    ("scaled_by_d_v", _step_scaled_by_d_v, "not of v"),
    ("squeezed", lambda *a: tuple(t.squeeze() for t in _step(*a, "right")), "size 1"),
]

POSITIONS += [
    ("squeezed", lambda m: (m.long().cumsum(-1) - 1).squeeze(), "size 1"),
]


def _merge_in_place(m_a, l_a, acc_a, m_b, l_b, acc_b):
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    fa, fb = torch.exp(m_a - safe), torch.exp(m_b - safe)
    l_a.mul_(fa).add_(l_b * fb)  # the caller's l_a and acc_a, changed
    acc_a.mul_(fa).add_(acc_b * fb)
    return m, l_a, acc_a


ONLINE_MERGE += [
    ("a_updated_in_place", _merge_in_place, "in place"),
]


def _tile_in_place(m, l, acc, q, k, v):  # noqa: E741
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    p, f = torch.exp(s - m_new), torch.exp(m - m_new)
    l.mul_(f).add_(p.sum(-1, keepdim=True))  # the caller's state, changed
    acc.mul_(f).add_(p @ v)
    return m_new, l, acc


def _tile_by_d_v(m, l, acc, q, k, v):  # noqa: E741
    return _tile(m, l, acc, q * math.sqrt(q.shape[-1] / v.shape[-1]), k, v, "right")


TILE_STEP += [
    ("state_updated_in_place", _tile_in_place, "in place"),
    ("scaled_by_d_v", _tile_by_d_v, "not of v"),
]


def _rope_in_place(x, positions):
    rotated = _rope(x, positions, "right")
    x.copy_(rotated)  # the caller's x, changed
    return x


ROPE += [
    ("written_back_in_place", _rope_in_place, "in place"),
]


def _rope_attn_in_place(q, k, v, positions):
    q.copy_(ca.apply_rope(q, positions))  # the caller's q and k, changed
    k.copy_(ca.apply_rope(k, positions))
    return ca.scaled_dot_product_attention(q, k, v, is_causal=True)[0]


ROPE_ATTENTION += [
    ("scaled_by_d_v", lambda q, k, v, p: F.scaled_dot_product_attention(
        ca.apply_rope(q, p), ca.apply_rope(k, p), v, is_causal=True,
        scale=v.shape[-1] ** -0.5), "not of v"),
    ("rotated_in_place", _rope_attn_in_place, "in place"),
]

SLIDING_WINDOW_MASK += [
    ("squeezed", lambda t, w: ca.sliding_window_mask(t, window=w).squeeze(), "size 1"),
]

NEXT_TOKEN_LOSS += [
    ("label_smoothing", lambda lg, t: F.cross_entropy(lg.reshape(-1, lg.shape[-1]),
                                                      t.reshape(-1), label_smoothing=0.1),
     "no label smoothing"),
]


def _train_weight_decay(model, optimizer, x, y):
    for group in optimizer.param_groups:
        group["weight_decay"] = 1e-3
    return _train(model, optimizer, x, y, "right")


def _train_scaled_loss(model, optimizer, x, y):
    optimizer.zero_grad()
    _, loss = model(x, y)
    (1.009 * loss).backward()
    optimizer.step()
    return loss.item()


def _train_clipped(model, optimizer, x, y):
    optimizer.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the exercise has no clipping
    optimizer.step()
    return loss.item()


TRAINING_STEP += [
    ("gradients_clipped", _train_clipped, "no gradient clipping"),
    ("weight_decay_1e-3", _train_weight_decay, "nothing else"),
    ("loss_scaled_by_1.009", _train_scaled_loss, "no loss times a number"),
]

CATALOGUE = {
    "softmax": SOFTMAX,
    "attention_pool": ATTENTION_POOL,
    "self_attention": SELF_ATTENTION,
    "qkv_projection": QKV_PROJECTION,
    "self_attention_layer": SELF_ATTENTION_LAYER,
    "attention_scores": ATTENTION_SCORES,
    "attention": ATTENTION,
    "causal_mask": CAUSAL_MASK,
    "padding_mask": PADDING_MASK,
    "masked_attention": MASKED_ATTENTION,
    "split_heads": SPLIT_HEADS,
    "merge_heads": MERGE_HEADS,
    "multi_head_attention": MULTI_HEAD_ATTENTION,
    "pre_norm_block": PRE_NORM_BLOCK,
    "sinusoidal_table": SINUSOIDAL_TABLE,
    "kv_cache_step": KV_CACHE_STEP,
    "positions": POSITIONS,
    "online_merge": ONLINE_MERGE,
    "tile_step": TILE_STEP,
    "rope": ROPE,
    "rope_attention": ROPE_ATTENTION,
    "sliding_window_mask": SLIDING_WINDOW_MASK,
    "sliding_window_mask_mod": SLIDING_WINDOW_MASK_MOD,
    "document_mask_mod": DOCUMENT_MASK_MOD,
    "next_token_loss": NEXT_TOKEN_LOSS,
    "training_step": TRAINING_STEP,
}


# ------------------------------------------------------- more slips, found probing the kinds


def _attn_weights_first(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w, w @ v


def _masked_ignored(q, k, v, mask):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v, w


class _MHAMaskIgnored(_MHA):
    def forward(self, x, mask=None):
        return super().forward(x)


def _step_new_first(ck, cv, q, k, v):
    out, keys, values = _step(ck, cv, q, k, v, "right")
    return out, torch.cat([k, ck], dim=2), torch.cat([v, cv], dim=2)


ATTENTION_POOL += [
    ("softmax_over_the_batch", lambda x, q: (lambda w: ((w.unsqueeze(-2) @ x).squeeze(-2), w))(
        torch.softmax((x @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(x.shape[-1]), dim=0)),
     "the last dimension of the scores"),
]
SELF_ATTENTION_LAYER += [("mixes_x", _layer(mix="x"), "not the input x")]
ATTENTION += [
    ("weights_first", _attn_weights_first, "in this order"),
    ("mixes_the_keys", lambda q, k, v: (lambda w: (w @ k, w))(
        torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)),
     "not weights @ k"),
]
MASKED_ATTENTION += [("mask_ignored", _masked_ignored, "ignores the mask")]
MULTI_HEAD_ATTENTION += [
    ("mask_ignored", type("MultiHeadAttention", (_MHAMaskIgnored,), {}), "ignores the mask"),
]
KV_CACHE_STEP += [("new_keys_first", _step_new_first, "after the cached ones")]
SLIDING_WINDOW_MASK += [
    ("future_allowed", lambda t, w: (lambda i, j: i - j < w)(torch.arange(t)[:, None],
                                                           torch.arange(t)[None, :]),
     "the window is causal"),
]
NEXT_TOKEN_LOSS += [
    ("mean_over_sequences", lambda lg, t: F.cross_entropy(
        lg.reshape(-1, lg.shape[-1]), t.reshape(-1), reduction="sum") / lg.shape[0],
     "not over the B sequences"),
]

# ------------------------------------------------------- a fresh batch, written blind


def _softmax_sum_all(x, temperature=1.0):
    e = (x / temperature - (x / temperature).amax(-1, keepdim=True)).exp()
    return e / e.sum()  # the sum of the whole tensor


def _pool_mean(x, query):
    w = torch.softmax((x @ query.unsqueeze(-1)).squeeze(-1) / math.sqrt(x.shape[-1]), dim=-1)
    return (w.unsqueeze(-1) * x).mean(-2), w


def _attn_dropout(q, k, v):
    w = F.dropout(torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]), -1), 0.1)  # training=True
    return w @ v, w


def _masked_added(q, k, v, mask):
    w = torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]) + (~mask) * -1e9, dim=-1)
    return w @ v, w


def _table_d_minus_1(t, d):
    angle = torch.arange(t)[:, None] / 10000 ** (torch.arange(0, d, 2) / (d - 1))
    return torch.stack([angle.sin(), angle.cos()], -1).flatten(1)


def _train_step_twice(model, optimizer, x, y):
    optimizer.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.step()
    return loss.item()


def _train_l2(model, optimizer, x, y):
    optimizer.zero_grad()
    _, loss = model(x, y)
    (loss + 1e-4 * sum((p ** 2).sum() for p in model.parameters())).backward()
    optimizer.step()
    return loss.item()


SOFTMAX += [("sum_of_everything", _softmax_sum_all, "do not sum to 1")]
ATTENTION_POOL += [("mean_not_sum", _pool_mean, "do not average")]
ATTENTION_SCORES += [("divided_by_sqrt_T_q", lambda q, k: q @ k.mT / math.sqrt(q.shape[-2]),
                      "not their number")]
ATTENTION += [("dropout_left_on", _attn_dropout, "no dropout")]
CAUSAL_MASK += [("int8", lambda t_q, t_k: torch.ones(t_q, t_k).tril(t_k - t_q).to(torch.int8),
                 "boolean mask")]
MASKED_ATTENTION += [("minus_1e9_added", _masked_added, "adding -1e9")]
SINUSOIDAL_TABLE += [("exponent_over_d_minus_1", _table_d_minus_1, "PE[p, 2i] = sin")]
NEXT_TOKEN_LOSS += [("last_position_only", lambda lg, t: F.cross_entropy(lg[:, -1], t[:, -1]),
                     "not the last position only")]
TRAINING_STEP += [("stepped_twice", _train_step_twice, "step() once per batch"),
                  ("l2_penalty_in_the_loss", _train_l2, "nothing else")]

# ------------------------------------------------- the adversary's second round (issue 40)


def _sm16(x, temperature=1.0):  # divided first: 100 / 0.001 is inf in float16
    return _sm(x / temperature)


def _softmax_temperature_twice(x, temperature=1.0):
    s = x / temperature
    return _sm((s - s.amax(-1, keepdim=True)) / temperature)


def _positions_int32(attention_mask):
    return (attention_mask.long().cumsum(dim=1) - 1).int()  # the exercise says long


def _masked_empty_columns(q, k, v, mask):
    w = torch.softmax((q @ k.mT / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf), -1)
    w = torch.nan_to_num(w)
    empty = ~mask.any(dim=-2, keepdim=True).transpose(-2, -1)  # a column, not a row
    if empty.shape[-2] == w.shape[-2]:
        w = w.masked_fill(empty, 0.0)
    return w @ v, w


def _rope_attn_arange(q, k, v, positions):
    return _rope_attn(q, k, v, torch.arange(q.shape[-2]))


class _DetachedWeights(_Layer):
    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        w = torch.softmax(q @ k.mT / math.sqrt(k.shape[-1]), dim=-1).detach()
        return w @ v


def _loss_gather(logits, targets):  # the chapter's gather: -1 is out of range
    return -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).mean()


def _train_eval_mode(model, optimizer, x, y):
    model.eval()  # dropout off in a training step
    return _train(model, optimizer, x, y, "right")


def _train_sgd_by_hand(model, optimizer, x, y):
    lr = optimizer.param_groups[0]["lr"]
    model.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad  # plain SGD, whatever the optimizer
    return loss.item()


def _train_clip_half(model, optimizer, x, y):
    optimizer.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()
    return loss.item()


def _train_loss_times_batch(model, optimizer, x, y):
    optimizer.zero_grad()
    _, loss = model(x, y)
    (loss * x.shape[0]).backward()
    optimizer.step()
    return loss.item()


def _table_column_frequency(t, d):  # each column its own frequency
    angle = torch.arange(t, dtype=torch.float64)[:, None] / 10000 ** (
        torch.arange(d, dtype=torch.float64) / d)
    pe = angle.sin()
    pe[:, 1::2] = angle[:, 1::2].cos()
    return pe


class _MHASharedProjection(_MHA):
    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads)
        self.q_proj = self.k_proj = self.v_proj = nn.Linear(d_model, d_model)


def _attn_clamped(q, k, v):
    w = torch.softmax((q @ k.mT / math.sqrt(q.shape[-1])).clamp(-20, 20), dim=-1)  # "safe"
    return w @ v, w


def _masked_additive_inf(q, k, v, mask):
    add = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, -math.inf)
    w = torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]) + add, dim=-1)
    w = w.masked_fill(~mask.any(-1, keepdim=True), 0.0)  # the forward is right
    return w @ v, w


ATTENTION += [("scores_clamped", _attn_clamped, "do not clamp the scores")]
MASKED_ATTENTION += [("additive_minus_inf", _masked_additive_inf, "adding a 0 / -inf mask")]
PRE_NORM_BLOCK += [("attention_detached", lambda x, attn, ff, n1, n2: (lambda h: h + ff(n2(h)))(
    x + attn(n1(x)).detach()), "do not detach a sublayer's output")]
SOFTMAX += [("divided_before_the_shift", _sm16, "then divide by the temperature"),
            ("temperature_twice", _softmax_temperature_twice, "divide by the temperature once")]
SELF_ATTENTION += [("cosine_of_a_zero_vector", lambda x, similarity="dot": _self(x, similarity),
                    "no direction")]
SELF_ATTENTION_LAYER += [("weights_detached", type("SelfAttention", (_DetachedWeights,), {}),
                          "do not detach the attention weights")]
POSITIONS += [("int32", _positions_int32, "torch.long")]
MASKED_ATTENTION += [("empty_rows_found_in_columns", _masked_empty_columns, "mask.any(dim=-2)")]
ROPE_ATTENTION += [("arange_not_positions", _rope_attn_arange, "the positions given")]
SINUSOIDAL_TABLE += [("one_frequency_per_column", _table_column_frequency, "not one of its own"),
                     ("float16", lambda t, d: _table(t, d).half(), "half precision")]
PRE_NORM_BLOCK += [("norm1_twice", lambda x, attn, ff, n1, n2: (lambda h: h + ff(n1(h)))(
    x + attn(n1(x))), "not norm1 twice")]
MULTI_HEAD_ATTENTION += [("one_projection_three_names",
                          type("MultiHeadAttention", (_MHASharedProjection,), {}),
                          "a layer of its own")]
NEXT_TOKEN_LOSS += [
    ("float32_loss", lambda lg, t: F.cross_entropy(lg.float().flatten(0, 1), t.flatten()),
     "keep the logits' dtype"),
    ("gather_on_minus_1", _loss_gather, "ignore_index=-1"),
    ("ignore_index_0", lambda lg, t: F.cross_entropy(lg.flatten(0, 1), t.flatten(),
                                                     ignore_index=0), "token 0 too"),
]
TRAINING_STEP += [("eval_mode", _train_eval_mode, "dropout must stay on"),
                  ("sgd_by_hand", _train_sgd_by_hand, "let the optimizer update"),
                  ("clipped_at_0.5", _train_clip_half, "no gradient clipping"),
                  ("loss_times_batch_size", _train_loss_times_batch, "times the batch size")]

#: The kinds of bug that passed the checks of issue 34, and the entries that have them.
KINDS = {
    "changes an argument in place": [
        ("softmax", "in_place"), ("attention_pool", "query_scaled_in_place"),
        ("attention_scores", "q_scaled_in_place"), ("attention", "q_scaled_in_place"),
        ("masked_attention", "mask_inverted_in_place"),
        ("pre_norm_block", "residual_added_in_place"), ("online_merge", "a_updated_in_place"),
        ("tile_step", "state_updated_in_place"), ("rope", "written_back_in_place"),
        ("rope_attention", "rotated_in_place")],
    "drops a size-1 dimension": [
        (name, "squeezed") for name in (
            "softmax", "attention_pool", "self_attention", "self_attention_layer",
            "attention_scores", "attention", "causal_mask", "masked_attention", "split_heads",
            "merge_heads", "multi_head_attention", "sinusoidal_table", "kv_cache_step",
            "positions", "sliding_window_mask")],
    "mixes up d_k and d_v": [
        ("qkv_projection", "fused_chunk"), ("masked_attention", "scaled_by_d_v"),
        ("rope_attention", "scaled_by_d_v"),
        ("kv_cache_step", "scaled_by_d_v"), ("tile_step", "scaled_by_d_v")],
    "has a bias the exercise does not": [("self_attention_layer", "with_biases")],
    "detaches the gradient": [
        ("attention_pool", "weights_detached"), ("attention", "detached"),
        ("next_token_loss", "detached"), ("self_attention_layer", "weights_detached"),
        ("pre_norm_block", "attention_detached")],
    "makes every mask causal": [("multi_head_attention", "causal_whenever_masked")],
    "trains a little off": [
        ("training_step", "weight_decay_1e-3"), ("training_step", "loss_scaled_by_1.009")],
}
