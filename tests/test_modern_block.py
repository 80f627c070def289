"""RMSNorm and SwiGLU, the parts of a 2026 decoder block (chapter 7), against references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from course_attn import FeedForward, GPTConfig, MiniGPT, TransformerBlock
from course_attn.core.layers import make_norm

D = 16


def test_rmsnorm_is_x_over_its_root_mean_square_times_a_gain():
    norm = make_norm("rms", D).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, D, dtype=torch.float64)
    eps = torch.finfo(torch.float64).eps if norm.eps is None else norm.eps
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm.weight
    assert_close(norm(x), expected, rtol=0, atol=1e-12)
    assert sum(p.numel() for p in norm.parameters()) == D  # a gain, no bias, no centring
    shifted = x + 3.0  # unlike LayerNorm, a shift changes the output
    assert not torch.allclose(norm(shifted), norm(x))


def test_swiglu_is_silu_of_the_gate_times_the_value():
    torch.manual_seed(0)
    ff = FeedForward(D, 24, activation="swiglu", bias=False).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    w_gate, w_value = ff.linear1.weight[:24], ff.linear1.weight[24:]  # (d_ff, D) each
    hidden = F.silu(x @ w_gate.T) * (x @ w_value.T)  # (B, T, d_ff)
    assert_close(ff(x), hidden @ ff.linear2.weight.T, rtol=0, atol=1e-12)
    assert ff.linear1.weight.shape == (48, D) and ff.linear2.weight.shape == (D, 24)


@pytest.mark.parametrize(("norm", "activation"), [("rms", "gelu"), ("layer", "swiglu"),
                                                  ("rms", "swiglu")])
def test_a_block_and_a_model_take_the_modern_parts(norm, activation):
    block = TransformerBlock(D, 4, norm=norm, activation=activation)
    assert isinstance(block.norm1, torch.nn.RMSNorm if norm == "rms" else torch.nn.LayerNorm)
    assert block.ff.gated == (activation == "swiglu")
    x = torch.randn(2, 5, D)
    assert block(x, is_causal=True).shape == (2, 5, D)
    config = GPTConfig(vocab_size=9, context_length=8, n_layers=2, n_heads=2, d_model=D,
                       norm=norm, activation=activation)
    model = MiniGPT(config)
    idx = torch.randint(9, (2, 6))
    logits, loss = model(idx, idx)
    loss.backward()
    assert logits.shape == (2, 6, 9) and torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    assert isinstance(model.norm, torch.nn.RMSNorm if norm == "rms" else torch.nn.LayerNorm)


def test_unknown_parts_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"^norm must be one of \('layer', 'rms'\)"):
        TransformerBlock(D, 4, norm="batch")
    with pytest.raises(ValueError, match=r"^activation must be one of"):
        GPTConfig(vocab_size=9, context_length=8, activation="tanh")
