"""The embedded default backend: every node of the plan is a process group on this machine."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from launcher import proctree
from launcher.backends.base import Preflight
from launcher.plan import NodePlan, Plan
from launcher.spec.cluster import ClusterSpec

FIND_MODULES = "import importlib.util, sys; missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]; print(' '.join(missing))"


class LocalNode:
    """A node agent started in its own session on this machine."""

    def __init__(self, index: int, proc: subprocess.Popen, job_id: str) -> None:
        self.index = index
        self.pid = proc.pid
        self._proc = proc
        self._job_id = job_id

    def lines(self) -> Iterator[str]:
        assert self._proc.stdout is not None
        for raw in iter(self._proc.stdout.readline, b""):
            yield raw.decode("utf-8", errors="replace").rstrip("\n")
        self._proc.stdout.close()

    def poll(self) -> int | None:
        return self._proc.poll()

    def terminate(self, grace: float) -> None:
        _signal_group(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self._proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(self.pid, signal.SIGKILL)
        self._proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class LocalBackend:
    """Runs the plan's nodes as local process groups (gloo on CPU slots, or local GPUs)."""

    name = "local"

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster

    def preflight(self, plan: Plan) -> Preflight:
        return Preflight(problems=self._problems(plan))

    def _problems(self, plan: Plan) -> list[str]:
        problems = []
        python = plan.nodes[0].argv[0]
        if shutil.which(python) is None and not os.access(python, os.X_OK):
            return [f"localhost: python interpreter '{python}' not found (cluster.yaml python)"]
        modules = ["torch"] + (["deepspeed"] if plan.launcher == "deepspeed" or plan.ds_config else [])
        result = subprocess.run([python, "-c", FIND_MODULES, *modules], capture_output=True, text=True)
        missing = result.stdout.split()
        if result.returncode != 0 or missing:
            problems.append(
                f"localhost: {python} cannot import {', '.join(missing) or 'its modules'}"
                " (install the training extras: pip install 'launch[train]')"
            )
        cwd = plan.nodes[0].cwd
        if not os.path.isdir(cwd):
            problems.append(f"localhost: workdir '{cwd}' does not exist")
        if not port_is_free(plan.rendezvous.port):
            problems.append(f"localhost: rendezvous port {plan.rendezvous.port} is in use")
        return problems

    def start(self, node: NodePlan, plan: Plan, run_dir: Path, secrets: Mapping[str, str]) -> LocalNode:
        env = {**os.environ, **node.env, **secrets}
        proc = subprocess.Popen(
            list(node.argv),
            cwd=node.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (run_dir / f"node{node.index}.pid").write_text(str(proc.pid))
        return LocalNode(node.index, proc, plan.job_id)

    def run_on_node(self, index: int, argv: list[str], timeout: float) -> tuple[int, str, str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr

    def kernel_log(self, node_index: int) -> list[str]:
        try:
            result = subprocess.run(["dmesg", "--ctime"], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return result.stdout.splitlines()[-300:] if result.returncode == 0 else []

    def leftovers(self, plan: Plan) -> dict[int, list[int]]:
        pids = proctree.job_pids(plan.job_id)
        return {0: pids} if pids else {}

    def sweep(self, plan: Plan, grace: float) -> dict[int, list[int]]:
        left = proctree.end_job(plan.job_id, grace)
        return {0: left} if left else {}

    def close(self) -> None:
        pass


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    """True if a TCP listener could bind ``port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port that is free on this machine now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
