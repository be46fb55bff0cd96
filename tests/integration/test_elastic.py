"""Lose a node, keep training (issue 22), end to end: the real CLI, namespaced SSH hosts, torchrun on gloo.

Three hosts of one process each train the ConvNet recipe at global batch 12 = micro 2 x GA 2 x 3 with
``elastic: {min_nodes: 2}``; host 3's agent is killed mid-run. The job must end SUCCEEDED on two hosts
at GA 3, with exactly max_steps steps and max_steps x 12 samples by the recipe's own count, and the
steps it ran twice (after the checkpoint it resumed from) must give the losses they gave before.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.node import rundir
from launcher.store.db import Store
from tests.helpers import TORCH_EXTENSIONS_DIR, all_held, hold_env, status_json
from tests.slurm_fixture import wait_for
from tests.testbed_fixture import needs_root
from tools import testbed as tb

pytestmark = [needs_root, pytest.mark.testbed]

PYTHON = sys.executable
LAUNCH = str(Path(sys.executable).with_name("launch"))
STEPS = 30
KILL_AT = 16  # the ranks are held there: after the checkpoint at 15, before the one at 20, so step 16 runs twice


def _cluster(tmp_path: Path, bed: tb.Testbed, slots: tuple[int, ...] = (2, 2, 2)) -> Path:
    spec = {
        "name": "testbed", "backend": "ssh",
        "ssh": {"user": "root", "key_file": str(bed.key_file), "known_hosts": str(bed.known_hosts),
                "config_file": str(bed.ssh_config)},
        "nodes": [{"host": h.name, "gpus": 0, "slots": n} for h, n in zip(bed.hosts, slots, strict=False)],
        "python": PYTHON, "workdir": str(tmp_path),
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(spec))
    return path


def _lose_node_2(home: Path, job_file: Path, cluster: Path, reached: Callable[[Store, str], bool],
                 ) -> tuple[str, subprocess.CompletedProcess]:
    """Submit in the foreground, kill node 2's agent once ``reached`` says attempt 0 got far enough; the finished submit."""
    submit = subprocess.Popen([LAUNCH, "submit", str(job_file), "--cluster", str(cluster)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
    try:
        store = Store(home)

        def far_enough():
            jobs = store.jobs(limit=1)
            return jobs[0].id if jobs and reached(store, jobs[0].id) else None

        job_id = wait_for(far_enough, 120, "attempt 0 to get far enough", every=0.05)
        pid_file = Path(rundir.run_root()) / job_id / "node2.pid"
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        out, err = submit.communicate(timeout=240)
    finally:
        if submit.poll() is None:
            submit.send_signal(signal.SIGTERM)
            submit.communicate(timeout=60)
    return job_id, subprocess.CompletedProcess(submit.args, submit.returncode, out, err)


def _status(job_id: str) -> dict:
    return status_json(None, job_id)  # this test's LAUNCH_HOME, in process (polled)


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "fsdp2"])
def test_a_lost_host_ends_succeeded_on_two_hosts_with_the_global_batch_exact(
        testbed: tb.Testbed, tmp_path: Path, home: Path, strategy: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "name": "elastic", "recipe": "convnet", "strategy": strategy,
        "batch": {"global_batch": 12, "micro_batch": 2}, "resources": {"nodes": 3, "nproc_per_node": 1},
        "max_steps": STEPS, "restarts": 2, "elastic": {"min_nodes": 2}, "metrics": {"every": 1},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": 5}, "watch": {"grace_period": 2},
        # zero2's ranks load the op the suite built; attempt 0's ranks wait after step KILL_AT until they are ended
        "env": {"TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR, **hold_env(tmp_path / "held", KILL_AT)},
    }))
    job_id, done = _lose_node_2(home, job, _cluster(tmp_path, testbed), lambda store, job_id: all_held(
        tmp_path / "held", 3) and len({r.rank for r in store.metrics(job_id) if r.attempt == 0 and r.step == KILL_AT}) == 3)
    assert done.returncode == 0, done.stderr[-4000:]

    status = _status(job_id)
    assert status["state"] == "SUCCEEDED" and status["attempt"] == 1
    names = [h.name for h in testbed.hosts]
    assert [n["host"] for n in status["nodes"] if n["attempt"] == 1] == names[:2]
    assert (status["grad_accum"], status["global_batch"], status["world_size"]) == (3, 12, 2)
    shrunk = [e for e in status["events"] if e["kind"] == "elastic_restart"]
    assert len(shrunk) == 1
    lost_at = shrunk[0]["data"]["lost_at_step"]
    assert shrunk[0]["message"] == f"attempt 1: 2 nodes ({names[2]} lost at step {lost_at}), grad_accum 2 -> 3, global batch 12 kept"
    # submit's output went to a pipe (as to a file): launch's decisions, the stages and [progress] summaries are in it
    said = done.stdout
    assert re.search(rf"^\[launch\] first failure: node 2 \({names[2]}\)", said, re.M), said[-3000:]
    assert f"[launch] {shrunk[0]['message']}" in said.splitlines()
    assert re.search(r"^\[launch\] attempt 0 failed \(first failure: node 2 .+\); restart 1 of 2$", said, re.M)
    assert re.search(rf"^\[start\] node 0 \({names[0]}\): done$", said, re.M)
    assert re.search(rf"^\[progress\] step {STEPS}/{STEPS}  100% ", said, re.M), said[-3000:]

    records = Store(home).metrics(job_id)
    after = [r for r in records if r.attempt == 1]
    assert {r.extra["grad_accum"] for r in after} == {3} and {r.rank for r in after} == {0, 1}
    final = max(after, key=lambda r: r.step)
    assert final.step == STEPS and final.extra["samples_consumed"] == STEPS * 12
    # the loss over the global batch, a step at a time; a step run in both attempts must agree (no jump)
    means = {a: _step_means([r for r in records if r.attempt == a], ranks) for a, ranks in ((0, 3), (1, 2))}
    assert set(means[0]) | set(means[1]) >= set(range(1, KILL_AT)) | set(range(KILL_AT + 4, STEPS + 1))
    again = sorted(set(means[0]) & set(means[1]))
    assert again, "no step ran in both attempts (the kill came after the checkpoint it should precede)"
    for step in again:
        assert abs(means[0][step] - means[1][step]) <= 1e-3, (step, means[0][step], means[1][step])

    failed_at = next(e["t"] for e in status["events"] if e["kind"] == "node_failed")
    first_step = min(r.t for r in after if r.t is not None)
    load = re.search(r"loaded in ([\d.]+) s", (home / "runs" / job_id / "attempt1-node0.log").read_text())
    print(f"{strategy}: node loss -> first step on 2 nodes: {first_step - failed_at:.1f} s (checkpoint load "
          f"{load[1] if load else '?'} s); steps run twice: {again}; samples {final.extra['samples_consumed']}")


