"""Chapter 11 trainer under faults: no lost work, and every failure explained (issue 18).

Files that must not be overwritten, outputs checked before training, runs that
diverge, resumes that would silently change the run, garbage checkpoints and
seeds out of range. Each test failed on the trainer before issue 18.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shlex
import tempfile

import pytest
import torch

import course_attn.train.cli as cli
import course_attn.train.loop as trainer
from course_attn.data.tasks import CopyTask
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import (
    CHECKPOINT_FORMAT,
    METRICS_FORMAT,
    TrainConfig,
    TrainingDiverged,
    build_parser,
    load_checkpoint,
    main,
    model_from_checkpoint,
    save_checkpoint,
    train,
)

TASK = CopyTask(vocab_size=6, half_length=4)
TINY = ["--n-layers", "1", "--n-heads", "2", "--d-model", "16", "--context-length", "8",
        "--batch-size", "4", "--eval-interval", "2", "--eval-iters", "2", "--device", "cpu",
        "--warmup-iters", "1", "--quiet"]
TEXT = "the cat sat on the mat. the dog sat on the log.\n" * 30


def tiny_model() -> MiniGPT:
    torch.manual_seed(0)
    return MiniGPT(GPTConfig(vocab_size=6, context_length=TASK.context_length, n_layers=1,
                             n_heads=2,
                             d_model=16))


def quick(**overrides) -> TrainConfig:
    options = dict(max_iters=6, batch_size=4, eval_interval=2, eval_iters=2, warmup_iters=2,
                   device="cpu", progress=False)
    options.update(overrides)
    return TrainConfig(**options)


def strict_json(path) -> dict:
    """Parse as strict JSON: NaN or Infinity in the file is an error."""
    def refuse(constant):
        raise ValueError(f"{constant} in {path}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture()
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def exits_with_2(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture()
def no_training(monkeypatch):
    """Make any start of training fail the test: the error must come before it."""
    monkeypatch.setattr(cli, "train", lambda *a, **k: pytest.fail("training started"))


# ------------------------------------------------------- 1. overwriting files
@pytest.mark.parametrize("flag", ["--out", "--metrics-out"])
def test_cli_never_overwrites_the_training_text(flag, corpus_file, capsys, no_training):
    err = exits_with_2(["--data", str(corpus_file), *TINY, flag, str(corpus_file)], capsys)
    assert "training text" in err and flag in err
    link = corpus_file.with_name("link.txt")
    link.symlink_to(corpus_file)
    same = corpus_file.parent / "sub" / ".." / corpus_file.name  # resolves to the text
    (corpus_file.parent / "sub").mkdir()
    for path in (link, same):
        err = exits_with_2(["--data", str(corpus_file), *TINY, flag, str(path)], capsys)
        assert "training text" in err
    assert corpus_file.read_text(encoding="utf-8") == TEXT


@pytest.mark.parametrize(("flag", "content"), [
    ("--out", "my notes\n"),
    ("--out", json.dumps({"format": METRICS_FORMAT})),  # a metrics file is no checkpoint
    ("--metrics-out", "my notes\n"),
    ("--metrics-out", json.dumps({"loss": 1.0})),  # JSON, but not this CLI's
    ("--metrics-out", ""),
])
def test_cli_refuses_to_overwrite_a_foreign_file(flag, content, tmp_path, corpus_file, capsys,
                                                 no_training):
    other = tmp_path / "other"
    other.write_text(content)
    err = exits_with_2(["--data", str(corpus_file), *TINY, flag, str(other)], capsys)
    assert "refusing to overwrite" in err and flag in err
    assert other.read_text() == content


def test_cli_overwrites_its_own_checkpoint_and_metrics(tmp_path, corpus_file):
    ckpt, metrics = tmp_path / "ckpt.pt", tmp_path / "m.json"
    args = ["--data", str(corpus_file), *TINY, "--max-iters", "2", "--samples", "0",
            "--out", str(ckpt), "--metrics-out", str(metrics)]
    assert main(args) == 0
    first = strict_json(metrics)
    assert first["format"] == METRICS_FORMAT
    assert main([*args, "--seed", "7"]) == 0  # a new run into the same two files
    assert strict_json(metrics)["train_config"]["seed"] == 7
    assert load_checkpoint(ckpt)["train_config"]["seed"] == 7


def test_cli_refuses_one_file_for_two_outputs(tmp_path, corpus_file, capsys, no_training):
    path = tmp_path / "both"
    err = exits_with_2(["--data", str(corpus_file), *TINY, "--out", str(path),
                        "--metrics-out", str(path)], capsys)
    assert "same file" in err


def test_train_refuses_a_foreign_checkpoint_path(corpus_file):
    with pytest.raises(ValueError, match="checkpoint_path .* refusing to overwrite"):
        train(tiny_model(), TASK, quick(), checkpoint_path=corpus_file)
    assert corpus_file.read_text(encoding="utf-8") == TEXT


# ------------------------------------------- 2. a finished run is never lost
def test_cli_four_letter_text_trains_writes_and_samples(tmp_path, capsys):
    dna = tmp_path / "dna.txt"
    dna.write_text("ACGTTGCAAGCTTCGA" * 40, encoding="utf-8")
    ckpt, metrics = tmp_path / "ckpt.pt", tmp_path / "m.json"
    code = main(["--data", str(dna), *TINY, "--max-iters", "2", "--samples", "30",
                 "--out", str(ckpt), "--metrics-out", str(metrics)])
    assert code == 0
    sample = capsys.readouterr().out.split("sample:\n")[1]
    assert len(sample.strip()) == 30 and set(sample.strip()) <= set("ACGT")
    assert strict_json(metrics)["model_config"]["vocab_size"] == 4
    assert load_checkpoint(ckpt)["iter"] == 2


def test_cli_writes_metrics_and_checkpoint_before_sampling(tmp_path, corpus_file,
                                                           monkeypatch):
    def broken_generate(*args, **kwargs):
        raise RuntimeError("sampling failed")

    monkeypatch.setattr(MiniGPT, "generate", broken_generate)
    ckpt, metrics = tmp_path / "ckpt.pt", tmp_path / "m.json"
    with pytest.raises(RuntimeError, match="sampling failed"):
        main(["--data", str(corpus_file), *TINY, "--max-iters", "2", "--out", str(ckpt),
              "--metrics-out", str(metrics)])
    assert len(strict_json(metrics)["train_loss_history"]) == 2
    assert load_checkpoint(ckpt)["iter"] == 2


# ------------------------------------ 3. output paths checked before training
@pytest.mark.parametrize("flag", ["--out", "--metrics-out"])
def test_cli_output_folder_is_refused_before_training(flag, tmp_path, corpus_file, capsys,
                                                      no_training):
    err = exits_with_2(["--data", str(corpus_file), *TINY, flag, str(tmp_path)], capsys)
    assert "is a folder" in err and flag in err


@pytest.mark.parametrize("flag", ["--out", "--metrics-out"])
def test_cli_unwritable_output_is_refused_before_training(flag, tmp_path, corpus_file, capsys,
                                                          no_training, monkeypatch):
    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)  # (root ignores permission bits)
    err = exits_with_2(["--data", str(corpus_file), *TINY, flag, str(tmp_path / "x")],
                       capsys)
    assert "cannot create a file" in err and "Permission denied" in err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root may write into a read-only folder")
def test_cli_read_only_folder_is_refused_before_training(tmp_path, corpus_file, capsys,
                                                         no_training):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        err = exits_with_2(["--data", str(corpus_file), *TINY, "--out", str(folder / "c.pt")],
                           capsys)
    finally:
        folder.chmod(0o700)
    assert "cannot create a file" in err


def test_save_checkpoint_removes_its_tmp_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    train(tiny_model(), TASK, quick(max_iters=2), checkpoint_path=path)
    before = path.read_bytes()
    checkpoint = load_checkpoint(path)

    def disk_full(obj, f):
        f.write(b"half a checkpoint")  # save_checkpoint hands torch.save an open file
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, checkpoint)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no ckpt.pt.tmp
    assert path.read_bytes() == before


# ------------------------------------------------------ 4. non-finite losses
def test_divergence_stops_at_the_first_non_finite_loss():
    with pytest.raises(TrainingDiverged) as info:
        train(tiny_model(), TASK, quick(lr=1e6, grad_clip=0, eval_interval=6))
    error = info.value
    assert isinstance(error, ValueError)
    assert not math.isfinite(error.loss) and error.checkpoint_iter is None
    losses = error.result.train_losses
    assert len(losses) == error.iteration - 1 and all(math.isfinite(x) for x in losses)
    assert f"iteration {error.iteration} is nan" in str(error) and "learning rate" in str(error)
    assert error.result.elapsed_s > 0


def poison_at(monkeypatch, bad_it: int) -> None:
    """A NaN learning rate at loop index ``bad_it``: the weights after that step are NaN,
    so the training loss of iteration ``bad_it + 2`` (counted from 1) is the first NaN."""
    real = trainer._scheduled_lr  # the schedule the loop reads, without learning_rate's checks
    monkeypatch.setattr(trainer, "_scheduled_lr",
                        lambda it, config: float("nan") if it == bad_it else real(it, config))


def test_divergence_names_the_exact_first_bad_iteration(monkeypatch):
    # One read-back covers iterations 2..10; the first NaN among them is iteration 6.
    options = dict(max_iters=10, eval_interval=10, log_interval=10)
    clean = train(tiny_model(), TASK, quick(**options))
    poison_at(monkeypatch, 4)
    with pytest.raises(TrainingDiverged) as info:
        train(tiny_model(), TASK, quick(**options))
    assert info.value.iteration == 6
    assert info.value.result.train_losses == clean.train_losses[:5]  # the good ones, kept


def test_divergence_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    poison_at(monkeypatch, 4)  # checkpoints at 2 and 4, the training loss of 6 is NaN
    with pytest.raises(TrainingDiverged) as info:
        train(tiny_model(), TASK, quick(max_iters=8), checkpoint_path=path)
    assert info.value.iteration == 6 and info.value.checkpoint_iter == 4
    checkpoint = load_checkpoint(path)
    assert checkpoint["iter"] == 4
    assert all(bool(t.isfinite().all()) for t in checkpoint["model"].values())
    assert f"iteration 4 in {str(path)!r} is kept" in str(info.value)


def test_divergence_found_by_evaluation_saves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    poison_at(monkeypatch, 3)  # the weights after iteration 4 are NaN; its loss is not
    with pytest.raises(TrainingDiverged, match="evaluation loss after iteration 4 is nan"):
        train(tiny_model(), TASK, quick(max_iters=8), checkpoint_path=path)
    assert load_checkpoint(path)["iter"] == 2


def test_non_finite_weights_are_never_saved(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    poison_at(monkeypatch, 3)
    monkeypatch.setattr(trainer, "estimate_loss", lambda *a, **k: {"train": 1.0, "val": 1.0})
    with pytest.raises(TrainingDiverged, match="weights after iteration 4 are not all finite"):
        train(tiny_model(), TASK, quick(max_iters=8), checkpoint_path=path)
    assert load_checkpoint(path)["iter"] == 2


def test_cli_divergence_writes_the_metrics_and_exits_with_2(tmp_path, corpus_file, capsys):
    metrics, ckpt = tmp_path / "m.json", tmp_path / "ckpt.pt"
    err = exits_with_2(["--data", str(corpus_file), *TINY, "--max-iters", "6", "--lr", "1e6",
                        "--grad-clip", "0", "--eval-interval", "6", "--out", str(ckpt),
                        "--metrics-out", str(metrics)], capsys)
    assert "training diverged" in err and "lower --lr" in err and "--grad-clip" in err
    written = strict_json(metrics)  # valid JSON: no NaN in it
    assert written["diverged_at_iter"] >= 2
    assert len(written["train_loss_history"]) == written["diverged_at_iter"] - 1
    assert "sample:" not in capsys.readouterr().out


# ------------------------------------------------ 5. resume refuses changes
def first_run(tmp_path, corpus_file, *extra) -> str:
    ckpt = tmp_path / "ckpt.pt"
    assert main(["--data", str(corpus_file), *TINY, "--max-iters", "4", "--samples", "0",
                 "--out", str(ckpt), *extra]) == 0
    return str(ckpt)


@pytest.mark.parametrize(("change", "named"), [
    (["--lr", "0.01"], ["lr 0.001 -> 0.01"]),
    (["--lr", "0.01", "--batch-size", "8"], ["lr 0.001 -> 0.01", "the global batch",
                                             "4 x 1 x 1 = 4 in the checkpoint, 8 x 1 x 1 = 8"]),
    (["--seed", "1"], ["seed 1337 -> 1"]),
    (["--max-iters", "6"], ["decays until iteration 4", "--lr-decay-iters 4"]),
    (["--max-iters", "6", "--lr-decay-iters", "6"], ["decays until iteration 4"]),
    (["--max-iters", "3", "--lr-decay-iters", "4"], ["at iteration 4, past max_iters=3"]),
])
def test_cli_resume_refuses_changed_settings(change, named, tmp_path, corpus_file, capsys):
    ckpt = first_run(tmp_path, corpus_file)
    err = exits_with_2(["--data", str(corpus_file), *TINY, "--max-iters", "4", "--samples",
                        "0", "--resume", ckpt, *change], capsys)
    for words in named:
        assert words in err


def test_cli_resume_refuses_another_text(tmp_path, corpus_file, capsys):
    ckpt = first_run(tmp_path, corpus_file)
    other = tmp_path / "other.txt"  # the same number of characters, other characters
    other.write_text(TEXT.replace("c", "k"), encoding="utf-8")
    err = exits_with_2(["--data", str(other), *TINY, "--samples", "0", "--resume", ckpt],
                       capsys)
    assert "the tokenizer" in err and "only in the checkpoint's: 'c'" in err
    shuffled = tmp_path / "shuffled.txt"  # the very same characters, another text
    shuffled.write_text(TEXT.replace("cat", "tac"), encoding="utf-8")
    err = exits_with_2(["--data", str(shuffled), *TINY, "--samples", "0", "--resume", ckpt],
                       capsys)
    assert "the training text (SHA-256" in err
    err = exits_with_2(["--task", "copy", "--n-layers", "1", "--n-heads", "2", "--d-model", "16",
                        "--device", "cpu", "--resume", ckpt], capsys)
    assert "different model configuration: vocab_size 15 -> 16, context_length 8 -> 31" in err


def test_resume_may_change_only_where_and_how_it_runs(tmp_path):
    path = tmp_path / "half.pt"
    options = dict(max_iters=8, lr_decay_iters=8, eval_interval=4)
    full = train(tiny_model(), TASK, quick(**options))
    train(tiny_model(), TASK, quick(**{**options, "max_iters": 4}), checkpoint_path=path,
          meta={"task": "copy"})
    resumed = train(tiny_model(), TASK, quick(**options, log_interval=3, device=None),
                    resume_from=path)
    assert resumed.train_losses == full.train_losses
    with pytest.raises(ValueError, match="eval_iters 2 -> 3"):
        train(tiny_model(), TASK, quick(**options, eval_iters=3), resume_from=path)
    with pytest.raises(ValueError, match="the data: the checkpoint was trained on a task"):
        train(tiny_model(), TASK, quick(**options), resume_from=path,
              meta={"tokenizer_chars": "abcdef"})
    # meta=None keeps the checkpoint's meta in the checkpoints of the resumed run
    train(tiny_model(), TASK, quick(**options), resume_from=path, checkpoint_path=path,
          meta=None)
    assert load_checkpoint(path)["meta"] == {"task": "copy", "world_size": 1}  # one process


def test_cli_help_example_of_a_longer_run_is_accepted(tmp_path, corpus_file, monkeypatch):
    """The --help epilog's resume example, at a thousandth of its size, resumes."""
    lines = [line.split("python -m course_attn.train ", 1)[1]
             for line in build_parser().epilog.splitlines() if "input.txt" in line]
    first, resume = (shlex.split(line) for line in lines)
    assert "--resume" in resume and "--max-iters" in resume

    def scaled(words: list[str]) -> list[str]:
        words = [str(tmp_path / "ckpt.pt") if w == "ckpt.pt" else
                 str(corpus_file) if w == "input.txt" else
                 str(int(w) // 1000) if w.isdigit() else w for w in words]
        return [*words, *TINY, "--dropout", "0", "--samples", "0"]

    # The gpu preset runs 5000 iterations; here 5 (TINY makes the model tiny).
    assert main([*scaled(first), "--max-iters", "5"]) == 0
    assert main(scaled(resume)) == 0
    checkpoint = load_checkpoint(tmp_path / "ckpt.pt")
    assert checkpoint["iter"] == 6 and len(checkpoint["history"]["train_losses"]) == 6


# ------------------------------------------------- 6. garbage checkpoints
class Thing:
    """An arbitrary Python object: a weights-only load refuses it."""


def garbage_files(tmp_path) -> dict[str, object]:
    good = tmp_path / "good.pt"
    train(tiny_model(), TASK, quick(max_iters=2), checkpoint_path=good)
    data = good.read_bytes()
    files = {
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "random bytes": bytes(range(256)) * 8,
        "text": TEXT.encode(),
        "a plain pickle": pickle.dumps({"format": CHECKPOINT_FORMAT}),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    torch.save({"x": Thing()}, tmp_path / "an object")  # needs weights_only=False: never
    return {name: tmp_path / name for name in [*files, "an object"]}


def test_garbage_checkpoints_give_a_clear_error(tmp_path, capsys, corpus_file):
    for name, path in garbage_files(tmp_path).items():
        with pytest.raises(ValueError, match="is not a readable course_attn checkpoint") as info:
            load_checkpoint(path)
        assert "weights_only" not in str(info.value), name
        assert info.value.__cause__ is None and info.value.__suppress_context__
        err = exits_with_2(["--data", str(corpus_file), *TINY, "--resume", str(path)], capsys)
        assert "not a readable course_attn checkpoint" in err and "weights_only" not in err
        with pytest.raises(ValueError, match="not a readable"):
            model_from_checkpoint(path)


def test_incomplete_checkpoints_give_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="missing.*model_config"):
        model_from_checkpoint({"format": CHECKPOINT_FORMAT, "model": {}})
    with pytest.raises(ValueError, match="not a course_attn training checkpoint"):
        model_from_checkpoint({"model_config": {}})
    with pytest.raises(TypeError, match="checkpoint"):
        model_from_checkpoint(5)  # type: ignore[arg-type]
    path = tmp_path / "ckpt.pt"
    train(tiny_model(), TASK, quick(max_iters=2), checkpoint_path=path)
    checkpoint = load_checkpoint(path)
    with pytest.raises(ValueError, match="not a GPTConfig"):
        model_from_checkpoint({**checkpoint, "model_config": {"widht": 3}})
    with pytest.raises(ValueError, match="does not hold the weights"):
        model_from_checkpoint({**checkpoint, "model": {}})
    with pytest.raises(ValueError, match="incomplete or damaged.*malformed.*iter"):
        train(tiny_model(), TASK, quick(), resume_from={**checkpoint, "iter": "2"})
    same = quick(max_iters=4, lr_decay_iters=2)  # the same run, two iterations longer
    with pytest.raises(ValueError, match="damaged.*history"):
        train(tiny_model(), TASK, same, resume_from={**checkpoint, "history": {}})
    older = {key: value for key, value in checkpoint.items() if key != "scaler"}
    assert len(train(tiny_model(), TASK, same, resume_from=older).train_losses) == 4
    del checkpoint["optimizer"]
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="incomplete or damaged.*optimizer"):
        load_checkpoint(path)


# ------------------------------------------------------------------ 7. seeds
def test_seeds_must_fit_a_signed_64_bit_int(corpus_file, capsys, no_training):
    for seed in (2**63, 2**64, -1):
        with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63 - 1\]"):
            TrainConfig(seed=seed)
    for seed in (1.0, "7", True, None):  # a wrong type is a TypeError, not a ValueError
        with pytest.raises(TypeError, match="seed must be an int"):
            TrainConfig(seed=seed)  # type: ignore[arg-type]
    for seed in ("18446744073709551616", "9223372036854775808", "-1"):
        err = exits_with_2(["--data", str(corpus_file), *TINY, "--seed", seed], capsys)
        assert "argument --seed: seed must be an int in [0, 2**63 - 1]" in err
    for seed in ("seven", "1.5", "1e3"):
        err = exits_with_2(["--data", str(corpus_file), *TINY, "--seed", seed], capsys)
        assert f"argument --seed: invalid int value: {seed!r}" in err


def test_the_largest_seed_trains():
    result = train(tiny_model(), TASK, quick(max_iters=2, seed=2**63 - 1))
    assert len(result.train_losses) == 2
