"""Elastic restarts (issue 22): the next attempt of an elastic job, re-planned on the nodes it can have.

At every restart of an elastic job the nodes are chosen again: the node lost in the attempt that ended
is left out, every other node of the cluster is a candidate (a host lost earlier that passes preflight
again is used again), and the job runs on the largest legal node count (``spec.elastic.node_counts``:
global batch exact, grad_accum whole) that the candidates allow, never fewer than ``min_nodes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.backends import Backend, planning
from launcher.backends.base import Preflight
from launcher.errors import LaunchError, PreflightError
from launcher.plan.planner import Plan
from launcher.plan.policy import node_procs
from launcher.spec.cluster import ClusterSpec
from launcher.spec.elastic import node_counts
from launcher.spec.job import BatchSpec, JobSpec

#: plans and preflights a job on a cluster for an attempt after the previous plan: (plan, its backend); PreflightError
Check = Callable[[JobSpec, ClusterSpec, Plan, int], tuple[Plan, Backend]]
#: what the supervisor calls: (previous plan, what it lost, the next attempt) -> the next attempt's plan
Replanner = Callable[[Plan, "Lost", int], "Replanned"]


@dataclass(frozen=True)
class Lost:
    """The node an attempt lost (its host, the last step it reported), or none (a hang: every node stays)."""

    host: str | None = None
    step: int | None = None


@dataclass(frozen=True)
class Replanned:
    """The next attempt's plan and backend, the job and cluster it was planned from, what changed (in words and
    as data), and how a scheduler's allocation re-plans it (``StartContext.place``; None: as before)."""

    plan: Plan
    backend: Backend
    job: JobSpec
    cluster: ClusterSpec
    message: str
    data: dict
    place: Callable[[Plan, Preflight], Plan] | None = None


def replan(job: JobSpec, cluster: ClusterSpec, plan: Plan, lost: Lost, attempt: int, check: Check) -> Replanned:
    """The plan of ``attempt`` after ``plan``'s attempt lost ``lost``; LaunchError when fewer than ``min_nodes`` can go on.

    On a cluster that lists its nodes (ssh) a candidate that fails preflight is dropped and the rest tried
    once more; elsewhere (local, Slurm: the scheduler picks the nodes) the job goes on with one node fewer.
    """
    assert job.elastic is not None, "only elastic jobs are re-planned this way"
    listed = planning(cluster).spare_nodes(job.resources.nodes) is not None
    candidates = [n for n in cluster.nodes if n.host != lost.host] if listed else []
    available = len(candidates) if listed else plan.nnodes - (lost.host is not None)
    for _ in range(2):
        procs = node_procs(job.resources.nproc_per_node, candidates) if listed else [plan.nodes[0].nproc] * available
        count = _largest_count(job, plan, procs[: job.resources.nodes])
        smaller_job = _on(job, plan, count)
        smaller = cluster.model_copy(update={"nodes": candidates}) if listed else cluster
        try:
            new_plan, backend = check(smaller_job, smaller, plan, attempt)
        except PreflightError as exc:
            failed = {n.host for n in candidates[:count] if any(line.strip().startswith(f"{n.host}:")
                                                                  for line in exc.message.splitlines())}
            if not listed or not failed:
                raise
            candidates = [n for n in candidates if n.host not in failed]
            available = len(candidates)
            continue
        return Replanned(new_plan, backend, smaller_job, smaller, change_message(attempt, plan, new_plan, lost),
                         change_data(attempt, plan, new_plan, lost))
    raise LaunchError(f"elastic: the nodes left failed preflight twice; {available} node(s) remain")


def _largest_count(job: JobSpec, plan: Plan, procs: list[int]) -> int:
    """The largest legal node count on the nodes left (``procs``: the processes of each, in order)."""
    assert job.elastic is not None
    whole = (plan.batch.global_batch, plan.batch.micro_batch) if plan.batch is not None else None
    counts = node_counts(procs, job.elastic.min_nodes, whole)
    if not counts:
        legal = f" (legal counts: {plan.elastic.describe()})" if plan.elastic else ""
        raise LaunchError(f"elastic: {len(procs)} node(s) left, and min_nodes is {job.elastic.min_nodes}{legal}")
    return counts[0].nodes


def _on(job: JobSpec, plan: Plan, count: int) -> JobSpec:
    """The job on ``count`` nodes with the plan's global and micro batch fixed (grad_accum follows)."""
    update: dict = {"resources": job.resources.model_copy(update={"nodes": count})}
    if plan.batch is not None:
        update["batch"] = BatchSpec(global_batch=plan.batch.global_batch, micro_batch=plan.batch.micro_batch)
    return job.model_copy(update=update)


def change_message(attempt: int, old: Plan, new: Plan, lost: Lost) -> str:
    """``attempt 2: 3 nodes (a800-04 lost at step 18231), grad_accum 2 -> 3, global batch 1024 kept``."""
    why = []
    if lost.host is not None:
        why.append(f"{lost.host} lost" + (f" at step {lost.step}" if lost.step is not None else ""))
    back = [n.host for n in new.nodes if n.host not in {o.host for o in old.nodes}]
    if back:
        why.append(f"{', '.join(back)} back")
    text = f"attempt {attempt}: {new.nnodes} nodes" + (f" ({'; '.join(why)})" if why else "")
    if old.batch is not None and new.batch is not None:
        accum = (f"grad_accum {old.batch.grad_accum} -> {new.batch.grad_accum}"
                 if old.batch.grad_accum != new.batch.grad_accum else f"grad_accum {new.batch.grad_accum} kept")
        text += f", {accum}, global batch {new.batch.global_batch} kept"
    return text


def change_data(attempt: int, old: Plan, new: Plan, lost: Lost) -> dict:
    """The same as data (the event's): nodes, world sizes and grad_accum before and after."""
    return {
        "attempt": attempt, "lost_host": lost.host, "lost_at_step": lost.step,
        "nodes": [n.host for n in new.nodes], "previous_nodes": [n.host for n in old.nodes],
        "world_size": new.world_size, "previous_world_size": old.world_size,
        "grad_accum": new.batch.grad_accum if new.batch else None,
        "previous_grad_accum": old.batch.grad_accum if old.batch else None,
        "global_batch": new.batch.global_batch if new.batch else None,
    }
