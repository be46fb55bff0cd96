"""A node agent's journal and its stdout: every framed line it reports, kept on the node (docs/JOURNALS.md).

``node<N>.journal`` in the job's run directory holds the agent's framed lines (``protocol``) in order, one a line:
line k has sequence number k. Each line is journaled, then sent to stdout by a thread of its own,
so the lines on stdout are the journal's in the same order and a slow, stalled or vanished reader
never slows the ranks. The journal is bounded (``limit`` bytes): past it, output (``|``) and
``@sample`` lines are no longer journaled, and one ``@journal`` frame says so; the agent's other lines
are always journaled. A journal that cannot be written (the disk is full) takes nothing more, and one
``@journal`` frame (sent, not journaled) says why. Either way every line still goes to stdout: those not
journaled marked live (``~``), which readers do not count as journal lines, so the supervisor sees every
line and sample while only a later ``follow`` misses them. One ``os.write`` for the lines of each read of the command's output (so at most one
a line), no fsync: the file is in the page cache, and it is the agent's death (or its reader's), not
the node's, that the journal outlives.

Standard library only: it runs on nodes.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import os
import stat
import threading
import time

from .protocol import DROPPABLE, FrameKind, encode_frame, encode_output, kind_of, live

DEFAULT_LIMIT = 256 * 2**20
BEHIND_LIMIT = 64 * 2**20  # stdout this far behind the journal (its reader stalled) is given up
DRAIN_STALL_S = 10.0  # at exit, the agent waits for its stdout to take the last lines while it makes progress


def journal_path(run_dir: str, node: object) -> str:
    return os.path.join(run_dir, f"node{node}.journal")


def contact_path(run_dir: str, node: object) -> str:
    """The file a reader in contact touches at least every second (``follow`` does)."""
    return os.path.join(run_dir, f"node{node}.contact")


def pid_path(run_dir: str, node: object) -> str:
    """``PID START_TICKS`` of the node's agent."""
    return os.path.join(run_dir, f"node{node}.pid")


def generation_path(run_dir: str, node: object) -> str:
    """Which supervisor generation is in charge of the node (``{"generation": N, "pid", "host", "since"}``): a
    supervisor of an older generation is fenced (docs/JOURNALS.md "Generations")."""
    return os.path.join(run_dir, f"node{node}.generation")


RECORD_FILE = "job.json"  # in the run directory: the job as its supervisor recorded it (`launch attach --cluster`)


