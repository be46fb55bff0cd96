"""A hung or stalled job's verdict on one screen, for 8 ranks or 1,000 (`launch status JOB`).

What it says, from the stack report kept with the job (``launcher.views.stacks``) and the store:
where the job stopped (the reason's head), the ranks in classes by stack (STAT's prefix tree, ranks as
ranges, the largest class first), the ranks that stand apart and their nodes, each suspect node's
evidence side by side with the other nodes' (its ranks' CPU/GPU activity, its last output, its kernel
log's Xid and similar lines), PyTorch's flight-recorder analysis when ranks left dumps, and what launch
did. At most ``SCREEN`` lines whatever the job's size: long lists are cut with a count, and
``status --json``'s ``verdict`` has everything (``verdict_json``). Plain text: the caller prints it
through ``safe_text``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from launcher.store.rows import JobRow
from launcher.views.stackclasses import StackClass, ranges
from launcher.views.stacks import StackReport

SCREEN = 40
CLASSES_SHOWN = 8
SUSPECTS_SHOWN = 4
FLIGHT_SHOWN = 3
RANGE_WIDTH = 60
_KERNEL_STAMP = re.compile(r"^\S*\d{4}-\d\d-\d\dT\S+\s+")
_DEVICES = re.compile(r"GPUs? ([\d,\-]+)")


def verdict_lines(report: StackReport, row: JobRow, events: Sequence[dict[str, Any]],
                  devices: dict[int, list[int]] | None = None) -> list[str]:
    """The verdict, at most ``SCREEN`` lines."""
    devices = devices if devices is not None else leased_devices(events)
    classes = report.classes()
    taken = time.strftime("%H:%M:%S", time.localtime(report.taken_at))
    lines = [f"verdict: {_head(row)} (attempt {report.attempt}; stacks of {report.counted(classes)} taken {taken})"]
    lines.append(f"stacks: {len(classes)} class(es) by the main thread's frames (outermost first), the largest first:")
    for cls in classes[:CLASSES_SHOWN]:
        lines.append(f"  {_who(report, cls, devices)}: {cls.label}")
    if len(classes) > CLASSES_SHOWN:
        rest = classes[CLASSES_SHOWN:]
        lines.append(f"  ... {len(rest)} more class(es) of {sum(len(c.ranks) for c in rest)} rank(s) "
                     f"(status --json: verdict.classes)")
    apart = report.apart(classes)
    lines.append(_apart_line(report, apart, classes))
    lines += _suspect_lines(report, apart)
    lines += _flight_lines(report.flight)
    lines.append(f"action: {_action(report, row, events)}")
    lines.append(f"every class with its frames: launch status {row.id or 'JOB'} --json (verdict.classes); "
                 f"full stacks: launch stacks {row.id or 'JOB'}")
    return lines[:SCREEN]


def verdict_json(report: StackReport, row: JobRow, events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``status --json``'s ``verdict``: every class, the ranks apart, every suspect node's evidence, the flight
    recorder's analysis and the action."""
    classes = report.classes()
    apart = report.apart(classes)
    return {
        "head": _head(row), "attempt": report.attempt, "taken_at": report.taken_at,
        "classes": [c.as_json() for c in classes],
        "apart": sorted(r for c in apart for r in c.ranks),
        "suspects": [_evidence(report, node, _apart_ranks(report, apart)) for node in _suspects(report, apart)],
        "flight_recorder": report.flight,
        "action": _action(report, row, events),
        "problems": report.problems,
    }


def leased_devices(events: Sequence[dict[str, Any]]) -> dict[int, list[int]]:
    """Each node's leased GPUs (``leased`` events: ``GPUs 4-7``), so a local rank names its GPU."""
    found: dict[int, list[int]] = {}
    for event in events:
        data = event.get("data") if event.get("kind") == "leased" else None
        if not isinstance(data, dict) or not isinstance(data.get("node"), int):
            continue
        match = _DEVICES.search(str(data.get("devices", "")))
        if match:
            numbers: list[int] = []
            for part in match[1].split(","):
                low, _, high = part.partition("-")
                if low.isdigit() and (not high or high.isdigit()):
                    numbers += range(int(low), int(high or low) + 1)
            found[data["node"]] = numbers
    return found


