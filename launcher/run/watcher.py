"""Node watchers: one thread a node reads its agent's framed lines and relays them.

A watcher writes the node's log file, echoes lines, files metric records and samples in the store,
and describes what it saw for the supervisor's loop (``liveness`` observations, a snapshot of the
node). It never stops reading on its own errors or the store's: a line it cannot handle, a record
the store refuses, a log file on a full disk are counted in ``Losses`` and skipped, so the pipe is
always drained and the ranks never block on a full one.
"""

from __future__ import annotations

import collections
import json
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher.backends import failures
from launcher.backends.base import NodeHandle
from launcher.metrics.record import ProcessSample, Rejected, parse_line, parse_samples
from launcher.plan.shell import mask
from launcher.run.liveness import Observation, Output, Progress, Sample
from launcher.store.db import Store
from launcher.store.logcap import CappedLog
from launcher.views.terminal import safe_text

_RANK_PREFIX = re.compile(r"^\[(\d{1,7})\]:(?=.)")
TAIL_LINES = 200


@dataclass(frozen=True)
class Lost:
    """What one attempt could not keep: metric records and samples the store refused, log lines not written."""

    records: int
    samples: int
    lines: int
    first_error: str

    def describe(self) -> str:
        parts = [f"{count} {what}" for count, what in ((self.records, "metric record(s)"), (self.samples, "sample(s)"),
                                                        (self.lines, "log line(s)")) if count]
        return f"{', '.join(parts)} could not be stored ({self.first_error})"


class Losses:
    """Counts what the watchers could not store, with the first error; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {"records": 0, "samples": 0, "lines": 0}
        self._first: str | None = None

    def add(self, what: str, count: int, exc: BaseException) -> None:
        with self._lock:
            self._counts[what] += count
            self._first = self._first or f"{type(exc).__name__}: {exc}"[:300]

    def take(self) -> Lost | None:
        """What was lost since the last take (None: nothing), counting afresh."""
        with self._lock:
            first, counts = self._first, dict(self._counts)
            self._first, self._counts = None, dict.fromkeys(counts, 0)
        return Lost(counts["records"], counts["samples"], counts["lines"], first) if first else None


@dataclass(frozen=True)
class Relay:
    """Where the watchers of one attempt relay to, and what they share."""

    store: Store
    job_id: str
    attempt: int
    world_size: int
    secrets: Mapping[str, str]
    echo: Callable[[str], None]
    rejected: Callable[[int, Rejected], None]
    note: Callable[[str], None]  # never raises
    sequence: Callable[[], int]  # the supervisor's order of observations, shared by every node
    observed: queue.SimpleQueue[Observation] = field(default_factory=queue.SimpleQueue)
    losses: Losses = field(default_factory=Losses)


@dataclass(frozen=True)
class NodeSeen:
    """A watcher's node as it stands: its last lines, the job's PIDs and samples there, its agent's exit."""

    tail: list[str]
    pids: frozenset[int]
    samples: dict[int, ProcessSample]
    agent_exit: int | None
    reported: int | None  # when its agent's "failed" line was seen (Relay.sequence)


