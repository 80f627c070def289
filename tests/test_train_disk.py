"""Chapter 11 trainer when the disk fails it (issue 33): a run loses nothing.

Every file of a run goes through one writer (``outputs.write_atomically``). A disk that
fills up or a folder that turns read-only stops the run with one line on the standard
error and exit code 74 (``EXIT_WRITE_FAILED``), never a traceback; the last good
checkpoint stays whole, and the metrics so far are written where they can be and named.

Real disks where the test can make them: a small tmpfs is a real full disk, and
remounting it read-only a real read-only folder (both need root and mount rights); as a
normal user a ``chmod``-ed folder refuses writes. Where neither is possible the test
skips and says why. Patched writers raise each error everywhere else.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, NamedTuple

import pytest
import torch

import course_attn
import course_attn.train.cli as cli
import course_attn.train.outputs as outputs
from course_attn.data.tasks import CopyTask
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import TrainConfig, load_checkpoint, main, model_from_checkpoint, train
from course_attn.train import sample as sample_cli
from course_attn.train.outputs import EXIT_WRITE_FAILED, save_metrics, write_atomically
from course_attn.train.resume import check_resume

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
TINY = ["--n-layers", "1", "--n-heads", "2", "--d-model", "16", "--context-length", "8",
        "--batch-size", "4", "--eval-interval", "2", "--eval-iters", "2", "--device", "cpu",
        "--warmup-iters", "1", "--quiet", "--samples", "0"]
TEXT = "the cat sat on the mat. the dog sat on the log.\n" * 30
#: A tmpfs this small takes one checkpoint of the TINY model (about 80 kB) but not the
#: second one written beside it: the disk fills at the second checkpoint.
ONE_CHECKPOINT = "120k"


# ------------------------------------------------------------------ real disks
def _mount_tmpfs(folder: Path, size: str) -> None:
    """A tmpfs of ``size`` at ``folder``, or a skip that says why it cannot be made."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs, which only root may mount")
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:  # a container without mount rights
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")


@pytest.fixture()
def small_disk(tmp_path) -> Iterator[Callable[[str], Path]]:
    """``small_disk(size)``: a real disk of ``size`` (a tmpfs), unmounted afterwards."""
    mounted: list[Path] = []

    def make(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        _mount_tmpfs(folder, size)
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


@pytest.fixture()
def read_only(tmp_path) -> Iterator[tuple[Path, Callable[[], None], str]]:
    """A folder, the function that makes it refuse writes, and the error that follows.

    As root: a tmpfs remounted read-only (root ignores permission bits). Otherwise
    ``chmod 0o500``.
    """
    folder = tmp_path / "ro"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        _mount_tmpfs(folder, "4m")

        def lock() -> None:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)

        yield folder, lock, os.strerror(errno.EROFS)
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)
        return
    folder.mkdir()
    yield folder, lambda: folder.chmod(0o500), os.strerror(errno.EACCES)
    folder.chmod(0o700)


