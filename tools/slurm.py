"""A real Slurm cluster on the namespaced SSH testbed (tools/testbed.py), for tests.

``munged`` (its own socket under ``base_dir``) and ``slurmctld`` run in the root
namespace, the controller reached at the bridge address (port 6817); one ``slurmd`` runs
inside each node host, so it takes the host's name. One partition holds every node.
Clients (``sbatch``, ``srun``, ``squeue``, ``scontrol``, ``scancel``, ``sinfo``) run in
the root namespace and need only ``SLURM_CONF`` (``SlurmCluster.env``). Accounting is
off: jobs are followed with ``squeue`` and ``scontrol`` (see tools/SLURM-NOTES.md).

Every daemon is started and stopped by PID. A machine runs one such cluster (Slurm's
fixed ports, the testbed's fixed names): each daemon is also recorded, with its start
time, in a machine-wide file, and ``up`` first stops whatever a crashed session left.

Needs root, Debian's ``slurm-wlm`` and ``munge`` (scripts/setup.sh --test); stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools import testbed as tb

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGE_KEY = Path("/etc/munge/munge.key")
SLURMD_PORT = 6818  # Slurm's default SlurmdPort
RECORD = Path(tempfile.gettempdir()) / "lt-slurm.json"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.05
# What up() creates under base_dir; down() removes all of it except LOG_DIR.
LOG_DIR = "log"
_STATE = ("slurm.conf", "gres.conf", "gpus", "munge", "state", "nodes")
# Root-namespace daemons this process started, by PID: reaped when they stop.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class SlurmError(RuntimeError):
    """Starting, stopping or asking the test cluster failed; the message says what and why."""


@dataclass(frozen=True)
class Settings:
    """What slurm.conf says beyond the fixed layout (each default chosen for tests)."""

    partition: str = "test"
    cpus: int = 1                 # per node: one job at a time on a node, so jobs queue
    real_memory_mb: int = 1024    # below what the machine has (more would drain the node)
    min_job_age_s: int = 30       # a finished job stays in scontrol/squeue this long (default 300)
    kill_wait_s: int = 5          # SIGTERM to SIGKILL at cancel and time limit (default 30)
    slurmd_timeout_s: int = 10    # an unresponsive slurmd's node goes DOWN after this (default 300)
    gpus_per_node: int = 0        # GRES gpu:N on fake devices: for --gpus-per-node and preflight checks


@dataclass(frozen=True)
class Daemon:
    """A started daemon: its PID and kernel start time, the proof that a PID is still it."""

    name: str
    pid: int
    start_time: int
    host: str | None = None       # None: the root namespace


@dataclass(frozen=True)
class SlurmCluster:
    """A running test cluster: where its files are and what a client needs."""

    base_dir: Path
    nodes: tuple[tb.Host, ...]
    settings: Settings = field(default_factory=Settings)

    @property
    def conf(self) -> Path:
        return self.base_dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.base_dir / "munge" / "munge.socket.2"

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the nodes' bed, where slurmctld listens."""
        return self.nodes[0].address.rsplit(".", 1)[0] + ".1"

    @property
    def partition(self) -> str:
        return self.settings.partition

    @property
    def env(self) -> dict[str, str]:
        """What a client adds to its environment to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self) -> dict[str, str]:
        """The caller's environment plus ``env``."""
        return {**os.environ, **self.env}

    def log_file(self, daemon: str, host: tb.Host | None = None) -> Path:
        """Log of ``daemon`` (munged, slurmctld, or slurmd of ``host``), with timestamps."""
        return self.base_dir / LOG_DIR / (f"slurmd-{host.name}.log" if host else f"{daemon}.log")

    def output_file(self, daemon: str) -> Path:
        """stdout and stderr of a root-namespace daemon (errors from before its log opens)."""
        return self.base_dir / LOG_DIR / f"{daemon}.out"

    def node(self, name: str) -> tb.Host:
        """The node host called ``name``."""
        for host in self.nodes:
            if host.name == name:
                return host
        raise SlurmError(f"no Slurm node {name!r}; nodes are: {', '.join(h.name for h in self.nodes)}")

    def run(self, argv: Sequence[str], *, check: bool = True,
            timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command in the root namespace; with ``check``, a non-zero exit raises."""
        try:
            done = subprocess.run(list(argv), env=self.client_env(), capture_output=True, text=True,
                                  timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"`{' '.join(argv)}` failed: {exc}") from exc
        if check and done.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
        return done


# ---------------------------------------------------------------- configuration

def _slurm_conf(cluster: SlurmCluster) -> str:
    """slurm.conf: the controller on the bridge, one NodeName per host, one partition."""
    s, base = cluster.settings, cluster.base_dir
    controller = socket.gethostname().split(".")[0]  # slurmctld starts only where this name matches
    lines = [
        "# generated by tools/slurm.py",
        "ClusterName=launchtest",
        f"SlurmctldHost={controller}({cluster.bridge_address})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={cluster.munge_socket}",
        f"StateSaveLocation={base}/state",
        f"SlurmctldPidFile={base}/state/slurmctld.pid",
        f"SlurmctldLogFile={cluster.log_file('slurmctld')}",
        f"SlurmdSpoolDir={base}/nodes/%n",
        f"SlurmdPidFile={base}/nodes/%n/slurmd.pid",
        f"SlurmdLogFile={base}/{LOG_DIR}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "ReturnToService=2",
        f"MinJobAge={s.min_job_age_s}",
        f"KillWait={s.kill_wait_s}",
        f"SlurmdTimeout={s.slurmd_timeout_s}",
        *(["GresTypes=gpu"] if s.gpus_per_node else []),
        *(f"NodeName={h.name} NodeAddr={h.address} CPUs={s.cpus} RealMemory={s.real_memory_mb}"
          + (f" Gres=gpu:{s.gpus_per_node}" if s.gpus_per_node else "") + " State=UNKNOWN"
          for h in cluster.nodes),
        f"PartitionName={s.partition} Nodes={','.join(h.name for h in cluster.nodes)} Default=YES "
        "MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- daemons by PID

def _start_time(pid: int) -> int | None:
    """The kernel start time of ``pid`` (clock ticks since boot), None when it does not run."""
    if not tb.pid_alive(pid):
        return None
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return None


def _is_running(daemon: Daemon) -> bool:
    """True while ``daemon``'s PID is still the process that was started."""
    return _start_time(daemon.pid) == daemon.start_time


def _read_record() -> list[Daemon]:
    try:
        return [Daemon(**entry) for entry in json.loads(RECORD.read_text())["daemons"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _record(daemon: Daemon) -> None:
    """Add ``daemon`` to the machine-wide record (written before anything else can fail)."""
    daemons = [d for d in _read_record() if _is_running(d)] + [daemon]
    RECORD.write_text(json.dumps({"daemons": [asdict(d) for d in daemons]}, indent=2) + "\n")


def _wait_gone(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` has ended (reaping it if this process started it); False at ``deadline``."""
    while time.monotonic() < deadline:
        child = _CHILDREN.get(pid)
        if (child.poll() is not None) if child else not tb.pid_alive(pid):
            _CHILDREN.pop(pid, None)
            return True
        time.sleep(0.01)
    return False


def _stop(daemons: Sequence[Daemon], sig: signal.Signals = signal.SIGTERM) -> None:
    """Send ``sig`` to every daemon still running, SIGKILL any left after STOP_TIMEOUT_S."""
    running = [d for d in daemons if _is_running(d)]
    for daemon in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.pid, sig)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    stubborn = [d for d in running if not _wait_gone(d.pid, deadline)]
    for daemon in stubborn:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.pid, signal.SIGKILL)
    if left := [d for d in stubborn if not _wait_gone(d.pid, time.monotonic() + STOP_TIMEOUT_S)]:
        raise SlurmError(f"daemons survive SIGKILL: {', '.join(f'{d.name} ({d.pid})' for d in left)}")


def _spawn_root(cluster: SlurmCluster, name: str, argv: Sequence[str]) -> Daemon:
    """Start a foreground daemon in the root namespace, in its own session; record it."""
    with open(cluster.output_file(name), "ab") as log:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=cluster.client_env())
    _CHILDREN[proc.pid] = proc
    daemon = Daemon(name=name, pid=proc.pid, start_time=_start_time(proc.pid) or 0)
    _record(daemon)
    return daemon


def _start_slurmd(cluster: SlurmCluster, host: tb.Host) -> Daemon:
    """Start ``host``'s slurmd inside the host (it takes the host's name); record it."""
    (cluster.base_dir / "nodes" / host.name).mkdir(parents=True, exist_ok=True)
    pid = tb.start_daemon(host, "slurmd", ["env", f"SLURM_CONF={cluster.conf}", SLURMD, "-D"])
    daemon = Daemon(name="slurmd", pid=pid, start_time=_start_time(pid) or 0, host=host.name)
    _record(daemon)
    return daemon


def _log_tail(path: Path, lines: int = 6) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _wait_until(condition: Callable[[], bool], what: str, timeout: float,
                alive: Sequence[tuple[Daemon, Path]] = (), details: Callable[[], str] = lambda: "") -> None:
    """Poll ``condition``; SlurmError naming ``what`` when a daemon in ``alive`` has exited (with
    the last lines of its log) or at the deadline (with ``details()``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        for daemon, log in alive:
            if not _is_running(daemon):
                raise SlurmError(f"{daemon.name}{f' on {daemon.host}' if daemon.host else ''} exited "
                                 f"while waiting for {what}: {_log_tail(log)}")
        if time.monotonic() > deadline:
            raise SlurmError(f"{what} not reached after {timeout:.0f} s{details()}")
        time.sleep(POLL_S)


# ---------------------------------------------------------------- nodes

def node_states(cluster: SlurmCluster) -> dict[str, str]:
    """Each node's state as ``sinfo`` prints it (``idle``, ``allocated``, ``down*``, ``drained``...);
    empty while the controller does not answer."""
    done = cluster.run(["sinfo", "-h", "-N", "-p", cluster.partition, "-o", "%N %T"], check=False)
    if done.returncode != 0:
        return {}
    return dict(line.split() for line in done.stdout.splitlines() if line.strip())


def wait_for_nodes(cluster: SlurmCluster, state: str = "idle", hosts: Sequence[tb.Host] | None = None,
                   timeout: float = START_TIMEOUT_S, alive: Sequence[tuple[Daemon, Path]] = ()) -> None:
    """Wait until every one of ``hosts`` (all nodes by default) shows ``state`` in sinfo; fail
    early if a daemon in ``alive`` exits."""
    names = [h.name for h in hosts or cluster.nodes]
    last: dict[str, str] = {}

    def reached() -> bool:
        last.update(node_states(cluster))
        return all(last.get(name) == state for name in names)
    _wait_until(reached, f"nodes {', '.join(names)} {state}", timeout, alive,
                details=lambda: f"; sinfo says {last or 'nothing'}; slurmctld log: "
                                f"{_log_tail(cluster.log_file('slurmctld'))}")


def slurmd_running(cluster: SlurmCluster, host: tb.Host) -> bool:
    """True while ``host``'s slurmd runs (False after ``kill_slurmd`` or a testbed re-made)."""
    return tb.daemon_pid(cluster.node(host.name), "slurmd") is not None


def kill_slurmd(cluster: SlurmCluster, host: tb.Host, sig: signal.Signals = signal.SIGKILL) -> None:
    """Stop ``host``'s slurmd alone (steps already running there keep running: slurmstepd is
    its own process); with SIGKILL the controller hears nothing and marks the node DOWN, and
    fails its jobs, some time after ``slurmd_timeout_s`` (25-26 s with the default 10 s)."""
    cluster.node(host.name)
    tb.stop_daemon(host, "slurmd", sig)


def _slurmd_listening(host: tb.Host) -> bool:
    """True when ``host``'s slurmd accepts connections on its port."""
    try:
        with socket.create_connection((host.address, SLURMD_PORT), timeout=0.2):
            return True
    except OSError:
        return False


def restart_slurmd(cluster: SlurmCluster, host: tb.Host, timeout: float = START_TIMEOUT_S) -> None:
    """Start ``host``'s slurmd again (stopping it first if it runs); return once it listens and
    the node is idle (ReturnToService=2 returns a DOWN node when its slurmd registers)."""
    kill_slurmd(cluster, host, signal.SIGTERM)
    daemon = _start_slurmd(cluster, host)
    _wait_until(lambda: _slurmd_listening(host) and node_states(cluster).get(host.name) == "idle",
                f"slurmd on {host.name} listening and its node idle", timeout,
                alive=[(daemon, cluster.log_file("slurmd", host))])


def drain(cluster: SlurmCluster, host: tb.Host, reason: str = "test") -> None:
    """Drain ``host``'s node: running jobs finish, no new job starts there."""
    cluster.run(["scontrol", "update", f"NodeName={cluster.node(host.name).name}", "State=DRAIN",
                 f"Reason={reason}"])


def resume(cluster: SlurmCluster, host: tb.Host) -> None:
    """Return a drained (or DOWN) node to service."""
    cluster.run(["scontrol", "update", f"NodeName={cluster.node(host.name).name}", "State=RESUME"])


# ---------------------------------------------------------------- whole cluster

def _check_installed() -> None:
    if os.geteuid() != 0:
        raise SlurmError("the test Slurm cluster needs root (daemons in network namespaces)")
    for program in (MUNGED, SLURMCTLD, SLURMD, shutil.which("sbatch") or "sbatch"):
        if not os.access(program, os.X_OK):
            raise SlurmError(f"{program} not found: install slurm-wlm and munge (scripts/setup.sh --test)")
    if not MUNGE_KEY.is_file():
        raise SlurmError(f"{MUNGE_KEY} missing: reinstall munge (its package creates the key)")


def up(bed: tb.Testbed, base_dir: str | os.PathLike[str], *, nodes: int = 2,
       settings: Settings = Settings(), timeout: float = START_TIMEOUT_S) -> SlurmCluster:
    """Start munged, slurmctld and a slurmd on each of the first ``nodes`` hosts of ``bed``;
    return once sinfo shows every node idle. Stops any cluster a crashed session left first;
    on failure stops everything it started before SlurmError propagates."""
    _check_installed()
    if not 1 <= nodes <= len(bed.hosts):
        raise SlurmError(f"nodes must be between 1 and {len(bed.hosts)} (the testbed's hosts), got {nodes}")
    stop_stale()
    cluster = SlurmCluster(base_dir=Path(base_dir).resolve(), nodes=bed.hosts[:nodes], settings=settings)
    try:
        _start(cluster, timeout)
    except BaseException:
        down(cluster)
        raise
    return cluster


def _write_fake_gpus(base: Path, count: int) -> None:
    """gres.conf (read from slurm.conf's directory) naming ``count`` GPU device files per node:
    character devices with /dev/null's numbers (slurmd drops a GPU without a File)."""
    devices = base / "gpus"
    devices.mkdir(exist_ok=True)
    for index in range(count):
        with contextlib.suppress(FileExistsError):
            os.mknod(devices / f"gpu{index}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (base / "gres.conf").write_text(f"Name=gpu File={devices}/gpu[0-{count - 1}]\n")


def _start(cluster: SlurmCluster, timeout: float) -> None:
    base = cluster.base_dir
    for directory in ("munge", "state", "nodes", LOG_DIR):
        (base / directory).mkdir(parents=True, exist_ok=True)
    (base / "munge").chmod(0o755)  # munged wants its socket directory searchable by all
    cluster.conf.write_text(_slurm_conf(cluster))
    if gpus := cluster.settings.gpus_per_node:
        _write_fake_gpus(base, gpus)
    munged = _spawn_root(cluster, "munged", [
        MUNGED, "--foreground", "--force", f"--socket={cluster.munge_socket}", f"--key-file={MUNGE_KEY}",
        f"--log-file={cluster.log_file('munged')}", f"--pid-file={base / 'munge' / 'munged.pid'}",
        f"--seed-file={base / 'munge' / 'munged.seed'}"])
    _wait_until(cluster.munge_socket.exists, "munged's socket", timeout,
                alive=[(munged, cluster.output_file("munged"))])
    controller = _spawn_root(cluster, "slurmctld", [SLURMCTLD, "-D", "-f", str(cluster.conf)])
    slurmds = [_start_slurmd(cluster, host) for host in cluster.nodes]
    watched = [(munged, cluster.output_file("munged")), (controller, cluster.output_file("slurmctld"))]
    watched += [(d, cluster.log_file("slurmd", h)) for d, h in zip(slurmds, cluster.nodes)]
    wait_for_nodes(cluster, "idle", timeout=timeout, alive=watched)


def stop_stale() -> None:
    """Stop every daemon the machine-wide record names that still runs (a crashed session's)."""
    _stop(_read_record())
    RECORD.unlink(missing_ok=True)


def down(cluster: SlurmCluster) -> None:
    """Stop every daemon by PID (slurmds, then slurmctld, then munged) and remove the state
    under base_dir (logs stay, in base_dir/log). Idempotent."""
    daemons = _read_record()
    order = {"slurmd": 0, "slurmctld": 1, "munged": 2}
    for rank in sorted(set(order.values())):
        _stop([d for d in daemons if order.get(d.name, 0) == rank])
    for host in cluster.nodes:
        tb.stop_daemon(host, "slurmd")  # forgets its pid file (already stopped above)
    RECORD.unlink(missing_ok=True)
    for name in _STATE:
        path = cluster.base_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
