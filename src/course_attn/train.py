"""Chapter 8: the training loop and its command line, ``python -m course_attn.train``.

nanoGPT's recipe, written for reading: AdamW (weight decay on matrices only),
linear warmup then cosine decay of the learning rate, gradient clipping,
periodic evaluation on held-out data, mixed precision on CUDA (bf16 where the
GPU has it natively, else fp16 with a gradient scaler), optional
``torch.compile``. The loop keeps a GPU busy: batches are copied without
blocking, and losses are read back only every ``log_interval`` iterations.
Checkpoints are plain dicts of tensors and numbers, loaded with
``torch.load(weights_only=True)``; they hold every random state, so a resumed
run repeats the uninterrupted run's losses exactly (on CPU), and a resume that
would change the run is refused. No work is lost: output paths are checked
before training, a run stops at its first non-finite loss
(:class:`TrainingDiverged`) with the last good checkpoint kept, and the CLI
writes its metrics before it samples.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn
from torch import Tensor

from ._validation import check_choice, check_device, check_positive_int, check_positive_real
from .data import CharCorpus, CharTokenizer, default_corpus, load_text
from .env import pick_device
from .model import GPTConfig, MiniGPT
from .tasks import TASKS, CopyTask, RecallTask, make_task

__all__ = [
    "GPU_PEAK_FLOPS",
    "PRESETS",
    "BatchSource",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "amp_dtype",
    "check_preset_device",
    "estimate_loss",
    "gpu_peak_flops",
    "learning_rate",
    "load_checkpoint",
    "main",
    "model_from_checkpoint",
    "save_checkpoint",
    "train",
]

CHECKPOINT_FORMAT = "course_attn.train/1"
#: The ``format`` key of the metrics JSON that ``--metrics-out`` writes: the CLI
#: overwrites an existing file only when it carries this key (a metrics file of its own).
METRICS_FORMAT = "course_attn.train.metrics/1"
#: Seeds are signed 64-bit ints, the range every torch generator accepts (the
#: evaluation batches use ``seed + 1`` and ``seed + 2``, which still fit).
MAX_SEED = 2**63 - 1
#: Settings a resumed run may change: where and how the arithmetic runs, and what is
#: shown. Everything else must be as the checkpoint stored it (see :func:`train`).
RESUME_MAY_CHANGE = ("device", "amp", "compile", "progress", "log_interval")
#: Keys of ``meta`` that say which data a run trains on; a resumed run must agree on them.
_DATA_IDENTITY = ("tokenizer_chars", "text_sha256", "task")


class BatchSource(Protocol):
    """Anything that hands out ``(x, y)`` batches: a :class:`CharCorpus` or a task."""

    def get_batch(self, split: str, batch_size: int, block_size: int, *,
                  generator: torch.Generator | None = None,
                  device: torch.device | str | None = None) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class TrainConfig:
    """How to train (chapter 8). Model sizes live in :class:`~course_attn.model.GPTConfig`.

    The learning rate rises linearly to ``lr`` over ``warmup_iters``, then
    follows a cosine down to ``min_lr`` (default ``lr / 10``) at
    ``lr_decay_iters`` (default ``max_iters``; fix it if the run may be
    lengthened later, see :func:`train`). ``grad_clip=0`` disables clipping.
    ``seed`` is an int in ``[0, 2**63 - 1]``. Every ``eval_interval``
    iterations (and at the end) the mean loss over ``eval_iters`` batches of
    each split is recorded. The training losses
    are read back from the device every ``log_interval`` iterations (each read
    makes the host wait for the GPU). ``device=None`` picks cuda, then mps,
    then cpu. ``amp`` turns on mixed precision on CUDA (see :func:`amp_dtype`).
    """

    max_iters: int = 2000
    batch_size: int = 12
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
        for name in ("max_iters", "batch_size", "eval_interval", "eval_iters", "log_interval"):
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
    """What a run produced: loss history, final losses and speed (chapter 8)."""

    train_losses: list[float] = field(default_factory=list)  # one per iteration
    eval_iters: list[int] = field(default_factory=list)  # iterations at which we evaluated
    eval_train_losses: list[float] = field(default_factory=list)
    eval_val_losses: list[float] = field(default_factory=list)
    ms_per_iter: float = float("nan")
    tokens_per_s: float = float("nan")
    n_params: int = 0
    device: str = "cpu"
    elapsed_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("train_losses", "eval_iters", "eval_train_losses", "eval_val_losses"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) for v in value):
                raise TypeError(f"{name} must be a list of numbers, got {value!r}")
        for name in ("ms_per_iter", "tokens_per_s", "elapsed_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {value!r}")
        if isinstance(self.n_params, bool) or not isinstance(self.n_params, int):
            raise TypeError(f"n_params must be an int, got {self.n_params!r}")
        if self.n_params < 0:
            raise ValueError(f"n_params must be >= 0, got {self.n_params}")
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
        }


def learning_rate(it: int, config: TrainConfig) -> float:
    """Learning rate at iteration ``it``: linear warmup, cosine decay, then ``min_lr``."""
    if isinstance(it, bool) or not isinstance(it, int):
        raise TypeError(f"it must be an int iteration index >= 0, got {it!r}")
    if it < 0:
        raise ValueError(f"it must be an iteration index >= 0, got {it}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
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
    # Fused on CUDA: one kernel for all tensors, and the fp16 scaler's checks without a sync.
    # Not on the CPU: there it saves only ~4 %, and its vectorised kernel rounds differently
    # with AVX-512 and without, which changed chapter 8's trained text on other CPUs.
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2),
                             fused=device.type == "cuda")


def amp_dtype(device: torch.device | str, *, amp: bool = True,
              bf16_native: bool | None = None) -> torch.dtype | None:
    """The autocast dtype for training on ``device``, or ``None`` for plain float32 (chapter 8).

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
def estimate_loss(model: nn.Module, data: BatchSource, config: TrainConfig, *,
                  device: torch.device | str | None = None) -> dict[str, float]:
    """Mean loss over ``config.eval_iters`` batches of each split, in eval mode.

    The batches come from generators seeded afresh at every call (``config.seed
    + 1`` for train, ``+ 2`` for val), so every evaluation sees the same batches,
    the two splits of a synthetic task are different draws, and the training
    run's random state is never disturbed.
    """
    if not isinstance(model, MiniGPT):
        raise TypeError(f"model must be a MiniGPT, got {type(model).__name__}")
    if not hasattr(data, "get_batch"):
        raise TypeError(f"data must provide get_batch(split, batch_size, block_size, ...) "
                        f"(a CharCorpus or a task), got {type(data).__name__}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    device = (check_device(device, "device") if device is not None
              else next(model.parameters()).device)
    dtype = amp_dtype(device, amp=config.amp)
    block_size = model.config.block_size
    was_training = model.training
    model.eval()
    out = {}
    for offset, split in enumerate(("train", "val"), start=1):
        generator = torch.Generator().manual_seed(config.seed + offset)
        losses = []
        for _ in range(config.eval_iters):
            x, y = data.get_batch(split, config.batch_size, block_size, generator=generator,
                                  device=device)
            with _autocast(device, dtype):
                _, loss = model(x, y)
            losses.append(loss.float())
        out[split] = torch.stack(losses).mean().item()  # one read-back per split
    model.train(was_training)
    return out


