"""The podman test image and the runtime commands launcher/plan/containers.py builds, run for real.

Each container is started with the argv ``run_argv`` makes, so these tests check the product's
commands against podman itself: the suite's interpreter and torch inside the image, secrets passed by
name and absent from every command line, host network and IPC, exit 137 for a kill by the runtime and
for the OOM killer, and (in testbed hosts) an image present on one host and missing on another.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import time
from pathlib import Path

import pytest

from launcher.plan.containers import (
    ContainerName,
    image_present_argv,
    remove_argv,
    run_argv,
    stop_argv,
)
from launcher.spec.container import Runtime
from tests.container_fixture import REPO_ROOT, TestImage, needs_podman
from tests.testbed_fixture import ssh_run
from tools import container_image as ci
from tools import testbed as tb

pytestmark = needs_podman
WORKDIR = str(REPO_ROOT)
START_TIMEOUT_S = 60.0


def _name(label: str) -> ContainerName:
    return ContainerName(f"ctest-{label}-{secrets.token_hex(4)}", 0)


def _podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=60)


def _containers_of(job_id: str) -> list[str]:
    """The names of every container of ``job_id``, running or stopped (by the label run_argv sets)."""
    listed = _podman("ps", "-a", "--filter", f"label=launch.job={job_id}", "--format", "{{.Names}}")
    return listed.stdout.split()


def _ended(name: ContainerName) -> tuple[int, bool]:
    """A stopped container's exit status and whether podman says the OOM killer ended it."""
    code, oom = _podman("inspect", "--type", "container", "--format", "{{.State.ExitCode}} {{.State.OOMKilled}}",
                        str(name)).stdout.split()
    return int(code), oom == "true"


def _kept(argv: list[str]) -> list[str]:
    """The product's run command without ``--rm``: the ended container stays to be inspected."""
    return [arg for arg in argv if arg != "--rm"]


def _podman_major() -> int:
    """Podman's major version (``podman version 4.3.1`` -> 4)."""
    return int(_podman("--version").stdout.split()[-1].split(".")[0])


def _wait_running(name: ContainerName, proc: subprocess.Popen) -> None:
    """Wait until podman reports ``name`` running (its process started)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while _podman("inspect", "--format", "{{.State.Running}}", str(name)).stdout.strip() != "true":
        assert proc.poll() is None, f"the container exited {proc.returncode} before running"
        assert time.monotonic() < deadline, f"{name} not running after {START_TIMEOUT_S} s"
        time.sleep(0.05)


def _accept_while_running(server: socket.socket, proc: subprocess.Popen) -> socket.socket:
    """The first connection to ``server``; fails as soon as ``proc`` exits without connecting."""
    server.settimeout(0.1)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            return server.accept()[0]
        except TimeoutError:
            assert proc.poll() is None, f"exited {proc.returncode} without connecting: {proc.stderr.read()}"
            assert time.monotonic() < deadline, f"no connection after {START_TIMEOUT_S} s"


def _command_lines() -> list[str]:
    """Every process's command line on this machine, arguments joined by spaces."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return lines


def test_a_container_runs_the_suites_python_and_imports_torch(container_image: TestImage, tmp_path: Path) -> None:
    import torch

    program = ("import json, os, sys, torch; print(json.dumps({'torch': torch.__version__, "
               "'container': os.environ.get('container'), 'marker': open('/etc/launch-test-image').read()}))")
    argv = run_argv(container_image.spec(), _name("torch"), [container_image.python, "-c", program],
                    [], WORKDIR, gpus=0)
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"torch": torch.__version__, "container": "podman",
                    "marker": f"launch test image {ci.SKELETON_VERSION}\n"}


