"""``follow``: a reader's way back to a node's journal (docs/JOURNALS.md).

Prints the journal's lines after line ``after`` as they are, then tails it, touching the contact file
every second (the agent's unattended watchdog counts that as contact), until it has printed an ``exit``
frame. Prints its own ``lost`` frame (``protocol``) instead when there is no journal, or when the agent
is gone (its pid, with its start time, from ``node<N>.pid``) and the journal has no ``exit``, or when a
new attempt's journal replaced the one followed. Prints a ``fenced`` frame (the generation record) and stops
when the node records a newer supervisor generation than the request's (``--takeover``): the
reader has been replaced. Its reader gone, it stops quietly (and so stops touching the contact
file): never the job.

``fence`` reads (and, given a newer ``generation``, writes) a node's generation record; ``record``
prints the job as its supervisor recorded it on the node (``job.json``: plan, specs, attempt). ``clean`` removes
a job's run directory once every job store that followed it has filed it (``collect``), and this user's run
directories no agent runs in when asked (`launch clean`) or untouched for ``RETENTION_S``.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shutil
import time

from . import proctree
from .journal import (
    RECORD_FILE,
    contact_age,
    contact_path,
    fenced_by,
    generation_path,
    journal_path,
    pid_path,
    read_generation,
    touch,
    write_atomically,
)
from .protocol import (
    CleanRequest,
    FenceRequest,
    FollowRequest,
    FrameKind,
    RecordRequest,
    SignalRequest,
    SweepRequest,
    encode_frame,
    frame_mark,
    kind_of,
)
from .rundir import RunDirError, existing_run_dir, job_run_dir, mark_store, roots, run_root, stores

POLL_S = 0.1
TOUCH_S = 1.0
READ_CHUNK = 1 << 20
EXIT = frame_mark(FrameKind.EXIT)
RETENTION_S = 7 * 86400  # a new agent removes its user's run directories untouched this long (no agent in them)
AGENT_EXIT_WAIT_S = 10.0  # a collected run directory waits this long for its agents to exit after their @exit
SWEEP_EVERY_S = 3600.0  # ... at most this often a node: the sweep reads every run directory (0.14 s of CPU for 1,300)
SWEPT_MARK = ".swept"  # in the run root: its mtime is the last sweep's start (not a directory: no job's)
PID_FILE = re.compile(r"node\d{1,7}\.pid")
RECORD_LIMIT = 16 * 2**20  # a job record past this is not one launch wrote


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
    return kind_of(line) is FrameKind.EXIT


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


def follow(req: FollowRequest, out: int = 1) -> int:
    """Follow the journal ``req`` names, printing to fd ``out``."""
    job_id, node, after, generation = req.job_id, req.node, max(0, req.after), req.generation

    def lost(reason: str) -> int:
        _write(out, encode_frame(FrameKind.LOST, {"reason": reason}) + b"\n")
        return 0

    try:
        try:
            run_dir = existing_run_dir(job_id)  # checked: this user's, private
            if run_dir is None:
                return lost(f"no run directory for job {job_id} on this node")
            fd = os.open(journal_path(run_dir, node), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return lost(f"no journal for node {node} of job {job_id} on this node")
        except (RunDirError, OSError) as exc:
            return lost(f"cannot read the journal of node {node} of job {job_id}: {exc}")
        try:
            return _tail(fd, run_dir, node, after, out, lost, generation)
        finally:
            os.close(fd)
    except ReaderGone:
        return 0


def _fenced(out: int, newer: dict) -> int:
    _write(out, encode_frame(FrameKind.FENCED, newer) + b"\n")
    return 0


def _tail(fd: int, run_dir: str, node: int, after: int, out: int, lost, generation: int = 0) -> int:
    contact = contact_path(run_dir, node)
    poller = select.poll()
    poller.register(out, select.POLLERR | select.POLLHUP)
    newer = fenced_by(run_dir, node, generation)
    if newer is not None:  # a newer supervisor is in charge: not one line for this reader, no contact
        return _fenced(out, newer)
    touch(contact)
    touched = time.monotonic()
    seq, partial, last_look = 0, b"", ""
    while True:
        if time.monotonic() - touched >= TOUCH_S:
            newer = fenced_by(run_dir, node, generation)
            if newer is not None:
                return _fenced(out, newer)
            touch(contact)
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


def fenced_request(req: SweepRequest | SignalRequest) -> dict | None:
    """The newer generation's record when a supervisor of generation ``req.generation`` asks something only the
    one in charge of node ``req.node`` may (signal, end); None while it is, or when no generation is given
    (`launch cancel` of a job whose supervisor is gone)."""
    generation, node = req.generation, req.node
    if generation is None or node is None or req.job_id is None:
        return None
    try:
        run_dir = existing_run_dir(req.job_id)
    except (RunDirError, OSError):
        return None
    return fenced_by(run_dir, node, generation) if run_dir is not None else None


def _answer(data: dict) -> int:
    print(json.dumps(data, separators=(",", ":")), flush=True)
    return 0


def fence(req: FenceRequest) -> int:
    """Print node ``node``'s generation record and how long ago a reader was in contact (``contact_s``, on the
    node's monotonic clock; None: never, or before a reboot). With
    ``generation`` newer than the recorded one, record it first (with ``pid``, ``host``): from then on, ``follow``
    and the agent refuse readers of an older generation. ``taken``: it was written."""
    node = req.node
    try:
        run_dir = existing_run_dir(req.job_id)
    except (RunDirError, OSError) as exc:
        return _answer({"error": f"cannot use the run directory of job {req.job_id}: {exc}"})
    if run_dir is None or not os.path.exists(journal_path(run_dir, node)):
        return _answer({"error": f"no journal of node {node} of job {req.job_id} on this node"})
    current = read_generation(run_dir, node)
    wanted = req.generation
    taken = wanted is not None and wanted > current["generation"]
    if taken:
        current = {"generation": wanted, "pid": req.pid, "host": req.host, "since": time.time()}
        write_atomically(generation_path(run_dir, node), json.dumps(current))
        if req.store is not None:
            try:
                mark_store(run_dir, req.store)
            except (RunDirError, OSError) as exc:
                return _answer({"error": f"cannot record the job store following job {req.job_id}: {exc}"})
    contact_s = contact_age(contact_path(run_dir, node))
    return _answer({**current, "taken": taken, "contact_s": contact_s, "agent_gone": agent_gone(run_dir, node)})


def clean(req: CleanRequest) -> int:
    """Remove this user's run directories (``req.job_id``'s only, when given) in which no agent runs (every
    ``node<N>.pid``'s agent gone) and nothing changed for ``older_than_s`` seconds: ``{"removed": [job ids], "kept":
    {job id: why}}``. Never follows a symlink; a directory it cannot check is kept, saying why."""
    if req.filed_by is not None and req.job_id is not None:
        removed, kept = collect(req.job_id, req.filed_by)
        return _answer({"removed": removed, "kept": kept})
    try:
        removed, kept = clean_dirs(req.job_id, req.older_than_s, req.dry_run)
    except OSError as exc:
        return _answer({"removed": [], "kept": {}, "error": f"cannot list the run roots: {exc}"})
    return _answer({"removed": removed, "kept": kept})


def clean_dirs(job_id: str | None, older_than_s: float, dry_run: bool = False,
               skip: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(the job ids whose run directories were removed, those kept and why): see ``clean``; ``skip``: a job id left
    alone (the calling agent's own)."""
    removed: list[str] = []
    kept: dict[str, str] = {}
    for root, name in _listed(job_id, skip):
        try:
            run_dir = existing_run_dir(name) if root is None else job_run_dir(name, root)
        except (RunDirError, OSError) as exc:
            kept[name] = str(exc)[:300]
            continue
        if run_dir is None:
            continue
        why = _kept(run_dir, older_than_s)
        if why is not None:
            kept[name] = why
            continue
        if not dry_run:
            shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(name)
    return removed, kept