class TrainingDiverged(ValueError):
    """Training stopped because a loss (or the weights) stopped being finite (chapter 8).

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


def _check_path(path: object, name: str) -> Path:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{name} must be a str or a path, got {type(path).__name__}")
    if str(path) == "":
        raise ValueError(f"{name} must be a file path, got ''")
    return Path(path)


def _read_checkpoint(source: Path, map_location: str | torch.device, *, mmap: bool = False
                     ) -> Any:
    """``torch.load(weights_only=True)``; any failure becomes a ``ValueError`` that says why.

    PyTorch's own messages are not passed on: for a file with other Python
    objects in it they advise ``weights_only=False``, which would run
    arbitrary code from the file.
    """
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4" on a stray pickle
            warnings.simplefilter("ignore")
            return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as error:  # noqa: BLE001  (every way a file can fail to load)
        if source.stat().st_size == 0:
            reason = "the file is empty"
        elif "zip archive" in str(error) or isinstance(error, EOFError):
            reason = "the file is truncated or damaged"
        elif type(error).__name__ == "UnpicklingError":
            reason = ("it is not a file torch.save wrote, or it holds Python objects besides "
                      "tensors and plain data, which are never loaded (they could run code)")
        else:
            reason = f"it is not a file torch.save wrote ({type(error).__name__})"
        raise ValueError(
            f"{str(source)!r} is not a readable course_attn checkpoint: {reason}. Checkpoints "
            "are written by `python -m course_attn.train --out` or save_checkpoint()"
        ) from None


def _is_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds a checkpoint of this format (memory-mapped: cheap when large)."""
    try:
        checkpoint = _read_checkpoint(path, "cpu", mmap=True)
    except ValueError:
        return False
    return isinstance(checkpoint, dict) and checkpoint.get("format") == CHECKPOINT_FORMAT


def _is_metrics(path: Path) -> bool:
    """Whether ``path`` holds a metrics JSON this CLI wrote (its ``format`` key)."""
    if path.stat().st_size > 256 * 2**20:  # a metrics file is kilobytes; don't read a corpus
        return False
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(metrics, dict) and metrics.get("format") == METRICS_FORMAT


