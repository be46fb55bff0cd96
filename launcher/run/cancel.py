"""`launch cancel`, and whether a job's supervisor is there: proven alive, proven gone, or still starting
(what cancel, `launch attach` and `status --watch` ask before they act)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from launcher.backends import get_backend
from launcher.errors import LaunchError
from launcher.run import identity
from launcher.run.recorded import RecordedJob
from launcher.store.db import Store
from launcher.store.rows import JobRow
from launcher.store.states import JobState, is_terminal

MAX_REATTACH = 3  # as many times as the keeper (``run.detached``) starts a new supervisor
RECORDS_ITSELF_S = 5.0  # how long `cancel` waits for a starting supervisor to record itself


def cancel(store: Store, job_ref: str, wait: float = 30.0) -> JobRow:
    """Cancel a job: signal its supervisor (once proven to be it), or, once it is proven gone, clean up directly.

    A supervisor that is alive but slow to tear the job down is never declared gone. It is waited for while it
    shows progress (its heartbeat, ``supervisor_at``, moves as its nodes stop: 64 hosts take longer than 2); once
    it has shown none for ``wait`` seconds this says so (LaunchError) and it records CANCELLED when it is done.
    """
    job = RecordedJob.read(store, job_ref)
    if job.state.terminal:
        raise LaunchError(f"job {job.id} already ended {job.state}; nothing to cancel")
    user, host = identity.user_and_host()
    store.add_event(job.id, "cancel_requested", f"cancel requested by `launch cancel` ({user} on {host})",
                    {"user": user, "host": host, "pid": os.getpid()})
    found = supervisor_presence(store, job.id)
    deadline = time.monotonic() + RECORDS_ITSELF_S
    while found.pid is None and found.gone is None and time.monotonic() < deadline:
        time.sleep(0.1)  # a detached supervisor that is still starting records itself in a moment
        found = supervisor_presence(store, job.id)
    if found.pid is not None:
        os.kill(found.pid, signal.SIGTERM)
        moved_at, beat = time.monotonic(), store.job(job.id).supervisor_at
        while found.gone is None:
            row = store.job(job.id)
            if row.terminal:
                return row
            if row.supervisor_at != beat:
                moved_at, beat = time.monotonic(), row.supervisor_at
            if time.monotonic() - moved_at >= wait:
                raise LaunchError(
                    f"job {job.id}: its supervisor (PID {found.pid}) was asked to cancel and is still ending the job, "
                    f"with no sign of progress for {wait:g} s; it records CANCELLED when the nodes are clean",
                    hint=f"`launch status --watch {job.id}` follows it; `launch cancel {job.id}` again asks again")
            time.sleep(0.1)
            found = supervisor_presence(store, job.id)
    row = store.job(job.id)
    if row.terminal:  # it ended the job as it went
        return row
    _cancel_orphaned(store, job, found.gone or "no supervisor ever recorded itself for this job")
    return store.job(job.id)


def supervisor_presence(store: Store, job_id: str) -> identity.Presence:
    """What is known of the supervisor of ``job_id``: proven alive (its pid), gone (why), or neither yet."""
    return identity.presence(store.run_dir(job_id), job_id, store.job(job_id).supervisor_pid)


def supervisor_gone(store: Store, job_id: str) -> str | None:
    """Why the supervisor of ``job_id`` is proven gone (for `status --watch`); None while it is, or may be, alive."""
    return supervisor_presence(store, job_id).gone


class SupervisorWatch:
    """For `logs --follow` and `status --watch`: called with a job id each poll, why no supervisor can come back to
    the job (its supervisor proven gone and no keeper left to start another, or the keeper gave up), else None.
    While a detached supervisor's keeper starts a new one, it says once a restart ``supervisor restarting, N of 3``
    through ``say`` and waits."""

    def __init__(self, store: Store, say: Callable[[str], None]) -> None:
        self.store, self.say = store, say
        self._said: set[int] = set()

    def __call__(self, job_id: str) -> str | None:
        gone = supervisor_gone(self.store, job_id)
        if gone is None or is_terminal(self.store.job(job_id).state):
            return None  # (a supervisor that ended the job has exited: the caller reads the end next)
        if identity.keeper_alive(self.store.run_dir(job_id), job_id) is None:
            return gone
        kinds = [event["kind"] for event in self.store.events(job_id)]
        if "supervisor_lost" in kinds:  # the keeper gave up: it ends in a moment
            return gone
        restart = kinds.count("supervisor_restarted") or 1  # (killed a moment ago: the keeper files it next)
        if restart not in self._said:
            self._said.add(restart)
            self.say(f"launch: job {job_id}: supervisor restarting, {restart} of {MAX_REATTACH} ({gone}; its keeper "
                     "starts a new one that re-attaches to the nodes' journals)")
        return None


def _cancel_orphaned(store: Store, job: RecordedJob, why: str) -> None:
    """The supervisor is gone (``why``): end the job's processes ourselves and record CANCELLED, unless a node
    could not be checked (then say which, and leave the job for another try)."""
    backend = get_backend(job.cluster)
    try:
        report = backend.sweep(job.plan, job.job.watch.grace_period)
    finally:
        backend.close()
    if not report.clean:
        for problem in report.problems():
            store.add_event(job.id, "sweep", problem)
        raise LaunchError(f"job {job.id}: cancel could not confirm every node is clean:\n"
                          + "\n".join(f"  {p}" for p in report.problems()),
                          hint=f"`launch cancel {job.id}` again once the node is reachable")
    reason = f"cancelled by user (supervisor was gone: {why})"
    if store.transition(job.id, JobState.CANCELLED, reason=reason):
        store.add_event(job.id, "cancelled", reason)