def _head(row: JobRow) -> str:
    """The reason's first clause: ``hung before the first step``, ``stalled at step 41 on node 3/rank 24``."""
    reason = row.reason or ""
    return reason.split(":", 1)[0][:120] if reason else "stacks taken on request"


def _who(report: StackReport, cls: StackClass, devices: dict[int, list[int]]) -> str:
    if len(cls.ranks) == 1:
        return f"rank {cls.ranks[0]} ({_where(report, cls.ranks[0], devices)})"
    text = ranges(cls.ranks)
    if len(text) > RANGE_WIDTH:
        text = text[:RANGE_WIDTH].rsplit(",", 1)[0] + ",..."
    if len(cls.ranks) <= 3:
        nodes = sorted({n for r in cls.ranks if (n := report.node_of(r)) is not None})
        where = f"node {nodes[0]} {report.host(nodes[0])}" if len(nodes) == 1 else f"nodes {ranges(nodes)}"
        return f"ranks {text} ({where})" if nodes else f"ranks {text}"
    return f"ranks {text}"


def _where(report: StackReport, rank: int, devices: dict[int, list[int]]) -> str:
    node = report.node_of(rank)
    if node is None:
        return "node unknown"
    local = next((r.local_rank for r in report.ranks if r.rank == rank), None)
    gpus = devices.get(node) or (list(range(report.gpus[node])) if node < len(report.gpus) and report.gpus[node] else [])
    if local is None:
        unit = ""
    elif gpus:
        unit = f", gpu{gpus[local]}" if local < len(gpus) else f", local rank {local}"
    else:
        unit = f", local rank {local}"
    return f"node {node} {report.host(node)}{unit}"


def _apart_ranks(report: StackReport, apart: list[StackClass]) -> set[int]:
    return {r for c in apart for r in c.ranks}


def _apart_line(report: StackReport, apart: list[StackClass], classes: list[StackClass]) -> str:
    if len(classes) == 1:
        return "stand apart: none by stack (every rank is at the same place: the evidence below compares the nodes)"
    if not apart:
        return "stand apart: none by stack (no class holds most ranks)"
    ranks = sorted(_apart_ranks(report, apart))
    nodes = sorted({n for r in ranks if (n := report.node_of(r)) is not None})
    shown = ", ".join(f"{n} ({report.host(n)})" for n in nodes[:SUSPECTS_SHOWN])
    more = f", ... {len(nodes) - SUSPECTS_SHOWN} more" if len(nodes) > SUSPECTS_SHOWN else ""
    label = "rank" if len(ranks) == 1 else "ranks"
    return (f"stand apart: {label} {_cut(ranges(ranks), RANGE_WIDTH)} of {sum(len(c.ranks) for c in classes)}, "
            f"on node{'s' if len(nodes) != 1 else ''} {shown}{more}")


def _suspects(report: StackReport, apart: list[StackClass]) -> list[int]:
    """Nodes to look at, most telling first: ranks apart, then kernel-log lines, then nodes that did not answer."""
    counts: dict[int, int] = {}
    for rank in _apart_ranks(report, apart):
        node = report.node_of(rank)
        if node is not None:
            counts[node] = counts.get(node, 0) + 1
    kernel = [n for n, seen in report.nodes.items() if seen.get("kernel")]
    order = sorted(counts, key=lambda n: (-counts[n], n))
    order += [n for n in sorted(kernel) if n not in order]
    order += [n for n in sorted(report.unreached) if n not in order]
    return order


