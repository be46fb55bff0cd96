"""The node commands that read the job interpreter's installed packages see them.

Node commands start their Python without ``site`` (``-S``) to save its start-up, except the ones that
report what is installed: the facts probe and Slurm's node side, which runs the probe in-process. This
test venv's torch lives in its site-packages, which only ``site`` puts on the path, so a probe started
without it would report torch missing (as every Slurm preflight once did).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from launcher.node.ship import node_argv
from launcher.node.slurmnode import ABORT_FILE, ABORTED_EXIT

PROBE = {"modules": ["torch", "deepspeed"]}


def test_the_facts_probe_sees_the_interpreters_installed_packages(tmp_path: Path) -> None:
    done = subprocess.run(node_argv(sys.executable, "facts", {**PROBE, "workdir": str(tmp_path)}),
                          capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert found["missing"] == []
    assert found["torch"] == importlib.metadata.version("torch")


def test_slurms_node_side_sees_them_too_when_it_probes_in_process(tmp_path: Path) -> None:
    (tmp_path / ABORT_FILE).write_text("")  # preflight "failed": the node writes its facts, then ends
    request = {"dir": str(tmp_path), "facts": [{**PROBE, "workdir": str(tmp_path)}], "wait_s": 5}
    done = subprocess.run(node_argv(sys.executable, "slurm", request), capture_output=True, text=True,
                          env={**os.environ, "SLURM_NODEID": "0"}, timeout=60)
    assert done.returncode == ABORTED_EXIT, done.stderr
    found = json.loads((tmp_path / "node0.facts.json").read_text())
    assert found["missing"] == []
    assert found["torch"] == importlib.metadata.version("torch")
