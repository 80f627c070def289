"""Chapter 11: the training loop, ``train()``, and its settings and result.

nanoGPT's recipe, written for reading: AdamW (weight decay on matrices only),
linear warmup then cosine decay of the learning rate, gradient clipping,
periodic evaluation on held-out data, mixed precision on CUDA (bf16 where the
GPU has it natively, else fp16 with a gradient scaler), optional
``torch.compile``. The loop keeps a GPU busy: batches are copied without
blocking, and losses are read back only every ``log_interval`` iterations.
A run stops at its first non-finite loss (:class:`TrainingDiverged`) with the
last good checkpoint kept.

One loop trains both kinds of model: a :class:`~course_attn.models.gpt.MiniGPT` on
next-token batches (text or a synthetic task), and an
:class:`~course_attn.models.encoder_decoder.EncoderDecoder` on a
:class:`~course_attn.data.seq2seq.Seq2SeqTask` (chapter 8). What differs is only
how a batch is drawn and how its loss is computed (``_Objective``).

The trainer's other jobs live beside it, and their public names are
importable from here too: the checkpoint format (:mod:`course_attn.train.checkpoint`),
the rules of resuming (:mod:`course_attn.train.resume`), the presets and the
hardware (:mod:`course_attn.train.presets`, :mod:`course_attn.train.hardware`), and the
command line ``python -m course_attn.train`` (:mod:`course_attn.train.cli`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from .._validation import check_device, check_positive_int, check_positive_real
from ..data.seq2seq import Seq2SeqTask, seq2seq_loss
from ..env import pick_device
from ..models.encoder_decoder import EncoderDecoder
from ..models.gpt import MiniGPT
from .checkpoint import CHECKPOINT_FORMAT as CHECKPOINT_FORMAT  # re-exported
from .checkpoint import (
    HISTORY,
    check_checkpoint_path,
    check_checkpoint_room,
    is_plain,
    load_checkpoint,
    model_from_checkpoint,
    restore_training_state,
    save_checkpoint,
    training_state,
)
from .distributed import all_sum, any_rank, join, leave, micro_batch_rows, world_from_env
from .hardware import GPU_PEAK_FLOPS, gpu_peak_flops
from .outputs import METRICS_FORMAT
from .presets import PRESETS, check_preset_device
from .resume import RESUME_MAY_CHANGE as RESUME_MAY_CHANGE  # re-exported
from .resume import check_resume
from .stopping import BEFORE_TRAINING, signals_recorded, stop_at_once

__all__ = [
    "FUSED_ADAMW_DEVICES",
    "GPU_PEAK_FLOPS",
    "PRESETS",
    "BatchSource",
    "TrainConfig",
    "TrainResult",
    "CheckpointWriteError",
    "TrainingDiverged",
    "TrainingInterrupted",
    "amp_dtype",
    "check_preset_device",
    "estimate_loss",
    "gpu_peak_flops",
    "learning_rate",
    "load_checkpoint",
    "model_from_checkpoint",
    "save_checkpoint",
    "train",
]

#: Devices where the trainer's AdamW is ``fused=True``; ``foreach=True`` elsewhere.
FUSED_ADAMW_DEVICES = ("cpu", "cuda")

#: Seeds are signed 64-bit ints, the range every torch generator accepts (the
#: evaluation batches use ``seed + 1`` and ``seed + 2``, which still fit).
MAX_SEED = 2**63 - 1


class BatchSource(Protocol):
    """Anything that hands out ``(x, y)`` batches (a :class:`CharCorpus` or a task), or
    ``(x, y, doc_ids)`` ones (a ``PackedCorpus``): a batch unpacks into the model's call."""

    def get_batch(self, split: str, batch_size: int, context_length: int, *,
                  generator: torch.Generator | None = None,
                  device: torch.device | str | None = None) -> tuple[Tensor, ...]: ...


class _Objective(NamedTuple):
    """What one kind of model trains on: how to draw a batch, and the model's loss on it."""

    #: ``(split, generator, device) -> batch``, the batch on ``device``.
    batch: Callable[[str, torch.Generator, torch.device], Any]
    #: ``(model or its compiled wrapper, batch) -> scalar loss``.
    loss: Callable[[Callable[..., Any], Any], Tensor]
    #: Token positions per batch (padding included), for ``tokens_per_s``.
    tokens_per_batch: int


def _objective(model: MiniGPT | EncoderDecoder, data: BatchSource | Seq2SeqTask,
               batch_size: int) -> _Objective:
    """The batches and loss of ``model`` on ``data`` (checked by :func:`_check_model_and_data`)."""
    if isinstance(model, EncoderDecoder):
        assert isinstance(data, Seq2SeqTask)
        task = data

        def seq2seq_batch(split: str, generator: torch.Generator, device: torch.device) -> Any:
            return task.get_batch(split, batch_size, generator=generator, device=device)

        return _Objective(seq2seq_batch, seq2seq_loss,
                          batch_size * (task.src_len + task.tgt_len))
    assert not isinstance(data, Seq2SeqTask)
    source, context_length = data, model.config.context_length

    def next_token_batch(split: str, generator: torch.Generator, device: torch.device) -> Any:
        return source.get_batch(split, batch_size, context_length, generator=generator,
                                device=device)  # (x, y), (B, T) each

    def gpt_loss(step_model: Callable[..., Any], batch: Any) -> Tensor:
        _, loss = step_model(*batch)
        return loss

    return _Objective(next_token_batch, gpt_loss, batch_size * context_length)


