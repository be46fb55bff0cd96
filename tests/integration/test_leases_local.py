"""Leases on the local cluster (docs/LEASES.md): jobs share this machine's slots, never oversubscribe them.

The jobs run tests/programs/lease_hold.py, which notes each rank's start and end and holds its slot until the
test creates the job's release file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, leasing, planning
from launcher.backends.base import StartContext
from launcher.backends.local.backend import LocalBackend
from launcher.node import leases, proctree
from launcher.run import orchestrate
from launcher.spec.job import JobSpec
from launcher.store.db import Store
from tests.helpers import ROOT, cli_env, cli_json, launch_argv, run_cli, status_json, wait_for, write_yaml

HOLD = ROOT / "tests" / "programs" / "lease_hold.py"


def _job(tmp_path: Path, tag: str, **extra) -> str:
    job = {"name": f"hold-{tag}", "entrypoint": ["python", str(HOLD)], "resources": {"nodes": 1, "nproc_per_node": 1},
           "watch": {"grace_period": 1},
           "env": {"TEST_TIMES": str(tmp_path / f"times-{tag}"), "TEST_RELEASE": str(tmp_path / f"release-{tag}")}}
    job.update(extra)
    return str(write_yaml(tmp_path / f"job-{tag}.yaml", job))


def _times(tmp_path: Path, tag: str) -> list[list[str]]:
    path = tmp_path / f"times-{tag}"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _holding(tmp_path: Path, tag: str, proc: subprocess.Popen) -> bool:
    """Whether job ``tag``'s ranks started (waited for; False once its submit ended without)."""
    wait_for(lambda: _times(tmp_path, tag) or proc.poll() is not None, timeout=90)
    return bool(_times(tmp_path, tag))


