"""Fan-out at scale (issue 23): known_hosts parsed once and shared, looked up by name, the cap honoured."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest

from launcher.backends import cluster_spec
from launcher.backends.ssh import settings as ssh_settings
from launcher.backends.ssh.connection import fan_out
from launcher.backends.ssh.hostkeys import HostKeyError, check_host_key, load_known_hosts
from launcher.backends.ssh.settings import SSHSettings
from launcher.backends.ssh.spec import SSHSpec
from launcher.backends.ssh.target import Target


def _key(tmp_path: Path, name: str) -> paramiko.PKey:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def _settings(tmp_path: Path, known: Path) -> SSHSettings:
    return SSHSettings(SSHSpec(known_hosts=str(known), config_file=str(tmp_path / "none")))


def test_known_hosts_is_parsed_once_and_again_only_when_the_file_changes(tmp_path, monkeypatch) -> None:
    key, other = _key(tmp_path, "k"), _key(tmp_path, "o")
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"h{i},10.0.0.{i} {key.get_name()} {key.get_base64()}\n" for i in range(1, 200)))
    parsed = []
    real = ssh_settings.load_known_hosts
    monkeypatch.setattr(ssh_settings, "load_known_hosts", lambda path: parsed.append(path) or real(path))
    settings = _settings(tmp_path, known)
    first = settings.host_keys()
    assert all(settings.host_keys() is first for _ in range(64)) and len(parsed) == 1
    known.write_text(f"h1 {other.get_name()} {other.get_base64()}\n")
    os.utime(known, ns=(time.time_ns(), time.time_ns() + 10**9))  # a rewrite within the same tick still shows
    assert settings.host_keys().lookup("h1") == {other.get_name(): other} and len(parsed) == 2


def test_the_index_answers_like_paramikos_scan_plain_hashed_and_missing(tmp_path) -> None:
    key, other = _key(tmp_path, "k"), _key(tmp_path, "o")
    hashed = paramiko.HostKeys.hash_host("10.9.9.9")
    path = tmp_path / "known_hosts"
    path.write_text(f"gpu-01,10.0.0.1 {key.get_name()} {key.get_base64()}\n"
                    f"[10.0.0.2]:2222 {other.get_name()} {other.get_base64()}\n"
                    f"{hashed} {key.get_name()} {key.get_base64()}\n")
    known = load_known_hosts(path)
    scan = paramiko.HostKeys(str(path))
    for name in ("gpu-01", "10.0.0.1", "[10.0.0.2]:2222", "10.9.9.9", "10.0.0.3", "10.0.0.2"):
        mine, theirs = known.lookup(name), scan.lookup(name)
        assert (dict(mine) if mine is not None else None) == (dict(theirs) if theirs is not None else None), name
    check_host_key(known, Target("a", "10.9.9.9", 22, "root"), key, path)
    with pytest.raises(HostKeyError, match="CHANGED"):
        check_host_key(known, Target("gpu-01", "10.0.0.1", 22, "root"), other, path)
    known.add("late", key.get_name(), key)  # added after indexing: still found (the scan answers)
    assert known.lookup("late") is not None


def test_fan_out_never_runs_more_than_the_cap_at_once() -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def step(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return i

    results = fan_out(step, list(range(40)), limit=4)
    assert [r.got for r in results] == list(range(40)) and peak[0] <= 4


def test_the_cap_is_a_cluster_setting_like_pdshs() -> None:
    assert cluster_spec(name="c", backend="ssh", nodes=[{"host": "a"}]).ssh.fanout == 32
    assert cluster_spec(name="c", backend="ssh", nodes=[{"host": "a"}], ssh={"fanout": 8}).ssh.fanout == 8
    with pytest.raises(ValueError, match="fanout"):
        cluster_spec(name="c", backend="ssh", nodes=[{"host": "a"}], ssh={"fanout": 0})
