"""What the nodes' facts say: problems that block training, differences between nodes, warnings.

The lower layer of `launch check` and of submit's version comparison: facts come from the node
side (``launcher.node.facts``) through a backend's ``node_command``, the same way preflight gets
them, so a submit compares the nodes from the facts its preflight already gathered. They are parsed
once, where they arrive, into ``launcher.backends.facts.NodeFacts``; a malformed answer is that
node's error.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from launcher.backends.base import Backend
from launcher.backends.facts import NodeFacts
from launcher.backends.nodechecks import RUN_ROOT_HINT, parse_facts
from launcher.node.protocol import FactsRequest
from launcher.plan.netenv import AUTO
from launcher.spec.cluster import ClusterSpec

SKEW_WARN_S = 2.0
CLOCK_TRIES = 3  # round trips a node's clock is read on: the shortest one's reading is kept
CLOCK_ARGV = ["date", "+%s.%N"]  # the node's wall clock, read as fast as a command can be
DISK_WARN_GB = 10.0
COMPARED = ("python", "torch", "deepspeed", "nccl")


@dataclass(frozen=True)
class Skew:
    """A node's wall clock minus this machine's, read on a round trip: the node read it at some moment between
    sending and receiving, so it is placed at the midpoint (the latency compensated), within half the trip."""

    seconds: float
    uncertainty: float

    @classmethod
    def on_trip(cls, node_time: float, sent: float, received: float) -> Skew:
        return cls(node_time - (sent + received) / 2, (received - sent) / 2)

    def beyond(self, limit: float) -> bool:
        """The clocks differ by more than ``limit`` whatever the trip's latency was."""
        return abs(self.seconds) - self.uncertainty > limit


@dataclass
class CheckedNode:
    """What one node reported, or why it could not."""

    index: int
    host: str
    facts: NodeFacts = field(default_factory=NodeFacts)
    error: str | None = None
    skew: Skew | None = None

    @property
    def skew_s(self) -> float | None:
        return self.skew.seconds if self.skew is not None else None


def measure_skew(backend: Backend, index: int, tries: int = CLOCK_TRIES) -> Skew | None:
    """The node's clock against this machine's, on launch's own round trips (``date``, nothing else in them): the
    reading of the shortest trip, the least uncertain. None when the node cannot say (no GNU date)."""
    best: Skew | None = None
    for _ in range(tries):
        sent = time.time()
        try:
            result = backend.run_on_node(None, index, CLOCK_ARGV, timeout=10)
        except Exception:  # noqa: BLE001 - the facts said what is wrong with the node; its clock is unknown
            return best
        received = time.time()
        try:
            node_time = float(result.out.strip()) if result.code == 0 else None
        except ValueError:
            node_time = None
        if node_time is None:
            return best
        skew = Skew.on_trip(node_time, sent, received)
        best = skew if best is None or skew.uncertainty < best.uncertainty else best
    return best


@dataclass
class CheckReport:
    nodes: list[CheckedNode]
    problems: list[str]
    warnings: list[str]
    bandwidth_gbps: float | None = None
    bandwidth_job: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def gather(backend: Backend, cluster: ClusterSpec, port: int, listen_s: float = 8.0) -> list[CheckedNode]:
    """The facts of every node of the cluster, in parallel; node 0 listens on ``port`` for ``listen_s``
    seconds while the others connect to it (``listen_s=0``: no reachability test)."""
    hosts = backend.planning.check_hosts()
    master = backend.planning.plan_nodes(1)[0]
    master_address = master.address if master.address and master.address != AUTO else hosts[0]
    reach = listen_s > 0 and len(hosts) > 1

    def one(index: int) -> CheckedNode:
        request = FactsRequest(workdir=cluster.workdir, gpus=True, run_root=True)
        if index == 0:
            request = dataclasses.replace(request, port=port, listen_s=listen_s if reach else 0, expect=len(hosts) - 1)
        elif reach:
            request = dataclasses.replace(request, port=port, connect=master_address, wait_s=listen_s)
        sent = time.time()
        answer, error = backend.node_command(None, index, "facts", request, timeout=listen_s + 30)
        received = time.time()
        if answer is None:
            return CheckedNode(index, hosts[index], error=error)
        facts, problem = parse_facts(hosts[index], answer)
        if facts is None:
            return CheckedNode(index, hosts[index], error=(problem or "").removeprefix(f"{hosts[index]}: "))
        # the facts' trip holds node 0's wait for its peers' port test: its clock is read on trips of its own
        skew = measure_skew(backend, index) or (
            Skew.on_trip(facts.time, sent, received) if facts.time is not None else None)
        return CheckedNode(index, hosts[index], facts, skew=skew)

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return list(pool.map(one, range(len(hosts))))


