"""SSH connections for the ``ssh`` backend: hosts, host keys, commands and fan-out.

A host is resolved like OpenSSH does (``HostName``, ``User``, ``Port``, ``IdentityFile``
and ``ProxyJump`` from ``~/.ssh/config``), with the values in ``cluster.yaml`` winning.
Host keys are checked against the cluster's ``known_hosts`` file and nothing else: an
unknown key is rejected (``launch trust HOST`` records one after showing its
fingerprint), a changed key refused with both fingerprints before any command runs.

Every remote command is an argv rendered by ``shell.render_command``; ``fan_out`` runs
one step per host on a thread pool of at most ``ssh.fanout`` threads (pdsh's ``-f``) and
returns per-host results (fabric-style). known_hosts is parsed once and shared by every
connection (re-read only when the file changes), and looked up by name in a dict: paramiko's
own path re-parses and scans it per client (20 s for 1,158 entries in an Ansible report).
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from launcher.errors import LaunchError, PreflightError
from launcher.plan.shell import render_command
from launcher.spec.cluster import SSHSpec
from launcher.spec.files import expand_user, read_regular
from launcher.spec.hosts import Hop, check_host, check_port, parse_jump_hosts

KEEPALIVE_S = 1
DEAD_AFTER_S = 4
# paramiko's transport thread polls its socket every 0.1 s (to see a close, to send the keepalive): ten socket.timeouts
# raised and caught in Python a second a connection, 3% of a core for a 64-node job's supervisor with nothing to read
# (docs/BENCHMARKS.md, "A supervisor that stays light"). Once a second still sends a keepalive every 1-2 s, well
# within DEAD_AFTER_S; a close does not wait for it (paramiko's stop_thread returns once the packetizer is closed).
TRANSPORT_POLL_S = 1.0
MAX_SSH_FILE_BYTES = 64 * 2**20  # a known_hosts or ssh config file: never a FIFO or a device, never unbounded
MAX_PARALLEL = 32  # the default fan-out cap (SSHSpec.fanout), as pdsh's
CONNECTION_ERRORS = (OSError, EOFError, paramiko.SSHException)

T = TypeVar("T")
K = TypeVar("K")


class HostKeyError(PreflightError):
    """A host's key is unknown or differs from known_hosts; nothing was run on it."""


