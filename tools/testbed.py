"""Multi-host SSH testbed: N hosts made of Linux network namespaces on one bridge.

Host ``lt-hI`` is namespace ``lt-hI`` at ``10.77.0.(10+I)/24`` on bridge ``lt-br0``
(``10.77.0.1/24``, root namespace) through veth ``lt-vI``. It runs its own ``sshd -D``
under ``unshare --uts --mount``: own hostname, ``/etc/hosts`` (every host),
``/etc/resolv.conf`` (``nameserver 127.0.0.1``: the machine's nameserver is
unreachable there and every miss would wait for it), and empty ``/root/.bashrc`` and
``/root/.profile`` (root's run pyenv on every SSH command): call interpreters by
absolute path; cgroup v1 hierarchies on ``/sys/fs/cgroup`` (slurmd and runc need them).
Everything written lives under ``base_dir``. One testbed a set of names: ``up`` tears down
whatever has its names. ``Names`` moves a second testbed (a benchmark's) to another prefix,
bridge and subnet, so it never touches the default one (the suite's, CI's). ``tools/enter_host.py`` is the step that enters
a host. See docs/TESTBED.md.

Needs root, ``iproute2``, ``util-linux`` and ``openssh-server``; stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "lt-"
BRIDGE = "lt-br0"
SUBNET = "10.77.0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
SSH_PORT = 22
SSH_USER = "root"
MAX_HOSTS = 200
SSHD = "/usr/sbin/sshd"
SSHD_PRIVSEP_DIR = Path("/run/sshd")
HIDDEN_DOTFILES = ("/root/.bashrc", "/root/.profile")
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
# What commands entering a host start with: sshd's default PATH, none of ours (pyenv shims).
HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8"}
# The step that enters a host (run as a script, by path: it imports nothing of ours).
ENTER_HOST = Path(__file__).resolve().with_name("enter_host.py")
READY_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 5.0
_PLAIN = re.compile(r"[A-Za-z0-9_./+-]+")
_PREFIX_SHAPE = re.compile(r"[a-z]{1,4}-")
_SUBNET_SHAPE = re.compile(r"10\.([0-9]{1,3})\.([0-9]{1,3})")
_GENERATED_FILES = ("testbed.json", "id_ed25519", "id_ed25519.pub", "authorized_keys",
                    "known_hosts", "ssh_config")


@dataclass(frozen=True)
class Names:
    """What a testbed's names and addresses are made of: hosts ``{prefix}hI`` at ``{subnet}.(10+I)``,
    veths ``{prefix}vI``, bridge ``{prefix}br0`` at ``{subnet}.1``. The default is the suite's."""

    prefix: str = PREFIX
    subnet: str = SUBNET

    def __post_init__(self) -> None:
        if not _PREFIX_SHAPE.fullmatch(self.prefix):
            raise TestbedError(f"prefix {self.prefix!r}: 1-4 lowercase letters and a dash (interface names are short)")
        shape = _SUBNET_SHAPE.fullmatch(self.subnet)
        if not shape or not all(0 <= int(octet) <= 255 for octet in shape.groups()):
            raise TestbedError(f"subnet {self.subnet!r}: three octets of 10.0.0.0/8, e.g. 10.78.0")

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def bridge_address(self) -> str:
        return f"{self.subnet}.1"

    def host_dir(self) -> re.Pattern[str]:
        """The name of a host's directory under base_dir."""
        return re.compile(re.escape(self.prefix) + r"h[0-9]+")


class TestbedError(RuntimeError):
    """A testbed operation failed; the message says which host and why."""

    __test__ = False  # not a pytest test class despite the name


