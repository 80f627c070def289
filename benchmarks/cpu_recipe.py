"""nanoGPT's CPU recipe, run by the course's trainer and by nanoGPT's loop (issue 42, chapter 11).

nanoGPT's README trains Shakespeare-char on a CPU with ``config/train_shakespeare_char.py``
and ``--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0``. This script runs that recipe with ``course_attn.train.train`` and the ``cpu``
preset (the same sizes and schedule), and with nanoGPT's training loop as its ``train.py``
writes it (``benchmarks/nanogpt_train.py``, around ``course_attn.lab.nanogpt``), on the same
text. For each: milliseconds per training iteration (the mean over the iterations after a
few, evaluations left out, as the course's trainer reports it), the final validation loss
as the trainer estimates it (20 random batches of its own), and the loss over every
character of the validation split in consecutive windows, the same text for both.

The two runs of a round live in two processes that take turns, one training while the
other waits, handing over at the evaluations every ``eval_interval`` = 250 iterations
(where both the preset and nanoGPT's recipe evaluate; the course's trainer evaluates after
its 250th iteration, nanoGPT's loop before its 251st, and hands over from the second
evaluation on, so that each turn trains 250 iterations of each): a slow minute of a shared
machine then falls on both, where run-after-run timing measured the same code 20 % apart.
``--eval-interval 50`` makes the turns shorter, with an evaluation at each (untimed), which
shares a machine whose speed moves from minute to minute more evenly.

    python benchmarks/cpu_recipe.py [--data input.txt] [--iters 2000] [--rounds 2]
                                    [--record course_attn/lab/cpu_recipe_runs.json]

``--record`` also writes the runs as JSON (chapter 11 quotes ``cpu_recipe_runs.json``, beside
``course_attn.lab.step_cost``, whose ``"about"`` says what each field is).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import multiprocessing as mp
import platform
import statistics
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch

from course_attn.data.text import CharCorpus, default_corpus
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import PRESETS, TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nanogpt_train  # noqa: E402

KINDS = ("course", "nanoGPT")


def every_window_loss(model: torch.nn.Module, ids: torch.Tensor, block: int) -> float:
    """The mean loss over every character of ``ids`` (1-D), in consecutive windows of
    ``block`` characters, each predicting its next: the same text for both models."""
    n = (len(ids) - 1) // block
    x, y = ids[:n * block].view(n, block), ids[1:n * block + 1].view(n, block)  # (n, T)
    model.eval()
    with torch.no_grad():
        total = sum(model(x[i:i + 64], y[i:i + 64])[1].item() * len(x[i:i + 64])
                    for i in range(0, n, 64))
    return total / n


def val_ids(text: str) -> torch.Tensor:
    """The validation split's ids, as both trainers cut them (90 % / 10 %, sorted chars)."""
    corpus = CharCorpus.from_text(text)
    return corpus.val_data


def course_run(text: str, iters: int, seed: int, eval_interval: int, pause
               ) -> tuple[float, float, float]:
    """The course's trainer, cpu preset: (its ms per iteration, final val loss estimate,
    loss over the whole validation split)."""
    corpus = CharCorpus.from_text(text)  # 90 % train, 10 % validation, as prepare.py
    p = PRESETS["cpu"]
    torch.manual_seed(seed)
    model = MiniGPT(GPTConfig(vocab_size=corpus.vocab_size, context_length=p["context_length"],
                              n_layers=p["n_layers"], n_heads=p["n_heads"],
                              d_model=p["d_model"], dropout=p["dropout"], bias=p["bias"],
                              impl="sdpa"))
    config = TrainConfig(max_iters=iters, batch_size=p["batch_size"], lr=p["lr"],
                         warmup_iters=p["warmup_iters"], eval_interval=eval_interval,
                         eval_iters=p["eval_iters"], device="cpu", progress=False, seed=seed)
    result = train(model, corpus, config, on_eval=lambda *_: pause())
    whole = every_window_loss(model, corpus.val_data, p["context_length"])
    return result.ms_per_iter, result.final_val_loss, whole


