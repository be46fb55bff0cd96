"""The namespaced SSH testbed itself: real namespaces, real sshd, paramiko with RejectPolicy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import paramiko
import pytest

from tests.testbed_fixture import (  # the `testbed` fixture comes from tests/conftest.py
    host_key_rotated,
    link_cut,
    needs_root,
    ssh_client,
    ssh_run,
    sshd_stopped,
)
from tools import testbed as tb

pytestmark = needs_root


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def _start_stray_sleep(bed: tb.Testbed, host: tb.Host) -> int:
    """A process detached from its SSH session, as a launched job would leave behind."""
    status, out, err = ssh_run(bed, host, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
    assert status == 0, err
    return int(out)


def test_each_host_answers_with_its_own_name_and_address(testbed: tb.Testbed) -> None:
    for host in testbed.hosts:
        status, out, err = ssh_run(testbed, host, "hostname; hostname -I")
        assert status == 0, err
        assert out.split() == [host.name, host.address]


def test_hosts_reach_each_other_by_name(testbed: tb.Testbed) -> None:
    h1, h2 = testbed.hosts[:2]
    status, out, err = ssh_run(testbed, h1, f"getent hosts {h2.name} {h1.name}")
    assert status == 0, err
    assert out.split() == [h2.address, h2.name, h1.address, h1.name]
    banner = tb.exec_in(h1, [sys.executable, "-c",
                             f"import socket; print(socket.create_connection(('{h2.name}', 22), 2).recv(8))"])
    assert "SSH-2.0" in banner.stdout


def test_ssh_commands_skip_root_dotfiles_and_the_machine_nameserver(testbed: tb.Testbed) -> None:
    status, out, err = ssh_run(testbed, testbed.hosts[0],
                               'wc -c < /root/.bashrc; echo "${PYENV_ROOT:-unset}"; cat /etc/resolv.conf')
    assert status == 0, err
    assert out.splitlines() == ["0", "unset", "nameserver 127.0.0.1", "options timeout:1 attempts:1"]


def test_stopped_sshd_refuses_connections_until_started(testbed: tb.Testbed) -> None:
    host = testbed.hosts[1]
    with sshd_stopped(host):
        assert tb.sshd_pid(host) is None
        with pytest.raises(paramiko.ssh_exception.NoValidConnectionsError):
            ssh_client(testbed, host, timeout=2)
    assert ssh_run(testbed, host, "true")[0] == 0


def test_rotated_host_key_is_refused(testbed: tb.Testbed) -> None:
    host = testbed.hosts[2]
    with host_key_rotated(testbed, host):
        with pytest.raises(paramiko.BadHostKeyException):
            ssh_client(testbed, host)
    assert ssh_run(testbed, host, "true")[0] == 0


def test_cut_link_makes_the_host_unreachable(testbed: tb.Testbed) -> None:
    host = testbed.hosts[3]
    with link_cut(host):
        assert not tb.status(testbed)[3].link_up
        with pytest.raises(OSError):
            ssh_client(testbed, host, timeout=1)
    assert ssh_run(testbed, host, "true")[0] == 0


def test_pids_lists_host_processes_but_not_the_sshd_listener(testbed: tb.Testbed) -> None:
    host = testbed.hosts[0]
    stray = _start_stray_sleep(testbed, host)
    try:
        assert stray in tb.pids(host)
        assert tb.sshd_pid(host) not in tb.pids(host)
    finally:
        os.kill(stray, signal.SIGKILL)


def test_a_daemon_started_in_a_host_is_not_a_leftover(testbed: tb.Testbed) -> None:
    host = testbed.hosts[3]
    pid = tb.start_daemon(host, "sleeper", ["sleep", "300"])
    try:
        assert pid in tb.daemon_pids(host)
        assert pid not in tb.pids(host)
        assert pid in map(int, _ip("netns", "pids", host.namespace).split())
        assert open(f"/proc/{pid}/cmdline").read() == "sleep\x00300\x00"
    finally:
        tb.stop_daemon(host, "sleeper")
    assert not tb.pid_alive(pid)
    assert pid not in tb.daemon_pids(host)


def test_every_host_mounts_the_cgroup_v1_hierarchies_slurmd_and_runc_need(testbed: tb.Testbed) -> None:
    wanted = {f"/sys/fs/cgroup/{name}": f"rw,{name}" for name in ("cpuset", "memory", "freezer", "devices", "pids")}
    wanted["/sys/fs/cgroup/systemd"] = "rw,name=systemd"
    command = "grep ' - cgroup ' /proc/self/mountinfo"  # fields: ID PARENT DEV ROOT MOUNT-POINT ... - TYPE SOURCE OPTIONS
    status, over_ssh, err = ssh_run(testbed, testbed.hosts[0], command)
    assert status == 0, err
    entered = tb.exec_in(testbed.hosts[1], ["sh", "-c", command]).stdout
    for listing in (over_ssh, entered):
        assert {line.split()[4]: line.split()[-1] for line in listing.splitlines()} == wanted
    status, out, err = ssh_run(testbed, testbed.hosts[0], "cat /sys/fs/cgroup/pids/cgroup.procs | wc -l")
    assert status == 0 and int(out) > 0, err


def test_exec_in_sees_the_host_without_its_sshd(testbed: tb.Testbed) -> None:
    host = testbed.hosts[1]
    with sshd_stopped(host):
        assert tb.exec_in(host, ["hostname"]).stdout.strip() == host.name
        etc_hosts = tb.exec_in(host, ["cat", "/etc/hosts"]).stdout
        assert "PYENV" not in tb.exec_in(host, ["env"]).stdout
    assert all(f"{h.address} {h.name}" in etc_hosts for h in testbed.hosts)


def test_sshd_that_cannot_start_is_named(testbed: tb.Testbed) -> None:
    host = testbed.hosts[2]
    config = host.sshd_config.read_text()
    with sshd_stopped(host):
        host.sshd_config.write_text(config + "NoSuchOption yes\n")
        try:
            with pytest.raises(tb.TestbedError, match=f"{host.name}: sshd exited at start"):
                tb.start_sshd(host)
        finally:
            host.sshd_config.write_text(config)


def test_cluster_yaml_lists_the_first_n_hosts(testbed: tb.Testbed) -> None:
    base = testbed.base_dir
    assert testbed.cluster_yaml("/opt/venv/bin/python", n=2) == (
        "name: testbed\n"
        "backend: ssh\n"
        f"ssh: {{user: root, port: 22, key_file: {base}/id_ed25519, known_hosts: {base}/known_hosts, "
        f"config_file: {base}/ssh_config}}\n"
        "nodes:\n"
        "  - {host: lt-h1, address: 10.77.0.11, gpus: 0}\n"
        "  - {host: lt-h2, address: 10.77.0.12, gpus: 0}\n"
        "python: /opt/venv/bin/python\n"
        "workdir: /tmp\n"
    )
    assert testbed.cluster_yaml("/p y", workdir="/w").endswith('python: "/p y"\nworkdir: /w\n')
    with pytest.raises(tb.TestbedError, match="n must be between 1 and 4"):
        testbed.cluster_yaml("/p", n=5)


def test_up_rejects_bad_arguments_before_touching_the_testbed(testbed: tb.Testbed) -> None:
    with pytest.raises(tb.TestbedError, match="n must be between 1 and 200, got 0"):
        tb.up(0, testbed.base_dir)
    with pytest.raises(tb.TestbedError, match="may only contain"):
        tb.up(1, testbed.base_dir / "a b")
    assert all(tb.sshd_pid(h) for h in testbed.hosts)


def test_up_on_a_running_testbed_replaces_it(testbed: tb.Testbed) -> None:
    old = [tb.sshd_pid(h) for h in testbed.hosts]
    tb.up(len(testbed.hosts), testbed.base_dir)
    assert not any(tb.pid_alive(pid) for pid in old)
    assert all(ssh_run(testbed, h, "true")[0] == 0 for h in testbed.hosts)


def test_down_leaves_nothing_behind_and_is_idempotent(testbed: tb.Testbed) -> None:
    recorded = [tb.sshd_pid(h) for h in testbed.hosts] + [_start_stray_sleep(testbed, testbed.hosts[1])]
    keep = testbed.base_dir / "not-ours.txt"
    keep.write_text("left alone")
    try:
        tb.down(testbed.base_dir)
        tb.down(testbed.base_dir)
        assert not [ns for ns in _ip("netns", "list").split() if ns.startswith("lt-")]
        assert " lt-" not in _ip("-o", "link")
        assert not [pid for pid in recorded if tb.pid_alive(pid)]
        assert not testbed.known_hosts.exists() and keep.exists()
    finally:
        tb.up(len(testbed.hosts), testbed.base_dir)
    assert ssh_run(testbed, testbed.hosts[0], "hostname")[1].strip() == "lt-h1"
