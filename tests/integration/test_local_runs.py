"""Real torchrun agents on the local backend (gloo on CPU), driven through the CLI."""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from launcher.node import proctree
from launcher.store.states import is_terminal
from tests.helpers import (
    HOSTILE,
    cli_env,
    launch_argv,
    probe_job,
    run_cli,
    status_json,
    wait_for,
    wait_for_state,
    write_yaml,
)
from tests.memory_cgroup import memory_cgroup as limited_memory_cgroup

pytestmark = pytest.mark.slow



LOCAL4 = Path(__file__).resolve().parent.parent / "clusters" / "local4.yaml"


def _ranks(out_dir):
    return {int(p.stem[4:]): json.loads(p.read_text(encoding="utf-8")) for p in out_dir.glob("rank*.json")}


def test_two_nodes_two_procs_rendezvous_and_report(tmp_path, home):
    out = tmp_path / "out"
    out.mkdir()
    job = probe_job(tmp_path / "job.yaml", nodes=2, nproc=2, env={"PROBE_OUT": str(out), "PROBE_STEPS": "6"})
    result = run_cli(home, "submit", str(job), "--cluster", str(LOCAL4))
    assert result.returncode == 0, result.stderr + result.stdout

    ranks = _ranks(out)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, seen in ranks.items():
        ident = seen["identity"]
        assert ident["RANK"] == str(rank) and ident["WORLD_SIZE"] == "4" and ident["LOCAL_WORLD_SIZE"] == "2"
        assert ident["MASTER_ADDR"] == "127.0.0.1"
        assert seen["all_reduce"] == 0 + 1 + 2 + 3
    by_node = {}
    for seen in ranks.values():
        by_node.setdefault(seen["identity"]["LAUNCH_NODE"], []).append(seen["identity"]["LOCAL_RANK"])
    assert {node: sorted(local) for node, local in by_node.items()} == {"0": ["0", "1"], "1": ["0", "1"]}

    job_id = result.stderr.split()[1].rstrip(":")
    obj = status_json(home, job_id)
    assert obj["state"] == "SUCCEEDED"
    assert obj["world_size"] == 4 and obj["grad_accum"] == 1
    metrics = obj["metrics"]
    assert sorted(r["rank"] for r in metrics["per_rank"]) == [0, 1, 2, 3]
    assert {r["node"] for r in metrics["per_rank"]} == {0, 1}
    assert all(r["host"] and r["samples_per_sec"] > 0 and r["peak_mem_mb"] > 10 for r in metrics["per_rank"])
    assert metrics["samples_per_sec"] > 0 and metrics["step_time_ms_p50"] >= 50
    assert metrics["peak_mem_mb"] == max(r["peak_mem_mb"] for r in metrics["per_rank"])

    lines = [line for line in result.stdout.splitlines() if "ready, all_reduce" in line]
    assert sorted(line.split("]")[0] for line in lines) == ["[0/0", "[0/1", "[1/2", "[1/3"], lines
    logs = run_cli(home, "logs", job_id, "--rank", "3").stdout.splitlines()
    assert logs and all(line.startswith("[") and "/3] " in line for line in logs)
    assert any("rank 3 of 4 ready" in line for line in logs)
    assert proctree.job_pids(job_id) == []


