"""The Ray backend on a real two-node Ray cluster, driven through the `launch` CLI.

The head runs in the root namespace on the testbed bridge (its .1 address); the
second node runs inside the first testbed host, so the two Ray nodes
have different IPs and the job's ranks talk across the bridge.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from launcher.backends.ray.backend import NAMESPACE
from launcher.node import proctree
from launcher.run.ports import free_port
from tests.helpers import HOSTILE, PROBE, TORCH_EXTENSIONS_DIR, cli_env, kill_supervisor_and_keeper, run_cli, status_json, wait_for, wait_for_state, write_yaml
from tests.testbed_fixture import RAY_BED, Beds, uninterrupted
from tools import testbed as tb

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed"),
]

RAY = str(Path(sys.executable).parent / "ray")
RAY_NODE_ARGS = ["--num-cpus", "2", "--object-store-memory", "100000000", "--disable-usage-stats"]

TRAIN = """\
import os, socket, sys, time
import torch
import torch.distributed as dist
from launcher.metrics import Reporter

if os.environ.get("USE_DEEPSPEED"):
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
else:
    dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
print(f"rank {rank} of {dist.get_world_size()} on {socket.gethostname()} "
      f"node {os.environ['LAUNCH_NODE']} all_reduce={total.item()}", flush=True)
reporter = Reporter(every=2)
for step in range(int(os.environ.get("STEPS", "6"))):
    time.sleep(float(os.environ.get("STEP_S", "0.05")))
    grad = torch.ones(4)
    dist.all_reduce(grad)
    reporter.step(samples=8, loss=1.0 / (step + 1))
reporter.close()
dist.destroy_process_group()
"""


def _ray_pids(names: tuple[str, ...] = ("raylet", "gcs_server")) -> set[int]:
    """PIDs of Ray's daemons on this machine (every namespace shares the PID namespace)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                found.add(int(entry))
    return found


RAY_TEMP_PREFIX = "/tmp/lray"  # the suite's Ray temp dirs: a Ray daemon naming one in its arguments is the suite's


def _stale_suite_ray() -> list[int]:
    """Ray's processes that a killed or interrupted earlier run of the suite left (their arguments name one of its
    temp dirs), SIGKILLed. The Ray bed is held by one test session at a time (its machine lock): any is stale."""
    stale = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if RAY_TEMP_PREFIX.encode() in argv:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)
            stale.append(int(entry))
    return stale


def _with_own_hosts_file(hosts: Path, argv: list[str]) -> list[str]:
    """``argv`` run in a private mount namespace where ``hosts`` is /etc/hosts.

    This machine's hostname does not resolve, and torchrun's c10d rendezvous
    looks it up on every node; real machines resolve their own names, the
    testbed hosts do, and so does the head this way (the root /etc/hosts stays untouched).
    """
    return ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *argv]


@pytest.fixture(scope="module")
def ray_cluster(testbeds: Beds, tmp_path_factory: pytest.TempPathFactory):
    """A Ray head on the bridge address and a second Ray node inside the first testbed host."""
    import ray

    testbed = testbeds.get(RAY_BED)
    _stale_suite_ray()
    before = _ray_pids()
    host = testbed.hosts[0]
    port, client_port = free_port(), free_port()
    address = f"{testbed.names.bridge_address}:{port}"
    hosts = tmp_path_factory.mktemp("ray-head") / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + f"{testbed.names.bridge_address} {socket.gethostname()}\n")
    temp_dir = tempfile.mkdtemp(prefix=Path(RAY_TEMP_PREFIX).name, dir=str(Path(RAY_TEMP_PREFIX).parent))  # short: Ray's socket paths live under it
    node_args = [*RAY_NODE_ARGS, "--temp-dir", temp_dir]
    try:
        subprocess.run(
            _with_own_hosts_file(hosts, [
                RAY, "start", "--head", "--node-ip-address", testbed.names.bridge_address, "--port", str(port),
                "--ray-client-server-port", str(client_port), "--include-dashboard=false", *node_args,
            ]),
            check=True, capture_output=True, timeout=60,
        )
        tb.exec_in(host, [RAY, "start", "--address", address, "--node-ip-address", host.address, *node_args],
                   timeout=60)
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="warning")
        assert wait_for(lambda: sum(n["Alive"] for n in ray.nodes()) == 2, timeout=30), ray.nodes()
        yield {"address": address, "host": host, "ray": ray, "bridge": testbed.names.bridge_address}
    finally:
        with uninterrupted():
            ray.shutdown()
            started = _ray_pids() - before
            subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=60)
            shutil.rmtree(temp_dir, ignore_errors=True)
    left = [pid for pid in started if tb.pid_alive(pid)]
    assert not left, f"Ray daemons still running after `ray stop --force`: {left}"


