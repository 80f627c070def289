"""What the processors can do (chapter 11): GPUs' peak FLOP/s, and this CPU's measured speed.

The peak is the denominator of MFU, model FLOPs utilisation, the share of
the peak that training achieves; the CPU's speed tells what a preset would
cost there (:func:`~course_attn.train.presets.check_preset_device`).
"""

from __future__ import annotations

import time

import torch

__all__ = ["GPU_PEAK_FLOPS", "gpu_peak_flops"]

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


def cpu_flops_per_second(size: int = 512, repeats: int = 5) -> float:
    """Best float32 matrix-multiply throughput of this CPU over a few tries (FLOP/s)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
