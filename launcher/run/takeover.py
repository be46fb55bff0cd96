"""Who decides for a job: supervisor generations on the nodes, and a job read back from its nodes.

Exactly one supervisor is in charge of a job at a time. Each node's run directory records the
generation in charge (``node<N>.generation``; none: 0, the submitting supervisor's). `launch attach`
records a newer one on every node (the ``fence`` node command) before it follows the job: from then
on a ``follow`` of an older generation is answered ``@fenced``, and an agent whose stdout goes to
an older supervisor closes it, so the older one learns within a second or two that it was taken
over and stops, deciding and writing nothing (``SupervisorFenced``).

`launch attach JOB --cluster FILE` of a job this store does not know reads the job back from its
nodes: each agent keeps the job's record (plan, specs, attempt; no secret's value) in its run
directory (``job.json``), which is imported into this store with the journals to fetch from line 1.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from launcher.backends import Backend, cluster_spec
from launcher.errors import LaunchError
from launcher.plan.planner import Plan
from launcher.run import identity
from launcher.run.recorded import RecordedJob, stored_spec
from launcher.spec.cluster import ClusterSpec
from launcher.spec.job import JobSpec
from launcher.store.db import Store
from launcher.store.rows import JobRow
from launcher.store.states import JobState, NodeState

FRESH_CONTACT_S = 3.0  # a node whose reader was in contact this recently is being followed by a supervisor
RECORD_VERSION = 1


@dataclass(frozen=True)
class NodeGeneration:
    """What a node said of the generation in charge (``answer``), or why it could not be asked (``error``)."""

    index: int
    host: str
    answer: dict[str, Any] | None
    error: str | None

    @property
    def generation(self) -> int:
        value = (self.answer or {}).get("generation")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


def next_generation(nodes: list[NodeGeneration]) -> int:
    """The generation a new supervisor takes: one past the newest any node records."""
    return max((node.generation for node in nodes), default=0) + 1


def in_contact(nodes: list[NodeGeneration], fresh_s: float = FRESH_CONTACT_S) -> NodeGeneration | None:
    """A node whose journal a reader (a supervisor) followed within ``fresh_s`` seconds, if any, whose agent runs."""
    for node in nodes:
        contact = (node.answer or {}).get("contact_s")
        if isinstance(contact, (int, float)) and contact < fresh_s and not (node.answer or {}).get("agent_gone"):
            return node
    return None


def who(node: NodeGeneration) -> str:
    """``generation N, process P on HOST`` of a node's record."""
    answer = node.answer or {}
    return (f"generation {node.generation}, process {answer.get('pid') or '?'} on "
            f"{answer.get('host') or 'the submitting machine'}")


def read_generations(backend: Backend, plan: Plan) -> list[NodeGeneration]:
    """Every node's generation record, asked in parallel."""
    def one(index: int) -> NodeGeneration:
        answer, error = backend.fence(plan, index, plan.job_id)
        return NodeGeneration(index, plan.nodes[index].host, answer, error)

    return backend.on_nodes(plan, one)


def take(backend: Backend, plan: Plan, nodes: list[NodeGeneration], *, every_node: bool,
         warn: Callable[[str], None], store: str | None = None) -> int:
    """Record a newer generation than any node has on every node that answered (``store``: the id of the job store
    the new supervisor files into, recorded as following the job there); that generation. With
    ``every_node`` (a takeover: a live supervisor must be fenced everywhere) a node that did not answer, or that
    another supervisor took meanwhile, is a LaunchError; else it is said through ``warn``."""
    unread = [node for node in nodes if node.answer is None]
    if unread and every_node:
        raise LaunchError(f"job {plan.job_id}: cannot take the job from its supervisor: "
                          + "; ".join(f"node {n.index} ({n.host}) cannot be asked: {n.error}" for n in unread)
                          + "; nothing was changed on any node",
                          hint="try again once every node can be reached (`launch check` shows them)")
    generation = next_generation(nodes)
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "store": store}

    def one(index: int) -> NodeGeneration:
        answer, error = backend.fence(plan, index, plan.job_id, generation, mine)
        return NodeGeneration(index, plan.nodes[index].host, answer, error)

    asked = [node.index for node in nodes if node.answer is not None]
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(asked)))) as pool:
        written = list(pool.map(one, asked))
    taken_meanwhile = [f"node {n.index} ({n.host}) was taken by another supervisor meanwhile ({who(n)})"
                       for n in written if n.answer is not None and not n.answer.get("taken")]
    if taken_meanwhile:  # two attaches at once: the one whose generation a node did not record decides nothing
        raise LaunchError(f"job {plan.job_id}: not attached: " + "; ".join(taken_meanwhile),
                          hint=f"`launch status {plan.job_id}` names the supervisor in charge; "
                               f"`launch attach {plan.job_id} --takeover` takes the job from it")
    problems = [f"node {n.index} ({n.host}): {n.error}" for n in written if n.answer is None]
    problems += [f"node {n.index} ({n.host}) cannot be asked: {n.error}" for n in unread]
    if problems and every_node:
        raise LaunchError(f"job {plan.job_id}: the takeover did not reach every node: " + "; ".join(problems),
                          hint=f"`launch attach {plan.job_id} --takeover` again")
    for problem in problems:
        warn(f"warning: job {plan.job_id}: supervisor generation {generation} not recorded on {problem}")
    return generation


