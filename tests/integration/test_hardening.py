"""Hostile rank output, a stranger's process in a stale record, another user's directory, a host that is
not SSH: through the real CLI and real processes, nothing wedges a job, leaks or hits the wrong process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.node import proctree
from launcher.run.orchestrate import stored_spec
from launcher.spec import JobSpec
from launcher.store.db import Store
from tests.helpers import ROOT, cli_env, run_cli, status_json, write_yaml

pytestmark = pytest.mark.slow
PROGRAMS = ROOT / "tests" / "programs"


def test_hostile_rank_output_neither_wedges_the_job_nor_breaks_the_views(tmp_path, home):
    job = write_yaml(tmp_path / "job.yaml", {"name": "hostile", "entrypoint": ["python", str(PROGRAMS / "hostile.py")],
                                              "resources": {"nodes": 1, "nproc_per_node": 2}})
    result = run_cli(home, "submit", str(job), timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    job_id = result.stderr.split()[1].rstrip(":")
    assert "metric record dropped" in result.stderr

    for args in (["status"], ["status", "--json"], ["status", job_id], ["metrics", job_id], ["metrics", job_id, "--json"],
                 ["compare", job_id], ["report", job_id, "--out", str(tmp_path / "r.html")]):
        shown = run_cli(home, *args)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, (args, shown.stderr[-1000:])
    obj = json.loads(run_cli(home, "status", job_id, "--json").stdout,
                     parse_constant=lambda name: pytest.fail(f"status --json printed {name}"))
    assert obj["state"] == "SUCCEEDED" and "forged" not in json.dumps(obj["reason"])
    ranks = obj["metrics"]["per_rank"]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and {r["node"] for r in ranks} == {0}
    assert {r["host"] for r in ranks} == {"localhost"}, "node and host come from the channel, not the record"
    log = Path(obj["nodes"][0]["log_path"]).read_text()
    assert "line cut at 65536 bytes" in log and max(len(line) for line in log.splitlines()) < 70_000
    assert (home / "jobs.db").stat().st_size < 2 * 2**20, "a 10 MB line does not reach the store"


def test_cancel_never_signals_a_process_that_took_over_the_supervisors_pid(tmp_path, home):
    spec = JobSpec(name="stale", entrypoint=["python", "t.py"], resources={"nodes": 1, "nproc_per_node": 1})
    cluster = cluster_spec(name="local", backend="local", python=sys.executable, workdir=str(tmp_path))
    plan = plan_job(spec, cluster, "stale-0000aaaa", rdzv_port=29511)
    store = Store(home)
    store.create_job(plan, stored_spec(spec, cluster, run_check=True))
    store.transition(plan.job_id, "LAUNCHING")
    store.transition(plan.job_id, "RUNNING")
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "my-launchpad-helper", "launch",
                              "submit", plan.job_id])
    try:
        identity = {"pid": decoy.pid, "start_ticks": proctree.start_ticks(decoy.pid) - 100,
                    "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(), "job_id": plan.job_id}
        (store.run_dir(plan.job_id) / "supervisor.json").write_text(json.dumps(identity))
        store.update_job(plan.job_id, supervisor_pid=decoy.pid)
        result = run_cli(home, "cancel", plan.job_id)
        assert result.returncode == 0, result.stderr
        assert decoy.poll() is None, "the decoy that reused the supervisor's PID was signalled"
        assert status_json(home, plan.job_id)["state"] == "CANCELLED"
    finally:
        decoy.kill()
        decoy.wait()
    refused = run_cli(home, "cancel", "")
    assert refused.returncode == 4 and "no job id given" in refused.stderr


def test_a_run_directory_made_by_another_user_stops_the_launch_with_nothing_started(tmp_path, home):
    """Issue 39, item 6: a run root another user made first once failed the job at start with `launch check` silent;
    preflight now names the directory and its owner (exit 3), and so does `launch check`. Only root can do this to
    ``$XDG_RUNTIME_DIR/launch`` (the runtime directory is the user's, closed): the /tmp root is one no one can make
    first (tests/integration/test_leases.py, with a second user)."""
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    theirs = runtime / "launch"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 12345, 12345)
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    job = write_yaml(tmp_path / "job.yaml", {"name": "dir", "entrypoint": ["python", str(script)],
                                              "resources": {"nodes": 1, "nproc_per_node": 1}})
    env = cli_env(home, XDG_RUNTIME_DIR=str(runtime))
    result = run_cli(home, "submit", str(job), env=env)
    assert result.returncode == 3, result.stderr
    said = f"{theirs} belongs to uid 12345, not to this user (root (uid 0)): refusing to use it"
    assert said in result.stderr and "another user may have created it first" in result.stderr
    assert "ran" not in result.stdout
    checked = run_cli(home, "check", "--no-bandwidth", env=env, timeout=120)
    assert checked.returncode == 3 and said in checked.stdout + checked.stderr, checked.stdout + checked.stderr


def test_a_host_that_does_not_speak_ssh_gets_launchs_one_line_not_paramikos_traceback(tmp_path, home):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def answer() -> None:
        for _ in range(4):
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    cluster = write_yaml(tmp_path / "cluster.yaml", {
        "name": "web", "backend": "ssh", "ssh": {"known_hosts": str(tmp_path / "known"), "connect_timeout": 5},
        "nodes": [{"host": "127.0.0.1", "port": port}], "python": sys.executable, "workdir": str(tmp_path)})
    result = run_cli(home, "check", "--cluster", str(cluster), "--no-bandwidth", timeout=60)  # a hang: timeout
    server.close()
    assert result.returncode == 3
    assert "Traceback" not in result.stderr + result.stdout
    assert "127.0.0.1" in result.stdout + result.stderr
