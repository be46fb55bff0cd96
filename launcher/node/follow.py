"""``follow``: a reader's way back to a node's journal (docs/JOURNALS.md).

Prints the journal's lines after line ``after``, then tails it, touching the contact file every
second (the agent's unattended watchdog counts that as contact), until it has printed an ``@exit``
line. Prints ``@lost {"reason": ...}`` instead when there is no journal, or when the agent is gone
(its pid, with its start time, from ``node<N>.pid``) and the journal has no ``@exit``, or when a
new attempt's journal replaced the one followed. Its reader gone, it stops quietly (and so stops
touching the contact file): never the job. Standard library only: it runs on nodes.
"""

from __future__ import annotations

import json
import os
import select
import time

from . import proctree
from .agent import RunDirError, job_run_dir, run_root
from .journal import contact_path, journal_path, pid_path

POLL_S = 0.1
TOUCH_S = 1.0
READ_CHUNK = 1 << 20
EXIT = b"@exit"


class ReaderGone(Exception):
    """Our stdout broke or was closed: nobody reads what ``follow`` prints."""


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise ReaderGone from exc


def _is_exit(line: bytes) -> bool:
    return line == EXIT or line.startswith(EXIT + b" ")


def agent_gone(run_dir: str, node: object) -> str | None:
    """Why the node's agent is gone (dead, a zombie, or its pid another process's now); None while it runs."""
    try:
        with open(pid_path(run_dir, node)) as handle:
            fields = handle.read().split()
        pid, ticks = int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError) as exc:
        return f"its pid file is unreadable ({exc})"
    stat = proctree._stat(pid)
    if stat is None or stat[4] != ticks:
        return f"the agent (pid {pid}) is gone"
    if stat[1] == "Z":
        return f"the agent (pid {pid}) has exited"
    return None


def _touch(path: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.utime(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # the run directory removed under us: the journal's state says the rest


def follow(req: dict, out: int = 1) -> int:
    """Follow the journal ``req`` names (``job_id``, ``node``, ``after``, ``run_root``), printing to fd ``out``."""
    job_id, node, after = req["job_id"], int(req["node"]), max(0, int(req.get("after") or 0))

    def lost(reason: str) -> int:
        _write(out, b"@lost " + json.dumps({"reason": reason}, separators=(",", ":")).encode() + b"\n")
        return 0

    try:
        try:
            run_dir = os.path.join(req.get("run_root") or run_root(), job_id)
            if not os.path.isdir(run_dir):
                return lost(f"no run directory for job {job_id} on this node")
            run_dir = job_run_dir(job_id, req.get("run_root"))  # checked: this user's, private
            fd = os.open(journal_path(run_dir, node), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return lost(f"no journal for node {node} of job {job_id} on this node")
        except (RunDirError, OSError) as exc:
            return lost(f"cannot read the journal of node {node} of job {job_id}: {exc}")
        try:
            return _tail(fd, run_dir, node, after, out, lost)
        finally:
            os.close(fd)
    except ReaderGone:
        return 0


def _tail(fd: int, run_dir: str, node: int, after: int, out: int, lost) -> int:
    contact = contact_path(run_dir, node)
    poller = select.poll()
    poller.register(out, select.POLLERR | select.POLLHUP)
    _touch(contact)
    touched = time.monotonic()
    seq, partial, last_look = 0, b"", ""
    while True:
        if time.monotonic() - touched >= TOUCH_S:
            _touch(contact)
            touched = time.monotonic()
        chunk = os.read(fd, READ_CHUNK)
        if chunk:
            data = partial + chunk
            cut = data.rfind(b"\n") + 1
            whole, partial = data[:cut], data[cut:]
            count = whole.count(b"\n")
            if seq + count <= after:  # all before the reader's place: only an @exit among them matters
                seq += count
                if EXIT in whole and any(_is_exit(line) for line in whole.split(b"\n")):
                    return 0  # the reader has had the journal to its end
                continue
            lines = whole.split(b"\n")[:-1]
            sent = []
            for line in lines:
                seq += 1
                if seq > after:
                    sent.append(line)
                if _is_exit(line):
                    _write(out, b"\n".join(sent) + b"\n" if sent else b"")
                    return 0
            _write(out, b"\n".join(sent) + b"\n" if sent else b"")
            continue
        if last_look:
            return lost(last_look)
        try:
            replaced = os.stat(journal_path(run_dir, node)).st_ino != os.fstat(fd).st_ino
        except OSError:
            replaced = True
        why = "its journal was replaced (a new attempt started)" if replaced else agent_gone(run_dir, node)
        if why is not None:
            last_look = f"{why} and its journal has no @exit"  # read to the end once more: @exit may just have come
            continue
        if poller.poll(POLL_S * 1000):
            raise ReaderGone
