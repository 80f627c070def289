"""Beyond one process (issue 26): data parallelism, and runs that survive interruption.

* ``torchrun --nproc_per_node=2 -m course_attn.train --device cpu`` (gloo) with a global
  batch G takes the same steps as one process with gradient accumulation 2, and as one
  process with batch G: the same losses, the same final weights to float tolerance;
  with dropout on, only close: each process draws its own masks (issue 36);
* a run resumes on another number of processes at the same global batch;
* SIGINT and SIGTERM stop a run at the end of a step with its checkpoint and metrics
  written (exit 130 and 143), and resuming it gives the uninterrupted run's weights;
  a second signal stops the process at once;
* a checkpoint or metrics file that cannot be written gives one clear error naming the
  path and the cause, and the last good checkpoint stays.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

import course_attn.train.outputs as outputs
from course_attn.train import CheckpointWriteError, TrainConfig, load_checkpoint, main, train
from course_attn.train.distributed import World, micro_batch_rows
from course_attn.train.outputs import EXIT_WRITE_FAILED

ROOT = Path(__file__).resolve().parents[1]
COPY = ["--task", "copy", "--n-layers", "1", "--n-heads", "2", "--d-model", "16",
        "--eval-iters", "1", "--device", "cpu", "--quiet"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def run(*args: str, processes: int = 1, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m course_attn.train ARGS``, under torchrun when ``processes`` > 1."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={processes}"] if processes > 1 else [sys.executable])
    result = subprocess.run([*launcher, "-m", "course_attn.train", *args], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_the_processes_slices_are_disjoint_and_cover_the_global_batch():
    for size, accum, batch in ((2, 1, 4), (2, 3, 2), (3, 2, 5)):
        seen = [row for rank in range(size) for k in range(accum)
                for row in range(*micro_batch_rows(World(rank, size), k, batch).indices(10**6))]
        assert sorted(seen) == list(range(size * accum * batch))  # each row once, all rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The same 20 steps, global batch 8: two processes, accumulation 2, and batch 8."""
    folder = tmp_path_factory.mktemp("ddp")
    plan = {"2 processes x 4": (["--batch-size", "4"], 2),
            "1 process x 4 x accumulation 2": (["--batch-size", "4", "--grad-accum", "2"], 1),
            "1 process x 8": (["--batch-size", "8"], 1)}
    out = {}
    for name, (flags, processes) in plan.items():
        ckpt, metrics = folder / f"{processes}-{len(flags)}.pt", folder / f"{len(flags)}.json"
        start = time.perf_counter()
        run(*COPY, *flags, "--max-iters", "20", "--eval-interval", "10", "--out", str(ckpt),
            "--metrics-out", str(metrics), processes=processes)
        print(f"{name}: {time.perf_counter() - start:.1f} s")
        out[name] = (ckpt, json.loads(metrics.read_text()))
    return out


def test_two_processes_take_the_steps_of_accumulation_and_of_one_big_batch(runs):
    (ddp, ddp_m), (accum, accum_m), (big, big_m) = runs.values()
    for metrics in (accum_m, big_m):
        assert metrics["train_loss_history"] == pytest.approx(ddp_m["train_loss_history"],
                                                              abs=1e-5)
    assert largest_difference(weights(ddp), weights(accum)) < 1e-5
    assert largest_difference(weights(ddp), weights(big)) < 1e-5
    # and only one process wrote: one checkpoint, one metrics file, one world size recorded
    assert load_checkpoint(ddp)["meta"]["world_size"] == 2


def test_with_dropout_two_processes_take_other_steps_than_accumulation(tmp_path):
    """The equality above needs dropout 0 (issue 36): each process draws its own dropout
    masks (seeded seed + rank), one process all of its micro-batches' from one stream.
    With dropout on, the rows are the same and the masks are not: the losses differ from
    the first step on, by the noise of dropout, and stay close."""
    losses = {}
    for name, flags, processes in (("2 processes", [], 2),
                                   ("accumulation 2", ["--grad-accum", "2"], 1)):
        metrics = tmp_path / f"{processes}.json"
        run(*COPY, "--batch-size", "4", "--dropout", "0.2", "--max-iters", "10",
            "--eval-interval", "10", "--metrics-out", str(metrics), *flags,
            processes=processes)
        losses[name] = json.loads(metrics.read_text())["train_loss_history"]
    ddp, accum = losses.values()
    gaps = [abs(a - b) / b for a, b in zip(ddp, accum, strict=True)]  # relative, per step
    # other masks, other steps: far beyond the rounding of the equal runs above (< 1e-5)
    assert gaps[0] > 1e-4 and sum(gaps) / len(gaps) > 1e-4
    assert max(gaps) < 0.05  # and the same run in distribution: within dropout's noise


