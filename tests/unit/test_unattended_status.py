"""What `launch status` says of a job whose supervisor is gone, and (`status JOB`) of what the nodes' agents did."""

from __future__ import annotations

import json

import pytest

from launcher.metrics.summary import JobSummary
from launcher.store.rows import JobRow
from launcher.store.states import JobState, Supervision, SupervisorState
from launcher.views.jobstatus import AgentsLeft, JobStatus, unattended

LOST = Supervision(SupervisorState.LOST)


def _status(supervision: Supervision | None, state: JobState = JobState.RUNNING,
            agents: AgentsLeft | None = None) -> JobStatus:
    return JobStatus(JobRow("bert-1a2b3c4d", "bert", state), JobSummary(), supervision, agents)


@pytest.mark.parametrize(("agents", "clause"), [
    (None, ""),
    (AgentsLeft(ended=(0, 1)),
     "; its agents have ended the job on every node (watch.unattended_timeout: their journals say why)"),
    (AgentsLeft(running=(0, 1, 2)), "; its agents still run the job on every node"),
    (AgentsLeft(running=(0,), ended=(1,), unknown=(2, 3)),
     "; agents ended on node 1, running on node 0, not answering on nodes 2, 3"),
    (AgentsLeft(), ""),
])
def test_a_lost_supervisors_job_says_what_its_nodes_agents_did(agents, clause) -> None:
    said = unattended(_status(LOST, agents=agents))
    assert said == f"RUNNING, unattended since ? (no supervisor){clause}: launch attach bert-1a2b3c4d"


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.PENDING])
def test_a_job_that_never_started_is_cancelled_not_attached(state) -> None:
    """attach refuses a job that is not RUNNING: the hint must name the command that works."""
    said = unattended(_status(LOST, state))
    assert said == f"{state}, unattended since ? (no supervisor): launch cancel bert-1a2b3c4d"


def test_a_supervised_job_says_nothing() -> None:
    assert unattended(_status(Supervision(SupervisorState.ATTACHED, since=0.0))) is None
    assert unattended(_status(None)) is None


def test_the_job_lists_state_column_stays_short_for_an_unattended_job() -> None:
    from io import StringIO

    from rich.console import Console

    from launcher.views.jobstatus import jobs_table

    out = StringIO()
    Console(file=out, width=200).print(jobs_table([_status(LOST, agents=AgentsLeft(running=(0, 1)))]))
    [row] = [line for line in out.getvalue().splitlines() if "bert-1a2b3c4d" in line]
    assert "RUNNING unattended " in row and "launch attach" not in row and len("RUNNING unattended") <= 20


def test_status_tells_when_a_job_ran_hides_check_jobs_and_counts_the_events_left_out(tmp_path, monkeypatch,
                                                                                      capsys) -> None:
    """A finished job: submitted, started, ended and how long it ran; the last 12 events and how many earlier ones
    there are; `launch check`'s own jobs only with --checks."""
    from launcher.backends import cluster_spec, plan_job
    from launcher.cli.main import main
    from launcher.spec import JobSpec
    from launcher.store.db import Store

    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path))
    store = Store()
    for name, job_id in (("train", "train-00000001"), ("launch-check", "launch-check-00000002")):
        job = JobSpec(name=name, entrypoint=["python", "t.py"])
        store.create_job(plan_job(job, cluster_spec(name="local"), job_id, rdzv_port=29500), {})
        for state in (JobState.LAUNCHING, JobState.RUNNING, JobState.SUCCEEDED):
            store.transition(job_id, state)
    store.update_job("train-00000001", created_at=1000.0, started_at=1004.0, ended_at=1004.0 + 2 * 3600 + 3 * 60)
    for n in range(20):
        store.add_event("train-00000001", "note", f"event {n}")
    store.close()

    main(["status", "train"])
    out = capsys.readouterr().out
    assert "started" in out and ", ran 2h03m" in out and "ended" in out
    assert "events: (8 earlier events: --events all)" in out and "event 8\n" in out and "event 7\n" not in out
    main(["status", "train", "--events", "all"])
    assert "event 0\n" in capsys.readouterr().out
    main(["status", "train", "--json"])
    assert json.loads(capsys.readouterr().out)["duration_s"] == 2 * 3600 + 3 * 60
    main(["status"])
    listed = capsys.readouterr().out
    assert "train-00000001" in listed and "launch-check" not in listed
    main(["status", "--checks"])
    assert "launch-check-00000002" in capsys.readouterr().out
