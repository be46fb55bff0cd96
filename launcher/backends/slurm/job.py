"""Following one Slurm job of launch (one attempt): its status, the end Slurm decided, its nodes' agents.

``SlurmJob`` asks ``squeue`` at most once a second (shared by the job's node handles) and, once the
job has ended, ``scontrol``/``sinfo`` once for why: the time limit, a failed node, a cancel from
outside, in Slurm's own words (with the ``***`` lines Slurm wrote into the job's logs).
``SlurmNode`` is a node handle for the supervisor: it follows the agent's framed lines in the job
directory (``node<N>.out``) until the agent's ``@exit``, or until Slurm ends the job without one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from launcher.backends import failures
from launcher.backends.base import NodeHandle
from launcher.backends.failures import LOST_NODE_EXIT, Failure, FailureKind
from launcher.backends.slurm import commands as cli
from launcher.node.protocol import Frame, FrameKind, parse

POLL_S = 0.5
STATUS_EVERY_S = 1.0
EXIT_TAIL_BYTES = 4096  # the end of node<N>.out that holds the agent's last line, its ``exit`` frame


_ENDED_WORDS = {s.value for s in cli.SlurmState if s.ended}


def slurm_lines(folder: Path) -> str:
    """Slurm's ``***`` and ``srun: error`` lines in the attempt's logs, as ``: line | line``."""
    found = []
    for path in sorted(folder.glob("*.log")):
        try:
            text = path.read_text(errors="replace")[-20000:]
        except OSError:
            continue
        found += [line.strip() for line in text.splitlines() if line.startswith(("***", "srun: error", "slurmstepd"))
                  or " *** " in line]
    return (": " + " | ".join(dict.fromkeys(found[-3:]))) if found else ""


def _down(node_state: str, node_reason: str) -> bool:
    """Whether sinfo's state and reason of a node say Slurm lost it (``down*``, ``Not responding``)."""
    return "down" in node_state or "*" in node_state or "not responding" in node_reason.lower()


