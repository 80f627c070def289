"""The checkpoint format of chapter 11's trainer: what a checkpoint holds, written and read.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts,
read back with ``torch.load(weights_only=True)`` (a file that holds any other
Python object is refused: loading it could run code). It holds everything a
run needs to continue exactly where it stopped (:func:`training_state`,
:func:`restore_training_state`): the weights, the optimizer and gradient
scaler, the iteration, every random state, the loss history, and ``meta``
(which data the run trained on).

Older checkpoints keep loading: the model's names that changed since they
were written are renamed on every load, in one place (:data:`OLD_NAMES`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .._validation import check_device
from ..data.text import CharTokenizer
from ..models.gpt import GPTConfig, MiniGPT
from .outputs import check_output_path, check_path, write_atomically

__all__ = ["CHECKPOINT_FORMAT", "load_checkpoint", "model_from_checkpoint", "save_checkpoint"]

CHECKPOINT_FORMAT = "course_attn.train/1"

#: Every key of a checkpoint, and the kind of its value.
CHECKPOINT_KEYS: dict[str, type] = {
    "model_config": dict, "train_config": dict, "model": dict, "optimizer": dict,
    "iter": int, "rng": dict, "history": dict, "meta": dict,
}
#: Keys a checkpoint may lack: the gradient scaler's state came with mixed precision.
OPTIONAL_KEYS: dict[str, type] = {"scaler": dict}
#: The loss history a checkpoint keeps: the lists of a :class:`~course_attn.train.TrainResult`.
HISTORY = ("train_losses", "eval_iters", "eval_train_losses", "eval_val_losses")

#: Names a checkpoint's model had when it was written, and today's names (issue 17 made
#: ``n_layer``/``n_head`` plural, and named MiniGPT's embeddings and final norm like the
#: encoder-decoder's). ``"model_config"`` maps keys of the config; ``"model"`` maps the
#: first part of the weights' names. The format string stayed: nothing else changed.
OLD_NAMES: dict[str, dict[str, str]] = {
    "model_config": {"n_layer": "n_layers", "n_head": "n_heads", "block_size": "context_length"},
    "model": {"tok_emb.": "embed.", "pos_emb.": "pos.", "ln_f.": "norm."},
}


def _renamed(key: object, old_prefixes: dict[str, str]) -> object:
    if isinstance(key, str):
        for old, new in old_prefixes.items():
            if key.startswith(old):
                return new + key.removeprefix(old)
    return key


def _with_todays_names(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``checkpoint`` with the model's old names (:data:`OLD_NAMES`) renamed."""
    upgraded = dict(checkpoint)
    config, weights = checkpoint.get("model_config"), checkpoint.get("model")
    if isinstance(config, dict):
        keys = OLD_NAMES["model_config"]
        # Fields GPTConfig gained after a checkpoint was written take their defaults,
        # which are the behaviour of the model that wrote it.
        added = {f.name: f.default for f in dataclasses.fields(GPTConfig)
                 if f.default is not dataclasses.MISSING}
        upgraded["model_config"] = {**added, **{keys.get(key, key): value
                                                for key, value in config.items()}}
    if isinstance(weights, dict):
        upgraded["model"] = {_renamed(key, OLD_NAMES["model"]): value
                             for key, value in weights.items()}
    return upgraded


def is_plain(value: object) -> bool:
    """Plain data a weights-only load can read back: numbers, strings, lists, dicts."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def _read(source: Path, map_location: str | torch.device, *, mmap: bool = False) -> Any:
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


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds a checkpoint of this format (memory-mapped: cheap when large)."""
    try:
        checkpoint = _read(path, "cpu", mmap=True)
    except ValueError:
        return False
    return isinstance(checkpoint, dict) and checkpoint.get("format") == CHECKPOINT_FORMAT


def check_checkpoint_path(path: object, name: str) -> Path:
    """Check, before any work, that ``path`` may receive a checkpoint; return it.

    See :func:`~course_attn.train.outputs.check_output_path`: an existing file is
    overwritten only if it is a checkpoint of this format.
    """
    return check_output_path(path, name, is_ours=is_checkpoint,
                             what="a course_attn checkpoint", example="ckpt.pt")


