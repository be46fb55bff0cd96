"""The backend protocol: everything that differs between local, SSH, Ray (and Slurm) lives behind it.

A backend knows how its nodes are chosen or placed (``plan_nodes``, with placeholders where a
scheduler places them later), its network defaults, which interpreter runs on its nodes, how to
check its nodes before launch (``preflight``), how to start a plan's nodes (``start``: each
node runs the node agent of ``launcher.node``) and how to run a short command on a node
(``run_on_node``). Finding and ending a job's processes, kernel logs and stack dumps are built
here on ``run_on_node`` and the node side, the same for every backend. The planner, the
supervisor and the reports never ask which backend they run on.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Protocol

from launcher.backends.facts import FactsError, NodeFacts
from launcher.backends.failures import LOST_NODE_EXIT
from launcher.backends.stopping import term_then_kill
from launcher.catalog.strategies import get_strategy
from launcher.errors import LaunchError, SupervisorFenced
from launcher.node.ship import node_argv, stdin_argv, stdin_request
from launcher.plan import containers
from launcher.plan.commands import RECIPE_MODULE
from launcher.plan.netenv import NodeNetwork
from launcher.plan.planner import NodePlan, Plan
from launcher.plan.policy import PlanPolicy
from launcher.spec.cluster import ClusterSpec, NodeSpec
from launcher.spec.container import ContainerSpec
from launcher.spec.job import JobSpec

NODE_COMMAND_TIMEOUT_S = 60.0
FACTS_TIMEOUT_S = 1800.0 + 360.0  # a preflight may pull a container image (launch.node.facts.PULL_TIMEOUT_S)
HOST_MEMORY_SHARE = 0.85  # of a node's memory a job may plan to use (the rest: the OS, page cache, other work)


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


class NodeHandle(Protocol):
    """One running node agent of a job. A scheduler's handle may also carry ``scheduler_failure``: the
    ``Failure`` the scheduler decided for its node (the time limit, the node declared failed), which the
    supervisor records as the node's failure."""

    index: int
    pid: int | None
    lost_reason: str | None  # set by the backend (trusted) when the node was lost

    def lines(self) -> Iterator[str]:
        """The agent's framed output lines (see ``launcher.node.agent``) until it closes."""

    def poll(self) -> int | None:
        """The agent's exit code (negative for a signal, LOST_NODE_EXIT when lost), None while it runs."""

    def terminate(self, grace: float) -> None:
        """End the node's processes of this job: TERM, then KILL after ``grace``."""


class Followed:
    """What a reader of a node's journal (``launch_node follow``) learns from the lines it passes on: the agent's
    ``@exit`` code, or its ``@lost`` reason (the agent died without one). A backend's follow handle wraps its line
    stream with ``through`` and answers ``poll`` from ``code``."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.exit: int | None = None
        self.lost: str | None = None
        self.fenced: dict | None = None  # the newer generation's record, when the node refused this reader

    def through(self, lines: Iterator[str]) -> Iterator[str]:
        for line in lines:
            if line.startswith("@fenced"):  # not a journal line: the node's answer to this reader
                self.fenced = fenced_record(line)
                return
            if line.startswith("@exit "):
                self.exit = _json_field(line, "code", int)
            elif line.startswith("@lost"):
                why = _json_field(line, "reason", str)
                self.lost = f"{self.host}: its node agent is gone without an exit ({why or 'no reason given'})"
            yield line

    def code(self) -> int | None:
        """The agent's exit code, LOST_NODE_EXIT once it is known lost, None while neither is known."""
        if self.exit is not None:
            return self.exit
        return LOST_NODE_EXIT if self.lost is not None else None


