"""`launch status`: each job as the store, its supervisor's identity and (one job whose supervisor is gone) its nodes'
agents tell it, with the stacks kept with it: the ``JobStatus`` values that ``views.jobstatus`` renders.

Light: no backend is imported until the nodes of one job whose supervisor is gone are asked.
"""

from __future__ import annotations

import re

from launcher.errors import LaunchError
from launcher.node.progress import HolderPace
from launcher.run import identity
from launcher.store.db import Store
from launcher.store.rows import JobRow
from launcher.store.states import JobState, Supervision, SupervisorState
from launcher.views.jobstatus import AgentsLeft, JobStatus, job_summary
from launcher.views.stacks import latest

_HOLDER = re.compile(r"\bjob (\S+) \(user ")  # a holder as ``leasing.who`` names it in a waiting reason
AGENTS_ASKED_S = 8  # how long `status JOB` waits for each node's answer about a job whose supervisor is gone
CHECK_JOB_NAME = "launch-check"  # the all-reduce job of `launch check`: left out of the job list unless asked


def newest(store: Store) -> str:
    """The id of the newest job (`--last`); LaunchError when there is none."""
    jobs = store.jobs(limit=1)
    if not jobs:
        raise LaunchError("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
    return jobs[0].id


def listed(store: Store, limit: int | None, checks: bool = True) -> list[JobStatus]:
    """The newest ``limit`` jobs (all: None), each with its summary and, not ended, its supervision; without
    ``checks``, `launch check`'s own jobs left out."""
    return [JobStatus(row, job_summary(store, row), supervision(store, row)) for row in store.jobs(limit=limit)
            if checks or not is_check_job(row)]


def is_check_job(row: JobRow) -> bool:
    """Whether the job is one `launch check` ran (its all-reduce test), not the user's."""
    return row.name == CHECK_JOB_NAME


def one(store: Store, ref: str) -> JobStatus:
    """One job in detail: its nodes, events and kept stacks; the nodes' agents asked when its supervisor is gone."""
    row = store.job(ref)
    said = supervision(store, row)
    agents = agents_left(store, row) if said is not None and said.state == SupervisorState.LOST else None
    return JobStatus(row, job_summary(store, row), said, agents, nodes=tuple(store.nodes(row.id)),
                     events=tuple(store.events(row.id)), stacks=latest(store.run_dir(row.id)),
                     holders=holders(store, row))


def holders(store: Store, row: JobRow) -> tuple[HolderPace, ...] | None:
    """A QUEUED job: the pace of the jobs its waiting reason names as holders (any user's), as their node agents
    recorded it and its supervisor last heard it (None for a job not queued; the lease module imported only then)."""
    if row.state != JobState.QUEUED or not row.queue_reason:
        return None
    from launcher.backends.leasing import read_paces

    named = set(_HOLDER.findall(row.queue_reason))
    return tuple(p for p in read_paces(store.run_dir(row.id)) if p.job in named)


def supervision(store: Store, row: JobRow) -> Supervision | None:
    """What is known of the supervisor of a job not ended (``identity.described``); None once it has ended."""
    if row.terminal:
        return None
    return identity.described(store.runs / row.id, row.id, row.supervisor_pid, row.supervisor_at)


def agents_left(store: Store, row: JobRow) -> AgentsLeft | None:
    """Each node's agent still running or not, asked of the nodes of a job whose supervisor is gone; None where the
    backend keeps no generation record to ask (Slurm, Ray) or the job cannot be read back."""
    from launcher.backends import get_backend
    from launcher.run.recorded import RecordedJob

    try:
        job = RecordedJob.read(store, row.id)
        backend = get_backend(job.cluster)
    except Exception:  # noqa: BLE001 - status shows what the store says when the nodes cannot be asked
        return None
    try:
        if not backend.capabilities.fences:
            return None
        answers = backend.on_nodes(job.plan, lambda index: backend.fence(job.plan, index, job.id,
                                                                         timeout=AGENTS_ASKED_S)[0])
    finally:
        backend.close()
    said: dict[str, list[int]] = {"running": [], "ended": [], "unknown": []}
    for index, answer in enumerate(answers):
        gone = answer.get("agent_gone") if isinstance(answer, dict) else None
        said["unknown" if answer is None else "ended" if gone else "running"].append(index)
    return AgentsLeft(tuple(said["running"]), tuple(said["ended"]), tuple(said["unknown"]))
