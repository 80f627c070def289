"""Chapter 10's variant comparisons: the recall task's look-ups, its oracle, and the seeds.

Chapter 10 trains each attention variant once, with seed 0, inside the notebook's time
budget, on the recall task of :class:`course_attn.data.tasks.RecallTask`. Two questions
need more than that run:

* how far apart the variants really are, which one seed cannot say: the runs with seeds
  0, 1 and 2 are trained once by ``tools/variant_seed_runs.py`` with the chapter's settings
  and cached as data in ``variant_runs.json`` beside this module: :data:`VARIANT_RUNS`;
* what each look-up of a sequence asks for: :func:`recall_lookup_distances` finds, for every
  key of a recall sequence, how far back the value to copy sits, and
  :func:`recall_oracle_losses` gives the loss of the best possible model on *these*
  sequences (the task's :meth:`~course_attn.data.tasks.RecallTask.loss_floor` is its
  expectation over all sequences), so that a model is measured against the sequences it
  was given, not against their average.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

import torch
from torch import Tensor

from .._validation import check_nonnegative_int, check_positive_int, check_tensor
from ..data.tasks import RecallTask

__all__ = ["RECALL_POSITION_KINDS", "VARIANT_RUNS", "previous_token_head",
           "recall_gap_by_kind", "recall_lookup_distances", "recall_oracle_losses"]

#: Chapter 10's variants trained with several seeds, by variant name (``"MHA"``, ``"GQA"``,
#: ``"MQA"``, ``"window 2"``, ``"learned"``, ``"linear"``, ``"sinusoidal"`` and ``"ALiBi"``):
#: the settings each ran with and, per seed, the losses measured as the chapter measures them. Data,
#: written by ``tools/variant_seed_runs.py``; the file's ``"about"`` says what each field is.
VARIANT_RECORD: dict[str, Any] = json.loads(
    resources.files(__package__).joinpath("variant_runs.json").read_text(encoding="utf-8")
)
VARIANT_RUNS: dict[str, dict[str, Any]] = VARIANT_RECORD["runs"]


def recall_lookup_distances(x: Tensor) -> Tensor:
    """``(B, T)`` long: how far back each look-up of a recall sequence reads (Chapter 10).

    ``x (B, T)`` holds the inputs of a :class:`~course_attn.data.tasks.RecallTask`,
    ``k_1 v_1 k_2 v_2 ..``: keys at the even positions, values at the odd ones. The key at
    position ``2i`` predicts its value; if the same key appeared before, last at position
    ``2j``, the value to copy is the token after it, at ``2j + 1``, and the look-up reads
    ``2i - (2j + 1)`` positions back. That distance is returned at position ``2i``; ``-1``
    where there is nothing to look up (a new key, and every value position).
    """
    check_tensor(x, "x", ndim=2, floating=False)
    if x.dtype.is_floating_point or x.dtype == torch.bool:
        raise TypeError(f"x must hold token ids (an integer tensor), got {x.dtype}")
    batch, length = x.shape
    keys = x[:, 0::2]  # (B, P): the keys, key i at position 2i
    distances = torch.full((batch, length), -1, dtype=torch.long, device=x.device)
    earlier = torch.arange(keys.shape[1], device=x.device)  # (P,) pair indices
    for i in range(1, keys.shape[1]):
        same = keys[:, :i] == keys[:, i:i + 1]  # (B, i): the same key before pair i
        last = torch.where(same, earlier[:i], -1).amax(dim=1)  # (B,): latest such j
        distances[:, 2 * i] = torch.where(last >= 0, 2 * i - (2 * last + 1), -1)
    return distances


def recall_oracle_losses(task: RecallTask, x: Tensor) -> Tensor:
    """``(B, T)`` float64: the best possible model's loss at each position of ``x`` (nats).

    The oracle knows how the task draws its tokens: after a value, the next key is one of
    ``max_step`` equally likely keys (``ln R``); at a key, its value is known if the key came
    before (``0``) and one of ``n_values`` otherwise (``ln N_val``). Its mean over many
    sequences is :meth:`RecallTask.loss_floor`; over a finite batch it differs from that by
    the batch's luck (more or fewer repeated keys than average). Chapter 10 measures its
    models against the oracle on the same sequences.
    """
    if not isinstance(task, RecallTask):
        raise TypeError(f"task must be a RecallTask, got {type(task).__name__}")
    check_tensor(x, "x", ndim=2, floating=False)
    if x.shape[1] != task.context_length:
        raise ValueError(f"x must have the task's length T = {task.context_length}, got "
                         f"shape {tuple(x.shape)}")
    distances = recall_lookup_distances(x)  # (B, T)
    losses = torch.full(x.shape, math.log(task.max_step), dtype=torch.float64,
                        device=x.device)  # (B, T): after a value, the next key
    keys = distances[:, 0::2]  # (B, P): the key positions, each predicting its value
    losses[:, 0::2] = torch.where(keys < 0, math.log(task.n_values), 0.0).double()
    return losses


#: The kinds of position of a recall sequence, as :func:`recall_gap_by_kind` splits a loss.
RECALL_POSITION_KINDS = ("next_key", "new_value", "seen_lookup", "unseen_lookup")


def recall_gap_by_kind(gap: Tensor, x: Tensor, seen: int) -> dict[str, float]:
    """How much of a mean loss gap each kind of position of a recall batch holds (Chapter 10).

    ``gap (B, T)`` is a model's loss minus the oracle's (:func:`recall_oracle_losses`) at each
    position of the inputs ``x (B, T)``. Each kind of :data:`RECALL_POSITION_KINDS` gets
    ``gap`` summed over its positions and divided by ``gap.numel()``, so the four add up to
    ``gap.mean()``:

    * ``"next_key"``: the value positions (odd), whose target is the next key, one to
      ``max_step`` steps round the ring from the key one position back;
    * ``"new_value"``: a key seen for the first time, whose value nothing can tell;
    * ``"seen_lookup"``: a repeated key whose value sits at most ``seen`` positions back;
    * ``"unseen_lookup"``: a repeated key whose value sits further back than ``seen``.
    """
    check_tensor(gap, "gap", ndim=2)
    check_tensor(x, "x", ndim=2, floating=False)
    seen = check_nonnegative_int(seen, "seen")
    if gap.shape != x.shape:
        raise ValueError(f"gap must have the shape of x, {tuple(x.shape)}, got "
                         f"{tuple(gap.shape)}")
    dist = recall_lookup_distances(x)  # (B, T): -1 = nothing to look up
    is_key = (torch.arange(x.shape[1], device=x.device) % 2 == 0).expand_as(x)  # (B, T)
    kinds = {"next_key": ~is_key, "new_value": is_key & (dist < 0),
             "seen_lookup": (dist >= 0) & (dist <= seen), "unseen_lookup": dist > seen}
    total = gap.double()
    return {kind: (total * where).sum().item() / gap.numel() for kind, where in kinds.items()}


def previous_token_head(maps: Tensor, trained_length: int) -> dict[str, float]:
    """Where a recall model's sharpest previous-token head looks past its trained length (Ch. 10).

    ``maps (L, B, H, T, T)`` are the attention weights of every head
    (:func:`course_attn.lab.analysis.attention_maps`) on recall inputs of length ``T`` longer
    than ``trained_length``. At a value position (odd), the target is the next key, found from
    the key one position back. The head with the most weight one back at the value positions
    below ``trained_length`` is the model's previous-token head. Returned: its ``"layer"`` and
    ``"head"``; its mean weight one back at the value positions below ``trained_length``
    (``"back_1_within"``) and at those from ``trained_length`` on (``"back_1_beyond"``); and
    the mean weight those later positions put on keys more than ``trained_length - 1`` back
    (``"unseen_beyond"``), distances that no sequence of ``trained_length`` tokens holds.
    """
    check_tensor(maps, "maps", ndim=5)
    trained_length = check_positive_int(trained_length, "trained_length")
    length = maps.shape[-1]
    if not 2 <= trained_length < length - 1 or maps.shape[-2] != length:
        raise ValueError(f"maps must be (L, B, H, T, T) with T > trained_length + 1 and "
                         f"trained_length >= 2, got shape {tuple(maps.shape)} and "
                         f"trained_length {trained_length}")
    positions = torch.arange(length, device=maps.device)
    within = positions[1:trained_length:2]  # value positions inside the trained length
    beyond = positions[trained_length + (trained_length % 2 == 0)::2]  # odd, >= trained_length
    back_1 = maps.diagonal(offset=-1, dim1=-2, dim2=-1)  # (L, B, H, T - 1): query t, key t - 1
    within_1 = back_1[..., within - 1].mean(dim=(1, 3))  # (L, H)
    layer, head = divmod(int(within_1.argmax()), within_1.shape[1])
    rows = maps[layer, :, head]  # (B, T, T): that head's weights
    far = (positions[:, None] - positions[None, :]) >= trained_length  # (T, T): unseen
    return {"layer": layer, "head": head, "back_1_within": within_1[layer, head].item(),
            "back_1_beyond": back_1[layer, :, head][:, beyond - 1].mean().item(),
            "unseen_beyond": (rows[:, beyond] * far[beyond]).sum(dim=-1).mean().item()}
