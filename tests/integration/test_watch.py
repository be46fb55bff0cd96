"""`launch status --watch` on real detached jobs (local backend): it follows them to their end."""

from __future__ import annotations

import re

import pytest

from launcher.views.progress import STAGES
from tests.helpers import probe_job, run_cli


@pytest.mark.slow
def test_watch_follows_a_detached_job_to_success(tmp_path, home):
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2, max_steps=20,
                    env={"PROBE_STEPS": "20", "PROBE_STEP_S": "0.1"})
    submitted = run_cli(home, "submit", str(job), "--detach")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    watched = run_cli(home, "status", job_id[:12], "--watch", timeout=180)
    assert watched.returncode == 0, watched.stderr + watched.stdout[-2000:]
    lines = watched.stdout.splitlines()
    assert any(line.startswith("[start] node 0 (") and line.endswith("): done") for line in lines), lines
    stages = [line for line in lines if re.match(rf"\[({'|'.join(STAGES)})\] ", line)]
    assert len(stages) == len(set(stages)), f"each stage change once on a pipe, not once a poll: {stages}"
    assert {"[0/0] rank 0 of 2 ready, all_reduce=1.0", "[0/1] rank 1 of 2 ready, all_reduce=1.0"} <= set(lines)
    summaries = [line for line in lines if line.startswith("[progress] ")]
    assert summaries and summaries[-1].startswith("[progress] step 20/20  100%  elapsed "), summaries
    assert "samples/s" in summaries[-1] and "ETA" not in summaries[-1]
    assert watched.stderr.splitlines()[0] == f"job {job_id}: SUCCEEDED"


@pytest.mark.slow
def test_watch_of_a_failing_detached_job_exits_1_with_the_reason(tmp_path, home):
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2, max_steps=200,
                    env={"PROBE_FAIL_RANK": "1", "PROBE_FAIL_AT_STEP": "3", "PROBE_STEPS": "200"})
    job_id = run_cli(home, "submit", str(job), "--detach").stdout.strip()
    watched = run_cli(home, "status", job_id, "--watch", timeout=180)
    assert watched.returncode == 1
    assert "[0/1] rank 1 failing on purpose at step 3" in watched.stdout.splitlines()
    err = watched.stderr.splitlines()
    assert err[0] == f"job {job_id}: FAILED" and err[1].startswith("  reason: ") and "rank 1" in err[1]
