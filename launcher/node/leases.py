"""Leases: each GPU (or CPU slot) of a node given to one job at a time, held by the kernel for its holder.

A lease is an exclusive ``flock`` on ``DIR/HOST.gpuN.lock`` (``slotN`` on nodes without GPUs), taken by
the node agent before any rank starts and held through its open file: when the agent exits, is killed
or the node reboots, the kernel drops it. ``DIR`` (``/var/tmp/launch-leases``) is made like /tmp
(mode 1777): any user may create a lock file, and because a lock file is opened read-only, any user
may lock a file another user made. Lock files are never unlinked (a lock on an unlinked file would
guard nothing); after locking, the path is checked to still name the locked file.

Who holds what: ``/proc/locks`` names the pid holding each lock file's inode; the holder's record
(``HOST.holder.UID.PID``, JSON: job, from, since, devices) is believed only when it belongs to that
pid's user, was written by that very process (start ticks) and lists the device. A stale record is
never believed, and no user can release another's lease: only the holding process can close its file.

A waiting job holds a ticket (``HOST.ticket.UID.PID``, flocked by its waiting process): a job takes
leases on a host only if no live earlier ticket of another job waits there (first come, first
served per host; no priorities, no backfill). Standard library only: it runs on nodes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import gpuapps, records

DEFAULT_DIR = "/var/tmp/launch-leases"


class LeaseError(Exception):
    """The lease directory or a lock file cannot be used safely."""


def host_name() -> str:
    """This node's name as it appears in lease file names (no '/' or leading dot)."""
    return socket.gethostname().replace("/", "_").lstrip(".") or "node"


def lease_dir(path: str | None = None) -> str:
    """The lease directory, made mode 1777 if missing; LeaseError if it is a symlink, not a directory, or
    writable by others without the sticky bit (anyone could then remove the lock files)."""
    path = path or DEFAULT_DIR
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
        os.chmod(path, 0o1777)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise LeaseError(f"{path} is not a directory (a symlink or a file): leases cannot be kept there")
    if info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX:
        raise LeaseError(f"{path} may be changed by every user without the sticky bit (mode "
                         f"{oct(info.st_mode & 0o7777)}): `chmod 1777 {path}`")
    return path


def unusable(path: str, info: os.stat_result) -> None:
    """LeaseError when what is at a lock path (another user may have put it there first) is not a lock file this
    user can open: a symlink, a directory, a FIFO, or a file closed to it; named with its owner and the fix."""
    what = ("a symlink" if stat.S_ISLNK(info.st_mode) else "a directory" if stat.S_ISDIR(info.st_mode) else
            "a FIFO" if stat.S_ISFIFO(info.st_mode) else None if stat.S_ISREG(info.st_mode) else "not a regular file")
    if what is None and (info.st_uid == os.getuid() or os.getuid() == 0 or info.st_mode & 0o004):
        return
    what = what or f"a file closed to this user (mode {oct(info.st_mode & 0o777)})"
    raise LeaseError(f"{path} is {what}, owned by {records.user_name(info.st_uid)} (uid {info.st_uid}): that device "
                     "cannot be leased by anyone; its owner or root must remove it (docs/LEASES.md: lock files made "
                     "by root on shared nodes)")


def _open_lock(path: str) -> int:
    """A read-only fd on the lock file at ``path``, made if missing (a regular file, never followed as a link)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    while True:
        try:
            fd = os.open(path, flags)  # no O_CREAT on another user's file: fs.protected_regular refuses it
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                os.fchmod(fd, 0o644)  # readable by every user whatever the umask: they lock it too
            except FileExistsError:
                continue
        except OSError as exc:
            raise LeaseError(f"cannot open {path}: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LeaseError(f"{path} is not a regular file: leases cannot be kept there")
        return fd


def locked_pids() -> dict[int, list[int]]:
    """Each inode's flock holders, from /proc/locks ({} when it cannot be read)."""
    held: dict[int, list[int]] = {}
    try:
        with open("/proc/locks") as handle:
            lines = handle.read(1 << 22).splitlines()
    except OSError:
        return held
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[4].isdigit():
            inode = parts[5].rsplit(":", 1)[-1]
            if inode.isdigit():
                held.setdefault(int(inode), []).append(int(parts[4]))
    return held


