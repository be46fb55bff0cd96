"""SSH connections for the ``ssh`` backend: connecting (the host key checked first, ``launcher.backends.ssh.hostkeys``),
commands, the pool of connections and fan-out.

Every remote command is an argv rendered by ``shell.render_command``; ``fan_out`` runs
one step per host on a thread pool of at most ``ssh.fanout`` threads (pdsh's ``-f``) and
returns per-host results (fabric-style).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar, cast

import paramiko

from launcher.backends.ssh.hostkeys import KnownHosts, check_host_key
from launcher.backends.ssh.settings import SSHSettings
from launcher.backends.ssh.target import Target
from launcher.errors import LaunchError
from launcher.plan.shell import render_command

KEEPALIVE_S = 1
DEAD_AFTER_S = 4
# paramiko's transport thread polls its socket every 0.1 s (to see a close, to send the keepalive): ten socket.timeouts
# raised and caught in Python a second a connection, 3% of a core for a 64-node job's supervisor with nothing to read
# (docs/BENCHMARKS.md, "A supervisor that stays light"). Once a second still sends a keepalive every 1-2 s, well
# within DEAD_AFTER_S; a close does not wait for it (paramiko's stop_thread returns once the packetizer is closed).
TRANSPORT_POLL_S = 1.0
MAX_PARALLEL = 32  # the default fan-out cap (SSHSpec.fanout), as pdsh's
CONNECTION_ERRORS = (OSError, EOFError, paramiko.SSHException)

T = TypeVar("T")
K = TypeVar("K")


class _CheckKnownHosts(paramiko.MissingHostKeyPolicy):
    """Accepts a host's key only if known_hosts holds it, else says which host and key it rejected."""

    def __init__(self, target: Target, known: KnownHosts, known_hosts: Path) -> None:
        self.target, self.known, self.known_hosts = target, known, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        check_host_key(self.known, self.target, key, self.known_hosts)


@dataclass(frozen=True)
class RunResult:
    """A finished remote command. ``code`` is -1 when the connection closed without a status."""

    code: int
    out: str
    err: str


class Connection:
    """One authenticated SSH connection to a host."""

    def __init__(self, target: Target, client: paramiko.SSHClient, peer: str | None) -> None:
        self.target = target
        self.client = client
        self._peer = peer
        transport = client.get_transport()
        if transport is None:
            client.close()
            raise LaunchError(f"{target.label}: the SSH connection closed as it opened")
        self.transport = transport
        self.transport.set_keepalive(KEEPALIVE_S)
        self.transport.sock.settimeout(TRANSPORT_POLL_S)

    @property
    def alive(self) -> bool:
        """False once the transport died (closed, or its peer silent for DEAD_AFTER_S)."""
        return self.transport.is_active()

    def peer_address(self) -> str:
        """The host's address: the TCP peer, or (behind a jump host) the address sshd was reached at."""
        if self._peer is None:
            fields = self.run(["printenv", "SSH_CONNECTION"]).out.split()
            self._peer = fields[2] if len(fields) == 4 else self.target.hostname
        return self._peer

    def exec(self, command: str, timeout: float = 30.0, combine: bool = False) -> paramiko.Channel:
        """Open a session channel (no pty) running ``command`` (from render_command).

        With ``combine`` the command's stderr arrives merged into its stdout.
        """
        channel = self.transport.open_session(timeout=timeout)
        channel.set_combine_stderr(combine)
        channel.exec_command(command)
        return channel

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        *,
        timeout: float = 30.0,
        combine: bool = False,
    ) -> RunResult:
        """Run ``argv`` and wait for it, ``timeout`` seconds in all (opening, output, exit status); LaunchError
        once they have passed. With ``combine`` stderr is merged into ``out``.

        Without it stdout is read before stderr: fine for short outputs.
        """
        deadline = time.monotonic() + timeout
        channel = self.exec(render_command(argv, env, cwd), timeout, combine)
        try:
            channel.shutdown_write()
            out = _read_until_eof(channel, channel.recv, deadline)
            err = _read_until_eof(channel, channel.recv_stderr, deadline)
            channel.status_event.wait(max(0.0, deadline - time.monotonic()))
            code = channel.exit_status if channel.status_event.is_set() else -1
        except TimeoutError:
            raise LaunchError(f"{self.target.label}: `{argv[0]}` did not finish within {timeout:.0f} s") from None
        finally:
            channel.close()
        return RunResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def open_tunnel(self, hostname: str, port: int, timeout: float) -> paramiko.Channel:
        """A direct-tcpip channel to ``hostname:port`` from this host (a ProxyJump hop)."""
        return self.transport.open_channel("direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=timeout)

    def sftp(self) -> paramiko.SFTPClient:
        """An SFTP session on this connection (the caller closes it)."""
        return self.client.open_sftp()

    def close(self) -> None:
        """Close the connection and every channel on it."""
        self.client.close()


def _read_until_eof(channel: paramiko.Channel, recv: Callable[[int], bytes], deadline: float) -> bytes:
    """Everything ``recv`` (the channel's stdout or stderr) gives until EOF; TimeoutError at ``deadline``
    (a command that keeps printing does not hold the caller past it)."""
    data = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        channel.settimeout(left)
        chunk = recv(65536)
        if not chunk:
            return bytes(data)
        data += chunk


def _tcp_socket(target: Target, timeout: float) -> socket.socket:
    """A TCP connection whose peer is declared dead after DEAD_AFTER_S of unacknowledged data."""
    sock = socket.create_connection((target.hostname, target.port), timeout=timeout)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_AFTER_S * 1000)
    return sock