def test_a_failing_rank_fails_the_job_and_names_it(tmp_path, home):
    job = probe_job(tmp_path / "job.yaml", nodes=2, nproc=2, env={"PROBE_FAIL_RANK": "3", "PROBE_STEPS": "200"})
    result = run_cli(home, "submit", str(job), "--cluster", str(LOCAL4))
    assert result.returncode == 1
    job_id = result.stderr.split()[1].rstrip(":")
    obj = status_json(home, job_id)
    assert obj["state"] == "FAILED"
    failure = obj["first_failure"]
    assert failure["rank"] == 3 and failure["exit_code"] == 1
    assert failure["node"] in (0, 1)
    node_exits = {n["node"]: n["exit_code"] for n in obj["nodes"]}
    assert node_exits[failure["node"]] != 0
    assert any("failing on purpose" in line for line in failure["last_lines"])
    text = run_cli(home, "status", job_id).stdout
    assert "first failure: node" in text and "rank 3" in text and "exit code 1" in text
    assert proctree.job_pids(job_id) == []

    # the fix, one command away: the same job again with one value changed, as a new job
    again = run_cli(home, "resubmit", job_id[:-2], "--set", "env.PROBE_FAIL_RANK=none", "--set", "env.PROBE_STEPS='4'")
    assert again.returncode == 0, again.stderr + again.stdout
    assert f"on local4, again as {job_id} was" in again.stderr
    new_id = again.stderr.split()[1].rstrip(":")
    fixed = status_json(home, new_id)
    assert new_id != job_id and fixed["state"] == "SUCCEEDED" and fixed["resubmit_of"] == job_id
    assert fixed["spec"]["env"] == {"PROBE_FAIL_RANK": "none", "PROBE_STEPS": "4"}
    assert fixed["overrides"] == ["env.PROBE_FAIL_RANK=none", "env.PROBE_STEPS='4'"]
    assert fixed["world_size"] == 4 and fixed["cluster"] == "local4" and fixed["metrics"]["steps"] == 4
    assert obj["spec"]["env"] == {"PROBE_FAIL_RANK": "3", "PROBE_STEPS": "200"} and obj["overrides"] == []
    assert obj["spec"]["entrypoint"] == fixed["spec"]["entrypoint"] and obj["resubmit_of"] is None
    assert f"submitted: again as {job_id} was (launch resubmit), --set env.PROBE_FAIL_RANK=none" in \
        run_cli(home, "status", new_id).stdout
    refused = run_cli(home, "resubmit", job_id, "--set", "resources.nodes=zero")
    assert refused.returncode == 2 and "--set resources.nodes=zero: resources.nodes" in refused.stderr


def test_a_ranks_recorded_error_is_read_from_torchruns_error_file_before_its_text(tmp_path, home):
    """A rank whose own lines do not say why it failed (its stderr closed): with ``@record``, torchrun's structured
    error file names its exception and the failure is classified from it; without, torchrun's text names the rank
    and its exit, and nothing says why."""
    program = str(Path(__file__).resolve().parent.parent / "programs" / "recorded_error.py")
    failures = {}
    for recorded in ("1", "0"):
        job = write_yaml(tmp_path / f"job{recorded}.yaml", {
            "name": "recorded", "entrypoint": ["python", program], "resources": {"nodes": 1, "nproc_per_node": 2},
            "env": {"RECORD": recorded}, "metrics": {"auto": False}})
        result = run_cli(home, "submit", str(job), "--cluster", str(LOCAL4))
        assert result.returncode == 1, result.stderr + result.stdout
        failures[recorded] = status_json(home, result.stderr.split()[1].rstrip(":"))["first_failure"]
    assert {k: (f["rank"], f["exit_code"]) for k, f in failures.items()} == {"1": (1, 1), "0": (1, 1)}
    assert failures["1"]["reason"].startswith("CUDA out of memory: lower micro_batch"), failures["1"]
    assert failures["0"]["reason"] == "it failed before the first step (an error that will repeat on a restart)"
    assert [line for line in failures["1"]["last_lines"] if "/1]" in line] == ["[0/1] loading the data"]


