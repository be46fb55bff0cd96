"""What `launch status` says of a job whose supervisor is gone, and (`status JOB`) of what the nodes' agents did."""

from __future__ import annotations

import pytest

from launcher.store.states import JobState
from launcher.views.jobstatus import unattended

JOB = ("bert-1a2b3c4d", JobState.RUNNING)


@pytest.mark.parametrize(("agents", "clause"), [
    (None, ""),
    ({"ended": [0, 1], "running": [], "unknown": []},
     "; its agents have ended the job on every node (watch.unattended_timeout: their journals say why)"),
    ({"ended": [], "running": [0, 1, 2], "unknown": []}, "; its agents still run the job on every node"),
    ({"ended": [1], "running": [0], "unknown": [2, 3]},
     "; agents ended on node 1, running on node 0, not answering on nodes 2, 3"),
    ({"ended": "junk"}, ""),
])
def test_a_lost_supervisors_job_says_what_its_nodes_agents_did(agents, clause) -> None:
    said = unattended(*JOB, {"state": "lost", "since": None, "agents": agents})
    assert said == f"RUNNING, unattended since ? (no supervisor){clause}: launch attach bert-1a2b3c4d"


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.PENDING])
def test_a_job_that_never_started_is_cancelled_not_attached(state) -> None:
    """attach refuses a job that is not RUNNING: the hint must name the command that works."""
    said = unattended("bert-1a2b3c4d", state, {"state": "lost", "since": None})
    assert said == f"{state}, unattended since ? (no supervisor): launch cancel bert-1a2b3c4d"


def test_a_supervised_job_says_nothing() -> None:
    assert unattended(*JOB, {"state": "attached", "since": 0.0}) is None
    assert unattended(*JOB, None) is None