def check_checkpoint(checkpoint: object, name: str, keys: Sequence[str]) -> dict[str, Any]:
    """A checkpoint dict of this format with ``keys`` present and of the right kind.

    Returns a copy with today's names (:data:`OLD_NAMES`); ``checkpoint`` is untouched.
    """
    if not isinstance(checkpoint, dict):
        raise TypeError(f"{name} must be a checkpoint dict or a path, got "
                        f"{type(checkpoint).__name__}")
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{name} is not a course_attn training checkpoint (format "
                         f"{checkpoint.get('format')!r}, expected {CHECKPOINT_FORMAT!r})")
    kinds = {**CHECKPOINT_KEYS, **OPTIONAL_KEYS}
    missing = [key for key in keys if key not in checkpoint]
    wrong = [key for key in (*keys, *OPTIONAL_KEYS) if key in checkpoint
             and not isinstance(checkpoint[key], kinds[key])]
    iteration = checkpoint.get("iter")
    if isinstance(iteration, bool) or (isinstance(iteration, int) and iteration < 0):
        wrong.append("iter")
    if missing or wrong:
        raise ValueError(f"{name} is an incomplete or damaged course_attn checkpoint "
                         f"(missing {missing}, malformed {wrong})")
    return _with_todays_names(checkpoint)


def _listed(names: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _shape(value: object) -> tuple[int, ...] | str:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def _model_config(checkpoint: dict[str, Any], name: str) -> GPTConfig:
    """The checkpoint's ``model_config`` as a :class:`GPTConfig`, or a ``ValueError``."""
    config = checkpoint["model_config"]
    known = {f.name for f in dataclasses.fields(GPTConfig)}
    unknown = sorted(str(key) for key in config if key not in known)
    missing = sorted(key for key in known if key not in config)
    if unknown or missing:
        parts = [f"{what}: {_listed(keys)}" for what, keys in (
            ("keys GPTConfig does not know", unknown), ("keys it lacks", missing)) if keys]
        raise ValueError(f"{name}: its model_config is not a GPTConfig ({'; '.join(parts)})")
    try:
        return GPTConfig(**config)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: its model_config is not a GPTConfig: {error}") from None


def check_model_parts(checkpoint: dict[str, Any], name: str) -> GPTConfig:
    """Check that a checkpoint's model config, weights and characters agree; return the config.

    ``checkpoint`` comes from :func:`check_checkpoint` (today's names). A
    ``ValueError`` naming ``name`` (the file) for a ``model_config`` that is
    not a :class:`GPTConfig` (a key it does not know, a key missing), weights
    that are not those of the model it describes (a weight missing or left
    over, another shape), and a tokenizer whose number of characters is not
    the model's vocabulary size. The model is built on the ``meta`` device:
    shapes only, no memory, no time.
    """
    config = _model_config(checkpoint, name)
    with torch.device("meta"):
        expected = MiniGPT(config).state_dict()
    weights = checkpoint["model"]
    missing = [key for key in expected if key not in weights]
    unexpected = [str(key) for key in weights if key not in expected]
    reshaped = [f"{key} {_shape(weights[key])} instead of {tuple(tensor.shape)}"
                for key, tensor in expected.items()
                if key in weights and _shape(weights[key]) != tuple(tensor.shape)]
    if missing or unexpected or reshaped:
        parts = [f"{what}: {_listed(keys)}" for what, keys in (
            ("missing", missing), ("unexpected", unexpected), ("other shapes", reshaped))
            if keys]
        raise ValueError(f"{name} does not hold the weights of the model its model_config "
                         f"describes ({'; '.join(parts)})")
    meta = checkpoint.get("meta")
    chars = meta.get("tokenizer_chars") if isinstance(meta, dict) else None
    if chars is not None and (not isinstance(chars, str) or len(set(chars)) != len(chars)
                              or len(chars) != config.vocab_size):
        count = (f"{len(chars)} characters" if isinstance(chars, str)
                 else f"a {type(chars).__name__}")
        raise ValueError(f"{name}: its tokenizer (meta['tokenizer_chars']) holds {count}, "
                         f"but its model's vocabulary has {config.vocab_size} tokens "
                         f"(model_config['vocab_size']): a text model needs one distinct "
                         f"character per token")
    return config


def checkpoint_bytes(model: nn.Module) -> int:
    """A lower bound on the size of a checkpoint of ``model``: its weights and buffers, and
    AdamW's two moments per weight (the file also holds names and the run's history)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return 3 * weights + sum(b.numel() * b.element_size() for b in model.buffers())


def check_checkpoint_room(path: Path, name: str, model: nn.Module) -> None:
    """Refuse, before training, a disk without room for one checkpoint of ``model``.

    The new checkpoint is written beside the old one before it replaces it
    (:func:`~course_attn.train.outputs.write_atomically`), so one checkpoint's
    room must be free even when ``path`` holds the last one.
    """
    folder = path.resolve().parent
    free, needed = shutil.disk_usage(folder).free, checkpoint_bytes(model)
    if free < needed:
        raise ValueError(f"{name} {str(path)!r}: the disk of {str(folder)!r} has {free:,} "
                         f"bytes free, fewer than the {needed:,} a checkpoint of this model "
                         "takes")


def save_checkpoint(path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> Path:
    """Write a checkpoint dict, as :func:`~course_attn.train.train` makes it.

    The file is written next to ``path`` as ``path + ".tmp"``, synced to the
    disk and then renamed, so a crash never leaves a half-written checkpoint
    under ``path``. If the write fails (a full disk, a read-only folder), the
    ``.tmp`` file is removed, the old file is untouched, and the error is an
    ``OSError`` with the cause's errno, never ``torch.save``'s bare
    ``RuntimeError`` (:func:`~course_attn.train.outputs.write_atomically`).
    """
    target = check_path(path, "path")
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
    write_atomically(target, lambda handle: torch.save(checkpoint, handle))
    return target


def load_checkpoint(path: str | os.PathLike[str], *, map_location: str | torch.device = "cpu"
                    ) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` (no arbitrary pickles).

    An empty, truncated or foreign file gives a ``ValueError`` that says
    "... is not a readable course_attn checkpoint" and why; so does one whose
    parts disagree (:func:`check_model_parts`: a ``model_config`` key that
    :class:`GPTConfig` does not know, a missing weight, characters that are
    not the model's vocabulary), naming the file. A checkpoint written before
    the model's names changed comes back with today's names.
    """
    source = check_path(path, "path")
    check_device(map_location, "map_location", allow_none=False)
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint {str(source)!r} is not an existing file")
    checkpoint = _read(source, map_location)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(source)!r} is not a course_attn training checkpoint")
    checked = check_checkpoint(checkpoint, repr(str(source)), tuple(CHECKPOINT_KEYS))
    check_model_parts(checked, repr(str(source)))
    return checked