def fill(folder: Path, *, log: IO[str] | None = None) -> None:
    """Write into ``folder`` until its disk is full (a real ENOSPC from then on).

    A file's last block may still have room: ``log``'s is filled too.
    """
    with open(folder / "filler", "wb", buffering=0) as handle:
        for chunk in (2**16, 2**12, 1):
            try:
                while True:
                    handle.write(b"\0" * chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC
    if log is not None:
        log.flush()
        try:
            while True:
                os.write(log.fileno(), b"\n")
        except OSError as error:
            assert error.errno == errno.ENOSPC


# -------------------------------------------------------------------- helpers
@pytest.fixture()
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture()
def temp_folder(tmp_path, monkeypatch) -> Path:
    """The system's temporary folder, the metrics' last resort, made this test's own."""
    folder = tmp_path / "system-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def one_line_error(err: str) -> str:
    """The one error line of a run; no traceback around it."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def metrics_named(line: str, tail: str = "") -> dict:
    """The metrics file the error line names after "are in", loaded as strict JSON."""
    path = line.split("are in '", 1)[1].split("'", 1)[0]
    assert path.endswith(".json") and path.endswith(tail)
    return json.loads(Path(path).read_text(encoding="utf-8"))


def after_training(monkeypatch, then: Callable[[], None], *, at: int | None = None) -> None:
    """Run ``then`` inside the CLI's run: after the evaluation of iteration ``at``, or after
    the last iteration when ``at`` is None (the moment the disk fails is staged, the
    failure is real)."""
    real = cli.train

    def staged(*args, **kwargs):
        if at is None:
            result = real(*args, **kwargs)
            then()
            return result

        def hook(iteration, model, result):
            if iteration == at:
                then()

        return real(*args, **kwargs, on_eval=hook)

    monkeypatch.setattr(cli, "train", staged)


# -------------------------------------------------- 1. the disk fills (real)
def test_a_disk_that_fills_at_a_checkpoint_stops_the_run_with_exit_74(tmp_path, corpus,
                                                                      small_disk):
    disk = small_disk(ONE_CHECKPOINT)
    ckpt, metrics = disk / "ckpt.pt", disk / "m.json"
    done = subprocess.run([sys.executable, "-m", "course_attn.train", "--data", str(corpus),
                           *TINY, "--max-iters", "6", "--out", str(ckpt), "--metrics-out",
                           str(metrics)], env=ENV, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == EXIT_WRITE_FAILED, done.stderr
    line = one_line_error(done.stderr)
    assert f"could not write the checkpoint {str(ckpt)!r} after iteration 4" in line
    assert "No space left on device" in line and "iteration 2 is kept there" in line
    assert "--resume" in line  # how to go on once there is room
    assert load_checkpoint(ckpt)["iter"] == 2  # the last good checkpoint, whole
    saved = json.loads(metrics.read_text())  # the tmp file removed, the metrics fit
    assert saved["stopped_at_iter"] == 4 and len(saved["train_loss_history"]) == 4
    assert sorted(p.name for p in disk.iterdir()) == ["ckpt.pt", "m.json"]  # no .tmp


def test_two_processes_stop_together_and_process_0_writes_the_metrics(small_disk):
    """Process 0 cannot write; the other learns it and stops too (it would wait forever in
    the next step's all-reduce), and torchrun's SIGTERM does not cut process 0's writing."""
    disk = small_disk(ONE_CHECKPOINT)
    ckpt, metrics = disk / "ckpt.pt", disk / "m.json"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "course_attn.train", "--task", "copy", "--n-layers", "1", "--n-heads", "2",
         "--d-model", "16", "--eval-iters", "1", "--device", "cpu", "--quiet",
         "--batch-size", "2", "--eval-interval", "2", "--max-iters", "6", "--out", str(ckpt),
         "--metrics-out", str(metrics)], env=ENV, capture_output=True, text=True,
        timeout=300, check=False)
    assert done.returncode != 0
    assert done.stderr.count("could not write the checkpoint") == 1  # process 0 says it
    assert f"exitcode  : {EXIT_WRITE_FAILED}" in done.stderr  # process 0's own exit code
    assert load_checkpoint(ckpt)["iter"] == 2
    assert json.loads(metrics.read_text())["stopped_at_iter"] == 4


