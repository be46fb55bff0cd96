"""Host keys for the ``ssh`` backend, checked against the cluster's known_hosts and nothing else: the file parsed
(``@revoked`` keys kept apart, entries indexed by name), an unknown key rejected (``launch trust HOST`` records one after
showing its fingerprint), a changed key refused with both fingerprints, before any command runs."""

from __future__ import annotations

import base64
import hashlib
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from launcher.errors import LaunchError, PreflightError
from launcher.spec.files import read_regular

if TYPE_CHECKING:
    from launcher.backends.ssh.target import Target

MAX_SSH_FILE_BYTES = 64 * 2**20  # a known_hosts or ssh config file: never a FIFO or a device, never unbounded


class HostKeyError(PreflightError):
    """A host's key is unknown or differs from known_hosts; nothing was run on it."""


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...``, the fingerprint OpenSSH prints for a key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class KnownHosts(paramiko.HostKeys):
    """known_hosts entries, and the keys its ``@revoked`` lines name (never trusted, for any host). Looked up by name
    in a dict: paramiko's own path re-parses and scans the file per client (20 s for 1,158 entries in an Ansible report)."""

    _entries: list[HostKeyEntry]  # paramiko.HostKeys' own list of entries (its stubs do not declare it)

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
