"""Data parallelism on this machine (chapter 11): two processes against one, same steps.

Trains chapter 11's copy-task model for 20 steps at a global batch of 8 sequences,
three ways: ``torchrun --nproc_per_node=2`` (gloo on a CPU, NCCL on GPUs; 4 sequences
per process), one process accumulating 2 micro-batches of 4, and one process with
batches of 8. Prints each run's time per step (the trainer's ``ms_per_iter``) and the
largest difference between the final weights, and the bytes one step all-reduces
for this model and for the GPU preset's.

    python benchmarks/data_parallel.py            # --device cuda for GPUs (one per process)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from course_attn import GPTConfig, MiniGPT
from course_attn.train import PRESETS, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def run(folder: Path, name: str, flags: list[str], processes: int, device: str) -> dict:
    """One training run; its metrics, and its final weights."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={processes}"] if processes > 1 else [sys.executable])
    ckpt, metrics = folder / f"{name}.pt", folder / f"{name}.json"
    command = [*launcher, "-m", "course_attn.train", "--task", "copy", "--n-layers", "2",
               "--n-heads", "2", "--d-model", "64", "--max-iters", "20", "--eval-interval",
               "20", "--eval-iters", "1", "--device", device, "--quiet", "--out", str(ckpt),
               "--metrics-out", str(metrics), *flags]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    return {"metrics": json.loads(metrics.read_text()), "weights": load_checkpoint(ckpt)["model"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    device = parser.parse_args().device
    plan = {"2 processes x 4": (["--batch-size", "4"], 2),
            "1 process x 4, accumulation 2": (["--batch-size", "4", "--grad-accum", "2"], 1),
            "1 process x 8": (["--batch-size", "8"], 1)}
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run(Path(tmp), str(i), flags, n, device)
                   for i, (name, (flags, n)) in enumerate(plan.items())}
    reference = results["2 processes x 4"]["weights"]
    print(f"20 steps of the copy task at a global batch of 8 sequences, on {device}, "
          f"torch {torch.__version__}:")
    for name, result in results.items():
        gap = max(float((result["weights"][k] - reference[k]).abs().max()) for k in reference)
        print(f"   {name:32s} {result['metrics']['ms_per_iter']:8.2f} ms/step   "
              f"largest weight difference from 2 processes: {gap:.1e}")
    for label, sizes in (("this model", dict(n_layers=2, n_heads=2, d_model=64)),
                         ("the gpu preset", {k: PRESETS["gpu"][k] for k in
                                             ("n_layers", "n_heads", "d_model")})):
        model = MiniGPT(GPTConfig(vocab_size=65, context_length=256, **sizes))
        n = model.num_parameters()
        print(f"   {label}: {n:,} parameters, so each step all-reduces {4 * n / 1e6:.1f} MB of "
              f"float32 gradients (a ring all-reduce sends about twice that per process)")


if __name__ == "__main__":
    main()