def _check_output_path(path: str | os.PathLike[str], name: str, *, kind: str = "checkpoint"
                      ) -> Path:
    """Check, before any work, that ``path`` may receive a ``kind`` file; return it.

    ``kind`` is ``"checkpoint"`` or ``"metrics"``. Refused with a
    ``ValueError`` naming ``name``: an existing folder, an existing file that
    is not a ``kind`` file of this package (a checkpoint of this format, or a
    metrics JSON with this CLI's ``format`` key: never the training text), and
    a folder where no file can be created. A missing folder gives
    ``FileNotFoundError``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    check_choice(kind, "kind", ("checkpoint", "metrics"))
    target = _check_path(path, name)
    if target.is_dir():
        example = target / ("ckpt.pt" if kind == "checkpoint" else "metrics.json")
        raise ValueError(f"{name} {str(target)!r} is a folder; give a file path in it, such as "
                         f"{str(example)!r}")
    folder = target.resolve().parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{name} {str(target)!r}: the folder {str(folder)!r} does not "
                                "exist")
    if target.exists():
        if not target.is_file():
            raise ValueError(f"{name} {str(target)!r} exists and is not a regular file")
        known = _is_checkpoint(target) if kind == "checkpoint" else _is_metrics(target)
        if not known:
            what = ("a course_attn checkpoint" if kind == "checkpoint"
                    else "a metrics file written by python -m course_attn.train")
            raise ValueError(f"{name} {str(target)!r} exists and is not {what}; refusing to "
                             "overwrite it. Choose another path, or delete the file first")
    try:  # the one sure test of writability (as root, permission bits say little)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".probe")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise ValueError(f"{name} {str(target)!r}: cannot create a file in {str(folder)!r} "
                         f"({error.strerror or error})") from None
    return target


def save_checkpoint(path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> Path:
    """Write a checkpoint dict, as :func:`train` makes it (tensors, numbers, strings, lists).

    The file is written next to ``path`` as ``path + ".tmp"`` and then renamed,
    so a crash never leaves a half-written checkpoint under ``path``; if the
    write fails, the ``.tmp`` file is removed and the old file is untouched.
    """
    target = _check_path(path, "path")
    if not isinstance(checkpoint, dict):
        raise TypeError(f"checkpoint must be a dict, got {type(checkpoint).__name__}")
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint must be a course_attn training checkpoint (a dict with "
                         f"format={CHECKPOINT_FORMAT!r}, as train() makes), got format "
                         f"{checkpoint.get('format')!r}")
    if target.is_dir():
        raise ValueError(f"path {str(target)!r} is a folder, not a checkpoint file path")
    if target.parent and not target.parent.exists():
        raise FileNotFoundError(f"the folder of the checkpoint path {str(target)!r} does not exist")
    tmp = target.with_name(target.name + ".tmp")
    try:
        torch.save(checkpoint, tmp)
        tmp.replace(target)  # never leave a half-written checkpoint behind
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


_CHECKPOINT_KEYS: dict[str, type] = {
    "model_config": dict, "train_config": dict, "model": dict, "optimizer": dict,
    "iter": int, "rng": dict, "history": dict, "meta": dict,
}
#: Keys a checkpoint may lack: the gradient scaler's state came with mixed precision.
_OPTIONAL_KEYS: dict[str, type] = {"scaler": dict}


def _check_checkpoint(checkpoint: object, name: str, keys: Sequence[str]) -> dict[str, Any]:
    """A checkpoint dict of this format with ``keys`` present and of the right kind."""
    if not isinstance(checkpoint, dict):
        raise TypeError(f"{name} must be a checkpoint dict or a path, got "
                        f"{type(checkpoint).__name__}")
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{name} is not a course_attn training checkpoint (format "
                         f"{checkpoint.get('format')!r}, expected {CHECKPOINT_FORMAT!r})")
    kinds = {**_CHECKPOINT_KEYS, **_OPTIONAL_KEYS}
    missing = [key for key in keys if key not in checkpoint]
    wrong = [key for key in (*keys, *_OPTIONAL_KEYS) if key in checkpoint
             and not isinstance(checkpoint[key], kinds[key])]
    iteration = checkpoint.get("iter")
    if isinstance(iteration, bool) or (isinstance(iteration, int) and iteration < 0):
        wrong.append("iter")
    if missing or wrong:
        raise ValueError(f"{name} is an incomplete or damaged course_attn checkpoint "
                         f"(missing {missing}, malformed {wrong})")
    return checkpoint


def load_checkpoint(path: str | os.PathLike[str], *, map_location: str | torch.device = "cpu"
                    ) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` (no arbitrary pickles).

    An empty, truncated or foreign file gives a ``ValueError`` that says
    "... is not a readable course_attn checkpoint" and why.
    """
    source = _check_path(path, "path")
    check_device(map_location, "map_location", allow_none=False)
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint {str(source)!r} is not an existing file")
    checkpoint = _read_checkpoint(source, map_location)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(source)!r} is not a course_attn training checkpoint")
    return _check_checkpoint(checkpoint, repr(str(source)), tuple(_CHECKPOINT_KEYS))


def model_from_checkpoint(checkpoint: dict[str, Any] | str | os.PathLike[str]
                          ) -> tuple[MiniGPT, CharTokenizer | None]:
    """Rebuild the trained :class:`MiniGPT` (and its tokenizer, for text runs)."""
    if not isinstance(checkpoint, dict):
        if not isinstance(checkpoint, str | os.PathLike):
            raise TypeError(f"checkpoint must be a checkpoint dict or a path, got "
                            f"{type(checkpoint).__name__}")
        checkpoint = load_checkpoint(checkpoint)
    _check_checkpoint(checkpoint, "checkpoint", ("model_config", "model"))
    try:
        model = MiniGPT(GPTConfig(**checkpoint["model_config"]))
    except TypeError as error:  # a key GPTConfig does not know
        raise ValueError(f"checkpoint['model_config'] is not a GPTConfig: {error}") from None
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError:
        raise ValueError("checkpoint['model'] does not hold the weights of the model that "
                         "checkpoint['model_config'] describes") from None
    meta = checkpoint.get("meta") or {}
    chars = meta.get("tokenizer_chars") if isinstance(meta, dict) else None
    return model, (CharTokenizer(chars) if chars else None)


def _plain(value: object) -> bool:
    """Plain data a weights-only load can read back: numbers, strings, lists, dicts."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _schedule(config: TrainConfig | dict[str, Any]) -> tuple[float, float, int, int]:
    """What fixes the learning rate at every iteration: lr, min_lr, warmup, decay end."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key)
    lr, min_lr = get("lr"), get("min_lr")
    decay = get("lr_decay_iters")
    return (lr, lr / 10 if min_lr is None else min_lr, get("warmup_iters"),
            get("max_iters") if decay is None else decay)


