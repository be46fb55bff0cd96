"""A holding job's pace as its node agent sees it, for every user: the step records (``@@launch`` lines) that pass
through the agent are read for their step alone, and, once two steps give a rate, then at most every ``WRITE_EVERY_S``
seconds (when it moved), the step, the job's ``max_steps``, the step rate and the node time of the newest step go into the agent's holder record
(``leases``), which any user's `launch queue`, refused submit (exit 3) or queued job reads (docs/LEASES.md).

Rank output is untrusted: a record counts only whole, on a rank's stream (its ``[rank]:`` prefix), bounded, with an
integer step; a rank can only misstate its own job's pace. ``Pace`` is what a reader makes of a record: the ETA is
counted on the node's clock, as seconds from when the record was read, so the reader's clock need not agree.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .rankrelay import PREFIX_PATTERN

MARKER = b"@@launch "
# what torchrun (the plan's prefix template) and the node side (rankrelay) put before each rank's line
RANK_PREFIX = re.compile(PREFIX_PATTERN.encode())
MAX_RECORD = 16 * 1024  # bytes of a record's JSON parsed (the supervisor's bound too)
MAX_STEP = 10**15
MAX_RANKS = 1024  # ranks of one node whose latest step is kept
WRITE_EVERY_S = 3.0
LOOK_S = 0.25  # how often the writer looks (it writes at most every WRITE_EVERY_S)


def record_step(line: bytes) -> tuple[int, int] | None:
    """(rank, step) of a whole step record on a rank's stream, or None for any other line."""
    prefix = RANK_PREFIX.match(line)
    if prefix is None or not line.startswith(MARKER, prefix.end()):
        return None
    payload = line[prefix.end() + len(MARKER):]
    if len(payload) > MAX_RECORD:
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    rank = int(prefix[1])
    if not isinstance(data, dict) or data.get("v") != 1 or data.get("rank", rank) != rank:
        return None
    step = data.get("step")
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return None
    return rank, step


class StepWatch:
    """The newest step of this node's ranks (the highest of each rank's latest), its node time, and the rate since the first
    record this agent saw; fed the relayed lines, it hands what changed to ``write`` at a bounded rate (``run``)."""

    def __init__(self, max_steps: int | None) -> None:
        self.max_steps = max_steps
        self._latest: dict[int, int] = {}
        self._first: tuple[float, int] | None = None  # (node time, step) of the first step seen
        self._step: int | None = None
        self._at: float | None = None
        self._changed = False
        self._lock = threading.Lock()

    def feed(self, lines: Iterable[bytes]) -> None:
        """Note the step of every step record among ``lines`` (cheap for other lines: one substring test)."""
        for line in lines:
            if MARKER not in line:
                continue
            found = record_step(line)
            if found is None:
                continue
            rank, step = found
            with self._lock:
                if rank not in self._latest and len(self._latest) >= MAX_RANKS:
                    continue
                self._latest[rank] = step
                newest = max(self._latest.values())
                now = time.time()
                if self._first is None or newest < self._first[1]:  # the first, or the ranks began again lower
                    self._first = (now, newest)
                if newest != self._step:
                    self._step, self._at, self._changed = newest, now, True

    def fields(self, need_rate: bool = False) -> dict | None:
        """What the holder record gains (step, max_steps, steps_per_s, step_t), or None when nothing moved since the
        last call (or, with ``need_rate``, no rate is known yet)."""
        with self._lock:
            if not self._changed or self._step is None or self._at is None or self._first is None:
                return None
            since, first = self._first
            rate = (self._step - first) / (self._at - since) if self._at > since and self._step > first else None
            if need_rate and not rate:
                return None
            self._changed = False
            return {"step": self._step, "max_steps": self.max_steps,
                    "steps_per_s": float(f"{rate:.4g}") if rate else None, "step_t": round(self._at, 3)}

    def run(self, stop: threading.Event, write: Callable[[dict], None]) -> None:
        """Until ``stop``: hand what changed to ``write``, the first time as soon as a rate is known (else after
        WRITE_EVERY_S), then at most every WRITE_EVERY_S seconds."""
        last, written = time.monotonic(), False
        while not stop.wait(LOOK_S):
            due = time.monotonic() - last >= WRITE_EVERY_S
            found = self.fields(need_rate=not due) if due or not written else None
            if found is not None:
                write(found)
                last, written = time.monotonic(), True


