"""`launch check` on this machine and across real namespace hosts."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from launcher.node import proctree
from tests.helpers import run_cli, write_yaml
from tests.testbed_fixture import needs_root, sshd_stopped

pytestmark = pytest.mark.slow
SYSTEM_PYTHON = "/usr/bin/python3"


def _testbed_cluster(tmp_path: Path, bed, pythons: list[str]) -> Path:
    return write_yaml(tmp_path / "cluster.yaml", {
        "name": "testbed", "backend": "ssh",
        "ssh": {"user": "root", "key_file": str(bed.key_file), "known_hosts": str(bed.known_hosts),
                "config_file": str(bed.ssh_config)},
        "nodes": [{"host": h.name, "gpus": 0} for h in bed.hosts[: len(pythons)]],
        "python": pythons[0], "workdir": str(tmp_path),
    })


def test_local_check_reports_versions_and_measures_bandwidth(tmp_path, home):
    result = run_cli(home, "check", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["problems"] == []
    node = report["nodes"][0]
    import torch

    assert node["torch"] == torch.__version__ and node["python"] == sys.version.split()[0]
    assert node["port_free"] is True and abs(node["skew_s"]) < 1
    assert report["bandwidth_gbps"] > 0
    job = json.loads(run_cli(home, "status", report["bandwidth_job"], "--json").stdout)
    assert job["state"] == "SUCCEEDED" and job["world_size"] == 2
    assert proctree.job_pids(report["bandwidth_job"]) == []


@needs_root
@pytest.mark.testbed
def test_check_across_hosts_measures_bandwidth_and_reachability(tmp_path, home, testbed):
    cluster = _testbed_cluster(tmp_path, testbed, [sys.executable, sys.executable])
    result = run_cli(home, "check", "--cluster", str(cluster), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [n["hostname"] for n in report["nodes"]] == ["lt-h1", "lt-h2"]
    assert report["nodes"][1]["reached"] is True and report["nodes"][0]["port_free"] is True
    assert report["bandwidth_gbps"] > 0
    # the hosts share this machine's clock: read on launch's own short trips, no skew beyond their uncertainty
    # (the facts' trip, in which node 0 waits for its peer's port test, once showed 4 s)
    for node in report["nodes"]:
        assert node["skew_uncertainty_s"] < 1.0 and abs(node["skew_s"]) <= node["skew_uncertainty_s"] + 1e-3, node
    assert not [w for w in report["warnings"] if "clock" in w], report["warnings"]
    text = run_cli(home, "check", "--cluster", str(cluster), "--no-bandwidth").stdout
    assert "lt-h1" in text and "lt-h2" in text and "ready" in text


@needs_root
@pytest.mark.testbed
@pytest.mark.skipif(not shutil.which(SYSTEM_PYTHON), reason="needs a second interpreter (Debian's python3) to differ")
def test_check_flags_differences_and_unreachable_hosts(tmp_path, home, testbed):
    cluster = _testbed_cluster(tmp_path, testbed, [sys.executable, sys.executable, sys.executable])
    spec = json.loads(json.dumps(__import__("yaml").safe_load(cluster.read_text())))
    spec["python"] = SYSTEM_PYTHON
    write_yaml(cluster, spec)
    result = run_cli(home, "check", "--cluster", str(cluster), "--no-bandwidth")
    assert result.returncode == 3
    assert "torch is not installed" in result.stdout
    with sshd_stopped(testbed.host("lt-h3")):
        spec["python"] = sys.executable
        write_yaml(cluster, spec)
        result = run_cli(home, "check", "--cluster", str(cluster), "--no-bandwidth")
    assert result.returncode == 3
    assert "problem: lt-h3" in result.stdout and "lt-h1" in result.stdout


@needs_root
@pytest.mark.testbed
@pytest.mark.skipif(not shutil.which(SYSTEM_PYTHON), reason="needs a second interpreter (Debian's python3) to differ")
def test_submit_refuses_nodes_whose_versions_differ(tmp_path, home, testbed):
    # The hosts share one filesystem: an interpreter wrapper gives lt-h2 another python (Debian's, with our
    # site-packages on its path), as a node whose image drifted has. Preflight passes; the comparison does not.
    import torch

    if _python_version(SYSTEM_PYTHON) == sys.version.split()[0]:
        pytest.skip("Debian's python3 is the same version as this one: nothing differs")
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'[ "$(hostname)" = lt-h2 ] && PYTHONPATH={Path(torch.__file__).parent.parent} exec {SYSTEM_PYTHON} "$@"\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    cluster = _testbed_cluster(tmp_path, testbed, [str(wrapper), str(wrapper)])
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    job = write_yaml(tmp_path / "job.yaml", {"name": "drift", "entrypoint": ["python", str(script)],
                                             "batch": {"micro_batch": 1}, "resources": {"nodes": 2}})
    result = run_cli(home, "submit", str(job), "--cluster", str(cluster))
    assert result.returncode == 3, result.stderr
    assert "preflight failed" in result.stderr and "nothing was started" in result.stderr
    assert "python differs between nodes" in result.stderr
    assert "`launch submit --skip-check` skips the version comparison" in result.stderr
    assert f"lt-h2={_python_version(SYSTEM_PYTHON)}" in result.stderr
    assert json.loads(run_cli(home, "status", "--json").stdout) == []
    assert _testbed_is_empty(testbed)


def _python_version(python: str) -> str:
    import subprocess

    return subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                          text=True, check=True).stdout.strip()


def _testbed_is_empty(bed) -> bool:
    from tools import testbed as tb

    return all(not tb.pids(host) for host in bed.hosts)
