"""The job store: SQLite in WAL mode under ``$LAUNCH_HOME`` (default ``~/.launch``).

Tables: jobs, nodes (per attempt), events, metrics (validated records),
samples (per rank and attempt: the node agent's latest process sample and the
peaks, so a long job does not grow the store). Job states move only along
legal transitions, checked atomically in SQL so that a cancel racing a
supervisor cannot resurrect a finished job. The directory is private to its
user (0700) and the database file too (0600).

The schema is versioned (``PRAGMA user_version``): a store made by an older
launch is migrated in place when opened, one made by a newer launch is
refused. Every SQLite error (a corrupted file, a locked or read-only one)
becomes a ``StoreError`` that names the file and what to do. Rows are read
back defensively, so every view renders any stored row: in a job row a value
of the wrong type, a JSON column that does not parse or a NaN reads as unknown;
a metric record or sample row that would not validate is left out.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from launcher.errors import JobNotFound, LaunchError
from launcher.metrics.record import MetricRecord, ProcessSample, RankUsage
from launcher.store.states import TERMINAL, JobState

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
CREATE TABLE IF NOT EXISTS samples (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node INTEGER,
    host TEXT,
    pid INTEGER,
    t REAL,
    cpu_s REAL,
    rss_bytes INTEGER,
    rss_peak_bytes INTEGER,
    gpu_mem_bytes INTEGER,
    gpu_mem_peak_bytes INTEGER,
    gpu_util_sum REAL NOT NULL DEFAULT 0,
    gpu_util_samples INTEGER NOT NULL DEFAULT 0,
    samples INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, attempt, rank)
)
"""

# Schema versions: 0 is the unversioned store of the first releases (no samples table), or a new
# empty file; MIGRATIONS[v] takes a store from version v to v + 1, in place. SCHEMA is version 1:
# a later version adds a migration (ALTER TABLE ...) instead of editing it. Version 2: a scheduler's
# pending reason and its own job id (Slurm).
SCHEMA_VERSION = 2
MIGRATIONS: dict[int, str] = {
    0: SCHEMA,
    1: "ALTER TABLE jobs ADD COLUMN queue_reason TEXT; ALTER TABLE jobs ADD COLUMN scheduler_id TEXT",
}

JSON_COLUMNS = ("first_failure", "plan", "spec", "summary")
INT_COLUMNS = ("nnodes", "nproc_per_node", "world_size", "micro_batch", "grad_accum", "global_batch", "max_steps",
               "attempt", "supervisor_pid")
TIME_COLUMNS = ("created_at", "started_at", "ended_at")
TEXT_COLUMNS = ("id", "name", "state", "backend", "cluster", "launcher", "strategy", "precision", "run_dir", "reason",
                "queue_reason", "scheduler_id")


class StoreError(LaunchError):
    """The job store cannot be read or written: a corrupted, locked, read-only or newer-version file."""


def launch_home() -> Path:
    """Where the store and run directories live: ``$LAUNCH_HOME`` or ``~/.launch``."""
    return Path(os.environ.get("LAUNCH_HOME") or Path.home() / ".launch").expanduser()


