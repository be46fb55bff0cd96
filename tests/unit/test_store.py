"""The job store: legal transitions only, prefix lookup, private files."""

from __future__ import annotations

import dataclasses
import stat

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.errors import JobNotFound
from launcher.metrics.record import MetricRecord
from launcher.spec import JobSpec
from launcher.store.db import CANCELLED, FAILED, LAUNCHING, PENDING, RUNNING, SUCCEEDED, Store
from launcher.store.records import Batch


def _plan(job_id: str):
    job = JobSpec(name="s", entrypoint=["python", "t.py"], batch={"micro_batch": 2})
    return plan_job(job, cluster_spec(name="local"), job_id, rdzv_port=29500)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "home")
    yield s
    s.close()


def test_states_move_only_along_legal_transitions(store):
    store.create_job(_plan("s-000001"), {})
    assert store.job("s-000001").state == PENDING
    assert not store.transition("s-000001", RUNNING), "PENDING -> RUNNING skips LAUNCHING"
    assert not store.transition("s-000001", SUCCEEDED)
    assert store.transition("s-000001", LAUNCHING)
    assert store.transition("s-000001", RUNNING)
    assert store.transition("s-000001", SUCCEEDED)
    assert store.job("s-000001").ended_at is not None
    for state in (RUNNING, FAILED, CANCELLED, LAUNCHING):
        assert not store.transition("s-000001", state), f"a finished job cannot become {state}"
    assert store.job("s-000001").state == SUCCEEDED


def test_a_restart_keeps_the_jobs_start_so_its_wall_time_spans_every_attempt(store):
    store.create_job(_plan("s-000003"), {})
    assert store.transition("s-000003", LAUNCHING) and store.transition("s-000003", RUNNING)
    first = store.job("s-000003").started_at
    assert store.transition("s-000003", LAUNCHING, attempt=1) and store.transition("s-000003", RUNNING)
    assert store.job("s-000003").started_at == first


def test_jobs_are_found_by_unique_prefix(store):
    store.create_job(_plan("s-aaa111"), {})
    store.create_job(_plan("s-aab222"), {})
    assert store.job("s-aaa").id == "s-aaa111"
    with pytest.raises(JobNotFound, match="matches several jobs"):
        store.job("s-aa")
    with pytest.raises(JobNotFound, match="no job 'zzz'"):
        store.job("zzz")
    with pytest.raises(JobNotFound):
        store.job("s-a%")


def test_metrics_and_events_round_trip(store):
    store.create_job(_plan("s-000002"), {})
    record = MetricRecord(job="claimed", rank=1, node=0, host="h0", step=10, samples=8, extra={"busbw": 1.5})
    store.add_batch("s-000002", 1, Batch(records=[record]))
    store.add_event("s-000002", "note", "hello", {"k": 1})
    assert store.metrics("s-000002") == [dataclasses.replace(record, job="s-000002", attempt=1)]
    assert store.events("s-000002")[0]["data"] == {"k": 1}


def test_store_files_are_private(store):
    assert stat.S_IMODE(store.home.stat().st_mode) == 0o700
    assert stat.S_IMODE((store.home / "jobs.db").stat().st_mode) == 0o600
    assert stat.S_IMODE(store.run_dir("x").stat().st_mode) == 0o700


FIRST_USE = """
import sys
from pathlib import Path
from launcher.store.db import Store
store = Store(Path(sys.argv[1]))
store.add_event("first-use", "k", "m")
"""


def test_two_commands_using_a_new_store_at_the_same_moment_both_work(tmp_path):
    """Two `launch` commands' first use of one LAUNCH_HOME at once: SQLite refused the second's switch of the new
    file to WAL at once, "database is locked", in about 1 pair in 10 (5 failures in 60 pairs before the fix)."""
    import subprocess
    import sys

    failures = []
    for round_ in range(20):
        home = tmp_path / f"home{round_}"
        pair = [subprocess.Popen([sys.executable, "-c", FIRST_USE, str(home)], stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
        failures += [err for proc in pair for err in [proc.communicate(timeout=60)[1]] if proc.returncode]
    assert not failures, failures[0][-600:]
    assert [len(Store(tmp_path / f"home{round_}").events("first-use")) for round_ in range(20)] == [2] * 20
