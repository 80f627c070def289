"""nanoGPT's CPU recipe, run by the course's trainer and by nanoGPT's loop (issue 42, chapter 11).

nanoGPT's README trains Shakespeare-char on a CPU with ``config/train_shakespeare_char.py``
and ``--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0``. This script runs that recipe twice on the same text, in the same process,
interleaved: with ``course_attn.train.train`` and the ``cpu`` preset (the same sizes and
schedule), and with nanoGPT's training loop as its ``train.py`` writes it
(``benchmarks/nanogpt_train.py``, around ``course_attn.lab.nanogpt``). For each:
milliseconds per training iteration (the mean over the iterations after a few, evaluations
left out, as the course's trainer reports it) and the final validation loss.

    python benchmarks/cpu_recipe.py [--data input.txt] [--iters 2000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from course_attn.data.text import CharCorpus, default_corpus
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import PRESETS, TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nanogpt_train  # noqa: E402


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
    parser.add_argument("--data", type=Path, default=None,
                        help="a text file (Tiny Shakespeare; default: the offline corpus)")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    text = default_corpus() if args.data is None else args.data.read_text(encoding="utf-8")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.iters} "
          f"iterations per run, {args.rounds} interleaved rounds")
    ms: dict[str, list[float]] = {"course": [], "nanoGPT": []}
    with tempfile.TemporaryDirectory() as tmp:
        vocab = nanogpt_train.prepare(text, Path(tmp))
        for seed in range(args.rounds):
            course_ms, course_val = course_run(text, args.iters, seed)
            nano_ms, nano_val = nanogpt_train.run(Path(tmp), vocab, nanogpt_train.CPU_RECIPE,
                                                  args.iters, seed=seed)
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
