"""Checks for chapter 11: the next-token loss, and one training step of a MiniGPT.

The loss is held to numbers known exactly: uniform logits cost ``ln N_vocab`` per token,
and the copy task's oracle reaches the task's loss floor (section 11.2); targets of ``-1``
count for nothing and 16-bit logits are upcast, as in ``MiniGPT``'s loss. The training step
runs on copies of one MiniGPT: twice with SGD, from the same parameters each time (the
second with the first step's gradients still there), once with dropout in training mode
(the same random masks for both steps) and once with AdamW. Every parameter's change is
held to the reference step's within 0.3%: tight enough that a loss scaled by 1% or a
weight decay of 1e-3 fails, loose enough for ``make nbval-perturbed``, which nudges each
gradient an optimizer uses by up to 0.1% (in both steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.tasks import CopyTask
from ..models.gpt import GPTConfig, MiniGPT
from ..models.gpt import next_token_loss as reference_loss
from .common import F64, gen, gradient_properties, randn
from .harness import gradients
from .report import CheckResult, section
from .runner import Case, Check, Harness, Inputs, Mistake, Property, args, call, run_check
from .values import FLOAT32, TIGHT, Tolerance

__all__ = ["next_token_loss", "training_step"]


# ----------------------------------------------------------------------- next_token_loss


def _number(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
    """The loss as a Python number when it is one (a scalar tensor or a float)."""
    loss = call(fn, positional, keyword)
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss.item()
    return loss


def _loss_tensor(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
    """The loss as a tensor of shape (), its dtype kept: float64 logits give a float64 loss."""
    loss = call(fn, positional, keyword)
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss.detach().reshape(())
    return loss


def _loss_width(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
    """The loss of 16-bit logits as a number, and whether it came in half precision (a loss
    computed in float32 or float64 will do)."""
    loss = call(fn, positional, keyword)
    if isinstance(loss, Tensor) and loss.numel() == 1:
        width = "16-bit" if loss.dtype in (torch.float16, torch.bfloat16) else \
            "float32 or wider"
        return loss.item(), f"a loss in {width}"
    return loss


def _flat(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)


UPCAST_HINT = (f"upcast 16-bit logits to float32 before the loss, logits.float(): float16 "
               f"holds about 3 significant digits, too few for a log-softmax over the "
               f"vocabulary and a mean over every position ({section('11.2')})")
IGNORED_HINT = (f"a target of -1 marks a position that counts for nothing (padding): "
                f"F.cross_entropy(..., ignore_index=-1), or leave those positions out of the "
                f"sum and the count before a gather ({section('11.2')})")

LOSS_MISTAKES = (
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t), reduction="none"),
            f"return one number, the mean over all B * T positions (a scalar tensor) "
            f"({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t), reduction="sum"),
            f"average over the B * T positions (the mean), do not sum ({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(lg[:, -1], t[:, -1]),
            f"average over every position of every sequence, not the last position only: "
            f"each position predicts its next token ({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t), reduction="sum") / lg.shape[0],
            f"average over all B * T positions, not over the B sequences only "
            f"({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t)) / math.log(2),
            f"use the natural log (nats): ln N_vocab is the uniform guess's loss "
            f"({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(_flat(lg, t)[0].softmax(-1), _flat(lg, t)[1]),
            f"F.cross_entropy takes the raw logits and applies log_softmax itself: do not "
            f"softmax them first ({section('11.2')})"),
    Mistake(lambda lg, t: reference_loss(lg[:, :-1], t[:, 1:]),
            f"the targets are already the next tokens (y is x shifted by one): do not shift "
            f"them again ({section('11.2')})"),
    Mistake(lambda lg, t: -torch.log(torch.softmax(lg, -1)).gather(-1, t[..., None]).mean(),
            f"log(softmax(...)) underflows to log 0 = -inf for logits far below the top: use "
            f"F.log_softmax or F.cross_entropy, which subtract the maximum ({section('1.6')})"),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg.float(), t), ignore_index=-1),
            f"keep the logits' dtype: float64 logits give a float64 loss (only 16-bit logits "
            f"are upcast, to float32) ({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t), ignore_index=-1),
            UPCAST_HINT),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t.clamp(min=0)), reduction="sum")
            / t.numel(),
            f"positions whose target is -1 count for nothing: leave them out of the sum and "
            f"of the count, F.cross_entropy(..., ignore_index=-1) ({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t), ignore_index=-1, reduction="sum")
            / t.numel(),
            f"average over the targets that count: positions whose target is -1 are left out "
            f"of the count as well as of the sum ({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t), ignore_index=0),
            f"every target counts, token 0 too: only a target of -1 marks a position to leave "
            f"out, ignore_index=-1, not 0 ({section('11.2')})"),
    Mistake(lambda lg, t: F.cross_entropy(*_flat(lg, t), ignore_index=-1, label_smoothing=0.1),
            f"no label smoothing: the loss is the plain cross-entropy, whose best value is the "
            f"task's floor ({section('11.2')})"),
)
LOSS_HINT = ("the mean cross-entropy over every position of every sequence: "
             "F.cross_entropy(logits.reshape(-1, N_vocab), targets.reshape(-1))")
RESHAPE_HINT = (f"F.cross_entropy wants logits (N, C) and targets (N,): reshape to (B * T, "
                f"N_vocab) and (B * T,) ({section('11.2')})")


def _oracle() -> Inputs:
    """Section 11.2's oracle: uniform on the noise, certain of every copied token."""
    task = CopyTask(vocab_size=16, half_length=12)
    _, targets = task.get_batch("val", 8, generator=gen(1))
    n = task.half_length
    logits = torch.zeros(8, task.context_length, task.vocab_size, dtype=F64)
    logits[:, n - 1:] = -1e9  # on the copy: every token impossible ...
    logits[:, n - 1:].scatter_(2, targets[:, n - 1:, None], 0.0)  # ... but the right one
    return args(logits, targets)


