"""The backend protocol: everything that differs between local, SSH, Ray (and Slurm) lives behind it.

A backend has three parts: what it can do (a frozen ``Capabilities`` value), what it decides before
anything runs (its ``Planning``: the nodes a job is planned on, with placeholders where a scheduler
places them later, its network defaults, the interpreter on its nodes; ``launcher.backends.planning``)
and its runtime, ``Backend`` below: how to check its nodes before launch (``preflight``), how to start a
plan's nodes (``start``: each node runs the node agent of ``launcher.node``) and how to run a short
command on a node (``run_on_node``). Finding and ending a job's processes, kernel logs and stack dumps
are built here on ``run_on_node`` and the node side, the same for every backend. The planner, the
supervisor and the reports never ask which backend they run on.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import ClassVar, Generic

from launcher.backends.facts import FactsError, NodeFacts
from launcher.backends.failures import LOST_NODE_EXIT, Failure
from launcher.backends.planning import C, Capabilities, Planning
from launcher.errors import LaunchError, SupervisorFenced
from launcher.node.protocol import CleanRequest, FactsRequest, FenceRequest, RecordRequest, Request, SignalRequest, StacksRequest, SweepRequest
from launcher.node.ship import node_argv
from launcher.plan.netenv import NodeNetwork
from launcher.plan.planner import Plan
from launcher.spec.cluster import NodeSpec

NODE_COMMAND_TIMEOUT_S = 60.0
COLLECT_TIMEOUT_S = 30.0  # a host asked to remove a filed job's run directory (it waits up to 10 s for its agents)


@dataclass
class Preflight:
    """What a backend learnt before launch.

    ``problems`` stop the launch (every host checked, all listed). ``nodes`` (concrete nodes:
    probed addresses, a Ray placement), ``probes`` (per-node network facts) and ``python`` (the
    interpreter the nodes run, when the backend found it) make the planner re-plan before launch.
    ``facts`` are what each node said about itself, parsed (``launcher.backends.facts``).
    """

    problems: list[str] = field(default_factory=list)
    nodes: list[NodeSpec] | None = None
    probes: dict[int, NodeNetwork] = field(default_factory=dict)
    python: str | None = None
    facts: dict[int, NodeFacts] = field(default_factory=dict)
    #: what to do about ``problems`` when they call for another hint than `launch check`'s (leases held)
    hint: str | None = None


@dataclass(frozen=True)
class CommandResult:
    """A short command run on a node. ``code`` is LOST_NODE_EXIT when the node could not be reached."""

    code: int
    out: str
    err: str


class Stage(StrEnum):
    PREFLIGHT = "preflight"
    QUEUED = "queued"
    SYNC = "sync"
    SETUP = "setup"
    START = "start"


class StageState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


StageSink = Callable[[Stage, int | None, str, StageState], None]  # node None: the whole job (queued)


def no_stage(stage: Stage, node: int | None, host: str, state: StageState) -> None:
    """A StageSink that shows nothing."""


@dataclass
class StartContext:
    """What ``Backend.start`` gets from the supervisor besides the plan."""

    run_dir: Path
    secrets: Mapping[str, str]
    grace: float
    stage: StageSink = no_stage
    #: the job was handed to a scheduler (its job id there)
    submitted: Callable[[str], None] = lambda scheduler_id: None
    queued: Callable[[str, str | None], None] = lambda reason, scheduler_id: None
    #: the scheduler allocated the job's nodes (its job id): the job is launching again after ``queued``
    allocated: Callable[[str], None] = lambda scheduler_id: None
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: re-plans with what a preflight inside the allocation found (backends whose scheduler places nodes at start)
    place: Callable[[Plan, Preflight], Plan] | None = None
    #: node N's agent on HOST holds these leases (``slots 0-1``): said once every node has started
    leased: Callable[[int, str, str], None] = lambda node, host, devices: None
    #: the supervisor's generation (``launch attach --takeover``: its agents refuse to start for an older one)
    generation: int = 0
    #: the job as recorded (plan, specs, attempt; no secret), kept in each node's run directory for `attach --cluster`
    record: dict | None = None


class NodeHandle(ABC):
    """One running node agent of a job, as its backend hands it to the supervisor. What the supervisor reads
    from a handle is declared here, with what it means where a backend does not set it."""

    index: int
    pid: int | None = None
    lost_reason: str | None = None  # set by the backend (trusted) when the node was lost
    #: why the handle's lines ended without the agent's exit (the watcher follows the journal again)
    error: str | None = None
    #: what the agent holds (``slots 0-1``, ``GPUs 0-3``), once it said so; None where the backend leases nothing
    leased: str | None = None

    @property
    def fenced(self) -> dict | None:
        """The newer supervisor generation's record when the node refused this one (a follow handle's)."""
        return None

    @property
    def scheduler_failure(self) -> Failure | None:
        """The ``Failure`` a scheduler decided for the node (Slurm: the time limit, the node declared failed),
        which the supervisor records as the node's failure; None where no scheduler decided one."""
        return None

    @abstractmethod
    def lines(self) -> Iterator[str]:
        """The agent's framed output lines (``launcher.node.protocol``) until it closes."""

    @abstractmethod
    def poll(self) -> int | None:
        """The agent's exit code (negative for a signal, LOST_NODE_EXIT when lost), None while it runs."""

    @abstractmethod
    def terminate(self, grace: float) -> None:
        """End the node's processes of this job: TERM, then KILL after ``grace``."""


