"""Where and as whom the ``ssh`` backend connects: a host resolved like OpenSSH does (``HostName``, ``User``, ``Port``,
``IdentityFile`` and ``ProxyJump`` from ``~/.ssh/config``) with the values in ``cluster.yaml`` winning, and the
cluster's known_hosts, parsed once and shared by every connection (parsed again only when the file changes)."""

from __future__ import annotations

import getpass
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import paramiko

from launcher.backends.ssh.hostkeys import MAX_SSH_FILE_BYTES, KnownHosts, load_known_hosts
from launcher.backends.ssh.spec import SSHSpec
from launcher.backends.ssh.target import Target
from launcher.errors import LaunchError
from launcher.spec.files import expand_user, read_regular
from launcher.spec.hosts import Hop, check_host, check_port, parse_jump_hosts


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
