"""Checks for chapter 11: the next-token loss, and one training step of a MiniGPT.

The loss is held to numbers known exactly: uniform logits cost ``ln N_vocab`` per token,
and the copy task's oracle reaches the task's loss floor (section 11.2). The training step
is held to the package's step on an identical model and batch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.tasks import CopyTask
from ..models.gpt import GPTConfig, MiniGPT
from ..models.gpt import next_token_loss as reference_loss
from .basics import TIGHT, randn
from .report import CheckResult, Run, has_nan, like, run_check, section

__all__ = ["next_token_loss", "training_step"]

F64 = torch.float64


# ----------------------------------------------------------------------- next_token_loss

LOSS_PLAN = (
    "uniform logits (2, 5, 16): the loss before training is ln 16 (11.2)",
    "the copy task's oracle logits (8, 23, 16): exactly the loss floor (11.2)",
    "random logits (3, 7, 11), float64, against F.cross_entropy",
    "logits 1000 apart: no inf or NaN (log_softmax, not log of softmax) (1.6)",
    "float64 gradient of the loss with respect to the logits",
)


def _oracle(task: CopyTask, targets: Tensor) -> Tensor:
    """Section 11.2's oracle: uniform on the noise, certain of every copied token."""
    batch, n = targets.shape[0], task.half_length
    logits = torch.zeros(batch, task.context_length, task.vocab_size, dtype=F64)
    logits[:, n - 1:] = -1e9  # on the copy: every token impossible ...
    logits[:, n - 1:].scatter_(2, targets[:, n - 1:, None], 0.0)  # ... but the right one
    return logits


