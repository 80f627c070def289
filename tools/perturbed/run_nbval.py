"""Strict nbval under perturbed numerics: ``make nbval-perturbed`` (``NB=...`` for one notebook).

Runs ``pytest --nbval`` with this folder's ``perturb_numerics.py`` as an IPython start-up
file of every notebook kernel (see its docstring for what it changes), so that a printed
figure that round-off can change fails here and not on a reader's machine. Two more changes
of the numerics, unless the environment already sets them: one thread (``make notebooks``
executes with two, so every parallel reduction splits its sums differently), and ATen's
kernels one level below this CPU's best (AVX2 code on an AVX-512 machine: other vector
widths, other reduction orders, other ``exp``; the portable scalar code on any other).
Arguments after the script's name go to pytest (the notebooks, ``-x``, ...).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


@contextlib.contextmanager
def perturbed_ipython_dir() -> Iterator[Path]:
    """A temporary ``IPYTHONDIR`` whose default profile starts with the perturbation."""
    with tempfile.TemporaryDirectory(prefix="course_attn_perturbed_") as tmp:
        startup = Path(tmp) / "profile_default" / "startup"
        startup.mkdir(parents=True)
        shutil.copy(HERE / "perturb_numerics.py", startup / "00_perturb_numerics.py")
        yield Path(tmp)


def lower_cpu_capability() -> str:
    """The ATen kernels one level below this CPU's best: ``avx2`` below AVX-512, else
    ``default`` (the portable code; slower, so only where there is no middle level)."""
    import torch

    return "avx2" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "default"


def main(argv: list[str]) -> int:
    with perturbed_ipython_dir() as ipython_dir:
        env = dict(os.environ, IPYTHONDIR=str(ipython_dir))
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("ATEN_CPU_CAPABILITY", lower_cpu_capability())
        # Compiled kernels (chapter 10's FlexAttention) in a cache of this run's own. Inductor
        # picks its vector code from ATEN_CPU_CAPABILITY, but a kernel cached on disk by a run
        # without it (make notebooks, the unit tests beside this pass) was loaded here and gave
        # a wrong answer, 2.8 off, reproduced on torch 2.13 with the shared cache and gone with
        # a fresh one.
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ipython_dir / "inductor"))
        print(f"nbval-perturbed: ATen {env['ATEN_CPU_CAPABILITY']}, "
              f"{env['OMP_NUM_THREADS']} thread(s), random draws and gradients nudged",
              flush=True)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval",
                   "--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE), *argv]
        return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
