"""Binder builds its own lean environment from binder/ (repo2docker reads that folder first)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", re.MULTILINE)


def pins(path: Path) -> dict[str, str]:
    return {name.lower(): version for name, version in PIN.findall(path.read_text())}


def test_binder_has_its_own_environment_with_a_pinned_python():
    assert (BINDER / "requirements.txt").is_file()
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    post_build = BINDER / "postBuild"
    assert post_build.stat().st_mode & 0o111, "postBuild must be executable"
    assert "pip install --no-deps ." in post_build.read_text()


def test_binder_installs_a_cpu_torch_and_nothing_for_tests_or_the_book():
    binder = pins(BINDER / "requirements.txt")
    assert binder["torch"].endswith("+cpu")
    assert "download.pytorch.org/whl/cpu" in (BINDER / "requirements.txt").read_text()
    for tool in ("pytest", "nbval", "jupyter-book", "playwright", "ruff", "hypothesis"):
        assert tool not in binder, f"{tool} is not needed to read the notebooks"


def test_binder_pins_the_versions_the_course_is_tested_with():
    tested = pins(ROOT / "requirements.txt")
    binder = pins(BINDER / "requirements.txt")
    assert binder["torch"].removesuffix("+cpu") == tested["torch"]
    for name, version in binder.items():
        if name != "torch":
            assert tested.get(name) == version, f"{name}: {version}, tested {tested.get(name)}"
    dependencies = re.search(r"^dependencies = \[(.*)\]", (ROOT / "pyproject.toml").read_text(),
                             re.MULTILINE)
    needed = re.findall(r'"([a-z]+)[><=]', dependencies.group(1))
    assert set(needed) <= set(binder), f"binder lacks {set(needed) - set(binder)}"
