"""Find and end exactly one job's processes, by the tag in their environment.

Every process a job starts carries ``LAUNCH_JOB_ID=<id>`` in its environment
(torchrun and the DeepSpeed launcher pass it down to every rank, even ranks
that run in sessions of their own). Scanning ``/proc/*/environ`` for that
exact tag finds the whole job and nothing else: never ``pkill -f``.

Standard library only: its source is also sent to remote nodes and run there
as ``python -c`` (see ``remote_argv``), so it must stay self-contained.
"""

from __future__ import annotations

import os
import signal
import sys
import time

TAG = "LAUNCH_JOB_ID"


def job_pids(job_id: str) -> list[int]:
    """PIDs of this user's processes tagged with ``job_id``."""
    needle = f"{TAG}={job_id}".encode()
    uid = os.getuid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if needle in environ and not _is_zombie(entry):
            found.append(int(entry))
    return found


def _is_zombie(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def signal_job(job_id: str, sig: int) -> list[int]:
    """Send ``sig`` to every process of the job; the PIDs signalled."""
    pids = job_pids(job_id)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def end_job(job_id: str, grace: float = 5.0) -> list[int]:
    """TERM the job's processes, KILL what is left after ``grace`` seconds.

    Returns the PIDs still alive afterwards (empty when the job is gone).
    """
    if not signal_job(job_id, signal.SIGTERM):
        return []
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and job_pids(job_id):
        time.sleep(0.1)
    signal_job(job_id, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        left = job_pids(job_id)
        if not left:
            return []
        time.sleep(0.1)
    return job_pids(job_id)


def remote_argv(python: str, action: str, job_id: str, grace: float = 5.0) -> list[str]:
    """An argv that runs this module's ``action`` (``list`` or ``end``) on a node."""
    with open(__file__, encoding="utf-8") as handle:
        source = handle.read()
    return [python, "-c", source, action, job_id, str(grace)]


def _main(argv: list[str]) -> int:
    action, job_id = argv[0], argv[1]
    grace = float(argv[2]) if len(argv) > 2 else 5.0
    pids = job_pids(job_id) if action == "list" else end_job(job_id, grace)
    print(" ".join(str(p) for p in pids))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
