"""What a check says: its result, the first failure, and the sections a hint cites (Ch. 1-11).

A check's answer is a :class:`CheckResult`: passed, with the cases it checked and the
tolerance it held them to; or the first :class:`Failure` (the case, its input, what was
expected, what came, the largest difference and a hint that names the idea and the
section of the chapter that explains it); or "not written yet", with the cases the check
will run. A passing or unwritten result prints nothing that depends on the machine (no
computed number): executed notebooks show them, and strict nbval compares them on any CPU.
A failure prints the numbers it found, with as many digits as it takes to tell them apart.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

__all__ = ["REPORT_WIDTH", "SECTIONS", "CheckResult", "Failure", "section"]

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
    "4.4": "Saturation and the gradient",
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
    "10.8": "Masks as code: FlexAttention",
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
    ``expected`` and ``got`` what should have come and what came (the values around the
    largest difference, or shapes), ``largest`` the largest difference, where it is and
    the tolerance (empty when shapes or types differ), and ``hint`` names the idea and
    the section. ``hung`` is true when the case ran out of time.
    """

    case: str
    inputs: str
    expected: str
    got: str
    hint: str
    largest: str = ""
    hung: bool = False


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
    false when the learner's function raised ``NotImplementedError``; ``tolerance`` says
    how closely numbers were compared (empty for a check of masks). ``print(result)`` and
    a notebook's display show the same few lines.
    """

    name: str
    passed: bool
    checked: tuple[str, ...]
    failure: Failure | None = None
    written: bool = True
    tolerance: str = ""

    def __str__(self) -> str:
        if not self.written:
            lines = [f"check.{self.name}: not written yet (it raises NotImplementedError);",
                     "this check will test:"]
            lines += [_wrap("  - ", case) for case in self.checked]
            return "\n".join(lines)
        if self.passed:
            lines = [f"check.{self.name}: passed, {len(self.checked)} cases:"]
            lines += [_wrap("  - ", case) for case in self.checked]
            if self.tolerance:
                lines.append(_wrap("  tolerance: ", self.tolerance))
            return "\n".join(lines)
        assert self.failure is not None  # a written check that did not pass has a failure
        f = self.failure
        lines = [f"check.{self.name}: FAILED after {len(self.checked)} passing case"
                 f"{'' if len(self.checked) == 1 else 's'}",
                 _wrap("  case:     ", f.case),
                 _wrap("  input:    ", f.inputs),
                 _wrap("  expected: ", f.expected),
                 _wrap("  got:      ", f.got)]
        if f.largest:
            lines.append(_wrap("  largest:  ", f.largest))
        lines.append(_wrap("  hint:     ", f.hint))
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython shows a bare ``check.softmax(f)`` at the end of a cell as str() does.
        printer.text(str(self))
