"""An elastic job in its plan: the node counts it may go on with, and what its ranks are told (issue 22)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from launcher.errors import PlanError
from launcher.plan.batch import BatchPlan
from launcher.spec.elastic import describe_counts, min_nodes_problem, node_counts
from launcher.spec.job import JobSpec


class ElasticCount(BaseModel):
    """A node count an elastic job may go on with: its world size and grad_accum (None: the program's own batch)."""

    model_config = ConfigDict(frozen=True)

    nodes: int
    world_size: int
    grad_accum: int | None


class Elastic(BaseModel):
    """An elastic job's legal node counts, largest first (the plan's own first), and what it resumes from."""

    model_config = ConfigDict(frozen=True)

    min_nodes: int
    counts: tuple[ElasticCount, ...]
    #: the attempt this plan is for (an elastic job is re-planned at every restart)
    attempt: int = 0
    #: the world size of the attempt before (a re-plan), else None
    previous_world_size: int | None = None

    def describe(self) -> str:
        """``4 nodes: GA 2, 2 nodes: GA 4``."""
        return describe_counts(self.counts)

    @property
    def resumed(self) -> tuple[int, int] | None:
        """``make_plan``'s ``resumed`` for this plan made again (with what preflight found)."""
        return None if self.previous_world_size is None else (self.attempt, self.previous_world_size)


def elastic_plan(job: JobSpec, procs: list[int], batch: BatchPlan | None, resumed: tuple[int, int] | None,
             ) -> Elastic | None:
    """The legal node counts of an elastic job (a plan on fewer nodes lists its own count first); a count
    keeps the first nodes, so on nodes of different sizes the list assumes the last ones are lost."""
    if job.elastic is None:
        return None
    whole = (batch.global_batch, batch.micro_batch) if batch is not None else None
    counts = node_counts(procs, min(job.elastic.min_nodes, len(procs)), whole)
    if job.resources.nproc_per_node == "auto" and len(counts) < 2 and len(procs) > job.elastic.min_nodes:
        raise PlanError(f"job '{job.name}': elastic: {min_nodes_problem(job.elastic, procs, whole)}")
    attempt, previous = resumed or (0, None)
    return Elastic(min_nodes=job.elastic.min_nodes, attempt=attempt, previous_world_size=previous,
                   counts=tuple(ElasticCount(nodes=c.nodes, world_size=c.world_size, grad_accum=c.grad_accum)
                                for c in counts))


def elastic_env(elastic: Elastic | None) -> dict[str, tuple[str, str]]:
    """What an elastic job's ranks are told beyond the batch (docs/RELIABILITY.md, the contract)."""
    if elastic is None:
        return {}
    env = {"LAUNCH_ELASTIC_MIN_NODES": (str(elastic.min_nodes), "launch: elastic.min_nodes"),
           "LAUNCH_ATTEMPT": (str(elastic.attempt), "launch: the attempt (0 first; an elastic job is re-planned at each restart)")}
    if elastic.previous_world_size is not None:
        env["LAUNCH_PREVIOUS_WORLD_SIZE"] = (str(elastic.previous_world_size),
                                             "launch: the world size of the attempt before this re-plan")
    return env
