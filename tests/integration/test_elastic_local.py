"""An elastic job on the local backend (issue 22): one node's processes killed, the job goes on with fewer.

Three local nodes of one CPU rank each train the ConvNet recipe at global batch 12 = micro 2 x GA 2 x 3;
node 2's agent is killed once attempt 0 has reported a step past the first checkpoint. The job must end
SUCCEEDED on two nodes at GA 3 with max_steps x 12 samples by the recipe's own count.
"""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from launcher.node import rundir
from launcher.store.db import Store
from launcher.views.report import PALETTE
from tests.helpers import ROOT, all_held, cli_env, hold_env, launch_argv, status_json, wait_for, write_yaml
from tests.integration.test_report_browser import CHROMIUM, _hex, png_rows

pytestmark = pytest.mark.slow

LOCAL4 = Path(__file__).resolve().parent.parent / "clusters" / "local4.yaml"
STEPS = 12


def test_a_killed_local_node_ends_succeeded_on_two_with_the_global_batch_exact(tmp_path: Path, home: Path,
                                                                               hook) -> None:
    job = write_yaml(tmp_path / "job.yaml", {
        "name": "elastic-local", "recipe": "convnet", "max_steps": STEPS, "metrics": {"every": 1},
        "batch": {"global_batch": 12, "micro_batch": 2}, "resources": {"nodes": 3, "nproc_per_node": 1},
        "restarts": 1, "elastic": {"min_nodes": 2}, "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": 3},
        "watch": {"grace_period": 2}, "env": hold_env(tmp_path / "held", 4),  # attempt 0's ranks wait after step 4
        "notify": {"on": ["restarted", "succeeded"], "webhooks": [hook.url]},
    })
    submit = subprocess.Popen(launch_argv("submit", str(job), "--cluster", str(LOCAL4)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=cli_env(home), cwd=ROOT)
    try:
        store = Store(home)

        def past_first_checkpoint():
            jobs = store.jobs(limit=1)
            return jobs[0].id if jobs and all_held(tmp_path / "held", 3) else None

        job_id = wait_for(past_first_checkpoint, timeout=120)
        assert job_id, "attempt 0's ranks never reached step 4"
        pid_file = Path(rundir.run_root()) / job_id / "node2.pid"
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        _, err = submit.communicate(timeout=240)
    finally:
        if submit.poll() is None:
            submit.send_signal(signal.SIGTERM)
            submit.communicate(timeout=60)
    assert submit.returncode == 0, err[-4000:]
    status = status_json(home, job_id)
    assert (status["state"], status["attempt"], status["world_size"], status["grad_accum"]) == ("SUCCEEDED", 1, 2, 3)
    shrunk = [e["message"] for e in status["events"] if e["kind"] == "elastic_restart"]
    assert len(shrunk) == 1 and shrunk[0].startswith("attempt 1: 2 nodes (") and shrunk[0].endswith(
        "grad_accum 2 -> 3, global batch 12 kept")
    restarted, succeeded = (body for _, body in hook.posts)  # the pager hears the truth: it goes on, re-planned
    assert (restarted["event"], restarted["state"], restarted["replan"]) == ("restarted", "RESTARTING", shrunk[0])
    assert succeeded["state"] == "SUCCEEDED" and succeeded["steps"] == STEPS and succeeded["attempt"] == 1
    first_try, second_try = status["attempts"]  # every attempt: its nodes, why it ended, what the next one changed
    assert len(first_try["hosts"]) == 3 and len(second_try["hosts"]) == 2 and first_try["next"] == shrunk[0]
    assert "node 2" in first_try["ended"] and second_try["ended"] in ("SUCCEEDED", status["reason"]), status["attempts"]
    shown = subprocess.run(launch_argv("status", job_id), capture_output=True, text=True, env=cli_env(home), cwd=ROOT)
    assert f"  elastic: {shrunk[0]}" in shown.stdout.splitlines()  # in the header, however many events follow
    assert any(line.startswith("  attempt 0: ") and line.endswith(f"; next {shrunk[0]}") for line in shown.stdout.splitlines())
    final = max((r for r in Store(home).metrics(job_id) if r.attempt == 1), key=lambda r: r.step)
    assert final.step == STEPS and final.extra["samples_consumed"] == STEPS * 12

    # the whole run's story in `launch metrics`: both attempts, where the second resumed, what was redone
    told = subprocess.run(launch_argv("metrics", job_id, "--json"), capture_output=True, text=True, env=cli_env(home),
                          cwd=ROOT)
    metrics = json.loads(told.stdout)
    first, second = metrics["attempts"]
    assert (first["attempt"], first["ranks"], second["attempt"], second["ranks"]) == (0, 3, 1, 2), metrics["attempts"]
    assert second["resumed_at_step"] == 3 and second["last_step"] == STEPS and first["last_step"] >= 4
    run = metrics["run"]
    assert (run["attempts"], run["last_step"], run["samples_consumed"]) == (2, STEPS, STEPS * 12), run
    assert run["steps_redone"] == first["last_step"] - 3 and run["lost_s"] > 0 and 0 < run["goodput"] < 1, run
    text = subprocess.run(launch_argv("metrics", job_id), capture_output=True, text=True, env=cli_env(home), cwd=ROOT)
    assert f"run         2 attempt(s), to step {STEPS}, {STEPS * 12} samples consumed" in text.stdout, text.stdout

    # its report tells both attempts, the node lost and the goodput, as a browser shows it
    page_path = tmp_path / "report.html"
    made = subprocess.run(launch_argv("report", job_id, "--out", str(page_path)), capture_output=True, text=True,
                          env=cli_env(home), cwd=ROOT)
    assert made.returncode == 0, made.stderr
    page = page_path.read_text()
    assert "No failures or stragglers" not in page and "<h2>Attempts</h2>" in page and "Goodput: " in page
    assert html.escape(shrunk[0]) in page and f"{job_id} (ddp), attempt 1 (restarted)" in page
    assert html.escape("attempt 0 failed (") in page

    # the same checkpoint.dir again: a new job would continue this run, so it says so and needs checkpoint.resume
    held = f"{tmp_path / 'ckpt'} holds the checkpoint of job {job_id} after step {STEPS}"
    again = subprocess.run(launch_argv("submit", str(job), "--cluster", str(LOCAL4)), capture_output=True, text=True,
                           env=cli_env(home), cwd=ROOT)
    assert again.returncode == 2 and f"{held}: job elastic-local-" in again.stderr, again.stderr
    assert "set checkpoint.resume: true to continue it (--set checkpoint.resume=true)" in again.stderr
    dry = subprocess.run(launch_argv("submit", str(job), "--cluster", str(LOCAL4), "--dry-run", "--set",
                                     "checkpoint.resume=true"), capture_output=True, text=True, env=cli_env(home), cwd=ROOT)
    assert f"  checkpoint  {held}: this job resumes from step {STEPS}" in dry.stdout.splitlines(), dry.stdout
    assert " --resume" in dry.stdout

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium): the report was checked as HTML only")
    shot = tmp_path / "report.png"  # kept with the test's files
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
                    "--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp_path / 'c'}",
                    f"--screenshot={shot}", "--window-size=1200,1800", page_path.as_uri()],
                   capture_output=True, timeout=90, check=True)
    width, _, bpp, rows = png_rows(shot)
    colors = {row[x:x + 3] for row in rows[::2] for x in range(0, width * bpp, bpp * 2)}
    assert bytes(_hex(PALETTE[1])) in colors, "the second attempt's curve is not drawn"
