"""nanoGPT's model as the yardstick of chapter 11 (course_attn.lab.nanogpt).

It is nanoGPT's GPT-2 layout, so it has exactly MiniGPT's parameters for the same sizes and
bias setting, and its loss is nanoGPT's mean cross-entropy. A training step of MiniGPT
dispatches at most nanoGPT's operators (issue 42's budget), though its loss spends five more
on a batch whose targets are all left out (a loss of 0 where a plain mean gives 0/0 = NaN):
the fused projection splits q, k and v into heads with three operators where nanoGPT's
split-view-transpose takes seven.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_attn import GPTConfig, MiniGPT, NanoGPT, NanoGPTConfig
from course_attn.lab.measure import count_ops


def pair(bias: bool, dropout: float = 0.0, device: str = "cpu"):
    with torch.device(device):
        course = MiniGPT(GPTConfig(vocab_size=65, context_length=32, n_layers=2, n_heads=4,
                                   d_model=64, dropout=dropout, bias=bias, impl="sdpa"))
        nano = NanoGPT(NanoGPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=4,
                                     n_embd=64, dropout=dropout, bias=bias))
    return course, nano


@pytest.mark.parametrize("bias", [False, True])
def test_the_same_parameters_as_minigpt(bias):
    course, nano = pair(bias)
    assert sum(p.numel() for p in course.parameters()) == sum(
        p.numel() for p in nano.parameters())


def test_forward_and_loss():
    torch.manual_seed(0)
    _, nano = pair(False)
    idx = torch.randint(65, (2, 8))
    logits, loss = nano(idx, idx)
    assert logits.shape == (2, 8, 65) and loss is not None
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, 65), idx.view(-1)))
    last, none = nano(idx)
    assert last.shape == (2, 1, 65) and none is None


@pytest.mark.parametrize("bias", [False, True])
def test_a_training_step_of_minigpt_costs_at_most_nanogpts_operators(bias):
    def step_ops(model: torch.nn.Module) -> int:
        with torch.device("meta"):
            idx = torch.randint(65, (4, 32))
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)

        def step() -> None:
            _, loss = model(idx, idx)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # AdamW's state is made at the first step
        return count_ops(step)

    course, nano = pair(bias, dropout=0.2, device="meta")
    course.train()
    nano.train()
    assert step_ops(course) <= step_ops(nano)
