"""A foreground supervisor's terminal closed (SIGHUP, a dropped SSH session, output that can no longer be written):
the job goes on, supervised in the background by the same process, until `launch attach JOB` takes it back to a
terminal or `launch cancel JOB` ends it. Only an explicit act ends a job (docs/RELIABILITY.md).

``detach_from_terminal`` is safe in a signal handler: raw ``os.write`` and ``os.dup2``, no Python-level lock.
"""

from __future__ import annotations

import os
from pathlib import Path

SUPERVISOR_LOG = "supervisor.log"


def parting_line(job_id: str) -> str:
    """What the terminal's last line says, when it can still take one."""
    return (f"\njob {job_id}: this terminal closed; the job goes on, supervised in the background. "
            f"`launch attach {job_id}` follows it; `launch cancel {job_id}` ends it\n")


STANDARD_FDS = (0, 1, 2)


def on_terminal() -> tuple[int, ...]:
    """The standard descriptors that are on a terminal now (asked before it closes: a hung-up one is no tty)."""
    return tuple(fd for fd in STANDARD_FDS if os.isatty(fd))


def detach_from_terminal(job_id: str, run_dir: Path, fds: tuple[int, ...] = STANDARD_FDS) -> None:
    """Say how to follow the job on stderr (a closed terminal refuses it: ignored), then point ``fds`` away from where
    they were: stdin and stdout at /dev/null, stderr at the job's ``supervisor.log``, so that nothing this process
    writes from now on fails there. After a SIGHUP, those that were on the terminal (`nohup launch submit` keeps its
    file); all three where writing failed (a pipe whose reader is gone)."""
    try:
        os.write(2, parting_line(job_id).encode())
    except OSError:
        pass  # EIO: the terminal is gone
    moved = [fd for fd in fds if fd in STANDARD_FDS]
    if not moved:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        log = os.open(run_dir / SUPERVISOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        log = null
    for fd in moved:
        os.dup2(log if fd == 2 else null, fd)
    for fd in {null, log}:
        os.close(fd)
