"""The one runner every check of ``course_attn.check`` is a table for (Chapters 1-11).

A check is a :class:`Check`: the package's reference, a tuple of :class:`Case` (inputs, the
words that describe them, a tolerance, a hint and the section it cites, and the harness
that calls the code: plainly, for its gradients, as a layer), the known mistakes (each a
wrong implementation with its hint) and the properties a failing output can be told about.
For every case the runner builds the inputs once, computes the expected value from a
private copy before the learner's code runs, calls the learner's code on another copy,
and compares the result and the inputs afterwards (a function must not change its
arguments). At the first case that fails it picks the hint: a known mistake only where its
output differs from the expected one and matches the learner's at the tolerance a pass
uses, and that gives the reference's value on every case passed before (with a changed
argument named after it, where there is one); then a changed argument; then a failing
property; then the case's own hint.
"""

from __future__ import annotations

import copy
import inspect
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .report import CheckResult, Failure, section
from .values import (
    EXACT,
    FLOAT32,
    TIGHT,
    Difference,
    Tol,
    describe_difference,
    describe_tolerance,
    matches,
    shape_of,
)

__all__ = [
    "Case",
    "Check",
    "CheckInterrupted",
    "CheckTimeout",
    "Mistake",
    "Property",
    "alarm",
    "args",
    "call",
    "run_check",
    "time_limit",
]

#: A case's arguments: ``(positional, keyword)``.
Inputs = tuple[tuple[Any, ...], dict[str, Any]]
#: How a case runs code on its arguments: ``harness(fn, args, kwargs) -> what is compared``.
Harness = Callable[[Any, tuple[Any, ...], dict[str, Any]], object]


def args(*positional: Any, **keyword: Any) -> Inputs:
    """A case's arguments, as the learner's function receives them."""
    return positional, keyword