def test_a_secret_passed_by_name_arrives_and_is_on_no_command_line(container_image: TestImage, tmp_path: Path) -> None:
    secret = f"lt-secret-{secrets.token_hex(16)}"
    program = "import os, sys; print(os.environ['LT_SECRET'], flush=True); sys.stdin.read()  # lt-secret-probe"
    spec = container_image.spec(options=[*container_image.options, "-i"])
    argv = run_argv(spec, _name("secret"), [container_image.python, "-c", program], ["LT_SECRET"], WORKDIR, gpus=0)
    proc = subprocess.Popen(argv, cwd=tmp_path, env={**os.environ, "LT_SECRET": secret}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == secret  # the value reached the container
        command_lines = _command_lines()
        ps = subprocess.run(["ps", "-eo", "args", "ww"], capture_output=True, text=True, check=True).stdout
        # the scan sees the container's own process (its program text), so it would see the secret too
        assert any("lt-secret-probe" in line and "podman" not in line for line in command_lines)
        assert not any(secret in line for line in command_lines)
        assert secret not in ps
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()


def test_host_network_and_ipc_are_the_hosts(container_image: TestImage, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        program = (f"import os, socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=30); "
                   "s.sendall(' '.join(os.readlink(f'/proc/self/ns/{n}') for n in ('net', 'ipc')).encode())")
        argv = run_argv(container_image.spec(), _name("net"), [container_image.python, "-c", program],
                        [], WORKDIR, gpus=0)
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        connection = _accept_while_running(server, proc)  # reached the host's loopback from inside
        with connection:
            namespaces = connection.recv(200).decode().split()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert namespaces == [os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/ipc")]


def test_a_container_killed_by_podman_exits_137(container_image: TestImage, tmp_path: Path) -> None:
    name = _name("kill")
    spec = container_image.spec(options=[*container_image.options, "-i"])
    argv = _kept(run_argv(spec, name, [container_image.python, "-c", "import sys; sys.stdin.read()"], [], WORKDIR,
                          gpus=0))
    proc = subprocess.Popen(argv, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_running(name, proc)
        assert _containers_of(name.job_id) == [str(name)]
        assert _podman("kill", str(name)).returncode == 0
        assert proc.wait(timeout=60) == 137
        assert _ended(name) == (137, False)
        assert not (tmp_path / "oom").exists()  # conmon's OOM marker: not an OOM kill
    finally:
        proc.kill()
        removed = _podman(*remove_argv(Runtime.PODMAN, name)[1:])
    assert removed.returncode == 0, removed.stderr
    assert _containers_of(name.job_id) == []


def test_stop_by_name_sends_sigterm_first_and_rm_leaves_no_container(container_image: TestImage,
                                                                     tmp_path: Path) -> None:
    name = _name("stop")
    program = ("import signal, sys\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(43))\n"
               "print('ready', flush=True)\nsignal.pause()")
    argv = run_argv(container_image.spec(), name, [container_image.python, "-c", program], [], WORKDIR, gpus=0)
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"  # its SIGTERM handler is installed
        grace_s = 30.0
        stopped = _podman(*stop_argv(Runtime.PODMAN, name, grace_s)[1:])
        assert stopped.returncode == 0, stopped.stderr
        assert proc.wait(timeout=60) == 43  # its handler's status: a SIGKILL after the grace would give 137
    finally:
        proc.kill()
    assert _containers_of(name.job_id) == []  # --rm
    assert _podman(*remove_argv(Runtime.PODMAN, name)[1:]).returncode == 0  # removing a gone one succeeds


def test_a_container_over_its_memory_limit_exits_137_and_the_kernel_log_names_it(
        container_image: TestImage, tmp_path: Path) -> None:
    name = _name("oom")
    spec = container_image.spec(options=[*container_image.options, "--memory", "64m", "--memory-swap", "64m", "-i"])
    program = "import sys; sys.stdin.readline(); hog = []\nwhile True: hog.append(bytearray(1 << 20))"
    argv = _kept(run_argv(spec, name, [container_image.python, "-c", program], [], WORKDIR, gpus=0))
    proc = subprocess.Popen(argv, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_running(name, proc)
        pid = int(_podman("inspect", "--format", "{{.State.Pid}}", str(name)).stdout)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=120) == 137
        kernel_log = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
        assert re.search(rf"out of memory: Killed process {pid} \(python", kernel_log), kernel_log[-2000:]
        code, oom_killed = _ended(name)
        assert code == 137
        # Podman says so too: OOMKilled from 5.0 on; before, conmon only drops an empty `oom` file into the
        # working directory of the command that started the container (containers/podman#13102, conmon#504).
        if _podman_major() >= 5:
            assert oom_killed
        else:
            assert (tmp_path / "oom").exists()
    finally:
        proc.kill()
        _podman(*remove_argv(Runtime.PODMAN, name)[1:])


@pytest.mark.testbed
def test_an_image_present_on_one_host_and_missing_on_another(testbed: tb.Testbed, container_image: TestImage) -> None:
    h1, h2 = testbed.hosts[:2]
    spec = container_image.spec()
    present = shlex.join(image_present_argv(spec))
    with ci.own_image_store(h2):
        assert ssh_run(testbed, h1, present)[0] == 0   # h1 shares the machine's store
        assert ssh_run(testbed, h2, present)[0] == 1   # h2's own store is empty
        program = ["/bin/true"]
        status, _, err = ssh_run(testbed, h2, shlex.join(run_argv(spec, _name("missing"), program, [], WORKDIR, 0)))
        assert (status, err.strip()) == (125, f"Error: {spec.image}: image not known")

        ci.build_image(spec.image, host=h2)
        assert ssh_run(testbed, h2, present)[0] == 0
        probe = (f"import socket; s = socket.create_connection(('{h1.address}', {tb.SSH_PORT}), timeout=10); "
                 "print(socket.gethostname(), s.recv(7).decode())")
        argv = run_argv(spec, _name("inhost"), [container_image.python, "-c", probe], [], WORKDIR, gpus=0)
        status, out, err = ssh_run(testbed, h2, shlex.join(argv), timeout=300)
        assert (status, out.split()) == (0, [h2.name, "SSH-2.0"]), err
    assert ssh_run(testbed, h2, present)[0] == 0  # the machine's store again


FAKE_CDI_SPEC = {  # CDI is plain JSON/YAML (github.com/cncf-tags/container-device-interface, SPEC.md, version 0.5.0)
    "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
    "devices": [{"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"},
                                                                   {"path": "/dev/nvidia1", "hostPath": "/dev/zero"}]}}],
    "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/null"}]},
}


