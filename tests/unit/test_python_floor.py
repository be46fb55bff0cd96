"""The Python floor in pyproject.toml is true: the checkers run at it, and they catch code newer than it.

A review found `requires-python >= 3.10` beside `StrEnum` (3.11+): launch installed on 3.10 and every
command but --help died. mypy now checks at the floor, so a feature newer than it fails `make test`.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _floor() -> str:
    requires = PYPROJECT["project"]["requires-python"]
    assert requires.startswith(">="), requires
    return requires.removeprefix(">=")


def test_mypy_checks_at_the_floor_that_pyproject_declares():
    assert PYPROJECT["tool"]["mypy"]["python_version"] == _floor()


def test_ruff_takes_its_target_from_the_floor():
    assert "target-version" not in PYPROJECT["tool"]["ruff"], "ruff reads requires-python when no target is pinned"


def test_the_floor_admits_the_interpreter_the_suite_runs_on():
    major, minor = (int(part) for part in _floor().split("."))
    assert sys.version_info[:2] >= (major, minor)


def test_mypy_at_an_older_floor_catches_a_311_only_import(tmp_path):
    """The defect the review found by hand, caught by the checker: StrEnum under a 3.10 floor."""
    module = tmp_path / "states.py"
    module.write_text("from enum import StrEnum\n\n\nclass State(StrEnum):\n    RUNNING = 'RUNNING'\n")
    common = [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", "/dev/null", str(module)]
    older = subprocess.run([*common, "--python-version", "3.10"], capture_output=True, text=True, timeout=120)
    at_floor = subprocess.run([*common, "--python-version", _floor()], capture_output=True, text=True, timeout=120)
    assert older.returncode == 1 and "StrEnum" in older.stdout, older.stdout
    assert at_floor.returncode == 0, at_floor.stdout
