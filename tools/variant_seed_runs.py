#!/usr/bin/env python3
"""Train chapter 10's variant comparisons with three seeds, and cache what they reach.

    PYTHONPATH=src python tools/variant_seed_runs.py     # about 10 minutes on one CPU core

Chapter 10 trains each variant once (seed 0) inside the notebook's time budget and
compares them: 4, 2 and 1 key/value heads, a window of 2, linear against softmax
attention, and four position encodings tested at twice the training length. One seed
cannot say how far apart two variants are. This script trains every one of those runs
with seeds 0, 1 and 2 (seed ``s``: initial weights from ``torch.manual_seed(s)``, batches
from ``TrainConfig(seed=1337 + s)``; seed 0 is the notebook's own run), with the chapter's
models and settings, measures them exactly as the notebook does, and writes the results to
``src/course_attn/lab/variant_runs.json``, which the notebook reads
(``course_attn.lab.variant_runs.VARIANT_RUNS``). CPU, one thread, fixed seeds: the same
numbers on every run on the same machine.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from course_attn.data.tasks import RecallTask
from course_attn.lab.analysis import attention_maps
from course_attn.lab.variant_runs import (
    previous_token_head,
    recall_gap_by_kind,
    recall_lookup_distances,
    recall_oracle_losses,
)
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.modern.linear_attention import linear_attention
from course_attn.train import TrainConfig, train

OUT = Path(__file__).resolve().parents[1] / "src" / "course_attn" / "lab" / "variant_runs.json"

SEEDS = (0, 1, 2)
#: The chapter's task (section 10.3) and the same task at twice the length (section 10.7).
RECALL = RecallTask(n_keys=4, n_values=8, n_pairs=8, max_step=2)
LONG_RECALL = RecallTask(n_keys=4, n_values=8, n_pairs=16, max_step=2)
#: The chapter's model: 2 layers of 4 heads, width 64, context 32, init_std 0.1.
MODEL = dict(vocab_size=RECALL.vocab_size, context_length=32, n_layers=2, n_heads=4,
             d_model=64, init_std=0.1)
#: The chapter's training run (section 10.3); the window's run is 150 iterations long.
RUN = dict(max_iters=400, batch_size=64, lr=3e-3, warmup_iters=30, weight_decay=0.0,
           eval_interval=50, eval_iters=2, progress=False)
#: name: (variant switched on in GPTConfig, linear attention?, iterations)
VARIANTS = {
    "MHA": (dict(pos_encoding="rope", n_kv_heads=4), False, 400),
    "GQA": (dict(pos_encoding="rope", n_kv_heads=2), False, 400),
    "MQA": (dict(pos_encoding="rope", n_kv_heads=1), False, 400),
    "window 2": (dict(pos_encoding="rope", window=2), False, 150),
    "learned": (dict(pos_encoding="learned"), False, 400),
    "linear": (dict(pos_encoding="learned"), True, 400),
    "sinusoidal": (dict(pos_encoding="sinusoidal"), False, 400),
    "ALiBi": (dict(pos_encoding="alibi"), False, 400),
}
#: Tested at twice the training length (section 10.7).
LENGTH_TESTED = ("learned", "sinusoidal", "MHA", "ALiBi")
#: The chapter's measurement batches: 256 sequences (generator seed 5) for the loss, and
#: 2,000 (seed 6) for the loss per look-up distance.
VAL_SEED, VAL_N, LOOKUP_SEED, LOOKUP_N = 5, 256, 6, 2000


class AtItsLength:
    """Batches of a task at the task's own length T, whatever the context_length."""

    def __init__(self, task: RecallTask) -> None:
        self.task = task

    def get_batch(self, split, batch_size, context_length=None, **kwargs):
        return self.task.get_batch(split, batch_size, **kwargs)  # (B, T), (B, T)


def linear_path(q, k, v, mask, *, is_causal, dropout_p, bias):
    """The chapter's attention path for MiniGPT's blocks: linear attention (section 10.6)."""
    assert dropout_p == 0.0 and bias is None
    return linear_attention(q, k, v, mask, is_causal=is_causal)


def model_for(name: str, seed: int) -> MiniGPT:
    """Variant ``name`` with the initial weights of ``seed`` (seed 0: the notebook's)."""
    variant, linear, _ = VARIANTS[name]
    torch.manual_seed(seed)
    return MiniGPT(GPTConfig(**MODEL, **variant), attention_fn=linear_path if linear else None)


def train_config(name: str, seed: int) -> TrainConfig:
    return TrainConfig(**dict(RUN, max_iters=VARIANTS[name][2]), seed=1337 + seed)


