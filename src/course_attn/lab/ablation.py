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
  fresh sequences, and its mean over each part.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_nonnegative_int, check_positive_int
from ..data.tasks import CopyTask, RecallTask
from ..models.gpt import MiniGPT

__all__ = ["LONG_RUNS", "freeze_positions", "part_means", "position_losses", "task_parts"]

#: The long-trained rows of chapter 11's ablation table, by ``"task, change"``: each with
#: the task, model and training settings it ran with and its mean losses (nats) overall and
#: per part (:func:`part_means`). Data, written by ``tools/ablation_long_runs.py``.
LONG_RUNS: dict[str, dict[str, Any]] = json.loads(
    resources.files(__package__).joinpath("ablation_runs.json").read_text(encoding="utf-8")
)["runs"]


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