@pytest.fixture
def job_files(tmp_path: Path, ray_cluster):
    """Write a cluster spec for the test cluster and return a job-spec writer."""
    (tmp_path / "train.py").write_text(TRAIN)
    cluster = write_yaml(tmp_path / "ray.yaml", {
        "name": "ray", "backend": "ray",
        "ray": {"address": ray_cluster["address"], "placement_timeout": 30},
        "python": sys.executable, "workdir": str(tmp_path),
    })

    def job(name: str = "rayjob", nodes: int = 2, nproc: int = 2, env: dict | None = None, **extra) -> Path:
        spec = {
            "name": name,
            "entrypoint": ["python", str(tmp_path / "train.py")],
            "batch": {"micro_batch": 8},
            "resources": {"nodes": nodes, "nproc_per_node": nproc},
            "env": {"TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR, **(env or {})},
            "watch": {"grace_period": 3},
            **extra,
        }
        return write_yaml(tmp_path / f"{name}.yaml", spec)

    return cluster, job


def _live_groups(ray) -> list[dict]:
    return [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]


def _assert_nothing_left(ray_cluster, job_id: str) -> None:
    ray, host = ray_cluster["ray"], ray_cluster["host"]
    assert wait_for(lambda: not _live_groups(ray), timeout=10), _live_groups(ray)
    assert proctree.job_pids(job_id) == []
    inside = tb.exec_in(host, [sys.executable, "-c", Path(proctree.__file__).read_text(), "list", job_id])
    assert inside.stdout.split() == []
    for index in range(2):
        with pytest.raises(ValueError):
            ray.get_actor(f"launch-{job_id}-node{index}", namespace=NAMESPACE)


def _job_id(result: subprocess.CompletedProcess) -> str:
    return result.stderr.split()[1].rstrip(":")


def test_two_nodes_of_two_torchrun_ranks_succeed_with_metrics(job_files, ray_cluster, home):
    cluster, job = job_files
    result = run_cli(home, "submit", str(job()), "--cluster", str(cluster), timeout=90)
    assert result.returncode == 0, result.stderr + result.stdout
    job_id = _job_id(result)
    obj = status_json(home, job_id)
    assert obj["state"] == "SUCCEEDED" and obj["world_size"] == 4
    addresses = {node["node"]: node["address"] for node in obj["nodes"]}
    assert set(addresses.values()) == {ray_cluster["bridge"], ray_cluster["host"].address}
    per_rank = obj["metrics"]["per_rank"]
    assert sorted(r["rank"] for r in per_rank) == [0, 1, 2, 3]
    assert len({addresses[r["node"]] for r in per_rank}) == 2
    assert ray_cluster["host"].name in {r["host"] for r in per_rank}
    ready = [line for line in result.stdout.splitlines() if "all_reduce=6.0" in line]
    assert len(ready) == 4, result.stdout
    _assert_nothing_left(ray_cluster, job_id)


def _running_job(job_files, home) -> str:
    """A long detached 2x2 job, once it has reported two steps; its id."""
    cluster, job = job_files
    result = run_cli(home, "submit", str(job(env={"STEPS": "2000"})), "--cluster", str(cluster), "--detach")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert wait_for(lambda: status_json(home, job_id)["metrics"]["steps"] >= 2, timeout=60), status_json(home, job_id)
    return job_id


def test_cancel_ends_every_process_and_removes_the_group(job_files, ray_cluster, home):
    job_id = _running_job(job_files, home)
    pids = proctree.job_pids(job_id)
    in_host = set(pids) & set(tb.pids(ray_cluster["host"]))
    assert len(pids) >= 6 and in_host, (pids, in_host)

    cancelled = run_cli(home, "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert status_json(home, job_id)["state"] == "CANCELLED"
    _assert_nothing_left(ray_cluster, job_id)


def _torchrun_of_node(job_id: str, node: int) -> int:
    for pid in proctree.job_pids(job_id):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"LAUNCH_NODE={node}".encode() in environ and b"torch.distributed.run" in cmdline:
            return pid
    raise AssertionError(f"no torchrun of node {node} in job {job_id}")


def test_killing_the_agent_of_node_1_fails_the_job_fast(job_files, ray_cluster, home):
    job_id = _running_job(job_files, home)

    os.kill(_torchrun_of_node(job_id, 1), signal.SIGKILL)
    obj = wait_for_state(home, job_id, ("FAILED", "SUCCEEDED", "CANCELLED"), timeout=30)
    assert obj["state"] == "FAILED", obj
    failure = obj["first_failure"]
    assert failure["node"] == 1 and failure["exit_code"] == -9 and failure["signal"] == "SIGKILL"
    _assert_nothing_left(ray_cluster, job_id)


def test_a_dead_supervisor_is_noticed_by_the_actors_and_the_group_released(job_files, ray_cluster, home):
    """Issue 20: the actors read their agents, so the agents never find themselves unattended; the actors notice
    that nobody pulls for watch.unattended_timeout, end the job on every node and remove the placement group."""
    cluster, job = job_files
    spec = job(env={"STEPS": "2000"}, watch={"grace_period": 3, "unattended_timeout": 8})
    result = run_cli(home, "submit", str(spec), "--cluster", str(cluster), "--detach")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert wait_for(lambda: status_json(home, job_id)["metrics"]["steps"] >= 2, timeout=60), status_json(home, job_id)
    assert proctree.job_pids(job_id) and _live_groups(ray_cluster["ray"])

    kill_supervisor_and_keeper(status_json(home, job_id)["supervisor"]["pid"])
    assert wait_for(lambda: not proctree.job_pids(job_id) and not _live_groups(ray_cluster["ray"]), timeout=60), \
        (proctree.job_pids(job_id), _live_groups(ray_cluster["ray"]))
    assert status_json(home, job_id)["supervisor"]["state"] == "lost"
    cancelled = run_cli(home, "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert status_json(home, job_id)["state"] == "CANCELLED"
    _assert_nothing_left(ray_cluster, job_id)


def test_losing_the_ray_agent_of_node_1_fails_the_job_and_says_why(job_files, ray_cluster, home):
    job_id = _running_job(job_files, home)

    ray = ray_cluster["ray"]
    ray.kill(ray.get_actor(f"launch-{job_id}-node1", namespace=NAMESPACE))
    obj = wait_for_state(home, job_id, ("FAILED", "SUCCEEDED", "CANCELLED"), timeout=30)
    assert obj["state"] == "FAILED", obj
    failure = obj["first_failure"]
    assert failure["kind"] == "lost" and failure["node"] == 1 and failure["exit_code"] == 255
    assert "node 1 lost: its Ray agent died" in failure["reason"], failure
    _assert_nothing_left(ray_cluster, job_id)


@pytest.mark.parametrize(("nodes", "nproc", "missing"), [
    (2, 3, "no node has {CPU: 3} in total"),
    (3, 1, "2 alive node(s), 1 too few"),
])
def test_a_group_that_cannot_be_placed_fails_preflight(tmp_path, job_files, ray_cluster, home, nodes, nproc, missing):
    cluster, job = job_files
    short = write_yaml(tmp_path / "short.yaml", {
        "name": "ray", "backend": "ray", "ray": {"address": ray_cluster["address"], "placement_timeout": 7},
        "python": sys.executable, "workdir": str(tmp_path),
    })
    result = run_cli(home, "submit", str(job(nodes=nodes, nproc=nproc)), "--cluster", str(short))
    assert result.returncode == 3, result.stderr
    assert "waiting for Ray to place" in result.stderr
    assert "could not place the job within 7 s" in result.stderr and missing in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    ray = ray_cluster["ray"]
    assert wait_for(lambda: not _live_groups(ray), timeout=10), _live_groups(ray)
    assert json.loads(run_cli(home, "status", "--json").stdout) == []


def test_a_deepspeed_job_runs_across_both_nodes(job_files, ray_cluster, home):
    cluster, job = job_files
    spec = job(name="dsjob", launcher="deepspeed", env={"USE_DEEPSPEED": "1"})
    result = run_cli(home, "submit", str(spec), "--cluster", str(cluster), timeout=90,
                     env=cli_env(home, TORCH_EXTENSIONS_DIR=TORCH_EXTENSIONS_DIR))
    assert result.returncode == 0, result.stderr + result.stdout
    job_id = _job_id(result)
    obj = status_json(home, job_id)
    assert obj["state"] == "SUCCEEDED" and obj["launcher"] == "deepspeed"
    assert sorted(r["rank"] for r in obj["metrics"]["per_rank"]) == [0, 1, 2, 3]
    # DeepSpeed's launcher gives its ranks one shared, unbuffered stdout: a print() is two writes, so
    # lines of different ranks can interleave. Count the reports, not the lines.
    assert result.stdout.count("all_reduce=6.0") == 4, result.stdout
    _assert_nothing_left(ray_cluster, job_id)


def test_hostile_argv_and_env_reach_the_ranks_verbatim(tmp_path, job_files, ray_cluster, home):
    cluster, _ = job_files
    out = tmp_path / "probe-out"
    out.mkdir()
    env = {f"HOSTILE_{i}": value for i, value in enumerate(HOSTILE)}
    env.update({"PROBE_OUT": str(out), "PROBE_ENV_KEYS": ",".join(env), "PROBE_STEPS": "1"})
    job = write_yaml(tmp_path / "hostile.yaml", {
        "name": "hostile", "entrypoint": ["python", str(PROBE), *HOSTILE], "batch": {"micro_batch": 1},
        "resources": {"nodes": 2, "nproc_per_node": 1}, "env": env, "watch": {"grace_period": 3},
    })
    result = run_cli(home, "submit", str(job), "--cluster", str(cluster), timeout=90)
    assert result.returncode == 0, result.stderr + result.stdout
    reports = [json.loads(p.read_text(encoding="utf-8")) for p in out.glob("rank*.json")]
    assert len(reports) == 2
    for seen in reports:
        assert seen["argv"] == HOSTILE
        assert [seen["env"][f"HOSTILE_{i}"] for i in range(len(HOSTILE))] == HOSTILE
    _assert_nothing_left(ray_cluster, _job_id(result))
