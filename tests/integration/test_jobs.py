"""The shipped job files: every one validates and plans; the main ones run their CPU smoke line."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from launcher.node import proctree
from tests.helpers import ROOT, TORCH_EXTENSIONS_DIR, cli_env, run_cli, status_json

JOBS = sorted((ROOT / "jobs").glob("*.yaml"))


def smoke_overrides(job: Path) -> list[str]:
    """The ``--set`` arguments of the job file's first line (``# CPU smoke: launch submit ...``)."""
    first = job.read_text().splitlines()[0]
    if not first.startswith("# CPU smoke:"):
        return []
    words = shlex.split(first.split(":", 1)[1])
    return [word for i, word in enumerate(words) if i and words[i - 1] == "--set"]


@pytest.mark.parametrize("job", JOBS, ids=[j.stem for j in JOBS])
def test_every_job_file_validates_and_plans(job, home):
    assert run_cli(home, "validate", str(job)).returncode == 0
    sets = [arg for s in smoke_overrides(job) for arg in ("--set", s)]
    result = run_cli(home, "submit", str(job), *sets, "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["batch"]["global_batch"] == plan["batch"]["micro_batch"] * plan["batch"]["grad_accum"] * plan["world_size"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cifar10_convnet", "bert_large_zero3"])
def test_smoke_runs_succeed_with_metrics(name, tmp_path, home):
    job = ROOT / "jobs" / f"{name}.yaml"
    sets = [arg for s in smoke_overrides(job) for arg in ("--set", s)]
    sets = [s.replace("/tmp/ckpt-bert-large", str(tmp_path / "ckpt")) for s in sets]
    env = cli_env(home, TORCH_EXTENSIONS_DIR=TORCH_EXTENSIONS_DIR)
    result = run_cli(home, "submit", str(job), *sets, env=env, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    job_id = result.stderr.split()[1].rstrip(":")
    obj = status_json(home, job_id)
    assert obj["state"] == "SUCCEEDED"
    metrics = obj["metrics"]
    assert metrics["steps"] == obj["max_steps"]
    assert len(metrics["per_rank"]) == obj["world_size"] and metrics["samples_per_sec"] > 0
    assert metrics["loss"] is not None and math.isfinite(metrics["loss"]) and metrics["loss"] > 0
    assert metrics["peak_mem_mb"] > 0
    assert proctree.job_pids(job_id) == []