def _rows(batch: Any, rows: slice) -> Any:
    """Some sequences of a batch: a tuple of tensors, each ``(B, ...)``."""
    if rows.start == 0 and rows.stop == len(batch[0]):
        return batch  # the whole batch: one process, no accumulation
    parts = [part[rows] for part in batch]
    return tuple(parts) if type(batch) is tuple else type(batch)(*parts)  # a NamedTuple


def _check_model_and_data(model: object, data: object) -> None:
    """A MiniGPT with next-token batches, or an EncoderDecoder with a Seq2SeqTask that fits it."""
    if isinstance(model, EncoderDecoder):
        if not isinstance(data, Seq2SeqTask):
            raise TypeError(f"data must be a Seq2SeqTask (e.g. a ReverseTask) to train an "
                            f"EncoderDecoder, got {type(data).__name__}")
        c = model.config
        if data.vocab_size > min(c.src_vocab_size, c.tgt_vocab_size):
            raise ValueError(f"data has vocab_size {data.vocab_size}, more than the model's "
                             f"src_vocab_size={c.src_vocab_size} or "
                             f"tgt_vocab_size={c.tgt_vocab_size}")
        if data.tgt_len > c.context_length:
            raise ValueError(f"data needs {data.tgt_len} target positions (tgt_len), more "
                             f"than the model's context_length={c.context_length}")
        return
    if not isinstance(model, MiniGPT):
        raise TypeError(f"model must be a MiniGPT or an EncoderDecoder, got "
                        f"{type(model).__name__}")
    if isinstance(data, Seq2SeqTask):
        raise TypeError(f"data: a {type(data).__name__} trains an EncoderDecoder, not a "
                        f"MiniGPT; give a CharCorpus or a next-token task")
    if not hasattr(data, "get_batch"):
        raise TypeError(f"data must provide get_batch(split, batch_size, context_length, ...) "
                        f"(a CharCorpus or a task), got {type(data).__name__}")


