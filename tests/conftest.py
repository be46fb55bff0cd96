"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest

# Fixtures that hold something the machine has once (the namespaced test bed, and the Slurm and Ray
# clusters on it; podman's image store): under pytest-xdist every test that uses one runs on the same
# worker, so two workers never build or tear down the same bed at once.
MACHINE_WIDE_FIXTURES = frozenset({"testbed", "container_image"})
MACHINE_WIDE_GROUP = "machine-wide-beds"

pytest_plugins = ["tests.testbed_fixture", "tests.slurm_fixture", "tests.container_fixture", "tests.users_fixture", "tests.webhook"]


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put every test that needs a machine-wide bed in one xdist group (``--dist loadgroup``)."""
    for item in items:
        if MACHINE_WIDE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(MACHINE_WIDE_GROUP))