def _resume_differences(stored: dict[str, Any], config: TrainConfig) -> list[str]:
    """The settings in which ``config`` differs from a checkpoint's, beyond what may change."""
    differences = []
    for key, value in dataclasses.asdict(config).items():
        if key in RESUME_MAY_CHANGE or key in ("max_iters", "lr_decay_iters"):
            continue
        if key == "min_lr":
            if _schedule(stored)[1] != _schedule(config)[1]:
                differences.append(f"min_lr {stored.get(key)!r} -> {value!r}")
        elif stored.get(key, "missing") != value:
            differences.append(f"{key} {stored.get(key, 'missing')!r} -> {value!r}")
    old_end, new_end = _schedule(stored)[3], _schedule(config)[3]
    if old_end != new_end:
        differences.append(
            f"the learning rate decays until iteration {old_end} in the checkpoint and until "
            f"{new_end} now (max_iters {stored.get('max_iters')} -> {config.max_iters}, "
            f"lr_decay_iters {stored.get('lr_decay_iters')} -> {config.lr_decay_iters}); to "
            f"train longer, keep the schedule: lr_decay_iters={old_end} (--lr-decay-iters "
            f"{old_end})")
    return differences


def _describe_data_change(key: str, old: Any, new: Any) -> str:
    if key == "tokenizer_chars":
        gone = "".join(sorted(set(old) - set(new)))
        added = "".join(sorted(set(new) - set(old)))
        return (f"the tokenizer: the checkpoint's {len(old)} characters and this text's "
                f"{len(new)} differ (only in the checkpoint's: {gone!r}; only in this "
                f"text's: {added!r})" if gone or added else
                f"the tokenizer: the same characters in another order ({old!r} -> {new!r})")
    if key == "text_sha256":
        return f"the training text (SHA-256 {old[:12]}... in the checkpoint, {new[:12]}... now)"
    return f"{key} {old!r} -> {new!r}"


def _resume_meta(stored: dict[str, Any], meta: dict[str, Any]) -> tuple[dict[str, Any],
                                                                        list[str]]:
    """The resumed run's meta (the checkpoint's, updated by ``meta``) and the data changes."""
    differences = []

    def kind(m: dict[str, Any]) -> str | None:
        return "a task" if "task" in m else "a text" if "tokenizer_chars" in m else None

    if kind(stored) and kind(meta) and kind(stored) != kind(meta):
        differences.append(f"the data: the checkpoint was trained on {kind(stored)}, this run "
                           f"is on {kind(meta)}")
    else:
        for key in _DATA_IDENTITY:
            if key in stored and key in meta and stored[key] != meta[key]:
                differences.append(_describe_data_change(key, stored[key], meta[key]))
    return {**stored, **meta}, differences


def _weights_finite(model: nn.Module) -> bool:
    flags = [p.detach().isfinite().all() for p in model.parameters()]
    return bool(torch.stack(flags).all())  # one read-back for all tensors


