"""What `launch status` says of a job whose supervisor is gone, and (`status JOB`) of what the nodes' agents did."""

from __future__ import annotations

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
