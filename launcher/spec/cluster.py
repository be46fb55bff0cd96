"""The cluster spec: where jobs run and how to reach the nodes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from launcher.spec.base import Strict
from launcher.spec.container import ContainerSpec
from launcher.spec.fields import MAX_NODES, MAX_PROCS_PER_NODE, Arg, FiniteFloat, Line, Name, NonEmptyLine
from launcher.spec.hosts import check_host, parse_jump_hosts
from launcher.spec.slurm import SlurmSpec

Host = Annotated[str, AfterValidator(check_host)]
User = Annotated[Name, AfterValidator(lambda v: _no_space(v, "a user name"))]


def _no_space(value: str, what: str) -> str:
    if any(ch.isspace() for ch in value):
        raise ValueError(f"{what} cannot contain spaces")
    return value


class NodeSpec(Strict):
    host: Host = Field(
        description="Host name, IP address or ~/.ssh/config alias: dot-separated labels of 1-63 letters, digits, '-', '_'.",
    )
    address: Host | None = Field(None, description="Address other nodes use to reach this one (default: resolved).")
    port: int | None = Field(None, ge=1, le=65535, description="SSH port (default: ssh.port).")
    user: User | None = Field(None, description="SSH user (default: ssh.user).")
    gpus: int = Field(0, ge=0, le=MAX_PROCS_PER_NODE, description="GPUs on the node; 0 means CPU slots with gloo.")
    slots: int | None = Field(
        None, ge=1, le=MAX_PROCS_PER_NODE, description="Processes the node takes without GPUs (default 8).",
    )

    @property
    def capacity(self) -> int:
        """Processes this node can run: its GPUs, else its CPU slots."""
        return self.gpus or self.slots or 8


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


class RaySpec(Strict):
    address: Line = Field("auto", description="'auto' on a cluster node, or ray://HOST:10001.")
    placement_timeout: FiniteFloat = Field(60.0, gt=0, le=86400, description="Seconds to wait for the placement group.")
    cpus_per_node: FiniteFloat | None = Field(
        None, gt=0, le=65536, description="CPUs each node bundle asks for (default: nproc).",
    )


class LocalSpec(Strict):
    gpus: int | None = Field(None, ge=0, le=MAX_PROCS_PER_NODE,
                             description="GPUs on this machine (default: those nvidia-smi lists); 0 runs gloo on CPU slots.")
    slots: int | None = Field(None, ge=1, le=MAX_PROCS_PER_NODE,
                              description="Processes the machine takes without GPUs (default: the CPUs launch may use).")


class GPUSpec(Strict):
    name: Name | None = None
    memory_gb: FiniteFloat | None = Field(None, gt=0, le=1e6)
    peak_tflops: FiniteFloat | None = Field(
        None, gt=0, le=1e6, description="Dense bf16 peak, for MFU on GPUs not in the table.",
    )


class NetworkSpec(Strict):
    interface: Name = Field("auto", description="Interface for NCCL/gloo sockets, or 'auto' (probed per node).")
    ib_hca: Name | None = Field("auto", description="NCCL_IB_HCA value, 'auto' (probed per node) or null (none).")


class RendezvousSpec(Strict):
    port: int | None = Field(None, ge=1024, le=65535, description="Fixed port; default: a free one per job.")


class ClusterSpec(Strict):
    name: Name
    backend: Literal["local", "ssh", "ray", "slurm"] = "local"
    ssh: SSHSpec = SSHSpec()
    nodes: list[NodeSpec] = Field(default_factory=list, max_length=MAX_NODES)
    local: LocalSpec = LocalSpec()
    ray: RaySpec = RaySpec()
    slurm: SlurmSpec = SlurmSpec()
    gpu: GPUSpec = GPUSpec()
    network: NetworkSpec = NetworkSpec()
    rendezvous: RendezvousSpec = RendezvousSpec()
    python: Line | None = Field(None, description="Interpreter on the nodes (default: the one running launch).")
    workdir: NonEmptyLine | None = Field(
        None,
        description="Working directory on the nodes (default: the current directory; ssh: the login directory, "
        "which a relative path starts from).",
    )
    sync_workdir: NonEmptyLine | None = Field(None, description="Local directory copied to workdir on each node (ssh).")
    setup: list[Arg] = Field(default_factory=list, description="Shell commands run on every node before launch.")
    container: ContainerSpec | None = Field(
        None, description="The default container of this cluster's jobs (docs/CONTAINERS.md); a job's own section wins.",
    )

    @field_validator("nodes")
    @classmethod
    def _distinct_nodes(cls, nodes: list[NodeSpec], info: ValidationInfo) -> list[NodeSpec]:
        """Two entries for one host (same name and port, or same address) would start two agents there."""
        ssh = info.data.get("ssh") or SSHSpec()
        problems: list[str] = []
        seen: dict[object, int] = {}
        for index, node in enumerate(nodes):
            keys: list[tuple[str, object]] = [(f"host {node.host} port {node.port or ssh.port}", (node.host.lower(), node.port or ssh.port))]
            if node.address and node.address != "auto":
                keys.append((f"address {node.address}", node.address.lower()))
            for shown, key in keys:
                if key in seen:
                    problems.append(f"nodes {seen[key]} and {index} are the same node ({shown})")
                seen.setdefault(key, index)
        if problems:
            raise ValueError("; ".join(problems) + "; list each node once")
        return nodes

    @model_validator(mode="after")
    def _nodes_for_backend(self) -> ClusterSpec:
        if self.backend == "ssh" and not self.nodes:
            raise ValueError("backend 'ssh' needs 'nodes': a list of {host: ...}")
        if self.backend == "local" and self.nodes:
            raise ValueError("backend 'local' runs on this machine: use 'local: {slots, gpus}', not 'nodes'")
        if self.backend == "slurm":
            self._check_slurm()
        return self

    def _check_slurm(self) -> None:
        """Slurm places the nodes, and its nodes meet in a job directory under workdir: a shared filesystem."""
        problems = []
        if not self.slurm.partition:
            problems.append("backend 'slurm' needs 'slurm: {partition: NAME}' (`sinfo -s` lists the partitions)")
        if not self.workdir or not self.workdir.startswith("/"):
            problems.append("backend 'slurm' needs 'workdir': an absolute path on a filesystem every node and this "
                            "machine mount (the job's files meet there)")
        for key, why in (("nodes", "Slurm chooses the nodes"), ("sync_workdir", "workdir is shared: nothing to copy"),
                         ("setup", "put node set-up in the job's entrypoint or the site's prolog")):
            if getattr(self, key):
                problems.append(f"'{key}' is not used by backend 'slurm' ({why}): remove it")
        if problems:
            raise ValueError("; ".join(problems))
