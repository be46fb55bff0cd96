"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.testbed_fixture", "tests.slurm_fixture", "tests.container_fixture", "tests.users_fixture"]


@pytest.fixture(autouse=True)
def lease_dir(tmp_path, monkeypatch):
    """Each test's jobs lease their slots in a directory of their own (docs/LEASES.md): tests that run at once, or
    other sessions on this machine, never find each other's leases; the lease tests share one on purpose."""
    path = tmp_path / "leases"
    monkeypatch.setenv("LAUNCH_LEASE_DIR", str(path))
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private LAUNCH_HOME for one test."""
    path = tmp_path / "launch-home"
    monkeypatch.setenv("LAUNCH_HOME", str(path))
    return path
