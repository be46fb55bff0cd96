"""The supervisor: starts a plan's nodes, follows them, and ends the job cleanly.

It relays every line with a ``[node/rank]`` prefix (to the console in the foreground, always to
per-node log files, each line after its epoch time), files metric records in the store, follows
what the node agents measure (CPU time, memory, GPU use of every rank), notices the first node
that fails and tears the others down, calls a silent and idle job hung (taking every rank's
stack first), obeys cancel requests (SIGTERM/SIGINT), restarts after failures that can pass,
and checks that no process of the job is left before it records the final state. Its own errors
end the job FAILED ("launch internal error"), never a job left RUNNING.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launcher.backends import failures
from launcher.backends.base import (
    Backend,
    NodeHandle,
    Preflight,
    StageSink,
    StartContext,
    no_stage,
)
from launcher.backends.failures import Failure, FailureKind
from launcher.errors import LaunchError, NodeStartError, PreflightError
from launcher.metrics.aggregate import summarize
from launcher.metrics.record import Rejected, RejectedCount, parse_line, parse_samples
from launcher.plan.planner import Plan
from launcher.plan.shell import mask
from launcher.run import identity, stacks
from launcher.run.liveness import HangDetector, Liveness
from launcher.store.db import Store
from launcher.store.states import JobState, NodeState

_RANK_PREFIX = re.compile(r"^\[(\d{1,7})\]:(?=.)")
SETTLE_S = 1.0
REPORT_WAIT_S = 5.0  # how long failed nodes' output may take to reach us (their failure reports), under load
TAIL_LINES = 200
POLL_S = 0.1
PROGRESS_PROXY_S = 120.0  # a program without the Reporter that ran this long has made progress
Replanner = Callable[[Plan, frozenset[str]], tuple[Plan, Backend]]


class NodeWatcher:
    """Reads one node agent's framed lines: log file, console echo, metric records, samples, last lines.

    It never dies on its own errors: a line it cannot handle is counted and skipped, so the
    pipe is always drained and the ranks never block on a full one.
    """

    def __init__(self, handle: NodeHandle, host: str, log_path: Path, sup: Supervisor, attempt: int) -> None:
        self.handle = handle
        self.host = host
        self.log_path = log_path
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.pids: set[int] = set()
        self.samples: dict[int, dict] = {}
        self.agent_exit: int | None = None
        self.errors = 0
        self._sup, self._attempt = sup, attempt
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"node{handle.index}")
        self._thread.start()

    def _run(self) -> None:
        try:
            with open(self.log_path, "a", encoding="utf-8", errors="replace") as log:
                for raw in self.handle.lines():
                    try:
                        self._line(raw, log)
                    except Exception as exc:  # noqa: BLE001 - one bad line must not stop the relay
                        self.errors += 1
                        if self.errors == 1:
                            self._sup.internal_note(f"node {self.handle.index}: a line could not be handled: {exc!r}")
        except Exception as exc:  # noqa: BLE001 - the node's channel broke: its exit code says the rest
            self._sup.internal_note(f"node {self.handle.index}: reading its output failed: {exc!r}")

    def _line(self, raw: str, log) -> None:
        node, now = self.handle.index, time.time()
        if raw.startswith("@"):
            kind, _, data = raw[1:].partition(" ")
            self._event(kind, json.loads(data) if data else {}, now)
            return
        text = raw[1:] if raw.startswith("|") else raw
        if self._sup.secrets:
            text = mask(text, self._sup.secrets)
        self._sup.live.output(now)
        record = parse_line(text, world_size=self._sup.plan.world_size, node=node, host=self.host)
        if isinstance(record, Rejected):
            self._sup.rejected_record(node, record)
            return
        if record is not None:
            self._sup.live.progress(node, record.rank, record.step, now)
            self._sup.store.add_metrics(self._sup.plan.job_id, self._attempt, [record])
            return
        match = _RANK_PREFIX.match(text)
        shown = f"[{node}/{match[1]}] {text[match.end():]}" if match else f"[{node}] {text}"
        log.write(f"{now:.3f} {shown}\n")
        log.flush()
        self.tail.append(shown)
        self._sup.echo_line(shown)

    def _event(self, kind: str, data: dict, now: float) -> None:
        if kind == "sample":
            node = self.handle.index
            samples = [s for s in parse_samples(data, world_size=self._sup.plan.world_size, node=node, host=self.host)
                       if not isinstance(s, Rejected)]
            for entry in data.get("ranks", []) if isinstance(data.get("ranks"), list) else []:
                if isinstance(entry, dict) and isinstance(entry.get("pids"), list):
                    self.pids.update(pid for pid in entry["pids"] if isinstance(pid, int))
            for sample in samples:
                self.samples[sample.rank] = sample
                self.pids.add(sample.pid)
                self._sup.live.sample(node, sample.rank, sample.cpu_s, sample.gpu_util, now)
            if samples:
                self._sup.store.add_samples(self._sup.plan.job_id, self._attempt, samples)
        elif kind == "started":
            self.handle.pid = int(data["pid"])
        elif kind == "exit":
            self.agent_exit = int(data["code"])

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


class Supervisor:
    """Runs one job to its end: SUCCEEDED, FAILED or CANCELLED."""

    def __init__(
        self,
        store: Store,
        plan: Plan,
        backend: Backend,
        *,
        echo: Callable[[str], None] | None = None,
        warn: Callable[[str], None] | None = None,
        stage: StageSink = no_stage,
        secrets: Mapping[str, str] | None = None,
        grace: float = 5.0,
        restarts: int = 0,
        restart_on: str = "transient",
        stall_timeout: float | None = None,
        replan: Replanner | None = None,
        place: Callable[[Plan, Preflight], Plan] | None = None,
    ) -> None:
        """``replan`` (given with ``leave_out_failed_nodes``) re-plans a restart without the hosts given:
        a host that failed first in two attempts is left out."""
        self.store = store
        self.plan = plan
        self.backend = backend
        self.echo = echo
        self._warn = warn
        self.stage = stage
        self.secrets = dict(secrets or {})
        self.grace = grace
        self.restarts = restarts
        self.restart_on = restart_on
        self.replan = replan
        self.place = place
        self.first_failures: collections.Counter[str] = collections.Counter()
        self.hangs = HangDetector(stall_timeout, plan.max_steps) if stall_timeout else None
        self.live = Liveness(time.time())
        self.run_dir = store.run_dir(plan.job_id)
        self._cancel = threading.Event()
        self._cancel_reason = ""
        self._quiet = threading.Event()
        self._rejected = RejectedCount()
        self._rejected_lock = threading.Lock()

    # output

    def echo_line(self, line: str) -> None:
        """Show a relayed line in the foreground, unless the job is being torn down (those stay in the logs)."""
        if self.echo is not None and not self._quiet.is_set():
            self.echo(line)

    def warn(self, text: str) -> None:
        self.store.add_event(self.plan.job_id, "warning", text)
        if self._warn is not None:
            self._warn(f"warning: {text}")

    def rejected_record(self, node: int, rejected: Rejected) -> None:
        """Count a malformed metric record (never stored); warn once an attempt."""
        with self._rejected_lock:
            warning = self._rejected.add(rejected)
        if warning:
            self.warn(f"node {node}: {warning}")

    def internal_note(self, text: str) -> None:
        with open(self.run_dir / "supervisor-errors.log", "a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n{traceback.format_exc()}\n")

    # control

    def request_cancel(self, reason: str = "cancelled by user") -> None:
        """Ask the watch loop to tear the job down and end it CANCELLED (thread- and signal-safe)."""
        self._cancel_reason = reason
        self._cancel.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM (launch cancel) and SIGINT (Ctrl-C) cancel the job."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_cancel("cancelled (SIGTERM to the supervisor)"))
        signal.signal(signal.SIGINT, lambda *_: self.request_cancel("cancelled (Ctrl-C)"))

    def run(self) -> JobState:
        """Start every node, watch until the end (restarting as the policy allows), clean up."""
        job_id = self.plan.job_id
        identity.record(self.run_dir, job_id)
        self.store.update_job(job_id, supervisor_pid=os.getpid())
        if not self.store.transition(job_id, JobState.LAUNCHING, attempt=0):
            return JobState(self.store.job(job_id)["state"])
        self.store.add_event(job_id, "launching", f"starting {self.plan.nnodes} node(s) on {self.plan.backend}")
        try:
            state, reason, failure = self._attempts()
        except Exception as exc:  # noqa: BLE001 - the job must end, whatever went wrong in launch
            self.internal_note(f"launch internal error: {exc!r}")
            self._quiet.set()
            state, reason = JobState.FAILED, f"launch internal error: {exc!r} (traceback in {self.run_dir}/supervisor-errors.log)"
            failure = Failure(kind=FailureKind.INTERNAL, reason=reason)
            self._sweep()
        finally:
            self.backend.close()
        try:
            summary = summarize(self.store.metrics(job_id), self.store.samples(job_id))
        except Exception as exc:  # noqa: BLE001 - a summary that cannot be made must not keep the job open
            self.internal_note(f"the metric summary could not be made: {exc!r}")
            summary = None
        self.store.transition(job_id, state, reason=reason,
                              first_failure=failure.model_dump(mode="json") if failure else None, summary=summary)
        self.store.add_event(job_id, state.lower(), reason or state)
        return state

    def _attempts(self) -> tuple[JobState, str | None, Failure | None]:
        attempt = 0
        while True:
            state, reason, failure = self._run_attempt(attempt)
            self._sweep()
            self._file_rejected()
            if state != JobState.FAILED or self._cancel.is_set():
                return state, reason, failure
            why_not = self._why_not_restart(attempt, failure)
            if why_not:
                if self.restarts:
                    self.store.add_event(self.plan.job_id, "no_restart", why_not)
                return state, reason if not self.restarts else f"{reason} ({why_not})", failure
            if self.replan is not None and failure is not None:
                problem = self._leave_out_twice_failed(failure)
                if problem:
                    return state, f"{reason}; {problem}", failure
                if self._cancel.is_set():
                    return JobState.CANCELLED, self._cancel_reason, None
            attempt += 1
            self.store.add_event(
                self.plan.job_id, "restarting",
                f"attempt {attempt - 1} failed ({reason}); restart {attempt} of {self.restarts}"
                + ("" if failure is None or failure.transient else " (restart_on: any)"),
                failure.model_dump(mode="json") if failure else None,
            )
            if not self._next_attempt(attempt):
                return JobState.CANCELLED, self._cancel_reason or "cancelled", None

    def _file_rejected(self) -> None:
        """One event for the attempt's dropped metric records, then count afresh."""
        with self._rejected_lock:
            count, self._rejected = self._rejected, RejectedCount()
        if count.count:
            self.store.add_event(self.plan.job_id, "metrics_rejected",
                                 f"{count.count} malformed metric record(s) dropped; first: {count.first}",
                                 {"count": count.count, "first": count.first})

    def _why_not_restart(self, attempt: int, failure: Failure | None) -> str | None:
        """Why this failure is not restarted (None: restart). With ``leave_out_failed_nodes`` a node's own
        failure is restarted whatever its kind: a host that fails twice is replaced, so it need not repeat."""
        if attempt >= self.restarts:
            return f"no restart left (restarts: {self.restarts})" if self.restarts else "restarts: 0"
        node_at_fault = (self.replan is not None and failure is not None and failure.node is not None
                         and failure.kind in (FailureKind.EXIT, FailureKind.LOST, FailureKind.OOM))
        if failure is not None and not failure.transient and self.restart_on != "any" and not node_at_fault:
            return ("not restarted: this failure would repeat (restart_on: transient restarts only lost nodes, "
                    "network/NCCL errors, signals from outside and hangs after progress; set restart_on: any to restart anyway)")
        return None

    def _sweep(self) -> None:
        report = self.backend.sweep(self.plan, self.grace)
        for problem in report.problems():
            self.store.add_event(self.plan.job_id, "sweep", problem,
                                 {"nodes": [n.__dict__ for n in report.nodes if n.outcome != "clean"]})

    def _leave_out_twice_failed(self, failure: Failure) -> str | None:
        """Count the failure against its host; at its second, re-plan without it. A problem text if that fails.

        Only a node whose processes exited or whose connection was lost counts (its failure has an exit
        code): a stall names the node heard from least recently, and a start or setup failure is reported
        by every node alike, so neither says which host is broken.
        """
        if failure.exit_code is None or failure.node is None or failure.kind not in (FailureKind.EXIT, FailureKind.LOST, FailureKind.OOM):
            return None
        host = failure.host or self.plan.nodes[failure.node].host
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
        self.live = Liveness(time.time())
        self._quiet.clear()
        if self.store.job(job_id)["state"] == JobState.LAUNCHING:
            self.store.update_job(job_id, attempt=attempt)
            return True
        return self.store.transition(job_id, JobState.LAUNCHING, attempt=attempt)

    # one attempt

    def _run_attempt(self, attempt: int) -> tuple[JobState, str | None, Failure | None]:
        job_id = self.plan.job_id
        started = self._start_nodes(attempt)
        if isinstance(started, Failure) and self._cancel.is_set():
            return JobState.CANCELLED, self._cancel_reason, None
        if isinstance(started, Failure):
            return JobState.FAILED, started.describe(), started
        watchers = started
        if not self.store.transition(job_id, JobState.RUNNING):
            self._teardown(watchers)
            return JobState.CANCELLED, "cancelled while launching", None
        self.store.add_event(job_id, "running", "all nodes started")
        self.live = Liveness(time.time())
        exits: dict[int, int] = {}
        while True:
            self._collect_exits(watchers, attempt, exits)
            if any(code != 0 for code in exits.values()):
                failure = self._first_failure(watchers, attempt, exits)
                self.store.add_event(job_id, "node_failed", failure.describe(), failure.model_dump(mode="json"))
                self._teardown(watchers)
                self._record_exits(watchers, attempt, exits)
                return JobState.FAILED, failure.describe(), failure
            if len(exits) == len(watchers):
                self._drain(watchers)
                return JobState.SUCCEEDED, None, None
            if self._cancel.is_set():
                self._teardown(watchers)
                self._record_exits(watchers, attempt, exits)
                return JobState.CANCELLED, self._cancel_reason, None
            hung = self.hangs.check(self.live, time.time()) if self.hangs else None
            if hung is not None:
                self._quiet.set()
                self.store.add_event(job_id, "hung" if hung.kind == FailureKind.HANG else "stalled", hung.reason,
                                     hung.model_dump(mode="json"))
                taken = stacks.collect(self.backend, self.plan, self.store, attempt)
                if taken.odd_one_out:
                    hung = hung.model_copy(update={"reason": f"{hung.reason}; {taken.odd_one_out}"})
                self._teardown(watchers)
                self._record_exits(watchers, attempt, exits)
                return JobState.FAILED, hung.describe(), hung
            time.sleep(POLL_S)

    def _start_nodes(self, attempt: int) -> list[NodeWatcher] | Failure:
        """Start every node through the backend; a Failure (nothing left running) if any cannot start."""
        job_id = self.plan.job_id
        for node in self.plan.nodes:
            self.store.set_node(job_id, attempt, node.index, host=node.host, address=node.address,
                                state=NodeState.STARTING, started_at=time.time())
        context = StartContext(run_dir=self.run_dir, secrets=self.secrets, grace=self.grace, stage=self.stage,
                               submitted=self._submitted, queued=self._queued, allocated=self._allocated,
                               cancelled=self._cancel, place=self.place)
        try:
            planned = self.plan
            self.plan, handles = self.backend.start(self.plan, context)
            if self.plan != planned:  # placed inside the allocation: status and cancel follow the nodes it got
                self.store.update_job(job_id, plan=self.plan.model_dump(mode="json"))
        except NodeStartError as exc:
            node = self.plan.nodes[exc.node]
            return Failure(kind=FailureKind.START, node=node.index, host=node.host, reason=f"could not start: {exc}")
        except PreflightError as exc:
            return Failure(kind=FailureKind.PREFLIGHT, reason=str(exc))
        except LaunchError as exc:
            return Failure(kind=FailureKind.START, reason=f"could not start: {exc}")
        watchers = []
        for handle in handles:
            node = self.plan.nodes[handle.index]
            log_path = self.run_dir / f"attempt{attempt}-node{node.index}.log"
            self.store.set_node(job_id, attempt, node.index, host=node.host, address=node.address,
                                state=NodeState.RUNNING, pid=handle.pid, log_path=str(log_path))
            watchers.append(NodeWatcher(handle, node.host, log_path, self, attempt))
        return watchers

    def _submitted(self, scheduler_id: str) -> None:
        """The scheduler has the job: its id recorded (`launch submit --detach` returns on it)."""
        self.store.update_job(self.plan.job_id, scheduler_id=scheduler_id)
        self.store.add_event(self.plan.job_id, "submitted", f"submitted to the scheduler: its job {scheduler_id}",
                             {"scheduler_id": scheduler_id})

    def _queued(self, reason: str, scheduler_id: str | None) -> None:
        """The scheduler holds the job: QUEUED with its reason and job id, said once per reason."""
        job_id = self.plan.job_id
        if not self.store.transition(job_id, JobState.QUEUED, queue_reason=reason, scheduler_id=scheduler_id):
            self.store.update_job(job_id, queue_reason=reason, scheduler_id=scheduler_id)
        text = f"queued by the scheduler (its job {scheduler_id}): {reason}"
        self.store.add_event(job_id, "queued", text, {"reason": reason, "scheduler_id": scheduler_id})
        if self._warn is not None:
            self._warn(f"job {job_id}: {text}; Ctrl-C cancels it")

    def _allocated(self, scheduler_id: str) -> None:
        """The scheduler gave the job its nodes: LAUNCHING again (from QUEUED), its job id kept."""
        job_id = self.plan.job_id
        self.store.update_job(job_id, scheduler_id=scheduler_id, queue_reason=None)
        if self.store.transition(job_id, JobState.LAUNCHING):
            self.store.add_event(job_id, "allocated", f"the scheduler allocated the nodes (its job {scheduler_id})")

    def _collect_exits(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, int]) -> None:
        for watcher in watchers:
            index = watcher.handle.index
            if index in exits:
                continue
            code = watcher.handle.poll()
            if code is not None:
                exits[index] = code
                self.store.set_node(self.plan.job_id, attempt, index, state=NodeState.EXITED, exit_code=code,
                                    ended_at=time.time())

    def _first_failure(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, int]) -> Failure:
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

    def _failure(self, watcher: NodeWatcher, code: int) -> Failure:
        """The node's failure: for each rank torchrun's report names, a failure classified from that rank's own
        lines; the one that came first by ``failures.precedence`` (its own error before an echo of a peer's)."""
        node = self.plan.nodes[watcher.handle.index]
        tail = list(watcher.tail)
        decided = getattr(watcher.handle, "scheduler_failure", None)  # a scheduler's verdict (Slurm), trusted
        if decided is not None:
            return decided.model_copy(update={
                "node": node.index, "host": node.host, "exit_code": code, "signal": failures.signal_name(code),
                "detected_at": time.time(), "last_lines": tail[-20:]})
        lost = watcher.agent_exit is None and (watcher.handle.lost_reason is not None or failures.agent_lost(code))
        reports = failures.parse_agent_failure(tail, self.plan.world_size) or [failures.AgentReport()]
        why_lost = watcher.handle.lost_reason or (
            f"its node agent was killed ({failures.signal_name(code)}) before it could report" if code and code < 0 else None)
        base = Failure(kind=FailureKind.LOST if lost else FailureKind.EXIT, node=node.index, host=node.host,
                       exit_code=code, detected_at=time.time(), reason=why_lost if lost else None)
        pids = watcher.pids | {r.pid for r in reports if r.pid}
        oom = None
        if not lost and pids:
            oom = failures.oom_kill(self.backend.kernel_log(self.plan, node.index), pids, self.live.started)
        killed = failures.oom_pid(oom) if oom else None
        rank_by_pid = {sample.pid: rank for rank, sample in watcher.samples.items()}
        rank_pids = set(rank_by_pid) | {r.pid for r in reports if r.pid}
        named = {r.rank for r in reports if r.rank is not None}
        if named and killed in rank_by_pid and rank_by_pid[killed] not in named:
            # torchrun reported only the peers that saw the killed rank go: the kernel's line names it
            reports.append(failures.AgentReport(rank=rank_by_pid[killed], pid=killed, exit_code=-signal.SIGKILL))
        candidates = []
        for report in reports:
            failure = base.model_copy(update=report.model_dump(exclude_none=True))
            failure = failure.model_copy(update={"signal": failures.signal_name(failure.exit_code)})
            rank_prefix = f"[{node.index}/{failure.rank}] "
            rank_lines = [line for line in tail if line.startswith(rank_prefix)]
            # the OOM line explains this failure unless it names another rank's process
            own_oom = None if failure.pid is not None and killed in rank_pids - {failure.pid} else oom
            if own_oom is not None and failure.rank is None:
                failure = failure.model_copy(update={"rank": rank_by_pid.get(killed), "pid": killed})
            progressed = self.live.reporting or time.time() - self.live.started >= PROGRESS_PROXY_S
            failure = failures.classify(failure, rank_lines or tail, own_oom, progressed)
            candidates.append(failure.model_copy(update={"last_lines": (rank_lines[-20:] or tail[-20:])}))
        return min(candidates, key=failures.precedence)

    def _teardown(self, watchers: list[NodeWatcher]) -> None:
        self._quiet.set()
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
                self.store.set_node(self.plan.job_id, attempt, index, state=NodeState.STOPPED,
                                    exit_code=watcher.handle.poll(), ended_at=time.time())
