"""The slurm backend end to end: the real CLI, the real Slurm of the `slurm` fixture (2 nodes x 1 CPU, one
partition), real torchrun with gloo. Each job is small: one rank per node, a few short steps."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.store.db import Store
from tests.container_fixture import needs_podman
from tests.helpers import all_held, hold_env, kill_supervisor_and_keeper, rank_results, status_json
from tests.slurm_fixture import (
    JOB_END_STATES,
    job_state,
    slurmd_killed,
    steps,
    wait_for,
)
from tests.testbed_fixture import needs_root
from tools import container_image as ci
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
    once = os.environ.get("TEST_FAIL_ONCE")
    if not once or not os.path.exists(once):
        if once:
            open(once, "w").close()
        sys.exit("this host is broken")
dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print("RESULT " + json.dumps({"rank": rank, "host": socket.gethostname(), "sum": total.item(),
                              "slurm_job": os.environ.get("SLURM_JOB_ID"), "container": os.environ.get("container")}),
      flush=True)
reporter = Reporter(every=1, warmup=0)
for _ in range(int(os.environ.get("TEST_STEPS", "3"))):
    time.sleep(float(os.environ.get("TEST_STEP_S", "0.05")))
    reporter.step(samples=2)
while os.environ.get("TEST_HOLD") and not os.path.exists(os.environ["TEST_HOLD"]):
    time.sleep(0.1)
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
    return status_json(None, job_id)  # this test's LAUNCH_HOME, in process (polled)


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
    results = rank_results(home, job_id)
    assert [r["rank"] for r in results] == [0, 1]
    assert sorted(r["host"] for r in results) == [h.name for h in slurm.nodes]
    assert {r["sum"] for r in results} == {3.0}
    status = _status(job_id)
    assert status["state"] == "SUCCEEDED" and status["backend"] == "slurm"
    assert status["scheduler_id"] == results[0]["slurm_job"] == results[1]["slurm_job"]
    assert {r["host"] for r in status["metrics"]["per_rank"]} == {h.name for h in slurm.nodes}
    assert status["metrics"]["steps"] == 3
    assert [n["host"] for n in status["network"]] == [h.name for h in slurm.nodes]
    assert job_state(slurm, status["scheduler_id"])[0] == "COMPLETED", "the batch script ended the job itself"
    _assert_nothing_left(slurm, [status["scheduler_id"]])


def _running_held_job(tmp_path: Path, cluster: Path, name: str) -> tuple[str, Path]:
    """A detached job, RUNNING, that holds both nodes until its hold file exists: (job id, hold file)."""
    hold = tmp_path / f"{name}.release"
    job_id = _submit_detached(_job(tmp_path, name=name, env={"TEST_HOLD": str(hold)}), cluster)
    wait_for(lambda: _status(job_id)["state"] == "RUNNING", 60, f"the job {name} to run")
    return job_id, hold


def test_a_second_job_waits_queued_behind_the_first_then_runs(slurm: sl.SlurmCluster, tmp_path: Path,
                                                              home: Path) -> None:
    cluster = _cluster(tmp_path, slurm)
    first, release = _running_held_job(tmp_path, cluster, "first")
    second = _submit_detached(_job(tmp_path, name="second"), cluster)
    assert _status(second)["scheduler_id"], "--detach returns once Slurm has the job"
    queued = wait_for(lambda: (s := _status(second))["queue_reason"] in ("Resources", "Priority") and s, 30,
                      "the second job to be queued with Slurm's reason")
    assert queued["state"] == "QUEUED" and queued["scheduler_id"]
    assert job_state(slurm, queued["scheduler_id"])[:2] == ("PENDING", queued["queue_reason"])
    shown = _launch("status", second).stdout
    assert "QUEUED" in shown and queued["queue_reason"] in shown and queued["scheduler_id"] in shown
    release.touch()
    assert _ended(first)["state"] == "SUCCEEDED"
    done = _ended(second)
    assert done["state"] == "SUCCEEDED" and done["queue_reason"] is None
    assert done["scheduler_id"] == queued["scheduler_id"]
    assert sorted(r["host"] for r in rank_results(home, second)) == [h.name for h in slurm.nodes]


def test_ctrl_c_cancels_a_queued_job_and_launch_cancel_a_running_one(slurm: sl.SlurmCluster, tmp_path: Path,
                                                                     home: Path) -> None:
    cluster = _cluster(tmp_path, slurm)
    first, _ = _running_held_job(tmp_path, cluster, "running")
    waiting = subprocess.Popen([LAUNCH, "submit", str(_job(tmp_path, name="queued")), "--cluster", str(cluster)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    store = Store(home)
    queued = wait_for(lambda: next((j for j in store.jobs() if j.name == "queued" and j.state == "QUEUED"), None),
                      30, "the foreground job to be queued")
    waiting.send_signal(signal.SIGINT)
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode != 0
    assert f"job {queued.id}: queued by the scheduler (its job {queued.scheduler_id})" in err
    assert _status(queued.id)["state"] == "CANCELLED"
    assert job_state(slurm, queued.scheduler_id)[0] == "CANCELLED"
    assert not steps(slurm, queued.scheduler_id)

    running = _status(first)
    done = _launch("cancel", first)
    assert done.returncode == 0, done.stderr
    assert _status(first)["state"] == "CANCELLED"
    assert job_state(slurm, running["scheduler_id"])[0] == "CANCELLED"
    _assert_nothing_left(slurm, [running["scheduler_id"], queued.scheduler_id])


def test_a_failing_rank_is_named_with_its_node(slurm: sl.SlurmCluster, tmp_path: Path, home: Path) -> None:
    broken = slurm.nodes[1].name
    job = _job(tmp_path, env={"TEST_FAIL_ON_HOST": broken})
    done = _launch("submit", str(job), "--cluster", str(_cluster(tmp_path, slurm)))
    assert done.returncode == 1, done.stderr
    job_id = re.search(r"job (\S+): FAILED", done.stderr)[1]
    failure = _status(job_id)["first_failure"]
    assert (failure["node"], failure["host"], failure["rank"], failure["exit_code"]) == (1, broken, 1, 1)
    assert any("this host is broken" in line for line in failure["last_lines"])
    _assert_nothing_left(slurm, [_status(job_id)["scheduler_id"]])


def test_a_deepspeed_job_runs_one_launcher_per_node(slurm: sl.SlurmCluster, tmp_path: Path, home: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                                  "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}))
    job = _job(tmp_path, name="deepspeed", launcher="deepspeed",
               entrypoint=["python", str(PROGRAMS / "user_deepspeed.py"), "--out", str(out), "--steps", "2",
                           "--deepspeed", "--deepspeed_config", str(config)],
               env={"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))})
    done = _launch("submit", str(job), "--cluster", str(_cluster(tmp_path, slurm)), timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    seen = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(entry["host"] for entry in seen) == [h.name for h in slurm.nodes]
    assert all(entry["local_rank_arg"] == 0 for entry in seen), "one rank a node: --local_rank 0 on each"


def test_an_elastic_job_whose_node_fails_is_resubmitted_on_the_node_left_with_the_global_batch_exact(
        slurm: sl.SlurmCluster, tmp_path: Path, home: Path) -> None:
    """Issue 22 on Slurm: node 2's slurmd dies (NODE_FAIL), named as the attempt's first failure; the job goes on as a
    new Slurm job of one node, GA 2 -> 4, from its last checkpoint, to exactly max_steps x the global batch."""
    lost = slurm.nodes[1]
    job = tmp_path / "elastic.yaml"
    job.write_text(json.dumps({
        "name": "elastic", "recipe": "convnet", "strategy": "ddp",
        "batch": {"global_batch": 8, "micro_batch": 2}, "resources": {"nodes": 2, "nproc_per_node": 1},
        "max_steps": 16, "restarts": 1, "elastic": {"min_nodes": 1}, "metrics": {"every": 1},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": 5}, "watch": {"grace_period": 2},
        # attempt 0's ranks wait after step 6, so the job cannot end before Slurm calls node 2 failed (about 25 s)
        "env": hold_env(tmp_path / "held", 6),
    }))
    job_id = _submit_detached(job, _cluster(tmp_path, slurm))
    store = Store(home)
    wait_for(lambda: all_held(tmp_path / "held", 2), 240, "both ranks held after step 6")
    with slurmd_killed(slurm, lost):
        ended = _ended(job_id, timeout=slurm.settings.slurmd_timeout_s * 6 + 120)
    assert ended["state"] == "SUCCEEDED", (ended["reason"], ended["events"][-6:])
    failed = [e for e in ended["events"] if e["kind"] == "node_failed"]
    assert len(failed) == 1 and (failed[0]["data"]["node"], failed[0]["data"]["host"]) == (1, lost.name), failed
    assert "NODE_FAIL" in failed[0]["message"] and "Not responding" in failed[0]["message"], failed[0]["message"]
    assert failed[0]["data"]["kind"] == "lost" and failed[0]["data"]["transient"], "a lost node can be restarted"
    shrunk = [e["message"] for e in ended["events"] if e["kind"] == "elastic_restart"]
    assert len(shrunk) == 1 and shrunk[0].startswith(f"attempt 1: 1 nodes ({lost.name} lost"), shrunk
    assert shrunk[0].endswith("grad_accum 2 -> 4, global batch 8 kept"), shrunk
    assert (ended["attempt"], ended["world_size"], ended["grad_accum"], ended["global_batch"]) == (1, 1, 4, 8)
    ids = [e["data"]["scheduler_id"] for e in ended["events"] if e["kind"] == "submitted"]
    assert len(set(ids)) == 2 and job_state(slurm, ids[0])[0] == "NODE_FAIL"
    assert slurm.run(["sacct", "-n", "-X", "-j", ids[1], "-o", "NNodes"], check=False).stdout.split()[:1] in (["1"], [])
    after = [r for r in store.metrics(job_id) if r.attempt == 1]
    final = max(after, key=lambda r: r.step)
    assert {r.rank for r in after} == {0} and {r.extra["grad_accum"] for r in after} == {4}
    assert final.step == 16 and final.extra["samples_consumed"] == 16 * 8
    _assert_nothing_left(slurm, ids)


def test_the_time_limit_warns_the_ranks_then_ends_the_job_as_a_timeout(slurm: sl.SlurmCluster, tmp_path: Path,
                                                                       home: Path) -> None:
    out = tmp_path / "usr1"
    out.mkdir()
    job = _job(tmp_path, name="limited", entrypoint=[PYTHON, str(PROGRAMS / "checkpoint_on_usr1.py")],
               env={"USR1_OUT": str(out)}, steps=1000)
    cluster = _cluster(tmp_path, slurm, time="1", time_warning=50)
    job_id = _submit_detached(job, cluster)
    ended = _ended(job_id, timeout=150)
    failure = ended["first_failure"]
    assert ended["state"] == "FAILED" and failure["kind"] == "timeout", failure
    assert "TimeLimit" in failure["reason"] and "DUE TO TIME LIMIT" in failure["reason"], failure["reason"]
    warned = [json.loads((out / f"usr1-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(entry["host"] for entry in warned) == [h.name for h in slurm.nodes]
    assert ended["metrics"]["steps"] > 20, "torchrun outlived the warning: the ranks kept stepping"
    assert job_state(slurm, ended["scheduler_id"])[0] == "TIMEOUT"
    _assert_nothing_left(slurm, [ended["scheduler_id"]])


def test_a_node_problem_found_inside_the_allocation_fails_the_job_with_the_preflight_report(
        slurm: sl.SlurmCluster, tmp_path: Path, home: Path) -> None:
    cluster = json.loads(_cluster(tmp_path, slurm).read_text())
    cluster["python"] = "/usr/bin/python3"  # the system's Python: no torch
    path = tmp_path / "no-torch.yaml"
    path.write_text(json.dumps(cluster))
    done = _launch("submit", str(_job(tmp_path)), "--cluster", str(path))
    assert done.returncode == 1, done.stderr
    job_id = re.search(r"job (\S+): FAILED", done.stderr)[1]
    status = _status(job_id)
    assert status["first_failure"]["kind"] == "preflight"
    reason = status["reason"]
    assert "preflight failed on 2 check(s); nothing was started" in reason
    for index, host in enumerate(slurm.nodes):
        assert f"node {index} ({host.name}): /usr/bin/python3 cannot import torch" in reason
    assert job_state(slurm, status["scheduler_id"])[0] == "CANCELLED"
    _assert_nothing_left(slurm, [status["scheduler_id"]])


def test_submit_refuses_what_the_partition_can_never_hold_and_submits_nothing(slurm: sl.SlurmCluster, tmp_path: Path,
                                                                              home: Path) -> None:
    before = slurm.run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split()
    too_big = _job(tmp_path, name="too-big")
    spec = json.loads(too_big.read_text())
    spec["resources"]["nodes"] = 3
    too_big.write_text(json.dumps(spec))
    done = _launch("submit", str(too_big), "--cluster", str(_cluster(tmp_path, slurm)))
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert f"resources.nodes: the job asks for 3 nodes; partition '{slurm.partition}' can give at most 2" in done.stderr
    nowhere = _cluster(tmp_path, slurm, partition="nope")
    done = _launch("submit", str(_job(tmp_path)), "--cluster", str(nowhere))
    assert done.returncode == 3 and "slurm.partition: Slurm has no partition 'nope'" in done.stderr
    assert slurm.run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split() == before
    assert Store(home).jobs() == [], "nothing recorded either"
    refused = _cluster(tmp_path, slurm, options=["--mem=100000000"])  # more memory than any node has
    done = _launch("submit", str(_job(tmp_path)), "--cluster", str(refused), "--detach")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "sbatch" in done.stderr and "Memory specification can not be satisfied" in done.stderr, done.stderr


def test_launch_check_probes_the_partitions_nodes_through_srun_and_measures_bandwidth(
        slurm: sl.SlurmCluster, tmp_path: Path, home: Path) -> None:
    done = _launch("check", "--cluster", str(_cluster(tmp_path, slurm)), "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    report = json.loads(done.stdout)
    assert [n["host"] for n in report["nodes"]] == [h.name for h in slurm.nodes]
    assert [n["hostname"] for n in report["nodes"]] == [h.name for h in slurm.nodes], "each probe on its own node"
    assert report["nodes"][1]["reached"] is True and report["nodes"][0]["port_free"] is True
    assert report["bandwidth_gbps"] > 0 and report["problems"] == []
    assert "may wait in Slurm's queue" in done.stderr


def test_a_restart_resubmits_the_job_to_slurm(slurm: sl.SlurmCluster, tmp_path: Path, home: Path) -> None:
    job = _job(tmp_path, name="restarted", restarts=1, restart_on="any",
               env={"TEST_FAIL_ON_HOST": slurm.nodes[0].name, "TEST_FAIL_ONCE": str(tmp_path / "failed-once")})
    done = _launch("submit", str(job), "--cluster", str(_cluster(tmp_path, slurm)))
    assert done.returncode == 0, done.stderr + done.stdout
    job_id = re.search(r"job (\S+): SUCCEEDED", done.stderr)[1]
    status = _status(job_id)
    assert status["attempt"] == 1 and [e["kind"] for e in status["events"]].count("restarting") == 1
    ids = [e["data"]["scheduler_id"] for e in status["events"] if e["kind"] == "submitted"]
    assert len(set(ids)) == 2 and ids[-1] == status["scheduler_id"], status["events"]
    assert job_state(slurm, ids[0])[0] in ("CANCELLED", "FAILED")
    assert sorted(r["host"] for r in rank_results(home, job_id) if r) == sorted(h.name for h in slurm.nodes)
    _assert_nothing_left(slurm, ids)


def test_a_recipe_under_a_deepspeed_strategy_trains_across_the_allocation(slurm: sl.SlurmCluster, tmp_path: Path,
                                                                         home: Path) -> None:
    recipe = Path(__file__).resolve().parents[2] / "jobs" / "cifar10_convnet_zero2.yaml"
    done = _launch("submit", str(recipe), "--cluster", str(_cluster(tmp_path, slurm)), "--set", "resources.nodes=2",
                   "--set", "resources.nproc_per_node=1", "--set", "batch.global_batch=null", "--set",
                   "batch.micro_batch=4", "--set", "max_steps=3", "--set", "metrics.every=1", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    status = _status(re.search(r"job (\S+): SUCCEEDED", done.stderr)[1])
    assert (status["strategy"], status["launcher"], status["world_size"]) == ("zero2", "deepspeed", 2)
    assert status["metrics"]["steps"] == 3 and status["metrics"]["loss"] is not None
    assert {r["host"] for r in status["metrics"]["per_rank"]} == {h.name for h in slurm.nodes}


@needs_podman
def test_every_rank_runs_inside_the_container_on_slurm(slurm: sl.SlurmCluster, tmp_path: Path, home: Path,
                                                       container_image) -> None:
    job = _job(tmp_path, container=container_image.spec(python=PYTHON).model_dump(mode="json"))
    done = _launch("submit", str(job), "--cluster", str(_cluster(tmp_path, slurm)))
    assert done.returncode == 0, done.stderr + done.stdout
    job_id = re.search(r"job (\S+): SUCCEEDED", done.stderr)[1]
    results = rank_results(home, job_id)
    assert sorted((r["rank"], r["host"], r["container"]) for r in results) == [
        (0, slurm.nodes[0].name, "podman"), (1, slurm.nodes[1].name, "podman")]
    assert _status(job_id)["metrics"]["steps"] == 3
    for host in slurm.nodes:
        left = ci.in_host(host, ["podman", "ps", "-a", "--filter", f"label=launch.job={job_id}", "--format", "{{.Names}}"])
        assert left.stdout.split() == [], f"no container is left on {host.name}, running or stopped"


def test_launch_attach_follows_a_slurm_job_whose_supervisor_died(slurm: sl.SlurmCluster, tmp_path: Path,
                                                                  home: Path) -> None:
    """Issue 20: the detached supervisor and its keeper killed mid-run; the Slurm job runs on (its agents write
    to the shared job directory), and `launch attach` follows it to its end from the lines the store has."""
    steps = 80
    job = _job(tmp_path, entrypoint=[PYTHON, str(PROGRAMS / "step_lines.py")], steps=steps,
               env={"STEPS": str(steps), "STEP_S": "0.15"})
    job_id = _submit_detached(job, _cluster(tmp_path, slurm))
    wait_for(lambda: (_status(job_id)["metrics"]["steps"] or 0) >= 3, 120, "the first steps")
    kill_supervisor_and_keeper(_status(job_id)["supervisor"]["pid"])
    wait_for(lambda: _status(job_id)["supervisor"]["state"] == "lost", 30, "the supervisor to be gone")

    attached = _launch("attach", job_id)
    assert attached.returncode == 0, attached.stderr[-3000:]
    done = _status(job_id)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 0
    logs = _launch("logs", job_id, "--rank", "0").stdout
    assert [int(m) for m in re.findall(r"step (\d+) of rank 0", logs)] == list(range(steps))
    by_rank: dict[int, list[int]] = {}
    for record in Store(home).metrics(job_id):
        by_rank.setdefault(record.rank, []).append(record.step)
    assert {rank: sorted(got) for rank, got in by_rank.items()} == {0: list(range(1, steps + 1)), 1: list(range(1, steps + 1))}
    _assert_nothing_left(slurm, [done["scheduler_id"]])
