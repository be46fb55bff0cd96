"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under pytest-xdist (make test: four workers) every test that needs something the machine holds once runs on
# the worker that holds it: a test bed (tests/testbed_fixture.py: bed "a" or "b", by module, with Slurm, Ray and
# the Unix users on theirs) or podman's image store (its modules are bed "a"'s).
BED_FIXTURES = frozenset({"testbed", "testbeds", "slurm", "slurm_cluster", "ray_cluster", "unix_users"})

pytest_plugins = ["tests.testbed_fixture", "tests.slurm_fixture", "tests.container_fixture", "tests.docker_fixture", "tests.users_fixture", "tests.webhook"]


@pytest.fixture(scope="session", autouse=True)
def session_lease_dir(tmp_path_factory) -> Iterator[Path]:
    """Jobs that module- and session-scoped fixtures start (set up before any test's own directory) lease in a
    directory of this session: two xdist workers never find each other's leases in the machine's."""
    path = tmp_path_factory.mktemp("session-leases")
    before = os.environ.get("LAUNCH_LEASE_DIR")
    os.environ["LAUNCH_LEASE_DIR"] = str(path)
    yield path
    if before is None:
        os.environ.pop("LAUNCH_LEASE_DIR", None)
    else:
        os.environ["LAUNCH_LEASE_DIR"] = before


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


def pytest_configure(config: pytest.Config) -> None:
    """TERM (a CI timeout, `timeout make test`) ends a run as Ctrl-C does, through the fixtures' teardown: killed
    outright, a session left its beds (namespaces, sshd, Ray) running."""

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupted)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs a bed must be in a module BED_OF_MODULE lists: that is how its worker is chosen."""
    from tests.testbed_fixture import BED_OF_MODULE

    unlisted = sorted({Path(str(item.fspath)).stem for item in items
                       if set(getattr(item, "fixturenames", ())) & (BED_FIXTURES | {"container_image"})
                       and Path(str(item.fspath)).stem not in BED_OF_MODULE})
    if unlisted:
        raise pytest.UsageError(f"tests/testbed_fixture.py BED_OF_MODULE lacks {', '.join(unlisted)}, whose tests use a "
                                "test bed or podman: add each to bed 'a' or 'b'")


# Modules whose module-scoped fixture runs jobs (the observed programs: 8 jobs, about 2 minutes): all their tests go
# to one worker, which makes the fixture once (spread test by test, every worker made it again: 3 x 2 minutes).
SHARED_FIXTURE_MODULES = frozenset({"test_observed_programs", "test_strategies", "test_metrics_cli",
                                    "test_flight_recorder", "test_verdict_scale", "test_record_property"})


def pytest_xdist_make_scheduler(config, log):
    """xdist (make test: four workers) sends every test of a bed's modules to one worker, and every test of a
    SHARED_FIXTURE_MODULES module to one, the other tests one by one: a bed or a module's jobs are made once.
    (xdist's own loadgroup cannot do it under pytest 9: the group it writes into a test's id does not reach the
    scheduler.)"""
    from xdist.scheduler import LoadScopeScheduling

    from tests.testbed_fixture import bed_of_nodeid

    class BedScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            bed = bed_of_nodeid(nodeid)
            if bed:
                return f"bed-{bed}"
            module = nodeid.split("::", 1)[0]
            return module if Path(module).stem in SHARED_FIXTURE_MODULES else nodeid

    return BedScheduling(config, log)
