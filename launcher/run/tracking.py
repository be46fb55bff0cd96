"""The supervisor's mirror of a job into experiment trackers (the spec's ``tracking:``): one run per tracker.

Every ``EVERY_S`` the mirror reads what the store has after each tracker's cursor (metric records, events) and
sends it; the cursor (``tracking.json`` in the run directory) moves only once the tracker took it. So a tracker that
fails gets the same again at the next sync (its failure is an event of the job, once per distinct problem, never the
job's failure), and a supervisor that attaches resumes the same run from the cursor: nothing is written twice.

A step is sent once every rank seen has reported it or a later step (or the job ended): the job's aggregate
(samples/s and tokens/s summed over the ranks, the slowest step time, the mean loss, the largest peak memory), and
each rank's figures where ``per_rank`` asks.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from launcher.metrics.record import MetricRecord
from launcher.plan.shell import MASK, mask
from launcher.spec.tracking import TrackingSpec
from launcher.store.db import Store
from launcher.store.states import JobState

#: Seconds between two syncs of a running job.
EVERY_S = 5.0
#: At the end, how long the last sync may keep trying a failing tracker before the job's end goes on without it.
CLOSE_TRIES, CLOSE_PAUSE_S = 3, 2.0
CURSORS = "tracking.json"
MAX_VALUE = 500  # a parameter's or an event's text, bounded
LAG = 4  # steps after which a rank that sent no record is taken not to report
FIGURES = ("samples_per_sec", "tokens_per_sec", "step_time_s", "loss", "mem_peak_bytes", "gpu_util")


@dataclass(frozen=True)
class Step:
    """One step of one attempt, as a tracker receives it: the job's figures, and each rank's where asked."""

    attempt: int
    step: int
    t: float
    metrics: dict[str, float]


@dataclass(frozen=True)
class RunInfo:
    """What a run opens with: the spec and plan as parameters (secrets masked), and the job's tags."""

    name: str
    params: dict[str, str]
    tags: dict[str, str]


class Tracker(Protocol):
    """One tracker's run. Each call either took everything it was given or raised."""

    name: str

    def open(self, run_id: str | None, info: RunInfo) -> str:
        """Open the run ``run_id`` again (attach), else a new one with ``info``; the run's id."""

    def steps(self, steps: list[Step]) -> None: ...

    def events(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        """The job's events (row id, {t, kind, message}) as tags or notes."""

    def tags(self, tags: dict[str, str]) -> None: ...

    def close(self, summary: dict[str, float], state: JobState) -> None:
        """The final summary, and the run ended as the job did."""


@dataclass
class Cursor:
    """How far one tracker's run has been sent: every record up to row ``records`` and of steps up to
    (``attempt``, ``step``), every event up to row ``events``."""

    run_id: str | None = None
    records: int = 0
    attempt: int = 0
    step: int = -1
    events: int = 0
    closed: bool = False


def read_cursors(run_dir: Path) -> dict[str, Cursor]:
    try:
        data = json.loads((run_dir / CURSORS).read_text(encoding="utf-8"))
        return {name: Cursor(**value) for name, value in data.items()}
    except (OSError, ValueError, TypeError):
        return {}


def write_cursors(run_dir: Path, cursors: Mapping[str, Cursor]) -> None:
    path = run_dir / CURSORS
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({name: asdict(c) for name, c in cursors.items()}), encoding="utf-8")
    temporary.replace(path)


def flat_params(value: Any, prefix: str = "") -> dict[str, str]:
    """Nested spec data as ``a.b.c`` -> text (lists joined), each value bounded."""
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for key, inner in value.items():
            out.update(flat_params(inner, f"{prefix}{key}."))
        return out
    if value is None or value == [] or value == {}:
        return {}
    text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return {prefix.rstrip("."): text[:MAX_VALUE]}


