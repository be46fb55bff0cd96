"""Pure parts of the ssh backend: remote commands, host resolution, host-key checks, fan-out.

The remote scripts (agent wrapper, probe, group kill) run here, locally, through
``bash -c`` exactly as sshd would run them: no network, no sshd.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.backends import ssh
from launcher.errors import LaunchError
from launcher.plan import NodePlan
from launcher.spec.cluster import SSHSpec
from launcher.sshconn import HostKeyError, SSHSettings, Target, check_host_key, error_text, fan_out, fingerprint
from launcher.trust import record_key

ECHO = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('V'), os.environ.get('SECRET'), os.getcwd()]))"
HOSTILE = ["a;b", "$(id)", "`id`", "it's", 'say "hi"', "two  words", "line\nbreak", "naïve ☃ 漢字", "", "-rf", "*", "\\"]
text_without_nul = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
JOB_PREFIX = f"unit-{os.getpid()}-"


@pytest.fixture(autouse=True, scope="module")
def _remove_run_dirs():
    """The wrapper writes under RUN_ROOT; remove what this module's jobs left there."""
    yield
    for path in Path(ssh.RUN_ROOT).glob(JOB_PREFIX + "*"):
        shutil.rmtree(path)


def _node(argv: list[str], env: dict[str, str], cwd: str) -> NodePlan:
    return NodePlan(index=1, host="h", address="a", nproc=1, gpus=0, argv=tuple(argv), env=env, env_sources={}, cwd=cwd)


def _run_agent(argv: list[str], env: dict[str, str], cwd: str, secrets: dict[str, str]) -> tuple[int, list[str], str]:
    """Run the agent command through bash as sshd would; (exit status, output lines, job id)."""
    job_id = JOB_PREFIX + uuid.uuid4().hex[:8]
    command = ssh.agent_command(job_id, _node(argv, env, cwd))
    done = subprocess.run(["bash", "-c", command], input=ssh.secrets_script(secrets), capture_output=True)
    return done.returncode, (done.stdout + done.stderr).decode().splitlines(), job_id


def test_agent_command_delivers_hostile_values_and_secrets_verbatim(tmp_path: Path) -> None:
    cwd = tmp_path / "dir with 'quotes' and $(x)"
    cwd.mkdir()
    for value in HOSTILE:
        secret = f"tok-{value}"
        command = ssh.agent_command("job", _node([sys.executable, "-c", ECHO, value], {"V": value}, str(cwd)))
        assert secret not in command
        status, lines, job_id = _run_agent([sys.executable, "-c", ECHO, value], {"V": value}, str(cwd), {"SECRET": secret})
        assert status == 0 and lines[0].startswith(ssh.AGENT_MARK)
        assert json.loads(lines[1]) == [[value], value, secret, str(cwd)]
        run_dir = Path(ssh.RUN_ROOT) / job_id
        assert (run_dir / "node1.pid").read_text().strip() == lines[0].split()[1]
        assert oct(run_dir.stat().st_mode & 0o777) == "0o700"


@settings(max_examples=25, deadline=None)
@given(st.lists(text_without_nul, min_size=1, max_size=3), text_without_nul)
def test_any_text_round_trips_through_the_agent_command(args: list[str], value: str) -> None:
    status, lines, _ = _run_agent([sys.executable, "-c", ECHO, *args], {"V": value}, "/", {})
    assert status == 0 and json.loads(lines[1])[:2] == [args, value]


def test_agent_exit_codes_and_signals_come_back() -> None:
    assert _run_agent([sys.executable, "-c", "raise SystemExit(3)"], {}, "/", {})[0] == 3
    status = _run_agent([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], {}, "/", {})[0]
    assert (status, ssh.exit_code(status)) == (137, -9)
    status, lines, _ = _run_agent(["/no/such/program"], {}, "/", {})
    assert status in (126, 127) and "/no/such/program" in lines[-1]
    assert [ssh.exit_code(code) for code in (0, 1, 128, 143, 255)] == [0, 1, 128, -15, 255]


def test_agent_runs_in_its_own_session_and_the_group_kill_ends_it() -> None:
    job_id = JOB_PREFIX + uuid.uuid4().hex[:8]
    script = "import os, time; print(os.getsid(0) == os.getpid(), flush=True); time.sleep(60)"
    command = ssh.agent_command(job_id, _node([sys.executable, "-c", script], {}, "/"))
    proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    agent = int(proc.stdout.readline().split()[1])
    assert proc.stdout.readline().strip() == "True"
    pid_file = f"{ssh.RUN_ROOT}/{job_id}/node1.pid"
    subprocess.run(["sh", "-c", ssh.KILL_GROUP, "sh", pid_file, "20"], check=True, timeout=10)
    assert proc.wait(5) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(agent, 0)

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    command = ssh.agent_command(job_id, _node([sys.executable, "-c", stubborn], {}, "/"))
    proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    assert proc.stdout.readline().strip() == "ready"
    started = time.monotonic()
    subprocess.run(["sh", "-c", ssh.KILL_GROUP, "sh", pid_file, "3"], check=True, timeout=10)
    assert proc.wait(5) == 128 + signal.SIGKILL and 0.3 <= time.monotonic() - started < 3


def _probe(request: dict) -> dict:
    base = {"modules": [], "workdir": None, "ifaces": [], "port": None, "gpus": 0, "master": None}
    done = subprocess.run([sys.executable, "-c", ssh.PROBE, json.dumps({**base, **request})], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_probe_reports_modules_workdir_port_interfaces_and_route(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        found = _probe({"modules": ["json", "no_such_module_xyz"], "workdir": str(tmp_path / "missing"),
                        "ifaces": ["lo", "nosuch0"], "port": port, "master": "127.0.0.1"})
    assert found["missing"] == ["no_such_module_xyz"] and found["workdir_ok"] is False
    assert found["missing_ifaces"] == ["nosuch0"] and found["port_free"] is False
    assert found["dev"] == "lo" and found["route_error"] is None
    node = _node(["python"], {}, str(tmp_path / "missing"))
    request = {"port": port, "gpus": 2, "master": "127.0.0.1"}
    problems = ssh._problems("h1", "/py", True, node, request, {**found, "gpus": 1})
    assert problems == [
        "h1: /py cannot import no_such_module_xyz (install it on the node, or point cluster.yaml python at an interpreter that has it)",
        f"h1: workdir '{tmp_path / 'missing'}' does not exist (cluster.yaml workdir, or set sync_workdir)",
        "h1: network interface 'nosuch0' (cluster.yaml network.interface) does not exist",
        f"h1: rendezvous port {port} is in use on node 0 (a stale job may hold it: `launch status`; or choose another rendezvous.port)",
        "h1: cluster.yaml says 2 GPUs, nvidia-smi lists 1",
    ]


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
