"""What a scheduler (Slurm) tells the supervisor while it holds a job: recorded in the store, said to the user."""

from __future__ import annotations

from collections.abc import Callable

from launcher.store.db import Store
from launcher.store.states import JobState


class SchedulerEvents:
    """The ``submitted``, ``queued``, ``allocated`` and ``leased`` callbacks of a backend's ``StartContext`` for one
    job."""

    def __init__(self, store: Store, job_id: str, warn: Callable[[str], None] | None) -> None:
        self.store, self.job_id, self._warn = store, job_id, warn

    def submitted(self, scheduler_id: str) -> None:
        """The scheduler has the job: its id recorded (`launch submit --detach` returns on it)."""
        self.store.update_job(self.job_id, scheduler_id=scheduler_id)
        self.store.add_event(self.job_id, "submitted", f"submitted to the scheduler: its job {scheduler_id}",
                             {"scheduler_id": scheduler_id})

    def queued(self, reason: str, scheduler_id: str | None) -> None:
        """The scheduler holds the job: QUEUED with its reason and job id, said once per reason."""
        if not self.store.transition(self.job_id, JobState.QUEUED, queue_reason=reason, scheduler_id=scheduler_id):
            self.store.update_job(self.job_id, queue_reason=reason, scheduler_id=scheduler_id)
        self.store.set_waiting(self.job_id, True)
        text = f"queued by the scheduler (its job {scheduler_id}): {reason}" if scheduler_id else f"waiting: {reason}"
        self.store.add_event(self.job_id, "queued", text, {"reason": reason, "scheduler_id": scheduler_id})
        if self._warn is not None:
            self._warn(f"job {self.job_id}: {text}; Ctrl-C cancels it")

    def allocated(self, scheduler_id: str) -> None:
        """The scheduler gave the job its nodes (``""``: its leases came free): LAUNCHING again (from QUEUED), its job
        id kept."""
        self.store.update_job(self.job_id, scheduler_id=scheduler_id or None, queue_reason=None)
        self.store.set_waiting(self.job_id, False)
        if self.store.transition(self.job_id, JobState.LAUNCHING):
            self.store.add_event(self.job_id, "allocated", f"the scheduler allocated the nodes (its job {scheduler_id})"
                                 if scheduler_id else "the leases came free: starting")

    def leased(self, node: int, host: str, devices: str) -> None:
        """Node ``node``'s agent holds ``devices`` (``GPUs 0-3``) for the job's life."""
        self.store.add_event(self.job_id, "leased", f"node {node} ({host}): {devices}",
                             {"node": node, "host": host, "devices": devices})