def test_cancel_ends_exactly_that_job(tmp_path, home, hook):
    slow = {"PROBE_STEPS": "2000", "PROBE_STEP_S": "0.05"}
    victim = probe_job(tmp_path / "victim.yaml", name="victim", nodes=2, nproc=1, env=slow,
                       notify={"on": ["cancelled"], "webhooks": [hook.url]})
    bystander = probe_job(tmp_path / "bystander.yaml", name="bystander", nodes=1, nproc=1, env=slow)
    cluster = str(write_yaml(tmp_path / "cluster.yaml", {"name": "three-slots", "backend": "local", "local": {"slots": 3}}))
    detached = run_cli(home, "submit", str(victim), "--detach", "--cluster", cluster)
    victim_id = detached.stdout.strip()  # the id alone on stdout (scripts take it), how to watch it on stderr
    assert f"watch it: launch status {victim_id} --watch" in detached.stderr
    assert f"launch logs {victim_id} --follow" in detached.stderr and f"launch cancel {victim_id}" in detached.stderr
    bystander_id = run_cli(home, "submit", str(bystander), "--detach", "--cluster", cluster).stdout.strip()
    try:
        assert wait_for_state(home, victim_id, ("RUNNING",))["state"] == "RUNNING"
        assert wait_for(lambda: status_json(home, victim_id)["metrics"]["steps"] >= 2, timeout=60)
        victim_pids = proctree.job_pids(victim_id)
        bystander_pids = proctree.job_pids(bystander_id)
        assert len(victim_pids) >= 4 and bystander_pids

        result = run_cli(home, "cancel", victim_id)
        assert result.returncode == 0, result.stderr
        assert f"job {victim_id}: CANCELLED" in result.stdout
        assert status_json(home, victim_id)["state"] == "CANCELLED"
        [(_, told)] = hook.posts  # who cancelled, and how far the job got
        assert told["state"] == "CANCELLED" and told["cancelled_by"] == f"{getpass.getuser()}@{socket.gethostname()}"
        assert told["reason"] == f"cancelled by {told['cancelled_by']} (launch cancel)" and told["steps"] >= 2, told
        assert proctree.job_pids(victim_id) == []
        assert all(_alive(p) for p in bystander_pids), "bystander was touched"
        assert status_json(home, bystander_id)["state"] == "RUNNING"
    finally:
        run_cli(home, "cancel", bystander_id)
    assert proctree.job_pids(bystander_id) == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat"):
            return True
    except OSError:
        return False


def test_ctrl_c_of_a_foreground_submit_cancels_everything(tmp_path, home):
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2, env={"PROBE_STEPS": "2000"})
    proc = subprocess.Popen(launch_argv("submit", str(job)), env=cli_env(home), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)  # no terminal: no question
    try:
        first = proc.stderr.readline()
        job_id = first.split()[1].rstrip(":")
        assert wait_for(lambda: status_json(home, job_id)["metrics"]["steps"] >= 2, timeout=60)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
    obj = status_json(home, job_id)
    assert obj["state"] == "CANCELLED" and "Ctrl-C" in obj["reason"]
    assert proctree.job_pids(job_id) == []


def test_hostile_argv_and_env_reach_the_ranks_verbatim(tmp_path, home):
    out = tmp_path / "out"
    out.mkdir()
    env = {f"HOSTILE_{i}": value for i, value in enumerate(HOSTILE)}
    env.update({"PROBE_OUT": str(out), "PROBE_ENV_KEYS": ",".join(env), "PROBE_STEPS": "1"})
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2, args=HOSTILE, env=env)
    result = run_cli(home, "submit", str(job))
    assert result.returncode == 0, result.stderr
    for seen in _ranks(out).values():
        assert seen["argv"] == HOSTILE
        assert [seen["env"][f"HOSTILE_{i}"] for i in range(len(HOSTILE))] == HOSTILE


def test_a_users_env_value_auto_reaches_the_ranks(tmp_path, home):
    """``auto`` is the user's value like any other: not one that waits for a probe (preflight once refused it)."""
    out = tmp_path / "out"
    out.mkdir()
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2,
                    env={"MY_MODE": "auto", "PROBE_OUT": str(out), "PROBE_ENV_KEYS": "MY_MODE", "PROBE_STEPS": "1"})
    result = run_cli(home, "submit", str(job))
    assert result.returncode == 0, result.stderr
    assert [seen["env"]["MY_MODE"] for seen in _ranks(out).values()] == ["auto", "auto"]


