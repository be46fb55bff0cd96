"""`notify:` on a real local job: a restart and the end reach a command and a webhook on loopback."""

from __future__ import annotations

import sys

from tests.helpers import probe_job, run_cli, status_json

RECORD = "import os, sys; open(sys.argv[1], 'a').write(os.environ['LAUNCH_JOB_EVENT'] + ' ' + os.environ['LAUNCH_JOB_STATE'] + '\\n')"


def test_a_restart_and_the_end_are_notified_and_a_broken_notifier_fails_nothing(tmp_path, home, hook):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    heard = tmp_path / "heard.txt"
    env = {"PROBE_FAIL_RANK": "1", "PROBE_FAIL_AT_STEP": "2", "PROBE_CKPT": str(ckpt), "PROBE_STEPS": "4"}
    notify = {"commands": [[sys.executable, "-c", RECORD, str(heard)]],
              "webhooks": [hook.url + "/job-events", "http://127.0.0.1:9/nobody-listens"]}
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2, env=env, restarts=1, notify=notify)
    result = run_cli(home, "submit", str(job))
    assert result.returncode == 0, result.stderr + result.stdout
    job_id = result.stderr.split()[1].rstrip(":")

    assert heard.read_text().splitlines() == ["restarted RESTARTING", "succeeded SUCCEEDED"]
    assert [(path, body["event"], body["state"], body["job"]) for path, body in hook.posts] == [
        ("/job-events", "restarted", "RESTARTING", job_id), ("/job-events", "succeeded", "SUCCEEDED", job_id)]
    restarted, succeeded = (body for _, body in hook.posts)
    assert "rank 1" in restarted["reason"] and restarted["replan"] is None and succeeded["attempt"] == 1
    assert succeeded["steps"] == 4 and succeeded["samples_per_sec"] > 0, succeeded  # the end, with its figures
    assert 0 < succeeded["duration_s"] < 300 and succeeded["cancelled_by"] is None

    obj = status_json(home, job_id)
    assert obj["state"] == "SUCCEEDED"
    problems = [event["message"] for event in obj["events"] if event["kind"] == "notify_failed"]
    assert len(problems) == 2 and all(p.startswith("notify webhook http://127.0.0.1:9 could not be reached") for p in problems)
