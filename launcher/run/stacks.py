"""Every rank's Python stack, taken from outside on every node, grouped so the odd rank stands out.

Used before a hung or stalled job is torn down, and by `launch stacks JOB` on a running one.
The node side (``launcher.node.stacks``) runs py-spy on each rank; here the answers are grouped
into classes by their main thread's path, as LLNL's STAT does (``stackclasses``: ranks written as
ranges, the largest class first, the ranks that stand apart named). With them is kept what launch
saw of each node when the stacks were taken, the evidence the verdict shows side by side: each rank's
CPU and GPU activity (the supervisor's ``Liveness``), the node's last output line (its log file), its
kernel-log lines about GPUs and memory (Xid...), and PyTorch's analysis of the NCCL flight
recorder's dumps (``flightrecorder``: which ranks did not join which collective). The report is kept
with the job as ``stacks-attemptN.json`` in its run directory, which `launch status` reads.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.run.stackclasses import StackClass, classify, main_path, ranges

if TYPE_CHECKING:
    from launcher.backends.base import Backend
    from launcher.plan.planner import Plan
    from launcher.run.liveness import Liveness
    from launcher.store.db import Store

_THREAD_ID = re.compile(r"Thread (0x[0-9A-Fa-f]+|\d+)")
_PROCESS = re.compile(r"^Process \d+:.*$", re.M)
_KERNEL_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[,.]\d+([+-]\d\d:?\d\d)?")
LAST_OUTPUT_BYTES = 8192
APART_SHOWN = 8  # ranks named one by one in the reason, at most
BUILD_LOCK_FILE = "torch/utils/file_baton.py"  # where torch waits on a JIT build lock (py-spy shortens the path)


@dataclass
class RankStack:
    node: int
    rank: int | None
    host: str
    pid: int | None
    stack: str | None
    error: str | None = None
    local_rank: int | None = None


@dataclass
class StackReport:
    taken_at: float
    attempt: int
    ranks: list[RankStack] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    nccl_traces: dict[int, list[str]] = field(default_factory=dict)
    world_size: int | None = None
    hosts: list[str] = field(default_factory=list)  # the plan's hosts in node order
    gpus: list[int] = field(default_factory=list)  # the plan's GPUs per node
    unreached: dict[int, str] = field(default_factory=dict)  # node -> why its stacks were not taken
    activity: dict[int, dict] = field(default_factory=dict)  # rank -> {"node", "idle_s", "step"}
    nodes: dict[int, dict] = field(default_factory=dict)  # node -> {"last_output": [t, line] | None, "kernel": [...]}
    flight: dict | None = None  # flightrecorder.analyse's result, when dumps were found

    def groups(self) -> list[list[RankStack]]:
        """Ranks grouped by identical stack, smallest group first (the odd ones out)."""
        by_key: dict[str, list[RankStack]] = {}
        for rank in self.ranks:
            by_key.setdefault(_key(rank), []).append(rank)
        return sorted(by_key.values(), key=lambda group: (len(group), min(r.rank or 0 for r in group)))

    def classes(self) -> list[StackClass]:
        """The ranks in classes by their main thread's path (``stackclasses``), the largest first; ranks of the
        world without a stack are classes of their own, by the reason."""
        paths, missing = {}, {}
        parsed: dict[str, tuple] = {}  # stacks alike but for process and thread ids are parsed once
        for entry in self.ranks:
            if entry.rank is None:
                continue
            if entry.stack:
                key = _key(entry)
                if key not in parsed:
                    parsed[key] = main_path(entry.stack)
                paths[entry.rank] = parsed[key]
            else:
                missing[entry.rank] = entry.error or "py-spy gave nothing"
        for rank in range(self.world_size or 0):
            if rank not in paths and rank not in missing:
                node = self.node_of(rank)
                missing[rank] = ("its node did not answer (stacks not taken)" if node is not None and node in self.unreached
                                 else "no rank process was found")
        return classify(paths, missing)

    def node_of(self, rank: int) -> int | None:
        """The rank's node: where its stack was taken, else where the supervisor saw it, else the plan's
        (``ranks_per_node``: every node of the plan holds as many)."""
        for entry in self.ranks:
            if entry.rank == rank:
                return entry.node
        seen = self.activity.get(rank)
        if seen and isinstance(seen.get("node"), int):
            return seen["node"]
        if self.world_size and self.hosts and self.world_size % len(self.hosts) == 0:
            return rank // (self.world_size // len(self.hosts))
        return None

    def apart(self, classes: list[StackClass] | None = None) -> list[StackClass]:
        """The classes that stand apart: every class but the largest, when the largest holds more than half the
        ranks (in a hang the crowd waits in the collective; the few elsewhere are the suspects). ``classes``:
        ``classes()``'s answer, when the caller has it already."""
        classes = self.classes() if classes is None else classes
        total = sum(len(c.ranks) for c in classes)
        if len(classes) < 2 or 2 * len(classes[0].ranks) <= total:
            return []
        return classes[1:]

    @property
    def odd_one_out(self) -> str | None:
        """"rank 3 on node 1 (h2) stands apart: its stack differs from the other N" (a few ranks named), or None."""
        classes = self.classes()
        apart = [c for c in self.apart(classes) if c.reason is None]
        ranks = sorted(r for c in apart for r in c.ranks)
        if not ranks or len(ranks) > APART_SHOWN:
            return None
        others = sum(len(c.ranks) for c in classes) - len(ranks)
        if len(ranks) == 1:
            node = self.node_of(ranks[0])
            return f"rank {ranks[0]} on node {node} ({self.host(node)}) stands apart: its stack differs from the other {others}"
        nodes = sorted({n for r in ranks if (n := self.node_of(r)) is not None})
        where = ", ".join(f"{n} ({self.host(n)})" for n in nodes)
        return f"ranks {ranges(ranks)} on node(s) {where} stand apart: their stacks differ from the other {others}"

    @property
    def on_build_lock(self) -> str | None:
        """"ranks 0-3 wait on torch's build lock ..." when ranks' main threads are in torch's FileBaton.wait, else
        None: the file a killed JIT build leaves (pytorch/pytorch#189245) holds them for ever, idle."""
        waiting = sorted(r.rank for r in self.ranks if r.rank is not None and r.stack
                         and (path := main_path(r.stack)) and path[-1].file.endswith(BUILD_LOCK_FILE))
        if not waiting:
            return None
        return (f"rank(s) {ranges(waiting)} wait on torch's build lock of a JIT-built op (torch's FileBaton.wait): "
                "a build killed on the node leaves TORCH_EXTENSIONS_DIR/<op>/lock and every load waits on it for ever "
                "(pytorch/pytorch#189245); remove the file if no build runs there")

    def host(self, node: int | None) -> str:
        if node is not None and 0 <= node < len(self.hosts):
            return self.hosts[node]
        return next((r.host for r in self.ranks if r.node == node), "?")


