"""Synthetic sequence tasks whose best achievable loss is known exactly (chapter 8).

A language model trained on real text never tells you how far it is from the
best possible loss. These tasks do: the data are generated in code, and
:meth:`CopyTask.loss_floor` computes the cross-entropy that a perfect model
would reach, so a training run can be judged against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ._validation import check_choice, check_positive_int

__all__ = ["TASKS", "CopyTask", "make_task", "offset_attention_score"]


@dataclass(frozen=True)
class CopyTask:
    """Random tokens whose second half repeats the first: ``a_1 .. a_n a_1 .. a_n``.

    Each sequence has ``2 * half_length`` tokens drawn uniformly from
    ``vocab_size`` symbols for the first half; the model reads the first
    ``2n - 1`` and predicts the next token at every position (``block_size =
    2n - 1`` predictions). The first half is pure noise: nothing predicts
    ``a_2 .. a_n``, so the best loss there is ``ln V`` each. Every token of the
    second half is a copy of a token ``n`` positions back; a model that finds
    it (attention is the only way to look back) pays nothing. Hence

        floor = (n - 1) * ln V / (2n - 1)   nats per predicted token.
    """

    vocab_size: int = 16
    half_length: int = 16

    def __post_init__(self) -> None:
        check_positive_int(self.vocab_size, "vocab_size")
        check_positive_int(self.half_length, "half_length")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {self.vocab_size}")
        if self.half_length < 2:
            raise ValueError(f"half_length must be at least 2, got {self.half_length}")

    @property
    def block_size(self) -> int:
        """Length ``T = 2n - 1`` of the model's input (and of the targets)."""
        return 2 * self.half_length - 1

    @property
    def copy_offset(self) -> int:
        """How far back the token to copy sits from a query in the second half: ``n - 1``.

        Query ``t`` (``t >= n - 1``) must predict ``x[t + 1] = x[t + 1 - n]``:
        the token right after the earlier copy of ``x[t]``.
        """
        return self.half_length - 1

    def loss_floor(self) -> float:
        """Exact best mean cross-entropy (nats) over the ``2n - 1`` predicted positions."""
        n = self.half_length
        return (n - 1) * math.log(self.vocab_size) / (2 * n - 1)

    def position_floor(self) -> Tensor:
        """Best loss at each predicted position ``(T,)``: ``ln V`` in the first half, else 0."""
        floor = torch.zeros(self.block_size, dtype=torch.float64)
        floor[: self.half_length - 1] = math.log(self.vocab_size)
        return floor

    def sample(
        self, batch_size: int, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Full sequences ``(B, 2n)``: ``n`` random tokens, then the same ``n`` again."""
        check_positive_int(batch_size, "batch_size")
        first = torch.randint(
            self.vocab_size, (batch_size, self.half_length), generator=generator
        )  # (B, n)
        return torch.cat([first, first], dim=1)  # (B, 2n)

    def get_batch(
        self,
        split: str,
        batch_size: int,
        block_size: int | None = None,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Inputs ``x (B, T)`` and next-token targets ``y (B, T)`` with ``T = 2n - 1``.

        ``split`` is accepted for the trainer's sake; both splits are fresh
        random draws (the task has no fixed data to overfit).
        """
        check_choice(split, "split", ("train", "val"))
        if block_size is not None and block_size != self.block_size:
            raise ValueError(
                f"block_size must be {self.block_size} (= 2 * half_length - 1) for this copy "
                f"task, got {block_size}"
            )
        seq = self.sample(batch_size, generator=generator)  # (B, 2n)
        x, y = seq[:, :-1], seq[:, 1:]  # (B, T), (B, T)
        if device is not None:
            x, y = x.to(device), y.to(device)
        return x, y


def offset_attention_score(
    attn_weights: Tensor, offset: int, *, first_query: int | None = None
) -> Tensor:
    """Mean attention weight a query puts on the key ``offset`` positions back.

    ``attn_weights (..., T, T)`` -> ``(...)``: the mean over queries
    ``t >= first_query`` (default ``offset``) of ``attn_weights[..., t, t - offset]``.
    ``offset=1`` scores a *previous-token head*. On the copy task, the token
    after the earlier copy of query ``t``'s token sits ``n - 1`` positions back
    (:attr:`CopyTask.copy_offset`), so that offset scores the head that does
    the copying (the pattern of an *induction head*). A score near 1 means the
    head looks almost only there.
    """
    if not isinstance(attn_weights, Tensor) or attn_weights.dim() < 2:
        raise ValueError("attn_weights must be a tensor (..., T, T)")
    time = attn_weights.shape[-1]
    if attn_weights.shape[-2] != time:
        raise ValueError(f"attn_weights must be square (..., T, T), got "
                         f"{tuple(attn_weights.shape)}")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < time:
        raise ValueError(f"offset must be an int in [0, T={time}), got {offset!r}")
    first = offset if first_query is None else first_query
    if isinstance(first, bool) or not isinstance(first, int) or not offset <= first < time:
        raise ValueError(f"first_query must be an int in [offset={offset}, T={time}), "
                         f"got {first_query!r}")
    queries = torch.arange(first, time, device=attn_weights.device)  # (Q,)
    picked = attn_weights[..., queries, queries - offset]  # (..., Q)
    return picked.mean(dim=-1)


#: Tasks the trainer CLI knows by name (``--task copy``).
TASKS: dict[str, type[CopyTask]] = {"copy": CopyTask}


def make_task(name: str, **kwargs: int) -> CopyTask:
    """Build a task by its name in :data:`TASKS` (e.g. ``make_task("copy", vocab_size=8)``)."""
    check_choice(name, "name", tuple(TASKS))
    return TASKS[name](**kwargs)
