"""The command line of chapter 11's trainer, ``python -m course_attn.train``.

The flags that override a preset are the fields of
:class:`~course_attn.models.gpt.GPTConfig` and :class:`~course_attn.train.TrainConfig`
listed in :data:`OVERRIDES`: each flag takes its field's name (``--n-layers``
for ``n_layers``) and type, and the dataclass's own checks judge its value,
so a wrong value exits with code 2 and the dataclass's message, naming the
flag. ``--impl`` offers :data:`~course_attn.core.attention.ATTENTION_IMPLS`.

Every mistake in the command line, the files or the settings exits with code
2 before any training where it can be known then, and no work is lost: the
output paths (and the room on their disks) are checked first, and the metrics
are written before sampling.

Exit codes: 0 done; 2 a mistake in the command line, the files or the settings
(or a run that diverged); 130 and 143 stopped by SIGINT or SIGTERM, at any moment
(:mod:`~course_attn.train.stopping`);
74 (:data:`~course_attn.train.outputs.EXIT_WRITE_FAILED`) a file of the run could not
be written (a disk that filled up, a folder that turned read-only): the last good
checkpoint is kept, the metrics so far are written where they can be (the
``--metrics-out`` path, else next to it or to the checkpoint, else the system's
temporary folder) and the message says where.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import re
import shlex
import shutil
import signal
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args, get_type_hints

import torch

from ..core.attention import ATTENTION_IMPLS
from ..core.layers import ACTIVATIONS, NORMS
from ..data.tasks import TASKS, make_task
from ..data.text import CharCorpus, PackedCorpus, default_corpus, load_text
from ..env import pick_device
from ..models.gpt import POS_ENCODINGS, GPTConfig, MiniGPT
from .checkpoint import check_checkpoint_path, check_checkpoint_room, load_checkpoint
from .distributed import World, launcher, world_from_env
from .loop import (
    BatchSource,
    CheckpointWriteError,
    TrainConfig,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    train,
)
from .outputs import EXIT_WRITE_FAILED, check_metrics_path, printed, same_file, save_metrics
from .presets import PRESETS, check_preset_device
from .stopping import AFTER_TRAINING, BEFORE_TRAINING, SignalOwner, StopRequested

__all__ = ["build_parser", "configs_from_args", "main"]

PROG = "python -m course_attn.train"

#: The fields of GPTConfig and TrainConfig that flags override, in ``--help``'s order,
#: each with its help (``{default}`` is the field's default) or None.
OVERRIDES: dict[str, str | None] = {
    "n_layers": None,
    "n_heads": None,
    "d_model": None,
    "context_length": "context length (with --task: set by the task)",
    "batch_size": "sequences per micro-batch and process (default: the preset's)",
    "grad_accum": "micro-batches per optimizer step: the global batch is --batch-size x "
                  "--grad-accum x processes (default {default})",
    "max_iters": None,
    "lr": "peak learning rate",
    "lr_decay_iters": "iteration where the cosine decay of the learning rate ends "
                      "(default: --max-iters; fix it to lengthen the run later)",
    "grad_clip": "clip the gradient norm to this (default {default}; 0 = no clipping)",
    "dropout": None,
    "eval_interval": None,
    "eval_iters": None,
    "warmup_iters": None,
    "device": "cpu, cuda, cuda:1 or mps (default: best available; the gpu preset refuses "
              "to start on a CPU unless --device cpu is given)",
    "seed": "random seed, an integer in [0, 2**63 - 1] (default {default})",
}

#: The other fields of GPTConfig, each a flag of its own (chapter 10's variants, chapter 7's
#: block): derived from the dataclass, so a field added there is a flag here. Their help,
#: and the choices of the string fields.
VARIANTS: dict[str, str] = {
    "pos_encoding": "how positions enter: {choices} (default {default})",
    "n_kv_heads": "key/value heads, dividing --n-heads: grouped-query attention; 1 = "
                  "multi-query (default: --n-heads)",
    "window": "sliding-window attention: each token sees the last N positions (default: all)",
    "norm": "the blocks' norm: {choices} (default {default})",
    "activation": "the feed-forward network: {choices} (default {default})",
    "init_std": "standard deviation of the initial weights (default {default})",
    "bias": "biases in the linear layers and norms (default: none, as nanoGPT's presets; "
            "GPTConfig's own default is {default})",
    "tie_weights": "share the token embedding with the output head (default {default})",
}
CHOICES: dict[str, tuple[str, ...]] = {"pos_encoding": POS_ENCODINGS, "norm": NORMS,
                                       "activation": ACTIVATIONS}

EPILOG = """\
examples:
  python -m course_attn.train --preset cpu --max-iters 500
  python -m course_attn.train --task copy --max-iters 1500 --metrics-out m.json
  python -m course_attn.train --data input.txt --preset gpu --out ckpt.pt
  python -m course_attn.train --data input.txt --preset gpu --resume ckpt.pt \