def run_info(job_name: str, job_id: str, spec: Mapping[str, Any], plan: Any, secrets: Mapping[str, str]) -> RunInfo:
    """The parameters (spec.*, plan.*) and tags of a job's run: no secret value, no environment value of a secret name."""
    from launcher.views.render import masked_env

    shown = dict(spec)
    if isinstance(shown.get("env"), dict):
        shown["env"] = masked_env(shown["env"], tuple(secrets) + tuple(shown.get("secrets") or ()))
    planned = {key: getattr(plan, key, None) for key in ("backend", "cluster_name", "launcher", "strategy", "precision",
                                                          "nnodes", "nproc_per_node", "world_size", "max_steps", "batch")}
    batch = planned["batch"]
    planned["batch"] = batch.model_dump(mode="json") if batch is not None else None
    params = {k: mask(v, secrets) for k, v in {**flat_params(shown, "spec."), **flat_params(planned, "plan.")}.items()}
    tags = {"launch.job_id": job_id, "launch.cluster": str(plan.cluster_name or ""), "launch.backend": str(plan.backend),
            "launch.strategy": str(plan.strategy or ""), "launch.attempt": "0"}
    return RunInfo(job_name, params, tags)


def step_figures(records: list[MetricRecord], per_rank: bool) -> dict[str, float]:
    """One step's figures over its ranks' records (the job's), and each rank's where asked."""
    def values(name: str) -> list[float]:
        return [float(v) for r in records if (v := getattr(r, name)) is not None]

    out: dict[str, float] = {}
    for name, combine in (("samples_per_sec", sum), ("tokens_per_sec", sum), ("step_time_s", max), ("loss", statistics.fmean),
                          ("mem_peak_bytes", max), ("gpu_util", statistics.fmean)):
        found = values(name)
        if found and (name != "tokens_per_sec" or any(found)):
            out[name] = float(combine(found))
    if per_rank:
        for record in records:
            for name in FIGURES:
                value = getattr(record, name)
                if value is not None:
                    out[f"rank_{record.rank}/{name}"] = float(value)
    return out


def ready_steps(rows: list[tuple[int, MetricRecord]], cursor: Cursor, ranks: int, final: bool,
                per_rank: bool) -> tuple[list[Step], int]:
    """The steps to send after ``cursor`` from the records read (row id, record), in order, and the row through which
    every record is then sent. Unless ``final``, a step waits until each of the job's ``ranks`` reported it or a later
    step; a rank with no record among those read stops counting once they span ``LAG`` steps (it does not report)."""
    groups: dict[tuple[int, int], list[tuple[int, MetricRecord]]] = {}
    latest: dict[int, tuple[int, int]] = {}
    for row, record in rows:
        if record.warmup or (record.attempt, record.step) <= (cursor.attempt, cursor.step):
            continue
        groups.setdefault((record.attempt, record.step), []).append((row, record))
        latest[record.rank] = max(latest.get(record.rank, (-1, -1)), (record.attempt, record.step))
    silent_counts = len(groups) < LAG
    done = min([*latest.values(), *([(-1, -1)] if silent_counts and len(latest) < ranks else [])], default=(-1, -1))
    steps: list[Step] = []
    through = rows[-1][0] if rows else cursor.records
    for key in sorted(groups):
        if not final and key > done:
            through = min(row for group in groups.values() for row, r in group if (r.attempt, r.step) >= key) - 1
            break
        records = [r for _, r in groups[key]]
        steps.append(Step(key[0], key[1], max(r.t or 0.0 for r in records) or time.time(), step_figures(records, per_rank)))
    return steps, max(through, cursor.records)