class SlurmJob:
    """One submitted attempt: its Slurm id, its directory, its status (squeue, at most once a second)."""

    def __init__(self, slurm_id: str, folder: Path) -> None:
        self.slurm_id = slurm_id
        self.folder = folder
        self._lock = threading.Lock()
        self._status: cli.JobStatus | None = None
        self._read_at = 0.0
        self._ending: tuple[cli.JobStatus, dict[str, str], dict[str, tuple[str, str]]] | None = None
        self.exited: set[int] = set()  # nodes whose agent reported its exit
        self.peer_failed = False  # some node's agent exited non-zero: the others ask whether their node is down
        self._nodes_read_at: dict[str, float] = {}

    def agents_done(self, nodes: int) -> bool:
        """Whether every node's agent has reported its exit (the batch script is ending the job by itself)."""
        return len(self.exited) == nodes

    def status(self, fresh: bool = False) -> cli.JobStatus:
        """The job's status; when squeue fails for a moment (a busy controller), the last one known
        (SlurmCommandError only when none is known yet)."""
        with self._lock:
            if fresh or self._status is None or time.monotonic() - self._read_at >= STATUS_EVERY_S:
                try:
                    self._status, self._read_at = cli.job_status(self.slurm_id), time.monotonic()
                except cli.SlurmCommandError:
                    if self._status is None:
                        raise
            return self._status

    def ending(self) -> tuple[cli.JobStatus, dict[str, str], dict[str, tuple[str, str]]]:
        """(status, scontrol's view of the job, the job's nodes' (state, reason)): read once the job has ended."""
        with self._lock:
            if self._ending is None:
                status = cli.job_status(self.slurm_id)
                shown = cli.show_job(self.slurm_id)
                names = cli.hostnames(shown.get("NodeList", "") or status.nodelist) if status.nodelist or shown else []
                result = (status, shown, cli.node_reasons(names))
                if not status.state.ended and shown.get("JobState") not in _ENDED_WORDS:
                    return result  # not ended yet: ask again next time
                self._ending = result
            return self._ending

    def node_down(self, host: str, fresh: bool = False) -> Failure | None:
        """A LOST failure when Slurm has ``host`` down or not responding (sinfo, at most once a second a host
        unless ``fresh``).
        Asked once another node failed: Slurm kills the job on the healthy nodes as soon as one is down, and
        their exits must not be taken for the cause while the job's own state still says COMPLETING."""
        if not fresh and time.monotonic() - self._nodes_read_at.get(host, 0.0) < STATUS_EVERY_S:
            return None
        self._nodes_read_at[host] = time.monotonic()
        try:
            node_state, node_reason = cli.node_reasons([host]).get(host, ("", ""))
        except cli.SlurmCommandError:
            return None
        if _down(node_state, node_reason):
            return Failure(kind=FailureKind.LOST, transient=True,
                           reason=f"Slurm: node {host} is {node_state} ({node_reason}): a NODE_FAIL, "
                                  f"Slurm ends job {self.slurm_id} on every node{slurm_lines(self.folder)}")
        return None

    def scheduler_failure(self, host: str) -> Failure | None:
        """The failure Slurm decided, as seen from node ``host``: the time limit, this node failed, or the
        job ended by Slurm or someone else; None while Slurm lets it run, when a rank's exit ended it, or
        when Slurm cannot be asked."""
        try:
            status, shown, nodes = self.ending()
        except cli.SlurmCommandError:
            return None
        state = shown.get("JobState") or status.state.value
        reason = shown.get("Reason") or status.reason
        words = f"Slurm: job {self.slurm_id} {state} (Reason={reason})"
        if state == "TIMEOUT" or reason == "TimeLimit":
            return Failure(kind=FailureKind.TIMEOUT, transient=True,
                           reason=f"{words}: the time limit ({shown.get('TimeLimit', '?')}) was reached"
                                  f"{slurm_lines(self.folder)}")
        if state == "NODE_FAIL" or reason == "NodeDown":
            node_state, node_reason = nodes.get(host, ("", ""))
            if _down(node_state, node_reason):
                return Failure(kind=FailureKind.LOST, transient=True,
                               reason=f"{words}; node {host} is {node_state}: {node_reason}{slurm_lines(self.folder)}")
            down = sorted(name for name, (state, why) in nodes.items() if _down(state, why))
            return Failure(kind=FailureKind.EXIT, transient=True,
                           reason=f"{failures.ENDED_FOR_ANOTHER_NODE} ({words}; down: {', '.join(down) or 'unknown'})")
        if state in (cli.SlurmState.CANCELLED, cli.SlurmState.PREEMPTED, cli.SlurmState.BOOT_FAIL, "DEADLINE", "OUT_OF_MEMORY"):
            return Failure(kind=FailureKind.LOST, reason=f"{words}{slurm_lines(self.folder)}")
        return None


