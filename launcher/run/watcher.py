"""Node watchers: one thread a node reads its agent's framed lines and relays them.

A watcher writes the node's log file (each line stamped with the node's wall clock when it wrote it) and
echoes its lines; everything else it parses and hands to
the supervisor's loop, which alone writes the store (``launcher.run.filing``: liveness observations,
metric records, samples), and it keeps a snapshot of the node. It never stops reading on its own
errors: a line it cannot handle, a log file on a full disk are counted in ``Losses`` and skipped, so
the pipe is always drained and the ranks never block on a full one.

It counts the whole lines it received (``seen``: line k of the node's journal is the k-th, see
docs/JOURNALS.md) and hands the count over with the records and samples those lines carried, and
with the log file's size (``store.records.Seen``): the loop stores them in one transaction. When the stream breaks without
the agent's ``@exit`` and the backend can follow a node again, the watcher is *out of contact*: it
follows the journal again from ``seen`` (``launcher.run.contact`` paces the tries; the supervisor's
loop decides, on evidence, when the node is lost and calls ``give_up``). A watcher that resumes a
node (``Resume``, `launch attach`) skips the output lines its log file already has past the stored
size: nothing is lost, nothing written twice.
"""

from __future__ import annotations

import collections
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from launcher.backends import failures, leasing
from launcher.backends.base import NodeHandle
from launcher.backends.follow import fenced_record
from launcher.metrics.logged import read_logged, with_logged
from launcher.metrics.record import RANK_PREFIX, ProcessSample, Rejected, parse_line, parse_samples
from launcher.node import nccl, torchelastic
from launcher.node.protocol import Frame, FrameKind, NodeTime, OutputLine, Unparsable, parse
from launcher.plan.shell import mask
from launcher.run.contact import OutOfContact, retry_delay
from launcher.run.filing import AgentStarted, Handed, Losses, Noted, RejectedLine, ToStore
from launcher.run.liveness import Joined, Output, Progress, Sample, Sampled
from launcher.run.nodetime import NodeClock
from launcher.store.logcap import CappedLog
from launcher.store.records import Seen
from launcher.views.nccl import NCCL_EVENT
from launcher.views.terminal import safe_text

_EXIT_BARRIER = re.compile(r"\bError waiting on exit barrier\b")
_TRACE_LINE = re.compile(r"^(Traceback \(most recent call last\):|\s|$|The above exception|During handling of the above|"
                         r"[\w.]+(Error|Exception)\b)")
TAIL_LINES = 200
MAX_JOINED = 1_000_000  # node 0's count of rendezvous connections is rank output's kin: bounded
JOURNAL_STOPPED = "journal_stopped"  # the event filed when a node's journal keeps no more lines
LOCK_FILE_REMOVED = "lock_file_removed"  # the event filed when a lock file of a node's lease was removed under it
MARK_S = 1.0  # how often the count of lines received is stored when only output lines come
Follow = Callable[[int, int, "tuple[int, int | None] | None"], NodeHandle]  # (node, after, agent) -> a handle


@dataclass(frozen=True)
class Resume:
    """Where a watcher takes a node up (`launch attach`): the lines already received, the log file's size
    then, and the agent's (pid, start ticks) as recorded."""

    seen: int
    log_bytes: int | None
    agent: tuple[int, int | None] | None = None


def journal_stopped(node: int, frame: Frame) -> str:
    """The line (and event) that says node ``node``'s journal keeps no more lines, from its ``@journal`` frame."""
    after = "later output and samples still reach this supervisor, but a later `launch attach` will not see them"
    if frame.get_text("state", 40) == "full":
        limit = frame.get_int("limit")
        return f"launch: node {node}: journal full at {limit if limit is not None else '?'} bytes: {after}"
    return (f"launch: node {node}: its journal cannot be written ({frame.get_text('error', 300) or 'no reason given'}): "
            f"{after}")


