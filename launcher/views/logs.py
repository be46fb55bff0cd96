"""Read a job's per-node log files back: filter (node, rank, time, pattern), tail, merge, follow.

Each line of a node's log file starts with the writer's epoch time (``1764536400.123 [0/1] ...``);
lines without it (logs written before timestamps) are shown as they are. Lines of several nodes
are merged in time order. Rank output is untrusted: it is printed through ``safe_text`` (plain colour
kept, every other control sequence made visible), never interpreted; ``raw`` prints it as written.
"""

from __future__ import annotations

import collections
import heapq
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.store.db import Store
from launcher.store.rows import JobRow
from launcher.views.terminal import safe_text

TIMESTAMP = re.compile(r"^(\d+\.\d{3}) ")
_PREFIX = re.compile(r"^\[(\d+)(?:/(\d+))?\] ")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
# Prefix colours by rank (click and rich both know these names); lines of a node's agent are dim.
RANK_COLOURS = ("cyan", "magenta", "yellow", "green", "blue", "bright_cyan", "bright_magenta", "bright_yellow",
                "bright_green", "bright_blue")
NODE_COLOUR = "bright_black"
READ_BLOCK = 64 * 1024
MAX_SINCE_DAYS = 100 * 366  # --since further back than this is a typo, not a log


@dataclass(frozen=True)
class LogLine:
    """One line of a node's log: its text (``[node/rank] ...``) and the time it was written, if known."""

    text: str
    t: float | None = None

    @classmethod
    def parse(cls, raw: str) -> LogLine:
        match = TIMESTAMP.match(raw)
        return cls(raw[match.end():], float(match[1])) if match else cls(raw)

    @property
    def prefix(self) -> tuple[int, int | None] | None:
        """(node, rank) of the ``[node/rank]`` prefix; rank None for a node's own lines."""
        match = _PREFIX.match(self.text)
        return (int(match[1]), int(match[2]) if match[2] is not None else None) if match else None


@dataclass(frozen=True)
class LogQuery:
    """Which lines to show: a node, an attempt (default: the latest), a rank, a time, a pattern, the last N."""

    node: int | None = None
    rank: int | None = None
    attempt: int | None = None
    since: float | None = None
    pattern: re.Pattern[str] | None = None
    tail: int | None = None

    def keep(self, line: LogLine) -> bool:
        if self.rank is not None:
            prefix = line.prefix
            if prefix is None or prefix[1] != self.rank:
                return False
        if self.since is not None and line.t is not None and line.t < self.since:
            return False
        return self.pattern is None or self.pattern.search(line.text) is not None


@dataclass(frozen=True)
class LogFormat:
    """How lines are printed: prefixes coloured per rank (terminals), the time shown or not; ``raw``: as written."""

    colour: bool = False
    timestamps: bool = False
    raw: bool = False

    def render(self, line: LogLine) -> str:
        if self.raw:
            return line.text
        text = safe_text(line.text)
        prefix = line.prefix
        if self.colour and prefix is not None:
            end = text.index("] ") + 1
            text = _style(text[:end], prefix_colour(*prefix)) + text[end:]
        if self.timestamps and line.t is not None:
            text = f"{datetime.fromtimestamp(line.t).isoformat(timespec='milliseconds')} {text}"
        return text


def prefix_colour(node: int, rank: int | None) -> str:
    """The colour of a ``[node/rank]`` prefix: one per rank, dim for a node's own lines."""
    return NODE_COLOUR if rank is None else RANK_COLOURS[rank % len(RANK_COLOURS)]


def _style(text: str, colour: str) -> str:
    import click

    return click.style(text, fg=colour)


def parse_since(text: str, now: float | None = None) -> float:
    """Epoch seconds from a duration back from now (``30s``, ``10m``, ``2h``, ``1d``, ``1h30m``) or an ISO time
    (local time unless it names its zone). ValueError with what was expected."""
    now = time.time() if now is None else now
    match = _DURATION.match(text.strip())
    if match and any(match.groups()):
        if any(len(g) > 9 for g in match.groups() if g):
            raise ValueError(f"'{text[:40]}': a duration back of at most {MAX_SINCE_DAYS} days, e.g. 30s, 10m, 2h, 1d")
        days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
        back = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
        if back > MAX_SINCE_DAYS * 86400:
            raise ValueError(f"'{text}': a duration back of at most {MAX_SINCE_DAYS} days, e.g. 30s, 10m, 2h, 1d")
        return now - back
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        raise ValueError(
            f"'{text}' is neither a duration (30s, 10m, 2h, 1d, 1h30m) nor an ISO time (2025-12-01T10:00:00)"
        ) from None


def log_files(store: Store, job: JobRow, node: int | None, attempts: Iterable[int]) -> list[Path]:
    """The job's log files of these attempts, in attempt and node order."""
    wanted = set(attempts)
    rows = [r for r in store.nodes(job.id) if r.attempt in wanted and (node is None or r.node == node)]
    return [Path(r.log_path) for r in rows if r.log_path]


