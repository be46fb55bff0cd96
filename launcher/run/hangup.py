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


def detach_from_terminal(job_id: str, run_dir: Path) -> None:
    """Say how to follow the job on stderr (a closed terminal refuses it: ignored), then point stdin at /dev/null,
    stdout at /dev/null and stderr at the job's ``supervisor.log``, so that nothing this process writes from now on
    fails on the terminal that is gone."""
    try:
        os.write(2, parting_line(job_id).encode())
    except OSError:
        pass  # EIO: the terminal is gone
    null = os.open(os.devnull, os.O_RDWR)
    try:
        log = os.open(run_dir / SUPERVISOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        log = null
    for fd, target in ((0, null), (1, null), (2, log)):
        os.dup2(target, fd)
    for fd in {null, log}:
        os.close(fd)
