"""What the supervisor needs from a backend: start a node, read it, stop it, check it is gone."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from launcher.netenv import NodeNetwork
from launcher.plan import NodePlan, Plan
from launcher.spec.cluster import NodeSpec


@dataclass
class Preflight:
    """What a backend learnt before launch.

    ``problems`` stop the launch (every host checked, all listed). ``nodes``
    (concrete nodes, e.g. with probed addresses or from a Ray placement) and
    ``probes`` (per-node network facts) make the planner re-plan before launch.
    """

    problems: list[str] = field(default_factory=list)
    nodes: list[NodeSpec] | None = None
    probes: dict[int, NodeNetwork] = field(default_factory=dict)


class NodeHandle(Protocol):
    """One running node agent (torchrun or the DeepSpeed launcher) of a job."""

    index: int
    pid: int | None

    def lines(self) -> Iterator[str]:
        """Output lines (stdout and stderr merged) until the agent's output closes."""

    def poll(self) -> int | None:
        """The agent's exit code (negative for a signal), or None while it runs."""

    def terminate(self, grace: float) -> None:
        """TERM the node's processes of this job, KILL what is left after ``grace``."""


class Backend(Protocol):
    """Executes plans on one kind of cluster."""

    name: str

    def preflight(self, plan: Plan) -> Preflight:
        """Check every host in parallel and probe what the plan left to ``auto``; starts nothing."""

    def start(self, node: NodePlan, plan: Plan, run_dir: Path, secrets: Mapping[str, str]) -> NodeHandle:
        """Start one node of the plan; the node's processes carry the job tag."""

    def run_on_node(self, index: int, argv: list[str], timeout: float) -> tuple[int, str, str]:
        """Run a short command on the cluster's node ``index``: (exit code, stdout, stderr)."""

    def kernel_log(self, node_index: int) -> list[str]:
        """The node's recent kernel log lines (for OOM-killer and Xid lines); [] if unreadable."""

    def leftovers(self, plan: Plan) -> dict[int, list[int]]:
        """PIDs of the job still alive, per node index (empty lists when clean)."""

    def sweep(self, plan: Plan, grace: float) -> dict[int, list[int]]:
        """End every process of the job on every node; what could not be ended."""

    def close(self) -> None:
        """Release connections."""


def get_backend(name: str, cluster) -> Backend:
    """The backend for a cluster spec; imports only the backend asked for."""
    if name == "local":
        from launcher.backends.local import LocalBackend

        return LocalBackend(cluster)
    if name == "ssh":
        from launcher.backends.ssh import SSHBackend

        return SSHBackend(cluster)
    if name == "ray":
        from launcher.backends.ray import RayBackend

        return RayBackend(cluster)
    raise ValueError(f"unknown backend {name!r}")
