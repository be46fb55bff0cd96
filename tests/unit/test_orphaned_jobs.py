"""A job is never left without an end: `launch cancel` acts on proof that a supervisor is gone (not on its
slowness), `status --watch` stops when it is gone, a detached supervisor that cannot start ends its job
FAILED, and a submit that fails before supervising closes its backend. Local processes only."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.errors import LaunchError
from launcher.run import detached, orchestrate
from launcher.run.cancel import cancel, supervisor_gone
from launcher.run.orchestrate import Prepared, stored_spec
from launcher.spec import JobSpec
from launcher.store.db import Store, StoreError
from launcher.store.states import JobState
from launcher.views.watch import watch
from tests.helpers import ROOT
from tests.unit.fakes import FakeBackend, NodeScript

JOB = JobSpec(name="orphan", entrypoint=["python", "t.py"], resources={"nodes": 1, "nproc_per_node": 1})


def _recorded(home: Path, state: JobState = JobState.RUNNING, job: JobSpec = JOB, job_id: str = "orphan-0000aaaa") -> Store:
    cluster = cluster_spec(name="local", backend="local", python=sys.executable, workdir=str(home))
    store = Store(home)
    store.create_job(plan_job(job, cluster, job_id, rdzv_port=29531), stored_spec(job, cluster, run_check=True))
    for step in (JobState.LAUNCHING, JobState.RUNNING)[: [JobState.PENDING, JobState.LAUNCHING, JobState.RUNNING].index(state)]:
        assert store.transition(job_id, step)
    return store


def _supervisor_that_exited(store: Store, job_id: str) -> int:
    """A process that recorded itself as the job's supervisor, then exited (killed, crashed): its PID."""
    done = subprocess.run([sys.executable, "-c", "import os, sys; from pathlib import Path; from launcher.run import identity; "
                           "identity.record(Path(sys.argv[1]), sys.argv[2]); print(os.getpid())",
                           str(store.run_dir(job_id)), job_id], capture_output=True, text=True, check=True, cwd=ROOT)
    return int(done.stdout)


SLOW = ("import signal, sys; from pathlib import Path; from launcher.run import identity; "
        "signal.signal(signal.SIGTERM, lambda *_: print('SIGTERM', flush=True)); "
        "identity.record(Path(sys.argv[1]), sys.argv[3]); print('ready', flush=True); sys.stdin.read()")


def test_cancel_never_calls_a_slow_supervisor_gone(home: Path) -> None:
    store = _recorded(home)
    job_id = "orphan-0000aaaa"
    slow = subprocess.Popen([sys.executable, "-c", SLOW, str(store.run_dir(job_id)), "launcher.run.detached", job_id],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert slow.stdout.readline() == "ready\n"
        with pytest.raises(LaunchError, match="is still ending the job"):
            cancel(store, job_id, wait=0.0)
        assert slow.stdout.readline() == "SIGTERM\n", "the supervisor was asked to cancel"
        assert store.job(job_id).state == "RUNNING", "the job is its supervisor's to end"
        assert supervisor_gone(store, job_id) is None
    finally:
        slow.kill()
        slow.wait()
    assert supervisor_gone(store, job_id) == f"its process {slow.pid} has exited"


STOPPING = ("import signal, sys, time; from pathlib import Path; from launcher.run import identity; "
            "from launcher.store.db import Store; store = Store(Path(sys.argv[1])); job = sys.argv[2]; "
            "identity.record(store.run_dir(job), job); "
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); print('ready', flush=True); "
            "signal.sigwait({signal.SIGTERM}); "  # a TERM sent before it waits is pending, not lost (pause() lost it)
            "[(time.sleep(0.3), store.update_job(job, supervisor_at=time.time())) for node in range(10)]; "
            "store.transition(job, 'CANCELLED', reason='cancelled by user')")


def test_cancel_waits_for_a_supervisor_that_keeps_stopping_nodes(home: Path) -> None:
    """64 hosts take a while to stop: each one stopped moves the supervisor's heartbeat, and cancel waits on."""
    store = _recorded(home)
    job_id = "orphan-0000aaaa"
    stopping = subprocess.Popen([sys.executable, "-c", STOPPING, str(home), job_id, "launcher.run.detached"],
                                stdout=subprocess.PIPE, text=True,
                                cwd=ROOT)
    try:
        assert stopping.stdout.readline() == "ready\n"
        started = time.monotonic()
        row = cancel(store, job_id, wait=2.0)  # 10 nodes stopped 0.3 s apart: 3 s in all, never 2 s without progress
        assert row.state == "CANCELLED" and time.monotonic() - started > 2.0, "waited past `wait`, on progress"
    finally:
        stopping.kill()
        stopping.wait()


def test_cancel_of_a_job_whose_supervisor_died_cleans_up_and_says_why(home: Path) -> None:
    store = _recorded(home)
    pid = _supervisor_that_exited(store, "orphan-0000aaaa")
    row = cancel(store, "orphan-0000aaaa")
    assert row.state == "CANCELLED"
    assert row.reason == f"cancelled by user (supervisor was gone: its process {pid} has exited)"


