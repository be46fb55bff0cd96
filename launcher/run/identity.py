"""Who is a job's supervisor? Proof enough to signal it, so `launch cancel` never hits a stranger.

A supervisor records its PID, its start time (clock ticks since boot, from /proc) and the boot id
in its job's run directory. `launch cancel` signals that PID only if the process there now
started at that same tick of that same boot (a reused PID cannot), and its command line is a
launch supervisor's: the detached one names the job id, the foreground one is `launch submit`, `attach` or `bench`
(whose runs are foreground submits).
The same proof, turned round, says when a supervisor is gone (``presence``): `launch cancel` and
`status --watch` act on that evidence only, never on a supervisor being slow. `launch attach` takes
a job whose supervisor is proven gone; ``described`` is what `launch status` says of a job's supervisor.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.node.journal import write_atomically
from launcher.node.proctree import start_ticks
from launcher.node.rundir import STORE_ID
from launcher.store.states import Successor, Supervision, SupervisorState

IDENTITY_FILE = "supervisor.json"
KEEPER_FILE = "keeper.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
FOREGROUND_COMMANDS = (b"submit", b"attach", b"bench")  # the commands that supervise a job in their own process
def user_and_host() -> tuple[str, str]:
    """Who runs this command, and where: the user's name (its uid where it has none) and this machine's host name."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a uid without a passwd entry (a container) and no LOGNAME
        user = f"uid {os.getuid()}"
    return user, socket.gethostname()


STORE_ID_FILE = "store.id"


def store_id(home: Path) -> str:
    """This job store's id (``LAUNCH_HOME/store.id``, made once): the nodes record which stores followed a job and
    which have filed it, and remove its run directory once every one has (docs/JOURNALS.md "Run directories")."""
    path = home / STORE_ID_FILE
    try:
        found = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        found = ""
    if STORE_ID.fullmatch(found):
        return found
    made = uuid.uuid4().hex
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another launch made it meanwhile (or what is there is not an id: replaced)
        again = path.read_text(encoding="ascii", errors="replace").strip() if not path.is_symlink() else ""
        if STORE_ID.fullmatch(again):
            return again
        write_atomically(str(path), made + "\n")
        return made
    with os.fdopen(fd, "w") as handle:
        handle.write(made + "\n")
    return made


def _boot_id() -> str | None:
    try:
        return Path(BOOT_ID).read_text().strip()
    except OSError:
        return None


def record(run_dir: Path, job_id: str, generation: int = 0, terminal_closed: float | None = None) -> None:
    """Record this process as the supervisor of ``job_id`` (of ``generation``: see ``launch attach --takeover``);
    ``terminal_closed``: when the terminal of this foreground supervisor closed (it goes on in the background, and
    a plain `launch attach` takes the job from it)."""
    since = _recorded(run_dir) or {}
    began = since.get("since") if since.get("pid") == os.getpid() and since.get("job_id") == job_id else None
    identity = {"pid": os.getpid(), "start_ticks": start_ticks(os.getpid()), "boot_id": _boot_id(), "job_id": job_id,
                "host": socket.gethostname(), "since": began or time.time(), "generation": generation,
                "terminal_closed": terminal_closed}
    write_atomically(str(run_dir / IDENTITY_FILE), json.dumps(identity))  # a takeover's reader sees one or the other


def fenced(run_dir: Path, job_id: str, newer: dict[str, Any]) -> None:
    """Add to this process's record that a newer supervisor (``newer``: its generation, pid and host, as the nodes
    said) took the job, for this store's `launch status`; a record that is no longer this process's is left alone."""
    identity = _recorded(run_dir)
    if identity is None or identity.get("pid") != os.getpid() or identity.get("job_id") != job_id:
        return
    taken = {key: newer.get(key) for key in ("generation", "pid", "host")}
    write_atomically(str(run_dir / IDENTITY_FILE), json.dumps({**identity, "taken_over_by": taken}))


def _successor(identity: dict[str, Any]) -> Successor | None:
    taken = identity.get("taken_over_by")
    if not isinstance(taken, dict):
        return None

    def typed(key: str, kind: type) -> Any:
        value = taken.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    return Successor(typed("generation", int), typed("pid", int), typed("host", str))


@dataclass(frozen=True)
class Presence:
    """What is known of a job's supervisor: alive (``pid``), gone (``gone``: the evidence), or neither (starting)."""

    pid: int | None = None
    gone: str | None = None


