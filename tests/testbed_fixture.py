"""Pytest fixture and helpers for the namespaced SSH testbed (tools/testbed.py).

Load it once, from tests/conftest.py, as a plugin::

    pytest_plugins = ["tests.testbed_fixture"]

(a plugin is registered once however many modules name it; importing the
fixture function into several modules would create one testbed per module, and
each ``up`` tears down the previous one, since host names are fixed).

``testbed`` gives the test its module's bed (two beds under different names, so
two xdist workers can hold one each); each is brought up once per session and torn
down at the end. A machine holds one bed of a name at a time, so concurrent pytest
sessions take turns through an exclusive lock file per name. Tests that break a host
use the context managers below, which repair it even when the test fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from tools import testbed as tb

TESTBED_HOSTS = 4
LOCK_TIMEOUT_S = 900.0
# Two beds under different names, so two pytest-xdist workers can each hold one: the suite's own ("a", whose
# host names and addresses some tests spell out) and a second one ("b"). Each test module uses one bed
# (BED_OF_MODULE; "a" by default), and tests/conftest.py puts every test of a bed in one xdist group, so a
# bed is made by one worker only.
BED_NAMES = {"a": tb.Names(), "b": tb.Names(prefix="lu-", subnet="10.81.0")}
BED_OF_MODULE = {
    **dict.fromkeys(("test_check", "test_container_image", "test_containers", "test_docker", "test_init", "test_leases",
                     "test_ssh_backend", "test_ssh_known_hosts_markers", "test_testbed", "test_user_programs_ssh"), "a"),
    **dict.fromkeys(("test_dashboard_live", "test_elastic", "test_ray_backend", "test_slurm_backend", "test_slurm_testbed"),
                   "b"),
}
SLURM_BED = RAY_BED = "b"
USERS_BED = "a"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C and TERM ignored while a bed is torn down: a second Ctrl-C during a slow teardown (``ray stop``, sshd,
    namespaces) used to leave the rest of the bed running. Outside the main thread signals cannot be set: as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def bed_of(item: pytest.Item) -> str:
    """The bed a test runs on: by its module."""
    return BED_OF_MODULE.get(Path(str(item.fspath)).stem, "a")


def bed_of_nodeid(nodeid: str) -> str | None:
    """The bed of a test id's module, None for a module that uses none."""
    return BED_OF_MODULE.get(Path(nodeid.split("::", 1)[0]).stem)


@contextlib.contextmanager
def _machine_lock(names: tb.Names) -> Iterator[None]:
    """Hold the machine-wide lock of the beds of ``names``, waiting up to LOCK_TIMEOUT_S for it."""
    path = Path(tempfile.gettempdir()) / f"{names.prefix}testbed.lock"
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    with open(path, "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test session holds {path} (testbed in use)")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Beds:
    """The session's test beds, each brought up when a test first asks for it and torn down at the end."""

    def __init__(self, base: Path, stack: contextlib.ExitStack) -> None:
        self._base, self._stack, self._beds = base, stack, {}

    def get(self, which: str) -> tb.Testbed:
        if which not in self._beds:
            names = BED_NAMES[which]
            self._stack.enter_context(_machine_lock(names))
            bed = tb.up(TESTBED_HOSTS, self._base / which, names)
            self._stack.callback(tb.down, bed.base_dir, names)
            self._beds[which] = bed
        return self._beds[which]


@pytest.fixture(scope="session")
def testbeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Beds]:
    """TESTBED_HOSTS namespaced hosts with sshd per bed, up for the rest of the session once asked for."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    stack = contextlib.ExitStack()
    try:
        yield Beds(tmp_path_factory.mktemp("testbeds"), stack)
    finally:
        with uninterrupted():
            stack.close()


@pytest.fixture
def testbed(testbeds: Beds, request: pytest.FixtureRequest) -> tb.Testbed:
    """The bed of this test's module (BED_OF_MODULE)."""
    return testbeds.get(bed_of(request.node))


def ssh_client(bed: tb.Testbed, host: tb.Host, timeout: float = 5.0) -> paramiko.SSHClient:
    """A paramiko client connected to ``host`` as root, checking its key against known_hosts."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(bed.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(host.address, port=tb.SSH_PORT, username=tb.SSH_USER,
                       key_filename=str(bed.key_file), look_for_keys=False, allow_agent=False,
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
    except BaseException:
        client.close()
        raise
    return client


def ssh_run(bed: tb.Testbed, host: tb.Host, command: str,
            timeout: float = 30.0) -> tuple[int, str, str]:
    """Run ``command`` on ``host`` over SSH; return (exit status, stdout, stderr)."""
    with ssh_client(bed, host) as client:
        _, stdout, stderr = client.exec_command(command, timeout=timeout)
        out, err = stdout.read().decode(), stderr.read().decode()
        return stdout.channel.recv_exit_status(), out, err


@contextlib.contextmanager
def sshd_stopped(host: tb.Host) -> Iterator[None]:
    """``host``'s sshd is down inside the block and running again after it."""
    tb.stop_sshd(host)
    try:
        yield
    finally:
        tb.start_sshd(host)


@contextlib.contextmanager
def link_cut(host: tb.Host) -> Iterator[None]:
    """``host`` is cut off the bridge inside the block and reconnected after it."""
    tb.link_down(host)
    try:
        yield
    finally:
        tb.link_up(host)


@contextlib.contextmanager
def ssh_blocked(host: tb.Host) -> Iterator[None]:
    """Every packet to ``host``'s SSH port is dropped inside the block (the ranks' traffic flows); not after it."""
    tb.ssh_blocked(host, True)
    try:
        yield
    finally:
        tb.ssh_blocked(host, False)


@contextlib.contextmanager
def host_key_rotated(bed: tb.Testbed, host: tb.Host) -> Iterator[None]:
    """``host`` has a new key that known_hosts lacks inside the block; after it,
    known_hosts is rewritten so later tests trust the new key."""
    tb.rotate_host_key(host)
    try:
        yield
    finally:
        tb.write_known_hosts(bed)
