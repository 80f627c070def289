"""nanoGPT's CPU recipe, run by the course's trainer and by nanoGPT's loop (issue 42, chapter 11).

nanoGPT's README trains Shakespeare-char on a CPU with ``config/train_shakespeare_char.py``
and ``--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0``. This script runs that recipe twice on the same text, in the same process,
interleaved: with ``course_attn.train.train`` and the ``cpu`` preset (the same sizes and
schedule), and with nanoGPT's training loop as its ``train.py`` writes it (batches cut from a
``np.memmap`` of ``train.bin``, re-opened at every batch; AdamW from ``configure_optimizers``;
warm-up and cosine decay; clipping at 1; ``zero_grad(set_to_none=True)``), around the model of
``benchmarks/nanogpt_model.py``. For each: milliseconds per training iteration (the mean
over iterations after the first, evaluations left out) and the final validation loss.

    python benchmarks/cpu_recipe.py --data ../shared/data/tinyshakespeare.txt [--iters 2000]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from course_attn.data.text import CharCorpus
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import PRESETS, TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nanogpt_model  # noqa: E402

RECIPE = dict(block_size=64, batch_size=12, n_layer=4, n_head=4, n_embd=128, dropout=0.0,
              bias=False, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, beta2=0.99,
              weight_decay=0.1, grad_clip=1.0, eval_interval=250, eval_iters=20)


def prepare(text: str, folder: Path) -> int:
    """nanoGPT's data/shakespeare_char/prepare.py: sorted characters, 90/10, uint16 files."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], dtype=np.uint16)
    split = int(0.9 * len(ids))
    ids[:split].tofile(folder / "train.bin")
    ids[split:].tofile(folder / "val.bin")
    return len(chars)


def nanogpt_run(folder: Path, vocab: int, iters: int, seed: int) -> tuple[list[float], float]:
    """nanoGPT's train.py loop on the CPU: (ms of each training iteration, final val loss)."""
    r = RECIPE
    torch.manual_seed(seed)

    def get_batch(split: str):  # re-opened every time, as train.py does (a memmap leak)
        data = np.memmap(folder / f"{split}.bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - r["block_size"], (r["batch_size"],))
        x = torch.stack([torch.from_numpy(data[i:i + r["block_size"]].astype(np.int64))
                         for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + r["block_size"]].astype(np.int64))
                         for i in ix])
        return x, y

    model = nanogpt_model.GPT(nanogpt_model.GPTConfig(
        block_size=r["block_size"], vocab_size=vocab, n_layer=r["n_layer"], n_head=r["n_head"],
        n_embd=r["n_embd"], dropout=r["dropout"], bias=r["bias"]))
    optimizer = model.configure_optimizers(r["weight_decay"], r["learning_rate"],
                                           (0.9, r["beta2"]), "cpu")

    def get_lr(it: int) -> float:
        if it < r["warmup_iters"]:
            return r["learning_rate"] * (it + 1) / (r["warmup_iters"] + 1)
        ratio = (it - r["warmup_iters"]) / (iters - r["warmup_iters"])
        return r["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (
            r["learning_rate"] - r["min_lr"])

    @torch.no_grad()
    def estimate_val() -> float:
        model.eval()
        losses = [model(*get_batch("val"))[1].item() for _ in range(r["eval_iters"])]
        model.train()
        return sum(losses) / len(losses)

    times, X, Y = [], *get_batch("train")
    for it in range(iters):
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        _, loss = model(X, Y)
        X, Y = get_batch("train")  # prefetch, as train.py does
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # log_interval=1: the loss is read back every iteration
        times.append(1e3 * (time.perf_counter() - t0))
    return times, estimate_val()


def course_run(text: str, iters: int, seed: int) -> tuple[float, float]:
    """The course's trainer, cpu preset: (its ms per iteration, final val loss)."""
    corpus = CharCorpus.from_text(text)  # 90 % train, 10 % validation, as prepare.py
    p = PRESETS["cpu"]
    torch.manual_seed(seed)
    model = MiniGPT(GPTConfig(vocab_size=corpus.vocab_size, context_length=p["context_length"],
                              n_layers=p["n_layers"], n_heads=p["n_heads"],
                              d_model=p["d_model"], dropout=p["dropout"], bias=p["bias"],
                              impl="sdpa"))
    config = TrainConfig(max_iters=iters, batch_size=p["batch_size"], lr=p["lr"],
                         warmup_iters=p["warmup_iters"], eval_interval=iters,
                         eval_iters=p["eval_iters"], device="cpu", progress=False, seed=seed)
    result = train(model, corpus, config)
    return result.ms_per_iter, result.final_val_loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a text file (Tiny Shakespeare)")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    text = args.data.read_text(encoding="utf-8")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.iters} "
          f"iterations per run, {args.rounds} interleaved rounds")
    ms: dict[str, list[float]] = {"course": [], "nanoGPT": []}
    with tempfile.TemporaryDirectory() as tmp:
        vocab = prepare(text, Path(tmp))
        for seed in range(args.rounds):
            course_ms, course_val = course_run(text, args.iters, seed)
            nano_times, nano_val = nanogpt_run(Path(tmp), vocab, args.iters, seed)
            nano_ms = statistics.fmean(nano_times[1:])  # as the trainer: the mean
            ms["course"].append(course_ms)
            ms["nanoGPT"].append(nano_ms)
            print(f"round {seed}: course {course_ms:.2f} ms/iter, val {course_val:.4f}; "
                  f"nanoGPT {nano_ms:.2f} ms/iter, val {nano_val:.4f}")
    course, nano = statistics.median(ms["course"]), statistics.median(ms["nanoGPT"])
    print(f"median: course {course:.2f}, nanoGPT {nano:.2f} ms/iter; course / nanoGPT "
          f"{course / nano:.2f} (goal <= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
