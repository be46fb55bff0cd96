"""Shared nodes and ordinary faults (issue 39): a full disk on a node or a co-tenant never blinds, kills or borrows
a job. Real processes through the real CLI on this machine's local cluster."""

from __future__ import annotations

import os
import subprocess

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
for i in range(40):
    print(f"after {i}", flush=True)
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
    assert lines == [f"before {i}" for i in range(40)] + [f"after {i}" for i in range(40)], "80 of 80 lines relayed"
    stopped = [event for event in obj["events"] if event["kind"] == "journal_stopped"]
    assert len(stopped) == 1 and "journal cannot be written (No space left on device" in stopped[0]["message"]
    assert log.count("its journal cannot be written") == 1
