"""Users' own programs on this machine: real torchrun and DeepSpeed (on two SSH hosts: test_user_programs_ssh.py).

The programs in tests/programs/ are written in other people's conventions (their argparse with
``--local_rank``, their ``init_process_group``, ``deepspeed.initialize`` with a config flag, their
own checkpoints) and never import ``launcher``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from launcher.node import proctree
from tests.helpers import ROOT, TORCH_EXTENSIONS_DIR, cli_env, run_cli, status_json, wait_for, wait_for_state, write_yaml
from tests.memory_cgroup import memory_cgroup as limited_memory_cgroup

pytestmark = pytest.mark.slow
PROGRAMS = ROOT / "tests" / "programs"
LOCAL4 = ROOT / "tests" / "clusters" / "local4.yaml"
PYTHON = sys.executable


def _job(path: Path, program: str, *args: str, nodes: int = 1, nproc: int = 2, **extra) -> Path:
    return write_yaml(path, {"name": "user", "entrypoint": ["python", str(PROGRAMS / program), *args],
                             "resources": {"nodes": nodes, "nproc_per_node": nproc}, **extra})


def _job_id(result) -> str:
    return result.stderr.split()[1].rstrip(":")


def _seen(out: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def _losses(home: Path, job_id: str, rank: int) -> list[float | None]:
    """The loss of each metric record of ``rank``, in step order."""
    rows = csv.DictReader(run_cli(home, "metrics", job_id, "--csv").stdout.splitlines())
    mine = sorted((int(row["step"]), row["loss"]) for row in rows if row["rank"] == str(rank))
    return [float(loss) if loss else None for _, loss in mine]


def test_a_quiet_program_without_the_reporter_is_not_killed_while_it_works(tmp_path, home):
    job = _job(tmp_path / "job.yaml", "quiet.py", watch={"stall_timeout": 8},  # silent past it: 12 s of compute
               env={"QUIET_PRINTS": "3", "QUIET_EVERY": "2", "QUIET_COMPUTE": "12"})
    result = run_cli(home, "submit", str(job), timeout=180)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "SignalException" not in result.stdout + result.stderr
    assert status_json(home, _job_id(result))["state"] == "SUCCEEDED"


def test_a_collective_one_rank_never_joins_is_called_hung_with_every_ranks_stack(tmp_path, home):
    job = _job(tmp_path / "job.yaml", "hang.py", nproc=3, watch={"stall_timeout": 8, "grace_period": 2},
               env={"HANG_ODD_RANK": "2"})
    result = run_cli(home, "submit", str(job), "--cluster", str(LOCAL4), timeout=120)
    assert result.returncode == 1
    obj = status_json(home, _job_id(result))
    assert obj["state"] == "FAILED" and obj["first_failure"]["kind"] == "hang"
    assert "hung before the first step" in obj["reason"]
    assert "rank 2 on node 0 (localhost) stands apart" in obj["reason"]
    stacks = {entry["rank"]: entry["stack"] for entry in obj["stacks"]}
    assert sorted(stacks) == [0, 1, 2]
    assert all("barrier" in stacks[rank] for rank in (0, 1)) and "barrier" not in stacks[2]
    text = run_cli(home, "status", _job_id(result)).stdout
    assert "  ranks 0-1 (node 0 localhost): barrier <- <module> hang.py:13" in text, "the verdict's classes, largest first"
    assert "  rank 2 (node 0 localhost, local rank 2): <module> hang.py:12" in text
    assert "stand apart: rank 2 of 3, on node 0 (localhost)" in text
    assert "Traceback" not in result.stdout, "the agents' teardown tracebacks stay in the node logs"
    assert proctree.job_pids(_job_id(result)) == []


def test_launch_stacks_shows_a_running_jobs_ranks(tmp_path, home):
    job = _job(tmp_path / "job.yaml", "hang.py", nproc=2, watch={"stall_timeout": 300}, env={"HANG_ODD_RANK": "1"})
    job_id = run_cli(home, "submit", str(job), "--detach").stdout.strip()
    try:
        assert wait_for_state(home, job_id, ("RUNNING",))["state"] == "RUNNING"
        assert wait_for(lambda: "rank 1 ready" in run_cli(home, "logs", job_id).stdout, timeout=60)
        shown = run_cli(home, "stacks", job_id, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert "rank 0 (node 0 localhost)" in shown.stdout and "rank 1 (node 0 localhost)" in shown.stdout
        assert "barrier" in shown.stdout
        assert [e["rank"] for e in status_json(home, job_id)["stacks"]] == [0, 1]
    finally:
        assert run_cli(home, "cancel", job_id).returncode == 0
    assert proctree.job_pids(job_id) == []


def test_an_entrypoint_sees_the_batch_and_the_deepspeed_config_and_its_local_rank(tmp_path, home):
    out = tmp_path / "out"
    out.mkdir()
    zero2 = tmp_path / "zero2.json"
    zero2.write_text(json.dumps({"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}))
    job = _job(tmp_path / "job.yaml", "user_deepspeed.py", "--out", str(out), "--steps", "4",
               launcher="deepspeed", batch={"global_batch": 16, "micro_batch": 4}, precision="fp32",
               deepspeed={"config": str(zero2)}, metrics={"every": 1})
    result = run_cli(home, "submit", str(job), timeout=240, env=cli_env(home, TORCH_EXTENSIONS_DIR=TORCH_EXTENSIONS_DIR))
    assert result.returncode == 0, result.stderr + result.stdout
    metrics = status_json(home, _job_id(result))["metrics"]
    assert metrics["steps"] == 2, "4 engine steps, 2 micro-batches a step: 2 optimizer steps, observed by launch's hooks"
    assert [(r["rank"], r["steps"]) for r in metrics["per_rank"]] == [(0, 2), (1, 2)]
    assert metrics["samples_per_sec"] > 0 and metrics["step_time_ms_p50"] > 0, "samples from the spec's batch: 8 a rank"
    logs = run_cli(home, "logs", _job_id(result)).stdout
    assert "[0/0] train: 4/4" in logs and "\\x0d" not in logs and "\r" not in logs, "a tqdm bar's last state, as a terminal shows it"
    printed = [float(loss) for loss in re.findall(r"^\[0/0\] .*?step \d+ loss ([\d.]+)$", logs, flags=re.M)]
    assert _losses(home, _job_id(result), rank=0) == pytest.approx([sum(printed[0:2]) / 2, sum(printed[2:4]) / 2], abs=1e-3), \
        "engine.backward divides by the accumulation (2): each step's loss is the mean of its 2 micro-batches' losses " \
        "(rank 0 draws a tqdm bar: its records still arrive)"
    seen = _seen(out)
    assert sorted(seen) == [0, 1]
    for rank, entry in seen.items():
        assert entry["local_rank_arg"] == int(entry["LOCAL_RANK"]) == rank, "the deepspeed command's --local_rank"
        assert (entry["train_batch_size"], entry["micro_batch"]) == (16, 4)
        config = entry["launch_ds_config"]
        assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (16, 4, 2)
        assert config["zero_optimization"]["stage"] == 2

    zero3 = tmp_path / "zero3.json"  # the same program on ZeRO-3's engine, unchanged: the hooks see its steps too
    zero3.write_text(json.dumps({"zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}))
    z3_out = tmp_path / "out-zero3"
    z3_out.mkdir()
    job = _job(tmp_path / "zero3.yaml", "user_deepspeed.py", "--out", str(z3_out), "--steps", "4", launcher="deepspeed",
               batch={"global_batch": 16, "micro_batch": 4}, deepspeed={"config": str(zero3)}, metrics={"every": 1})
    result = run_cli(home, "submit", str(job), timeout=240, env=cli_env(home, TORCH_EXTENSIONS_DIR=TORCH_EXTENSIONS_DIR))
    assert result.returncode == 0, result.stderr + result.stdout
    obj = status_json(home, _job_id(result))
    assert [(r["rank"], r["steps"]) for r in obj["metrics"]["per_rank"]] == [(0, 2), (1, 2)], "ZeRO-3's optimizer steps"
    assert obj["metrics"]["step_time_ms_p50"] > 0 and obj["metrics"]["peak_mem_mb"] > 50
    assert all(loss is not None and loss > 0 for loss in _losses(home, _job_id(result), rank=1)), "ZeRO-3's too"
    assert obj["precision"] is None, "the spec named none: the program's (its DeepSpeed config may say bf16)"
    assert all(entry["launch_ds_config"]["zero_optimization"]["stage"] == 3 for entry in _seen(z3_out).values())

    torchrun_out = tmp_path / "out-ddp"
    torchrun_out.mkdir()
    job = _job(tmp_path / "ddp.yaml", "user_ddp.py", "--out", str(torchrun_out), "--epochs", "20", "--hold-mb", "300",
               "--save-dir", str(tmp_path / "ckpt"), batch={"micro_batch": 8, "grad_accum": 2})
    result = run_cli(home, "submit", str(job), timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    for rank, entry in _seen(torchrun_out).items():
        assert entry["batch_env"] == {"LAUNCH_GLOBAL_BATCH": "32", "LAUNCH_MICRO_BATCH": "8", "LAUNCH_GRAD_ACCUM": "2"}
        assert entry["local_rank_arg"] == rank and entry["launcher_imported"] is False
    assert (tmp_path / "ckpt" / "checkpoint.pth").exists()
    metrics = status_json(home, _job_id(result))["metrics"]
    assert sorted(r["rank"] for r in metrics["per_rank"]) == [0, 1], "ranks measured from outside, without the Reporter"
    assert all(r["peak_mem_mb"] >= 300 for r in metrics["per_rank"]) and metrics["peak_mem_mb"] >= 300
    assert metrics["steps"] == 20, "its optimizer steps, observed by launch's step hooks"
    assert metrics["samples_per_sec"] > 0, "no DataLoader: the spec's batch (32 a step, 16 a rank)"


def test_no_local_rank_is_honoured(tmp_path, home):
    out = tmp_path / "out"
    out.mkdir()
    job = _job(tmp_path / "job.yaml", "user_deepspeed.py", "--out", str(out), "--steps", "1", nproc=1,
               launcher="deepspeed", batch={"micro_batch": 2}, deepspeed={"no_local_rank": True})
    result = run_cli(home, "submit", str(job), timeout=240, env=cli_env(home, TORCH_EXTENSIONS_DIR=TORCH_EXTENSIONS_DIR))
    assert result.returncode == 0, result.stderr + result.stdout
    assert _seen(out)[0]["local_rank_arg"] == -1


def test_a_build_lock_a_killed_build_left_refuses_a_deepspeed_job_before_it_starts(tmp_path, home):
    # Without this, every rank waits on the file for ever in torch's FileBaton.wait (pytorch/pytorch#189245).
    cache = tmp_path / "torch_extensions"
    lock = cache / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (time.time() - 3 * 3600,) * 2)
    out = tmp_path / "out"
    out.mkdir()
    job = _job(tmp_path / "job.yaml", "user_deepspeed.py", "--out", str(out), "--steps", "1", nproc=1,
               launcher="deepspeed", batch={"micro_batch": 2}, env={"TORCH_EXTENSIONS_DIR": str(cache)})
    result = run_cli(home, "submit", str(job))
    assert result.returncode == 3, result.stderr + result.stdout
    assert "preflight failed" in result.stderr and "nothing was started" in result.stderr
    assert f"localhost: torch's build lock {lock} is 3.0 h old" in result.stderr
    assert "--skip-check" not in result.stderr, "skipping the version checks would not help"
    assert "Traceback" not in result.stderr
    assert list(out.iterdir()) == [], "no rank ran"


def test_the_readmes_bert_large_job_is_refused_on_this_machine_with_a_command_that_fits(home):
    result = run_cli(home, "submit", "jobs/bert_large_zero3.yaml")
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "does not fit this machine" in err and "16 processes on this machine" in err
    assert "GiB of host memory needed" in err and "nothing was started" in err
    assert "Traceback" not in err
    assert "bert" not in run_cli(home, "status").stdout, "nothing recorded"
    fix = err.split("this fits: ", 1)[1].strip().split()
    planned = run_cli(home, "submit", "jobs/bert_large_zero3.yaml", *fix, "--dry-run")
    assert planned.returncode == 0, planned.stderr


@pytest.fixture
def memory_cgroup():
    """A memory cgroup limited to 64 MB (cgroup v1 or v2; needs root), removed after the test."""
    with limited_memory_cgroup("launch-test-ds", 64 * 1024 * 1024) as path:
        yield path


def test_an_oom_kill_under_the_deepspeed_launcher_is_named_and_not_restarted(tmp_path, home, memory_cgroup):
    job = write_yaml(tmp_path / "job.yaml", {
        "name": "oom", "entrypoint": ["python", str(PROGRAMS / "rank_probe.py")], "launcher": "deepspeed",
        "resources": {"nodes": 1, "nproc_per_node": 2}, "restarts": 1,
        "env": {"PROBE_FAIL_RANK": "1", "PROBE_FAIL_AT_STEP": "1", "PROBE_OOM_CGROUP": memory_cgroup,
                "PROBE_STEPS": "50", "PROBE_STEP_S": "1"},
    })
    result = run_cli(home, "submit", str(job), timeout=240, env=cli_env(home, TORCH_EXTENSIONS_DIR=TORCH_EXTENSIONS_DIR))
    assert result.returncode == 1
    obj = status_json(home, _job_id(result))
    failure = obj["first_failure"]
    assert failure["kind"] == "oom" and failure["reason"].startswith("killed by the kernel's OOM killer"), failure
    assert failure["rank"] == 1
    assert obj["attempt"] == 0 and "not restarted: this failure would repeat" in obj["reason"]
    assert [e["kind"] for e in obj["events"]].count("restarting") == 0