def model_from_checkpoint(checkpoint: dict[str, Any] | str | os.PathLike[str]
                          ) -> tuple[MiniGPT, CharTokenizer | None]:
    """Rebuild the trained :class:`MiniGPT` (and its tokenizer, for text runs).

    A checkpoint whose parts disagree is a ``ValueError`` (:func:`check_model_parts`).
    """
    if not isinstance(checkpoint, dict):
        if not isinstance(checkpoint, str | os.PathLike):
            raise TypeError(f"checkpoint must be a checkpoint dict or a path, got "
                            f"{type(checkpoint).__name__}")
        checkpoint = load_checkpoint(checkpoint)  # checked, and named by its file
        config = GPTConfig(**checkpoint["model_config"])
    else:
        checkpoint = check_checkpoint(checkpoint, "checkpoint", ("model_config", "model"))
        config = check_model_parts(checkpoint, "checkpoint")
    model = MiniGPT(config)
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError:  # shapes and names were checked: what is left is another dtype
        raise ValueError("checkpoint['model'] does not hold the weights of the model that "
                         "checkpoint['model_config'] describes") from None
    meta = checkpoint.get("meta") or {}
    chars = meta.get("tokenizer_chars") if isinstance(meta, dict) else None
    return model, (CharTokenizer(chars) if chars else None)


def training_state(*, model: MiniGPT, train_config: dict[str, Any],
                   optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                   generator: torch.Generator, device: torch.device, iteration: int,
                   history: dict[str, list[float] | list[int]], meta: dict[str, Any]
                   ) -> dict[str, Any]:
    """The checkpoint of a run after ``iteration`` iterations, for :func:`restore_training_state`.

    ``generator`` draws the batches; the global torch random state (and, on
    CUDA, the GPU's) draws dropout: all three are saved.
    """
    return {
        "format": CHECKPOINT_FORMAT,
        "model_config": dataclasses.asdict(model.config),
        "train_config": train_config,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "iter": iteration,
        "rng": {"data": generator.get_state(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None},
        "history": {name: list(history[name]) for name in HISTORY},
        "meta": dict(meta),
    }


def restore_training_state(checkpoint: dict[str, Any], *, model: nn.Module,
                           optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                           generator: torch.Generator, device: torch.device
                           ) -> dict[str, list[float] | list[int]]:
    """Put a checked checkpoint's weights, optimizer and random states back; return its history.

    A part that does not load is a ``ValueError`` (a damaged checkpoint).
    """
    try:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if checkpoint.get("scaler"):
            scaler.load_state_dict(checkpoint["scaler"])
        generator.set_state(checkpoint["rng"]["data"])
        torch.set_rng_state(checkpoint["rng"]["torch"])
        if device.type == "cuda" and checkpoint["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(checkpoint["rng"]["cuda"])
        return {name: [int(v) if name == "eval_iters" else float(v)
                       for v in checkpoint["history"][name]] for name in HISTORY}
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"resume_from is a damaged course_attn checkpoint: its weights, "
                         f"optimizer state, random states or history do not load "
                         f"({type(error).__name__})") from None