def _ranks_of(report: StackReport, node: int) -> list[int]:
    """The node's ranks (where their stacks were taken, or where the supervisor saw them); one pass for all."""
    by_node: dict[int, set[int]] | None = getattr(report, "_by_node", None)
    if by_node is None:
        by_node = {}
        for entry in report.ranks:
            if entry.rank is not None:
                by_node.setdefault(entry.node, set()).add(entry.rank)
        for rank, seen in report.activity.items():
            if isinstance(seen.get("node"), int):
                by_node.setdefault(seen["node"], set()).add(rank)
        setattr(report, "_by_node", by_node)  # noqa: B010 - a memo beside the report's fields, never saved
    return sorted(by_node.get(node, ()))


def _evidence(report: StackReport, node: int, apart: set[int]) -> dict[str, Any]:
    ranks = _ranks_of(report, node)
    seen = report.nodes.get(node, {})
    idle = {r: report.activity[r].get("idle_s") for r in ranks if r in report.activity}
    return {"node": node, "host": report.host(node), "ranks": ranks, "apart": sorted(set(ranks) & apart),
            "idle_s": idle, "last_output": seen.get("last_output"), "kernel": seen.get("kernel") or [],
            "unreached": report.unreached.get(node)}


def _suspect_lines(report: StackReport, apart: list[StackClass]) -> list[str]:
    suspects = _suspects(report, apart)
    if not suspects:
        return ["suspect nodes: none (no rank apart, no kernel-log line, every node answered)"]
    apart_ranks = _apart_ranks(report, apart)
    shown = suspects[:SUSPECTS_SHOWN]
    others = [n for n in range(len(report.hosts)) if n not in suspects]
    header = f"  {'NODE':<16} {'RANKS':<14} {'CPU/GPU':<16} {'LAST OUTPUT':<11} KERNEL LOG"
    beside = f", side by side with the {len(others)} other node(s)" if others else ""
    lines = [f"suspect nodes{beside}:", header]
    details = []
    for node in shown:
        ev = _evidence(report, node, apart_ranks)
        kernel = ev["kernel"]
        name = f"{node} {ev['host']}"
        lines.append(f"  {_cell(name, 16)} {_cell(ranges(ev['ranks']) or '-', 14)} "
                     f"{_cell(_activity(ev['idle_s'].values(), ev['ranks']), 16)} "
                     f"{_cell(_age(report, ev['last_output']), 11)} "
                     f"{_cut(_short_kernel(kernel[-1]), 60) if kernel else ('unreachable' if ev['unreached'] else 'nothing')}"
                     + (f" (+{len(kernel) - 1})" if len(kernel) > 1 else ""))
        busy = _busier(ev["idle_s"])
        if busy:
            details.append(f"    node {node} CPU/GPU: {busy}")
        last = ev["last_output"]
        if last:
            details.append(f"    node {node} last output: {_cut(str(last[1]), 110)}")
        if kernel:
            details.append(f"    node {node} kernel: {_short_kernel(kernel[-1])}")
        if ev["unreached"]:
            details.append(f"    node {node} did not answer: {_cut(str(ev['unreached']), 100)}")
    if others:
        idle = [report.activity[r].get("idle_s") for n in others for r in _ranks_of(report, n) if r in report.activity]
        ranks = [r for n in others for r in _ranks_of(report, n)]
        ages = [report.taken_at - last[0] for n in others if (last := report.nodes.get(n, {}).get("last_output"))]
        kernel_quiet = sum(1 for n in others if not report.nodes.get(n, {}).get("kernel"))
        lines.append(f"  {_cell(f'others ({len(others)})', 16)} {_cell(ranges(ranks) or '-', 14)} "
                     f"{_cell(_activity(idle, ranks), 16)} {_cell(_span(ages, ' s ago'), 11)} "
                     f"{'nothing' if kernel_quiet == len(others) else f'{len(others) - kernel_quiet} with lines'}")
    if len(suspects) > SUSPECTS_SHOWN:
        lines.append(f"  ... {len(suspects) - SUSPECTS_SHOWN} more suspect node(s) (status --json: verdict.suspects)")
    return lines + details


