"""Resuming a training run (chapter 11): a resumed run must be the same run.

:func:`check_resume` compares a checkpoint with the run that would continue
it and names every difference: another model, other settings beyond those in
:data:`RESUME_MAY_CHANGE`, another learning-rate schedule, other data. Only
then does :func:`~course_attn.train.train` put the checkpoint's state back,
so that the resumed run repeats the uninterrupted run's losses exactly.
"""

from __future__ import annotations

import os
from typing import Any

from .checkpoint import CHECKPOINT_KEYS, check_checkpoint, load_checkpoint

__all__ = ["RESUME_MAY_CHANGE"]

#: Settings a resumed run may change: where and how the arithmetic runs, and what is
#: shown. Everything else must be as the checkpoint stored it (see :func:`check_resume`).
RESUME_MAY_CHANGE = ("device", "amp", "compile", "progress", "log_interval")
#: A run may also change ``batch_size`` and ``grad_accum`` along with its number of
#: processes, when the global batch ``batch_size * grad_accum * processes`` stays the same.
#: Keys of ``meta`` that say which data a run trains on; a resumed run must agree on them.
_DATA_IDENTITY = ("tokenizer_chars", "text_sha256", "task", "document_separator")


def _schedule(config: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """What fixes the learning rate at every iteration: lr, min_lr, warmup, decay end.

    The values come from a stored config (a plain dict), so their types are the
    dict's; a missing key is ``None`` and compares unequal to a number.
    """
    lr, min_lr, decay = config.get("lr"), config.get("min_lr"), config.get("lr_decay_iters")
    if min_lr is None and lr is not None:
        min_lr = lr / 10
    end = config.get("max_iters") if decay is None else decay
    return lr, min_lr, config.get("warmup_iters"), end


def _model_differences(stored: dict[str, Any], model_config: dict[str, Any]) -> list[str]:
    if stored == model_config:
        return []
    changes = [f"{key} {stored.get(key, 'missing')!r} -> {value!r}"
               for key, value in model_config.items() if stored.get(key, "missing") != value]
    return changes or [f"{stored} -> {model_config}"]


def _global_batch(config: dict[str, Any], world_size: int) -> Any:
    """Sequences per optimizer step: ``batch_size * grad_accum * processes``."""
    size, accum = config.get("batch_size"), config.get("grad_accum", 1)  # 1 before issue 26
    return size * accum * world_size if isinstance(size, int) and isinstance(accum, int) else size


def _setting_differences(stored: dict[str, Any], config: dict[str, Any], *,
                         stored_world: int = 1, world: int = 1) -> list[str]:
    """The settings in which ``config`` differs from a checkpoint's, beyond what may change.

    The per-process batch and the accumulation may change with the number of processes,
    as long as the global batch (and so every step) stays the same.
    """
    differences = []
    old_batch, new_batch = _global_batch(stored, stored_world), _global_batch(config, world)
    if old_batch != new_batch:
        # Every process trains on batch_size x grad_accum rows of each step's global batch.
        split = (f" ({old_batch} rows cannot be split over {world} processes: resume on "
                 f"a number of processes that divides {old_batch})"
                 if isinstance(old_batch, int) and old_batch % world else "")
        differences.append(
            f"the global batch (batch_size x grad_accum x processes): "
            f"{stored.get('batch_size')} x {stored.get('grad_accum', 1)} x {stored_world} = "
            f"{old_batch} in the checkpoint, {config.get('batch_size')} x "
            f"{config.get('grad_accum', 1)} x {world} = {new_batch} now{split}")
    for key, value in config.items():
        if key in RESUME_MAY_CHANGE or key in ("max_iters", "lr_decay_iters", "batch_size",
                                               "grad_accum"):
            continue
        if key == "min_lr":  # None means lr / 10: compare what it stands for
            if _schedule(stored)[1] != _schedule(config)[1]:
                differences.append(f"min_lr {stored.get(key)!r} -> {value!r}")
        elif stored.get(key, "missing") != value:
            differences.append(f"{key} {stored.get(key, 'missing')!r} -> {value!r}")
    old_end, new_end = _schedule(stored)[3], _schedule(config)[3]
    if old_end != new_end:
        differences.append(
            f"the learning rate decays until iteration {old_end} in the checkpoint and until "
            f"{new_end} now (max_iters {stored.get('max_iters')} -> {config['max_iters']}, "
            f"lr_decay_iters {stored.get('lr_decay_iters')} -> {config['lr_decay_iters']}); "
            f"to train longer, keep the schedule: lr_decay_iters={old_end} (--lr-decay-iters "
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


def _data_differences(stored: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """How the data named by ``meta`` differs from the data named by a checkpoint's meta."""

    def kind(m: dict[str, Any]) -> str | None:
        return "a task" if "task" in m else "a text" if "tokenizer_chars" in m else None

    if kind(stored) and kind(meta) and kind(stored) != kind(meta):
        return [f"the data: the checkpoint was trained on {kind(stored)}, this run is on "
                f"{kind(meta)}"]
    return [_describe_data_change(key, stored[key], meta[key]) for key in _DATA_IDENTITY
            if key in stored and key in meta and stored[key] != meta[key]]


def check_resume(resume_from: dict[str, Any] | str | os.PathLike[str],
                 model_config: dict[str, Any], train_config: dict[str, Any],
                 meta: dict[str, Any], *, world_size: int = 1
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint to resume from, and the resumed run's meta, if this is the same run.

    ``model_config`` and ``train_config`` are the new run's settings as dicts
    (``dataclasses.asdict``), ``meta`` its meta, ``world_size`` its number of processes;
    the returned meta is the checkpoint's, updated by ``meta``. A ``ValueError`` names
    every difference. A run may resume on another number of processes when its global
    batch stays the same (the checkpoint's meta records its number, ``world_size``).
    """
    checkpoint = check_checkpoint(
        resume_from if isinstance(resume_from, dict) else load_checkpoint(resume_from),
        "resume_from", tuple(CHECKPOINT_KEYS))
    changes = _model_differences(checkpoint["model_config"], model_config)
    if changes:
        raise ValueError("resume_from was saved for a different model configuration: "
                         + ", ".join(changes))
    stored_world = checkpoint["meta"].get("world_size", 1)
    differences = (_data_differences(checkpoint["meta"], meta)
                   + _setting_differences(checkpoint["train_config"], train_config,
                                          stored_world=stored_world, world=world_size))
    if differences:
        raise ValueError(
            "resume_from: a resumed run must be the same run, and this one changes "
            + "; ".join(differences)
            + f". Only {', '.join(RESUME_MAY_CHANGE)} may change, and max_iters when the "
            "learning-rate schedule stays the same")
    if checkpoint["iter"] > train_config["max_iters"]:
        raise ValueError(f"resume_from is at iteration {checkpoint['iter']}, past "
                         f"max_iters={train_config['max_iters']}")
    return checkpoint, {**checkpoint["meta"], **meta}
