"""Stopped when asked, at any moment (issue 41): SIGINT or SIGTERM at every stage of a run.

``python -m course_attn.train`` owns the two signals from the first line of its ``main``
to its last write (``course_attn.train.stopping``). Whenever one comes, the command
stops as soon as the work in hand allows, within :data:`BOUND` seconds here: before
training at once, with nothing written; during training after the step, evaluation or
checkpoint in hand, with the checkpoint, the metrics and the command to resume; after
training at once, its files written. Exit code 128 + the signal, one line on the
standard error, never a traceback.

Each stage is staged by ``tests/staged_train.py`` (the work there made slow, the moment
announced); the signal and the process are real. Each runs once quiet with SIGINT and
once under a CPU hog (one busy process per CPU, as on a shared machine) with SIGTERM.
The bound is the behaviour under test: a signal that is lost (issue 41: one sent after
the model line was ignored until the last of 200,000 iterations) runs into it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from course_attn.train import load_checkpoint
from course_attn.train.stopping import SignalOwner, StopRequested, signals_recorded

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
#: Seconds from the signal to the end of the process. A stop takes a step, an evaluation
#: or a write of this tiny model (milliseconds; the staged work adds one second).
BOUND = 10.0
TINY = ["--n-layers", "1", "--n-heads", "2", "--d-model", "16", "--batch-size", "2",
        "--eval-interval", "3", "--eval-iters", "1", "--device", "cpu", "--quiet"]
TEXT = "the cat sat on the mat. the dog sat on the log.\n" * 30
#: The signal of each way a test runs: quiet, or beside a CPU hog.
WAYS = {"quiet": signal.SIGINT, "under a CPU hog": signal.SIGTERM}


@pytest.fixture(params=list(WAYS))
def way(request) -> Iterator[signal.Signals]:
    """The signal to send; with "under a CPU hog", busy processes run beside the test."""
    hogs = []
    if request.param == "under a CPU hog":
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
                for _ in range(min(os.cpu_count() or 2, 4))]
    yield WAYS[request.param]
    for hog in hogs:
        hog.kill()
        hog.wait()


def stopped(stage: str, sig: signal.Signals, *args: str, launcher: tuple[str, ...] = (),
            announcements: int = 1) -> tuple[subprocess.CompletedProcess, float]:
    """Run the CLI with ``stage`` staged, send ``sig`` once it is reached; the finished
    process (stderr without the stage lines) and the seconds it took to end after the signal.

    ``announcements``: how many processes must reach the stage first (under torchrun).
    """
    process = subprocess.Popen([sys.executable, *launcher, str(ROOT / "tests" / "staged_train.py"),
                                stage, *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    assert process.stderr is not None
    for line in process.stderr:  # blocks until the stage is reached, or the process ends
        lines.append(line)
        if sum(line.startswith("stage: ") for line in lines) == announcements:
            break
    assert sum(line.startswith("stage: ") for line in lines) == announcements, "".join(lines)
    done, seconds = signalled(process, sig)
    err = "".join(line for line in [*lines, done.stderr] if not line.startswith("stage: "))
    return subprocess.CompletedProcess(process.args, done.returncode, done.stdout, err), seconds


def signalled(process: subprocess.Popen, sig: signal.Signals
              ) -> tuple[subprocess.CompletedProcess, float]:
    """Send ``sig``; the process once ended, and the seconds it took. A lost signal would
    let the run go on: it is killed (its session, torchrun's workers too) well after the
    bound."""
    process.send_signal(sig)
    start = time.monotonic()
    try:
        out, err = process.communicate(timeout=3 * BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    seconds = time.monotonic() - start
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), seconds


def one_line(done: subprocess.CompletedProcess, sig: signal.Signals, seconds: float) -> str:
    """The run ended within the bound with 128 + the signal and one line; that line."""
    assert seconds < BOUND, f"{seconds:.1f} s after {sig.name}:\n{done.stderr[-2000:]}"
    assert done.returncode == 128 + sig, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("python -m course_attn.train: "), lines
    return lines[0]


@pytest.fixture()
def files(tmp_path) -> dict[str, Path]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    return {"folder": tmp_path, "corpus": corpus, "out": tmp_path / "run.pt",
            "metrics": tmp_path / "run.json"}


def outputs(files: dict[str, Path], max_iters: int, *extra: str,
            data: tuple[str, ...] = ()) -> list[str]:
    """The flags of a run on the test's text (or ``data``) that writes both files."""
    data = data or ("--data", str(files["corpus"]), "--context-length", "8")
    return [*data, *TINY, "--max-iters", str(max_iters), "--out", str(files["out"]),
            "--metrics-out", str(files["metrics"]), *extra]


def interrupted_at(files: dict[str, Path], line: str, sig: signal.Signals) -> int:
    """The iteration the run stopped after: its checkpoint's, its metrics', its message's."""
    iteration = load_checkpoint(files["out"])["iter"]
    metrics = json.loads(files["metrics"].read_text())
    assert metrics["interrupted_at_iter"] == iteration == len(metrics["train_loss_history"])
    assert f"training stopped by {sig.name} after iteration {iteration} of" in line
    assert "To continue: python -m course_attn.train --data" in line and "--resume" in line
    return iteration


# ------------------------------------------------------------ the owner itself
def signal_self(sig: signal.Signals, record: list[int]) -> None:
    """Send ``sig`` to this process and wait for its Python handler to record it."""
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + 5
    while not record and time.monotonic() < deadline:
        time.sleep(0.001)  # the handler runs in the main thread, between bytecodes


def test_a_loop_that_starts_after_the_signal_still_sees_it():
    before = signal.getsignal(signal.SIGTERM)
    with SignalOwner() as owner:
        signal_self(signal.SIGTERM, owner.received)
        loop: list[int] = []
        with signals_recorded(loop):  # as train()'s loop does, after the signal
            assert loop == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # a second one kills
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def test_at_once_stops_the_work_in_hand_and_deferred_waits_for_its_block():
    with SignalOwner() as owner:
        with pytest.raises(StopRequested) as info, owner.at_once("before training"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # cut short by the signal
        assert str(info.value) == "stopped by SIGINT before training"
        assert info.value.signum == signal.SIGINT
    with SignalOwner() as owner, pytest.raises(StopRequested):
        with owner.at_once("before training"):
            with owner.deferred():
                signal_self(signal.SIGINT, owner.received)
                finished = True  # the deferred block runs to its end
            pytest.fail("the signal should stop the command after the deferred block")
    assert finished


# ------------------------------------------------------------ before training
def catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (Linux: /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_signal_while_python_still_imports_torch_stops_at_once(files, way):
    """Before main's first line: the package's first import owns the signals
    (course_attn/_early_stop.py), before torch is imported. Python's own KeyboardInterrupt
    there printed a traceback, and code inside the import could swallow it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "course_attn.train", *outputs(files, 100_000)], cwd=ROOT,
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    deadline = time.monotonic() + 60
    while (process.poll() is None and not catches_sigterm(process.pid)
           and time.monotonic() < deadline):
        time.sleep(0.001)  # once the handler is in place, torch comes next
    done, seconds = signalled(process, way)
    line = one_line(done, way, seconds)
    assert line.endswith(f"stopped by {way.name} before training; nothing was written.")
    assert done.stdout == ""
    assert sorted(p.name for p in files["folder"].iterdir()) == ["corpus.txt"]


def test_a_signal_while_the_data_loads_stops_at_once_with_nothing_written(files, way):
    done, seconds = stopped("loading the data", way, *outputs(files, 100_000))
    line = one_line(done, way, seconds)
    assert line.endswith(f"stopped by {way.name} before training; nothing was written.")
    assert sorted(p.name for p in files["folder"].iterdir()) == ["corpus.txt"]  # no probe
    assert done.stdout == ""  # not even the model line


def test_a_signal_after_the_model_line_is_not_lost(files, way):
    """The issue's case: after the model line, before the loop, the signal was recorded
    where the loop never looked, and the run went on to its last iteration. Now train()
    finds it as it sets up (nothing written yet) and stops at once."""
    done, seconds = stopped("after the model line", way, *outputs(files, 100_000))
    line = one_line(done, way, seconds)
    assert done.stdout.startswith("MiniGPT: ")
    assert line.endswith(f"stopped by {way.name} before training; nothing was written.")
    assert sorted(p.name for p in files["folder"].iterdir()) == ["corpus.txt"]


# ------------------------------------------------------------ during training
def test_a_signal_during_the_first_evaluation_stops_after_it(files, way):
    done, seconds = stopped("the first evaluation", way, *outputs(files, 100_000))
    line = one_line(done, way, seconds)
    assert interrupted_at(files, line, way) == 3  # the evaluation's own checkpoint
    assert json.loads(files["metrics"].read_text())["eval_iters"] == [3]


def test_a_signal_during_a_checkpoint_write_stops_after_it(files, way):
    done, seconds = stopped("a checkpoint write", way, *outputs(files, 100_000))
    line = one_line(done, way, seconds)
    assert interrupted_at(files, line, way) == 3  # the checkpoint being written, whole
    assert sorted(p.name for p in files["folder"].iterdir()) == [
        "corpus.txt", "run.json", "run.pt"]  # no .tmp file left


# ------------------------------------------------------------- after training
def test_a_signal_during_the_metrics_write_stops_after_it(files, way):
    done, seconds = stopped("the metrics write", way, *outputs(files, 4))
    line = one_line(done, way, seconds)
    assert f"stopped by {way.name} after training. The metrics so far are in" in line
    assert len(json.loads(files["metrics"].read_text())["train_loss_history"]) == 4
    assert load_checkpoint(files["out"])["iter"] == 4
    assert "sample:" not in done.stdout  # no sample once asked to stop


def test_a_signal_after_the_last_iteration_stops_the_sample_at_once(files, way):
    done, seconds = stopped("after the last iteration", way,
                            *outputs(files, 4, "--samples", "100000"))
    line = one_line(done, way, seconds)
    assert line.endswith(f"stopped by {way.name} after training; its files are written.")
    assert len(json.loads(files["metrics"].read_text())["train_loss_history"]) == 4
    assert load_checkpoint(files["out"])["iter"] == 4
    assert done.stdout.startswith("MiniGPT: ") and "final loss: train" in done.stdout


# ------------------------------------------------------------------ torchrun
def test_under_torchrun_a_signal_before_the_loop_stops_every_process_after_one_step(files):
    """torchrun passes the signal to each process; before the loop none stops alone (the
    others would wait for it in the step's all-reduce): all stop after the first step, and
    the command to resume is torchrun's."""
    done, _ = stopped("after the model line", signal.SIGINT,
                      *outputs(files, 100_000, data=("--task", "copy")),
                      launcher=("-m", "torch.distributed.run", "--standalone",
                                "--nproc_per_node=2"), announcements=2)
    assert "forcefully exiting" not in done.stderr  # no process had to be killed
    assert done.stderr.count("training stopped by SIGINT after iteration 1 of") == 1
    assert "To continue: torchrun --nproc_per_node=2 -m course_attn.train --task copy" in (
        done.stderr)
    assert load_checkpoint(files["out"])["iter"] == 1
    assert json.loads(files["metrics"].read_text())["interrupted_at_iter"] == 1