def _random_logits(offset: float = 0.0) -> Inputs:
    g = gen(18)
    logits, targets = randn(g, 3, 7, 11, scale=2.0), torch.randint(0, 11, (3, 7), generator=g)
    logits[..., 0] += offset  # the other tokens lie `offset` below token 0
    return args(logits, targets)


def _ignored_targets() -> Inputs:
    logits, targets = _random_logits()[0]
    targets = targets.clone()
    targets[0, 5:] = -1  # a right-padded row: its last two positions count for nothing
    targets[2, :3] = -1  # a left-padded one
    return args(logits, targets)


def _half_logits() -> Inputs:
    logits, targets = _random_logits()[0]
    return args(logits.to(torch.float16), targets)


NEXT_TOKEN_LOSS = Check("next_token_loss", reference_loss, (
    Case("uniform logits (2, 5, 16): the loss before training is ln 16",
         lambda: args(torch.zeros(2, 5, 16, dtype=F64),
                      torch.randint(0, 16, (2, 5), generator=gen(18))),
         "logits = zeros (2, 5, 16), float64; random targets (2, 5), seed 18",
         "uniform logits give every token probability 1/16: the loss is ln 16 = 2.77 nats",
         "11.2", FLOAT32, _number),
    Case("the copy task's oracle logits (8, 23, 16): exactly the loss floor", _oracle,
         "section 11.2's oracle logits for 8 copy-task sequences (vocabulary 16, half length "
         "12), float64, seed 1", "the oracle is uniform on the noise and certain on the copy: "
         "its mean loss is the floor (n - 1) ln N_vocab / (2n - 1)", "11.2", FLOAT32, _number),
    Case("random logits (3, 7, 11), float64, against F.cross_entropy", _random_logits,
         "random logits (3, 7, 11) and targets (3, 7), float64, seed 18", LOSS_HINT, "11.2",
         harness=_number),
    Case("logits 1000 apart: no inf or NaN (log_softmax, not log of softmax)",
         lambda: _random_logits(1000.0), "the logits above with 1000 added to token 0's, so "
         "the other tokens lie 1000 below", "use F.cross_entropy or F.log_softmax, never "
         "log(softmax(...))", "1.6", FLOAT32, _number),
    Case("the float64 gradient of the loss with respect to the logits", _random_logits,
         "the random logits above with requires_grad=True", "keep the loss a differentiable "
         "torch scalar: no .item(), no numpy", "11.2", FLOAT32, gradients((0,)),
         properties=gradient_properties(("logits",), "11.2")),
    Case("float64 logits give a float64 loss, a tensor of shape ()", _random_logits,
         "the random logits (3, 7, 11) above, float64, seed 18", "compute the loss in the "
         "logits' dtype and return it as a tensor", "11.2", harness=_loss_tensor),
    Case("targets of -1 (padding) count for nothing: the mean over the other positions, as "
         "MiniGPT's loss", _ignored_targets, "the random logits above; targets with -1 at "
         "positions 5-6 of row 0 and 0-2 of row 2", "a target of -1 is left out of the sum "
         "and of the count: F.cross_entropy(..., ignore_index=-1)", "11.2", FLOAT32,
         _number),
    Case("float16 logits: the loss computed in float32 (upcast), not in half precision",
         _half_logits, "the random logits above in float16, targets (3, 7); compared: the "
         "loss, then whether it is a 16-bit number", "upcast 16-bit logits to float32 "
         "before the log-softmax, logits.float()", "11.2", FLOAT32, _loss_width),
), params=("logits", "targets"), mistakes=LOSS_MISTAKES,
    errors=(("Expected target size", RESHAPE_HINT), ("expected target size", RESHAPE_HINT),
            ("out of bounds", IGNORED_HINT), ("must be non-negative", IGNORED_HINT)))