# a job read back from its nodes


def node_record(row: JobRow, plan: Plan, attempt: int, store: str | None = None) -> dict[str, Any]:
    """What each node keeps of the job (``job.json``): its stored specs (names of secrets, never their values),
    its plan as run, the attempt, and the id of the job store its supervisor files into (the agent records it as
    following the job: the run directory stays until that store has filed the job)."""
    return {"version": RECORD_VERSION, "job_id": plan.job_id, "created_at": row.created_at, "attempt": attempt,
            "plan": plan.model_dump(mode="json"), "spec": row.spec, "store": store}


@dataclass(frozen=True)
class NodeRecord:
    """A job as its nodes recorded it, checked: ``job`` as RecordedJob reads it, the attempt, when it was made."""

    job: RecordedJob
    attempt: int
    created_at: float | None


def parse_record(record: dict[str, Any], job_id: str, given: ClusterSpec) -> NodeRecord:
    """The node record of ``job_id``, the job's cluster the given one (LaunchError: not this job's, not this
    cluster's, or not readable). The cluster kept is ``given`` (this machine's settings: its SSH keys, its
    Python), restricted to the nodes the job ran on."""
    if record.get("job_id") != job_id:
        raise LaunchError(f"the nodes hold a record of job {record.get('job_id')!r}, not {job_id}")
    spec: dict[str, Any] = record["spec"] if isinstance(record.get("spec"), dict) else {}
    try:
        plan = Plan.model_validate(record.get("plan"))
        job = JobSpec.model_validate(spec.get("job"))
        ran_on = cluster_spec(spec.get("cluster"))
    except (ValidationError, ValueError, TypeError) as exc:
        raise LaunchError(f"job {job_id}: the record its nodes keep cannot be read back: {exc}") from None
    cluster = on_cluster(ran_on, given, job_id)
    attempt = record.get("attempt")
    created = record.get("created_at")
    return NodeRecord(
        RecordedJob(id=job_id, state=JobState.RUNNING, plan=plan, job=job, cluster=cluster,
                    check=spec.get("check", True) is not False, supervisor_pid=None),
        attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 0 else 0,
        float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else None)


def _where(node: Any) -> tuple[str, int | None, str | None]:
    return node.host, node.port, node.user


def on_cluster(ran_on: ClusterSpec, given: ClusterSpec, job_id: str) -> ClusterSpec:
    """``given`` restricted to the nodes of ``ran_on`` (the cluster the job ran on, as recorded), or a LaunchError
    saying how the two differ."""
    if ran_on.backend != given.backend:
        raise LaunchError(f"job {job_id} ran on a {ran_on.backend} cluster ({ran_on.name}), not on the {given.backend} "
                          f"cluster of this file ({given.name})", hint="give the cluster file the job was submitted with")
    hosts = {_where(node): node for node in given.nodes}
    missing = [node.host for node in ran_on.nodes if _where(node) not in hosts]
    if ran_on.name != given.name or missing:
        why = (f"its hosts {', '.join(missing)} are not in this file" if missing
               else f"it is named {ran_on.name!r}, this file {given.name!r}")
        raise LaunchError(f"job {job_id} ran on cluster {ran_on.name!r}, which is not the cluster of this file: {why}",
                          hint="give the cluster file the job was submitted with")
    return given.model_copy(update={"nodes": [hosts[_where(node)] for node in ran_on.nodes]})


def read_record(backend: Backend, cluster: ClusterSpec, job_id: str) -> dict[str, Any]:
    """The job's record from the first of the cluster's nodes that has one (LaunchError naming each node's answer)."""
    said = []
    for index in range(max(1, len(cluster.nodes))):
        record, error = backend.job_record(index, job_id)
        if record is not None:
            return record
        said.append(f"{backend.host(None, index)}: {error}")
    unknown = all("no run directory" in line or "left no record" in line for line in said)
    raise LaunchError((f"job {job_id} is not known to this store, and its nodes do not know it either: "
                       if unknown else f"job {job_id} cannot be read back from its nodes: ") + "; ".join(said),
                      hint="give the job's full id and the cluster file it ran on; `launch status` lists this "
                           "store's jobs")


def import_job(store: Store, found: NodeRecord, source: str) -> None:
    """Record the job in this store as RUNNING at its attempt, each node with no journal line received yet (its
    whole history is fetched from the journals), and an ``imported`` event."""
    job = found.job
    store.create_job(job.plan, stored_spec(job.job, job.cluster, job.check), user=identity.user_and_host()[0])
    store.transition(job.id, JobState.LAUNCHING, attempt=found.attempt)
    store.transition(job.id, JobState.RUNNING)
    if found.created_at is not None:
        store.update_job(job.id, created_at=found.created_at)
    now = time.time()
    for node in job.plan.nodes:
        store.set_node(job.id, found.attempt, node.index, host=node.host, address=node.address,
                       state=NodeState.RUNNING, started_at=now, seen=0,
                       log_path=str(store.run_dir(job.id) / f"attempt{found.attempt}-node{node.index}.log"))
    store.add_event(job.id, "imported", f"read back from its nodes ({source}) by `launch attach --cluster`: attempt "
                    f"{found.attempt} of {job.plan.nnodes} node(s), each journal fetched from its first line",
                    {"attempt": found.attempt, "from": source})
