"""Every rank's Python stack, taken from outside on every node, grouped so the odd rank stands out.

Used before a hung or stalled job is torn down, and by `launch stacks JOB` on a running one.
The node side (``launcher.node.stacks``) runs py-spy on each rank; here the answers are grouped
by identical stack (thread ids and addresses left out), the smallest groups first: in a hang
the one rank that is not in the collective is the group of one. The report is kept with the
job as ``stacks-attemptN.json`` in its run directory, which `launch status` reads.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.backends.base import Backend
    from launcher.plan.planner import Plan
    from launcher.store.db import Store

_THREAD_ID = re.compile(r"Thread (0x[0-9A-Fa-f]+|\d+)")
_PROCESS = re.compile(r"^Process \d+:.*$", re.M)


@dataclass
class RankStack:
    node: int
    rank: int | None
    host: str
    pid: int | None
    stack: str | None
    error: str | None = None


@dataclass
class StackReport:
    taken_at: float
    attempt: int
    ranks: list[RankStack] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    nccl_traces: dict[int, list[str]] = field(default_factory=dict)

    def groups(self) -> list[list[RankStack]]:
        """Ranks grouped by identical stack, smallest group first (the odd ones out)."""
        by_key: dict[str, list[RankStack]] = {}
        for rank in self.ranks:
            by_key.setdefault(_key(rank), []).append(rank)
        return sorted(by_key.values(), key=lambda group: (len(group), min(r.rank or 0 for r in group)))

    @property
    def odd_one_out(self) -> str | None:
        """"rank 3 on node 1 stands apart from the other N" when exactly one group of one differs."""
        groups = [g for g in self.groups() if g[0].stack]
        if len(groups) < 2 or len(groups[0]) != 1 or len(groups[1]) == 1:
            return None
        odd = groups[0][0]
        others = len(self.ranks) - 1
        return f"rank {odd.rank} on node {odd.node} ({odd.host}) stands apart: its stack differs from the other {others}"


def _key(rank: RankStack) -> str:
    if not rank.stack:
        return f"(no stack: {rank.error})"
    return _PROCESS.sub("", _THREAD_ID.sub("Thread", rank.stack)).strip()


def collect(backend: Backend, plan: Plan, store: Store | None, attempt: int) -> StackReport:
    """Take every rank's stack on every node in parallel; saved with the job when ``store`` is given."""
    report = StackReport(taken_at=time.time(), attempt=attempt)
    for index, answer, error in backend.stacks(plan):
        host = plan.nodes[index].host
        if answer is None:
            report.problems.append(f"node {index} ({host}): stacks not taken: {error}")
            continue
        report.ranks += [RankStack(index, r.get("rank"), host, r.get("pid"), r.get("stack"), r.get("error"))
                         for r in answer.get("ranks", [])]
        if answer.get("nccl_traces"):
            report.nccl_traces[index] = list(answer["nccl_traces"])
    report.ranks.sort(key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.node))
    if store is not None:
        path = store.run_dir(plan.job_id) / f"stacks-attempt{attempt}.json"
        path.write_text(json.dumps(asdict(report), indent=1))
        store.add_event(plan.job_id, "stacks", f"stacks of {len(report.ranks)} rank(s) taken: {path}")
    return report


def latest(run_dir: Path) -> StackReport | None:
    """The newest stack report kept in a job's run directory, or None."""
    files = sorted(run_dir.glob("stacks-attempt*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None
    try:
        data = json.loads(files[-1].read_text())
        ranks = [RankStack(**r) for r in data.pop("ranks")]
        data["nccl_traces"] = {int(k): v for k, v in data.get("nccl_traces", {}).items()}
        return StackReport(ranks=ranks, **data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def report_lines(report: StackReport) -> list[str]:
    """The report as text: ranks grouped by identical stack, odd ones out first (plain text, no markup)."""
    lines = [f"stacks of {len(report.ranks)} rank(s), attempt {report.attempt}, "
             f"taken {time.strftime('%H:%M:%S', time.localtime(report.taken_at))}"]
    if report.odd_one_out:
        lines.append(f"  {report.odd_one_out}")
    for group in report.groups():
        where = ", ".join(f"rank {r.rank} (node {r.node} {r.host})" for r in group)
        lines.append(f"  {len(group)} rank(s): {where}")
        first = group[0]
        body = first.stack or f"(no stack: {first.error})"
        lines.extend("    " + line for line in body.strip().splitlines()[:40])
    lines.extend(f"  {problem}" for problem in report.problems)
    for node, traces in report.nccl_traces.items():
        lines.append(f"  node {node}: NCCL flight recorder dumps: {', '.join(traces)}")
    return lines


def json_entries(report: StackReport) -> list[dict]:
    """``status --json``'s ``stacks``: one ``{node, rank, host, stack}`` per rank (``stack``: text or why none)."""
    return [{"node": r.node, "rank": r.rank, "host": r.host, "stack": r.stack or f"(no stack: {r.error})"}
            for r in report.ranks]
