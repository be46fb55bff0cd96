"""Host-key trust for the SSH backend: fetch a host's key without logging in, record it in known_hosts.

``launch trust`` (``launcher.cli.trust``) shows the fingerprints and asks before recording.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko

    from launcher.backends.ssh.connection import Pool
    from launcher.backends.ssh.target import Target


def fetch_host_key(target: Target, pool: Pool) -> paramiko.PKey:
    """The key ``target`` offers, without authenticating (jump hosts on the way must be trusted).

    A key type already recorded for the host is asked for first, so a
    comparison with known_hosts compares like with like.
    """
    import paramiko

    from launcher.backends.ssh.connection import CONNECTION_ERRORS, open_socket
    from launcher.errors import LaunchError

    via = pool.get(target.via) if target.via else None
    transport = paramiko.Transport(open_socket(target, pool.timeout, via))
    try:
        recorded = pool.settings.host_keys().lookup(target.known_hosts_name)
        if recorded:
            options = transport.get_security_options()
            wanted = next(iter(recorded.keys()))
            wanted = "rsa-sha2-512" if wanted == "ssh-rsa" else wanted
            options.key_types = [wanted] + [t for t in options.key_types if t != wanted]
        transport.start_client(timeout=pool.timeout)
        return transport.get_remote_server_key()
    except CONNECTION_ERRORS as exc:
        raise LaunchError(f"{target.label}: SSH handshake failed: {exc}") from None
    finally:
        transport.close()


def record_key(known_hosts: Path, target: Target, key: paramiko.PKey, replace: bool = False) -> None:
    """Append ``key`` for ``target`` to known_hosts (created 0600); with ``replace``, drop its old lines first."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = target.known_hosts_name
    lines = known_hosts.read_text().splitlines(keepends=True) if known_hosts.exists() else []
    if replace:
        lines = [line for line in lines if not _names(line, name)]
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.append(f"{name} {key.get_name()} {key.get_base64()}\n")
    temporary = known_hosts.with_name(f".{known_hosts.name}.launch-tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.writelines(lines)
    os.replace(temporary, known_hosts)


def _names(line: str, name: str) -> bool:
    """True if the known_hosts ``line`` is an entry for ``name`` (plain or hashed)."""
    from paramiko.hostkeys import HostKeyEntry, HostKeys, InvalidHostKey

    if not line.strip() or line.startswith("#"):
        return False
    try:
        entry = HostKeyEntry.from_line(line.strip())
    except InvalidHostKey:
        return False
    if entry is None:
        return False
    return any(
        host == name or (host.startswith("|1|") and HostKeys.hash_host(name, host) == host)
        for host in entry.hostnames
    )
