"""Jobs inside containers on two namespaced SSH hosts: real podman (runc), real sshd, real torchrun; and, for a host
lost while `launch attach` follows the job, real Docker too (a dockerd a host: tests/docker_fixture.py).

The test image (tests/container_fixture.py) runs the suite's interpreter from read-only mounts, so the
ranks run this checkout's code inside the container. Each host runs its own containers; a host can
have an image store of its own (tools/container_image.own_image_store) to miss or differ in the image.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.spec.container import ContainerSpec
from tests.container_fixture import TestImage, needs_podman
from tests.docker_fixture import needs_docker
from tests.helpers import (
    ROOT,
    TORCH_EXTENSIONS_DIR,
    build_deepspeed_ops,
    cli_env,
    kill_supervisor_and_keeper,
    launch_argv,
    run_cli,
    status_json,
    wait_for,
    wait_for_state,
    write_yaml,
)
from tests.testbed_fixture import link_cut, needs_root
from tools import container_image as ci
from tools import testbed as tb

pytestmark = [needs_root, pytest.mark.testbed, pytest.mark.slow]
PROGRAMS = ROOT / "tests" / "programs"

RANK = """\
import json, os, socket, time
import torch
import torch.distributed as dist
from launcher.metrics import Reporter

dist.init_process_group("gloo")
rank = dist.get_rank()
print("INSIDE " + json.dumps({"rank": rank, "host": socket.gethostname(),
                               "container": os.environ.get("container")}), flush=True)
reporter = Reporter(every=1, warmup=0)
for step in range(1, int(os.environ.get("STEPS", "3")) + 1):
    time.sleep(float(os.environ.get("STEP_S", "0.1")))
    dist.all_reduce(torch.ones(1))  # a step waits for every rank, as training does: a lost host stalls the others
    reporter.step(samples=4)
    print(f"step {step} of rank {rank}", flush=True)
reporter.close()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture
def hosts(testbed, container_image):
    """The first two test hosts (every host mounts the cgroup hierarchies runc needs)."""
    return testbed.hosts[:2]


def _cluster(tmp_path: Path, bed) -> Path:
    return write_yaml(tmp_path / "cluster.yaml", {
        "name": "testbed", "backend": "ssh",
        "ssh": {"user": "root", "key_file": str(bed.key_file), "known_hosts": str(bed.known_hosts),
                "config_file": str(bed.ssh_config)},
        "nodes": [{"host": h.name, "gpus": 0, "slots": 2} for h in bed.hosts[:2]],
        "python": sys.executable, "workdir": str(tmp_path),
    })


def _job(tmp_path: Path, container: ContainerSpec, name: str = "ctr", steps: int = 3, step_s: float = 0.1,
         **extra) -> Path:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return write_yaml(tmp_path / "job.yaml", {
        "name": name, "entrypoint": ["python", str(script)], "resources": {"nodes": 2, "nproc_per_node": 1},
        "container": container.model_dump(mode="json"),
        "env": {"STEPS": str(steps), "STEP_S": str(step_s)}, **extra,
    })


def _podman(image: TestImage) -> ContainerSpec:
    """The podman ``container:`` section running the suite's interpreter in the test image."""
    return image.spec(python=sys.executable)


def _containers(host: tb.Host, job_id: str, runtime: str = "podman") -> list[str]:
    """The containers of ``job_id`` on ``host``, running or stopped, as the host's SSH sessions see them (Docker: the
    host's own dockerd)."""
    done = ci.in_host(host, [runtime, "ps", "-a", "--filter", f"label=launch.job={job_id}", "--format", "{{.Names}}"])
    return done.stdout.split()


def _nothing_left(hosts, job_id: str, runtime: str) -> bool:
    """No container of the job (running or stopped) and no process of it on any of ``hosts``."""
    return all(_containers(host, job_id, runtime) == [] and tb.tagged_pids(host, f"LAUNCH_JOB_ID={job_id}") == []
               for host in hosts)


@pytest.fixture(params=[pytest.param("podman", marks=needs_podman), pytest.param("docker", marks=needs_docker)])
def engine(request) -> ContainerSpec:
    """The test image's ``container:`` section under each engine: podman (the machine's store, every host) or Docker
    (a dockerd in each of the first two hosts)."""
    if request.param == "docker":
        return request.getfixturevalue("docker_hosts").spec()
    return _podman(request.getfixturevalue("container_image"))