def next_token_loss(fn: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """Check the language-model loss, ``fn(logits, targets) -> scalar`` (Chapter 11).

    ``logits (B, T, N_vocab)``, ``targets (B, T)`` token ids (already the next tokens; ``-1``
    marks a position that counts for nothing, as in ``MiniGPT``'s loss); returns the mean
    cross-entropy over the counted positions, in nats, as a scalar tensor that carries a
    gradient, in the logits' dtype (16-bit logits upcast to float32). Uniform logits give
    ``ln N_vocab``; the copy task's oracle gives the task's loss floor (section 11.2).
    """
    return run_check(NEXT_TOKEN_LOSS, fn)


# ------------------------------------------------------------------------- training_step

LR = 0.5
#: Every parameter's change, held to the reference's within 0.3% of itself: a perturbed
#: run nudges each gradient an optimizer uses by up to 0.1%, a loss scaled by 1.01 or a
#: weight decay changes it by more (a parameter whose gradient is 0 must not move at all).
UPDATE: Tolerance = {"atol": 1e-12, "rtol": 3e-3}


def _reference_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor,
                    y: Tensor) -> float:
    """The step of section 11.2's loop, without its schedule and clipping."""
    optimizer.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    return float(loss.item())


def _loss_number(loss: object) -> object:
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss.item()
    return loss


def _change(start: list[Tensor], model: nn.Module) -> Tensor:
    """Every parameter's change since ``start``, flattened into one vector."""
    return torch.cat([(p.detach() - s).reshape(-1) for s, p in zip(start, model.parameters(),
                                                                    strict=True)])


def _sgd(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=LR)


def _adamw(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=0.01, weight_decay=0.1)


