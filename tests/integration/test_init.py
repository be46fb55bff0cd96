"""`launch init` against real sshd hosts (network namespaces): keys, probing, the file, a job run with it."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import cli_env, launch_argv, run_cli, write_yaml
from tests.testbed_fixture import host_key_rotated, needs_root, ssh_run, sshd_stopped
from tools import testbed as tb

pytestmark = [needs_root, pytest.mark.testbed, pytest.mark.slow]

TRAIN = """\
import os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print("RESULT", dist.get_rank(), socket.gethostname(), int(total.item()), flush=True)
dist.destroy_process_group()
"""


def _init(home: Path, bed: tb.Testbed, *args: str, known_hosts: Path | None = None, input: str | None = None):
    argv = ["init", *args, "--user", "root", "--key-file", str(bed.key_file),
            "--known-hosts", str(known_hosts or bed.known_hosts), "--ssh-config", str(bed.ssh_config)]
    return subprocess.run(launch_argv(*argv), capture_output=True, text=True, timeout=300, input=input, env=cli_env(home))


def _fingerprint(bed: tb.Testbed, name: str) -> str:
    """The host key's fingerprint as ssh-keygen prints it (what an administrator would read out)."""
    public = bed.host(name).host_key.with_suffix(".pub")
    return subprocess.run(["ssh-keygen", "-lf", str(public)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_init_writes_a_file_that_validates_and_runs_a_two_host_job(testbed: tb.Testbed, tmp_path: Path, home: Path) -> None:
    out = tmp_path / "cluster.yaml"
    started = time.monotonic()
    done = _init(home, testbed, "lt-h1", "lt-h2", "--out", str(out), "--name", "bed")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr + done.stdout
    print(f"launch init for 2 hosts: {elapsed:.1f} s ({done.stdout.strip().splitlines()[-1]})")
    assert "lt-h1" in done.stdout and "lt-h2" in done.stdout and "eth0" in done.stdout
    assert run_cli(home, "validate", str(out)).stdout.strip() == f"ok    {out}"

    text = out.read_text()
    spec = yaml.safe_load(text)
    assert spec["name"] == "bed" and spec["backend"] == "ssh"
    assert spec["ssh"]["user"] == "root" and spec["ssh"]["known_hosts"] == str(testbed.known_hosts)
    assert [n["host"] for n in spec["nodes"]] == ["lt-h1", "lt-h2"]
    for node in spec["nodes"]:
        code, cpus, _ = ssh_run(testbed, testbed.host(node["host"]), "nproc")
        assert code == 0 and node["gpus"] == 0 and node["slots"] == int(cpus)
    assert spec["network"]["interface"] == "eth0"  # every testbed host's link to the bridge
    assert "gpu" not in spec and "workdir" not in spec
    assert re.search(r"^# workdir: .*SET THIS", text, re.M)
    python = spec["python"]
    for name in ("lt-h1", "lt-h2"):
        code, _, err = ssh_run(testbed, testbed.host(name), f"{python} -c 'import torch'")
        assert code == 0, f"{name}: {python} cannot import torch: {err}"

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    job = write_yaml(tmp_path / "job.yaml", {
        "name": "init-job", "entrypoint": ["python", str(script)], "batch": {"micro_batch": 1},
        "resources": {"nodes": 2, "nproc_per_node": 1},
    })
    run = run_cli(home, "submit", str(job), "--cluster", str(out), timeout=180)
    assert run.returncode == 0, run.stderr + run.stdout
    assert sorted(re.findall(r"RESULT (\d) (\S+) (\d)", run.stdout)) == [("0", "lt-h1", "3"), ("1", "lt-h2", "3")]


def test_an_untrusted_host_key_is_asked_for(testbed: tb.Testbed, tmp_path: Path, home: Path) -> None:
    known = tmp_path / "known_hosts"
    first = testbed.known_hosts.read_text().splitlines()[0]
    assert first.startswith("lt-h1,")
    known.write_text(first + "\n")
    out = tmp_path / "cluster.yaml"

    declined = _init(home, testbed, "lt-h1", "lt-h2", "--out", str(out), known_hosts=known, input="n\n")
    assert declined.returncode == 3, declined.stderr
    assert declined.stdout.count("trust this key") == 1
    assert f"lt-h2 (10.77.0.12:22)  ssh-ed25519  {_fingerprint(testbed, 'lt-h2')}" in declined.stdout
    assert "lt-h2 (10.77.0.12:22): host key not trusted (declined)" in declined.stderr
    assert not out.exists() and known.read_text() == first + "\n"

    accepted = _init(home, testbed, "lt-h1", "lt-h2", "--out", str(out), known_hosts=known, input="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert f"recorded in {known}" in accepted.stdout and out.exists()
    assert [line.split()[0] for line in known.read_text().splitlines()] == ["lt-h1,10.77.0.11", "10.77.0.12"]
    again = _init(home, testbed, "lt-h1", "lt-h2", "--out", str(out), "--force", known_hosts=known, input="")
    assert again.returncode == 0 and "trust this key" not in again.stdout, again.stderr


def test_a_changed_key_is_refused(testbed: tb.Testbed, tmp_path: Path, home: Path) -> None:
    out = tmp_path / "cluster.yaml"
    with host_key_rotated(testbed, testbed.host("lt-h2")):
        done = _init(home, testbed, "lt-h1", "lt-h2", "--out", str(out), "--yes")
    assert done.returncode == 3 and "CHANGED" in done.stdout
    assert "launch trust lt-h2 --replace" in done.stderr and not out.exists()


def test_a_host_that_is_down_is_reported_in_one_line_and_the_others_are_still_probed(
        testbed: tb.Testbed, tmp_path: Path, home: Path) -> None:
    out, known = tmp_path / "cluster.yaml", tmp_path / "known_hosts"
    known.write_text("")  # lt-h1's key is accepted (--yes) and recorded: the message must not say nothing was written
    with sshd_stopped(testbed.host("lt-h3")):
        done = _init(home, testbed, "lt-h3", "lt-h1", "--out", str(out), "--yes", known_hosts=known)
    assert done.returncode == 3, done.stderr
    about = [line for line in done.stderr.splitlines() if "lt-h3" in line]
    assert len(about) == 1 and "cannot connect" in about[0] and "Traceback" not in done.stderr
    assert not [line for line in done.stderr.splitlines() if line.startswith("  ") and "lt-h1" in line]
    assert not out.exists() and known.read_text().startswith("10.77.0.11 ssh-ed25519 ")
    assert "nothing was written" not in done.stderr
    assert f"no cluster file was written (the host keys accepted stay recorded: lt-h1 in {known})" in done.stderr
    assert "1 other host(s) probed" in done.stderr
    [row] = [line for line in done.stdout.splitlines() if "lt-h1" in line and "ssh-ed25519" not in line]  # not the key
    assert "eth0" in row, "lt-h1's facts are shown although lt-h3 (first, node 0) is down"
