"""`launch status --watch JOB`: the progress view of a job that another process runs, fed by the store.

Stages come from ``stage`` events (filed by ``run.detached.stage_recorder``), the job's state (queued) and the
node rows of its current attempt (start); log lines from following its log files; the bar from
its metric records. The watch ends when the job does, or when its supervisor is proven gone (the
job would never end then: the view says so and how to clean up).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from launcher.store.db import Store
from launcher.store.rows import JobRow, NodeRow
from launcher.store.states import JobState, NodeState
from launcher.views.logs import LogQuery, LogReader, gone_text
from launcher.views.progress import STAGE_STATES, STAGES, open_progress

STAGE_EVENT = "stage"
TAIL_LINES = 10


@dataclass(frozen=True)
class StageUpdate:
    """One node's state in one stage (the arguments of ``Progress.stage``)."""

    stage: str
    node: int | None
    host: str
    state: str
    detail: str = ""


def _from_event(data: Any) -> StageUpdate | None:
    if not isinstance(data, Mapping) or data.get("stage") not in STAGES or data.get("state") not in STAGE_STATES:
        return None
    node = data.get("node")
    return StageUpdate(data["stage"], node if isinstance(node, int) else None, str(data.get("host") or ""),
                       data["state"], str(data.get("detail") or ""))


def job_stages(
    job: JobRow, nodes: Iterable[NodeRow], events: Iterable[Mapping[str, Any]],
) -> list[StageUpdate]:
    """The stages of a job as the store tells them, oldest first: recorded ``stage`` events, ``queued`` while
    the scheduler holds the job, and ``start`` from the node rows of the current attempt (when no start
    events were recorded)."""
    updates = [u for e in events if e.get("kind") == STAGE_EVENT and (u := _from_event(e.get("data"))) is not None]
    if job.state == JobState.QUEUED:
        updates.append(StageUpdate("queued", None, "", "running", job.queue_reason or job.reason or ""))
    if any(u.stage == "start" for u in updates):
        return updates
    for row in nodes:
        if row.state == NodeState.WAITING:  # its job is queued: the queued stage says so
            continue
        if row.state == NodeState.STARTING:
            failed = job.terminal
            updates.append(StageUpdate("start", row.node, row.host or "", "failed" if failed else "running",
                                       (job.reason or "") if failed else ""))
        elif row.state is not None:
            updates.append(StageUpdate("start", row.node, row.host or "", "done"))
    return updates


def watch(
    store: Store, job_ref: str, *, stream: IO[str], plain: bool | None = None, poll_s: float = 0.5,
    supervisor_gone: Callable[[str], str | None] | None = None,
) -> JobRow:
    """Show the job's progress until it ends (its stages, its last TAIL_LINES log lines, then what comes);
    the final job row. ``supervisor_gone(job_id)``: why the job's supervisor is proven gone, else None
    (`launch status --watch` passes ``launcher.run.cancel.supervisor_gone``); the watch then stops."""
    reader = LogReader(store, job_ref, LogQuery(tail=TAIL_LINES))
    job = reader.job
    progress = open_progress(stream, max_steps=job.max_steps, nnodes=job.nnodes or 1, plain=plain)
    stages = _StageFeed(store, progress)
    try:
        stages.show(job, reader.ended)
        for line in reader.existing():
            progress.log(line.text)
        while True:
            ended, job = reader.ended, reader.job
            stages.show(job, ended)
            for line in reader.new():
                progress.log(line.text)
            if ended:
                break
            gone = supervisor_gone(job.id) if supervisor_gone is not None else None
            if gone is not None and not store.job(job.id).terminal:  # (ended meanwhile: shown next round)
                progress.log(gone_text(job, gone))
                break
            if gone is None:
                time.sleep(poll_s)
    finally:
        progress.close()
    return store.job(job.id)


class _StageFeed:
    """Feeds a job's stages from the store to the view (the view shows only changes)."""

    def __init__(self, store: Store, progress) -> None:
        self.store, self.progress = store, progress
        self.queued_shown = False
        self._fed: list[StageUpdate] = []

    def show(self, job: JobRow, ended: bool) -> None:
        """The stages as they stand, each change once (the store's events are replayed every poll: only those not
        fed before go to the view); the bar from when the job runs (or has ended)."""
        updates = job_stages(job, self.store.nodes(job.id, job.attempt), self.store.events(job.id))
        for index, update in enumerate(updates):
            if index < len(self._fed) and self._fed[index] == update:
                continue
            self.queued_shown = self.queued_shown or update.stage == "queued"
            self.progress.stage(update.stage, update.node, update.host, update.state, update.detail)
        self._fed = updates
        if self.queued_shown and job.state != JobState.QUEUED:
            self.progress.stage("queued", None, "", "done")
        if (job.state == JobState.RUNNING or ended) and not self.progress.attached:
            self.progress.attach(self.store, job.id)
