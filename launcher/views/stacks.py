"""A stack report: every rank's Python stack and what launch saw of each node when they were taken, read back
and shown (`launch stacks`, `launch status JOB`); ``launcher.run.stacks`` takes them.

The ranks are grouped into classes by their main thread's path, as LLNL's STAT does (``stackclasses``: ranks
written as ranges, the largest class first, the ranks that stand apart named). The report is kept with the job as
``stacks-attemptN.json`` in its run directory.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.views.stackclasses import StackClass, classify, main_path, ranges

_THREAD_ID = re.compile(r"Thread (0x[0-9A-Fa-f]+|\d+)")
_PROCESS = re.compile(r"^Process \d+:.*$", re.M)
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

    @property
    def taken(self) -> int:
        """How many ranks' stacks were taken (the classes also hold the ranks of the world without one)."""
        return sum(1 for entry in self.ranks if entry.rank is not None and entry.stack)

    def counted(self, classes: list[StackClass]) -> str:
        """``8 rank(s)``, or ``1 of 2 rank(s)`` when some ranks of the classes have no stack."""
        total = sum(len(c.ranks) for c in classes)
        return f"{total} rank(s)" if self.taken == total else f"{self.taken} of {total} rank(s)"

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
    lines = [f"stacks of {report.counted(classes)} in {len(classes)} class(es), "
             f"attempt {report.attempt}, taken {time.strftime('%H:%M:%S', time.localtime(report.taken_at))}"]
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
