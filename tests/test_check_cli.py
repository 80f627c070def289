"""``python -m course_attn.check FILE.py``: a learner's file, checked by name (issue 34).

Exit codes: 0 when every check found passed, 1 when one did not, 2 for a usage error.
Most cases call ``main`` in this process (fast); one runs the real command.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from course_attn.check import NAMES
from course_attn.check.__main__ import EXIT_FAILED, EXIT_PASSED, EXIT_USAGE, main

CORRECT = '''
import math
import torch
from torch import nn


def softmax(x, temperature=1.0):
    x = x / temperature
    e = (x - x.amax(dim=-1, keepdim=True)).exp()
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
    # every other check gets one line saying what to write
    assert "check.attention_pool: attention_pool not found in mine.py (write " \
           "attention_pool(x, query) -> (pooled, weights))" in out
    assert out.count(" not found in mine.py") == len(NAMES) - 3


def test_a_wrong_function_fails_the_run_and_shows_its_hint(tmp_path, capsys):
    assert main([str(write(tmp_path, WRONG))]) == EXIT_FAILED
    out = " ".join(capsys.readouterr().out.split())  # a report folds its long lines
    assert "check.causal_mask: FAILED" in out and "the diagonal is True" in out
    assert "check.softmax: passed" in out  # the others still run


def test_only_the_named_checks_run(tmp_path, capsys):
    assert main([str(write(tmp_path, WRONG)), "softmax", "MultiHeadAttention"]) == EXIT_PASSED
    out = capsys.readouterr().out
    assert "check.causal_mask" not in out and "not found" not in out
    assert "check.multi_head_attention: passed" in out


def test_a_function_not_written_yet_fails_the_run(tmp_path, capsys):
    source = "def softmax(x, temperature=1.0):\n    raise NotImplementedError\n"
    assert main([str(write(tmp_path, source))]) == EXIT_FAILED
    assert "check.softmax: not written yet" in capsys.readouterr().out


@pytest.mark.parametrize(("source", "args", "message"), [
    ("x = 1\n", [], "defines none of the names"),  # missing every function
    ("import no_such_module_anywhere\n", [], "cannot import"),
    (None, [], "no such file"),
    ("def softmax(x, temperature=1.0):\n    return x\n", ["no_such_check"], "unknown check"),
])
def test_usage_errors_exit_with_2_and_say_why(tmp_path, capsys, source, args, message):
    path = tmp_path / "missing.py" if source is None else write(tmp_path, source)
    assert main([str(path), *args]) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_a_name_that_is_not_a_function_is_a_failure_not_a_crash(tmp_path, capsys):
    assert main([str(write(tmp_path, "softmax = 3\n"))]) == EXIT_FAILED
    assert "check.softmax: TypeError: fn must be a function" in capsys.readouterr().out


def test_the_command_runs_as_python_dash_m(tmp_path):
    path = write(tmp_path, WRONG)
    result = subprocess.run([sys.executable, "-m", "course_attn.check", str(path), "causal_mask"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == EXIT_FAILED, result.stderr
    assert result.stdout.startswith("check.causal_mask: FAILED after 0 passing cases")
    usage = subprocess.run([sys.executable, "-m", "course_attn.check"], capture_output=True,
                           text=True, timeout=300)
    assert usage.returncode == EXIT_USAGE and "usage: python -m course_attn.check" in usage.stderr
