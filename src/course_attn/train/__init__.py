"""Chapter 11's trainer: the loop, checkpoints, resuming, presets and the command line.

``python -m course_attn.train`` runs :func:`course_attn.train.cli.main`.
"""

from .checkpoint import CHECKPOINT_FORMAT, load_checkpoint, model_from_checkpoint, save_checkpoint
from .cli import build_parser, main
from .hardware import GPU_PEAK_FLOPS, gpu_peak_flops
from .loop import (
    BatchSource,
    TrainConfig,
    TrainingDiverged,
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
    "GPU_PEAK_FLOPS",
    "PRESETS",
    "RESUME_MAY_CHANGE",
    "BatchSource",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "amp_dtype",
    "build_parser",
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