def _key(rank: RankStack) -> str:
    if not rank.stack:
        return f"(no stack: {rank.error})"
    return _PROCESS.sub("", _THREAD_ID.sub("Thread", rank.stack)).strip()


def collect(backend: Backend, plan: Plan, store: Store | None, attempt: int, live: Liveness | None = None) -> StackReport:
    """Take every rank's stack on every node in parallel; saved with the job when ``store`` is given, with
    what ``live`` (the supervisor's view of the attempt) and the node logs say of each rank and node."""
    now = time.time()
    report = StackReport(taken_at=now, attempt=attempt, world_size=plan.world_size,
                         hosts=[node.host for node in plan.nodes], gpus=[node.gpus for node in plan.nodes])
    dumps: dict[int, dict] = {}
    since = _job_created(store, plan.job_id)
    for index, answer, error in backend.stacks(plan):
        host = plan.nodes[index].host
        if answer is None:
            report.problems.append(f"node {index} ({host}): stacks not taken: {error}")
            report.unreached[index] = str(error)[:300]
            continue
        report.ranks += [RankStack(index, r.get("rank"), host, r.get("pid"), r.get("stack"), r.get("error"),
                                   r.get("local_rank")) for r in answer.get("ranks", [])]
        if answer.get("nccl_traces"):
            report.nccl_traces[index] = list(answer["nccl_traces"])
        report.problems += [f"node {index} ({host}): {p}" for p in answer.get("flight_problems") or []][:4]
        for rank, dump in (answer.get("flight") or {}).items():
            if str(rank).isdigit() and isinstance(dump, dict):
                dumps[int(rank)] = dump
        report.nodes[index] = {"kernel": _recent(answer.get("kernel") or [], since), "last_output": None}
    report.ranks.sort(key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.node))
    if live is not None:
        report.activity = {rank: {"node": seen.node, "idle_s": None if seen.active_at is None else now - seen.active_at,
                                  "step": seen.step} for rank, seen in live.ranks.items()}
    if store is not None:
        run_dir = store.run_dir(plan.job_id)
        for node in plan.nodes:
            last = last_output(run_dir / f"attempt{attempt}-node{node.index}.log")
            report.nodes.setdefault(node.index, {"kernel": [], "last_output": None})["last_output"] = last
    if dumps:
        from launcher.run import flightrecorder  # torch, lazily: only when ranks left dumps

        report.flight = flightrecorder.analyse(dumps, plan.world_size)
    if store is not None:
        path = store.run_dir(plan.job_id) / f"stacks-attempt{attempt}.json"
        path.write_text(json.dumps(asdict(report), indent=1))
        store.add_event(plan.job_id, "stacks", f"stacks of {len(report.ranks)} rank(s) taken: {path}")
    return report