def open_socket(target: Target, timeout: float, via: Connection | None) -> socket.socket | paramiko.Channel:
    """The byte stream to the host's sshd: TCP, or a tunnel through the jump host ``via``."""
    try:
        return via.open_tunnel(target.hostname, target.port, timeout) if via else _tcp_socket(target, timeout)
    except CONNECTION_ERRORS as exc:
        how = f"through {via.target.alias}" if via else "over TCP"
        raise LaunchError(f"{target.label}: cannot connect {how}: {_reason(exc)} (is the host up and sshd running?)") from None


def connect(
    target: Target,
    settings: SSHSettings,
    timeout: float,
    via: Connection | None = None,
    on_peer: Callable[[str], None] | None = None,
) -> Connection:
    """Connect and authenticate, checking the host key first; LaunchError naming the host otherwise.

    ``on_peer`` learns the TCP peer address as soon as TCP connects, before the SSH handshake.
    """
    sock = open_socket(target, timeout, via)
    if on_peer is not None and via is None:
        on_peer(sock.getpeername()[0])
    client = paramiko.SSHClient()
    known = settings.host_keys()
    # The client's own host keys stay empty: every offered key goes to the policy, which checks it against the
    # shared, indexed known_hosts (copying the entries into each client costs a scan per entry per host).
    client.set_missing_host_key_policy(_CheckKnownHosts(target, known, settings.known_hosts))
    try:
        client.connect(
            target.hostname, port=target.port, username=target.user, sock=sock,
            key_filename=list(target.key_files) or None,  # type: ignore[arg-type]  # a list too (stubs say str)
            look_for_keys=not target.key_files, allow_agent=not target.key_files, timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        check_host_key(settings.host_keys(), target, exc.key, settings.known_hosts)
        raise LaunchError(f"{target.label}: host key rejected: {exc}") from None
    except paramiko.AuthenticationException as exc:
        client.close()
        keys = ", ".join(target.key_files) or "your default keys and agent"
        raise LaunchError(f"{target.label}: authentication as {target.user} failed with {keys}: {_reason(exc)}") from None
    except (LaunchError, *CONNECTION_ERRORS) as exc:
        client.close()
        if isinstance(exc, LaunchError):
            raise
        raise LaunchError(f"{target.label}: SSH handshake failed: {_reason(exc)}") from None
    return Connection(target, client, None if via else sock.getpeername()[0])


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class Pool:
    """Connections shared by a backend's steps, one per host (jump hosts included)."""

    def __init__(self, settings: SSHSettings, timeout: float) -> None:
        self.settings = settings
        self.timeout = timeout
        self._connections: dict[Target, Connection] = {}
        self._locks: dict[Target, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, target: Target, timeout: float | None = None, on_peer: Callable[[str], None] | None = None) -> Connection:
        """The live connection to ``target``, connecting (again) when there is none (see ``connect``)."""
        with self._guard:
            lock = self._locks.setdefault(target, threading.Lock())
        with lock:
            conn = self._connections.get(target)
            if conn is not None and conn.alive:
                return conn
            if conn is not None:
                conn.close()
            wait = timeout or self.timeout
            via = self.get(target.via, wait) if target.via else None
            conn = connect(target, self.settings, wait, via, on_peer)
            self._connections[target] = conn
            return conn

    def close(self) -> None:
        """Close every connection."""
        with self._guard:
            connections = list(self._connections.values())
            self._connections.clear()
        for conn in connections:
            conn.close()


@dataclass(frozen=True)
class HostResult(Generic[K, T]):
    """What one host's step returned, or the error it raised (fabric's per-host result)."""

    key: K
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def got(self) -> T:
        """The step's value; its error raised again when it failed (check ``ok`` first)."""
        if self.error is not None:
            raise self.error
        return cast(T, self.value)

    @property
    def failure(self) -> BaseException:
        """The step's error (check ``ok`` first)."""
        if self.error is None:
            raise ValueError(f"{self.key}: the step did not fail")
        return self.error


def fan_out(step: Callable[[K], T], keys: Sequence[K], limit: int = MAX_PARALLEL) -> list[HostResult[K, T]]:
    """Run ``step`` for every key, at most ``limit`` at once (``SSHSettings.fanout``); per-key results in the
    order of ``keys``."""
    if not keys:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(limit, len(keys))), thread_name_prefix="ssh") as pool:
        futures = [pool.submit(step, key) for key in keys]
    return [HostResult(k, error=f.exception()) if f.exception() else HostResult(k, value=f.result()) for k, f in zip(keys, futures)]


def error_text(exc: BaseException) -> str:
    """The user-facing text of a per-host error; programming errors are re-raised."""
    if isinstance(exc, LaunchError):
        return str(exc)
    if isinstance(exc, CONNECTION_ERRORS):
        return f"connection lost: {_reason(exc)}"
    raise exc
