"""``Connection.run``'s timeout bounds the whole command, not each receive: a remote command that keeps
printing a little at a time cannot hold preflight, a sweep or a stack dump past it.

The channel is a fake whose every receive takes 10 s of a fake clock; nothing sleeps.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from launcher.backends.ssh import connection
from launcher.backends.ssh.connection import Connection
from launcher.backends.ssh.target import Target
from launcher.errors import LaunchError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class TricklingChannel:
    """A command that prints one byte every 10 s (of ``clock``) for ``chunks`` receives, then exits 0."""

    def __init__(self, clock: Clock, chunks: int) -> None:
        self.clock, self.chunks = clock, chunks
        self.status_event = threading.Event()
        self.exit_status = -1
        self.timeouts: list[float | None] = []

    def set_combine_stderr(self, combine: bool) -> None:
        pass

    def exec_command(self, command: str) -> None:
        pass

    def shutdown_write(self) -> None:
        pass

    def settimeout(self, timeout: float | None) -> None:
        self.timeouts.append(timeout)

    def recv(self, size: int) -> bytes:
        if self.chunks == 0:
            self.exit_status = 0
            self.status_event.set()
            return b""
        self.chunks -= 1
        self.clock.now += 10.0
        return b"x"

    def recv_stderr(self, size: int) -> bytes:
        return b""

    def makefile(self, mode: str) -> SimpleNamespace:  # the file paramiko offers over recv
        return SimpleNamespace(read=lambda: b"".join(iter(lambda: self.recv(65536), b"")))

    def makefile_stderr(self, mode: str) -> SimpleNamespace:
        return SimpleNamespace(read=lambda: b"")

    def close(self) -> None:
        pass


def connection_to(channel: TricklingChannel) -> Connection:
    transport = SimpleNamespace(set_keepalive=lambda seconds: None, open_session=lambda timeout: channel,
                                is_active=lambda: True, sock=SimpleNamespace(settimeout=lambda seconds: None))
    client = SimpleNamespace(get_transport=lambda: transport)
    return Connection(Target("gpu-01", "10.0.0.1", 22, "train"), client, "10.0.0.1")


def test_a_command_that_keeps_printing_past_the_timeout_is_stopped_at_it(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(connection, "time", clock)
    channel = TricklingChannel(clock, chunks=100)  # 1000 s of output, every receive well within 30 s

    with pytest.raises(LaunchError, match=r"gpu-01 \(10.0.0.1:22\): `python3` did not finish within 30 s"):
        connection_to(channel).run(["python3", "-c", "pass"], timeout=30)

    assert clock.now - 1000.0 <= 40.0  # it stopped reading at the deadline, not after the 1000 s of output


def test_a_command_within_its_timeout_gives_its_output_and_status(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(connection, "time", clock)
    result = connection_to(TricklingChannel(clock, chunks=2)).run(["true"], timeout=30)
    assert (result.code, result.out, result.err) == (0, "xx", "")