def test_secrets_reach_ranks_but_no_output_of_launch(tmp_path, home):
    out = tmp_path / "out"
    out.mkdir()
    secret = "s3cr3t-value-1234"
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=1, secrets=["MY_TOKEN"],
                    env={"PROBE_OUT": str(out), "PROBE_ENV_KEYS": "MY_TOKEN", "PROBE_STEPS": "1"},
                    args=["--echo"])
    missing = run_cli(home, "submit", str(job))
    assert missing.returncode == 2 and "MY_TOKEN not set in your environment" in missing.stderr
    env = cli_env(home, MY_TOKEN=secret)
    dry = subprocess.run(launch_argv("submit", str(job), "--dry-run"), env=env, capture_output=True, text=True)
    assert "MY_TOKEN=****" in dry.stdout and secret not in dry.stdout
    result = subprocess.run(launch_argv("submit", str(job)), env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert _ranks(out)[0]["env"]["MY_TOKEN"] == secret
    job_id = result.stderr.split()[1].rstrip(":")
    status = run_cli(home, "status", job_id, "--json").stdout + run_cli(home, "status", job_id).stdout
    everything = status + result.stdout + result.stderr + (home / "jobs.db").read_bytes().decode("latin-1")
    everything += "".join(p.read_text() for p in (home / "runs").rglob("*.log"))
    assert secret not in everything


def test_restart_resumes_and_ends_at_exactly_max_steps(tmp_path, home):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    env = {"PROBE_FAIL_RANK": "1", "PROBE_FAIL_AT_STEP": "4", "PROBE_CKPT": str(ckpt), "PROBE_STEPS": "8",
           "PROBE_EVERY": "1"}
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2, env=env, restarts=1)
    result = run_cli(home, "submit", str(job))
    assert result.returncode == 0, result.stderr + result.stdout
    assert "resumed from step 4" in result.stdout
    job_id = result.stderr.split()[1].rstrip(":")
    obj = status_json(home, job_id)
    assert obj["state"] == "SUCCEEDED" and obj["attempt"] == 1
    assert obj["metrics"]["steps"] == 8
    assert sorted({(n["attempt"], n["exit_code"]) for n in obj["nodes"]}) == [(0, 1), (1, 0)]
    text = run_cli(home, "status", job_id).stdout
    assert "restarting" in text and "restart 1 of 1" in text


def test_a_stopped_rank_is_detected_as_hung(tmp_path, home):
    env = {"PROBE_STEPS": "100000", "PROBE_STEP_S": "0.02", "PROBE_EVERY": "5"}
    # stall_timeout: until the first rank exists only torchrun runs, importing torch, and its CPU time is not
    # counted as the job's activity (only the ranks' is): 8 s was once too short for that import on a loaded CI box
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2, env=env, watch={"stall_timeout": 15, "grace_period": 2})
    job_id = run_cli(home, "submit", str(job), "--detach").stdout.strip()

    def ten_steps_or_ended() -> dict | None:
        obj = status_json(home, job_id)
        return obj if obj["metrics"]["steps"] >= 10 or is_terminal(obj["state"]) else None

    running = wait_for(ten_steps_or_ended, timeout=60)
    assert running is not None, "fewer than 10 steps after 60 s"
    assert running["state"] == "RUNNING", (running["state"], running["reason"])
    ranks = [p for p in proctree.job_pids(job_id) if "rank_probe" in open(f"/proc/{p}/cmdline").read()
             and "torch.distributed.run" not in open(f"/proc/{p}/cmdline").read()]
    assert ranks
    stopped = max(ranks)
    os.kill(stopped, signal.SIGSTOP)
    obj = wait_for_state(home, job_id, ("FAILED", "SUCCEEDED", "CANCELLED"), timeout=60)
    assert obj["state"] == "FAILED", obj
    # The stopped rank is silent and idle, and its peer waits idle in a collective: hung, the steps stopped.
    assert re.match(r"(hung|stalled) at step \d+ on node 0/rank [01]", obj["reason"]), obj["reason"]
    assert proctree.job_pids(job_id) == []


