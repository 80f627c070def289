"""nanoGPT's training loop, as its train.py writes it, around course_attn.lab.nanogpt.

For the comparisons of benchmarks/cpu_recipe.py (nanoGPT's CPU recipe) and
benchmarks/gpu_check.sh (its baby GPT on a GPU, where no checkout of nanoGPT is given):
batches cut from a ``np.memmap`` of ``train.bin``, re-opened for every batch (train.py does,
against a memory leak), pinned and copied without blocking on a GPU; AdamW from
``configure_optimizers`` (fused on CUDA); bfloat16 autocast on a GPU that has it; warm-up and
cosine decay of the learning rate; the next batch fetched while the GPU works; clipping at 1;
``zero_grad(set_to_none=True)``; the loss read back every ``log_interval`` iterations; both
splits' losses estimated every ``eval_interval`` iterations (when given). The time per
iteration is the wall time of the iterations after the first ``warmup`` ones, synchronised
at both ends, evaluations and pauses left out, over their number (as the course's trainer
reports its own).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from course_attn.lab.nanogpt import NanoGPT, NanoGPTConfig

#: nanoGPT's config/train_shakespeare_char.py (the baby GPT) and its CPU recipe's overrides.
BABY_GPT = dict(block_size=256, batch_size=64, n_layer=6, n_head=6, n_embd=384, dropout=0.2,
                bias=False, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, beta2=0.99,
                weight_decay=0.1, grad_clip=1.0, eval_iters=200, log_interval=10)
CPU_RECIPE = dict(BABY_GPT, block_size=64, batch_size=12, n_layer=4, n_head=4, n_embd=128,
                  dropout=0.0, eval_iters=20, log_interval=1)


def prepare(text: str, folder: Path) -> int:
    """nanoGPT's data/shakespeare_char/prepare.py, offline: sorted characters, 90 / 10,
    uint16 files ``train.bin`` and ``val.bin``; returns the vocabulary size."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], dtype=np.uint16)
    split = int(0.9 * len(ids))
    ids[:split].tofile(folder / "train.bin")
    ids[split:].tofile(folder / "val.bin")
    return len(chars)


def run(folder: Path, vocab: int, r: dict, iters: int, *, seed: int = 1337,
        device: str = "cpu", lr_decay_iters: int | None = None, warmup: int = 10,
        eval_interval: int | None = None, on_pause: Callable[[], None] | None = None,
        trained: list[torch.nn.Module] | None = None) -> tuple[float, float]:
    """Train ``iters`` iterations; ``(ms per iteration, final validation loss)``.

    ``eval_interval``: estimate both splits' losses (``r["eval_iters"]`` batches each) at
    every iteration ``it`` with ``it % eval_interval == 0``, as train.py does, and from the
    second on call ``on_pause`` (``benchmarks/cpu_recipe.py`` hands the machine to the
    other trainer there, which has just trained as many iterations); neither is timed.
    ``trained``: the model is appended to it at the end.
    """
    torch.manual_seed(seed)
    cuda = device.startswith("cuda")
    decay_iters = lr_decay_iters or iters

    def get_batch(split: str):
        data = np.memmap(folder / f"{split}.bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - r["block_size"], (r["batch_size"],))
        x = torch.stack([torch.from_numpy(data[i:i + r["block_size"]].astype(np.int64))
                         for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + r["block_size"]].astype(np.int64))
                         for i in ix])
        if cuda:
            return x.pin_memory().to(device, non_blocking=True), \
                y.pin_memory().to(device, non_blocking=True)
        return x, y

    model = NanoGPT(NanoGPTConfig(
        block_size=r["block_size"], vocab_size=vocab, n_layer=r["n_layer"], n_head=r["n_head"],
        n_embd=r["n_embd"], dropout=r["dropout"], bias=r["bias"])).to(device)
    optimizer = model.configure_optimizers(r["weight_decay"], r["learning_rate"],
                                           (0.9, r["beta2"]), "cuda" if cuda else "cpu")
    bf16 = cuda and torch.cuda.is_bf16_supported()
    ctx = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16)

    def get_lr(it: int) -> float:
        if it < r["warmup_iters"]:
            return r["learning_rate"] * (it + 1) / (r["warmup_iters"] + 1)
        if it > decay_iters:
            return r["min_lr"]
        ratio = (it - r["warmup_iters"]) / (decay_iters - r["warmup_iters"])
        return r["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (
            r["learning_rate"] - r["min_lr"])

    @torch.no_grad()
    def estimate_loss() -> None:  # train.py's, for its cost and its draws from the generator
        model.eval()
        for split in ("train", "val"):
            for _ in range(r["eval_iters"]):
                with ctx:
                    model(*get_batch(split))[1].item()
        model.train()

    X, Y = get_batch("train")
    start, untimed = 0.0, 0.0
    for it in range(iters):
        if it == warmup:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        if eval_interval and it % eval_interval == 0:
            began = time.perf_counter()
            estimate_loss()
            if on_pause is not None and it > 0:
                on_pause()
            if it >= warmup:
                untimed += time.perf_counter() - began
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        with ctx:
            _, loss = model(X, Y)
        X, Y = get_batch("train")  # fetched while the GPU computes
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % r["log_interval"] == 0:
            loss.item()  # the log line's read-back
    if cuda:
        torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - start - untimed) / (iters - warmup)
    model.eval()
    with torch.no_grad(), ctx:
        val = sum(model(*get_batch("val"))[1].item() for _ in range(r["eval_iters"]))
    if trained is not None:
        trained.append(model)
    return ms, val / r["eval_iters"]