def _listed(job_id: str | None, skip: str | None) -> list[tuple[str | None, str]]:
    """(root, name) of each run directory ``clean_dirs`` looks at: ``job_id``'s (its root found later), or every
    entry but ``skip`` and the dot files (``SWEPT_MARK``) in each of this user's roots."""
    if job_id:
        return [(None, job_id)]
    found: list[tuple[str | None, str]] = []
    for root in roots():
        try:
            found += [(root, name) for name in sorted(os.listdir(root)) if name != skip and not name.startswith(".")]
        except FileNotFoundError:
            continue
    return found


def collect(job_id: str, store: str, wait_s: float = AGENT_EXIT_WAIT_S) -> tuple[list[str], dict[str, str]]:
    """The job store ``store`` has filed job ``job_id`` to its end: say so in the job's run directory here, and remove
    the directory once every store that followed the job here has filed it too (a supervisor that comes back, or
    an attach of another store, still finds what it has not filed) and no agent of the job runs in it (waited for
    up to ``wait_s``: an agent exits just after its ``@exit``). Only this user's directory of this job: checked as
    ``job_run_dir`` does (this user's, private, no symlink) and holding this job's record. (removed, kept: why)."""
    try:
        run_dir = existing_run_dir(job_id)
        if run_dir is None:
            return [], {}
        root = os.open(os.path.dirname(run_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (RunDirError, OSError) as exc:
        return [], {job_id: str(exc)[:300]}
    try:
        fcntl.flock(root, fcntl.LOCK_EX)  # one collector at a time (nodes of the job on one host, or sharing /tmp)
        return _collect(job_id, run_dir, store, wait_s)
    finally:
        os.close(root)


def _collect(job_id: str, run_dir: str, store: str, wait_s: float) -> tuple[list[str], dict[str, str]]:
    try:
        if not os.path.lexists(run_dir):
            return [], {}  # another collector removed it while this one waited for the lock
        run_dir = job_run_dir(job_id, os.path.dirname(run_dir))
        if _record_job_id(run_dir) != job_id:
            return [], {job_id: "it holds no record of this job (job.json): not removed"}
        mark_store(run_dir, store, filed=True)
    except (RunDirError, OSError) as exc:
        return [], {job_id: str(exc)[:300]}
    followed = stores(run_dir)
    if store not in followed:
        return [], {job_id: "this job store is not recorded as following the job here (an older launch?)"}
    waiting = followed - stores(run_dir, filed=True)
    if waiting:
        return [], {job_id: f"{len(waiting)} other job store(s) that followed the job have not filed it yet (their "
                            "`launch attach` reads it)"}
    deadline = time.monotonic() + wait_s
    while (running := _running_agents(run_dir)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if running:
        return [], {job_id: f"an agent of the job still runs ({', '.join(running)})"}
    shutil.rmtree(run_dir, ignore_errors=True)
    if os.path.lexists(run_dir):
        return [], {job_id: "not all of it could be removed (files of another user in it?)"}
    return [job_id], {}


def _record_job_id(run_dir: str) -> object:
    """The job id in the run directory's record (``job.json``), None without one."""
    try:
        fd = os.open(os.path.join(run_dir, RECORD_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            found = json.loads(handle.read(RECORD_LIMIT + 1)[:RECORD_LIMIT])
    except (OSError, ValueError):
        return None
    return found.get("job_id") if isinstance(found, dict) else None


def _running_agents(run_dir: str) -> list[str]:
    """The pid files in ``run_dir`` whose agents still run."""
    return [name for name in sorted(os.listdir(run_dir)) if PID_FILE.fullmatch(name)
            and agent_gone(run_dir, name[len("node"):-len(".pid")]) is None]


def sweep_due(now: float | None = None) -> bool:
    """Whether this node's retention sweep is due (the run root's ``SWEPT_MARK`` older than ``SWEEP_EVERY_S``, or
    missing); if so the mark is touched first, so that the agents of a job starting together do not all sweep."""
    now = time.time() if now is None else now
    mark = os.path.join(run_root(), SWEPT_MARK)
    try:
        if now - os.stat(mark, follow_symlinks=False).st_mtime < SWEEP_EVERY_S:
            return False
    except FileNotFoundError:
        pass
    fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.utime(fd, (now, now))
    finally:
        os.close(fd)
    return True


def _kept(run_dir: str, older_than_s: float) -> str | None:
    """Why ``run_dir`` stays: an agent of the job runs there, or something in it changed too recently."""
    running = _running_agents(run_dir)
    if running:
        return f"an agent of the job still runs ({', '.join(running)})"
    newest = max((entry.stat(follow_symlinks=False).st_mtime for entry in os.scandir(run_dir)),
                 default=os.stat(run_dir).st_mtime)
    if time.time() - newest < older_than_s:
        return f"changed {time.time() - newest:.0f} s ago (kept for {older_than_s:.0f} s)"
    return None


def record(req: RecordRequest) -> int:
    """Print the job as its supervisor recorded it in the run directory (``job.json``), or why not."""
    try:
        run_dir = existing_run_dir(req.job_id)
        if run_dir is None:
            return _answer({"error": f"no run directory of job {req.job_id} on this node"})
        fd = os.open(os.path.join(run_dir, RECORD_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read(RECORD_LIMIT + 1)[:RECORD_LIMIT])
    except FileNotFoundError:
        return _answer({"error": f"job {req.job_id} left no record on this node (started by an older launch?)"})
    except (RunDirError, OSError, ValueError) as exc:
        return _answer({"error": f"cannot read the record of job {req.job_id} on this node: {exc}"})
    return _answer({"record": data})