class SlurmNode(NodeHandle):
    """One node agent of a Slurm job, followed through its framed output file in the job directory."""

    def __init__(self, index: int, host: str, job: SlurmJob, pid: int | None, skip: int = 0) -> None:
        """``skip``: the whole lines a reader already had (`launch attach`): read past, never given again."""
        self.index = index
        self._skip = skip
        self.pid = pid
        #: the failure Slurm decided (time limit, node failure), with Slurm's words; trusted
        self._scheduler_failure: Failure | None = None  # Slurm's verdict on this node's end (``scheduler_failure``)
        self._host = host
        self._job = job
        self._code: int | None = None
        self._decided = threading.Lock()
        self._path = job.folder / f"node{index}.out"

    def lines(self) -> Iterator[str]:
        """The agent's lines until its ``@exit``, or until Slurm says the job ended without one (lost)."""
        pending = b""
        with open(self._path, "rb") as handle:
            while True:
                chunk = handle.read(65536)
                if chunk:
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    for raw in complete:
                        line = raw.decode("utf-8", "replace")
                        parsed = parse(line)
                        if self._skip:  # counted in journal lines: a live line before the last one had is skipped too
                            self._skip -= parsed.journaled
                        else:
                            yield line
                        if isinstance(parsed, Frame) and parsed.kind is FrameKind.EXIT:
                            self._exited(parsed)
                            return
                    continue
                if self._code is not None:
                    return
                if self._job.status().state.ended:
                    if handle.read(1):
                        handle.seek(-1, os.SEEK_CUR)
                        continue
                    self._lost()
                    return
                time.sleep(POLL_S)

    @property
    def scheduler_failure(self) -> Failure | None:
        """Slurm's verdict on this node's failed end, asked again once it is read (the supervisor reads it after its
        settle time): a node's step that Slurm killed because another node failed ends before squeue says NODE_FAIL."""
        if self._scheduler_failure is None and self._code not in (None, 0):
            self._scheduler_failure = self._job.scheduler_failure(self._host)
        return self._scheduler_failure

    def _exited(self, frame: Frame) -> None:
        code = frame.get_int("code")
        code = LOST_NODE_EXIT if code is None else code
        with self._decided:  # lines() and poll() may both find the line
            if self._code is not None:
                return
            if code != 0:  # a rank's own failure, unless Slurm decided it (its node down, the time limit, a cancel)
                self._scheduler_failure = (self._job.scheduler_failure(self._host)
                                          or self._job.node_down(self._host, fresh=True))
                self._job.peer_failed = True
            self._job.exited.add(self.index)
            self._code = code

    def _lost(self) -> None:
        self._scheduler_failure = self._job.scheduler_failure(self._host)
        status = self._job.status()
        self.lost_reason = (self._scheduler_failure.reason if self._scheduler_failure else None) or (
            f"Slurm: job {self._job.slurm_id} {status.state.value} (Reason={status.reason}) before node "
            f"{self.index}'s agent reported its exit{slurm_lines(self._job.folder)}")
        self._code = LOST_NODE_EXIT

    def _last_line(self) -> str:
        """The last whole line of the agent's output file ('' when there is none yet)."""
        try:
            with open(self._path, "rb") as handle:
                handle.seek(max(0, handle.seek(0, os.SEEK_END) - EXIT_TAIL_BYTES))
                tail = handle.read()
        except OSError:
            return ""
        whole = tail.rpartition(b"\n")[0]
        return whole.rpartition(b"\n")[2].decode("utf-8", "replace")

    def poll(self) -> int | None:
        """The exit code once known, whether or not ``lines()`` has read the agent's ``@exit``; LOST_NODE_EXIT at
        once for a node Slurm declared failed; None while Slurm cannot be asked."""
        try:
            return self._poll()
        except cli.SlurmCommandError:
            return self._code

    def _poll(self) -> int | None:
        if self._code is None:
            last = parse(self._last_line())
            if isinstance(last, Frame) and last.kind is FrameKind.EXIT:
                self._exited(last)
        if self._code is None and self._job.status().state in (cli.SlurmState.NODE_FAIL, cli.SlurmState.COMPLETING):
            failure = self._job.scheduler_failure(self._host)
            if failure is not None and failure.kind == FailureKind.LOST:
                self._scheduler_failure, self.lost_reason, self._code = failure, failure.reason, LOST_NODE_EXIT
        if self._code is None and self._job.peer_failed:
            failure = self._job.node_down(self._host)
            if failure is not None:
                self._scheduler_failure, self.lost_reason, self._code = failure, failure.reason, LOST_NODE_EXIT
        return self._code

    def terminate(self, grace: float) -> None:
        """``scancel`` the job (every node: Slurm signals the steps, KillWait later kills them). When Slurm cannot
        be asked, the sweep that follows reports the job as not confirmed ended."""
        try:
            if not self._job.status().state.ended:
                cli.cancel(self._job.slurm_id)
        except cli.SlurmCommandError:
            return


def step_log_tail(folder: Path, index: int) -> str:
    try:
        text = (folder / f"node{index}.step.log").read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text[-400:] or f"nothing in {folder}/node{index}.step.log"
