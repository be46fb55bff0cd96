"""A Docker daemon of its own in each testbed host, as each real node has its own.

Docker's ``--network host`` is the network of the dockerd that makes the container, not of the client that asks:
each host runs its own ``dockerd`` inside its sshd's namespaces (mount, network, UTS), with its own data root, exec
root and socket under the machine's /run and /var/lib. Its socket is bound over ``/run/docker.sock`` in that host's
mount namespace only, so a ``docker`` client in an SSH session of the host reaches the host's own daemon, as on a
node. Found on these machines (docs: /work/shared/notes/testbeds.md): ``--storage-driver vfs`` (no overlay here),
``--iptables=false --bridge=none`` (by default dockerd sets FORWARD to DROP and loads br_netfilter, which cuts the
hosts' bridge), images from ``docker import`` of the skeleton root file system (no registry).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import container_image as ci
from tools import testbed as tb

DEFAULT_SOCKET = "/run/docker.sock"  # what a docker client uses without DOCKER_HOST (/var/run is /run)
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class DockerHostError(RuntimeError):
    """A host's dockerd did not start, or did not stop."""


@dataclass(frozen=True)
class HostDocker:
    """One host's daemon: where its state is, its socket on the machine, its PID."""

    host: tb.Host
    root: Path  # data root, exec root and log under it
    socket: Path
    pid: int

    def docker(self, *args: str) -> list[str]:
        """A docker command talking to this host's daemon (from the machine, with -H)."""
        return ["docker", "-H", f"unix://{self.socket}", *args]


def _root(host: tb.Host) -> Path:
    # short: a unix socket's path is at most 107 bytes; exec roots hold containerd's sockets
    return Path("/run/launch-docker") / host.name


def _run(argv: Sequence[str], timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=tb.HOST_ENV)
    if check and done.returncode:
        raise DockerHostError(f"{' '.join(argv[:6])} failed (exit {done.returncode}): {(done.stderr or done.stdout)[-800:]}")
    return done


def start(host: tb.Host) -> HostDocker:
    """Start ``host``'s own dockerd in its sshd's namespaces, wait until it answers, bind its socket over
    /run/docker.sock in the host, and record its PIDs (dockerd, its containerd) as the host's daemons."""
    root = _root(host)
    shutil.rmtree(root, ignore_errors=True)
    (root / "exec").mkdir(parents=True, mode=0o700)
    data = host.dir / "docker-data"
    socket = root / "docker.sock"
    log = open(host.dir / "dockerd.log", "ab")  # noqa: SIM115 - the daemon's, closed below once it is started
    argv = ["dockerd", "--storage-driver", "vfs", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
            "--bridge=none", "--userland-proxy=false", "--data-root", str(data), "--exec-root", str(root / "exec"),
            "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{socket}", "--log-level", "warn"]
    with log:
        proc = subprocess.Popen(["nsenter", "-t", str(ci._sshd_pid(host)), "-m", "-n", "-u", "--", *argv],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=tb.HOST_ENV,
                                start_new_session=True)
    daemon = HostDocker(host, root, socket, proc.pid)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while _run(daemon.docker("version", "--format", "{{.Server.Version}}"), check=False).returncode:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(daemon)
            tail = (host.dir / "dockerd.log").read_text(errors="replace")[-1500:]
            raise DockerHostError(f"{host.name}: dockerd did not answer (exit {proc.poll()}): {tail}")
        time.sleep(0.2)
    if not os.path.lexists(DEFAULT_SOCKET):
        Path(DEFAULT_SOCKET).touch(mode=0o600)  # a mount point for the hosts' binds; no daemon answers on it here
    ci.in_host(host, ["mount", "--bind", str(socket), DEFAULT_SOCKET])
    _record(daemon)
    return daemon


