"""A host key marked @revoked in known_hosts is refused against a real sshd, even where another line trusts it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.store.db import Store
from tests.testbed_fixture import needs_root
from tools import testbed as tb

pytestmark = [needs_root, pytest.mark.testbed]

LAUNCH = str(Path(sys.executable).with_name("launch"))


def test_a_revoked_host_key_is_refused_before_anything_runs(testbed: tb.Testbed, tmp_path: Path) -> None:
    host = testbed.hosts[1]
    public = host.host_key.with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(
        testbed.known_hosts.read_text()  # lt-h2's key is trusted by its own line...
        + f"@revoked * {public[0]} {public[1]}\n"  # ...and revoked by this one
        + f"@cert-authority *.example.com {public[0]} {public[1]}\n"
    )
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(json.dumps({
        "name": "revoked", "backend": "ssh",
        "ssh": {"user": "root", "key_file": str(testbed.key_file), "known_hosts": str(known),
                "config_file": str(testbed.ssh_config)},
        "nodes": [{"host": h.name, "gpus": 0, "slots": 1} for h in testbed.hosts[:2]],
        "python": sys.executable, "workdir": str(tmp_path),
    }))
    job, script = tmp_path / "job.yaml", tmp_path / "train.py"
    script.write_text("pass\n")
    job.write_text(json.dumps({"name": "revoked", "entrypoint": ["python", str(script)], "batch": {"micro_batch": 1},
                               "resources": {"nodes": 2, "nproc_per_node": 1}}))
    home = tmp_path / "home"
    done = subprocess.run([LAUNCH, "submit", str(job), "--cluster", str(cluster)], capture_output=True, text=True,
                          timeout=120, env={"LAUNCH_HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 3, done.stderr
    assert f"lt-h2 (10.77.0.12:22): the host offered {public[0]}" in done.stderr
    assert f"{known} marks @revoked. Nothing was run on it." in done.stderr
    assert "Traceback" not in done.stderr and "lt-h1" not in done.stderr
    assert not Store(home).jobs()
