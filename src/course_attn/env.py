"""Where the course runs: versions, device choice and seeding (first cell of every chapter)."""

from __future__ import annotations

import platform
import random

import numpy as np
import torch

__all__ = ["environment_report", "pick_device", "seed_everything"]


def pick_device(preferred: str | None = None) -> torch.device:
    """Return ``preferred`` if given, else the best available: cuda, then mps, then cpu."""
    if preferred is not None:
        if not isinstance(preferred, str):
            raise TypeError(f"preferred must be a device string or None, got {preferred!r}")
        try:
            device = torch.device(preferred)
        except RuntimeError:
            raise ValueError(f"preferred must name a torch device, got {preferred!r}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("preferred='cuda' but no CUDA device is available")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise ValueError("preferred='mps' but no Apple MPS device is available")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a ``torch.Generator`` seeded the same way."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002  (readers' own np.random calls)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def environment_report() -> str:
    """One line per library version plus the device the chapter will use."""
    import matplotlib

    from . import __version__

    device = pick_device()
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else platform.machine()
    lines = [
        f"python      {platform.python_version()}",
        f"torch       {torch.__version__}",
        f"numpy       {np.__version__}",
        f"matplotlib  {matplotlib.__version__}",
        f"course_attn {__version__}",
        f"device      {device.type} ({name})",
    ]
    return "\n".join(lines)
