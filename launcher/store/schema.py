"""The job store's schema: its tables, its version, the migrations, and the check that a file is one.

The schema is versioned (``PRAGMA user_version``): a store made by an older launch is migrated
in place when opened, one made by a newer launch is refused, and so is one whose version launch
never wrote (a negative one) or whose tables lack a column launch reads (another program's file,
or a damaged one): each as a ``StoreError`` naming the file and what to do.
"""

from __future__ import annotations

import re
import shlex
import sqlite3
from pathlib import Path

from launcher.errors import LaunchError


class StoreError(LaunchError):
    """The job store cannot be read or written: a corrupted, locked, read-only or newer-version file."""


class StoreLocked(StoreError):
    """Another process held the job store's write lock for longer than this one waited."""


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
# pending reason and its own job id (Slurm). Version 3: where a supervisor may resume a node's journal
# (``nodes.seen``: the whole lines received; ``nodes.log_bytes``: the node's log file then; the agent's
# ``start_ticks``, to signal it by PID safely) and when the job's supervisor was last alive (``jobs.supervisor_at``).
# Version 4: the running summary of each rank's metric records (``store.tally``), for `launch status` of a running
# job; a job's records stored before it are not tallied, and its summary is made from them. Version 5: the kind of the
# job's first failure (``jobs.failure_kind``, a ``FailureKind``), which `launch submit` decides from; a job ended
# before it has none. Version 6: who submitted the job (``jobs.user``: the user that ran `launch submit`, or took the
# job over into this store); a job stored before it has none. Version 7: the figures the dashboard plots in columns
# of the metrics table (``records.FIGURE_COLUMNS``, and ``warmup``; ``figures`` 1 where a row has them), read without
# parsing each record's JSON; rows stored before keep them in their JSON only.
SCHEMA_VERSION = 7
MIGRATIONS: dict[int, str] = {
    0: SCHEMA,
    1: "ALTER TABLE jobs ADD COLUMN queue_reason TEXT; ALTER TABLE jobs ADD COLUMN scheduler_id TEXT",
    2: "ALTER TABLE nodes ADD COLUMN seen INTEGER; ALTER TABLE nodes ADD COLUMN log_bytes INTEGER; "
       "ALTER TABLE nodes ADD COLUMN start_ticks INTEGER; ALTER TABLE jobs ADD COLUMN supervisor_at REAL",
    3: """
CREATE TABLE IF NOT EXISTS tally_ranks (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node INTEGER,
    host TEXT,
    records INTEGER NOT NULL,
    warmup_records INTEGER NOT NULL,
    step INTEGER NOT NULL,
    mem_peak_bytes INTEGER,
    PRIMARY KEY (job_id, attempt, rank)
);
CREATE TABLE IF NOT EXISTS tally_values (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    warmup INTEGER NOT NULL,
    chunk INTEGER NOT NULL,
    step_time_s BLOB NOT NULL,
    interval_s BLOB NOT NULL,
    samples BLOB NOT NULL,
    tokens BLOB NOT NULL,
    gpu_util BLOB NOT NULL,
    PRIMARY KEY (job_id, attempt, rank, warmup, chunk)
);
CREATE TABLE IF NOT EXISTS tally_attempts (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    loss REAL,
    flops_per_sample REAL,
    PRIMARY KEY (job_id, attempt)
)""",
    4: "ALTER TABLE jobs ADD COLUMN failure_kind TEXT",
    5: "ALTER TABLE jobs ADD COLUMN user TEXT",
    6: "ALTER TABLE metrics ADD COLUMN figures INTEGER; ALTER TABLE metrics ADD COLUMN warmup INTEGER; "
       "ALTER TABLE metrics ADD COLUMN samples_per_sec REAL; ALTER TABLE metrics ADD COLUMN step_time_s REAL; "
       "ALTER TABLE metrics ADD COLUMN loss REAL; ALTER TABLE metrics ADD COLUMN mem_peak_bytes REAL",
}


def _columns(table: str) -> set[str]:
    """The columns ``table`` has once every migration has run (read from MIGRATIONS, SCHEMA the first)."""
    body = re.search(rf"CREATE TABLE IF NOT EXISTS {table} \((.*?)\n\)", "\n".join(MIGRATIONS.values()), re.S)
    assert body is not None, table
    names = {line.split()[0] for line in body.group(1).splitlines() if line.strip() and not line.strip().startswith("PRIMARY")}
    names.update(re.findall(rf"ALTER TABLE {table} ADD COLUMN (\w+)", " ".join(MIGRATIONS.values())))
    return names


TABLES = ("jobs", "nodes", "events", "metrics", "samples", "tally_ranks", "tally_values", "tally_attempts")
REQUIRED_COLUMNS: dict[str, set[str]] = {table: _columns(table) for table in TABLES}


def _aside(path: Path) -> str:
    return f"move it aside (mv {shlex.quote(str(path))} {shlex.quote(str(path))}.broken) and run launch again: it makes a new, empty store"


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the schema to ``SCHEMA_VERSION`` (one transaction per step); refuse a newer store, a version
    launch never wrote, or tables without the columns launch reads."""
    while True:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the job store {path} was made by a newer launch (schema {version}); "
                f"this launch reads schema {SCHEMA_VERSION}",
                hint="upgrade launch, or set LAUNCH_HOME to another directory for this version",
            )
        if version < 0:
            raise StoreError(f"the job store {path} has schema version {version}, which no launch writes: it is "
                             "another program's file or a damaged one", hint=_aside(path))
        if version == SCHEMA_VERSION:
            break
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("PRAGMA user_version").fetchone()[0] == version:  # nobody migrated meanwhile
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {version + 1}")
            db.execute("COMMIT")
        except sqlite3.OperationalError:
            db.execute("ROLLBACK")
            check_columns(db, path)  # a table the migration alters is missing: say what the file lacks
            raise
        except BaseException:
            db.execute("ROLLBACK")
            raise
    check_columns(db, path)


def check_columns(db: sqlite3.Connection, path: Path) -> None:
    """Every table and column launch reads is there; else a StoreError listing what is missing."""
    missing = []
    for table, wanted in REQUIRED_COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if not have:
            missing.append(f"table {table}")
        else:
            missing.extend(f"{table}.{name}" for name in sorted(wanted - have))
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise StoreError(f"the job store {path} lacks {shown} (schema {SCHEMA_VERSION} has them): it is another "
                         "program's file or a damaged one", hint=_aside(path))