class FollowHandle:
    """A node followed through its journal (``Backend.follow``): ``lines`` the journal's lines after those the
    reader had, until its agent's ``@exit`` (or ``@lost``); ``poll`` answers from them; ``terminate`` signals
    the agent by PID and start time (when recorded) through the backend's ``signal`` node command.
    ``error``: why the stream ended when it ended without an answer (the reader then tries again)."""

    def __init__(self, backend: Backend, plan: Plan, index: int, lines: Iterator[str], close: Callable[[], None],
                 agent: tuple[int, int | None] | None) -> None:
        self.index = index
        self.pid: int | None = agent[0] if agent else None
        self.start_ticks: int | None = agent[1] if agent else None
        self.lost_reason: str | None = None
        self.error: str | None = None
        self._backend, self._plan = backend, plan
        self._followed = Followed(backend.host(plan, index))
        self._source, self._close = lines, close
        self._ended = threading.Event()

    def lines(self) -> Iterator[str]:
        try:
            yield from self._followed.through(self._source)
        finally:
            self._close()
            self.lost_reason = self.lost_reason or self._followed.lost
            self._ended.set()

    def poll(self) -> int | None:
        return LOST_NODE_EXIT if self.lost_reason is not None else self._followed.code()

    @property
    def fenced(self) -> dict | None:
        """The newer supervisor generation's record when the node refused to be followed by this one."""
        return self._followed.fenced

    def terminate(self, grace: float) -> None:
        """TERM the agent (it ends its node's processes and journals @exit), then KILL it; the sweep does the rest."""
        if self.poll() is not None or self.pid is None:
            return
        term_then_kill(self._signal, lambda wait: self._ended.wait(wait) or self.poll() is not None, grace, kill_wait=5.0)

    def _signal(self, sig: int) -> None:
        self._backend.fenced_command(self._plan, self.index, "signal",
                                     {"pid": self.pid, "start_ticks": self.start_ticks, "signal": int(sig)}, timeout=30)


def whole_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """The whole (newline-ended) lines of a byte stream, decoded; a last line without its newline is not one
    (a reader that resumes gets it again, whole)."""
    pending = bytearray()
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            yield pending.decode("utf-8", "replace")
            pending.clear()
            start = end + 1
        pending += chunk[start:]


def _json_field(line: str, key: str, kind: type) -> Any:
    try:
        value = json.loads(line.partition(" ")[2] or "{}").get(key)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def follow_request(plan: Plan, index: int, after: int, generation: int = 0) -> dict:
    """The ``follow`` node command's request: node ``index``'s journal after line ``after``, for a supervisor of
    ``generation`` (refused with ``@fenced`` once the node records a newer one)."""
    return {"job_id": plan.job_id, "node": index, "after": after, "generation": generation}


def fenced_record(line: str) -> dict:
    """The generation record of an ``@fenced`` line (``{"generation": N, "pid", "host"}``), as far as it reads."""
    try:
        data = json.loads(line.partition(" ")[2] or "{}")
    except ValueError:
        data = None
    data = data if isinstance(data, dict) else {}
    generation = data.get("generation")
    return {"generation": generation if isinstance(generation, int) and not isinstance(generation, bool) else None,
            "pid": data.get("pid") if isinstance(data.get("pid"), int) else None,
            "host": str(data.get("host"))[:200] if isinstance(data.get("host"), str) else None}


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


