"""Synthetic sequence tasks whose best achievable loss is known exactly (chapter 11).

A language model trained on real text never tells you how far it is from the
best possible loss. These tasks do: the data are generated in code, and
:meth:`CopyTask.loss_floor` computes the cross-entropy that a perfect model
would reach, so a training run can be judged against it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

import torch
from torch import Tensor

from .._validation import (
    check_choice,
    check_cpu_generator,
    check_device,
    check_positive_int,
    check_split,
)
from .text import to_device

__all__ = ["TASKS", "CopyTask", "RecallTask", "make_task"]


class _NextTokenTask:
    """Batching shared by the synthetic tasks: a sampled sequence, split into inputs and targets.

    A task supplies ``sample(batch_size, generator=...) -> (B, T + 1)``, its
    ``context_length`` T and ``_length_rule`` (how T follows from its sizes).
    """

    _length_rule = ""
    @property
    def context_length(self) -> int:
        """T, the length of the inputs (each task derives it from its sizes)."""
        raise NotImplementedError

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def get_batch(
        self,
        split: str,
        batch_size: int,
        context_length: int | None = None,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Inputs ``x (B, T)`` and next-token targets ``y (B, T)``.

        ``split`` is accepted for the trainer's sake; both splits are fresh
        random draws (a synthetic task has no fixed data to overfit).
        """
        check_split(split)
        if context_length is not None:
            check_positive_int(context_length, "context_length")
        if device is not None:
            check_device(device, "device", exists=True)
        if context_length is not None and context_length != self.context_length:
            raise ValueError(f"context_length must be {self.context_length} (= "
                             f"{self._length_rule}) for the {type(self).__name__}, got "
                             f"{context_length}")
        seq = self.sample(batch_size, generator=generator)  # (B, T + 1)
        if device is not None:
            seq = to_device(seq, device)  # one non-blocking copy (pinned memory on CUDA)
        return seq[:, :-1], seq[:, 1:]  # (B, T), (B, T)


