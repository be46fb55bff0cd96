"""Leases: each GPU (or CPU slot) of a node given to one job at a time, held by the kernel for its holder.

A lease is an exclusive ``flock`` on ``DIR/HOST.gpuN.lock`` (``slotN`` on nodes without GPUs), taken by
the node agent before any rank starts and held through its open file: when the agent exits, is killed
or the node reboots, the kernel drops it. ``DIR`` (``/var/tmp/launch-leases``) is made like /tmp
(mode 1777): any user may create a lock file, and because a lock file is opened read-only, any user
may lock a file another user made. Lock files are never unlinked (a lock on an unlinked file would
guard nothing); after locking, the path is checked to still name the locked file, and the holder checks it again
while it holds the lease (``Lease.verify``): the owner of a lock file or of the directory could unlink it, so a
lock file removed or replaced is said, and leased again where it can be. ``set_up`` (root, once a shared node) makes
the directory and every lock file root's, so no user can. ``survey`` names the holder of a device whose lock file
was removed under it, never "free".

Who holds what: ``/proc/locks`` names the pid holding each lock file's inode; the holder's record
(``HOST.holder.UID.PID``, JSON: job, from, since, devices, max_steps; the job's step, step rate and the node time
of its newest step once its ranks report steps: ``progress``) is believed only when it belongs to that pid's user,
was written by that very process (start ticks) and lists the device. A stale record is never believed, and no user
can release another's lease: only the holding process can close its file. The holder rewrites its record
(atomically, bounded) as its job's step moves.

A waiting job holds a ticket (``HOST.ticket.UID.PID``, flocked by its waiting process): a job takes
leases on a host only if no live ticket of another job that arrived there before its own waits (first come,
first served per host, by the ticket file's change time: no priorities, no backfill); a job without a ticket
goes behind all of them. A ticket whose turn came and that did not lease loses its place (``waiting.Places``). Standard library only: it runs on nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import gpuapps, records
from .progress import Pace

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


def set_up(kind: str, capacity: int, directory: str | None = None) -> list[str]:
    """As root, once on a shared node: the lease directory root's (mode 1777, sticky) and a lock file of root's
    (0644) for each of ``capacity`` devices of ``kind``, so that no other user can remove or plant one. A lock
    file a user made is given to root as it is (a job may hold it: its inode is kept); anything else at a lock path
    (a directory, a symlink, a FIFO) is removed first. What was changed, one line each ([] when nothing)."""
    if os.geteuid() != 0:
        raise LeaseError("setting up the lease directory needs root (`sudo launch queue --set-up`): only then can no "
                         "other user remove or plant a lock file")
    path = directory or DEFAULT_DIR
    done = []
    try:
        os.mkdir(path, 0o700)
        done.append(f"made {path}")
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise LeaseError(f"{path} is not a directory (a symlink or a file): remove it, then run the set-up again")
    if info.st_uid != 0 or info.st_gid != 0:
        done.append(f"{path} given to root (was {records.user_name(info.st_uid)}'s)")
    os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, 0o1777)
    for index in range(capacity):
        lock = os.path.join(path, f"{host_name()}.{kind}{index}.lock")
        found: os.stat_result | None = None
        with contextlib.suppress(FileNotFoundError):
            found = os.lstat(lock)
        if found is not None and not stat.S_ISREG(found.st_mode):
            if stat.S_ISDIR(found.st_mode):
                shutil.rmtree(lock)
            else:
                os.unlink(lock)
            done.append(f"removed {lock} ({records.user_name(found.st_uid)}'s, not a lock file)")
            found = None
        # no O_CREAT on a user's file: fs.protected_regular refuses it, even to root
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                     | (os.O_CREAT | os.O_EXCL if found is None else 0), 0o644)
        try:
            if found is None:
                done.append(f"made {lock}")
            elif found.st_uid != 0:
                done.append(f"{lock} given to root (was {records.user_name(found.st_uid)}'s)")
            os.fchown(fd, 0, 0)
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
    return done


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
    lock_removed: bool | None = None  # True: it holds the device's lock file that was removed (another may lease it)
    pace: Pace | None = None  # the job's step and ETA, as its agent last recorded them

    def as_json(self) -> dict:
        return {("from" if k == "origin" else k): (v.as_json() if isinstance(v, Pace) else v)
                for k, v in self.__dict__.items() if v is not None}


def holder(directory: str, pid: int, index: int, kind: str) -> Holder:
    """The holder of device ``index`` known by its pid: its record if believable, else only its pid and user."""
    user = records.user_name(records.uid_of(pid))
    record = _record_of(directory, pid, "holder")
    if record is None or index not in (record.get("devices") or []) or record.get("kind") != kind:
        return Holder(pid, user)
    since = record.get("since")
    return Holder(pid, user, _text(record.get("job")), _text(record.get("from")),
                  float(since) if isinstance(since, (int, float)) else None, pace=Pace.of(record, time.time()))


@dataclass(frozen=True)
class Ticket:
    """A waiting job's place in the queue of this host: ``since``, when its ticket arrived here (the ticket file's
    change time, the kernel's: no waiter can claim an earlier place)."""

    job: str
    user: str
    origin: str | None
    since: float
    count: int
    pid: int

    def as_json(self) -> dict:
        return {("from" if k == "origin" else k): v for k, v in self.__dict__.items() if v is not None}


