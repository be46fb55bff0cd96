"""`launch status --watch`: stages, log lines and progress of a job run elsewhere, read from the store."""

from __future__ import annotations

import subprocess

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.metrics.record import MetricRecord
from launcher.run.detached import stage_recorder
from launcher.spec import JobSpec
from launcher.store.db import CANCELLED, FAILED, LAUNCHING, RUNNING, SUCCEEDED, Store
from launcher.store.records import Batch
from launcher.store.rows import JobRow, NodeRow
from launcher.store.states import JobState, NodeState
from launcher.views.watch import StageUpdate, job_stages
from tests.helpers import ROOT, cli_env, launch_argv, run_cli
from tests.terminal import run_in_terminal

T0 = 1764547200.0


def running_job(home, job_id: str = "w-000001", lines: int = 15) -> Store:
    """A RUNNING job on two nodes: node 0 wrote ``lines`` lines, two ranks reported step 30 of 60."""
    store = Store(home)
    job = JobSpec(name="w", entrypoint=["python", "t.py"], batch={"micro_batch": 2}, max_steps=60,
                  resources={"nodes": 1, "nproc_per_node": 2})
    store.create_job(plan_job(job, cluster_spec(name="local", local={"slots": 4}), job_id, rdzv_port=29500), {})
    assert store.transition(job_id, LAUNCHING)
    for node in (0, 1):
        path = store.run_dir(job_id) / f"attempt0-node{node}.log"
        text = "".join(f"{T0 + i:.3f} [0/{i % 2}] line {i}\n" for i in range(lines)) if node == 0 else ""
        path.write_text(text)
        store.set_node(job_id, 0, node, host=f"h{node}", state="RUNNING", log_path=str(path))
    assert store.transition(job_id, RUNNING)
    store.add_batch(job_id, 0, Batch(records=[
        MetricRecord(rank=0, node=0, step=30, samples_per_sec=80.0, step_time_s=0.1, mem_peak_bytes=2**30),
        MetricRecord(rank=1, node=0, step=30, samples_per_sec=40.0, step_time_s=0.2, mem_peak_bytes=2**30),
    ]))
    return store


def test_stages_from_events_queue_and_node_rows():
    events = [{"kind": "launching", "data": None},
              {"kind": "stage", "data": {"stage": "sync", "node": 1, "host": "h1", "state": "done", "detail": ""}},
              {"kind": "stage", "data": {"stage": "bogus", "node": 1, "host": "h1", "state": "done"}},
              {"kind": "stage", "data": "not a mapping"}]
    nodes = [NodeRow("j", 0, 0, host="h0", state=NodeState.STARTING), NodeRow("j", 0, 1, host="h1", state=NodeState.RUNNING)]
    assert job_stages(JobRow("j", "j", JobState.LAUNCHING), nodes, events) == [
        StageUpdate("sync", 1, "h1", "done"), StageUpdate("start", 0, "h0", "running"), StageUpdate("start", 1, "h1", "done")]
    assert job_stages(JobRow("j", "j", JobState.FAILED, reason="node 0: could not start"), nodes[:1], [])[0] == \
        StageUpdate("start", 0, "h0", "failed", "node 0: could not start")
    assert job_stages(JobRow("j", "j", JobState.QUEUED, reason="Priority"), [], []) == [StageUpdate("queued", None, "", "running", "Priority")]
    start_events = [{"kind": "stage", "data": {"stage": "start", "node": 0, "host": "h0", "state": "running"}}]
    assert job_stages(JobRow("j", "j", JobState.RUNNING), nodes, start_events) == [StageUpdate("start", 0, "h0", "running")], \
        "recorded start events are more precise than the node rows"


def test_watch_follows_a_running_job_until_it_fails(home):
    store = running_job(home)
    proc = subprocess.Popen(launch_argv("status", "--watch", "w-000001"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(home), cwd=ROOT)
    shown = [proc.stdout.readline() for _ in range(12)]
    assert shown[:2] == ["[start] node 0 (h0): done\n", "[start] node 1 (h1): done\n"]
    assert shown[2:] == [f"[0/{i % 2}] line {i}\n" for i in range(5, 15)], "then the last ten lines"
    log = store.run_dir("w-000001") / "attempt0-node1.log"
    log.write_text(f"{T0 + 99:.3f} [0/1] a new line\n")
    stage_recorder(store, "w-000001")("setup", 1, "h1", "failed", "pip: no space left")
    assert store.transition("w-000001", FAILED, reason="node 1 (h1): setup failed")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    lines = out.splitlines()
    assert "[0/1] a new line" in lines
    assert "[setup] node 1 (h1): failed: pip: no space left" in lines
    assert any(line.startswith("[progress] step 30/60  50%") and "120 samples/s" in line for line in lines), lines
    assert "\x1b" not in out
    assert err.splitlines() == ["job w-000001: FAILED", "  reason: node 1 (h1): setup failed"]


@pytest.mark.parametrize(("state", "code"), [(SUCCEEDED, 0), (FAILED, 1), (CANCELLED, 130)])
def test_watch_of_an_ended_job_exits_with_its_state(home, state, code):
    store = running_job(home)
    assert store.transition("w-000001", state)
    result = run_cli(home, "status", "w", "--watch", timeout=30)
    assert result.returncode == code, result.stderr
    assert result.stdout.splitlines()[2:12] == [f"[0/{i % 2}] line {i}" for i in range(5, 15)]
    assert result.stderr.splitlines()[0] == f"job w-000001: {state}"


def test_watch_needs_one_job(home):
    running_job(home)
    for args in (["status", "--watch"], ["status", "w", "--watch", "--json"]):
        result = run_cli(home, *args)
        assert result.returncode == 2 and "--watch follows one job" in result.stderr and "Traceback" not in result.stderr
    result = run_cli(home, "status", "nosuchjob", "--watch")
    assert result.returncode == 4 and "no job 'nosuchjob'" in result.stderr


def test_watch_on_a_terminal_shows_the_bar(home):
    store = running_job(home)
    assert store.transition("w-000001", SUCCEEDED)
    ended_at = store.job("w-000001").ended_at
    store.update_job("w-000001", started_at=ended_at - 125)
    run = run_in_terminal(launch_argv("status", "--watch", "--last"), cli_env(home), cols=100, rows=40)
    assert run.returncode == 0
    lines = [line for line in run.screen if line]
    assert lines[0] == "start      node 0 (h0) done  node 1 (h1) done"
    assert lines[1:11] == [f"[0/{i % 2}] line {i}" for i in range(5, 15)]
    assert lines[11].startswith("step 30/60 ") and lines[11].endswith(" 50%  elapsed 0:02:05"), "ended: no ETA"
    assert lines[12] == "120 samples/s  slowest rank 1 (200 ms/step)  peak mem 1.0 GiB"
    assert lines[13] == "job w-000001: SUCCEEDED"