@dataclass(frozen=True)
class Target:
    """Where and as whom to connect: one host after ``~/.ssh/config`` and cluster.yaml."""

    alias: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...] = ()
    via: Target | None = None

    @property
    def label(self) -> str:
        """``alias (hostname:port)``, for messages."""
        return f"{self.alias} ({self.hostname}:{self.port})"

    @property
    def known_hosts_name(self) -> str:
        """The name the host's key is filed under in known_hosts (OpenSSH's convention)."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...``, the fingerprint OpenSSH prints for a key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class SSHSettings:
    """How to reach hosts: the cluster's ``ssh:`` section over ``~/.ssh/config``."""

    def __init__(self, spec: SSHSpec) -> None:
        self.spec = spec
        self.known_hosts = expand_user(spec.known_hosts, "ssh.known_hosts")
        self._config = _load_config(expand_user(spec.config_file, "ssh.config_file"))
        self._known: tuple[tuple[int, int, int] | None, KnownHosts] | None = None
        self._known_lock = threading.Lock()

    @property
    def fanout(self) -> int:
        """Hosts contacted at once (``ssh.fanout``)."""
        return self.spec.fanout

    def target(self, host: str, port: int | None = None, user: str | None = None) -> Target:
        """Resolve ``host`` (a name, address or ~/.ssh/config alias).

        Precedence: the node's ``port``/``user``, then ``ssh:`` in cluster.yaml
        (``ssh.port`` when not 22), then ~/.ssh/config, then 22 and the local user.
        """
        found = self._config.lookup(host)
        spec = self.spec
        via = None
        for hop in self._jump_hops(host, found):
            via = self._hop(hop, via)
        return Target(
            alias=host,
            hostname=self._config_value(host, found, "hostname", check_host, host),
            port=port or (spec.port if spec.port != 22 else self._config_value(host, found, "port", check_port, 22)),
            user=user or spec.user or found.get("user") or getpass.getuser(),
            key_files=self._key_files(found),
            via=via,
        )

    def _jump_hops(self, host: str, found: Mapping[str, Any]) -> list[Hop]:
        """The jump hosts to ``host``: cluster.yaml's ``ssh.jump_host`` (checked by the spec), else ProxyJump."""
        if self.spec.jump_host:
            return parse_jump_hosts(self.spec.jump_host)
        return self._config_value(host, found, "proxyjump", parse_jump_hosts, [])

    def _config_value(self, host: str, found: Mapping[str, Any], key: str, parse: Callable[[str], Any], default: Any) -> Any:
        """``key`` of ``host``'s ~/.ssh/config entry read by ``parse``; LaunchError naming the file when it is invalid."""
        if key not in found:
            return default
        try:
            return parse(found[key])
        except ValueError as exc:
            raise LaunchError(f"{self.spec.config_file}: {key} for host {host}: {exc}") from None

    def _hop(self, hop: Hop, via: Target | None) -> Target:
        """A ProxyJump hop, itself resolved through ~/.ssh/config."""
        found = self._config.lookup(hop.host)
        return Target(
            alias=hop.host,
            hostname=self._config_value(hop.host, found, "hostname", check_host, hop.host),
            port=hop.port or self._config_value(hop.host, found, "port", check_port, 22),
            user=hop.user or found.get("user") or self.spec.user or getpass.getuser(),
            key_files=self._key_files(found),
            via=via,
        )

    def _key_files(self, found: Mapping[str, Any]) -> tuple[str, ...]:
        if self.spec.key_file:
            return (str(expand_user(self.spec.key_file, "ssh.key_file")),)
        return tuple(str(Path(p).expanduser()) for p in found.get("identityfile", []))

    def host_keys(self) -> KnownHosts:
        """The known_hosts entries (empty when the file does not exist yet): parsed once and shared by every
        connection, parsed again only when the file changed (``launch trust`` writes it)."""
        with self._known_lock:
            signature = _signature(self.known_hosts)
            if self._known is None or self._known[0] != signature or signature is None:
                self._known = (signature, load_known_hosts(self.known_hosts))
            return self._known[1]


