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
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from launcher.metrics.snapshot import (
    Snapshot,
    figures,
    snapshot,
    step_text,
    summary_line,
    timing,
    with_elapsed,
)
from launcher.views.logs import TIMESTAMP, LogLine, prefix_colour
from launcher.views.terminal import safe_text

STAGES = ("queued", "preflight", "sync", "setup", "start")
STAGE_STATES = ("waiting", "running", "done", "failed")
STATE_COLOURS = {"waiting": "bright_black", "running": "yellow", "done": "green", "failed": "bold red"}
TICK_S = 0.1            # how often the live view flushes relayed lines
READ_EVERY_S = 0.5      # how often the store is read (at least; more rarely when reading takes long)
READ_COST_FACTOR = 10   # ... at most a tenth of the time is spent reading the store
PLAIN_EVERY_S = 30.0    # plain mode: a summary line at most this often
NODES_SHOWN = 8         # more nodes than this: a stage line counts them by state


def who(node: int | None, host: str) -> str:
    """``node 1 (lt-h2)``, ``node 1``, or ``job`` for a stage of the whole job (queued)."""
    if node is None:
        return "job"
    return f"node {node} ({host})" if host else f"node {node}"


@dataclass(frozen=True)
class NodeStage:
    """One node's state in one stage, with what went wrong when it failed."""

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
        if self._source is None:
            return
        store, job_id = self._source
        try:
            job = store.job(job_id)
            records = store.metrics(job_id)
        except Exception:  # noqa: BLE001 - a store that cannot be read now leaves the last figures shown
            return
        self._started_at, self._ended_at = job.started_at, job.ended_at
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
        self._summary_at: float | None = None  # when the last summary was written, and at which step
        self._summary_step: int | None = None

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _stage_changed(self, stage: str, entry: NodeStage) -> None:
        """A line a node and change; past NODES_SHOWN nodes, a failed node's line (with why) and the stage's
        count each time another quarter of the nodes is done (``[preflight] 32/64 done``), not 3 lines a host."""
        detail = f": {entry.detail}" if entry.detail else ""
        if self.nnodes <= NODES_SHOWN or entry.node is None or entry.state == "failed":
            self._write(safe_text(f"[{stage}] {who(entry.node, entry.host)}: {entry.state}{detail}", colour=False))
        if self.nnodes <= NODES_SHOWN or entry.node is None:
            return
        nodes = list(self._stages[stage].values())
        done = sum(1 for e in nodes if e.state == "done")
        settled = len(nodes) >= self.nnodes and all(e.state in ("done", "failed") for e in nodes)
        if settled or (entry.state == "done" and done % max(1, self.nnodes // 4) == 0):
            self._write(f"[{stage}] {stage_counts(nodes, self.nnodes)}")

    def _line(self, text: str) -> None:
        self._write(safe_text(text))

    def _summary(self, due: bool) -> None:
        """A summary line if there is a new step to tell and ``due``."""
        snap = self._snapshot
        if snap is not None and snap.step is not None and snap.step != self._summary_step and due:
            self._summary_at, self._summary_step = time.monotonic(), snap.step
            self._write(summary_line(snap))

    def _refreshed(self) -> None:
        self._summary(self._summary_at is None or time.monotonic() - self._summary_at >= self.every_s)

    def _finish(self) -> None:
        self._summary(due=True)


class LiveProgress(Progress):
    """A rich Live view: stage lines or the bar at the bottom, relayed lines scrolling above."""

    def __init__(self, stream: IO[str], max_steps: int | None, nnodes: int) -> None:
        from rich.console import Console
        from rich.live import Live

        super().__init__(stream, max_steps, nnodes)
        self._pending: list[str] = []
        self._shown_above: dict[str, dict[int | None, NodeStage]] = {}
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
        """The stages are done with: they stay above (after the lines relayed so far), the bar takes their
        place; a stage that changes later (a restart) is drawn live again. (Never print holding the lock:
        Live's refresh thread holds its own lock while it asks ``_render`` for the view.)"""
        self._flush()
        with self._lock:
            lines = list(self._stage_lines())
            self._shown_above = {stage: dict(nodes) for stage, nodes in self._stages.items()}
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
            if self._shown_above.get(stage) == nodes:
                continue
            yield _stage_line(stage, list(nodes.values()), len(nodes) if None in nodes else max(self.nnodes, len(nodes)))
            for entry in nodes.values():
                if entry.state == "failed" and entry.detail:
                    yield _text(f"  {who(entry.node, entry.host)}: {entry.detail}", STATE_COLOURS["failed"])

    def _bar(self):
        """Two lines: ``step 30/60 ━━━━━╸━━━━━ 50%  elapsed 0:00:30  ETA 0:00:30``, then the figures."""
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        snap = self._snapshot or snapshot([], self.max_steps, time.time(), time.time())
        if self._started_at is not None and self._ended_at is None:
            snap = with_elapsed(snap, time.time() - self._started_at)
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


def _text(text: str, style: str = ""):
    from rich.text import Text

    return Text(safe_text(text, colour=False), style=style)


def _log_text(line: str):
    """A relayed line as rich Text: the rank's plain ANSI colours kept, other control codes made visible before
    rich reads it (rich would make OSC 8 a link), never markup; its ``[node/rank]`` prefix coloured per rank."""
    from rich.text import Text

    text = Text.from_ansi(safe_text(line))
    prefix = LogLine(text.plain).prefix
    if prefix is not None:
        text.stylize(prefix_colour(*prefix), 0, text.plain.index("]") + 1)
    return text


def _stage_line(stage: str, nodes: list[NodeStage], total: int):
    from rich.text import Text

    line = Text(f"{stage:<10}", style="bold")
    if total <= NODES_SHOWN:
        for entry in nodes:
            line.append(safe_text(f" {who(entry.node, entry.host)} ", colour=False))
            line.append(entry.state, style=STATE_COLOURS[entry.state])
            line.append(" ")
    else:
        line.append(" " + stage_counts(nodes, total))
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def stage_counts(nodes: list[NodeStage], total: int) -> str:
    """``41/64 done, 2 failed, 21 running`` (the nodes not heard of yet count as waiting)."""
    counts = {state: sum(1 for e in nodes if e.state == state) for state in STAGE_STATES}
    counts["waiting"] += max(0, total - len(nodes))
    rest = [f"{counts[state]} {state}" for state in ("failed", "running", "waiting") if counts[state]]
    return ", ".join([f"{counts['done']}/{total} done", *rest])


def open_progress(stream: IO[str], *, max_steps: int | None, nnodes: int, plain: bool | None = None) -> Progress:
    """The progress view on ``stream``: live on a terminal, plain lines elsewhere (``plain=None``: decide by
    ``stream.isatty()``)."""
    if plain is None:
        plain = not stream.isatty()
    return PlainProgress(stream, max_steps, nnodes) if plain else LiveProgress(stream, max_steps, nnodes)