--out ckpt.pt --max-iters 6000 --lr-decay-iters 5000

  torchrun --nproc_per_node=2 -m course_attn.train --device cpu --preset cpu \
--batch-size 6 --out ckpt.pt
      (two processes, gloo on a CPU, NCCL on GPUs: data parallelism; the global
      batch above is 6 x 1 x 2 = 12, the cpu preset's)

Ctrl-C or SIGTERM stops the command whenever it comes (exit 130 or 143, one
line): before training (reading the data, building the model) at once, with
nothing written; during training at the end of the step, evaluation or
checkpoint in hand (under torchrun, of the step where the processes next read
their losses back, within 10 steps; one before the loop, after the first step),
with the checkpoint (--out) and the metrics so far written and the command to
resume printed; after training (the sample) at once, its files written. A
second Ctrl-C stops at once.

A disk that fills up or a folder that turns read-only stops the run at the next
checkpoint with one message and exit code 74: the last good checkpoint is kept,
and the metrics so far are written (to --metrics-out, else next to it or to the
checkpoint, else to the system's temporary folder; the message says where).

A resumed run is the same run: give the same data, preset, overrides and seed.
--max-iters may grow when --lr-decay-iters keeps the learning-rate schedule
where it was (the first run's --lr-decay-iters, else its --max-iters: 5000
for the gpu preset); --device, --compile, --no-amp and --quiet may change, and
--batch-size and --grad-accum with the number of processes when the global
batch stays the same."""

Config = TypeVar("Config", GPTConfig, TrainConfig)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_overrides(group: argparse._ArgumentGroup) -> None:
    """One flag per field in :data:`OVERRIDES`, typed as the field is (``int | None``: int)."""
    hints = {**get_type_hints(GPTConfig), **get_type_hints(TrainConfig)}
    defaults = {f.name: f.default for config in (GPTConfig, TrainConfig)
                for f in dataclasses.fields(config)}
    for name, text in OVERRIDES.items():
        hint = hints[name]
        kind = next(t for t in get_args(hint) if t is not type(None)) if isinstance(
            hint, types.UnionType) else hint
        group.add_argument(_flag(name), type=kind,
                           help=text and text.format(default=defaults[name]))


def _add_variants(group: argparse._ArgumentGroup) -> None:
    """One flag per GPTConfig field that is neither an override nor set by the data."""
    fields = {f.name: f for f in dataclasses.fields(GPTConfig)}
    missing = set(fields) - set(OVERRIDES) - set(VARIANTS) - {"vocab_size", "impl"}
    assert not missing, f"GPTConfig fields without a flag: {missing}"  # a new field: add it
    hints = get_type_hints(GPTConfig)
    for name, text in VARIANTS.items():
        default, hint = fields[name].default, hints[name]
        help_text = text.format(default=default, choices=", ".join(CHOICES.get(name, ())))
        if hint is bool:
            group.add_argument(_flag(name), action=argparse.BooleanOptionalAction,
                               default=None, help=help_text)
            continue
        kind = next(t for t in get_args(hint) if t is not type(None)) if isinstance(
            hint, types.UnionType) else hint
        group.add_argument(_flag(name), type=kind, choices=CHOICES.get(name), help=help_text)


def _count(text: str) -> int:
    """The type of ``--samples``, the one number that is no dataclass's: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _separator(text: str) -> str:
    """The type of ``--pack-documents``: a non-empty separator, ``\\n``, ``\\t`` and ``\\\\``
    read as a newline, a tab and a backslash (a blank line is hard to type in a shell)."""
    escapes = {"n": "\n", "t": "\t", "\\": "\\"}
    out, chars = [], iter(text)
    for char in chars:
        if char == "\\":
            char = escapes.get(next(chars, ""), "")
            if not char:
                raise argparse.ArgumentTypeError(f"{text!r}: only \\n, \\t and \\\\ are escapes")
        out.append(char)
    if not out:
        raise argparse.ArgumentTypeError("the separator must not be empty")
    return "".join(out)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m course_attn.train``."""
    parser = argparse.ArgumentParser(
        prog="python -m course_attn.train",
        description="Train the course's MiniGPT (chapter 11) on a text file, on the offline "
                    "default corpus (Python standard-library sources) or on a synthetic task.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", metavar="PATH",
                        help="UTF-8 text file to train a character-level model on "
                             "(default: the offline standard-library corpus)")
    source.add_argument("--task", choices=sorted(TASKS),
                        help="a synthetic task with a known best loss instead of text")
    parser.add_argument("--pack-documents", nargs="?", const="\n\n", metavar="SEP",
                        type=_separator,
                        help="cut the text into documents at each SEP (default: a blank line, "
                             "\\n\\n: Tiny Shakespeare's speeches; \\n, \\t and \\\\ "
                             "are read as escapes) and keep attention and positions inside "
                             "each document of a row: chapter 11's document mask")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                        help="model and training sizes (default: cpu; gpu = nanoGPT baby GPT)")
    group = parser.add_argument_group("overrides of the preset")
    _add_overrides(group)
    variants = parser.add_argument_group("the model's variants (chapters 7 and 10)")
    _add_variants(variants)
    group.add_argument("--impl", choices=ATTENTION_IMPLS, default="sdpa",
                       help="attention path: readable manual or PyTorch's fused (default)")
    group.add_argument("--compile", action="store_true", help="torch.compile the model")
    group.add_argument("--no-amp", action="store_true",
                       help="no mixed precision on CUDA (default: bf16 where the GPU has it "
                            "natively, else fp16 with a gradient scaler)")
    parser.add_argument("--out", metavar="CKPT",
                        help="save checkpoints here (plain tensors); an existing file is "
                             "overwritten only if it is a checkpoint")
    parser.add_argument("--resume", metavar="CKPT", help="continue from this checkpoint")
    parser.add_argument("--metrics-out", metavar="JSON",
                        help="write loss history, final losses, speed, parameter count, "
                             "device and torch version as JSON (before any sampling); an "
                             "existing file is overwritten only if this CLI wrote it")
    parser.add_argument("--samples", type=_count, default=200, metavar="N",
                        help="characters to generate after training a text model (default 200)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _checked(parser: argparse.ArgumentParser, config: type[Config], **values: Any) -> Config:
    """``config(**values)``, its own checks' error made a command-line error (exit code 2).

    The message is the dataclass's, after the flags of the fields it names.
    """
    try:
        return config(**values)
    except (TypeError, ValueError) as error:
        flags = [_flag(name) for name in (*OVERRIDES, *VARIANTS)
                 if re.search(rf"\b{name}\b", str(error))]
        parser.error(f"argument {'/'.join(flags)}: {error}" if flags else str(error))


def _configs(parser: argparse.ArgumentParser, args: argparse.Namespace
             ) -> tuple[GPTConfig, TrainConfig]:
    """The preset with the flags' overrides, checked by the two dataclasses."""
    given = {name: getattr(args, name) for name in (*OVERRIDES, *VARIANTS)
             if getattr(args, name) is not None}
    values = {**PRESETS[args.preset], **given}

    def fields_of(config: type) -> dict[str, Any]:
        return {f.name: values[f.name] for f in dataclasses.fields(config) if f.name in values}

    # GPTConfig needs the vocabulary size, which only the data tells (see _load_data): a
    # stand-in lets the other sizes be checked now, before any file is read.
    model_config = _checked(parser, GPTConfig, vocab_size=1, impl=args.impl,
                            **fields_of(GPTConfig))
    config = _checked(parser, TrainConfig, amp=not args.no_amp, compile=args.compile,
                      progress=not args.quiet, **fields_of(TrainConfig))
    return model_config, config


def configs_from_args(argv: Sequence[str]) -> tuple[GPTConfig, TrainConfig]:
    """The ``(GPTConfig, TrainConfig)`` that ``python -m course_attn.train ARGV`` would build,
    without reading data or training (chapter 11 checks that its printed command builds the
    page's model). ``vocab_size`` is a stand-in 1: the command takes it from the data.

    Raises ``TypeError`` unless ``argv`` is a list or tuple of strings, and ``ValueError``
    with the parser's message where the command line would exit with a usage error.
    """
    if not isinstance(argv, list | tuple) or not all(isinstance(a, str) for a in argv):
        raise TypeError(f"argv must be a list of strings (the command's arguments), got "
                        f"{type(argv).__name__}")
    parser = build_parser()
    message = io.StringIO()
    try:
        with contextlib.redirect_stderr(message):
            return _configs(parser, parser.parse_args(list(argv)))
    except SystemExit:  # argparse's usage error, or a preset or field refused
        lines = message.getvalue().strip().splitlines()
        raise ValueError(f"argv is not a valid command line for {PROG}: "
                         f"{lines[-1] if lines else 'usage error'}") from None


def _check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before any work, outputs that would overwrite an input or each other."""
    outputs = [("--out", args.out, check_checkpoint_path),
               ("--metrics-out", args.metrics_out, check_metrics_path)]
    for flag, path, _ in outputs:
        if path is not None and args.data is not None and same_file(path, args.data):
            parser.error(f"{flag} {path!r} is the training text given as --data; refusing to "
                         "overwrite it")
    if args.out is not None and args.metrics_out is not None and same_file(args.out,
                                                                           args.metrics_out):
        parser.error(f"--out and --metrics-out name the same file {args.out!r}")
    if args.metrics_out is not None and args.resume is not None and same_file(
            args.metrics_out, args.resume):
        parser.error(f"--metrics-out {args.metrics_out!r} is the checkpoint given as --resume")
    for flag, path, check in outputs:
        if path is not None:
            try:
                check(path, flag)
            except (FileNotFoundError, ValueError) as error:
                parser.error(str(error))
    if args.metrics_out is not None:  # room for the file, known before any training
        folder = Path(args.metrics_out).resolve().parent
        free, needed = shutil.disk_usage(folder).free, metrics_bytes(max_iters(args))
        if free < needed:
            parser.error(f"--metrics-out {args.metrics_out!r}: the disk of {str(folder)!r} has "
                         f"{free:,} bytes free, fewer than the {needed:,} its metrics may take")


def _check_room(parser: argparse.ArgumentParser, args: argparse.Namespace,
                model: MiniGPT) -> None:
    """Refuse an ``--out`` disk without room for one checkpoint (known once the model is)."""
    if args.out is not None:
        try:
            check_checkpoint_room(Path(args.out), "--out", model)
        except ValueError as error:
            parser.error(str(error))


def max_iters(args: argparse.Namespace) -> int:
    """The run's ``max_iters``: the flag's, else the preset's."""
    return args.max_iters if args.max_iters is not None else PRESETS[args.preset]["max_iters"]


def metrics_bytes(iterations: int) -> int:
    """A generous bound on a metrics file's size: two numbers per iteration, and the rest."""
    return 2 * 32 * iterations + 64 * 1024


def _load_resume(parser: argparse.ArgumentParser, args: argparse.Namespace
                 ) -> dict[str, Any] | None:
    if args.resume is None:
        return None
    try:
        return load_checkpoint(args.resume)
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"--resume {args.resume!r}: {error}")


def _load_data(parser: argparse.ArgumentParser, args: argparse.Namespace,
               model_config: GPTConfig) -> tuple[BatchSource, GPTConfig, dict[str, Any]]:
    """The task or text to train on, the model config that fits it, and the run's meta."""
    if args.task is not None:
        if args.pack_documents is not None:
            parser.error(f"--pack-documents cuts a text into documents; the {args.task} task's "
                         "sequences are not a text")
        task = make_task(args.task)
        if args.context_length is not None and args.context_length != task.context_length:
            parser.error(f"--context-length {args.context_length}: the {args.task} task fixes it "
                         f"to {task.context_length}")
        meta = {"task": args.task, "loss_floor": task.loss_floor()}
        return task, dataclasses.replace(model_config, vocab_size=task.vocab_size,
                                         context_length=task.context_length), meta
    try:
        text = load_text(args.data) if args.data is not None else default_corpus()
        corpus = (CharCorpus.from_text(text) if args.pack_documents is None
                  else PackedCorpus.from_text(text, args.pack_documents))
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"--data {args.data!r}" + (f" --pack-documents {args.pack_documents!r}"
                     if args.pack_documents is not None else "") + f": {error}")
    if len(corpus.val_data) <= model_config.context_length:
        parser.error(f"--data {args.data!r}: the text is too short for --context-length "
                     f"{model_config.context_length} (its validation tenth has "
                     f"{len(corpus.val_data)} characters)")
    meta = {"tokenizer_chars": corpus.tokenizer.chars,
            "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "document_separator": args.pack_documents}
    return corpus, dataclasses.replace(model_config, vocab_size=corpus.vocab_size), meta


def _metrics(args: argparse.Namespace, model: MiniGPT, config: TrainConfig,
             result: TrainResult, meta: dict[str, Any]) -> dict[str, Any]:
    metrics = {"preset": args.preset, "model_config": dataclasses.asdict(model.config),
               "train_config": dataclasses.asdict(config), **result.to_metrics()}
    if "loss_floor" in meta:
        metrics["loss_floor"] = meta["loss_floor"]
    return metrics


def _save_metrics(args: argparse.Namespace, metrics: dict[str, Any], world: World, *,
                  always: bool = False) -> tuple[str, bool]:
    """Write the metrics (one process does; without ``--metrics-out`` only if ``always``).

    Returns the sentence that says where they are, and whether they are where asked:
    a path that cannot take them sends them next to it (or to the checkpoint), else
    to the system's temporary folder (:func:`~course_attn.train.outputs.save_metrics`).
    """
    if not world.main or (args.metrics_out is None and not always):
        return "", True
    written, failures = save_metrics(metrics, path=args.metrics_out, near=args.out)
    if written is None:
        return f" The metrics could not be written anywhere: {', '.join(failures)}.", False
    if args.metrics_out is not None and failures:
        return (f" The metrics could not be written to {failures[0]}; they are in "
                f"{str(written)!r}.", False)
    elsewhere = f" (not in {', '.join(failures)})" if failures else ""  # folders
    return f" The metrics so far are in {str(written)!r}{elsewhere}.", True


def _resume_command(args: argparse.Namespace, argv: Sequence[str], world: World) -> str:
    """The command that continues this run from its checkpoint (under torchrun, torchrun's)."""
    words = [w for i, w in enumerate(argv) if w != "--resume"
             and (i == 0 or argv[i - 1] != "--resume") and not w.startswith("--resume=")]
    return shlex.join([*launcher(world), "-m", "course_attn.train", *words, "--resume",
                       str(args.out)])


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace, model: MiniGPT,
           data: BatchSource, config: TrainConfig, resume: dict[str, Any] | None,
           meta: dict[str, Any], argv: Sequence[str], world: World) -> TrainResult | int:
    """:func:`~course_attn.train.train`; a run that stops early still writes its metrics.

    Returns the result, or the exit code of a run stopped early: 128 + the number of
    the signal that stopped it, or :data:`EXIT_WRITE_FAILED` for a checkpoint that
    could not be written.
    """
    try:
        return train(model, data, config, checkpoint_path=args.out, resume_from=resume,
                     meta=meta)
    except TrainingInterrupted as error:
        saved, _ = _save_metrics(args, {**_metrics(args, model, config, error.result, meta),
                                        "interrupted_at_iter": error.iteration}, world)
        if world.main:
            how = (f" To continue: {_resume_command(args, argv, world)}"
                   if error.checkpoint_iter is not None else " (no --out: nothing to resume)")
            print(f"python -m course_attn.train: {error}.{saved}{how}", file=sys.stderr)
        return 128 + signal.Signals[error.signal_name].value if error.signal_name.startswith(
            "SIG") else 1
    except CheckpointWriteError as error:  # the disk filled up, the folder turned read-only
        saved, _ = _save_metrics(args, {**_metrics(args, model, config, error.result, meta),
                                        "stopped_at_iter": len(error.result.train_losses)},
                                 world, always=True)
        cure = (" Move the folder at --out away (or choose another --out)"
                if args.out is not None and Path(args.out).is_dir()
                else " Free some space or make the folder writable (or choose another --out)")
        how = (f"{cure}, then continue: {_resume_command(args, argv, world)}"
               if error.checkpoint_iter is not None else f"{cure}, then start again.")
        if world.main:
            print(f"python -m course_attn.train: error: {error}.{saved}{how}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except TrainingDiverged as error:
        saved, _ = _save_metrics(args, {**_metrics(args, model, config, error.result, meta),
                                        "diverged_at_iter": error.iteration}, world)
        clip = (f"clip harder (--grad-clip below {config.grad_clip:g})" if config.grad_clip > 0
                else "clip the gradients (--grad-clip 1)")
        parser.error(f"{error}.{saved} On the command line: lower --lr (now {config.lr:g}) "
                     f"or {clip}")
    except ValueError as error:  # e.g. a checkpoint of another model or run
        if not world.main:  # every process found the same; one says it
            raise SystemExit(2) from None
        parser.error(str(error))


def _report(args: argparse.Namespace, model: MiniGPT, data: BatchSource, config: TrainConfig,
            result: TrainResult, meta: dict[str, Any]) -> None:
    """Print the final losses (and the task's floor), then a sample of a text model."""
    print(f"final loss: train {result.final_train_loss:.4f}, val {result.final_val_loss:.4f} "
          f"({result.ms_per_iter:.1f} ms/iter, {result.tokens_per_s:,.0f} tokens/s)")
    if "loss_floor" in meta:
        print(f"best achievable loss of the task: {meta['loss_floor']:.4f}")
    if isinstance(data, CharCorpus | PackedCorpus) and args.samples:
        tokenizer = data.tokenizer
        prompt = data.train_data[:1].unsqueeze(0).to(next(model.parameters()).device)  # (1, 1)
        generator = torch.Generator(device=prompt.device).manual_seed(config.seed)
        sample = model.generate(prompt, args.samples, top_k=min(10, tokenizer.vocab_size),
                                generator=generator)
        print("sample:\n" + tokenizer.decode(sample[0, 1:].cpu()))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m course_attn.train``; returns the exit code.

    Every mistake in the command line, the files or the settings exits with
    code 2 and a message, before any training where it can be known then.
    SIGINT and SIGTERM are owned here, from the first line to the last write
    (:mod:`course_attn.train.stopping`): one that comes while nothing is worth
    saving stops the command at once; during training, after the work in hand.
    """
    if argv is not None and (isinstance(argv, str) or not isinstance(argv, Sequence)
                             or not all(isinstance(arg, str) for arg in argv)):
        raise TypeError(f"argv must be a list of str (command-line words) or None, got "
                        f"{argv!r}")
    with SignalOwner() as stop:
        try:
            return _main(sys.argv[1:] if argv is None else list(argv), stop)
        except StopRequested as stopped:
            print(f"python -m course_attn.train: {stopped}.", file=sys.stderr)
            return 128 + stopped.signum


def _main(argv: list[str], stop: SignalOwner) -> int:
    """:func:`main` under its signal owner ``stop``."""
    parser = build_parser()
    world = world_from_env()
    # One process stops at once before training. Several go on to their first step, where
    # they agree to stop together: one stopping alone would leave the others waiting for it.
    with stop.at_once(BEFORE_TRAINING) if world.size == 1 else contextlib.nullcontext():
        args = parser.parse_args(argv)
        model, data, config, resume, meta, device = _prepare(parser, args, stop)
        header = _header(model, device, world)
        if world.main and not printed(lambda: print(header, flush=True), PROG, "before training"):
            return EXIT_WRITE_FAILED
    # From here a signal is recorded: train()'s loop stops after the step, evaluation or
    # checkpoint in hand; under torchrun the first process to stop makes torchrun send
    # SIGTERM to the others, and process 0 must not die before its metrics are written.
    result = _train(parser, args, model, data, config, resume, meta, argv, world)
    if isinstance(result, int):
        return result  # stopped by a signal, or a checkpoint that could not be written
    # Everything that took time is on disk before anything else can fail: the final
    # checkpoint (written by train at the last iteration), then the metrics.
    saved, where_asked = _save_metrics(args, _metrics(args, model, config, result, meta), world)
    if not where_asked:
        checkpoint = (f" The final checkpoint is in {args.out!r}." if args.out is not None
                      else " No checkpoint was asked for (--out).")
        print(f"python -m course_attn.train: error: the run finished ({config.max_iters} "
              f"iterations).{saved}{checkpoint}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    if stop.received:  # a signal after the last step: the files are written, no sample
        print(f"python -m course_attn.train: stopped by {signal.Signals(stop.received[0]).name} "
              f"after training.{saved}", file=sys.stderr)
        return 128 + stop.received[0]
    with stop.at_once(AFTER_TRAINING):  # the sample: nothing left to save
        if world.main and not printed(lambda: _report(args, model, data, config, result, meta),
                                      PROG, "after training (its files are written)"):
            return EXIT_WRITE_FAILED
    return 0


def _prepare(parser: argparse.ArgumentParser, args: argparse.Namespace, stop: SignalOwner
             ) -> tuple[MiniGPT, BatchSource, TrainConfig, dict[str, Any] | None,
                        dict[str, Any], torch.device]:
    """Check the settings and the outputs, read the data, build the model (exit 2 on a
    mistake); return the model, the data, the training config, the checkpoint to resume
    from, the run's meta and its device."""
    model_config, config = _configs(parser, args)
    with stop.deferred():  # the probe files of the output folders are removed before a stop
        _check_outputs(parser, args)
    resume = _load_resume(parser, args)
    data, model_config, meta = _load_data(parser, args, model_config)
    device = pick_device(config.device)
    if args.device is None:  # an explicit --device cpu is the user's informed choice
        try:
            check_preset_device(args.preset, device, vocab_size=model_config.vocab_size)
        except ValueError as error:
            parser.error(f"--preset {args.preset}: {error}")
    with torch.random.fork_rng(devices=[]):  # --seed also fixes the initial weights
        torch.manual_seed(config.seed)
        model = MiniGPT(model_config)
    _check_room(parser, args, model)
    return model, data, config, resume, meta, device


def _header(model: MiniGPT, device: torch.device, world: World) -> str:
    """The line that describes the run before it starts."""
    c = model.config
    processes = f", {world.size} processes" if world.size > 1 else ""
    return (f"MiniGPT: {model.num_parameters():,} parameters, {c.n_layers} layers x "
            f"{c.n_heads} heads, width {c.d_model}, context {c.context_length}, vocabulary "
            f"{c.vocab_size}; device {device}{processes}")
