"""Chapter 11's ablation: take a part away from a MiniGPT, and measure its loss part by part.

The chapter trains each row of its ablation table briefly, in the notebook, and
reads it against the exact floors of :mod:`course_attn.data.tasks`. The rows that
need long training are measured once by ``tools/ablation_long_runs.py`` with the
same functions, and cached as data in ``ablation_runs.json`` beside this module:
:data:`LONG_RUNS`.

* :func:`freeze_positions`: a model without positions (its learned table zeroed
  and frozen; nothing else changes);
* :func:`task_parts`: which predicted positions ask for what (the copy task's
  noise and copied halves; the recall task's keys and values);
* :func:`position_losses` and :func:`part_means`: the loss at each position on
  fresh sequences, and its mean over each part;
* :func:`ablated_model`: a fresh model with one part of :data:`ABLATIONS` taken away,
  seeded (``tools/ablation_long_runs.py`` trains every row with three seeds);
* :func:`heads_removed`: chosen heads of a trained model silenced (zero-ablation), to
  measure what each head contributes rather than where it looks.

:data:`LONG_RUNS`, :data:`SHORT_RUNS` and :data:`VARIANT_RUNS` are the record that script
writes: every row with seeds 0, 1 and 2 (seed 0 is the chapter's own run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Iterator
from importlib import resources
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_nonnegative_int, check_positive_int
from ..core.attention import ATTENTION_FUNCTIONS
from ..data.tasks import CopyTask, RecallTask
from ..models.gpt import GPTConfig, MiniGPT

__all__ = ["ABLATIONS", "LONG_RUNS", "SHORT_RUNS", "VARIANT_RUNS", "ablated_model",
           "freeze_positions", "heads_removed", "no_causal_mask_attention", "part_means",
           "position_losses", "task_parts"]

_RECORD: dict[str, Any] = json.loads(
    resources.files(__package__).joinpath("ablation_runs.json").read_text(encoding="utf-8"))

#: The long-trained rows of chapter 11's ablation table, by ``"task, change"``: each with
#: the task, model and training settings it ran with (seed 0's), its mean losses (nats)
#: overall and per part (:func:`part_means`) for seed 0 (``"losses"``) and for every seed
#: (``"seed_losses"``, seeds ``"seeds"``), and a short ``"probe"`` run that
#: ``tests/test_ablation.py`` repeats, so that a cache the code no longer reproduces fails.
#: Data, written by ``tools/ablation_long_runs.py``.
LONG_RUNS: dict[str, dict[str, Any]] = _RECORD["runs"]
#: Every row of chapter 11's ablation table at the chapter's 200 iterations, by
#: ``"task, change"``, with the same fields as :data:`LONG_RUNS` (no probe): the spread
#: over seeds of the rows the notebook trains once.
SHORT_RUNS: dict[str, dict[str, Any]] = _RECORD.get("short_runs", {})
#: Section 11.4's recall runs of 500 iterations over seeds: the chapter's ``init_std=0.1``,
#: GPT-2's ``0.02``, and RoPE with one key/value head; same fields as :data:`SHORT_RUNS`.
VARIANT_RUNS: dict[str, dict[str, Any]] = _RECORD.get("variant_runs", {})

#: The rows of chapter 11's ablation table: the full model, then one part taken away.
ABLATIONS: tuple[str, ...] = ("full model", "no positions", "no causal mask", "one layer")


def no_causal_mask_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *,
                             is_causal: bool, **options: Any) -> tuple[Tensor, Tensor | None]:
    """The manual attention path with no mask at all: any query sees any key (Chapter 11).

    An ``attention_fn`` for :class:`MiniGPT` (the signature of the attention paths); the
    ablation's "no causal mask" row, which chapter 11 writes out as ``sees_the_future``.
    Like the paths it wraps, it checks nothing.
    """
    return ATTENTION_FUNCTIONS["manual"](q, k, v, None, is_causal=False, **options)


def ablated_model(config: GPTConfig, change: str, *, seed: int = 0) -> MiniGPT:
    """A fresh :class:`MiniGPT` of ``config`` with one part taken away (Chapter 11).

    ``change`` is one of :data:`ABLATIONS`: ``"full model"`` (nothing), ``"no positions"``
    (:func:`freeze_positions`), ``"no causal mask"`` (:func:`no_causal_mask_attention`)
    or ``"one layer"`` (``n_layers=1``). ``torch.manual_seed(seed)`` is called just before
    the model is built, as the chapter does with seed 0.
    """
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    if change not in ABLATIONS:
        raise ValueError(f"change must be one of {', '.join(map(repr, ABLATIONS))}, "
                         f"got {change!r}")
    check_nonnegative_int(seed, "seed")
    if change == "one layer":
        config = dataclasses.replace(config, n_layers=1)
    torch.manual_seed(seed)
    future = no_causal_mask_attention if change == "no causal mask" else None
    model = MiniGPT(config, attention_fn=future)
    return freeze_positions(model) if change == "no positions" else model


@contextlib.contextmanager
def heads_removed(model: MiniGPT, heads: Iterable[tuple[int, int]]) -> Iterator[MiniGPT]:
    """Within the ``with`` block, the given heads of ``model`` contribute nothing (Chapter 11).

    ``heads`` are ``(layer, head)`` pairs. Each head's slice of the input of its layer's
    ``out_proj`` (the ``head_dim`` columns it writes) is set to zero by a forward pre-hook:
    *zero-ablation*. The weights a head computes, and so the scores of
    :func:`~course_attn.lab.analysis.attention_maps`, are left as they are; only what the
    head adds to the residual stream is gone (its share of ``out_proj``'s bias stays, being
    no head's). The hooks are removed on leaving the block, even after an error. Zero is a
    harsher replacement than a head's mean output, so a loss measured without a head is an
    upper bound on what the head is worth.
    """
    if not isinstance(model, MiniGPT):
        raise TypeError(f"model must be a MiniGPT, got {type(model).__name__}")
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    chosen: dict[int, list[int]] = {}
    for pair in heads:
        if (not isinstance(pair, tuple) or len(pair) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in pair)):
            raise TypeError(f"heads must be (layer, head) pairs of ints, got {pair!r}")
        layer, head = pair
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"heads: ({layer}, {head}) is not a head of this model "
                             f"({n_layers} layers of {n_heads} heads)")
        chosen.setdefault(layer, []).append(head)
    width = model.config.d_model // n_heads  # head_dim: the columns one head writes

    def silence(silenced: list[int]):
        def hook(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
            out = args[0].clone()  # (B, T, H * head_dim): the heads side by side
            for head in silenced:
                out[..., head * width:(head + 1) * width] = 0
            return (out, *args[1:])
        return hook

    hooks = [model.blocks[layer].get_submodule("self_attn.out_proj")
             .register_forward_pre_hook(silence(hs)) for layer, hs in chosen.items()]
    try:
        yield model
    finally:
        for hook in hooks:
            hook.remove()


def _check_task(task: object) -> CopyTask | RecallTask:
    if not isinstance(task, CopyTask | RecallTask):
        raise TypeError(f"task must be a CopyTask or a RecallTask, got {type(task).__name__}")
    return task


def freeze_positions(model: MiniGPT) -> MiniGPT:
    """Set ``model``'s learned position table to zero and freeze it; return the model.

    Tokens then enter as their embeddings alone, and training never moves the
    table (the trainer's optimizer takes only parameters that require a
    gradient). A model with another ``pos_encoding`` has no such table:
    ``ValueError``.
    """
    if not isinstance(model, MiniGPT):
        raise TypeError(f"model must be a MiniGPT, got {type(model).__name__}")
    if model.pos is None:
        raise ValueError(f"model must have a learned position table "
                         f"(pos_encoding='learned'), got pos_encoding="
                         f"{model.config.pos_encoding!r}")
    with torch.no_grad():
        model.pos.weight.zero_()
    model.pos.weight.requires_grad_(False)
    return model


def task_parts(task: CopyTask | RecallTask) -> dict[str, Tensor]:
    """The predicted positions of ``task``, grouped by what they ask for (each ``(k,)`` long).

    Copy task: ``"noise half"`` (the first ``n - 1`` predictions, best loss
    ``ln N_vocab``) and ``"copied half"`` (the rest, best loss 0). Recall task:
    ``"keys: value"`` (a key asks for its value: a lookup when the key came
    before) and ``"values: next key"`` (best loss ``ln R``). The parts cover
    every position once.
    """
    task = _check_task(task)
    if isinstance(task, CopyTask):
        n = task.half_length
        return {"noise half": torch.arange(n - 1),
                "copied half": torch.arange(n - 1, task.context_length)}
    return {"keys: value": task.key_positions, "values: next key": task.value_positions}


@torch.no_grad()
def position_losses(model: MiniGPT, task: CopyTask | RecallTask, *, n_sequences: int = 512,
                    seed: int = 5) -> Tensor:
    """Mean cross-entropy (nats) at each predicted position: ``(T,)`` float32, on the CPU.

    Averaged over ``n_sequences`` fresh sequences of ``task`` drawn with
    ``seed`` (the same sequences for every model), in eval mode; the model's
    mode is put back afterwards.
    """
    if not isinstance(model, MiniGPT):
        raise TypeError(f"model must be a MiniGPT, got {type(model).__name__}")
    task = _check_task(task)
    check_positive_int(n_sequences, "n_sequences")
    check_nonnegative_int(seed, "seed")
    if model.config.context_length < task.context_length:
        raise ValueError(f"model has context_length={model.config.context_length}, fewer than the "
                         f"task's {task.context_length} positions")
    x, y = task.get_batch("val", n_sequences, generator=torch.Generator().manual_seed(seed))
    was_training = model.training
    model.eval()
    try:
        logits, _ = model(x.to(next(model.parameters()).device))  # (B, T, N_vocab)
    finally:
        model.train(was_training)
    losses = F.cross_entropy(logits.float().cpu().transpose(1, 2), y,
                             reduction="none")  # (B, N_vocab, T) against (B, T) -> (B, T)
    return losses.mean(dim=0)  # (T,)


def part_means(per_position: Tensor, task: CopyTask | RecallTask) -> dict[str, float]:
    """``{"all": mean, part: mean over the part, ...}`` of a ``(T,)`` loss per position.

    ``per_position`` is :func:`position_losses` of a model, or ``task.position_floor()``
    for the best possible losses; the parts are :func:`task_parts`.
    """
    task = _check_task(task)
    if not isinstance(per_position, Tensor):
        raise TypeError(f"per_position must be a tensor (T,), got {type(per_position).__name__}")
    if per_position.shape != (task.context_length,):
        raise ValueError(f"per_position must have shape ({task.context_length},), one loss per "
                         f"predicted position of the task, got {tuple(per_position.shape)}")
    values = per_position.double()
    means = {"all": values.mean().item()}
    means.update({name: values[where].mean().item()
                  for name, where in task_parts(task).items()})
    return means
