"""``python -m course_attn.sample`` and nucleus sampling (issue 26, item 2)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_attn.models.decoding import pick_next
from course_attn.train import load_checkpoint, model_from_checkpoint
from course_attn.train import main as train_main
from course_attn.train.sample import main

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the cat sat on the mat. the dog sat on the log.\n" * 40


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sample")
    (folder / "text.txt").write_text(TEXT)
    ckpt = folder / "ckpt.pt"
    assert train_main(["--data", str(folder / "text.txt"), "--n-layers", "1", "--n-heads", "2",
                       "--d-model", "16", "--context-length", "16", "--batch-size", "4",
                       "--max-iters", "20", "--eval-interval", "10", "--eval-iters", "1",
                       "--device", "cpu", "--quiet", "--samples", "0", "--out", str(ckpt)]) == 0
    return ckpt


def _run(capsys, *args: str) -> tuple[str, str]:
    assert main(list(args)) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_the_same_seed_gives_the_same_text_and_the_cache_changes_nothing(checkpoint, capsys):
    base = ["--checkpoint", str(checkpoint), "--prompt", "the ", "--max-new-tokens", "40",
            "--device", "cpu"]
    first, err = _run(capsys, *base, "--seed", "3")
    again, _ = _run(capsys, *base, "--seed", "3")
    other, _ = _run(capsys, *base, "--seed", "4")
    uncached, err_uncached = _run(capsys, *base, "--seed", "3", "--no-cache")
    assert first == again == uncached and first != other
    assert first.startswith("the ") and len(first) == len("the ") + 40 + 1  # and a newline
    assert "with the KV cache" in err and "without the KV cache" in err_uncached


def test_temperature_zero_is_the_models_own_greedy_generate(checkpoint, capsys):
    out, _ = _run(capsys, "--checkpoint", str(checkpoint), "--prompt", "the d",
                  "--max-new-tokens", "25", "--temperature", "0", "--device", "cpu")
    model, tokenizer = model_from_checkpoint(load_checkpoint(checkpoint))
    idx = torch.tensor([tokenizer.encode("the d")])
    greedy = model.eval().generate(idx, 25, temperature=0.0)
    assert out == tokenizer.decode(greedy[0].tolist()) + "\n"


def test_several_samples_and_a_prompt_file(checkpoint, tmp_path, capsys):
    (tmp_path / "prompt.txt").write_text("the ")
    out, _ = _run(capsys, "--checkpoint", str(checkpoint), "--prompt-file",
                  str(tmp_path / "prompt.txt"), "--max-new-tokens", "10", "--num-samples", "3",
                  "--top-k", "5", "--top-p", "0.9", "--device", "cpu")
    assert out.count("-" * 40) == 2 and out.count("the ") >= 3


def test_a_prompt_longer_than_the_context_is_cut_from_the_left_with_a_notice(checkpoint,
                                                                           capsys):
    _, err = _run(capsys, "--checkpoint", str(checkpoint), "--prompt", "the cat " * 5,
                  "--max-new-tokens", "3", "--device", "cpu")
    assert "the prompt has 40 characters, more than the model's context of 16" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--prompt", "Zebra"], r"--prompt: the model's vocabulary \(\d+ characters\) has no 'Z', "
                            r"'b', 'r'"),
    (["--prompt", ""], "--prompt: the prompt is empty"),
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "0"], "--top-k"),
    (["--device", "cuda:7"], "--device"),
])
def test_bad_arguments_exit_2_naming_them(checkpoint, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["--checkpoint", str(checkpoint), *args])
    assert info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_missing_or_task_checkpoint_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--checkpoint", str(tmp_path / "none.pt")])
    assert info.value.code == 2 and "--checkpoint" in capsys.readouterr().err
    ckpt = tmp_path / "task.pt"
    assert train_main(["--task", "copy", "--n-layers", "1", "--n-heads", "1", "--d-model", "8",
                       "--batch-size", "2", "--max-iters", "1", "--eval-iters", "1",
                       "--device", "cpu", "--quiet", "--out", str(ckpt)]) == 0
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(ckpt)])
    assert "trained on a synthetic task" in capsys.readouterr().err


def test_python_dash_m_course_attn_sample_runs(checkpoint):
    result = subprocess.run([sys.executable, "-m", "course_attn.sample", "--checkpoint",
                             str(checkpoint), "--max-new-tokens", "5", "--device", "cpu"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout) == 1 + 5 + 1  # the newline prompt, 5 characters, a newline


def test_nucleus_sampling_keeps_the_fewest_tokens_reaching_top_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    seen = {int(pick_next(logits, 1.0, None, torch.Generator().manual_seed(s), 0.7))
            for s in range(200)}
    assert seen == {0, 1}  # 0.5 < 0.7, and 0.5 + 0.3 reaches it: token 2 and 3 are out
    only_best = {int(pick_next(logits, 1.0, None, torch.Generator().manual_seed(s), 0.4))
                 for s in range(50)}
    assert only_best == {0}  # the likeliest token always stays
    everything = {int(pick_next(logits, 1.0, None, torch.Generator().manual_seed(s), 1.0))
                  for s in range(400)}
    assert everything == {0, 1, 2, 3}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (not Linux)")
def test_a_full_standard_output_is_one_line_and_exit_74_without_a_traceback(checkpoint):
    """``python -m course_attn.sample ... > /dev/full`` (issue 41): every write fails with
    ENOSPC. One line says so; Python's own flush at exit does not fail again (exit 120)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "course_attn.sample", "--checkpoint",
                               str(checkpoint), "--max-new-tokens", "20", "--device", "cpu"],
                              cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=300, check=False)
    assert done.returncode == 74, done.stderr  # EXIT_WRITE_FAILED, as the trainer's
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert ("python -m course_attn.sample: error: could not write to the standard output "
            "while sampling: No space left on device") in done.stderr
    assert "characters in" not in done.stderr  # no report of a sample nobody got
