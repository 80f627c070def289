#!/usr/bin/env python3
"""Train chapter 11's slow ablation rows for long, and cache what they reach.

    PYTHONPATH=src python tools/ablation_long_runs.py     # a few minutes on one CPU core

Chapter 11 trains every row of its ablation table for 200 iterations, inside the
notebook's time budget. Two rows are still moving then, and the chapter's
question about them is where they end up: the copy task without positions, and
the recall task without positions or with one layer. This script trains those
rows for longer, with the chapter's models and settings (only ``max_iters``
differs), measures them exactly as the notebook measures its rows
(``course_attn.lab.ablation.position_losses`` and ``part_means``)
and writes the results to ``src/course_attn/lab/ablation_runs.json``, which the
notebook reads (``course_attn.lab.ablation.LONG_RUNS``). CPU, one thread, fixed
seeds: the same numbers on every run on the same machine.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from course_attn.data.tasks import CopyTask, RecallTask
from course_attn.lab.ablation import freeze_positions, part_means, position_losses
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import TrainConfig, train

OUT = Path(__file__).resolve().parents[1] / "src" / "course_attn" / "lab" / "ablation_runs.json"

#: The chapter's two tasks, their models (seed 0) and training settings (11.2 and 11.4).
TASKS = {"copy": CopyTask(vocab_size=16, half_length=12),
         "recall": RecallTask(n_keys=8, n_values=8, n_pairs=12, max_step=4)}
MODELS = {name: GPTConfig(vocab_size=task.vocab_size, context_length=task.context_length,
                          n_layers=2,
                          n_heads=2, d_model=64, init_std=0.1 if name == "recall" else 0.02)
          for name, task in TASKS.items()}
SETTINGS = {"copy": dict(batch_size=32, lr=3e-3, warmup_iters=50, weight_decay=0.0,
                         eval_iters=20),
            "recall": dict(batch_size=128, lr=3e-3, warmup_iters=50, weight_decay=0.0,
                           eval_iters=4)}
#: (task, change, iterations): the rows trained for long.
RUNS = (("copy", "no positions", 4000), ("recall", "no positions", 1000),
        ("recall", "one layer", 1000))


def model_for(name: str, change: str) -> MiniGPT:
    """The chapter's model of task ``name`` with ``change`` made (seed 0, as in the notebook)."""
    config = MODELS[name]
    if change == "one layer":
        config = dataclasses.replace(config, n_layers=1)
    torch.manual_seed(0)
    model = MiniGPT(config)
    if change == "no positions":
        freeze_positions(model)
    elif change != "one layer":
        raise ValueError(f"change must be 'no positions' or 'one layer', got {change!r}")
    return model


def train_config(name: str, iterations: int) -> TrainConfig:
    return TrainConfig(max_iters=iterations, eval_interval=iterations, device="cpu",
                       progress=False, **SETTINGS[name])


def run(name: str, change: str, iterations: int) -> dict:
    """Train one row for ``iterations`` and measure it; the entry written for it."""
    task, model = TASKS[name], model_for(name, change)
    config = train_config(name, iterations)
    start = time.perf_counter()
    train(model, task, config)
    seconds = time.perf_counter() - start
    losses = part_means(position_losses(model, task), task)
    print(f"{name}, {change}, {iterations} iterations: {losses} ({seconds:.0f} s)",
          file=sys.stderr)
    return {"task": dataclasses.asdict(task), "model": dataclasses.asdict(model.config),
            "train": dataclasses.asdict(config), "losses": losses}


def main() -> None:
    torch.set_num_threads(1)
    runs = {f"{name}, {change}": run(name, change, iterations)
            for name, change, iterations in RUNS}
    about = ("Chapter 11's long ablation runs, cached. Written by tools/ablation_long_runs.py; "
             "do not edit, run the script again. Each entry is one row of the chapter's "
             "ablation table trained for longer than the notebook can afford: the task, the "
             "model and training settings it ran with, and its mean loss (nats) overall and "
             "over each part of the task (course_attn.lab.ablation.part_means), measured on "
             "the notebook's 512 fresh sequences. Produced with torch "
             f"{torch.__version__.split('+')[0]}, on a CPU, one thread.")
    OUT.write_text(json.dumps({"about": about, "runs": runs}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
