"""Pytest fixture and helpers for the namespaced SSH testbed (tools/testbed.py).

Load it once, from tests/conftest.py, as a plugin::

    pytest_plugins = ["tests.testbed_fixture"]

(a plugin is registered once however many modules name it; importing the
fixture function into several modules would create one testbed per module, and
each ``up`` tears down the previous one, since host names are fixed).

``testbed`` brings up ``TESTBED_HOSTS`` hosts once per session and tears them
down at the end. A machine holds one testbed at a time, so concurrent pytest
sessions take turns through an exclusive lock file. Tests that break a host
use the context managers below, which repair it even when the test fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from tools import testbed as tb

TESTBED_HOSTS = 4
LOCK_FILE = Path(tempfile.gettempdir()) / "lt-testbed.lock"
LOCK_TIMEOUT_S = 900.0

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Hold the machine-wide testbed lock, waiting up to LOCK_TIMEOUT_S for it."""
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    with open(LOCK_FILE, "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test session holds {LOCK_FILE} (testbed in use)")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tb.Testbed]:
    """TESTBED_HOSTS namespaced hosts with sshd, up for the whole session."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    with _machine_lock():
        bed = tb.up(TESTBED_HOSTS, tmp_path_factory.mktemp("testbed"))
        try:
            yield bed
        finally:
            tb.down(bed.base_dir)


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
