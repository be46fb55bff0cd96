"""The cluster spec: where jobs run and how to reach the nodes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from launcher.spec.base import Strict
from launcher.spec.container import ContainerSpec


class NodeSpec(Strict):
    host: str = Field(description="Host name or address to connect to; ~/.ssh/config aliases work.")
    address: str | None = Field(None, description="Address other nodes use to reach this one (default: resolved).")
    port: int | None = Field(None, ge=1, le=65535, description="SSH port (default: ssh.port).")
    user: str | None = Field(None, description="SSH user (default: ssh.user).")
    gpus: int = Field(0, ge=0, description="GPUs on the node; 0 means CPU slots with gloo.")
    slots: int | None = Field(None, ge=1, description="Processes the node takes without GPUs (default 8).")

    @property
    def capacity(self) -> int:
        """Processes this node can run: its GPUs, else its CPU slots."""
        return self.gpus or self.slots or 8


class SSHSpec(Strict):
    user: str | None = None
    port: int = Field(22, ge=1, le=65535)
    key_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    config_file: str = "~/.ssh/config"
    jump_host: str | None = None
    connect_timeout: float = Field(10.0, gt=0)


class RaySpec(Strict):
    address: str = Field("auto", description="'auto' on a cluster node, or ray://HOST:10001.")
    placement_timeout: float = Field(60.0, gt=0, description="Seconds to wait for the placement group.")
    cpus_per_node: float | None = Field(None, gt=0, description="CPUs each node bundle asks for (default: nproc).")


class LocalSpec(Strict):
    gpus: int | None = Field(None, ge=0, description="GPUs on this machine (default: those nvidia-smi lists); 0 runs gloo on CPU slots.")
    slots: int | None = Field(None, ge=1, description="Processes the machine takes without GPUs (default: the CPUs launch may use).")


class GPUSpec(Strict):
    name: str | None = None
    memory_gb: float | None = Field(None, gt=0)
    peak_tflops: float | None = Field(None, gt=0, description="Dense bf16 peak, for MFU on GPUs not in the table.")


class NetworkSpec(Strict):
    interface: str = Field("auto", description="Interface for NCCL/gloo sockets, or 'auto' (probed per node).")
    ib_hca: str | None = Field("auto", description="NCCL_IB_HCA value, 'auto' (probed per node) or null (none).")


class RendezvousSpec(Strict):
    port: int | None = Field(None, ge=1024, le=65535, description="Fixed port; default: a free one per job.")


class ClusterSpec(Strict):
    name: str
    backend: Literal["local", "ssh", "ray"] = "local"
    nodes: list[NodeSpec] = Field(default_factory=list)
    local: LocalSpec = LocalSpec()
    ssh: SSHSpec = SSHSpec()
    ray: RaySpec = RaySpec()
    gpu: GPUSpec = GPUSpec()
    network: NetworkSpec = NetworkSpec()
    rendezvous: RendezvousSpec = RendezvousSpec()
    python: str | None = Field(None, description="Interpreter on the nodes (default: the one running launch).")
    workdir: str | None = Field(None, description="Working directory on the nodes (default: current directory).")
    sync_workdir: str | None = Field(None, description="Local directory copied to workdir on each node (ssh).")
    setup: list[str] = Field(default_factory=list, description="Shell commands run on every node before launch.")
    container: ContainerSpec | None = Field(
        None, description="The default container of this cluster's jobs (docs/CONTAINERS.md); a job's own section wins.",
    )

    @model_validator(mode="after")
    def _nodes_for_backend(self) -> "ClusterSpec":
        if self.backend == "ssh" and not self.nodes:
            raise ValueError("backend 'ssh' needs 'nodes': a list of {host: ...}")
        if self.backend == "local" and self.nodes:
            raise ValueError("backend 'local' runs on this machine: use 'local: {slots, gpus}', not 'nodes'")
        return self
