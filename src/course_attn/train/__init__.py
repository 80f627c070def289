"""Chapter 11's trainer: the loop, checkpoints, resuming, presets, the command line, sampling.

``python -m course_attn.train`` runs :func:`course_attn.train.cli.main` (on several
processes under ``torchrun``, :mod:`course_attn.train.distributed`);
``python -m course_attn.sample`` runs :func:`course_attn.train.sample.main`.
"""

from .checkpoint import CHECKPOINT_FORMAT, load_checkpoint, model_from_checkpoint, save_checkpoint
from .cli import build_parser, configs_from_args, main
from .hardware import GPU_PEAK_FLOPS, gpu_peak_flops
from .loop import (
    FUSED_ADAMW_DEVICES,
    BatchSource,
    CheckpointWriteError,
    TrainConfig,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    amp_dtype,
    estimate_loss,
    learning_rate,
    train,
)
from .outputs import METRICS_FORMAT as METRICS_FORMAT  # importable, not in __all__
from .presets import PRESETS, check_preset_device
from .resume import RESUME_MAY_CHANGE

__all__ = [
    "CHECKPOINT_FORMAT",
    "FUSED_ADAMW_DEVICES",
    "GPU_PEAK_FLOPS",
    "PRESETS",
    "RESUME_MAY_CHANGE",
    "BatchSource",
    "CheckpointWriteError",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "amp_dtype",
    "build_parser",
    "configs_from_args",
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