def _record_of(directory: str, pid: int, kind: str) -> dict | None:
    """The record ``pid`` wrote (``HOST.KIND.UID.PID``), if its owner is pid's user and it is this process's."""
    uid = records.uid_of(pid)
    if uid is None:
        return None
    path = os.path.join(directory, f"{host_name()}.{kind}.{uid}.{pid}")
    try:
        if os.lstat(path).st_uid != uid:
            return None
    except OSError:
        return None
    record = records.read_json(path)
    if record is None or record.get("start_ticks") != records.start_ticks(pid):
        return None
    return record


def _text(value: object) -> str | None:
    return value[:120] if isinstance(value, str) else None


@dataclass(frozen=True)
class Holder:
    """Who holds a device: a launch job (from its agent's record), or a foreign process on a GPU."""

    pid: int
    user: str
    job: str | None = None
    origin: str | None = None  # the host the job was submitted from
    since: float | None = None
    command: str | None = None  # a foreign process's command (nvidia-smi)

    def as_json(self) -> dict:
        return {("from" if k == "origin" else k): v for k, v in self.__dict__.items() if v is not None}


def holder(directory: str, pid: int, index: int, kind: str) -> Holder:
    """The holder of device ``index`` known by its pid: its record if believable, else only its pid and user."""
    user = records.user_name(records.uid_of(pid))
    record = _record_of(directory, pid, "holder")
    if record is None or index not in (record.get("devices") or []) or record.get("kind") != kind:
        return Holder(pid, user)
    since = record.get("since")
    return Holder(pid, user, _text(record.get("job")), _text(record.get("from")),
                  float(since) if isinstance(since, (int, float)) else None)


@dataclass(frozen=True)
class Ticket:
    """A waiting job's place in the queue of this host."""

    job: str
    user: str
    origin: str | None
    since: float | None
    order: float
    count: int
    pid: int

    def as_json(self) -> dict:
        return {("from" if k == "origin" else k): v for k, v in self.__dict__.items() if v is not None}


def tickets(directory: str) -> list[Ticket]:
    """The live tickets of this host (flocked by their waiting process), oldest first."""
    prefix = f"{host_name()}.ticket."
    held = locked_pids()
    found = []
    for entry in os.listdir(directory):
        if not entry.startswith(prefix) or entry.endswith(".tmp"):
            continue
        parts = entry[len(prefix):].split(".")
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        path = os.path.join(directory, entry)
        try:
            inode = os.lstat(path).st_ino
        except OSError:
            continue
        pid = int(parts[1])
        record = _record_of(directory, pid, "ticket")
        if pid not in held.get(inode, []) or record is None or not isinstance(record.get("order"), (int, float)):
            continue
        since = record.get("since")
        found.append(Ticket(_text(record.get("job")) or "?", records.user_name(records.uid_of(pid)), _text(record.get("from")),
                            float(since) if isinstance(since, (int, float)) else None, float(record["order"]),
                            int(record.get("count") or 0), pid))
    return sorted(found, key=lambda t: (t.order, t.job))


def foreign_gpu_processes() -> dict[int, list[Holder]]:
    """Per GPU index, the compute processes nvidia-smi lists ({} without nvidia-smi)."""
    return {index: [Holder(pid, records.user_name(records.uid_of(pid)), command=command) for pid, command in apps]
            for index, apps in gpuapps.compute_apps().items()}


@dataclass
class Survey:
    """This host's devices of one kind: each index's holder (None: free) and foreign processes, and its queue."""

    kind: str
    holders: dict[int, Holder | None]
    foreign: dict[int, list[Holder]] = field(default_factory=dict)
    waiting: list[Ticket] = field(default_factory=list)

    def free(self, allow_shared: bool) -> list[int]:
        return [i for i, h in self.holders.items() if h is None and (allow_shared or not self.foreign.get(i))]

    def as_json(self) -> dict:
        return {"host": host_name(), "kind": self.kind,
                "devices": [{"index": i, "holder": h.as_json() if h else None,
                             "foreign": [p.as_json() for p in self.foreign.get(i, [])]} for i, h in self.holders.items()],
                "waiting": [t.as_json() for t in self.waiting]}


def survey(kind: str, capacity: int, directory: str | None = None) -> Survey:
    """Who holds each of this host's ``capacity`` devices of ``kind`` now, and who waits (touches no lock)."""
    directory = lease_dir(directory)
    held = locked_pids()
    holders: dict[int, Holder | None] = {}
    for index in range(capacity):
        path = os.path.join(directory, f"{host_name()}.{kind}{index}.lock")
        try:
            info = os.lstat(path)
        except OSError:
            holders[index] = None
            continue
        unusable(path, info)
        inode = info.st_ino
        pids = held.get(inode, [])
        holders[index] = holder(directory, pids[0], index, kind) if pids else None
    foreign = foreign_gpu_processes() if kind == "gpu" else {}
    return Survey(kind, holders, foreign, tickets(directory))