class ExitBarrierTrace:
    """torchrun's agent waits at an exit barrier only once its node's ranks all exited 0; when another node's agent
    (node 0's, which holds the store) has already gone, it logs ``Error waiting on exit barrier`` and a DistNetworkError
    trace of some 30 lines although the job succeeded. Those lines of the agent's own output (never a rank's) are
    kept in the node's log and left off the console, where one line says what happened."""

    def __init__(self) -> None:
        self.lines = 0  # lines of the trace seen so far (0: not in one)

    def quiet(self, text: str) -> bool:
        """Whether an unprefixed line of the node's output belongs to that trace."""
        if _EXIT_BARRIER.search(text):
            self.lines = 1
        elif self.lines and _TRACE_LINE.match(text):
            self.lines += 1
        else:
            self.lines = 0
        return self.lines > 0


def logged_after(path: Path, offset: int | None) -> list[str]:
    """The lines (without their time) the log file has past ``offset``: written, but not yet counted as seen."""
    if offset is None:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return []
    return [line.decode("utf-8", "replace").partition(" ")[2] for line in data.split(b"\n")[:-1]]


@dataclass(frozen=True)
class Relay:
    """Where the watchers of one attempt relay to, and what they share: they hand everything for the job's
    rows and its liveness to the supervisor's loop (``handed``, see ``launcher.run.filing``)."""

    world_size: int
    secrets: Mapping[str, str]
    echo: Callable[[str], None]
    note: Callable[[str], None]  # never raises
    sequence: Callable[[], int]  # the supervisor's order of observations, shared by every node
    handed: queue.SimpleQueue[Handed] = field(default_factory=queue.SimpleQueue)
    losses: Losses = field(default_factory=Losses)


@dataclass(frozen=True)
class NodeSeen:
    """A watcher's node as it stands: its last lines, the job's PIDs and samples there, its agent's exit."""

    tail: list[str]
    pids: frozenset[int]
    samples: dict[int, ProcessSample]
    agent_exit: int | None
    reported: int | None  # when its agent's "failed" line was seen (Relay.sequence)
    recorded: failures.RecordedError | None = None  # what its torchrun's error file said (``@error_file``)


def last_state(text: str) -> str:
    """What a terminal would show of a line that redraws itself with carriage returns (a tqdm bar): its last state."""
    if "\r" not in text:
        return text
    states = [state for state in text.split("\r") if state.strip()]
    return states[-1] if states else ""


def _wall(stamp: NodeTime | None, at: float) -> float:
    """The time a log line shows: the node's wall clock when it wrote the line (``at`` for an unstamped one)."""
    return stamp.wall if stamp is not None else at