def _activity(idle: Any, ranks: Sequence[int]) -> str:
    """``idle 300-312 s``: how long ago the node's ranks last gained CPU time or kept their GPU busy."""
    values = [v for v in idle if isinstance(v, (int, float))]
    if not values:
        return "no sample" if ranks else "-"
    unsampled = len(ranks) - len(values)
    return f"idle {_span(values, ' s')}" + (f", {unsampled} unsampled" if unsampled > 0 else "")


def _busier(idle: dict[int, Any]) -> str | None:
    """``rank 512 active 0 s ago, the node's other 7 idle 300 s``: the ranks of a node that worked much more
    recently than the rest (in a stalled job, the one still computing); None when they are alike."""
    known = {rank: v for rank, v in idle.items() if isinstance(v, (int, float))}
    if len(known) < 2 or max(known.values()) < 10:
        return None
    newest = max(known.values())
    active = sorted(rank for rank, v in known.items() if v < newest / 2)
    if not active or len(active) == len(known):
        return None
    rest = [v for rank, v in known.items() if rank not in active]
    label = "rank" if len(active) == 1 else "ranks"
    return (f"{label} {_cut(ranges(active), 40)} active {_span([known[r] for r in active], ' s')} ago, the node's "
            f"other {len(rest)} idle {_span(rest, ' s')}")


def _span(values: Sequence[float], unit: str) -> str:
    if not values:
        return "-"
    low, high = round(min(values)), round(max(values))
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def _age(report: StackReport, last: Any) -> str:
    if not last:
        return "none"
    return f"{max(0.0, report.taken_at - float(last[0])):.0f} s ago"


def _short_kernel(line: str) -> str:
    return _cut(_KERNEL_STAMP.sub("", line), 110)


def _cell(text: str, width: int) -> str:
    return _cut(text, width).ljust(width)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _flight_lines(flight: dict[str, Any] | None) -> list[str]:
    if not flight:
        return []
    ranks = flight.get("ranks") or []
    lines = [f"flight recorder: {flight.get('by')}, dumps of {len(ranks)} rank(s):"]
    found = flight.get("collectives") or []
    for collective in found[:FLIGHT_SHOWN]:
        missing, joined = collective.get("missing") or [], collective.get("joined") or []
        who = (f"{'rank' if len(missing) == 1 else 'ranks'} {_cut(ranges(missing), 40)} did not join "
               f"({len(joined)} of {len(missing) + len(joined)} did)") if missing else f"mismatch: {collective.get('mismatch')}"
        where = f", called at {collective['where']}" if collective.get("where") else ""
        lines.append(f"  {collective.get('name')} #{collective.get('seq')} in group {collective.get('group')}: {who}{where}")
    if not found:
        lines.append("  every rank joined every collective its dump holds")
    if flight.get("problem"):
        lines.append(f"  ({_cut(str(flight['problem']), 120)})")
    return lines


def _action(report: StackReport, row: JobRow, events: Sequence[dict[str, Any]]) -> str:
    """What launch did after taking the stacks, from the events filed since."""
    after = [e for e in events if isinstance(e.get("t"), (int, float)) and e["t"] >= report.taken_at - 1]
    kinds = {e.get("kind"): e for e in after}
    state = row.state
    if (state is None or not state.terminal) and "restarting" not in kinds:
        return f"none yet: stacks taken on request while the job is {state or 'running'}"
    nodes = f"its {len(report.hosts)} node(s)" if report.hosts else "its nodes"
    said = f"stacks taken, then every process of attempt {report.attempt} ended on {nodes}"
    sweep = [e for e in after if e.get("kind") == "sweep"]
    if sweep:
        said += f" (sweep: {_cut(str(sweep[0].get('message')), 80)})"
    if "restarting" in kinds:
        return f"{said}; restarted as attempt {report.attempt + 1}"
    for kind in ("node_left_out", "elastic_restart"):
        if kind in kinds:
            return f"{said}; {_cut(str(kinds[kind].get('message')), 100)}"
    why = f": {_cut(str(kinds['no_restart'].get('message')), 100)}" if "no_restart" in kinds else ""
    return f"{said}; job {state}, not restarted{why}"