def worker(kind: str, text: str, folder: str, vocab: int, iters: int, seed: int,
           eval_interval: int, conn: Connection) -> None:
    """One trainer in its own process; it waits for "go" before its first iteration and
    after each evaluation, and says "paused" or, at the end, its result."""
    def pause() -> None:
        conn.send("paused")
        conn.recv()  # "go"

    conn.recv()
    if kind == "course":
        result = course_run(text, iters, seed, eval_interval, pause)
    else:
        recipe, trained = nanogpt_train.CPU_RECIPE, []
        ms, val = nanogpt_train.run(Path(folder), vocab, recipe, iters, seed=seed,
                                    warmup=min(10, iters // 2), eval_interval=eval_interval,
                                    on_pause=pause, trained=trained)
        ids = torch.from_numpy(np.fromfile(Path(folder) / "val.bin", dtype=np.uint16)
                               .astype(np.int64))
        if not torch.equal(ids, val_ids(text)):  # the same text, the same character ids
            raise RuntimeError("nanoGPT's val.bin differs from the course's validation split")
        result = (ms, val, every_window_loss(trained[0], ids, recipe["block_size"]))
    conn.send(result)


def one_round(text: str, folder: Path, vocab: int, iters: int, seed: int,
              eval_interval: int) -> dict[str, tuple[float, float, float]]:
    """Both trainers, taking turns (the course first in even rounds):
    kind -> (ms per iteration, val estimate, loss over the whole validation split)."""
    order = KINDS if seed % 2 == 0 else KINDS[::-1]
    context = mp.get_context("spawn")  # a fresh interpreter each, as a run from the shell
    pipes, processes = {}, []
    for kind in order:
        ours, theirs = context.Pipe()
        process = context.Process(target=worker, args=(kind, text, str(folder), vocab, iters,
                                                       seed, eval_interval, theirs))
        process.start()
        pipes[kind] = ours
        processes.append(process)
    results: dict[str, tuple[float, float, float]] = {}
    try:
        while len(results) < len(order):
            for kind in order:
                if kind in results:
                    continue
                pipes[kind].send("go")
                message = pipes[kind].recv()  # "paused", or the run's result
                if message != "paused":
                    results[kind] = message
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None,
                        help="a text file (Tiny Shakespeare; default: the offline corpus)")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eval-interval", type=int, default=PRESETS["cpu"]["eval_interval"],
                        help="iterations between evaluations, where the two runs take turns "
                             "(default: the recipe's)")
    parser.add_argument("--record", type=Path, default=None,
                        help="also write the runs to this JSON file")
    args = parser.parse_args(argv)
    text = default_corpus() if args.data is None else args.data.read_text(encoding="utf-8")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.iters} "
          f"iterations per run, {args.rounds} rounds, the two runs of a round taking turns "
          f"every {args.eval_interval} iterations")
    ms: dict[str, list[float]] = {kind: [] for kind in KINDS}
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        vocab = nanogpt_train.prepare(text, Path(tmp))
        for seed in range(args.rounds):
            results = one_round(text, Path(tmp), vocab, args.iters, seed, args.eval_interval)
            for kind in KINDS:
                ms[kind].append(results[kind][0])
            rounds.append({"seed": seed, "first": KINDS[seed % 2], **{
                kind: {"ms_per_iter": round(results[kind][0], 3),
                       "val_loss": round(results[kind][1], 4),
                       "val_loss_every_window": round(results[kind][2], 4)}
                for kind in KINDS}})
            (course_ms, course_val, course_all), (nano_ms, nano_val, nano_all) = (
                results[k] for k in KINDS)
            print(f"round {seed}: course {course_ms:.2f} ms/iter, val {course_val:.4f} "
                  f"(whole split {course_all:.4f}); nanoGPT {nano_ms:.2f} ms/iter, val "
                  f"{nano_val:.4f} (whole split {nano_all:.4f}); ratio "
                  f"{course_ms / nano_ms:.3f}")
    course, nano = statistics.median(ms["course"]), statistics.median(ms["nanoGPT"])
    print(f"median: course {course:.2f}, nanoGPT {nano:.2f} ms/iter; course / nanoGPT "
          f"{course / nano:.2f} (goal <= 0.95)")
    if args.record is not None:
        write_record(args, text, rounds, {"course": course, "nanoGPT": nano})
    return 0


def write_record(args: argparse.Namespace, text: str, rounds: list[dict],
                 median: dict[str, float]) -> None:
    """The runs, the machine and the code they ran on, as JSON (see the file's "about")."""
    here = Path(__file__).resolve().parent

    def git(*words: str) -> str:
        return subprocess.run(["git", *words], cwd=here, capture_output=True, text=True,
                              check=False).stdout.strip()

    record = {
        "about": "nanoGPT's CPU recipe (Shakespeare-char, 4 layers, 4 heads, width 128, "
                 "context 64, batch 12, no dropout, no biases) trained by the course's "
                 "trainer (cpu preset) and by nanoGPT's train.py loop "
                 "(benchmarks/nanogpt_train.py), written by benchmarks/cpu_recipe.py "
                 "--record. Each round runs both in two processes taking turns every "
                 "eval_interval iterations, 'first' starting; ms_per_iter is each "
                 "trainer's own mean over its timed iterations (evaluations left out), "
                 "val_loss its final validation loss (its own estimate over eval_iters "
                 "random batches), val_loss_every_window the final model's mean loss over "
                 "every character of the validation split in consecutive windows of the "
                 "context length (the same text for both); median_ms_per_iter the median "
                 "over the rounds and ratio "
                 "course / nanoGPT of those medians. commit is the code's commit "
                 "('+changes' when the tree differed from it).",
        "date": datetime.date.today().isoformat(),
        "commit": git("rev-parse", "--short", "HEAD") + ("+changes" if git(
            "status", "--porcelain", "--untracked-files=no") else ""),
        "torch": torch.__version__,
        "cpu_model": cpu_model(),
        "threads": torch.get_num_threads(),
        "data": args.data.name if args.data is not None else "default_corpus()",
        "data_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "iters": args.iters,
        "eval_interval": args.eval_interval,
        "rounds": rounds,
        "median_ms_per_iter": {kind: round(value, 3) for kind, value in median.items()},
        "ratio": round(median["course"] / median["nanoGPT"], 4),
    }
    args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"record written to {args.record}")


def cpu_model() -> str:
    """The CPU's model name, as Linux's /proc/cpuinfo gives it (else the platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
