"""The job store: jobs (a state machine), nodes (per attempt), events, metrics, samples.

SQLite in WAL mode under ``$LAUNCH_HOME`` (default ``~/.launch``): the file, its connection and its
errors are ``store.base``; the schema and its migrations ``store.schema``; events, metric records
and samples ``store.records``; reading rows back defensively ``store.rows``. This module holds the
job and node rows. Job states move only along legal transitions, checked atomically in SQL so that
a cancel racing a supervisor cannot resurrect a finished job; a node row still STARTING when its
attempt is over (its start failed) is closed as NOT_STARTED.
"""

from __future__ import annotations

import time
from typing import Any

from launcher.errors import JobNotFound, LaunchError
from launcher.store.base import StoreBase, launch_home
from launcher.store.records import MAX_METRIC_RECORDS, RecordsStore
from launcher.store.rows import JSON_COLUMNS, JobRow, NodeRow, json_safe, json_text
from launcher.store.schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION, StoreError
from launcher.store.states import TERMINAL, JobState, NodeState

PENDING, QUEUED, LAUNCHING, RUNNING = JobState.PENDING, JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING
SUCCEEDED, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

__all__ = [
    "CANCELLED", "FAILED", "LAUNCHING", "MAX_METRIC_RECORDS", "MIGRATIONS", "PENDING", "QUEUED", "RUNNING", "SCHEMA",
    "SCHEMA_VERSION", "SUCCEEDED", "TERMINAL", "Store", "StoreBase", "StoreError", "json_safe", "launch_home",
]


