"""Leases from the submitting side (local and SSH clusters; docs/LEASES.md).

Each node agent takes its node's leases itself (``launcher.node.leases``) and says ``@leased`` or
``@busy``; a backend starts the ranks only once every agent of the job holds its leases (``go`` on
their stdin), so a job holds every lease it needs or none. Before that, ``probe`` answers quickly who
holds what (preflight's exit 3), and under ``queue: wait`` ``start_leased`` keeps the job's ticket in
each host's queue (a ``wait`` command per host) and QUEUED until every host says its turn has come.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from launcher.backends.base import Stage, StageState, StartContext
from launcher.errors import LaunchError, NodeStartError
from launcher.node import records
from launcher.node.progress import HolderPace, Pace
from launcher.node.protocol import Frame, FrameKind, LeaseRequest, early_output, parse
from launcher.plan.planner import NodePlan, Plan

if TYPE_CHECKING:
    from launcher.backends.base import Backend, NodeHandle

LEASE_DIR_ENV = "LAUNCH_LEASE_DIR"  # another lease directory than the nodes' default (tests: one per test)
TAKEN_FIRST = "another job took the leases first"  # said in the reason of a job that failed so (FailureKind.LEASES)
RECHECK_S = 1.0  # after a lost race for the leases: look again this soon even if no host's state changed
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")

H = TypeVar("H", bound="NodeHandle")


class LeasesBusy(NodeStartError):
    """A node agent found its leases held: nothing was started on any node."""


class NodeStream(Protocol):
    """A long-running node command's output lines (``Backend.stream_command``); ``close`` ends it."""

    def lines(self) -> Iterator[str]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class HostLease:
    """What a job leases on one host: the host's first node of the plan, and the devices its nodes take together."""

    host: str
    index: int
    kind: str
    count: int
    capacity: int


def host_leases(backend: Backend, plan: Plan) -> list[HostLease]:
    """One entry a host of the plan (several local nodes share this machine); [] on backends without leases."""
    found: dict[str, HostLease] = {}
    if not backend.capabilities.leases:
        return []
    for node in plan.nodes:
        device = backend.lease_devices(plan, node.index)
        if device is None:
            return []
        host = backend.host(plan, node.index)
        known = found.get(host)
        count = node.nproc + (known.count if known else 0)
        found[host] = HostLease(host, known.index if known else node.index, device[0], count, device[1])
    return list(found.values())


def _request(plan: Plan | None, kind: str, count: int, capacity: int, go_on_stdin: bool = False) -> LeaseRequest:
    """A ``leases``/``wait`` node request, or an agent's ``lease`` (``plan`` None: `launch queue`'s, for no job)."""
    return LeaseRequest(kind=kind, count=count, capacity=capacity, job=plan.job_id if plan else "",
                        waited=go_on_stdin and plan is not None and plan.queue == "wait",
                        origin=socket.gethostname(), allow_shared=plan.allow_shared_gpus if plan else False,
                        dir=os.environ.get(LEASE_DIR_ENV) or None, go_on_stdin=go_on_stdin,
                        max_steps=plan.max_steps if plan else None)


def agent_lease(backend: Backend, plan: Plan, node: NodePlan) -> LeaseRequest | None:
    """The ``lease`` of node ``node``'s agent request (None without leases): it waits for ``go`` on its stdin."""
    device = backend.lease_devices(plan, node.index)
    if device is None:
        return None
    return _request(plan, device[0], node.nproc, device[1], go_on_stdin=True)


def survey_request(kind: str, capacity: int) -> LeaseRequest:
    """The ``leases`` request of `launch queue`: who holds each device, and who waits."""
    return _request(None, kind, 0, capacity)


def clean(value: object, limit: int = 120) -> str:
    """A value another user wrote on a node (a job id, a host, a command), printable and bounded (a line naming a
    path, such as what ``--set-up`` changed, takes a longer ``limit``)."""
    return _UNPRINTABLE.sub("?", str(value))[:limit]


