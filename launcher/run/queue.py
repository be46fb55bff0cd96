"""`launch queue`: who holds each GPU or CPU slot of a cluster's nodes, and which jobs wait for them, in order.

Every node is asked at once, through the backend's one connection per host (as `launch check` does), by
the node side's ``leases`` command (``launcher.node.waiting``); what other users' records say is shown as
plain text (``leasing.clean``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from launcher.backends import get_backend, leasing
from launcher.errors import LaunchError
from launcher.spec.cluster import ClusterSpec

PATH_LINE = 1000  # a line of what `--set-up` changed names a lock file's whole path (a lease dir may be deep)


@dataclass
class NodeQueue:
    """One node: each device with its holder (None: free), the jobs waiting there, or why it could not be read."""

    index: int
    host: str
    kind: str = "slot"
    devices: list[dict] = field(default_factory=list)
    waiting: list[dict] = field(default_factory=list)
    error: str | None = None
    set_up: list[str] | None = None  # what `--set-up` changed there (None: not asked)
    exposed: list[str] = field(default_factory=list)  # why another user could remove lock files there


@dataclass
class Waiter:
    """A job waiting for leases, with the hosts it waits on; ``since``: when its first ticket arrived (a node's time)."""

    job: str
    user: str
    origin: str
    since: float | None
    hosts: list[str]


def read_queue(cluster: ClusterSpec, set_up: bool = False) -> tuple[list[NodeQueue], list[Waiter]]:
    """Every node's devices and queue, and the waiting jobs in the order they will start; with ``set_up`` (root on
    the nodes), each node's lease directory and lock files made root's first (``launcher.node.leases.set_up``)."""
    backend = get_backend(cluster)
    try:
        if backend.lease_devices(None, 0) is None:
            raise LaunchError(f"cluster '{cluster.name}' ({cluster.backend}) allocates its own nodes: launch keeps no "
                              "leases there", hint="`squeue` shows Slurm's queue; `ray status` Ray's")
        hosts = backend.planning.check_hosts()

        def one(index: int) -> NodeQueue:
            kind, capacity = backend.lease_devices(None, index) or ("slot", 0)
            answer, error = backend.node_command(None, index, "lease-setup" if set_up else "leases",
                                                 leasing.survey_request(kind, capacity), timeout=60)
            if answer is None or answer.get("error"):
                return NodeQueue(index, hosts[index], kind, error=leasing.clean(error or answer and answer["error"]))
            return NodeQueue(index, hosts[index], kind, list(answer.get("devices") or []), list(answer.get("waiting") or []),
                             set_up=[leasing.clean(line, limit=PATH_LINE) for line in answer.get("set_up") or []] if set_up else None,
                             exposed=[leasing.clean(line) for line in (answer.get("exposed") or [])[:8]])

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
            nodes = list(pool.map(one, range(len(hosts))))
    finally:
        backend.close()
    return nodes, waiters(nodes)


def waiters(nodes: list[NodeQueue]) -> list[Waiter]:
    """The jobs holding tickets on any node, each with the hosts it waits on, in the order their tickets arrived
    (the earliest of each job's; each host lets its own tickets go in the order they arrived there)."""
    found: dict[str, Waiter] = {}
    for node in nodes:
        for ticket in node.waiting:
            job = leasing.clean(ticket.get("job", "?"))
            since = ticket.get("since") if isinstance(ticket.get("since"), (int, float)) else None
            if job not in found:
                found[job] = Waiter(job, leasing.clean(ticket.get("user", "?")), leasing.clean(ticket.get("from", "?")),
                                    since, [])
            elif since is not None and (found[job].since is None or since < found[job].since):
                found[job].since = since
            found[job].hosts.append(node.host)
    return sorted(found.values(), key=lambda w: (w.since if w.since is not None else float("inf"), w.job))


def _pace(device: dict) -> str | None:
    """``step 120/1000, ETA 14:32``: the pace of a device's holder (any user's job) as its agent recorded it."""
    holder = device.get("holder")
    return leasing.pace(holder) if isinstance(holder, dict) else None


def queue_json(nodes: list[NodeQueue], waiting: list[Waiter]) -> dict:
    return {
        "nodes": [{"index": n.index, "host": n.host, "kind": n.kind, "error": n.error, "set_up": n.set_up,
                   "exposed": n.exposed,
                   "devices": [{"index": d.get("index"), "holder": d.get("holder"), "foreign": d.get("foreign") or [],
                                "progress": _pace(d)}
                               for d in n.devices]} for n in nodes],
        "waiting": [{"job": w.job, "user": w.user, "from": w.origin, "since": w.since, "hosts": w.hosts} for w in waiting],
    }


def queue_lines(nodes: list[NodeQueue], waiting: list[Waiter]) -> list[str]:
    """Per node, each GPU or slot and its holder (or free); then the waiting jobs in order."""
    lines = []
    for node in nodes:
        if node.set_up is not None and not node.error:
            lines += [f"{node.host}: set up: {line}" for line in node.set_up or ["nothing to change: the lease directory "
                                                                                "and its lock files are root's"]]
        if node.error:
            lines.append(f"{node.host}: cannot read its leases: {node.error}")
            continue
        lines += [f"{node.host}: warning: {why}, and so let a second job lease a device that is held; root runs "
                  "`launch queue --set-up` once (docs/LEASES.md)" for why in node.exposed]
        noun = "GPU" if node.kind == "gpu" else "slot"
        for device in node.devices:
            holder, foreign = device.get("holder"), device.get("foreign") or []
            if holder:
                state = leasing.who(holder)
            elif foreign:
                state = "used by " + ", ".join(f"process {leasing.clean(p.get('pid'))} (user {leasing.clean(p.get('user'))}: "
                                               f"{leasing.clean(p.get('command'))})" for p in foreign[:4]) + " (not launch's)"
            else:
                state = "free"
            lines.append(f"{node.host} {noun} {device.get('index')}: {state}")
    if waiting:
        lines.append("waiting, in the order they start:")
        lines += [f"  {number}. job {w.job} (user {w.user}, from {w.origin}, since {leasing.at(w.since)}) for "
                  f"{', '.join(w.hosts)}" for number, w in enumerate(waiting, 1)]
    else:
        lines.append("no job waiting")
    return lines