def _num_parameters(model: MiniGPT | EncoderDecoder) -> int:
    if isinstance(model, MiniGPT):
        return model.num_parameters()
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class TrainConfig:
    """How to train (chapter 11). Model sizes live in :class:`~course_attn.models.gpt.GPTConfig`.

    The learning rate rises linearly to ``lr`` over ``warmup_iters``, then
    follows a cosine down to ``min_lr`` (default ``lr / 10``) at
    ``lr_decay_iters`` (default ``max_iters``; fix it if the run may be
    lengthened later, see :func:`train`). ``grad_clip=0`` disables clipping.
    Each optimizer step sums the gradients of ``grad_accum`` micro-batches of
    ``batch_size`` sequences on each of the run's processes (one, or N under
    ``torchrun --nproc_per_node=N``): a global batch of ``batch_size * grad_accum * N``.
    Other splits of one global batch take the same steps with ``dropout=0`` only;
    with dropout, each process draws its own masks, so the steps are alike in
    distribution, not equal (:mod:`course_attn.train.distributed`).
    ``seed`` is an int in ``[0, 2**63 - 1]``. Every ``eval_interval``
    iterations (and at the end) the mean loss over ``eval_iters`` batches of
    each split is recorded. The training losses
    are read back from the device every ``log_interval`` iterations (each read
    makes the host wait for the GPU). ``device=None`` picks cuda, then mps,
    then cpu. ``amp`` turns on mixed precision on CUDA (see :func:`amp_dtype`).
    """

    max_iters: int = 2000
    batch_size: int = 12
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float | None = None
    warmup_iters: int = 100
    lr_decay_iters: int | None = None
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 10
    seed: int = 1337
    device: str | None = None
    amp: bool = True
    compile: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters",
                     "log_interval"):
            check_positive_int(getattr(self, name), name)
        for name, top in (("warmup_iters", None), ("seed", MAX_SEED)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int >= 0, got {type(value).__name__} "
                                f"{value!r}")
            if value < 0 or (top is not None and value > top):
                expected = ">= 0" if top is None else "in [0, 2**63 - 1]"
                raise ValueError(f"{name} must be an int {expected}, got {value!r}")
        if self.lr_decay_iters is not None:
            check_positive_int(self.lr_decay_iters, "lr_decay_iters")
        check_positive_real(self.lr, "lr")
        if self.min_lr is not None:
            check_positive_real(self.min_lr, "min_lr")
            if self.min_lr > self.lr:
                raise ValueError(f"min_lr must be <= lr={self.lr}, got {self.min_lr}")
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a finite number >= 0, got "
                                f"{type(value).__name__} {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number in [0, 1), got "
                                f"{type(value).__name__} {value!r}")
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.device is not None:
            pick_device(self.device)  # raises a clear error for a bad or missing device
        for name in ("amp", "compile", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")


@dataclass
class TrainResult:
    """What a run produced: loss history, final losses and speed (chapter 11).

    ``train_losses`` and ``learning_rates`` hold one entry per iteration: the
    loss of that iteration's batch (before its optimizer step) and the
    learning rate that step used. The ``eval_*`` lists hold one entry per
    evaluation.

    ``train_seconds`` is the time spent in training steps alone, over
    ``timed_iters`` iterations: the first iteration of each call (kernel selection,
    ``torch.compile``'s compilation), the evaluations, the checkpoints and the
    ``on_eval`` callbacks are left out. ``ms_per_iter`` and ``tokens_per_s`` are
    computed from these two; ``elapsed_s`` is the wall time of the whole call. The
    model FLOPs utilisation of the training steps is therefore
    ``flops_per_token * tokens_per_batch * timed_iters / train_seconds / peak``
    (chapter 11).
    """

    train_losses: list[float] = field(default_factory=list)  # one per iteration
    learning_rates: list[float] = field(default_factory=list)  # one per iteration
    eval_iters: list[int] = field(default_factory=list)  # iterations at which we evaluated
    eval_train_losses: list[float] = field(default_factory=list)
    eval_val_losses: list[float] = field(default_factory=list)
    ms_per_iter: float = float("nan")
    tokens_per_s: float = float("nan")
    n_params: int = 0
    device: str = "cpu"
    elapsed_s: float = 0.0
    train_seconds: float = 0.0  # the timed training steps only: no evaluation, no compiling
    timed_iters: int = 0  # the iterations train_seconds covers

    def __post_init__(self) -> None:
        for name in ("train_losses", "learning_rates", "eval_iters", "eval_train_losses",
                     "eval_val_losses"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) for v in value):
                raise TypeError(f"{name} must be a list of numbers, got {value!r}")
        for name in ("ms_per_iter", "tokens_per_s", "elapsed_s", "train_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {value!r}")
        for name in ("n_params", "timed_iters"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not isinstance(self.device, str):
            raise TypeError(f"device must be a str, got {self.device!r}")

    @property
    def final_train_loss(self) -> float:
        return self.eval_train_losses[-1] if self.eval_train_losses else float("nan")

    @property
    def final_val_loss(self) -> float:
        return self.eval_val_losses[-1] if self.eval_val_losses else float("nan")

    def to_metrics(self) -> dict[str, Any]:
        """The JSON-ready dict ``--metrics-out`` writes (``None`` where nothing was measured).

        Its ``format`` key (:data:`METRICS_FORMAT`) marks the file as this
        CLI's, the only kind of existing file ``--metrics-out`` overwrites.
        """

        def number(value: float) -> float | None:
            return value if math.isfinite(value) else None

        return {
            "format": METRICS_FORMAT,
            "train_loss_history": self.train_losses,
            "learning_rate_history": self.learning_rates,
            "eval_iters": self.eval_iters,
            "eval_train_loss_history": self.eval_train_losses,
            "val_loss_history": self.eval_val_losses,
            "final_train_loss": number(self.final_train_loss),
            "final_val_loss": number(self.final_val_loss),
            "ms_per_iter": number(self.ms_per_iter),
            "tokens_per_s": number(self.tokens_per_s),
            "n_params": self.n_params,
            "device": self.device,
            "torch_version": torch.__version__,
            "elapsed_s": self.elapsed_s,
            "train_seconds": self.train_seconds,
            "timed_iters": self.timed_iters,
        }


def learning_rate(it: int, config: TrainConfig) -> float:
    """Learning rate at iteration ``it``: linear warmup, cosine decay, then ``min_lr``."""
    if isinstance(it, bool) or not isinstance(it, int):
        raise TypeError(f"it must be an int iteration index >= 0, got {it!r}")
    if it < 0:
        raise ValueError(f"it must be an iteration index >= 0, got {it}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    return _scheduled_lr(it, config)


def _scheduled_lr(it: int, config: TrainConfig) -> float:
    """:func:`learning_rate` without the checks, for the loop (checked once, at the door)."""
    min_lr = config.lr / 10 if config.min_lr is None else config.min_lr
    decay_iters = config.max_iters if config.lr_decay_iters is None else config.lr_decay_iters
    if it < config.warmup_iters:
        return config.lr * (it + 1) / (config.warmup_iters + 1)
    if it >= decay_iters:
        return min_lr
    progress = (it - config.warmup_iters) / max(1, decay_iters - config.warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - min_lr)


def _make_optimizer(model: nn.Module, config: TrainConfig, device: torch.device
                    ) -> torch.optim.AdamW:
    # Decay matrices (linear layers, embeddings); leave biases and LayerNorm gains alone.
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # Fused on CUDA and the CPU: one operator per parameter group for the whole update
    # (on the CPU about a third of foreach's time at the cpu preset's sizes, chapter 11's
    # step_cost.update_ms), and on CUDA the fp16 scaler's checks without a sync. Neither
    # form gives the same bits on every CPU (both round differently with AVX-512 and with
    # AVX2), so the faster one is taken. Elsewhere foreach: one dispatch per operation for
    # all tensors instead of one per tensor.
    fused = device.type in FUSED_ADAMW_DEVICES
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2),
                             fused=fused, foreach=not fused)


