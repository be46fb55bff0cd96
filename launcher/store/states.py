"""The states of a job and of its nodes, and the moves allowed between them.

A job moves PENDING -> (QUEUED ->) LAUNCHING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED.
QUEUED is a scheduler holding the job (Slurm's pending jobs); a restart goes back from RUNNING
to LAUNCHING. The store applies every move atomically (``Store.transition``), so a cancel racing
a supervisor cannot bring a finished job back. The values are the strings users see in
``launch status`` and its ``--json``.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def allowed_from(self) -> tuple[JobState, ...]:
        """The states a job may be in to move to this one."""
        return TRANSITIONS[self]


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
TRANSITIONS: dict[JobState, tuple[JobState, ...]] = {
    JobState.PENDING: (),
    JobState.QUEUED: (JobState.PENDING, JobState.LAUNCHING),
    JobState.LAUNCHING: (JobState.PENDING, JobState.QUEUED, JobState.RUNNING),
    JobState.RUNNING: (JobState.LAUNCHING,),
    JobState.SUCCEEDED: (JobState.RUNNING,),
    JobState.FAILED: (JobState.PENDING, JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING),
    JobState.CANCELLED: (JobState.PENDING, JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING),
}


class NodeState(StrEnum):
    """One node of one attempt: started, running, then exited on its own or stopped by launch; NOT_STARTED: its
    attempt ended (a start failed, here or on another node) before it ran."""

    STARTING = "STARTING"
    NOT_STARTED = "NOT_STARTED"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    STOPPED = "STOPPED"


def is_terminal(state: str) -> bool:
    """True for a finished job's state (a stored string or a JobState)."""
    return state in TERMINAL