def test_status_watch_stops_and_says_so_when_the_supervisor_is_dead(home: Path) -> None:
    store = _recorded(home)
    pid = _supervisor_that_exited(store, "orphan-0000aaaa")
    shown = io.StringIO()
    row = watch(store, "orphan-0000aaaa", stream=shown, plain=True,
                supervisor_gone=lambda job_id: supervisor_gone(store, job_id))
    assert row.state == "RUNNING"
    assert (f"job orphan-0000aaaa is RUNNING but its supervisor is gone (its process {pid} has exited)"
            in shown.getvalue())
    assert "`launch cancel orphan-0000aaaa`" in shown.getvalue()


def test_a_detached_supervisor_that_cannot_start_ends_its_job_failed_with_the_reason(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORPHAN_TOKEN", raising=False)
    store = _recorded(home, JobState.PENDING, JOB.model_copy(update={"secrets": ["ORPHAN_TOKEN"]}))
    assert detached.main(["orphan-0000aaaa"]) == 1
    row = store.job("orphan-0000aaaa")
    assert row.state == "FAILED" and row.reason.startswith("the detached supervisor could not start: secrets: ORPHAN_TOKEN")
    assert row.first_failure["kind"] == "internal"


SSH = cluster_spec(name="two", backend="ssh", python="/usr/bin/python3", workdir="/work",
                  network={"interface": "eth0", "ib_hca": None}, nodes=[{"host": "h1", "address": "10.0.0.1", "gpus": 0, "slots": 2}])


def _prepared() -> Prepared:
    return Prepared(JOB, SSH, plan_job(JOB, SSH, "orphan-0000bbbb", rdzv_port=29532))


def test_a_submit_whose_job_cannot_be_recorded_closes_its_backend(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeBackend(SSH, [[NodeScript()]])
    monkeypatch.setattr(orchestrate, "get_backend", lambda cluster: backend)

    def full(self, plan, spec, user=None):
        raise StoreError("the store could not be written: database or disk is full")

    monkeypatch.setattr(Store, "create_job", full)
    with pytest.raises(StoreError):
        orchestrate.submit(_prepared(), detach=False, echo=None)
    assert backend.closed and backend.started == []


def test_a_submit_that_fails_once_the_job_is_recorded_ends_it_failed(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeBackend(SSH, [[NodeScript()]])
    monkeypatch.setattr(orchestrate, "get_backend", lambda cluster: backend)

    def broken_view(job_id: str) -> None:
        raise OSError("the terminal went away")

    with pytest.raises(OSError):
        orchestrate.submit(_prepared(), detach=False, echo=None, on_recorded=broken_view)
    row = Store(home).job("orphan-0000bbbb")
    assert backend.closed and backend.started == []
    assert row.state == "FAILED" and "the terminal went away" in row.reason


KEEPER = ("import sys; from pathlib import Path; from launcher.run import identity; "
          "identity.record_keeper(Path(sys.argv[1]), sys.argv[3]); print('ready', flush=True); sys.stdin.read()")


def test_a_watch_waits_while_a_keeper_can_restart_the_supervisor_and_gives_up_when_none_can(home: Path) -> None:
    from launcher.run.cancel import SupervisorWatch

    store = _recorded(home)
    job_id = "orphan-0000aaaa"
    _supervisor_that_exited(store, job_id)
    said: list[str] = []
    gone = SupervisorWatch(store, said.append)
    assert gone(job_id) is not None and said == []  # no keeper: nothing can come back
    keeper = subprocess.Popen([sys.executable, "-c", KEEPER, str(store.run_dir(job_id)), "launcher.run.detached", job_id],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert keeper.stdout.readline() == "ready\n"
        assert gone(job_id) is None and gone(job_id) is None
        assert len(said) == 1 and said[0].startswith(f"launch: job {job_id}: supervisor restarting, 1 of 3 (its process")
        store.add_event(job_id, "supervisor_restarted", "restart 1")
        store.add_event(job_id, "supervisor_restarted", "restart 2")
        assert gone(job_id) is None and "supervisor restarting, 2 of 3" in said[-1] and len(said) == 2
        store.add_event(job_id, "supervisor_lost", "not restarted again")
        assert gone(job_id) is not None  # the keeper gave up
    finally:
        keeper.stdin.close()
        keeper.wait(timeout=10)
    assert gone(job_id) is not None


def test_a_watch_reads_the_end_of_a_job_whose_supervisor_exited_before_its_keeper(home: Path) -> None:
    """A supervisor that ended its job exits a moment before its keeper does: `status --watch` and `logs --follow`
    then read the job's end, never say 'supervisor restarting' (seen as the first line of a watch's output)."""
    from launcher.run.cancel import SupervisorWatch

    store = _recorded(home)
    job_id = "orphan-0000aaaa"
    _supervisor_that_exited(store, job_id)
    keeper = subprocess.Popen([sys.executable, "-c", KEEPER, str(store.run_dir(job_id)), "launcher.run.detached", job_id],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert keeper.stdout.readline() == "ready\n"
        assert store.transition(job_id, JobState.FAILED, reason="rank 1 failed")
        said: list[str] = []
        assert SupervisorWatch(store, said.append)(job_id) is None and said == []
    finally:
        keeper.stdin.close()
        keeper.wait(timeout=10)
