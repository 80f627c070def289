"""Chapter 11: SIGINT and SIGTERM, owned in one place for a whole training command.

Ctrl-C, a closed terminal or a scheduler (SLURM, Kubernetes, a CI runner's cancel)
asks a run to stop with SIGINT or SIGTERM, often once, then kills it after a grace
period. So a signal must never be lost, whenever it comes, and the run must stop as
soon as the work in hand allows:

* while nothing is worth saving (the command reads its data and builds its model,
  :func:`~course_attn.train.train` sets up, or the command samples after its files are
  written), at once: :meth:`SignalOwner.at_once` (:func:`stop_at_once`) turns the signal
  into :class:`StopRequested`, raised where the program is;
* while training, at the end of the step, evaluation or checkpoint in hand: the signal
  is recorded, and the loop (:func:`~course_attn.train.train`) reads the record.

:class:`SignalOwner` installs one handler for the whole command (``python -m
course_attn.train``'s ``main``, from its first line to its last write; before it, while
Python imports torch, :mod:`course_attn._early_stop` stands in for it). The loop asks
for the record with :func:`signals_recorded`: under an owner it listens to the owner's
record, signals that came before the loop started included; alone (``train()`` called
from a notebook) it owns the signals for the time of the loop. A second signal takes
its default course at once: the process stops, whatever it is doing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

from .._early_stop import RECEIVED as early_signals

__all__ = ["SignalOwner", "StopRequested", "signals_recorded", "stop_at_once"]

#: The signals that ask a run to stop.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: What a command is doing when a signal stops it at once: the ``when`` of
#: :class:`StopRequested` before the first training step, and after the files are written.
BEFORE_TRAINING = "before training; nothing was written"
AFTER_TRAINING = "after training; its files are written"


class StopRequested(BaseException):
    """A stop signal came while nothing was worth saving: stop at once.

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that no ``except Exception``
    on the way swallows it. ``signum`` is the signal, ``when`` says what the command
    was doing (``"before training"``).
    """

    def __init__(self, signum: int, when: str) -> None:
        self.signum, self.when = signum, when
        super().__init__(f"stopped by {self.name} {when}")

    @property
    def name(self) -> str:
        """The signal's name, such as ``"SIGINT"``."""
        return signal.Signals(self.signum).name


#: The owners in force, innermost last. Signal handlers belong to the whole process, so
#: who owns them is the process's too: a loop started under a command's owner must find
#: it even after its first signal, when the handlers are the default ones again.
_OWNERS: list[SignalOwner] = []


class SignalOwner:
    """The one handler of SIGINT and SIGTERM while a command runs (a context manager).

    ``received`` lists the signals that came (the first one decides). Outside
    :meth:`at_once` a signal is only recorded, for the work in hand to finish; inside,
    it raises :class:`StopRequested` at once. Either way the next signal takes its
    default course: the process stops. On leaving, the handlers before are put back.
    Only the main thread may set handlers: in another thread the owner records nothing.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._listeners: list[list[int]] = []
        self._when: str | None = None  # inside at_once: what is being done
        self._before: dict[int, Any] = {}  # the handlers to put back (main thread only)

    def __enter__(self) -> SignalOwner:
        self.received.extend(early_signals)  # while the command was still importing torch
        if threading.current_thread() is threading.main_thread():
            self._before = {kind: signal.getsignal(kind) for kind in STOP_SIGNALS}
            for kind in STOP_SIGNALS:
                signal.signal(kind, self._handle)
            _OWNERS.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._before:
            _OWNERS.remove(self)
        for number, handler in self._before.items():
            signal.signal(number, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        for listener in self._listeners:
            listener.append(signum)
        for kind in STOP_SIGNALS:  # the next signal takes its default course: the process stops
            signal.signal(kind, signal.SIG_DFL)
        if self._when is not None:
            raise StopRequested(signum, self._when)

    @contextlib.contextmanager
    def at_once(self, when: str) -> Iterator[None]:
        """Within the block a signal raises :class:`StopRequested` (``when``: what is being
        done); one that came before the block raises it on entry."""
        self.stop_if_received(when)
        outer, self._when = self._when, when
        try:
            yield
        finally:
            self._when = outer

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Within an :meth:`at_once` block: a signal waits for the end of this block
        (a file created and removed in it is never left behind), then raises."""
        outer, self._when = self._when, None
        try:
            yield
        finally:
            self._when = outer
        if outer is not None:
            self.stop_if_received(outer)

    def stop_if_received(self, when: str) -> None:
        """Raise :class:`StopRequested` if a signal has come."""
        if self.received:
            raise StopRequested(self.received[0], when)

    @contextlib.contextmanager
    def listened(self, record: list[int]) -> Iterator[None]:
        """Append to ``record`` the signals received so far and those that come in the block."""
        record.extend(self.received)
        self._listeners.append(record)
        try:
            yield
        finally:
            self._listeners.remove(record)


@contextlib.contextmanager
def stop_at_once(when: str) -> Iterator[None]:
    """Under a :class:`SignalOwner`, its :meth:`~SignalOwner.at_once`: a signal in the block
    raises :class:`StopRequested`. Alone, nothing: a signal takes its usual course."""
    if not _OWNERS:
        yield
        return
    with _OWNERS[-1].at_once(when):
        yield


@contextlib.contextmanager
def signals_recorded(stop: list[int]) -> Iterator[None]:
    """Record SIGINT or SIGTERM in ``stop`` instead of dying; a second one kills at once.

    Under a :class:`SignalOwner` (the command line's), ``stop`` listens to its record,
    so a signal that came before the block is in ``stop`` from the start. Alone, the
    block owns the signals while it runs.
    """
    if _OWNERS:
        with _OWNERS[-1].listened(stop):
            yield
        return
    with SignalOwner() as owner, owner.listened(stop):
        yield
