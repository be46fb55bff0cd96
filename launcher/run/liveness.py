"""Is a job alive, progressing, or hung? Verdicts from what launch observes from outside the ranks.

Liveness is not progress. A rank that never reports steps (a user's program without the
Reporter) is alive while it prints, gains CPU time (the node agent reads /proc) or keeps its GPU
busy; the job is called hung only when every rank has been silent and idle for
``watch.stall_timeout``. Once ranks report steps, the job is also called stalled when no step
has been reported for ``stall_timeout``, and hung sooner when, besides, every rank has gone silent
and idle: the limit then adapts to the job (five times the longest gap seen between two
reports, at least FLOOR_S, never more than ``stall_timeout``), so a job reporting every second is
called hung in seconds, not after NCCL's timeout. Pure logic: times are passed in.

A rank whose program has returned says so (the step hooks' last record is marked ``ended``, written when its Python
begins to shut down); a rank the node agent no longer finds has exited. A job whose training ended and whose
remaining ranks are silent and idle after their program returned is called hung in exit (a thread the program left
running, an atexit handler or a destructor such as a process group's blocks the interpreter's end), naming the step
at which training ended, the ranks stuck and those gone; never "hung before the first step" or "every rank alive".

Where the job is matters as much as whether it moves: a job in which some node has no rank process
yet (its torchrun agent is still in the rendezvous, waiting for the others) is reported as stuck in
rendezvous, naming the nodes without ranks and, when node 0's agent could count them, how many
agents had joined the rendezvous store; never as ranks that hang, since those ranks do not exist.

One writer: the node watchers' threads only describe what they saw (``Output``, ``Sample``,
``Progress``); the supervisor's loop applies those to its ``Liveness`` (``apply``) and reads it. Each carries
``t``, when the node wrote the line, on the supervisor's clock (``launcher.run.nodetime``: placed by the node's
own monotonic time, whenever the supervisor read it), which the verdicts use, and the node's own time of the
line (``node_time``: its monotonic and wall clocks, ``launcher.node.protocol``). A supervisor that was away judges
only once it has caught up with every node (``nodetime.Attention``): never a job hung because it did not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.backends.failures import Failure, FailureKind
from launcher.node.protocol import NodeTime
from launcher.views.stackclasses import ranges

CPU_BUSY = 0.02  # a rank gaining more than 2% of a core between two samples is working
GPU_BUSY = 0.05  # GPU utilisation above 5% is working
AGENT_SILENT_S = 30.0  # a node agent samples its ranks every few seconds, idle or not: this long without one, it is stopped


@dataclass(frozen=True)
class Output:
    """A line of output from any rank or node agent, at ``t`` (``node_time``: the node's, when it said)."""

    t: float
    node_time: NodeTime | None = None


@dataclass(frozen=True)
class Sample:
    """A node agent's measurement of one rank's process tree."""

    node: int
    rank: int
    cpu_s: float
    gpu_util: float | None
    t: float
    node_time: NodeTime | None = None


@dataclass(frozen=True)
class Progress:
    """A metric record: ``rank`` reported ``step`` (``ended``: its program's last: it returned)."""

    node: int
    rank: int
    step: int
    t: float
    node_time: NodeTime | None = None
    ended: bool = False


@dataclass(frozen=True)
class Sampled:
    """A node agent's look at its node: the ranks it found alive there at ``t`` (a rank no longer among them has
    exited)."""

    node: int
    ranks: frozenset[int]
    t: float
    node_time: NodeTime | None = None


@dataclass(frozen=True)
class Joined:
    """How many nodes' launcher agents are connected to the rendezvous store on node 0 (its agent counts
    them), at ``t``."""

    agents: int
    t: float
    node_time: NodeTime | None = None


Observation = Output | Sample | Sampled | Progress | Joined


@dataclass
class RankSeen:
    """What launch last saw of one rank."""

    node: int
    cpu_s: float | None = None
    cpu_at: float | None = None
    active_at: float | None = None
    step: int | None = None
    step_at: float | None = None
    ended_at: float | None = None  # when its program said it returned
    gone: bool = False  # its node's agent no longer finds it: it exited


@dataclass
class Liveness:
    """Activity and progress of one attempt's ranks, fed by the supervisor's node watchers."""

    started: float
    output_at: float | None = None
    ranks: dict[int, RankSeen] = field(default_factory=dict)
    longest_gap: float = 0.0
    newest_report: float | None = None
    joined: int | None = None  # agents connected to the rendezvous store, when node 0's agent counted them

    def apply(self, seen: Observation) -> None:
        """Take in one observation a node watcher made."""
        if isinstance(seen, Output):
            self.output(seen.t)
        elif isinstance(seen, Sample):
            self.sample(seen.node, seen.rank, seen.cpu_s, seen.gpu_util, seen.t)
        elif isinstance(seen, Sampled):
            self.sampled(seen.node, seen.ranks)
        elif isinstance(seen, Joined):
            self.joined = seen.agents
        else:
            self.progress(seen.node, seen.rank, seen.step, seen.t, seen.ended)

    def output(self, t: float) -> None:
        """A line of output from any rank or node agent."""
        self.output_at = max(self.output_at or t, t)

    def sample(self, node: int, rank: int, cpu_s: float, gpu_util: float | None, t: float) -> None:
        """A node agent's measurement of one rank's process tree."""
        seen = self.ranks.setdefault(rank, RankSeen(node))
        if seen.cpu_s is not None and seen.cpu_at is not None and t > seen.cpu_at:
            if (cpu_s - seen.cpu_s) / (t - seen.cpu_at) >= CPU_BUSY:
                seen.active_at = t
        elif seen.cpu_s is None:
            seen.active_at = t  # a new rank: alive from its first sample
        if gpu_util is not None and gpu_util >= GPU_BUSY:
            seen.active_at = t
        seen.cpu_s, seen.cpu_at = cpu_s, t

    def sampled(self, node: int, ranks: frozenset[int]) -> None:
        """A node agent found ``ranks`` alive on ``node``: the others seen there before have exited."""
        for rank, seen in self.ranks.items():
            if seen.node == node:
                seen.gone = rank not in ranks

    def progress(self, node: int, rank: int, step: int, t: float, ended: bool = False) -> None:
        """A metric record: ``rank`` reported ``step`` (``ended``: its program returned)."""
        seen = self.ranks.setdefault(rank, RankSeen(node))
        seen.step, seen.step_at = step, t
        if ended:
            seen.ended_at = t
        if self.newest_report is not None and t > self.newest_report:
            self.longest_gap = max(self.longest_gap, t - self.newest_report)
        self.newest_report = max(self.newest_report or t, t)

    def unsampled_nodes(self, now: float, silent_s: float = AGENT_SILENT_S) -> dict[int, float]:
        """The nodes whose agent sent no sample of a live rank for ``silent_s`` (a SIGSTOPped agent, a stalled
        host): node -> seconds since its last sample. Idle ranks are still sampled; these are not measured."""
        last: dict[int, float] = {}
        for seen in self.ranks.values():
            if not seen.gone and seen.cpu_at is not None:
                last[seen.node] = max(last.get(seen.node, seen.cpu_at), seen.cpu_at)
        return {node: now - at for node, at in sorted(last.items()) if now - at >= silent_s}

    def nodes_with_ranks(self) -> set[int]:
        """The nodes on which a rank process has been seen (sampled or reporting) in this attempt."""
        return {seen.node for seen in self.ranks.values()}

    def last_activity(self) -> float:
        times = [self.started, self.output_at or 0.0, *(r.active_at or 0.0 for r in self.ranks.values())]
        return max(times)

    @property
    def reporting(self) -> bool:
        return self.newest_report is not None

    @property
    def last_step(self) -> int | None:
        """The furthest step any rank reported (None before the first record)."""
        steps = [seen.step for seen in self.ranks.values() if seen.step is not None]
        return max(steps) if steps else None

    def laggard(self) -> tuple[int, RankSeen] | None:
        """The reporting rank heard from least recently (by its last step)."""
        reported = [(rank, seen) for rank, seen in self.ranks.items() if seen.step_at is not None]
        return min(reported, key=lambda item: (item[1].step_at, item[0])) if reported else None

    def alive(self) -> list[int]:
        """The ranks seen and not gone."""
        return sorted(rank for rank, seen in self.ranks.items() if not seen.gone)

    def gone(self) -> list[int]:
        """The ranks that have exited (their node's agent no longer finds them)."""
        return sorted(rank for rank, seen in self.ranks.items() if seen.gone)

    def in_exit(self) -> list[int]:
        """The ranks alive whose program returned, when every rank alive has (else none): stuck in exit."""
        alive = self.alive()
        return alive if alive and all(self.ranks[rank].ended_at is not None for rank in alive) else []

    def finished_steps(self, max_steps: int | None) -> bool:
        return max_steps is not None and any(seen.step is not None and seen.step >= max_steps for seen in self.ranks.values())


class HangDetector:
    """Verdicts on a Liveness: None while the job lives, else a STALL or HANG failure."""

    FLOOR_S = 30.0
    FACTOR = 5.0

    def __init__(self, stall_timeout: float, max_steps: int | None, hosts: Sequence[str] = ()) -> None:
        """``hosts``: the job's nodes in node order (the plan's host names), so that a job in which some node
        has no rank process yet is called stuck in rendezvous, naming those nodes; without them the detector
        makes no claim about where the job is (every verdict before the first step is "hung")."""
        self.stall_timeout = stall_timeout
        self.max_steps = max_steps
        self.hosts = tuple(hosts)

    def limit(self, live: Liveness) -> float:
        """Seconds of silence and idleness allowed now for a reporting job."""
        if live.longest_gap <= 0 or live.finished_steps(self.max_steps):
            return self.stall_timeout
        return min(self.stall_timeout, max(self.FLOOR_S, self.FACTOR * live.longest_gap))

    def check(self, live: Liveness, now: float) -> Failure | None:
        idle = now - live.last_activity()
        gone = live.gone()
        what = ("every rank alive but silent and idle" if not gone else
                f"rank(s) {ranges(live.alive())} alive but silent and idle, rank(s) {ranges(gone)} exited")
        what += " (no output, no CPU time gained, no GPU activity)"
        if silent := live.unsampled_nodes(now):  # the agent itself is stopped: its ranks are not known to be idle
            what = (f"no output, and no sample from the agent of node(s) {ranges(silent)} for "
                    f"{max(silent.values()):.0f} s (stopped, e.g. by SIGSTOP, or its host stalled): its ranks cannot be "
                    "measured")
        if exiting := live.in_exit():
            return self._in_exit(live, exiting, idle)
        laggard = live.laggard()  # None until a rank reports a step
        if laggard is None:
            if idle < self.stall_timeout:
                return None
            if (stuck := self._in_rendezvous(live, idle)) is not None:
                return stuck
            return Failure(
                kind=FailureKind.HANG, stalled_s=idle, transient=False,
                reason=f"hung before the first step: {what} for {idle:.0f} s (watch.stall_timeout {self.stall_timeout:g} s)",
            )
        rank, seen = laggard
        since = now - (live.newest_report or now)
        place = f"step {seen.step} on node {seen.node}/rank {rank}"
        limit = self.limit(live)
        if since >= limit and idle >= limit:
            return Failure(
                kind=FailureKind.HANG, node=seen.node, rank=rank, step=seen.step, stalled_s=idle, transient=True,
                reason=f"hung at {place}: {what} for {idle:.0f} s (limit {limit:.0f} s; "
                       f"node {seen.node}/rank {rank} reported least recently)",
            )
        if since >= self.stall_timeout:
            return Failure(
                kind=FailureKind.STALL, node=seen.node, rank=rank, step=seen.step, stalled_s=since, transient=True,
                reason=f"stalled at {place}: no rank reported progress for {since:.0f} s although the ranks are "
                       f"alive (watch.stall_timeout {self.stall_timeout:g} s)",
            )
        return None

    def _in_exit(self, live: Liveness, stuck: list[int], idle: float) -> Failure | None:
        """The verdict on a job whose ranks alive all returned from their program, silent and idle for the whole
        ``stall_timeout`` (an end that waits on a slow upload is idle too), else None."""
        if idle < self.stall_timeout:
            return None
        step = live.last_step or 0
        ended = f"training ended at step {step}" if step else "no training step was observed"
        first = live.ranks[stuck[0]]
        nodes = sorted({live.ranks[rank].node for rank in stuck})
        where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {ranges(nodes)}"
        gone = live.gone()
        exited = f"; rank(s) {ranges(gone)} exited" if gone else ""
        return Failure(
            kind=FailureKind.HANG, node=first.node, rank=stuck[0], step=step or None, stalled_s=idle, transient=False,
            reason=f"hung in exit: {ended}; rank(s) {ranges(stuck)} on {where} stuck in exit for {idle:.0f} s after "
                   f"their program returned (silent and idle: a thread the program left running, an atexit handler or "
                   f"a destructor blocks the interpreter's end){exited}",
        )

    def _in_rendezvous(self, live: Liveness, idle: float) -> Failure | None:
        """The verdict on a job in which some node has no rank process yet, else None."""
        nnodes = len(self.hosts)
        with_ranks = live.nodes_with_ranks()
        without = [node for node in range(nnodes) if node not in with_ranks]
        if not without:
            return None  # every node has ranks (or the nodes are unknown: no claim about where the job is)
        joined = (f"{live.joined} of {nnodes} nodes' agents joined the rendezvous store on node 0"
                  if live.joined is not None else "how many agents joined is unknown")
        where = (f"no rank process on {len(without)} of {nnodes} nodes: {self._names(without)}"
                 if with_ranks else f"no rank process on any of the {nnodes} nodes")
        waiting = ("torchrun's agents there are still waiting for each other: ranks started elsewhere wait for them"
                   if with_ranks else "every torchrun agent is still waiting for the others: no rank has started")
        return Failure(
            kind=FailureKind.HANG, node=without[0], host=self.hosts[without[0]],
            stalled_s=idle, transient=False,
            reason=f"stuck in rendezvous for {idle:.0f} s (watch.stall_timeout {self.stall_timeout:g} s): {where}; "
                   f"{joined}; {waiting}",
        )

    def _names(self, nodes: list[int], shown: int = 8) -> str:
        """``nodes 3-5,9 (h4, h5, h6, h10)``, with at most ``shown`` host names."""
        names = [self.hosts[node] for node in nodes[:shown]]
        more = f", ... {len(nodes) - shown} more" if len(nodes) > shown else ""
        label = "node" if len(nodes) == 1 else "nodes"
        return f"{label} {ranges(nodes)} ({', '.join(names)}{more})"