def tickets(directory: str) -> list[Ticket]:
    """The live tickets of this host (flocked by their waiting process), in the order they arrived."""
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
            info = os.lstat(path)
        except OSError:
            continue
        pid = int(parts[1])
        record = _record_of(directory, pid, "ticket")
        if pid not in held.get(info.st_ino, []) or record is None:
            continue
        count = record.get("count")
        found.append(Ticket(_text(record.get("job")) or "?", records.user_name(records.uid_of(pid)), _text(record.get("from")),
                            info.st_ctime, count if type(count) is int and count > 0 else 1, pid))
    return sorted(found, key=lambda t: (t.since, t.job))


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
    exposed: list[str] = field(default_factory=list)  # why another user could remove lock files here (``exposure``)

    def free(self, allow_shared: bool) -> list[int]:
        return [i for i, h in self.holders.items() if h is None and (allow_shared or not self.foreign.get(i))]

    def as_json(self) -> dict:
        return {"host": host_name(), "kind": self.kind,
                "devices": [{"index": i, "holder": h.as_json() if h else None,
                             "foreign": [p.as_json() for p in self.foreign.get(i, [])]} for i, h in self.holders.items()],
                "waiting": [t.as_json() for t in self.waiting], "exposed": self.exposed}


def survey(kind: str, capacity: int, directory: str | None = None) -> Survey:
    """Who holds each of this host's ``capacity`` devices of ``kind`` now, and who waits (touches no lock)."""
    directory = lease_dir(directory)
    held = locked_pids()
    holders: dict[int, Holder | None] = {}
    inodes: dict[int, int] = {}
    owners: dict[int, int] = {}
    for index in range(capacity):
        path = os.path.join(directory, f"{host_name()}.{kind}{index}.lock")
        try:
            info = os.lstat(path)
        except OSError:
            holders[index] = None
            continue
        unusable(path, info)
        inodes[index], owners[index] = info.st_ino, info.st_uid
        pids = held.get(info.st_ino, [])
        holders[index] = holder(directory, pids[0], index, kind) if pids else None
    for index, found in _removed_under(directory, kind, held, inodes).items():
        if holders.get(index) is None:
            holders[index] = found
    foreign = foreign_gpu_processes() if kind == "gpu" else {}
    return Survey(kind, holders, foreign, tickets(directory), exposure(directory, kind, owners))


def _removed_under(directory: str, kind: str, held: dict[int, list[int]], inodes: dict[int, int]) -> dict[int, Holder]:
    """Devices whose holder still holds a lock file that was removed (or replaced) under it: a process with a
    believable holder record for them that holds a flock on an inode no lock path names any more."""
    current = set(inodes.values())
    removed: dict[int, int] = {}  # pid -> how many of its flocks are on inodes no lock path names
    for inode, pids in held.items():
        if inode not in current:
            for pid in pids:
                removed[pid] = removed.get(pid, 0) + 1
    found: dict[int, Holder] = {}
    for pid in removed:
        record = _record_of(directory, pid, "holder")
        if record is None or record.get("kind") != kind:
            continue
        devices = [i for i in record.get("devices") or [] if type(i) is int]
        lost = [i for i in devices if pid not in held.get(inodes.get(i, -1), [])]
        if lost and len(lost) <= removed[pid]:
            for index in lost:
                found[index] = dataclasses.replace(holder(directory, pid, index, kind), lock_removed=True)
    return found


def ahead(waiting: list[Ticket], job: str, since: float | None, passed: frozenset[tuple[int, float]] = frozenset()
          ) -> list[Ticket]:
    """The live tickets of other jobs that arrived before a ticket of ``job`` that arrived at ``since`` (None: a job
    without a ticket, behind all of them), but those ``passed`` ((pid, since): they lost their place)."""
    return [t for t in waiting if t.job != job and (since is None or (t.since, t.job) < (since, job))
            and (t.pid, t.since) not in passed]


@dataclass(frozen=True)
class Moved:
    """A held device's lock file found removed or replaced (``Lease.verify``), and what became of the lease."""

    kind: str
    index: int
    path: str
    what: str  # "removed" or "replaced"
    owners: list[str]  # who besides root could have done it: the lock file's owner, the directory's
    leased_again: bool  # the path's new lock file is this process's now: the device is guarded again
    holder: Holder | None = None  # else who holds the new lock file: two jobs share the device
    error: str | None = None  # else why the path cannot be leased again

    def as_json(self) -> dict:
        return {"kind": self.kind, "device": self.index, "path": self.path, "what": self.what, "owners": self.owners,
                "leased_again": self.leased_again, **({"holder": self.holder.as_json()} if self.holder else {}),
                **({"error": self.error} if self.error else {})}


