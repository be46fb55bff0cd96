"""The store as an adversary finds it: an older schema, a newer one, a corrupted file, junk in any column.

Corrupted and old stores are real SQLite files made here; the CLI runs for real
(a subprocess) where the exit code and the absence of a traceback are the point.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli.main import main
from launcher.errors import JobNotFound
from launcher.metrics.record import ProcessSample
from launcher.store.db import SCHEMA_VERSION, Store, StoreError
from launcher.store.records import Batch

# The schema of the first releases, exactly as their store.py created it (no version, no samples table).
SCHEMA_V0 = """
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

# What those releases wrote: json.dumps(...) of a summary with a NaN loss, a record the old
# supervisor stored although it is invalid (the audit's "samples": "x"), and valid records.
OLD_SUMMARY = (
    '{"steps": 20, "records": 4, "samples_per_sec": 160.0, "tokens_per_sec": null, "step_time_ms_p50": 100.0, '
    '"step_time_ms_p95": 110.0, "steps_per_sec": 10.0, "peak_mem_mb": 120.5, "gpu_util": null, '
    '"flops_per_sample": null, "loss": NaN, "per_rank": [{"rank": 0, "node": 0, "host": "h0", "samples_per_sec": 80.0, '
    '"tokens_per_sec": 0.0, "step_time_ms_p50": 100.0, "peak_mem_mb": 120.5, "steps": 20}]}'
)
OLD_RECORD = ('{{"v": 1, "job": "old-000001", "node": 0, "rank": {rank}, "local_rank": 0, "host": "h0", "step": {step}, '
              '"t": 1700000000.0, "steps": 10, "interval_s": 1.0, "step_time_s": 0.1, "samples": 80, "tokens": 0, '
              '"samples_per_sec": 80.0, "tokens_per_sec": 0.0, "loss": {loss}, "mem_peak_bytes": 126353408, '
              '"warmup": false}}')


def _strict(text: str):
    """JSON as a strict parser reads it: NaN or Infinity are errors."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def _launch(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAUNCH_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True, timeout=60)


def _old_store(home: Path) -> Path:
    home.mkdir(parents=True)
    path = home / "jobs.db"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_V0)
    db.execute(
        "INSERT INTO jobs (id, name, state, created_at, started_at, ended_at, backend, cluster, launcher, strategy, "
        "precision, nnodes, nproc_per_node, world_size, micro_batch, grad_accum, global_batch, max_steps, attempt, "
        "summary) VALUES ('old-000001', 'old', 'SUCCEEDED', 1700000000.0, 1700000001.0, 1700000100.0, 'local', "
        "'local', 'torchrun', NULL, 'fp32', 1, 2, 2, 8, 1, 16, 20, 0, ?)", (OLD_SUMMARY,))
    db.execute("INSERT INTO jobs (id, name, state, created_at, attempt) VALUES ('old-000002', 'old', 'RUNNING', "
               "1700000200.0, 0)")
    rows = [OLD_RECORD.format(rank=r, step=s, loss="NaN" if s == 20 else "0.5") for r in (0, 1) for s in (10, 20)]
    rows.append('{"v":1,"rank":0,"step":1,"samples":"x","interval_s":1}')
    for record in rows:
        db.execute("INSERT INTO metrics (job_id, attempt, node, rank, step, record) VALUES ('old-000002', 0, 0, 0, 0, ?)",
                   (record,))
    db.commit()
    db.close()
    return path


def test_a_store_made_by_the_first_releases_is_migrated_in_place(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    path = _old_store(home)
    store = Store(home)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
    assert store.job("old-000001").summary["loss"] is None, "NaN written by old code reads as unknown"
    assert store.job("old-000001").failure_kind is None, "a job ended before failure kinds were kept has none"
    assert store.job("old-000001").user is None, "a job stored before its submitter was kept has none"
    assert (store.job("old-000002").queue_reason, store.job("old-000002").scheduler_id) == (None, None)
    store.update_job("old-000002", queue_reason="Resources", scheduler_id="17")
    assert (store.job("old-000002").queue_reason, store.job("old-000002").scheduler_id) == ("Resources", "17")
    records = store.metrics("old-000002")
    assert len(records) == 4, "the invalid old record is left out, the valid ones read"
    assert {r.loss for r in records} == {0.5, None}
    store.add_batch("old-000002", 0, Batch(samples=[ProcessSample(node=0, rank=0, t=1.0, pid=5, cpu_s=1.0, rss_bytes=1,
                                                      rss_peak_bytes=2)]))
    assert store.samples("old-000002")[0].rss_peak_bytes == 2
    store.close()
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    for argv in (["status", "--json"], ["status", "old-000002", "--json"], ["metrics", "old-000002", "--json"],
                 ["compare", "old-000001", "old-000002", "--json"]):
        main(argv)
        _strict(capsys.readouterr().out)
    assert Store(home).running_summary("old-000002") is None, "its records were stored before the running summary"
    main(["status", "old-000002", "--json"])
    shown = _strict(capsys.readouterr().out)["metrics"]
    assert (shown["steps"], shown["samples_per_sec"], shown["loss"]) == (20, 160.0, 0.5), "summarised from its records"
    assert Store(home).job("old-000001").state == "SUCCEEDED", "opening a migrated store again changes nothing"


def test_a_store_from_a_newer_launch_is_refused(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    db = sqlite3.connect(home / "jobs.db")
    db.execute("CREATE TABLE jobs (id TEXT)")
    db.execute("PRAGMA user_version = 99")
    db.commit()
    done = _launch(home, "status")
    assert done.returncode == 1
    assert f"made by a newer launch (schema 99); this launch reads schema {SCHEMA_VERSION}" in done.stderr
    assert str(home / "jobs.db") in done.stderr and "Traceback" not in done.stderr


def _corrupt_jobs_table(home: Path) -> None:
    """A real store whose jobs table's root page is overwritten: SQLite reports 'database disk image is malformed'."""
    store = Store(home)
    for index in range(200):
        store._execute("INSERT INTO jobs (id, name, state, created_at) VALUES (?, ?, 'SUCCEEDED', 1.0)",
                       (f"j-{index:04d}", "n" * 200))
    root = store._query("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'")[0][0]
    page = store._query("PRAGMA page_size")[0][0]
    store.close()
    with open(home / "jobs.db", "r+b") as handle:
        handle.seek((root - 1) * page + 8)
        handle.write(b"\xa5" * (page - 8))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda home: (home / "jobs.db").write_bytes(b"this is not SQLite" * 400), "file is not a database"),
        (_corrupt_jobs_table, "database disk image is malformed"),
    ],
)
@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["metrics", "j-0001"], ["cancel", "j-0001"]])
def test_a_corrupted_store_is_named_with_what_to_do(tmp_path, damage, message, command):
    home = tmp_path / "home"
    home.mkdir()
    damage(home)
    done = _launch(home, *command)
    assert done.returncode == 1, done.stderr
    assert message in done.stderr and f"the job store {home / 'jobs.db'} is corrupted" in done.stderr
    assert "move it aside" in done.stderr and "Traceback" not in done.stderr