def _complete_end(handle, size: int) -> int:
    """The offset just past the last newline before ``size`` (0 if there is none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - READ_BLOCK)
        handle.seek(start)
        block = handle.read(pos - start)
        at = block.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        pos = start
    return 0


def _decode(raw: bytes) -> LogLine:
    return LogLine.parse(raw.decode("utf-8", errors="replace").rstrip("\r"))


def _lines_backward(handle, end: int) -> Iterator[LogLine]:
    """The complete lines before offset ``end`` (just past a newline), last first, read in blocks from the end."""
    if end <= 0:
        return
    pos, rest = end - 1, b""  # the newline that ends the last line
    while pos > 0:
        start = max(0, pos - READ_BLOCK)
        handle.seek(start)
        pieces = (handle.read(pos - start) + rest).split(b"\n")
        pos, rest = start, pieces[0]
        for piece in reversed(pieces[1:]):
            yield _decode(piece)
    yield _decode(rest)


def _tail_of(handle, end: int, query: LogQuery) -> list[LogLine]:
    """The lines of one file that ``query`` keeps, reading back only as far as --tail and --since need."""
    kept: list[LogLine] = []
    for line in _lines_backward(handle, end):
        if query.since is not None and line.t is not None and line.t < query.since:
            break
        if query.keep(line):
            kept.append(line)
            if query.tail is not None and len(kept) >= query.tail:
                break
    kept.reverse()
    return kept


def _lines_forward(handle, start: int, end: int, query: LogQuery) -> Iterator[LogLine]:
    handle.seek(start)
    pos = start
    while pos < end:
        raw = handle.readline(end - pos)
        if not raw:
            return
        pos += len(raw)
        line = _decode(raw.rstrip(b"\n"))
        if query.keep(line):
            yield line


def _time_ordered(lines: Iterable[LogLine]) -> Iterator[tuple[float, LogLine]]:
    """(sort key, line): the line's time, or that of the line before it in the same file (0 before any)."""
    last = 0.0
    for line in lines:
        last = line.t if line.t is not None else last
        yield last, line


def merged(per_file: list[Iterable[LogLine]]) -> Iterator[LogLine]:
    """Lines of several files in time order; files without timestamps keep their node order."""
    for _, line in heapq.merge(*(_time_ordered(lines) for lines in per_file), key=lambda pair: pair[0]):
        yield line


class LogReader:
    """Reads a job's log files for a query, then (for --follow) the lines written since."""

    def __init__(self, store: Store, job_ref: str, query: LogQuery) -> None:
        self.store, self.query = store, query
        self.job = store.job(job_ref)
        self.first_attempt = (self.job.attempt or 0) if query.attempt is None else query.attempt
        self.offsets: dict[Path, int] = {}

    def _paths(self) -> list[Path]:
        if self.query.attempt is not None:
            attempts: Iterable[int] = (self.query.attempt,)
        else:
            attempts = range(self.first_attempt, (self.job.attempt or 0) + 1)
        paths = log_files(self.store, self.job, self.query.node, attempts)
        if self.query.since is not None:
            paths = [p for p in paths if not p.exists() or p.stat().st_mtime >= self.query.since]
        return paths

    def existing(self) -> Iterator[LogLine]:
        """The lines already written that the query keeps, merged in time order (last ``tail`` of them)."""
        handles: list[Any] = []
        per_file: list[Iterable[LogLine]] = []
        try:
            for path in self._paths():
                try:
                    handle = open(path, "rb")
                except FileNotFoundError:
                    continue
                handles.append(handle)
                end = _complete_end(handle, os.fstat(handle.fileno()).st_size)
                self.offsets[path] = end
                if self.query.tail is not None or self.query.since is not None:
                    per_file.append(_tail_of(handle, end, self.query))
                else:
                    per_file.append(_lines_forward(handle, 0, end, self.query))
            lines = merged(per_file)
            if self.query.tail is not None:
                lines = iter(collections.deque(lines, maxlen=self.query.tail))
            yield from lines
        finally:
            for handle in handles:
                handle.close()

    def new(self) -> list[LogLine]:
        """Complete lines written since the last read (new attempts' files included), merged in time order."""
        self.job = self.store.job(self.job.id)
        per_file: list[Iterable[LogLine]] = []
        for path in self._paths():
            try:
                with open(path, "rb") as handle:
                    start = self.offsets.get(path, 0)
                    end = _complete_end(handle, os.fstat(handle.fileno()).st_size)
                    if end > start:
                        per_file.append(list(_lines_forward(handle, start, end, self.query)))
                        self.offsets[path] = end
            except FileNotFoundError:
                continue
        return list(merged(per_file))

    @property
    def ended(self) -> bool:
        return self.job.terminal


def gone_text(job: JobRow, gone: str) -> str:
    """What `status --watch` and `logs --follow` say when a job's supervisor is proven gone."""
    return (f"launch: job {job.id} is {job.state} but its supervisor is gone ({gone}): nothing relays its nodes' "
            f"lines or records its end now; `launch attach {job.id}` supervises it again, "
            f"`launch cancel {job.id}` ends it")


def print_logs(
    store: Store,
    job_ref: str,
    query: LogQuery = LogQuery(),
    *,
    follow: bool = False,
    fmt: LogFormat = LogFormat(),
    out: Callable[[str], None] = print,
    poll_s: float = 0.25,
    supervisor_gone: Callable[[str], str | None] | None = None,
    say: Callable[[str], None] | None = None,
) -> None:
    """Print the logs; with ``follow``, keep printing new lines until the job has ended, or until its supervisor
    is proven gone (``supervisor_gone(job_id)``: why; nothing writes its logs then): ``say`` tells it."""
    reader = LogReader(store, job_ref, query)
    for line in reader.existing():
        out(fmt.render(line))
    while follow:
        ended = reader.ended
        for line in reader.new():
            out(fmt.render(line))
        if ended:
            return
        gone = supervisor_gone(reader.job.id) if supervisor_gone is not None else None
        if gone is not None and not store.job(reader.job.id).terminal:
            (say or out)(gone_text(reader.job, gone))
            return
        if gone is None:
            time.sleep(poll_s)
