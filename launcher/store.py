"""The job store: SQLite in WAL mode under ``$LAUNCH_HOME`` (default ``~/.launch``).

Tables: jobs, nodes (per attempt), events, metrics (raw records). Job states
move only along legal transitions, checked atomically in SQL so that a
cancel racing a supervisor cannot resurrect a finished job. The directory
is private to its user (0700) and the database file too (0600).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from launcher.errors import JobNotFound, LaunchError
from launcher.states import TERMINAL, JobState

PENDING, QUEUED, LAUNCHING, RUNNING = JobState.PENDING, JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING
SUCCEEDED, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    backend TEXT,
    cluster TEXT,
    launcher TEXT,
    strategy TEXT,
    precision TEXT,
    nnodes INTEGER,
    nproc_per_node INTEGER,
    world_size INTEGER,
    micro_batch INTEGER,
    grad_accum INTEGER,
    global_batch INTEGER,
    max_steps INTEGER,
    attempt INTEGER NOT NULL DEFAULT 0,
    run_dir TEXT,
    supervisor_pid INTEGER,
    reason TEXT,
    first_failure TEXT,
    plan TEXT,
    spec TEXT,
    summary TEXT
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at);
CREATE TABLE IF NOT EXISTS nodes (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    node INTEGER NOT NULL,
    host TEXT,
    address TEXT,
    state TEXT,
    pid INTEGER,
    exit_code INTEGER,
    log_path TEXT,
    started_at REAL,
    ended_at REAL,
    PRIMARY KEY (job_id, attempt, node)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    t REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT,
    data TEXT
);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id, id);
CREATE TABLE IF NOT EXISTS metrics (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    node INTEGER,
    rank INTEGER,
    step INTEGER,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_job ON metrics (job_id, id);
"""

JSON_COLUMNS = ("first_failure", "plan", "spec", "summary")


def launch_home() -> Path:
    """Where the store and run directories live: ``$LAUNCH_HOME`` or ``~/.launch``."""
    return Path(os.environ.get("LAUNCH_HOME") or Path.home() / ".launch").expanduser()