def _record(daemon: HostDocker) -> None:
    """The host's daemon PIDs in its ``*.pid`` files (tools.testbed.daemon_pids): not a job's leftovers."""
    children = _run(["pgrep", "-P", str(daemon.pid)], check=False).stdout.split()
    (daemon.host.dir / "dockerd.pid").write_text(f"{daemon.pid}\n")
    for index, pid in enumerate(children):
        (daemon.host.dir / f"dockerd-child{index}.pid").write_text(f"{pid}\n")


def stop(daemon: HostDocker) -> None:
    """Remove every container, stop the daemon (TERM, then KILL), unbind its socket and delete its state."""
    host = daemon.host
    with contextlib.suppress(DockerHostError, subprocess.TimeoutExpired):
        names = _run(daemon.docker("ps", "-aq"), check=False, timeout=30).stdout.split()
        if names:
            _run(daemon.docker("rm", "-f", *names), check=False, timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while tb.pid_alive(daemon.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid_file in host.dir.glob("dockerd*.pid"):
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
    if tb.sshd_pid(host) is not None:
        ci.in_host(host, ["umount", DEFAULT_SOCKET], check=False)
    shutil.rmtree(daemon.root, ignore_errors=True)
    shutil.rmtree(host.dir / "docker-data", ignore_errors=True)


def release_default_socket() -> None:
    """Delete the empty mount point ``start`` made at /run/docker.sock, once no host binds over it."""
    path = Path(DEFAULT_SOCKET)
    with contextlib.suppress(OSError):
        if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
            path.unlink()


def build_image(daemon: HostDocker, name: str = ci.DEFAULT_IMAGE) -> None:
    """Import the skeleton root file system (tools/container_image.py) as ``name`` into the host's daemon."""
    with tempfile.TemporaryDirectory(prefix="launch-docker-image-") as tmp:
        archive = Path(tmp) / "rootfs.tar"
        ci.write_rootfs_tar(archive)
        _run(daemon.docker("import", "--change", 'CMD ["/bin/sh"]', str(archive), name))


IB_DEVICES = "/dev/infiniband"
FAKE_HCA = "mlx5_0"


@contextlib.contextmanager
def fake_infiniband(hosts: Sequence[tb.Host]) -> Iterator[None]:
    """``hosts`` look like InfiniBand nodes to launch's probe inside the block, in their mount namespaces only: an HCA
    in /sys/class/infiniband (a tmpfs over /sys/class, the host's /sys/class/net moved back into it) and a device
    node /dev/infiniband/uverbs0 (a tmpfs on a directory made in the machine's /dev; the node is /dev/null's: no
    verbs work, the container only has to see it)."""
    made = not os.path.lexists(IB_DEVICES)
    if made:
        os.mkdir(IB_DEVICES, 0o755)
    done: list[tb.Host] = []
    try:
        for host in hosts:
            keep = _root(host) / "sys-class-net"
            keep.mkdir(parents=True, exist_ok=True)
            done.append(host)
            for argv in (["mount", "--bind", "/sys/class/net", str(keep)], ["mount", "-t", "tmpfs", "fake-class", "/sys/class"],
                         ["mkdir", "-p", "/sys/class/net", f"/sys/class/infiniband/{FAKE_HCA}"],
                         ["mount", "--move", str(keep), "/sys/class/net"],
                         ["mount", "-t", "tmpfs", "fake-ib", IB_DEVICES], ["mknod", f"{IB_DEVICES}/uverbs0", "c", "1", "3"]):
                ci.in_host(host, argv)
        yield
    finally:
        for host in done:
            for target in (IB_DEVICES, "/sys/class/net", "/sys/class", str(_root(host) / "sys-class-net")):
                ci.in_host(host, ["umount", target], check=False)
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(IB_DEVICES)


def containers(host: tb.Host, label: str) -> list[str]:
    """Names of ``host``'s containers (running or stopped) with ``label``, asked as its SSH sessions would."""
    done = ci.in_host(host, ["docker", "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"])
    return done.stdout.split()
