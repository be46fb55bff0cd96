"""A co-tenant's module in a shared project directory or workdir (issue 39, item 4): launch's own interpreters (the
keeper and the detached supervisor, started in the caller's cwd; the DeepSpeed config check; the node agent and
torchrun, started in the workdir; the recipe's ranks) never import it, while the user's own program still imports its
neighbours, as Python always lets a script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.run import orchestrate
from tests.helpers import cli_env, status_json, wait_for_state, write_yaml

pytestmark = pytest.mark.slow

# What a co-tenant plants: it says where it ran, then breaks the process that imported it.
PLANTED = "import os, sys\nwith open({log!r}, 'a') as f:\n    f.write(__name__ + ' ' + ' '.join(sys.argv[:3]) + '\\n')\n" \
          "raise SystemExit('planted module ' + __name__)\n"


def _plant(folder: Path, log: Path) -> None:
    text = PLANTED.format(log=str(log))
    (folder / "launcher").mkdir(parents=True)
    (folder / "launcher" / "__init__.py").write_text(text)
    for name in ("json", "torch"):
        (folder / f"{name}.py").write_text(text)


def _launch(home: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`launch ARGS` as its console script starts it (its bin directory, not the cwd, first on sys.path)."""
    return subprocess.run([sys.executable, "-P", "-m", "launcher", *args], capture_output=True, text=True,
                          env=cli_env(home), cwd=cwd, timeout=timeout)


def test_no_interpreter_of_launch_imports_a_module_planted_in_the_cwd_or_workdir(tmp_path, home):
    shared, log = tmp_path / "shared", tmp_path / "planted.log"
    _plant(shared, log)
    program = tmp_path / "program"
    program.mkdir()
    (program / "helper.py").write_text("WORD = 'the program imported its own helper'\n")
    (program / "train.py").write_text("import helper\nprint(helper.WORD)\n")
    cluster = write_yaml(tmp_path / "cluster.yaml", {"name": "here", "backend": "local", "python": sys.executable,
                                                     "workdir": str(shared)})
    jobs = {
        "program": write_yaml(tmp_path / "program.yaml", {"name": "program", "entrypoint": ["python", str(program / "train.py")],
                                                            "resources": {"nodes": 1, "nproc_per_node": 1}}),
        "recipe": write_yaml(tmp_path / "recipe.yaml", {"name": "recipe", "recipe": "convnet", "max_steps": 2,
                                                          "batch": {"micro_batch": 4},
                                                          "resources": {"nodes": 1, "nproc_per_node": 1}}),
    }
    ids = {}
    for name, job in jobs.items():
        started = _launch(home, shared, "submit", str(job), "--cluster", str(cluster), "--detach")
        assert started.returncode == 0, started.stderr[-2000:]
        ids[name] = started.stdout.split()[-1]
    for name, job_id in ids.items():
        assert wait_for_state(home, job_id, ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=240)["state"] == "SUCCEEDED", \
            (name, status_json(home, job_id)["reason"], (home / "runs" / job_id / "supervisor.log").read_text()[-2000:])
    assert not log.exists(), f"a planted module ran: {log.read_text()}"
    logs = "".join(path.read_text() for path in (home / "runs" / ids["program"]).glob("attempt*-node*.log"))
    assert "the program imported its own helper" in logs


def test_deepspeeds_config_check_does_not_import_a_module_planted_in_the_cwd(tmp_path, monkeypatch):
    log = tmp_path / "planted.log"
    _plant(tmp_path / "shared", log)
    monkeypatch.chdir(tmp_path / "shared")
    check = orchestrate._start_ds_validation({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                                              "zero_optimization": {"stage": 2}})
    assert check is not None, "deepspeed is installed with launch[train]"
    assert orchestrate._ds_problems(check) == []
    assert not log.exists(), f"a planted module ran: {log.read_text()}"