class Store:
    """Thread-safe access to the job store. One connection per Store."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or launch_home()
        self.runs = self.home / "runs"
        try:
            self.runs.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.home, 0o700)
            path = self.home / "jobs.db"
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            os.close(fd)
            self._db = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA busy_timeout = 30000")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise LaunchError(f"cannot open the job store in {self.home}: {exc}", hint="set LAUNCH_HOME to a writable directory") from None
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def _execute(self, sql: str, params: tuple | list = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, params)

    def run_dir(self, job_id: str) -> Path:
        """The job's private directory for logs and pid files (created 0700)."""
        path = self.runs / job_id
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    # jobs

    def create_job(self, plan: Any, spec: dict[str, Any]) -> None:
        """Record a planned job as PENDING; an id already in the store is refused."""
        try:
            self._insert_job(plan, spec)
        except sqlite3.IntegrityError:
            raise LaunchError(f"job id {plan.job_id} is already in the store; submit again for a new id") from None

    def _insert_job(self, plan: Any, spec: dict[str, Any]) -> None:
        self._execute(
            """INSERT INTO jobs (id, name, state, created_at, backend, cluster, launcher, strategy, precision,
               nnodes, nproc_per_node, world_size, micro_batch, grad_accum, global_batch, max_steps,
               run_dir, plan, spec) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (
                plan.job_id, plan.job_name, PENDING, time.time(), plan.backend, plan.cluster_name, plan.launcher,
                plan.strategy, plan.precision, plan.nnodes, plan.nproc_per_node, plan.world_size,
                *((plan.batch.micro_batch, plan.batch.grad_accum, plan.batch.global_batch) if plan.batch else (None,) * 3),
                plan.max_steps,
                str(self.run_dir(plan.job_id)), plan.model_dump_json(), json.dumps(spec),
            ),
        )

    def transition(self, job_id: str, state: str, **fields: Any) -> bool:
        """Move a job to ``state`` if that is legal from its current state; False if not."""
        allowed = JobState(state).allowed_from
        updates = {"state": state, **fields}
        if state in TERMINAL:
            updates.setdefault("ended_at", time.time())
        if state == RUNNING:
            updates.setdefault("started_at", time.time())
        cols = ", ".join(f"{k} = ?" for k in updates)
        values = [json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in updates.items()]
        marks = ",".join("?" * len(allowed))
        cur = self._execute(
            f"UPDATE jobs SET {cols} WHERE id = ? AND state IN ({marks})", [*values, job_id, *allowed]
        )
        return cur.rowcount == 1

    def update_job(self, job_id: str, **fields: Any) -> None:
        """Set fields other than the state."""
        cols = ", ".join(f"{k} = ?" for k in fields)
        values = [json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in fields.items()]
        self._execute(f"UPDATE jobs SET {cols} WHERE id = ?", [*values, job_id])

    def job(self, ref: str) -> dict[str, Any]:
        """The job with this id, or the only one whose id starts with it."""
        rows = self._execute("SELECT * FROM jobs WHERE id = ?", (ref,)).fetchall()
        if not rows:
            rows = self._execute(
                "SELECT * FROM jobs WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC LIMIT 6",
                (ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
            ).fetchall()
        if not rows:
            raise JobNotFound(f"no job '{ref}' in the store ({self.home})", hint="`launch status` lists the jobs")
        if len(rows) > 1:
            ids = ", ".join(r["id"] for r in rows)
            raise JobNotFound(f"'{ref}' matches several jobs: {ids}; give more of the id")
        return _job_dict(rows[0])

    def jobs(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Jobs, newest first, without their plans and specs."""
        sql = (
            "SELECT id, name, state, created_at, started_at, ended_at, backend, cluster, launcher, strategy,"
            " precision, nnodes, nproc_per_node, world_size, micro_batch, grad_accum, global_batch, max_steps,"
            " attempt, reason, first_failure, summary FROM jobs ORDER BY created_at DESC"
        )
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [_job_dict(r) for r in self._execute(sql).fetchall()]

    def job_ids(self, prefix: str = "", limit: int = 100) -> list[tuple[str, str]]:
        """(id, state) of the newest jobs whose id starts with ``prefix`` (for shell completion)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._execute(
            "SELECT id, state FROM jobs WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC LIMIT ?",
            (escaped + "%", int(limit)),
        ).fetchall()
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

    def nodes(self, job_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """Node rows of a job (all attempts unless one is named), in order."""
        if attempt is None:
            rows = self._execute("SELECT * FROM nodes WHERE job_id = ? ORDER BY attempt, node", (job_id,))
        else:
            rows = self._execute(
                "SELECT * FROM nodes WHERE job_id = ? AND attempt = ? ORDER BY node", (job_id, attempt)
            )
        return [dict(r) for r in rows.fetchall()]

    # events and metrics

    def add_event(self, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self._execute(
            "INSERT INTO events (job_id, t, kind, message, data) VALUES (?,?,?,?,?)",
            (job_id, time.time(), kind, message, json.dumps(data) if data is not None else None),
        )

    def events(self, job_id: str) -> list[dict[str, Any]]:
        rows = self._execute("SELECT t, kind, message, data FROM events WHERE job_id = ? ORDER BY id", (job_id,))
        return [{**dict(r), "data": json.loads(r["data"]) if r["data"] else None} for r in rows.fetchall()]

    def add_metrics(self, job_id: str, attempt: int, records: list[dict[str, Any]]) -> None:
        """Store raw metric records (one transaction for the batch)."""
        rows = [
            (job_id, attempt, r.get("node"), r.get("rank"), r.get("step"), json.dumps(r, separators=(",", ":")))
            for r in records
        ]
        with self._lock:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT INTO metrics (job_id, attempt, node, rank, step, record) VALUES (?,?,?,?,?,?)", rows
                )

    def metrics(self, job_id: str) -> list[dict[str, Any]]:
        """Raw records of a job, in arrival order, each with its attempt."""
        rows = self._execute("SELECT attempt, record FROM metrics WHERE job_id = ? ORDER BY id", (job_id,))
        return [{**json.loads(r["record"]), "attempt": r["attempt"]} for r in rows.fetchall()]


def _job_dict(row: sqlite3.Row) -> dict[str, Any]:
    job = dict(row)
    for key in JSON_COLUMNS:
        if job.get(key):
            job[key] = json.loads(job[key])
    return job
