"""Worked examples of the source articles (SEEDS.md), Chapters 3 and 4, corrected values pinned."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from course_attn import SelfAttention, scaled_dot_product_attention

# ---------------------------------------------------- seed 001: two tokens, Q/K/V by hand

X_001 = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.float64)
W_Q_001 = torch.tensor([[1, 2, 0], [0, 1, 1], [1, 0, 1], [2, 1, 0]], dtype=torch.float64)
W_K_001 = torch.tensor([[0, 1, 1], [1, 0, 2], [2, 1, 0], [0, 2, 1]], dtype=torch.float64)
W_V_001 = torch.tensor([[1, 0], [0, 2], [2, 1], [1, 1]], dtype=torch.float64)


def test_seed_001_projections():
    # row-vector convention of the article: Q = X W_Q
    assert_close(X_001 @ W_Q_001, torch.tensor([[2.0, 2, 1], [2, 2, 1]], dtype=torch.float64))
    assert_close(X_001 @ W_K_001, torch.tensor([[2.0, 2, 1], [1, 2, 3]], dtype=torch.float64))
    assert_close(X_001 @ W_V_001, torch.tensor([[3.0, 1], [1, 3]], dtype=torch.float64))


def test_seed_001_finished_tied_scores_give_a_plain_average():
    q, k, v = X_001 @ W_Q_001, X_001 @ W_K_001, X_001 @ W_V_001
    out, weights = scaled_dot_product_attention(q, k, v)
    scaled_scores = q @ k.T / math.sqrt(3)  # d_k = 3
    assert_close(scaled_scores, torch.full((2, 2), 9 / math.sqrt(3), dtype=torch.float64))
    assert round(9 / math.sqrt(3), 3) == 5.196
    assert_close(weights, torch.full((2, 2), 0.5, dtype=torch.float64))
    assert_close(out, torch.full((2, 2), 2.0, dtype=torch.float64))


def test_seed_001_through_the_layer_needs_the_transposed_matrices():
    layer = SelfAttention(4, 3).double()
    with torch.no_grad():  # nn.Linear computes x @ weight.T, so weight = W.T
        layer.q_proj.weight.copy_(W_Q_001.T)
        layer.k_proj.weight.copy_(W_K_001.T)
    # SelfAttention has d_v = d_out = 3: pad W_V with a zero column; the output gets a zero column
    w_v = torch.cat([W_V_001, torch.zeros(4, 1, dtype=torch.float64)], dim=1)  # (4, 3)
    with torch.no_grad():
        layer.v_proj.weight.copy_(w_v.T)
    out, weights = layer(X_001[None], need_weights=True)
    assert_close(weights[0], torch.full((2, 2), 0.5, dtype=torch.float64))
    assert_close(out[0], torch.tensor([[2.0, 2, 0], [2, 2, 0]], dtype=torch.float64))
    # copying W_Q without the transpose is a shape error here: (4, 3) is not (3, 4)
    assert layer.q_proj.weight.shape != W_Q_001.shape


# -------------------------------------------- seed 004: a 4x3 input, errors in the article

X_004 = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], dtype=torch.float64)
W_004 = torch.tensor([[1, 0], [0, 1], [1, 1]], dtype=torch.float64)  # W_Q = W_K = W_V


def test_seed_004_projections_are_not_what_the_article_printed():
    q = X_004 @ W_004  # (4, 3) @ (3, 2) -> (4, 2)
    correct = torch.tensor([[4.0, 5], [10, 11], [16, 17], [22, 23]], dtype=torch.float64)
    assert_close(q, correct)
    assert not torch.equal(q[1], torch.tensor([7.0, 11], dtype=torch.float64))  # printed row 2
    assert not torch.equal(q[3], torch.tensor([23.0, 23], dtype=torch.float64))  # printed row 4


def test_seed_004_scores():
    q = X_004 @ W_004
    expected = torch.tensor([[41.0, 95, 149, 203], [95, 221, 347, 473],
                             [149, 347, 545, 743], [203, 473, 743, 1013]], dtype=torch.float64)
    assert_close(q @ q.T, expected)


def test_seed_004_weights_are_one_hot_on_the_last_key_with_and_without_scaling():
    q = X_004 @ W_004
    one_hot = torch.zeros(4, 4, dtype=torch.float64)
    one_hot[:, -1] = 1.0
    for scale in (1.0, None):  # the article's unscaled version, and 1/sqrt(d_k) = 1/sqrt(2)
        out, weights = scaled_dot_product_attention(q, q, q, scale=scale)
        assert_close(weights.round(decimals=4), one_hot)
        assert_close(out.round(decimals=4), torch.tensor([[22.0, 23]] * 4, dtype=torch.float64))
        assert_close(weights.sum(-1), torch.ones(4, dtype=torch.float64))
    # the first row is the least saturated; even there the last key dominates by e^(-38)
    _, scaled = scaled_dot_product_attention(q, q, q)
    assert scaled[0, 2] < 1e-16 and scaled[0, 2] > 0