def test_a_run_resumes_on_another_number_of_processes_at_the_same_global_batch(runs, tmp_path):
    full, _ = runs["1 process x 4 x accumulation 2"]  # 20 steps, decaying until step 20
    half = tmp_path / "half.pt"
    run(*COPY, "--batch-size", "4", "--max-iters", "10", "--lr-decay-iters", "20",
        "--eval-interval", "10", "--out", str(half), processes=2)
    # ... the first ten steps on two processes, the last ten on one with accumulation 2
    run(*COPY, "--batch-size", "4", "--grad-accum", "2", "--max-iters", "20",
        "--lr-decay-iters", "20", "--eval-interval", "10", "--resume", str(half),
        "--out", str(half))
    assert largest_difference(weights(half), weights(full)) < 1e-5


# ------------------------------------------------------------------ interruption
def start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    ckpt, metrics = tmp_path / "run.pt", tmp_path / "run.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "course_attn.train", *COPY, "--d-model", "64", "--batch-size",
         "8", "--max-iters", "100000", "--lr-decay-iters", "100000", "--eval-interval", "3",
         "--out", str(ckpt), "--metrics-out", str(metrics), *extra],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ckpt.exists():  # training has started: the first checkpoint is written
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.1)
    return process, ckpt, metrics


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_run_with_its_checkpoint_and_metrics(tmp_path, sig, code):
    process, ckpt, metrics = start(tmp_path)
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    assert process.returncode == code, err
    stopped = load_checkpoint(ckpt)["iter"]
    saved = json.loads(metrics.read_text())
    assert saved["interrupted_at_iter"] == stopped == len(saved["train_loss_history"])
    assert f"training stopped by {sig.name} after iteration {stopped}" in err
    assert "To continue: python -m course_attn.train" in err and "--resume" in err
    if sig != signal.SIGINT:
        return  # the same stop; resuming is checked once, below
    # resuming to a fixed length gives the weights of the run never interrupted
    length = stopped + 2
    flags = [*COPY, "--d-model", "64", "--batch-size", "8", "--max-iters", str(length),
             "--lr-decay-iters", "100000", "--eval-interval", "3"]
    run(*flags, "--resume", str(ckpt), "--out", str(ckpt))
    straight = tmp_path / "straight.pt"
    run(*flags, "--out", str(straight))
    assert largest_difference(weights(ckpt), weights(straight)) == 0.0


def test_a_second_signal_stops_the_process_at_once(tmp_path):
    process, _, _ = start(tmp_path, "--d-model", "256", "--n-layers", "4")
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    assert process.returncode in (-signal.SIGINT, 130)  # killed by it, or already stopping


# ------------------------------------------------------------- failed writes
def test_a_full_disk_names_the_checkpoint_and_keeps_the_last_good_one(tmp_path, monkeypatch):
    path, calls = tmp_path / "ckpt.pt", []
    real_save = torch.save

    def fills_up(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) > 1:  # the first checkpoint fits; the disk is full at the second
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fills_up)
    from course_attn import CopyTask, GPTConfig, MiniGPT
    task = CopyTask(vocab_size=6, half_length=4)
    model = MiniGPT(GPTConfig(vocab_size=6, context_length=task.context_length, n_layers=1,
                              n_heads=2, d_model=16))
    config = TrainConfig(max_iters=6, batch_size=2, eval_interval=2, eval_iters=1,
                         device="cpu", progress=False)
    with pytest.raises(CheckpointWriteError) as info:
        train(model, task, config, checkpoint_path=path)
    message = str(info.value)
    assert f"could not write the checkpoint {str(path)!r} after iteration 4" in message
    assert "No space left on device" in message and "iteration 2 is kept" in message
    assert info.value.checkpoint_iter == 2 and len(info.value.result.train_losses) == 4
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(path)["iter"] == 2  # the last good checkpoint, whole


def test_the_cli_reports_a_write_that_fails_and_keeps_the_metrics(tmp_path, monkeypatch,
                                                                    capsys):
    metrics = tmp_path / "m.json"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(outputs, "write_metrics", read_only)  # every place refuses them
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = main([*COPY, "--batch-size", "2", "--max-iters", "2", "--out",
                 str(tmp_path / "c.pt"), "--metrics-out", str(metrics)])
    err = capsys.readouterr().err
    assert code == EXIT_WRITE_FAILED and "could not be written anywhere" in err
    assert f"{str(metrics)!r} (Read-only file system)" in err and (tmp_path / "c.pt").exists()


def test_metrics_without_room_are_refused_before_training(tmp_path, monkeypatch, capsys):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000))
    with pytest.raises(SystemExit) as info:
        main([*COPY, "--max-iters", "2", "--metrics-out", str(tmp_path / "m.json")])
    assert info.value.code == 2
    assert "--metrics-out" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
