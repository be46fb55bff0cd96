"""A multi-line secret printed by a rank is masked line by line in everything launch shows or keeps: its views, its
store and logs, and the node's journal, which `launch attach --cluster` reads back into a store without secrets."""

from __future__ import annotations

import subprocess

from tests.helpers import cli_env, launch_argv, probe_job, run_cli, status_json

PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACBmdWxseS1mYWtlLWtleS1mb3ItdGVzdGluZy1vbmx5LW5vdC1yZWFsAAAA\n"
    "-----END OPENSSH PRIVATE KEY-----"
)


def test_a_pem_secret_printed_by_a_rank_is_masked_line_by_line(tmp_path, home):
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=1, secrets=["DEPLOY_KEY"],
                    env={"PROBE_ENV_KEYS": "DEPLOY_KEY", "PROBE_STEPS": "1", "PROBE_FOLLOWER": "f" * 32}, args=["--echo"])
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    result = subprocess.run(launch_argv("submit", str(job)), env=cli_env(home, DEPLOY_KEY=PEM, XDG_RUNTIME_DIR=str(runtime)),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "echo: DEPLOY_KEY=****" in result.stdout  # the rank did print the key's first line
    job_id = result.stderr.split()[1].rstrip(":")
    shown = run_cli(home, "status", job_id, "--json").stdout + run_cli(home, "logs", job_id).stdout
    kept = (home / "jobs.db").read_bytes().decode("latin-1") + "".join(p.read_text() for p in (home / "runs").rglob("*.log"))
    # issue 39, item 9: it was kept raw. Another store followed the job (the rank said so): its journal outlives it
    journal = (runtime / "launch" / job_id / "node0.journal").read_text()
    kept = [e["message"] for e in status_json(home, job_id)["events"] if e["kind"] == "run_dirs_kept"]
    assert kept == ["run directories kept (`launch clean` removes them; a new job of yours removes those untouched for "
                    "7 days): localhost: 1 other job store(s) that followed the job have not filed it yet (their "
                    "`launch attach` reads it)"], kept
    assert "echo: DEPLOY_KEY=****" in journal
    for line in PEM.splitlines():
        for where, text in (("submit output", result.stdout + result.stderr), ("status and logs", shown), ("store and logs", kept),
                            ("node's journal", journal)):
            assert line not in text, f"{line!r} shows in the {where}"