def _steps(count: int, optimizer: Callable[[Any], torch.optim.Optimizer] = _sgd) -> Harness:
    """``count`` steps with a fresh ``optimizer``, each from the same parameters (a step's
    gradients are left in place, as a forgotten zero_grad would leave them); the last step's
    loss and every parameter's change. Each step starts from the same random state, so that
    a dropout draws the same masks in the reference and in the learner's step."""
    def harness(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
        model, *batches = positional
        opt = optimizer(model.parameters())
        start = [p.detach().clone() for p in model.parameters()]
        found: tuple[object, ...] = ()
        for i, (x, y) in enumerate(batches[:count]):
            with torch.no_grad():
                for p, s in zip(model.parameters(), start, strict=True):
                    p.copy_(s)
            torch.manual_seed(100 + i)
            found = (_loss_number(fn(model, opt, x, y)), _change(start, model))
        return found
    return harness


def _train_inputs(dropout: float = 0.0) -> Inputs:
    task = CopyTask(vocab_size=8, half_length=4)
    model = MiniGPT(GPTConfig(vocab_size=8, context_length=task.context_length, n_layers=1,
                              n_heads=2, d_model=16, dropout=dropout)).double()
    g = gen(19)
    return args(model.train(), *(task.get_batch("train", 4, generator=g) for _ in range(2)))


def _step_variant(how: str) -> Callable[..., object]:
    def wrong(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> object:
        if how == "eval":
            model.eval()
        if how != "no_zero_grad":
            optimizer.zero_grad()
        if how == "own_shift":
            logits, _ = model(x)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                   y[:, 1:].reshape(-1))
        else:
            _, loss = model(x, y)
        scale = {"summed": x.numel(), "times_batch": x.shape[0]}.get(how, 1)
        (loss * scale).backward()
        if how == "by_hand":
            lr = optimizer.param_groups[0]["lr"]
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-lr)
        elif how != "no_step":
            optimizer.step()
            if how == "twice":
                optimizer.step()
        if how == "loss_after":
            with torch.no_grad():
                return model(x, y)[1].item()
        return loss.item()
    return wrong


STEP_MISTAKES = (
    Mistake(_step_variant("no_step"),
            f"the parameters did not change: call loss.backward() and then optimizer.step(), "
            f"in this order, with no zero_grad between them ({section('11.2')})"),
    Mistake(_step_variant("no_zero_grad"),
            f"call optimizer.zero_grad() before loss.backward(): PyTorch adds new gradients to "
            f"the old ones, so this step also used the last batch's ({section('11.2')})"),
    Mistake(_step_variant("loss_after"),
            f"return the loss computed before the update, the one that was backpropagated, "
            f"not a loss recomputed after optimizer.step() ({section('11.2')})"),
    Mistake(_step_variant("summed"),
            f"backpropagate the mean loss (the one model(x, y) returns), not the sum "
            f"({section('11.2')})"),
    Mistake(_step_variant("times_batch"),
            f"backpropagate the mean loss (the one model(x, y) returns), not the loss times "
            f"the batch size ({section('11.2')})"),
    Mistake(_step_variant("twice"),
            f"call optimizer.step() once per batch: a second step moves the parameters by the "
            f"same gradient again ({section('11.2')})"),
    Mistake(_step_variant("own_shift"),
            f"use the loss model(x, y) returns: y is already the next tokens, so a loss of "
            f"your own on shifted targets shifts them twice ({section('11.2')})"),
    Mistake(_step_variant("eval"),
            f"do not switch the model to eval() in a training step: dropout must stay on "
            f"while training (train() leaves the model in training mode) ({section('11.2')})"),
    Mistake(_step_variant("by_hand"),
            f"let the optimizer update the parameters, optimizer.step(): p -= lr * p.grad by "
            f"hand is plain SGD whatever optimizer was passed in (here AdamW, with its moments "
            f"and weight decay) ({section('11.2')})"),
)


