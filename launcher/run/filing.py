"""What node watchers hand the supervisor's loop, and the loop's filing of it: the one writer of the job's rows.

A watcher thread only reads, parses and hands over (``Relay.handed``): observations for the loop's
``Liveness``, metric records and samples with where the node's journal stands once they are filed
(``ToStore``), its agent's pid, a malformed record, an event (a log file capped). ``Filer.take``,
called by the loop each round, applies the observations and files everything else in one store
transaction a round, whatever the number of nodes. A store locked by another process holds them back
(they wait, in order, and are filed once it is free: ``Waited``); a store that refuses them otherwise
loses that round's records and samples (counted in ``Losses``, and the journal's mark stays where it
was, so `attach` reads them again). Neither stops a watcher or holds up the loop's verdicts.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.metrics.record import MetricRecord, ProcessSample, Rejected
from launcher.run.liveness import Liveness, Observation
from launcher.store.db import Store
from launcher.store.records import Batch, Seen
from launcher.store.schema import StoreLocked


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


@dataclass(frozen=True)
class Waited:
    """What the store's lock held back: for ``seconds``, ``rows`` records, samples and events, filed once it was free."""

    seconds: float
    rows: int

    def describe(self) -> str:
        return (f"the job store was locked by another process for {self.seconds:.0f} s: {self.rows} record(s) waited "
                "and are filed; the job was judged on what its nodes sent meanwhile")


class Filer:
    """Files one attempt's hand-overs: called by the supervisor's loop only. What the store's lock (another process
    writing, a backup, a ``sqlite3`` shell) keeps out waits here, in order, and is filed once the lock is free: the
    loop never waits longer than ``WAIT_S`` on the store, and its liveness and verdicts never wait at all."""

    WAIT_S = 0.05  # a round's write waits this long for another process's lock, then tries again the next round
    MAX_WAITING = 200_000  # records and samples held while the store is locked; past that they are counted lost

    def __init__(self, store: Store, job_id: str, attempt: int, losses: Losses,
                 rejected: Callable[[int, Rejected], None], note: Callable[[str], None]) -> None:
        self.store, self.job_id, self.attempt, self.losses = store, job_id, attempt, losses
        self._rejected, self._note = rejected, note
        self._batch = Batch()
        self._rows: list[AgentStarted | RejectedLine | Noted] = []
        self._locked_since: float | None = None

    def take(self, handed: queue.SimpleQueue[Handed], live: Liveness, now: float | None = None) -> Waited | None:
        """Apply everything handed over so far to ``live``, and file it with what waited; ``Waited`` once what the
        store's lock held back got in."""
        batch = self._batch
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
                self._rows.append(item)
            else:
                live.apply(item)
        if len(batch.records) + len(batch.samples) > self.MAX_WAITING:
            self.losses.add(StoreLocked(f"the job store stayed locked by another process past {self.MAX_WAITING} "
                                        "records"), records=len(batch.records), samples=len(batch.samples))
            self._batch = Batch()  # their journal mark stays where it was: `launch attach` reads them again
        return self.file(time.time() if now is None else now)

    def file(self, now: float) -> Waited | None:
        """File what waits, in order; what the lock still keeps out waits for the next round."""
        waiting = len(self._batch.records) + len(self._batch.samples) + len(self._rows)
        try:
            with self.store.waiting_at_most(self.WAIT_S):
                self._file_batch()
                while self._rows:
                    self._file_row(self._rows[0])
                    del self._rows[0]
        except StoreLocked:
            self._locked_since = self._locked_since or now
            return None
        since, self._locked_since = self._locked_since, None
        return Waited(now - since, waiting) if since is not None else None

    def flush(self, patience: float) -> None:
        """File what waits at the attempt's end, waiting up to ``patience`` seconds for the store's lock; what it
        still keeps out then is counted lost (the journal marks stay behind: `launch attach` reads them again)."""
        deadline = time.monotonic() + patience
        while self._batch or self._rows:
            try:
                with self.store.waiting_at_most(max(0.0, min(1.0, deadline - time.monotonic()))):
                    self._file_batch()
                    while self._rows:
                        self._file_row(self._rows[0])
                        del self._rows[0]
            except StoreLocked as exc:
                if time.monotonic() < deadline:
                    continue
                self.losses.add(exc, records=len(self._batch.records), samples=len(self._batch.samples))
                self._batch, self._rows = Batch(), []

    def _file_batch(self) -> None:
        batch = self._batch
        if not batch:
            return
        try:
            self.store.add_batch(self.job_id, self.attempt, batch)
        except StoreLocked:
            raise
        except Exception as exc:  # noqa: BLE001 - the store (its disk) failing must not stop the job: counted
            if batch.records or batch.samples:
                self.losses.add(exc, records=len(batch.records), samples=len(batch.samples))
            else:
                self._note(f"how far the nodes' journals were received could not be stored: {exc!r}")
        self._batch = Batch()

    def _file_row(self, item: AgentStarted | RejectedLine | Noted) -> None:
        """File one row (they are few: an agent's pid, a warning, an event)."""
        try:
            if isinstance(item, AgentStarted):
                self.store.set_node(self.job_id, self.attempt, item.node, pid=item.pid, start_ticks=item.start_ticks)
            elif isinstance(item, RejectedLine):
                self._rejected(item.node, item.rejected)
            else:
                self.store.add_event(self.job_id, item.kind, item.message, item.data)
        except StoreLocked:
            raise
        except Exception as exc:  # noqa: BLE001 - a store that refuses one row must not stop the loop
            self._note(f"a write to the store failed: {exc!r}")
