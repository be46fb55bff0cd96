"""The cluster's interpreter replaces an entrypoint's program only when that program is exactly `python` or `python3`.

The rule of ``launcher.plan.commands.program_args``: only ``python`` and ``python3`` become the cluster's interpreter; anything
else, `pythonic-tool` or an explicit `/opt/py38/bin/python3.8`, runs as written under `--no-python`.
"""

from __future__ import annotations

import json

import pytest

from launcher.cli.main import main
from launcher.plan.batch import BatchPlan
from launcher.plan.commands import program_args
from launcher.spec import JobSpec
from tests.helpers import write_yaml

BATCH = BatchPlan(micro_batch=8, grad_accum=1, global_batch=8, world_size=1)


def _job(entrypoint: list[str]) -> JobSpec:
    return JobSpec(name="x", entrypoint=entrypoint, batch={"micro_batch": 8})


@pytest.mark.parametrize("program", ["python", "python3"])
def test_python_and_python3_become_the_clusters_interpreter(program):
    assert program_args(_job([program, "train.py", "--lr", "1"]), BATCH, None) == (True, ["train.py", "--lr", "1"])


def test_python_dash_u_is_dropped_the_script_and_its_own_flags_kept():
    assert program_args(_job(["python", "-u", "train.py", "-u"]), BATCH, None) == (True, ["train.py", "-u"])
    assert program_args(_job(["python3", "-u", "-m", "pkg.train", "-u"]), BATCH, None) == (True, ["-m", "pkg.train", "-u"])


@pytest.mark.parametrize("entrypoint", [
    ["pythonic-tool", "--flag"],
    ["/opt/py38/bin/python3.8", "train.py"],
    ["/usr/bin/python3", "train.py"],
    ["python3.11", "train.py"],
    ["python-config", "--ldflags"],
    ["./python", "x"],
    ["torchrun-wrapper.sh", "train.py"],
])
def test_any_other_program_runs_as_written(entrypoint):
    assert program_args(_job(entrypoint), BATCH, None) == (False, entrypoint)


def test_the_planned_command_runs_a_program_named_like_python_itself(tmp_path, home, capsys):
    job = write_yaml(tmp_path / "job.yaml", {"name": "x", "entrypoint": ["pythonic-tool", "--flag"], "batch": {"micro_batch": 8}})
    main(["submit", str(job), "--dry-run", "--json"])
    argv = json.loads(capsys.readouterr().out)["nodes"][0]["argv"]
    assert argv[-3:] == ["--no-python", "pythonic-tool", "--flag"]