def test_a_full_disk_is_refused_before_training(corpus, small_disk, capsys, monkeypatch):
    disk = small_disk("64k")
    fill(disk)
    monkeypatch.setattr(cli, "train", lambda *a, **k: pytest.fail("training started"))
    with pytest.raises(SystemExit) as info:
        main(["--data", str(corpus), *TINY, "--out", str(disk / "c.pt")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--out {str(disk / 'c.pt')!r}: the disk of" in err
    assert "0 bytes free, fewer than the" in err


def test_metrics_out_alone_on_a_disk_that_fills_go_to_the_temporary_folder(
        corpus, small_disk, temp_folder, monkeypatch, capsys):
    disk = small_disk("256k")
    metrics = disk / "m.json"
    after_training(monkeypatch, lambda: fill(disk))
    code = main(["--data", str(corpus), *TINY, "--max-iters", "4", "--metrics-out",
                 str(metrics)])
    assert code == EXIT_WRITE_FAILED
    line = one_line_error(capsys.readouterr().err)
    assert f"could not be written to {str(metrics)!r} (No space left on device)" in line
    assert "No checkpoint was asked for (--out)" in line and "is written" not in line
    saved = metrics_named(line)
    assert str(temp_folder) in line and len(saved["train_loss_history"]) == 4
    assert not metrics.exists()


def test_a_full_standard_output_is_an_error_after_the_files_are_written(
        tmp_path, corpus, small_disk, monkeypatch, capsys):
    disk = small_disk("64k")
    ckpt, metrics = tmp_path / "c.pt", tmp_path / "m.json"
    with open(disk / "log.txt", "w", encoding="utf-8") as log:  # python -m ... > log.txt
        monkeypatch.setattr(sys, "stdout", log)
        after_training(monkeypatch, lambda: fill(disk, log=log))
        code = main(["--data", str(corpus), *TINY, "--max-iters", "2", "--samples", "50",
                     "--out", str(ckpt), "--metrics-out", str(metrics)])
    assert code == EXIT_WRITE_FAILED
    line = one_line_error(capsys.readouterr().err)
    assert "could not write to the standard output after training" in line
    assert "No space left on device" in line
    assert load_checkpoint(ckpt)["iter"] == 2 and json.loads(metrics.read_text())["n_params"]


def test_a_full_standard_output_before_training_is_exit_74_without_a_traceback(corpus,
                                                                               small_disk):
    disk = small_disk("64k")
    fill(disk)
    with open(disk / "log.txt", "w", encoding="utf-8") as log:  # python -m ... > log.txt
        done = subprocess.run([sys.executable, "-m", "course_attn.train", "--data",
                               str(corpus), *TINY, "--max-iters", "2"], env=ENV, stdout=log,
                              stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    assert done.returncode == EXIT_WRITE_FAILED, done.stderr  # not 120: nothing left to flush
    line = one_line_error(done.stderr)
    assert "could not write to the standard output before training" in line
    assert "Exception ignored" not in done.stderr


def test_write_atomically_on_a_full_disk_keeps_the_old_file(small_disk):
    disk = small_disk(ONE_CHECKPOINT)
    target = disk / "w.pt"
    write_atomically(target, lambda handle: torch.save({"w": torch.zeros(10)}, handle))
    before = target.read_bytes()
    with pytest.raises(OSError) as info:  # torch.save's own RuntimeError, made an OSError
        write_atomically(target, lambda handle: torch.save({"w": torch.zeros(10**6)}, handle))
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert target.read_bytes() == before and sorted(os.listdir(disk)) == ["w.pt"]


# ------------------------------------------ 2. the folder turns read-only (real)
def test_out_alone_in_a_folder_turned_read_only_keeps_checkpoint_and_metrics(
        corpus, read_only, temp_folder, monkeypatch, capsys):
    folder, lock, why = read_only
    ckpt = folder / "ckpt.pt"
    after_training(monkeypatch, lock, at=2)  # after the checkpoint of iteration 2
    code = main(["--data", str(corpus), *TINY, "--max-iters", "6", "--out", str(ckpt)])
    assert code == EXIT_WRITE_FAILED
    line = one_line_error(capsys.readouterr().err)
    assert f"could not write the checkpoint {str(ckpt)!r} after iteration 4: {why}" in line
    assert "iteration 2 is kept there" in line
    saved = metrics_named(line)  # not next to the checkpoint: in the temporary folder
    assert str(temp_folder) in line and f"{str(folder)!r} ({why})" in line
    assert saved["stopped_at_iter"] == 4
    assert load_checkpoint(ckpt)["iter"] == 2


def test_metrics_out_in_a_folder_turned_read_only(tmp_path, corpus, read_only, temp_folder,
                                                  monkeypatch, capsys):
    folder, lock, why = read_only
    ckpt, metrics = tmp_path / "c.pt", folder / "m.json"
    after_training(monkeypatch, lock)
    code = main(["--data", str(corpus), *TINY, "--max-iters", "2", "--out", str(ckpt),
                 "--metrics-out", str(metrics)])
    assert code == EXIT_WRITE_FAILED
    line = one_line_error(capsys.readouterr().err)
    assert f"could not be written to {str(metrics)!r} ({why})" in line
    assert f"The final checkpoint is in {str(ckpt)!r}" in line
    assert len(metrics_named(line)["train_loss_history"]) == 2
    assert load_checkpoint(ckpt)["iter"] == 2


def test_a_checkpoint_path_that_becomes_a_folder_stops_with_74_and_the_metrics(
        tmp_path, corpus, monkeypatch, capsys):
    """The path of --out turned into a folder during the run (issue 41): a write that
    fails (exit 74, the metrics written, one line), not a mistake of the command line
    (exit 2, the metrics lost), and no claim that a checkpoint is kept there."""
    ckpt, metrics = tmp_path / "c.pt", tmp_path / "m.json"

    def into_a_folder() -> None:
        ckpt.unlink()
        ckpt.mkdir()

    after_training(monkeypatch, into_a_folder, at=2)  # after the checkpoint of iteration 2
    code = main(["--data", str(corpus), *TINY, "--max-iters", "6", "--out", str(ckpt),
                 "--metrics-out", str(metrics)])
    assert code == EXIT_WRITE_FAILED
    line = one_line_error(capsys.readouterr().err)
    assert (f"could not write the checkpoint {str(ckpt)!r} after iteration 4: Is a directory; "
            "the path is a folder now: no checkpoint of this run is there") in line
    assert "Move the folder at --out away" in line and "then start again" in line
    assert "--resume" not in line  # nothing to resume from there
    assert json.loads(metrics.read_text())["stopped_at_iter"] == 4
    assert ckpt.is_dir() and list(ckpt.iterdir()) == []  # the folder left as it was


# ------------------------------------- 2b. a read-only folder as a non-root user (real)
class NonRoot(NamedTuple):
    """How to run a command as a user that permission bits bind, and a folder of its own."""

    prefix: list[str]  # the words before the command: setpriv as nobody, or none
    owner: tuple[int, int] | None  # (uid, gid) to give the folders to, or None
    folder: Path

    def own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner)


@pytest.fixture()
def non_root() -> Iterator[NonRoot]:
    """As root (which ignores permission bits) commands run as ``nobody`` through util-linux's
    ``setpriv``; as another user, as that user. Skipped, saying why, where there is no
    ``nobody`` or ``setpriv``, or ``nobody`` cannot run the interpreter and read the package
    and torch (a home folder closed to others)."""
    if not hasattr(os, "geteuid"):
        pytest.skip("no POSIX users here")
    prefix: list[str] = []
    owner = None
    if os.geteuid() == 0:
        import pwd  # POSIX only, as geteuid

        try:
            nobody = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("running as root, and there is no user 'nobody' to run as")
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, and util-linux's setpriv is missing to run as nobody")
        owner = (nobody.pw_uid, nobody.pw_gid)
        prefix = ["setpriv", f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups"]
    folder = Path(tempfile.mkdtemp(prefix="course_attn-non-root-"))  # pytest's is root's only
    try:
        user = NonRoot(prefix, owner, folder)
        (folder / "tmp").mkdir()
        for path in (folder, folder / "tmp"):
            user.own(path)
        readable = [course_attn.__file__, torch.__file__, str(folder)]
        probe = subprocess.run([*prefix, sys.executable, "-I", "-c", "import os, sys; sys.exit("
                                f"0 if all(os.access(p, os.R_OK) for p in {readable!r}) "
                                "else 3)"], capture_output=True, text=True, timeout=60,
                               check=False)
        if probe.returncode != 0:
            pytest.skip(f"{'nobody' if owner else 'this user'} cannot run {sys.executable} or "
                        f"read the package and torch here: {probe.stderr.strip()[-200:]}")
        yield user
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def non_root_run(user: NonRoot, *args: str) -> list[str]:
    """The command ``python ARGS`` as the fixture's user."""
    return [*user.prefix, sys.executable, *args]


def non_root_env(user: NonRoot) -> dict[str, str]:
    """The environment of a run as that user: its temporary folder and home are its own."""
    return {**ENV, "TMPDIR": str(user.folder / "tmp"), "HOME": str(user.folder),
            "PYTHONDONTWRITEBYTECODE": "1"}


def test_as_a_non_root_user_a_read_only_folder_is_refused_before_training(corpus, non_root):
    folder = non_root.folder / "ro"
    folder.mkdir()
    non_root.own(folder)
    folder.chmod(0o500)
    shutil.copy(corpus, non_root.folder / "corpus.txt")
    done = subprocess.run(non_root_run(non_root, "-m", "course_attn.train", "--data",
                                       str(non_root.folder / "corpus.txt"), *TINY,
                                       "--max-iters", "2", "--out", str(folder / "c.pt")),
                          env=non_root_env(non_root), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    assert f"cannot create a file in {str(folder)!r} (Permission denied)" in done.stderr
    assert "Traceback" not in done.stderr and not list(folder.iterdir())


def test_as_a_non_root_user_a_folder_turned_read_only_keeps_checkpoint_and_metrics(
        corpus, non_root):
    """The chmod case of the read_only fixture, which root never runs: the folder of the
    checkpoint and the metrics refuses writes after the checkpoint of iteration 2."""
    folder = non_root.folder
    shutil.copy(corpus, folder / "corpus.txt")
    ckpt, metrics = folder / "c.pt", folder / "m.json"
    process = subprocess.Popen(
        non_root_run(non_root, str(ROOT / "tests" / "staged_train.py"), "a checkpoint write",
                     "--data", str(folder / "corpus.txt"), *TINY, "--max-iters", "6",
                     "--out", str(ckpt), "--metrics-out", str(metrics)),
        env={**non_root_env(non_root), "STAGED_CALL": "2"}, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    announced = process.stderr.readline()  # the second checkpoint, about to be written
    assert announced == "stage: a checkpoint write\n", announced + process.stderr.read()
    folder.chmod(0o500)  # the folder turns read-only under the running process
    try:
        err = process.communicate(timeout=300)[1]
    finally:
        folder.chmod(0o755)
    assert process.returncode == EXIT_WRITE_FAILED, err
    line = one_line_error(err)
    assert (f"could not write the checkpoint {str(ckpt)!r} after iteration 4: Permission "
            "denied; the checkpoint of iteration 2 is kept there") in line
    saved = metrics_named(line)  # neither there nor beside it: in the temporary folder
    assert str(folder / "tmp") in line and saved["stopped_at_iter"] == 4
    assert load_checkpoint(ckpt)["iter"] == 2


# ------------------------------------------------ 3. patched writers, anywhere
def raises(code: int) -> Callable[[], None]:
    """A writer's failure: ``OSError(code)`` (``PermissionError`` for ``EACCES``)."""
    def fail() -> None:
        raise OSError(code, os.strerror(code))
    return fail


def torch_save_fails(code: int) -> Callable[[], None]:
    """What torch.save does when a write fails: a RuntimeError, the OSError its context."""
    def fail() -> None:
        try:
            raise OSError(code, os.strerror(code))
        except OSError:
            raise RuntimeError(  # noqa: B904  (torch's own: the OSError only as context)
                "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    return fail


def bare_runtime_error() -> None:
    raise RuntimeError("file write failed")


#: Each way a write fails: the failure, and the words the error line gives for it.
FAILURES: dict[str, tuple[Callable[[], None], str]] = {
    "ENOSPC": (raises(errno.ENOSPC), os.strerror(errno.ENOSPC)),
    "EROFS": (raises(errno.EROFS), os.strerror(errno.EROFS)),
    "EACCES": (raises(errno.EACCES), os.strerror(errno.EACCES)),
    "RuntimeError of torch.save": (torch_save_fails(errno.ENOSPC), os.strerror(errno.ENOSPC)),
    "RuntimeError alone": (bare_runtime_error, "RuntimeError: file write failed"),
}


@pytest.mark.parametrize("kind", FAILURES)
def test_each_error_of_the_checkpoint_writer_is_one_line_and_exit_74(
        kind, tmp_path, corpus, monkeypatch, capsys):
    fail, why = FAILURES[kind]
    real_save, calls = torch.save, []

    def second_fails(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) > 1:  # the first checkpoint is written; the second one fails
            f.write(b"half a checkpoint")
            fail()
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", second_fails)
    ckpt, metrics = tmp_path / "c.pt", tmp_path / "m.json"
    code = main(["--data", str(corpus), *TINY, "--max-iters", "6", "--out", str(ckpt),
                 "--metrics-out", str(metrics)])
    monkeypatch.setattr(torch, "save", real_save)
    assert code == EXIT_WRITE_FAILED
    line = one_line_error(capsys.readouterr().err)
    assert f"after iteration 4: {why}; the checkpoint of iteration 2 is kept there" in line
    assert load_checkpoint(ckpt)["iter"] == 2
    assert json.loads(metrics.read_text())["stopped_at_iter"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "corpus.txt", "m.json"]


@pytest.mark.parametrize("kind", ["ENOSPC", "EROFS", "EACCES"])
def test_each_error_of_the_metrics_writer_sends_them_elsewhere(kind, tmp_path, corpus,
                                                               temp_folder, monkeypatch,
                                                               capsys):
    fail, why = FAILURES[kind]
    metrics = tmp_path / "m.json"
    real_write = outputs.write_metrics

    def refuses_the_asked_path(path, data):
        if Path(path) == metrics:
            fail()
        real_write(path, data)

    monkeypatch.setattr(outputs, "write_metrics", refuses_the_asked_path)
    code = main(["--data", str(corpus), *TINY, "--max-iters", "2", "--metrics-out",
                 str(metrics)])
    assert code == EXIT_WRITE_FAILED
    line = one_line_error(capsys.readouterr().err)
    assert f"could not be written to {str(metrics)!r} ({why})" in line
    saved = metrics_named(line)  # next to it, in the same folder: a new file
    assert f"'{tmp_path}{os.sep}m.metrics-" in line and saved["timed_iters"] >= 1


def test_metrics_that_fit_nowhere_are_named_in_the_error(tmp_path, corpus, temp_folder,
                                                         monkeypatch, capsys):
    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs, "write_metrics", full)
    metrics = tmp_path / "m.json"
    code = main(["--data", str(corpus), *TINY, "--max-iters", "2", "--metrics-out",
                 str(metrics)])
    assert code == EXIT_WRITE_FAILED
    line = one_line_error(capsys.readouterr().err)
    assert "could not be written anywhere" in line and str(temp_folder) in line
    assert sorted(os.listdir(temp_folder)) == [] and not metrics.exists()  # nothing left


def test_save_metrics_never_replaces_a_file_next_to_the_path(tmp_path, temp_folder):
    # the asked path is a folder now: the metrics go beside it, as a new file
    (tmp_path / "m.json").mkdir()
    other = tmp_path / "m.metrics.json"
    other.write_text("my notes")
    written, failures = save_metrics({"a": 1}, path=tmp_path / "m.json")
    assert written is not None and written.parent == tmp_path and written != other
    assert json.loads(written.read_text()) == {"a": 1} and other.read_text() == "my notes"
    assert len(failures) == 1 and str(tmp_path / "m.json") in failures[0]


# ------------------------------------------- 4. checkpoints whose parts disagree
def tiny_checkpoint(tmp_path) -> Path:
    task = CopyTask(vocab_size=6, half_length=4)
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=6, context_length=task.context_length, n_layers=1,
                              n_heads=2, d_model=16))
    path = tmp_path / "ckpt.pt"
    train(model, task, TrainConfig(max_iters=2, batch_size=4, eval_interval=2, eval_iters=1,
                                   device="cpu", progress=False), checkpoint_path=path,
          meta={"tokenizer_chars": "abcdef"})
    return path


def rewritten(path: Path, name: str, change: Callable[[dict], None]) -> Path:
    checkpoint = torch.load(path, weights_only=True)
    change(checkpoint)
    other = path.with_name(name)
    torch.save(checkpoint, other)
    return other


@pytest.mark.parametrize(("name", "change", "said"), [
    ("key.pt", lambda c: c["model_config"].update(widht=3),
     "its model_config is not a GPTConfig (keys GPTConfig does not know: 'widht')"),
    ("weight.pt", lambda c: c["model"].pop("embed.weight"),
     "does not hold the weights of the model its model_config describes (missing: "),
    ("shape.pt", lambda c: c["model"].update({"embed.weight": torch.zeros(7, 16)}),
     "other shapes: 'embed.weight (7, 16) instead of (6, 16)'"),
    ("chars.pt", lambda c: c["meta"].update(tokenizer_chars="abc"),
     "its tokenizer (meta['tokenizer_chars']) holds 3 characters, but its model's "
     "vocabulary has 6 tokens"),
])
def test_load_checkpoint_refuses_parts_that_disagree_naming_the_file(name, change, said,
                                                                    tmp_path):
    path = rewritten(tiny_checkpoint(tmp_path), name, change)
    for load in (load_checkpoint, model_from_checkpoint):
        with pytest.raises(ValueError) as info:
            load(path)
        assert repr(str(path)) in str(info.value) and said in str(info.value)


def test_sample_refuses_characters_that_are_not_the_vocabulary(tmp_path, capsys):
    path = rewritten(tiny_checkpoint(tmp_path), "chars.pt",
                     lambda c: c["meta"].update(tokenizer_chars="abcdefghij"))
    with pytest.raises(SystemExit) as info:  # at load, before any generation
        sample_cli.main(["--checkpoint", str(path), "--prompt", "a"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--checkpoint: {str(path)!r}: its tokenizer" in err and "holds 10 characters" in err
    assert "Traceback" not in err


def test_resume_says_a_global_batch_cannot_be_split_over_the_processes(tmp_path):
    path = tiny_checkpoint(tmp_path)
    checkpoint = load_checkpoint(path)
    stored = checkpoint["train_config"]
    with pytest.raises(ValueError, match="4 rows cannot be split over 3 processes"):
        check_resume(checkpoint, checkpoint["model_config"], {**stored, "batch_size": 1},
                     checkpoint["meta"], world_size=3)
    with pytest.raises(ValueError) as info:  # 4 rows do split over 2: no such remark
        check_resume(checkpoint, checkpoint["model_config"], {**stored, "batch_size": 1},
                     checkpoint["meta"], world_size=2)
    assert "cannot be split" not in str(info.value) and "1 x 1 x 2 = 2 now" in str(info.value)