class Store(RecordsStore):
    """Thread-safe access to the job store. One connection per Store."""

    # jobs

    def create_job(self, plan: Any, spec: dict[str, Any], user: str | None = None) -> None:
        """Record a planned job as PENDING, submitted by ``user``; an id already in the store is refused."""
        if not self._insert_job(plan, spec, user):
            raise LaunchError(f"job id {plan.job_id} is already in the store; submit again for a new id")

    def _insert_job(self, plan: Any, spec: dict[str, Any], user: str | None) -> bool:
        return 1 == self._execute(
            """INSERT OR IGNORE INTO jobs (id, name, state, created_at, backend, cluster, launcher, strategy, precision,
               nnodes, nproc_per_node, world_size, micro_batch, grad_accum, global_batch, max_steps,
               run_dir, plan, spec, user) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (
                plan.job_id, plan.job_name, PENDING, time.time(), plan.backend, plan.cluster_name, plan.launcher,
                plan.strategy, plan.precision, plan.nnodes, plan.nproc_per_node, plan.world_size,
                *((plan.batch.micro_batch, plan.batch.grad_accum, plan.batch.global_batch) if plan.batch else (None,) * 3),
                plan.max_steps,
                str(self.run_dir(plan.job_id)), plan.model_dump_json(), json_text(spec), user,
            ),
        )

    def transition(self, job_id: str, state: JobState, **fields: Any) -> bool:
        """Move a job to ``state`` if that is legal from its current state; False if not."""
        allowed = JobState(state).allowed_from
        updates = {"state": state, **fields}
        if state in TERMINAL:
            updates.setdefault("ended_at", time.time())
        first_start = state == RUNNING and "started_at" not in fields
        cols = ", ".join(f"{k} = ?" for k in updates)
        if first_start:  # the job's start is its first attempt's: a restart does not move it (wall time, goodput)
            cols += ", started_at = COALESCE(started_at, ?)"
            updates["started_at"] = time.time()
        values = [json_text(v) if k in JSON_COLUMNS and v is not None else v for k, v in updates.items()]
        marks = ",".join("?" * len(allowed))
        changed = self._execute(
            f"UPDATE jobs SET {cols} WHERE id = ? AND state IN ({marks})", [*values, job_id, *allowed]
        )
        if changed == 1 and (state in TERMINAL or "attempt" in fields):
            self._close_unstarted(job_id, None if state in TERMINAL else fields["attempt"])
        return changed == 1

    def _close_unstarted(self, job_id: str, before_attempt: int | None) -> None:
        """Node rows left STARTING or WAITING by an attempt that is over (all of them when the job ended) become
        NOT_STARTED."""
        bound = "" if before_attempt is None else " AND attempt < ?"
        self._execute(
            f"UPDATE nodes SET state = ?, ended_at = coalesce(ended_at, ?) WHERE job_id = ? AND state IN (?, ?){bound}",
            [NodeState.NOT_STARTED, time.time(), job_id, NodeState.STARTING, NodeState.WAITING,
             *(() if before_attempt is None else (before_attempt,))],
        )

    def set_waiting(self, job_id: str, waiting: bool) -> None:
        """The nodes of a job not started yet: WAITING while it is queued (``waiting``), STARTING again once its turn
        came."""
        was, now = (NodeState.STARTING, NodeState.WAITING) if waiting else (NodeState.WAITING, NodeState.STARTING)
        self._execute("UPDATE nodes SET state = ? WHERE job_id = ? AND state = ?", [now, job_id, was])

    def update_job(self, job_id: str, **fields: Any) -> None:
        """Set fields other than the state."""
        cols = ", ".join(f"{k} = ?" for k in fields)
        values = [json_text(v) if k in JSON_COLUMNS and v is not None else v for k, v in fields.items()]
        self._execute(f"UPDATE jobs SET {cols} WHERE id = ?", [*values, job_id])

    def job(self, ref: str) -> JobRow:
        """The job with this id, or the only one whose id starts with it (an empty reference matches none)."""
        if not ref or not ref.strip():
            raise JobNotFound("no job id given (an empty or blank reference matches no job)",
                              hint="`launch status` lists the jobs")
        rows = self._query("SELECT * FROM jobs WHERE id = ?", (ref,))
        if not rows:
            rows = self._query(
                "SELECT * FROM jobs WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC LIMIT 6",
                (ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
            )
        if not rows:
            raise JobNotFound(f"no job '{ref}' in the store ({self.home})", hint="`launch status` lists the jobs")
        if len(rows) > 1:
            ids = ", ".join(r["id"] for r in rows)
            raise JobNotFound(f"'{ref}' matches several jobs: {ids}; give more of the id")
        return JobRow.read(rows[0])

    def state(self, job_id: str) -> JobState:
        """The state of the job ``job_id``; a StoreError when it is one this launch does not know (a damaged row)."""
        state = self.job(job_id).state
        if state is None:
            raise StoreError(f"job {job_id} has a state this launch does not know in {self.home}")
        return state

    def jobs(self, limit: int | None = None) -> list[JobRow]:
        """Jobs, newest first, without their plans and specs."""
        sql = (
            "SELECT id, name, state, created_at, started_at, ended_at, backend, cluster, launcher, strategy,"
            " precision, nnodes, nproc_per_node, world_size, micro_batch, grad_accum, global_batch, max_steps,"
            " attempt, reason, failure_kind, queue_reason, scheduler_id, first_failure, summary, supervisor_pid,"
            " supervisor_at, user"
            " FROM jobs ORDER BY created_at DESC"
        )
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [JobRow.read(r) for r in self._query(sql)]

    def job_ids(self, prefix: str = "", limit: int = 100) -> list[tuple[str, str]]:
        """(id, state) of the newest jobs whose id starts with ``prefix`` (for shell completion)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._query(
            "SELECT id, state FROM jobs WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC LIMIT ?",
            (escaped + "%", int(limit)),
        )
        return [(r["id"], r["state"]) for r in rows]

    # nodes

    def set_node(self, job_id: str, attempt: int, node: int, **fields: Any) -> None:
        """Insert or update one node's row for an attempt."""
        self._execute(
            "INSERT INTO nodes (job_id, attempt, node) VALUES (?,?,?) ON CONFLICT DO NOTHING",
            (job_id, attempt, node),
        )
        if fields:
            cols = ", ".join(f"{k} = ?" for k in fields)
            self._execute(
                f"UPDATE nodes SET {cols} WHERE job_id = ? AND attempt = ? AND node = ?",
                [*fields.values(), job_id, attempt, node],
            )

    def nodes(self, job_id: str, attempt: int | None = None) -> list[NodeRow]:
        """Node rows of a job (all attempts unless one is named), in order."""
        if attempt is None:
            rows = self._query("SELECT * FROM nodes WHERE job_id = ? ORDER BY attempt, node", (job_id,))
        else:
            rows = self._query("SELECT * FROM nodes WHERE job_id = ? AND attempt = ? ORDER BY node", (job_id, attempt))
        return [NodeRow.read(r) for r in rows]
