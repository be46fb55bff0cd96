"""Pure parts of the ssh backend: host resolution, host-key checks, fan-out (the node side it runs
is tested in test_node_agent.py)."""

from __future__ import annotations

import getpass
import socket
import subprocess
import threading
from pathlib import Path

import paramiko
import pytest

from launcher.backends.ssh.connection import error_text, fan_out
from launcher.backends.ssh.hostkeys import HostKeyError, check_host_key, fingerprint
from launcher.backends.ssh.settings import SSHSettings
from launcher.backends.ssh.spec import SSHSpec
from launcher.backends.ssh.target import Target
from launcher.backends.ssh.trust import record_key
from launcher.errors import LaunchError


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
    together = threading.Barrier(4, timeout=60)  # passes only when all four steps run at the same time

    def step(host: str) -> str:
        together.wait()
        if host == "bad":
            raise LaunchError(f"{host}: unreachable")
        return host.upper()

    results = fan_out(step, ["a", "bad", "c", "d"])
    assert [(r.key, r.ok, r.value) for r in results] == [("a", True, "A"), ("bad", False, None), ("c", True, "C"), ("d", True, "D")]
    assert error_text(results[1].error) == "bad: unreachable"
    assert error_text(OSError("reset")) == "connection lost: reset"
    with pytest.raises(KeyError):
        error_text(KeyError("bug"))


def test_known_hosts_markers_and_unreadable_lines_are_parsed_around(tmp_path: Path) -> None:
    good, revoked, other = _key(tmp_path, "good"), _key(tmp_path, "revoked"), _key(tmp_path, "other")
    path = tmp_path / "known_hosts"
    path.write_bytes(
        f"10.0.0.1 {good.get_name()} {good.get_base64()}\n"
        f"10.0.0.2 {revoked.get_name()} {revoked.get_base64()}\n"
        f"@revoked * {revoked.get_name()} {revoked.get_base64()}\n"
        f"@cert-authority *.example.com {other.get_name()} {other.get_base64()}\n"
        f"@bogus-marker 10.0.0.3 {other.get_name()} {other.get_base64()}\n"
        "10.0.0.4 ssh-ed25519 !!!not-base64\n"
        "10.0.0.5 ssh-ed25519 AAAA\n"
        "10.0.0.6 ssh-unknown-type AAAAB3NzaC1yc2E=\n"
        "onlyonefield\n".encode() + b"10.0.0.7 caf\xe9 x\n"
    )
    known = SSHSettings(SSHSpec(known_hosts=str(path))).host_keys()
    assert known.lookup("10.0.0.1")[good.get_name()] == good
    assert known.lookup("10.0.0.2") is None  # its only key is revoked
    assert known.lookup("host.example.com") is None and known.lookup("10.0.0.3") is None
    check_host_key(known, Target("a", "10.0.0.1", 22, "root"), good, path)
    for host in ("10.0.0.2", "10.0.0.1", "10.0.0.9"):  # revoked wherever it is offered, recorded or not
        with pytest.raises(HostKeyError, match=r"a key .*known_hosts marks @revoked. Nothing was run on it"):
            check_host_key(known, Target("b", host, 22, "root"), revoked, path)
    with pytest.raises(HostKeyError, match="host key not trusted"):  # a CA line trusts no plain key
        check_host_key(known, Target("c", "h.example.com", 22, "root"), other, path)


@pytest.mark.parametrize("config,fragment", [
    ("Host gpu\n  ProxyJump bastion:abc\n", "proxyjump for host gpu: jump host 'bastion:abc': port 'abc' is not a number"),
    ("Host gpu\n  ProxyJump user@host:99999\n", "proxyjump for host gpu: jump host 'user@host:99999': port '99999'"),
    ("Host gpu\n  Port abc\n", "port for host gpu: port 'abc' is not a number from 1 to 65535"),
    ("Host gpu\n  HostName " + "a" * 64 + ".example.com\n", "hostname for host gpu: the label 'aaaaaaaaaaaaaaaaaaaa'... is 64"),
    ("Host gpu\n  ProxyJump hop\nHost hop\n  Port 0\n", "port for host hop: port '0' is not a number"),
])
def test_ssh_config_values_that_do_not_parse_are_launch_errors(config: str, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(config)
    with pytest.raises(LaunchError) as error:
        SSHSettings(SSHSpec(config_file=str(path))).target("gpu")
    assert str(error.value).startswith(f"{path}: ") and fragment in str(error.value)


def test_jump_hosts_parse_users_ports_and_ipv6() -> None:
    from launcher.spec.hosts import Hop, parse_jump_hosts

    assert parse_jump_hosts("ops@bastion:2222, [fe80::1]:22,ssh://u@10.0.0.1,fe80::2") == [
        Hop("bastion", 2222, "ops"), Hop("fe80::1", 22), Hop("10.0.0.1", None, "u"), Hop("fe80::2"),
    ]
    assert parse_jump_hosts("None") == []