def train(
    model: MiniGPT,
    data: BatchSource,
    config: TrainConfig,
    *,
    checkpoint_path: str | os.PathLike[str] | None = None,
    resume_from: dict[str, Any] | str | os.PathLike[str] | None = None,
    meta: dict[str, Any] | None = None,
) -> TrainResult:
    """Train ``model`` on batches from ``data`` for ``config.max_iters`` iterations.

    ``checkpoint_path`` saves a checkpoint after every evaluation and at the
    end; it is checked before training starts (a folder, a missing or
    unwritable folder, or an existing file that is not a checkpoint of this
    format is refused, so the training text is never overwritten).

    ``resume_from`` (a checkpoint or its path) restores the weights, the
    optimizer, the iteration count, the loss history and every random state,
    then continues to ``config.max_iters``; on CPU the losses are then exactly
    those of the uninterrupted run. A resumed run must be the same run:
    ``ValueError`` names every setting of ``config`` that differs from the
    checkpoint's, except those in :data:`RESUME_MAY_CHANGE` (device, amp,
    compile, progress, log_interval). ``max_iters`` may change (not below the
    checkpoint's iteration) only where the learning-rate schedule stays the
    same: with ``lr_decay_iters`` at the iteration where the stored run's
    schedule ends (its ``lr_decay_iters``, else its ``max_iters``). The data
    must be the same too: where both the checkpoint's ``meta`` and ``meta``
    name it (``tokenizer_chars``, ``text_sha256``, ``task``), they must agree.

    ``meta`` (plain data: numbers, strings, lists, dicts; e.g. the
    tokenizer's characters) is stored in the checkpoint; on resume, the
    checkpoint's meta is kept and updated with it.

    A non-finite training loss stops the run at once (it is found when the
    losses are read back, every ``log_interval`` iterations, and the first
    bad iteration is named): :class:`TrainingDiverged` carries the result so
    far, and the checkpoint on disk stays the last one with finite weights
    (evaluation losses and weights are checked before every save).
    """
    from tqdm.auto import tqdm  # a widget in Jupyter, a text bar in a terminal

    if not isinstance(model, MiniGPT):
        raise TypeError(f"model must be a MiniGPT, got {type(model).__name__}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not hasattr(data, "get_batch"):
        raise TypeError(f"data must provide get_batch(split, batch_size, block_size, ...) "
                        f"(a CharCorpus or a task), got {type(data).__name__}")
    if meta is not None and not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict of plain data or None, got {type(meta).__name__}")
    if meta is not None and not _plain(meta):
        raise TypeError("meta must hold only plain data (str keys; numbers, strings, lists, "
                        "dicts), which a weights-only load can read back")
    meta = dict(meta or {})
    if resume_from is not None and not isinstance(resume_from, dict | str | os.PathLike):
        raise TypeError(f"resume_from must be a checkpoint dict or a path, got "
                        f"{type(resume_from).__name__}")
    checkpoint = None
    if resume_from is not None:
        checkpoint = _check_checkpoint(
            resume_from if isinstance(resume_from, dict) else load_checkpoint(resume_from),
            "resume_from", tuple(_CHECKPOINT_KEYS))
        stored_model, this_model = checkpoint["model_config"], dataclasses.asdict(model.config)
        if stored_model != this_model:
            changes = [f"{key} {stored_model.get(key, 'missing')!r} -> {value!r}"
                       for key, value in this_model.items()
                       if stored_model.get(key, "missing") != value]
            raise ValueError("resume_from was saved for a different model configuration: "
                             + ", ".join(changes or [f"{stored_model} -> {this_model}"]))
        meta, differences = _resume_meta(checkpoint["meta"], meta)
        differences += _resume_differences(checkpoint["train_config"], config)
        if differences:
            raise ValueError(
                "resume_from: a resumed run must be the same run, and this one changes "
                + "; ".join(differences)
                + f". Only {', '.join(RESUME_MAY_CHANGE)} may change, and max_iters when the "
                "learning-rate schedule stays the same")
        if checkpoint["iter"] > config.max_iters:
            raise ValueError(f"resume_from is at iteration {checkpoint['iter']}, past "
                             f"max_iters={config.max_iters}")
    if checkpoint_path is not None:
        _check_output_path(checkpoint_path, "checkpoint_path")
    device = pick_device(config.device)
    model.to(device)
    optimizer = _make_optimizer(model, config, device)
    dtype = amp_dtype(device, amp=config.amp)
    # fp16 gradients underflow without scaling; bf16 and float32 need none (a no-op then).
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    generator = torch.Generator().manual_seed(config.seed)  # data order (CPU, saveable)
    torch.manual_seed(config.seed)  # dropout
    result = TrainResult(n_params=model.num_parameters(), device=str(device))
    start = 0
    history = ("train_losses", "eval_iters", "eval_train_losses", "eval_val_losses")
    if checkpoint is not None:
        try:
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            if checkpoint.get("scaler"):
                scaler.load_state_dict(checkpoint["scaler"])
            generator.set_state(checkpoint["rng"]["data"])
            torch.set_rng_state(checkpoint["rng"]["torch"])
            if device.type == "cuda" and checkpoint["rng"].get("cuda") is not None:
                torch.cuda.set_rng_state_all(checkpoint["rng"]["cuda"])
            for name in history:
                setattr(result, name, [float(v) if name != "eval_iters" else int(v)
                                       for v in checkpoint["history"][name]])
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"resume_from is a damaged course_attn checkpoint: its weights, "
                             f"optimizer state, random states or history do not load "
                             f"({type(error).__name__})") from None
        start = checkpoint["iter"]

    def make_checkpoint(it: int) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "model_config": dataclasses.asdict(model.config),
            "train_config": dataclasses.asdict(config),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "iter": it,
            "rng": {"data": generator.get_state(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None},
            "history": {name: list(getattr(result, name)) for name in history},
            "meta": dict(meta),
        }

    step_model = torch.compile(model) if config.compile else model
    block_size = model.config.block_size
    model.train()
    pending: list[Tensor] = []  # this stretch's losses, still on the device
    saved_iter: int | None = None  # the last checkpoint this run wrote

    def finish() -> None:
        bar.close()
        result.elapsed_s = time.perf_counter() - t_start
        if timed_iters:
            result.ms_per_iter = 1000.0 * train_seconds / timed_iters
            result.tokens_per_s = config.batch_size * block_size * timed_iters / train_seconds

    def diverged(iteration: int, value: float, what: str) -> TrainingDiverged:
        # `what` says what went bad, at `iteration`: "the training loss of iteration 7 is nan"
        finish()
        kept = (f"the checkpoint of iteration {saved_iter} in {str(checkpoint_path)!r} is kept"
                if saved_iter is not None else "no checkpoint was written by this run")
        clip = (f"grad_clip is {config.grad_clip:g}" if config.grad_clip > 0
                else "gradients are not clipped (grad_clip=0); 1.0 is usual")
        return TrainingDiverged(
            f"training diverged: {what}. Stopped there; "
            f"{kept}, and the {len(result.train_losses)} finite training losses before it are "
            f"in the result. Try a lower learning rate (lr is {config.lr:g}) or gradient "
            f"clipping ({clip})",
            result=result, iteration=iteration, loss=value, checkpoint_iter=saved_iter)

    def read_back_losses() -> None:
        values = torch.stack(pending).tolist() if pending else []  # waits for the device
        pending.clear()
        bad = next((i for i, value in enumerate(values) if not math.isfinite(value)), None)
        if bad is not None:
            result.train_losses.extend(values[:bad])
            iteration = len(result.train_losses) + 1
            raise diverged(iteration, values[bad],
                           f"the training loss of iteration {iteration} is {values[bad]}")
        result.train_losses.extend(values)
        if values:
            bar.set_postfix(loss=f"{values[-1]:.4f}", refresh=False)

    # Timing: the clock is read only where the host has just waited for the device
    # (a read-back), so queued GPU work is never missed; the first iteration (kernel
    # selection, torch.compile) and evaluations are left out.
    train_seconds, timed_iters = 0.0, 0
    t_start = time.perf_counter()
    mark_time, mark_iter = t_start, start
    bar = tqdm(range(start, config.max_iters), initial=start, total=config.max_iters,
               disable=not config.progress, desc="train", leave=True)
    for it in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(it, config)
        x, y = data.get_batch("train", config.batch_size, block_size, generator=generator,
                              device=device)  # (B, T), (B, T)
        with _autocast(device, dtype):
            _, loss = step_model(x, y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if config.grad_clip > 0:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        pending.append(loss.detach())
        done = it + 1
        evaluate = done % config.eval_interval == 0 or done == config.max_iters
        warm_up = done == start + 1 and not evaluate
        if evaluate or warm_up or done % config.log_interval == 0:
            read_back_losses()
            now = time.perf_counter()
            if not warm_up:
                train_seconds += now - mark_time
                timed_iters += done - mark_iter
            mark_time, mark_iter = now, done
        if evaluate:
            losses = estimate_loss(model, data, config, device=device)
            for split in ("train", "val"):  # the weights after iteration `done` went bad
                if not math.isfinite(losses[split]):
                    raise diverged(done, losses[split], f"the {split} evaluation loss after "
                                   f"iteration {done} is {losses[split]}")
            result.eval_iters.append(done)
            result.eval_train_losses.append(losses["train"])
            result.eval_val_losses.append(losses["val"])
            bar.set_postfix(loss=f"{result.train_losses[-1]:.4f}", val=f"{losses['val']:.4f}")
            if checkpoint_path is not None:
                if not _weights_finite(model):  # never overwrite good weights with bad ones
                    raise diverged(done, float("nan"),
                                   f"the weights after iteration {done} are not all finite")
                save_checkpoint(checkpoint_path, make_checkpoint(done))
                saved_iter = done
            mark_time = time.perf_counter()  # evaluation is not training time
    finish()
    return result


# ------------------------------------------------------------------------ CLI
#: Model and training sizes of the two presets. ``gpu`` is nanoGPT's "baby GPT"
#: on Tiny Shakespeare (val loss 1.47 in about 3 minutes on one A100); ``cpu`` is
#: its laptop recipe (4 layers, 4 heads, width 128, context 64, batch 12).
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": dict(n_layers=4, n_heads=4, d_model=128, block_size=64, batch_size=12, dropout=0.0,
                lr=1e-3, max_iters=2000, eval_interval=250, eval_iters=20, warmup_iters=100),
    "gpu": dict(n_layers=6, n_heads=6, d_model=384, block_size=256, batch_size=64, dropout=0.2,
                lr=1e-3, max_iters=5000, eval_interval=250, eval_iters=200, warmup_iters=100),
}


