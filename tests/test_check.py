"""``course_attn.check`` as a learner and a notebook meet it (issue 34).

What a result says (passed, the first failure, "not written yet"), that it says it the same
way on every run and machine (nbval compares the printed text), that a check leaves the
notebook's random stream alone, that its arguments are checked at the door, and that every
section a hint cites is a section of the chapters, under that heading. The catalogue of
wrong implementations is in ``tests/test_check_catalogue.py``, the command line in
``tests/test_check_cli.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from check_solutions import SOLUTIONS

from course_attn import check
from course_attn.check import basics, decoding, efficient, heads, masks, modern, training
from course_attn.check.report import SECTIONS, CheckResult, describe_difference, section, show

ROOT = Path(__file__).resolve().parents[1]
MODULES = (basics, masks, heads, decoding, efficient, modern, training)


def _plan(name: str) -> tuple[str, ...]:
    """The plan of a check: what "not written yet" lists."""
    def not_written(*args, **kwargs):
        raise NotImplementedError

    class NotWritten:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError

    fn = NotWritten if name in ("self_attention_layer", "multi_head_attention") else not_written
    result = check.CHECKS[name](fn)
    assert not result.written
    return result.checked


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_the_reference_runs_every_case_of_the_plan(name):
    result = check.CHECKS[name](SOLUTIONS[name])
    assert result.passed and result.checked == _plan(name), str(result)
    text = str(result)
    assert text.startswith(f"check.{name}: passed, {len(result.checked)} cases:")
    flat = " ".join(text.split())  # the report folds long cases at REPORT_WIDTH
    assert all(f"- {' '.join(case.split())}" in flat for case in result.checked)
    assert max(map(len, text.splitlines())) <= check.report.REPORT_WIDTH, text


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_a_function_not_written_yet_says_so_and_what_will_be_tested(name):
    plan = _plan(name)
    assert len(plan) >= 2

    def stub(*args, **kwargs):
        raise NotImplementedError("write me")

    class Stub:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError

    result = check.CHECKS[name](Stub if "Attention" in check.NAMES[name] else stub)
    assert not result.passed and not result.written and result.failure is None
    lines = str(result).splitlines()
    assert lines[:2] == [f"check.{name}: not written yet (it raises NotImplementedError);",
                         "this check will test:"]
    cases = "\n".join(lines[2:]).replace("\n    ", " ").splitlines()  # unfold long cases
    assert cases == [f"  - {' '.join(case.split())}" for case in plan]
    assert max(map(len, lines)) <= check.report.REPORT_WIDTH
    assert "Traceback" not in str(result)


def test_another_exception_is_reported_with_its_input_and_the_hint():
    def broken(x, temperature=1.0):
        raise ValueError("my own bug")

    result = check.softmax(broken)
    assert result.written and not result.passed and result.checked == ()
    failure = result.failure
    assert failure is not None
    assert failure.got == "ValueError: my own bug" and failure.expected == "no exception"
    assert failure.inputs == "x = [[2, 1, 0.1], [0, 0, 0]], temperature = 1"
    assert "section 1.3, Softmax turns scores into a distribution" in failure.hint
    assert "  got:      ValueError: my own bug" in str(result)


def test_a_failure_prints_case_input_expected_got_and_hint_in_that_order():
    def no_max(x, temperature=1.0):
        e = (x / temperature).exp()
        return e / e.sum(-1, keepdim=True)

    text = str(check.softmax(no_max))
    assert text == (
        "check.softmax: FAILED after 2 passing cases\n"
        "  case:     scores of 1000: no NaN, the row maximum is subtracted first (1.6)\n"
        "  input:    x = [[1000, 999, 998]], temperature = 1\n"
        "  expected: [[0.665, 0.245, 0.09]]\n"
        "  got:      [[nan, nan, nan]]\n"
        "  hint:     your softmax gives NaN for scores of 1000: exp(1000) is inf and inf\n"
        "            / inf is NaN; subtract each row's maximum first (section 1.6,\n"
        "            Numerical stability)")


def test_results_are_frozen_and_ipython_shows_them_as_print_does():
    result = check.causal_mask(SOLUTIONS["causal_mask"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.passed = False  # type: ignore[misc]

    class Printer:  # what IPython hands _repr_pretty_: an object with .text(str)
        def __init__(self):
            self.parts = []

        def text(self, value):
            self.parts.append(value)

    printer = Printer()
    result._repr_pretty_(printer, cycle=False)
    assert "".join(printer.parts) == str(result)


def _wrong_everywhere():
    """One wrong implementation per check, from the catalogue, for the output tests."""
    from test_check_catalogue import CATALOGUE

    return {name: entries[0][1] for name, entries in CATALOGUE.items()}


def test_printed_results_are_the_same_on_every_run_and_hold_no_round_off_or_address():
    wrong = _wrong_everywhere()
    for name, fn in check.CHECKS.items():
        for learner in (SOLUTIONS[name], wrong[name]):
            first, second = str(fn(learner)), str(fn(learner))
            assert first == second, name
            assert "0x" not in first, first
            # three significant digits at most: no digits a CPU's round-off can change
            decimals = re.findall(r"\d+\.\d+", first)
            assert all(len(d.replace(".", "").lstrip("0")) <= 3 for d in decimals), first
            assert not re.search(r"(?<![\w.])-0(?![\w.])", first), first  # no "-0"


def test_a_check_leaves_torchs_random_stream_as_it_found_it():
    def draws(x, temperature=1.0):
        torch.rand(100)  # the learner's code may draw; the notebook must not notice
        return torch.softmax(x / temperature, dim=-1)

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check.softmax(draws)
    check.multi_head_attention(SOLUTIONS["multi_head_attention"])  # builds layers
    check.training_step(SOLUTIONS["training_step"])  # builds a model, draws batches
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(("name", "bad", "error"), [
    ("softmax", 3, TypeError),
    ("softmax", "softmax", TypeError),
    ("softmax", torch.nn.Linear, TypeError),  # a class where a function is checked
    ("multi_head_attention", lambda d, h: None, TypeError),  # a function for a class
    ("self_attention_layer", torch.nn.Linear(2, 2), TypeError),  # an instance
])
def test_the_checks_check_their_own_argument_at_the_door(name, bad, error):
    argument = "cls" if "Attention" in check.NAMES[name] else "fn"
    with pytest.raises(error, match=rf"^{argument} must be a"):
        check.CHECKS[name](bad)


def _notebook_headings() -> dict[str, str]:
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                for line in "".join(cell["source"]).splitlines():
                    match = re.match(r"^## (\d+\.\d+) (.+)$", line)
                    if match:
                        found[match.group(1)] = match.group(2).strip()
    return found


def test_every_section_a_hint_can_cite_is_a_section_of_the_chapters_under_that_heading():
    headings = _notebook_headings()
    assert len(headings) > 80  # the walk found the chapters
    wrong = {number: (heading, headings.get(number)) for number, heading in SECTIONS.items()
             if headings.get(number) != heading}
    assert not wrong, wrong
    assert section("6.3") == "section 6.3, The pitfall: view without transpose"
    assert section("5.2") == "section 5.2, Building the mask: -inf before softmax, or zero after it"


def test_every_hint_of_the_source_cites_a_known_section():
    cited = set()
    for path in (ROOT / "src" / "course_attn" / "check").glob("*.py"):
        cited |= set(re.findall(r"section\('(\d+\.\d+)'\)", path.read_text()))
    assert cited and cited <= set(SECTIONS), sorted(cited - set(SECTIONS))


def test_differences_name_shapes_dtypes_and_the_first_wrong_row():
    expected = torch.arange(24.0).reshape(2, 3, 4)
    got = expected.clone()
    got[1, 2, 3] = -1.0
    assert describe_difference(expected, got) == ("row [1, 2]: [20, 21, 22, 23]",
                                                  "row [1, 2]: [20, 21, 22, -1]")
    assert describe_difference(expected, got.double()) == (
        "a float32 tensor of shape (2, 3, 4)", "a float64 tensor of shape (2, 3, 4)")
    assert describe_difference(expected, got[0]) == (
        "a float32 tensor of shape (2, 3, 4)", "a float32 tensor of shape (3, 4)")
    assert describe_difference((expected,), expected) == (
        "a tuple of 1: a float32 tensor of shape (2, 3, 4)", "a float32 tensor of shape (2, 3, 4)")
    assert describe_difference(expected, expected.clone()) is None
    assert describe_difference(torch.tensor([-torch.inf, 1.0]),
                               torch.tensor([-torch.inf, 1.0])) is None
    assert describe_difference(torch.tensor([1.0]), torch.tensor([torch.nan])) is not None
    assert show(torch.tensor([[1000.0, -0.0, 0.123456]])) == "[[1000, 0, 0.123]]"


def test_importing_the_package_does_not_load_the_checks():
    code = ("import sys, course_attn; print('course_attn.check' in sys.modules); "
            "course_attn.check; print('course_attn.check' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.split() == ["False", "True"]


def test_every_check_module_exports_its_checks():
    exported = {name for module in MODULES for name in module.__all__}
    assert exported == set(check.CHECKS)


def test_the_registry_names_every_check_once_with_its_signature():
    assert set(check.CHECKS) == set(check.NAMES) == set(check.SIGNATURES)
    assert len(set(check.NAMES.values())) == len(check.NAMES)
    assert all(check.CHECKS[name].__doc__ and re.search(r"\(Ch(apter|\.) \d+\)",
                                                        check.CHECKS[name].__doc__ or "")
               for name in check.CHECKS)
    assert isinstance(check.softmax(SOLUTIONS["softmax"]), CheckResult)


def test_the_references_pass_under_the_perturbed_numerics_of_make_nbval_perturbed():
    # A solution cell in a notebook runs its check under tools/perturbed (random draws and
    # gradients nudged): a correct solution must still pass there.
    code = (f"exec(open({str(ROOT / 'tools/perturbed/perturb_numerics.py')!r}).read())\n"
            "import check_solutions as s\n"
            "from course_attn import check\n"
            "print([n for n, fn in s.SOLUTIONS.items() if not check.CHECKS[n](fn).passed])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT / "tests", timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
