"""The supervisor: starts a plan's nodes, follows them, and ends the job cleanly.

It relays every line with a ``[node/rank]`` prefix (to the console in the
foreground, always to per-node log files), files metric records in the
store, notices the first node that fails and tears the others down, obeys
cancel requests (SIGTERM/SIGINT), and checks that no process of the job is
left before it records the final state.

Run detached as ``python -m launcher.supervisor JOB_ID``.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from launcher import failures
from launcher.backends.base import Backend, NodeHandle
from launcher.errors import LaunchError, NodeStartError
from launcher.metrics.aggregate import summarize
from launcher.metrics.reporter import parse_record
from launcher.plan import Plan
from launcher.shell import mask
from launcher.store import CANCELLED, FAILED, LAUNCHING, RUNNING, SUCCEEDED, Store

_RANK_PREFIX = re.compile(r"^\[(\d+)\]:(?=.)")
SETTLE_S = 1.0
REPORT_WAIT_S = 5.0  # how long failed nodes' output may take to reach us (their failure reports), under load
TAIL_LINES = 200
POLL_S = 0.1


class NodeWatcher:
    """Reads one node's output: log file, console echo, metric records, last lines."""

    def __init__(
        self,
        handle: NodeHandle,
        log_path: Path,
        store: Store,
        job_id: str,
        attempt: int,
        echo: Callable[[str], None] | None,
        secrets: Mapping[str, str],
    ) -> None:
        self.handle = handle
        self.log_path = log_path
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.started = time.monotonic()
        self.progress: dict[int, tuple[int, float]] = {}
        self._store, self._job_id, self._attempt = store, job_id, attempt
        self._echo, self._secrets = echo, secrets
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"node{handle.index}")
        self._thread.start()

    def _run(self) -> None:
        node = self.handle.index
        with open(self.log_path, "a", encoding="utf-8", errors="replace") as log:
            for raw in self.handle.lines():
                line = mask(raw, self._secrets) if self._secrets else raw
                record = parse_record(line)
                if record is not None:
                    record.setdefault("node", node)
                    self.progress[int(record.get("rank", -1))] = (int(record.get("step", 0)), time.monotonic())
                    self._store.add_metrics(self._job_id, self._attempt, [record])
                    continue
                match = _RANK_PREFIX.match(line)
                text = f"[{node}/{match[1]}] {line[match.end():]}" if match else f"[{node}] {line}"
                log.write(text + "\n")
                log.flush()
                self.tail.append(text)
                if self._echo is not None:
                    self._echo(text)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class StallDetector:
    """Calls a job stalled when no rank has reported progress for too long.

    The limit is ``stall_timeout`` until reports arrive; after that it adapts
    to the job: five times the longest gap seen between two reports (at least
    30 s), never more than ``stall_timeout``. Once a rank has reported its last
    step, the ranks' exit (checkpoint, teardown) gets the whole ``stall_timeout``. So a job whose reports come
    every second is called stalled in seconds, not after NCCL's timeout.
    """

    FLOOR_S = 30.0
    FACTOR = 5.0

    def __init__(self, stall_timeout: float, max_steps: int) -> None:
        self.stall_timeout = stall_timeout
        self.max_steps = max_steps
        self._last_report: float | None = None
        self._longest_gap = 0.0
        self._finishing = False

    def limit(self) -> float:
        """Seconds of silence allowed now (the whole stall_timeout while ranks finish up)."""
        if self._longest_gap <= 0 or self._finishing:
            return self.stall_timeout
        return min(self.stall_timeout, max(self.FLOOR_S, self.FACTOR * self._longest_gap))

    def check(self, watchers: list[NodeWatcher]) -> dict[str, Any] | None:
        """A failure record if the job has stalled, else None."""
        now = time.monotonic()
        latest = [(t, step, w.handle.index, rank) for w in watchers for rank, (step, t) in w.progress.items()]
        newest = max((t for t, *_ in latest), default=None)
        self._finishing = any(step >= self.max_steps for _, step, *_ in latest)
        if newest is not None and newest != self._last_report:
            if self._last_report is not None:
                self._longest_gap = max(self._longest_gap, newest - self._last_report)
            self._last_report = newest
        since = newest if newest is not None else min(w.started for w in watchers)
        quiet = now - since
        if quiet < self.limit():
            return None
        if not latest:
            return {"reason": f"stalled before the first step: no rank reported progress in {quiet:.0f} s",
                    "stalled_s": quiet}
        t, step, node, rank = min(latest)
        return {
            "node": node, "rank": rank, "step": step, "stalled_s": quiet,
            "reason": f"stalled at step {step} on node {node}/rank {rank}: no rank reported progress for {quiet:.0f} s "
                      f"(limit {self.limit():.0f} s; node {node}/rank {rank} was heard from least recently)",
        }