#: Dense bf16/fp16 tensor-core peak FLOP/s of common GPUs, from the vendors' data sheets
#: (no sparsity), matched in this order against ``torch.cuda.get_device_name()``.
GPU_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def gpu_peak_flops(name: str) -> float | None:
    """Peak FLOP/s of the GPU called ``name`` (e.g. ``"NVIDIA H100 80GB HBM3"``), or None.

    The denominator of MFU, model FLOPs utilisation: the share of the peak that
    training achieves (:meth:`MiniGPT.flops_per_token` x tokens per second / peak).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a GPU name (str), got {type(name).__name__}")
    if not name.strip():
        raise ValueError("name must be a GPU name such as 'NVIDIA H100 80GB HBM3', got "
                         f"{name!r}")
    return next((peak for key, peak in GPU_PEAK_FLOPS if key in name), None)


def _cpu_flops_per_second(size: int = 512, repeats: int = 5) -> float:
    """Best float32 matrix-multiply throughput of this CPU over a few tries (FLOP/s)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def check_preset_device(preset: str, device: torch.device | str, *, vocab_size: int = 65,
                        cpu_flops: float | None = None) -> None:
    """Refuse to start the ``gpu`` preset on a CPU, saying what it would cost (chapter 8).

    The estimate is :meth:`MiniGPT.flops_per_token` times the tokens of the
    whole run, over this CPU's measured matrix-multiply speed (``cpu_flops``,
    FLOP/s, measured when ``None``): a lower bound, since training never runs
    as fast as one large matrix product. Any other preset or device passes.
    Raises ``ValueError`` with the estimate and the two ways on.
    """
    if not isinstance(preset, str):
        raise TypeError(f"preset must be a str, one of {tuple(PRESETS)}, got "
                        f"{type(preset).__name__}")
    check_choice(preset, "preset", tuple(PRESETS))
    device = check_device(device, "device", allow_none=False)
    check_positive_int(vocab_size, "vocab_size")
    if cpu_flops is not None:
        check_positive_real(cpu_flops, "cpu_flops")
    if preset != "gpu" or device.type != "cpu":
        return
    sizes = PRESETS["gpu"]
    with torch.device("meta"):  # sizes only: no memory, no time
        model = MiniGPT(GPTConfig(vocab_size=vocab_size, block_size=sizes["block_size"],
                                  n_layers=sizes["n_layers"], n_heads=sizes["n_heads"],
                                  d_model=sizes["d_model"]))
    tokens = sizes["max_iters"] * sizes["batch_size"] * sizes["block_size"]
    flops = model.flops_per_token() * tokens
    speed = _cpu_flops_per_second() if cpu_flops is None else check_positive_real(
        cpu_flops, "cpu_flops")
    hours = flops / speed / 3600
    raise ValueError(
        f"the gpu preset trains a {model.num_parameters() / 1e6:.1f}M-parameter model on "
        f"{tokens / 1e6:.0f}M tokens ({flops:.1e} floating-point operations), and no GPU was "
        f"found: this CPU multiplies matrices at {speed / 1e9:.0f} GFLOP/s, so it would take "
        f"at least {hours:.0f} hours. Use the cpu preset, run on a GPU (on Colab: Runtime > "
        "Change runtime type > GPU), or ask for the CPU explicitly (--device cpu) to run it "
        "anyway"
    )


