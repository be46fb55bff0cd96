"""What a backend decides for the planner, handed over as one frozen value.

The planner never sees a backend: each backend builds its ``PlanPolicy`` (``Planning.plan_policy``)
and the planner reads it, so backends import the planner and never the reverse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher.spec.cluster import NodeSpec


@dataclass(frozen=True)
class PlanPolicy:
    """A backend's choices for one job on one cluster."""

    #: the nodes the job is planned on unless a placement is given (placeholders where placed later)
    nodes: tuple[NodeSpec, ...]
    #: the interpreter the nodes run when preflight found none
    python: str
    #: what the cluster can never give this job, one line each
    resource_problems: tuple[str, ...] = ()
    #: how many nodes beyond the job's a restart could move to; None: nodes cannot be left out
    spare_nodes: int | None = None
    #: nodes are placed by the backend at launch (Ray, Slurm): no capacity check before then
    places_nodes: bool = False
    #: whether a node's GPUs or slots bound the processes per node (off where one machine hosts every node)
    checks_capacity: bool = True
    #: (interface, where it comes from) when the backend fixes it; None: pinned in the spec, or probed
    pinned_interface: tuple[str, str] | None = None
    #: whether InfiniBand HCAs are probed and set on this backend's nodes
    uses_hcas: bool = True
    #: whether each node's agent leases the node's GPUs or slots it runs on (local, ssh: docs/LEASES.md)
    leases: bool = False


def node_procs(nproc: int | str, nodes: Sequence[NodeSpec]) -> list[int]:
    """The processes of each node: ``nproc`` on every one, or with ``auto`` each node's GPUs (or CPU slots)."""
    return [node.capacity if nproc == "auto" else int(nproc) for node in nodes]


def capacity_problems(procs: list[int], nodes: list[NodeSpec]) -> list[str]:
    """Nodes that cannot take their processes (their GPUs, or CPU slots without GPUs)."""
    return [
        f"resources.nproc_per_node: {nproc} processes on node {index} ({node.host}), which has "
        + (f"{node.gpus} GPUs" if node.gpus else f"{node.capacity} CPU slots")
        for index, (node, nproc) in enumerate(zip(nodes, procs, strict=True)) if nproc > node.capacity
    ]