def test_every_sqlite_error_in_the_store_is_a_store_error(tmp_path):
    store = Store(tmp_path / "home")
    store._db.close()  # every call now fails inside SQLite (sqlite3.ProgrammingError)
    calls = [
        lambda: store.jobs(), lambda: store.job("x"), lambda: store.nodes("x"), lambda: store.events("x"),
        lambda: store.metrics("x"), lambda: store.samples("x"), lambda: store.add_event("x", "k", "m"),
        lambda: store.set_node("x", 0, 0, state="RUNNING"), lambda: store.update_job("x", reason="r"),
        lambda: store.transition("x", "FAILED"), lambda: store.add_batch("x", 0, Batch(samples=[ProcessSample(
            node=0, rank=0, t=1.0, pid=1, cpu_s=0.0, rss_bytes=0, rss_peak_bytes=0)])),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="the job store .* failed"):
            call()


@pytest.mark.parametrize("ref", ["", " ", "\t\n"])
def test_an_empty_job_reference_matches_no_job(tmp_path, ref):
    store = Store(tmp_path / "home")
    store._execute("INSERT INTO jobs (id, name, state, created_at) VALUES ('a-1', 'a', 'RUNNING', 1.0)")
    with pytest.raises(JobNotFound, match="no job id given"):
        store.job(ref)


def test_cancel_of_an_empty_id_is_refused(tmp_path):
    home = tmp_path / "home"
    Store(home)._execute("INSERT INTO jobs (id, name, state, created_at) VALUES ('a-1', 'a', 'RUNNING', 1.0)")
    done = _launch(home, "cancel", "")
    assert done.returncode == 4 and "no job id given" in done.stderr and "Traceback" not in done.stderr
    assert Store(home).job("a-1").state == "RUNNING"


def test_samples_keep_one_row_per_rank_with_the_peaks(tmp_path):
    store = Store(tmp_path / "home")
    for second, (rss, gpu, util) in enumerate([(100, 50, 0.2), (300, 80, 0.4), (200, None, None), (150, 60, 0.6)]):
        store.add_batch("j", 0, Batch(samples=[ProcessSample(node=1, rank=3, host="h1", t=float(second), pid=77, cpu_s=second * 2.0,
                                                 rss_bytes=rss, rss_peak_bytes=rss, gpu_mem_bytes=gpu, gpu_util=util)]))
    [usage] = store.samples("j")
    assert store._query("SELECT count(*) FROM samples")[0][0] == 1
    assert (usage.rank, usage.node, usage.host, usage.t, usage.cpu_s) == (3, 1, "h1", 3.0, 6.0)
    assert (usage.rss_bytes, usage.rss_peak_bytes) == (150, 300)
    assert (usage.gpu_mem_bytes, usage.gpu_mem_peak_bytes) == (60, 80)
    assert usage.gpu_util_mean == pytest.approx(0.4) and usage.samples == 4


