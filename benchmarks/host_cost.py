"""What one training step costs the host: MiniGPT against nanoGPT (issue 42, chapter 11).

Every PyTorch operator a step dispatches costs the host Python and dispatcher work; on a GPU
most of them launch a kernel (views launch none), and when the model is small the GPU waits
for the host to issue them. Both can be
measured without a GPU:

* **aten operators per step**: one step (forward with the loss, backward, AdamW with
  ``foreach=True``, ``zero_grad(set_to_none=True)``) at the gpu preset's sizes (6 layers,
  6 heads, width 384, context 256, batch 64, dropout 0.2) on the ``meta`` device, where
  nothing is computed, counted by a ``TorchDispatchMode``. The count depends only on the
  code: the same on every machine.
* **host milliseconds per step** at tiny sizes (width 48, context 8, batch 1, one thread),
  where the arithmetic is small and the same for both models: the median of
  ``--steps`` steps per model in each of ``--rounds`` rounds (2 by default), fresh models
  each round, built in the other order every other round, their steps taken in turn (course,
  nanoGPT, nanoGPT, course, ...). Each model's figure is the median of its rounds' medians;
  the ratio is the median of the rounds' ratios, printed with their smallest and largest.
* **the control**: nanoGPT's model timed the same way against a second copy of itself. Its
  ratio would be 1.00 on a perfect harness; how far it and its rounds land from 1.00 on this
  machine is what the ratios above cannot resolve (``--no-control`` skips it).

Both models have the same layers, heads, dropout and bias setting (``--bias both`` runs
with and without biases). nanoGPT is ``course_attn.lab.nanogpt`` (its model.py written
out) or, with ``--nanogpt-dir``, the ``model.py`` of a checkout. Prints a table and the
ratios; asserts nothing (speed goals are measured, not tested). The models, the step and
the timing are ``course_attn.lab.step_cost``'s, which chapter 11 runs too.

    python benchmarks/host_cost.py [--impl sdpa] [--bias both|true|false] [--steps 200]
                                   [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

from course_attn import ATTENTION_IMPLS
from course_attn.lab.step_cost import host_ms_rounds, step_operator_counts


def load_nanogpt(folder: Path | None) -> tuple[type, type] | None:
    """None (the package's ``course_attn.lab.nanogpt``) or, with a folder, the ``GPT`` and
    ``GPTConfig`` of that checkout's ``model.py``."""
    if folder is None:
        return None
    spec = importlib.util.spec_from_file_location("nanogpt_checkout", folder / "model.py")
    assert spec is not None and spec.loader is not None, folder
    module = importlib.util.module_from_spec(spec)
    sys.modules["nanogpt_checkout"] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module.GPT, module.GPTConfig


def _summary(rounds: dict[str, list[float]], a: str, b: str) -> str:
    """``a``'s and ``b``'s median ms, the median of the rounds' ratios a / b, and their range."""
    ratios = [x / y for x, y in zip(rounds[a], rounds[b], strict=True)]
    return (f"{statistics.median(rounds[a]):>11.2f}{statistics.median(rounds[b]):>12.2f}"
            f"{statistics.median(ratios):>7.2f}  {min(ratios):.2f} to {max(ratios):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=ATTENTION_IMPLS, default="sdpa")
    parser.add_argument("--bias", choices=("both", "true", "false"), default="both")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of fresh models (an even number builds each first as often)")
    parser.add_argument("--nanogpt-dir", type=Path, default=None,
                        help="a checkout of karpathy/nanoGPT (its model.py is used)")
    parser.add_argument("--top", type=int, default=0,
                        help="also list the N operators whose counts differ most")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip timing nanoGPT against a copy of itself")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    nanogpt = load_nanogpt(args.nanogpt_dir)
    print(f"torch {torch.__version__}, course impl={args.impl}, one thread; operators at "
          f"the gpu preset's sizes (meta device), host ms at width 48, context 8, batch 1")
    print(f"{'biases':8s}{'':>4s}{'ops course':>12s}{'ops nanoGPT':>13s}{'ratio':>7s}"
          f"{'ms course':>11s}{'ms nanoGPT':>12s}{'ratio':>7s}  rounds' ratios")
    timing = dict(steps=args.steps, rounds=args.rounds, warmup=20, nanogpt=nanogpt)
    for bias in {"both": (False, True), "true": (True,), "false": (False,)}[args.bias]:
        ops = {kind: step_operator_counts(kind, bias=bias, impl=args.impl, nanogpt=nanogpt)
               for kind in ("course", "nanoGPT")}
        ms = host_ms_rounds(bias=bias, impl=args.impl, **timing)  # interleaved
        n = {kind: sum(counter.values()) for kind, counter in ops.items()}
        print(f"{str(bias).lower():8s}{'':>4s}{n['course']:>12,d}{n['nanoGPT']:>13,d}"
              f"{n['course'] / n['nanoGPT']:>7.2f}{_summary(ms, 'course', 'nanoGPT')}")
        if args.top:
            diff = ops["course"].copy()
            diff.subtract(ops["nanoGPT"])
            worst = sorted(diff.items(), key=lambda item: -abs(item[1]))[:args.top]
            print("    course - nanoGPT:", ", ".join(f"{op} {d:+d}" for op, d in worst if d))
    if args.control:  # the same model twice: the harness's own error, in the same units
        same = host_ms_rounds(("nanoGPT", "nanoGPT"), bias=False, **timing)
        print(f"control: nanoGPT against a copy of itself (no biases, 1.00 on a perfect "
              f"harness)\n{'false':8s}{'':>4s}{'':>32s}{_summary(same, 'nanoGPT', 'nanoGPT #2')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
