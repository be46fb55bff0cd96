"""The errors `launch` reports to users. The CLI maps each to its exit code."""

from __future__ import annotations


class LaunchError(Exception):
    """A problem the user can act on: one paragraph, no traceback."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class SpecError(LaunchError):
    """A job or cluster spec (or a --set override) is invalid."""

    exit_code = 2


class PlanError(SpecError):
    """The job and the cluster do not fit together (batch, slots, nodes)."""


class PreflightError(LaunchError):
    """A host or resource failed the checks made before anything starts."""

    exit_code = 3


class NodeStartError(LaunchError):
    """A node could not be started because of one node: ``node`` (its plan index), which may be another one
    than the node being started (preparing the nodes is one step for all of them)."""

    def __init__(self, message: str, node: int) -> None:
        super().__init__(message)
        self.node = node


class JobNotFound(LaunchError):
    """No job in the store matches the id given."""

    exit_code = 4


FENCED_EXIT = 5  # a supervisor that a newer one took the job from (`launch attach --takeover`) exits with this


class SupervisorFenced(LaunchError):
    """A newer supervisor generation took the job: this one stops deciding and writing, and says so."""

    exit_code = FENCED_EXIT

    def __init__(self, job_id: str, newer: dict) -> None:
        where = f"process {newer.get('pid') or '?'} on {newer.get('host') or '?'}"
        super().__init__(f"job {job_id}: taken over by a newer supervisor (generation {newer.get('generation')}, "
                         f"{where}); this one stops here",
                         hint=f"`launch status {job_id}` shows the job and its supervisor")
        self.newer = newer
