"""A SIGINT at a random moment of a training command, under a CPU hog (issue 41).

Run ``python tools/stop_anytime.py`` (``--help`` for the options). It starts
``python -m course_attn.train`` on the copy task with a 2-layer model and 200,000
iterations (the issue's run, which ignored a signal sent after its model line), beside
``--hogs`` busy processes (``yes > /dev/null``, a shared machine), sends SIGINT at a
moment drawn uniformly from ``[0, --window]`` seconds after the start, and measures the
seconds from the signal to the end of the process. ``--runs`` times; it prints one line
per run (the moment, the seconds to stop, the exit code, where the signal landed) and
exits with 1 if any run took longer than ``--bound`` seconds, or stopped otherwise than
by the signal (exit 130, or Python's own death by SIGINT while it was still importing
torch, before the command's first line), or left a checkpoint and metrics that disagree.

The window is wide enough to land before ``main`` (Python importing torch), during the
preparation (data, model), around the model line and in the training loop. The numbers
are a measurement, not a test: tests/test_train_stop.py stages each moment instead.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["-m", "course_attn.train", "--task", "copy", "--n-layers", "2", "--max-iters",
           "200000", "--device", "cpu", "--quiet"]


def where(err: str, code: int) -> str:
    """Where the signal landed, read off the standard error."""
    if "stopped by SIGINT before training" in err:
        return "before training (at once, nothing written)"
    if "training stopped by SIGINT after iteration" in err:
        iteration = err.split("after iteration ", 1)[1].split(" ", 1)[0]
        return f"in training (stopped after iteration {iteration})"
    if code == -signal.SIGINT and "KeyboardInterrupt" in err:
        return "before main (Python still importing)"
    return "elsewhere: " + (err.strip().splitlines() or ["(no message)"])[-1][:80]


def consistent(folder: Path) -> bool:
    """A checkpoint and metrics that agree on the iteration, or neither written."""
    ckpt, metrics = folder / "run.pt", folder / "run.json"
    if not ckpt.exists() and not metrics.exists():
        return True
    if not (ckpt.exists() and metrics.exists()):
        return False
    from course_attn.train import load_checkpoint  # only when there is one to read

    saved = json.loads(metrics.read_text())
    return load_checkpoint(ckpt)["iter"] == saved.get("interrupted_at_iter")


def one_run(moment: float, env: dict[str, str]) -> tuple[float, int, str, bool]:
    """Start the command, SIGINT it ``moment`` seconds later; (seconds to stop, exit code,
    where it landed, files consistent)."""
    with tempfile.TemporaryDirectory(prefix="stop-anytime-") as name:
        folder = Path(name)
        process = subprocess.Popen(
            [sys.executable, *COMMAND, "--out", str(folder / "run.pt"), "--metrics-out",
             str(folder / "run.json")], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        time.sleep(moment)
        process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            _, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        seconds = time.monotonic() - sent
        return seconds, process.returncode, where(err, process.returncode), consistent(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--window", type=float, default=30.0,
                        help="the latest moment of the signal, in seconds after the start")
    parser.add_argument("--bound", type=float, default=10.0,
                        help="seconds from the signal to the end of the process, at most")
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside the run")
    parser.add_argument("--seed", type=int, default=41, help="draws the moments")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    draw = random.Random(args.seed)
    moments = [draw.uniform(0, args.window) for _ in range(args.runs)]
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.hogs)]
    failures, times = 0, []
    try:
        print(f"{args.runs} runs, SIGINT at a moment in [0, {args.window:g}] s, "
              f"{args.hogs} CPU hogs, bound {args.bound:g} s")
        for i, moment in enumerate(moments, start=1):
            seconds, code, landed, files_ok = one_run(moment, env)
            ok = seconds < args.bound and code in (130, -signal.SIGINT) and files_ok
            failures += not ok
            times.append(seconds)
            print(f"{i:2d}. signal at {moment:5.2f} s: stopped {seconds:5.2f} s later, exit "
                  f"{code}, {landed}{'' if files_ok else ', FILES DISAGREE'}"
                  f"{'' if ok else '  <-- FAILED'}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"slowest stop {max(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s; "
          f"{args.runs - failures} of {args.runs} within {args.bound:g} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