class SweepOutcome(StrEnum):
    CLEAN = "clean"
    LEFTOVERS = "leftovers"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class NodeSweep:
    """What a sweep found on one node: clean, processes it could not end (named), or unreachable (why)."""

    index: int
    host: str
    outcome: SweepOutcome
    pids: tuple[int, ...] = ()
    detail: str | None = None


@dataclass(frozen=True)
class SweepReport:
    nodes: tuple[NodeSweep, ...]

    @property
    def clean(self) -> bool:
        return all(node.outcome == SweepOutcome.CLEAN for node in self.nodes)

    def problems(self) -> list[str]:
        """One line per node that is not known to be clean."""
        return [
            f"node {n.index} ({n.host}): left behind: "
            + "; ".join(filter(None, [f"processes {', '.join(map(str, n.pids))}" if n.pids else None, n.detail]))
            if n.outcome == SweepOutcome.LEFTOVERS else f"node {n.index} ({n.host}): unreachable, not checked: {n.detail}"
            for n in self.nodes if n.outcome != SweepOutcome.CLEAN
        ]


class Backend(ABC, Generic[C]):
    """Runs plans on one kind of cluster (``C``: its backend's cluster model). Registered in
    ``launcher.backends.BACKENDS``.

    Required: ``preflight``, ``start``, ``run_on_node`` and ``close``. Optional, each saying what it does
    where a backend does not: ``follow`` (with ``capabilities.follows``), ``fence`` and ``job_record`` (with
    ``capabilities.fences``), ``lease_devices`` (with ``capabilities.leases``), ``stream_command``, ``warm``,
    ``node_unreachable``, ``host``. Built on ``run_on_node`` and the node side, the same for every backend
    unless one knows better: ``node_command``, ``fenced_command``, ``sweep``, ``kernel_log``, ``stacks``.
    What a backend decides before anything runs is its ``planning_class`` (``launcher.backends.planning``).
    """

    name: ClassVar[str]
    planning_class: ClassVar[type[Planning]] = Planning
    #: its planning class's: what this backend can do
    capabilities: Capabilities = Planning.capabilities

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.capabilities = cls.planning_class.capabilities

    def __init__(self, cluster: C) -> None:
        self.cluster = cluster

    @property
    def planning(self) -> Planning[C]:
        """What this backend decides for its cluster before anything runs."""
        return self.planning_class(self.cluster)

    # required

    @abstractmethod
    def preflight(self, plan: Plan) -> Preflight:
        """Check every node in parallel and probe what the plan left to ``auto``; starts nothing."""

    @abstractmethod
    def start(self, plan: Plan, context: StartContext) -> tuple[Plan, Sequence[NodeHandle]]:
        """Start every node's agent; (the plan as run, the handles). On failure nothing is left running
        (NodeStartError names the node at fault)."""

    @abstractmethod
    def run_on_node(self, plan: Plan | None, index: int, argv: list[str], timeout: float) -> CommandResult:
        """Run a short command on node ``index`` (of ``plan``, or of the cluster when None)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the backend holds (connections, interpreters started ahead); nothing when it holds none."""

    # optional

    def follow(self, plan: Plan, index: int, after: int, agent: tuple[int, int | None] | None = None,
               generation: int = 0) -> NodeHandle:
        """A handle on node ``index`` of ``plan`` that reads its agent's journal from line ``after + 1`` on
        (docs/JOURNALS.md): its ``lines`` end after the agent's ``@exit`` (or ``@lost``), its ``poll`` answers
        from them. ``agent``: the agent's (pid, start ticks) as recorded, for ``terminate``. ``generation``: the
        reader's (a node that records a newer one ends the lines at once, the handle's ``fenced`` set). Raises
        LaunchError or OSError when the node cannot be reached now (the caller tries again later)."""
        raise LaunchError(f"the {self.name} backend cannot follow a node's journal again")

    def fence(self, plan: Plan | None, index: int, job_id: str, generation: int | None = None,
              who: Mapping[str, object] | None = None, timeout: float = 30) -> tuple[dict | None, str | None]:
        """Node ``index``'s supervisor generation record (``{"generation", "pid", "host", "contact_s", ...}``);
        with ``generation`` newer than it, that one is recorded first (``who``: pid, host, job store id). (answer, None) or
        (None, why not)."""
        pid, host, store = (who or {}).get("pid"), (who or {}).get("host"), (who or {}).get("store")
        request = FenceRequest(job_id, index, generation, pid if isinstance(pid, int) else None,
                               host if isinstance(host, str) else None, store if isinstance(store, str) else None)
        answer, error = self.node_command(plan, index, "fence", request, timeout=timeout)
        if answer is not None and "error" in answer:
            return None, str(answer["error"])[:300]
        return answer, error

    def collect(self, plan: Plan, index: int, request: CleanRequest) -> tuple[dict | None, str | None]:
        """Node ``index``'s answer to a ``clean`` that removes the job's run directory there once every job store that
        followed it has filed it (``request.filed_by``): (``{"removed": [...], "kept": {...}}``, None) or (None, why
        not)."""
        return self.node_command(plan, index, "clean", request, timeout=COLLECT_TIMEOUT_S)

    def clean(self, index: int, request: CleanRequest) -> tuple[dict | None, str | None]:
        """`launch clean` on node ``index`` of the cluster: (``{"removed": [...], "kept": {...}}``, None) or (None,
        why not)."""
        return self.node_command(None, index, "clean", request, timeout=120)

    def job_record(self, index: int, job_id: str) -> tuple[dict | None, str | None]:
        """The job as its supervisor recorded it in node ``index``'s run directory (of the cluster, plan or not):
        (record, None) or (None, why not)."""
        answer, error = self.node_command(None, index, "record", RecordRequest(job_id), timeout=60)
        if answer is None:
            return None, error
        if "error" in answer or not isinstance(answer.get("record"), dict):
            return None, str(answer.get("error") or "an unreadable answer")[:300]
        return answer["record"], None

    def node_unreachable(self, index: int) -> None:  # noqa: B027 (optional hook: backends with connections use it)
        """Node ``index`` was found lost: later commands to it should give up quickly."""

    def host(self, plan: Plan | None, index: int) -> str:
        return plan.nodes[index].host if plan is not None else self.cluster.nodes[index].host

    def lease_devices(self, plan: Plan | None, index: int) -> tuple[str, int] | None:
        """What node ``index`` (of ``plan``, or of the cluster) leases (docs/LEASES.md): ("gpu" or "slot", how many
        the host has); None where the cluster allocates (Ray, Slurm)."""
        return None

    def stream_command(self, plan: Plan, index: int, command: str, request: Request):
        """A long-running node-side command on node ``index`` (``launcher.backends.leasing.NodeStream``)."""
        raise LaunchError(f"the {self.name} backend runs no long node commands")

    def warm(self, plan: Plan) -> None:  # noqa: B027 (optional hook: most backends start nothing ahead)
        """Get ready to start ``plan`` while preflight runs (the local backend starts its agents' interpreters);
        what is not used is released by ``close``."""

    # built on run_on_node and the node side

    def node_command(self, plan: Plan | None, index: int, command: str, request: Request,
                     timeout: float = NODE_COMMAND_TIMEOUT_S) -> tuple[dict | None, str | None]:
        """Run a node-side command; (its JSON answer, None) or (None, why not)."""
        python = plan.python if plan is not None else self.planning.default_python()
        result = self.run_on_node(plan, index, node_argv(python, command, request), timeout)
        lines = [line for line in result.out.splitlines() if line.startswith("{")]
        if result.code != 0 or not lines:
            return None, (result.err or result.out).strip()[-300:] or f"exit {result.code}"
        try:
            return json.loads(lines[-1]), None
        except ValueError:
            return None, f"unreadable answer: {lines[-1][:200]}"

    def fenced_command(self, plan: Plan, index: int, command: str, request: SweepRequest | SignalRequest,
                       generation: int | None, timeout: float = NODE_COMMAND_TIMEOUT_S) -> tuple[dict | None, str | None]:
        """``node_command`` for what only the supervisor in charge may do (signal, end): with the asking
        supervisor's ``generation``, which the node checks (None: `launch cancel` of a job without a supervisor,
        never refused); SupervisorFenced when the node records a newer one."""
        if generation is not None:
            request = dataclasses.replace(request, job_id=plan.job_id, node=index, generation=generation)
        answer, error = self.node_command(plan, index, command, request, timeout)
        if answer is not None and isinstance(answer.get("fenced"), dict):
            raise SupervisorFenced(plan.job_id, answer["fenced"])
        return answer, error

    def untrusted(self, plan: Plan) -> list[str]:
        """Why each node whose identity is no longer the one recorded (SSH: a changed or unknown host key) cannot be
        used: `launch attach` refuses them as submit's preflight does; [] where nothing is checked or all is well."""
        return []

    def on_nodes(self, plan: Plan, step: Callable[[int], object]) -> list:
        """``step(index)`` for every node of the plan, in parallel, results in node order."""
        with ThreadPoolExecutor(max_workers=max(1, min(32, plan.nnodes))) as pool:
            return list(pool.map(step, range(plan.nnodes)))

    def sweep(self, plan: Plan, grace: float, end: bool = True, generation: int | None = None) -> SweepReport:
        """End (or with ``end=False`` only list) the job's processes on every node: all of the job's on its
        host, whichever node (or attempt) tagged them, as the safety net behind the agents. ``generation``: the
        sweeping supervisor's (the nodes refuse it once they record a newer one: SupervisorFenced); None for
        `launch cancel`."""

        def one(index: int) -> NodeSweep:
            host = self.host(plan, index)
            cleanup = [list(c) for c in plan.nodes[index].cleanup] if end else []
            answer, error = self.fenced_command(plan, index, "end" if end else "list",
                                                SweepRequest(plan.job_id, grace, tuple(map(tuple, cleanup))),
                                                generation, timeout=grace + 30 + 30 * len(cleanup))
            if answer is None:
                return NodeSweep(index, host, SweepOutcome.UNREACHABLE, detail=error)
            pids = tuple(answer["pids"])
            failed = answer.get("cleanup_failed") or []
            outcome = SweepOutcome.LEFTOVERS if pids or failed else SweepOutcome.CLEAN
            return NodeSweep(index, host, outcome, pids, "; ".join(failed) or None)

        return SweepReport(tuple(self.on_nodes(plan, one)))

    def kernel_log(self, plan: Plan, index: int) -> list[str]:
        """The node's recent kernel log (ISO times), for OOM-killer lines; [] if unreadable."""
        answer, _ = self.node_command(plan, index, "facts", FactsRequest(kernel_log=True))
        try:
            return list(NodeFacts.parse(answer).kernel_log) if answer else []
        except FactsError:
            return []

    def stacks(self, plan: Plan) -> list[tuple[int, dict | None, str | None]]:
        """Per node: (index, the node's stack report, or None and why not)."""
        return self.on_nodes(plan, lambda index: (index, *self.node_command(
            plan, index, "stacks", StacksRequest(plan.job_id, index), timeout=60)))


def unreachable(error: str) -> CommandResult:
    """The result of a command on a node that could not be reached."""
    return CommandResult(LOST_NODE_EXIT, "", error)
