"""``course_attn.check`` as a learner and a notebook meet it (issues 34 and 40).

What a result says (passed, the first failure, "not written yet"), that it says it the same
way on every run and machine (nbval compares the printed text), how it compares numbers
(the tolerance it states, the largest difference, enough digits), that the learner's code
runs on private copies and may not change its arguments, that a layer runs in eval mode,
that a hung or exiting function is reported, that a check leaves the notebook's random
stream alone, that its arguments are checked at the door, and that every section a report
cites is a section of the chapters, cited as "section 5.3", never "(5.3)". The catalogues of
wrong and correct implementations are in ``tests/test_check_catalogue.py``, the command
line in ``tests/test_check_cli.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from check_solutions import SOLUTIONS
from check_wrong import CATALOGUE

from course_attn import check
from course_attn.check import (
    basics,
    block,
    decoding,
    efficient,
    heads,
    masks,
    modern,
    projections,
    training,
)
from course_attn.check.report import REPORT_WIDTH, SECTIONS, CheckResult, section
from course_attn.check.runner import CheckInterrupted, time_limit
from course_attn.check.values import FLOAT32, TIGHT, describe_difference, show

ROOT = Path(__file__).resolve().parents[1]
MODULES = (basics, projections, masks, heads, block, decoding, efficient, modern, training)
CLASSES = ("self_attention_layer", "multi_head_attention")


def _not_written(name: str) -> object:
    def stub(*args, **kwargs):
        raise NotImplementedError("write me")

    class Stub:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError

    return Stub if name in CLASSES else stub


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_the_reference_runs_every_case_of_the_plan(name):
    result = check.CHECKS[name](SOLUTIONS[name])
    assert result.passed and result.checked == check.TABLES[name].plan(), str(result)
    text = str(result)
    assert text.startswith(f"check.{name}: passed, {len(result.checked)} cases:")
    flat = " ".join(text.split())  # the report folds long cases at REPORT_WIDTH
    assert all(f"- {' '.join(case.split())}" in flat for case in result.checked)
    assert max(map(len, text.splitlines())) <= REPORT_WIDTH, text


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_a_function_not_written_yet_says_so_and_what_will_be_tested(name):
    plan = check.TABLES[name].plan()
    assert len(plan) >= 2
    result = check.CHECKS[name](_not_written(name))
    assert not result.passed and not result.written and result.failure is None
    lines = str(result).splitlines()
    assert lines[:2] == [f"check.{name}: not written yet (it raises NotImplementedError);",
                         "this check will test:"]
    cases = "\n".join(lines[2:]).replace("\n    ", " ").splitlines()  # unfold long cases
    assert cases == [f"  - {' '.join(case.split())}" for case in plan]
    assert max(map(len, lines)) <= REPORT_WIDTH
    assert "Traceback" not in str(result)


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_passing_and_unwritten_reports_print_only_the_plan_and_the_stated_tolerance(name):
    # The notebooks show these two reports; nbval compares them on any CPU, under perturbed
    # numerics too: they hold no computed number, only the table's own words.
    table = check.TABLES[name]
    passed = " ".join(str(check.CHECKS[name](SOLUTIONS[name])).split())
    words = [f"check.{name}: passed, {len(table.plan())} cases:",
             *(f"- {case}" for case in table.plan())]
    if table.tolerance():
        words.append(f"tolerance: {table.tolerance()}")
    assert passed == " ".join(" ".join(words).split())
    unwritten = str(check.CHECKS[name](_not_written(name)))
    assert all(number in " ".join(table.plan()) for number in
               re.findall(r"\d+\.\d+", unwritten))


def test_another_exception_is_reported_with_its_input_and_the_hint():
    def broken(x, temperature=1.0):
        raise ValueError("my own bug")

    result = check.softmax(broken)
    assert result.written and not result.passed and result.checked == ()
    failure = result.failure
    assert failure is not None
    assert failure.got == "ValueError: my own bug" and failure.expected == "no exception"
    assert failure.inputs == "x = [[2, 1, 0.1], [0, 0, 0]], temperature left to its default"
    assert "section 1.3, Softmax turns scores into a distribution" in failure.hint
    assert "  got:      ValueError: my own bug" in str(result)


def test_a_failure_prints_case_input_expected_got_largest_and_hint_in_that_order():
    def no_max(x, temperature=1.0):
        e = (x / temperature).exp()
        return e / e.sum(-1, keepdim=True)

    text = str(check.softmax(no_max))
    assert text == (
        "check.softmax: FAILED after 2 passing cases\n"
        "  case:     scores of 1000: no NaN, the row maximum is subtracted first (section\n"
        "            1.6)\n"
        "  input:    x = [[1000, 999, 998]], temperature = 1\n"
        "  expected: [[0.665, 0.245, 0.09]]\n"
        "  got:      [[nan, nan, nan]]\n"
        "  largest:  |got - expected| = nan at [0, 0], allowed 1e-05 + 1e-05 |expected|\n"
        "  hint:     your softmax gives NaN for scores of 1000: exp(1000) is inf and inf\n"
        "            / inf is NaN; subtract each row's maximum first (section 1.6,\n"
        "            Numerical stability)")


def test_expected_and_got_print_as_many_digits_as_it_takes_to_tell_them_apart():
    expected = torch.tensor([0.1234567, 2.0, 3.0], dtype=torch.float64)
    got = expected.clone()
    got[0] = 0.1234569
    difference = describe_difference(expected, got)
    assert difference is not None
    assert (difference.expected, difference.got) == ("[0.1234567, 2, 3]", "[0.1234569, 2, 3]")
    assert difference.largest == ("|got - expected| = 2e-07 at [0], allowed 1e-09 + 1e-07 "
                                  "|expected|")
    assert describe_difference(expected, got, tol=FLOAT32) is None  # 2e-07 < 1e-05


def test_the_largest_difference_is_reported_where_it_is_with_its_row():
    expected = torch.zeros(2, 3, 20, dtype=torch.float64)
    got = expected.clone()
    got[0, 0, 0], got[1, 2, 7] = 1e-3, 0.5  # the second is the largest
    difference = describe_difference(expected, got, tol=TIGHT)
    assert difference is not None and difference.kind == "value"
    assert difference.largest.startswith("|got - expected| = 0.5 at [1, 2, 7]")
    assert difference.got == "at [1, 2, 7]: 0.5"


def test_differences_name_shapes_dtypes_and_kinds():
    expected = torch.arange(24.0).reshape(2, 3, 4)
    got = expected.clone()
    got[1, 2, 3] = -1.0
    difference = describe_difference(expected, got)
    assert difference is not None and (difference.expected, difference.got) == (
        "row [1, 2]: [20, 21, 22, 23]", "row [1, 2]: [20, 21, 22, -1]")
    kinds = {
        "dtype": got.double(), "shape": got[0], "type": (got,),
        "nan": torch.where(got < 0, torch.nan, got)}
    for kind, wrong in kinds.items():
        found = describe_difference(expected, wrong)
        assert found is not None and found.kind == kind, (kind, found)
    assert describe_difference((expected,), expected).expected.startswith("a tuple of 1")
    assert describe_difference(expected, expected.clone()) is None
    assert describe_difference(torch.tensor([-torch.inf, 1.0]),
                               torch.tensor([-torch.inf, 1.0])) is None
    assert describe_difference(torch.tensor([torch.inf]), torch.tensor([5.0])) is not None
    assert describe_difference(math.inf, 857.0) is not None  # inf is no tolerance
    assert show(torch.tensor([[1000.0, -0.0, 0.123456]])) == "[[1000, 0, 0.123]]"


def test_a_function_that_changes_its_argument_fails_even_with_the_right_answer():
    def scales_q_in_place(q, k, v):  # right output, from a scaled copy of the caller's q
        q /= math.sqrt(q.shape[-1])
        weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return weights @ v, weights

    result = check.attention(scales_q_in_place)
    failure = result.failure
    assert failure is not None and result.checked == ()
    assert failure.expected.startswith("q unchanged, as passed: [[4, 5], [10, 11]")
    assert failure.got.startswith("q changed: [[2.83, 3.54]")
    assert failure.hint.startswith("your function changed its argument q in place")


def test_the_expected_value_comes_from_a_private_copy_computed_before_the_learners_code():
    seen = []

    def spoils_its_input(x, temperature=1.0):
        seen.append(x)
        x.fill_(0.0)  # were the reference computed from this x, 1/3 would be expected
        return torch.softmax(x / temperature, dim=-1)

    failure = check.softmax(spoils_its_input).failure
    assert failure is not None
    assert failure.expected == "[[0.659, 0.242, 0.0986], [0.333, 0.333, 0.333]]"
    assert failure.got.startswith("[[0.333, 0.333, 0.333]")
    assert failure.hint.startswith("your function changed its argument x in place")
    assert seen and not seen[0].any()  # the learner's own copy, spoilt


def test_a_layer_is_checked_in_eval_mode():
    base = SOLUTIONS["multi_head_attention"]

    class OnlyInEval(base):
        def forward(self, x, mask=None):
            assert not self.training, "value cases run in eval mode"
            return super().forward(x, mask=mask)

    assert check.multi_head_attention(OnlyInEval).passed


def test_a_function_that_hangs_is_reported_with_the_case_it_hung_on():
    def hangs_on_temperature(x, temperature=1.0):
        while temperature != 1.0:  # an endless loop, even with a broad except inside
            try:
                pass
            except Exception:
                pass
        return torch.softmax(x, dim=-1)

    with time_limit(0.5):
        result = check.softmax(hangs_on_temperature)
    failure = result.failure
    assert failure is not None and failure.hung
    assert failure.case.startswith("temperatures 0.5 and 4")
    assert failure.expected == "an answer within 0.5 s"
    assert "a loop that never ends" in failure.hint
    assert check.softmax(SOLUTIONS["softmax"]).passed  # the alarm is off again


def test_a_function_that_calls_sys_exit_fails_and_the_check_goes_on():
    def exits(x, temperature=1.0):
        sys.exit(3)

    failure = check.softmax(exits).failure
    assert failure is not None and failure.got == "SystemExit: 3"
    assert "called sys.exit()" in failure.hint


def test_ctrl_c_in_the_learners_code_stops_the_check_and_says_where():
    def interrupted(x, temperature=1.0):
        raise KeyboardInterrupt

    with pytest.raises(CheckInterrupted) as caught:
        check.softmax(interrupted)
    assert isinstance(caught.value, KeyboardInterrupt)
    assert caught.value.check == "softmax"
    assert caught.value.case.startswith("two rows of scores")


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


def test_printed_results_are_the_same_on_every_run_and_hold_no_address():
    wrong = {name: entries[0][1] for name, entries in CATALOGUE.items()}
    for name, fn in check.CHECKS.items():
        for learner in (SOLUTIONS[name], wrong[name]):
            first, second = str(fn(learner)), str(fn(learner))
            assert first == second, name
            assert "0x" not in first, first
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
    argument = "cls" if name in CLASSES else "fn"
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


def _report_words() -> list[str]:
    """Every plan line, case hint and known mistake's and property's hint of every check."""
    words = []
    for table in check.TABLES.values():
        words += table.plan()
        words += [case.hint for case in table.cases]
        words += [m.hint for m in table.mistakes]
        words += [p.hint for case in table.cases for p in case.properties]
        words += [p.hint for p in table.properties] + [hint for _, hint in table.errors]
    return words


def test_reports_cite_a_section_as_section_n_m_never_as_an_equation_number():
    # issue 44: "(1.5)" is the book's notation for equation 1.5
    words = _report_words()
    cited = [n for text in words for n in re.findall(r"\bsections? (\d+\.\d+)", text)]
    assert cited and set(cited) <= set(SECTIONS), sorted(set(cited) - set(SECTIONS))
    bare = [text for text in words if re.search(r"\(\d+\.\d+(?:,\s*\d+\.\d+)*\)", text)]
    assert not bare, bare
    assert all(case.section in SECTIONS for t in check.TABLES.values() for case in t.cases)
    reports = [str(check.CHECKS[name](fn)) for name, fn in SOLUTIONS.items()]
    reports += [str(check.CHECKS[name](entries[0][1])) for name, entries in CATALOGUE.items()]
    assert not [r for r in reports if re.search(r"\(\d+\.\d+\)", r)]


def test_importing_the_package_does_not_load_the_checks():
    code = ("import sys, course_attn; print('course_attn.check' in sys.modules); "
            "course_attn.check; print('course_attn.check' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.split() == ["False", "True"]


def test_every_check_module_exports_its_checks_and_every_check_has_a_table():
    exported = {name for module in MODULES for name in module.__all__}
    assert exported == set(check.CHECKS) == set(check.TABLES)
    assert all(check.TABLES[name].name == name for name in check.CHECKS)


def test_the_registry_names_every_check_once_with_its_signature():
    assert set(check.CHECKS) == set(check.NAMES) == set(check.SIGNATURES)
    assert set(check.LEARNER_NAMES) == set(check.CHECKS)
    names = [n for names in check.LEARNER_NAMES.values() for n in names]
    assert len(set(names)) == len(names)
    assert all(check.NAMES[c] == check.LEARNER_NAMES[c][0] for c in check.CHECKS)
    assert all(check.CHECKS[name].__doc__ and re.search(r"\(Ch(apter|\.) \d+\)",
                                                        check.CHECKS[name].__doc__ or "")
               for name in check.CHECKS)
    assert isinstance(check.softmax(SOLUTIONS["softmax"]), CheckResult)


def test_the_notebooks_exercise_names_are_names_the_command_line_looks_for():
    calls = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            calls += re.findall(r"check\.(\w+)\(((?:my_|My)\w+)\)", source)
    assert len(calls) >= 24, calls  # every chapter's "your turn" cells
    missing = [(c, n) for c, n in calls if n not in check.LEARNER_NAMES.get(c, ())]
    assert not missing, missing


def test_the_references_pass_under_the_perturbed_numerics_of_make_nbval_perturbed():
    # A solution cell in a notebook runs its check under tools/perturbed (random draws and
    # gradients nudged): a correct solution must still pass there.
    code = (f"exec(open({str(ROOT / 'tools/perturbed/perturb_numerics.py')!r}).read())\n"
            "import check_solutions as s, check_correct as c\n"
            "from course_attn import check\n"
            "print([n for n, fn in s.SOLUTIONS.items() if not check.CHECKS[n](fn).passed]\n"
            "      + [l for n, e in c.CORRECT.items() for l, fn in e\n"
            "         if not check.CHECKS[n](fn).passed])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT / "tests", timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