def _ranges(indices: list[int]) -> str:
    parts: list[str] = []
    for index in sorted(indices):
        if parts and parts[-1].split("-")[-1] == str(index - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{index}"
        else:
            parts.append(str(index))
    return ",".join(parts)


def at(since: object) -> str:
    """``10:02``: when a lease or a ticket was taken, in this machine's time zone."""
    return time.strftime("%H:%M", time.localtime(since)) if isinstance(since, (int, float)) else "?"


def pace(entry: dict, read_at: float | None = None) -> str | None:
    """``step 120/1000, ETA 14:32``: a holder's pace as its node agent recorded it (any user's job), from a holder
    entry a node answered at ``read_at`` (now); None when its ranks reported no step."""
    found = Pace.from_json(entry.get("pace"))
    return found.text(time.time() if read_at is None else read_at) if found else None


def who(entry: dict, with_pace: bool = True) -> str:
    """``job X (user U, from H, since 10:02; step 120/1000, ETA 14:32)`` (the pace unless ``with_pace`` is False, where
    its agent recorded one), or the process without a believable record."""
    if entry.get("job"):
        job = clean(entry["job"])
        known = pace(entry) if with_pace else None
        said = (f"job {job} (user {clean(entry.get('user', '?'))}, from {clean(entry.get('from') or '?')}, since "
                f"{at(entry.get('since'))}{f'; {known}' if known else ''})")
    else:
        said = f"process {clean(entry.get('pid', '?'))} (user {clean(entry.get('user', '?'))}, no launch record)"
    return said + (", though its lock file was removed (docs/LEASES.md: shared nodes)" if entry.get("lock_removed") else "")


def lock_file_removed(node: int, frame: Frame) -> str:
    """The line (and event) that says a lock file of node ``node``'s lease was removed or replaced while the job
    held it (its agent's ``@lease`` frame, ``launcher.node.leases.Moved``), and what became of the lease."""
    device = devices_text(frame.get_text("kind", 10), [frame.get_int("device") or 0])
    owners = frame.data.get("owners")
    by = ", ".join(clean(o) for o in owners[:4]) if isinstance(owners, list) and owners else None
    said = (f"launch: node {node}: the lock file of {device} ({clean(frame.get_text('path', 300) or '?')}) was "
            f"{'replaced' if frame.get_text('what', 20) == 'replaced' else 'removed'} while this job held it "
            f"({f'only {by} or root could' if by else 'only root could'})")
    holder = frame.data.get("holder")
    if frame.data.get("leased_again") is True:
        said += f": leased again, no other job can take {device}"
    elif isinstance(holder, dict):
        said += f": {device} is now leased by {who(holder)} as well: two jobs share it"
    else:
        said += f": it cannot be leased again ({clean(frame.get_text('error', 300) or 'no reason given')})"
    return said + "; `launch queue --set-up`, run once by root, makes lock files no user can remove (docs/LEASES.md)"


def describe(host: str, state: dict, allow_shared: bool, with_pace: bool = True) -> list[str]:
    """Why a host's devices are not the job's now: holders (grouped by job, with their pace unless ``with_pace`` is
    False), foreign processes, jobs ahead."""
    noun = "GPU" if state.get("kind") == "gpu" else "slot"
    groups: dict[str, list[int]] = {}
    foreign: list[str] = []
    for device in state.get("devices", []):
        if device.get("holder"):
            groups.setdefault(who(device["holder"], with_pace), []).append(int(device["index"]))
        elif device.get("foreign") and not allow_shared:
            for proc in device["foreign"][:4]:
                foreign.append(f"{host} GPU {device['index']}: process {clean(proc.get('pid'))} (user "
                               f"{clean(proc.get('user', '?'))}: {clean(proc.get('command', '?'))}), not started by "
                               "launch (resources.allow_shared_gpus: true shares it)")
    lines = [f"{host} {noun}{'s' if len(held) > 1 else ''} {_ranges(held)}: {name}" for name, held in groups.items()]
    lines += foreign
    lines += [f"{host}: {who(t)} waits for it first" for t in state.get("ahead", [])]
    if not lines:
        lines.append(f"{host}: {state.get('wanted')} {noun}(s) wanted, {state.get('free')} free")
    return lines


def _answer_problems(host: str, answer: dict | None, error: str | None, allow_shared: bool,
                     with_pace: bool = True) -> list[str]:
    if answer is None or answer.get("error"):
        return [f"{host}: cannot read its leases: {clean(error or (answer or {}).get('error'))}"]
    return [] if answer.get("ready") else describe(host, answer, allow_shared, with_pace)


def hint(problems: Sequence[str]) -> str | None:
    """BUSY_HINT when every problem is a lease held (``probe``'s), else None."""
    return BUSY_HINT if problems and all(isinstance(p, BusyLine) for p in problems) else None


def preflight_request(backend: Backend, plan: Plan, index: int) -> LeaseRequest | None:
    """What node ``index``'s preflight probe asks of its host's leases, besides its facts (None: nothing, as for a
    job that waits for them, a host whose leases another node of the plan probes, or a backend without leases)."""
    if plan.queue == "wait":
        return None
    lease = next((lease for lease in host_leases(backend, plan) if lease.index == index), None)
    return None if lease is None else _request(plan, lease.kind, lease.count, lease.capacity)


def preflight_problems(host: str, plan: Plan, facts_answer: dict) -> list[str]:
    """Who holds what the plan needs on ``host``, from the answer of a probe sent ``preflight_request``."""
    leases = facts_answer.get("leases")
    if not isinstance(leases, dict):
        return [f"{host}: cannot read its leases: the probe did not say"]
    if leases.get("error"):  # an unusable lock path or directory: not a lease held, nothing to wait for
        return _answer_problems(host, leases, None, plan.allow_shared_gpus)
    if leases.get("ready"):
        return [BusyLine(line) for line in _answer_problems(host, leases, None, plan.allow_shared_gpus)]
    return [BusyLine(line) for line in describe(host, leases, plan.allow_shared_gpus)]


def devices_text(kind: object, devices: Sequence[int]) -> str:
    """``GPUs 4-7``, ``slot 1``."""
    noun = "GPU" if kind == "gpu" else "slot"
    return f"{noun}{'s' if len(devices) > 1 else ''} {_ranges(list(devices))}"


class BusyLine(str):
    """A preflight problem that is another job's lease (``probe``): its hint is ``BUSY_HINT``."""


BUSY_HINT = ("`launch submit --wait` (or queue: wait) queues the job until they are free; `launch queue` shows who "
             "holds what (docs/LEASES.md)")


def read_until_leased(lines: Iterator[str], host: str, index: int) -> str:
    """Read an agent's first lines up to its ``leased`` frame: what it holds (``GPUs 4-7``); LeasesBusy on ``busy``,
    NodeStartError if it ended first."""
    seen: list[str] = []
    for line in lines:
        seen.append(line)
        parsed = parse(line)
        if isinstance(parsed, Frame) and parsed.kind is FrameKind.LEASED:
            devices = parsed.data.get("devices")
            return devices_text(parsed.data.get("kind"), [i for i in devices if type(i) is int] if isinstance(devices, list) else [])
        if isinstance(parsed, Frame) and parsed.kind is FrameKind.BUSY:
            raise LeasesBusy("; ".join(describe(host, parsed.data, bool(parsed.data.get("allow_shared")))), index)
    raise NodeStartError(f"{host}: the node agent exited before taking its leases: {early_output(seen, last=5) or 'no output'}",
                         index)


HOLDERS_FILE = "holders.json"  # in a QUEUED job's run directory: the pace of the jobs holding what it waits for
HOLDERS_LIMIT = 64 * 1024  # bytes of it read back
HOLDERS_SHOWN = 16


def paces(state: dict, read_at: float) -> dict[str, HolderPace]:
    """The pace of each job holding a device in a host's answer (any user's: their agents record it), by job."""
    found: dict[str, HolderPace] = {}
    for device in state.get("devices") or []:
        holder = device.get("holder") if isinstance(device, dict) else None
        recorded = Pace.from_json(holder.get("pace")) if isinstance(holder, dict) and holder.get("job") else None
        if recorded is not None and isinstance(holder, dict):
            job = clean(holder["job"])
            found[job] = HolderPace(job, clean(holder.get("user", "?")), recorded, read_at)
    return found


def write_paces(run_dir: Path, found: Iterable[HolderPace]) -> None:
    """Keep the holders' pace where `launch status` of the queued job reads it (``read_paces``)."""
    with contextlib.suppress(OSError):
        records.write_json(str(run_dir / HOLDERS_FILE), {"holders": [p.as_json() for p in list(found)[:HOLDERS_SHOWN]]})


def read_paces(run_dir: Path) -> tuple[HolderPace, ...]:
    """The holders' pace a queued job's supervisor last kept (``write_paces``): () when none."""
    try:
        data = json.loads((run_dir / HOLDERS_FILE).read_bytes()[:HOLDERS_LIMIT])
    except (OSError, ValueError):
        return ()
    entries = data.get("holders") if isinstance(data, dict) else None
    found = (HolderPace.from_json(entry) for entry in (entries if isinstance(entries, list) else [])[:HOLDERS_SHOWN])
    return tuple(p for p in found if p is not None)


class _Turn:
    """The job's tickets on every host (``wait`` commands), and the latest state each host reported."""

    def __init__(self, backend: Backend, plan: Plan, hosts: list[HostLease]) -> None:
        self.hosts, self.allow_shared = hosts, plan.allow_shared_gpus
        self.events: queue.Queue[tuple[int, dict | None]] = queue.Queue()
        self.states: dict[int, dict] = {}
        self.paces: dict[str, HolderPace] = {}  # the holders' pace by job, as their hosts last said it
        self.streams: list[NodeStream] = []
        self.shown: str | None = None  # the reason the job is QUEUED with (None: not queued)
        try:
            for number, lease in enumerate(hosts):
                stream = backend.stream_command(plan, lease.index, "wait",
                                                _request(plan, lease.kind, lease.count, lease.capacity))
                self.streams.append(stream)
                threading.Thread(target=self._read, args=(number, stream), daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _read(self, number: int, stream: NodeStream) -> None:
        try:
            for line in stream.lines():
                try:
                    state = json.loads(line) if line.startswith("{") else None
                except ValueError:
                    continue
                if isinstance(state, dict):
                    self.events.put((number, state))
        finally:
            self.events.put((number, None))

    def wait_ready(self, context: StartContext, plan: Plan, fresh: bool) -> None:
        """Until every host says the job's turn has come (QUEUED with who holds what meanwhile); LaunchError when
        cancelled or a host's ``wait`` ended. ``fresh``: a race was just lost, so wait for news (or RECHECK_S)."""
        deadline = time.monotonic() + RECHECK_S if fresh else 0.0
        while True:
            if context.cancelled.is_set():
                raise LaunchError("cancelled while waiting for the leases")
            if len(self.states) == len(self.hosts) and time.monotonic() >= deadline:
                busy = [line for n, state in sorted(self.states.items())  # no pace: the reason changes when holders do
                        for line in _answer_problems(self.hosts[n].host, state, None, self.allow_shared, False)]
                if not busy:
                    if self.shown is not None:
                        context.stage(Stage.QUEUED, None, "", StageState.DONE)
                        context.allocated("")
                        self.shown = None
                    return
                self.say(context, "; ".join(busy))
            try:
                number, state = self.events.get(timeout=0.2)
            except queue.Empty:
                continue
            host = self.hosts[number].host
            if state is None:
                raise LaunchError(f"{host}: waiting for the leases ended: the connection or the `wait` command there "
                                  f"ended ({plan.job_id} did not start)")
            if state.get("error"):
                raise LaunchError(f"{host}: cannot wait for the leases there: {clean(state['error'])}")
            self.states[number] = state
            self.paces.update(paces(state, time.time()))
            if self.paces:
                write_paces(context.run_dir, self.paces.values())

    def say(self, context: StartContext, reason: str) -> None:
        """QUEUED with ``reason`` (said once per reason)."""
        if reason != self.shown:
            context.queued(reason, None)
            context.stage(Stage.QUEUED, None, "", StageState.RUNNING)
            self.shown = reason

    def close(self) -> None:
        for stream in self.streams:
            stream.close()


def start_leased(backend: Backend, plan: Plan, context: StartContext,
                 start: Callable[[], tuple[Plan, Sequence[H]]]) -> tuple[Plan, Sequence[H]]:
    """``start()`` once the leases may be had: at once (``queue: fail``: a lost race is LeasesBusy), or, under
    ``queue: wait``, when every host says the job's turn has come (again after a lost race). Jobs wait their turn on
    each host in the order their tickets arrived there (the node's time, never the submitting machine's claim)."""
    hosts = host_leases(backend, plan)
    if not hosts or plan.queue != "wait":
        try:
            return _said(context, plan, start())
        except LeasesBusy as exc:
            raise LeasesBusy(f"{TAKEN_FIRST} (nothing was started): {exc}", exc.node) from None
    turn = _Turn(backend, plan, hosts)
    try:
        fresh = False
        while True:
            turn.wait_ready(context, plan, fresh)
            try:
                return _said(context, plan, start())
            except LeasesBusy as exc:
                turn.say(context, f"{TAKEN_FIRST}: {exc}")
                fresh = True
    finally:
        turn.close()


def _said(context: StartContext, plan: Plan, started: tuple[Plan, Sequence[H]]) -> tuple[Plan, Sequence[H]]:
    """Tell the supervisor what each started node holds (its handle's ``leased``, where it leases)."""
    for handle in started[1]:
        if handle.leased:
            context.leased(handle.index, plan.nodes[handle.index].host, handle.leased)
    return started
