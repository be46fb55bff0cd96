"""Who is a job's supervisor? Proof enough to signal it, so `launch cancel` never hits a stranger.

A supervisor records its PID, its start time (clock ticks since boot, from /proc) and the boot id
in its job's run directory. `launch cancel` signals that PID only if the process there now
started at that same tick of that same boot (a reused PID cannot), and its command line is a
launch supervisor's: the detached one names the job id, the foreground one is `launch submit`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.node.proctree import start_ticks

IDENTITY_FILE = "supervisor.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str | None:
    try:
        return Path(BOOT_ID).read_text().strip()
    except OSError:
        return None


def record(run_dir: Path, job_id: str) -> None:
    """Record this process as the supervisor of ``job_id``."""
    identity = {"pid": os.getpid(), "start_ticks": start_ticks(os.getpid()), "boot_id": _boot_id(), "job_id": job_id}
    (run_dir / IDENTITY_FILE).write_text(json.dumps(identity))


def verified_pid(run_dir: Path, job_id: str) -> int | None:
    """The recorded supervisor's PID if that very process is alive and is launch's; else None."""
    try:
        identity = json.loads((run_dir / IDENTITY_FILE).read_text())
        pid = int(identity["pid"])
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if identity.get("job_id") != job_id or identity.get("boot_id") != _boot_id():
        return None
    if identity.get("start_ticks") is None or start_ticks(pid) != identity["start_ticks"]:
        return None
    detached = b"launcher.run.detached" in argv and job_id.encode() in argv
    foreground = b"submit" in argv and any(arg.endswith((b"launch", b"launcher")) for arg in argv[:3])
    return pid if detached or foreground else None