def ahead(waiting: list[Ticket], job: str, order: float) -> list[Ticket]:
    """The live tickets of other jobs that came before (``order``, ``job``)."""
    return [t for t in waiting if t.job != job and (t.order, t.job) < (order, job)]


@dataclass
class Lease:
    """Devices this process holds: their open lock files (closed by ``release``, or by the process's end)."""

    kind: str
    devices: list[int]
    fds: list[int]
    record_path: str | None = None

    def release(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        if self.record_path:
            with contextlib.suppress(OSError):
                os.unlink(self.record_path)
            self.record_path = None


@dataclass
class Busy:
    """Why leases were not taken: the survey of the host at that moment, and the tickets ahead."""

    survey: Survey
    ahead: list[Ticket]
    wanted: int

    def as_json(self, allow_shared: bool) -> dict:
        return {**self.survey.as_json(), "wanted": self.wanted, "free": len(self.survey.free(allow_shared)),
                "allow_shared": allow_shared,
                "ahead": [t.as_json() for t in self.ahead]}


def _try_lock(directory: str, kind: str, index: int) -> int | None:
    """An fd holding device ``index``'s lock, or None when another process holds it."""
    path = os.path.join(directory, f"{host_name()}.{kind}{index}.lock")
    while True:
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise LeaseError(f"cannot lock {path}: {exc.strerror}") from None
        try:
            same = os.lstat(path).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if same:
            return fd
        os.close(fd)  # the file was replaced after we opened it: lock what the path names now


def acquire(kind: str, count: int, capacity: int, record: dict, order: float, *, allow_shared: bool = False,
            directory: str | None = None) -> Lease | Busy:
    """Take ``count`` free devices of ``kind`` (lowest first) without blocking, all or none: a Lease, or Busy when
    fewer are free or another job's earlier ticket waits here. ``record`` (job, from) is written as the holder's."""
    directory = lease_dir(directory)
    job = str(record.get("job"))
    queue = ahead(tickets(directory), job, order)
    foreign = foreign_gpu_processes() if kind == "gpu" and not allow_shared else {}
    pid = os.getpid()
    path = os.path.join(directory, f"{host_name()}.holder.{os.getuid()}.{pid}")
    holder = {**record, "kind": kind, "since": time.time(), "start_ticks": records.start_ticks(pid)}
    # the record comes before the locks (naming every device this may lock), so another job that finds one held
    # reads whose it is, never a bare PID; it names the devices got once they are
    _write_record(path, {**holder, "devices": [i for i in range(capacity) if not foreign.get(i)]})
    taken: list[tuple[int, int]] = []
    if not queue:
        for index in range(capacity):
            if len(taken) == count:
                break
            if foreign.get(index):
                continue
            fd = _try_lock(directory, kind, index)
            if fd is not None:
                taken.append((index, fd))
    if len(taken) < count:
        for _, fd in taken:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return Busy(survey(kind, capacity, directory), queue, count)
    lease = Lease(kind, [i for i, _ in taken], [fd for _, fd in taken])
    _tidy(directory)
    if _write_record(path, {**holder, "devices": lease.devices}):
        lease.record_path = path
    return lease


def _write_record(path: str, holder: dict) -> bool:
    """Write the holder's record; False when it cannot (the lease holds without it: others see its PID and user)."""
    try:
        records.write_json(path, holder)
    except OSError:
        return False
    return True


def _tidy(directory: str) -> None:
    """Remove this user's holder records and tickets on this host whose process is gone (a killed agent's or
    waiter's: never believed, but they would pile up)."""
    prefix = f"{host_name()}."
    for entry in os.listdir(directory):
        kind, _, owner = entry[len(prefix):].partition(".") if entry.startswith(prefix) else ("", "", "")
        uid, _, pid = owner.partition(".")
        if kind in ("holder", "ticket") and uid == str(os.getuid()) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


@contextlib.contextmanager
def ticket(record: dict, order: float, count: int, directory: str | None = None) -> Iterator[str]:
    """Hold this process's ticket in the host's queue while the block runs."""
    directory = lease_dir(directory)
    _tidy(directory)
    pid = os.getpid()
    path = os.path.join(directory, f"{host_name()}.ticket.{os.getuid()}.{pid}")
    records.write_json(path, {**record, "order": order, "count": count, "since": time.time(), "start_ticks": records.start_ticks(pid)})
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield path
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