def _recorded(run_dir: Path) -> dict[str, Any] | None:
    try:
        identity = json.loads((run_dir / IDENTITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return identity if isinstance(identity, dict) else None


def _argv(pid: int) -> list[bytes] | None:
    """The process's command line; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return None


def record_keeper(run_dir: Path, job_id: str) -> None:
    """Record this process as the keeper of ``job_id``'s detached supervisor (``launcher.run.detached``)."""
    keeper = {"pid": os.getpid(), "start_ticks": start_ticks(os.getpid()), "boot_id": _boot_id(), "job_id": job_id}
    write_atomically(str(run_dir / KEEPER_FILE), json.dumps(keeper))


def keeper_alive(run_dir: Path, job_id: str) -> int | None:
    """The PID of the keeper of ``job_id``'s detached supervisor while it runs (proven as a supervisor is: same
    start tick, same boot, a keeper's command line), else None: it may start another supervisor while it lives."""
    try:
        keeper = json.loads((run_dir / KEEPER_FILE).read_text())
    except (OSError, ValueError):
        return None
    pid = keeper.get("pid") if isinstance(keeper, dict) else None
    if not isinstance(pid, int) or keeper.get("job_id") != job_id or keeper.get("boot_id") != _boot_id():
        return None
    argv = _argv(pid)
    if argv is None or start_ticks(pid) != keeper.get("start_ticks"):
        return None
    return pid if b"launcher.run.detached" in argv and job_id.encode() in argv else None


def _is_supervisor(argv: list[bytes], job_id: str) -> bool:
    detached = b"launcher.run.detached" in argv and job_id.encode() in argv
    launch = any(arg.endswith((b"launch", b"launcher")) for arg in argv[:3])
    foreground = launch and any(command in argv for command in FOREGROUND_COMMANDS)
    return detached or foreground


def presence(run_dir: Path, job_id: str, spawned_pid: int | None) -> Presence:
    """Is the supervisor of ``job_id`` alive, proven gone, or not yet known? ``spawned_pid`` is the PID the store
    has for it (a detached supervisor's, recorded when it was started, before it records itself)."""
    identity = _recorded(run_dir)
    if identity is None or identity.get("job_id") != job_id or not isinstance(identity.get("pid"), int):
        if spawned_pid is None:
            return Presence()  # nothing recorded yet: a supervisor that is starting
        argv = _argv(spawned_pid)
        if argv is None:
            return Presence(gone=f"its process {spawned_pid} exited before it recorded itself")
        if not _is_supervisor(argv, job_id):
            return Presence(gone=f"process {spawned_pid} is no longer this job's supervisor")
        return Presence()
    pid = identity["pid"]
    if identity.get("boot_id") != _boot_id():
        return Presence(gone="the machine restarted since it started")
    argv = _argv(pid)
    if argv is None:
        return Presence(gone=f"its process {pid} has exited")
    if identity.get("start_ticks") is None or start_ticks(pid) != identity["start_ticks"] or not _is_supervisor(argv, job_id):
        return Presence(gone=f"its process {pid} has exited (the PID is not launch's now)")
    return Presence(pid=pid)


def described(run_dir: Path, job_id: str, spawned_pid: int | None, alive_at: float | None) -> Supervision:
    """The supervision of a job that has not ended; ``alive_at``: when its supervisor last said it was alive."""
    found = presence(run_dir, job_id, spawned_pid)
    identity = _recorded(run_dir) or {}
    mine = identity.get("job_id") == job_id
    host = identity.get("host") if mine and isinstance(identity.get("host"), str) else None
    pid = identity.get("pid") if mine and isinstance(identity.get("pid"), int) else spawned_pid
    began = identity.get("since") if mine and isinstance(identity.get("since"), (int, float)) else None
    generation = identity.get("generation", 0) if mine and isinstance(identity.get("generation", 0), int) else None
    successor = _successor(identity) if mine else None
    if successor is not None:
        return Supervision(SupervisorState.TAKEN_OVER, host, pid, began, found.gone, generation, successor=successor)
    closed = identity.get("terminal_closed") if mine else None
    closed = closed if isinstance(closed, (int, float)) and not isinstance(closed, bool) else None
    if found.pid is not None:
        return Supervision(SupervisorState.ATTACHED, host or socket.gethostname(), found.pid, began, generation=generation,
                           terminal_closed=closed)
    if found.gone is not None:
        return Supervision(SupervisorState.LOST, host, pid, alive_at if alive_at is not None else began, found.gone, generation)
    return Supervision(SupervisorState.UNKNOWN, host, pid, None, generation=generation)