class Supervisor:
    """Runs one job to its end: SUCCEEDED, FAILED or CANCELLED."""

    def __init__(
        self,
        store: Store,
        plan: Plan,
        backend: Backend,
        *,
        echo: Callable[[str], None] | None = None,
        secrets: Mapping[str, str] | None = None,
        grace: float = 5.0,
        restarts: int = 0,
        stall_timeout: float | None = None,
        replan: Callable[[Plan, frozenset[str]], tuple[Plan, Backend]] | None = None,
    ) -> None:
        """``replan`` (given with ``leave_out_failed_nodes``) re-plans a restart without the hosts given:
        a host that failed first in two attempts is left out."""
        self.store = store
        self.plan = plan
        self.backend = backend
        self.echo = echo
        self.secrets = dict(secrets or {})
        self.grace = grace
        self.restarts = restarts
        self.replan = replan
        self.first_failures: collections.Counter[str] = collections.Counter()
        self.stall = StallDetector(stall_timeout, plan.max_steps) if stall_timeout else None
        self.run_dir = store.run_dir(plan.job_id)
        self._cancel = threading.Event()
        self._cancel_reason = ""

    def request_cancel(self, reason: str = "cancelled by user") -> None:
        """Ask the watch loop to tear the job down and end it CANCELLED (thread- and signal-safe)."""
        self._cancel_reason = reason
        self._cancel.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM (launch cancel) and SIGINT (Ctrl-C) cancel the job."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_cancel("cancelled (SIGTERM to the supervisor)"))
        signal.signal(signal.SIGINT, lambda *_: self.request_cancel("cancelled (Ctrl-C)"))

    def run(self) -> str:
        """Start every node, watch until the end (restarting up to ``restarts`` times), clean up."""
        job_id, attempt = self.plan.job_id, 0
        self.store.update_job(job_id, supervisor_pid=os.getpid())
        if not self.store.transition(job_id, LAUNCHING, attempt=attempt):
            return self.store.job(job_id)["state"]
        self.store.add_event(job_id, "launching", f"starting {self.plan.nnodes} node(s) on {self.plan.backend}")
        try:
            while True:
                state, reason, failure = self._run_attempt(attempt)
                left = self.backend.sweep(self.plan, self.grace)
                if left:
                    self.store.add_event(job_id, "leftovers", f"processes alive after teardown: {left}", {"pids": left})
                if state != FAILED or attempt >= self.restarts or self._cancel.is_set():
                    break
                if self.replan is not None and failure is not None:
                    problem = self._leave_out_twice_failed(failure)
                    if problem:
                        reason = f"{reason}; {problem}"
                        break
                    if self._cancel.is_set():
                        state, reason = CANCELLED, self._cancel_reason
                        break
                attempt += 1
                self.store.add_event(
                    job_id, "restarting", f"attempt {attempt - 1} failed ({reason}); restart {attempt} of {self.restarts}",
                    failure,
                )
                if not self._next_attempt(attempt):
                    state, reason = CANCELLED, self._cancel_reason or "cancelled"
                    break
        finally:
            self.backend.close()
        summary = summarize(self.store.metrics(job_id))
        self.store.transition(job_id, state, reason=reason, first_failure=failure, summary=summary)
        self.store.add_event(job_id, state.lower(), reason or state)
        return state

    def _leave_out_twice_failed(self, failure: dict[str, Any]) -> str | None:
        """Count the failure against its host; at its second, re-plan without it. A problem text if that fails.

        Only a node whose processes exited or whose connection was lost counts (its failure has an exit
        code): a stall names the node heard from least recently, and a start or setup failure is reported
        by every node alike, so neither says which host is broken.
        """
        if failure.get("exit_code") is None or failure.get("node") is None:
            return None
        host = failure.get("host") or self.plan.nodes[failure["node"]].host
        self.first_failures[host] += 1
        if self.first_failures[host] < 2:
            return None
        left_out = frozenset(h for h, count in self.first_failures.items() if count >= 2)
        try:
            plan, backend = self.replan(self.plan, left_out)
        except LaunchError as exc:
            return f"{host} failed first in two attempts and was left out, but the job cannot restart without it: {exc}"
        self.backend.close()
        self.plan, self.backend = plan, backend
        self.store.add_event(
            self.plan.job_id, "node_left_out",
            f"{host} failed first in two attempts: left out; restarting on {', '.join(n.host for n in plan.nodes)}",
            {"host": host, "nodes": [n.host for n in plan.nodes]},
        )
        return None

    def _next_attempt(self, attempt: int) -> bool:
        """Record the new attempt (RUNNING -> LAUNCHING); False if the job was cancelled meanwhile."""
        job_id = self.plan.job_id
        if self.store.job(job_id)["state"] == LAUNCHING:
            self.store.update_job(job_id, attempt=attempt)
            return True
        return self.store.transition(job_id, LAUNCHING, attempt=attempt)

    def _run_attempt(self, attempt: int) -> tuple[str, str | None, dict[str, Any] | None]:
        job_id = self.plan.job_id
        watchers = self._start_nodes(attempt)
        if isinstance(watchers, tuple):
            return watchers
        if not self.store.transition(job_id, RUNNING):
            self._teardown(watchers)
            return CANCELLED, "cancelled while launching", None
        self.store.add_event(job_id, "running", "all nodes started")
        exits: dict[int, int] = {}
        while True:
            self._collect_exits(watchers, attempt, exits)
            if any(code != 0 for code in exits.values()):
                first_failure = self._first_failure(watchers, attempt, exits)
                self.store.add_event(job_id, "node_failed", failures.describe(first_failure), first_failure)
                self._teardown(watchers)
                self._record_exits(watchers, attempt, exits)
                return FAILED, failures.describe(first_failure), first_failure
            if len(exits) == len(watchers):
                self._drain(watchers)
                return SUCCEEDED, None, None
            if self._cancel.is_set():
                self._teardown(watchers)
                self._record_exits(watchers, attempt, exits)
                return CANCELLED, self._cancel_reason, None
            stalled = self.stall.check(watchers) if self.stall else None
            if stalled is not None:
                self.store.add_event(job_id, "stalled", stalled["reason"], stalled)
                self._teardown(watchers)
                self._record_exits(watchers, attempt, exits)
                return FAILED, stalled["reason"], stalled
            time.sleep(POLL_S)

    def _collect_exits(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, int]) -> None:
        for watcher in watchers:
            index = watcher.handle.index
            if index in exits:
                continue
            code = watcher.handle.poll()
            if code is not None:
                exits[index] = code
                self.store.set_node(self.plan.job_id, attempt, index, state="EXITED", exit_code=code, ended_at=time.time())

    def _first_failure(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, int]) -> dict[str, Any]:
        """The failure that came first: other nodes get a moment to report theirs, then
        ``failures.precedence`` picks the cause over its echoes (exits alone are noticed in poll order)."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and len(exits) < len(watchers):
            time.sleep(POLL_S)
            self._collect_exits(watchers, attempt, exits)
        failed = [w for w in watchers if exits.get(w.handle.index, 0) != 0]
        reports_by = time.monotonic() + REPORT_WAIT_S
        for watcher in failed:
            watcher.join(max(0.0, reports_by - time.monotonic()))
        return min((self._failure(w, exits[w.handle.index]) for w in failed), key=failures.precedence)

    def _start_nodes(self, attempt: int) -> list[NodeWatcher] | tuple[str, str, dict[str, Any]]:
        """Start every node in parallel; on any failure stop those started."""
        job_id = self.plan.job_id

        def start(node):
            log_path = self.run_dir / f"attempt{attempt}-node{node.index}.log"
            self.store.set_node(
                job_id, attempt, node.index, host=node.host, address=node.address,
                state="STARTING", log_path=str(log_path), started_at=time.time(),
            )
            handle = self.backend.start(node, self.plan, self.run_dir, self.secrets)
            self.store.set_node(job_id, attempt, node.index, state="RUNNING", pid=handle.pid)
            return NodeWatcher(handle, log_path, self.store, job_id, attempt, self.echo, self.secrets)

        watchers, errors = [], []
        with ThreadPoolExecutor(max_workers=min(32, len(self.plan.nodes))) as pool:
            futures = [(node, pool.submit(start, node)) for node in self.plan.nodes]
            for node, future in futures:
                try:
                    watchers.append(future.result())
                except Exception as exc:  # noqa: BLE001 - any start failure fails the job, reported below
                    errors.append((node, exc))
        if errors:
            self._teardown(watchers)
            node, exc = errors[0]
            if isinstance(exc, NodeStartError):
                node = self.plan.nodes[exc.node]
            failure = {"node": node.index, "host": node.host, "reason": f"could not start: {exc}"}
            return FAILED, failures.describe(failure), failure
        return watchers

    def _failure(self, watcher: NodeWatcher, code: int) -> dict[str, Any]:
        node = self.plan.nodes[watcher.handle.index]
        tail = list(watcher.tail)
        failure: dict[str, Any] = {
            "node": node.index,
            "host": node.host,
            "exit_code": code,
            "signal": failures.signal_name(code),
            "detected_at": time.time(),
        }
        failure.update({k: v for k, v in failures.parse_agent_failure(tail).items() if k != "host"})
        rank_prefix = f"[{node.index}/{failure.get('rank')}] "
        rank_lines = [line for line in tail if line.startswith(rank_prefix)]
        failure["last_lines"] = rank_lines[-20:] or tail[-20:]
        kernel_log = self.backend.kernel_log(node.index) if failure.get("exit_code") == -9 else []
        failure["reason"] = failures.explain(failure, rank_lines or tail, kernel_log)
        return failure

    def _teardown(self, watchers: list[NodeWatcher]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(watchers)))) as pool:
            list(pool.map(lambda w: w.handle.terminate(self.grace), watchers))
        self._drain(watchers)

    def _drain(self, watchers: list[NodeWatcher]) -> None:
        for watcher in watchers:
            watcher.join(5.0)

    def _record_exits(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, int]) -> None:
        for watcher in watchers:
            index = watcher.handle.index
            if index not in exits:
                code = watcher.handle.poll()
                self.store.set_node(self.plan.job_id, attempt, index, state="STOPPED", exit_code=code, ended_at=time.time())


def main(argv: list[str]) -> int:
    """Entry of a detached supervisor: ``python -m launcher.supervisor JOB_ID``."""
    from launcher.backends.base import get_backend
    from launcher.orchestrate import replanner
    from launcher.secrets import read_secrets
    from launcher.spec.cluster import ClusterSpec
    from launcher.spec.job import JobSpec

    store = Store()
    job = store.job(argv[0])
    plan = Plan.model_validate(job["plan"])
    cluster = ClusterSpec.model_validate(job["spec"]["cluster"])
    spec = job["spec"]["job"]
    supervisor = Supervisor(
        store, plan, get_backend(plan.backend, cluster), secrets=read_secrets(plan.secrets),
        grace=spec["watch"]["grace_period"], restarts=spec["restarts"], stall_timeout=spec["watch"]["stall_timeout"],
        replan=(replanner(JobSpec.model_validate(spec), cluster, store, job["spec"].get("check", True))
                if spec.get("leave_out_failed_nodes") else None),
    )
    supervisor.install_signal_handlers()
    state = supervisor.run()
    return 0 if state == SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