class NodeWatcher:
    """Reads one node agent's framed lines: log file, console echo, metric records, samples, last lines."""

    def __init__(self, handle: NodeHandle, host: str, log_path: Path, relay: Relay, *, follow: Follow | None = None,
                 resume: Resume | None = None) -> None:
        self.handle = handle
        self.host = host
        self.log_path = log_path
        self._relay = relay
        self._follow = follow
        self.count = resume.seen if resume else 0  # whole lines of the node's journal received
        self.agent = resume.agent if resume else None
        self._logged = collections.deque(logged_after(log_path, resume.log_bytes) if resume else [])
        self._marked_at = time.monotonic()
        self._marked = self.count
        self._log: CappedLog | None = None
        self._contact: OutOfContact | None = None
        self._after_try: OutOfContact | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._pids: set[int] = set()
        self._samples: dict[int, ProcessSample] = {}
        self._program_logged: dict[int, dict[str, float]] = {}  # a rank's numbers from its latest Trainer-style log line
        self._agent_exit: int | None = None
        self._recorded: failures.RecordedError | None = None
        self._reported: int | None = None
        self._barrier = ExitBarrierTrace()
        self._clock = NodeClock()
        self._heard: float | None = None
        self._handling_since: float | None = None  # a line being handled since (its echo may block on a full pipe)
        self._log_error: OSError = OSError("its log file was not opened")
        self.errors = 0
        self.fenced: dict | None = None  # the newer generation's record once the node refused this reader
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"node{handle.index}")
        self._thread.start()

    def seen(self) -> NodeSeen:
        """A snapshot, safe to read while the watcher goes on."""
        with self._lock:
            return NodeSeen(list(self._tail), frozenset(self._pids), dict(self._samples), self._agent_exit,
                            self._reported, self._recorded)

    def heard(self) -> float | None:
        """When the node wrote the newest line read from it (its time, on the supervisor's clock); None before one."""
        with self._lock:
            return self._heard

    def stuck_since(self, now: float, after: float) -> float | None:
        """Since when the watcher has been handling one line, if for ``after`` seconds or more (its echo blocked: a
        foreground output nobody reads); None while it takes its node's lines in."""
        since = self._handling_since
        return since if since is not None and now - since >= after else None

    def contact(self) -> OutOfContact | None:
        """None while the node's stream flows; else since when it is out of contact and how the tries went."""
        with self._lock:
            return self._contact

    def give_up(self, reason: str) -> None:
        """The supervisor found the node lost (``reason``): stop following it."""
        self.handle.lost_reason = reason
        self._stop.set()

    def _run(self) -> None:
        self._log = log = self._open_log()
        handle = self.handle
        try:
            while True:
                got = self._read(handle, log)
                self._mark()
                self.fenced = self.fenced or handle.fenced
                if self.fenced is not None:  # a newer supervisor took the job: its loop stops this one
                    return
                if self._follow is None or self._stop.is_set():
                    return
                if handle.poll() is not None:  # the agent exited: its stream is whole once it brought the @exit
                    if self._agent_exit is None:
                        self._catch_up(log)
                    return
                prior = self._after_try
                error = handle.error or "the stream ended without the agent's exit"
                with self._lock:  # a try that connected but brought nothing counts as a failed one
                    self._contact = (replace(prior, tries=prior.tries + 1, error=error, trying_since=None)
                                     if prior is not None and not got else
                                     OutOfContact(self.handle.index, self.host, time.time(), error=error))
                followed = self._again()
                if followed is None:
                    return
                self.handle = handle = followed
        finally:
            if log is not None:
                try:
                    log.close()
                except OSError:
                    pass  # its lost lines are counted already

    def _read(self, handle: NodeHandle, log: CappedLog | None) -> int:
        """Handle the lines of ``handle`` until it ends; how many came."""
        got = 0
        try:
            for raw in handle.lines():
                parsed = parse(raw)
                if isinstance(parsed, Frame) and parsed.kind is FrameKind.FENCED:  # to this reader, not journaled
                    self.fenced = fenced_record(parsed)
                    return got
                got += 1
                if got == 1:
                    with self._lock:
                        self._contact = self._after_try = None
                self._handling_since = time.time()
                try:
                    self._line(parsed, log)
                except Exception as exc:  # noqa: BLE001 - one bad line must not stop the relay (counted in _line)
                    self.errors += 1
                    self._relay.losses.add(exc, lines=1)
                    if self.errors == 1:
                        self._relay.note(f"node {self.handle.index}: a line could not be handled: {exc!r}")
                finally:
                    self._handling_since = None
        except Exception as exc:  # noqa: BLE001 - the node's channel broke: its exit code says the rest
            self._relay.note(f"node {self.handle.index}: reading its output failed: {exc!r}")
        return got

    def _catch_up(self, log: CappedLog | None) -> None:
        """Read the journal of an agent that exited before its stream brought its ``@exit`` (its stdout gave up on a
        reader that stopped taking lines, a paused supervisor), from ``count`` to its end (its ``@exit``, or ``@lost``
        for an agent killed before writing one). Only its lines: how the node ended is still its own handle's word."""
        assert self._follow is not None
        try:
            followed = self._follow(self.handle.index, self.count, self.agent)
        except Exception as exc:  # noqa: BLE001 - its lines after ``count`` stay in its journal (``launch attach``)
            self._relay.note(f"node {self.handle.index}: its agent exited before its last lines came, and its journal "
                             f"could not be read after line {self.count}: {exc}")
            return
        self._read(followed, log)
        self._mark()

    def _again(self) -> NodeHandle | None:
        """Follow the node's journal again from ``count``, pacing the tries; None once given up."""
        assert self._follow is not None
        while True:
            contact = self.contact()
            assert contact is not None
            if self._stop.wait(retry_delay(contact.tries)):
                return None
            with self._lock:
                self._contact = contact = replace(contact, trying_since=time.time())
            try:
                handle = self._follow(self.handle.index, self.count, self.agent)
            except Exception as exc:  # noqa: BLE001 - unreachable (or refused) this time: the loop decides when it is lost
                with self._lock:
                    self._contact = replace(contact, tries=contact.tries + 1, error=f"{exc}"[:300], trying_since=None)
                continue
            if self._stop.is_set():
                return None
            self._after_try = contact
            return handle

    def _seen(self, log: CappedLog | None) -> Seen:
        return Seen(self.handle.index, self.count, log.size if log is not None else None)

    def _mark(self) -> None:
        """Have how far the journal was received stored, if it moved (output lines only are marked now and then)."""
        if self._marked != self.count:
            self._relay.handed.put(ToStore(self._seen(self._log)))
            self._marked, self._marked_at = self.count, time.monotonic()

    def _open_log(self) -> CappedLog | None:
        handed = self._relay.handed
        try:
            return CappedLog(self.log_path, self.handle.index,
                             lambda kind, message, data: handed.put(Noted(kind, message, data)))
        except OSError as exc:
            self._relay.note(f"node {self.handle.index}: its log file cannot be opened: {exc!r}")
            self._log_error = exc
            return None

    def _line(self, parsed: OutputLine | Frame | Unparsable, log: CappedLog | None) -> None:
        """Handle one line: ``at``, when the node wrote it (its clock placed on ours), is the time of everything it
        says; the log file shows the node's wall clock."""
        node, received = self.handle.index, time.time()
        if parsed.journaled:  # a live line (the journal full or unwritable) is not one of the journal's
            self.count += 1
        if isinstance(parsed, Unparsable):
            raise ValueError(f"an unparsable line from the node: {parsed.why}")
        at = self._clock.when(parsed.at, received)
        try:
            self._handle(parsed, log, node, at)
        finally:
            with self._lock:  # after what the line said was handed over: the loop judges once it has it
                self._heard = max(self._heard or at, at)

    def _handle(self, parsed: OutputLine | Frame, log: CappedLog | None, node: int, at: float) -> None:
        if isinstance(parsed, Frame):
            self._event(parsed, at, log)
            return
        relay = self._relay
        text = parsed.text
        if relay.secrets:
            text = mask(text, dict(relay.secrets))
        relay.handed.put(Output(at, parsed.at))
        record = parse_line(text, world_size=relay.world_size, node=node, host=self.host)
        if isinstance(record, Rejected):
            relay.handed.put(RejectedLine(node, record))
            return
        if record is not None:
            if record.observed and record.rank in self._program_logged:
                record = with_logged(record, self._program_logged.pop(record.rank))
            relay.handed.put(Progress(node, record.rank, record.step, at, parsed.at, ended=record.ended))
            interval = record.steps or not record.ended  # an end with no steps since the last record is no interval
            relay.handed.put(ToStore(self._seen(log), records=(record,) if interval else ()))
            self._marked = self.count
            return
        match = RANK_PREFIX.match(text)
        quiet = match is None and self._barrier.quiet(text)
        if quiet and self._barrier.lines == 1:
            self._echo(f"[{node}] torchrun's exit barrier failed after every rank of this node exited 0 (another node's "
                       f"agent ended first); its trace is kept in the node's log (launch logs --node {node})")
        where, content = (f"{node}/{match[1]}", text[match.end():]) if match else (str(node), text)
        content = last_state(content)
        if match and (logged := read_logged(content)) is not None:
            self._program_logged[int(match[1])] = logged
        self._show(f"[{where}] {content}", text, log, _wall(parsed.at, at), echo=not quiet)

    def _echo(self, shown: str) -> None:
        try:
            self._relay.echo(safe_text(shown))
        except OSError:
            pass  # the console is gone (its terminal closed): the line is in the log, and the job goes on

    def _show(self, shown: str, text: str, log: CappedLog | None, stamp: float, echo: bool = True) -> None:
        """A line of the node's output: its tail, its log file (unless the file has it already) stamped with the
        node's wall clock ``stamp``, the console (unless not ``echo``)."""
        relay = self._relay
        with self._lock:
            self._tail.append(shown)
            if self._reported is None and failures.is_agent_failed_line(text):
                self._reported = relay.sequence()
        if self._logged and self._logged[0] == shown:
            self._logged.popleft()  # written before the supervisor that wrote it stopped: not again
        else:
            self._logged.clear()
            self._write(log, f"{stamp:.3f} {shown}\n")
        if echo:
            self._echo(shown)
        if time.monotonic() - self._marked_at >= MARK_S:
            self._mark()

    def _write(self, log: CappedLog | None, line: str) -> None:
        if log is None:
            self._relay.losses.add(self._log_error, lines=1)
            return
        try:
            log.write(line)
            log.flush()
        except Exception as exc:  # noqa: BLE001 - a full disk or a store that refuses the cap's event
            self._relay.losses.add(exc, lines=1)

    def _event(self, frame: Frame, at: float, log: CappedLog | None) -> None:
        node, stamp = self.handle.index, _wall(frame.at, at)
        if frame.kind is FrameKind.SAMPLE:
            self._sample(frame.data, at, log, frame.at)
        elif frame.kind is FrameKind.STARTED:
            pid = frame.get_int("pid")
            if pid is None:
                raise ValueError("a started frame without the agent's pid")
            self.handle.pid = pid
            self.agent = (pid, frame.get_int("start_ticks"))
            self._relay.handed.put(AgentStarted(node, *self.agent))
        elif frame.kind is FrameKind.ERROR_FILE:
            message = frame.get_text("message", torchelastic.MESSAGE_CHARS)
            if message is None:
                raise ValueError("an error_file frame without a message")
            with self._lock:
                self._recorded = failures.RecordedError(message, frame.get_int("exit_code"))
        elif frame.kind is FrameKind.EXIT:
            code = frame.get_int("code")
            if code is None:
                raise ValueError("an exit frame without a code")
            with self._lock:
                self._agent_exit = code
        elif frame.kind is FrameKind.NCCL:
            transport = nccl.Transport.from_json(frame.data)
            if transport is not None:  # read from files the ranks wrote: kept only when well formed
                self._relay.handed.put(Noted(NCCL_EVENT, f"node {node} ({self.host}): NCCL uses {transport.describe()}",
                                           {"node": node, "host": self.host, **transport.as_json()}))
        elif frame.kind is FrameKind.UNATTENDED:
            after = frame.get_number("after_s")
            self._show(f"[{node}] launch: node {node}: no supervisor in contact for "
                       f"{format(after, 'g') if after is not None else '?'} s (watch.unattended_timeout): "
                       "its agent ended the job there", "", log, stamp)
        elif frame.kind is FrameKind.LOST:
            why = frame.get_text("reason")
            self._show(f"[{node}] launch: node {node}: its agent is gone without an exit "
                       f"({why if why is not None else 'no reason given'})", "", log, stamp)
        elif frame.kind is FrameKind.JOURNAL:
            text = journal_stopped(node, frame)
            self._relay.handed.put(Noted(JOURNAL_STOPPED, text, {"node": node, "state": frame.get_text("state", 40)}))
            self._show(f"[{node}] {text}", "", log, stamp)
        elif frame.kind is FrameKind.LEASE:
            text = leasing.lock_file_removed(node, frame)
            self._relay.handed.put(Noted(LOCK_FILE_REMOVED, text, {"node": node, "device": frame.get_int("device"),
                                                                   "leased_again": frame.data.get("leased_again") is True}))
            self._show(f"[{node}] {text}", "", log, stamp)

    def _sample(self, data: dict, at: float, log: CappedLog | None, node_time: NodeTime | None) -> None:
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
            relay.handed.put(Sample(node, sample.rank, sample.cpu_s, sample.gpu_util, at, node_time))
        if isinstance(entries, list) and len(samples) == len(entries):  # every rank of the frame read: the others exited
            relay.handed.put(Sampled(node, frozenset(sample.rank for sample in samples), at, node_time))
        joined = data.get("joined")
        if node == 0 and type(joined) is int and 0 <= joined <= MAX_JOINED:
            relay.handed.put(Joined(joined, at, node_time))
        relay.handed.put(ToStore(self._seen(log), samples=tuple(samples)))
        self._marked = self.count

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()
