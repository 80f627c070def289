#!/usr/bin/env python3
"""Train chapter 11's ablation rows with three seeds, and the slow rows for long; record them.

    PYTHONPATH=src python tools/ablation_long_runs.py     # about 15 minutes on one CPU core

Chapter 11 trains every row of its ablation table once (seed 0) for 200 iterations, inside
the notebook's time budget, and its recall runs of section 11.4 once for 500 iterations.
This script writes the record the chapter quotes for what one run cannot say
(``src/course_attn/lab/ablation_runs.json``, read as ``course_attn.lab.ablation``'s
``LONG_RUNS``, ``SHORT_RUNS`` and ``VARIANT_RUNS``):

* ``runs``: the three rows still moving after 200 iterations (the copy task without
  positions, the recall task without positions or with one layer), trained for longer;
* ``short_runs``: every row of the table at the chapter's 200 iterations;
* ``variant_runs``: section 11.4's recall runs of 500 iterations (``init_std`` 0.1 and 0.02,
  and RoPE with one key/value head);

each with seeds 0, 1 and 2. Seed ``s`` calls ``torch.manual_seed(s)`` before the model is
built and trains with ``TrainConfig.seed = 1337 + s`` (the batches); seed 0 is the chapter's
own run. Every row is measured as the notebook measures it (``position_losses`` on the same
512 sequences, then ``part_means``). Each long row also gets a ``probe``: seed 0 trained for
20 iterations and measured the same way, which ``tests/test_ablation.py`` repeats, so that a
record the code no longer reproduces fails a test. CPU, one thread, fixed seeds: the same
numbers on every run on the same machine. Never edit the JSON by hand: run this again.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from course_attn.data.tasks import CopyTask, RecallTask
from course_attn.lab.ablation import ablated_model, part_means, position_losses
from course_attn.models.gpt import GPTConfig
from course_attn.train import TrainConfig, train

OUT = Path(__file__).resolve().parents[1] / "src" / "course_attn" / "lab" / "ablation_runs.json"

#: The seeds of every row; seed 0 is the chapter's run.
SEEDS = (0, 1, 2)
#: The chapter's two tasks, their models and training settings (sections 11.2 and 11.4).
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
#: The rows of the chapter's table, trained as long as the notebook trains them.
SHORT_ITERS = 200
CHANGES = ("full model", "no positions", "no causal mask", "one layer")
#: Section 11.4's recall runs: name -> changes to the recall model, for VARIANT_ITERS.
VARIANT_ITERS = 500
VARIANTS: dict[str, dict[str, Any]] = {
    "init_std 0.1": {}, "init_std 0.02": {"init_std": 0.02},
    "rope, 1 key/value head": {"pos_encoding": "rope", "n_kv_heads": 1}}
#: Iterations of the probe that the tests repeat.
PROBE_ITERS = 20


def model_config(name: str, change: str, **overrides: Any) -> GPTConfig:
    """The chapter's model of task ``name`` as trained with ``change`` made."""
    config = dataclasses.replace(MODELS[name], **overrides)
    return dataclasses.replace(config, n_layers=1) if change == "one layer" else config


def train_config(name: str, iterations: int, seed: int = 0) -> TrainConfig:
    """The chapter's settings for task ``name``, ``iterations`` long (one evaluation)."""
    return TrainConfig(max_iters=iterations, eval_interval=iterations, device="cpu",
                       progress=False, seed=1337 + seed, **SETTINGS[name])


def measure(name: str, change: str, iterations: int, seed: int,
            **overrides: Any) -> dict[str, float]:
    """Train one row with ``seed`` for ``iterations``; its losses, as the notebook measures."""
    task = TASKS[name]
    model = ablated_model(dataclasses.replace(MODELS[name], **overrides), change, seed=seed)
    start = time.perf_counter()
    train(model, task, train_config(name, iterations, seed))
    losses = part_means(position_losses(model, task), task)
    print(f"{name}, {change} {overrides or ''}, {iterations} iterations, seed {seed}: "
          f"{ {k: round(v, 4) for k, v in losses.items()} } "
          f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    return losses


def entry(name: str, change: str, iterations: int, **overrides: Any) -> dict[str, Any]:
    """One row over every seed: its settings (seed 0's), seed 0's losses and every seed's."""
    by_seed = [measure(name, change, iterations, seed, **overrides) for seed in SEEDS]
    return {"task": dataclasses.asdict(TASKS[name]), "change": change,
            "model": dataclasses.asdict(model_config(name, change, **overrides)),
            "train": dataclasses.asdict(train_config(name, iterations)),
            "seeds": list(SEEDS), "losses": by_seed[0], "seed_losses": by_seed}


def main() -> None:
    torch.set_num_threads(1)
    probes = {f"{name}, {change}": measure(name, change, PROBE_ITERS, 0)
              for name, change, _ in RUNS}
    short = {f"{name}, {change}": entry(name, change, SHORT_ITERS)
             for name in TASKS for change in CHANGES}
    variants = {key: entry("recall", "full model", VARIANT_ITERS, **overrides)
                for key, overrides in VARIANTS.items()}
    runs = {}
    for name, change, iterations in RUNS:
        key = f"{name}, {change}"
        runs[key] = {**entry(name, change, iterations),
                     "probe": {"max_iters": PROBE_ITERS, "losses": probes[key]}}
    about = ("Chapter 11's ablation runs over seeds. Written by tools/ablation_long_runs.py; "
             "do not edit, run the script again. 'runs': the rows of the chapter's ablation "
             "table trained for longer than the notebook can afford; 'short_runs': every row "
             "at the chapter's 200 iterations; 'variant_runs': section 11.4's recall runs of "
             "500 iterations. Each entry: the task, the change, the model and training "
             "settings it ran with (seed 0's), and its mean loss (nats) overall and over each "
             "part of the task (course_attn.lab.ablation.part_means), measured on the "
             "notebook's 512 fresh sequences, for seed 0 ('losses', the chapter's run) and for "
             "every seed ('seed_losses'). Seed s: torch.manual_seed(s) before the model is "
             "built, TrainConfig.seed = 1337 + s. Produced with torch "
             f"{torch.__version__.split('+')[0]}, on a CPU, one thread.")
    record = {"about": about, "seeds": list(SEEDS), "runs": runs, "short_runs": short,
              "variant_runs": variants}
    OUT.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