def amp_dtype(device: torch.device | str, *, amp: bool = True,
              bf16_native: bool | None = None) -> torch.dtype | None:
    """The autocast dtype for training on ``device``, or ``None`` for plain float32 (chapter 11).

    * CUDA with native bfloat16 (compute capability 8.0 and newer: A100, H100,
      RTX 30xx and later): ``torch.bfloat16``. It has float32's range, so it
      needs no loss scaling.
    * Older CUDA GPUs, such as Colab's free T4 (7.5): ``torch.float16``, with a
      ``GradScaler`` in :func:`train`. They only emulate bfloat16, slowly, and
      ``torch.cuda.is_bf16_supported()`` says True there unless asked about
      native support.
    * CPU, MPS, or ``amp=False``: ``None``.

    ``bf16_native=None`` asks ``torch.cuda.is_bf16_supported(including_emulation=False)``;
    tests pass it explicitly to cover each kind of GPU on any machine.
    """
    device = check_device(device, "device", allow_none=False)
    if not isinstance(amp, bool):
        raise TypeError(f"amp must be a bool, got {amp!r}")
    if bf16_native is not None and not isinstance(bf16_native, bool):
        raise TypeError(f"bf16_native must be a bool or None, got {bf16_native!r}")
    if not amp or device.type != "cuda":
        return None
    if bf16_native is None:
        bf16_native = torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.bfloat16 if bf16_native else torch.float16


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None)


@torch.no_grad()
def estimate_loss(model: MiniGPT | EncoderDecoder, data: BatchSource | Seq2SeqTask,
                  config: TrainConfig, *,
                  device: torch.device | str | None = None) -> dict[str, float]:
    """Mean loss over ``config.eval_iters`` batches of each split, in eval mode.

    The batches come from generators seeded afresh at every call (``config.seed
    + 1`` for train, ``+ 2`` for val), so every evaluation sees the same batches,
    the two splits of a synthetic task are different draws, and the training
    run's random state is never disturbed. ``model`` is a :class:`MiniGPT` with
    next-token data, or an :class:`EncoderDecoder` with a :class:`Seq2SeqTask`.
    """
    _check_model_and_data(model, data)
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    device = (check_device(device, "device", allow_none=False) if device is not None
              else next(model.parameters()).device)
    dtype = amp_dtype(device, amp=config.amp)
    objective = _objective(model, data, config.batch_size)
    was_training = model.training
    model.eval()
    out = {}
    for offset, split in enumerate(("train", "val"), start=1):
        generator = torch.Generator().manual_seed(config.seed + offset)
        losses = []
        for _ in range(config.eval_iters):
            batch = objective.batch(split, generator, device)
            with _autocast(device, dtype):
                loss = objective.loss(model, batch)
            losses.append(loss.float())
        out[split] = torch.stack(losses).mean().item()  # one read-back per split
    model.train(was_training)
    return out


class TrainingDiverged(ValueError):
    """Training stopped because a loss (or the weights) stopped being finite (chapter 11).

    Raised by :func:`train` at the first non-finite training loss, found when
    the losses are read back from the device (every ``log_interval``
    iterations), or when an evaluation loss or the weights turn non-finite
    before a checkpoint would be written. Nothing non-finite is ever saved:
    the checkpoint on disk, if any, is the last one with finite weights. A
    ``ValueError``, because the cure is a setting (a lower ``lr``, gradient
    clipping). Attributes:

    * ``result``: the :class:`TrainResult` so far; ``train_losses`` holds
      every finite loss before the first bad one, and the timings are filled in;
    * ``iteration``: the first bad iteration, counted from 1 like ``eval_iters``;
    * ``loss``: the non-finite value found (a training or evaluation loss;
      ``nan`` when the weights were the first to go);
    * ``checkpoint_iter``: the iteration of the last checkpoint this run
      wrote, or ``None``.
    """

    def __init__(self, message: str, *, result: TrainResult, iteration: int, loss: float,
                 checkpoint_iter: int | None) -> None:
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        if not isinstance(result, TrainResult):
            raise TypeError(f"result must be a TrainResult, got {type(result).__name__}")
        check_positive_int(iteration, "iteration")
        if isinstance(loss, bool) or not isinstance(loss, int | float):
            raise TypeError(f"loss must be a number, got {loss!r}")
        if math.isfinite(loss):
            raise ValueError(f"loss must be the non-finite value found, got {loss}")
        if checkpoint_iter is not None:
            check_positive_int(checkpoint_iter, "checkpoint_iter")
        super().__init__(message)
        self.result = result
        self.iteration = iteration
        self.loss = loss
        self.checkpoint_iter = checkpoint_iter