@dataclass
class Mirror:
    """Sends a job to its trackers from the supervisor: ``start`` (also on attach), then ``close`` at its end."""

    store: Store
    job_id: str
    run_dir: Path
    info: RunInfo
    spec: TrackingSpec
    trackers: list[Tracker]
    secrets: Mapping[str, str] = field(default_factory=dict)
    ranks: int = 1
    every_s: float = EVERY_S
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _filed: dict[str, str] = field(default_factory=dict)
    _cursors: dict[str, Cursor] = field(default_factory=dict)

    def start(self) -> None:
        self._cursors = read_cursors(self.run_dir)
        self._thread = threading.Thread(target=self._loop, name="launch-tracking", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop syncing (a newer supervisor took the job: it goes on from the cursor)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def close(self, state: JobState) -> None:
        """The last records and events, the summary, the run ended; a tracker still failing after ``CLOSE_TRIES`` is
        left (its failure filed)."""
        self.stop()
        for tracker in self.trackers:
            for attempt in range(CLOSE_TRIES):
                if self._sync(tracker, final=True, state=state):
                    break
                if attempt + 1 < CLOSE_TRIES:
                    time.sleep(CLOSE_PAUSE_S)

    def _loop(self) -> None:
        """Open the runs at once, then sync every ``every_s``."""
        while True:
            for tracker in self.trackers:
                if self._stop.is_set():
                    return
                self._sync(tracker, final=False)
            if self._stop.wait(self.every_s):
                return

    def _sync(self, tracker: Tracker, final: bool, state: JobState | None = None) -> bool:
        """Send what ``tracker`` has not taken yet; False (and the problem filed once) where it failed."""
        with self._lock:
            cursor = self._cursors.setdefault(tracker.name, Cursor())
            if cursor.closed:
                return True
            try:
                self._send(tracker, cursor, final, state)
            except Exception as exc:  # noqa: BLE001 - a tracker's failure is the job's event, never its failure
                self._file(tracker.name, exc)
                return False
            self._filed.pop(tracker.name, None)
            return True

    def _send(self, tracker: Tracker, cursor: Cursor, final: bool, state: JobState | None) -> None:
        if cursor.run_id is None:
            cursor.run_id = tracker.open(None, self.info)
            self._save()
        elif not getattr(tracker, "run_id", None):
            tracker.open(cursor.run_id, self.info)
        while True:
            rows = self.store.metrics_after(self.job_id, cursor.records)
            steps, through = ready_steps(rows, cursor, self.ranks, final, self.spec.per_rank)
            if steps:
                tracker.steps(steps)
                if steps[-1].attempt != cursor.attempt:
                    tracker.tags({"launch.attempt": str(steps[-1].attempt)})
                cursor.attempt, cursor.step = steps[-1].attempt, steps[-1].step
            cursor.records = through
            self._save()
            if len(rows) < 10_000:
                break
        events = [(row, {**event, "message": mask(event["message"], self.secrets)})
                  for row, event in self.store.events_after(self.job_id, cursor.events)
                  if event["kind"] != "tracking_failed"]
        if events:
            tracker.events(events)
            cursor.events = events[-1][0]
            self._save()
        if final and state is not None:
            row = self.store.job(self.job_id)
            summary = {k: float(v) for k, v in (row.summary or {}).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            tracker.close(summary, state)
            cursor.closed = True
            self._save()

    def _save(self) -> None:
        write_cursors(self.run_dir, self._cursors)

    def _file(self, name: str, exc: Exception) -> None:
        text = mask(f"{type(exc).__name__}: {exc}", self.secrets).replace("\n", " ")[:MAX_VALUE]
        if self._filed.get(name) != text:
            self._filed[name] = text
            self.store.add_event(self.job_id, "tracking_failed", f"{name}: {text} (tried again at the next sync)")


def make_mirror(store: Store, spec: TrackingSpec, job: Mapping[str, Any], plan: Any, secrets: Mapping[str, str],
                trackers: Callable[[TrackingSpec, Path], list[Tracker]]) -> Mirror:
    """The mirror of a job whose spec has ``tracking:``, to the ``trackers`` made for it (``trackers.configured``)."""
    run_dir = store.run_dir(plan.job_id)
    return Mirror(store, plan.job_id, run_dir, run_info(plan.job_name, plan.job_id, job, plan, secrets), spec,
                  trackers(spec, run_dir), secrets, plan.world_size)


__all__ = ["MASK", "Mirror", "Step", "Tracker", "make_mirror", "ready_steps", "run_info"]
