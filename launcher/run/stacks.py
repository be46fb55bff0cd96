"""Every rank's Python stack, taken from outside on every node (the report, read back and shown: ``views.stacks``).

Used before a hung or stalled job is torn down, and by `launch stacks JOB` on a running one.
The node side (``launcher.node.stacks``) runs py-spy on each rank. With the stacks is kept what launch
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
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.views.stacks import RankStack, StackReport, latest

if TYPE_CHECKING:
    from launcher.backends.base import Backend
    from launcher.plan.planner import Plan
    from launcher.run.liveness import Liveness
    from launcher.store.db import Store

_KERNEL_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[,.]\d+([+-]\d\d:?\d\d)?")
LAST_OUTPUT_BYTES = 8192


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
        store.add_event(plan.job_id, "stacks", f"stacks of {report.taken} rank(s) taken: {path}")
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