def _step_means(records, ranks: int) -> dict[int, float]:
    """The loss of each step over the global batch (the mean of the ranks', which hold as many samples each),
    for the steps every one of the attempt's ``ranks`` reported."""
    by_step: dict[int, list[float]] = {}
    for r in records:
        by_step.setdefault(r.step, []).append(r.loss)
    return {step: sum(values) / len(values) for step, values in by_step.items() if len(values) == ranks}


def test_a_users_own_program_keeps_its_global_batch_across_a_node_loss(
        testbed: tb.Testbed, tmp_path: Path, home: Path) -> None:
    program = Path(__file__).resolve().parents[1] / "programs" / "elastic_user.py"
    steps = 16
    job = tmp_path / "user.yaml"
    job.write_text(json.dumps({
        "name": "elastic-user", "entrypoint": ["python", str(program), "--ckpt", str(tmp_path / "state.json"),
                                               "--steps", str(steps)],
        "batch": {"global_batch": 12, "micro_batch": 2}, "resources": {"nodes": 3, "nproc_per_node": 1},
        "restarts": 1, "elastic": {"min_nodes": 2}, "watch": {"grace_period": 2},
    }))
    runs = home / "runs"

    def log(job_id: str, attempt: int) -> str:
        path = runs / job_id / f"attempt{attempt}-node0.log"
        return path.read_text() if path.exists() else ""

    job_id, done = _lose_node_2(home, job, _cluster(tmp_path, testbed), lambda store, job_id: "step 7 " in log(job_id, 0))
    assert done.returncode == 0, done.stderr[-4000:]
    lines = {a: re.findall(r"step (\d+) world (\d+) grad_accum (\d+) global (\d+) samples (\d+)", log(job_id, a))
             for a in (0, 1)}
    assert {(w, ga, g) for _, w, ga, g, _ in lines[0]} == {("3", "2", "12")}
    assert {(w, ga, g) for _, w, ga, g, _ in lines[1]} == {("2", "3", "12")}
    resumed = re.search(r"resumed at step (\d+) after (\d+) samples; attempt 1, previous world size 3", log(job_id, 1))
    assert resumed and int(resumed[2]) == int(resumed[1]) * 12 and int(resumed[1]) % 5 == 0
    step, *_, samples = lines[1][-1]
    assert (int(step), int(samples)) == (steps, steps * 12)


@pytest.mark.parametrize("launcher, strategy", [("torchrun", "ddp"), ("deepspeed", "zero2")])
def test_two_hosts_of_two_and_one_slots_run_three_ranks(testbed: tb.Testbed, tmp_path: Path, home: Path,
                                                         launcher: str, strategy: str) -> None:
    # global 12 = micro 2 x GA 2 x 3 ranks: ranks 0-1 on the 2-slot host, rank 2 on the other
    job = tmp_path / "uneven.yaml"
    job.write_text(json.dumps({
        "name": "uneven", "recipe": "convnet", "launcher": launcher, "strategy": strategy, "max_steps": 3,
        "metrics": {"every": 1}, "env": {"TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR},  # the suite's built op
        "batch": {"global_batch": 12, "micro_batch": 2}, "resources": {"nodes": 2, "nproc_per_node": "auto"},
    }))
    done = subprocess.run([LAUNCH, "submit", str(job), "--cluster", str(_cluster(tmp_path, testbed, (2, 1)))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    job_id = re.search(r"job (\S+): SUCCEEDED", done.stderr)[1]
    assert (_status(job_id)["world_size"], _status(job_id)["grad_accum"]) == (3, 2)
    records = Store(home).metrics(job_id)
    names = [h.name for h in testbed.hosts]
    assert {(r.rank, r.host) for r in records} == {(0, names[0]), (1, names[0]), (2, names[1])}
    assert {r.extra["samples_consumed"] for r in records if r.step == 3} == {3 * 12}
