"""The supervisor and a scheduler (Slurm): QUEUED with the scheduler's reason and job id, LAUNCHING once
allocated, a cancel while queued, and a failure the scheduler decided (the time limit) recorded as such.
A scripted in-memory backend; the real Slurm: tests/integration/test_slurm_backend.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.failures import Failure, FailureKind
from launcher.errors import LaunchError
from launcher.run import supervisor as supervisor_module
from launcher.run.orchestrate import stored_spec
from launcher.run.supervisor import Supervisor
from launcher.spec import JobSpec
from launcher.store.db import Store
from launcher.store.states import JobState
from tests.unit.fakes import FakeBackend, NodeScript, output

CLUSTER = cluster_spec(name="s", backend="slurm", slurm={"partition": "p"}, python="/usr/bin/python3", workdir="/w")
TIME_LIMIT = Failure(kind=FailureKind.TIMEOUT, transient=True,
                     reason="Slurm: job 41 TIMEOUT (Reason=TimeLimit): the time limit (00:01:00) was reached")


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "SETTLE_S", 0.2)
    monkeypatch.setattr(supervisor_module, "REPORT_WAIT_S", 0.5)
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)


class QueueingBackend(FakeBackend):
    """Waits in a scripted queue before starting its nodes; records the job row at each step."""

    def __init__(self, attempts, store: Store, reasons: list[str], cancel_when_queued: bool = False,
                 decided: Failure | None = None) -> None:
        super().__init__(CLUSTER, attempts)
        self.store, self.reasons, self.cancel_when_queued, self.decided = store, reasons, cancel_when_queued, decided
        self.rows: list[tuple[str, str | None, str | None]] = []
        self.supervisor: Supervisor | None = None

    def _row(self, job_id: str) -> None:
        row = self.store.job(job_id)
        self.rows.append((row.state, row.queue_reason, row.scheduler_id))

    def start(self, plan, context):
        context.submitted("41")
        for reason in self.reasons:
            context.queued(reason, "41")
            self._row(plan.job_id)
        if self.cancel_when_queued:
            self.supervisor.request_cancel("cancelled (Ctrl-C)")
        if context.cancelled.is_set():
            raise LaunchError("cancelled before the job started")
        context.allocated("41")
        self._row(plan.job_id)
        plan, nodes = super().start(plan, context)
        if self.decided is not None:
            nodes[0].decided = self.decided
        return plan, nodes


def _run(tmp_path: Path, scripts: list[NodeScript], **options) -> tuple[JobState, dict, QueueingBackend, list[str]]:
    spec = JobSpec(name="queued", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 1})
    plan = plan_job(spec, CLUSTER, "queued-00000001", rdzv_port=29500)
    store = Store(tmp_path / "home")
    store.create_job(plan, stored_spec(spec, CLUSTER, run_check=True))
    backend = QueueingBackend([scripts], store, **options)
    warnings: list[str] = []
    backend.supervisor = Supervisor(store, plan, backend, grace=0.1, warn=warnings.append)
    state = backend.supervisor.run()
    return state, store.job(plan.job_id), backend, warnings


def test_a_queued_job_shows_each_reason_then_launches_and_keeps_the_scheduler_id(tmp_path):
    state, job, backend, warnings = _run(tmp_path, [NodeScript(), NodeScript()], reasons=["Priority", "Resources"])
    assert state == JobState.SUCCEEDED
    assert backend.rows == [("QUEUED", "Priority", "41"), ("QUEUED", "Resources", "41"), ("LAUNCHING", None, "41")]
    assert (job.queue_reason, job.scheduler_id) == (None, "41")
    assert warnings == [f"job {job.id}: queued by the scheduler (its job 41): Priority; Ctrl-C cancels it",
                        f"job {job.id}: queued by the scheduler (its job 41): Resources; Ctrl-C cancels it"]


def test_a_job_cancelled_while_queued_ends_cancelled(tmp_path):
    state, job, backend, _ = _run(tmp_path, [NodeScript(), NodeScript()], reasons=["Resources"],
                                  cancel_when_queued=True)
    assert state == JobState.CANCELLED and job.reason == "cancelled (Ctrl-C)"
    assert backend.started == [] and job.first_failure is None


def test_a_failure_the_scheduler_decided_is_the_first_failure_with_its_words(tmp_path):
    scripts = [NodeScript([output("step 9")], code=-15), NodeScript(code=None)]
    state, job, _, _ = _run(tmp_path, scripts, reasons=[], decided=TIME_LIMIT)
    failure = job.first_failure
    assert state == JobState.FAILED
    assert (failure["kind"], failure["node"], failure["exit_code"], failure["signal"]) == ("timeout", 0, -15, "SIGTERM")
    assert failure["reason"] == TIME_LIMIT.reason and failure["transient"] is True
    assert failure["last_lines"] == ["[0] step 9"]