def node_problems(nodes: list[CheckedNode], cluster: ClusterSpec) -> list[str]:
    """Per-node problems: unreachable, no torch, no workdir, port busy or unreachable."""
    problems = []
    for n in nodes:
        if n.error:
            problems.append(f"{n.host}: {n.error}")
            continue
        f = n.facts
        if not f.torch:
            problems.append(f"{n.host}: torch is not installed for {f.executable or cluster.python or 'python3'}")
        if f.run_root_error:
            problems.append(f"{n.host}: a job's run directory cannot be made there: {f.run_root_error}; {RUN_ROOT_HINT}")
        if not f.workdir_ok and not cluster.sync_workdir:
            problems.append(f"{n.host}: workdir '{cluster.workdir}' does not exist")
        if n.index == 0 and f.port_free is False:
            problems.append(f"{n.host}: rendezvous port is in use")
        if n.index and f.reached not in (None, True):
            problems.append(f"{n.host}: cannot reach node 0 on the rendezvous port: {f.reached}")
    return problems


def version_differences(facts: Mapping[str, NodeFacts]) -> list[str]:
    """One problem per package whose version differs between nodes (``facts``: host -> facts)."""
    problems = []
    for key in COMPARED:
        if len({getattr(f, key) for f in facts.values()}) > 1:
            detail = ", ".join(f"{host}={getattr(f, key)}" for host, f in facts.items())
            problems.append(f"{key} differs between nodes: {detail}")
    return problems


def node_warnings(nodes: list[CheckedNode]) -> list[str]:
    """Clock skew (beyond SKEW_WARN_S whatever its measurement's uncertainty), low disk, processes on the GPUs."""
    warnings = []
    for n in nodes:
        if n.error:
            continue
        f = n.facts
        if n.skew is not None and n.skew.beyond(SKEW_WARN_S):
            warnings.append(f"{n.host}: clock differs from this machine by {n.skew.seconds:+.1f} s "
                            f"(measured within {n.skew.uncertainty:.2f} s)")
        if f.disk_free_gb is not None and f.disk_free_gb < DISK_WARN_GB:
            warnings.append(f"{n.host}: only {f.disk_free_gb:.1f} GB free in the workdir")
        if f.gpu_processes:
            warnings.append(f"{n.host}: {f.gpu_processes} process(es) already on the GPUs")
        warnings += infiniband_warnings(n.host, f)
    return warnings


def infiniband_warnings(host: str, facts: NodeFacts) -> list[str]:
    """What a node with InfiniBand HCAs got in the job's container (checked in preflight), where NCCL would not
    have what its verbs need: the device files, an unlimited memlock."""
    inside = facts.container
    if not facts.hcas or inside is None or not inside.ib_checked:
        return []
    warnings = []
    if not inside.ib_devices:
        warnings.append(f"{host}: InfiniBand HCAs {', '.join(facts.hcas)} on the node, but no /dev/infiniband in "
                        "the container: NCCL will use TCP sockets")
    if inside.memlock is not None and inside.memlock != -1:
        warnings.append(f"{host}: the container got memlock {inside.memlock // 1024} KiB, not unlimited (the node's "
                        "hard limit): NCCL may fail to register large buffers with the HCA")
    return warnings


def assess(nodes: list[CheckedNode], cluster: ClusterSpec) -> tuple[list[str], list[str]]:
    """Problems (the cluster cannot train) and warnings, from the gathered facts."""
    answered = {n.host: n.facts for n in nodes if not n.error}
    return node_problems(nodes, cluster) + version_differences(answered), node_warnings(nodes)
