"""tools/perturbed: the numerics make nbval-perturbed runs every notebook under.

The perturbation patches torch for the whole process, so each check runs it in a fresh
interpreter (a subprocess) and never in the test process itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PERTURB = ROOT / "tools" / "perturbed" / "perturb_numerics.py"
sys.path.insert(0, str(ROOT / "tools" / "perturbed"))
from run_nbval import perturbed_ipython_dir  # noqa: E402


def _run(code: str, perturbed: bool) -> str:
    """``code`` in a fresh Python, after the perturbation's start-up file if asked."""
    prelude = f"exec(open({str(PERTURB)!r}).read())\n" if perturbed else ""
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


DRAWS = """
    import torch
    torch.manual_seed(0)
    draws = [torch.randn(4096, dtype=torch.float64), torch.rand(64, 64),
             torch.nn.Linear(64, 64).weight.detach(), torch.empty(256).normal_()]
    after = torch.randint(0, 10**6, (8,))  # the stream after the draws
    torch.save((draws, after), {path!r})
"""


def test_random_floats_move_by_about_one_part_in_a_million_and_the_stream_stays(tmp_path):
    import torch

    plain, nudged = tmp_path / "plain.pt", tmp_path / "nudged.pt"
    _run(DRAWS.format(path=str(plain)), perturbed=False)
    _run(DRAWS.format(path=str(nudged)), perturbed=True)
    (a, after_a), (b, after_b) = torch.load(plain), torch.load(nudged)
    assert torch.equal(after_a, after_b)  # integers drawn later: the same
    for x, y in zip(a, b, strict=True):
        relative = ((y - x) / x).abs()
        # changed, by at most 1e-6 (and half a float32 step of rounding)
        assert 1e-7 < relative.max() <= 1e-6 + 2**-23
        assert (relative > 0).float().mean() > 0.5  # nearly every number, not a few


def test_gradients_are_nudged_before_each_optimiser_step():
    out = _run("""
        import torch
        w = torch.nn.Parameter(torch.ones(1000, dtype=torch.float64))
        opt = torch.optim.SGD([w], lr=1.0)
        w.grad = torch.ones_like(w)
        opt.step()  # w = 1 - grad, the grad nudged first
        print(float((w.detach() - 0).abs().max()), float(w.detach().abs().min()))
    """, perturbed=True)
    largest, smallest = map(float, out.split())
    assert 0 < largest <= 1.000001e-3 and smallest >= 0  # |1 - g| = |u| <= 1e-3


def test_an_operator_count_sees_the_step_and_not_the_nudge():
    """Chapter 11 counts an optimizer step's operators: the nudge of its gradients stands
    for another CPU's rounding, so it must not add operators to the count."""
    code = """
        import torch
        from course_attn.lab.measure import operator_counts
        w = torch.nn.Parameter(torch.ones(10, 10))
        opt = torch.optim.AdamW([w], foreach=False)
        w.grad = torch.ones_like(w)
        opt.step()
        w.grad = torch.ones_like(w)
        print(sum(operator_counts(opt.step).values()))
    """
    nudged = _run(code, perturbed=True)
    assert int(nudged) == int(_run(code, perturbed=False)) > 0
    out = _run("""
        import torch
        w = torch.nn.Parameter(torch.ones(1000, dtype=torch.float64))
        w.grad = torch.ones_like(w)
        torch.optim.SGD([w], lr=1.0).step()
        print(int((w.detach() != 0).sum()))
    """, perturbed=True)
    assert int(out) > 900  # and the gradients are still nudged


def test_bfloat16_attention_on_the_cpu_is_missing_as_on_an_amx_cpu():
    out = _run("""
        import torch, torch.nn.functional as F
        q = torch.randn(1, 2, 8, 16)
        F.scaled_dot_product_attention(q, q, q)  # float32: runs
        try:
            F.scaled_dot_product_attention(q.bfloat16(), q.bfloat16(), q.bfloat16())
        except RuntimeError as err:
            print("refused:", err)
    """, perturbed=True)
    assert "refused: pack_vnni2 is only supported when avx512 is supported" in out


def test_a_notebook_kernel_starts_perturbed():
    """The pass checks nothing unless the kernel really loads the start-up file."""
    jupyter_client = pytest.importorskip("jupyter_client")
    import os

    with perturbed_ipython_dir() as ipython_dir:
        old = os.environ.get("IPYTHONDIR")
        os.environ["IPYTHONDIR"] = str(ipython_dir)
        try:
            manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
        finally:
            if old is None:
                del os.environ["IPYTHONDIR"]
            else:
                os.environ["IPYTHONDIR"] = old
        printed: list[str] = []
        try:
            client.execute_interactive(
                "import os; print(os.environ.get('COURSE_PERTURBED'))", timeout=60,
                output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    assert "".join(printed).strip() == "1e-06"


def test_the_pass_compiles_into_a_kernel_cache_of_its_own(monkeypatch):
    """A FlexAttention kernel cached by a run at another ATEN_CPU_CAPABILITY gave a wrong
    answer when loaded under the pass's (torch 2.13): the pass must not share the cache."""
    import run_nbval

    seen: dict[str, str] = {}

    def call(command, env):
        seen.update(env)
        assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent.is_dir()  # inside the live temp dir
        return 0

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(run_nbval.subprocess, "call", call)
    assert run_nbval.main(["--co"]) == 0
    cache = Path(seen["TORCHINDUCTOR_CACHE_DIR"])
    assert cache.name == "inductor" and cache.parent.name.startswith("course_attn_perturbed_")
    assert not cache.parent.exists()  # removed with the run