JUNK_JOBS = [
    # (id, column values written straight into the row)
    ("junk-summary-text", {"summary": '"a string"'}),
    ("junk-summary-shape", {"summary": '{"samples_per_sec": "fast", "steps": [1], "peak_mem_mb": NaN, '
                                       '"per_rank": [1, {"rank": "x"}, {"rank": 0, "peak_mem_mb": Infinity, "host": "[/x]"}]}'}),
    ("junk-summary-json", {"summary": "{not json"}),
    ("junk-plan", {"plan": '{"nodes": [{"index": 0}, 5, {"env": {"NCCL_IB_HCA": "x"}}]}', "summary": "{}"}),
    ("junk-plan-list", {"plan": "[1, 2, 3]", "spec": '{"cluster": {"gpu": {"peak_tflops": "many", "name": 5}}}'}),
    ("junk-failure", {"first_failure": '{"stalled_s": 5}', "reason": "[/x] [bold]markup[/] in a reason"}),
    ("junk-failure-lines", {"first_failure": '{"node": "[/x]", "last_lines": 5}', "state": "FAILED"}),
    ("junk-failure-list", {"first_failure": "[1, 2]", "state": "WEIRD"}),
    ("junk-numbers", {"created_at": "'yesterday'", "nnodes": "'many'", "world_size": "2.5", "max_steps": "x'00'",
                      "attempt": "'x'", "name": "x'ff00'"}),
]


def _junk_store(home: Path) -> None:
    store = Store(home)
    for job_id, columns in JUNK_JOBS:
        store._execute("INSERT INTO jobs (id, name, state, created_at) VALUES (?, 'junk', 'SUCCEEDED', 1.0)", (job_id,))
        for column, sql_value in columns.items():
            literal = sql_value if column in ("created_at", "nnodes", "world_size", "max_steps", "attempt", "name") \
                else "'" + sql_value.replace("'", "''") + "'"
            store._execute(f"UPDATE jobs SET {column} = {literal} WHERE id = ?", (job_id,))
    store._execute("UPDATE jobs SET state = 'RUNNING' WHERE id = 'junk-plan'")
    for record in ("not json", '{"rank": -1, "step": 1}', '[1]', '{"v": 1, "rank": 0, "step": 2, "loss": NaN, '
                   '"samples": 8, "interval_s": 1.0, "host": "[/x]"}', '{"v": 1, "rank": 1, "step": 1e400}'):
        store._execute("INSERT INTO metrics (job_id, attempt, node, rank, step, record) VALUES ('junk-plan', 0, 0, 0, 0, ?)",
                       (record,))
    store._execute("INSERT INTO metrics (job_id, attempt, node, rank, step, record) VALUES ('junk-plan', 'x', 0, 0, 0, 5)")
    store._execute("INSERT INTO nodes (job_id, attempt, node, host, state) VALUES ('junk-plan', 0, 0, '[/x]', '[bold]')")
    store._execute("INSERT INTO events (job_id, t, kind, message, data) VALUES ('junk-plan', 'then', 5, NULL, '{bad')")
    store._execute("INSERT INTO samples (job_id, attempt, rank, rss_peak_bytes, gpu_util_sum, gpu_util_samples) "
                   "VALUES ('junk-plan', 0, 3, 'big', 'x', 2), ('junk-plan', 0, 'r', 1, 0, 0)")
    store.close()


def test_status_views_render_any_stored_row(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    _junk_store(home)
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    ids = [job_id for job_id, _ in JUNK_JOBS]
    main(["status"])
    listing = capsys.readouterr().out
    assert all(job_id in listing for job_id in ids)
    assert {j["id"] for j in _strict(_run_json(capsys, ["status", "--json", "--limit", "0"]))} == set(ids)
    for job_id in ids:
        main(["status", job_id])
        assert job_id in capsys.readouterr().out
        _strict(_run_json(capsys, ["status", job_id, "--json"]))
        main(["metrics", job_id])
        _strict(_run_json(capsys, ["metrics", job_id, "--json"]))
        main(["metrics", job_id, "--csv"])
    capsys.readouterr()
    main(["compare", *ids])
    assert "junk-failure" in capsys.readouterr().out
    _strict(_run_json(capsys, ["compare", *ids, "--json"]))
    main(["report", *ids, "--out", str(tmp_path / "r.html")])
    assert "junk-plan" in (tmp_path / "r.html").read_text()


def test_a_rank_claiming_markup_cannot_change_the_job_view(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    _junk_store(home)
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    main(["status", "junk-failure"])
    out = capsys.readouterr().out
    assert "[/x] [bold]markup[/] in a reason" in out, "shown as the text it is"


def _run_json(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    main(argv)
    return capsys.readouterr().out