@dataclass(frozen=True)
class CopyTask(_NextTokenTask):
    """Random tokens whose second half repeats the first: ``a_1 .. a_n a_1 .. a_n`` (Chapter 11).

    Each sequence has ``2 * half_length`` tokens drawn uniformly from
    ``vocab_size`` symbols for the first half; the model reads the first
    ``2n - 1`` and predicts the next token at every position (``context_length =
    2n - 1`` predictions). The first half is pure noise: nothing predicts
    ``a_2 .. a_n``, so the best loss there is ``ln N_vocab`` each. Every token of the
    second half is a copy of a token ``n`` positions back; a model that finds
    it (attention is the only way to look back) pays nothing. Hence

        floor = (n - 1) * ln N_vocab / (2n - 1)   nats per predicted token.
    """

    vocab_size: int = 16
    half_length: int = 16
    _length_rule = "2 * half_length - 1"

    def __post_init__(self) -> None:
        check_positive_int(self.vocab_size, "vocab_size")
        check_positive_int(self.half_length, "half_length")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {self.vocab_size}")
        if self.half_length < 2:
            raise ValueError(f"half_length must be at least 2, got {self.half_length}")

    @property
    def context_length(self) -> int:
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
        """Best loss at each predicted position ``(T,)``: ``ln N_vocab``, then 0 when copying."""
        floor = torch.zeros(self.context_length, dtype=torch.float64)
        floor[: self.half_length - 1] = math.log(self.vocab_size)
        return floor

    def sample(
        self, batch_size: int, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Full sequences ``(B, 2n)``: ``n`` random tokens, then the same ``n`` again."""
        check_positive_int(batch_size, "batch_size")
        check_cpu_generator(generator)
        first = torch.randint(
            self.vocab_size, (batch_size, self.half_length), generator=generator
        )  # (B, n)
        return torch.cat([first, first], dim=1)  # (B, 2n)

@dataclass(frozen=True)
class RecallTask(_NextTokenTask):
    """Key-value pairs read out in order; a key that comes back brings back its value (Chapter 11).

    Each sequence is ``P = n_pairs`` pairs ``k_1 v_1 k_2 v_2 .. k_P v_P``.
    Keys are ids ``0 .. K-1`` (``K = n_keys``) arranged on a ring: the first
    key is uniform, and each next key is ``max_step`` or fewer steps further
    round (``k_{i+1} = k_i + s mod K`` with ``s`` uniform in ``1 .. R``,
    ``R = max_step``). Values are ids ``K .. K+N_val-1`` (``N_val = n_values``):
    every key gets its own uniformly drawn value for each sequence, the same
    value each time it appears.

    What a perfect model pays, per prediction (``2P - 1`` per sequence):

    - reading a value ``v_i``, the next key: ``ln R``, once it knows ``k_i``,
      the token one step back (the job of a *previous-token head*);
    - reading a key ``k_i``, its value: ``0`` if ``k_i`` appeared earlier in
      the sequence (look up the token after that earlier ``k_i``: an
      *induction head*), else ``ln N_val``.

    The walk's steps change from sequence to sequence, so no fixed distance
    points back to the earlier copy of a key; only its content finds it.
    :meth:`loss_floor` is exact (see :meth:`new_key_probability`) and fast for
    any ``n_pairs``. ``n_keys`` is capped at 16, the sizes the course uses.
    """

    n_keys: int = 8
    n_values: int = 8
    n_pairs: int = 12
    max_step: int = 4
    _length_rule = "2 * n_pairs - 1"

    def __post_init__(self) -> None:
        for name in ("n_keys", "n_values", "n_pairs", "max_step"):
            check_positive_int(getattr(self, name), name)
        if not 2 <= self.n_keys <= 16:
            raise ValueError(f"n_keys must be in [2, 16], got {self.n_keys}")
        for name in ("n_values", "n_pairs"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be at least 2, got {getattr(self, name)}")
        if self.max_step >= self.n_keys:
            raise ValueError(f"max_step must be below n_keys={self.n_keys} (a step of n_keys "
                             f"would land on the same key), got {self.max_step}")

    @property
    def vocab_size(self) -> int:
        """Keys and values together: ``K + N_val`` ids."""
        return self.n_keys + self.n_values

    @property
    def context_length(self) -> int:
        """Length ``T = 2P - 1`` of the model's input (and of the targets)."""
        return 2 * self.n_pairs - 1

    @property
    def key_positions(self) -> Tensor:
        """Input positions that hold a key (and predict its value): ``0, 2, .., 2P - 2``."""
        return torch.arange(0, self.context_length, 2)

    @property
    def value_positions(self) -> Tensor:
        """Input positions that hold a value (and predict the next key): ``1, 3, .., 2P - 3``."""
        return torch.arange(1, self.context_length, 2)

    def new_key_probability(self) -> Tensor:
        """``(P,)``: the probability that key ``i`` has not appeared before it (exact).

        Key ``i`` repeats key ``j < i`` exactly when the steps between them,
        ``s_{j+1} + .. + s_i``, add up to a multiple of ``K``. Read backwards
        from key ``i``, those sums are a walk round the ring that starts at 0
        and takes the same uniform steps, so key ``i`` is new exactly when that
        walk has not come back to 0 in ``i`` steps. The probability of every
        ring position of the walk (``K`` numbers) is carried along, and the
        part that comes back to 0 is dropped: what is left is the probability
        that the key is new. ``O(P K^2)`` operations: milliseconds for ``K = 16``
        and thousands of pairs (it stops once the probability drops below
        float64's smallest normal number, 2.2e-308; the rest stays 0).
        """
        ring, reach = self.n_keys, self.max_step
        step = torch.zeros(ring, ring, dtype=torch.float64)  # (K, K): one step of the walk
        for position in range(ring):
            for move in range(1, reach + 1):
                step[position, (position + move) % ring] += 1.0 / reach
        walk = torch.zeros(ring, dtype=torch.float64)  # (K,): walks that have not come back
        walk[0] = 1.0
        new = torch.zeros(self.n_pairs, dtype=torch.float64)
        new[0] = 1.0  # the first key is always new
        for i in range(1, self.n_pairs):
            walk = walk @ step  # (K,) @ (K, K) -> (K,)
            walk[0] = 0.0  # back at the key itself: key i repeats an earlier key
            new[i] = walk.sum()
            if new[i] < sys.float_info.min:  # below float64's smallest normal number:
                break  # the rest is smaller still and adds nothing to the floor; left at 0
        return new

    def position_floor(self) -> Tensor:
        """Best expected loss at each predicted position ``(T,)`` (nats)."""
        floor = torch.full((self.context_length,), math.log(self.max_step), dtype=torch.float64)
        floor[self.key_positions] = self.new_key_probability() * math.log(self.n_values)
        return floor

    def loss_floor(self) -> float:
        """Exact best mean cross-entropy (nats) over the ``2P - 1`` predicted positions."""
        return float(self.position_floor().mean())

    def sample(
        self, batch_size: int, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Full sequences ``(B, 2P)``: ``k_1 v_1 .. k_P v_P``."""
        check_positive_int(batch_size, "batch_size")
        check_cpu_generator(generator)
        shape = (batch_size, self.n_pairs)
        steps = torch.randint(1, self.max_step + 1, shape, generator=generator)  # (B, P)
        steps[:, 0] = torch.randint(self.n_keys, (batch_size,), generator=generator)
        keys = steps.cumsum(dim=1) % self.n_keys  # (B, P): a walk round the ring
        table = torch.randint(self.n_values, (batch_size, self.n_keys),
                              generator=generator) + self.n_keys  # (B, K): each key's value
        values = table.gather(1, keys)  # (B, P)
        return torch.stack([keys, values], dim=2).reshape(batch_size, 2 * self.n_pairs)

Task = CopyTask | RecallTask

#: Tasks the trainer CLI knows by name (``--task copy``, ``--task recall``).
TASKS: dict[str, type[Task]] = {"copy": CopyTask, "recall": RecallTask}


def make_task(name: str, **kwargs: int) -> Task:
    """Build a task by its name in :data:`TASKS` (e.g. ``make_task("copy", vocab_size=8)``)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a task name (str), one of {tuple(TASKS)}, got "
                        f"{type(name).__name__}")
    check_choice(name, "name", tuple(TASKS))
    task = TASKS[name]
    known = tuple(f.name for f in dataclasses.fields(task))
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise TypeError(f"the {name} task has no setting {', '.join(map(repr, unknown))}; "
                        f"its settings are {known}")
    return task(**kwargs)