@dataclass
class Lease:
    """Devices this process holds: their open lock files (closed by ``release``, or by the process's end)."""

    kind: str
    devices: list[int]
    fds: list[int]
    record_path: str | None = None
    paths: list[str] = field(default_factory=list)  # each device's lock path
    exposed: list[str] = field(default_factory=list)  # why another user could remove its lock files (``exposure``)
    _told: dict[int, tuple[int, int] | None] = field(default_factory=dict)  # device -> what its path named when said
    record: dict = field(default_factory=dict)  # what the holder record says
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_progress(self, fields: dict) -> None:
        """Rewrite the holder record (atomically) with the job's pace (``progress.StepWatch.fields``)."""
        with self._guard:
            if self.record_path:
                _write_record(self.record_path, {**self.record, **fields})

    def release(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        with self._guard:
            if self.record_path:
                with contextlib.suppress(OSError):
                    os.unlink(self.record_path)
                self.record_path = None

    def verify(self) -> list[Moved]:
        """Check that each lock path still names the file this process locked; each one removed or replaced (by
        its owner or the directory's: only they can, the sticky bit stops the rest) is leased again when its new
        file is free, else said with who holds it now. Each change is said once."""
        moved = []
        for slot, (index, path) in enumerate(zip(self.devices, self.paths)):
            mine = os.fstat(self.fds[slot])
            try:
                info: os.stat_result | None = os.lstat(path)
            except FileNotFoundError:
                info = None
            now = (info.st_dev, info.st_ino) if info else None
            if now == (mine.st_dev, mine.st_ino) or (index in self._told and self._told[index] == now):
                continue
            self._told[index] = now
            owners = _owners(os.path.dirname(path), mine.st_uid)
            found = Moved(self.kind, index, path, "replaced" if info else "removed", owners, False)
            try:
                fd = _try_lock(os.path.dirname(path), self.kind, index)
            except LeaseError as exc:
                moved.append(dataclasses.replace(found, error=str(exc)))
                continue
            if fd is not None:
                os.close(self.fds[slot])
                self.fds[slot] = fd
                self._told.pop(index, None)
                moved.append(dataclasses.replace(found, leased_again=True))
                continue
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                self._told[index] = (info.st_dev, info.st_ino)
            pids = locked_pids().get(info.st_ino, []) if info else []
            moved.append(dataclasses.replace(found, holder=holder(os.path.dirname(path), pids[0], index, self.kind)
                                             if pids else None))
        return moved


def _owners(directory: str, file_uid: int) -> list[str]:
    """The users other than this one and root who may unlink a lock file owned by ``file_uid`` in ``directory``."""
    uids = [file_uid]
    with contextlib.suppress(OSError):
        uids.append(os.stat(directory).st_uid)
    return list(dict.fromkeys(records.user_name(uid) for uid in uids if uid not in (0, os.getuid())))


def exposure(directory: str, kind: str, owners: dict[int, int]) -> list[str]:
    """Why lock files (``owners``: device -> the uid owning its lock file) could be removed by another user (each
    its own line; [] when only this user and root can): owned by that user, or in a directory that user owns.
    ``set_up`` (as root) makes it []."""
    said = []
    with contextlib.suppress(OSError):
        owner = os.stat(directory).st_uid
        if owner not in (0, os.getuid()):
            said.append(f"the lease directory {directory} belongs to {records.user_name(owner)}, who can remove "
                        "any lock file in it")
    by_owner: dict[int, list[int]] = {}
    for index, uid in sorted(owners.items()):
        if uid not in (0, os.getuid()):
            by_owner.setdefault(uid, []).append(index)
    noun = "GPU" if kind == "gpu" else "slot"
    said += [f"the lock file(s) of {noun}(s) {','.join(map(str, held))} belong to {records.user_name(uid)}, who can "
             "remove them" for uid, held in by_owner.items()]
    return said


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


def acquire(kind: str, count: int, capacity: int, record: dict, *, waited: bool = False, allow_shared: bool = False,
            directory: str | None = None) -> Lease | Busy:
    """Take ``count`` free devices of ``kind`` (lowest first) without blocking, all or none: a Lease, or Busy when
    fewer are free or another job's ticket waits here (a job that ``waited`` with its own ticket, which its waiter
    found first, is not sent back). ``record`` (job, from, max_steps) is written as the holder's."""
    directory = lease_dir(directory)
    job = str(record.get("job"))
    queue = [] if waited else ahead(tickets(directory), job, None)
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
    devices, fds = [i for i, _ in taken], [fd for _, fd in taken]
    lease = Lease(kind, devices, fds, paths=[os.path.join(directory, f"{host_name()}.{kind}{i}.lock") for i in devices],
                  exposed=exposure(directory, kind, {i: os.fstat(fd).st_uid for i, fd in taken}),
                  record={**holder, "devices": devices})
    _tidy(directory)
    if _write_record(path, lease.record):
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
def ticket(record: dict, count: int, directory: str | None = None) -> Iterator[str]:
    """Hold this process's ticket in the host's queue while the block runs."""
    directory = lease_dir(directory)
    _tidy(directory)
    pid = os.getpid()
    path = os.path.join(directory, f"{host_name()}.ticket.{os.getuid()}.{pid}")
    records.write_json(path, {**record, "count": count, "start_ticks": records.start_ticks(pid)})
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield path
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