def _submit(home: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(launch_argv("submit", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(home), cwd=ROOT, stdin=subprocess.DEVNULL)  # no terminal: Ctrl-C does not ask


def _done(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_two_one_slot_jobs_share_a_two_slot_host_each_on_its_own_slot_and_a_third_waits(
        tmp_path: Path, home: Path) -> None:
    cluster = str(write_yaml(tmp_path / "cluster.yaml", {"name": "two-slots", "backend": "local", "local": {"slots": 2}}))
    first, second = (_submit(home, _job(tmp_path, tag), "--cluster", cluster) for tag in ("a", "b"))
    assert wait_for(lambda: _times(tmp_path, "a") and _times(tmp_path, "b"), timeout=90), (first, second)
    listed = json.loads(run_cli(home, "queue", "--cluster", cluster, "--json").stdout)
    holders = {d["index"]: d["holder"]["job"] for d in listed["nodes"][0]["devices"]}
    jobs = {_times(tmp_path, "a")[0][1], _times(tmp_path, "b")[0][1]}
    assert set(holders) == {0, 1} and set(holders.values()) == jobs, listed

    third = _submit(home, _job(tmp_path, "c"), "--cluster", cluster, "--wait")
    queued = wait_for(lambda: next((j for j in cli_json(home, "status", "--json") if j["state"] == "QUEUED"), None),
                      timeout=60)
    assert queued and all(f"job {job} (user " in queued["queue_reason"] for job in jobs), queued
    shown = run_cli(home, "queue", "--cluster", cluster).stdout
    assert f"1. job {queued['id']}" in shown, shown
    (tmp_path / "release-a").touch()
    assert _done(first)[0] == 0
    assert wait_for(lambda: _times(tmp_path, "c"), timeout=90), third
    ended_a = max(float(t[5]) for t in _times(tmp_path, "a") if t[0] == "end")
    assert float(_times(tmp_path, "c")[0][5]) >= ended_a
    for tag in ("b", "c"):
        (tmp_path / f"release-{tag}").touch()
    assert _done(second)[0] == 0
    code, err = _done(third)
    assert code == 0, err
    assert status_json(home, queued["id"])["state"] == "SUCCEEDED"


def test_two_demo_submits_at_once_on_a_two_core_machine_never_run_together(tmp_path: Path, home: Path) -> None:
    cluster = str(write_yaml(tmp_path / "cluster.yaml", {"name": "laptop", "backend": "local", "local": {"slots": 2}}))
    args = ("jobs/cifar10_convnet.yaml", "--cluster", cluster, "--set", "max_steps=2", "--skip-check")
    both = [_submit(home, *args) for _ in range(2)]
    (code_a, err_a), (code_b, err_b) = (_done(proc) for proc in both)
    assert sorted((code_a, code_b)) == [0, 3], (err_a, err_b)
    refused = err_a if code_a == 3 else err_b
    assert "localhost slots 0-1: job cifar10-convnet-" in refused, refused


def test_ctrl_c_or_cancel_of_a_waiting_job_leaves_nothing(tmp_path: Path, home: Path) -> None:
    cluster = str(write_yaml(tmp_path / "cluster.yaml", {"name": "one-slot", "backend": "local", "local": {"slots": 1}}))
    reporting = {"TEST_TIMES": str(tmp_path / "times-a"), "TEST_RELEASE": str(tmp_path / "release-a"), "TEST_REPORT": "1"}
    holder = _submit(home, _job(tmp_path, "a", max_steps=100000, env=reporting), "--cluster", cluster)
    assert _holding(tmp_path, "a", holder), _done(holder)
    def pace() -> str | None:  # a step alone is recorded first; the ETA once two steps give a rate
        said = json.loads(run_cli(home, "queue", "--cluster", cluster, "--json").stdout)["nodes"][0]["devices"][0]["progress"]
        return said if said and "ETA" in said else None

    assert wait_for(pace, 60), "the holder's agent recorded no pace"
    held = {"id": _times(tmp_path, "a")[0][1]}
    refused = run_cli(home, "submit", _job(tmp_path, "d"), "--cluster", cluster)  # a teammate sees how far it is
    assert refused.returncode == 3 and re.search(
        rf"slot 0: job {held['id']} \(user \S+, from \S+, since \d\d:\d\d; step \d+/100000, ETA \d\d:\d\d\)",
        refused.stderr), refused.stderr
    waiting = _submit(home, _job(tmp_path, "b"), "--cluster", cluster, "--wait")
    detached = run_cli(home, "submit", _job(tmp_path, "c"), "--cluster", cluster, "--wait", "--detach").stdout.strip()

    def queued() -> list[dict]:
        return [j for j in cli_json(home, "status", "--json") if j["state"] == "QUEUED"]

    assert wait_for(lambda: len(queued()) == 2, timeout=60), queued()
    assert wait_for(lambda: len(json.loads(run_cli(home, "queue", "--cluster", cluster, "--json").stdout)["waiting"]) == 2,
                    timeout=30)
    shown = run_cli(home, "queue", "--cluster", cluster).stdout
    assert re.search(rf"slot 0: job {held['id']} .*; step \d+/100000, ETA \d\d:\d\d\)", shown), shown
    told = status_json(home, detached)  # a queued job's story: its node waits (not STARTING), when it was queued
    assert [n["state"] for n in told["nodes"]] == ["WAITING"], told["nodes"]
    assert not [e for e in told["events"] if "None" in e["message"]], told["events"]
    assert told["started_at"] is None and told["duration_s"] is None
    text = run_cli(home, "status", detached).stdout
    assert re.search(r"submitted \d\d:\d\d:\d\d, queued \d\d:\d\d:\d\d \(waited \d+\.\d s\)", text), text
    assert "stage            queued: running\n" in text and "as submitted: --set queue=wait" in text, text
    assert re.search(rf"; now job {held['id']} of \S+: step \d+/100000, ETA \d\d:\d\d", text), text  # its pace
    pace = told["holders_progress"][held["id"]]
    assert re.fullmatch(r"step \d+/100000, ETA \d\d:\d\d", pace["text"]) and pace["eta"] > time.time(), pace
    waiting.send_signal(signal.SIGINT)
    code, err = _done(waiting)
    assert code == 130, err
    assert run_cli(home, "cancel", detached).returncode == 0
    states = {j["id"]: j["state"] for j in json.loads(run_cli(home, "status", "--json").stdout)}
    assert sorted(states.values()) == ["CANCELLED", "CANCELLED", "RUNNING"], states
    assert [n["state"] for n in status_json(home, detached)["nodes"]] == ["NOT_STARTED"]
    listed = json.loads(run_cli(home, "queue", "--cluster", cluster, "--json").stdout)
    assert listed["waiting"] == [] and listed["nodes"][0]["devices"][0]["holder"]["job"] == _times(tmp_path, "a")[0][1]
    (tmp_path / "release-a").touch()
    assert _done(holder)[0] == 0
    assert not _times(tmp_path, "b") and not _times(tmp_path, "c")


FAKE_SMI = """#!/bin/sh
# nvidia-smi as recorded on a 3-GPU node where someone runs python train.py on GPU 0 (the rest: no output)
case "$*" in
  *--query-gpu=index,uuid*) printf '0, GPU-5e0c8f8a-1b2c-4d5e-8f90-a1b2c3d4e5f6\\n1, GPU-6f1d9a9b-2c3d-4e5f-9a01-b2c3d4e5f6a7\\n2, GPU-7a2eab0c-3d4e-4f5a-ab12-c3d4e5f6a7b8\\n' ;;
  *--query-compute-apps=pid,gpu_uuid,process_name*) printf '4194999, GPU-5e0c8f8a-1b2c-4d5e-8f90-a1b2c3d4e5f6, python train.py\\n' ;;
esac
"""


def test_part_of_a_gpu_node_each_job_its_lowest_free_gpus_and_a_foreign_process_counts_as_busy(
        tmp_path: Path, home: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = cli_env(home, PATH=f"{bin_dir}:{os.environ['PATH']}")
    cluster = str(write_yaml(tmp_path / "cluster.yaml", {"name": "three-gpus", "backend": "local", "local": {"gpus": 3}}))
    plan = run_cli(home, "submit", _job(tmp_path, "a"), "--cluster", cluster, "--dry-run", env=env).stdout
    assert "lease 1 of the node's 3 GPUs, the lowest free when it starts, set as CUDA_VISIBLE_DEVICES" in plan, plan

    def submit(tag: str, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(launch_argv("submit", _job(tmp_path, tag), "--cluster", cluster, *extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    first, second = submit("a"), submit("b")
    for tag, proc in (("a", first), ("b", second)):
        assert _holding(tmp_path, tag, proc), _done(proc)
    visible = {tag: _times(tmp_path, tag)[0][4] for tag in ("a", "b")}  # CUDA_VISIBLE_DEVICES: GPU 0 is in use
    assert sorted(visible.values()) == ["1", "2"], visible
    refused = run_cli(home, "submit", _job(tmp_path, "c"), "--cluster", cluster, env=env)
    assert refused.returncode == 3, refused.stderr
    assert ("localhost GPU 0: process 4194999 (user ?: python train.py), not started by launch "
            "(resources.allow_shared_gpus: true shares it)") in refused.stderr, refused.stderr
    shared = submit("d", "--set", "resources.allow_shared_gpus=true")
    assert _holding(tmp_path, "d", shared), _done(shared)
    assert _times(tmp_path, "d")[0][4] == "0"
    events = [e["message"] for e in Store(home).events(_times(tmp_path, "a")[0][1]) if e["kind"] == "leased"]
    assert events == [f"node 0 (localhost): GPU {visible['a']}"]
    for tag, proc in (("a", first), ("b", second), ("d", shared)):
        (tmp_path / f"release-{tag}").touch()
        code, err = _done(proc)
        assert code == 0, err


def test_a_job_finding_one_nodes_leases_taken_at_start_starts_no_rank_on_any_node(
        tmp_path: Path, lease_dir: Path) -> None:
    """The race between preflight and start, made certain: another holder takes a slot after the check."""
    cluster = planning(cluster_spec(name="two-slots", backend="local", local={"slots": 2})).resolve_defaults()
    job = JobSpec(name="race", entrypoint=["python", str(HOLD)], resources={"nodes": 2, "nproc_per_node": 1},
                  env={"TEST_TIMES": str(tmp_path / "times-race"), "TEST_RELEASE": str(tmp_path / "release-race")})
    plan = orchestrate.prepare_job(job, cluster).plan
    other = leases.acquire("slot", 1, 2, {"job": "quicker"}, directory=str(lease_dir))
    assert isinstance(other, leases.Lease)
    backend = LocalBackend(cluster)
    try:
        with pytest.raises(leasing.LeasesBusy, match=f"{leasing.TAKEN_FIRST} .*localhost slot 0: job quicker"):
            backend.start(plan, StartContext(run_dir=tmp_path, secrets={}, grace=1.0))
    finally:
        other.release()
    assert not _times(tmp_path, "race") and proctree.job_pids(plan.job_id) == []
    assert leases.survey("slot", 2, str(lease_dir)).free(False) == [0, 1]