def _count(value: object) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_STEP else None


def _number(value: object) -> float | None:
    return float(value) if type(value) in (int, float) and math.isfinite(value) else None  # type: ignore[arg-type]


@dataclass(frozen=True)
class Pace:
    """A holding job's step, its ``max_steps`` when known, and (at its pace) the seconds until it ends counted from
    when the record was read; ``idle_s``: seconds since its newest step."""

    step: int
    max_steps: int | None = None
    eta_s: float | None = None
    idle_s: float | None = None

    @classmethod
    def of(cls, record: dict, now: float) -> Pace | None:
        """The pace a holder record states (others' files: every value checked), as of node time ``now``."""
        step = _count(record.get("step"))
        if step is None:
            return None
        total, rate, at = _count(record.get("max_steps")) or None, _number(record.get("steps_per_s")), _number(record.get("step_t"))
        idle = round(max(0.0, now - at), 1) if at is not None else None
        eta = None
        if total and total > step and rate and rate > 0 and idle is not None:
            eta = round(min((total - step) / rate - idle, 1e9), 1)
        return cls(step, total, eta, idle)

    @classmethod
    def from_json(cls, data: object) -> Pace | None:
        """A pace as ``as_json`` wrote it (read back from another process: checked)."""
        if not isinstance(data, dict) or _count(data.get("step")) is None:
            return None
        eta, idle = _number(data.get("eta_s")), _number(data.get("idle_s"))
        return cls(data["step"], _count(data.get("max_steps")) or None, eta, idle)

    def as_json(self) -> dict:
        return {"step": self.step, "max_steps": self.max_steps, "eta_s": self.eta_s, "idle_s": self.idle_s}

    def text(self, read_at: float) -> str:
        """``step 120/1000, ETA 14:32`` (the ETA in this machine's time zone, counted from ``read_at``, when the
        record was read); an ETA already passed says how long the job has shown no step."""
        said = f"step {self.step}/{self.max_steps}" if self.max_steps else f"step {self.step}"
        if self.eta_s is not None and self.eta_s >= 0:
            said += f", ETA {time.strftime('%H:%M', time.localtime(read_at + self.eta_s))}"
        elif self.eta_s is not None:
            said += f", ETA passed (no step for {self.idle_s:.0f} s)"
        return said


@dataclass(frozen=True)
class HolderPace:
    """Job ``job`` of ``user`` at ``pace``, as a node answered at ``read_at`` (this machine's time)."""

    job: str
    user: str
    pace: Pace
    read_at: float

    def text(self) -> str:
        """``job X of alice: step 120/1000, ETA 14:32``."""
        return f"job {self.job} of {self.user}: {self.pace.text(self.read_at)}"

    def as_json(self) -> dict:
        eta = self.pace.eta_s
        return {"job": self.job, "user": self.user, **self.pace.as_json(), "read_at": self.read_at,
                "eta": round(self.read_at + eta, 1) if eta is not None and eta >= 0 else None,
                "text": self.pace.text(self.read_at)}

    @classmethod
    def from_json(cls, data: object) -> HolderPace | None:
        """Read back from a file (checked: a damaged entry is None)."""
        pace = Pace.from_json(data)
        if pace is None or not isinstance(data, dict):
            return None
        job, user, read_at = data.get("job"), data.get("user"), _number(data.get("read_at"))
        if not isinstance(job, str) or not isinstance(user, str) or read_at is None:
            return None
        return cls(job[:120], user[:120], pace, read_at)
