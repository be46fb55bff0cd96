"""Shared nodes and ordinary faults (issue 39): a full disk on a node or a co-tenant never blinds, kills or borrows
a job. Real processes through the real CLI on this machine's local cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.helpers import cli_env, run_cli, status_json, write_yaml

pytestmark = pytest.mark.slow

# Prints 40 lines, fills the file system of its argument (the node's run root), prints 40 more, then lives on
# for a few samples.
FILLS_THE_DISK = """import sys, time
for i in range(40):
    print(f"before {i}", flush=True)
try:
    with open(sys.argv[1], "wb") as f:
        while True:
            f.write(b"x" * 65536)
except OSError as exc:
    print("filled:", exc.strerror, flush=True)
for i in range(40):  # 8 KiB: more than the page the journal's last write may have left free
    print(f"after {i} " + "y" * 200, flush=True)
time.sleep(2)
"""


@pytest.fixture
def tiny_run_root(tmp_path):
    """A 1 MiB tmpfs as the node's run root (XDG_RUNTIME_DIR): a disk the job itself can fill."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(runtime)], check=True)
    yield runtime
    subprocess.run(["umount", "-l", str(runtime)], check=False)


def test_a_full_disk_under_the_nodes_run_directory_loses_no_line_and_says_so_once(tmp_path, home, tiny_run_root):
    program = tmp_path / "fill.py"
    program.write_text(FILLS_THE_DISK)
    job = write_yaml(tmp_path / "job.yaml", {"name": "enospc", "resources": {"nodes": 1, "nproc_per_node": 1},
                                              "entrypoint": ["python", str(program), str(tiny_run_root / "filler")]})
    result = run_cli(home, "submit", str(job), env=cli_env(home, XDG_RUNTIME_DIR=str(tiny_run_root)), timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    job_id = result.stderr.split()[1].rstrip(":")
    obj = status_json(home, job_id)
    assert obj["state"] == "SUCCEEDED"
    log = "".join(path.read_text() for path in (home / "runs" / job_id).glob("attempt*-node*.log"))
    lines = [line.split("] ", 1)[1] for line in log.splitlines() if "] before " in line or "] after " in line]
    assert lines == [f"before {i}" for i in range(40)] + [f"after {i} " + "y" * 200 for i in range(40)], \
        "80 of 80 lines relayed"
    stopped = [event for event in obj["events"] if event["kind"] == "journal_stopped"]
    assert len(stopped) == 1 and "journal cannot be written (No space left on device" in stopped[0]["message"]
    assert log.count("its journal cannot be written") == 1


# A rank that writes where LAUNCH_RUN_DIR points, files named as the agent's: a generation record and an @exit.
WRITES_THE_RUN_DIR = """import json, os, time
folder = os.environ["LAUNCH_RUN_DIR"]
with open(os.path.join(folder, "node0.generation"), "w") as f:
    json.dump({"generation": 9, "pid": 1, "host": "rank", "since": time.time()}, f)
with open(os.path.join(folder, "node0.journal"), "a") as f:
    f.write('@exit 1.0 1.0 {"code": 0}\\n')
print("wrote into", folder, flush=True)
agents = os.path.dirname(folder)  # the agent's own files, beside the ranks' directory
print("agent's generation record:", os.path.exists(os.path.join(agents, "node0.generation")), flush=True)
with open(os.path.join(agents, "node0.journal")) as f:
    print("agent's journal exits:", f.read().count("@exit"), flush=True)
time.sleep(2.5)
print("still supervised", flush=True)
"""


def test_a_rank_writing_its_launch_run_dir_touches_none_of_the_agents_files(tmp_path, home):
    program = tmp_path / "writer.py"
    program.write_text(WRITES_THE_RUN_DIR)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    job = write_yaml(tmp_path / "job.yaml", {"name": "rundir", "resources": {"nodes": 1, "nproc_per_node": 1},
                                              "entrypoint": ["python", str(program)]})
    result = run_cli(home, "submit", str(job), env=cli_env(home, XDG_RUNTIME_DIR=str(runtime)), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "still supervised" in result.stdout and "newer supervisor" not in result.stdout + result.stderr
    job_id = result.stderr.split()[1].rstrip(":")
    assert status_json(home, job_id)["state"] == "SUCCEEDED"
    run_dir = runtime / "launch" / job_id
    assert f"wrote into {run_dir / 'ranks'}" in result.stdout
    assert "agent's generation record: False" in result.stdout and "agent's journal exits: 0" in result.stdout
    assert not run_dir.exists(), "its supervisor filed the job: the run directory went"


def test_run_directories_go_once_filed_and_launch_clean_or_the_retention_removes_the_rest(tmp_path, home):
    """Issue 39, item 10: node run directories were never removed (91 of them, two 256 MiB journals in an hour).
    A job's goes once its supervisor filed it; one never collected (its store never came back) stays for `launch
    clean`, or a week."""
    from launcher.node import proctree

    runtime = tmp_path / "runtime"
    (runtime / "launch").mkdir(parents=True, mode=0o700)
    os.chmod(runtime, 0o700)
    left = runtime / "launch" / "left-00000000"  # a job whose store never filed it: kept for its `launch attach`
    left.mkdir(mode=0o700)
    (left / "node0.journal").write_text("|1.0 1.0 left\n")
    old = runtime / "launch" / "old-00000000"  # a week and a day untouched, no agent: the retention removes it
    old.mkdir(mode=0o700)
    (old / "node0.journal").write_text("|1.0 1.0 old\n")
    for path in (old / "node0.journal", old):
        os.utime(path, (time.time() - 8 * 86400,) * 2)
    busy = runtime / "launch" / "busy-00000000"  # an agent still runs in it: never removed
    busy.mkdir(mode=0o700)
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (busy / "node0.pid").write_text(f"{agent.pid} {proctree.start_ticks(agent.pid)}\n")
        env = cli_env(home, XDG_RUNTIME_DIR=str(runtime))
        program = tmp_path / "hello.py"
        program.write_text("print('hello')\n")
        job = write_yaml(tmp_path / "job.yaml", {"name": "clean", "resources": {"nodes": 1, "nproc_per_node": 1},
                                                  "entrypoint": ["python", str(program)]})
        result = run_cli(home, "submit", str(job), env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        job_id = result.stderr.split()[1].rstrip(":")
        assert not old.exists(), "the new agent removed a run directory untouched for 8 days"
        assert not (runtime / "launch" / job_id).exists(), "its supervisor filed the job: the run directory went"
        assert "run_dirs_kept" not in [event["kind"] for event in status_json(home, job_id)["events"]]
        listed = run_cli(home, "clean", "--dry-run", env=env)
        assert listed.returncode == 0 and "would remove 1 run directory (left-00000000)" in listed.stdout, listed.stdout
        assert "kept busy-00000000: an agent of the job still runs (node0.pid)" in listed.stdout
        recent = run_cli(home, "clean", "--older-than", "1d", env=env)
        assert "removed 0 run directories" in recent.stdout and "kept left-00000000: changed" in recent.stdout
        assert left.exists()
        cleaned = run_cli(home, "clean", env=env)
        assert cleaned.returncode == 0 and "removed 1 run directory (left-00000000)" in cleaned.stdout, cleaned.stdout
        assert not left.exists() and busy.exists()
    finally:
        agent.kill()
        agent.wait()