def test_ten_concurrent_detached_submits_all_land(tmp_path, home):
    """Ten at once on ten slots (more than this machine's: the store's concurrency is tested, not leases)."""
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=1, env={"PROBE_STEPS": "1"})
    cluster = str(write_yaml(tmp_path / "cluster.yaml", {"name": "ten-slots", "backend": "local", "local": {"slots": 10}}))
    procs = [subprocess.Popen(launch_argv("submit", str(job), "--detach", "--cluster", cluster),
                              env=cli_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(10)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    ids = {out.strip() for out, _ in outs}
    assert len(ids) == 10
    finished = wait_for(lambda: all(status_json(home, i)["state"] in ("SUCCEEDED", "FAILED") for i in ids), timeout=240,
                        interval=2)
    listing = json.loads(run_cli(home, "status", "--json", "--limit", "0").stdout)
    assert {o["id"] for o in listing} == ids
    assert finished, [o["state"] for o in listing]
    assert all(o["state"] == "SUCCEEDED" for o in listing), [(o["id"], o["reason"]) for o in listing]


@pytest.fixture
def memory_cgroup():
    """A memory cgroup limited to 64 MB (cgroup v1 or v2; needs root), removed after the test."""
    with limited_memory_cgroup("launch-test", 64 * 1024 * 1024) as path:
        yield path


def test_an_oom_killed_rank_is_explained_from_the_kernel_log(tmp_path, home, memory_cgroup):
    env = {"PROBE_FAIL_RANK": "1", "PROBE_FAIL_AT_STEP": "1", "PROBE_OOM_CGROUP": memory_cgroup, "PROBE_STEPS": "50"}
    job = probe_job(tmp_path / "job.yaml", nodes=1, nproc=2, env=env)
    result = run_cli(home, "submit", str(job))
    assert result.returncode == 1
    job_id = result.stderr.split()[1].rstrip(":")
    failure = status_json(home, job_id)["first_failure"]
    assert failure["rank"] == 1 and failure["exit_code"] == -9 and failure["signal"] == "SIGKILL"
    assert failure["reason"].startswith("killed by the kernel's OOM killer"), failure["reason"]
    assert str(failure["pid"]) in failure["reason"]
    assert "OOM killer" in run_cli(home, "status", job_id).stdout


def test_a_supervisor_stopped_while_the_job_ends_takes_in_every_line_after(tmp_path, home):
    """Issue 34: the detached supervisor and its keeper SIGSTOPped while the program prints more than a pipe holds
    and exits, and its node agent, its stdout full and unread, gives up on it and exits too: back, the supervisor
    reads the rest from the node's journal. The job SUCCEEDS with every line once, in order, and says it was away."""
    lines, gate = 3000, tmp_path / "go"
    program = Path(__file__).resolve().parent.parent / "programs" / "gated_burst.py"
    job = write_yaml(tmp_path / "job.yaml", {
        "name": "burst", "entrypoint": ["python", str(program)], "resources": {"nodes": 1, "nproc_per_node": 1},
        "env": {"GATE_FILE": str(gate), "LINES": str(lines)}})
    job_id = run_cli(home, "submit", str(job), "--detach").stdout.strip()
    running = wait_for(lambda: (obj := status_json(home, job_id))["state"] == "RUNNING" and obj["supervisor"]["pid"]
                       and obj, timeout=60)
    assert running, status_json(home, job_id)
    supervisor = running["supervisor"]["pid"]
    keeper = int(Path(f"/proc/{supervisor}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(keeper, signal.SIGSTOP)
    os.kill(supervisor, signal.SIGSTOP)
    try:
        gate.touch()
        # the program, torchrun and the node agent (once its stdout took nothing for 10 s) all exit unread
        assert wait_for(lambda: proctree.job_pids(job_id) == [], timeout=90), proctree.job_pids(job_id)
    finally:
        os.kill(supervisor, signal.SIGCONT)
        os.kill(keeper, signal.SIGCONT)
    done = wait_for_state(home, job_id, ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=60)
    assert done["state"] == "SUCCEEDED", done["reason"]
    shown = [int(m) for m in re.findall(r"burst line (\d+) x", run_cli(home, "logs", job_id).stdout)]
    assert shown == list(range(lines)), (len(shown), shown[:3], shown[-3:])
    said = run_cli(home, "status", job_id).stdout
    assert re.search(r"supervisor_away +supervisor was away \d+ s; caught up", said), said
