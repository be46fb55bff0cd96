"""The supervisor: starts a plan's nodes, follows them, and ends the job cleanly.

It relays every line with a ``[node/rank]`` prefix (``watcher``: to the console in the foreground,
always to per-node log files), files metric records in the store, follows what the node agents
measure (``liveness``), notices the first node that fails (``attribution``) and tears the others
down, calls a silent and idle job hung (taking every rank's stack first), obeys cancel requests
(SIGTERM; SIGINT, asked first on a terminal), goes on in the background when its terminal closes (SIGHUP: ``hangup``),
restarts after failures that can pass, and checks that no process of the
job is left before it records the final state. Whatever goes wrong, it ends in one guarded finish
(``finish``) that writes a terminal state: its own errors end the job FAILED ("launch internal
error"), never a job left RUNNING (``errorlog`` keeps their tracebacks). Its collaborators: ``nodes`` (an
attempt's nodes, their exits and teardown), ``intake`` (what the watchers hand over, filed), ``replanning``
(a restart on other nodes).
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import cast

from launcher.backends import failures
from launcher.backends.base import Backend, Preflight, StageSink, StartContext, no_stage
from launcher.backends.failures import Failure, FailureKind
from launcher.errors import SupervisorFenced
from launcher.metrics.record import Rejected
from launcher.plan.planner import Plan
from launcher.run import errorlog, hangup, identity, stacks
from launcher.run.attribution import node_failure
from launcher.run.clean import collect
from launcher.run.elastic import Replanner as ElasticReplanner
from launcher.run.filing import Filer
from launcher.run.finish import Outcome, finish
from launcher.run.intake import Intake
from launcher.run.liveness import HangDetector, Liveness
from launcher.run.nodes import Nodes, in_charge, kept_record
from launcher.run.nodetime import AWAY_S, Attention, Away
from launcher.run.notify import Notifier
from launcher.run.replanning import Moved, Replanner, on_nodes_left, without_twice_failed
from launcher.run.restarts import why_not_restart
from launcher.run.scheduled import SchedulerEvents
from launcher.run.step import Attempt, CancelAsked, Do, Event, Fenced, Stalled, step
from launcher.run.tracking import Mirror
from launcher.run.watcher import Relay
from launcher.spec.notify import NotifyEvent
from launcher.store.db import Store
from launcher.store.schema import StoreLocked
from launcher.store.states import JobState

SETTLE_S = 1.0
REPORT_WAIT_S = 5.0  # how long failed nodes' output may take to reach us (their failure reports), under load
POLL_S = 0.1
CATCH_UP_S = 30.0  # without a stall_timeout: how long a loop back from an absence waits to hear every node
HEARTBEAT_S = 2.0  # how often the loop records that the job's supervisor is alive (jobs.supervisor_at)
CANCELLED_BY_TERM = "cancelled (SIGTERM to the supervisor)"
CANCELLED_BY_CTRL_C = "cancelled (Ctrl-C)"


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
        mirror: Mirror | None = None,
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
        self.mirror = mirror
        self.generation = generation
        self.first_failures: collections.Counter[str] = collections.Counter()
        self.hangs = HangDetector(stall_timeout, plan.max_steps, [n.host for n in plan.nodes]) if stall_timeout else None
        self.live = Liveness(time.time())
        self.run_dir = store.run_dir(plan.job_id)
        self._cancel = threading.Event()
        self._cancel_reason = ""
        self._quiet = threading.Event()
        self._sequence = itertools.count().__next__  # the order in which this supervisor observes things
        self._intake = Intake(store, plan.job_id, self.secrets, self.echo_line, self.internal_note, self._sequence,
                              self._guarded)
        self._resume_attempt: int | None = None  # `launch attach`: follow this attempt's nodes instead of starting
        self._heartbeat_at = 0.0
        self._asking = threading.Event()  # a Ctrl-C's question is on the terminal
        self._terminal_lost = threading.Event()  # the terminal closed: the job goes on, supervised in the background
        self._terminal_lost_filed = False

    # output

    def echo_line(self, line: str) -> None:
        """Show a relayed line in the foreground, unless the job is being torn down (those stay in the logs)."""
        if self.echo is not None and not self._quiet.is_set() and not self._terminal_lost.is_set():
            try:
                self.echo(line)
            except OSError:  # EIO or EPIPE: the terminal (or the pipe's reader) is gone, the job is not
                self.lose_terminal(hangup.STANDARD_FDS)

    def say(self, kind: str, text: str, data: dict | None = None, *, held: bool = False) -> None:
        """A decision or a finding of launch's own: an event, and one ``[launch]`` line in the foreground output, with
        the relayed lines (terminal or pipe, even while a teardown quiets them; supervisor.log when detached).
        ``held``: filed with the loop's round (held while another process locks the store), not at once."""
        if not held:
            try:
                self.store.add_event(self.plan.job_id, kind, text, data)
            except StoreLocked:  # locked past the busy timeout: it waits with the round's records
                held = True
        if held:
            self._intake.event(kind, text, data or {})
        show = self.echo or self._warn
        if show is not None and not self._terminal_lost.is_set():
            try:
                show(f"[launch] {text}")
            except OSError:  # the terminal (or the pipe's reader) is gone: the event has it, the job goes on
                self.lose_terminal()

    def warn(self, text: str) -> None:
        self.store.add_event(self.plan.job_id, "warning", text)
        if self._warn is not None and not self._terminal_lost.is_set():
            try:
                self._warn(f"warning: {text}")
            except OSError:
                self.lose_terminal(hangup.STANDARD_FDS)

    def rejected_record(self, node: int, rejected: Rejected) -> None:
        """Count a malformed metric record (never stored); warn once an attempt."""
        warning = self._intake.rejected.add(rejected)
        if warning:
            self.warn(f"node {node}: {warning}")

    def internal_note(self, text: str) -> None:
        """Keep an error of launch's own (with its traceback) in the run directory; never raises (the disk may be full)."""
        errorlog.note(self.run_dir, text)

    # control

    def request_cancel(self, reason: str = "cancelled by user") -> None:
        """Ask the watch loop to tear the job down and end it CANCELLED (thread- and signal-safe)."""
        self._cancel_reason = reason
        self._cancel.set()

    def install_signal_handlers(self, *, terminal: bool = False, ask: Callable[[], bool] | None = None) -> None:
        """SIGTERM (`launch cancel`) cancels the job. SIGINT (Ctrl-C) cancels it, or with ``ask`` (a terminal to
        answer on) first asks in a thread: yes cancels, and a second Ctrl-C while it asks is a yes. SIGHUP never
        ends the job: a ``terminal`` supervisor (foreground) goes on in the background (``lose_terminal``), any
        other ignores it."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_cancel(CANCELLED_BY_TERM))
        signal.signal(signal.SIGINT, lambda *_: self._interrupted(ask))
        fds = hangup.on_terminal()
        signal.signal(signal.SIGHUP, (lambda *_: self.lose_terminal(fds)) if terminal else signal.SIG_IGN)

    def _interrupted(self, ask: Callable[[], bool] | None) -> None:
        if ask is None or self._asking.is_set() or self._terminal_lost.is_set():
            self.request_cancel(CANCELLED_BY_CTRL_C)
            return
        self._asking.set()
        threading.Thread(target=self._ask, args=(ask,), daemon=True, name="launch-ctrl-c").start()

    def _ask(self, ask: Callable[[], bool]) -> None:
        try:
            yes = ask()
        except (OSError, ValueError):  # the terminal went away while asking: nobody said yes
            yes = False
        finally:
            self._asking.clear()
        if yes:
            self.request_cancel(CANCELLED_BY_CTRL_C)

    def lose_terminal(self, fds: tuple[int, ...] = hangup.STANDARD_FDS) -> None:
        """The terminal closed (signal-safe), or writing to the output failed: say how to follow the job where it can
        still be said, point ``fds`` away (those on the terminal, or all three), and go on; the loop files it
        (``_heartbeat``)."""
        if self._terminal_lost.is_set():
            return
        self._terminal_lost.set()
        hangup.detach_from_terminal(self.plan.job_id, self.run_dir, fds)

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
            if self.mirror is not None:
                self._guarded("starting the trackers' mirror", self.mirror.start)
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
            newer = exc.newer
            self._guarded("recording who took the job", lambda: identity.fenced(self.run_dir, job_id, newer))
        except Exception as exc:  # noqa: BLE001 - the job must end, whatever went wrong in launch
            outcome = self._internal_error(exc)
        finally:
            try:
                if fenced is None:
                    state = self._finish(outcome)
                    if outcome is not None:
                        self._guarded("removing the nodes' run directories", self._collect)
            finally:
                self._guarded("closing the backend", self.backend.close)
        if fenced is not None:
            self._quiet.set()
            if self.mirror is not None:  # the newer supervisor mirrors on from the cursor
                self._guarded("stopping the trackers' mirror", self.mirror.stop)
            raise fenced
        return state

    def _finish(self, outcome: Outcome | None) -> JobState:
        job_id = self.plan.job_id
        if outcome is None:
            return self.store.state(job_id)
        self._intake.file_losses(self.live)
        state = finish(self.store, job_id, outcome.with_losses(self._intake.lost), self.internal_note)
        self._guarded("notifying", lambda: self._notify(state))
        if self.mirror is not None:
            mirror = self.mirror
            self._guarded("closing the trackers' runs", lambda: mirror.close(state))
        return state

    def _collect(self) -> None:
        """The job's end filed with every line and record: ask its hosts to remove its run directories (each goes once
        every store that followed the job there has filed it, docs/JOURNALS.md "Run directories"); one event naming
        those kept. Only where supervisors follow and fence nodes (local, SSH): a Slurm allocation is gone by now,
        and those (and Ray's) stay for `launch clean` or the retention."""
        job_id = self.plan.job_id
        if not self.backend.capabilities.fences:
            return
        if self._intake.lost or not self.store.state(job_id).terminal:
            return  # what was not filed stays in the journals, for whoever reads them
        kept = collect(self.backend, self.plan, identity.store_id(self.store.home))
        if kept:
            self.store.add_event(job_id, "run_dirs_kept",
                                 "run directories kept (`launch clean` removes them; a new job of yours removes those "
                                 "untouched for 7 days): " + "; ".join(kept))

    def _notify(self, state: JobState, reason: str | None = None, event: NotifyEvent | None = None) -> None:
        """Tell the job's notifiers (``notify:``) what happened; a notifier's problem is an event, never the job's."""
        if self.notifier is not None:
            self.notifier.tell(self.store, self.plan.job_id, self.plan.job_name, event or cast(NotifyEvent, state.lower()),
                               str(state), reason)

    def _internal_error(self, exc: Exception) -> Outcome:
        self.internal_note(f"launch internal error: {exc!r}")
        self._quiet.set()
        reason = f"launch internal error: {exc!r} (traceback in {self.run_dir}/{errorlog.ERRORS_LOG})"
        self._guarded("the sweep after an internal error", self._sweep)
        return Outcome(JobState.FAILED, reason, Failure(kind=FailureKind.INTERNAL, reason=reason))

    def _guarded(self, what: str, step: Callable[[], object]) -> None:
        errorlog.guarded(what, step, self.run_dir, self.store, self.plan.job_id)

    def _attempts(self, attempt: int = 0) -> Outcome:
        while True:
            outcome = self._run_attempt(attempt)
            if outcome.failure is not None and outcome.failure.kind == FailureKind.START:
                # the agents of a fenced supervisor refuse to start: its sweep must not follow
                in_charge(self.backend, self.plan, self.generation)
            self._sweep()
            self._intake.file_rejected()
            self._intake.file_losses(self.live)
            if outcome.state != JobState.FAILED or self._cancel.is_set():
                return outcome
            failure = outcome.failure
            why_not = why_not_restart(attempt, failure, self.restarts, self.restart_on, self.replan is not None)
            if why_not:
                if self.restarts:
                    self.say("no_restart", f"no restart: {why_not}")
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
            in_charge(self.backend, self.plan, self.generation)  # a supervisor taken over restarts nothing
            attempt += 1
            self.say(
                "restarting",
                f"attempt {attempt - 1} failed ({outcome.reason}); restart {attempt} of {self.restarts}"
                + ("" if failure is None or failure.transient else " (restart_on: any)"),
                failure.model_dump(mode="json") if failure else None,
            )
            self._guarded("notifying", functools.partial(self._notify, JobState.FAILED, outcome.reason, "restarted"))
            if not self._next_attempt(attempt):
                return Outcome(JobState.CANCELLED, self._cancel_reason or "cancelled")

    def _sweep(self) -> None:
        self._heartbeat()
        report = self.backend.sweep(self.plan, self.grace, generation=self.generation)
        for problem in report.problems():
            self.store.add_event(self.plan.job_id, "sweep", problem,
                                 {"nodes": [n.__dict__ for n in report.nodes if n.outcome != "clean"]})

    def _leave_out_twice_failed(self, failure: Failure) -> str | None:
        """Count a node's own failure against its host; at its second, re-plan without it
        (``replanning.without_twice_failed``). A problem text if that fails."""
        if self.replan is None:
            return None
        return self._move(without_twice_failed(failure, self.plan, self.first_failures, self.replan),
                          "closing the backend of the hosts left out")

    def _go_elastic(self, failure: Failure | None, attempt: int) -> str | None:
        """Re-plan the next attempt of an elastic job without the node this one lost; a problem text if it cannot go on."""
        assert self.elastic is not None
        problem = self._move(on_nodes_left(failure, self.plan, attempt, self.store, self.elastic),
                             "closing the backend of the previous attempt")
        if problem is None and self.hangs is not None:
            self.hangs.hosts = tuple(n.host for n in self.plan.nodes)
        return problem

    def _move(self, moved: Moved | str | None, closing: str) -> str | None:
        """Go on with a re-plan's plan and backend (the previous backend closed: ``closing``); a problem text, or
        None where nothing moved, is passed on."""
        if not isinstance(moved, Moved):
            return moved
        self._guarded(closing, self.backend.close)
        self.plan, self.backend, self.place = moved.plan, moved.backend, moved.place or self.place
        self.say(moved.kind, moved.text, moved.data)
        return None

    def _next_attempt(self, attempt: int) -> bool:
        """Record the new attempt (RUNNING -> LAUNCHING); False if the job was cancelled meanwhile."""
        job_id = self.plan.job_id
        self._quiet.clear()
        if self.store.state(job_id) == JobState.LAUNCHING:
            self.store.update_job(job_id, attempt=attempt)
            return True
        return self.store.transition(job_id, JobState.LAUNCHING, attempt=attempt)

    # one attempt

    def _run_attempt(self, attempt: int) -> Outcome:
        job_id = self.plan.job_id
        if self._resume_attempt == attempt:
            self._resume_attempt = None
            nodes = Nodes(self.store, self.plan, self.backend, self.generation, attempt, self._sequence, self.say)
            nodes.follow(self.run_dir, self._new_relay(attempt))
            self.live = Liveness(time.time())
        else:
            started = self._start_nodes(attempt)
            if isinstance(started, Failure) and self._cancel.is_set():
                return Outcome(JobState.CANCELLED, self._cancel_reason)
            if isinstance(started, Failure):
                return Outcome(JobState.FAILED, started.describe(), started)
            nodes = started
            if not self.store.transition(job_id, JobState.RUNNING):
                self._teardown(nodes)
                return Outcome(JobState.CANCELLED, "cancelled while launching")
            self.store.add_event(job_id, "running", "all nodes started")
            self.live = Liveness(time.time())
        state, fed = Attempt(len(self.plan.nodes)), set[int]()
        attention = Attention(self.hangs.stall_timeout if self.hangs else CATCH_UP_S)
        while True:
            self._heartbeat()
            self._take_in(attention, nodes)
            for event in self._events(nodes, fed, judging=not attention.waiting):
                state, do = step(state, event)
                if do is not Do.WATCH:
                    outcome = self._act(do, event, nodes)
                    self._say_away(attention.ended(all(w.done for w in nodes.watchers), time.time()), held=False)
                    return outcome
            time.sleep(POLL_S)

    def _take_in(self, attention: Attention, nodes: Nodes) -> None:
        """Take in what the nodes sent (``Attention``: a loop that was away, paused, asleep or held up, judges
        only once it has heard every node since it came back), and say so after an absence."""
        attention.round(time.time(), time.monotonic())
        stuck = nodes.stuck(time.time(), AWAY_S)
        if stuck is not None:
            attention.hold(stuck[1], time.time(), f"node {stuck[0]}'s lines could not be taken in (the foreground "
                                                  "output blocked) for")
        heard = nodes.heard()  # before the hand-overs are taken: what was heard by then is among them
        waited = self._intake.observe(self.live)
        attention.round(time.time(), time.monotonic())
        if waited is not None:
            self.say("store_locked", waited.describe(), {"seconds": round(waited.seconds, 1), "rows": waited.rows},
                     held=True)
        self._say_away(attention.settle(heard, time.time()))

    def _say_away(self, back: Away | None, held: bool = True) -> None:
        """The loop's absence, once it caught up with its nodes (or judged on what came, or the attempt ended: then
        filed at once, the rounds being over)."""
        if back is not None:
            self.say("supervisor_away", back.describe(),
                     {"seconds": round(back.seconds, 1), "caught_up": back.caught_up,
                      "caught_up_after_s": round(back.settled - back.back, 1)}, held=held)

    def _events(self, nodes: Nodes, fed: set[int], judging: bool = True) -> Iterator[Event]:
        """This round's events in the order ``step`` takes them; each is looked for only once the ones before
        decided nothing (a hang is judged only when no node ended and nobody cancelled). ``fed``: the nodes whose
        exit ``step`` has had (a job followed again by `launch attach` starts with the exits the store has).
        ``judging`` False (the loop has not caught up with its nodes): no node is called lost, no job hung."""
        yield from nodes.ended(self.live, fed, judging)
        if self._cancel.is_set():
            yield CancelAsked(self._cancel_reason)
        hung = self.hangs.check(self.live, time.time()) if self.hangs and judging else None
        if hung is not None:
            yield Stalled(hung)

    def _act(self, do: Do, event: Event, nodes: Nodes) -> Outcome:
        """Do what ``step`` decided on ``event``: the attempt's outcome."""
        job_id = self.plan.job_id
        if do is Do.STOP and isinstance(event, Fenced):
            self._guarded("filing what came before the fence", self._observe)  # the lines before the agent's word
            raise SupervisorFenced(job_id, dict(event.by))
        if do is Do.FAIL:
            failure = self._first_failure(nodes)
            self.say("node_failed", failure.describe(), failure.model_dump(mode="json"))
            self._teardown(nodes)
            nodes.record_exits()
            return Outcome(JobState.FAILED, failure.describe(), failure)
        if do is Do.SUCCEED:
            nodes.drain()
            self._observe()
            return Outcome(JobState.SUCCEEDED)
        in_charge(self.backend, self.plan, self.generation)
        if do is Do.HANG and isinstance(event, Stalled):
            hung = event.failure
            self._quiet.set()
            self.say("hung" if hung.kind == FailureKind.HANG else "stalled", hung.reason or "", hung.model_dump(mode="json"))
            taken = stacks.collect(self.backend, self.plan, self.store, nodes.attempt, self.live)
            for note in (taken.odd_one_out, taken.on_build_lock):
                if note:
                    hung = hung.model_copy(update={"reason": f"{hung.reason}; {note}"})
            self._teardown(nodes)
            nodes.record_exits()
            return Outcome(JobState.FAILED, hung.describe(), hung)
        self._teardown(nodes)
        nodes.record_exits()
        return Outcome(JobState.CANCELLED, self._cancel_reason)

    def _observe(self) -> None:
        self._intake.observe(self.live)

    def _start_nodes(self, attempt: int) -> Nodes | Failure:
        """Start every node through the backend; a Failure (nothing left running) if any cannot start."""
        scheduler = SchedulerEvents(self.store, self.plan.job_id, self._warn)
        context = StartContext(run_dir=self.run_dir, secrets=self.secrets, grace=self.grace, stage=self.stage,
                               submitted=scheduler.submitted, queued=scheduler.queued, allocated=scheduler.allocated,
                               cancelled=self._cancel, place=self.place, leased=scheduler.leased,
                               generation=self.generation,
                               record=kept_record(self.store, self.plan, attempt, self.internal_note))
        nodes = Nodes(self.store, self.plan, self.backend, self.generation, attempt, self._sequence, self.say)
        try:
            started = nodes.start(context)
        finally:
            self.plan = nodes.plan  # as run (placed inside a scheduler's allocation), whatever failed after its start
        if isinstance(started, Failure):
            return started
        nodes.watch(started, self.run_dir, self._new_relay(attempt))
        return nodes

    def _new_relay(self, attempt: int) -> Relay:
        return self._intake.new_attempt(attempt, self.plan.world_size, self.rejected_record, self.live)

    def _heartbeat(self) -> None:
        """Record that the supervisor is alive, every HEARTBEAT_S; a store locked by another process is not waited
        for (the next round tries again)."""
        now = time.time()
        if self._terminal_lost.is_set() and not self._terminal_lost_filed:
            self._terminal_lost_filed = True
            identity.record(self.run_dir, self.plan.job_id, self.generation, terminal_closed=now)
            job_id = self.plan.job_id
            self.store.add_event(job_id, "terminal_closed", f"the supervisor's terminal closed; it goes on in the "
                                 f"background (process {os.getpid()}): `launch attach {job_id}` follows the job")
        if now - self._heartbeat_at >= HEARTBEAT_S:
            try:
                with self.store.waiting_at_most(Filer.WAIT_S):
                    self.store.update_job(self.plan.job_id, supervisor_at=now)
            except StoreLocked:
                return
            self._heartbeat_at = now

    def _first_failure(self, nodes: Nodes) -> Failure:
        """The failure that came first: other nodes get a moment to report theirs, then
        ``failures.precedence`` picks the cause over its echoes, in the order this supervisor saw them."""
        failed = nodes.failed(self.live, SETTLE_S + self.backend.capabilities.verdict_delay_s, REPORT_WAIT_S, POLL_S)
        self._observe()
        return min((node_failure(self.plan, self.backend, self.live, w, nodes.exits[w.handle.index]) for w in failed),
                   key=failures.precedence)

    def _teardown(self, nodes: Nodes) -> None:
        """Stop every node; the lines relayed from now on stay in the logs."""
        self._quiet.set()
        nodes.stop(self.grace, self._heartbeat)
