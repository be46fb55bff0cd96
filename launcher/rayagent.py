"""The node agent: a Ray actor that runs one node's command of a plan and relays it.

One agent runs in each bundle of a job's placement group (one bundle per node).
It reports the node as Ray sees it, probes the node's network towards node 0,
runs the node's argv (torchrun or DeepSpeed's per-node launcher) without a
shell in a session of its own, buffers its output lines for the driver to
pull in batches, reports its exit code, and on terminate ends its process
group and every process tagged with the job id on the node.

Standard library only, and sent to the cluster by value (see
``RayBackend``): nodes need Ray and the job's Python, not the ``launch``
package. The job-tag reaper (``launcher/proctree.py``) arrives as source text
and runs as ``python -c``, as it does over SSH. Ray itself is imported only
inside the methods, which run on the cluster.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

MAX_BATCH = 5000
PROBE_TIMEOUT_S = 30.0
REAP_TIMEOUT_S = 15.0
ADOPT_TIMEOUT_S = 120.0
KERNEL_LOG_LINES = 300
PR_SET_PDEATHSIG = 1
IB_CLASS_DIR = "/sys/class/infiniband"


class NodeAgent:
    """Runs node ``index`` of job ``job_id`` (a threaded Ray actor: pull, start and terminate overlap).

    ``reaper`` is the source of ``launcher/proctree.py``. ``group`` names the
    placement group, which the agent removes (ending every agent of the job)
    if no supervisor starts it within ``ADOPT_TIMEOUT_S``: a submit that
    died between preflight and launch leaves nothing behind.
    """

    def __init__(self, job_id: str, index: int, reaper: str, group: str) -> None:
        self.job_id = job_id
        self.index = index
        self._reaper = reaper
        self._group = group
        self._proc: subprocess.Popen | None = None
        self._lines: list[str] = []
        self._code: int | None = None
        self._cond = threading.Condition()
        self._adopt = threading.Timer(ADOPT_TIMEOUT_S, self._abandon)
        self._adopt.daemon = True
        self._adopt.start()

    def describe(self) -> dict:
        """This node as Ray sees it: IP, hostname, node id, GPUs given to the bundle."""
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpus": len(ray.get_gpu_ids()),
        }

    def probe(self, master: str | None, check_argv: list[str], cwd: str, port: int | None, resolve: bool) -> dict:
        """Interface towards ``master`` (None: pinned, not probed), HCAs, and what is wrong here.

        ``check_argv`` must print the modules it cannot import; ``port`` is
        checked to be free (the rendezvous port, on node 0 only); ``resolve``
        checks that this node's hostname resolves (torchrun's c10d
        rendezvous looks it up, and fails deep in a traceback otherwise).
        """
        problems = []
        if resolve:
            try:
                socket.getaddrinfo(socket.gethostname(), None)
            except OSError as exc:
                problems.append(
                    f"its hostname '{socket.gethostname()}' does not resolve ({exc.strerror}); torchrun's "
                    "c10d rendezvous looks it up: add it to /etc/hosts or DNS"
                )
        interface = address = None
        if master is not None:
            try:
                interface, address = route_to(master)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                problems.append(f"cannot find the interface routing to node 0 ({master}): {exc}")
        problem = _missing_modules(check_argv)
        if problem:
            problems.append(f"{problem} (this node's Ray workers run {sys.executable}: set 'python:' in the cluster spec)")
        if not os.path.isdir(cwd):
            problems.append(f"workdir '{cwd}' does not exist")
        if port is not None and not _port_is_free(port):
            problems.append(f"rendezvous port {port} is in use")
        hcas = sorted(os.listdir(IB_CLASS_DIR)) if os.path.isdir(IB_CLASS_DIR) else []
        return {"interface": interface, "address": address, "ib_hcas": hcas, "problems": problems}

    def start(self, argv: list[str], env: dict[str, str], cwd: str) -> int | str:
        """Start ``argv`` in its own session, with ``env`` added; its PID, or why it could not start."""
        self._adopt.cancel()
        with self._cond:
            self._lines, self._code = [], None
        started: list[int | str] = []
        ready = threading.Event()
        threading.Thread(
            target=self._run, args=(argv, {**os.environ, **env}, cwd, started, ready), daemon=True, name="launch-node"
        ).start()
        ready.wait()
        return started[0]

    def _run(self, argv: list[str], env: dict[str, str], cwd: str, started: list, ready: threading.Event) -> None:
        """Start the process, relay its output, reap it. This thread lives exactly as long as the
        process, which gets SIGTERM if the thread dies (the agent was killed, or its worker crashed)."""
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            started.append(f"cannot run {argv[0]} in {cwd}: {getattr(exc, 'strerror', None) or exc}")
            ready.set()
            return
        self._proc = proc
        started.append(proc.pid)
        ready.set()
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            with self._cond:
                self._lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
                self._cond.notify_all()
        proc.stdout.close()
        code = proc.wait()
        with self._cond:
            self._code = code
            self._cond.notify_all()

    def pull(self, wait: float) -> tuple[list[str], int | None]:
        """New output lines (waiting up to ``wait`` s for some), and the exit code once all are pulled."""
        with self._cond:
            self._cond.wait_for(lambda: self._lines or self._code is not None, timeout=wait)
            batch, self._lines = self._lines[:MAX_BATCH], self._lines[MAX_BATCH:]
            return batch, self._code if not self._lines else None

    def terminate(self, grace: float) -> list[int]:
        """TERM the node's process group, KILL it after ``grace``, then end the job's tagged processes.

        Returns the PIDs of the job still alive on this node.
        """
        self._adopt.cancel()
        proc = self._proc
        if proc is not None:
            _signal_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        return self._reap("end", grace)

    def job_pids(self) -> list[int]:
        """PIDs of the job's processes on this node."""
        return self._reap("list", 0.0)

    def kernel_log(self) -> list[str]:
        """The node's last kernel log lines (``dmesg``), for OOM-killer and Xid lines; [] if unreadable."""
        try:
            done = subprocess.run(["dmesg", "--ctime"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return []
        return done.stdout.splitlines()[-KERNEL_LOG_LINES:] if done.returncode == 0 else []

    def _reap(self, action: str, grace: float) -> list[int]:
        argv = [sys.executable, "-c", self._reaper, action, self.job_id, str(grace)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=grace + REAP_TIMEOUT_S, check=True)
        return [int(pid) for pid in done.stdout.split()]

    def _abandon(self) -> None:
        """No supervisor adopted this job: remove its placement group, which ends every agent."""
        import ray

        ray.util.remove_placement_group(ray.util.get_placement_group(self._group))


def route_to(address: str) -> tuple[str, str]:
    """(interface, source address) this node uses to reach ``address``.

    For an address of this node, the interface that holds it (not ``lo``,
    which the kernel reports for local routes).
    """
    tokens = _ip("route", "get", address).split()
    interface, source = tokens[tokens.index("dev") + 1], tokens[tokens.index("src") + 1]
    if tokens[0] == "local":
        owners = _ip("-4", "addr", "show", "to", address).split()
        if owners:
            interface = owners[1].split("@")[0]
    return interface, source


def _missing_modules(check_argv: list[str]) -> str | None:
    """What is wrong with the job's Python here (``check_argv`` prints the modules it lacks), or None."""
    try:
        found = subprocess.run(check_argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run {check_argv[0]}: {getattr(exc, 'strerror', None) or exc}"
    if found.returncode != 0:
        return f"{check_argv[0]} failed to check its modules: {found.stderr.strip()[-200:]}"
    missing = found.stdout.split()
    return f"{check_argv[0]} cannot import {', '.join(missing)}" if missing else None


def _ip(*args: str) -> str:
    return subprocess.run(["ip", "-o", *args], capture_output=True, text=True, timeout=10, check=True).stdout


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
