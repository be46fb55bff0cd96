"""The node side's interpreter survey, run as a node runs it (the shipped `facts` command)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from launcher.node.ship import node_argv


def _survey(paths: list[str]) -> list[dict]:
    request = {"pythons": {"paths": paths, "search": False}}
    done = subprocess.run(node_argv(sys.executable, "facts", request), capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["pythons"]


def test_an_interpreter_with_torch_reports_its_versions_and_imports_it():
    [found] = _survey([sys.executable])
    assert found["path"] == sys.executable and found["version"] == sys.version.split()[0]
    assert found["torch"] == importlib.metadata.version("torch")
    assert found["deepspeed"] == importlib.metadata.version("deepspeed")
    assert found["imports_torch"] is True


def test_a_torch_that_is_listed_but_broken_is_caught_and_missing_paths_are_skipped(tmp_path: Path):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    (site / "torch-9.9.dist-info").mkdir()
    (site / "torch-9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    [found] = _survey([str(wrapper), str(tmp_path / "no-such-python")])
    assert found["path"] == str(wrapper) and found["torch"] == "9.9"
    assert found["imports_torch"] is False and "libcudart.so.12" in found["import_error"]