def _loss_body(run: Run, fn: Callable[..., Any]) -> None:
    hint = (f"the mean cross-entropy over every position of every sequence: "
            f"F.cross_entropy(logits.reshape(-1, N_vocab), targets.reshape(-1)) "
            f"({section('11.2')})")
    reshape_hint = (f"F.cross_entropy wants logits (N, C) and targets (N,): reshape to (B * T, "
                    f"N_vocab) and (B * T,) ({section('11.2')})")

    def check(case: str, logits: Tensor, targets: Tensor, inputs: str, case_hint: str) -> Any:
        got = run.call(case, inputs, lambda: fn(logits, targets.clone()), case_hint,
                       errors=[("Expected target size", reshape_hint),
                               ("expected target size", reshape_hint)])
        n_vocab = logits.shape[-1]
        flat, flat_t = logits.detach().reshape(-1, n_vocab), targets.reshape(-1)
        expected = reference_loss(logits.detach(), targets).item()
        run.compare(case, inputs, got, expected, case_hint, atol=1e-6, rtol=1e-6, mistakes=[
            (lambda g: isinstance(g, Tensor) and g.numel() != 1,
             f"return one number, the mean over all B * T positions (a scalar tensor) "
             f"({section('11.2')})"),
            (like(lambda: F.cross_entropy(flat, flat_t, reduction="sum").item(),
                  atol=1e-6, rtol=1e-6),
             f"average over the B * T positions (the mean), do not sum ({section('11.2')})"),
            (like(lambda: expected / math.log(2), atol=1e-6, rtol=1e-6),
             f"use the natural log (nats): ln N_vocab is the uniform guess's loss "
             f"({section('11.2')})"),
            (like(lambda: F.cross_entropy(flat.softmax(-1), flat_t).item(), atol=1e-6,
                  rtol=1e-6),
             f"F.cross_entropy takes the raw logits and applies log_softmax itself: do not "
             f"softmax them first ({section('11.2')})"),
            (like(lambda: reference_loss(logits.detach()[:, :-1], targets[:, 1:]).item(),
                  atol=1e-6, rtol=1e-6),
             f"the targets are already the next tokens (y is x shifted by one): do not shift "
             f"them again ({section('11.2')})"),
            (lambda g: has_nan(g) or (isinstance(g, Tensor | float) and math.isinf(float(g))),
             f"log(softmax(...)) underflows to log 0 = -inf for logits far below the top: use "
             f"F.log_softmax or F.cross_entropy, which subtract the maximum ({section('1.6')})"),
        ])
        run.passed(case)
        return got

    gen = torch.Generator().manual_seed(18)
    targets = torch.randint(0, 16, (2, 5), generator=gen)
    uniform = torch.zeros(2, 5, 16, dtype=F64)
    check(LOSS_PLAN[0], uniform, targets, "logits = zeros (2, 5, 16), float64; random targets "
          "(2, 5), seed 18",
          f"uniform logits give every token probability 1/16: the loss is ln 16 = 2.77 nats "
          f"({section('11.2')})")
    task = CopyTask(vocab_size=16, half_length=12)
    _, ys = task.get_batch("val", 8, generator=torch.Generator().manual_seed(1))
    check(LOSS_PLAN[1], _oracle(task, ys), ys, "section 11.2's oracle logits for 8 copy-task "
          "sequences (vocabulary 16, half length 12), float64, seed 1",
          f"the oracle is uniform on the noise and certain on the copy: its mean loss is the "
          f"floor (n - 1) ln N_vocab / (2n - 1) ({section('11.2')})")
    logits, targets = randn(gen, 3, 7, 11, scale=2.0), torch.randint(0, 11, (3, 7),
                                                                     generator=gen)
    check(LOSS_PLAN[2], logits, targets, "random logits (3, 7, 11) and targets (3, 7), "
          "float64, seed 18", hint)
    big = logits.clone()
    big[..., 0] += 1000.0
    check(LOSS_PLAN[3], big, targets, "the logits above with 1000 added to token 0's, so the "
          "other tokens lie 1000 below",
          f"use F.cross_entropy or F.log_softmax, never log(softmax(...)) ({section('1.6')})")

    case = LOSS_PLAN[4]
    leaf = logits.clone().requires_grad_(True)
    inputs = "the random logits above with requires_grad=True"
    grad_hint = (f"keep the loss a differentiable torch scalar: no .item(), no numpy "
                 f"({section('11.2')})")
    got = run.call(case, inputs, lambda: fn(leaf, targets.clone()), grad_hint)
    if not isinstance(got, Tensor) or not got.requires_grad:
        run.fail(case, inputs, "a scalar tensor that carries a gradient",
                 "a value detached from the logits", grad_hint)
    assert isinstance(got, Tensor)  # for the type checker; fail() raised otherwise
    grad = run.call(case, inputs, lambda: torch.autograd.grad(got.sum(), leaf)[0], grad_hint)
    ref_leaf = logits.clone().requires_grad_(True)
    expected = torch.autograd.grad(reference_loss(ref_leaf, targets), ref_leaf)[0]
    run.compare(case, inputs, grad, expected, hint, **TIGHT)
    run.passed(case)


