"""What a check says, and the runner every check of ``course_attn.check`` is built on (Ch. 1-11).

A check calls the learner's code on a list of cases, fixed ones from the chapter first,
then seeded random ones against the package's reference, and stops at the first case it
gets wrong. Its answer is a :class:`CheckResult`: passed, with what was checked; or the
first :class:`Failure` (what input, what was expected, what came) and a hint that names
the idea and the section of the chapter that explains it. A function that still raises
``NotImplementedError`` is "not written yet", and the result lists what the check will test.

Every printed number is rounded to three significant digits and every input is named
by its shape, seed and dtype, never printed in full: executed notebooks show these
results, and strict nbval compares them on any CPU.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import textwrap
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypedDict

import torch
from torch import Tensor

__all__ = [
    "SECTIONS",
    "CheckResult",
    "Failure",
    "Run",
    "StopCheck",
    "Tolerance",
    "describe_difference",
    "has_nan",
    "like",
    "matches",
    "run_check",
    "section",
    "show",
]

#: The chapter sections a hint may cite, with their headings as the notebooks write them
#: (``tests/test_check.py`` reads the notebooks and holds this table to them).
SECTIONS: dict[str, str] = {
    "1.2": "Why raw weights are not a distribution",
    "1.3": "Softmax turns scores into a distribution",
    "1.5": "Temperature: sharp or flat",
    "1.6": "Numerical stability",
    "1.7": "Attention pooling with a task query",
    "2.4": "The matrix form",
    "2.6": "Cosine similarity",
    "3.3": "A worked example with two tokens",
    "3.4": "`nn.Linear` stores the transpose",
    "3.5": "From raw parameters to the package class",
    "4.1": "The computation, four ways",
    "4.2": "The variance of a dot product",
    "4.4": "Saturation makes the gradient vanish",
    "4.5": "The worked 4x3 example, corrected",
    "5.2": "Building the mask: $-\\infty$ before softmax, or zero after it",
    "5.3": "`causal_mask`, and where it sits when $T_q < T_k$",
    "5.4": "Padding masks",
    "5.5": "Left padding: the gap in the source material",
    "5.6": "A query that may attend to nothing",
    "5.7": "Three mask conventions, and converters",
    "6.2": "The fused version: one projection, then a reshape",
    "6.3": "The pitfall: `view` without `transpose`",
    "6.4": "Concatenation and the output projection, as a sum over heads",
    "6.5": "`head_dim = d_model / H`, and the scale $\\sqrt{d_k}$",
    "6.10": "Equivalence with `torch.nn.MultiheadAttention`",
    "7.2": "Sinusoidal positional encodings",
    "7.4": "Residual connections and layer norm",
    "7.5": "Gradients through a deep stack: why pre-norm is the common choice",
    "7.7": "The block, assembled",
    "8.2": "Padding never leaks",
    "8.3": "The KV cache",
    "9.2": "The online softmax",
    "9.3": "Tiled attention: the forward pass",
    "10.1": "Rotary position embeddings",
    "10.4": "Sliding-window attention",
    "11.2": "Part A: a task whose best loss is known exactly",
}


def _plain(heading: str) -> str:
    """A heading without its Markdown: ``$-\\infty$`` -> ``-inf``, no backticks."""
    text = heading.replace("$-\\infty$", "-inf").replace("\\sqrt{d_k}", "sqrt(d_k)")
    return text.replace("`", "").replace("$", "")


def section(number: str) -> str:
    """``"section 1.6, Numerical stability"``: how a hint cites the chapter (Chapters 1-11)."""
    return f"section {number}, {_plain(SECTIONS[number])}"


@dataclasses.dataclass(frozen=True)
class Failure:
    """The first case a learner's code got wrong (Chapters 1-11).

    ``case`` says what was being checked, ``inputs`` what the code was called with,
    ``expected`` and ``got`` what should have come and what came (values rounded to
    three significant digits, or shapes), and ``hint`` names the idea and the section.
    """

    case: str
    inputs: str
    expected: str
    got: str
    hint: str


#: A report's lines are at most this wide: the site's code column shows 84 characters.
REPORT_WIDTH = 80


def _wrap(label: str, text: str) -> str:
    """``label + text`` folded at :data:`REPORT_WIDTH`, later lines under the text's start;
    a text of several lines (a printed tensor) keeps its own lines."""
    if "\n" in text:
        return label + text.replace("\n", "\n" + " " * len(label))
    return textwrap.fill(text, REPORT_WIDTH, initial_indent=label,
                         subsequent_indent=" " * len(label), break_long_words=False,
                         break_on_hyphens=False)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The answer of one check of ``course_attn.check`` (Chapters 1-11).

    ``passed`` is true when every case passed; ``checked`` lists the cases that passed,
    in order (or, when the function is not written yet, every case the check will run);
    ``failure`` is the first case that did not pass (``None`` otherwise); ``written`` is
    false when the learner's function raised ``NotImplementedError``. ``print(result)``
    and a notebook's display show the same few lines.
    """

    name: str
    passed: bool
    checked: tuple[str, ...]
    failure: Failure | None = None
    written: bool = True

    def __str__(self) -> str:
        if not self.written:
            lines = [f"check.{self.name}: not written yet (it raises NotImplementedError);",
                     "this check will test:"]
            lines += [_wrap("  - ", case) for case in self.checked]
            return "\n".join(lines)
        if self.passed:
            lines = [f"check.{self.name}: passed, {len(self.checked)} cases:"]
            lines += [_wrap("  - ", case) for case in self.checked]
            return "\n".join(lines)
        assert self.failure is not None  # a written check that did not pass has a failure
        f = self.failure
        lines = [f"check.{self.name}: FAILED after {len(self.checked)} passing case"
                 f"{'' if len(self.checked) == 1 else 's'}",
                 _wrap("  case:     ", f.case),
                 _wrap("  input:    ", f.inputs),
                 _wrap("  expected: ", f.expected),
                 _wrap("  got:      ", f.got),
                 _wrap("  hint:     ", f.hint)]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython shows a bare ``check.softmax(f)`` at the end of a cell as str() does.
        printer.text(str(self))


