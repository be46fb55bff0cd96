"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.testbed_fixture", "tests.slurm_fixture", "tests.container_fixture"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private LAUNCH_HOME for one test."""
    path = tmp_path / "launch-home"
    monkeypatch.setenv("LAUNCH_HOME", str(path))
    return path
