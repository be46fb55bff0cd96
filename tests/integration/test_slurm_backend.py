"""The slurm backend end to end: the real CLI, the real Slurm of the `slurm` fixture (2 nodes x 1 CPU, one
partition), real torchrun with gloo. Each job is small: one rank per node, a few short steps."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.store import Store
from tests.slurm_fixture import JOB_END_STATES, job_state, slurmd_killed, steps, wait_for, wait_for_state
from tests.testbed_fixture import needs_root
from tools import slurm as sl
from tools import testbed as tb

pytestmark = [needs_root, pytest.mark.testbed]

PYTHON = sys.executable
LAUNCH = str(Path(sys.executable).with_name("launch"))
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"

TRAIN = '''
import json, os, socket, sys, time
import torch
import torch.distributed as dist
from launcher.metrics import Reporter

if socket.gethostname() == os.environ.get("TEST_FAIL_ON_HOST"):
    sys.exit("this host is broken")
dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print("RESULT " + json.dumps({"rank": rank, "host": socket.gethostname(), "sum": total.item(),
                              "slurm_job": os.environ.get("SLURM_JOB_ID")}), flush=True)
reporter = Reporter(every=1, warmup=0)
for _ in range(int(os.environ.get("TEST_STEPS", "3"))):
    time.sleep(float(os.environ.get("TEST_STEP_S", "0.05")))
    reporter.step(samples=2)
reporter.close()
dist.barrier()
dist.destroy_process_group()
'''


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm: sl.SlurmCluster) -> Path:
    """A private LAUNCH_HOME, and SLURM_CONF for the CLI runs of one test."""
    path = tmp_path / "home"
    monkeypatch.setenv("LAUNCH_HOME", str(path))
    for key, value in slurm.env.items():
        monkeypatch.setenv(key, value)
    return path


def _cluster(tmp_path: Path, slurm: sl.SlurmCluster, **slurm_keys) -> Path:
    spec = {"name": "slurm-test", "backend": "slurm", "slurm": {"partition": slurm.partition, **slurm_keys},
            "python": PYTHON, "workdir": str(tmp_path)}
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(spec))
    return path


def _job(tmp_path: Path, *, steps: int = 3, step_s: float = 0.05, env: dict | None = None, name: str = "slurm-test",
         entrypoint: list[str] | None = None, **extra) -> Path:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    spec = {
        "name": name, "entrypoint": entrypoint or [PYTHON, str(script)],
        "resources": {"nodes": 2, "nproc_per_node": 1}, "max_steps": steps, "metrics": {"every": 1},
        "watch": {"grace_period": 2}, "env": {"TEST_STEPS": str(steps), "TEST_STEP_S": str(step_s), **(env or {})},
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(spec))
    return path


def _launch(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([LAUNCH, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def _submit_detached(job: Path, cluster: Path) -> str:
    done = _launch("submit", str(job), "--cluster", str(cluster), "--detach")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _status(job_id: str) -> dict:
    done = _launch("status", job_id, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _results(home: Path, job_id: str) -> list[dict]:
    text = "".join(p.read_text() for p in sorted((home / "runs" / job_id).glob("attempt*-node*.log")))
    return sorted((json.loads(m) for m in re.findall(r"RESULT (\{.*\})", text)), key=lambda r: r["rank"])


def _ended(job_id: str, timeout: float = 120) -> dict:
    return wait_for(lambda: (s := _status(job_id))["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and s,
                    timeout, f"job {job_id} to end")


def _assert_nothing_left(slurm: sl.SlurmCluster, scheduler_ids: list[str]) -> None:
    """Slurm knows no live job or step of ours, and no host runs any process but its sshd and slurmd."""
    for slurm_id in scheduler_ids:
        state = job_state(slurm, slurm_id)[0] if slurm.run(["squeue", "-h", "-t", "all", "-j", slurm_id],
                                                            check=False).stdout.strip() else "GONE"
        assert state in (*JOB_END_STATES, "GONE"), f"Slurm job {slurm_id} is {state}"
        assert not steps(slurm, slurm_id)
    wait_for(lambda: not any(tb.pids(host) for host in slurm.nodes), 30, "every host to hold no job process")


def test_two_nodes_one_rank_each_succeed_with_metrics(slurm: sl.SlurmCluster, tmp_path: Path, home: Path) -> None:
    done = _launch("submit", str(_job(tmp_path)), "--cluster", str(_cluster(tmp_path, slurm)))
    assert done.returncode == 0, done.stderr + done.stdout
    job_id = re.search(r"job (\S+): SUCCEEDED", done.stderr)[1]
    results = _results(home, job_id)
    assert [r["rank"] for r in results] == [0, 1]
    assert sorted(r["host"] for r in results) == [h.name for h in slurm.nodes]
    assert {r["sum"] for r in results} == {3.0}
    status = _status(job_id)
    assert status["state"] == "SUCCEEDED" and status["backend"] == "slurm"
    assert status["scheduler_id"] == results[0]["slurm_job"] == results[1]["slurm_job"]
    assert {r["host"] for r in status["metrics"]["per_rank"]} == {h.name for h in slurm.nodes}
    assert status["metrics"]["steps"] == 3
    assert [n["host"] for n in status["network"]] == [h.name for h in slurm.nodes]
    _assert_nothing_left(slurm, [status["scheduler_id"]])
