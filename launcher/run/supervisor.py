"""The supervisor: starts a plan's nodes, follows them, and ends the job cleanly.

It relays every line with a ``[node/rank]`` prefix (``watcher``: to the console in the foreground,
always to per-node log files), files metric records in the store, follows what the node agents
measure (``liveness``), notices the first node that fails (``attribution``) and tears the others
down, calls a silent and idle job hung (taking every rank's stack first), obeys cancel requests
(SIGTERM, SIGINT, SIGHUP), restarts after failures that can pass, and checks that no process of the
job is left before it records the final state. Whatever goes wrong, it ends in one guarded finish
(``finish``) that writes a terminal state: its own errors end the job FAILED ("launch internal
error"), never a job left RUNNING.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import cast

from launcher.backends import failures
from launcher.backends.base import Backend, NodeHandle, Preflight, StageSink, StartContext, no_stage
from launcher.backends.failures import LOST_NODE_EXIT, Failure, FailureKind
from launcher.errors import LaunchError, NodeStartError, PreflightError, SupervisorFenced
from launcher.metrics.record import Rejected, RejectedCount
from launcher.plan.planner import Plan
from launcher.run import contact, identity, stacks
from launcher.run.attribution import NodeExit, node_failure
from launcher.run.elastic import Lost as ElasticLoss
from launcher.run.elastic import Replanner as ElasticReplanner
from launcher.run.filing import Filer, Lost
from launcher.run.finish import Outcome, finish
from launcher.run.liveness import HangDetector, Liveness
from launcher.run.notify import Notifier
from launcher.run.restarts import node_at_fault, why_not_restart
from launcher.run.scheduled import SchedulerEvents
from launcher.run.step import Attempt, CancelAsked, Do, Event, Exited, Fenced, Stalled, step
from launcher.run.watcher import NodeWatcher, Relay, Resume
from launcher.spec.notify import NotifyEvent
from launcher.store.db import Store
from launcher.store.states import JobState, NodeState

SETTLE_S = 1.0
DRAIN_S = 5.0  # how long the node watchers may take to read their nodes' last lines, all together
REPORT_WAIT_S = 5.0  # how long failed nodes' output may take to reach us (their failure reports), under load
POLL_S = 0.1
HEARTBEAT_S = 2.0  # how often the loop records that the job's supervisor is alive (jobs.supervisor_at)
Replanner = Callable[[Plan, frozenset[str]], tuple[Plan, Backend]]
CANCEL_SIGNALS = {
    signal.SIGTERM: "cancelled (SIGTERM to the supervisor)",
    signal.SIGINT: "cancelled (Ctrl-C)",
    signal.SIGHUP: "cancelled (SIGHUP: the terminal of `launch submit` was closed)",
}


class _Unreached:
    """A node `launch attach` could not reach at first: no lines, no exit yet; its watcher tries again."""

    def __init__(self, index: int, agent: tuple[int, int | None] | None, error: str) -> None:
        self.index = index
        self.pid: int | None = agent[0] if agent else None
        self.lost_reason: str | None = None
        self.error = error

    def lines(self):
        return iter(())

    def poll(self) -> int | None:
        return LOST_NODE_EXIT if self.lost_reason is not None else None

    def terminate(self, grace: float) -> None:
        """Nothing to signal through: the sweep reaches the node if it can."""


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
        elastic: ElasticReplanner | None = None,
        notifier: Notifier | None = None,
        generation: int = 0,
    ) -> None:
        """``replan`` (given with ``leave_out_failed_nodes``) re-plans a restart without the hosts given:
        a host that failed first in two attempts is left out. ``elastic`` (an elastic job) re-plans every
        restart on the nodes left, without the one lost (``run.elastic``). ``generation``: this supervisor's
        (0 for the submitting one; `launch attach` records a newer one on the nodes first): once a node records
        a newer one, this supervisor is fenced and stops (``SupervisorFenced``), deciding and writing nothing."""
        self.store = store
        self.plan = plan
        self.backend = backend
        backend.generation = generation  # the nodes refuse this supervisor's signals and sweeps once taken over
        self.echo = echo
        self._warn = warn
        self.stage = stage
        self.secrets = dict(secrets or {})
        self.grace = grace
        self.restarts = restarts
        self.restart_on = restart_on
        self.replan = replan
        self.place = place
        self.elastic = elastic
        self.notifier = notifier
        self.generation = generation
        self.first_failures: collections.Counter[str] = collections.Counter()
        self.hangs = HangDetector(stall_timeout, plan.max_steps, [n.host for n in plan.nodes]) if stall_timeout else None
        self.live = Liveness(time.time())
        self.run_dir = store.run_dir(plan.job_id)
        self._cancel = threading.Event()
        self._cancel_reason = ""
        self._quiet = threading.Event()
        self._rejected = RejectedCount()
        self._sequence = itertools.count().__next__  # the order in which this supervisor observes things
        self._relay: Relay | None = None
        self._filer: Filer | None = None
        self._lost: dict[int, Lost] = {}
        self._resume_attempt: int | None = None  # `launch attach`: follow this attempt's nodes instead of starting
        self._heartbeat_at = 0.0
        self._out_of_contact: dict[int, contact.OutOfContact] = {}

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
        warning = self._rejected.add(rejected)
        if warning:
            self.warn(f"node {node}: {warning}")

    def internal_note(self, text: str) -> None:
        """Keep an error of launch's own (with its traceback) in the run directory; never raises (the disk may be full)."""
        entry = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n{traceback.format_exc()}\n"
        try:
            with open(self.run_dir / "supervisor-errors.log", "a", encoding="utf-8") as handle:
                handle.write(entry)
        except OSError:
            try:
                sys.stderr.write(entry)
            except (OSError, ValueError):
                pass  # nowhere left to say it; the job's reason says what was lost

    # control

    def request_cancel(self, reason: str = "cancelled by user") -> None:
        """Ask the watch loop to tear the job down and end it CANCELLED (thread- and signal-safe)."""
        self._cancel_reason = reason
        self._cancel.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM (launch cancel), SIGINT (Ctrl-C) and SIGHUP (the submitting terminal closed) cancel the job."""
        for signum, reason in CANCEL_SIGNALS.items():
            signal.signal(signum, lambda *_, why=reason: self.request_cancel(why))

    def run(self) -> JobState:
        """Start every node, watch until the end (restarting as the policy allows), clean up; the final state.

        It always ends in ``finish``: whatever was raised, the backend is closed and a terminal state written.
        """
        return self._supervise(resume=None)

    def attach(self, attempt: int) -> JobState:
        """Supervise a RUNNING job whose supervisor is gone (`launch attach`): follow every node of ``attempt``
        from the journal lines the store has, then go on as ``run`` does (restarts, one guarded finish)."""
        return self._supervise(resume=attempt)

    def _supervise(self, resume: int | None) -> JobState:
        job_id = self.plan.job_id
        outcome: Outcome | None = Outcome(JobState.FAILED, "launch internal error: the supervisor was interrupted")
        fenced: SupervisorFenced | None = None
        try:
            identity.record(self.run_dir, job_id, self.generation)
            self.store.update_job(job_id, supervisor_pid=os.getpid(), supervisor_at=time.time())
            if resume is not None:
                self._resume_attempt = resume
                outcome = self._attempts(resume)
            elif not self.store.transition(job_id, JobState.LAUNCHING, attempt=0):
                outcome = None  # the job ended (cancelled) before it launched: nothing to write
            else:
                self.store.add_event(job_id, "launching", f"starting {self.plan.nnodes} node(s) on {self.plan.backend}")
                outcome = self._attempts()
        except SupervisorFenced as exc:  # a newer supervisor decides now: no sweep, no state, no notice
            fenced = exc
        except Exception as exc:  # noqa: BLE001 - the job must end, whatever went wrong in launch
            outcome = self._internal_error(exc)
        finally:
            self._guarded("closing the backend", self.backend.close)
            if fenced is None:
                state = self._finish(outcome)
        if fenced is not None:
            self._quiet.set()
            raise fenced
        return state

    def _finish(self, outcome: Outcome | None) -> JobState:
        job_id = self.plan.job_id
        if outcome is None:
            return JobState(self.store.job(job_id)["state"])
        self._file_losses()
        state = finish(self.store, job_id, outcome.with_losses(self._lost), self.internal_note)
        self._guarded("notifying", lambda: self._notify(state))
        return state

    def _notify(self, state: JobState, reason: str | None = None, event: NotifyEvent | None = None) -> None:
        """Tell the job's notifiers (``notify:``) what happened; a notifier's problem is an event, never the job's."""
        if self.notifier is not None:
            self.notifier.tell(self.store, self.plan.job_id, self.plan.job_name, event or cast(NotifyEvent, state.lower()),
                               str(state), reason)

    def _internal_error(self, exc: Exception) -> Outcome:
        self.internal_note(f"launch internal error: {exc!r}")
        self._quiet.set()
        reason = f"launch internal error: {exc!r} (traceback in {self.run_dir}/supervisor-errors.log)"
        self._guarded("the sweep after an internal error", self._sweep)
        return Outcome(JobState.FAILED, reason, Failure(kind=FailureKind.INTERNAL, reason=reason))

    def _guarded(self, what: str, step: Callable[[], object]) -> None:
        """Run a clean-up step; its error is noted (and filed as an event if the store allows), never raised."""
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - one failed clean-up step must not stop the others or the finish
            self.internal_note(f"{what} failed: {exc!r}")
            try:
                self.store.add_event(self.plan.job_id, "internal_error", f"{what} failed: {exc!r}")
            except Exception:  # noqa: BLE001 - noted above already
                pass

    def _attempts(self, attempt: int = 0) -> Outcome:
        while True:
            outcome = self._run_attempt(attempt)
            if outcome.failure is not None and outcome.failure.kind == FailureKind.START:
                self._in_charge()  # the agents of a fenced supervisor refuse to start: its sweep must not follow
            self._sweep()
            self._file_rejected()
            self._file_losses()
            if outcome.state != JobState.FAILED or self._cancel.is_set():
                return outcome
            failure = outcome.failure
            why_not = why_not_restart(attempt, failure, self.restarts, self.restart_on, self.replan is not None)
            if why_not:
                if self.restarts:
                    self.store.add_event(self.plan.job_id, "no_restart", why_not)
                return outcome if not self.restarts else outcome.with_reason(f"{outcome.reason} ({why_not})")
            if self.replan is not None and failure is not None:
                problem = self._leave_out_twice_failed(failure)
                if problem:
                    return outcome.with_reason(f"{outcome.reason}; {problem}")
                if self._cancel.is_set():
                    return Outcome(JobState.CANCELLED, self._cancel_reason)
            if self.elastic is not None:
                problem = self._go_elastic(failure, attempt)
                if problem:
                    return outcome.with_reason(f"{outcome.reason}; {problem}")
            self._in_charge()  # a supervisor taken over restarts nothing
            attempt += 1
            self.store.add_event(
                self.plan.job_id, "restarting",
                f"attempt {attempt - 1} failed ({outcome.reason}); restart {attempt} of {self.restarts}"
                + ("" if failure is None or failure.transient else " (restart_on: any)"),
                failure.model_dump(mode="json") if failure else None,
            )
            self._guarded("notifying", functools.partial(self._notify, JobState.FAILED, outcome.reason, "restarted"))
            if not self._next_attempt(attempt):
                return Outcome(JobState.CANCELLED, self._cancel_reason or "cancelled")

    def _file_rejected(self) -> None:
        """One event for the attempt's dropped metric records, then count afresh."""
        count, self._rejected = self._rejected, RejectedCount()
        if count.count:
            self.store.add_event(self.plan.job_id, "metrics_rejected",
                                 f"{count.count} malformed metric record(s) dropped; first: {count.first}",
                                 {"count": count.count, "first": count.first})

    def _file_losses(self) -> None:
        """File what the attempt's watchers handed over last; what could not be stored: kept for the final reason,
        and one event if the store takes it."""
        self._guarded("filing what the watchers handed over", self._observe)
        relay, filer = self._relay, self._filer
        lost = relay.losses.take() if relay is not None else None
        if filer is None or lost is None:
            return
        self._lost[filer.attempt] = lost
        data = {"attempt": filer.attempt, "records": lost.records, "samples": lost.samples, "lines": lost.lines,
                "first_error": lost.first_error}
        self._guarded("filing what was lost", lambda: self.store.add_event(
            self.plan.job_id, "records_lost", f"attempt {filer.attempt}: {lost.describe()}", data))

    def _sweep(self) -> None:
        self._heartbeat()
        report = self.backend.sweep(self.plan, self.grace)
        for problem in report.problems():
            self.store.add_event(self.plan.job_id, "sweep", problem,
                                 {"nodes": [n.__dict__ for n in report.nodes if n.outcome != "clean"]})

    def _leave_out_twice_failed(self, failure: Failure) -> str | None:
        """Count a node's own failure (``restarts.node_at_fault``, with an exit code) against its host; at its
        second, re-plan without it. A problem text if that fails."""
        if self.replan is None or not node_at_fault(failure) or failure.exit_code is None:
            return None
        host = failure.host or self.plan.nodes[failure.node or 0].host
        self.first_failures[host] += 1
        if self.first_failures[host] < 2:
            return None
        left_out = frozenset(h for h, count in self.first_failures.items() if count >= 2)
        try:
            plan, backend = self.replan(self.plan, left_out)
        except LaunchError as exc:
            return f"{host} failed first in two attempts and was left out, but the job cannot restart without it: {exc}"
        self._guarded("closing the backend of the hosts left out", self.backend.close)
        self.plan, self.backend = plan, backend
        backend.generation = self.generation
        self.store.add_event(
            self.plan.job_id, "node_left_out",
            f"{host} failed first in two attempts: left out; restarting on {', '.join(n.host for n in plan.nodes)}",
            {"host": host, "nodes": [n.host for n in plan.nodes]},
        )
        return None

    def _go_elastic(self, failure: Failure | None, attempt: int) -> str | None:
        """Re-plan the next attempt of an elastic job without the node this one lost; a problem text if it cannot go on."""
        assert self.elastic is not None
        lost = ElasticLoss()
        if node_at_fault(failure):
            assert failure is not None
            steps = [r.step for r in self.store.metrics(self.plan.job_id) if r.attempt == attempt]
            lost = ElasticLoss(failure.host or self.plan.nodes[failure.node or 0].host, max(steps, default=None))
        try:
            shrunk = self.elastic(self.plan, lost, attempt + 1)
        except LaunchError as exc:
            return f"not restarted on fewer nodes: {exc}"
        self._guarded("closing the backend of the previous attempt", self.backend.close)
        self.plan, self.backend, self.place = shrunk.plan, shrunk.backend, shrunk.place or self.place
        shrunk.backend.generation = self.generation
        if self.hangs is not None:
            self.hangs.hosts = tuple(n.host for n in shrunk.plan.nodes)
        self.store.add_event(self.plan.job_id, "elastic_restart", shrunk.message, shrunk.data)
        return None

    def _next_attempt(self, attempt: int) -> bool:
        """Record the new attempt (RUNNING -> LAUNCHING); False if the job was cancelled meanwhile."""
        job_id = self.plan.job_id
        self._quiet.clear()
        if self.store.job(job_id)["state"] == JobState.LAUNCHING:
            self.store.update_job(job_id, attempt=attempt)
            return True
        return self.store.transition(job_id, JobState.LAUNCHING, attempt=attempt)

    # one attempt

    def _run_attempt(self, attempt: int) -> Outcome:
        job_id = self.plan.job_id
        exits: dict[int, NodeExit] = {}
        if self._resume_attempt == attempt:
            self._resume_attempt = None
            watchers = self._follow_nodes(attempt, exits)
            self.live = Liveness(time.time())
        else:
            started = self._start_nodes(attempt)
            if isinstance(started, Failure) and self._cancel.is_set():
                return Outcome(JobState.CANCELLED, self._cancel_reason)
            if isinstance(started, Failure):
                return Outcome(JobState.FAILED, started.describe(), started)
            watchers = started
            if not self.store.transition(job_id, JobState.RUNNING):
                self._teardown(watchers)
                return Outcome(JobState.CANCELLED, "cancelled while launching")
            self.store.add_event(job_id, "running", "all nodes started")
            self.live = Liveness(time.time())
        self._out_of_contact = {}
        state, fed = Attempt(len(self.plan.nodes)), set[int]()
        while True:
            self._observe()
            self._heartbeat()
            for event in self._events(watchers, attempt, exits, fed):
                state, do = step(state, event)
                if do is not Do.WATCH:
                    return self._act(do, event, watchers, attempt, exits)
            time.sleep(POLL_S)

    def _events(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, NodeExit],
                fed: set[int]) -> Iterator[Event]:
        """This round's events in the order ``step`` takes them; each is looked for only once the ones before
        decided nothing (a hang is judged only when no node ended and nobody cancelled). ``fed``: the nodes whose
        exit ``step`` has had (a job followed again by `launch attach` starts with the exits the store has)."""
        fenced = next((watcher.fenced for watcher in watchers if watcher.fenced is not None), None)
        if fenced is not None:
            yield Fenced(fenced)
        self._collect_exits(watchers, attempt, exits)
        for index in sorted(exits.keys() - fed, key=lambda node: exits[node].observed):
            fed.add(index)
            yield Exited(index, exits[index].code)
        if self._cancel.is_set():
            yield CancelAsked(self._cancel_reason)
        hung = self.hangs.check(self.live, time.time()) if self.hangs else None
        if hung is not None:
            yield Stalled(hung)

    def _act(self, do: Do, event: Event, watchers: list[NodeWatcher], attempt: int,
             exits: dict[int, NodeExit]) -> Outcome:
        """Do what ``step`` decided on ``event``: the attempt's outcome."""
        job_id = self.plan.job_id
        if do is Do.STOP and isinstance(event, Fenced):
            self._guarded("filing what came before the fence", self._observe)  # the lines before the agent's word
            raise SupervisorFenced(job_id, dict(event.by))
        if do is Do.FAIL:
            failure = self._first_failure(watchers, attempt, exits)
            self.store.add_event(job_id, "node_failed", failure.describe(), failure.model_dump(mode="json"))
            self._teardown(watchers)
            self._record_exits(watchers, attempt, exits)
            return Outcome(JobState.FAILED, failure.describe(), failure)
        if do is Do.SUCCEED:
            self._drain(watchers)
            self._observe()
            return Outcome(JobState.SUCCEEDED)
        self._in_charge()
        if do is Do.HANG and isinstance(event, Stalled):
            hung = event.failure
            self._quiet.set()
            self.store.add_event(job_id, "hung" if hung.kind == FailureKind.HANG else "stalled", hung.reason or "",
                                 hung.model_dump(mode="json"))
            taken = stacks.collect(self.backend, self.plan, self.store, attempt, self.live)
            if taken.odd_one_out:
                hung = hung.model_copy(update={"reason": f"{hung.reason}; {taken.odd_one_out}"})
            self._teardown(watchers)
            self._record_exits(watchers, attempt, exits)
            return Outcome(JobState.FAILED, hung.describe(), hung)
        self._teardown(watchers)
        self._record_exits(watchers, attempt, exits)
        return Outcome(JobState.CANCELLED, self._cancel_reason)

    def _observe(self) -> None:
        """Apply what the watchers handed over: observations to this attempt's Liveness, the rest filed in the store
        in one transaction (only this loop writes either)."""
        if self._relay is not None and self._filer is not None:
            self._filer.take(self._relay.handed, self.live)

    def _start_nodes(self, attempt: int) -> list[NodeWatcher] | Failure:
        """Start every node through the backend; a Failure (nothing left running) if any cannot start."""
        job_id = self.plan.job_id
        for node in self.plan.nodes:
            self.store.set_node(job_id, attempt, node.index, host=node.host, address=node.address,
                                state=NodeState.STARTING, started_at=time.time())
        scheduler = SchedulerEvents(self.store, job_id, self._warn)
        context = StartContext(run_dir=self.run_dir, secrets=self.secrets, grace=self.grace, stage=self.stage,
                               submitted=scheduler.submitted, queued=scheduler.queued, allocated=scheduler.allocated,
                               cancelled=self._cancel, place=self.place, leased=scheduler.leased,
                               generation=self.generation, record=self._record(attempt))
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
        relay = self._new_relay(attempt)
        watchers = []
        for handle in handles:
            node = self.plan.nodes[handle.index]
            log_path = self.run_dir / f"attempt{attempt}-node{node.index}.log"
            self.store.set_node(job_id, attempt, node.index, host=node.host, address=node.address,
                                state=NodeState.RUNNING, pid=handle.pid, log_path=str(log_path))
            watchers.append(NodeWatcher(handle, node.host, log_path, relay, follow=self._follower()))
        return watchers

    def _record(self, attempt: int) -> dict | None:
        """The job as the nodes keep it (``job.json``: what `launch attach --cluster` reads back); None if unreadable."""
        from launcher.run.takeover import node_record

        try:
            return node_record(self.store.job(self.plan.job_id), self.plan, attempt)
        except Exception as exc:  # noqa: BLE001 - a record the nodes cannot keep must not stop the job
            self.internal_note(f"the job's record for its nodes could not be made: {exc!r}")
            return None

    def _follower(self):
        """How a watcher follows its node again (None where the backend cannot)."""
        if not self.backend.follows:
            return None
        backend, plan, generation = self.backend, self.plan, self.generation
        return lambda index, after, agent: backend.follow(plan, index, after, agent, generation)

    def _in_charge(self) -> None:
        """Before a cancel or hang teardown, a restart, or the sweep after a failed start: SupervisorFenced if any
        node records a newer supervisor generation (a Ctrl-C of a supervisor that was just taken over ends nothing;
        its streams tell it within a second or two anyway). A node that cannot be asked does not stop the teardown."""
        if not self.backend.fences:
            return
        job_id = self.plan.job_id
        answers = self.backend.on_nodes(self.plan, lambda index: self.backend.fence(self.plan, index, job_id)[0])
        for answer in answers:
            if answer is not None and isinstance(answer.get("generation"), int) and answer["generation"] > self.generation:
                raise SupervisorFenced(job_id, answer)

    def _new_relay(self, attempt: int) -> Relay:
        self._file_losses()  # what the previous attempt's watchers handed over last
        self._relay = Relay(world_size=self.plan.world_size, secrets=self.secrets, echo=self.echo_line,
                            note=self.internal_note, sequence=self._sequence)
        self._filer = Filer(self.store, self.plan.job_id, attempt, self._relay.losses, self.rejected_record,
                            self.internal_note)
        return self._relay

    def _follow_nodes(self, attempt: int, exits: dict[int, NodeExit]) -> list[NodeWatcher]:
        """`launch attach`: a watcher on every node of ``attempt`` still running, each from the lines the store has
        (``nodes.seen``); a node that cannot be reached now starts out of contact. Exits already recorded stand."""
        job_id = self.plan.job_id
        relay = self._new_relay(attempt)
        rows = {row["node"]: row for row in self.store.nodes(job_id, attempt)}
        follow = self._follower()
        watchers = []
        for node in self.plan.nodes:
            row = rows.get(node.index, {})
            if row.get("state") in (NodeState.EXITED, NodeState.STOPPED) and isinstance(row.get("exit_code"), int):
                exits[node.index] = NodeExit(row["exit_code"], self._sequence())
                continue
            pid, ticks = row.get("pid"), row.get("start_ticks")
            agent = (pid, ticks if isinstance(ticks, int) else None) if isinstance(pid, int) else None
            seen: int = row["seen"] if isinstance(row.get("seen"), int) else 0
            resume = Resume(seen, row.get("log_bytes") if isinstance(row.get("log_bytes"), int) else None, agent)
            handle: NodeHandle
            try:
                handle = self.backend.follow(self.plan, node.index, seen, agent, self.generation)
            except Exception as exc:  # noqa: BLE001 - unreachable now: its watcher tries again, the loop decides
                handle = _Unreached(node.index, agent, f"{exc}"[:300])
            log_path = Path(row.get("log_path") or self.run_dir / f"attempt{attempt}-node{node.index}.log")
            watchers.append(NodeWatcher(handle, node.host, log_path, relay, follow=follow, resume=resume))
        self.store.add_event(job_id, "attached", f"supervisor attached (pid {os.getpid()}): following "
                             f"{len(watchers)} node(s) from the lines the store has",
                             {"pid": os.getpid(), "seen": {w.handle.index: w.count for w in watchers}})
        return watchers

    def _heartbeat(self) -> None:
        now = time.time()
        if now - self._heartbeat_at >= HEARTBEAT_S:
            self._heartbeat_at = now
            self.store.update_job(self.plan.job_id, supervisor_at=now)

    def _contact(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, NodeExit]) -> None:
        """Out-of-contact nodes: file when contact is lost and back; declare a node lost on evidence only."""
        job_id, now = self.plan.job_id, time.time()
        failed = any(ended.code != 0 for ended in exits.values())
        for watcher in watchers:
            index = watcher.handle.index
            if index in exits:
                continue
            out = watcher.contact()
            before = self._out_of_contact.get(index)
            if out is None:
                if before is not None:
                    del self._out_of_contact[index]
                    self.store.add_event(job_id, "contact_back", f"node {index} ({watcher.host}): back in contact "
                                         f"after {now - before.since:.1f} s, followed from line {watcher.count}")
                continue
            if before is None or before.since != out.since:
                self._out_of_contact[index] = out
                self.store.add_event(job_id, "contact_lost", f"node {index} ({watcher.host}): out of contact "
                                     f"({out.error}); following it again")
            why = contact.verdict(out, contact.pulse(self.live, index, failed), now, self.plan.unattended_s)
            if why is not None:
                watcher.give_up(why)
                self.backend.node_unreachable(index)
                exits[index] = NodeExit(LOST_NODE_EXIT, self._sequence())
                self.store.set_node(job_id, attempt, index, state=NodeState.EXITED, exit_code=LOST_NODE_EXIT,
                                    ended_at=now)

    def _collect_exits(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, NodeExit]) -> None:
        self._contact(watchers, attempt, exits)
        for watcher in watchers:
            index = watcher.handle.index
            if index in exits:
                continue
            code = watcher.handle.poll()
            if code is not None:
                exits[index] = NodeExit(code, self._sequence())
                self.store.set_node(self.plan.job_id, attempt, index, state=NodeState.EXITED, exit_code=code,
                                    ended_at=time.time())

    def _first_failure(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, NodeExit]) -> Failure:
        """The failure that came first: other nodes get a moment to report theirs, then
        ``failures.precedence`` picks the cause over its echoes, in the order this supervisor saw them."""
        deadline = time.monotonic() + SETTLE_S + self.backend.verdict_delay_s
        while time.monotonic() < deadline and len(exits) < len(watchers):
            time.sleep(POLL_S)
            self._collect_exits(watchers, attempt, exits)
        failed = [w for w in watchers if w.handle.index in exits and exits[w.handle.index].code != 0]
        reports_by = time.monotonic() + REPORT_WAIT_S
        for watcher in failed:
            watcher.join(max(0.0, reports_by - time.monotonic()))
        self._observe()
        return min((node_failure(self.plan, self.backend, self.live, w, exits[w.handle.index]) for w in failed),
                   key=failures.precedence)

    def _teardown(self, watchers: list[NodeWatcher]) -> None:
        """Stop every node (at most 32 at once); the heartbeat moves as they stop, so `launch cancel` sees progress."""
        self._quiet.set()
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(watchers)))) as pool:
            for stopped in as_completed([pool.submit(w.handle.terminate, self.grace) for w in watchers]):
                stopped.result()
                self._heartbeat()
        self._drain(watchers)

    def _drain(self, watchers: list[NodeWatcher]) -> None:
        """Let the watchers read their nodes' last lines: 5 s for all of them together."""
        deadline = time.monotonic() + DRAIN_S
        for watcher in watchers:
            watcher.join(max(0.0, deadline - time.monotonic()))

    def _record_exits(self, watchers: list[NodeWatcher], attempt: int, exits: dict[int, NodeExit]) -> None:
        for watcher in watchers:
            index = watcher.handle.index
            if index not in exits:
                self.store.set_node(self.plan.job_id, attempt, index, state=NodeState.STOPPED,
                                    exit_code=watcher.handle.poll(), ended_at=time.time())
