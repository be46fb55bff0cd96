"""Where and as whom the ``ssh`` backend connects: one host, resolved."""

from __future__ import annotations

from dataclasses import dataclass


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