@torch.no_grad()
def losses(model: MiniGPT, task: RecallTask, n: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Per-position losses (B, T) of the model and of the oracle, and the look-up distances."""
    x, y = task.get_batch("val", n, generator=torch.Generator().manual_seed(seed))
    logits, _ = model.eval()(x)  # (B, T, N_vocab)
    loss = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (B, T)
    return loss.double(), recall_oracle_losses(task, x), recall_lookup_distances(x)


def measure(name: str, model: MiniGPT) -> dict[str, Any]:
    """What the chapter reads off a trained variant (nats)."""
    loss, oracle, _ = losses(model, RECALL, VAL_N, VAL_SEED)
    out: dict[str, Any] = {"loss": loss.mean().item(),
                           "above_oracle": (loss - oracle).mean().item(),
                           "above_floor": loss.mean().item() - RECALL.loss_floor()}
    if name in LENGTH_TESTED:
        seen = int(recall_lookup_distances(
            RECALL.get_batch("val", LOOKUP_N,
                             generator=torch.Generator().manual_seed(LOOKUP_SEED))[0]).max())
        loss, oracle, _ = losses(model, LONG_RECALL, VAL_N, VAL_SEED)
        out["above_oracle_2T"] = (loss - oracle).mean().item()
        x, _ = LONG_RECALL.get_batch("val", VAL_N,
                                     generator=torch.Generator().manual_seed(VAL_SEED))
        out["above_oracle_2T_by_kind"] = recall_gap_by_kind(loss - oracle, x, seen)
        windowed = MiniGPT(dataclasses.replace(model.config, window=RECALL.context_length))
        windowed.load_state_dict(model.state_dict())  # the same weights, keys <= 14 back
        loss, oracle, _ = losses(windowed, LONG_RECALL, VAL_N, VAL_SEED)
        out["above_oracle_2T_by_kind_window"] = recall_gap_by_kind(loss - oracle, x, seen)
        with torch.no_grad():
            maps = attention_maps(model, x)  # (L, B, H, 2T + 1, 2T + 1)
        out["previous_token_head_2T"] = previous_token_head(maps, RECALL.context_length)
        loss, _, dist = losses(model, LONG_RECALL, LOOKUP_N, LOOKUP_SEED)
        out["lookup_loss_seen_2T"] = loss[(dist >= 0) & (dist <= seen)].mean().item()
        out["lookup_loss_unseen_2T"] = loss[dist > seen].mean().item()
    return out


def run(name: str, seed: int) -> dict[str, Any]:
    model = model_for(name, seed)
    start = time.perf_counter()
    train(model, AtItsLength(RECALL), train_config(name, seed))
    measured = measure(name, model)
    print(f"{name}, seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in measured.items()
                                               if isinstance(v, float))
          + f" ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return measured


def entry(name: str) -> dict:
    config = model_for(name, 0).config
    return {"task": dataclasses.asdict(RECALL), "model": dataclasses.asdict(config),
            "linear_attention": VARIANTS[name][1],
            "train": dataclasses.asdict(train_config(name, 0)),
            "seeds": {str(seed): run(name, seed) for seed in SEEDS}}


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    runs = {name: entry(name) for name in (names or VARIANTS)}
    if names:  # a trial of a few variants: printed, not written
        return
    about = ("Chapter 10's variant comparisons with three seeds, cached. Written by "
             "tools/variant_seed_runs.py; do not edit, run the script again. Each entry is "
             "one variant of the chapter: the task, the model and training settings it ran "
             "with (train.seed is seed 0's; seed s trains with initial weights from "
             "torch.manual_seed(s) and TrainConfig.seed 1337 + s), and per seed: its mean "
             "loss (nats) on the notebook's 256 validation sequences (generator seed 5), that "
             "loss above the oracle's on the same sequences (above_oracle) and above the "
             "task's expected floor (above_floor); for the position encodings, the loss above "
             "the oracle at twice the length (above_oracle_2T) and the mean loss at the "
             "look-ups of 2,000 sequences of twice the length (generator seed 6) whose "
             "distance back was seen in training (lookup_loss_seen_2T) or not "
             "(lookup_loss_unseen_2T); above_oracle_2T split by kind of position "
             "(above_oracle_2T_by_kind, the parts add up to it: next_key at the value "
             "positions, new_value at a key seen for the first time, seen_lookup and "
             "unseen_lookup at a repeated key whose value sits at most or more than 13 "
             "back), and the same split for the same weights run with a sliding window of "
             "15, keys at most 14 back (above_oracle_2T_by_kind_window); and, on the same "
             "256 sequences, the head that reads the previous token most at the value "
             "positions below 15 (previous_token_head_2T: its layer and head, its weight 1 "
             "back below 15 and from 15 on, and the weight it puts from 15 on on keys more "
             "than 14 back, distances no training sequence holds). Produced with torch "
             f"{torch.__version__.split('+')[0]}, on a CPU, one thread.")
    OUT.write_text(json.dumps({"about": about, "seeds": list(SEEDS), "runs": runs},
                              indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
