"""The cluster spec's common part: its name, nodes, GPUs, network, interpreter and directories.

A backend's own section (``ssh:``, ``slurm:``...) lives in the backend's package, in its subclass of ``ClusterSpec``.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

from pydantic import AfterValidator, BaseModel, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from launcher.spec.base import Strict
from launcher.spec.container import ContainerSpec
from launcher.spec.fields import MAX_NODES, MAX_PROCS_PER_NODE, Arg, FiniteFloat, Line, Name, NonEmptyLine
from launcher.spec.hosts import check_host

Host = Annotated[str, AfterValidator(check_host)]
User = Annotated[Name, AfterValidator(lambda v: _no_space(v, "a user name"))]


def _no_space(value: str, what: str) -> str:
    if any(ch.isspace() for ch in value):
        raise ValueError(f"{what} cannot contain spaces")
    return value


class NamedFile(NamedTuple):
    """A file on this machine that a spec names and launch reads: its key path, its path as written."""

    loc: tuple[str, ...]
    path: str
    may_be_missing: bool


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
    """What every cluster has, whatever its backend: the common part of every backend's cluster model.

    Each backend's package subclasses it with its ``backend:`` name and its own section (``ssh:``,
    ``slurm:``...); ``launcher.spec.clusters`` makes the registered ones one union chosen by ``backend:``.
    """

    name: Name
    backend: str = "local"
    nodes: list[NodeSpec] = Field(default_factory=list, max_length=MAX_NODES)
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

    def model_post_init(self, context: Any, /) -> None:
        if type(self) is ClusterSpec:
            raise TypeError("ClusterSpec is the part every backend's cluster model shares; make a cluster through "
                            "its backend's model or launcher.backends.cluster_spec")

    def named_files(self) -> list[NamedFile]:
        """Every file on this machine this cluster names and launch reads."""
        return []


def field_error(model: type[BaseModel], loc: tuple[str | int, ...], message: str, value: Any) -> ValidationError:
    """A validation error at ``loc`` raised from a model validator (which pydantic otherwise places at the top)."""
    return ValidationError.from_exception_data(
        model.__name__, [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=value)],
    )
