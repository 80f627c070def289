"""``python -m course_attn.check FILE.py``: a learner's file, checked by name (issues 34, 40).

Exit codes: 0 when every check run passed, 1 when one did not (failed, not written, hung),
2 for a usage error, 3 when the file cannot be imported, 130 when interrupted. Most cases
call ``main`` in this process (fast); two run the real command.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from course_attn.check import CHECKS
from course_attn.check.__main__ import (
    EXIT_FAILED,
    EXIT_IMPORT,
    EXIT_INTERRUPTED,
    EXIT_PASSED,
    EXIT_USAGE,
    main,
)

CORRECT = '''
import math
import torch
from torch import nn


def softmax(x, temperature=1.0):
    x = (x - x.amax(dim=-1, keepdim=True)) / temperature
    e = x.exp()
    return e / e.sum(dim=-1, keepdim=True)


def causal_mask(t_q, t_k):
    return torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, mask=None):
        b, t, d = x.shape
        hd = d // self.n_heads
        q, k, v = (p(x).view(b, t, self.n_heads, hd).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))
'''

WRONG = CORRECT.replace("tril(t_k - t_q)", "tril(t_k - t_q - 1)")  # the diagonal blocked


def write(tmp_path: Path, source: str, name: str = "mine.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_a_correct_file_passes_every_check_it_defines(tmp_path, capsys):
    assert main([str(write(tmp_path, CORRECT))]) == EXIT_PASSED
    out = capsys.readouterr().out
    for name in ("softmax", "causal_mask", "multi_head_attention"):
        assert f"check.{name}: passed" in out
    absent = " ".join(out.split("not in mine.py, so not checked: ")[1].split())
    assert absent.startswith("attention_pool, self_attention, qkv_projection, SelfAttention")
    assert out.splitlines()[-1] == "3 of 3 pass"


def test_the_notebooks_names_are_checked_too(tmp_path, capsys):
    source = CORRECT.replace("def softmax(", "def my_softmax(").replace(
        "class MultiHeadAttention(", "class MyMultiHeadAttention(")
    assert main([str(write(tmp_path, source))]) == EXIT_PASSED
    out = capsys.readouterr().out
    assert "check.softmax (my_softmax): passed" in out
    assert "check.multi_head_attention (MyMultiHeadAttention): passed" in out
    assert main([str(write(tmp_path, source)), "my_softmax"]) == EXIT_PASSED
    assert "check.causal_mask" not in capsys.readouterr().out


def test_a_wrong_function_fails_the_run_and_shows_its_hint(tmp_path, capsys):
    assert main([str(write(tmp_path, WRONG))]) == EXIT_FAILED
    out = capsys.readouterr().out
    flat = " ".join(out.split())  # a report folds its long lines
    assert "check.causal_mask: FAILED" in flat and "the diagonal is True" in flat
    assert "check.softmax: passed" in flat  # the others still run
    assert out.splitlines()[-1] == "2 of 3 pass, 1 fails"


def test_the_summary_counts_passes_failures_and_functions_not_written(tmp_path, capsys):
    solutions = (Path(__file__).parent / "check_solutions.py").read_text()
    source = solutions.replace("def sliding_window_mask(t, window):\n",
                               "def sliding_window_mask(t, window):\n"
                               "    raise NotImplementedError\n")
    source = source.replace("x + ff(norm2(x))", "x + ff(norm1(x))")  # the wrong norm
    path = write(tmp_path, source)
    names = ["softmax", "attention_pool", "qkv_projection", "attention_scores", "causal_mask",
             "padding_mask", "split_heads", "pre_norm_block", "sliding_window_mask"]
    assert main([str(path), *names]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "7 of 9 pass, 1 fails, 1 not written"
    assert "check.sliding_window_mask: not written yet" in out


def test_only_the_named_checks_run(tmp_path, capsys):
    assert main([str(write(tmp_path, WRONG)), "softmax", "MultiHeadAttention"]) == EXIT_PASSED
    out = capsys.readouterr().out
    assert "check.causal_mask" not in out and "not in mine.py" not in out
    assert "check.multi_head_attention: passed" in out


def test_a_function_not_written_yet_fails_the_run(tmp_path, capsys):
    source = "def softmax(x, temperature=1.0):\n    raise NotImplementedError\n"
    assert main([str(write(tmp_path, source))]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "check.softmax: not written yet" in out
    assert out.splitlines()[-1] == "0 of 1 pass, 1 not written"


def test_a_name_imported_rather_than_written_is_not_checked(tmp_path, capsys):
    source = "from course_attn import causal_mask\n" + CORRECT.replace("def causal_mask",
                                                                       "def unused")
    assert main([str(write(tmp_path, source))]) == EXIT_PASSED
    out = capsys.readouterr().out
    assert ("check.causal_mask: causal_mask is imported from course_attn.core.masks, not "
            "yours: not checked") in " ".join(out.split())
    assert out.splitlines()[-1] == "2 of 2 pass, 1 imported, not checked"
    only_imported = "from course_attn import causal_mask, softmax\n"
    assert main([str(write(tmp_path, only_imported))]) == EXIT_USAGE


@pytest.mark.parametrize(("source", "args", "message"), [
    ("x = 1\n", [], "defines none of the names"),  # missing every function
    ("def softmax(x, temperature=1.0):\n    return x\n", ["causal_mask"],
     "mine.py does not define causal_mask"),  # a name asked for, not in the file
    (None, [], "no such file"),
    ("def softmax(x, temperature=1.0):\n    return x\n", ["no_such_check"], "unknown name"),
    ("def softmax(x, temperature=1.0):\n    return x\n", ["--timeout", "-1"], "--timeout"),
])
def test_usage_errors_exit_with_2_and_say_why(tmp_path, capsys, source, args, message):
    path = tmp_path / "missing.py" if source is None else write(tmp_path, source)
    assert main([str(path), *args]) == EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("source", "message"), [
    ("import no_such_module_anywhere\n", "cannot import mine.py: ModuleNotFoundError"),
    ("raise ValueError('oops')\n", "cannot import mine.py: ValueError: oops"),
    ("import sys\n\ndef main():\n    return 0\n\nsys.exit(main())\n",
     "mine.py called sys.exit(0) while being imported, so no check could run"),
    ("while True:\n    pass\n", "importing mine.py took more than 1.2 s"),
])
def test_a_file_that_cannot_be_imported_exits_with_3_and_says_why(tmp_path, capsys, source,
                                                                  message):
    assert main([str(write(tmp_path, source)), "--timeout", "0.1"]) == EXIT_IMPORT
    assert message in capsys.readouterr().err


def test_a_file_imports_as_a_module_would_dataclasses_included(tmp_path, capsys):
    source = ("from __future__ import annotations\n\nimport dataclasses\n\n"
              "@dataclasses.dataclass\nclass Config:\n    width: int = 4\n\n" + CORRECT)
    assert main([str(write(tmp_path, source)), "softmax"]) == EXIT_PASSED
    assert capsys.readouterr().out.splitlines()[-1] == "1 of 1 pass"


def test_a_name_that_is_not_a_function_is_a_failure_not_a_crash(tmp_path, capsys):
    assert main([str(write(tmp_path, "softmax = 3\n"))]) == EXIT_FAILED
    out = " ".join(capsys.readouterr().out.split())
    assert "check.softmax: softmax in mine.py is an int, not a function: TypeError: fn must " \
           "be a function" in out


def test_a_function_that_hangs_is_reported_with_its_case_and_the_others_still_run(
        tmp_path, capsys):
    source = CORRECT.replace("def causal_mask(t_q, t_k):\n",
                             "def causal_mask(t_q, t_k):\n    while t_q != t_k:\n"
                             "        pass\n")
    assert main([str(write(tmp_path, source)), "--timeout", "0.5"]) == EXIT_FAILED
    out = " ".join(capsys.readouterr().out.split())
    assert ("check.causal_mask: FAILED after 1 passing case case: T_q = 2 new queries "
            "against T_k = 5 keys") in out
    assert "expected: an answer within 0.5 s" in out and "a loop that never ends" in out
    assert "check.multi_head_attention: passed" in out
    assert out.endswith("2 of 3 pass, 1 fails (1 hung)")


def test_sys_exit_in_a_checked_function_is_that_checks_failure(tmp_path, capsys):
    source = CORRECT.replace("    e = x.exp()\n", "    raise SystemExit(4)\n")
    assert main([str(write(tmp_path, source))]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "got:      SystemExit: 4" in out and out.splitlines()[-1] == "2 of 3 pass, 1 fails"


@pytest.mark.parametrize(("source", "where"), [
    ("raise KeyboardInterrupt\n", "interrupted during importing mine.py"),
    (CORRECT.replace("    return torch.ones(t_q", "    raise KeyboardInterrupt\n"
                                                  "    return torch.ones(t_q"),
     "interrupted during check.causal_mask, case: a square mask (4, 4)"),
])
def test_ctrl_c_exits_with_130_and_says_where(tmp_path, capsys, source, where):
    assert main([str(write(tmp_path, source))]) == EXIT_INTERRUPTED
    out = capsys.readouterr().out
    assert where in out
    if "check." in where:
        assert out.splitlines()[-1] == "1 of 1 pass"  # softmax, checked before


def test_the_command_runs_as_python_dash_m(tmp_path):
    path = write(tmp_path, WRONG)
    result = subprocess.run([sys.executable, "-m", "course_attn.check", str(path), "causal_mask"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == EXIT_FAILED, result.stderr
    assert result.stdout.startswith("check.causal_mask: FAILED after 0 passing cases")
    usage = subprocess.run([sys.executable, "-m", "course_attn.check", "--help"],
                           capture_output=True, text=True, timeout=300)
    assert usage.returncode == 0 and "usage: python -m course_attn.check" in usage.stdout
    help_text = " ".join(usage.stdout.split())
    for code in ("0 every check run passed", "1 one failed", "2 usage error",
                 "3 FILE cannot be imported", "130 interrupted"):
        assert code in help_text
    assert len(CHECKS) == 26
