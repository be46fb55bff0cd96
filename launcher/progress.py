"""The progress view of a running job: stages while nodes are prepared, then a progress bar.

On a terminal it is a rich Live view: one line per stage (preflight, sync, setup, start,
queued) with each node's state, then a bar with step / max_steps, samples/s, the slowest
rank, peak memory, elapsed time and ETA, read from the job store's metric records; relayed
log lines scroll above it. On a pipe or a CI log it prints plain lines: one per stage change,
the log lines as they come, and a ``[progress]`` summary at most every PLAIN_EVERY_S seconds
(and once at the end). Only the standard library is imported here; rich when a terminal needs it.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from launcher.logs import TIMESTAMP, LogLine, prefix_colour

STAGES = ("queued", "preflight", "sync", "setup", "start")
STAGE_STATES = ("waiting", "running", "done", "failed")
STATE_COLOURS = {"waiting": "bright_black", "running": "yellow", "done": "green", "failed": "bold red"}
TICK_S = 0.1            # how often the live view flushes relayed lines
READ_EVERY_S = 0.5      # how often the store is read (at least; more rarely when reading takes long)
READ_COST_FACTOR = 10   # ... at most a tenth of the time is spent reading the store
PLAIN_EVERY_S = 30.0    # plain mode: a summary line at most this often
NODES_SHOWN = 8         # more nodes than this: a stage line counts them by state


@dataclass(frozen=True)
class Snapshot:
    """Where a running job is, from its metric records (``snapshot()``)."""

    step: int | None
    max_steps: int | None
    samples_per_sec: float | None
    slowest_rank: int | None
    slowest_step_s: float | None
    peak_mem_bytes: int | None
    loss: float | None
    ranks: int
    elapsed_s: float
    eta_s: float | None


def _number(record: Mapping[str, Any], key: str) -> float | None:
    """A finite, non-negative number from an untrusted record, else None."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _whole(record: Mapping[str, Any], key: str) -> int | None:
    value = record.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def snapshot(records: Iterable[Mapping[str, Any]], max_steps: int | None, started_at: float, now: float) -> Snapshot:
    """The job's progress from its raw metric records (latest attempt only).

    step: the lowest of the ranks' latest steps; samples/s: the sum of the ranks' latest rates;
    slowest rank: the longest latest step time, which also paces the ETA; peak memory: the
    highest any rank reported. Records without a valid rank and step are ignored.
    """
    latest: dict[int, Mapping[str, Any]] = {}
    peak: float | None = None
    loss: float | None = None
    attempt = -1
    for record in records:
        rank, step, this_attempt = _whole(record, "rank"), _whole(record, "step"), _whole(record, "attempt") or 0
        if rank is None or step is None or this_attempt < attempt:
            continue
        if this_attempt > attempt:
            attempt, latest, peak, loss = this_attempt, {}, None, None
        if rank not in latest or step >= latest[rank]["step"]:
            latest[rank] = record
        memory = _number(record, "mem_peak_bytes")
        peak = memory if peak is None or (memory is not None and memory > peak) else peak
        value = record.get("loss")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            loss = float(value)
    elapsed = max(0.0, now - started_at)
    if not latest:
        return Snapshot(None, max_steps, None, None, None, None, None, 0, elapsed, None)
    step = min(r["step"] for r in latest.values())
    rates = [_number(r, "samples_per_sec") for r in latest.values()]
    times = [(t, rank) for rank, r in latest.items() if (t := _number(r, "step_time_s")) is not None]
    slowest_s, slowest_rank = max(times) if times else (None, None)
    eta = None
    if max_steps:
        eta = 0.0 if step >= max_steps else (max_steps - step) * slowest_s if slowest_s is not None else None
    return Snapshot(
        step, max_steps, sum(r for r in rates if r is not None) if any(r is not None for r in rates) else None,
        slowest_rank, slowest_s, int(peak) if peak is not None else None, loss, len(latest), elapsed, eta,
    )


