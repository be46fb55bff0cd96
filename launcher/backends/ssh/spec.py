"""The SSH backend's cluster model: ``backend: ssh``, its ``ssh:`` section and the ``nodes`` it needs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from launcher.spec.base import Strict
from launcher.spec.cluster import ClusterSpec, NamedFile, User, field_error
from launcher.spec.fields import FiniteFloat, Line
from launcher.spec.hosts import parse_jump_hosts


class SSHSpec(Strict):
    user: User | None = None
    port: int = Field(22, ge=1, le=65535)
    key_file: Line | None = None
    known_hosts: Line = "~/.ssh/known_hosts"
    config_file: Line = "~/.ssh/config"
    jump_host: Line | None = Field(None, description="ProxyJump: [user@]host[:port], comma-separated hops, or 'none'.")
    connect_timeout: FiniteFloat = Field(10.0, gt=0, le=3600)
    fanout: int = Field(32, ge=1, le=1024, description="Hosts contacted at once (connect, preflight, start, check, "
                        "cancel), as pdsh's -f; 32 like pdsh's default.")

    @field_validator("jump_host")
    @classmethod
    def _jump_host(cls, v: str | None) -> str | None:
        if v is not None:
            parse_jump_hosts(v)
        return v


class SSHCluster(ClusterSpec):
    """Listed hosts, each node's agent started over SSH."""

    backend: Literal["ssh"]
    ssh: SSHSpec = SSHSpec()

    @model_validator(mode="after")
    def _nodes(self) -> SSHCluster:
        if not self.nodes:
            raise ValueError("backend 'ssh' needs 'nodes': a list of {host: ...}")
        self._distinct_nodes()
        return self

    def _distinct_nodes(self) -> None:
        """Two entries for one host (same name and port, or same address) would start two agents there."""
        problems: list[str] = []
        seen: dict[object, int] = {}
        for index, node in enumerate(self.nodes):
            port = node.port or self.ssh.port
            keys: list[tuple[str, object]] = [(f"host {node.host} port {port}", (node.host.lower(), port))]
            if node.address and node.address != "auto":
                keys.append((f"address {node.address}", node.address.lower()))
            for shown, key in keys:
                if key in seen:
                    problems.append(f"nodes {seen[key]} and {index} are the same node ({shown})")
                seen.setdefault(key, index)
        if problems:
            raise field_error(type(self), ("nodes",), "; ".join(problems) + "; list each node once",
                              [node.model_dump(exclude_unset=True) for node in self.nodes])

    def named_files(self) -> list[NamedFile]:
        files = [NamedFile(("ssh", "known_hosts"), self.ssh.known_hosts, True),
                 NamedFile(("ssh", "config_file"), self.ssh.config_file, True)]
        if self.ssh.key_file:
            files.append(NamedFile(("ssh", "key_file"), self.ssh.key_file, True))
        return files