def test_a_two_host_job_runs_every_rank_inside_the_container(tmp_path, home, hosts, container_image, testbed):
    result = run_cli(home, "submit", str(_job(tmp_path, _podman(container_image))), "--cluster", str(_cluster(tmp_path, testbed)),
                     timeout=240)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    inside = [json.loads(line.split("INSIDE ", 1)[1]) for line in result.stdout.splitlines() if "INSIDE " in line]
    assert sorted((r["rank"], r["host"], r["container"]) for r in inside) == [(0, "lt-h1", "podman"), (1, "lt-h2", "podman")]
    job_id = re.search(r"^job (ctr-[0-9a-f]{8}): ", result.stderr, re.M)[1]  # after any warning (a full disk's)
    obj = status_json(home, job_id)
    assert sorted(r["rank"] for r in obj["metrics"]["per_rank"]) == [0, 1] and obj["metrics"]["samples_per_sec"] > 0
    assert all(_containers(host, job_id) == [] for host in hosts), "no container is left, running or stopped"
    dry = run_cli(home, "submit", str(tmp_path / "job.yaml"), "--cluster", str(tmp_path / "cluster.yaml"), "--dry-run")
    assert "podman run --rm --name launch-" in dry.stdout and "--network host --ipc host" in dry.stdout


def test_a_deepspeed_job_runs_inside_the_container(tmp_path, home, hosts, container_image, testbed):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                                               "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}))
    out = tmp_path / "out"
    out.mkdir()
    build_deepspeed_ops("comm")  # a fresh clone has no extension cache yet (podman mounts only what exists)
    spec = container_image.spec(python=sys.executable, mounts=[*container_image.mounts, f"{TORCH_EXTENSIONS_DIR}:{TORCH_EXTENSIONS_DIR}"])
    job = write_yaml(tmp_path / "job.yaml", {
        "name": "ctr-ds", "launcher": "deepspeed", "resources": {"nodes": 2, "nproc_per_node": 1},
        "entrypoint": ["python", str(PROGRAMS / "user_deepspeed.py"), "--out", str(out), "--steps", "2",
                       "--deepspeed", "--deepspeed_config", str(config)],
        "container": spec.model_dump(mode="json"), "env": {"TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR},
    })
    result = run_cli(home, "submit", str(job), "--cluster", str(_cluster(tmp_path, testbed)), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    seen = sorted(json.loads(p.read_text())["host"] for p in out.glob("rank*.json"))
    assert seen == ["lt-h1", "lt-h2"]


def test_cancel_mid_run_leaves_no_container_on_either_host(tmp_path, home, hosts, container_image, testbed):
    job = _job(tmp_path, _podman(container_image), name="ctr-cancel", steps=2000, step_s=0.1)
    job_id = run_cli(home, "submit", str(job), "--cluster", str(_cluster(tmp_path, testbed)), "--detach").stdout.strip()
    assert wait_for_state(home, job_id, ("RUNNING",), timeout=120)["state"] == "RUNNING"
    assert wait_for(lambda: all(_containers(host, job_id) for host in hosts), timeout=60), "containers started"
    assert wait_for(lambda: (status_json(home, job_id)["metrics"]["steps"] or 0) >= 2, timeout=120)
    result = run_cli(home, "cancel", job_id, timeout=120)
    assert result.returncode == 0, result.stderr
    assert status_json(home, job_id)["state"] == "CANCELLED"
    assert all(_containers(host, job_id) == [] for host in hosts)
    assert all(tb.tagged_pids(host, f"LAUNCH_JOB_ID={job_id}") == [] for host in hosts), "no process of the job"
    # podman's own clean-up (conmon's `podman container cleanup`) may still be exiting: it ends by itself
    assert wait_for(lambda: all(not tb.pids(host) for host in hosts), timeout=30), "nothing at all left on the hosts"


def test_attach_follows_a_container_job_whose_supervisor_was_killed_and_a_lost_host_fails_it(
        tmp_path, home, engine, testbed):
    """Under podman and Docker alike: once the detached supervisor and its keeper are killed (the submitting
    machine's crash) the containers run on; `launch attach` follows the job from its nodes' journals, relaying
    the lines and storing the steps the ranks made meanwhile; then the second host is cut off the network and the
    job FAILS naming it as lost, and no container or process of the job is left on either host."""
    hosts, runtime = testbed.hosts[:2], engine.runtime.value
    job = _job(tmp_path, engine, name=f"{runtime}-attach", steps=2000)
    submitted = run_cli(home, "submit", str(job), "--cluster", str(_cluster(tmp_path, testbed)), "--detach")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert wait_for(lambda: (status_json(home, job_id)["metrics"]["steps"] or 0) >= 2, timeout=120)
    kill_supervisor_and_keeper(status_json(home, job_id)["supervisor"]["pid"])
    assert wait_for(lambda: status_json(home, job_id)["supervisor"]["state"] == "lost", timeout=30)
    assert all(_containers(host, job_id, runtime) for host in hosts), "the containers run on"
    stored = status_json(home, job_id)["metrics"]["steps"]

    attach = subprocess.Popen(launch_argv("attach", job_id), env=cli_env(home), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert wait_for(lambda: (status_json(home, job_id)["metrics"]["steps"] or 0) >= stored + 3, timeout=120), \
            "attach stores the steps the ranks make"
        assert status_json(home, job_id)["supervisor"]["state"] == "attached"
        with link_cut(hosts[1]):
            out, err = attach.communicate(timeout=120)
    finally:
        attach.kill()
    assert attach.returncode == 1 and f"job {job_id}: FAILED" in err, err[-3000:]
    assert max(map(int, re.findall(r"step (\d+) of rank 1$", out, re.M)), default=0) > stored, \
        "attach relays the lines the ranks print"
    logged = [int(n) for n in re.findall(r"step (\d+) of rank 0$", run_cli(home, "logs", job_id, "--rank", "0").stdout, re.M)]
    assert logged == list(range(1, len(logged) + 1)) and len(logged) > stored, "each of rank 0's lines kept once"
    obj = status_json(home, job_id)
    failure = obj["first_failure"]
    assert (failure["node"], failure["host"], failure["kind"]) == (1, "lt-h2", "lost"), failure
    assert "lt-h2 unreachable" in failure["reason"]
    # lt-h1's container had ended with its command (--rm) before the sweep's stop: "no such container" is nothing left
    swept = [e["message"] for e in obj["events"] if e["kind"] == "sweep"]
    assert all(m.startswith("node 1 (lt-h2): unreachable, not checked") for m in swept), swept
    assert wait_for(lambda: _nothing_left(hosts, job_id, runtime), timeout=60), "the lost host's container ends too"
    # and attach's SSH session on the cut host, whose client end was reset while it was away (the tests after this
    # one find the hosts empty)
    assert wait_for(lambda: all(not tb.pids(host) for host in hosts), timeout=30), "nothing at all left on the hosts"


def test_an_image_missing_on_one_host_with_pull_never_is_refused_before_anything_starts(
        tmp_path, home, hosts, container_image, testbed):
    with ci.own_image_store(hosts[1]):
        result = run_cli(home, "submit", str(_job(tmp_path, _podman(container_image))), "--cluster",
                         str(_cluster(tmp_path, testbed)), timeout=120)
    assert result.returncode == 3, result.stderr
    assert "lt-h2: image localhost/launch-test:1: the image is not on this node (pull: never)" in result.stderr
    assert "lt-h1:" not in result.stderr and "nothing was started" in result.stderr
    assert json.loads(run_cli(home, "status", "--json").stdout) == []


def test_different_torch_versions_inside_the_image_are_flagged(tmp_path, home, hosts, container_image, testbed):
    import torch

    with ci.own_image_store(hosts[1]):
        ci.build_image(container_image.name, host=hosts[1], claims={"torch": "1.0.0"})
        result = run_cli(home, "submit", str(_job(tmp_path, _podman(container_image))), "--cluster",
                         str(_cluster(tmp_path, testbed)), timeout=180)
    assert result.returncode == 3, result.stderr
    assert f"torch differs between nodes: lt-h1={torch.__version__}, lt-h2=1.0.0" in result.stderr
    assert json.loads(run_cli(home, "status", "--json").stdout) == []
    assert subprocess.run(["podman", "ps", "-a", "--filter", "label=launch.job", "--format", "{{.Names}}"],
                          capture_output=True, text=True).stdout.strip() == ""
