"""Elastic jobs: the node counts a job may shrink to with its global batch kept exact.

global_batch = micro_batch x grad_accum x world_size: the micro batch stays, so a node count is legal
only where grad_accum = global / (micro x world) is a whole number. Pure arithmetic, read by the spec's
validation and by the planner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import Field

from launcher.spec.base import Strict
from launcher.spec.fields import MAX_NODES


class ElasticSpec(Strict):
    """``elastic: {min_nodes: N}``: on a lost node, restart on fewer nodes (down to N) from the last checkpoint."""

    min_nodes: int = Field(
        ge=1, le=MAX_NODES, description="The fewest nodes the job may go on with; the global batch stays exact "
        "(grad_accum recomputed), so only node counts with a whole grad_accum are used.",
    )


@dataclass(frozen=True)
class NodeCount:
    """A node count the job may run at, with its world size and accumulation (None: the program batches itself)."""

    nodes: int
    world_size: int
    grad_accum: int | None



def grad_accum_for(global_batch: int, micro_batch: int, world_size: int) -> int | None:
    """The whole accumulation that keeps ``global_batch`` at ``world_size`` ranks, or None if there is none."""
    per_step = micro_batch * world_size
    return global_batch // per_step if global_batch % per_step == 0 else None


def node_counts(procs: list[int], min_nodes: int, batch: tuple[int, int] | None) -> list[NodeCount]:
    """The legal counts from ``len(procs)`` nodes down to ``min_nodes``, largest first.

    ``procs`` are the processes of each node in plan order (a count of n keeps the first n);
    ``batch`` is (global, micro), or None for a program that batches its own data (every count is legal).
    """
    counts = []
    for nodes in range(len(procs), min_nodes - 1, -1):
        world = sum(procs[:nodes])
        accum = None if batch is None else grad_accum_for(batch[0], batch[1], world)
        if batch is None or accum is not None:
            counts.append(NodeCount(nodes, world, accum))
    return counts


class Counted(Protocol):
    """A node count with its accumulation (``NodeCount``, or the plan's copy of it)."""

    @property
    def nodes(self) -> int: ...
    @property
    def grad_accum(self) -> int | None: ...


def describe_counts(counts: Sequence[Counted]) -> str:
    """``4 nodes: GA 2, 2 nodes: GA 4``."""
    return ", ".join(f"{c.nodes} {'node' if c.nodes == 1 else 'nodes'}" + ("" if c.grad_accum is None else f": GA {c.grad_accum}")
                     for c in counts)


def min_nodes_problem(elastic: ElasticSpec, procs: list[int], batch: tuple[int, int] | None) -> str | None:
    """Why ``min_nodes`` admits no node count below the full one (None: it admits some)."""
    full = len(procs)
    if elastic.min_nodes >= full:
        return (f"min_nodes {elastic.min_nodes} leaves no node to lose: the job runs on {full} node(s) "
                f"(resources.nodes); set min_nodes below {full}")
    if node_counts(procs, elastic.min_nodes, batch)[1:]:
        return None
    every = node_counts(procs, 1, batch)
    below = [count for count in every if count.nodes < full]
    hint = (f"set min_nodes to {below[0].nodes} or lower" if below
            else "choose a global_batch with more divisors")
    assert batch is not None, "without a batch every count is legal"
    return (f"min_nodes {elastic.min_nodes} admits no node count below {full} with a whole grad_accum "
            f"(global_batch {batch[0]} = micro_batch {batch[1]} x grad_accum x world size); "
            f"legal counts: {describe_counts(every)}; {hint}")