def duration(seconds: float) -> str:
    """h:mm:ss, to the nearest second."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _memory(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def step_text(snap: Snapshot) -> str:
    """``step 30/60`` (or ``step 30`` without a step limit)."""
    step = snap.step or 0
    return f"step {step}/{snap.max_steps}" if snap.max_steps else f"step {step}"


def timing(snap: Snapshot) -> list[str]:
    """What goes beside the bar: percent done, elapsed, ETA."""
    parts = []
    if snap.max_steps and snap.step is not None:
        parts.append(f"{min(100, 100 * snap.step // snap.max_steps)}%")
    parts.append(f"elapsed {duration(snap.elapsed_s)}")
    if snap.eta_s is not None:
        parts.append(f"ETA {duration(snap.eta_s)}")
    return parts


def figures(snap: Snapshot) -> list[str]:
    """What goes under the bar: samples/s, the slowest rank, peak memory, loss."""
    if snap.step is None:
        return ["no metric records yet"]
    parts = []
    if snap.samples_per_sec is not None:
        parts.append(f"{_rate(snap.samples_per_sec)} samples/s")
    if snap.slowest_rank is not None and snap.ranks > 1:
        parts.append(f"slowest rank {snap.slowest_rank} ({snap.slowest_step_s * 1000:.0f} ms/step)")
    if snap.peak_mem_bytes is not None:
        parts.append(f"peak mem {_memory(snap.peak_mem_bytes)}")
    if snap.loss is not None:
        parts.append(f"loss {snap.loss:.4g}")
    return parts


def summary_line(snap: Snapshot) -> str:
    """The plain-mode summary: ``[progress] step 30/60  50%  elapsed 0:00:30  ETA 0:00:30  120 samples/s ...``."""
    return "  ".join([f"[progress] {step_text(snap)}", *timing(snap), *figures(snap)])


def who(node: int | None, host: str) -> str:
    """``node 1 (lt-h2)``, ``node 1``, or ``job`` for a stage of the whole job (queued)."""
    if node is None:
        return "job"
    return f"node {node} ({host})" if host else f"node {node}"


@dataclass(frozen=True)
class NodeStage:
    node: int | None
    host: str
    state: str
    detail: str = ""


class Progress:
    """The view: ``stage()``, ``log()``, ``attach()`` and ``close()``; a subclass draws it.

    Thread-safe: every method may be called from any thread.
    """

    def __init__(self, stream: IO[str], max_steps: int | None, nnodes: int) -> None:
        self.stream, self.max_steps, self.nnodes = stream, max_steps, nnodes
        self._lock = threading.RLock()
        self._stages: dict[str, dict[int | None, NodeStage]] = {}
        self._source: tuple[Any, str] | None = None
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._snapshot: Snapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def stage(self, stage: str, node: int | None, host: str, state: str, detail: str = "") -> None:
        """A node's state in a stage (``stage`` in STAGES, ``state`` in STAGE_STATES); shown when it changed."""
        stage, state = str(stage), str(state)
        if stage not in STAGES or state not in STAGE_STATES:
            raise ValueError(f"stage {stage!r} / state {state!r}: expected one of {STAGES} / {STAGE_STATES}")
        entry = NodeStage(node, host, state, detail)
        with self._lock:
            nodes = self._stages.setdefault(stage, {})
            if nodes.get(node) == entry:
                return
            nodes[node] = entry
            self._stage_changed(stage, entry)

    def log(self, line: str) -> None:
        """A relayed log line (a leading log-file timestamp is dropped)."""
        match = TIMESTAMP.match(line)
        self._line(line[match.end():] if match else line)

    def attach(self, store: Any, job_id: str) -> None:
        """From now on show the job's progress, read from ``store`` (``store.metrics``, ``store.job``)."""
        with self._lock:
            self._source = (store, job_id)
        self._attached()
        self._start_thread()

    def close(self) -> None:
        """Stop refreshing, show the final state once, leave the terminal clean. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._source is not None:
            self._read_store()
        self._finish()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def attached(self) -> bool:
        """True once ``attach`` was called."""
        return self._source is not None

    @property
    def current(self) -> Snapshot | None:
        """The latest snapshot read from the store (None before attach)."""
        return self._snapshot

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, daemon=True, name="launch-progress")
                self._thread.start()

    def _run(self) -> None:
        next_read = 0.0
        while not self._stop.wait(TICK_S):
            self._tick()
            if self._source is not None and time.monotonic() >= next_read:
                began = time.monotonic()
                self._read_store()
                cost = time.monotonic() - began
                next_read = began + max(READ_EVERY_S, READ_COST_FACTOR * cost)
                self._refreshed()

    def _read_store(self) -> None:
        """A new snapshot; once the job has ended, its elapsed time stops and it has no ETA."""
        store, job_id = self._source
        try:
            job = store.job(job_id)
            records = store.metrics(job_id)
        except Exception:  # noqa: BLE001 - a store that cannot be read now leaves the last figures shown
            return
        self._started_at, self._ended_at = job.get("started_at"), job.get("ended_at")
        started = self._started_at if self._started_at is not None else time.time()
        snap = snapshot(records, self.max_steps, started, self._ended_at or time.time())
        self._snapshot = dataclasses.replace(snap, eta_s=None) if self._ended_at else snap

    # What the subclasses draw.

    def _stage_changed(self, stage: str, entry: NodeStage) -> None:
        raise NotImplementedError

    def _line(self, text: str) -> None:
        raise NotImplementedError

    def _attached(self) -> None:
        """Called when a store is attached."""

    def _tick(self) -> None:
        """Called by the thread every TICK_S."""

    def _refreshed(self) -> None:
        """Called by the thread after each read of the store."""

    def _finish(self) -> None:
        raise NotImplementedError


class PlainProgress(Progress):
    """Plain lines for pipes and CI logs."""

    def __init__(self, stream: IO[str], max_steps: int | None, nnodes: int, every_s: float = PLAIN_EVERY_S) -> None:
        super().__init__(stream, max_steps, nnodes)
        self.every_s = every_s
        self._last_summary: tuple[float, int | None] | None = None

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _stage_changed(self, stage: str, entry: NodeStage) -> None:
        self._write(f"[{stage}] {who(entry.node, entry.host)}: {entry.state}" + (f": {entry.detail}" if entry.detail else ""))

    def _line(self, text: str) -> None:
        self._write(text)

    def _refreshed(self) -> None:
        snap = self._snapshot
        if snap is None or snap.step is None:
            return
        now = time.monotonic()
        if self._last_summary is None or (now - self._last_summary[0] >= self.every_s and snap.step != self._last_summary[1]):
            self._last_summary = (now, snap.step)
            self._write(summary_line(snap))

    def _finish(self) -> None:
        snap = self._snapshot
        if snap is not None and snap.step is not None and (self._last_summary is None or snap.step != self._last_summary[1]):
            self._write(summary_line(snap))


class LiveProgress(Progress):
    """A rich Live view: stage lines or the bar at the bottom, relayed lines scrolling above."""

    def __init__(self, stream: IO[str], max_steps: int | None, nnodes: int) -> None:
        from rich.console import Console
        from rich.live import Live

        super().__init__(stream, max_steps, nnodes)
        self._pending: list[str] = []
        self._console = Console(file=stream, force_terminal=True, highlight=False)
        self._live = Live(console=self._console, get_renderable=self._render, refresh_per_second=4)
        self._live.start()
        self._start_thread()

    def _stage_changed(self, stage: str, entry: NodeStage) -> None:
        """Drawn by the next refresh."""

    def _line(self, text: str) -> None:
        with self._lock:
            self._pending.append(text)

    def _tick(self) -> None:
        self._flush()

    def _flush(self) -> None:
        from rich.console import Group

        with self._lock:
            lines, self._pending = self._pending, []
        if lines:
            self._console.print(Group(*(_log_text(line) for line in lines)), overflow="fold")

    def _attached(self) -> None:
        """The stages are done with: they stay above, the bar takes their place. (Never print holding
        the lock: Live's refresh thread holds its own lock while it asks ``_render`` for the view.)"""
        with self._lock:
            lines = list(self._stage_lines())
            self._stages = {}
        if lines:
            from rich.console import Group

            self._console.print(Group(*lines))

    def _finish(self) -> None:
        self._flush()
        self._live.refresh()
        self._live.stop()

    def _render(self):
        from rich.console import Group

        with self._lock:
            parts = list(self._stage_lines())
            if self._source is not None:
                parts.append(self._bar())
        return Group(*parts)

    def _stage_lines(self) -> Iterable[Any]:
        for stage, nodes in self._stages.items():
            yield _stage_line(stage, list(nodes.values()))
            for entry in nodes.values():
                if entry.state == "failed" and entry.detail:
                    yield _text(f"  {who(entry.node, entry.host)}: {entry.detail}", STATE_COLOURS["failed"])

    def _bar(self):
        """Two lines: ``step 30/60 ━━━━━━╸━━━━━ 50%  elapsed 0:00:30  ETA 0:00:30``, then the figures."""
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        snap = self._snapshot or snapshot([], self.max_steps, time.time(), time.time())
        if self._started_at is not None and self._ended_at is None:
            snap = _with_elapsed(snap, time.time() - self._started_at)
        head, tail = step_text(snap), "  ".join(timing(snap))
        line = Table.grid(padding=(0, 1))
        line.add_column(no_wrap=True, min_width=len(head))
        cells: list[Any] = [Text(head, style="bold")]
        if snap.max_steps:
            width = max(10, min(40, self._console.width - len(head) - len(tail) - 2))
            line.add_column(width=width)
            cells.append(ProgressBar(total=snap.max_steps, completed=min(snap.step or 0, snap.max_steps), width=width))
        line.add_column(no_wrap=True, overflow="ellipsis")
        cells.append(Text(tail))
        line.add_row(*cells)
        below = Text("  ".join(figures(snap)), no_wrap=True, overflow="ellipsis")
        return Group(line, below)


def _with_elapsed(snap: Snapshot, elapsed: float) -> Snapshot:
    """The snapshot with the elapsed time of now (between reads of the store); the ETA counts down with it."""
    ticked = max(0.0, elapsed - snap.elapsed_s)
    eta = None if snap.eta_s is None else max(0.0, snap.eta_s - ticked)
    return dataclasses.replace(snap, elapsed_s=max(elapsed, snap.elapsed_s), eta_s=eta)


def _text(text: str, style: str = ""):
    from rich.text import Text

    return Text(text, style=style)


def _log_text(line: str):
    """A relayed line as rich Text: the rank's ANSI colours kept, other control codes dropped, never markup;
    its ``[node/rank]`` prefix coloured per rank."""
    from rich.text import Text

    text = Text.from_ansi(line)
    prefix = LogLine(text.plain).prefix
    if prefix is not None:
        text.stylize(prefix_colour(*prefix), 0, text.plain.index("]") + 1)
    return text


def _stage_line(stage: str, nodes: list[NodeStage]):
    from rich.text import Text

    line = Text(f"{stage:<10}", style="bold")
    if len(nodes) <= NODES_SHOWN:
        for entry in nodes:
            line.append(f" {who(entry.node, entry.host)} ")
            line.append(entry.state, style=STATE_COLOURS[entry.state])
            line.append(" ")
    else:
        counts = {state: sum(1 for e in nodes if e.state == state) for state in STAGE_STATES}
        for state, count in counts.items():
            if count:
                line.append(f" {count} ")
                line.append(state, style=STATE_COLOURS[state])
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def open_progress(stream: IO[str], *, max_steps: int | None, nnodes: int, plain: bool | None = None) -> Progress:
    """The progress view on ``stream``: live on a terminal, plain lines elsewhere (``plain=None``: decide by
    ``stream.isatty()``)."""
    if plain is None:
        plain = not stream.isatty()
    return PlainProgress(stream, max_steps, nnodes) if plain else LiveProgress(stream, max_steps, nnodes)