def call(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
    """The plain harness: ``fn(*args, **kwargs)``."""
    return fn(*positional, **keyword)


class Mistake(NamedTuple):
    """A known mistake: a wrong implementation, called as the learner's, and its hint."""

    wrong: Callable[..., Any]
    hint: str


class Property(NamedTuple):
    """A property a failing output can break: ``fails(got, expected, inputs)``, its hint."""

    fails: Callable[[object, object, Inputs], bool]
    hint: str

    def told(self, got: object, expected: object, inputs: Inputs) -> bool:
        """Whether this property's hint is told: it fails on ``got`` (a property that
        cannot read this output, a gradient's say, is not the one that failed)."""
        try:
            return bool(self.fails(got, expected, inputs))
        except Exception:
            return False


class Case(NamedTuple):
    """One case of a check: a row of its table.

    ``plan`` is what the report lists (cases that share a plan are one line); ``inputs``
    builds the arguments (called once per run, then copied); ``describe`` names them in
    words; ``hint`` says what the case tests, and ``section`` where the chapter explains
    it; ``tol`` is the tolerance; ``harness`` runs the code; ``properties`` are this case's
    own, tried before the check's.
    """

    plan: str
    inputs: Callable[[], Inputs]
    describe: str
    hint: str
    section: str
    tol: Tol = TIGHT
    harness: Harness = call
    properties: tuple[Property, ...] = ()


class Check(NamedTuple):
    """A check: its name, the reference, its cases and what it knows about mistakes.

    ``params`` names the learner's arguments (for a changed argument's message);
    ``errors`` maps a phrase of an exception's message to a better hint than the case's;
    ``want_class`` says that the learner writes a class (an ``nn.Module``).
    """

    name: str
    reference: Any
    cases: tuple[Case, ...]
    params: tuple[str, ...]
    mistakes: tuple[Mistake, ...] = ()
    properties: tuple[Property, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    want_class: bool = False

    def plan(self) -> tuple[str, ...]:
        """Every case's plan line, once, in order, each with its section."""
        lines: list[str] = []
        for case in self.cases:
            line = plan_line(case)
            if line not in lines:
                lines.append(line)
        return tuple(lines)

    def tolerance(self) -> str:
        """How the check compares numbers, as a passing report states it."""
        found: list[str] = []
        for case in self.cases:
            for tol in case.tol if isinstance(case.tol, tuple) else (case.tol,):
                if tol != EXACT:
                    words = describe_tolerance(tol)
                    if tol == FLOAT32:
                        words += " (float32 intermediates allowed)"
                    if words not in found:
                        found.append(words)
        return "; ".join(found)


def plan_line(case: Case) -> str:
    return f"{case.plan} (section {case.section})"


# ------------------------------------------------------------- stopping: time, interrupt


class CheckTimeout(BaseException):
    """The learner's code ran past the time limit (a ``BaseException``, so that an ``except
    Exception`` in the learner's loop does not swallow it)."""


class CheckInterrupted(KeyboardInterrupt):
    """Ctrl-C during a check: a ``KeyboardInterrupt`` that says which check and case."""

    def __init__(self, check: str, case: str) -> None:
        super().__init__(f"check.{check}, case: {case}")
        self.check, self.case = check, case


class _Stop(Exception):
    """Ends a check at its first failure (or at an unwritten function)."""


_limit: list[float] = []  # the time limit set by time_limit(), innermost last


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Give every check run inside at most ``seconds`` (``None``: no limit).

    The limit counts the time spent in the learner's code (the check's own work, the
    reference included, is not counted, so that torch's first-call warm-up lands there).
    It is kept by ``SIGALRM``, which exists on Linux and macOS and only in the main thread;
    elsewhere the checks run without one.
    """
    _limit.append(seconds or 0.0)
    try:
        yield
    finally:
        _limit.pop()


@contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`CheckTimeout` in the code run inside after ``seconds`` (0: never)."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is \
        threading.main_thread()
    if seconds <= 0 or not usable:
        yield
        return

    def ring(signum: int, frame: object) -> None:
        raise CheckTimeout

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------- copies, changes


def clone(value: Any) -> Any:
    """A private copy of a case's arguments: tensors cloned, containers and modules copied."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(clone(v) for v in value)
    if isinstance(value, list):
        return [clone(v) for v in value]
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, nn.Module):
        return copy.deepcopy(value)
    return value


def changed(before: Inputs, after: Inputs, params: Sequence[str]) -> tuple[str, Difference] | None:
    """The first argument the call changed in place (a tensor or a list), and how."""
    named = [(params[i] if i < len(params) else f"argument {i + 1}", b, a)
             for i, (b, a) in enumerate(zip(before[0], after[0], strict=True))]
    named += [(k, before[1][k], after[1][k]) for k in before[1]]
    for name, b, a in named:
        if isinstance(b, Tensor | list):
            difference = describe_difference(b if isinstance(b, Tensor) else tuple(b),
                                             a if isinstance(a, Tensor) else tuple(a),
                                             tol=EXACT, equal_nan=True)
            if difference is not None:
                return name, difference
    return None


# ----------------------------------------------------------------------------- hints


def _squeezed(difference: Difference) -> bool:
    e, g = difference.expected_part, difference.got_part
    return isinstance(e, Tensor) and isinstance(g, Tensor) and \
        tuple(g.shape) == tuple(s for s in e.shape if s != 1) and g.shape != e.shape


def _flattened(difference: Difference) -> bool:
    """The expected leading dimensions folded into one: a 2-D product never reshaped back."""
    e, g = difference.expected_part, difference.got_part
    return isinstance(e, Tensor) and isinstance(g, Tensor) and e.dim() > 2 and \
        g.dim() == 2 and g.shape[-1] == e.shape[-1] and g.shape[0] == e.shape[:-1].numel()


def _generic(difference: Difference, case: Case) -> str:
    """What a failing output is told when no mistake and no property names it better: the
    property that fails (a missing size-1 dimension, the dtype, the shape, NaN), then, where
    it helps, what the case computes; always the case's section."""
    e, g = difference.expected_part, difference.got_part
    cite = f" ({section(case.section)})"
    if difference.kind == "shape" and _squeezed(difference):
        return ("a dimension of size 1 is missing from your result (a .squeeze()?): keep "
                "every dimension, even one of size 1" + cite)
    if difference.kind == "shape" and _flattened(difference) and isinstance(e, Tensor) and \
            isinstance(g, Tensor):
        return (f"your result lost its leading dimensions, {tuple(e.shape)} flattened to "
                f"{tuple(g.shape)}: keep them (reshape back after a 2-D product, or use @, "
                f"which broadcasts over them)" + cite)
    if difference.kind == "dtype" and isinstance(e, Tensor) and e.dtype == torch.bool:
        return "return a boolean mask (dtype torch.bool, True = may attend), not numbers" + cite
    if difference.kind == "dtype" and isinstance(e, Tensor):
        return (f"keep the inputs' dtype, {shape_of(e).split()[1]}: no .float() and no new "
                f"float32 tensors in what you return" + cite)
    lead = ""
    if difference.kind == "shape" and isinstance(e, Tensor) and isinstance(g, Tensor):
        lead = f"the shape is wrong, {tuple(e.shape)} expected and {tuple(g.shape)} came: "
    elif difference.kind == "type":
        lead = f"return {difference.expected.split(':')[0]}, not {shape_of(g)}: "
    elif difference.kind == "nan":
        lead = "your result holds NaN or inf where a number is expected: "
    return lead + case.hint + cite


def _mutation_hint(name: str) -> str:
    return (f"your function changed its argument {name} in place ({name} /= ..., "
            f"{name}.mul_(...), {name}[...] = ..., copy_): the caller's {name} must stay as "
            f"it was, so compute on new tensors (for example {name} = {name} / s, not {name} /= s)")


class Run:
    """One check in progress: its cases run in order, the first failure kept."""

    def __init__(self, check: Check, fn: Any) -> None:
        self.check, self.fn = check, fn
        self.checked: list[str] = []
        self.passed_cases: list[tuple[Case, Inputs, object]] = []
        self.failure: Failure | None = None
        self.written = True
        self.current = ""
        self.limit = _limit[-1] if _limit else 0.0
        self.left = self.limit  # of the time limit, what the learner's code has not used

    def fail(self, failure: Failure) -> None:
        if self.current in self.checked:  # a plan line of several cases, one of them failed
            self.checked.remove(self.current)
        self.failure = failure
        raise _Stop

    def call(self, case: Case, thunk: Callable[[], object]) -> object:
        """The learner's code on one case; what it raises ends the check as a failure."""
        start = time.perf_counter()
        try:
            if self.limit and self.left <= 0:
                raise CheckTimeout
            with alarm(self.left if self.limit else 0.0):
                return thunk()
        except NotImplementedError:
            self.written = False
            raise _Stop from None
        except CheckTimeout:
            self.fail(Failure(plan_line(case), case.describe,
                              f"an answer within {self.limit:g} s",
                              "none: still running when the time ran out",
                              f"the case did not finish: look for a loop that never ends (a "
                              f"while whose condition never changes) or work that grows far "
                              f"beyond this small input ({section(case.section)})", hung=True))
        except (Exception, SystemExit) as error:  # the learner's bug, reported, not raised
            self.fail(self._error(case, error))
        finally:
            self.left -= time.perf_counter() - start
        raise AssertionError("unreachable")  # fail() raised

    def _error(self, case: Case, error: BaseException) -> Failure:
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        message = re.sub(r"0x[0-9a-fA-F]+", "0x...", message)[:200]  # no addresses
        got = f"{type(error).__name__}: {message}" if message else type(error).__name__
        hint = next((h for phrase, h in self.check.errors if phrase in str(error)), None)
        if isinstance(error, SystemExit):
            hint = (f"your code called sys.exit() (or exit()), which ends the whole program: "
                    f"return the result instead ({section(case.section)})")
        return Failure(plan_line(case), case.describe, "no exception", got,
                       hint or f"{case.hint} ({section(case.section)})")

    def case(self, case: Case) -> None:
        self.current = plan_line(case)
        base = case.inputs()
        expected = case.harness(self.check.reference, *clone(base))  # before the learner's
        mine, before = clone(base), clone(base)
        got = self.call(case, lambda: case.harness(self.fn, *mine))
        difference = describe_difference(expected, got, tol=case.tol)
        change = changed(before, mine, self.check.params)
        if difference is None and change is None:
            self.passed_cases.append((case, base, expected))
            if self.current not in self.checked:
                self.checked.append(self.current)
            return
        hint = self.hint(case, base, expected, got, difference, change)
        if difference is None and change is not None:
            name, how = change
            self.fail(Failure(self.current, case.describe, f"{name} unchanged, as passed: "
                              f"{how.expected}", f"{name} changed: {how.got}", hint))
        assert difference is not None  # for the type checker
        self.fail(Failure(self.current, case.describe, difference.expected, difference.got,
                          hint, difference.largest))

    def hint(self, case: Case, base: Inputs, expected: object, got: object,
             difference: Difference | None, change: tuple[str, Difference] | None) -> str:
        """The hint of a failing case: see the module's docstring for the order."""
        if difference is not None:
            # a mistake that gives a case passed before another value than the reference's
            # is not the one the learner made, whatever it gives here
            claimed = [m for m in self.check.mistakes
                       if self._claims(case, base, m, expected, got) and self._consistent(m)]
            if claimed:  # two mistakes that give the same output here: both are named
                told = claimed[0].hint if len(claimed) == 1 or \
                    claimed[1].hint == claimed[0].hint else \
                    f"{claimed[0].hint}; or else: {claimed[1].hint}"
                if change is not None:  # a second mistake, as real as the first
                    told += f"; and {_mutation_hint(change[0])}"
                return told
        if change is not None:
            return f"{_mutation_hint(change[0])} ({section(case.section)})"
        assert difference is not None  # a case without a change failed on its value
        for prop in (*case.properties, *self.check.properties):
            if prop.told(got, expected, base):
                return prop.hint
        return _generic(difference, case)

    @staticmethod
    def _claims(case: Case, base: Inputs, mistake: Mistake, expected: object,
                got: object) -> bool:
        """Whether ``mistake`` explains ``got``: it differs from the expected value on this
        case, and the learner's output matches it at the case's tolerance."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wrong = case.harness(mistake.wrong, *clone(base))
            return describe_difference(expected, wrong, tol=case.tol) is not None and \
                matches(got, wrong, tol=case.tol)
        except Exception:  # a mistake that cannot even run here is not the one made
            return False

    def _consistent(self, mistake: Mistake) -> bool:
        """Whether ``mistake`` gives the expected value on every case passed so far."""
        for case, base, expected in self.passed_cases:
            try:
                wrong = case.harness(mistake.wrong, *clone(base))
                if describe_difference(expected, wrong, tol=case.tol) is not None:
                    return False
            except Exception:  # a mistake that fails to run there would have failed there
                return False
        return True

    def result(self) -> CheckResult:
        if not self.written:
            return CheckResult(self.check.name, False, self.check.plan(), None, written=False)
        return CheckResult(self.check.name, self.failure is None, tuple(self.checked),
                           self.failure, tolerance=self.check.tolerance())


# -------------------------------------------------------------------------- the runner


@contextmanager
def quiet_rng(seed: int = 0) -> Iterator[None]:
    """Run with torch's global generator seeded, and restore it afterwards.

    A check builds layers (their initial weights) and may call code that draws random
    numbers; none of it may change what the next cell of the learner's notebook draws.
    """
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        yield


def check_callable(fn: object, name: str, *, want_class: bool = False) -> None:
    """The door of every check: ``fn`` must be a function (or a class, for a module)."""
    if want_class:
        if not inspect.isclass(fn):
            raise TypeError(f"{name} must be a class (an nn.Module subclass, not an instance), "
                            f"got {shape_of(fn)}")
        return
    if inspect.isclass(fn) or not callable(fn):
        raise TypeError(f"{name} must be a function, got {shape_of(fn)}")


def run_check(check: Check, fn: object) -> CheckResult:
    """Check ``fn`` at the door, then run every case of ``check`` quietly; its result.

    Quietly: torch's global generator is restored afterwards and warnings the learner's
    code raises (a deprecated ``x.T``, say) are not printed, so a notebook's next cells and
    its stored output do not depend on the check. Under :func:`time_limit` the learner's
    code must finish in time, or the case it was running is reported as the one that hung.
    """
    check_callable(fn, "cls" if check.want_class else "fn", want_class=check.want_class)
    run = Run(check, fn)
    with quiet_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for case in check.cases:
                run.case(case)
        except _Stop:
            pass
        except KeyboardInterrupt as interrupt:
            raise CheckInterrupted(check.name, run.current) from interrupt
    return run.result()
