"""What node watchers hand the supervisor's loop, and the loop's filing of it: the one writer of the job's rows.

A watcher thread only reads, parses and hands over (``Relay.handed``): observations for the loop's
``Liveness``, metric records and samples with where the node's journal stands once they are filed
(``ToStore``), its agent's pid, a malformed record, an event (a log file capped). ``Filer.take``,
called by the loop each round, applies the observations and files everything else in one store
transaction a round, whatever the number of nodes: a store that refuses it loses that round's
records and samples (counted in ``Losses``, and the journal's mark stays where it was, so `attach`
reads them again), and never stops a watcher.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.metrics.record import MetricRecord, ProcessSample, Rejected
from launcher.run.liveness import Liveness, Observation
from launcher.store.db import Store
from launcher.store.records import Batch, Seen


@dataclass(frozen=True)
class ToStore:
    """What one journal line carried for the store (a record, samples, or nothing: a mark of how far the journal
    was received), and ``seen``: where the node's journal stands once it is filed."""

    seen: Seen
    records: tuple[MetricRecord, ...] = ()
    samples: tuple[ProcessSample, ...] = ()


@dataclass(frozen=True)
class AgentStarted:
    """A node agent said who it is: its pid and the start time the kernel gives it (to prove it is the job's)."""

    node: int
    pid: int
    start_ticks: int | None


@dataclass(frozen=True)
class RejectedLine:
    """A line looked like a metric record but was not a valid one (never stored, counted)."""

    node: int
    rejected: Rejected


@dataclass(frozen=True)
class Noted:
    """An event for the job's history (a node's log file reached its cap)."""

    kind: str
    message: str
    data: dict[str, Any]


Handed = Observation | ToStore | AgentStarted | RejectedLine | Noted


@dataclass(frozen=True)
class Lost:
    """What one attempt could not keep: metric records and samples the store refused, log lines not written."""

    records: int = 0
    samples: int = 0
    lines: int = 0
    first_error: str = ""

    def describe(self) -> str:
        parts = [f"{count} {what}" for count, what in ((self.records, "metric record(s)"), (self.samples, "sample(s)"),
                                                        (self.lines, "log line(s)")) if count]
        return f"{', '.join(parts)} could not be stored ({self.first_error})"


class Losses:
    """Counts what could not be stored, with the first error; thread-safe (watchers count unwritten log lines)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lost = Lost()

    def add(self, exc: BaseException, *, records: int = 0, samples: int = 0, lines: int = 0) -> None:
        with self._lock:
            lost = self._lost
            self._lost = Lost(lost.records + records, lost.samples + samples, lost.lines + lines,
                              lost.first_error or f"{type(exc).__name__}: {exc}"[:300])

    def take(self) -> Lost | None:
        """What was lost since the last take (None: nothing), counting afresh."""
        with self._lock:
            lost, self._lost = self._lost, Lost()
        return lost if lost.first_error else None


class Filer:
    """Files one attempt's hand-overs: called by the supervisor's loop only."""

    def __init__(self, store: Store, job_id: str, attempt: int, losses: Losses,
                 rejected: Callable[[int, Rejected], None], note: Callable[[str], None]) -> None:
        self.store, self.job_id, self.attempt, self.losses = store, job_id, attempt, losses
        self._rejected, self._note = rejected, note

    def take(self, handed: queue.SimpleQueue[Handed], live: Liveness) -> None:
        """Apply and file everything handed over so far."""
        batch = Batch()
        while True:
            try:
                item = handed.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, ToStore):
                batch.records.extend(item.records)
                batch.samples.extend(item.samples)
                batch.seen[item.seen.node] = item.seen
            elif isinstance(item, (AgentStarted, RejectedLine, Noted)):
                self._guarded(item)
            else:
                live.apply(item)
        if not batch:
            return
        try:
            self.store.add_batch(self.job_id, self.attempt, batch)
        except Exception as exc:  # noqa: BLE001 - the store (its disk) failing must not stop the job: counted
            if batch.records or batch.samples:
                self.losses.add(exc, records=len(batch.records), samples=len(batch.samples))
            else:
                self._note(f"how far the nodes' journals were received could not be stored: {exc!r}")

    def _guarded(self, item: AgentStarted | RejectedLine | Noted) -> None:
        """File one row at once (they are few: an agent's pid, a warning, an event)."""
        try:
            if isinstance(item, AgentStarted):
                self.store.set_node(self.job_id, self.attempt, item.node, pid=item.pid, start_ticks=item.start_ticks)
            elif isinstance(item, RejectedLine):
                self._rejected(item.node, item.rejected)
            else:
                self.store.add_event(self.job_id, item.kind, item.message, item.data)
        except Exception as exc:  # noqa: BLE001 - a store that refuses one row must not stop the loop
            self._note(f"a write to the store failed: {exc!r}")
