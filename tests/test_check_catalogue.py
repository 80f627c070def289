"""The checks of ``course_attn.check`` catch the mistakes learners make, with the right hint.

For every check, a catalogue of typical wrong implementations (``tests/check_wrong.py``):
each must fail its check, and the hint it gets must be the one written for that mistake
(the test reads the hint's key phrase). A catalogue of correct but unusual ones
(``tests/check_correct.py``) must pass, as must the package's reference written as a
learner would call it (``tests/check_solutions.py``). And the hints are right or silent:
no known mistake, and no property, is ever told to the reference; every known mistake
can be told (it differs from the reference on some case); and each known mistake, written
as the learner's code, gets its own hint.
"""

from __future__ import annotations

import pytest
from check_correct import CORRECT
from check_solutions import SOLUTIONS
from check_wrong import CATALOGUE, KINDS

from course_attn import check
from course_attn.check import TABLES
from course_attn.check.runner import Check, clone
from course_attn.check.values import describe_difference, matches

WRONG = [(name, label, fn, phrase) for name, entries in CATALOGUE.items()
         for label, fn, phrase in entries]
RIGHT = [(name, label, fn) for name, entries in CORRECT.items() for label, fn in entries]


def test_every_check_has_a_catalogue_of_at_least_five_mistakes_and_two_correct_answers():
    assert set(CATALOGUE) == set(check.CHECKS) == set(CORRECT)
    small = {name: len(entries) for name, entries in CATALOGUE.items() if len(entries) < 5}
    assert not small, small
    assert all(len(entries) >= 2 for entries in CORRECT.values())


@pytest.mark.parametrize(("kind", "least"), [
    ("changes an argument in place", 10), ("drops a size-1 dimension", 15),
    ("mixes up d_k and d_v", 4), ("has a bias the exercise does not", 1),
    ("detaches the gradient", 3), ("makes every mask causal", 1),
    ("trains a little off", 2)])
def test_the_catalogue_covers_the_kinds_of_bug_that_slipped_through_before(kind, least):
    # issue 40: these passed the checks of issue 34
    entries = KINDS[kind]
    assert len(entries) >= least, entries
    labels = {(name, label) for name, label, _, _ in WRONG}
    assert set(entries) <= labels


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_the_reference_passes_its_check(name):
    result = check.CHECKS[name](SOLUTIONS[name])
    assert result.passed, str(result)
    assert result.failure is None and result.written


@pytest.mark.parametrize(("name", "label", "fn", "phrase"), WRONG,
                         ids=[f"{name}-{label}" for name, label, _, _ in WRONG])
def test_each_mistake_fails_with_its_own_hint(name, label, fn, phrase):
    result = check.CHECKS[name](fn)
    assert result.written and not result.passed, str(result)
    assert result.failure is not None
    assert phrase in result.failure.hint, str(result)
    assert "section " in result.failure.hint  # every hint names the chapter's section


@pytest.mark.parametrize(("name", "label", "fn"), RIGHT,
                         ids=[f"{name}-{label}" for name, label, _ in RIGHT])
def test_each_correct_but_unusual_answer_passes(name, label, fn):
    result = check.CHECKS[name](fn)
    assert result.passed, str(result)


def _outputs(table: Check, fn: object) -> list[object]:
    """``fn``'s output on every case of ``table``, through the case's harness."""
    found = []
    for case in table.cases:
        found.append(case.harness(fn, *clone(case.inputs())))
    return found


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_no_known_mistake_and_no_property_is_ever_told_to_the_reference(name):
    table = TABLES[name]
    for case, expected in zip(table.cases, _outputs(table, table.reference), strict=True):
        base = case.inputs()
        for mistake in table.mistakes:
            try:
                wrong = case.harness(mistake.wrong, *clone(base))
            except Exception:
                continue
            differs = describe_difference(expected, wrong, tol=case.tol) is not None
            assert not (differs and matches(expected, wrong, tol=case.tol)), (case.plan,
                                                                             mistake.hint)
        for prop in (*case.properties, *table.properties):
            assert not prop.told(expected, expected, base), (case.plan, prop.hint)


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_every_known_mistake_differs_from_the_reference_on_some_case(name):
    table = TABLES[name]
    reference = _outputs(table, table.reference)
    for mistake in table.mistakes:
        differs = []
        for case, expected in zip(table.cases, reference, strict=True):
            try:
                wrong = case.harness(mistake.wrong, *clone(case.inputs()))
            except Exception:
                differs.append(True)  # it cannot even run there
                continue
            differs.append(describe_difference(expected, wrong, tol=case.tol) is not None)
        assert any(differs), mistake.hint


@pytest.mark.parametrize("name", list(check.CHECKS))
def test_each_known_mistake_written_as_the_learners_code_gets_its_own_hint(name):
    table = TABLES[name]
    for mistake in table.mistakes:
        result = check.CHECKS[name](mistake.wrong)
        assert not result.passed and result.failure is not None, mistake.hint
        assert mistake.hint in result.failure.hint, (mistake.hint, str(result))
