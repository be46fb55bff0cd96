"""Jobs in Docker containers on two namespaced SSH hosts, each with a dockerd of its own (tests/docker_fixture.py):
real dockerd (Debian's docker.io), real sshd, real torchrun. What the podman tests (test_containers.py) check,
under Docker: a job succeeds with metrics, cancel leaves no container and no process. Attach after the supervisor
was killed, then a host lost, is one test under both engines (test_containers.py). A CDI device is run for real by
podman (Docker 20.10 has no CDI).
"""

from __future__ import annotations

import json
import re
import resource
import sys
from pathlib import Path

import pytest

from tests.docker_fixture import needs_docker
from tests.helpers import run_cli, status_json, wait_for, wait_for_state, write_yaml
from tests.testbed_fixture import needs_root
from tools import docker_hosts as dh
from tools import testbed as tb

pytestmark = [needs_root, needs_docker, pytest.mark.testbed, pytest.mark.slow]

RANK = """\
import json, os, resource, socket, time
import torch
import torch.distributed as dist
from launcher.metrics import Reporter

dist.init_process_group("gloo")
caps = next(int(l.split()[1], 16) for l in open("/proc/self/status") if l.startswith("CapEff:"))
print("INSIDE " + json.dumps({"rank": dist.get_rank(), "host": socket.gethostname(),
                               "docker": os.path.exists("/.dockerenv"),
                               "ib": sorted(os.listdir("/dev/infiniband")) if os.path.isdir("/dev/infiniband") else None,
                               "memlock": resource.getrlimit(resource.RLIMIT_MEMLOCK)[0], "ipc_lock": bool(caps >> 14 & 1)}),
      flush=True)
reporter = Reporter(every=1, warmup=0)
for _ in range(int(os.environ.get("STEPS", "3"))):
    time.sleep(float(os.environ.get("STEP_S", "0.1")))
    dist.all_reduce(torch.ones(1))  # a step waits for every rank, as training does: a lost host stalls the others
    reporter.step(samples=4)
reporter.close()
dist.barrier()
dist.destroy_process_group()
"""


def _cluster(tmp_path: Path, bed: tb.Testbed) -> Path:
    return write_yaml(tmp_path / "cluster.yaml", {
        "name": "testbed", "backend": "ssh",
        "ssh": {"user": "root", "key_file": str(bed.key_file), "known_hosts": str(bed.known_hosts),
                "config_file": str(bed.ssh_config)},
        "nodes": [{"host": h.name, "gpus": 0, "slots": 2} for h in bed.hosts[:2]],
        "python": sys.executable, "workdir": str(tmp_path),
    })


def _job(tmp_path: Path, docker, name: str, steps: int = 3, step_s: float = 0.1, **extra) -> Path:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return write_yaml(tmp_path / f"{name}.yaml", {
        "name": name, "entrypoint": ["python", str(script)], "resources": {"nodes": 2, "nproc_per_node": 1},
        "container": docker.spec().model_dump(mode="json"), "env": {"STEPS": str(steps), "STEP_S": str(step_s)},
        **extra,
    })


def _nothing_left(docker, job_id: str) -> bool:
    """No container of the job (running or stopped) and no process of it on either host."""
    return all(dh.containers(host, f"launch.job={job_id}") == [] and tb.tagged_pids(host, f"LAUNCH_JOB_ID={job_id}") == []
               for host in docker.hosts)


def test_a_two_host_docker_job_succeeds_with_metrics_and_cancel_leaves_nothing(tmp_path, home, docker_hosts, testbed):
    """On hosts that look like InfiniBand nodes (an HCA in /sys/class/infiniband, /dev/infiniband/uverbs0), as the
    A800 clusters' nodes do: the containers get the device, IPC_LOCK and the memlock the node allows (8 MiB here:
    the machine's hard limit cannot be raised), and preflight says what they got."""
    cluster = _cluster(tmp_path, testbed)
    with dh.fake_infiniband(docker_hosts.hosts):
        dry = run_cli(home, "submit", str(_job(tmp_path, docker_hosts, "dkr")), "--cluster", str(cluster), "--dry-run")
        result = run_cli(home, "submit", str(tmp_path / "dkr.yaml"), "--cluster", str(cluster), timeout=240)
    assert "docker run --rm --name launch-" in dry.stdout and "--network host --ipc host" in dry.stdout
    assert "adds  --device /dev/infiniband (probed at launch)  # if the node's probe finds InfiniBand HCAs" in dry.stdout
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    inside = [json.loads(line.split("INSIDE ", 1)[1]) for line in result.stdout.splitlines() if "INSIDE " in line]
    assert sorted((r["rank"], r["host"], r["docker"], r["ib"], r["memlock"], r["ipc_lock"]) for r in inside) == [
        (0, "lt-h1", True, ["uverbs0"], hard, True), (1, "lt-h2", True, ["uverbs0"], hard, True)]
    if hard != resource.RLIM_INFINITY:  # what a machine without CAP_SYS_RESOURCE gets, said before the start
        assert f"lt-h2: the container got memlock {hard // 1024} KiB, not unlimited" in result.stderr + result.stdout
    job_id = re.search(r"\b(dkr-[0-9a-f]{8})\b", result.stderr).group(1)
    obj = status_json(home, job_id)
    assert [n["env"].get("NCCL_IB_HCA") for n in obj["network"]] == [dh.FAKE_HCA, dh.FAKE_HCA]
    assert obj["state"] == "SUCCEEDED"
    assert sorted(r["rank"] for r in obj["metrics"]["per_rank"]) == [0, 1] and obj["metrics"]["samples_per_sec"] > 0
    assert _nothing_left(docker_hosts, job_id), "no container is left, running or stopped"

    job = _job(tmp_path, docker_hosts, "dkr-cancel", steps=2000)
    job_id = run_cli(home, "submit", str(job), "--cluster", str(cluster), "--detach").stdout.strip()
    assert wait_for_state(home, job_id, ("RUNNING",), timeout=120)["state"] == "RUNNING"
    assert wait_for(lambda: all(dh.containers(h, f"launch.job={job_id}") for h in docker_hosts.hosts), timeout=60)
    assert wait_for(lambda: (status_json(home, job_id)["metrics"]["steps"] or 0) >= 2, timeout=120)
    cancelled = run_cli(home, "cancel", job_id, timeout=120)
    assert cancelled.returncode == 0, cancelled.stderr
    assert status_json(home, job_id)["state"] == "CANCELLED"
    assert _nothing_left(docker_hosts, job_id)
    # a container's processes are containerd-shim's children, not the agent's: none may outlive the cancel
    assert wait_for(lambda: all(not tb.pids(h) for h in docker_hosts.hosts), timeout=30), "nothing left on the hosts"