class TrainingInterrupted(Exception):
    """Training stopped at the end of a step because the process got SIGINT or SIGTERM.

    Ctrl-C, a closed laptop or a cluster scheduler sends one of the two; :func:`train`
    then finishes the step it is in, reads the losses back, writes a checkpoint (when it
    has a ``checkpoint_path``) and raises this, with ``result`` (the run so far),
    ``iteration`` (the last step done), ``signal_name`` and ``checkpoint_iter`` (the
    iteration of the checkpoint on disk, or ``None``). A second signal stops the process
    at once. Resuming from the checkpoint repeats the uninterrupted run (chapter 11).
    Several processes stop together after the step of their next read-back (every
    ``log_interval`` steps), where they agree at no extra cost; asking them after every
    step would make each step wait for the GPU.
    """

    def __init__(self, message: str, *, result: TrainResult, iteration: int,
                 signal_name: str, checkpoint_iter: int | None) -> None:
        _check_stop(message, result, checkpoint_iter)
        check_positive_int(iteration, "iteration")
        if not isinstance(signal_name, str) or not signal_name:
            raise TypeError(f"signal_name must be the signal's name, such as 'SIGINT', got "
                            f"{signal_name!r}")
        super().__init__(message)
        self.result, self.iteration = result, iteration
        self.signal_name, self.checkpoint_iter = signal_name, checkpoint_iter


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a read-only folder, no permission).

    The message names the path and the cause; the last good checkpoint, written
    atomically, is still on disk (``checkpoint_iter``, or ``None``), and ``result``
    holds the run so far (chapter 11).
    """

    def __init__(self, message: str, *, result: TrainResult,
                 checkpoint_iter: int | None) -> None:
        _check_stop(message, result, checkpoint_iter)
        super().__init__(message)
        self.result, self.checkpoint_iter = result, checkpoint_iter


def _check_stop(message: object, result: object, checkpoint_iter: object) -> None:
    """The arguments every early stop carries: a message, the result, the last checkpoint."""
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    if not isinstance(result, TrainResult):
        raise TypeError(f"result must be a TrainResult, got {type(result).__name__}")
    if checkpoint_iter is not None:
        check_positive_int(checkpoint_iter, "checkpoint_iter")


#: What :func:`train` calls after each evaluation: ``on_eval(iteration, model, result)``.
OnEval = Callable[[int, MiniGPT | EncoderDecoder, TrainResult], object]


@contextlib.contextmanager
def _random_state_kept(device: torch.device) -> Iterator[None]:
    """Put back the global random states (CPU, and ``device``'s) on leaving the block."""
    cpu = torch.get_rng_state()
    accelerator = (torch.cuda.get_rng_state(device) if device.type == "cuda"
                   else torch.mps.get_rng_state() if device.type == "mps" else None)
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if accelerator is not None and device.type == "cuda":
            torch.cuda.set_rng_state(accelerator, device)
        elif accelerator is not None:
            torch.mps.set_rng_state(accelerator)


def _weights_finite(model: nn.Module) -> bool:
    flags = [p.detach().isfinite().all() for p in model.parameters()]
    return bool(torch.stack(flags).all())  # one read-back for all tensors


class _Run:
    """One call of :func:`train`: its moving parts, and the steps of its loop as methods."""

    def __init__(self, model: MiniGPT | EncoderDecoder, data: BatchSource | Seq2SeqTask,
                 config: TrainConfig, *,
                 checkpoint_path: str | os.PathLike[str] | None, meta: dict[str, Any],
                 on_eval: OnEval | None = None) -> None:
        self.model, self.data, self.config = model, data, config
        self.checkpoint_path, self.meta, self.on_eval = checkpoint_path, meta, on_eval
        self.world = world_from_env()  # one process, or one of torchrun's
        self.device = join(self.world, pick_device(config.device))
        model.to(self.device)
        # Several processes: each holds a copy; DDP averages the gradients in backward.
        self.ddp = (DistributedDataParallel(model, device_ids=None if self.device.type != "cuda"
                                            else [self.device.index])
                    if self.world.size > 1 else None)
        self.optimizer = _make_optimizer(model, config, self.device)
        self.dtype = amp_dtype(self.device, amp=config.amp)
        # fp16 gradients underflow without scaling; bf16 and float32 need none (a no-op then).
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.autocast = _autocast(self.device, self.dtype)  # made once, entered every step
        self.generator = torch.Generator().manual_seed(config.seed)  # data order (CPU, saveable)
        # Dropout: each process its own stream. So N processes repeat one process's steps
        # (accumulating N micro-batches) only without dropout: with it, the rows are the
        # same and the masks are not (see course_attn.train.distributed).
        torch.manual_seed(config.seed + self.world.rank)
        # Every process draws the same global batch and trains on its slices (_step).
        self.objective = _objective(
            model, data, config.batch_size * config.grad_accum * self.world.size)
        self.stop: list[int] = []  # the signals received (SIGINT, SIGTERM)
        self.stop_agreed = False  # several processes: whether any had one at the read-back
        self.result = TrainResult(n_params=_num_parameters(model), device=str(self.device))
        self.start = 0  # the first iteration: 0, or the checkpoint's when resuming
        self.pending: list[Tensor] = []  # this stretch's losses, still on the device
        self.pending_lrs: list[float] = []  # and the learning rates of their steps
        self.saved_iter: int | None = None  # the last checkpoint this run wrote

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Continue from a checkpoint that :func:`~.resume.check_resume` accepted."""
        history = restore_training_state(
            checkpoint, model=self.model, optimizer=self.optimizer, scaler=self.scaler,
            generator=self.generator, device=self.device)
        for name, values in history.items():
            setattr(self.result, name, values)
        self.start = checkpoint["iter"]
        # Not stored: check_resume allows no change to the schedule before `start`.
        self.result.learning_rates = [learning_rate(it, self.config)
                                      for it in range(self.start)]

    def run(self) -> TrainResult:
        """Iterate from ``start`` to ``max_iters``: step; read back, evaluate and save at times."""
        from tqdm.auto import tqdm  # a widget in Jupyter, a text bar in a terminal

        config = self.config
        wrapped = self.ddp or self.model
        step_model = torch.compile(wrapped) if config.compile else wrapped
        self.model.train()
        # Timing: the clock is read only where the host has just waited for the device
        # (a read-back), so queued GPU work is never missed; the first iteration (kernel
        # selection, torch.compile) and evaluations are left out.
        self.train_seconds, self.timed_iters = 0.0, 0
        self.t_start = self.mark_time = time.perf_counter()
        self.mark_iter = self.start
        self.bar = tqdm(range(self.start, config.max_iters), initial=self.start,
                        total=config.max_iters, desc="train", leave=True,
                        disable=not (config.progress and self.world.main))
        with signals_recorded(self.stop):
            for it in self.bar:
                self._step(step_model, it)
                done = it + 1
                evaluate = done % config.eval_interval == 0 or done == config.max_iters
                warm_up = done == self.start + 1 and not evaluate
                read = evaluate or warm_up or done % config.log_interval == 0
                if read:
                    self._read_back(done, timed=not warm_up)
                if evaluate:
                    self._evaluate(done)
                # One process: the signal it got. Several: the one they agreed on at the
                # read-back, so that all stop after the same step.
                if self.stop_agreed if self.world.size > 1 else self.stop:
                    raise self._interrupted(done, evaluated=evaluate)
        self._finish()
        return self.result

    def _step(self, step_model: Callable[..., Any], it: int) -> None:
        """One optimizer step on one batch; its loss stays on the device (no sync).

        Nothing here is checked, made or read back that the step does not need: the
        settings were checked once (``TrainConfig``), the autocast context is made once,
        and the loss is this process's own (averaged over the processes at the read-back,
        :meth:`_read_back`). On a GPU each tensor operation costs the host a few
        microseconds, and each read-back makes it wait for the device.
        """
        config, optimizer, scaler = self.config, self.optimizer, self.scaler
        lr = _scheduled_lr(it, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # The global batch, drawn alike by every process; this one trains on its slices.
        batch = self.objective.batch("train", self.generator, self.device)  # (G, ...)
        optimizer.zero_grad(set_to_none=True)
        accum, world = config.grad_accum, self.world
        losses: list[Tensor] = []
        for k in range(accum):
            micro = _rows(batch, micro_batch_rows(world, k, config.batch_size))  # (B, ...)
            last = k == accum - 1  # DDP averages the gradients once, after the last one
            with (contextlib.nullcontext() if last or self.ddp is None else self.ddp.no_sync()):
                with self.autocast:
                    micro_loss = self.objective.loss(step_model, micro)
                    if accum > 1:  # (x / 1 is x: one kernel less, forward and backward)
                        # The mean of the micro-batches' mean losses: the mean over the
                        # global batch's tokens only because every micro-batch counts as
                        # many tokens (B x T of next-token text, B x tgt_len of seq2seq).
                        micro_loss = micro_loss / accum
                scaler.scale(micro_loss).backward()  # gradients add up over micro-batches
            losses.append(micro_loss.detach())
        loss = losses[0]
        for later in losses[1:]:  # added in order: the same bits as the sum from 0 was
            loss = loss + later
        if config.grad_clip > 0:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        self.pending.append(loss)
        self.pending_lrs.append(lr)

    def _read_back(self, done: int, *, timed: bool) -> None:
        """Fetch the pending losses (the host waits for the device here), then time the stretch.

        Under several processes, one all-reduce here averages each step's loss over them
        (every process reports the same losses) and tells them whether any got a signal.
        """
        if self.world.size > 1:
            flag = torch.full((), float(bool(self.stop)), device=self.device)
            summed = all_sum(torch.stack([*self.pending, flag]), self.world)  # (n + 1,)
            values = (summed[:-1] / self.world.size).tolist()
            self.stop_agreed = bool(summed[-1] > 0)
        else:
            values = torch.stack(self.pending).tolist() if self.pending else []
        lrs = self.pending_lrs[:]
        self.pending.clear()
        self.pending_lrs.clear()
        bad = next((i for i, value in enumerate(values) if not math.isfinite(value)), None)
        if bad is not None:
            self.result.train_losses.extend(values[:bad])
            self.result.learning_rates.extend(lrs[:bad])
            iteration = len(self.result.train_losses) + 1
            raise self._diverged(iteration, values[bad],
                                 f"the training loss of iteration {iteration} is {values[bad]}")
        self.result.train_losses.extend(values)
        self.result.learning_rates.extend(lrs)
        if values:
            self.bar.set_postfix(loss=f"{values[-1]:.4f}", refresh=False)
        now = time.perf_counter()
        if timed:
            self.train_seconds += now - self.mark_time
            self.timed_iters += done - self.mark_iter
        self.mark_time, self.mark_iter = now, done

    def _evaluate(self, done: int) -> None:
        """Record both splits' losses after iteration ``done``, then save a checkpoint."""
        losses = estimate_loss(self.model, self.data, self.config, device=self.device)
        for split in ("train", "val"):  # the weights after iteration `done` went bad
            if not math.isfinite(losses[split]):
                raise self._diverged(done, losses[split], f"the {split} evaluation loss after "
                                     f"iteration {done} is {losses[split]}")
        self.result.eval_iters.append(done)
        self.result.eval_train_losses.append(losses["train"])
        self.result.eval_val_losses.append(losses["val"])
        self.bar.set_postfix(loss=f"{self.result.train_losses[-1]:.4f}",
                             val=f"{losses['val']:.4f}")
        if self.checkpoint_path is not None:
            self._save(done)
        if self.on_eval is not None and self.world.main:
            self._call_on_eval(done)
        self.mark_time = time.perf_counter()  # evaluation is not training time

    def _call_on_eval(self, done: int) -> None:
        """Hand the model to the caller; whatever the callback does, the run goes on unchanged."""
        assert self.on_eval is not None
        with _random_state_kept(self.device):  # dropout's random numbers stay the run's own
            self.on_eval(done, self.model, self.result)
        self.model.train()  # the callback may have left it in eval mode

    def _save(self, done: int) -> None:
        """Write the checkpoint of iteration ``done`` (process 0); every process learns if it
        could not be written, and all of them stop together (none waits for the others)."""
        if not _weights_finite(self.model):  # never overwrite good weights with bad ones
            raise self._diverged(done, float("nan"),
                                 f"the weights after iteration {done} are not all finite")
        # One process writes (the others hold the same weights) and tells the others.
        failed = self._write_checkpoint(done) if self.world.main else None
        if any_rank(failed is not None, self.world, self.device):
            self._finish()
            # A path that became a folder holds no checkpoint of this run any more.
            gone = failed is not None and failed.errno == errno.EISDIR
            kept = ("the path is a folder now: no checkpoint of this run is there" if gone
                    else f"the checkpoint of iteration {self.saved_iter} is kept there"
                    if self.saved_iter is not None else "no checkpoint of this run was written")
            reason = (f"{failed.strerror or failed}" if failed is not None
                      else "process 0 could not write it")
            raise CheckpointWriteError(
                f"could not write the checkpoint {str(self.checkpoint_path)!r} after iteration "
                f"{done}: {reason}; {kept}", result=self.result,
                checkpoint_iter=None if gone else self.saved_iter)
        self.saved_iter = done

    def _write_checkpoint(self, done: int) -> OSError | None:
        """Save the run after iteration ``done``; the ``OSError`` if it could not be written."""
        history = {name: getattr(self.result, name) for name in HISTORY}
        assert isinstance(self.model, MiniGPT)  # train() refuses checkpoints for the others
        checkpoint = training_state(
            model=self.model, train_config=dataclasses.asdict(self.config),
            optimizer=self.optimizer, scaler=self.scaler, generator=self.generator,
            device=self.device, iteration=done, history=history, meta=self.meta)
        assert self.checkpoint_path is not None  # _save runs only with a path
        path = Path(self.checkpoint_path)
        if path.is_dir():  # it became a folder during the run: a write that fails, not a mistake
            return IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        try:  # save_checkpoint's one writer makes every failure an OSError with its cause
            save_checkpoint(self.checkpoint_path, checkpoint)
        except OSError as error:
            return error
        return None

    def _finish(self) -> None:
        self.bar.close()
        self.result.elapsed_s = time.perf_counter() - self.t_start
        self.result.train_seconds, self.result.timed_iters = self.train_seconds, self.timed_iters
        if self.timed_iters:
            self.result.ms_per_iter = 1000.0 * self.train_seconds / self.timed_iters
            self.result.tokens_per_s = (self.objective.tokens_per_batch * self.timed_iters
                                        / self.train_seconds)

    def _interrupted(self, done: int, *, evaluated: bool) -> TrainingInterrupted:
        """Stop after step ``done``: read back, write a checkpoint, and say how to go on."""
        name = signal.Signals(self.stop[0]).name if self.stop else "a signal to another process"
        if not evaluated:  # the step's losses, and a checkpoint of exactly this step
            self._read_back(done, timed=True)
            if self.checkpoint_path is not None:
                self._save(done)
        self._finish()
        saved = self.saved_iter if self.checkpoint_path is not None else None
        where = (f"the checkpoint of iteration {saved} is in {str(self.checkpoint_path)!r}; "
                 f"resume from it" if saved is not None
                 else "no checkpoint was asked for (checkpoint_path)")
        return TrainingInterrupted(
            f"training stopped by {name} after iteration {done} of {self.config.max_iters}: "
            f"{where}", result=self.result, iteration=done, signal_name=name,
            checkpoint_iter=saved)

    def _diverged(self, iteration: int, value: float, what: str) -> TrainingDiverged:
        """The error for a non-finite ``value`` found at ``iteration``; ``what`` says where."""
        self._finish()
        config, saved = self.config, self.saved_iter
        kept = (f"the checkpoint of iteration {saved} in {str(self.checkpoint_path)!r} is kept"
                if saved is not None else "no checkpoint was written by this run")
        clip = (f"grad_clip is {config.grad_clip:g}" if config.grad_clip > 0
                else "gradients are not clipped (grad_clip=0); 1.0 is usual")
        return TrainingDiverged(
            f"training diverged: {what}. Stopped there; "
            f"{kept}, and the {len(self.result.train_losses)} finite training losses before it "
            f"are in the result. Try a lower learning rate (lr is {config.lr:g}) or gradient "
            f"clipping ({clip})",
            result=self.result, iteration=iteration, loss=value, checkpoint_iter=saved)


