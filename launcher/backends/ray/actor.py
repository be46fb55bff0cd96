"""The Ray actor on each node of a job: it runs the node agent (``launcher.node``) and relays it.

One actor runs in each bundle of a job's placement group (one bundle per node). It reports the
node as Ray sees it, runs short node-side commands (facts, list, end, stacks), and runs the
node agent without a shell (its argv comes from ``launcher.node.ship``), buffering its framed
output for the driver to pull in batches. On terminate it signals the agent, which ends its
node's processes. Nobody pulling for the job's ``unattended_s`` means its supervisor is gone (the
actor itself reads the agent, so the agent would never find itself unattended): the actor then
ends its agent and removes the job's placement group, so its GPUs go back to the cluster. Standard
library only (with ``launcher.backends.stopping``), and sent to the
cluster by value (see ``RayBackend``): nodes need Ray and a Python, not the ``launch`` package. Ray itself is
imported only inside the methods, which run on the cluster.
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

from launcher.backends.stopping import stop_process

MAX_BATCH = 5000
MAX_BUFFERED = 200_000  # lines kept for a driver that does not pull; the node's journal keeps them all
UNATTENDED_CHECK_S = 5.0
ADOPT_TIMEOUT_S = 120.0
PR_SET_PDEATHSIG = 1


class NodeActor:
    """Runs node ``index`` of job ``job_id`` (a threaded Ray actor: pull, start and terminate overlap).

    ``group`` names the placement group, which the actor removes (ending every actor of the job)
    if no supervisor starts it within ``ADOPT_TIMEOUT_S``: a submit that died between preflight
    and launch leaves nothing behind.
    """

    def __init__(self, job_id: str, index: int, group: str) -> None:
        self.job_id = job_id
        self.index = index
        self._group = group
        self._proc: subprocess.Popen | None = None
        self._lines: list[str] = []
        self._code: int | None = None
        self._cond = threading.Condition()
        self._pulled_at = time.monotonic()
        self._adopt = threading.Timer(ADOPT_TIMEOUT_S, self._abandon)
        self._adopt.daemon = True
        self._adopt.start()

    def describe(self) -> dict:
        """This node as Ray sees it: IP, hostname, node id, GPUs given to the bundle, the workers' Python."""
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpus": len(ray.get_gpu_ids()),
            "python": sys.executable,
        }

    def run(self, argv: list[str], timeout: float) -> tuple[int, str, str]:
        """Run a short command here: (exit code, stdout, stderr)."""
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, "", f"`{argv[0]}` did not finish within {timeout:.0f} s"
        except OSError as exc:
            return 127, "", f"cannot run {argv[0]}: {exc.strerror or exc}"
        return done.returncode, done.stdout, done.stderr

    def start(self, argv: list[str], tag: dict[str, str], stdin: bytes, cwd: str,
              unattended_s: float | None = None, grace: float = 5.0) -> int | str:
        """Start the node agent (``argv``, then ``stdin`` written to it) with ``tag`` added to its environment;
        its PID, or why not. With ``unattended_s``, nobody pulling for that long ends the job here."""
        self._adopt.cancel()
        with self._cond:
            self._lines, self._code, self._pulled_at = [], None, time.monotonic()
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env={**os.environ, **tag}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot run {argv[0]} in {cwd}: {getattr(exc, 'strerror', None) or exc}"
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the agent exited at once: its output says why
        self._proc = proc
        threading.Thread(target=self._relay, args=(proc,), daemon=True, name="launch-node").start()
        if unattended_s is not None:
            threading.Thread(target=self._end_when_unattended, args=(proc, unattended_s, grace), daemon=True,
                             name="launch-unattended").start()
        return proc.pid

    def _relay(self, proc: subprocess.Popen) -> None:
        """Buffer the agent's lines, then its exit code. This thread lives as long as the agent, which
        gets SIGTERM if the actor's process dies (the actor was killed, or its worker crashed)."""
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            with self._cond:
                self._lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
                del self._lines[:-MAX_BUFFERED]
                self._cond.notify_all()
        proc.stdout.close()
        code = proc.wait()
        with self._cond:
            self._code = code
            self._cond.notify_all()

    def pull(self, wait: float) -> tuple[list[str], int | None]:
        """New output lines (waiting up to ``wait`` s for some), and the exit code once all are pulled."""
        with self._cond:
            self._pulled_at = time.monotonic()
            self._cond.wait_for(lambda: self._lines or self._code is not None, timeout=wait)
            batch, self._lines = self._lines[:MAX_BATCH], self._lines[MAX_BATCH:]
            return batch, self._code if not self._lines else None

    def exit_code(self) -> int | None:
        """The agent's exit status once it has exited and its output is read, pulled or not; None before."""
        with self._cond:
            return self._code

    def terminate(self, grace: float) -> None:
        """TERM the agent (it ends its node's processes); KILL it if it lingers."""
        self._adopt.cancel()
        if self._proc is not None:
            stop_process(self._proc, grace)

    def _end_when_unattended(self, proc: subprocess.Popen, unattended_s: float, grace: float) -> None:
        """Once nobody has pulled for ``unattended_s``, end the agent (it ends its node's processes) and the group."""
        while proc.poll() is None:
            with self._cond:
                idle = time.monotonic() - self._pulled_at
            if idle > unattended_s:
                print(f"launch: node {self.index} of job {self.job_id}: no supervisor pulled for {idle:.0f} s "
                      f"(watch.unattended_timeout {unattended_s:g} s): ending the job and its placement group",
                      file=sys.stderr, flush=True)
                stop_process(proc, 2 * grace + 10)  # the agent's own TERM, grace, KILL of its ranks first
                self._abandon()
                return
            time.sleep(min(UNATTENDED_CHECK_S, unattended_s / 4))

    def _abandon(self) -> None:
        """No supervisor adopted this job: remove its placement group, which ends every actor."""
        import ray

        ray.util.remove_placement_group(ray.util.get_placement_group(self._group))
