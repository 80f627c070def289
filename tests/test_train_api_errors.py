"""Every public name of the trainer's modules, data.py and tasks.py, given a wrong type and value.

The design promises a ``TypeError`` (wrong type) or ``ValueError`` (wrong
value) that names the argument, never a raw torch error. The table below has
one entry per callable in each module's ``__all__`` (and the public methods of
its classes); a test fails when a public name has no entry, so a new function
cannot skip the sweep.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch

import course_attn.train as trainer
from course_attn.data import tasks
from course_attn.data import text as data
from course_attn.lab import analysis
from course_attn.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import checkpoint, cli, hardware, presets, resume

TASK = tasks.CopyTask(vocab_size=6, half_length=4)
TASK_IDS = torch.zeros(2, 4, dtype=torch.long)
TOKENIZER = data.CharTokenizer("abc")
IDS = torch.arange(60) % 3
WEIGHTS = torch.full((6, 6), 1 / 6)
CORPUS = data.CharCorpus(TOKENIZER, IDS, IDS)


def model() -> MiniGPT:
    return MiniGPT(GPTConfig(vocab_size=6, context_length=TASK.context_length, n_layers=1,
                             n_heads=1,
                             d_model=8))


def config(**overrides) -> trainer.TrainConfig:
    options = dict(max_iters=1, batch_size=2, eval_iters=1, warmup_iters=0, device="cpu",
                   progress=False)
    return trainer.TrainConfig(**{**options, **overrides})


def result() -> trainer.TrainResult:
    return trainer.TrainResult()


def an_empty_file(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("")
    return path


# name -> (wrong-type call, the argument it names, wrong-value call, the argument it names).
# Each call takes tmp_path. A wrong value names what is wrong with the value.
Case = tuple[Callable, str, Callable, str]
CASES: dict[str, Case] = {
    # ------------------------------------------------------------- train.py
    "TrainConfig": (lambda p: config(batch_size="12"), "batch_size",
                    lambda p: config(batch_size=0), "batch_size"),
    "TrainResult": (lambda p: trainer.TrainResult(train_losses="1.0"), "train_losses",
                    lambda p: trainer.TrainResult(n_params=-1), "n_params"),
    "TrainingInterrupted": (
        lambda p: trainer.TrainingInterrupted("x", result={}, iteration=1, signal_name="SIGINT",
                                              checkpoint_iter=None), "result",
        lambda p: trainer.TrainingInterrupted("x", result=result(), iteration=0,
                                              signal_name="SIGINT", checkpoint_iter=None),
        "iteration"),
    "CheckpointWriteError": (
        lambda p: trainer.CheckpointWriteError("x", result=None, checkpoint_iter=None), "result",
        lambda p: trainer.CheckpointWriteError("x", result=result(), checkpoint_iter=0),
        "checkpoint_iter"),
    "TrainingDiverged": (
        lambda p: trainer.TrainingDiverged("x", result={}, iteration=1, loss=float("nan"),
                                           checkpoint_iter=None), "result",
        lambda p: trainer.TrainingDiverged("x", result=result(), iteration=0,
                                           loss=float("nan"), checkpoint_iter=None),
        "iteration"),
    "amp_dtype": (lambda p: trainer.amp_dtype(0), "device",
                  lambda p: trainer.amp_dtype("gpu"), "device"),
    "check_preset_device": (lambda p: trainer.check_preset_device(1, "cpu"), "preset",
                            lambda p: trainer.check_preset_device("tpu", "cpu"), "preset"),
    "estimate_loss": (lambda p: trainer.estimate_loss(torch.nn.Linear(2, 2), TASK, config()),
                      "model",
                      lambda p: trainer.estimate_loss(model(), TASK, config(), device="gpu"),
                      "device"),
    "gpu_peak_flops": (lambda p: trainer.gpu_peak_flops(None), "name",
                       lambda p: trainer.gpu_peak_flops(""), "name"),
    "learning_rate": (lambda p: trainer.learning_rate(1.5, config()), "it",
                      lambda p: trainer.learning_rate(-1, config()), "it"),
    "load_checkpoint": (lambda p: trainer.load_checkpoint(5), "path",
                        lambda p: trainer.load_checkpoint(an_empty_file(p)),
                        "not a readable course_attn checkpoint"),
    "model_from_checkpoint": (lambda p: trainer.model_from_checkpoint(5), "checkpoint",
                              lambda p: trainer.model_from_checkpoint({}), "checkpoint"),
    "save_checkpoint": (lambda p: trainer.save_checkpoint(5, {}), "path",
                        lambda p: trainer.save_checkpoint(p / "c.pt", {}), "checkpoint"),
    "train": (lambda p: trainer.train(model(), TASK, config(), meta=["x"]), "meta",
              lambda p: trainer.train(model(), TASK, config(), checkpoint_path=p),
              "checkpoint_path"),
    # main: a wrong value is a command-line mistake, exit code 2 (test below)
    "main": (lambda p: trainer.main("--lr 1"), "argv", None, ""),
    "configs_from_args": (lambda p: trainer.configs_from_args("--lr 1"), "argv",
                          lambda p: trainer.configs_from_args(["--lr", "x"]), "argv"),
    # -------------------------------------------------------------- data.py
    "CharCorpus": (lambda p: data.CharCorpus("abc", IDS, IDS), "tokenizer",
                   lambda p: data.CharCorpus(TOKENIZER, IDS.view(6, 10), IDS), "train_data"),
    "CharCorpus.from_text": (lambda p: data.CharCorpus.from_text(b"abc"), "text",
                             lambda p: data.CharCorpus.from_text("abc", 1.5), "train_fraction"),
    "CharCorpus.get_batch": (
        lambda p: data.CharCorpus.from_text("abc" * 20).get_batch(0, 2, 4), "split",
        lambda p: data.CharCorpus.from_text("abc" * 20).get_batch("test", 2, 4), "split"),
    "PackedCorpus": (lambda p: data.PackedCorpus("abc", "\n", IDS, IDS), "corpus",
                     lambda p: data.PackedCorpus(CORPUS, "\n", IDS[:5], IDS[:5]),
                     "train_docs"),
    "PackedCorpus.from_text": (
        lambda p: data.PackedCorpus.from_text("a\nb" * 9, 5), "separator",
        lambda p: data.PackedCorpus.from_text("a\nb" * 9, "##"), "separator"),
    "PackedCorpus.get_batch": (
        lambda p: data.PackedCorpus.from_text("a\nb" * 9, "\n").get_batch(0, 2, 4), "split",
        lambda p: data.PackedCorpus.from_text("a\nb" * 9, "\n").get_batch("val", 2, 9),
        "context_length"),
    "document_ids": (lambda p: data.document_ids(b"a b", " "), "text",
                     lambda p: data.document_ids("a b", ""), "separator"),
    "CharTokenizer": (lambda p: data.CharTokenizer(5), "chars",
                      lambda p: data.CharTokenizer(""), "chars"),
    "CharTokenizer.from_text": (lambda p: data.CharTokenizer.from_text(5), "text",
                                lambda p: data.CharTokenizer.from_text(""), "text"),
    "CharTokenizer.encode": (lambda p: TOKENIZER.encode(5), "text",
                             lambda p: TOKENIZER.encode("abz"), "text"),
    "CharTokenizer.decode": (lambda p: TOKENIZER.decode(5), "ids",
                             lambda p: TOKENIZER.decode([7]), "ids"),
    "default_corpus": (lambda p: data.default_corpus(5), "modules",
                       lambda p: data.default_corpus(()), "modules"),
    "download_tiny_shakespeare": (
        lambda p: data.download_tiny_shakespeare(p, timeout="30"), "timeout",
        lambda p: data.download_tiny_shakespeare(p, filename="../x.txt"), "filename"),
    "get_batch": (lambda p: data.get_batch(list(range(60)), 2, 4), "data",
                  lambda p: data.get_batch(IDS, 0, 4), "batch_size"),
    "load_text": (lambda p: data.load_text(5), "path",
                  lambda p: data.load_text(an_empty_file(p)), "path"),
    "to_device": (lambda p: data.to_device([1, 2], "cpu"), "tensor",
                  lambda p: data.to_device(IDS, "gpu"), "device"),
    "train_val_split": (lambda p: data.train_val_split(IDS.float()), "data",
                        lambda p: data.train_val_split(IDS, 1.5), "train_fraction"),
    # ------------------------------------------------------------- tasks.py
    "CopyTask": (lambda p: tasks.CopyTask(vocab_size=2.5), "vocab_size",
                 lambda p: tasks.CopyTask(vocab_size=1), "vocab_size"),
    "CopyTask.sample": (lambda p: TASK.sample("2"), "batch_size",
                        lambda p: TASK.sample(0), "batch_size"),
    "CopyTask.get_batch": (lambda p: TASK.get_batch("train", 2, 7.0), "context_length",
                           lambda p: TASK.get_batch("train", 2, 8), "context_length"),
    "RecallTask": (lambda p: tasks.RecallTask(n_pairs=3.0), "n_pairs",
                   lambda p: tasks.RecallTask(n_keys=17), "n_keys"),
    "RecallTask.sample": (lambda p: tasks.RecallTask().sample(2, generator=1), "generator",
                          lambda p: tasks.RecallTask().sample(-1), "batch_size"),
    "RecallTask.get_batch": (lambda p: tasks.RecallTask().get_batch(None, 2), "split",
                             lambda p: tasks.RecallTask().get_batch("dev", 2), "split"),
    "HeadScoreTracker": (
        lambda p: analysis.HeadScoreTracker(TASK_IDS.double()), "tokens",
        lambda p: analysis.HeadScoreTracker(torch.tensor([[1, 2, 1, 2]]),
                                            previous_queries=torch.tensor([0, 1])),
        "previous_queries"),
    "attention_maps": (lambda p: analysis.attention_maps(model(), TASK_IDS.double()), "idx",
                       lambda p: analysis.attention_maps(model(), TASK_IDS[0]), "idx"),
    "cross_attention_maps": (
        lambda p: analysis.cross_attention_maps(model(), TASK_IDS, TASK_IDS), "model",
        lambda p: analysis.cross_attention_maps(
            EncoderDecoder(EncoderDecoderConfig(src_vocab_size=6, tgt_vocab_size=6, d_model=8,
                                                n_heads=2, n_layers=1)),
            TASK_IDS, TASK_IDS + 6), "tgt"),
    "cross_document_attention": (
        lambda p: analysis.cross_document_attention(WEIGHTS[None, None], [[0] * 6]), "doc_ids",
        lambda p: analysis.cross_document_attention(WEIGHTS[None, None], IDS[None, :5]),
        "doc_ids"),
    "induction_attention_score": (
        lambda p: analysis.induction_attention_score(WEIGHTS[None], [[0, 1]]), "tokens",
        lambda p: analysis.induction_attention_score(WEIGHTS[None], torch.arange(6)), "tokens"),
    "make_task": (lambda p: tasks.make_task(None), "name",
                  lambda p: tasks.make_task("reverse"), "name"),
    "offset_attention_score": (lambda p: analysis.offset_attention_score(WEIGHTS, 1.5), "offset",
                               lambda p: analysis.offset_attention_score(WEIGHTS, 6), "offset"),
}

#: Public names that are not called: constants, and an interface that is never built.
NOT_CALLED = {"GPU_PEAK_FLOPS", "PRESETS", "BatchSource", "DEFAULT_CORPUS_MODULES", "PackedBatch",
              "TINY_SHAKESPEARE_SHA256", "TINY_SHAKESPEARE_URL", "TASKS", "CHECKPOINT_FORMAT",
              "RESUME_MAY_CHANGE", "FUSED_ADAMW_DEVICES"}
#: Public callables that take no arguments, so none can be wrong.
NO_ARGUMENTS = {"build_parser"}
#: train.py and the modules it was split into (their public names are re-exported by it).
TRAINER_MODULES = (trainer, checkpoint, cli, hardware, presets, resume)


def public_callables() -> set[str]:
    """Every callable in the modules' ``__all__``, and their classes' public methods."""
    names = set()
    for module in (*TRAINER_MODULES, data, tasks, analysis):
        for name in module.__all__:
            value = getattr(module, name)
            if name in NO_ARGUMENTS:
                assert not inspect.signature(value).parameters, name
                continue
            if name in NOT_CALLED:
                assert not callable(value) or inspect.isclass(value), name
                continue
            assert callable(value), name
            names.add(name)
            if inspect.isclass(value) and not issubclass(value, BaseException):
                for attr, member in vars(value).items():
                    if not attr.startswith("_") and callable(
                            getattr(member, "__func__", member)) and not isinstance(
                            member, property):
                        takes_arguments = len(inspect.signature(
                            getattr(value, attr)).parameters) > (
                            0 if isinstance(member, classmethod | staticmethod) else 1)
                        if takes_arguments:
                            names.add(f"{name}.{attr}")
    return names


def test_the_sweep_covers_every_public_callable():
    found = public_callables()
    # Methods inherited from the tasks' shared base class count for each task.
    found |= {f"{task}.get_batch" for task in ("CopyTask", "RecallTask")}
    assert found == set(CASES), (f"missing: {sorted(found - set(CASES))}, "
                                 f"stale: {sorted(set(CASES) - found)}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_wrong_type_is_a_type_error_that_names_the_argument(name, tmp_path):
    call, argument, _, _ = CASES[name]
    with pytest.raises(TypeError) as info:
        call(tmp_path)
    assert argument in str(info.value), str(info.value)


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case[2]))
def test_a_wrong_value_is_a_value_error_that_names_the_argument(name, tmp_path):
    _, _, call, argument = CASES[name]
    with pytest.raises(ValueError) as info:
        call(tmp_path)
    assert argument in str(info.value), str(info.value)
    assert not isinstance(info.value, TypeError)


def test_train_re_exports_the_public_names_of_the_modules_split_from_it():
    for module in TRAINER_MODULES:
        for name in module.__all__:
            if name not in NO_ARGUMENTS | {"CHECKPOINT_FORMAT", "RESUME_MAY_CHANGE"}:
                assert name in trainer.__all__, (module.__name__, name)
            assert getattr(trainer, name) is getattr(module, name), (module.__name__, name)


def test_main_wrong_values_exit_with_2_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as info:
        trainer.main(["--task", "copy", "--lr", "-1"])
    assert info.value.code == 2 and "--lr" in capsys.readouterr().err