def _check_train_arguments(model: object, data: object, config: object, meta: object,
                           resume_from: object, on_eval: object) -> None:
    _check_model_and_data(model, data)
    if on_eval is not None and not callable(on_eval):
        raise TypeError(f"on_eval must be a callable on_eval(iteration, model, result) or "
                        f"None, got {type(on_eval).__name__}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if meta is not None and not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict of plain data or None, got {type(meta).__name__}")
    if meta is not None and not is_plain(meta):
        raise TypeError("meta must hold only plain data (str keys; numbers, strings, lists, "
                        "dicts), which a weights-only load can read back")
    if resume_from is not None and not isinstance(resume_from, dict | str | os.PathLike):
        raise TypeError(f"resume_from must be a checkpoint dict or a path, got "
                        f"{type(resume_from).__name__}")


def _refuse_checkpoints(model: object, checkpoint_path: object, resume_from: object) -> None:
    # The checkpoint format (checkpoint.py) and model_from_checkpoint know only MiniGPT.
    if not isinstance(model, EncoderDecoder):
        return
    for name, value in (("checkpoint_path", checkpoint_path), ("resume_from", resume_from)):
        if value is not None:
            raise ValueError(f"{name} must be None for an EncoderDecoder: checkpoints and "
                             f"resuming cover only the MiniGPT so far, got {value!r}")