def _cli_number(kind: type, expected: str, accept: Callable[[float], bool]):
    """An argparse ``type=`` that parses ``kind`` and refuses values ``accept`` rejects."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


_positive_int = _cli_number(int, "a positive integer", lambda v: v >= 1)
_non_negative_int = _cli_number(int, "an integer >= 0", lambda v: v >= 0)
_positive_float = _cli_number(float, "a positive number", lambda v: math.isfinite(v) and v > 0)
_non_negative_float = _cli_number(float, "a number >= 0",
                                  lambda v: math.isfinite(v) and v >= 0)
_probability = _cli_number(float, "a number in [0, 1)", lambda v: 0.0 <= v < 1.0)
_seed = _cli_number(int, "an integer in [0, 2**63 - 1]", lambda v: 0 <= v <= MAX_SEED)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m course_attn.train``."""
    parser = argparse.ArgumentParser(
        prog="python -m course_attn.train",
        description="Train the course's MiniGPT (chapter 8) on a text file, on the offline "
                    "default corpus (Python standard-library sources) or on a synthetic task.",
        epilog="examples:\n"
               "  python -m course_attn.train --preset cpu --max-iters 500\n"
               "  python -m course_attn.train --task copy --max-iters 1500 --metrics-out m.json\n"
               "  python -m course_attn.train --data input.txt --preset gpu --out ckpt.pt\n"
               "  python -m course_attn.train --data input.txt --preset gpu --resume ckpt.pt "
               "--out ckpt.pt --max-iters 6000 --lr-decay-iters 5000\n"
               "\n"
               "A resumed run is the same run: give the same data, preset, overrides and seed.\n"
               "--max-iters may grow when --lr-decay-iters keeps the learning-rate schedule\n"
               "where it was (the first run's --lr-decay-iters, else its --max-iters: 5000\n"
               "for the gpu preset); --device, --compile, --no-amp and --quiet may change.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", metavar="PATH",
                        help="UTF-8 text file to train a character-level model on "
                             "(default: the offline standard-library corpus)")
    source.add_argument("--task", choices=sorted(TASKS),
                        help="a synthetic task with a known best loss instead of text")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                        help="model and training sizes (default: cpu; gpu = nanoGPT baby GPT)")
    group = parser.add_argument_group("overrides of the preset")
    group.add_argument("--n-layers", type=_positive_int)
    group.add_argument("--n-heads", type=_positive_int)
    group.add_argument("--d-model", type=_positive_int)
    group.add_argument("--block-size", type=_positive_int,
                       help="context length (with --task: set by the task)")
    group.add_argument("--batch-size", type=_positive_int)
    group.add_argument("--max-iters", type=_positive_int)
    group.add_argument("--lr", type=_positive_float, help="peak learning rate")
    group.add_argument("--lr-decay-iters", type=_positive_int,
                       help="iteration where the cosine decay of the learning rate ends "
                            "(default: --max-iters; fix it to lengthen the run later)")
    group.add_argument("--grad-clip", type=_non_negative_float,
                       help="clip the gradient norm to this (default 1.0; 0 = no clipping)")
    group.add_argument("--dropout", type=_probability)
    group.add_argument("--eval-interval", type=_positive_int)
    group.add_argument("--eval-iters", type=_positive_int)
    group.add_argument("--warmup-iters", type=_non_negative_int)
    group.add_argument("--device", help="cpu, cuda, cuda:1 or mps (default: best available; "
                       "the gpu preset refuses to start on a CPU unless --device cpu is given)")
    group.add_argument("--seed", type=_seed, default=1337,
                       help="random seed, an integer in [0, 2**63 - 1] (default 1337)")
    group.add_argument("--impl", choices=["manual", "sdpa"], default="sdpa",
                       help="attention path: readable manual or PyTorch's fused (default)")
    group.add_argument("--compile", action="store_true", help="torch.compile the model")
    group.add_argument("--no-amp", action="store_true",
                       help="no mixed precision on CUDA (default: bf16 where the GPU has it "
                            "natively, else fp16 with a gradient scaler)")
    parser.add_argument("--out", metavar="CKPT",
                        help="save checkpoints here (plain tensors); an existing file is "
                             "overwritten only if it is a checkpoint")
    parser.add_argument("--resume", metavar="CKPT", help="continue from this checkpoint")
    parser.add_argument("--metrics-out", metavar="JSON",
                        help="write loss history, final losses, speed, parameter count, "
                             "device and torch version as JSON (before any sampling); an "
                             "existing file is overwritten only if this CLI wrote it")
    parser.add_argument("--samples", type=_non_negative_int, default=200, metavar="N",
                        help="characters to generate after training a text model (default 200)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (resolved links, or the same inode)."""
    first, second = Path(a), Path(b)
    if first.resolve() == second.resolve():
        return True
    try:
        return first.exists() and second.exists() and os.path.samefile(first, second)
    except OSError:
        return False


def _write_metrics(path: str, metrics: dict[str, Any]) -> None:
    """Write the metrics JSON atomically (a ``.tmp`` file renamed into place)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m course_attn.train``; returns the exit code.

    Every mistake in the command line, the files or the settings exits with
    code 2 and a message, before any training where it can be known then.
    """
    if argv is not None and (isinstance(argv, str) or not isinstance(argv, Sequence)
                             or not all(isinstance(arg, str) for arg in argv)):
        raise TypeError(f"argv must be a list of str (command-line words) or None, got "
                        f"{argv!r}")
    parser = build_parser()
    args = parser.parse_args(argv)
    preset = dict(PRESETS[args.preset])
    for key in ("n_layers", "n_heads", "d_model", "block_size", "batch_size", "max_iters", "lr",
                "dropout", "eval_interval", "eval_iters", "warmup_iters"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    outputs = [("--out", args.out, "checkpoint"), ("--metrics-out", args.metrics_out, "metrics")]
    for flag, path, _ in outputs:
        if path is not None and args.data is not None and _same_file(path, args.data):
            parser.error(f"{flag} {path!r} is the training text given as --data; refusing to "
                         "overwrite it")
    if args.out is not None and args.metrics_out is not None and _same_file(args.out,
                                                                            args.metrics_out):
        parser.error(f"--out and --metrics-out name the same file {args.out!r}")
    if args.metrics_out is not None and args.resume is not None and _same_file(
            args.metrics_out, args.resume):
        parser.error(f"--metrics-out {args.metrics_out!r} is the checkpoint given as --resume")
    for flag, path, kind in outputs:
        if path is not None:
            try:
                _check_output_path(path, flag, kind=kind)
            except (FileNotFoundError, ValueError) as error:
                parser.error(str(error))
    resume = None
    if args.resume is not None:
        try:
            resume = load_checkpoint(args.resume)
        except (FileNotFoundError, ValueError) as error:
            parser.error(f"--resume {args.resume!r}: {error}")

    meta: dict[str, Any] = {}
    if args.task is not None:
        data: BatchSource = make_task(args.task)
        assert isinstance(data, (CopyTask, RecallTask))
        if args.block_size is not None and args.block_size != data.block_size:
            parser.error(f"--block-size {args.block_size}: the {args.task} task fixes it "
                         f"to {data.block_size}")
        preset["block_size"] = data.block_size
        vocab_size = data.vocab_size
        meta = {"task": args.task, "loss_floor": data.loss_floor()}
    else:
        try:
            text = load_text(args.data) if args.data is not None else default_corpus()
            corpus = CharCorpus.from_text(text)
        except (FileNotFoundError, ValueError) as error:
            parser.error(f"--data {args.data!r}: {error}")
        if len(corpus.val_data) <= preset["block_size"]:
            parser.error(f"--data {args.data!r}: the text is too short for --block-size "
                         f"{preset['block_size']} (its validation tenth has "
                         f"{len(corpus.val_data)} characters)")
        data, vocab_size = corpus, corpus.vocab_size
        meta = {"tokenizer_chars": corpus.tokenizer.chars,
                "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}

    try:
        model_config = GPTConfig(vocab_size=vocab_size, block_size=preset["block_size"],
                                 n_layers=preset["n_layers"], n_heads=preset["n_heads"],
                                 d_model=preset["d_model"], dropout=preset["dropout"],
                                 impl=args.impl)
        options = {} if args.grad_clip is None else {"grad_clip": args.grad_clip}
        config = TrainConfig(max_iters=preset["max_iters"], batch_size=preset["batch_size"],
                             lr=preset["lr"], warmup_iters=preset["warmup_iters"],
                             lr_decay_iters=args.lr_decay_iters,
                             eval_interval=preset["eval_interval"],
                             eval_iters=preset["eval_iters"], seed=args.seed,
                             device=args.device, amp=not args.no_amp, compile=args.compile,
                             progress=not args.quiet, **options)
    except (TypeError, ValueError) as error:
        parser.error(str(error))

    device = pick_device(config.device)
    if args.device is None:  # an explicit --device cpu is the user's informed choice
        try:
            check_preset_device(args.preset, device, vocab_size=vocab_size)
        except ValueError as error:
            parser.error(f"--preset {args.preset}: {error}")
    model = MiniGPT(model_config)
    print(f"MiniGPT: {model.num_parameters():,} parameters, "
          f"{model_config.n_layers} layers x {model_config.n_heads} heads, width "
          f"{model_config.d_model}, context {model_config.block_size}, vocabulary {vocab_size}; "
          f"device {device}")

    def metrics_of(result: TrainResult) -> dict[str, Any]:
        metrics = {"preset": args.preset, "model_config": dataclasses.asdict(model_config),
                   "train_config": dataclasses.asdict(config), **result.to_metrics()}
        if "loss_floor" in meta:
            metrics["loss_floor"] = meta["loss_floor"]
        return metrics

    try:
        result = train(model, data, config, checkpoint_path=args.out, resume_from=resume,
                       meta=meta)
    except TrainingDiverged as error:
        saved = ""
        if args.metrics_out is not None:
            _write_metrics(args.metrics_out,
                           {**metrics_of(error.result), "diverged_at_iter": error.iteration})
            saved = f" The metrics so far are in {args.metrics_out!r}."
        clip = (f"clip harder (--grad-clip below {config.grad_clip:g})" if config.grad_clip > 0
                else "clip the gradients (--grad-clip 1)")
        parser.error(f"{error}.{saved} On the command line: lower --lr (now {config.lr:g}) "
                     f"or {clip}")
    except ValueError as error:  # e.g. a checkpoint of another model or run
        parser.error(str(error))
    # Everything that took time is on disk before anything else can fail: the final
    # checkpoint (written by train at the last iteration), then the metrics.
    if args.metrics_out is not None:
        _write_metrics(args.metrics_out, metrics_of(result))
    print(f"final loss: train {result.final_train_loss:.4f}, val {result.final_val_loss:.4f} "
          f"({result.ms_per_iter:.1f} ms/iter, {result.tokens_per_s:,.0f} tokens/s)")
    if "loss_floor" in meta:
        print(f"best achievable loss of the task: {meta['loss_floor']:.4f}")
    if "tokenizer_chars" in meta and args.samples:
        tokenizer = corpus.tokenizer
        prompt = corpus.train_data[:1].unsqueeze(0).to(next(model.parameters()).device)  # (1, 1)
        generator = torch.Generator(device=prompt.device).manual_seed(args.seed)
        sample = model.generate(prompt, args.samples, top_k=min(10, tokenizer.vocab_size),
                                generator=generator)
        print("sample:\n" + tokenizer.decode(sample[0, 1:].cpu()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
