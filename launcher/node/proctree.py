"""Find, measure and end exactly one job's processes on a node, by the tag in their environment.

Every process a job starts carries ``LAUNCH_JOB_ID=<id>`` in its environment (torchrun and the
DeepSpeed launcher pass it down to every rank, even to ranks in sessions of their own). Scanning
``/proc/*/environ`` of this user's processes for that exact tag finds the whole job and nothing
else: never ``pkill -f``. With a node index, only that node's processes (``LAUNCH_NODE``): nodes
of one job may share a process table (a test bed's namespace hosts, several nodes on one machine),
and a node's agent never measures or ends another's. A rank is a tagged process with ``RANK`` in
its environment whose parent is not the same rank (its data-loader workers inherit ``RANK`` too);
its tree is the rank and those descendants.

A rank's memory is what its processes use: the proportional set size (PSS, ``/proc/PID/smaps_rollup``: a page
shared by N processes counts 1/N in each, so a DataLoader worker forked from the rank adds what it has of its own,
not the rank's pages again), summed over the rank and the descendants that run the rank's own program (its
``/proc/PID/exe``: forked or spawned workers), not over a program it runs (a compiler building a DeepSpeed op, a
shell) nor what that program starts. Where smaps_rollup cannot be read (a kernel before 4.14) the RSS is used.
CPU time is the whole tree's: a rank waiting for its compiler is working.

Standard library only: it runs on nodes (see ``launcher.node``).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

TAG = "LAUNCH_JOB_ID"
NODE_TAG = "LAUNCH_NODE"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Proc:
    """One process of the job as /proc shows it now."""

    pid: int
    ppid: int
    state: str
    cpu_s: float  # user + system, including reaped children
    rss_bytes: int
    start_ticks: int
    env: dict[str, str] = field(default_factory=dict)
    exe: str | None = None  # the program it runs (/proc/PID/exe), None where it cannot be read


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def pss_bytes(pid: int) -> int | None:
    """``pid``'s proportional set size (``Pss:`` of /proc/PID/smaps_rollup), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _stat(pid: int) -> tuple[int, str, float, int, int] | None:
    """(ppid, state, cpu seconds incl. reaped children, rss bytes, start time in ticks) of ``pid``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return int(fields[1]), fields[0].decode(), ticks / CLOCK_TICKS, int(fields[21]) * PAGE_SIZE, int(fields[19])


def _environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def job_procs(job_id: str, node: int | None = None, skip: set[int] | None = None) -> list[Proc]:
    """This user's live processes tagged with ``job_id`` (zombies left out), only node ``node``'s if given. With
    ``skip``: the PIDs in it are not looked at, and every PID looked at and found not to be one is added to it."""
    needle = f"{TAG}={job_id}".encode()
    uid, me = os.getuid(), os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me or (skip is not None and pid in skip):
            continue
        proc = _tagged(pid, needle, uid, node)
        if proc is not None:
            found.append(proc)
        elif skip is not None:
            skip.add(pid)
    return found


def _tagged(pid: int, needle: bytes, uid: int, node: int | None) -> Proc | None:
    """``pid`` as a Proc if it is a live process of this user whose environment holds ``needle`` (and node ``node``'s)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return None
        with open(f"/proc/{pid}/environ", "rb") as handle:
            if needle not in handle.read().split(b"\0"):
                return None
    except OSError:
        return None
    stat = _stat(pid)
    env = _environ(pid)
    if stat is None or env is None or stat[1] == "Z":
        return None
    if node is not None and env.get(NODE_TAG) != str(node):
        return None
    return Proc(pid, stat[0], stat[1], stat[2], stat[3], stat[4], env, _exe(pid))


class JobScan:
    """``job_procs`` for a caller that asks every few seconds (the agent's sampler): a PID found not to be the
    job's is not read again (its environment: ~11 us a process, some 450 processes where 64 namespace hosts share
    one process table, every 2 s) until the next full scan, every ``full_every`` scans. Between them a process
    that became the job's without a new PID (an exec given the tag, a reused PID) is not seen: the sampler's
    figures leave it out for up to that long; ``job_procs`` alone (ending, listing) always reads every process."""

    def __init__(self, job_id: str, node: int | None = None, full_every: int = 15) -> None:
        self.job_id, self.node, self.full_every = job_id, node, full_every
        self.skip: set[int] = set()
        self.scans = 0

    def procs(self) -> list[Proc]:
        if self.scans % self.full_every == 0:
            self.skip.clear()
        self.scans += 1
        return job_procs(self.job_id, self.node, self.skip)


def job_pids(job_id: str, node: int | None = None) -> list[int]:
    """PIDs of this user's live processes tagged with ``job_id`` (and ``node``)."""
    return [proc.pid for proc in job_procs(job_id, node)]


@dataclass
class RankTree:
    """A rank's process and its descendants (data-loader workers...), measured together."""

    rank: int
    local_rank: int | None
    pid: int
    pids: list[int]
    cpu_s: float
    mem_bytes: int  # PSS of the rank and the descendants running its program (see the module docstring)
    cuda_visible: str | None


def rank_trees(procs: list[Proc]) -> list[RankTree]:
    """The job's ranks among ``procs`` (from ``job_procs``), each with its tree's CPU time and memory."""
    by_pid = {proc.pid: proc for proc in procs}
    children: dict[int, list[Proc]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc)
    trees = []
    for proc in procs:
        rank = _int(proc.env.get("RANK"))
        parent = by_pid.get(proc.ppid)
        if rank is None or (parent is not None and parent.env.get("RANK") == proc.env.get("RANK")):
            continue
        members, own, todo = [], [], [(proc, True)]
        while todo:
            member, same = todo.pop()
            same = same and member.exe == proc.exe
            members.append(member)
            if same:
                own.append(member)
            todo.extend((child, same) for child in children.get(member.pid, ()))
        trees.append(RankTree(
            rank=rank, local_rank=_int(proc.env.get("LOCAL_RANK")), pid=proc.pid,
            pids=sorted(m.pid for m in members), cpu_s=sum(m.cpu_s for m in members),
            mem_bytes=sum(_memory(m) for m in own), cuda_visible=proc.env.get("CUDA_VISIBLE_DEVICES"),
        ))
    return sorted(trees, key=lambda tree: tree.rank)


def _memory(proc: Proc) -> int:
    pss = pss_bytes(proc.pid)
    return pss if pss is not None else proc.rss_bytes


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def signal_job(job_id: str, sig: int, node: int | None = None) -> list[int]:
    """Send ``sig`` to every process of the job (of its node ``node``); the PIDs signalled."""
    pids = job_pids(job_id, node)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def end_job(job_id: str, grace: float = 5.0, node: int | None = None) -> list[int]:
    """TERM the job's processes (its node ``node``'s), KILL what is left after ``grace`` seconds; the PIDs
    still alive after."""
    if not signal_job(job_id, signal.SIGTERM, node):
        return []
    _wait(lambda: not job_pids(job_id, node), grace)
    signal_job(job_id, signal.SIGKILL, node)
    _wait(lambda: not job_pids(job_id, node), 5.0)
    return job_pids(job_id, node)


def end_group(pgid: int, grace: float, alive=None) -> None:
    """TERM the process group ``pgid``, KILL it after ``grace`` seconds unless ``alive()`` says it is gone."""
    alive = alive or (lambda: _group_alive(pgid))
    _signal_group(pgid, signal.SIGTERM)
    _wait(lambda: not alive(), grace)
    _signal_group(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(done, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def descendants(root: int, skip: frozenset[int] = frozenset()) -> list[Proc]:
    """This user's live processes below ``root`` (zombies left out), through their parents, not below a PID in ``skip``.

    With ``root`` a child subreaper (the node agent), every process its command started stays below it, whatever
    it did to its environment, its session or its parent: orphans are re-parented to ``root``, not to init.
    """
    uid = os.getuid()
    children: dict[int, list[tuple[int, tuple[int, str, float, int, int]]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
        except OSError:
            continue
        stat = _stat(int(entry))
        if stat is not None:
            children.setdefault(stat[0], []).append((int(entry), stat))
    found, todo = [], [root]
    while todo:
        for pid, stat in children.get(todo.pop(), ()):
            if pid in skip:
                continue
            todo.append(pid)
            if stat[1] != "Z":
                found.append(Proc(pid, stat[0], stat[1], stat[2], stat[3], stat[4]))
    return found


def end_descendants(root: int, grace: float, skip: frozenset[int] = frozenset()) -> list[int]:
    """TERM every process below ``root`` (see ``descendants``), KILL what is left after ``grace`` seconds, each
    only while it is still the process found (PID and start time); the PIDs still alive after."""
    found = descendants(root, skip)
    if not found:
        return []
    for proc in found:
        signal_if(proc.pid, proc.start_ticks, signal.SIGTERM)
    _wait(lambda: not descendants(root, skip), grace)
    deadline = time.monotonic() + 5.0
    while (left := descendants(root, skip)) and time.monotonic() < deadline:
        for proc in left:  # found afresh each round: a process may have forked while it was being ended
            signal_if(proc.pid, proc.start_ticks, signal.SIGKILL)
        time.sleep(0.05)
    return [proc.pid for proc in descendants(root, skip)]


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (with the PID, an identity that survives PID reuse)."""
    stat = _stat(pid)
    return stat[4] if stat is not None else None


def catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (its SigCgt mask in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def signal_if(pid: int, ticks: int | None, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process that started at ``ticks`` (not a reused PID)."""
    if ticks is None or start_ticks(pid) != ticks:
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