def test_a_gpu_nodes_container_gets_the_devices_of_a_cdi_spec(container_image: TestImage, tmp_path: Path) -> None:
    """The GPU flag launch gives podman (``--device nvidia.com/gpu=all``) run for real through a fake CDI spec in
    /run/cdi (a spec dir podman 4.3 reads): the container sees the spec's device nodes and environment. Docker 20.10
    (Debian's docker.io) has no CDI: Docker nodes get ``--gpus all``, which needs NVIDIA's runtime, not tried here."""
    if any(path for d in ("/etc/cdi", "/run/cdi") for path in Path(d).glob("nvidia*")):
        pytest.skip("this machine has a CDI spec for NVIDIA devices: a fake one would conflict with it")
    spec_file = Path("/run/cdi/launch-test-fake-gpu.json")
    spec_file.parent.mkdir(exist_ok=True)
    spec_file.write_text(json.dumps(FAKE_CDI_SPEC))
    program = ("import json, os, stat; print(json.dumps({'devices': sorted(d for d in os.listdir('/dev') if d.startswith"
               "('nvidia') and stat.S_ISCHR(os.stat('/dev/' + d).st_mode)), 'visible': os.environ.get('NVIDIA_VISIBLE_DEVICES')}))")
    try:
        argv = run_argv(container_image.spec(), _name("cdi"), [container_image.python, "-c", program], [], WORKDIR,
                        gpus=2)
        assert ("--device", "nvidia.com/gpu=all") in set(zip(argv, argv[1:]))
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        spec_file.unlink()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"devices": ["nvidia0", "nvidia1", "nvidiactl"], "visible": "all"}