class Backend(ABC):
    """Executes plans on one kind of cluster. Subclasses register in ``launcher.backends.BACKENDS``."""

    name: ClassVar[str]
    #: nodes are placed by the backend at launch (Ray, Slurm): the plan holds placeholders until then
    places_nodes: ClassVar[bool] = False
    #: the nodes are known only inside ``start`` (a scheduler's allocation): preflight at submit checks what the
    #: scheduler answers at once, the nodes' own checks run in ``start`` (re-planned through ``StartContext.place``)
    places_at_start: ClassVar[bool] = False

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        #: the generation of the supervisor using this backend (None: `launch cancel` of a job without one): the
        #: nodes refuse its signals and sweeps once they record a newer one (``fenced_command``)
        self.generation: int | None = None

    # planning: pure, no connection

    #: whether a node's GPUs or slots bound the processes per node (off where one machine hosts every node)
    checks_capacity: ClassVar[bool] = True
    #: each node's agent leases the GPUs or slots it uses (``lease_devices``; docs/LEASES.md)
    leases: ClassVar[bool] = False

    @classmethod
    def plan_policy(cls, job: JobSpec, cluster: ClusterSpec) -> PlanPolicy:
        """This backend's choices for planning ``job`` on ``cluster``, as the value the planner reads."""
        return PlanPolicy(
            nodes=tuple(cls.plan_nodes(cluster, job.resources.nodes)),
            python=cls.default_python(cluster),
            resource_problems=tuple(cls.resource_problems(job, cluster)),
            spare_nodes=cls.spare_nodes(cluster, job.resources.nodes),
            places_nodes=cls.places_nodes,
            checks_capacity=cls.checks_capacity,
            pinned_interface=cls.pinned_interface(cluster),
            uses_hcas=cls.uses_hcas(cluster),
            leases=cls.leases,
        )

    @classmethod
    def plan_nodes(cls, cluster: ClusterSpec, count: int) -> list[NodeSpec]:
        """The nodes a job of ``count`` nodes is planned on (placeholders where placed later)."""
        return list(cluster.nodes[:count])

    @classmethod
    def default_python(cls, cluster: ClusterSpec) -> str:
        """The interpreter the nodes run when the cluster spec names none."""
        return cluster.python or "python3"

    @classmethod
    def pinned_interface(cls, cluster: ClusterSpec) -> tuple[str, str] | None:
        """(interface, where it comes from) when the backend fixes it, else None (pinned in the spec, or probed)."""
        return None

    @classmethod
    def uses_hcas(cls, cluster: ClusterSpec) -> bool:
        """Whether InfiniBand HCAs are probed and set on this backend's nodes."""
        return True

    @classmethod
    def resource_problems(cls, job: JobSpec, cluster: ClusterSpec) -> list[str]:
        """What the cluster can never give this job (checked at plan time)."""
        if cls.places_nodes:
            return []
        wanted = job.resources.nodes
        if wanted > len(cluster.nodes):
            return [f"resources.nodes: the job asks for {wanted} nodes; cluster '{cluster.name}' lists {len(cluster.nodes)}"]
        return []

    @classmethod
    def spare_nodes(cls, cluster: ClusterSpec, wanted: int) -> int | None:
        """How many nodes beyond ``wanted`` a restart could move to (None: this backend cannot leave nodes out)."""
        return None

    @classmethod
    def resolve_defaults(cls, cluster: ClusterSpec) -> ClusterSpec:
        """The cluster spec with what this backend fills in when the spec leaves it out."""
        return cluster

    @classmethod  # noqa: B027 (an optional hook: most backends cannot know the nodes' memory before launch)
    def check_host_memory(cls, job: JobSpec, cluster: ClusterSpec, plan: Plan) -> None:
        """Refuse (PlanError) a job whose processes cannot fit the nodes' host memory, when the backend
        knows it before launch."""

    @classmethod
    def check_hosts(cls, cluster: ClusterSpec) -> list[str]:
        """The nodes `launch check` covers, by host name (node ``index`` of ``run_on_node(None, index, ...)``)."""
        return [node.host for node in cluster.nodes]

    @classmethod
    def bandwidth_nodes(cls, cluster: ClusterSpec) -> int:
        """How many nodes `launch check`'s all-reduce job runs on."""
        return len(cls.check_hosts(cluster))

    # running

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

    #: ``follow`` works: a node's journal can be followed again (after a broken stream, or by `launch attach`)
    follows: ClassVar[bool] = False
    #: the nodes keep a supervisor generation (``fence``) that ``follow`` and the agents check, and the job's
    #: record (``job_record``): `launch attach --takeover` and `--cluster` work
    fences: ClassVar[bool] = False
    #: seconds more than the supervisor's own settle time (``SETTLE_S``) that the other nodes' verdicts may take to
    #: arrive after a node's failure, before the first failure is chosen: an engine that learns of a lost node
    #: by polling (Slurm: squeue and sinfo, at most once a second) takes longer than a node agent's exit
    verdict_delay_s: ClassVar[float] = 0.0

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
        with ``generation`` newer than it, that one is recorded first (``who``: pid and host). (answer, None) or
        (None, why not)."""
        answer, error = self.node_command(plan, index, "fence", {"job_id": job_id, "node": index,
                                                                 "generation": generation, **(who or {})},
                                          timeout=timeout)
        if answer is not None and "error" in answer:
            return None, str(answer["error"])[:300]
        return answer, error

    def job_record(self, index: int, job_id: str) -> tuple[dict | None, str | None]:
        """The job as its supervisor recorded it in node ``index``'s run directory (of the cluster, plan or not):
        (record, None) or (None, why not)."""
        answer, error = self.node_command(None, index, "record", {"job_id": job_id}, timeout=60)
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

    def stream_command(self, plan: Plan, index: int, command: str, request: dict):
        """A long-running node-side command on node ``index`` (``launcher.backends.leasing.NodeStream``)."""
        raise LaunchError(f"the {self.name} backend runs no long node commands")

    def warm(self, plan: Plan) -> None:  # noqa: B027 (optional hook: most backends start nothing ahead)
        """Get ready to start ``plan`` while preflight runs (the local backend starts its agents' interpreters);
        what is not used is released by ``close``."""

    def close(self) -> None:  # noqa: B027 (optional hook: backends without connections have nothing to release)
        """Release connections."""

    # built on run_on_node and the node side

    def node_command(self, plan: Plan | None, index: int, command: str, request: dict,
                     timeout: float = NODE_COMMAND_TIMEOUT_S) -> tuple[dict | None, str | None]:
        """Run a node-side command; (its JSON answer, None) or (None, why not)."""
        python = plan.python if plan is not None else self.default_python(self.cluster)
        result = self.run_on_node(plan, index, node_argv(python, command, request), timeout)
        lines = [line for line in result.out.splitlines() if line.startswith("{")]
        if result.code != 0 or not lines:
            return None, (result.err or result.out).strip()[-300:] or f"exit {result.code}"
        try:
            return json.loads(lines[-1]), None
        except ValueError:
            return None, f"unreadable answer: {lines[-1][:200]}"

    def fenced_command(self, plan: Plan, index: int, command: str, request: dict,
                       timeout: float = NODE_COMMAND_TIMEOUT_S) -> tuple[dict | None, str | None]:
        """``node_command`` for what only the supervisor in charge may do (signal, end): with this backend's
        ``generation``, which the node checks; SupervisorFenced when it records a newer one."""
        if self.generation is not None:
            request = {**request, "job_id": plan.job_id, "node": index, "generation": self.generation}
        answer, error = self.node_command(plan, index, command, request, timeout)
        if answer is not None and isinstance(answer.get("fenced"), dict):
            raise SupervisorFenced(plan.job_id, answer["fenced"])
        return answer, error

    def on_nodes(self, plan: Plan, step: Callable[[int], object]) -> list:
        """``step(index)`` for every node of the plan, in parallel, results in node order."""
        with ThreadPoolExecutor(max_workers=max(1, min(32, plan.nnodes))) as pool:
            return list(pool.map(step, range(plan.nnodes)))

    def sweep(self, plan: Plan, grace: float, end: bool = True) -> SweepReport:
        """End (or with ``end=False`` only list) the job's processes on every node: all of the job's on its
        host, whichever node (or attempt) tagged them, as the safety net behind the agents."""

        def one(index: int) -> NodeSweep:
            host = self.host(plan, index)
            cleanup = [list(c) for c in plan.nodes[index].cleanup] if end else []
            answer, error = self.fenced_command(plan, index, "end" if end else "list",
                                                {"job_id": plan.job_id, "grace": grace, "cleanup": cleanup},
                                                timeout=grace + 30 + 30 * len(cleanup))
            if answer is None:
                return NodeSweep(index, host, SweepOutcome.UNREACHABLE, detail=error)
            pids = tuple(answer["pids"])
            failed = answer.get("cleanup_failed") or []
            outcome = SweepOutcome.LEFTOVERS if pids or failed else SweepOutcome.CLEAN
            return NodeSweep(index, host, outcome, pids, "; ".join(failed) or None)

        return SweepReport(tuple(self.on_nodes(plan, one)))

    def kernel_log(self, plan: Plan, index: int) -> list[str]:
        """The node's recent kernel log (ISO times), for OOM-killer lines; [] if unreadable."""
        answer, _ = self.node_command(plan, index, "facts", {"kernel_log": True})
        try:
            return list(NodeFacts.parse(answer).kernel_log) if answer else []
        except FactsError:
            return []

    def stacks(self, plan: Plan) -> list[tuple[int, dict | None, str | None]]:
        """Per node: (index, the node's stack report, or None and why not)."""
        return self.on_nodes(plan, lambda index: (index, *self.node_command(
            plan, index, "stacks", {"job_id": plan.job_id, "node": index}, timeout=60)))


def agent_request(plan: Plan, node: NodePlan, grace: float, secrets_on_stdin: bool, lease: dict | None = None,
                  generation: int = 0, record: dict | None = None) -> dict:
    """What the node agent needs to run ``node`` of ``plan`` (see ``launcher.node.agent``); ``lease``: what it
    leases first (``launcher.backends.leasing.agent_lease``); ``generation``: its supervisor's; ``record``: the
    job as recorded, kept in the node's run directory (``StartContext.record``)."""
    return {**({"lease": lease} if lease else {}),
        "job_id": plan.job_id, "node": node.index, "argv": list(node.argv), "env": dict(node.env), "cwd": node.cwd,
        "files": {name: list(file) for name, file in node.files.items()}, "gpus": node.gpus, "grace": grace,
        "secrets_on_stdin": secrets_on_stdin, "cleanup": [list(c) for c in node.cleanup], "env_prefix": node.env_prefix,
        "unattended_s": plan.unattended_s, "generation": generation, **({"record": record} if record else {}),
        **({"rendezvous_port": plan.rendezvous.port} if node.index == 0 else {}),
    }


@dataclass(frozen=True)
class AgentStart:
    """How a backend starts a node's agent: ``argv`` (no request, no secret in it), then ``stdin`` written to it:
    the request on its first line (the job's env may be larger than one argument may be), the secrets on the second."""

    argv: list[str]
    stdin: bytes


def agent_start(plan: Plan, node: NodePlan, grace: float, secrets: Mapping[str, str],
                lease: dict | None = None, generation: int = 0, record: dict | None = None) -> AgentStart:
    """The ``AgentStart`` of ``node`` of ``plan`` under ``plan.python``."""
    request = agent_request(plan, node, grace, secrets_on_stdin=True, lease=lease, generation=generation, record=record)
    return AgentStart(stdin_argv(plan.python, "agent"), stdin_request(request) + json.dumps(dict(secrets)).encode() + b"\n")


def facts_request(plan: Plan, index: int, **extra) -> dict:
    """The facts request preflight sends to node ``index``: the modules the job needs, its workdir, the
    rendezvous port on node 0, and, for a job in a container, the runtime, the image and the facts of the
    interpreter inside it. ``extra`` adds backend-specific keys (the route to node 0, pinned interfaces...)."""
    node = plan.nodes[index]
    request = {"modules": required_modules(plan), "workdir": node.cwd,
               "port": plan.rendezvous.port if index == 0 else None, **extra}
    if plan.container is not None:
        request["container"] = container_request(plan, plan.container, index)
    return request


def container_request(plan: Plan, spec: ContainerSpec, index: int) -> dict:
    """How a node checks the job's container (``spec``): runtime usable, image present or pulled, facts inside the image."""
    node = plan.nodes[index]
    probe_name = containers.ContainerName(f"{plan.job_id}-probe", index)
    inside = node_argv(spec.python, "facts", {"modules": required_modules(plan), "workdir": node.cwd})
    return {
        "probe": containers.probe_argv(spec.runtime),
        "present": containers.image_present_argv(spec),
        "pull": spec.pull.value if spec.runtime.value != "apptainer" else "never",
        "pull_argv": containers.pull_argv(spec) if spec.runtime.value != "apptainer" else None,
        "inside": containers.run_argv(spec, probe_name, inside, [], node.cwd, 0),
    }


def agent_exit_code(status: int) -> int:
    """A node agent's exit status as a NodeHandle code: 128+N (its command died of signal N) becomes -N."""
    return -(status - 128) if 128 < status < 192 else status


def required_modules(plan: Plan) -> list[str]:
    """What the nodes' interpreter must import for this plan: torch, deepspeed under DeepSpeed,
    launch itself for a built-in recipe (a user's program needs only torch)."""
    modules = ["torch"]
    if plan.launcher == "deepspeed" or plan.ds_config:
        modules.append("deepspeed")
    if RECIPE_MODULE in plan.nodes[0].argv:
        modules.append("launcher")
    return modules


def node_problems(host: str, plan: Plan, facts: NodeFacts, node: NodePlan | None = None, gpus: int = 0) -> list[str]:
    """What a node's facts say is wrong with it for this plan (every backend's preflight uses this)."""
    node = node or plan.nodes[0]
    problems = []
    if facts.missing and plan.container is not None:
        problems.append(f"{host}: {plan.container.python} in image {plan.container.image} cannot import "
                        f"{', '.join(facts.missing)} (container.python names the image's interpreter)")
    elif facts.missing:
        problems.append(
            f"{host}: {plan.python} cannot import {', '.join(facts.missing)} "
            "(install it on the node, or point cluster.yaml python at an interpreter that has it)"
        )
    if not facts.workdir_ok:
        problems.append(f"{host}: workdir '{node.cwd}' does not exist (cluster.yaml workdir, or set sync_workdir)")
    for name in facts.missing_ifaces:
        problems.append(f"{host}: network interface '{name}' (cluster.yaml network.interface) does not exist")
    if facts.port_free is False:
        problems.append(
            f"{host}: rendezvous port {plan.rendezvous.port} is in use on node 0 (a stale job may hold it: "
            "`launch status`; or choose another rendezvous.port)"
        )
    if gpus and not facts.gpus:
        problems.append(f"{host}: cluster.yaml says {gpus} GPUs but nvidia-smi failed: {facts.gpu_error}")
    elif gpus and len(facts.gpus) < gpus:
        problems.append(f"{host}: cluster.yaml says {gpus} GPUs, nvidia-smi lists {len(facts.gpus)}")
    if facts.route_error and not facts.dev:
        problems.append(
            f"{host}: cannot find the interface routing to node 0: {facts.route_error} (pin network.interface in cluster.yaml)"
        )
    box = facts.container
    container = plan.container
    if container is not None and box is not None:
        for what, error in ((f"container runtime {container.runtime.value} is not usable", box.runtime_error),
                            (f"image {container.image}", box.image_error), ("inside the image", box.inside_error)):
            if error:
                problems.append(f"{host}: {what}: {error}")
    offloaded = plan.memory.cpu_gib_per_node if plan.memory and plan.strategy and get_strategy(plan.strategy).offload else None
    total = facts.mem_total_bytes
    if offloaded and total is not None and offloaded * 2**30 > total * HOST_MEMORY_SHARE:
        problems.append(
            f"{host}: {plan.strategy} keeps about {offloaded:.1f} GiB of model states in host memory on each node; "
            f"this node has {total / 2**30:.1f} GiB ({HOST_MEMORY_SHARE:.0%} usable): use more nodes, or zero3"
        )
    if facts.hostname_resolves not in (None, True):
        problems.append(
            f"{host}: its hostname '{facts.hostname}' does not resolve ({facts.hostname_resolves}); torchrun's "
            "c10d rendezvous looks it up: add it to /etc/hosts or DNS"
        )
    return problems


def parse_facts(host: str, answer: object) -> tuple[NodeFacts | None, str | None]:
    """A node's facts answer as received, parsed once: (the facts, None), or (None, ``host``'s problem)."""
    try:
        return NodeFacts.parse(answer), None
    except FactsError as exc:
        return None, f"{host}: {exc}"


def unreachable(error: str) -> CommandResult:
    """The result of a command on a node that could not be reached."""
    return CommandResult(LOST_NODE_EXIT, "", error)
