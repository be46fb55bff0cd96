"""An attempt's nodes as the supervisor's loop holds them: a watcher each (started, or followed again by `launch
attach`), who is out of contact or lost, the exits in the order observed, the teardown. Only the loop calls
these, so it stays the one writer of the job's rows."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from launcher.backends.base import Backend, NodeHandle, StartContext
from launcher.backends.failures import LOST_NODE_EXIT, Failure, FailureKind
from launcher.backends.leasing import LeasesBusy
from launcher.errors import LaunchError, NodeStartError, PreflightError, SupervisorFenced
from launcher.plan.planner import Plan
from launcher.run import contact
from launcher.run.attribution import NodeExit
from launcher.run.liveness import Liveness
from launcher.run.step import Exited, Fenced
from launcher.run.watcher import Follow, NodeWatcher, Relay, Resume
from launcher.store.db import Store
from launcher.store.rows import NodeRow
from launcher.store.states import NodeState

DRAIN_S = 5.0  # how long the node watchers may go without a line while they read their nodes' last lines
DRAIN_MAX_S = 120.0  # and the most they may take, all together


class _Unreached(NodeHandle):
    """A node `launch attach` could not reach at first: no lines, no exit yet; its watcher tries again."""

    def __init__(self, index: int, agent: tuple[int, int | None] | None, error: str) -> None:
        self.index = index
        self.pid = agent[0] if agent else None
        self.error = error

    def lines(self):
        return iter(())

    def poll(self) -> int | None:
        return LOST_NODE_EXIT if self.lost_reason is not None else None

    def terminate(self, grace: float) -> None:
        """Nothing to signal through: the sweep reaches the node if it can."""


def follower(backend: Backend, plan: Plan, generation: int) -> Follow | None:
    """How a watcher follows its node again (None where the backend cannot)."""
    if not backend.capabilities.follows:
        return None
    return lambda index, after, agent: backend.follow(plan, index, after, agent, generation)


def in_charge(backend: Backend, plan: Plan, generation: int) -> None:
    """Before a cancel or hang teardown, a restart, or the sweep after a failed start: SupervisorFenced if any
    node records a newer supervisor generation (a Ctrl-C of a supervisor that was just taken over ends nothing;
    its streams tell it within a second or two anyway). A node that cannot be asked does not stop the teardown."""
    if not backend.capabilities.fences:
        return
    job_id = plan.job_id
    answers = backend.on_nodes(plan, lambda index: backend.fence(plan, index, job_id)[0])
    for answer in answers:
        if answer is not None and isinstance(answer.get("generation"), int) and answer["generation"] > generation:
            raise SupervisorFenced(job_id, answer)


def kept_record(store: Store, plan: Plan, attempt: int, note: Callable[[str], None]) -> dict | None:
    """The job as the nodes keep it (``job.json``: what `launch attach --cluster` reads back); None if unreadable."""
    from launcher.run.identity import store_id
    from launcher.run.takeover import node_record

    try:
        return node_record(store.job(plan.job_id), plan, attempt, store_id(store.home))
    except Exception as exc:  # noqa: BLE001 - a record the nodes cannot keep must not stop the job
        note(f"the job's record for its nodes could not be made: {exc!r}")
        return None


class Nodes:
    """One attempt's nodes: a watcher each, their exits in the order this supervisor observed them
    (``sequence``), and the ones out of contact now."""

    def __init__(self, store: Store, plan: Plan, backend: Backend, generation: int, attempt: int,
                 sequence: Callable[[], int], say: Callable[[str, str], None] | None = None) -> None:
        """``say(kind, text)``: how a finding is told (an event, and a line in the foreground)."""
        self.store = store
        self._say = say or (lambda kind, text: store.add_event(plan.job_id, kind, text))
        self.plan = plan
        self.backend = backend
        self.generation = generation
        self.attempt = attempt
        self.watchers: list[NodeWatcher] = []
        self.exits: dict[int, NodeExit] = {}
        self._sequence = sequence
        self._out_of_contact: dict[int, contact.OutOfContact] = {}

    def start(self, context: StartContext) -> Sequence[NodeHandle] | Failure:
        """Start every node through the backend (``plan`` is then the plan as run): their handles, or a Failure
        (nothing left running) if any cannot start."""
        job_id, attempt = self.plan.job_id, self.attempt
        for node in self.plan.nodes:
            self.store.set_node(job_id, attempt, node.index, host=node.host, address=node.address,
                                state=NodeState.STARTING, started_at=time.time())
        try:
            planned = self.plan
            self.plan, handles = self.backend.start(self.plan, context)
            if self.plan != planned:  # placed inside the allocation: status and cancel follow the nodes it got
                self.store.update_job(job_id, plan=self.plan.model_dump(mode="json"))
        except NodeStartError as exc:
            node = self.plan.nodes[exc.node]
            kind = FailureKind.LEASES if isinstance(exc, LeasesBusy) else FailureKind.START
            return Failure(kind=kind, node=node.index, host=node.host, reason=f"could not start: {exc}")
        except PreflightError as exc:
            return Failure(kind=FailureKind.PREFLIGHT, reason=str(exc))
        except LaunchError as exc:
            return Failure(kind=FailureKind.START, reason=f"could not start: {exc}")
        return handles

    def watch(self, handles: Sequence[NodeHandle], run_dir: Path, relay: Relay) -> None:
        """A watcher on every node started, each recorded RUNNING with its log file."""
        job_id, attempt = self.plan.job_id, self.attempt
        for handle in handles:
            node = self.plan.nodes[handle.index]
            log_path = run_dir / f"attempt{attempt}-node{node.index}.log"
            self.store.set_node(job_id, attempt, node.index, host=node.host, address=node.address,
                                state=NodeState.RUNNING, pid=handle.pid, log_path=str(log_path))
            self.watchers.append(NodeWatcher(handle, node.host, log_path, relay,
                                             follow=follower(self.backend, self.plan, self.generation)))

    def follow(self, run_dir: Path, relay: Relay) -> None:
        """`launch attach`: a watcher on every node still running, each from the lines the store has
        (``nodes.seen``); a node that cannot be reached now starts out of contact. Exits already recorded stand."""
        job_id, attempt = self.plan.job_id, self.attempt
        rows = {row.node: row for row in self.store.nodes(job_id, attempt)}
        follow = follower(self.backend, self.plan, self.generation)
        for node in self.plan.nodes:
            row = rows.get(node.index) or NodeRow(job_id, attempt, node.index)
            if row.state in (NodeState.EXITED, NodeState.STOPPED) and row.exit_code is not None:
                self.exits[node.index] = NodeExit(row.exit_code, self._sequence())
                continue
            agent = (row.pid, row.start_ticks) if row.pid is not None else None
            seen = row.seen or 0
            resume = Resume(seen, row.log_bytes, agent)
            handle: NodeHandle
            try:
                handle = self.backend.follow(self.plan, node.index, seen, agent, self.generation)
            except Exception as exc:  # noqa: BLE001 - unreachable now: its watcher tries again, the loop decides
                handle = _Unreached(node.index, agent, f"{exc}"[:300])
            log_path = Path(row.log_path or run_dir / f"attempt{attempt}-node{node.index}.log")
            self.watchers.append(NodeWatcher(handle, node.host, log_path, relay, follow=follow, resume=resume))
        self.store.add_event(job_id, "attached", f"supervisor attached (pid {os.getpid()}): following "
                             f"{len(self.watchers)} node(s) from the lines the store has",
                             {"pid": os.getpid(), "seen": {w.handle.index: w.count for w in self.watchers}})

    def stuck(self, now: float, after: float) -> tuple[int, float] | None:
        """A node whose watcher has been stuck on one line for ``after`` seconds (its echo blocked), and since when."""
        for watcher in self.watchers:
            since = watcher.stuck_since(now, after)
            if since is not None:
                return watcher.handle.index, since
        return None

    def heard(self) -> list[float | None]:
        """When each node still running last wrote a line that was read (its time, on the supervisor's clock)."""
        return [watcher.heard() for watcher in self.watchers if watcher.handle.index not in self.exits]

    def contact(self, live: Liveness, judging: bool = True) -> None:
        """Out-of-contact nodes: file when contact is lost and back; declare a node lost on evidence only (and only
        while ``judging``: not before the supervisor has caught up with every node after an absence)."""
        job_id, now = self.plan.job_id, time.time()
        failed = any(ended.code != 0 for ended in self.exits.values())
        for watcher in self.watchers:
            index = watcher.handle.index
            if index in self.exits:
                continue
            out = watcher.contact()
            before = self._out_of_contact.get(index)
            if out is None:
                if before is not None:
                    del self._out_of_contact[index]
                    self._say("contact_back", f"node {index} ({watcher.host}): back in contact after "
                              f"{now - before.since:.1f} s, followed from line {watcher.count}")
                continue
            if before is None or before.since != out.since:
                self._out_of_contact[index] = out
                self._say("contact_lost", f"node {index} ({watcher.host}): out of contact ({out.error}); "
                          "following it again")
            why = contact.verdict(out, contact.pulse(live, index, failed), now, self.plan.unattended_s) if judging else None
            if why is not None:
                watcher.give_up(why)
                self.backend.node_unreachable(index)
                self.exits[index] = NodeExit(LOST_NODE_EXIT, self._sequence())
                self.store.set_node(job_id, self.attempt, index, state=NodeState.EXITED, exit_code=LOST_NODE_EXIT,
                                    ended_at=now)

    def collect_exits(self, live: Liveness, judging: bool = True) -> None:
        self.contact(live, judging)
        for watcher in self.watchers:
            index = watcher.handle.index
            if index in self.exits:
                continue
            code = watcher.handle.poll()
            if code is not None:
                self.exits[index] = NodeExit(code, self._sequence())
                self.store.set_node(self.plan.job_id, self.attempt, index, state=NodeState.EXITED, exit_code=code,
                                    ended_at=time.time())

    def ended(self, live: Liveness, fed: set[int], judging: bool = True) -> Iterator[Fenced | Exited]:
        """The nodes' events of this round: a node's word that a newer supervisor took the job, then the exits
        ``step`` has not had (``fed``), in the order this supervisor observed them."""
        fenced = next((watcher.fenced for watcher in self.watchers if watcher.fenced is not None), None)
        if fenced is not None:
            yield Fenced(fenced)
        self.collect_exits(live, judging)
        for index in sorted(self.exits.keys() - fed, key=lambda node: self.exits[node].observed):
            fed.add(index)
            yield Exited(index, self.exits[index].code)

    def failed(self, live: Liveness, settle_s: float, reports_s: float, poll_s: float) -> list[NodeWatcher]:
        """The nodes that failed, once the others had ``settle_s`` to report theirs and each failed one's output
        ``reports_s`` (all together) to come in."""
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and len(self.exits) < len(self.watchers):
            time.sleep(poll_s)
            self.collect_exits(live)
        failed = [w for w in self.watchers if w.handle.index in self.exits and self.exits[w.handle.index].code != 0]
        reports_by = time.monotonic() + reports_s
        for watcher in failed:
            watcher.join(max(0.0, reports_by - time.monotonic()))
        return failed

    def stop(self, grace: float, heartbeat: Callable[[], None]) -> None:
        """Stop every node (at most 32 at once), ``heartbeat`` as they stop, so `launch cancel` sees progress."""
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(self.watchers)))) as pool:
            for stopped in as_completed([pool.submit(w.handle.terminate, grace) for w in self.watchers]):
                stopped.result()
                heartbeat()
        self.drain()

    def drain(self) -> None:
        """Let the watchers read their nodes' last lines (an agent's journal read to its end when its stream stopped
        short): while they bring lines, until none came for ``DRAIN_S`` or ``DRAIN_MAX_S`` in all."""
        started = time.monotonic()
        received, came_at = -1, started
        while (reading := [watcher for watcher in self.watchers if not watcher.done]):
            now, count = time.monotonic(), sum(watcher.count for watcher in self.watchers)
            if count != received:
                received, came_at = count, now
            if now - came_at >= DRAIN_S or now - started >= DRAIN_MAX_S:
                return
            reading[0].join(0.1)

    def record_exits(self) -> None:
        for watcher in self.watchers:
            index = watcher.handle.index
            if index not in self.exits:
                self.store.set_node(self.plan.job_id, self.attempt, index, state=NodeState.STOPPED,
                                    exit_code=watcher.handle.poll(), ended_at=time.time())