def next_token_loss(fn: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """Check the language-model loss, ``fn(logits, targets) -> scalar`` (Chapter 11).

    ``logits (B, T, N_vocab)``, ``targets (B, T)`` token ids (already the next tokens);
    returns the mean cross-entropy over the ``B * T`` positions, in nats, as a scalar tensor
    that carries a gradient. Uniform logits give ``ln N_vocab``; the copy task's oracle
    gives the task's loss floor (section 11.2).
    """
    return run_check("next_token_loss", LOSS_PLAN, fn, _loss_body)


# ------------------------------------------------------------------------- training_step

STEP_PLAN = (
    "one step of a MiniGPT on a copy-task batch, SGD: the loss before the update, and the "
    "update of every parameter (11.2)",
    "a second step on a new batch: its update uses only this batch's gradient (11.2)",
)


def _updates(before: list[Tensor], model: nn.Module) -> Tensor:
    """Every parameter's change since ``before``, flattened into one vector."""
    return torch.cat([(p.detach() - b).reshape(-1) for b, p in zip(before, model.parameters(),
                                                                     strict=True)])


def _step_body(run: Run, fn: Callable[..., Any]) -> None:
    task = CopyTask(vocab_size=8, half_length=4)
    config = GPTConfig(vocab_size=8, context_length=task.context_length, n_layers=1,
                       n_heads=2, d_model=16)
    reference = MiniGPT(config).double()
    mine = copy.deepcopy(reference)
    lr = 0.5
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    my_opt = torch.optim.SGD(mine.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(19)
    hint = (f"optimizer.zero_grad(); _, loss = model(x, y); loss.backward(); "
            f"optimizer.step(); return the loss ({section('11.2')})")

    def reference_step(x: Tensor, y: Tensor) -> float:
        ref_opt.zero_grad()
        _, loss = reference(x, y)
        assert loss is not None  # targets were given
        loss.backward()
        ref_opt.step()
        return loss.item()

    def check(case: str, inputs: str) -> None:
        x, y = task.get_batch("train", 4, generator=gen)
        before = [p.detach().clone() for p in mine.parameters()]
        ref_before = [p.detach().clone() for p in reference.parameters()]
        got = run.call(case, inputs, lambda: fn(mine, my_opt, x, y), hint)
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        expected_loss = reference_step(x, y)
        run.compare(case, inputs + ": the loss returned", got, expected_loss, hint,
                    atol=1e-9, rtol=1e-7, mistakes=[
            (lambda g: isinstance(g, float) and g < expected_loss,
             f"return the loss computed before the update, the one that was backpropagated, "
             f"not a loss recomputed after optimizer.step() ({section('11.2')})"),
        ])
        mine_update, ref_update = _updates(before, mine), _updates(ref_before, reference)
        # Relative to the update's size: a notebook's perturbed run nudges every gradient
        # an optimiser uses by up to 1e-3, and the mistakes change it by far more.
        scale = float(ref_update.abs().max())
        run.compare(case, inputs + ": every parameter's change", mine_update, ref_update, hint,
                    atol=1e-2 * scale, rtol=1e-2, mistakes=[
            (lambda g: isinstance(g, Tensor) and bool((g == 0).all()),
             f"the parameters did not change: call loss.backward() and then optimizer.step(), "
             f"in this order ({section('11.2')})"),
            (lambda g: bool(previous) and like(lambda: ref_update + previous[-1],
                                               atol=1e-2 * scale, rtol=1e-2)(g),
             f"call optimizer.zero_grad() before loss.backward(): PyTorch adds new gradients "
             f"to the old ones, so this step also used the last batch's ({section('11.2')})"),
            (like(lambda: ref_update * x.numel(), atol=1e-2 * scale * x.numel(), rtol=1e-2),
             f"backpropagate the mean loss (the one model(x, y) returns), not the sum "
             f"({section('11.2')})"),
        ])
        run.passed(case)
        previous.append(ref_update)
        with torch.no_grad():  # the next step starts from the reference's parameters: a
            for p, r in zip(mine.parameters(), reference.parameters(), strict=True):
                p.copy_(r)  # perturbed run's nudged gradients must not move its loss

    previous: list[Tensor] = []  # the reference's last update (what a stale gradient adds)
    check(STEP_PLAN[0], "a MiniGPT (1 layer, 2 heads, width 16, float64), SGD lr 0.5, a copy "
          "batch (4, 7) of vocabulary 8, seed 19")
    check(STEP_PLAN[1], "the same model and optimizer, the next batch (4, 7)")


def training_step(fn: Callable[..., float]) -> CheckResult:
    """Check one training step, ``fn(model, optimizer, x, y) -> loss`` (Chapter 11).

    ``model`` is a ``MiniGPT`` (``model(x, y)`` returns ``(logits, loss)``), ``optimizer``
    an optimizer over its parameters, ``x, y (B, T)`` a batch of inputs and next-token
    targets. One step zeroes the gradients, computes the loss, backpropagates it and
    updates the parameters; it returns that loss (a float or a scalar tensor). The check
    uses SGD and compares the loss and every parameter's change with the package's step
    on an identical model (section 11.2).
    """
    return run_check("training_step", STEP_PLAN, fn, _step_body)

