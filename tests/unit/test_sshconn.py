"""Pure parts of the ssh backend: host resolution, host-key checks, fan-out (the node side it runs
is tested in test_node_agent.py)."""

from __future__ import annotations

import getpass
import socket
import time
import subprocess
from pathlib import Path

import paramiko
import pytest

from launcher.errors import LaunchError
from launcher.spec.cluster import SSHSpec
from launcher.sshconn import HostKeyError, SSHSettings, Target, check_host_key, error_text, fan_out, fingerprint
from launcher.trust import record_key

def _key(tmp_path: Path, name: str) -> paramiko.PKey:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def test_fingerprint_matches_ssh_keygen(tmp_path: Path) -> None:
    key = _key(tmp_path, "k")
    out = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True, check=True)
    assert fingerprint(key) == out.stdout.split()[1]


def test_known_hosts_rejects_unknown_and_changed_keys(tmp_path: Path) -> None:
    old, new = _key(tmp_path, "old"), _key(tmp_path, "new")
    known = paramiko.HostKeys()
    known.add("10.0.0.1", old.get_name(), old)
    known.add("[10.0.0.2]:2222", old.get_name(), old)
    path = tmp_path / "known_hosts"
    gpu1 = Target("gpu-01", "10.0.0.1", 22, "root")
    check_host_key(known, gpu1, old, path)
    check_host_key(known, Target("gpu-02", "10.0.0.2", 2222, "root"), old, path)
    with pytest.raises(HostKeyError) as changed:
        check_host_key(known, gpu1, new, path)
    message = str(changed.value)
    assert message.startswith("gpu-01 (10.0.0.1:22): the host key has CHANGED")
    assert fingerprint(old) in message and fingerprint(new) in message and "launch trust gpu-01 --replace" in message
    with pytest.raises(HostKeyError, match=r"gpu-02 \(10.0.0.2:22\): host key not trusted: 10.0.0.2 is not in"):
        check_host_key(known, Target("gpu-02", "10.0.0.2", 22, "root"), new, path)
    assert changed.value.exit_code == 3


def test_record_key_appends_and_replaces_plain_and_hashed_entries(tmp_path: Path) -> None:
    old, new = _key(tmp_path, "old"), _key(tmp_path, "new")
    path = tmp_path / "ssh" / "known_hosts"
    target = Target("gpu-01", "10.0.0.1", 22, "root")
    record_key(path, target, old)
    hashed = paramiko.HostKeys.hash_host("10.0.0.1")
    with open(path, "a") as handle:
        handle.write(f"# comment\n{hashed} {old.get_name()} {old.get_base64()}\nother {old.get_name()} {old.get_base64()}")
    record_key(path, target, new, replace=True)
    lines = path.read_text().splitlines()
    assert lines == ["# comment", f"other {old.get_name()} {old.get_base64()}", f"10.0.0.1 {new.get_name()} {new.get_base64()}"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_hosts_resolve_through_ssh_config_with_cluster_values_winning(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "Host gpu-*\n  User train\n  Port 2200\n  IdentityFile ~/.ssh/gpu_key\n  ProxyJump ops@bastion:2222\n"
        "Host gpu-01\n  HostName 10.0.0.1\n"
        "Host bastion\n  HostName 192.0.2.1\n"
    )
    plain = SSHSettings(SSHSpec(config_file=str(config)))
    target = plain.target("gpu-01")
    assert (target.hostname, target.port, target.user) == ("10.0.0.1", 2200, "train")
    assert target.key_files == (str(Path.home() / ".ssh/gpu_key"),)
    assert (target.via.hostname, target.via.port, target.via.user, target.via.via) == ("192.0.2.1", 2222, "ops", None)
    assert target.known_hosts_name == "[10.0.0.1]:2200"
    pinned = SSHSettings(SSHSpec(config_file=str(config), user="root", port=2022, key_file="/k", jump_host="a,b:2"))
    target = pinned.target("gpu-01", port=22, user="me")
    assert (target.port, target.user, target.key_files) == (22, "me", ("/k",))
    assert (target.via.alias, target.via.port, target.via.via.alias) == ("b", 2, "a")
    assert pinned.target("other").port == 2022
    assert SSHSettings(SSHSpec(config_file=str(tmp_path / "none"))).target("x").hostname == "x"


def test_host_lookup_never_resolves_the_local_fqdn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def slow_dns(*_):
        raise AssertionError("socket.getfqdn called: a 5 s stall with an unreachable nameserver")

    monkeypatch.setattr(socket, "getfqdn", slow_dns)
    config = tmp_path / "config"
    config.write_text("Host gpu-*\n  IdentityFile ~/.ssh/id_%u\n  ControlPath /tmp/%l-%h\n")
    target = SSHSettings(SSHSpec(config_file=str(config), user="root")).target("gpu-01")
    assert target.key_files == (str(Path.home() / f".ssh/id_{getpass.getuser()}"),)


def test_fan_out_keeps_order_and_reports_each_host() -> None:
    def step(host: str) -> str:
        time.sleep(0.2)
        if host == "bad":
            raise LaunchError(f"{host}: unreachable")
        return host.upper()

    started = time.monotonic()
    results = fan_out(step, ["a", "bad", "c", "d"])
    assert time.monotonic() - started < 0.6
    assert [(r.key, r.ok, r.value) for r in results] == [("a", True, "A"), ("bad", False, None), ("c", True, "C"), ("d", True, "D")]
    assert error_text(results[1].error) == "bad: unreachable"
    assert error_text(OSError("reset")) == "connection lost: reset"
    with pytest.raises(KeyError):
        error_text(KeyError("bug"))