class Tolerance(TypedDict):
    """How close a learner's number must come to the reference's: ``|got - expected| <= atol
    + rtol * |expected|``."""

    atol: float
    rtol: float


class StopCheck(Exception):
    """Raised inside a check to end it at the first failure (or an unwritten function)."""


# ---------------------------------------------------------------- showing values


def _number(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"  # never "-0"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))  # 1000, not 1e+03
    return f"{value:.3g}"


def _nested(values: Any) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v) for v in values) + "]"
    return _number(values)


def show(value: object, *, limit: int = 12) -> str:
    """A value as a learner reads it: small tensors in full (3 digits), large ones by shape."""
    if isinstance(value, Tensor):
        if value.numel() <= limit and value.dim() <= 3:
            return _nested(value.detach().cpu().tolist())
        return f"a {_dtype(value.dtype)} tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        inner = ", ".join(show(v, limit=limit) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, float | int | bool):
        return _number(value)
    if value is None:
        return "None"
    return f"a {type(value).__name__}"


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _shape(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {_dtype(value.dtype)} tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _first_mismatch(expected: Tensor, got: Tensor, atol: float, rtol: float,
                    equal_nan: bool = False) -> int | None:
    """Flat index of the first entry of ``got`` not close to ``expected``.

    NaN matches NaN only with ``equal_nan`` (when ``expected`` is a known mistake's output).
    """
    e, g = expected.detach().reshape(-1), got.detach().reshape(-1).to(expected.dtype)
    if expected.dtype == torch.bool or not expected.is_floating_point():
        bad = e != g
    else:
        same_inf = torch.isinf(e) & (e == g)  # -inf where -inf is expected is right
        close = (g - e).abs() <= atol + rtol * e.abs()
        both_nan = torch.isnan(e) & torch.isnan(g) if equal_nan else torch.zeros_like(close)
        bad = ~(close | same_inf | both_nan)
    where = bad.nonzero()
    return None if where.numel() == 0 else int(where[0, 0])


def _index(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _where(expected: Tensor, got: Tensor, flat: int) -> tuple[str, str]:
    """``expected`` and ``got`` around their first difference, as two short strings."""
    if expected.numel() <= 12 and expected.dim() <= 3:
        return show(expected), show(got)
    index = _index(flat, expected.shape)
    row = index[:-1]
    e_row, g_row = expected.detach()[row], got.detach()[row]
    if e_row.numel() <= 8:  # the whole last-axis row around the difference
        at = f"row {list(row)}: " if row else ""
        return f"{at}{show(e_row)}", f"{at}{show(g_row)}"
    e_val, g_val = expected.reshape(-1)[flat].item(), got.reshape(-1)[flat].item()
    return (f"at {list(index)}: {_number(e_val)}", f"at {list(index)}: {_number(g_val)}")


def describe_difference(expected: object, got: object, *, atol: float = 1e-6,
                        rtol: float = 1e-5, equal_nan: bool = False) -> tuple[str, str] | None:
    """``None`` when ``got`` matches ``expected``, else ``(expected, got)`` in words.

    Tensors must agree in shape and dtype and be close entry by entry (``-inf`` where
    ``-inf`` is expected counts as equal, NaN never does); tuples are compared entry by
    entry; Python numbers against a tolerance.
    """
    if isinstance(expected, tuple):
        if not isinstance(got, tuple | list) or len(got) != len(expected):
            return (f"a tuple of {len(expected)}: "
                    + ", ".join(_shape(e) for e in expected), _shape(got))
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            difference = describe_difference(e, g, atol=atol, rtol=rtol, equal_nan=equal_nan)
            if difference is not None:
                return f"item {i}: {difference[0]}", f"item {i}: {difference[1]}"
        return None
    if isinstance(expected, Tensor):
        if isinstance(got, tuple | list) and got and isinstance(got[0], Tensor):
            return _shape(expected), f"{_shape(got)} (return the tensor itself)"
        if not isinstance(got, Tensor):
            return _shape(expected), _shape(got)
        if tuple(got.shape) != tuple(expected.shape):
            return _shape(expected), _shape(got)
        if got.dtype != expected.dtype:
            return _shape(expected), _shape(got)
        flat = _first_mismatch(expected, got, atol, rtol, equal_nan)
        return None if flat is None else _where(expected, got, flat)
    if isinstance(expected, float | int):
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, float | int) or isinstance(got, bool):
            return _number(expected), _shape(got)
        if not abs(got - expected) <= atol + rtol * abs(expected):
            return _number(expected), _number(got)
        return None
    raise TypeError(f"expected must be a tensor, a tuple or a number, got {_shape(expected)}")


def matches(got: object, wrong: object, *, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    """Whether ``got`` equals ``wrong``, the result of a known mistake (NaN equals NaN)."""
    try:
        return describe_difference(wrong, got, atol=atol, rtol=rtol, equal_nan=True) is None
    except (TypeError, RuntimeError, ValueError, IndexError):
        return False


def like(wrong: Callable[[], object], *, atol: float = 1e-6,
         rtol: float = 1e-5) -> Callable[[object], bool]:
    """A mistake recognised by its output: ``wrong()`` computes what the mistake gives.

    It is computed only when a case fails, and a mistake that cannot even run on this
    input (a shape error, say) is simply not the one the learner made.
    """
    def test(got: object) -> bool:
        try:
            return matches(got, wrong(), atol=atol, rtol=rtol)
        except (TypeError, RuntimeError, ValueError, IndexError):
            return False

    return test


def has_nan(value: object) -> bool:
    """Whether a tensor, or any tensor of a tuple, holds a NaN."""
    if isinstance(value, Tensor):
        return bool(value.is_floating_point() and torch.isnan(value.detach()).any())
    if isinstance(value, tuple | list):
        return any(has_nan(v) for v in value)
    return False


#: A known mistake: a test of the learner's output (``like(...)`` or any predicate), its hint.
Mistake = tuple[Callable[[object], bool], str]


class Run:
    """One check in progress: calls the learner's code case by case (Chapters 1-11).

    ``call`` runs the learner's code and turns an exception into a failure (or, for
    ``NotImplementedError``, into "not written yet"); ``compare`` holds its result to the
    reference and, on a difference, picks the hint of the first known mistake the result
    matches, else the case's own hint. Both end the check at the first failure by raising
    :class:`StopCheck`; ``passed`` records a case that passed.
    """

    def __init__(self, name: str, plan: Sequence[str]) -> None:
        self.name = name
        self.plan = tuple(plan)
        self.checked: list[str] = []
        self.failure: Failure | None = None
        self.written = True

    def call(self, case: str, inputs: str, thunk: Callable[[], Any], hint: str, *,
             errors: Sequence[tuple[str, str]] = ()) -> Any:
        """``thunk()``, the learner's code on one input; an exception ends the check.

        ``errors`` maps a phrase of an exception's message to a better hint than the case's.
        """
        try:
            return thunk()
        except StopCheck:
            raise
        except NotImplementedError:
            self.written = False
            raise StopCheck from None
        except Exception as error:  # the learner's bug, reported, never re-raised
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            message = re.sub(r"0x[0-9a-fA-F]+", "0x...", message)[:200]  # no addresses
            hint = next((h for phrase, h in errors if phrase in str(error)), hint)
            self.fail(case, inputs, "no exception",
                      f"{type(error).__name__}: {message}" if message else type(error).__name__,
                      hint)

    def fail(self, case: str, inputs: str, expected: str, got: str, hint: str) -> None:
        """Record the failure and end the check."""
        self.failure = Failure(case, inputs, expected, got, hint)
        raise StopCheck

    def compare(self, case: str, inputs: str, got: object, expected: object, hint: str, *,
                mistakes: Sequence[Mistake] = (), atol: float = 1e-6,
                rtol: float = 1e-5) -> None:
        """Fail unless ``got`` matches ``expected``; the hint of a matched mistake wins."""
        difference = describe_difference(expected, got, atol=atol, rtol=rtol)
        if difference is None:
            return
        for test, mistake_hint in mistakes:
            try:
                found = test(got)
            except Exception:  # a predicate that cannot read this output: not this mistake
                found = False
            if found:
                hint = mistake_hint
                break
        self.fail(case, inputs, difference[0], difference[1], hint)

    def passed(self, case: str) -> None:
        """Record a case that passed."""
        self.checked.append(case)

    def result(self) -> CheckResult:
        if not self.written:
            return CheckResult(self.name, False, self.plan, None, written=False)
        return CheckResult(self.name, self.failure is None, tuple(self.checked), self.failure)


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
                            f"got {_shape(fn)}")
        return
    if inspect.isclass(fn) or not callable(fn):
        raise TypeError(f"{name} must be a function, got {_shape(fn)}")


def run_check(name: str, plan: Sequence[str], fn: object, body: Callable[[Run, Any], None], *,
              arg: str = "fn", want_class: bool = False) -> CheckResult:
    """Check ``fn`` at the door, then run ``body(run, fn)`` quietly and return its result.

    Quietly: torch's global generator is restored afterwards and warnings the learner's
    code raises (a deprecated ``x.T``, say) are not printed, so a notebook's next cells and
    its stored output do not depend on the check.
    """
    check_callable(fn, arg, want_class=want_class)
    run = Run(name, plan)
    with quiet_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            body(run, fn)
        except StopCheck:
            pass
    return run.result()