@dataclass(frozen=True)
class Host:
    """One testbed host: a network namespace running its own sshd."""

    name: str
    address: str
    namespace: str
    veth: str
    base_dir: Path

    @property
    def dir(self) -> Path:
        """This host's directory under base_dir (sshd config, key, pid, log)."""
        return self.base_dir / self.name

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def sshd_config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def pid_file(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / "sshd.log"


@dataclass(frozen=True)
class Testbed:
    """A running testbed: its hosts and the files SSH clients need."""

    __test__ = False  # not a pytest test class despite the name

    hosts: tuple[Host, ...]
    base_dir: Path
    key_file: Path
    known_hosts: Path
    ssh_config: Path
    names: Names = Names()

    def host(self, name: str) -> Host:
        """The host called ``name``; TestbedError lists the valid names otherwise."""
        for host in self.hosts:
            if host.name == name:
                return host
        names = ", ".join(h.name for h in self.hosts)
        raise TestbedError(f"no testbed host {name!r}; hosts are: {names}")

    def cluster_yaml(self, python: str, n: int | None = None, workdir: str | None = None) -> str:
        """A cluster spec (backend ssh) for the first ``n`` hosts (all by default)."""
        count = len(self.hosts) if n is None else n
        if not 1 <= count <= len(self.hosts):
            raise TestbedError(f"n must be between 1 and {len(self.hosts)}, got {n}")
        lines = [
            "name: testbed",
            "backend: ssh",
            f"ssh: {{user: {SSH_USER}, port: {SSH_PORT}, key_file: {self.key_file}, "
            f"known_hosts: {self.known_hosts}, config_file: {self.ssh_config}}}",
            "nodes:",
            *(f"  - {{host: {h.name}, address: {h.address}, gpus: 0}}" for h in self.hosts[:count]),
            f"python: {_yaml_string(python)}",
            f"workdir: {_yaml_string(workdir or '/tmp')}",
        ]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class HostStatus:
    """What ``status`` found for one host."""

    host: Host
    namespace_exists: bool
    sshd_pid: int | None
    link_up: bool


def _yaml_string(value: str) -> str:
    """``value`` as a YAML scalar: bare when plainly safe, else double-quoted."""
    return value if _PLAIN.fullmatch(value) else json.dumps(value)


def _layout(n: int, base_dir: Path, names: Names = Names()) -> Testbed:
    """Names, addresses and paths of an ``n``-host testbed under ``base_dir`` (no I/O)."""
    prefix = names.prefix
    hosts = tuple(
        Host(name=f"{prefix}h{i}", address=f"{names.subnet}.{10 + i}", namespace=f"{prefix}h{i}",
             veth=f"{prefix}v{i}", base_dir=base_dir)
        for i in range(1, n + 1)
    )
    return Testbed(hosts=hosts, base_dir=base_dir, key_file=base_dir / "id_ed25519",
                   known_hosts=base_dir / "known_hosts", ssh_config=base_dir / "ssh_config", names=names)


def _etc_dir(base_dir: Path) -> Path:
    """Where the files bind-mounted into every host live."""
    return base_dir / "etc"


def _bind_mounts(base_dir: Path) -> list[tuple[str, str]]:
    """(source, target) pairs mounted over the root filesystem inside every host."""
    etc = _etc_dir(base_dir)
    mounts = [(str(etc / "hosts"), "/etc/hosts"), (str(etc / "resolv.conf"), "/etc/resolv.conf")]
    mounts += [(str(etc / "empty"), dotfile) for dotfile in HIDDEN_DOTFILES if os.path.exists(dotfile)]
    return mounts


def _run(argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0) -> str:
    """Run ``argv``; return its stdout, or raise TestbedError with its stderr."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedError(f"{argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _ip_batch(commands: Sequence[str], namespace: str | None = None) -> None:
    """Run ``ip`` commands in one process (``ip -batch``), in ``namespace`` if given."""
    argv = ["ip"] + (["-n", namespace] if namespace else []) + ["-batch", "-"]
    _run(argv, stdin="\n".join(commands) + "\n")


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a running process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_dead(pids: Sequence[int], what: str, timeout: float = KILL_TIMEOUT_S) -> None:
    """Wait until none of ``pids`` runs; TestbedError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while live := [pid for pid in pids if pid_alive(pid)]:
        if time.monotonic() > deadline:
            raise TestbedError(f"{what}: processes {live} still running after {timeout:.0f} s")
        time.sleep(0.005)


# ---------------------------------------------------------------- files under base_dir

def _generate_keys(keys: Sequence[tuple[Path, str]]) -> None:
    """Generate ed25519 key pairs (path, comment) in parallel, replacing old ones."""
    for key, _ in keys:
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
    procs = [(key, subprocess.Popen(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for key, comment in keys]
    for key, proc in procs:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            raise TestbedError(f"ssh-keygen for {key} exited {proc.returncode}: {output.strip()}")


def _public_key(key: Path) -> str:
    """``type base64`` of the public half of ``key``."""
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def _sshd_config(host: Host) -> str:
    """sshd_config of ``host``: keys only, root allowed, no client environment. A session whose client vanished
    while the host was cut off (its connection reset there, no FIN ever came) ends at the next client-alive message
    once the host is back, as on a node with keepalives, instead of idling for TCP's two hours; a stopped client
    (SIGSTOP, its kernel still acknowledging) keeps its sessions for 10 minutes."""
    return "\n".join([
        f"# {host.name}: generated by tools/testbed.py",
        f"Port {SSH_PORT}",
        f"HostKey {host.host_key}",
        f"PidFile {host.pid_file}",
        f"AuthorizedKeysFile {host.base_dir / 'authorized_keys'}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin prohibit-password",
        "MaxSessions 64",
        "MaxStartups 100",
        "UseDNS no",
        "ClientAliveInterval 5",
        "ClientAliveCountMax 120",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "Subsystem sftp internal-sftp",
    ]) + "\n"


def _ssh_config(testbed: Testbed) -> str:
    """ssh_config for OpenSSH tools: ``ssh -F base_dir/ssh_config lt-h1``."""
    blocks = [
        f"Host {h.name}\n"
        f"    HostName {h.address}\n"
        f"    User {SSH_USER}\n"
        f"    Port {SSH_PORT}\n"
        f"    IdentityFile {testbed.key_file}\n"
        f"    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {testbed.known_hosts}\n"
        f"    StrictHostKeyChecking yes\n"
        f"    BatchMode yes\n"
        for h in testbed.hosts
    ]
    return "\n".join(blocks)


def _etc_hosts(testbed: Testbed) -> str:
    """/etc/hosts of every host: localhost and every testbed host, itself included."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address} {h.name}" for h in testbed.hosts]
    return "\n".join(lines) + "\n"


def write_known_hosts(testbed: Testbed) -> None:
    """Write known_hosts from the hosts' current keys, under both name and address."""
    lines = [f"{h.name},{h.address} {_public_key(h.host_key)}" for h in testbed.hosts]
    testbed.known_hosts.write_text("\n".join(lines) + "\n")


def _write_files(testbed: Testbed) -> None:
    """Create base_dir's keys and configuration files for every host."""
    etc = _etc_dir(testbed.base_dir)
    etc.mkdir(parents=True, exist_ok=True)
    for host in testbed.hosts:
        host.dir.mkdir(exist_ok=True)
    _generate_keys([(testbed.key_file, f"{SSH_USER}@testbed")]
                   + [(h.host_key, h.name) for h in testbed.hosts])
    (testbed.base_dir / "authorized_keys").write_text(_public_key(testbed.key_file) + "\n")
    (etc / "hosts").write_text(_etc_hosts(testbed))
    (etc / "resolv.conf").write_text(RESOLV_CONF)
    (etc / "empty").write_text("")
    for host in testbed.hosts:
        host.sshd_config.write_text(_sshd_config(host))
    testbed.ssh_config.write_text(_ssh_config(testbed))
    write_known_hosts(testbed)
    (testbed.base_dir / "testbed.json").write_text(json.dumps(
        {"hosts": [h.name for h in testbed.hosts], "prefix": testbed.names.prefix, "subnet": testbed.names.subnet},
        indent=2) + "\n")


def _remove_files(base_dir: Path, names: Names = Names()) -> None:
    """Remove what ``_write_files`` and the sshds created in base_dir, nothing else."""
    if not base_dir.is_dir():
        return
    for name in _GENERATED_FILES:
        (base_dir / name).unlink(missing_ok=True)
    shutil.rmtree(_etc_dir(base_dir), ignore_errors=True)
    for entry in base_dir.iterdir():
        if entry.is_dir() and names.host_dir().fullmatch(entry.name):
            shutil.rmtree(entry)


# ---------------------------------------------------------------- network

def _create_network(testbed: Testbed) -> None:
    """Namespaces, bridge and veths (one ``ip -batch``), then each namespace's addresses."""
    bridge = testbed.names.bridge
    root = [f"netns add {h.namespace}" for h in testbed.hosts]
    root += [f"link add {bridge} type bridge", f"addr add {testbed.names.bridge_address}/24 dev {bridge}",
             f"link set {bridge} up"]
    for h in testbed.hosts:
        root += [f"link add {h.veth} type veth peer name eth0 netns {h.namespace}",
                 f"link set {h.veth} master {bridge} up"]
    _ip_batch(root)
    for h in testbed.hosts:
        _ip_batch(["link set lo up", f"addr add {h.address}/24 dev eth0", "link set eth0 up"],
                  namespace=h.namespace)


def _testbed_namespaces(prefix: str = PREFIX) -> list[str]:
    """Every network namespace whose name starts with the testbed prefix."""
    listing = _run(["ip", "-j", "netns", "list"]).strip()
    return [ns["name"] for ns in json.loads(listing or "[]") if ns["name"].startswith(prefix)]


def _testbed_links(prefix: str = PREFIX) -> list[str]:
    """Every root-namespace link whose name starts with the testbed prefix."""
    return [link["ifname"] for link in json.loads(_run(["ip", "-j", "link", "show"]))
            if link["ifname"].startswith(prefix)]


def _namespace_pids(namespace: str) -> list[int]:
    """PIDs of the (non-zombie) processes in ``namespace``, via ``ip netns pids``."""
    return [int(pid) for pid in _run(["ip", "netns", "pids", namespace]).split()]


def _kill_namespace_processes(namespaces: Sequence[str]) -> None:
    """SIGKILL every process in ``namespaces`` until none is left (new ones included)."""
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while live := [pid for ns in namespaces for pid in _namespace_pids(ns) if pid_alive(pid)]:
        if time.monotonic() > deadline:
            raise TestbedError(f"processes {live} in {', '.join(namespaces)} survive SIGKILL")
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def link_down(host: Host) -> None:
    """Cut ``host`` off the bridge (its veth goes down; packets to it are lost)."""
    _run(["ip", "link", "set", host.veth, "down"])


def link_up(host: Host) -> None:
    """Reconnect ``host`` to the bridge."""
    _run(["ip", "link", "set", host.veth, "up"])


def ssh_blocked(host: Host, blocked: bool) -> None:
    """Drop (or stop dropping) every packet to ``host``'s port 22, inside its namespace (iptables): SSH to it
    stalls while the host and its other ports (the ranks' own traffic) carry on."""
    rule = ["INPUT", "-p", "tcp", "--dport", str(SSH_PORT), "-j", "DROP"]
    _run(["ip", "netns", "exec", host.namespace, "iptables", "-I" if blocked else "-D", *rule])


def _link_is_up(veth: str) -> bool:
    """True when ``veth`` exists and is administratively up."""
    try:
        links = json.loads(_run(["ip", "-j", "link", "show", "dev", veth]))
    except TestbedError:
        return False
    return "UP" in links[0]["flags"]


# ---------------------------------------------------------------- entering a host

def _enter_argv(host: Host, command: Sequence[str], *, detach: bool = False) -> list[str]:
    """argv that runs ``command`` as ``host`` sees the world: its network, name and files."""
    binds = [arg for source, target in _bind_mounts(host.base_dir) for arg in ("--bind", source, target)]
    return ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "--mount",
            sys.executable, "-I", "-S", str(ENTER_HOST),
            "--hostname", host.name, *binds, *(["--detach"] if detach else []), "--", *command]


def exec_in(host: Host, argv: Sequence[str], *, timeout: float = 30.0,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``host`` (its namespace, hostname and files); capture its output.

    Works whether or not the host's sshd runs; the environment is HOST_ENV. With ``check``, a non-zero exit
    raises TestbedError carrying stderr.
    """
    try:
        done = subprocess.run(_enter_argv(host, argv), env=HOST_ENV, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"{host.name}: `{' '.join(argv)}` still running after {timeout} s") from exc
    if check and done.returncode != 0:
        raise TestbedError(f"{host.name}: `{' '.join(argv)}` exited {done.returncode}: "
                           f"{done.stderr.strip()}")
    return done


def daemon_pids(host: Host) -> set[int]:
    """PIDs of ``host``'s running daemons: its sshd listener and those ``start_daemon`` started
    (each recorded in a ``*.pid`` file of the host's directory)."""
    recorded = set()
    for pid_file in host.dir.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            recorded.add(int(pid_file.read_text()))
    return {pid for pid in recorded if pid_alive(pid)}


def pids(host: Host) -> list[int]:
    """PIDs of the processes in ``host``'s namespace other than its daemons (``daemon_pids``):
    what a job left behind."""
    daemons = daemon_pids(host)
    return sorted(pid for pid in _namespace_pids(host.namespace) if pid not in daemons)


def tagged_pids(host: Host, tag: str) -> list[int]:
    """PIDs in ``host``'s namespace (``pids``) whose environment holds the entry ``tag`` exactly, e.g.
    ``LAUNCH_JOB_ID=<id>``: one job's processes on that host (a process that exits meanwhile is left out)."""
    needle = tag.encode()
    found = []
    for pid in pids(host):
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") and pid_alive(pid):
                found.append(pid)
    return found


def start_daemon(host: Host, name: str, argv: Sequence[str]) -> int:
    """Start ``argv`` (a program that stays in the foreground) detached inside ``host``;
    record its PID in ``host.dir/NAME.pid`` (so ``pids`` leaves it out) and return it.

    ``down`` ends it with every other process of the host.
    """
    pid = _spawned_pid(host, _spawn_detached(host, argv), name)
    (host.dir / f"{name}.pid").write_text(f"{pid}\n")
    return pid


def daemon_pid(host: Host, name: str) -> int | None:
    """PID of the daemon ``start_daemon`` started as ``name`` in ``host``, None when it does not run."""
    try:
        pid = int((host.dir / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) and pid in _namespace_pids(host.namespace) else None


def stop_daemon(host: Host, name: str, sig: signal.Signals = signal.SIGTERM) -> None:
    """Send ``sig`` to the daemon ``start_daemon`` started as ``name`` in ``host``, wait until it
    is gone and forget it; no-op when it is not running."""
    if (pid := daemon_pid(host, name)) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        _wait_dead([pid], f"{host.name}: {name}")
    (host.dir / f"{name}.pid").unlink(missing_ok=True)


# ---------------------------------------------------------------- sshd

def sshd_pid(host: Host) -> int | None:
    """PID of ``host``'s sshd listener, or None when it is not running."""
    try:
        pid = int(host.pid_file.read_text())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def _spawn_detached(host: Host, argv: Sequence[str]) -> subprocess.Popen[str]:
    """Start ``argv`` detached in ``host``; the process prints the program's PID and exits."""
    return subprocess.Popen(_enter_argv(host, argv, detach=True), env=HOST_ENV, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _spawned_pid(host: Host, proc: subprocess.Popen[str], name: str = "sshd") -> int:
    """The PID of the detached program (``name``) that ``proc``, a ``--detach`` entry step, reports."""
    try:
        out, err = proc.communicate(timeout=READY_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        raise TestbedError(f"{host.name}: {name} launcher hung for {READY_TIMEOUT_S:.0f} s") from exc
    if proc.returncode != 0 or not out.strip().isdigit():
        raise TestbedError(f"{host.name}: could not start {name} (exit {proc.returncode}): {err.strip()}")
    return int(out)


def _log_tail(host: Host, lines: int = 5) -> str:
    """The last lines of ``host``'s sshd log, on one line, for error messages."""
    try:
        return " | ".join(host.log_file.read_text().splitlines()[-lines:])
    except OSError:
        return "(no sshd log)"


def _accepts_connections(host: Host) -> bool:
    """True when a TCP connection to ``host``'s SSH port succeeds."""
    try:
        with socket.create_connection((host.address, SSH_PORT), timeout=0.2):
            return True
    except OSError:
        return False


def _wait_listening(host: Host, pid: int, deadline: float) -> None:
    """Wait until ``host``'s sshd (``pid``) accepts TCP connections and has written its
    pid file (it does so right after listening), or raise naming the host."""
    while not (_accepts_connections(host) and sshd_pid(host) == pid):
        if not pid_alive(pid):
            raise TestbedError(f"{host.name}: sshd exited at start: {_log_tail(host)}")
        if time.monotonic() > deadline:
            raise TestbedError(f"{host.name}: sshd at {host.address}:{SSH_PORT} not accepting "
                               f"connections after {READY_TIMEOUT_S:.0f} s: {_log_tail(host)}")
        time.sleep(0.005)


def _start_sshds(hosts: Sequence[Host]) -> None:
    """Start the sshd of every host in parallel and wait until all listen."""
    SSHD_PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    for host in hosts:
        if (pid := sshd_pid(host)) is not None:
            raise TestbedError(f"{host.name}: sshd already running (pid {pid})")
    spawned = [(host, _spawn_detached(host, [SSHD, "-D", "-f", str(host.sshd_config), "-E", str(host.log_file)]))
               for host in hosts]
    started = [(host, _spawned_pid(host, proc)) for host, proc in spawned]
    deadline = time.monotonic() + READY_TIMEOUT_S
    for host, pid in started:
        _wait_listening(host, pid, deadline)


def start_sshd(host: Host) -> None:
    """Start ``host``'s sshd and wait until it accepts connections."""
    _start_sshds([host])


def stop_sshd(host: Host) -> None:
    """Stop ``host``'s sshd listener (open sessions keep running); no-op if stopped."""
    pid = sshd_pid(host)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        _wait_dead([pid], f"{host.name}: sshd")
    host.pid_file.unlink(missing_ok=True)


def rotate_host_key(host: Host) -> None:
    """Give ``host`` a new host key and restart its sshd; known_hosts is left stale."""
    stop_sshd(host)
    _generate_keys([(host.host_key, host.name)])
    start_sshd(host)


# ---------------------------------------------------------------- whole testbed

def _require_root() -> None:
    """Raise TestbedError unless we are root and sshd is installed."""
    if os.geteuid() != 0:
        raise TestbedError("network namespaces need root")
    if not os.access(SSHD, os.X_OK):
        raise TestbedError(f"{SSHD} not found: install openssh-server")


def _checked_base_dir(base_dir: str | os.PathLike[str]) -> Path:
    """``base_dir`` as an absolute path that sshd_config and YAML take unquoted."""
    path = Path(base_dir).resolve()
    if not _PLAIN.fullmatch(str(path)):
        raise TestbedError(f"base_dir {str(path)!r} may only contain letters, digits and _ . / + -")
    return path


def up(n: int, base_dir: str | os.PathLike[str], names: Names = Names()) -> Testbed:
    """Bring up ``n`` hosts, tearing down any testbed of the same ``names`` first; return once every sshd listens.

    On failure everything created is torn down again before TestbedError propagates.
    """
    _require_root()
    if not 1 <= n <= MAX_HOSTS:
        raise TestbedError(f"n must be between 1 and {MAX_HOSTS}, got {n}")
    path = _checked_base_dir(base_dir)
    down(path, names)
    path.mkdir(parents=True, exist_ok=True)
    testbed = _layout(n, path, names)
    try:
        log.info("writing keys and configs for %d hosts under %s", n, path)
        _write_files(testbed)
        log.info("creating namespaces %s..%s on bridge %s", testbed.hosts[0].name,
                 testbed.hosts[-1].name, names.bridge)
        _create_network(testbed)
        log.info("starting %d sshd", n)
        _start_sshds(testbed.hosts)
    except BaseException:
        down(path, names)
        raise
    return testbed


def down(base_dir: str | os.PathLike[str], names: Names | None = None) -> None:
    """Tear down any testbed of ``names`` (idempotent): processes, links, namespaces, base_dir's files.

    Kills every process in every namespace of the prefix (``lt-`` by default) by PID, deletes
    every link and namespace of the prefix, and removes the generated files in ``base_dir`` only.
    Without ``names``, those recorded by the ``up`` under ``base_dir`` (the default when none).
    """
    _require_root()
    path = Path(base_dir).resolve()
    names = names or _recorded_names(path)
    namespaces = _testbed_namespaces(names.prefix)
    if namespaces:
        log.info("killing processes in %s", ", ".join(namespaces))
        _kill_namespace_processes(namespaces)
    links = _testbed_links(names.prefix)
    if links or namespaces:
        log.info("deleting links %s and namespaces", ", ".join(links) or "(none)")
        _ip_batch([f"link delete {link}" for link in links]
                  + [f"netns delete {ns}" for ns in namespaces])
    _remove_files(path, names)


def _recorded_names(path: Path) -> Names:
    """The names the testbed under ``path`` was made with (the default when it records none)."""
    try:
        recorded = json.loads((path / "testbed.json").read_text())
    except (OSError, ValueError):
        return Names()
    return Names(recorded.get("prefix", PREFIX), recorded.get("subnet", SUBNET))


def load(base_dir: str | os.PathLike[str]) -> Testbed:
    """The testbed that ``up`` created under ``base_dir`` (e.g. from another process)."""
    path = Path(base_dir).resolve()
    try:
        names = json.loads((path / "testbed.json").read_text())["hosts"]
    except (OSError, ValueError, KeyError) as exc:
        raise TestbedError(f"no testbed under {path} ({exc})") from exc
    return _layout(len(names), path, _recorded_names(path))


def status(testbed: Testbed) -> list[HostStatus]:
    """Namespace, sshd and link state of every host."""
    namespaces = set(_testbed_namespaces(testbed.names.prefix))
    return [HostStatus(host=h, namespace_exists=h.namespace in namespaces, sshd_pid=sshd_pid(h),
                       link_up=_link_is_up(h.veth))
            for h in testbed.hosts]


def set_delay(hosts: Sequence[Host], delay_ms: float | None) -> None:
    """Add ``delay_ms`` of latency each way between every one of ``hosts`` and the bridge (``tc netem``
    on the host's ``eth0``, its outgoing side, and on its veth, its incoming side: a round trip to it from
    the root namespace then takes 2 x ``delay_ms`` more); None removes it."""
    root = []
    for host in hosts:
        if delay_ms is None:
            _run(["tc", "-n", host.namespace, "qdisc", "del", "dev", "eth0", "root"])
            root.append(f"qdisc del dev {host.veth} root")
        else:
            _run(["tc", "-n", host.namespace, "qdisc", "replace", "dev", "eth0", "root", "netem",
                  "delay", f"{delay_ms:g}ms"])
            root.append(f"qdisc replace dev {host.veth} root netem delay {delay_ms:g}ms")
    if root:
        _run(["tc", "-batch", "-"], stdin="\n".join(root) + "\n")
