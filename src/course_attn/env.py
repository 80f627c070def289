"""Where the course runs: versions, device choice and seeding (first cell of every chapter)."""

from __future__ import annotations

import platform
import random

import numpy as np
import torch

from ._validation import check_device, check_device_exists

__all__ = ["environment_report", "pick_device", "seed_everything"]


RUNNABLE_DEVICE_TYPES = ("cpu", "cuda", "mps")


def pick_device(preferred: str | torch.device | None = None) -> torch.device:
    """``preferred`` if given, else the best available: cuda, mps, then cpu (Chapter 11).

    ``preferred`` is ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` (or such a
    ``torch.device``), and must exist on this machine: ``"cuda:7"`` on a machine
    with one GPU is a ``ValueError`` naming the index and the count. Devices
    that cannot run the course (``"meta"`` has no values, others are not
    supported) are refused too.
    """
    if preferred is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = check_device(preferred, "preferred", allow_none=False)
    if device.type not in RUNNABLE_DEVICE_TYPES:
        why = " ('meta' tensors have shapes but no values)" if device.type == "meta" else ""
        raise ValueError(f"preferred={preferred!r} is not a device to run on{why}; the course "
                         f"runs on {', '.join(RUNNABLE_DEVICE_TYPES)}")
    if device.type == "cpu" and device.index not in (None, 0):
        raise ValueError(f"preferred={preferred!r}: there is one CPU device, 'cpu' (index 0)")
    return check_device_exists(device, "preferred")


SEED_MAX = 2**64 - 1  # torch.manual_seed takes at most an unsigned 64-bit integer


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a ``torch.Generator`` seeded the same way (Chapter 1).

    ``seed`` is an int in ``[0, 2**64 - 1]`` (torch's range; NumPy gets ``seed % 2**32``).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int in [0, 2**64 - 1], got "
                        f"{type(seed).__name__} {seed!r}")
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be an int in [0, 2**64 - 1] (torch's seed range), "
                         f"got {seed}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002  (readers' own np.random calls)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def environment_report() -> str:
    """One line per library version plus the device the chapter will use (Chapter 1)."""
    import matplotlib

    from ._version import __version__

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