def _scaled(larger: bool) -> Property:
    """Every parameter moved by one factor times the expected change, larger or smaller."""
    def fails(got: object, expected: object, inputs: Inputs) -> bool:
        if not (isinstance(got, tuple) and isinstance(expected, tuple) and len(got) == 2
                and isinstance(got[1], Tensor) and isinstance(expected[1], Tensor)
                and got[1].shape == expected[1].shape):
            return False
        mine, ref = got[1].double(), expected[1].double()
        factor = float((mine @ ref) / (ref @ ref).clamp(min=1e-300))
        off = float((mine - factor * ref).norm() / ref.norm().clamp(min=1e-300))
        return off < 1e-4 and (factor > 1.001 if larger else 0.0 < factor < 0.999)
    if larger:
        hint = (f"every parameter moved by the same factor more than -lr times the gradient: "
                f"backpropagate the mean loss model(x, y) returns as it is (no loss times a "
                f"number) and step once ({section('11.2')})")
    else:
        hint = (f"every parameter moved by the same factor less than -lr times the gradient: "
                f"no gradient clipping (clip_grad_norm_) and no scaled-down loss in this step "
                f"({section('11.2')})")
    return Property(fails, hint)


STEP_HINT = ("optimizer.zero_grad(); _, loss = model(x, y); loss.backward(); "
             "optimizer.step(); return the loss. One SGD step changes each parameter by -lr "
             "times the gradient of this batch's mean loss, nothing else: no weight decay, no "
             "clipping, no rescaled loss")
MODEL = ("a MiniGPT (1 layer, 2 heads, width 16, float64), in training mode, copy batches "
         "(4, 7) of vocabulary 8, seed 19")
COMPARED = "compared: the loss returned, then every parameter's change"

TRAINING_STEP = Check("training_step", _reference_step, (
    Case("one step of a MiniGPT on a copy-task batch, SGD: the loss before the update, and "
         "the change of every parameter", _train_inputs, f"{MODEL}; SGD lr 0.5; {COMPARED}",
         STEP_HINT, "11.2", (TIGHT, UPDATE), _steps(1)),
    Case("a second step on a new batch, from the same parameters: its change uses only this "
         "batch's gradient", _train_inputs, f"{MODEL}; SGD lr 0.5; the second batch, after a "
         f"first step; {COMPARED}", STEP_HINT, "11.2", (TIGHT, UPDATE), _steps(2)),
    Case("a MiniGPT with dropout 0.1, in training mode: the step runs with dropout on (the "
         "same masks for your step and the reference)", lambda: _train_inputs(0.1),
         f"{MODEL}, dropout 0.1; SGD lr 0.5; {COMPARED}", "train the model as it is given, "
         "in training mode: no model.eval() in a training step", "11.2", (TIGHT, UPDATE),
         _steps(1)),
    Case("one step with AdamW (lr 0.01, weight decay 0.1), the trainer's optimizer: the "
         "optimizer's own update, not -lr times the gradient", _train_inputs,
         f"{MODEL}; AdamW lr 0.01, weight decay 0.1; {COMPARED}", "let the optimizer "
         "update the parameters: optimizer.step(), whatever optimizer it is", "11.2",
         (TIGHT, UPDATE), _steps(1, _adamw)),
), params=("model", "batch 1", "batch 2"), mistakes=STEP_MISTAKES,
    properties=(_scaled(True), _scaled(False)))


def training_step(fn: Callable[..., float]) -> CheckResult:
    """Check one training step, ``fn(model, optimizer, x, y) -> loss`` (Chapter 11).

    ``model`` is a ``MiniGPT`` (``model(x, y)`` returns ``(logits, loss)``), ``optimizer``
    an optimizer over its parameters, ``x, y (B, T)`` a batch of inputs and next-token
    targets. One step zeroes the gradients, computes the loss, backpropagates it and
    updates the parameters with the optimizer; it returns that loss (a float or a scalar
    tensor). The check runs it with SGD (twice, on two batches), on a model with dropout in
    training mode, and with AdamW, and compares the loss and every parameter's change with
    the same step on an identical model (section 11.2).
    """
    return run_check(TRAINING_STEP, fn)
