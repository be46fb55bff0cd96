"""The states of a job, of its nodes and of its supervisor, the moves allowed between them, and the kinds of failure
a job ends with.

A job moves PENDING -> (QUEUED ->) LAUNCHING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED.
QUEUED is a scheduler holding the job (Slurm's pending jobs); a restart goes back from RUNNING
to LAUNCHING. The store applies every move atomically (``Store.transition``), so a cancel racing
a supervisor cannot bring a finished job back. The values are the strings users see in
``launch status`` and its ``--json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


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
    WAITING = "WAITING"  # its job is QUEUED: the node waits for its GPUs or slots, or for the scheduler's allocation
    NOT_STARTED = "NOT_STARTED"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    STOPPED = "STOPPED"


class FailureKind(StrEnum):
    """What failed first (``first_failure.kind`` in ``status --json``; the job's ``failure_kind`` column)."""

    EXIT = "exit"  # a rank or the node's agent exited non-zero
    LOST = "lost"  # the node's agent died unseen or went out of reach
    OOM = "oom"  # the kernel's OOM killer ended a process of the job
    STALL = "stall"  # ranks that reported steps stopped advancing
    HANG = "hang"  # every rank alive but silent and idle
    START = "start"  # a node could not be started
    LEASES = "leases"  # another job took the nodes' GPUs or slots between preflight and start (submit exits 3)
    PREFLIGHT = "preflight"  # a check on the allocated nodes failed (schedulers)
    TIMEOUT = "timeout"  # the scheduler's time limit
    INTERNAL = "internal"  # launch itself failed


class SupervisorState(StrEnum):
    """What is known of a job's supervisor (``supervisor.state`` in ``status --json``): alive, proven gone (the job is
    unattended: `launch attach` takes it), or neither proven."""

    ATTACHED = "attached"
    LOST = "lost"
    UNKNOWN = "unknown"
    TAKEN_OVER = "taken_over"  # fenced by a newer supervisor generation (another store's, or another attach's)


@dataclass(frozen=True)
class Successor:
    """The supervisor that took a job from this store's one (what the fenced supervisor heard from its nodes)."""

    generation: int | None
    pid: int | None
    host: str | None

    def __str__(self) -> str:
        return f"generation {self.generation if self.generation is not None else '?'} (process {self.pid or '?'} on {self.host or '?'})"

    def as_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "pid": self.pid, "host": self.host}


@dataclass(frozen=True)
class Supervision:
    """What `launch status` says of a job's supervisor: ``attached`` (where, since when it took the job; when its
    terminal closed, if it did), ``lost`` (where it ran, when it was last alive, why it is known gone), ``taken_over``
    (by whom) or ``unknown``."""

    state: SupervisorState
    host: str | None = None
    pid: int | None = None
    since: float | None = None
    why: str | None = None
    generation: int | None = None  # 0: the submitting supervisor; each `launch attach` one more
    terminal_closed: float | None = None  # a foreground supervisor whose terminal closed: it goes on in the background
    successor: Successor | None = None  # TAKEN_OVER: who took the job

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "host": self.host, "pid": self.pid, "since": self.since,
                "generation": self.generation, "terminal_closed": self.terminal_closed,
                "taken_over_by": None if self.successor is None else self.successor.as_json()}


def is_terminal(state: JobState | str | None) -> bool:
    """True for a finished job's state (a stored string or a JobState; None, an unknown state, has not ended)."""
    return state in TERMINAL
