"""Chapter 11: text from a trained checkpoint: ``python -m course_attn.sample``, as nanoGPT's.

Loads a checkpoint that ``python -m course_attn.train`` wrote (weights, model config and
the character tokenizer, with the checks ``--resume`` makes), encodes a prompt and
continues it with :meth:`MiniGPT.generate <course_attn.models.gpt.MiniGPT.generate>`,
keys and values cached. The same ``--seed`` on the same device gives the same text;
``--temperature 0`` is greedy decoding.

Exit codes: 0 done; 2 a mistake in the command line or the checkpoint; 74
(:data:`~course_attn.train.outputs.EXIT_WRITE_FAILED`) the text could not be written to
the standard output (a full disk under ``> file``, a closed pipe): one line on the
standard error says so, never a traceback; 130 and 143 stopped by SIGINT or SIGTERM, at
once (a sample has nothing to save).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from ..data.text import CharTokenizer, load_text
from ..env import pick_device
from ..models.gpt import MiniGPT
from .checkpoint import load_checkpoint, model_from_checkpoint
from .outputs import EXIT_WRITE_FAILED, printed
from .stopping import SignalOwner, StopRequested

__all__ = ["build_parser", "main"]

PROG = "python -m course_attn.sample"

EPILOG = """\
examples:
  python -m course_attn.sample --checkpoint ckpt.pt
  python -m course_attn.sample --checkpoint ckpt.pt --prompt "ROMEO:" --num-samples 3 \\
--max-new-tokens 300 --temperature 0.8 --top-k 40 --seed 7
  python -m course_attn.sample --checkpoint ckpt.pt --prompt-file start.txt --temperature 0

exit codes: 0 done, 2 a wrong argument or checkpoint, 74 the standard output could not be
written (a full disk, a closed pipe), 130 or 143 stopped by Ctrl-C or SIGTERM."""


def _number(kind: type, low: float, high: float | None = None, *, low_open: bool = False):
    """An argparse type: a number of ``kind`` in ``[low, high]`` (``(low, ...`` if open)."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        too_low = value < low or (low_open and value == low)
        if too_low or (high is not None and value > high):
            left, right = "(" if low_open else "[", "]" if high is not None else ")"
            bounds = f"{left}{low}, {'inf' if high is None else high}{right}"
            raise argparse.ArgumentTypeError(f"expected a value in {bounds}, got {value}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m course_attn.sample``."""
    parser = argparse.ArgumentParser(
        prog="python -m course_attn.sample",
        description="Continue a prompt with a MiniGPT trained by python -m course_attn.train "
                    "on a text file (chapter 11).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", metavar="CKPT", required=True,
                        help="a checkpoint written by python -m course_attn.train --out")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None,
                        help="the text to continue (default: a newline)")
    prompt.add_argument("--prompt-file", metavar="PATH", help="read the prompt from a file")
    parser.add_argument("--max-new-tokens", type=_number(int, 0), default=500, metavar="N",
                        help="characters to generate after the prompt (default 500)")
    parser.add_argument("--num-samples", type=_number(int, 1), default=1, metavar="N",
                        help="how many continuations (default 1)")
    parser.add_argument("--temperature", type=_number(float, 0.0), default=0.8,
                        help="divides the logits; 0 = greedy (default 0.8)")
    parser.add_argument("--top-k", type=_number(int, 1), default=None, metavar="K",
                        help="sample among the K likeliest characters only")
    parser.add_argument("--top-p", type=_number(float, 0.0, 1.0, low_open=True), default=None,
                        metavar="P", help="sample among the fewest characters whose "
                                          "probabilities add up to P (nucleus sampling)")
    parser.add_argument("--seed", type=_number(int, 0, 2**63 - 1), default=1337,
                        help="random seed (default 1337): the same seed gives the same text")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:1 or mps (default: best available)")
    parser.add_argument("--no-cache", action="store_true",
                        help="recompute every position at every step (slower; the same text)")
    return parser


def _prompt(parser: argparse.ArgumentParser, args: argparse.Namespace, chars: str) -> str:
    """The prompt's text, every character of it in the model's vocabulary."""
    if args.prompt_file is not None:
        try:
            text = load_text(args.prompt_file)
        except (OSError, ValueError) as error:
            parser.error(f"--prompt-file {args.prompt_file!r}: {error}")
    else:
        text = "\n" if args.prompt is None else args.prompt
    flag = "--prompt-file" if args.prompt_file is not None else "--prompt"
    if not text:
        parser.error(f"{flag}: the prompt is empty; give at least one character")
    unknown = sorted(set(text) - set(chars))
    if unknown:
        parser.error(f"{flag}: the model's vocabulary ({len(chars)} characters) has no "
                     f"{', '.join(repr(c) for c in unknown)}")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m course_attn.sample``; return the exit code (argument errors exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        device = pick_device(args.device)
        checkpoint = load_checkpoint(Path(args.checkpoint), map_location="cpu")
        model, tokenizer = model_from_checkpoint(checkpoint)
    except (OSError, TypeError, ValueError) as error:
        flag = "--device" if "preferred" in str(error) else "--checkpoint"
        parser.error(f"{flag}: {error}")
    if tokenizer is None:
        parser.error(f"--checkpoint {args.checkpoint!r}: this model was trained on a synthetic "
                     "task, not on text; there is no tokenizer to write characters with")
    text = _prompt(parser, args, tokenizer.chars)
    ids = tokenizer.encode(text)
    context = model.config.context_length
    if len(ids) > context:
        print(f"sample: the prompt has {len(ids)} characters, more than the model's context of "
              f"{context}; it keeps the last {context}", file=sys.stderr)
        ids = ids[-context:]
    with SignalOwner() as stop:
        try:
            with stop.at_once("while sampling"):  # nothing to save: stop at once
                return _sample(args, model.to(device).eval(), tokenizer, ids, device)
        except StopRequested as stopped:
            print(f"{PROG}: {stopped}.", file=sys.stderr)
            return 128 + stopped.signum


def _sample(args: argparse.Namespace, model: MiniGPT, tokenizer: CharTokenizer,
            ids: list[int], device: torch.device) -> int:
    """Print ``--num-samples`` continuations of the prompt ``ids``; return the exit code."""
    idx = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    start = time.perf_counter()

    def show() -> None:
        for number in range(args.num_samples):
            out = model.generate(idx, args.max_new_tokens, temperature=args.temperature,
                                 top_k=args.top_k and min(args.top_k, tokenizer.vocab_size),
                                 top_p=args.top_p, use_cache=not args.no_cache,
                                 generator=generator)  # (1, T + max_new_tokens)
            if number:
                print("-" * 40)
            print(tokenizer.decode(out[0].tolist()))

    if not printed(show, PROG, "while sampling"):
        return EXIT_WRITE_FAILED
    seconds = time.perf_counter() - start
    print(f"sample: {args.num_samples} x {args.max_new_tokens} characters in {seconds:.2f} s "
          f"on {device}{' without' if args.no_cache else ' with'} the KV cache", file=sys.stderr)
    return 0