class NodeWatcher:
    """Reads one node agent's framed lines: log file, console echo, metric records, samples, last lines."""

    def __init__(self, handle: NodeHandle, host: str, log_path: Path, relay: Relay) -> None:
        self.handle = handle
        self.host = host
        self.log_path = log_path
        self._relay = relay
        self._lock = threading.Lock()
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._pids: set[int] = set()
        self._samples: dict[int, ProcessSample] = {}
        self._agent_exit: int | None = None
        self._reported: int | None = None
        self._log_error: OSError = OSError("its log file was not opened")
        self.errors = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"node{handle.index}")
        self._thread.start()

    def seen(self) -> NodeSeen:
        """A snapshot, safe to read while the watcher goes on."""
        with self._lock:
            return NodeSeen(list(self._tail), frozenset(self._pids), dict(self._samples), self._agent_exit,
                            self._reported)

    def _run(self) -> None:
        log = self._open_log()
        try:
            for raw in self.handle.lines():
                try:
                    self._line(raw, log)
                except Exception as exc:  # noqa: BLE001 - one bad line must not stop the relay
                    self.errors += 1
                    self._relay.losses.add("lines", 1, exc)
                    if self.errors == 1:
                        self._relay.note(f"node {self.handle.index}: a line could not be handled: {exc!r}")
        except Exception as exc:  # noqa: BLE001 - the node's channel broke: its exit code says the rest
            self._relay.note(f"node {self.handle.index}: reading its output failed: {exc!r}")
        finally:
            if log is not None:
                try:
                    log.close()
                except OSError:
                    pass  # its lost lines are counted already

    def _open_log(self) -> CappedLog | None:
        try:
            return CappedLog(self.log_path, self._relay.store, self._relay.job_id, self.handle.index)
        except OSError as exc:
            self._relay.note(f"node {self.handle.index}: its log file cannot be opened: {exc!r}")
            self._log_error = exc
            return None

    def _line(self, raw: str, log: CappedLog | None) -> None:
        node, now = self.handle.index, time.time()
        if raw.startswith("@"):
            kind, _, data = raw[1:].partition(" ")
            self._event(kind, json.loads(data) if data else {}, now)
            return
        relay = self._relay
        text = raw[1:] if raw.startswith("|") else raw
        if relay.secrets:
            text = mask(text, dict(relay.secrets))
        relay.observed.put(Output(now))
        record = parse_line(text, world_size=relay.world_size, node=node, host=self.host)
        if isinstance(record, Rejected):
            relay.rejected(node, record)
            return
        if record is not None:
            relay.observed.put(Progress(node, record.rank, record.step, now))
            try:
                relay.store.add_metrics(relay.job_id, relay.attempt, [record])
            except Exception as exc:  # noqa: BLE001 - the store (its disk) failing must not stop the relay
                relay.losses.add("records", 1, exc)
            return
        match = _RANK_PREFIX.match(text)
        shown = f"[{node}/{match[1]}] {text[match.end():]}" if match else f"[{node}] {text}"
        with self._lock:
            self._tail.append(shown)
            if self._reported is None and failures.is_agent_failed_line(text):
                self._reported = relay.sequence()
        self._write(log, f"{now:.3f} {shown}\n")
        try:
            relay.echo(safe_text(shown))
        except OSError:
            pass  # the console is gone (its terminal closed): the line is in the log, and the job goes on

    def _write(self, log: CappedLog | None, line: str) -> None:
        if log is None:
            self._relay.losses.add("lines", 1, self._log_error)
            return
        try:
            log.write(line)
            log.flush()
        except Exception as exc:  # noqa: BLE001 - a full disk or a store that refuses the cap's event
            self._relay.losses.add("lines", 1, exc)

    def _event(self, kind: str, data: dict, now: float) -> None:
        if kind == "sample":
            self._sample(data, now)
        elif kind == "started":
            self.handle.pid = int(data["pid"])
        elif kind == "exit":
            with self._lock:
                self._agent_exit = int(data["code"])

    def _sample(self, data: dict, now: float) -> None:
        relay, node = self._relay, self.handle.index
        samples = [s for s in parse_samples(data, world_size=relay.world_size, node=node, host=self.host)
                   if not isinstance(s, Rejected)]
        entries = data.get("ranks")
        with self._lock:
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, dict) and isinstance(entry.get("pids"), list):
                    self._pids.update(pid for pid in entry["pids"] if isinstance(pid, int))
            for sample in samples:
                self._samples[sample.rank] = sample
                self._pids.add(sample.pid)
        for sample in samples:
            relay.observed.put(Sample(node, sample.rank, sample.cpu_s, sample.gpu_util, now))
        if samples:
            try:
                relay.store.add_samples(relay.job_id, relay.attempt, samples)
            except Exception as exc:  # noqa: BLE001 - the store (its disk) failing must not stop the relay
                relay.losses.add("samples", len(samples), exc)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()