class Store:
    """Thread-safe access to the job store. One connection per Store."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or launch_home()
        self.runs = self.home / "runs"
        self.path = self.home / "jobs.db"
        self._lock = threading.Lock()
        try:
            self.runs.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.home, 0o700)
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
            os.close(fd)
        except OSError as exc:
            raise StoreError(f"cannot open the job store in {self.home}: {exc}", hint="set LAUNCH_HOME to a writable directory") from None
        with self._guard():
            self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA busy_timeout = 30000")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()

    def _migrate(self) -> None:
        """Bring the schema to ``SCHEMA_VERSION`` (one transaction per step); refuse a newer store."""
        while True:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the job store {self.path} was made by a newer launch (schema {version}); "
                    f"this launch reads schema {SCHEMA_VERSION}",
                    hint="upgrade launch, or set LAUNCH_HOME to another directory for this version",
                )
            if version == SCHEMA_VERSION:
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if self._db.execute("PRAGMA user_version").fetchone()[0] == version:  # nobody migrated meanwhile
                    for statement in MIGRATIONS[version].split(";"):
                        if statement.strip():
                            self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {version + 1}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """SQLite errors as a StoreError naming the file and what to do."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text or "corrupt" in text):
            return StoreError(
                f"the job store {self.path} is corrupted ({text})",
                hint=f"move it aside (mv {shlex.quote(str(self.path))} {shlex.quote(str(self.path))}.broken) and run launch "
                     f"again: it makes a new, empty store; the jobs' logs stay under {self.runs}",
            )
        if "locked" in text or "busy" in text:
            return StoreError(f"the job store {self.path} is locked by another process ({text})",
                              hint="try again when the other launch command is done")
        return StoreError(f"the job store {self.path} failed: {text}",
                          hint="check the disk and the file's permissions, or set LAUNCH_HOME to another directory")

    def close(self) -> None:
        with self._guard():
            self._db.close()

    def _execute(self, sql: str, params: tuple | list = ()) -> int:
        """Run one write; the number of rows it changed."""
        with self._lock, self._guard():
            return self._db.execute(sql, params).rowcount

    def _query(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
        """Run one read and fetch every row (a damaged page fails here, inside the guard)."""
        with self._lock, self._guard():
            return self._db.execute(sql, params).fetchall()

    def _transaction(self, sql: str, rows: list[tuple]) -> None:
        with self._lock, self._guard():
            self._db.execute("BEGIN")
            try:
                self._db.executemany(sql, rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def run_dir(self, job_id: str) -> Path:
        """The job's private directory for logs and pid files (created 0700)."""
        path = self.runs / job_id
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    # jobs

    def create_job(self, plan: Any, spec: dict[str, Any]) -> None:
        """Record a planned job as PENDING; an id already in the store is refused."""
        if not self._insert_job(plan, spec):
            raise LaunchError(f"job id {plan.job_id} is already in the store; submit again for a new id")

    def _insert_job(self, plan: Any, spec: dict[str, Any]) -> bool:
        return 1 == self._execute(
            """INSERT OR IGNORE INTO jobs (id, name, state, created_at, backend, cluster, launcher, strategy, precision,
               nnodes, nproc_per_node, world_size, micro_batch, grad_accum, global_batch, max_steps,
               run_dir, plan, spec) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (
                plan.job_id, plan.job_name, PENDING, time.time(), plan.backend, plan.cluster_name, plan.launcher,
                plan.strategy, plan.precision, plan.nnodes, plan.nproc_per_node, plan.world_size,
                *((plan.batch.micro_batch, plan.batch.grad_accum, plan.batch.global_batch) if plan.batch else (None,) * 3),
                plan.max_steps,
                str(self.run_dir(plan.job_id)), plan.model_dump_json(), _json_text(spec),
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
        values = [_json_text(v) if k in JSON_COLUMNS and v is not None else v for k, v in updates.items()]
        marks = ",".join("?" * len(allowed))
        changed = self._execute(
            f"UPDATE jobs SET {cols} WHERE id = ? AND state IN ({marks})", [*values, job_id, *allowed]
        )
        return changed == 1

    def update_job(self, job_id: str, **fields: Any) -> None:
        """Set fields other than the state."""
        cols = ", ".join(f"{k} = ?" for k in fields)
        values = [_json_text(v) if k in JSON_COLUMNS and v is not None else v for k, v in fields.items()]
        self._execute(f"UPDATE jobs SET {cols} WHERE id = ?", [*values, job_id])

    def job(self, ref: str) -> dict[str, Any]:
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
        return _job_dict(rows[0])

    def jobs(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Jobs, newest first, without their plans and specs."""
        sql = (
            "SELECT id, name, state, created_at, started_at, ended_at, backend, cluster, launcher, strategy,"
            " precision, nnodes, nproc_per_node, world_size, micro_batch, grad_accum, global_batch, max_steps,"
            " attempt, reason, queue_reason, scheduler_id, first_failure, summary FROM jobs ORDER BY created_at DESC"
        )
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [_job_dict(r) for r in self._query(sql)]

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

    def nodes(self, job_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """Node rows of a job (all attempts unless one is named), in order."""
        if attempt is None:
            rows = self._query("SELECT * FROM nodes WHERE job_id = ? ORDER BY attempt, node", (job_id,))
        else:
            rows = self._query("SELECT * FROM nodes WHERE job_id = ? AND attempt = ? ORDER BY node", (job_id, attempt))
        return [dict(r) for r in rows]

    # events and metrics

    def add_event(self, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self._execute(
            "INSERT INTO events (job_id, t, kind, message, data) VALUES (?,?,?,?,?)",
            (job_id, time.time(), kind, message, _json_text(data) if data is not None else None),
        )

    def events(self, job_id: str) -> list[dict[str, Any]]:
        """A job's events in order; a value of the wrong type reads as unknown."""
        rows = self._query("SELECT t, kind, message, data FROM events WHERE job_id = ? ORDER BY id", (job_id,))
        return [
            {"t": _finite_or_none(r["t"]) or 0.0, "kind": _text_or_none(r["kind"]) or "?",
             "message": _text_or_none(r["message"]) or "", "data": _json_value(r["data"])}
            for r in rows
        ]

    def add_metrics(self, job_id: str, attempt: int, records: Iterable[MetricRecord | Mapping[str, Any]]) -> None:
        """Store metric records of an attempt (one transaction for the batch), each under this job and attempt.

        Records come from ``parse_line`` (validated, with the channel's node and host); a mapping is
        read as a stored row is.
        """
        rows = []
        for item in records:
            record = item if isinstance(item, MetricRecord) else MetricRecord.from_stored(item)
            if record is None:
                continue
            wire = {**record.to_wire(), "job": job_id}
            rows.append((job_id, attempt, record.node, record.rank, record.step, _json_text(wire)))
        if rows:
            self._transaction("INSERT INTO metrics (job_id, attempt, node, rank, step, record) VALUES (?,?,?,?,?,?)", rows)

    def metrics(self, job_id: str) -> list[MetricRecord]:
        """A job's records, in arrival order, each with its attempt; rows that are not valid records are left out."""
        rows = self._query("SELECT attempt, record FROM metrics WHERE job_id = ? ORDER BY id", (job_id,))
        records = []
        for row in rows:
            data = _json_value(row["record"])
            record = MetricRecord.from_stored(data, attempt=row["attempt"]) if isinstance(data, dict) else None
            if record is not None:
                records.append(record)
        return records

    def add_samples(self, job_id: str, attempt: int, samples: Iterable[ProcessSample]) -> None:
        """Fold the node agent's process samples into one row per rank and attempt.

        Kept: the latest sample (time, pid, CPU seconds, RSS, GPU memory), the peaks of RSS
        and GPU memory, and the sum and count of GPU utilisation readings (for the mean).
        """
        rows = [
            (job_id, attempt, s.rank, s.node, s.host, s.pid, s.t, s.cpu_s, s.rss_bytes, max(s.rss_peak_bytes, s.rss_bytes),
             s.gpu_mem_bytes, s.gpu_mem_bytes, s.gpu_util or 0.0, int(s.gpu_util is not None))
            for s in samples
        ]
        if rows:
            self._transaction(
                """INSERT INTO samples (job_id, attempt, rank, node, host, pid, t, cpu_s, rss_bytes, rss_peak_bytes,
                   gpu_mem_bytes, gpu_mem_peak_bytes, gpu_util_sum, gpu_util_samples, samples)
                   VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,1)
                   ON CONFLICT (job_id, attempt, rank) DO UPDATE SET
                   node = excluded.node, host = excluded.host, pid = excluded.pid, t = excluded.t,
                   cpu_s = excluded.cpu_s, rss_bytes = excluded.rss_bytes,
                   rss_peak_bytes = max(coalesce(rss_peak_bytes, 0), excluded.rss_peak_bytes),
                   gpu_mem_bytes = excluded.gpu_mem_bytes,
                   gpu_mem_peak_bytes = CASE WHEN excluded.gpu_mem_peak_bytes IS NULL THEN gpu_mem_peak_bytes
                       ELSE max(coalesce(gpu_mem_peak_bytes, 0), excluded.gpu_mem_peak_bytes) END,
                   gpu_util_sum = gpu_util_sum + excluded.gpu_util_sum,
                   gpu_util_samples = gpu_util_samples + excluded.gpu_util_samples,
                   samples = samples + 1""",
                rows,
            )

    def samples(self, job_id: str) -> list[RankUsage]:
        """What the node agents saw of each rank, per attempt (rows that do not read as valid are left out)."""
        rows = self._query("SELECT * FROM samples WHERE job_id = ? ORDER BY attempt, rank", (job_id,))
        usage = []
        for row in rows:
            data = dict(row)
            count = data["gpu_util_samples"]
            if isinstance(count, int) and count > 0 and isinstance(data["gpu_util_sum"], (int, float)):
                data["gpu_util_mean"] = data["gpu_util_sum"] / count
            entry = RankUsage.from_stored(data)
            if entry is not None:
                usage.append(entry)
        return usage


def _json_text(value: Any) -> str:
    """JSON text for a column (see ``json_safe``)."""
    return json.dumps(json_safe(value), separators=(",", ":"), allow_nan=False)


def json_safe(value: Any) -> Any:
    """``value`` as strict JSON data: objects with ``as_json`` as their JSON, NaN and infinities as null."""
    if hasattr(value, "as_json"):
        value = value.as_json()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _json_value(text: Any) -> Any:
    """A JSON column's value; None when it does not parse. NaN, infinities and out-of-range numbers read as None."""
    if not isinstance(text, (str, bytes)) or not text:
        return None
    try:
        return json.loads(text, parse_constant=lambda _: None, parse_float=_parse_float)
    except (ValueError, RecursionError):
        return None


def _parse_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _finite_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _text_or_none(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _job_dict(row: sqlite3.Row) -> dict[str, Any]:
    """A job row with each column of its expected type (a JSON column that is not an object, or junk, reads as None)."""
    job = dict(row)
    for key in JSON_COLUMNS:
        if key in job:
            value = _json_value(job[key])
            job[key] = value if isinstance(value, dict) else None
    for key in INT_COLUMNS:
        if key in job and (isinstance(job[key], bool) or not isinstance(job[key], int)):
            job[key] = None
    for key in TIME_COLUMNS:
        if key in job:
            job[key] = _finite_or_none(job[key])
    for key in TEXT_COLUMNS:
        if key in job:
            job[key] = _text_or_none(job[key])
    return job
