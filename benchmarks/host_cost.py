"""What one training step costs the host: MiniGPT against nanoGPT (issue 42, chapter 11).

On a GPU every PyTorch operator a step dispatches is one kernel launch, and the Python and
dispatcher work to issue it is time the GPU waits for when the model is small. Both can be
measured without a GPU:

* **aten operators per step**: one step (forward with the loss, backward, AdamW with
  ``foreach=True``, ``zero_grad(set_to_none=True)``) at the gpu preset's sizes (6 layers,
  6 heads, width 384, context 256, batch 64, dropout 0.2) on the ``meta`` device, where
  nothing is computed, counted by a ``TorchDispatchMode``. The count depends only on the
  code: the same on every machine.
* **host milliseconds per step** at tiny sizes (width 48, context 8, batch 1, one thread),
  where the arithmetic is negligible and what is left is the host's work: the median of
  ``--steps`` steps, in two rounds interleaved course, nanoGPT, course, nanoGPT, each
  figure the median of its two rounds' medians.

Both models have the same layers, heads, dropout and bias setting (``--bias both`` runs
with and without biases). nanoGPT is ``course_attn.lab.nanogpt`` (its model.py written
out) or, with ``--nanogpt-dir``, the ``model.py`` of a checkout. Prints a table and the
ratios; asserts nothing (speed goals are measured, not tested).

    python benchmarks/host_cost.py [--impl sdpa] [--bias both|true|false] [--steps 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from course_attn import ATTENTION_IMPLS, GPTConfig, MiniGPT
from course_attn.lab.measure import operator_counts
from course_attn.lab.nanogpt import NanoGPT, NanoGPTConfig

GPU = dict(n_layers=6, n_heads=6, d_model=384, context_length=256, batch=64, dropout=0.2)
TINY = dict(GPU, d_model=48, context_length=8, batch=1)
VOCAB = 65


def load_nanogpt(folder: Path | None) -> tuple[type, type]:
    """nanoGPT's model class and config: the package's (course_attn.lab.nanogpt) or, with a
    folder, the ``GPT`` and ``GPTConfig`` of that checkout's ``model.py``."""
    if folder is None:
        return NanoGPT, NanoGPTConfig
    spec = importlib.util.spec_from_file_location("nanogpt_checkout", folder / "model.py")
    assert spec is not None and spec.loader is not None, folder
    module = importlib.util.module_from_spec(spec)
    sys.modules["nanogpt_checkout"] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module.GPT, module.GPTConfig


def build(kind: str, sizes: dict, bias: bool, impl: str, nanogpt, device: str):
    """The model and its AdamW (weight decay on matrices only, foreach), on ``device``."""
    with torch.device(device):
        if kind == "course":
            model = MiniGPT(GPTConfig(vocab_size=VOCAB, context_length=sizes["context_length"],
                                      n_layers=sizes["n_layers"], n_heads=sizes["n_heads"],
                                      d_model=sizes["d_model"], dropout=sizes["dropout"],
                                      bias=bias, impl=impl))
        else:
            gpt, gpt_config = nanogpt
            model = gpt(gpt_config(
                block_size=sizes["context_length"], vocab_size=VOCAB,
                n_layer=sizes["n_layers"], n_head=sizes["n_heads"], n_embd=sizes["d_model"],
                dropout=sizes["dropout"], bias=bias))
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, foreach=True)
    model.train()
    return model, optimizer


def step(model, optimizer, x, y) -> None:
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def batch(sizes: dict, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(VOCAB, (sizes["batch"], sizes["context_length"] + 1), generator=gen)
    return data[:, :-1].to(device), data[:, 1:].to(device)  # (B, T) each


def count_ops(kind: str, bias: bool, impl: str, nanogpt) -> Counter[str]:
    """aten operators of one step at the gpu preset's sizes, after a first step (AdamW's state)."""
    model, optimizer = build(kind, GPU, bias, impl, nanogpt, "meta")
    x, y = batch(GPU, "meta")
    step(model, optimizer, x, y)  # the first step creates AdamW's state; count the next
    return operator_counts(lambda: step(model, optimizer, x, y))


def host_ms(kind: str, bias: bool, impl: str, nanogpt, steps: int) -> float:
    torch.manual_seed(0)
    model, optimizer = build(kind, TINY, bias, impl, nanogpt, "cpu")
    x, y = batch(TINY, "cpu")
    for _ in range(20):
        step(model, optimizer, x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(model, optimizer, x, y)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=ATTENTION_IMPLS, default="sdpa")
    parser.add_argument("--bias", choices=("both", "true", "false"), default="both")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--nanogpt-dir", type=Path, default=None,
                        help="a checkout of karpathy/nanoGPT (its model.py is used)")
    parser.add_argument("--top", type=int, default=0,
                        help="also list the N operators whose counts differ most")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    nanogpt = load_nanogpt(args.nanogpt_dir)
    print(f"torch {torch.__version__}, course impl={args.impl}, one thread; operators at "
          f"the gpu preset's sizes (meta device), host ms at width 48, context 8, batch 1")
    print(f"{'biases':8s}{'':>4s}{'ops course':>12s}{'ops nanoGPT':>13s}{'ratio':>7s}"
          f"{'ms course':>11s}{'ms nanoGPT':>12s}{'ratio':>7s}")
    for bias in {"both": (False, True), "true": (True,), "false": (False,)}[args.bias]:
        ops = {kind: count_ops(kind, bias, args.impl, nanogpt) for kind in ("course", "nano")}
        rounds: dict[str, list[float]] = {"course": [], "nano": []}
        for _ in range(2):  # interleaved: a busy moment of the machine hits both
            for kind in rounds:
                rounds[kind].append(host_ms(kind, bias, args.impl, nanogpt, args.steps))
        ms = {kind: statistics.median(values) for kind, values in rounds.items()}
        n = {kind: sum(counter.values()) for kind, counter in ops.items()}
        print(f"{str(bias).lower():8s}{'':>4s}{n['course']:>12,d}{n['nano']:>13,d}"
              f"{n['course'] / n['nano']:>7.2f}{ms['course']:>11.2f}{ms['nano']:>12.2f}"
              f"{ms['course'] / ms['nano']:>7.2f}")
        if args.top:
            diff = ops["course"].copy()
            diff.subtract(ops["nano"])
            worst = sorted(diff.items(), key=lambda item: -abs(item[1]))[:args.top]
            print("    course - nanoGPT:", ", ".join(f"{op} {d:+d}" for op, d in worst if d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