def read_generation(run_dir: str, node: object) -> dict:
    """The node's generation record; ``{"generation": 0}`` when none was written (the submitting supervisor's) or
    what is there is not one ``fence`` wrote: not a regular file (a symlink, a FIFO), or not a whole record (a
    generation of 1 or more, ``since``, ``pid`` and ``host``)."""
    try:
        fd = os.open(generation_path(run_dir, node), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return {"generation": 0}
            found = json.loads(handle.read(4096))
    except (OSError, ValueError):
        return {"generation": 0}
    return found if _is_record(found) else {"generation": 0}


def _is_record(found: object) -> bool:
    """Whether ``found`` is a generation record as ``fence`` writes it."""
    if not isinstance(found, dict):
        return False
    generation, since = found.get("generation"), found.get("since")
    return (type(generation) is int and generation >= 1 and type(since) in (int, float)
            and (found.get("pid") is None or type(found.get("pid")) is int)
            and (found.get("host") is None or isinstance(found.get("host"), str)))


def is_fenced(recorded: int, mine: int) -> bool:
    """A supervisor of generation ``mine`` is fenced once a node records a newer one."""
    return recorded > mine


def fenced_by(run_dir: str, node: object, mine: int) -> dict | None:
    """The newer generation's record that fences a supervisor of generation ``mine``; None while it is in charge."""
    found = read_generation(run_dir, node)
    return found if is_fenced(found["generation"], mine) else None


BOOT_ID = "/proc/sys/kernel/random/boot_id"
STAMP_WIDTH = 20  # the monotonic seconds in a contact file, fixed width: each touch rewrites the same bytes


@functools.cache
def boot_id() -> str:
    """This boot's id (a monotonic time means nothing in another boot); empty where the kernel does not say."""
    try:
        with open(BOOT_ID) as handle:
            return handle.read(64).strip()
    except OSError:
        return ""


def touch(path: str) -> None:
    """Mark ``path`` (a contact file) as touched now: ``BOOT_ID MONOTONIC`` written over its bytes (so its times
    change too); a run directory removed meanwhile is not an error."""
    stamp = f"{boot_id() or '-'} {time.monotonic():0{STAMP_WIDTH}.3f}\n".encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        try:
            os.pwrite(fd, stamp, 0)
            os.ftruncate(fd, len(stamp))
        finally:
            os.close(fd)
    except OSError:
        pass


def contact_age(path: str) -> float | None:
    """Seconds since the contact file ``path`` was last touched, on this node's monotonic clock (a step of the wall
    clock makes contact look neither lost nor fresh); None when it was never touched or in another boot."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            fields = os.read(fd, 128).split()
        finally:
            os.close(fd)
        stamp = float(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    if fields[0].decode("ascii", "replace") != (boot_id() or "-") or not math.isfinite(stamp):
        return None
    return max(0.0, time.monotonic() - stamp)


def write_atomically(path: str, text: str) -> None:
    """``text`` as the file ``path`` (mode 0600), replaced in one rename: a reader sees the old file or the new."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


class Journal:
    """``node<N>.journal`` in ``run_dir``, a fresh file (renamed over a previous attempt's), bounded at ``limit`` bytes."""

    def __init__(self, run_dir: str, node: object, limit: int = DEFAULT_LIMIT) -> None:
        self.path = journal_path(run_dir, node)
        self.node, self.limit = node, limit
        self.size = self.lines = 0
        self.full = False
        self.failed: str | None = None  # a write failed (the disk is full): nothing more is written
        tmp = f"{self.path}.{os.getpid()}.new"
        self._fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.replace(tmp, self.path)

    def append(self, lines: list[bytes]) -> bytes:
        """Journal ``lines`` (framed lines, no newlines) in one write, those the bound leaves; what to send in their
        place (newline-ended): every line, in order, those not journaled marked live (``protocol.live``), so the
        supervisor takes in every line and sample whatever the journal does. Where the journal stops keeping lines,
        one ``@journal`` frame says why: journaled where it filled, sent live where it cannot be written."""
        if self.failed is not None:
            return b"".join(live(line) + b"\n" for line in lines)
        block = b"\n".join(lines) + b"\n"
        if not self.full and self.size + len(block) <= self.limit:  # the hot path: all of them fit
            written = self._write(block)
            if written == len(block):
                self.size += written
                self.lines += len(lines)
                return block
            return self._sent(list(zip(lines, [True] * len(lines), strict=True)), written)
        entries = list(self._bounded(lines))
        block = b"".join(line + b"\n" for line, keep in entries if keep)
        return self._sent(entries, self._write(block) if block else 0)

    def _sent(self, entries: list[tuple[bytes, bool]], written: int) -> bytes:
        """What to send for ``entries`` (line, meant for the journal) once ``written`` bytes of theirs were journaled:
        the lines written whole as they are, the others live, and the frame that says why a write failed."""
        whole = 0
        sent = []
        for line, keep in entries:
            if keep and whole + len(line) + 1 <= written:
                whole += len(line) + 1
                self.lines += 1
                sent.append(line + b"\n")
            else:
                sent.append(live(line) + b"\n")
        self.size += written
        if self.failed is not None:
            sent.append(live(encode_frame(FrameKind.JOURNAL, {"state": "unwritable", "error": self.failed[:300],
                                                               "lines": self.lines})) + b"\n")
        return b"".join(sent)

    def _bounded(self, lines: list[bytes]):
        """(line, journal it) for ``lines``: past the bound, output and samples are sent but not journaled; the
        first that would pass it is preceded by the ``@journal`` frame that says the journal is full."""
        size = self.size
        for line in lines:
            droppable = kind_of(line) in DROPPABLE
            if droppable and not self.full and size + len(line) + 1 > self.limit:
                self.full = True
                note = encode_frame(FrameKind.JOURNAL, {"state": "full", "limit": self.limit})
                size += len(note) + 1
                yield note, True
            keep = not (droppable and self.full)
            size += (len(line) + 1) if keep else 0
            yield line, keep

    def _write(self, block: bytes) -> int:
        """Append ``block``; the bytes written (all of them unless the disk is full: then nothing more is written)."""
        written = 0
        try:
            while written < len(block):  # a regular file takes it whole unless the disk is full
                written += os.write(self._fd, block[written:])
        except OSError as exc:
            self.failed, self.full = f"{exc.strerror or exc} ({self.path})", True
        return written

    def close(self) -> None:
        os.close(self._fd)


class Output:
    """The agent's framed lines: each journaled (once ``attach`` gave a journal), then queued for the sender thread,
    which writes them to ``fd`` (stdout) in order. ``broken`` once stdout is given up: its reader is gone, or it
    fell ``behind_limit`` bytes behind; the journal carries on."""

    def __init__(self, fd: int, behind_limit: int = BEHIND_LIMIT) -> None:
        self._fd, self._behind_limit = fd, behind_limit
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: collections.deque[bytes] = collections.deque()
        self._unsent = 0  # bytes queued or being written
        self._waiting_since = time.monotonic()  # the oldest unsent byte's wait began here (or the last write ended)
        self._closing = False
        self._farewell: str | None = None  # set by ``farewell``: stdout takes nothing more once its queue is sent
        self.journal: Journal | None = None
        self.broken = threading.Event()
        self.why_broken = ""
        self._sender = threading.Thread(target=self._send, daemon=True)
        self._sender.start()

    def attach(self, journal: Journal) -> None:
        with self._lock:
            self.journal = journal

    def fileno(self) -> int:
        return self._fd

    def note(self, text: str) -> None:
        """Journal a line of the agent's own output (``launch: ...``) and queue it for stdout."""
        self.write_lines([encode_output(text)])

    def write_lines(self, lines: list[bytes]) -> None:
        """Journal framed lines (no newlines) in one write and queue them for stdout (the relay's hot path)."""
        with self._lock:
            data = self.journal.append(lines) if self.journal is not None else b"\n".join(lines) + b"\n"
            if not data:
                return
            if self.broken.is_set() or self._closing or self._farewell is not None:
                return
            if not self._unsent:
                self._waiting_since = time.monotonic()
            self._queue.append(data)
            self._unsent += len(data)
            if self._unsent > self._behind_limit:
                self._give_up(f"stdout fell more than {self._behind_limit} bytes behind")
            else:
                self._ready.notify()

    def event(self, kind: FrameKind, data: dict) -> None:
        """Journal a frame of ``kind`` and queue it for stdout."""
        self.write_lines([encode_frame(kind, data)])

    def farewell(self, kind: FrameKind, data: dict, why: str) -> None:
        """Send a frame (not journaled: the agent's word to this reader only) after what is queued, then give
        stdout up (``why``): the journal goes on without it."""
        line = encode_frame(kind, data) + b"\n"
        with self._lock:
            if self.broken.is_set() or self._farewell is not None:
                return
            self._farewell = why
            if not self._unsent:
                self._waiting_since = time.monotonic()
            self._queue.append(line)
            self._unsent += len(line)
            self._ready.notify()

    def lose(self, why: str) -> None:
        """Give stdout up (its reader is gone): nothing more is written there."""
        with self._lock:
            self._give_up(why)

    def _give_up(self, why: str) -> None:
        if not self.broken.is_set():
            self.why_broken = why
            self.broken.set()
        self._queue.clear()
        self._ready.notify_all()

    def contact_age(self) -> float:
        """Seconds since stdout last showed a reader: 0 while it is caught up; inf once given up."""
        with self._lock:
            if self.broken.is_set():
                return float("inf")
            return time.monotonic() - self._waiting_since if self._unsent else 0.0

    def close(self, stall_s: float = DRAIN_STALL_S) -> None:
        """Let the sender write what is queued, while it makes progress (at most ``stall_s`` without), then stop."""
        with self._lock:
            self._closing = True
            self._ready.notify_all()
        while self._sender.is_alive():
            with self._lock:
                stalled = self._unsent and time.monotonic() - self._waiting_since > stall_s
            if stalled:
                self.lose(f"stdout took nothing for {stall_s} s at exit")
                return
            self._sender.join(0.1)

    def _send(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing and not self.broken.is_set():
                    self._ready.wait()
                if self.broken.is_set() or not self._queue:
                    return
                data = b"".join(self._queue)
                self._queue.clear()
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError as exc:
                self.lose(f"stdout broke: {exc}")
                return
            with self._lock:
                self._unsent -= len(data)
                self._waiting_since = time.monotonic()
                if self._farewell is not None and not self._queue:
                    self._give_up(self._farewell)
                    return