def for_job(store: Store, ref: str) -> StackReport:
    """`launch stacks`: a running job's stacks, taken now and kept with it; a finished job's kept ones (LaunchError
    when none were taken)."""
    from launcher.backends import get_backend
    from launcher.errors import LaunchError
    from launcher.run.recorded import RecordedJob

    row = store.job(ref)
    if row.terminal:
        report = latest(store.run_dir(row.id))
        if report is None:
            raise LaunchError(f"job {row.id} ended {row.state} and no stacks were taken; stacks are taken from "
                              "running jobs, and from hung or stalled ones before they are torn down")
        return report
    job = RecordedJob.read(store, row.id)
    backend = get_backend(job.cluster)
    try:
        return collect(backend, job.plan, store, row.attempt or 0)
    finally:
        backend.close()


def _job_created(store: Store | None, job_id: str) -> float | None:
    if store is None:
        return None
    try:
        created = store.job(job_id).created_at
    except Exception:  # noqa: BLE001 - no filter then
        return None
    return float(created) if isinstance(created, (int, float)) else None


def _recent(lines: list, since: float | None) -> list[str]:
    """Kernel-log lines written since the job was submitted (lines without a time are kept)."""
    kept = []
    for line in lines:
        if not isinstance(line, str):
            continue
        stamp = _KERNEL_TIME.match(line)
        if since is not None and stamp:
            try:
                zone = (stamp[2] or "").replace(":", "")
                when = datetime.strptime(stamp[1] + zone, "%Y-%m-%dT%H:%M:%S" + ("%z" if zone else "")).timestamp()
            except ValueError:
                when = None
            if when is not None and when < since - 1:
                continue
        kept.append(line[:300])
    return kept


def last_output(log: Path) -> list | None:
    """``[t, line]``: the last line a node's log file has (``t`` when the supervisor got it), or None."""
    try:
        with open(log, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - LAST_OUTPUT_BYTES))
            data = handle.read()
    except OSError:
        return None
    for raw in reversed(data.split(b"\n")):
        stamp, _, text = raw.decode("utf-8", "replace").partition(" ")
        try:
            return [float(stamp), text[:300]]
        except ValueError:
            continue
    return None


def latest(run_dir: Path) -> StackReport | None:
    """The newest stack report kept in a job's run directory, or None."""
    files = sorted(run_dir.glob("stacks-attempt*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None
    try:
        data = json.loads(files[-1].read_text())
        ranks = [RankStack(**r) for r in data.pop("ranks")]
        for key in ("nccl_traces", "unreached", "activity", "nodes"):
            data[key] = {int(k): v for k, v in data.get(key, {}).items()}
        return StackReport(ranks=ranks, **data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def report_lines(report: StackReport) -> list[str]:
    """The report as text (`launch stacks`): each class of ranks with the stack of its first rank, the largest
    class first, the ranks that stand apart named (plain text, no markup)."""
    classes = report.classes()
    lines = [f"stacks of {len(report.ranks)} rank(s) in {len(classes)} class(es), attempt {report.attempt}, "
             f"taken {time.strftime('%H:%M:%S', time.localtime(report.taken_at))}"]
    lines.extend(f"  {note}" for note in (report.odd_one_out, report.on_build_lock) if note)
    by_rank = {r.rank: r for r in report.ranks}
    for cls in classes:
        if len(cls.ranks) <= APART_SHOWN:
            where = ", ".join(f"rank {r} (node {report.node_of(r)} {report.host(report.node_of(r))})" for r in cls.ranks)
        else:
            nodes = sorted({n for r in cls.ranks if (n := report.node_of(r)) is not None})
            where = f"ranks {ranges(cls.ranks)} on {len(nodes)} node(s)"
        lines.append(f"  {len(cls.ranks)} rank(s): {where}: {cls.label}")
        first = by_rank.get(cls.ranks[0])
        body = first.stack if first is not None and first.stack else f"(no stack: {cls.reason})"
        lines.extend("    " + line for line in body.strip().splitlines()[:40])
    lines.extend(f"  {problem}" for problem in report.problems)
    for node, traces in report.nccl_traces.items():
        lines.append(f"  node {node}: NCCL flight recorder dumps: {', '.join(traces)}")
    return lines


def json_entries(report: StackReport) -> list[dict]:
    """``status --json``'s ``stacks``: one ``{node, rank, host, stack}`` per rank (``stack``: text or why none)."""
    return [{"node": r.node, "rank": r.rank, "host": r.host, "stack": r.stack or f"(no stack: {r.error})"}
            for r in report.ranks]