def _set_up(model: MiniGPT | EncoderDecoder, data: BatchSource | Seq2SeqTask,
            config: TrainConfig, checkpoint_path: str | os.PathLike[str] | None,
            meta: dict[str, Any], on_eval: OnEval | None) -> _Run:
    """The run's moving parts (:class:`_Run`), before its first step.

    Setting up writes nothing and may take long (the optimizer's first import of
    torch._dynamo: seconds, a minute on a busy machine). Under the command line's signal
    owner a signal here stops at once; several processes go on to agree after a step.
    """
    world = world_from_env()
    with stop_at_once(BEFORE_TRAINING) if world.size == 1 else contextlib.nullcontext():
        return _Run(model, data, config, checkpoint_path=checkpoint_path,
                    meta={**meta, "world_size": world.size}, on_eval=on_eval)


def train(model: MiniGPT | EncoderDecoder, data: BatchSource | Seq2SeqTask,
          config: TrainConfig, *,
          checkpoint_path: str | os.PathLike[str] | None = None,
          resume_from: dict[str, Any] | str | os.PathLike[str] | None = None,
          meta: dict[str, Any] | None = None,
          on_eval: OnEval | None = None) -> TrainResult:
    """Train ``model`` on batches from ``data`` for ``config.max_iters`` iterations.

    ``model`` is a :class:`MiniGPT` with next-token ``data`` (a
    :class:`~course_attn.data.CharCorpus` or a task of :mod:`course_attn.data.tasks`),
    or an :class:`EncoderDecoder` with a :class:`~course_attn.data.seq2seq.Seq2SeqTask`
    (loss :func:`~course_attn.data.seq2seq.seq2seq_loss`; ``tokens_per_s`` counts
    source and target positions, padding included). Checkpoints are for the
    MiniGPT only (a ``ValueError`` for an EncoderDecoder).

    ``checkpoint_path`` saves a checkpoint after every evaluation and at the
    end; it is checked before training starts (a folder, a missing or unwritable
    folder, a disk without room for one, or an existing file that is not a
    checkpoint is refused, so the training text is never overwritten). A write
    that fails later stops the run: :class:`CheckpointWriteError`.

    ``resume_from`` (a checkpoint or its path) restores the weights, the
    optimizer, the iteration count, the loss history and every random state,
    then continues to ``config.max_iters``; on CPU the losses are then exactly
    those of the uninterrupted run. ``ValueError`` names every difference from
    the checkpoint's model, data (``meta``) and settings, except those in
    :data:`RESUME_MAY_CHANGE`; ``max_iters`` may change only where the
    learning-rate schedule stays the same (see :mod:`course_attn.train.resume`).

    ``meta`` (plain data, e.g. the tokenizer's characters) is stored in the
    checkpoint; on resume, the checkpoint's meta is kept and updated with it.

    A non-finite training loss stops the run (found at the read-back every
    ``log_interval`` iterations; the first bad iteration is named): a
    :class:`TrainingDiverged` with the result so far; the checkpoint stays the last good one.

    ``on_eval(iteration, model, result)`` is called after every evaluation and
    its checkpoint (chapter 11 prints a sample there). It changes nothing about
    the run: the random states and the model's training mode are put back
    afterwards, and its time is left out of ``ms_per_iter``.
    """
    _check_train_arguments(model, data, config, meta, resume_from, on_eval)
    _refuse_checkpoints(model, checkpoint_path, resume_from)
    meta = dict(meta or {})
    checkpoint = None
    if resume_from is not None:
        checkpoint, meta = check_resume(resume_from, dataclasses.asdict(model.config),
                                        dataclasses.asdict(config), meta,
                                        world_size=world_from_env().size)
    if checkpoint_path is not None:  # the path, and room on its disk for one checkpoint
        check_checkpoint_room(check_checkpoint_path(checkpoint_path, "checkpoint_path"),
                              "checkpoint_path", model)
    run = _set_up(model, data, config, checkpoint_path, meta, on_eval)
    try:
        if checkpoint is not None:
            run.restore(checkpoint)
        return run.run()
    finally:
        leave(run.world)