def _signature(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is rewritten (inode, size, modification time), None when it is missing."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class KnownHosts(paramiko.HostKeys):
    """known_hosts entries, and the keys its ``@revoked`` lines name (never trusted, for any host)."""

    def __init__(self) -> None:
        super().__init__()
        self.revoked: set[bytes] = set()
        self._by_name: dict[str, dict[str, paramiko.PKey]] = {}
        self._indexed = -1  # how many entries the index covers (-1: none; a later add() falls back to the scan)
        self._hashed = False

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return key.asbytes() in self.revoked

    def index(self) -> None:
        """Index the entries by plain host name: ``lookup`` becomes a dict access instead of a scan."""
        self._by_name = {}
        self._hashed = False
        for entry in self._entries:
            for name in entry.hostnames:
                if name.startswith("|1|"):
                    self._hashed = True
                else:
                    self._by_name.setdefault(name, {}).setdefault(entry.key.get_name(), entry.key)
        self._indexed = len(self._entries)

    def lookup(self, hostname: str) -> Any:
        """The keys recorded for ``hostname`` (type -> key), None when there are none."""
        if self._indexed != len(self._entries):
            return super().lookup(hostname)
        found = self._by_name.get(hostname)
        if found is not None:
            return dict(found)
        return super().lookup(hostname) if self._hashed else None


# What paramiko may raise on a line it cannot read: a bad base64 blob, a key that does not decode.
_BAD_LINE = (paramiko.SSHException, InvalidHostKey, ValueError, TypeError, IndexError, struct.error)


def load_known_hosts(path: Path) -> KnownHosts:
    """Parse an OpenSSH known_hosts file around paramiko's loader, which stops at marker lines.

    ``@revoked`` keys are collected and dropped from the entries (so paramiko never
    accepts them); ``@cert-authority`` lines are skipped, as launch does not accept
    host certificates; lines that cannot be read are skipped, as OpenSSH does.
    """
    known = KnownHosts()
    if not path.exists():
        return known
    try:
        text = read_regular(path, "known_hosts", MAX_SSH_FILE_BYTES).decode("utf-8", "replace")
    except OSError as exc:
        raise LaunchError(f"cannot read known_hosts {path}: {exc.strerror or exc}") from None
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
            if marker != "@revoked":
                continue
        try:
            entry = HostKeyEntry.from_line(line, number)
        except _BAD_LINE:
            continue
        if entry is None or entry.key is None:
            continue
        if marker == "@revoked":
            known.revoked.add(entry.key.asbytes())
        else:
            entries.append(entry)
    # Appended as HostKeys.load does (add() would keep one key per host and type; OpenSSH accepts every listed key).
    known._entries.extend(entry for entry in entries if entry.key.asbytes() not in known.revoked)
    known.index()
    return known


class _SSHConfig(paramiko.SSHConfig):
    """SSHConfig leaving ``%l`` as written: paramiko resolves the local FQDN for every IdentityFile,
    used or not, and with an unreachable nameserver each lookup then waits 5 s."""

    TOKENS_BY_CONFIG_KEY = {
        key: [token for token in tokens if token != "%l"] for key, tokens in paramiko.SSHConfig.TOKENS_BY_CONFIG_KEY.items()
    }


def _load_config(path: Path) -> paramiko.SSHConfig:
    if not path.exists():
        return _SSHConfig()
    try:
        return _SSHConfig.from_text(read_regular(path, "SSH config", MAX_SSH_FILE_BYTES).decode("utf-8", "replace"))
    except (OSError, paramiko.ConfigParseError) as exc:
        raise LaunchError(f"cannot read SSH config {path}: {exc}") from None


def key_status(known: paramiko.HostKeys, name: str, offered: paramiko.PKey) -> tuple[str, paramiko.PKey | None]:
    """``("new", None)``, ``("trusted", key)`` or ``("changed", recorded key)`` for ``offered``."""
    recorded = known.lookup(name)
    if recorded is None:
        return "new", None
    expected = recorded.get(offered.get_name()) or next(iter(recorded.values()))
    return ("trusted" if expected == offered else "changed"), expected


def check_host_key(known: paramiko.HostKeys, target: Target, offered: paramiko.PKey, known_hosts: Path) -> None:
    """Accept ``offered`` only if known_hosts holds it for ``target``; else raise HostKeyError.

    An unknown host is rejected (never added); a host whose recorded key
    differs is refused with the expected and the offered fingerprints.
    """
    name = target.known_hosts_name
    if isinstance(known, KnownHosts) and known.is_revoked(offered):
        raise HostKeyError(
            f"{target.label}: the host offered {offered.get_name()} {fingerprint(offered)}, a key {known_hosts} marks "
            "@revoked. Nothing was run on it.",
            hint="a revoked key is never accepted; ask the host's administrator which key it should have",
        )
    status, expected = key_status(known, name, offered)
    if status == "new":
        raise HostKeyError(
            f"{target.label}: host key not trusted: {name} is not in {known_hosts}; the host offered "
            f"{offered.get_name()} {fingerprint(offered)}. Nothing was run on it.",
            hint=f"check that fingerprint with the host's administrator, then run `launch trust {target.alias}`"
            " (add --cluster FILE to use the cluster's ssh settings)",
        )
    if status == "changed" and expected is not None:  # key_status gives the recorded key for a changed one
        raise HostKeyError(
            f"{target.label}: the host key has CHANGED: {known_hosts} has {expected.get_name()} "
            f"{fingerprint(expected)} for {name}, the host offered {offered.get_name()} {fingerprint(offered)}. "
            "Nothing was run on it: either the host was reinstalled or someone is intercepting the connection.",
            hint=f"confirm the new fingerprint out of band, then run `launch trust {target.alias} --replace`",
        )


class _CheckKnownHosts(paramiko.RejectPolicy):
    """RejectPolicy that says which host and key it rejected."""

    def __init__(self, target: Target, known: KnownHosts, known_hosts: Path) -> None:
        self.target, self.known, self.known_hosts = target, known, known_hosts

    def missing_host_key(self, client, hostname, key) -> None:
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
        self.transport = client.get_transport()
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
            key_filename=list(target.key_files) or None, look_for_keys=not target.key_files,
            allow_agent=not target.key_files, timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
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
